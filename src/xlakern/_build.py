"""From sources to a cached shared library: cache key, compile, link.

The cache key is a SHA-256 over everything that can change the library: the
sources, every header they reach under our include dir and the user's include
paths, the entry points' arg_specs, all flags, the GPU arch, the compilers'
versions, xlakern's version and jaxlib's FFI headers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from . import _cache, _codegen, _toolchain
from ._spec import EntryPoint, Source
from ._version import __version__
from .errors import CompilationError, ToolchainError

CACHE_FORMAT = 2  # 2: kernel libraries link the process's libstdc++

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    platform: str  # "cpu" | "cuda"
    optimization_level: int = 3
    use_fast_math: bool = False
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_paths: tuple[str, ...] = ()
    arch: str | None = None  # e.g. "90"
    allow_cuda_graph: bool = True


# -- header scanning ----------------------------------------------------------
#
# Header digests are remembered per (path, mtime_ns, size), in memory and in the
# cache root, so a fresh process hitting the cache only stats its headers. The
# library itself is always re-hashed before loading (see _cache.Entry).

_DIGESTS_FILE = "file-digests.json"
_digest_lock = threading.Lock()
_digests: dict[str, list] | None = None
_digests_dirty = False


def _digest_memo() -> dict[str, list]:
    global _digests
    if _digests is None:
        _digests = _cache.read_lookup(_cache.cache_root() / _DIGESTS_FILE,
                                      lambda v: isinstance(v, list) and len(v) == 3 and isinstance(v[2], str))
    return _digests


def _file_digest(path: str) -> str:
    global _digests_dirty
    st = os.stat(path)
    with _digest_lock:
        entry = _digest_memo().get(path)
        if entry and entry[0] == st.st_mtime_ns and entry[1] == st.st_size:
            return entry[2]
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with _digest_lock:
        _digest_memo()[path] = [st.st_mtime_ns, st.st_size, digest]
        _digests_dirty = True
    return digest


def _save_digests() -> None:
    global _digests_dirty
    with _digest_lock:
        if not _digests_dirty or _digests is None:
            return
        text = json.dumps(_digests)
        _digests_dirty = False
    try:
        _cache.atomic_write_text(_cache.cache_root() / _DIGESTS_FILE, text)
    except OSError:
        pass  # read-only cache: we only lose the shortcut


def reachable_headers(sources: Sequence[Source], include_paths: Sequence[str]) -> dict[str, str]:
    """{path: sha256} of every header the sources include that lives in ``include_paths``
    (or, for quoted includes, next to the including file). System headers are covered by
    the compiler's version instead."""
    found: dict[str, str] = {}
    pending: list[tuple[str, str | None]] = [
        (s.text, os.path.dirname(str(s.path)) if s.path else None) for s in sources]
    while pending:
        text, here = pending.pop()
        for m in _INCLUDE_RE.finditer(text):
            quoted, name = m.group(1) == '"', m.group(2).strip()
            dirs = ([here] if quoted and here is not None else []) + list(include_paths)
            for d in dirs:
                cand = os.path.normpath(os.path.join(d, name))
                if cand in found:
                    break
                if os.path.isfile(cand):
                    found[cand] = _file_digest(cand)
                    with open(cand, errors="replace") as f:
                        pending.append((f.read(), os.path.dirname(cand)))
                    break
    return found


@functools.lru_cache(maxsize=None)
def _our_headers() -> tuple[tuple[str, str], ...]:
    # Every kernel TU gets xlakern/xlakern.h force-included, so all our headers count.
    root = str(_toolchain.include_dir())
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".h"):
                p = os.path.join(dirpath, f)
                out.append((os.path.relpath(p, root), _file_digest(p)))
    return tuple(sorted(out))


def cache_key(
    name: str,
    sources: Sequence[Source],
    entries: Sequence[EntryPoint],
    options: BuildOptions,
    host: _toolchain.Tool,
    cuda: _toolchain.Tool | None,
) -> str:
    # xlakern's own headers are all hashed by _our_headers(); scanning covers the user's.
    material = {
        "format": CACHE_FORMAT,
        "xlakern": __version__,
        "glue_abi": _codegen.GLUE_ABI_VERSION,
        "name": name,
        "sources": [[s.label, hashlib.sha256(s.text.encode()).hexdigest()] for s in sources],
        "headers": sorted(reachable_headers(sources, options.extra_include_paths).items()),
        "our_headers": _our_headers(),
        "entries": [[e.name, e.spec] for e in entries],
        "options": dataclasses.asdict(options),
        "host": [list(host.command), host.version],
        "cuda": [list(cuda.command), cuda.version] if cuda else None,
        "ffi_headers": _ffi_headers_digest(),
    }
    _save_digests()
    blob = json.dumps(material, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@functools.lru_cache(maxsize=None)
def _ffi_headers_digest() -> str:
    """Digest of jaxlib's FFI API headers: a new jaxlib means new handlers."""
    api = os.path.join(str(_toolchain.ffi_include_dir()), "xla", "ffi", "api")
    parts = [f"{n}:{_file_digest(os.path.join(api, n))}" for n in sorted(os.listdir(api)) if n.endswith(".h")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# -- compiling ----------------------------------------------------------------


@dataclasses.dataclass
class _Step:
    what: str  # "compile <label>" or "link"
    command: list[str]
    label: str


def _run(step: _Step, cwd: Path) -> tuple[_Step, subprocess.CompletedProcess]:
    try:
        proc = subprocess.run(step.command, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise ToolchainError(f"cannot start {step.command[0]}: {e}") from None
    return step, proc


def _hint(output: str) -> str:
    if "undefined reference to" in output or "undefined symbol" in output:
        return (
            "\nhint: an entry point the generated handler calls is not defined with the declared signature. "
            "Entry points must be non-static 'void' functions at global namespace scope."
        )
    return ""


class Builder:
    """Builds one module in a private directory."""

    def __init__(self, name: str, sources: Sequence[Source], entries: Sequence[EntryPoint],
                 options: BuildOptions, host: _toolchain.Tool, cuda: _toolchain.Tool | None,
                 verbose: bool):
        self.name = name
        self.sources = sources
        self.entries = entries
        self.options = options
        self.host = host
        self.cuda = cuda
        self.verbose = verbose
        self.commands: list[str] = []

    def _includes(self) -> list[str]:
        incs = [f"-I{p}" for p in self.options.extra_include_paths]
        return incs + [f"-I{_toolchain.include_dir()}", f"-I{_toolchain.ffi_include_dir()}"]

    def _host_flags(self) -> list[str]:
        return ["-std=c++17", "-fPIC", f"-O{self.options.optimization_level}", *self._includes(),
                *self.options.extra_cflags]

    def _user_compile(self, src: Path, obj: Path) -> list[str]:
        o = self.options
        if o.platform == "cpu":
            return [*self.host.command, *self._host_flags(), "-include", "xlakern/xlakern.h",
                    "-c", str(src), "-o", str(obj)]
        arch = o.arch
        cmd = [self.cuda.path, "-std=c++17", f"-O{o.optimization_level}", "-Xcompiler", "-fPIC",
               f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]",
               "-ccbin", self.host.path, *self._includes(), "-include", "xlakern/xlakern.h"]
        if o.use_fast_math:
            cmd.append("--use_fast_math")
        cmd += [*o.extra_cuda_cflags, "-x", "cu", "-c", str(src), "-o", str(obj)]
        return cmd

    def _link(self, objs: list[Path], out: Path) -> list[str]:
        o = self.options
        # Share the process's C++ runtime rather than risk a static copy (see process_libstdcxx).
        libstdcxx = _toolchain.process_libstdcxx()
        if o.platform == "cpu":
            return [*self.host.command, "-shared", "-Wl,-Bsymbolic", "-Wl,--no-undefined",
                    *map(str, objs), *([libstdcxx] if libstdcxx else []), "-o", str(out), *o.extra_ldflags]
        return [self.cuda.path, "-shared", "-ccbin", self.host.path, "-cudart", "static",
                "-Xlinker", "-Bsymbolic", "-Xlinker", "--no-undefined",
                f"-gencode=arch=compute_{o.arch},code=[sm_{o.arch},compute_{o.arch}]",
                *map(str, objs), *(["-Xlinker", libstdcxx] if libstdcxx else []),
                "-o", str(out), *o.extra_ldflags]

    def __call__(self, work: Path) -> Path:
        steps: list[_Step] = []
        objs: list[Path] = []
        ext = ".cu" if self.options.platform == "cuda" else ".cc"
        for i, s in enumerate(self.sources):
            if s.path is not None:
                src = s.path
            else:
                src = work / f"inline_{i}{ext}"
                # The #line directive makes diagnostics name the user's source and its lines.
                src.write_text(f'#line 1 "{s.label}"\n{s.text}\n')
            obj = work / f"src_{i}.o"
            steps.append(_Step(f"compile {s.label}", self._user_compile(src, obj), s.label))
            objs.append(obj)
        glue = work / "xlakern_handlers.cc"
        glue.write_text(_codegen.generate_glue(self.name, self.entries, self.options.platform,
                                               allow_cuda_graph=self.options.allow_cuda_graph))
        glue_obj = work / "xlakern_handlers.o"
        steps.append(_Step("compile generated handlers",
                           [*self.host.command, *self._host_flags(), "-c", str(glue), "-o", str(glue_obj)],
                           "generated handlers"))
        objs.append(glue_obj)

        workers = max(1, min(len(steps), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda st: _run(st, work), steps))
        failures = [(st, p) for st, p in results if p.returncode != 0]
        self.commands = [shlex.join(st.command) for st, _ in results]
        if failures:
            self._fail(failures, work)
        lib = work / f"lib{self.name}.so"
        link = _Step("link", self._link(objs, lib), "link")
        _, proc = _run(link, work)
        self.commands.append(shlex.join(link.command))
        if proc.returncode != 0:
            self._fail([(link, proc)], work)
        for obj in objs:  # the published build keeps sources and the library only
            obj.unlink(missing_ok=True)
        return lib

    def _fail(self, failures, work: Path) -> None:
        kind = "CUDA" if self.options.platform == "cuda" else "C++"
        parts = [f"building module '{self.name}' ({kind}) failed:"]
        for step, proc in failures:
            out = (proc.stderr + proc.stdout).strip()
            out = out.replace(str(work) + os.sep, "")
            parts.append(f"--- {step.what} (exit {proc.returncode}) ---\n{out}{_hint(out)}")
            if step.label == "generated handlers":
                parts.append(
                    "The generated handler code did not compile: this usually means an entry point's C++ "
                    "signature uses a type xlakern cannot name outside your source. Please report it with "
                    "the source if it persists."
                )
            if self.verbose:
                parts.append("command: " + shlex.join(step.command))
        if not self.verbose:
            parts.append("(pass verbose=True to see the full compiler commands)")
        raise CompilationError("\n".join(parts))


class Progress:
    """Says on stderr that a build is running once it has taken over ``delay`` seconds."""

    def __init__(self, message: str, quiet: bool, delay: float = 1.0):
        self.message = message
        self.quiet = quiet or os.environ.get("XLAKERN_QUIET", "") not in ("", "0")
        self.delay = delay
        self.shown = False
        self._timer: threading.Timer | None = None
        self._start = 0.0

    def _show(self) -> None:
        self.shown = True
        print(f"xlakern: {self.message}\u2026", file=sys.stderr, flush=True)

    def __enter__(self) -> "Progress":
        self._start = time.perf_counter()
        if not self.quiet:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.shown:
            status = "failed" if exc[0] else "done"
            print(f"xlakern: {status} in {time.perf_counter() - self._start:.1f} s", file=sys.stderr, flush=True)
