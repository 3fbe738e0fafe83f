"""Compiled Numba kernels kept on disk, so a new process skips Numba's compiler.

Each stored kernel lives in the build cache under a kind directory whose name is not a C
identifier, so it can never clash with a module name, and follows the build cache's
layout (``clear_cache`` and ``python -m xlakern cache`` handle it like a module)::

    <cache root>/numba-cpu/<key>/entry.bin     a CPU kernel: its cfunc's Numba compile result
    <cache root>/numba-cuda/<key>/entry.bin    a CUDA kernel: its image
    <cache root>/<kind>/.<key>.lock            held while <key> is published or deleted

The key hashes everything the machine code depends on: the kernel's content fingerprint
(its code, closure, globals and the jitted functions it calls), the signature, and the
versions of Python, Numba, llvmlite and NumPy (and, for the CPU, the host CPU Numba
targets). Only kernels whose fingerprint is *portable* (nothing in it is keyed by object
identity or by a user module's name alone) are stored, so an edited kernel always gets a
new key. ``entry.bin`` holds a magic line, the SHA-256 of the payload, then the payload; a
file that fails the check is ignored and replaced. A store that cannot be written (a
read-only cache) only costs the compile in the next process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import sys
from pathlib import Path

import numpy

from . import _cache

CPU_KIND = "numba-cpu"
CUDA_KIND = "numba-cuda"
# The file format's name and version, and the file's name: kept as first written, so stored
# kernels stay readable.
_MAGIC = b"xlakern-numba-entry 1\n"
_FILE = "entry.bin"
_log = logging.getLogger("xlakern")


def disk_key(kind: str, *parts: object) -> str:
    """The content key of a stored kernel of ``kind``, from what its machine code depends on."""
    import llvmlite
    import numba

    context = (kind, sys.version_info[:2], numba.__version__, llvmlite.__version__, numpy.__version__)
    return hashlib.sha256(repr((context, parts)).encode()).hexdigest()


def _slot(kind: str, key: str) -> tuple[Path, Path]:
    directory = _cache.cache_root() / kind
    return directory, directory / key[:_cache.KEY_CHARS]


def load(kind: str, key: str) -> bytes | None:
    """The stored payload of ``key``, or None if absent or damaged."""
    _, published = _slot(kind, key)
    try:
        blob = (published / _FILE).read_bytes()
    except OSError:
        return None
    head = len(_MAGIC)
    digest, payload = blob[head:head + 64], blob[head + 65:]
    if not blob.startswith(_MAGIC) or hashlib.sha256(payload).hexdigest().encode() != digest:
        _log.warning("xlakern: ignoring a damaged stored Numba kernel %s", published)
        return None
    return payload


def store(kind: str, key: str, payload: bytes) -> None:
    """Publish ``payload`` under ``key`` (a temp dir renamed into place under the key's lock)."""
    directory, published = _slot(kind, key)
    short = key[:_cache.KEY_CHARS]
    tmp = directory / f".tmp-{short}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir(parents=True)
        with open(tmp / _FILE, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            f.flush()
            os.fsync(f.fileno())
        with _cache.file_lock(directory / f".{short}.lock"):
            if published.exists():  # damaged (we only store after a failed load): replace it
                trash = directory / f".trash-{short}-{secrets.token_hex(4)}"
                os.replace(published, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, published)
    except OSError as e:
        _log.info("xlakern: could not store a compiled Numba kernel under %s: %s", directory, e)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
