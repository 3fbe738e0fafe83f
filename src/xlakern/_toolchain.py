"""Finding compilers, their versions, jaxlib's FFI headers and the GPU arch.

Nothing here starts a subprocess on a warm path: compiler versions are looked
up once per (path, mtime, size) and remembered in the cache directory, so a
cache hit in a fresh process runs no compiler at all.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jax

from . import _cache
from ._stamped_lookup import Stamped, StampedLookup
from .errors import (
    GpuArchDetectionError,
    HeaderNotFoundError,
    HostCompilerNotFoundError,
    NvccNotFoundError,
    ToolchainError,
)

_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Tool:
    """A compiler: how to invoke it, the real compiler behind it and that compiler's version.

    ``command`` may start with a launcher (``ccache g++`` gives ``("/usr/bin/ccache",
    "/usr/bin/g++")``); ``compiler`` is then the real compiler, whose version is recorded and
    which nvcc gets as ``-ccbin`` (nvcc cannot take a launcher there).
    """

    command: tuple[str, ...]
    version: str
    compiler: str = ""  # the real compiler; empty: command[0] is it

    @property
    def path(self) -> str:
        return self.compiler or self.command[0]

    @property
    def identity(self) -> list:
        """What the build cache records: the real compiler, its extra words and version (not the
        launcher, which does not change what is built)."""
        words = list(self.command)
        if self.compiler and self.compiler in words:
            words = words[words.index(self.compiler):]
        return [self.path, *words[1:], self.version]


def include_dir() -> Path:
    """Directory of xlakern's public C++ headers (``xlakern/xlakern.h``, ``brainevent/common.h``)."""
    d = _PACKAGE_DIR / "include"
    if not (d / "xlakern" / "xlakern.h").is_file():
        raise HeaderNotFoundError(
            f"xlakern's C++ headers are missing from {d}; reinstall xlakern (pip install --no-build-isolation .)"
        )
    return d


@functools.lru_cache(maxsize=None)
def ffi_include_dir() -> Path:
    """jaxlib's XLA FFI header directory (``jax.ffi.include_dir()``)."""
    d = Path(jax.ffi.include_dir())
    if not (d / "xla" / "ffi" / "api" / "ffi.h").is_file():
        raise HeaderNotFoundError(
            f"jaxlib's XLA FFI headers are not at {d}; install a jaxlib that ships them (jax>=0.4.36)"
        )
    return d


# -- version memo -----------------------------------------------------------

def _encode_version(known: Stamped) -> object:
    return {"stamp": [known.mtime_ns, known.size], "version": known.value}


def _decode_version(entry: object) -> Stamped | None:
    if not (isinstance(entry, dict) and isinstance(entry.get("version"), str)):
        return None
    stamp = entry.get("stamp")
    if not (isinstance(stamp, list) and len(stamp) == 2):
        return None
    return Stamped(stamp[0], stamp[1], entry["version"], None)


_versions = StampedLookup("toolchain-versions.json", _encode_version, _decode_version)


def tool_version(path: str) -> str:
    """First lines of ``path --version``, remembered by (path, mtime, size)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ToolchainError(f"compiler {path} cannot be read: {e}") from None
    known = _versions.get(path, st)
    if known is not None:
        return known
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, errors="replace",
                             stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"cannot run '{path} --version': {e}") from None
    text = (out.stdout or out.stderr).strip()
    if out.returncode != 0 or not text:
        raise ToolchainError(f"'{path} --version' failed (exit {out.returncode}): {out.stderr.strip()[:300]}")
    version = "\n".join(line for line in text.splitlines() if line.strip())
    _versions.put(path, st, version)
    _versions.save()  # a read-only cache only costs a --version run next time
    return version


# -- compilers ----------------------------------------------------------------


_LAUNCHERS = ("ccache", "sccache")


def _real_behind_masquerade(path: str) -> str | None:
    """For a ccache/sccache symlink named like a compiler (``/usr/lib/ccache/g++``), the compiler of
    that name further down PATH; None when ``path`` is not such a symlink."""
    if os.path.basename(os.path.realpath(path)) not in _LAUNCHERS or os.path.basename(path) in _LAUNCHERS:
        return None
    name = os.path.basename(path)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cand = os.path.join(d, name)
        if os.access(cand, os.X_OK) and os.path.basename(os.path.realpath(cand)) not in _LAUNCHERS:
            return os.path.realpath(cand)
    raise ToolchainError(f"{path} is a compiler cache wrapper, but no real '{name}' follows it on PATH; "
                         f"install {name} or point CXX at the real compiler")


def host_compiler() -> Tool:
    """The C++ compiler: ``$CXX`` if set, else g++, else clang++.

    ``CXX`` may name a launcher before the compiler (``ccache g++``, ``sccache clang++``) or a
    ccache symlink named like the compiler; builds then go through the launcher, while the
    version check and nvcc's ``-ccbin`` use the real compiler.
    """
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        words = shlex.split(cxx)
        path = shutil.which(words[0])
        if path is None:
            raise HostCompilerNotFoundError(
                f"CXX={cxx!r} but '{words[0]}' is not an executable on PATH; fix or unset CXX")
        # 'launcher compiler [flags]': a second word that is a program, not a flag.
        second = shutil.which(words[1]) if len(words) > 1 and not words[1].startswith("-") else None
        if second is not None:
            real = _real_behind_masquerade(second) or os.path.realpath(second)
            command = (os.path.abspath(path), real, *words[2:])
            return Tool(command, tool_version(real), real)
    else:
        for name in ("g++", "clang++", "c++"):
            path = shutil.which(name)
            if path:
                words = [name]
                break
        else:
            raise HostCompilerNotFoundError(
                "no C++ compiler found: install g++ or clang++ (e.g. apt-get install g++), or point CXX at one"
            )
    real = _real_behind_masquerade(path)
    if real is not None:  # keep the symlink's path: ccache decides what to run by the name it was called by
        return Tool((os.path.abspath(path), *words[1:]), tool_version(real), real)
    command = (os.path.realpath(path), *words[1:])
    return Tool(command, tool_version(command[0]))


def _pip_nvcc_candidates() -> list[Path]:
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for root in spec.submodule_search_locations:
        found += sorted(Path(root).glob("*/bin/nvcc"))
    return found


# Where find_nvcc looks first after $XLAKERN_NVCC and $CUDA_HOME/$CUDA_PATH: pip's nvidia packages
# ("pip", the default) or PATH and /usr/local/cuda ("system"); config.prefer_system_nvcc sets it.
_nvcc_preference = "pip"
_pinned_arch: str | None = None  # config.set_compute_capability's architecture ('90'), or None


def set_nvcc_preference(preference: str) -> None:
    global _nvcc_preference
    if preference not in ("pip", "system"):
        raise ToolchainError(f"nvcc preference must be 'pip' or 'system'; got {preference!r}")
    _nvcc_preference = preference


def set_pinned_arch(value: object) -> None:
    """Pin the arch cuda_arch falls back to ('9.0', 'sm_90', (9, 0), ...), or None to detect again."""
    global _pinned_arch
    _pinned_arch = None if value is None else _normalise_arch(value, "compute capability")


def pinned_arch() -> str | None:
    return _pinned_arch


def find_nvcc() -> str:
    """Path of nvcc: $XLAKERN_NVCC, $CUDA_HOME, $CUDA_PATH, then pip's nvidia packages and PATH (and
    /usr/local/cuda) in the order config.prefer_system_nvcc chose (pip's first by default)."""
    tried = []
    env = os.environ.get("XLAKERN_NVCC")
    if env:
        if os.access(env, os.X_OK):
            return os.path.realpath(env)
        raise NvccNotFoundError(f"XLAKERN_NVCC={env!r} is not an executable; fix or unset it")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            cand = Path(root) / "bin" / "nvcc"
            tried.append(f"${var}/bin/nvcc ({cand})")
            if os.access(cand, os.X_OK):
                return os.path.realpath(cand)

    def from_pip():
        for cand in _pip_nvcc_candidates():
            tried.append(str(cand))
            if os.access(cand, os.X_OK):
                return os.path.realpath(cand)
        return None

    def from_system():
        path = shutil.which("nvcc")
        tried.append("nvcc on PATH")
        if path:
            return os.path.realpath(path)
        cand = Path("/usr/local/cuda/bin/nvcc")
        tried.append(str(cand))
        return os.path.realpath(cand) if os.access(cand, os.X_OK) else None

    order = (from_system, from_pip) if _nvcc_preference == "system" else (from_pip, from_system)
    for look in order:
        found = look()
        if found:
            return found
    raise NvccNotFoundError(
        "nvcc not found (looked at: " + ", ".join(tried) + "). Install the CUDA toolkit or "
        "'pip install nvidia-cuda-nvcc', or set XLAKERN_NVCC / CUDA_HOME"
    )


def nvcc() -> Tool:
    path = find_nvcc()
    return Tool((path,), tool_version(path))


@functools.lru_cache(maxsize=None)
def process_libstdcxx() -> str | None:
    """Path of the libstdc++ this process has loaded (jaxlib brings one), if any.

    Kernel libraries link against it explicitly. Some toolchains (e.g. a relocated GCC
    shipping only libstdc++.a) would otherwise link the C++ runtime statically into each
    kernel library, where GCC 13's iostream/locale objects are never initialised: the
    first std::ostringstream then crashes the process.
    """
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "/libstdc++.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


# -- GPU architecture ---------------------------------------------------------


def _normalise_arch(value: object, origin: str) -> str:
    text = str(value).strip().lower()
    for prefix in ("sm_", "compute_", "sm"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    if isinstance(value, tuple) and len(value) == 2:
        text = f"{value[0]}{value[1]}"
    text = text.replace(".", "")
    suffix = ""
    if text.endswith(("a", "f")):
        text, suffix = text[:-1], text[-1]
    if not text.isdigit() or not 2 <= len(text) <= 3:
        raise GpuArchDetectionError(
            f"{origin}={value!r} is not a compute capability; use e.g. '9.0', '90', 'sm_90' or (9, 0)"
        )
    return text + suffix


def gpu_compute_capabilities() -> tuple[tuple[int, int], ...]:
    """``(major, minor)`` of every GPU JAX sees, in device order; ``()`` without a GPU.

    The one place xlakern asks the devices: module builds (:func:`gpu_compute_capability`) and
    Numba CUDA kernels (a cubin when every GPU shares one capability, else PTX) read it.

    Example::

        >>> xlakern._toolchain.gpu_compute_capabilities()
        ((9, 0),)
    """
    try:
        devices = jax.devices("gpu")
    except Exception:  # no GPU backend: RuntimeError, or a plugin failing to start
        return ()
    found = []
    for d in devices:
        cc = getattr(d, "compute_capability", None)  # "9.0"; a GPU without one cannot be built for
        if cc:
            major, _, minor = str(cc).partition(".")
            found.append((int(major), int(minor or 0)))
    return tuple(found)


def gpu_compute_capability() -> str | None:
    """The arch a CUDA module is built for by default ('90' on Hopper), or None without a GPU.

    With GPUs of different capabilities, the lowest: the build embeds that arch's PTX, which the
    driver compiles for the newer GPUs, so the module runs on every GPU JAX sees.
    """
    capabilities = gpu_compute_capabilities()
    return _normalise_arch(min(capabilities), "the device's compute capability") if capabilities else None


def cuda_arch(compute_capability: object = None) -> str:
    """The arch to build for: argument, then $XLAKERN_CUDA_ARCH, then config.set_compute_capability's,
    then JAX's GPU."""
    if compute_capability is not None:
        return _normalise_arch(compute_capability, "compute_capability")
    env = os.environ.get("XLAKERN_CUDA_ARCH")
    if env:
        return _normalise_arch(env, "XLAKERN_CUDA_ARCH")
    if _pinned_arch is not None:
        return _pinned_arch
    cc = gpu_compute_capability()
    if cc is None:
        raise GpuArchDetectionError(
            "cannot tell which GPU to build for: JAX sees no GPU. Pass compute_capability='9.0' "
            "(or set XLAKERN_CUDA_ARCH=90) to build without one"
        )
    return cc
