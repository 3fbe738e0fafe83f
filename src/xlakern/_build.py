"""From sources to a cached shared library: keys, an object store and a parallel compiler driver.

Two levels of content addressing:

* A module's **base key** is a SHA-256 over its sources' bytes, entry points, flags, GPU arch,
  the real compilers and their versions, xlakern's version, its own headers and jaxlib's FFI
  headers. It names the module's cache entry (see ``_cache.Entry``). The headers the compiler
  actually read, from its ``-MMD`` depfiles, are recorded in the entry with their digests; a
  load whose headers changed rebuilds, and the module's full key covers them too. Checking
  them on a hit only stats files (digests are remembered by (path, mtime, size)).
* Each **object** is kept in ``<root>/.objects/`` under a key over its compile command, source
  bytes, compiler versions and the digests of xlakern's and jaxlib's headers, with a manifest of
  the headers it read. Editing one file of a module therefore recompiles one object; the others,
  and the generated handlers, are reused across module keys. The generated handlers name no
  module, so modules with the same entry points share one handler object; each library gets its
  name from a one-line unit the link compiles (``_codegen.module_name_unit``). Every module also
  links ``_codegen.FRAME_ERRORS_UNIT`` (the glue's error paths) and every C++ module
  ``_codegen.POOL_UNIT`` (parallel_for's pool): one object each for all modules.

Compilers run with stdin closed, at most ``$XLAKERN_MAX_JOBS`` (or ``$MAX_JOBS``) at a time,
each in its own process group so a timeout (``$XLAKERN_BUILD_TIMEOUT``) or Ctrl-C kills it
and everything it started. Their warnings go to the ``xlakern`` logger.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from . import _cache, _codegen, _toolchain
from ._spec import EntryPoint, Source
from ._stamped_lookup import Stamped, StampedLookup
from ._version import __version__
from .errors import CompilationError, ToolchainError

CACHE_FORMAT = 3  # 3: headers come from depfiles and are checked on every load
OBJECTS_DIR = ".objects"
DEFAULT_TIMEOUT_S = 600.0

log = logging.getLogger("xlakern")

# The units xlakern generates compile at -O2 at most: the handlers decode a call frame and call the entry point,
# which -O3's unrolling and vectorising do not speed up, and at -O3 their unit took about 25% longer to compile.
# A cold build waits on the slowest unit (bench/RESULTS.md, session 75).
_GLUE_MAX_LEVEL = 2
# The glue's error paths (_codegen.FRAME_ERRORS_UNIT) run only when a call fails: -O0 compiles them in about
# half the time of -O2, and a module's first cold build waits on them beside the pool's unit.
_ERRORS_LEVEL = 0


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


# -- settings from the environment --------------------------------------------


def _positive_env(names: Sequence[str], kind: type, what: str) -> tuple[str, float] | None:
    for var in names:
        text = os.environ.get(var, "").strip()
        if not text:
            continue
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise ToolchainError(f"{var}={text!r} is not valid: set it to {what}, or unset it")
        return var, value
    return None


def max_jobs() -> int:
    """How many compilers may run at once: ``$XLAKERN_MAX_JOBS``, ``$MAX_JOBS``, else the CPUs."""
    found = _positive_env(("XLAKERN_MAX_JOBS", "MAX_JOBS"), int, "a whole number of parallel compiles, e.g. 4")
    if found:
        return int(found[1])
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def build_timeout() -> float:
    """Seconds one compiler command may run: ``$XLAKERN_BUILD_TIMEOUT`` (default 600)."""
    found = _positive_env(("XLAKERN_BUILD_TIMEOUT",), float, "a number of seconds, e.g. 600")
    return float(found[1]) if found else DEFAULT_TIMEOUT_S


_PATH_FLAGS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-L", "--include-path",
               "--library-path")


def absolute_path_flags(flags: Sequence[str], cwd: str | None = None) -> tuple[str, ...]:
    """``flags`` with the paths of include/library options made absolute against ``cwd``
    (the caller's working directory): compilers run elsewhere, and the cache key must name
    the directory actually meant."""
    cwd = cwd or os.getcwd()

    def absolute(path: str) -> str:
        path = os.path.expanduser(path)
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(cwd, path))

    out: list[str] = []
    takes_next = False
    for flag in flags:
        if takes_next:
            out.append(absolute(flag))
            takes_next = False
            continue
        for opt in _PATH_FLAGS:
            if flag == opt:
                out.append(flag)
                takes_next = True
                break
            if opt.startswith("--") and flag.startswith(opt + "="):
                out.append(f"{opt}={absolute(flag[len(opt) + 1:])}")
                break
            if opt in ("-I", "-L") and flag.startswith(opt) and flag[2:] != "-":
                out.append(opt + absolute(flag[2:]))
                break
        else:
            out.append(flag)
    return tuple(out)


# -- file digests ---------------------------------------------------------------
#
# Remembered per (path, mtime_ns, size), in memory and in the cache root, so a fresh
# process hitting the cache only stats the headers its build recorded.

def _encode_digest(known: Stamped) -> object:
    return [known.mtime_ns, known.size, known.value, known.computed_at_ns]


def _decode_digest(entry: object) -> Stamped | None:
    if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[2], str) and isinstance(entry[3], int):
        return Stamped(entry[0], entry[1], entry[2], entry[3])
    return None


# File times tick coarsely (a few ms; seconds on some file systems): a file hashed within this
# margin of its mtime could change again without its (mtime, size) changing, so it is re-hashed
# until it is older (git's "racily clean" rule).
_RACY_NS = 2_000_000_000
_digests = StampedLookup("file-digests.json", _encode_digest, _decode_digest, racy_ns=_RACY_NS)


def _file_digest(path: str) -> str:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):  # /dev/stdin, a FIFO: reading could block, and nothing is cached
        raise OSError(errno.EINVAL, "not a regular file", path)
    known = _digests.get(path, st)
    if known is not None:
        return known
    hashed_at = time.time_ns()
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    _digests.put(path, st, digest, hashed_at)
    return digest


def _save_digests() -> None:
    _digests.save()  # a read-only cache only loses the shortcut


def headers_unchanged(recorded: object) -> bool:
    """True when every header in ``recorded`` ({path: sha256}) still has that digest."""
    if not isinstance(recorded, dict):
        return False
    try:
        return all(isinstance(d, str) and _file_digest(p) == d for p, d in recorded.items())
    except OSError:
        return False  # a header vanished: rebuild, and the compiler will say what is missing
    finally:
        _save_digests()


def _digests_of(paths: Sequence[str]) -> dict[str, str]:
    try:
        return {p: _file_digest(p) for p in sorted(set(paths))}
    finally:
        _save_digests()


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


@functools.lru_cache(maxsize=None)
def _ffi_headers_digest() -> str:
    """Digest of jaxlib's FFI API headers: a new jaxlib means new handlers."""
    api = os.path.join(str(_toolchain.ffi_include_dir()), "xla", "ffi", "api")
    parts = [f"{n}:{_file_digest(os.path.join(api, n))}" for n in sorted(os.listdir(api)) if n.endswith(".h")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def cache_key(
    name: str,
    sources: Sequence[Source],
    entries: Sequence[EntryPoint],
    options: BuildOptions,
    host: _toolchain.Tool,
    cuda: _toolchain.Tool | None,
) -> str:
    """The module's base key (everything but the headers its build reads; see :func:`full_key`)."""
    material = {
        "format": CACHE_FORMAT,
        "xlakern": __version__,
        "glue_abi": _codegen.GLUE_ABI_VERSION,
        "name": name,
        "sources": [[s.label, _sha256(s.data)] for s in sources],
        "our_headers": _our_headers(),
        "entries": [dataclasses.asdict(e) for e in entries],
        "options": dataclasses.asdict(options),
        "host": host.identity,
        "cuda": cuda.identity if cuda else None,
        "ffi_headers": _ffi_headers_digest(),
    }
    _save_digests()
    return _sha256(json.dumps(material, sort_keys=True, default=str))


def full_key(base_key: str, headers: Mapping[str, str]) -> str:
    """The module's identity: its base key and the digests of the headers its build read."""
    return _sha256(base_key + json.dumps(sorted(headers.items())))


# -- depfiles and the object store ----------------------------------------------


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-style depfile (``obj.o: src.cc a.h \\`` ...)."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for line in text.splitlines():
        sep = re.search(r":(?=\s|$)", line)
        if sep is None:
            continue
        word, rest = [], line[sep.end():] + " "
        i = 0
        while i < len(rest):
            c = rest[i]
            if c == "\\" and i + 1 < len(rest) and rest[i + 1] in " #":
                word.append(rest[i + 1])
                i += 2
                continue
            if c == "$" and rest.startswith("$$", i):
                word.append("$")
                i += 2
                continue
            if c.isspace():
                if word:
                    deps.append("".join(word))
                    word = []
            else:
                word.append(c)
            i += 1
    return deps


class ObjectStore:
    """Compiled objects shared by every module of a cache root: ``<root>/.objects/``.

    ``<manifest key>.json`` names the object built last for a (command, source, compilers)
    and the headers it read; ``<object key>.o`` (object key: manifest key + header digests)
    holds it. Both are written to a temp file and renamed, so readers never see half a file;
    two processes compiling one object publish identical bytes.
    """

    def __init__(self, root: Path):
        self.dir = root / OBJECTS_DIR

    def lookup(self, manifest_key: str) -> tuple[Path, dict[str, str]] | None:
        try:
            manifest = json.loads((self.dir / f"{manifest_key}.json").read_text())
            obj = self.dir / f"{manifest['object']}.o"
            headers = manifest["headers"]
            if re.fullmatch(r"[0-9a-f]{64}", manifest["object"]) and headers_unchanged(headers):
                # Linked into a library this process runs: only a private regular file of ours.
                _cache.check_private(os.stat(self.dir), self.dir)
                _cache.check_private(os.lstat(self.dir / f"{manifest_key}.json"), self.dir / f"{manifest_key}.json")
                st = os.lstat(obj)
                if stat.S_ISREG(st.st_mode):
                    _cache.check_private(st, obj)
                    return obj, headers
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent or damaged: compile again and rewrite it
        return None

    def publish(self, manifest_key: str, built: Path, headers: dict[str, str]) -> Path:
        object_key = _sha256(manifest_key + json.dumps(sorted(headers.items())))
        final = self.dir / f"{object_key}.o"
        _cache.make_private_dirs(self.dir)  # 0700, like every directory of the cache
        tmp = self.dir / f".{object_key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _cache.FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(built.read_bytes())
            os.chmod(tmp, _cache.FILE_MODE)  # 0600 whatever the umask
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _cache.atomic_write_text(self.dir / f"{manifest_key}.json",
                                 json.dumps({"object": object_key, "headers": headers}, sort_keys=True))
        return final


def clear_objects(root: Path) -> int:
    """Delete the object store of cache root ``root``; returns how many files went."""
    store = root / OBJECTS_DIR
    removed = 0
    if store.is_dir() and not store.is_symlink():
        for p in store.iterdir():
            if p.is_file() and not p.is_symlink() and p.suffix in (".o", ".json", ".tmp"):
                p.unlink(missing_ok=True)
                removed += 1
    return removed


# -- running compilers ------------------------------------------------------------


@dataclasses.dataclass
class _Step:
    what: str  # "compile <label>", "compile generated <unit>" (handlers, pool, frame errors) or "link"
    command: list[str]
    label: str
    output: Path
    depfile: Path | None = None
    manifest_key: str | None = None
    result: Path | None = None  # the object once compiled (or found in the store)
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and everything it started (it leads its own process group)."""
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


class _Runner:
    """Runs compiler commands, ``jobs`` at a time, each with stdin closed, in its own process
    group and under a timeout. ``stop()`` (on Ctrl-C or a failure) kills every running one."""

    def __init__(self, work: Path, jobs: int, timeout: float, verbose: bool):
        self.work = work
        self.jobs = jobs
        self.timeout = timeout
        self.verbose = verbose
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._stopped = False

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            running = list(self._running)
        for proc in running:
            _kill_group(proc)

    def _echo(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def run(self, step: _Step) -> tuple[int, str]:
        """(exit status, combined output) of one command; output streams to stderr if verbose."""
        with self._lock:
            if self._stopped:
                raise CompilationError(f"{step.what}: not started, the build was stopped")
            if self.verbose:
                self._echo(f"xlakern: {shlex.join(step.command)}\n")
            try:
                proc = subprocess.Popen(step.command, cwd=self.work, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                raise ToolchainError(f"cannot start {step.command[0]} ({step.what}): {e.strerror or e}. "
                                     f"Check that the compiler is installed and executable") from None
            self._running.add(proc)
        lines: list[str] = []

        def read() -> None:
            for raw in proc.stdout:
                line = raw.decode("utf-8", errors="replace")
                lines.append(line)
                if self.verbose:
                    self._echo(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CompilationError(
                f"{step.what} did not finish within {self.timeout:g} s and was stopped "
                f"(command: {shlex.join(step.command)}). Set XLAKERN_BUILD_TIMEOUT to allow longer "
                f"compiles, or check that the compiler is not waiting for something") from None
        finally:
            with self._lock:
                self._running.discard(proc)
            reader.join(5.0)
            proc.stdout.close()
        return proc.returncode, "".join(lines)

    def run_all(self, steps: Sequence[_Step]) -> list[tuple[_Step, int, str]]:
        if not steps:
            return []
        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(self.jobs, len(steps))))
        futures = [pool.submit(self.run, st) for st in steps]
        try:
            pending = set(futures)
            while pending:
                # Short waits keep the main thread responsive to Ctrl-C.
                done, pending = concurrent.futures.wait(pending, timeout=0.2,
                                                        return_when=concurrent.futures.FIRST_EXCEPTION)
                for f in done:
                    if f.exception() is not None:
                        raise f.exception()
        except BaseException:
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [(st, *f.result()) for st, f in zip(steps, futures)]


def os_error(name: str, e: OSError, root: Path) -> CompilationError:
    """A build's raw OS error (a full disk, an unwritable cache) as a CompilationError saying what."""
    where = f" ({e.filename})" if e.filename else ""
    return CompilationError(f"building module '{name}' failed: {e.strerror or e}{where}. Check that the cache "
                            f"directory ({root}) is writable and has space")


def _hint(output: str) -> str:
    if "undefined reference to" in output or "undefined symbol" in output:
        return (
            "\nhint: an entry point the generated handler calls is not defined with the declared signature. "
            "Entry points must be non-static 'void' functions at namespace scope (not class members)."
        )
    return ""


class Builder:
    """Builds one module in a private directory, reusing objects from the store."""

    def __init__(self, name: str, sources: Sequence[Source], entries: Sequence[EntryPoint],
                 options: BuildOptions, host: _toolchain.Tool, cuda: _toolchain.Tool | None,
                 verbose: bool, *, store: ObjectStore | None = None, reuse_objects: bool = True):
        self.name = name
        self.sources = sources
        self.entries = entries
        self.options = options
        self.host = host
        self.cuda = cuda
        self.verbose = verbose
        self.store = store
        self.reuse_objects = reuse_objects
        self.commands: list[str] = []
        self.headers: dict[str, str] = {}  # every header the build read: path -> sha256
        self.compiled: list[str] = []  # labels of the objects compiled (not reused)

    def _includes(self) -> list[str]:
        # xlakern's and jaxlib's headers are system headers: their warnings are not the user's, and
        # the depfiles leave them out (the base key covers them: _our_headers, _ffi_headers_digest).
        incs = [f"-I{p}" for p in self.options.extra_include_paths]
        return incs + ["-isystem", str(_toolchain.include_dir()), "-isystem", str(_toolchain.ffi_include_dir())]

    def _host_flags(self, max_level: int = 3) -> list[str]:
        level = min(self.options.optimization_level, max_level)
        return ["-std=c++17", "-fPIC", f"-O{level}", *self._includes(), *self.options.extra_cflags]

    def _user_compile(self, src: Path, obj: Path, dep: Path) -> list[str]:
        o = self.options
        if o.platform == "cpu":
            return [*self.host.command, *self._host_flags(), "-include", "xlakern/xlakern.h",
                    "-MMD", "-MF", str(dep), "-c", str(src), "-o", str(obj)]
        arch = o.arch
        cmd = [self.cuda.path, "-std=c++17", f"-O{o.optimization_level}", "-Xcompiler", "-fPIC",
               f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]",
               "-ccbin", self.host.path, *self._includes(), "-include", "xlakern/xlakern.h"]
        if o.use_fast_math:
            cmd.append("--use_fast_math")
        cmd += [*o.extra_cuda_cflags, "-MMD", "-MF", str(dep), "-x", "cu", "-c", str(src), "-o", str(obj)]
        return cmd

    def _link(self, objs: list[Path], out: Path, name_unit: Path) -> list[str]:
        o = self.options
        # Share the process's C++ runtime rather than risk a static copy (see process_libstdcxx).
        libstdcxx = _toolchain.process_libstdcxx()
        if o.platform == "cpu":
            # the module-name unit is one array: compiled by the link itself, no step of its own
            return [*self.host.command, "-shared", "-Wl,-Bsymbolic", "-Wl,--no-undefined",
                    *map(str, objs), "-fPIC", str(name_unit), *([libstdcxx] if libstdcxx else []), "-o", str(out),
                    *o.extra_ldflags]
        unit = ["-Xcompiler", "-fPIC", str(name_unit)]
        return [self.cuda.path, "-shared", "-ccbin", self.host.path, "-cudart", "static",
                "-Xlinker", "-Bsymbolic", "-Xlinker", "--no-undefined",
                f"-gencode=arch=compute_{o.arch},code=[sm_{o.arch},compute_{o.arch}]",
                *map(str, objs), *unit, *(["-Xlinker", libstdcxx] if libstdcxx else []),
                "-o", str(out), *o.extra_ldflags]

    def _manifest_key(self, step: _Step, work: Path, source_bytes: bytes) -> str:
        # The temp dir's name varies per build; everything else in the command is what the
        # object depends on (with the source's bytes and the compilers' versions).
        command = [a.replace(str(work), "<work>") for a in step.command]
        versions = [self.host.identity, self.cuda.identity if self.cuda else None]
        # xlakern's and jaxlib's headers are -isystem, so no depfile lists them: their digests go in
        # here, or an object built against an older xlakern or jaxlib (another XLA_FFI_CallFrame,
        # say) would be linked into a module of the new one.
        headers = [_our_headers(), _ffi_headers_digest()]
        return _sha256(json.dumps([command, _sha256(source_bytes), versions, headers]))

    def _compile_steps(self, work: Path) -> list[_Step]:
        steps: list[_Step] = []
        ext = ".cu" if self.options.platform == "cuda" else ".cc"
        for i, s in enumerate(self.sources):
            obj, dep = work / f"src_{i}.o", work / f"src_{i}.d"
            compiled = s.data
            if s.path is not None:
                src = s.path
            else:
                src = work / f"inline_{i}{ext}"
                # The #line directive makes diagnostics (and __FILE__, which XK_CHECK reports) name the
                # user's source; the object is keyed by these bytes, so it is not reused under another name.
                compiled = b'#line 1 "' + s.label.encode() + b'"\n' + s.data + b"\n"
                src.write_bytes(compiled)
            step = _Step(f"compile {s.label}", self._user_compile(src, obj, dep), s.label, obj, dep)
            step.manifest_key = self._manifest_key(step, work, compiled)
            steps.append(step)
        glue_text = _codegen.generate_glue(self.entries, self.options.platform,
                                           allow_cuda_graph=self.options.allow_cuda_graph).encode()
        steps.append(self._generated_step(work, "xlakern_handlers", glue_text, "generated handlers"))
        if self.options.platform == "cpu":  # nvcc's units run parallel_for serially: CUDA modules need no pool
            steps.append(self._generated_step(work, "xlakern_pool", _codegen.POOL_UNIT.encode(), "generated pool"))
        steps.append(self._generated_step(work, "xlakern_frame_errors", _codegen.FRAME_ERRORS_UNIT.encode(),
                                          "generated frame errors", max_level=_ERRORS_LEVEL))
        return steps

    def _generated_step(self, work: Path, stem: str, text: bytes, label: str,
                        max_level: int = _GLUE_MAX_LEVEL) -> _Step:
        """The compile of one unit xlakern writes itself (host compiler, at most -O2: see _GLUE_MAX_LEVEL
        and _ERRORS_LEVEL)."""
        src, obj, dep = work / f"{stem}.cc", work / f"{stem}.o", work / f"{stem}.d"
        src.write_bytes(text)
        step = _Step(f"compile {label}", [*self.host.command, *self._host_flags(max_level=max_level), "-MMD",
                                          "-MF", str(dep), "-c", str(src), "-o", str(obj)], label, obj, dep)
        step.manifest_key = self._manifest_key(step, work, text)
        return step

    def _read_headers(self, step: _Step, work: Path) -> dict[str, str]:
        try:
            deps = parse_depfile(step.depfile.read_text(errors="replace"))
        except OSError:
            raise CompilationError(
                f"building module '{self.name}': {step.what} succeeded but the compiler wrote no dependency "
                f"file (xlakern passes -MMD -MF to learn which headers each object reads). Use a GCC-, "
                f"Clang- or nvcc-compatible compiler") from None
        toolkit = os.path.dirname(os.path.dirname(self.cuda.path)) + os.sep if self.cuda else None
        headers = []
        for d in deps[1:]:  # the first prerequisite is the source itself
            p = os.path.normpath(os.path.join(str(work), d))
            if p.startswith(str(work) + os.sep) or (toolkit and p.startswith(toolkit)):
                continue  # generated files, and the CUDA toolkit (covered by nvcc's version)
            if not os.path.isfile(p):
                continue  # '#include "/dev/stdin"' and other non-files: nothing to track
            headers.append(p)
        return _digests_of(headers)

    def __call__(self, work: Path) -> Path:
        try:
            return self._build(work)
        except OSError as e:
            raise os_error(self.name, e, work.parent.parent) from None

    def _build(self, work: Path) -> Path:
        steps = self._compile_steps(work)
        to_run = []
        for step in steps:
            found = self.store.lookup(step.manifest_key) if (self.store and self.reuse_objects) else None
            if found is not None:
                step.result, step.headers = found
            else:
                to_run.append(step)
        runner = _Runner(work, max_jobs(), build_timeout(), self.verbose)
        results = runner.run_all(to_run)
        self.commands = [shlex.join(st.command) for st in to_run]
        failures = [(st, rc, out) for st, rc, out in results if rc != 0]
        if failures:
            self._fail(failures, work)
        for st, _, out in results:
            self._report_output(st, out, work)
            self._require_output(st)
            st.headers = self._read_headers(st, work)
            st.result = st.output
            if self.store is not None:
                try:
                    st.result = self.store.publish(st.manifest_key, st.output, st.headers)
                except OSError as e:  # the module still builds; only the reuse is lost
                    log.warning("xlakern: cannot keep the object of %s in the object store: %s", st.what, e)
            self.compiled.append(st.label)
        for st in steps:
            self.headers.update(st.headers)
        lib = work / f"lib{self.name}.so"
        name_unit = work / "xlakern_module.cc"
        name_unit.write_text(_codegen.module_name_unit(self.name))
        link = _Step("link", self._link([st.result for st in steps], lib, name_unit), "link", lib)
        ((_, rc, out),) = runner.run_all([link])
        self.commands.append(shlex.join(link.command))
        if rc != 0:
            self._fail([(link, rc, out)], work)
        self._report_output(link, out, work)
        self._require_output(link)
        for st in steps:  # the published build keeps sources and the library only
            st.output.unlink(missing_ok=True)
        return lib

    def _require_output(self, step: _Step) -> None:
        if not step.output.is_file():
            raise CompilationError(
                f"building module '{self.name}': {step.what} exited successfully but did not write its output "
                f"({step.output.name}). The compiler (or a wrapper around it) is broken; run with verbose=True "
                f"to see the command")

    def _report_output(self, step: _Step, output: str, work: Path) -> None:
        text = output.replace(str(work) + os.sep, "").strip()
        if text:  # warnings (or notes) of a successful step; the generated code's are ours, not the user's
            level = logging.DEBUG if step.label.startswith("generated ") else logging.WARNING
            log.log(level, "module '%s', %s:\n%s", self.name, step.what, text)

    def _fail(self, failures, work: Path) -> None:
        kind = "CUDA" if self.options.platform == "cuda" else "C++"
        parts = [f"building module '{self.name}' ({kind}) failed:"]
        for step, rc, output in failures:
            out = output.strip().replace(str(work) + os.sep, "")
            parts.append(f"--- {step.what} (exit {rc}) ---\n{out}{_hint(out)}")
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
