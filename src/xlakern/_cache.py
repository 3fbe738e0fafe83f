"""The on-disk build cache: content-addressed, locked, self-healing.

Layout under the cache root (``~/.cache/xlakern`` by default)::

    <name>/<key>/lib<name>.so      a published build, never modified again
    <name>/<key>/meta.json         written last: the library's SHA-256 and size
    <name>/.<key>.lock             flock'd while <key> is built or deleted
    <name>/.tmp-<key>-<pid>-<rnd>/ a build in progress (private to its builder)

A build happens in a private temp dir and is published with one rename, so a
reader sees either nothing or a complete build. Builders of one key serialise
on the key's lock; the kernel drops a flock when its process dies, so a build
killed mid-way blocks nobody, and its temp dir is swept by the next builder.
A published build whose library no longer matches its recorded hash is
treated as absent and rebuilt, never loaded.

The cache holds code this process will run, so it follows the rules ssh and
pip apply to their own files: directories are created 0700 and files 0600;
the root, and every directory and file below it that a load reads, must be
owned by the current user and not writable by group or others, or the load
is refused with :class:`CacheError`. A library is opened once, without
following a symlink, checked and hashed through that descriptor, and loaded
from the same descriptor, so nothing can be swapped in between.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import re
import shutil
import stat
import threading
from pathlib import Path
from typing import Callable, Iterator

from .errors import CacheError, XlakernError

_root_override: Path | None = None
_root_lock = threading.Lock()

META_FILE = "meta.json"
KEY_CHARS = 32  # hex characters of the key used in directory names


def default_cache_dir() -> Path:
    env = os.environ.get("XLAKERN_CACHE_DIR")
    if env:
        # Absolute now: the compiler runs in a temp dir, where a relative path means something else.
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "xlakern"


def cache_root() -> Path:
    with _root_lock:
        return _root_override if _root_override is not None else default_cache_dir()


def user_path(what: str, value: object) -> Path:
    """A path the user gave (``what`` names the argument), absolute; anything but a str or os.PathLike
    is refused here, not by pathlib's TypeError, which names no argument."""
    if not isinstance(value, (str, os.PathLike)):
        raise XlakernError(f"{what} must be a path (a str or os.PathLike); got {type(value).__name__} "
                           f"{value!r:.60}")
    return Path(value).expanduser().resolve()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use ``path`` as the build cache for this process (None: back to the default).

    Example::

        xlakern.set_cache_dir("/scratch/me/xlakern-cache")
    """
    global _root_override
    root = user_path("set_cache_dir: path", path) if path is not None else None
    with _root_lock:
        _root_override = root


def get_cache_dir() -> Path:
    """The build cache directory in use (``$XLAKERN_CACHE_DIR`` or ``~/.cache/xlakern``)."""
    return cache_root()


# -- permissions ----------------------------------------------------------------

DIR_MODE = 0o700
FILE_MODE = 0o600


def _trusted_uids() -> frozenset[int]:
    """Who may own cache directories and files: you, and root (as ssh allows; tests stand in
    another uid here)."""
    return frozenset((os.geteuid(), 0))


def check_private(st: os.stat_result, path: Path | str) -> None:
    """Raise :class:`CacheError` unless ``st`` (of ``path``) is ours and not group/world-writable."""
    fix = (f"Remove it (or run: chown -R $(id -un) {path} && chmod -R go-w {path}), or point "
           f"XLAKERN_CACHE_DIR / xlakern.set_cache_dir() at a directory of your own")
    if st.st_uid not in _trusted_uids():
        raise CacheError(f"xlakern's cache path {path} is owned by uid {st.st_uid}, not by you (uid "
                         f"{os.geteuid()}) or root; a library there could run code planted by someone else, so "
                         f"it is not used. {fix}")
    if st.st_mode & 0o022:
        raise CacheError(f"xlakern's cache path {path} is writable by its group or by others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); a library there could run code planted by someone "
                         f"else, so it is not used. {fix}")


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents with mode 0700, then check it is private."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass  # made by a concurrent process: checked below like any existing directory
    check_private(os.stat(path), path)


def _make_private_tree(top: Path) -> None:
    """Modes 0700/0600 for everything a builder wrote under ``top`` (it wrote with the umask)."""
    for dirpath, dirnames, filenames in os.walk(top):
        for names, mode in ((dirnames, DIR_MODE), (filenames, FILE_MODE)):
            for n in names:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    os.chmod(p, mode)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) through a temp file and a rename."""
    make_private_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE), "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return fd_sha256(f.fileno())


def fd_sha256(fd: int) -> str:
    """SHA-256 of the whole file open on ``fd``, read from its start."""
    h = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, 1 << 20, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


def read_lookup(path: Path, entry_ok: Callable[[object], bool], max_entries: int = 20000) -> dict:
    """A lookup file of the cache root (a JSON object of entries), healed as it is read.

    These files only save work, so anything unexpected in them (not JSON, not an object, an
    entry of the wrong shape) is dropped, never trusted: the dropped entries are recomputed and
    the file is rewritten by its next save.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        data = None
    healed = {}
    if isinstance(data, dict) and len(data) <= max_entries:
        healed = {k: v for k, v in data.items() if isinstance(k, str) and entry_ok(v)}
    if not isinstance(data, dict) or len(healed) != len(data):
        with contextlib.suppress(OSError, XlakernError):  # a read-only or foreign cache: heal in memory only
            atomic_write_text(path, json.dumps(healed))
    return healed


@contextlib.contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields False if non-blocking and busy."""
    make_private_dirs(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            raise
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class VerifiedLibrary:
    """A published library, open on ``fd``, whose owner, mode, size and hash were checked there.

    Load it through ``fd`` (the runtime dlopens ``/proc/self/fd/<fd>``), then :meth:`close`.
    """

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "VerifiedLibrary":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)


def _open_checked(name: str, dir_fd: int | None, flags: int, shown: Path) -> int:
    """Open ``name`` (relative to ``dir_fd``, never through a final symlink) and check the
    object opened is private; returns its descriptor."""
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        check_private(os.fstat(fd), shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Entry:
    """One (module name, content key) slot of a cache root."""

    def __init__(self, root: Path, name: str, key: str):
        self.root = root
        self.name = name
        self.key = key
        self.dir = root / name
        self.published = self.dir / key[:KEY_CHARS]
        self.lock_path = self.dir / f".{key[:KEY_CHARS]}.lock"
        self.meta: dict = {}

    @property
    def library(self) -> Path:
        return self.published / f"lib{self.name}.so"

    def open_library(self, accept: Callable[[dict], bool] | None = None) -> VerifiedLibrary | None:
        """The published library, opened and verified, if it is complete, matches its record and
        ``accept(meta)`` (e.g. its headers are unchanged). Its metadata is then in ``self.meta``.

        Each directory from the root down is opened relative to the one above it, without
        following symlinks (the root itself may be one: the user chose it), and checked
        through its descriptor. Raises :class:`CacheError` for a path that is not private.
        """
        fds: list[int] = []
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fds.append(root_fd)
            check_private(os.fstat(root_fd), self.root)
            fds.append(_open_checked(self.name, root_fd, _O_DIR, self.dir))
            fds.append(_open_checked(self.published.name, fds[-1], _O_DIR, self.published))
            key_fd = fds[-1]
            meta_fd = _open_checked(META_FILE, key_fd, _O_FILE, self.published / META_FILE)
            with os.fdopen(meta_fd, "rb") as f:
                meta = json.loads(f.read())
            lib_fd = _open_checked(self.library.name, key_fd, _O_FILE, self.library)
            try:
                st = os.fstat(lib_fd)
                if (not isinstance(meta, dict) or meta.get("key") != self.key or not stat.S_ISREG(st.st_mode)
                        or st.st_size != meta.get("size") or fd_sha256(lib_fd) != meta.get("sha256")
                        or (accept is not None and not accept(meta))):
                    os.close(lib_fd)
                    return None
            except BaseException:
                os.close(lib_fd)
                raise
            self.meta = meta
            return VerifiedLibrary(self.library, lib_fd)
        except (OSError, ValueError, AttributeError, TypeError):
            return None
        finally:
            for fd in fds:
                os.close(fd)

    def valid_library(self, accept: Callable[[dict], bool] | None = None) -> Path | None:
        """The published library's path if it is complete, private, matches its recorded hash and
        ``accept(meta)``. Its metadata is then in ``self.meta``."""
        lib = self.open_library(accept)
        if lib is None:
            return None
        lib.close()
        return lib.path

    def _sweep_temp_dirs(self) -> None:
        # Only called under the key's lock: any temp dir of this key belongs
        # to a builder that died.
        prefix = f".tmp-{self.key[:KEY_CHARS]}-"
        if self.dir.is_dir():
            for p in self.dir.iterdir():
                if p.name.startswith(prefix):
                    shutil.rmtree(p, ignore_errors=True)

    def build(self, builder: Callable[[Path], Path], meta: dict | Callable[[], dict], *, force: bool = False,
              accept: Callable[[dict], bool] | None = None) -> tuple[Path, bool]:
        """Return the library, building it with ``builder(temp_dir) -> lib`` if needed
        (always, with ``force``). Returns (library path, whether this call built it).
        ``meta`` (or what it returns once the builder ran) is recorded with the build.
        """
        make_private_dirs(self.root)
        with file_lock(self.lock_path):
            lib = None if force else self.valid_library(accept)
            if lib is not None:
                return lib, False  # another process published it while we waited
            self._sweep_temp_dirs()
            tmp = self.dir / f".tmp-{self.key[:KEY_CHARS]}-{os.getpid()}-{secrets.token_hex(4)}"
            os.mkdir(tmp, DIR_MODE)
            try:
                built = builder(tmp)
                final_name = f"lib{self.name}.so"
                if built.name != final_name:
                    os.replace(built, tmp / final_name)
                lib_tmp = tmp / final_name
                _make_private_tree(tmp)
                self.meta = record = dict(meta() if callable(meta) else meta, key=self.key,
                                          sha256=file_sha256(lib_tmp), size=lib_tmp.stat().st_size)
                atomic_write_text(tmp / META_FILE, json.dumps(record, indent=1, sort_keys=True))
                if self.published.exists():
                    # A corrupt earlier build: move it aside, then publish.
                    trash = self.dir / f".trash-{self.key[:KEY_CHARS]}-{secrets.token_hex(4)}"
                    os.replace(self.published, trash)
                    shutil.rmtree(trash, ignore_errors=True)
                os.replace(tmp, self.published)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return self.library, True


# Names xlakern gives what it creates: module directories (module names), and in them
# published builds (hex keys) and the temp/trash directories of builds.
_MODULE_DIR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BUILD_DIR_RE = re.compile(r"(\.(tmp|trash)-)?([0-9a-f]{%d})(-.*)?" % KEY_CHARS)


def _real_dir(path: Path) -> bool:
    """A directory itself, not a symlink to one (clear never follows a link out of the cache)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def clear(root: Path, name: str | None = None) -> dict[str, list[str]]:
    """Delete published builds (all, or those of module ``name``).

    Only what xlakern created is touched: module directories named like modules, and in them
    build directories named by a key. Symlinks are never followed (a linked module folder is
    skipped, not emptied), and nothing outside ``root`` is reached. A key whose lock is held (a
    build in progress) is skipped, never deleted.
    Returns {"removed": [...], "skipped": [...]} of build directories.
    """
    if name is not None and (not isinstance(name, str) or not _MODULE_DIR_RE.fullmatch(name)):
        raise XlakernError(f"clear_cache: {name!r} is not a module name (a C identifier such as 'my_ops'); "
                           f"pass the name a module was loaded under, or nothing to clear every module")
    removed: list[str] = []
    skipped: list[str] = []
    if not root.is_dir():
        return {"removed": removed, "skipped": skipped}
    if name is not None:
        names = [name]
    else:
        names = sorted(p.name for p in root.iterdir() if _MODULE_DIR_RE.fullmatch(p.name))
    for n in names:
        d = root / n
        if not _real_dir(d):
            if d.is_symlink():
                skipped.append(str(d))
            continue
        keys = set()
        for p in d.iterdir():
            m = _BUILD_DIR_RE.fullmatch(p.name)
            if m is not None and (m.group(1) is None) == (m.group(4) is None):
                keys.add(m.group(3))
            elif p.name.startswith(".") and p.name.endswith(".lock") and _BUILD_DIR_RE.fullmatch(p.name[1:-5]):
                keys.add(p.name[1:-5])
        for k in sorted(keys):
            with file_lock(d / f".{k}.lock", blocking=False) as got:
                if not got:
                    skipped.append(str(d / k))
                    continue
                for p in list(d.iterdir()):
                    if p.name == k or p.name.startswith((f".tmp-{k}-", f".trash-{k}-")):
                        if not _real_dir(p):  # a link planted in place of a build: remove the link only
                            with contextlib.suppress(OSError):
                                os.unlink(p)
                            continue
                        shutil.rmtree(p, ignore_errors=True)
                        if p.name == k:
                            removed.append(str(p))
        # Lock files stay: a concurrent builder may hold one open, and
        # unlinking it would let two builders lock different files.
    return {"removed": removed, "skipped": skipped}


def cache_size(root: Path) -> tuple[int, int]:
    """(number of published builds, total bytes) under ``root``."""
    count = total = 0
    if not root.is_dir():
        return 0, 0
    for d in root.iterdir():
        if not _real_dir(d):
            continue
        for k in d.iterdir():
            if _real_dir(k) and not k.name.startswith("."):
                count += 1
                for f in k.iterdir():
                    with contextlib.suppress(OSError):
                        total += f.stat().st_size
    return count, total
