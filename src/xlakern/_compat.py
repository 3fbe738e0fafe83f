"""Workarounds for the library versions xlakern runs with, and every jax internal it reads.

NumPy 2.5 removed ``np.row_stack`` (an alias of ``np.vstack``), and numba-cuda 0.30.4 still
registers an overload for it when ``numba.cuda`` is imported, which then fails. Restoring the
alias before that import is harmless: it is the same function NumPy used to provide.

Every use of ``jax._src`` in xlakern goes through this module. Each function says which public
API it stands in for and the jax versions it was tested with (0.10.2 on the CPU, 0.11.2 on the
GPU machine); where jax could drop the internal, a fallback keeps xlakern working with less.

Example::

    >>> from xlakern import _compat
    >>> _compat.jax_backends_started()
    False
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # type: ignore[attr-defined]

import jax  # noqa: E402
from jax._src import config as _jax_config  # noqa: E402  (after the NumPy fix, which must come first)
from jax._src import core as _jax_core  # noqa: E402
from jax._src import dispatch as _jax_dispatch  # noqa: E402

try:  # the jax internals below have fallbacks: each may be missing from some jax
    from jax._src.interpreters import mlir as _jax_mlir
    from jax._src.lib.mlir import ir as _mlir_ir
except ImportError:  # pragma: no cover
    _jax_mlir = _mlir_ir = None
try:
    from jax._src.lib import xla_client as _xla_client
except ImportError:  # pragma: no cover
    _xla_client = None

# jax's tracer and abstract array types. Public as jax.core.Tracer / jax.core.ShapedArray in the
# versions tested, but jax keeps trimming jax.core (it deprecated get_aval in 0.10), so xlakern
# takes them from where jax defines them (jax._src.core, tested 0.10.2 and 0.11.2).
Tracer = _jax_core.Tracer
ShapedArray = _jax_core.ShapedArray


def get_aval(x: Any) -> Any:
    """The abstract value (shape, dtype, ...) of ``x``: ``jax.typeof`` (public since jax 0.6; jax 0.10.2
    no longer has ``jax._src.core.get_aval``, which older versions call it)."""
    typeof = getattr(jax, "typeof", None)
    return typeof(x) if typeof is not None else _jax_core.get_aval(x)


def trace_state_clean() -> bool:
    """Whether no trace (jit, vmap, grad, ...) is active.

    jax has no public query; ``jax._src.core.trace_state_clean`` exists in jax 0.4.3x-0.11
    (tested 0.10.2, 0.11.2). Without it we answer True, and callers check eagerly only.
    """
    check = getattr(_jax_core, "trace_state_clean", None)
    return check is None or bool(check())


def jit_placement_key() -> tuple:
    """What decides where and in which width ``jax.jit`` puts a Python number it is given: the x64 flag
    and the default device (``jax.default_device``'s, which jax keeps in a private config state; jax
    0.10.2 and 0.11.2 have it). A cache of such numbers as arrays keys on this."""
    x64 = getattr(_jax_config, "enable_x64", None)
    device = getattr(_jax_config, "default_device", None)
    return (x64.value if x64 is not None else jax.config.jax_enable_x64,
            device.value if device is not None else None)


def eager_impl(primitive: Any) -> Callable[..., Any]:
    """The implementation that runs ``primitive`` outside a trace: compile it alone and run it.

    Stands in for the default a public ``jax.extend.core.Primitive`` does not have; every jax
    primitive uses ``jax._src.dispatch.apply_primitive`` (tested 0.10.2, 0.11.2).
    """
    return functools.partial(_jax_dispatch.apply_primitive, primitive)


def register_attribute_lowering(python_type: type, lower: Callable[[Any, Any], Any]) -> bool:
    """Lower FFI attributes of ``python_type`` with ``lower(value, ir)`` (``ir`` is jax's MLIR module).

    Stands in for a public way to add attribute types to ``jax.ffi.ffi_call``, which jax does not
    have; ``jax._src.interpreters.mlir.register_attribute_handler`` exists in jax 0.4.3x-0.11
    (tested 0.10.2, 0.11.2). Returns False where it is missing.
    """
    if _jax_mlir is None or not hasattr(_jax_mlir, "register_attribute_handler"):
        return False  # pragma: no cover
    _jax_mlir.register_attribute_handler(python_type, lambda value: lower(value, _mlir_ir))
    return True


def jit_keyed_state(name: str, help: str) -> Any:
    """A jax config state whose value is part of jit's cache key and of the trace context, or None.

    Stands in for nothing public: jax creates such states for its own options (``jax_enable_x64``)
    with ``jax._src.config.string_or_object_state(include_in_jit_key=True,
    include_in_trace_context=True)``, present with this signature in jax 0.4.3x-0.11 (tested
    0.10.2, 0.11.2). None where it is missing or refuses; the caller then clears jax's caches.
    """
    try:
        return _jax_config.string_or_object_state(name, default=None, help=help, include_in_jit_key=True,
                                                  include_in_trace_context=True)
    except Exception:  # pragma: no cover - a jax without this internal API
        return None


def command_buffer_traits() -> dict[str, Any]:
    """Keywords of ``jax.ffi.register_ffi_target`` that mark a target CUDA-graph (command buffer) safe.

    Stands in for the ``traits`` a handler bundle cannot report through the public API;
    ``jax._src.lib.xla_client.CustomCallTargetTraits`` exists in jax 0.4.3x-0.11 (tested 0.10.2,
    0.11.2). Empty where it is missing: graphs are an optimisation.
    """
    traits = getattr(_xla_client, "CustomCallTargetTraits", None)
    return {"traits": traits.COMMAND_BUFFER_COMPATIBLE} if traits is not None else {}


def jax_backends_started() -> bool:
    """Whether JAX has created its backends (after which XLA_FLAGS changes have no effect).

    Stands in for a public "are backends initialised" query, which jax does not have;
    ``jax._src.xla_bridge.backends_are_initialized`` exists in jax 0.4.3x-0.11 (tested 0.10.2,
    0.11.2). Without it we answer False, and XLA silently keeps the flags it started with.
    """
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover
        return False
    probe = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(probe()) if probe is not None else False


# jax.export's name for "allow every custom call" among DisabledSafetyCheck.custom_call targets: its
# module check (jax._src.export._export._check_module) reads it in jax 0.4.3x-0.11 (tested 0.10.2,
# 0.11.2). Where a jax lacks it, xlakern.export's lenient first export fails and export says so.
EXPORT_ALL_CUSTOM_CALLS = "ALL"


def export_stable_targets() -> frozenset[str]:
    """The custom-call targets jax.export accepts without being told (its compatibility list).

    ``jax._src.export._export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE`` in jax 0.4.3x-0.11 (tested 0.10.2,
    0.11.2). Without it the set is empty, and xlakern.export lets jax.export judge every foreign target.
    """
    try:
        from jax._src.export import _export
    except ImportError:  # pragma: no cover
        return frozenset()
    return frozenset(getattr(_export, "_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE", ()))


def xla_custom_call_targets(platform: str) -> frozenset[str] | None:
    """Every custom-call target XLA holds for ``platform`` ('cpu', 'cuda'), by any library, or None if
    unknown. Stands in for a public query, which jax does not have; ``xla_client.custom_call_targets``
    exists in jax 0.4.3x-0.11 (tested 0.10.2, 0.11.2)."""
    listing = getattr(_xla_client, "custom_call_targets", None)
    if listing is None:  # pragma: no cover
        return None
    try:
        return frozenset(listing(platform))
    except Exception:  # pragma: no cover - a platform XLA does not know
        return None


# =========================================================================== Numba private names
#
# The Numba internals the bridges use, each behind one function that says which public API it
# stands in for, if any. Tested with numba 0.68 and numba-cuda 0.30.4. Numba is an optional
# dependency: these functions import it when called, never when xlakern is imported. (The
# section's own imports stand here, not at the top, so it stays one block apart from the jax part.)

import pickle  # noqa: E402
import sys  # noqa: E402


def is_cpu_dispatcher(obj: object) -> bool:
    """Whether ``obj`` is an ``@numba.njit`` function.

    Reads ``numba.core.registry.CPUDispatcher``, which has no public name
    (``numba.extending.is_jitted`` also accepts other targets' dispatchers).
    """
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:  # pragma: no cover - numba not installed
        return False
    return isinstance(obj, CPUDispatcher)


def is_cuda_dispatcher(obj: object) -> bool:
    """Whether ``obj`` is a ``@cuda.jit`` kernel, without importing ``numba.cuda``.

    Reads ``numba.cuda.dispatcher.CUDADispatcher`` (no public name), and only once something
    imported it: no CUDA kernel exists before that.
    """
    module = sys.modules.get("numba.cuda.dispatcher")
    return module is not None and isinstance(obj, getattr(module, "CUDADispatcher", ()))


def numba_threads_launched() -> bool:
    """Whether Numba started its parallel thread pool (and so fixed its threading layer).

    Reads ``numba.np.ufunc.parallel._is_initialized``; the public ``numba.threading_layer()``
    tells the same by raising ValueError until then.
    """
    from numba.np.ufunc import parallel

    return bool(getattr(parallel, "_is_initialized", False))


def launch_numba_threads() -> None:
    """Start Numba's parallel thread pool with the configured threading layer (raises if it
    cannot be loaded; a no-op once started).

    Calls ``numba.np.ufunc.parallel._launch_threads``; the public ``numba.get_num_threads()``
    starts the pool too, as a side effect.
    """
    from numba.np.ufunc import parallel

    parallel._launch_threads()


def cpu_codegen_magic() -> tuple:
    """What Numba's CPU machine code depends on: target triple, host CPU name and features.

    ``numba.core.registry.cpu_target.target_context.codegen().magic_tuple()``, which Numba's
    own ``cache=True`` keys its index with; no public name.
    """
    from numba.core import registry

    return registry.cpu_target.target_context.codegen().magic_tuple()


def uncompiled_cfunc(pyfunc: Any, signature: Any, cache: Any = None) -> Any:
    """A ``@cfunc`` of ``pyfunc`` for ``signature`` (a Numba signature), compiled by its
    ``compile()``; with ``cache`` (an object with Numba's ``load_overload``/``save_overload``),
    the compile result is loaded from and stored to it.

    Stands in for ``numba.cfunc(signature, cache=True)``, which compiles at once and keeps its
    cache beside the source file: builds ``numba.core.ccallback.CFunc`` and sets its ``_cache``.
    """
    from numba.core.ccallback import CFunc

    cfunc = CFunc(pyfunc, (signature.args, signature.return_type), locals={}, options={})
    if cache is not None:
        cfunc._cache = cache
    return cfunc


def compile_result_payload(cres: Any) -> bytes | None:
    """A compile result as the bytes Numba's ``cache=True`` stores, or None when its machine
    code holds this process's addresses and must never be reused elsewhere.

    ``CompileResult._reduce`` serialised with ``numba.core.serialize.dumps``; no public name.
    """
    if any(not f.can_cache for f in cres.lifted) or cres.library.has_dynamic_globals:
        return None
    from numba.core.serialize import dumps

    return dumps(cres._reduce())


def rebuild_compile_result(target_context: Any, payload: bytes) -> Any:
    """The compile result :func:`compile_result_payload` stored, rebuilt without Numba's compiler.

    ``CompileResult._rebuild``, what ``cache=True`` loads with; no public name. Numba's runtime
    (NRT) is installed first, as Numba does before compiling: the stored object code links
    against its symbols.
    """
    from numba.core.compiler import CompileResult

    target_context.refresh()
    return CompileResult._rebuild(target_context, *pickle.loads(payload))


def cuda_code_library(kernel: Any) -> Any:
    """The code library (PTX, cubin, linked files) of a compiled ``@cuda.jit`` kernel, as
    ``dispatcher.compile(argtypes)`` returns it.

    Reads ``kernel._codelibrary``; numba-cuda 0.30.4 also has it as the public ``kernel.library``,
    which the numba.cuda inside older Numba lacks.
    """
    return kernel._codelibrary


def launch_needs_numba(library: Any) -> list[str]:
    """Why kernels of the code ``library`` can only be launched by Numba's own launcher
    (empty when a plain ``cuLaunchKernel`` runs them).

    Reads ``_setup_functions``, ``_teardown_functions`` and ``_linking_files`` of numba-cuda's
    ``CUDACodeLibrary``; no public name.
    """
    reasons = []
    if getattr(library, "_setup_functions", None) or getattr(library, "_teardown_functions", None):
        reasons.append("its linked code needs module setup callbacks")
    if any("nrt" in str(f).lower() for f in getattr(library, "_linking_files", ()) or ()):
        reasons.append("it uses Numba's CUDA runtime (NRT)")
    return reasons


def device_array_at(cuda: Any, context: Any, address: int, shape: tuple[int, ...], dtype: str) -> Any:
    """A Numba device array over the C-contiguous GPU buffer at ``address`` in ``context``,
    owning nothing (zero copy).

    Builds ``numba.cuda.cudadrv.driver.MemoryPointer`` and ``DeviceNDArray`` directly, as the
    public ``numba.cuda.from_cuda_array_interface`` does, but in ``context`` (the one of XLA's
    device) rather than whichever context is current.
    """
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    dt = np.dtype(dtype)
    strides, step = [], dt.itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes == 0:
        return cuda.device_array(shape, dtype=dt)
    pointer = driver.MemoryPointer(context, driver.binding.CUdeviceptr(address), size=nbytes)
    return DeviceNDArray(shape, tuple(reversed(strides)), dt, stream=0, gpu_data=pointer)
