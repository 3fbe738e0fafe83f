"""Values computed from a file, remembered while the file keeps its (mtime, size) stamp.

Two lookup files of the cache root use it: the compilers' ``--version`` text (``_toolchain``)
and the digests of the files a build reads (``_build``), so that a cache hit in a fresh process
only stats files. Each file keeps its own entry shape (``encode``/``decode``); an entry that
does not decode is dropped when the file is read, and recomputed (``_cache.read_lookup``).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple

from . import _cache


class Stamped(NamedTuple):
    """A value, the stamp of the file it was computed from, and when it was computed."""

    mtime_ns: int
    size: int
    value: Any
    computed_at_ns: int | None  # None: not recorded (then no racy check can pass)


class StampedLookup:
    """``{path: value}`` kept while the file at ``path`` has the same (mtime, size), in memory and
    in the lookup file ``file_name`` of the cache root.

    With ``racy_ns``, a value computed within that margin of its file's mtime is not trusted:
    file times tick coarsely, so the file could change again without its stamp changing (git's
    "racily clean" rule). It is recomputed until the file is older.

    Example::

        versions = StampedLookup("versions.json", encode, decode)
        st = os.stat(path)
        version = versions.get(path, st)
        if version is None:
            versions.put(path, st, run_version(path))
            versions.save()
    """

    def __init__(self, file_name: str, encode: Callable[[Stamped], object],
                 decode: Callable[[object], Stamped | None], racy_ns: int = 0):
        self._file_name = file_name
        self._encode = encode
        self._decode = decode
        self._racy_ns = racy_ns
        self._lock = threading.Lock()
        self._entries: dict[str, object] | None = None  # as encoded in the file
        self._dirty = False

    def _path(self) -> Path:
        return _cache.cache_root() / self._file_name

    def _loaded(self) -> dict[str, object]:
        if self._entries is None:
            self._entries = _cache.read_lookup(self._path(), lambda v: self._decode(v) is not None)
        return self._entries

    def get(self, path: str, st: os.stat_result) -> Any | None:
        """The value remembered for ``path`` if its file still has stamp ``st``, else None."""
        with self._lock:
            raw = self._loaded().get(path)
        known = None if raw is None else self._decode(raw)
        if known is None or known.mtime_ns != st.st_mtime_ns or known.size != st.st_size:
            return None
        if self._racy_ns and (known.computed_at_ns is None
                              or known.mtime_ns >= known.computed_at_ns - self._racy_ns):
            return None
        return known.value

    def put(self, path: str, st: os.stat_result, value: Any, computed_at_ns: int | None = None) -> None:
        """Remember ``value`` for ``path`` at stamp ``st``; :meth:`save` writes it to the file."""
        with self._lock:
            self._loaded()[path] = self._encode(Stamped(st.st_mtime_ns, st.st_size, value, computed_at_ns))
            self._dirty = True

    def save(self) -> None:
        """Write the lookup file if anything was remembered since the last save."""
        with self._lock:
            if not self._dirty or self._entries is None:
                return
            text = json.dumps(self._entries, sort_keys=True)
            self._dirty = False
        try:
            _cache.atomic_write_text(self._path(), text)
        except OSError:
            pass  # a read-only cache: only the shortcut is lost
