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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator

_root_override: Path | None = None
_root_lock = threading.Lock()

META_FILE = "meta.json"
KEY_CHARS = 32  # hex characters of the key used in directory names


def default_cache_dir() -> Path:
    env = os.environ.get("XLAKERN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "xlakern"


def cache_root() -> Path:
    with _root_lock:
        return _root_override if _root_override is not None else default_cache_dir()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use ``path`` as the build cache for this process (None: back to the default).

    Example::

        xlakern.set_cache_dir("/scratch/me/xlakern-cache")
    """
    global _root_override
    with _root_lock:
        _root_override = Path(path).expanduser().resolve() if path is not None else None


def get_cache_dir() -> Path:
    """The build cache directory in use (``$XLAKERN_CACHE_DIR`` or ``~/.cache/xlakern``)."""
    return cache_root()


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields False if non-blocking and busy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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


class Entry:
    """One (module name, content key) slot of a cache root."""

    def __init__(self, root: Path, name: str, key: str):
        self.name = name
        self.key = key
        self.dir = root / name
        self.published = self.dir / key[:KEY_CHARS]
        self.lock_path = self.dir / f".{key[:KEY_CHARS]}.lock"
        self.meta: dict = {}

    @property
    def library(self) -> Path:
        return self.published / f"lib{self.name}.so"

    def valid_library(self, accept: Callable[[dict], bool] | None = None) -> Path | None:
        """The published library if it is complete, matches its recorded hash and ``accept(meta)``
        (e.g. its headers are unchanged). Its metadata is then in ``self.meta``."""
        try:
            meta = json.loads((self.published / META_FILE).read_text())
            lib = self.library
            if meta.get("key") != self.key or lib.stat().st_size != meta.get("size"):
                return None
            if file_sha256(lib) != meta.get("sha256"):
                return None
            if accept is not None and not accept(meta):
                return None
            self.meta = meta
            return lib
        except (OSError, ValueError, AttributeError, TypeError):
            return None

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
        with file_lock(self.lock_path):
            lib = None if force else self.valid_library(accept)
            if lib is not None:
                return lib, False  # another process published it while we waited
            self._sweep_temp_dirs()
            tmp = self.dir / f".tmp-{self.key[:KEY_CHARS]}-{os.getpid()}-{secrets.token_hex(4)}"
            tmp.mkdir(parents=True)
            try:
                built = builder(tmp)
                final_name = f"lib{self.name}.so"
                if built.name != final_name:
                    os.replace(built, tmp / final_name)
                lib_tmp = tmp / final_name
                self.meta = record = dict(meta() if callable(meta) else meta, key=self.key, sha256=file_sha256(lib_tmp), size=lib_tmp.stat().st_size)
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


def clear(root: Path, name: str | None = None) -> dict[str, list[str]]:
    """Delete published builds (all, or those of module ``name``).

    A key whose lock is held (a build in progress) is skipped, never deleted.
    Returns {"removed": [...], "skipped": [...]} of build directories.
    """
    removed: list[str] = []
    skipped: list[str] = []
    if not root.is_dir():
        return {"removed": removed, "skipped": skipped}
    names = [name] if name is not None else [p.name for p in root.iterdir() if p.is_dir()]
    for n in names:
        d = root / n
        if not d.is_dir():
            continue
        keys = {p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")}
        keys |= {p.name[1:-5] for p in d.iterdir() if p.name.startswith(".") and p.name.endswith(".lock")}
        for k in sorted(keys):
            with file_lock(d / f".{k}.lock", blocking=False) as got:
                if not got:
                    skipped.append(str(d / k))
                    continue
                for p in list(d.iterdir()):
                    if p.name == k or p.name.startswith((f".tmp-{k}-", f".trash-{k}-")):
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
        if not d.is_dir():
            continue
        for k in d.iterdir():
            if k.is_dir() and not k.name.startswith("."):
                count += 1
                for f in k.iterdir():
                    with contextlib.suppress(OSError):
                        total += f.stat().st_size
    return count, total
