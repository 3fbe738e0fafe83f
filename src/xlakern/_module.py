"""Loading C++/CUDA sources as JAX FFI targets: ``load_cpp_inline`` and friends."""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import shlex
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import ml_dtypes
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import _bridge, _build, _cache, _codegen, _compat, _runtime, _toolchain
from ._arrays import as_struct, describes_array
from ._dtypes import SUPPORTED_DTYPES
from ._spec import EntryPoint, Source, resolve_entry_points
from .errors import CallError, OptionError, RegistrationError, SpecError, XlakernError

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # used with fullmatch: "$" would accept a final newline
# Module names name a cache directory and a library file (lib<name>.so, beside temp and lock
# names built from it): this keeps every such path component far below NAME_MAX (255).
MAX_NAME_LENGTH = 100
_MODULES: dict[str, "CompiledModule"] = {}
_LOAD_LOCK = threading.RLock()

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
                                  [as_struct(o) for o in flat_outs],
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

    def __init__(self, name: str, path: Path, key: str, platform: str, entries: Sequence[EntryPoint]):
        self.name = name
        self.path = path
        self.key = key
        self.platform = platform
        self.entries = {e.name: e for e in entries}
        self.functions = {e.name: e.spec for e in entries}
        self.targets = {e.name: f"{name}.{e.name}" for e in entries}
        self.base_key = key  # the cache entry's key; ``key`` adds the headers the build read
        self.headers: dict[str, str] = {}
        self._callables = {e.name: CompiledFunction(self, e) for e in entries}

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


def _as_flags(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise XlakernError(f"{what} must be a string or a list of strings; got {value!r}")


def _register(name: str, key: str, lib: "_cache.VerifiedLibrary", platform: str,
              entries: Sequence[EntryPoint]) -> None:
    """Load ``lib`` as module ``name`` and register all its targets with XLA, or none.

    Everything that can fail without XLA (loading, finding each handler) is done before XLA sees
    any handler. Should XLA itself refuse a target part-way, the module stays loaded and pinned
    for the targets it accepted (XLA keeps their handler pointers) and is never registered again.
    """
    xla_platform = "cpu" if platform == "cpu" else "CUDA"
    try:
        fresh = _runtime.open_module(name, key, str(lib.path), xla_platform, lib.fd)
    except _runtime.ModuleConflict as e:
        raise RegistrationError(_conflict_message(name, str(e))) from None
    except RuntimeError as e:
        raise RegistrationError(
            f"cannot load module '{name}': {e}. Delete the build with xlakern.clear_cache({name!r}) and load again"
        ) from None
    if not fresh:
        return
    try:
        handlers = []
        for e in entries:
            target = f"{name}.{e.name}"
            handlers.append((target, _runtime.handler_capsule(name, _codegen.handler_symbol(e.name)), {}))
            # mod.fn(...) calls the control target; the plain one keeps the arg_spec's exact attributes.
            handlers.append((_codegen.control_target(target),
                             _runtime.handler_capsule(name, _codegen.control_handler_symbol(e.name)), {}))
    except RuntimeError as exc:
        _runtime.forget(name)  # XLA has seen nothing of it yet
        raise RegistrationError(f"module '{name}' cannot be registered: {exc}. Delete the build with "
                                f"xlakern.clear_cache({name!r}) and load again") from None
    try:
        _bridge.start_backend(xla_platform)  # a backend that cannot start fails here, before XLA sees anything
    except Exception as exc:
        _runtime.forget(name)
        raise RegistrationError(f"cannot start jax's {xla_platform} backend to register module '{name}': "
                                f"{exc}") from exc
    _runtime.pin(name)
    accepted: list[str] = []
    try:
        _bridge.register_targets(xla_platform, handlers, accepted=accepted.append)
    except RegistrationError as exc:
        raise RegistrationError(
            f"{exc}. Module '{name}' registered {len(accepted)} of its {len(handlers)} target(s) "
            f"({', '.join(accepted) or 'none'}); those stay usable, but the module cannot be loaded again "
            f"under this name in this process: load it under a new name, or restart Python") from exc.__cause__
    finally:
        _runtime.add_targets(name, accepted, len(accepted) == len(handlers))


# Keywords a call takes besides the attributes (read from CompiledFunction.__call__, plus those
# a call may gain): an attribute spelled like one could never be passed.
_CALL_KEYWORDS = frozenset(
    [p.name for p in inspect.signature(CompiledFunction.__call__).parameters.values()
     if p.kind is inspect.Parameter.KEYWORD_ONLY] + ["zeroed_outputs"])


def _check_attribute_names(module: str, entries: Sequence[EntryPoint]) -> None:
    for e in entries:
        for p in e.attrs:
            if p.attr_name in _CALL_KEYWORDS:
                raise SpecError(
                    f"{module}.{e.name}: attribute 'attr.{p.attr_name}' (from {e.source}, line {e.line}) is named "
                    f"like the call keyword {p.attr_name}=, so it could never be passed; rename the attribute "
                    f"(call keywords: {', '.join(sorted(_CALL_KEYWORDS))})")


def _check_module_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise SpecError(f"module name {name!r} must be a C identifier (letters, digits, _, not starting with a "
                        f"digit), since it prefixes the FFI target names '<name>.<function>'")
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError(f"module name '{name[:20]}...' is {len(name)} characters long; at most {MAX_NAME_LENGTH} "
                        f"are allowed, since it names the module's files in the cache. Choose a shorter name")
    if name + "." == _bridge.RESERVED_PREFIX:
        raise SpecError(f"module name '{name}' is reserved: targets '{_bridge.RESERVED_PREFIX}*' are xlakern's "
                        f"own (numba_cpu, cuda_image, python_callable). Choose another name")


def _conflict_message(name: str, detail: str) -> str:
    return (
        f"{detail}. XLA cannot replace an FFI target once registered, so one process holds one build per "
        f"module name. Load the changed source under a new name (e.g. name='{name}_v2'), or restart Python "
        f"to replace it"
    )


def _load(name: str, sources: list[Source], functions: Any, platform: str, *,
          optimization_level: int = 3, use_fast_math: bool = False, extra_cflags: Any = None,
          extra_cuda_cflags: Any = None, extra_ldflags: Any = None, extra_include_paths: Any = None,
          compute_capability: Any = None, allow_cuda_graph: bool = True,
          build_directory: str | os.PathLike | None = None, force_rebuild: bool = False,
          verbose: bool = False, quiet: bool = False) -> CompiledModule:
    _check_module_name(name)
    if not isinstance(optimization_level, int) or not 0 <= optimization_level <= 3:
        raise XlakernError(f"optimization_level must be 0, 1, 2 or 3; got {optimization_level!r}")
    if platform == "cpu" and (use_fast_math or extra_cuda_cflags or compute_capability is not None):
        raise XlakernError("use_fast_math, extra_cuda_cflags and compute_capability apply to CUDA modules only; "
                           "use extra_cflags=['-ffast-math'] for C++")
    entries = resolve_entry_points(sources, functions, platform=platform)
    _check_attribute_names(name, entries)
    # Relative paths mean the caller's working directory (compilers run in a temp dir).
    include_paths = tuple(str(Path(p).expanduser().resolve()) for p in _as_flags(extra_include_paths,
                                                                                "extra_include_paths"))
    for p in include_paths:
        if not Path(p).is_dir():
            raise XlakernError(f"extra_include_paths: {p} is not a directory")
    host = _toolchain.host_compiler()
    cuda = _toolchain.nvcc() if platform == "cuda" else None
    options = _build.BuildOptions(
        platform=platform,
        optimization_level=optimization_level,
        use_fast_math=bool(use_fast_math),
        extra_cflags=_build.absolute_path_flags(_as_flags(extra_cflags, "extra_cflags")),
        extra_cuda_cflags=_build.absolute_path_flags(_as_flags(extra_cuda_cflags, "extra_cuda_cflags")),
        extra_ldflags=_build.absolute_path_flags(_as_flags(extra_ldflags, "extra_ldflags")),
        extra_include_paths=include_paths,
        arch=_toolchain.cuda_arch(compute_capability) if platform == "cuda" else None,
        allow_cuda_graph=bool(allow_cuda_graph),
    )
    base_key = _build.cache_key(name, sources, entries, options, host, cuda)

    with _LOAD_LOCK:
        existing = _MODULES.get(name)
        # Checked before compiling, force_rebuild or not: XLA could never register other content as `name`.
        if existing is not None and not (existing.base_key == base_key
                                         and _build.headers_unchanged(existing.headers)):
            raise RegistrationError(_conflict_message(
                name, f"module '{name}' is already registered from other content (key {existing.key[:12]}, "
                      f"new key {base_key[:12]}; the sources, options or a header they include changed since)"))
        if existing is not None and not force_rebuild:
            return existing
        root = Path(build_directory).expanduser().resolve() if build_directory else _cache.cache_root()
        slot = _cache.Entry(root, name, base_key)

        def headers_unchanged(meta: dict) -> bool:  # a build is valid only while its headers are
            return _build.headers_unchanged(meta.get("headers"))

        lib = None if force_rebuild else slot.open_library(headers_unchanged)
        if lib is None:
            kind = f"CUDA, sm_{options.arch}" if platform == "cuda" else "C++"
            builder = _build.Builder(name, sources, entries, options, host, cuda, verbose,
                                     store=_build.ObjectStore(root), reuse_objects=not force_rebuild)
            with _build.Progress(f"compiling {name} ({kind})", quiet):
                try:
                    slot.build(builder, lambda: {"name": name, "platform": platform,
                                                 "functions": {e.name: e.spec for e in entries},
                                                 "headers": builder.headers},
                               force=force_rebuild, accept=headers_unchanged)
                except OSError as e:  # the cache entry itself: lock, temp dir, publishing
                    raise _build.os_error(name, e, root) from None
            # Loaded from what is verified now, not from the build's path.
            try:
                lib = slot.open_library(headers_unchanged)
            except OSError as e:
                raise _build.os_error(name, e, root) from None
            if lib is None:
                raise RegistrationError(f"the build of module '{name}' at {slot.library} changed or vanished "
                                        f"right after it was published; load it again")
        headers = dict(slot.meta.get("headers") or {})
        key = _build.full_key(base_key, headers)
        with lib:
            _register(name, key, lib, platform, entries)
        module = CompiledModule(name, lib.path, key, platform, entries)
        module.base_key, module.headers = base_key, headers
        if existing is None or existing.key != key:
            _MODULES[name] = module
        return _MODULES[name]


_CPP_OPTIONS_DOC = """
        optimization_level: ``-O`` level, 0 to 3 (default 3).
        extra_cflags: more host compiler flags, a list or one shell-quoted string.
        extra_ldflags: more linker flags (``-L``, ``-l``), a list or a string.
        extra_include_paths: directories added with ``-I`` (relative to the working directory).
        build_directory: cache root for this module instead of :func:`get_cache_dir`.
        force_rebuild: compile even when the cache holds this build.
        verbose: print the compiler commands.
        quiet: no "compiling …" line on stderr (also ``XLAKERN_QUIET=1``)."""

_CUDA_OPTIONS_DOC = _CPP_OPTIONS_DOC + """
        use_fast_math: compile with nvcc's ``--use_fast_math``.
        extra_cuda_cflags: more nvcc flags, a list or a string.
        compute_capability: target GPU as ``"9.0"``, ``(9, 0)`` or ``90``; default: the GPU JAX
            sees, or ``$XLAKERN_CUDA_ARCH``.
        allow_cuda_graph: let XLA capture the handlers into CUDA graphs (default True)."""

_RETURNS_DOC = """

    Returns:
        The :class:`CompiledModule`; the same object again for the same name and content.

    Raises:
        SpecError: an entry point's arg_spec does not match its signature (before compiling).
        CompilationError: the compiler rejected the sources.
        RegistrationError: ``name`` is loaded in this process from other content (checked
            before compiling: XLA cannot replace a registered target).
        OptionError: an unknown keyword option (the message names the closest one)."""


_CUDA_ONLY_OPTIONS = frozenset(["use_fast_math", "extra_cuda_cflags", "compute_capability", "allow_cuda_graph"])


def _with_option_check(fn: Any) -> Any:
    """Make a misspelt keyword an :class:`OptionError` that names ``fn`` and the closest option.

    The signature seen by ``help()`` and IDEs stays ``fn``'s own (``functools.wraps``).
    """
    accepted = list(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in accepted]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, accepted, n=1)
                if k in _CUDA_ONLY_OPTIONS:
                    hints.append(f"'{k}' (it applies to CUDA modules only; for C++ pass compiler flags in "
                                 f"extra_cflags, e.g. extra_cflags=['-ffast-math'])")
                else:
                    hints.append(f"'{k}' (did you mean '{close[0]}'?)" if close else f"'{k}'")
            raise OptionError(f"{fn.__name__}() got unknown option(s) {', '.join(hints)}. It takes: "
                              f"{', '.join(accepted)}")
        return fn(*args, **kwargs)

    return checked


def _build_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword options of ``_load`` among a loader's arguments (its ``locals()``)."""
    return {k: v for k, v in given.items() if k in _LOAD_OPTIONS}


def _inline_sources(name: str, sources: Any, what: str) -> list[Source]:
    if isinstance(sources, str):
        sources = [sources]
    if not isinstance(sources, (list, tuple)) or not sources or not all(isinstance(s, str) for s in sources):
        raise XlakernError(f"{what} must be a source string or a non-empty list of source strings")
    if len(sources) == 1:
        return [Source(f"inline:{name}", sources[0])]
    return [Source(f"inline:{name}[{i}]", s) for i, s in enumerate(sources)]


def _file_sources(paths: Sequence[Path]) -> list[Source]:
    out = []
    for p in paths:
        p = Path(p).expanduser().resolve()
        if not p.is_file():
            raise XlakernError(f"source file {p} does not exist")
        out.append(Source.from_file(p))  # bytes: the compiler, not Python, decides the encoding
    return out


def _dir_sources(directory: str | os.PathLike, file_patterns: Sequence[str]) -> tuple[Path, list[Source]]:
    d = Path(directory).expanduser().resolve()
    if not d.is_dir():
        raise XlakernError(f"{d} is not a directory")
    if isinstance(file_patterns, str) or not all(isinstance(p, str) for p in file_patterns):
        raise XlakernError(f"file_patterns must be a list of glob patterns such as ['*.cc']; got {file_patterns!r}")
    files = sorted({p for pat in file_patterns for p in d.glob(pat) if p.is_file()})
    if not files:
        raise XlakernError(f"no files matching {list(file_patterns)} in {d}")
    return d, _file_sources(files)


def _default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(path).stem)
    return stem if re.match(r"^[A-Za-z_]", stem) else f"m_{stem}"


@_with_option_check
def load_cpp_inline(
        name: str, cpp_sources: str | Sequence[str], functions: Any = None, *,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
) -> CompiledModule:
    """Compile C++ source text for the CPU and register its entry points with XLA.

    Example::

        mod = xlakern.load_cpp_inline("ops", '''
        // @xk add_one arg ret
        void add_one(const xk::Tensor x, xk::Tensor out) {
          const float* in = x.data<float>(); float* o = out.data<float>();
          for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] + 1;
        }''')
        y = jax.jit(lambda x: mod.add_one(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))(x)

    Args:
        name: module name, a C identifier; the targets are ``"<name>.<function>"``.
        cpp_sources: the source text, or a list of texts (one translation unit each).
        functions: the entry points: ``None`` (from ``// @xk fn tokens`` annotations), a list of
            names (arg_spec inferred from the signatures), or ``{fn: "arg ret attr.k:float32"}``."""
    return _load(name, _inline_sources(name, cpp_sources, "cpp_sources"), functions, "cpu",
                 **_build_options(locals()))


@_with_option_check
def load_cpp_file(
        path: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
) -> CompiledModule:
    """Like :func:`load_cpp_inline` for one C++ file.

    Example::

        mod = xlakern.load_cpp_file("kernels/decay.cc")

    Args:
        path: the source file.
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the file's stem)."""
    return _load(name or _default_name(Path(path)), _file_sources([Path(path)]), functions, "cpu", **_build_options(locals()))


@_with_option_check
def load_cuda_inline(
        name: str, cuda_sources: str | Sequence[str], functions: Any = None, *,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        use_fast_math: bool = False, extra_cuda_cflags: str | Sequence[str] | None = None, compute_capability: Any = None,
        allow_cuda_graph: bool = True,
) -> CompiledModule:
    """Compile CUDA source text with nvcc for the GPU JAX uses and register its entry points.

    Entry points take XLA's stream as ``int64_t stream`` (token ``stream``) and launch on it.

    Example::

        mod = xlakern.load_cuda_inline("my_kernels", CUDA_SRC)
        out = mod.vector_add(a, b, outs=jax.ShapeDtypeStruct(a.shape, a.dtype))

    Args:
        name: module name, a C identifier; the targets are ``"<name>.<function>"``.
        cuda_sources: the source text, or a list of texts (one translation unit each).
        functions: entry points, as for :func:`load_cpp_inline`."""
    return _load(name, _inline_sources(name, cuda_sources, "cuda_sources"), functions, "cuda",
                 **_build_options(locals()))


@_with_option_check
def load_cuda_file(
        path: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        use_fast_math: bool = False, extra_cuda_cflags: str | Sequence[str] | None = None, compute_capability: Any = None,
        allow_cuda_graph: bool = True,
) -> CompiledModule:
    """Like :func:`load_cuda_inline` for one ``.cu`` file.

    Example::

        mod = xlakern.load_cuda_file("kernels/lif.cu", compute_capability="9.0")

    Args:
        path: the source file.
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the file's stem)."""
    return _load(name or _default_name(Path(path)), _file_sources([Path(path)]), functions, "cuda", **_build_options(locals()))


@_with_option_check
def load_cuda_dir(
        directory: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        file_patterns: Sequence[str] = ("*.cu",),
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        use_fast_math: bool = False, extra_cuda_cflags: str | Sequence[str] | None = None, compute_capability: Any = None,
        allow_cuda_graph: bool = True,
) -> CompiledModule:
    """Compile every file of ``directory`` matching ``file_patterns`` (each its own translation
    unit, compiled in parallel) into one module.

    Example::

        mod = xlakern.load_cuda_dir("kernels/", name="snn")

    Args:
        directory: the folder holding the sources.
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the folder's name).
        file_patterns: glob patterns of the files to compile (default ``("*.cu",)``)."""
    d, sources = _dir_sources(directory, file_patterns)
    return _load(name or _default_name(d), sources, functions, "cuda", **_build_options(locals()))


@_with_option_check
def load_cpp_dir(
        directory: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        file_patterns: Sequence[str] = ("*.cc", "*.cpp", "*.cxx"),
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
) -> CompiledModule:
    """Compile every C++ file of ``directory`` matching ``file_patterns`` for the CPU into one module.

    Each file is its own translation unit; they compile in parallel (at most ``$MAX_JOBS`` at
    once) and each object is cached by content, so editing one file recompiles only that one.
    Headers next to the files (or under ``extra_include_paths``) are tracked: editing one
    rebuilds what includes it. Entry points are found as in :func:`load_cpp_inline`.

    Example::

        mod = xlakern.load_cpp_dir("kernels/", name="snn_cpu", extra_cflags=["-march=native"])
        v = mod.lif_step(v, i_ext, outs=jax.ShapeDtypeStruct(v.shape, v.dtype), decay=0.9)

    Args:
        directory: the folder holding the sources.
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the folder's name).
        file_patterns: glob patterns of the files to compile (default ``("*.cc", "*.cpp", "*.cxx")``)."""
    d, sources = _dir_sources(directory, file_patterns)
    return _load(name or _default_name(d), sources, functions, "cpu", **_build_options(locals()))


# Keyword options of _load, which the loaders above pass on by name.
_LOAD_OPTIONS = frozenset(p.name for p in inspect.signature(_load).parameters.values()
                          if p.kind is inspect.Parameter.KEYWORD_ONLY)
for _loader, _options_doc in [(load_cpp_inline, _CPP_OPTIONS_DOC), (load_cpp_file, _CPP_OPTIONS_DOC),
                              (load_cuda_inline, _CUDA_OPTIONS_DOC), (load_cuda_file, _CUDA_OPTIONS_DOC),
                              (load_cuda_dir, _CUDA_OPTIONS_DOC), (load_cpp_dir, _CPP_OPTIONS_DOC)]:
    _loader.__doc__ += _options_doc + _RETURNS_DOC


def list_registered_targets() -> list[str]:
    """Names of every FFI target xlakern registered in this process.

    Example::

        >>> xlakern.list_registered_targets()
        ['my_kernels.vector_add', 'scale_ops.scale_by', 'xlakern.numba_cpu']

    Numba kernels and Python callables share the runtime's generic targets (``xlakern.*``),
    so wrapping more of them never adds a target.
    """
    return _bridge.registered_targets()


def clear_cache(name: str | None = None) -> dict[str, list[str]]:
    """Delete cached builds of module ``name`` (or all). Builds in progress are left alone.

    Returns ``{"removed": [...], "skipped": [...]}``. Modules already loaded stay usable.

    Example::

        xlakern.clear_cache("my_kernels")
    """
    result = _cache.clear(_cache.cache_root(), name)
    if name is None:  # objects are shared between modules: only a full clear drops them
        _build.clear_objects(_cache.cache_root())
    return result
