"""Call time: a loaded module's functions, and what a call checks before it reaches XLA.

``CompiledModule`` holds one ``CompiledFunction`` per entry point. A call checks its arrays
(dtype, rank, size) and attributes (names, types, ranges), turns the attributes into exactly the
NumPy types the generated handler decodes, refuses a platform the module was not built for, and
runs the module's control target through :func:`xlakern._bridge.run_ffi`.

Example::

    mod = xlakern.load_cpp_inline("ops", SRC)          # a CompiledModule (see _loading)
    y = mod.scale_by(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), scale_factor=3.0)
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import ml_dtypes
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import _bridge, _codegen, _compat
from ._arrays import as_struct, describes_array
from ._dtypes import SUPPORTED_DTYPES
from ._spec import EntryPoint
from .errors import CallError

__all__ = ["CompiledModule", "CompiledFunction"]

# Most dimensions an xk::Tensor holds (XK_MAX_DIMS of xlakern/config.h; test_dtype_table compares them).
_MAX_DIMS = 8


class _UInt64Bits(int):
    """A uint64 attribute value of 2**63 or more.

    jax turns NumPy integer attributes into MLIR attributes through a binding that takes
    int64, which rejects such values; this type is lowered with the same 64 bits given as
    their two's-complement int64, which XLA hands to the handler as the intended uint64.
    """


_uint64_handler_installed = False


def _large_uint64(value: int) -> Any:
    global _uint64_handler_installed
    if not _uint64_handler_installed:
        if not _compat.register_attribute_lowering(
                _UInt64Bits, lambda v, ir: ir.IntegerAttr.get(ir.IntegerType.get_unsigned(64), int(v) - 2**64)):
            raise CallError(  # pragma: no cover - a jax without the internal
                f"uint64 attribute {value} >= 2**63 is not supported by this jax version; pass it as an input array")
        _uint64_handler_installed = True
    return _UInt64Bits(value)


def _coerce_attr(fn: str, name: str, attr_type: str, value: Any) -> Any:
    """Turn a Python/NumPy scalar into exactly the NumPy type the handler decodes."""
    if isinstance(value, jax.core.Tracer) or (hasattr(value, "shape") and getattr(value, "shape", ()) != ()):
        raise CallError(
            f"{fn}: attribute '{name}' must be a Python or NumPy scalar known at trace time "
            f"(attributes are static); got {type(value).__name__}. Pass traced values as input arrays"
        )
    if hasattr(value, "item") and not isinstance(value, (np.generic,)):
        value = value.item()
    bad = CallError(f"{fn}: attribute '{name}' is declared {attr_type}; got {value!r} ({type(value).__name__})")
    if attr_type == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise bad
        return np.bool_(value)
    if attr_type.startswith(("int", "uint")):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise bad
        info = np.iinfo(attr_type)
        if not info.min <= int(value) <= info.max:
            raise CallError(f"{fn}: attribute '{name}' = {value} does not fit in {attr_type} "
                            f"[{info.min}, {info.max}]")
        if attr_type == "uint64" and int(value) >= 2**63:
            return _large_uint64(int(value))
        return np.dtype(attr_type).type(int(value))
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
        raise bad
    if attr_type in ("float16", "bfloat16"):
        if attr_type == "bfloat16":
            dt = np.dtype(ml_dtypes.bfloat16)
        else:
            dt = np.dtype(np.float16)
        return np.array(value, dtype=dt).view(np.uint16)[()]
    return np.dtype(attr_type).type(value)


def _check_array(fn: str, what: str, i: int, x: Any) -> None:
    if not describes_array(x):
        raise CallError(f"{fn}: {what} {i} must be an array (or jax.ShapeDtypeStruct for outputs); got "
                        f"{type(x).__name__}")
    dtype, shape = x.dtype, x.shape
    if np.dtype(dtype).name not in SUPPORTED_DTYPES:
        raise CallError(f"{fn}: {what} {i} has dtype {np.dtype(dtype).name}, which xk::Tensor cannot carry; "
                        f"supported: {', '.join(sorted(SUPPORTED_DTYPES))}")
    if len(shape) > _MAX_DIMS:
        raise CallError(f"{fn}: {what} {i} has {len(shape)} dimensions; kernels take at most {_MAX_DIMS}. "
                        f"Reshape it first")
    _bridge.check_size(fn, what, i, shape, dtype)


class CompiledFunction:
    """One entry point of a :class:`CompiledModule`, callable on JAX arrays.

    Example::

        y = mod.scale_by(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), scale_factor=3.0)
    """

    def __init__(self, module: "CompiledModule", entry: EntryPoint):
        self.module = module
        self.entry = entry
        self.target = f"{module.name}.{entry.name}"
        self.__name__ = entry.name
        self.__doc__ = f"FFI target '{self.target}' with arg_spec '{entry.spec}' ({entry.source}, line {entry.line})."

    def __repr__(self) -> str:
        return f"<xlakern function {self.target}: {self.entry.spec}>"

    def __call__(self, *arrays: Any, outs: Any, vmap_method: str | None = None,
                 input_output_aliases: Mapping[int, int] | None = None, zeroed_outputs: Any = None,
                 **attrs: Any) -> Any:
        """Call the entry point on JAX arrays; ``outs`` describes the outputs, keywords are its attributes.

        ``zeroed_outputs`` (output indices, ``True`` for all, or a callable of the attribute
        dict returning indices) clears those outputs inside the same FFI call before the entry
        point runs (``memset`` on the CPU, ``cudaMemsetAsync`` on XLA's stream on the GPU).
        With ``vmap_method="broadcast_all"`` or ``"expand_dims"``, a batched call runs the entry
        point once per batch element, each time on tensors of the shapes it was traced with.

        Example::

            counts = mod.histogram(x, outs=jax.ShapeDtypeStruct((64,), jnp.int32), zeroed_outputs=[0])
        """
        e = self.entry
        if len(arrays) != len(e.args):
            raise CallError(f"{self.target} takes {len(e.args)} input array(s) (spec '{e.spec}'); got {len(arrays)}")
        for i, x in enumerate(arrays):
            _check_array(self.target, "input", i, x)
        flat_outs, treedef = jax.tree.flatten(outs)
        if len(flat_outs) != len(e.rets):
            raise CallError(f"{self.target} writes {len(e.rets)} output(s) (spec '{e.spec}'); outs= describes "
                            f"{len(flat_outs)}. Pass one jax.ShapeDtypeStruct per 'ret'")
        for i, o in enumerate(flat_outs):
            _check_array(self.target, "output", i, o)
        declared = {p.attr_name: p.attr_type for p in e.attrs}
        missing = [n for n in declared if n not in attrs]
        unknown = [n for n in attrs if n not in declared]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing attribute(s) {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown keyword(s) {', '.join(unknown)}")
            raise CallError(f"{self.target}: {'; '.join(parts)}. It takes: "
                            f"{', '.join(f'{n}: {t}' for n, t in declared.items()) or 'no attributes'}")
        values = {n: _coerce_attr(self.target, n, declared[n], v) for n, v in attrs.items()}
        traced = any(isinstance(x, jax.core.Tracer) for x in arrays) or (not arrays and _under_trace())
        if not traced:
            _check_eager_platform(self, arrays)
        # The control target: zeroed outputs, and the traced (unbatched) ranks for per-element vmap.
        zero = _bridge.zeroed_mask(self.target, zeroed_outputs, len(flat_outs), input_output_aliases, attrs)
        values[_codegen.CONTROL_ATTR] = np.array(
            [zero, *(len(x.shape) for x in arrays), *(len(o.shape) for o in flat_outs)], np.int64)
        results = _bridge.run_ffi(_codegen.control_target(self.target),
                                  [as_struct(o, lambda i=i: f"{self.target}: output {i}") for i, o in enumerate(flat_outs)],
                                  arrays, values, vmap_method, input_output_aliases)
        if traced:  # the platform is known only when the trace is lowered: check it there
            results = [_platform_guard().bind(r, target=self.target, platform=self.module.platform)
                       for r in results]
        return jax.tree.unflatten(treedef, list(results))


def _under_trace() -> bool:
    """Whether a trace (jit, vmap, ...) is active, for calls without inputs to tell by."""
    return not _compat.trace_state_clean()


_PLATFORM_WORDS = {"cpu": "the CPU", "cuda": "a GPU", "gpu": "a GPU"}


def _wrong_platform(target: str, module_platform: str, where: str, found: str) -> CallError:
    if module_platform == "cuda":
        fix = ("put the inputs on a GPU (jax.device_put(x, jax.devices('gpu')[0])), or build the module "
               "for the CPU with load_cpp_inline/load_cpp_file/load_cpp_dir")
    else:
        fix = ("put the inputs on the CPU (jax.device_put(x, jax.devices('cpu')[0]) or "
               "jax.default_device(jax.devices('cpu')[0])), or build a CUDA version with load_cuda_*")
    kind = "CUDA" if module_platform == "cuda" else "CPU"
    return CallError(f"{target} is a {kind} kernel (it runs on {_PLATFORM_WORDS[module_platform]} only), but "
                     f"{where} on platform '{found}'; {fix}")


def _check_eager_platform(fn: "CompiledFunction", arrays: Sequence[Any]) -> None:
    """A concrete call runs where its inputs live (or on the default device): refuse a wrong one
    before XLA reports a missing handler."""
    wanted = "gpu" if fn.module.platform == "cuda" else "cpu"
    for i, x in enumerate(arrays):
        if isinstance(x, jax.Array):
            found = {d.platform for d in x.devices()}
            if found and found != {wanted}:
                raise _wrong_platform(fn.target, fn.module.platform, f"input {i} lives", ", ".join(sorted(found)))
            return
    device = jax.config.jax_default_device
    if isinstance(device, str):
        found = device.lower()
    elif device is not None:
        found = device.platform
    else:
        found = jax.devices()[0].platform
    if _PLATFORM_NAMES.get(found, found) != wanted:
        raise _wrong_platform(fn.target, fn.module.platform, "the call would run on the default device", found)


_PLATFORM_NAMES = {"cuda": "gpu", "rocm": "gpu", "host": "cpu"}
_guard = None
_guard_lock = threading.Lock()


def _platform_guard():
    """An identity primitive on a module function's outputs whose lowering rule refuses
    platforms the module was not built for, as a CallError at jit time (not XLA's
    NOT_FOUND when it compiles). It emits no operation."""
    global _guard
    with _guard_lock:
        if _guard is None:
            # Here, not at the top: jax.extend imports Pallas too (~17 ms that `import xlakern` skips).
            from jax.extend.core import Primitive

            prim = Primitive("xlakern_platform_check")
            prim.def_impl(_compat.eager_impl(prim))
            prim.def_abstract_eval(lambda x, **_: x)

            def lower(ctx, x, *, target, platform):
                # Without the attribute (a jax that lacks it), XLA's own error remains.
                for found in getattr(ctx.module_context, "platforms", None) or ():
                    if _PLATFORM_NAMES.get(found, found) != _PLATFORM_NAMES.get(platform, platform):
                        raise _wrong_platform(target, platform, "this jitted call is lowered", found)
                return [x]

            mlir.register_lowering(prim, lower)
            batching.primitive_batchers[prim] = lambda args, dims, **kw: (prim.bind(*args, **kw), dims[0])
            ad.primitive_jvps[prim] = lambda primals, tangents, **kw: (prim.bind(*primals, **kw), tangents[0])
            _guard = prim
        return _guard


class CompiledModule:
    """A loaded module: one callable per entry point, registered as ``"<name>.<fn>"`` FFI targets.

    Attributes:
        name: the module name (prefix of every target).
        path: the shared library it was loaded from.
        functions: entry point name -> canonical arg_spec.
        targets: entry point name -> FFI target name.

    Example::

        mod = xlakern.load_cpp_inline("ops", SRC)
        y = mod.add_one(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
        y = jax.ffi.ffi_call(mod.targets["add_one"], jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    """

    def __init__(self, name: str, path: Path, key: str, platform: str, entry_points: Sequence[EntryPoint]):
        self.name = name
        self.path = path
        self.key = key
        self.platform = platform
        self.entries = {e.name: e for e in entry_points}
        self.functions = {e.name: e.spec for e in entry_points}
        self.targets = {e.name: f"{name}.{e.name}" for e in entry_points}
        self.base_key = key  # the cache entry's key; ``key`` adds the headers the build read
        self.headers: dict[str, str] = {}
        self._callables = {e.name: CompiledFunction(self, e) for e in entry_points}

    def __getattr__(self, item: str) -> CompiledFunction:
        callables = self.__dict__.get("_callables", {})
        if item in callables:
            return callables[item]
        raise AttributeError(f"module '{self.__dict__.get('name')}' has no function '{item}'; "
                             f"it has: {', '.join(callables) or 'none'}")

    def __getitem__(self, item: str) -> CompiledFunction:
        return self._callables[item]

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._callables))

    def __repr__(self) -> str:
        return f"<xlakern module '{self.name}' ({self.platform}): {', '.join(self.functions)}>"


# Keywords a call takes besides the attributes (read from CompiledFunction.__call__, plus those
# a call may gain): an attribute spelled like one could never be passed.
CALL_KEYWORDS = frozenset(
    [p.name for p in inspect.signature(CompiledFunction.__call__).parameters.values()
     if p.kind is inspect.Parameter.KEYWORD_ONLY] + ["zeroed_outputs"])

