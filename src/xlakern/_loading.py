"""Load time: compiling C++/CUDA sources and registering their entry points as JAX FFI targets.

The loaders (``load_cpp_inline`` and friends) check their options, resolve the entry points,
build through the cache (:mod:`xlakern._build`, :mod:`xlakern._cache`) and register every target
of the library with XLA, or none (:func:`_register`). What a loaded module does when called is
in :mod:`xlakern._calling`.

Example::

    mod = xlakern.load_cpp_inline("ops", SRC)
    xlakern.list_registered_targets()        # ['ops.add_one', ...]
"""

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

from . import _bridge, _build, _cache, _codegen, _runtime, _toolchain
from ._calling import CALL_KEYWORDS, CompiledModule
from ._spec import EntryPoint, Source, resolve_entry_points
from .errors import KernelLoadError, OptionError, RegistrationError, SpecError, XlakernError

__all__ = ["load_cpp_inline", "load_cpp_file", "load_cpp_dir", "load_cuda_inline", "load_cuda_file", "load_cuda_dir",
           "list_registered_targets", "clear_cache", "register_ffi_target"]

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # used with fullmatch: "$" would accept a final newline
# Module names name a cache directory and a library file (lib<name>.so, beside temp and lock
# names built from it): this keeps every such path component far below NAME_MAX (255).
MAX_NAME_LENGTH = 100
_MODULES: dict[str, "CompiledModule"] = {}
_LOAD_LOCK = threading.RLock()


def _as_flags(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise XlakernError(f"{what} must be a string or a list of strings; got {value!r}")


def _register(name: str, key: str, lib: "_cache.VerifiedLibrary", platform: str,
              entry_points: Sequence[EntryPoint]) -> None:
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
        raise KernelLoadError(
            f"cannot load module '{name}': {e}. Delete the build with xlakern.clear_cache({name!r}) and load again"
        ) from None
    if not fresh:
        return
    try:
        handlers = []
        for e in entry_points:
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


def _check_attribute_names(module: str, entry_points: Sequence[EntryPoint]) -> None:
    for e in entry_points:
        for p in e.attrs:
            if p.attr_name in CALL_KEYWORDS:
                raise SpecError(
                    f"{module}.{e.name}: attribute 'attr.{p.attr_name}' (from {e.source}, line {e.line}) is named "
                    f"like the call keyword {p.attr_name}=, so it could never be passed; rename the attribute "
                    f"(call keywords: {', '.join(sorted(CALL_KEYWORDS))})")


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
          replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
          **build_options: Any) -> CompiledModule:
    """_load_module, then the registration options BrainEvent 0.3's loaders take."""
    # `replace` changes nothing: XLA cannot re-point a registered target, so a module name loaded from
    # other content raises RegistrationError either way (BrainEvent 0.3's `replace` is reserved alike).
    del replace
    if target_prefix is not None and (not isinstance(target_prefix, str) or not target_prefix
                                      or target_prefix != target_prefix.strip()):
        raise XlakernError(f"target_prefix must be a non-empty string without surrounding blanks (the targets are "
                           f"'<target_prefix>.<function>'); got {target_prefix!r}")
    module = _load_module(name, sources, functions, platform, **build_options)
    if auto_register and target_prefix is not None and target_prefix != name:
        for fn in module.entries:  # the same entry point under the same name again is a no-op
            register_ffi_target(f"{target_prefix}.{fn}", module, fn)
    return module


def _load_module(name: str, sources: list[Source], functions: Any, platform: str, *,
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
    entry_points = resolve_entry_points(sources, functions, platform=platform)
    _check_attribute_names(name, entry_points)
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
    base_key = _build.cache_key(name, sources, entry_points, options, host, cuda)

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
        root = _cache.user_path("build_directory", build_directory) if build_directory else _cache.cache_root()
        slot = _cache.Entry(root, name, base_key)

        def headers_unchanged(meta: dict) -> bool:  # a build is valid only while its headers are
            return _build.headers_unchanged(meta.get("headers"))

        lib = None if force_rebuild else slot.open_library(headers_unchanged)
        if lib is None:
            kind = f"CUDA, sm_{options.arch}" if platform == "cuda" else "C++"
            builder = _build.Builder(name, sources, entry_points, options, host, cuda, verbose,
                                     store=_build.ObjectStore(root), reuse_objects=not force_rebuild)
            with _build.Progress(f"compiling {name} ({kind})", quiet):
                try:
                    slot.build(builder, lambda: {"name": name, "platform": platform,
                                                 "functions": {e.name: e.spec for e in entry_points},
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
            _register(name, key, lib, platform, entry_points)
        module = CompiledModule(name, lib.path, key, platform, entry_points)
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
        quiet: no "compiling …" line on stderr (also ``XLAKERN_QUIET=1``).
        target_prefix: also register each entry point as the FFI target ``"<target_prefix>.<fn>"``
            (for ``jax.ffi.ffi_call``), beside ``"<name>.<fn>"``, as BrainEvent 0.3 names them.
        auto_register: ``False`` skips the ``target_prefix`` names (register names of your own with
            :func:`register_ffi_target`). The module's own ``"<name>.<fn>"`` targets are always
            registered: ``mod.fn(...)`` calls them, and a module name is unique in a process.
        replace: accepted for BrainEvent 0.3's signature, and changes nothing. XLA cannot re-point a
            registered target, so loading other content under a loaded name raises
            :class:`RegistrationError` either way; load it under a new ``name``."""

_CUDA_OPTIONS_DOC = _CPP_OPTIONS_DOC + """
        use_fast_math: compile with nvcc's ``--use_fast_math``.
        extra_cuda_cflags: more nvcc flags, a list or a string.
        compute_capability: target GPU as ``"9.0"``, ``(9, 0)`` or ``90``; default:
            ``$XLAKERN_CUDA_ARCH``, else the GPU JAX sees (with several, the lowest capability:
            its PTX, built in, runs on the newer ones).
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
# Keywords a loader also takes under an earlier name: xlakern's file loaders named their first argument
# `path` before they took BrainEvent 0.3's `filepath`.
_KEYWORD_ALIASES = {"path": "filepath"}


def _with_option_check(fn: Any) -> Any:
    """Make a misspelt keyword an :class:`OptionError` that names ``fn`` and the closest option.

    The signature seen by ``help()`` and IDEs stays ``fn``'s own (``functools.wraps``).
    """
    accepted = list(inspect.signature(fn).parameters)
    aliases = {old: new for old, new in _KEYWORD_ALIASES.items() if new in accepted and old not in accepted}

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for old, new in aliases.items():
            if old in kwargs:
                if new in kwargs:
                    raise OptionError(f"{fn.__name__}() got both {new}= and {old}= (the same argument)")
                kwargs[new] = kwargs.pop(old)
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
        p = _cache.user_path("the source file", p)
        if not p.is_file():
            raise XlakernError(f"source file {p} does not exist")
        out.append(Source.from_file(p))  # bytes: the compiler, not Python, decides the encoding
    return out


def _dir_sources(directory: str | os.PathLike, file_patterns: Sequence[str]) -> tuple[Path, list[Source]]:
    d = _cache.user_path("the source directory", directory)
    if not d.is_dir():
        raise XlakernError(f"{d} is not a directory")
    if not isinstance(file_patterns, (list, tuple)) or not all(isinstance(p, str) for p in file_patterns):
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
        replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
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
        filepath: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
) -> CompiledModule:
    """Like :func:`load_cpp_inline` for one C++ file.

    Example::

        mod = xlakern.load_cpp_file("kernels/decay.cc")

    Args:
        filepath: the source file (also accepted as ``path=``).
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the file's stem)."""
    source = _cache.user_path("filepath", filepath)
    return _load(name or _default_name(source), _file_sources([source]), functions, "cpu", **_build_options(locals()))


@_with_option_check
def load_cuda_inline(
        name: str, cuda_sources: str | Sequence[str], functions: Any = None, *,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        use_fast_math: bool = False, extra_cuda_cflags: str | Sequence[str] | None = None, compute_capability: Any = None,
        allow_cuda_graph: bool = True,
        replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
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
        filepath: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        use_fast_math: bool = False, extra_cuda_cflags: str | Sequence[str] | None = None, compute_capability: Any = None,
        allow_cuda_graph: bool = True,
        replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
) -> CompiledModule:
    """Like :func:`load_cuda_inline` for one ``.cu`` file.

    Example::

        mod = xlakern.load_cuda_file("kernels/lif.cu", compute_capability="9.0")

    Args:
        filepath: the source file (also accepted as ``path=``).
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the file's stem)."""
    source = _cache.user_path("filepath", filepath)
    return _load(name or _default_name(source), _file_sources([source]), functions, "cuda", **_build_options(locals()))


@_with_option_check
def load_cuda_dir(
        directory: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        file_patterns: Sequence[str] | None = None,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        use_fast_math: bool = False, extra_cuda_cflags: str | Sequence[str] | None = None, compute_capability: Any = None,
        allow_cuda_graph: bool = True,
        replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
) -> CompiledModule:
    """Compile every file of ``directory`` matching ``file_patterns`` (each its own translation
    unit, compiled in parallel) into one module.

    Example::

        mod = xlakern.load_cuda_dir("kernels/", name="snn")

    Args:
        directory: the folder holding the sources.
        functions: entry points, as for :func:`load_cpp_inline`.
        name: module name (default: the folder's name).
        file_patterns: glob patterns of the files to compile (``None``: ``("*.cu",)``)."""
    d, sources = _dir_sources(directory, ("*.cu",) if file_patterns is None else file_patterns)
    return _load(name or _default_name(d), sources, functions, "cuda", **_build_options(locals()))


@_with_option_check
def load_cpp_dir(
        directory: str | os.PathLike, functions: Any = None, *, name: str | None = None,
        file_patterns: Sequence[str] | None = None,
        optimization_level: int = 3, extra_cflags: str | Sequence[str] | None = None,
        extra_ldflags: str | Sequence[str] | None = None, extra_include_paths: str | Sequence[str] | None = None,
        build_directory: str | os.PathLike | None = None, force_rebuild: bool = False, verbose: bool = False,
        quiet: bool = False,
        replace: bool = False, auto_register: bool = True, target_prefix: str | None = None,
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
        file_patterns: glob patterns of the files to compile (``None``: ``("*.cc", "*.cpp", "*.cxx")``)."""
    d, sources = _dir_sources(directory, ("*.cc", "*.cpp", "*.cxx") if file_patterns is None else file_patterns)
    return _load(name or _default_name(d), sources, functions, "cpu", **_build_options(locals()))


# Keyword options of _load and _load_module, which the loaders above pass on by name.
_LOAD_OPTIONS = frozenset(p.name for f in (_load, _load_module) for p in inspect.signature(f).parameters.values()
                          if p.kind is inspect.Parameter.KEYWORD_ONLY)
for _loader, _options_doc in [(load_cpp_inline, _CPP_OPTIONS_DOC), (load_cpp_file, _CPP_OPTIONS_DOC),
                              (load_cuda_inline, _CUDA_OPTIONS_DOC), (load_cuda_file, _CUDA_OPTIONS_DOC),
                              (load_cuda_dir, _CUDA_OPTIONS_DOC), (load_cpp_dir, _CPP_OPTIONS_DOC)]:
    _loader.__doc__ += _options_doc + _RETURNS_DOC


def register_ffi_target(target_name: str, module: CompiledModule, func_name: str, *, platform: str | None = None,
                        replace: bool = False, content_id: str | None = None) -> None:
    """Make ``module``'s entry point ``func_name`` callable as ``jax.ffi.ffi_call(target_name, ...)`` too.

    Every entry point is already registered as ``module.targets[func_name]`` (``"<module>.<fn>"``);
    this adds a name of the caller's choosing, as BrainEvent's function of this name does. The call
    takes the entry point's arg_spec exactly (its attributes, with their declared types). Registering
    the same entry point under the same name again does nothing; a name that already belongs to other
    code raises :class:`RegistrationError` whatever ``replace`` says, since XLA cannot re-point a
    registered target. ``platform`` (``"cpu"``, ``"gpu"``/``"CUDA"``), if given, must be the module's;
    ``content_id`` is accepted for BrainEvent's signature (the module's content key is used instead).

    Example::

        mod = xlakern.load_cpp_inline("ops", SRC)
        xlakern.register_ffi_target("my_add_one", mod, "add_one", platform="cpu")
        y = jax.ffi.ffi_call("my_add_one", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    """
    del replace, content_id
    if not isinstance(module, CompiledModule):
        raise RegistrationError(f"register_ffi_target: module must be a CompiledModule (what load_cpp_* / "
                                f"load_cuda_* return); got {type(module).__name__}")
    if not isinstance(target_name, str) or not target_name:
        raise RegistrationError(f"register_ffi_target: target_name must be a non-empty string; got {target_name!r}")
    if func_name not in module.entries:
        raise RegistrationError(f"register_ffi_target: module '{module.name}' has no entry point '{func_name}'; "
                                f"it has: {', '.join(module.entries) or 'none'}")
    xla_platform = "cpu" if module.platform == "cpu" else "CUDA"
    if platform is not None and ("cpu" if str(platform).lower() == "cpu" else "CUDA") != xla_platform:
        raise RegistrationError(f"register_ffi_target: platform={platform!r}, but module '{module.name}' is built "
                                f"for {'the CPU' if xla_platform == 'cpu' else 'CUDA GPUs'}")
    handler = _runtime.handler_capsule(module.name, _codegen.handler_symbol(func_name))
    _bridge.register_alias(xla_platform, target_name, handler, (module.key, func_name))


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

