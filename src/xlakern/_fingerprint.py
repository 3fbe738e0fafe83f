"""Content fingerprints of Python functions, so textually identical kernels share one build.

Numba freezes a function's globals and closure values into the machine code it compiles, so
two kernels behave alike exactly when their bytecode, constants, names, closure values and the
globals they read are alike. A value xlakern cannot fingerprint soundly (an arbitrary object)
makes the function unfingerprintable, and callers then fall back to the object's identity.
"""

from __future__ import annotations

import builtins
import hashlib
import types
from dataclasses import dataclass
from typing import Any

import numpy as np


class _Unfingerprintable(Exception):
    pass


@dataclass(frozen=True)
class Fingerprint:
    digest: str | None  # None: identity must be used
    uses_parallel: bool  # the function or a jitted function it calls has parallel=True
    # The digest is content alone and may key a cache shared across processes: nothing in it
    # stands for code by name only (a user module, a user-defined Numba extension).
    portable: bool = False


# Modules whose contents are fixed by their installed version (a cross-process key records
# the versions of those that generate code); any other module is named only, not hashed.
_LIBRARY_MODULES = frozenset(["numpy", "math", "cmath", "numba", "operator", "builtins", "random",
                               "numba_cuda"])


def _is_dispatcher(value: Any) -> bool:
    # Numba CPU and CUDA dispatchers both carry py_func and targetoptions.
    return hasattr(value, "py_func") and hasattr(value, "targetoptions")


class _Walker:
    def __init__(self) -> None:
        self.parallel = False
        self.active: set[int] = set()  # recursion guard for mutually recursive kernels
        self.portable = True

    def value(self, v: Any) -> str:
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            return f"{type(v).__name__}:{v!r}"
        if isinstance(v, np.generic):
            return f"np:{v.dtype.str}:{v.tobytes().hex()}"
        if isinstance(v, np.ndarray):
            data = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
            return f"ndarray:{v.dtype.str}:{v.shape}:{data}"
        if isinstance(v, np.dtype):
            return f"dtype:{v.str}"
        if isinstance(v, (tuple, list)):
            return f"{type(v).__name__}:[" + ",".join(self.value(x) for x in v) + "]"
        if isinstance(v, types.ModuleType):
            if v.__name__.split(".")[0] not in _LIBRARY_MODULES:
                self.portable = False  # an attribute read from it is not hashed
            return f"module:{v.__name__}"
        if isinstance(v, type) and v.__module__.split(".")[0] in ("builtins", "numpy", "numba"):
            return f"type:{v.__module__}.{v.__qualname__}"
        if isinstance(v, types.BuiltinFunctionType) and getattr(builtins, v.__name__, None) is v:
            return f"builtin:{v.__name__}"
        if isinstance(v, np.ufunc):
            return f"ufunc:{v.__name__}"
        if _is_dispatcher(v):
            return "dispatcher:" + self.dispatcher(v)
        if type(v).__module__.startswith("numba"):
            from numba.core import types as nbtypes

            if isinstance(v, nbtypes.Type):
                # numba.float32, types.Array(...): canonical names.
                return f"numba-type:{v}"
            if hasattr(v, "__qualname__") and hasattr(v, "__module__"):
                # numba.carray, cuda.grid and other fixed library functions.
                if str(v.__module__).split(".")[0] not in ("numba", "numba_cuda"):
                    self.portable = False  # a user's @intrinsic or @overload: named, not hashed
                return f"numba-object:{v.__module__}.{v.__qualname__}"
        if isinstance(v, types.FunctionType):
            return "function:" + self.function(v)
        if isinstance(v, types.BuiltinFunctionType) or type(v).__module__ == "numpy":
            name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None)
            if name:
                return f"library:{getattr(v, '__module__', '')}.{name}"
        raise _Unfingerprintable(type(v).__qualname__)

    def code(self, co: types.CodeType) -> str:
        parts = [co.co_name, co.co_code.hex(), repr(co.co_names), repr(co.co_varnames),
                 repr(co.co_freevars), repr(co.co_cellvars), str(co.co_argcount), str(co.co_flags)]
        for c in co.co_consts:
            parts.append("code:" + self.code(c) if isinstance(c, types.CodeType) else self.value(c))
        return "|".join(parts)

    def global_names(self, co: types.CodeType) -> set[str]:
        names = set(co.co_names)
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                names |= self.global_names(c)
        return names

    def function(self, fn: types.FunctionType) -> str:
        if id(fn) in self.active:
            return f"recursive:{fn.__qualname__}"
        self.active.add(id(fn))
        try:
            # Not the qualname: kernels made by two different factories are still textually identical.
            parts = [self.code(fn.__code__), self.value(fn.__defaults__)]
            for cell in fn.__closure__ or ():
                try:
                    parts.append(self.value(cell.cell_contents))
                except ValueError:  # an empty cell
                    parts.append("empty-cell")
            g = fn.__globals__
            for name in sorted(self.global_names(fn.__code__)):
                if name in g:
                    parts.append(f"{name}={self.value(g[name])}")
            return hashlib.sha256("\n".join(parts).encode()).hexdigest()
        finally:
            self.active.discard(id(fn))

    def dispatcher(self, d: Any) -> str:
        options = dict(d.targetoptions)
        if options.get("parallel"):
            self.parallel = True
        return f"{type(d).__qualname__}:{sorted((k, repr(v)) for k, v in options.items())}:" + self.function(d.py_func)


def fingerprint_dispatcher(dispatcher: Any) -> Fingerprint:
    """Fingerprint of a Numba dispatcher: its Python function, options and what it reads."""
    walker = _Walker()
    try:
        digest = hashlib.sha256(walker.dispatcher(dispatcher).encode()).hexdigest()
    except _Unfingerprintable:
        digest = None
    return Fingerprint(digest, walker.parallel or bool(dict(dispatcher.targetoptions).get("parallel")),
                       portable=digest is not None and walker.portable)
