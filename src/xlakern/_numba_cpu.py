"""Numba CPU kernels as JAX operations, called from C++ with no Python per call: ``numba_kernel``.

For each (kernel, input and output dtypes and ranks) xlakern compiles one Numba ``@cfunc``
``int32 cfunc(void** data, int64* dims)`` that rebuilds the arrays with ``numba.carray``, calls
the kernel inside ``try``, and returns 1 if it raised. The runtime's ``xlakern.numba_cpu``
handler calls that function pointer directly. The cfunc is registered in the runtime under a
content key; the HLO carries only that key, so a program compiled in another process can never
reach a stale pointer.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Mapping

import numpy as np

from . import _bridge, _compat, _numba_store, _runtime
from ._bridge_op import BridgeOp, RegisteredKernels
from ._build import Progress
from ._fingerprint import Fingerprint
from ._hoist import without_body_imports
from .errors import CallError

# Element types a Numba CPU kernel can take through xlakern (float16 is checked at compile time:
# Numba's CPU target cannot do arithmetic on it).
from ._dtypes import NUMBA_DTYPES as NUMBA_CPU_DTYPES  # from the one dtype table

_CFUNC_VERSION = 2  # bump when the generated cfunc changes (2: inputs are read-only)

# The compiled cfuncs, which keep their machine code alive: the runtime holds its address forever.
_CFUNCS = RegisteredKernels(_CFUNC_VERSION)
_COMPILE_LOCK = _CFUNCS.lock
_threading_checked = False
_serialize_parallel = False


def _configure_threading() -> bool:
    """Choose Numba's threading layer before its first parallel launch; True if kernels must serialize.

    Numba's default "workqueue" layer aborts the process when two threads enter parallel code at
    once, which XLA's thread pool and several Python threads both do. Unless the user chose a
    layer, xlakern asks for a thread-safe one ("threadsafe": TBB, else OpenMP). If none can be
    loaded (or workqueue was already started), parallel kernels run one at a time under a lock.
    """
    global _threading_checked, _serialize_parallel
    if _threading_checked:
        return _serialize_parallel
    import numba

    with _COMPILE_LOCK:
        if not _threading_checked:
            if not _compat.numba_threads_launched() and numba.config.THREADING_LAYER == "default":
                numba.config.THREADING_LAYER = "threadsafe"
                try:
                    _compat.launch_numba_threads()
                except Exception:
                    numba.config.THREADING_LAYER = "default"
            _compat.launch_numba_threads()
            _serialize_parallel = numba.threading_layer() == "workqueue"
            _threading_checked = True
    return _serialize_parallel


_readonly_view = None


def _readonly() -> Any:
    """A Numba intrinsic giving a read-only view of an array (the same data, typed readonly).

    Inputs are XLA's buffers, which the caller's arrays may share: typed read-only, a kernel that
    writes one fails to compile ("Cannot modify readonly array") instead of changing them.
    """
    global _readonly_view
    if _readonly_view is None:
        from numba.core.imputils import impl_ret_borrowed
        from numba.extending import intrinsic

        @intrinsic
        def readonly_view(typingctx, arr):
            def codegen(context, builder, signature, args):
                return impl_ret_borrowed(context, builder, signature.return_type, args[0])

            return arr.copy(readonly=True)(arr), codegen

        _readonly_view = readonly_view
    return _readonly_view


def _cfunc_source(n_args: int, ranks: tuple[int, ...], n_inputs: int) -> str:
    lines = ["def cfunc(data, dims):"]
    offset = 0
    for a, rank in enumerate(ranks):
        shape = "(" + "".join(f"dims[{offset + i}], " for i in range(rank)) + ")"
        view = f"carray(data[{a}], {shape}, dt{a})"
        lines.append(f"    a{a} = {f'readonly({view})' if a < n_inputs else view}")
        offset += rank
    args = ", ".join(f"a{a}" for a in range(n_args))
    lines += ["    try:", f"        kernel({args})", "    except Exception:", "        return 1", "    return 0"]
    return "\n".join(lines) + "\n"


def _njit_like(kernel: Any) -> Any:
    import numba

    return numba.jit(**dict(kernel.targetoptions))


class _DiskCache:
    """Numba's per-function cache interface (``load_overload``/``save_overload``) for one
    generated cfunc, kept in xlakern's cache under a content key instead of beside a source file.

    A hit rebuilds Numba's compile result from its object code, as Numba's own ``cache=True``
    does, without running Numba's compiler.
    """

    def __init__(self, key: str):
        self.key = key

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        payload = _numba_store.load(_numba_store.CPU_KIND, self.key)
        if payload is None:
            return None
        try:
            return _compat.rebuild_compile_result(target_context, payload)
        except Exception as e:  # written by another Numba, or it imports what is gone: compile
            logging.getLogger("xlakern").info("xlakern: stored Numba cfunc %s unusable (%s)", self.key[:12], e)
            return None

    def save_overload(self, sig: Any, cres: Any) -> None:
        try:
            payload = _compat.compile_result_payload(cres)
        except Exception as e:
            logging.getLogger("xlakern").info("xlakern: cannot store Numba cfunc %s (%s)", self.key[:12], e)
            return
        if payload is not None:  # None: machine code holding this process's addresses
            _numba_store.store(_numba_store.CPU_KIND, self.key, payload)


def _disk_key(fp: Fingerprint, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int) -> str | None:
    """The cross-process key of a cfunc, or None when it must be compiled in each process.

    That is when the kernel's fingerprint is not portable, and when it runs parallel loops: a
    cfunc calling a parfor kernel, once reloaded from object code, crashes on its first call
    (Numba's own ``cfunc(cache=True)`` does too, as of Numba 0.68).
    """
    if not fp.portable or fp.uses_parallel:
        return None
    import numba

    options = tuple(getattr(numba.config, n, None) for n in ("OPT", "BOUNDSCHECK", "DEBUGINFO_DEFAULT"))
    return _numba_store.disk_key(_numba_store.CPU_KIND, _CFUNC_VERSION, _compat.cpu_codegen_magic(), options,
                                 fp.digest, dtypes, ranks, n_inputs)


def _compile_cfunc(kernel: Any, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int,
                   disk_key: str | None = None) -> Any:
    """The compiled cfunc; with ``disk_key``, loaded from xlakern's cache when stored there."""
    import numba
    from numba import types

    # __name__ makes the cfunc's Numba environment importable when a cache hit rebuilds it.
    namespace: dict[str, Any] = {"carray": numba.carray, "kernel": kernel, "readonly": _readonly(),
                                 "__name__": __name__}
    for a, dt in enumerate(dtypes):
        namespace[f"dt{a}"] = np.dtype(dt)
    exec(compile(_cfunc_source(len(dtypes), ranks, n_inputs), f"<xlakern cfunc for {kernel.__name__}>", "exec"),
         namespace)
    signature = types.int32(types.CPointer(types.voidptr), types.CPointer(types.int64))
    cfunc = _compat.uncompiled_cfunc(namespace["cfunc"], signature,
                                     _DiskCache(disk_key) if disk_key is not None else None)
    with Progress(f"compiling numba kernel {kernel.__name__}", quiet=False):
        cfunc.compile()
    return cfunc


def _registered_cfunc(kernel: Any, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int) -> str:
    """The runtime key of this kernel specialisation's cfunc, compiling and registering it on first use."""

    def compile_and_register(key: str, fp: Fingerprint) -> Any:
        serialize = _configure_threading() if fp.uses_parallel else False
        try:
            cfunc = _compile_cfunc(without_body_imports(kernel, _njit_like(kernel)), dtypes, ranks, n_inputs,
                                   _disk_key(fp, dtypes, ranks, n_inputs))
        except Exception as e:
            sig = ", ".join(f"{d}[{'x'.join(':' * r) or '0-d'}]" for d, r in zip(dtypes, ranks))
            hint = ""
            if "float16" in dtypes:
                hint = " Numba's CPU target does not support float16 arithmetic; cast to float32 first."
            if "readonly array" in str(e):
                hint = (" Its inputs are read-only (they are XLA's buffers, possibly your arrays): write "
                        "results into its output arrays, or alias an input to an output with "
                        "input_output_aliases and write the output.")
            raise CallError(f"numba_kernel: Numba could not compile '{kernel.__name__}' for arrays ({sig}): "
                            f"{type(e).__name__}: {e}.{hint}") from e
        _runtime.register_numba_cpu_kernel(key, kernel.__name__, cfunc.address, list(dtypes), list(ranks),
                                           n_inputs, serialize)
        return cfunc

    return _CFUNCS.kernel_for(kernel, (dtypes, ranks, n_inputs), compile_and_register).key


def _array_at(address: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0 or address == 0:
        return np.empty(shape, dt)
    buf = (ctypes.c_char * (count * dt.itemsize)).from_address(address)
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def _explain_error(key: str, arrays: list, n_inputs: int, stream: int, device: int) -> str:
    """Runtime hook: the kernel's cfunc reported an exception; re-run the kernel to recover which."""
    registered = _CFUNCS.find(key)
    if registered is None:
        return "it raised an exception"
    views = [_array_at(addr, shape, dtype) for addr, shape, dtype in arrays]
    for v in views[:n_inputs]:
        v.flags.writeable = False  # as in the cfunc: the re-run must not write inputs either
    try:
        without_body_imports(registered.kernel, _njit_like(registered.kernel))(*views)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ("it raised an exception; re-running it on the same arrays to recover the message did not raise "
            "(its failure may depend on outputs it had already written)")


class NumbaKernel(BridgeOp):
    """A Numba CPU kernel as a function of JAX arrays; made by :func:`numba_kernel`."""

    wrapper = "numba_kernel"
    target = _bridge.NUMBA_CPU_TARGET
    dtypes = NUMBA_CPU_DTYPES
    platform = "cpu"
    kind = "Numba CPU kernels"
    python_hook = (_runtime.PythonHook.EXPLAIN_NUMBA_ERROR, _explain_error)

    def __init__(self, kernel: Any, outs: Any, vmap_method: str | None,
                 input_output_aliases: Mapping[int, int] | None, zeroed_outputs: Any = None):
        self.kernel = kernel
        super().__init__(getattr(kernel, "__name__", "kernel"), kernel.py_func, outs, vmap_method,
                         input_output_aliases, zeroed_outputs)

    def _arity_note(self) -> str:
        n_outs = len(self._flat_outs)
        return f" (the kernel's {self._n_inputs + n_outs} parameters minus {n_outs} output(s))"

    def _register(self, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int) -> str:
        return _registered_cfunc(self.kernel, dtypes, ranks, n_inputs)


def numba_kernel(kernel: Any, outs: Any, *, vmap_method: str | None = None,
                 input_output_aliases: Mapping[int, int] | None = None, zeroed_outputs: Any = None) -> NumbaKernel:
    """Wrap an ``@numba.njit`` kernel as a JAX operation on CPU arrays.

    The kernel takes its inputs, then one array per output, and writes the outputs in place.
    The returned function takes JAX arrays, works eagerly and under ``jax.jit``, and returns
    arrays with the structure of ``outs`` (one ``jax.ShapeDtypeStruct`` → one array). Each call
    runs the compiled kernel from C++: no Python and no GIL per call.

    ``vmap_method`` and ``input_output_aliases`` go to ``jax.ffi.ffi_call``. With
    ``"broadcast_all"`` or ``"expand_dims"`` the runtime runs the kernel once per batch element
    inside one call. A kernel that raises makes the call raise :class:`KernelError` naming it.
    Parallel kernels (``parallel=True``, ``numba.prange``) get a thread-safe Numba threading
    layer when one is available; otherwise they run one at a time.

    XLA hands kernels uninitialised output buffers. ``zeroed_outputs`` (output indices,
    ``True`` for all, or a callable of a dict of static parameters, here empty, returning
    indices) makes the handler ``memset`` those outputs to zero inside the same call, before
    the kernel runs: what a histogram or scatter-add needs. Under vmap the whole batched
    buffer is cleared once. An output cannot be both zeroed and aliased to an input.

    Example::

        @numba.njit
        def add(x, y, out):
            for i in range(out.size):
                out[i] = x[i] + y[i]

        f = xlakern.numba_kernel(add, outs=jax.ShapeDtypeStruct((8,), jnp.float32))
        z = jax.jit(f)(jnp.ones(8, jnp.float32), jnp.arange(8, dtype=jnp.float32))
    """
    if not _compat.is_cpu_dispatcher(kernel):
        what = type(kernel).__name__
        hint = " (a @cuda.jit kernel: use numba_cuda_kernel)" if hasattr(kernel, "targetoptions") else ""
        raise CallError(f"numba_kernel needs an @numba.njit function; got {what}{hint}")
    return NumbaKernel(kernel, outs, vmap_method, input_output_aliases, zeroed_outputs)


def numba_kernel_cache_info() -> dict[str, int]:
    """Counts of what the Numba bridges hold in this process.

    ``cfuncs``: compiled Numba CPU cfuncs (one per kernel content and dtype/rank
    signature); ``runtime_kernels``: kernels registered with the runtime's generic targets.

    Example::

        >>> xlakern.numba_kernel_cache_info()
        {'cfuncs': 3, 'runtime_kernels': 5}
    """
    return {"cfuncs": len(_CFUNCS), "runtime_kernels": _runtime.kernel_count()}
