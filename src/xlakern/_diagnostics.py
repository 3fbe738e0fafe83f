"""``print_diagnostics()`` / ``python -m xlakern doctor``: what xlakern sees."""

from __future__ import annotations

import ctypes
import platform
import sys
from importlib import metadata
from typing import Callable, TextIO

import jax
import jaxlib

from . import _bridge, _cache, _runtime, _toolchain
from ._version import __version__

# Distributions whose versions decide what xlakern can build and run (pip names).
_COMPONENTS = [
    ("numpy", "numpy"),
    ("ml_dtypes", "ml_dtypes"),
    ("numba", "numba"),
    ("llvmlite", "llvmlite"),
    ("numba-cuda", "numba-cuda"),
    ("warp", "warp-lang"),
    ("nanobind (builds only)", "nanobind"),
    ("scikit-build-core (builds only)", "scikit-build-core"),
]
_JAX_CUDA_PLUGINS = ["jax-cuda13-plugin", "jax-cuda12-plugin"]


def _try(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as e:  # a diagnostic report must never fail
        return f"unavailable ({e})"


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def _version_of(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def nvidia_driver_version() -> str:
    """The CUDA version the NVIDIA driver supports (``cuDriverGetVersion``), or why not known.

    Asks libcuda directly through ctypes (no CUDA context is created), so it works without
    jax's CUDA plugin or numba-cuda.

    Example::

        >>> xlakern._diagnostics.nvidia_driver_version()
        'CUDA 13.0 (libcuda.so.1)'
    """
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver (libcuda.so.1 not found)"
    version = ctypes.c_int(0)
    status = libcuda.cuDriverGetVersion(ctypes.byref(version))
    if status != 0:
        return f"libcuda.so.1 found, cuDriverGetVersion failed (CUresult {status})"
    return f"CUDA {version.value // 1000}.{version.value % 1000 // 10} (libcuda.so.1)"


def _gpus() -> str:
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return "none visible to JAX"
    return "; ".join(f"{d.id}: {getattr(d, 'device_kind', '?')} (compute capability "
                     f"{getattr(d, 'compute_capability', '?')})" for d in devices) or "none visible to JAX"


def _threading_layer() -> str:
    import numba  # optional: imported only when the report asks
    from numba.np.ufunc import parallel

    if getattr(parallel, "_is_initialized", False):
        return f"{numba.threading_layer()} (NUMBA_THREADING_LAYER={numba.config.THREADING_LAYER})"
    available = []
    for layer, module in [("tbb", "tbbpool"), ("omp", "omppool"), ("workqueue", "workqueue")]:
        try:
            __import__(f"numba.np.ufunc.{module}")
            available.append(layer)
        except ImportError:
            pass
    return (f"not started in this process (NUMBA_THREADING_LAYER={numba.config.THREADING_LAYER}; "
            f"loadable: {', '.join(available) or 'none'}; for parallel kernels xlakern asks for a "
            f"thread-safe one unless you chose one)")


def print_diagnostics(file: TextIO | None = None, *, command_line: bool = False) -> None:
    """Print versions of every component, toolchain paths, the NVIDIA driver and GPUs, Numba's
    threading layer, the cache dir and size, and the FFI targets registered in this process.

    ``command_line=True`` (``python -m xlakern doctor``) says that a new process has registered
    nothing yet, instead of listing no targets.

    Example::

        >>> xlakern.print_diagnostics()
        xlakern 0.1.0 ...
    """
    out = file or sys.stdout
    rows: list[tuple[str, str]] = [
        ("xlakern", f"{__version__} ({_try(lambda: str(_toolchain.include_dir().parent))})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("jax / jaxlib", f"{jax.__version__} / {jaxlib.__version__}"),
    ]
    plugins = [f"{p} {_version_of(p)}" for p in _JAX_CUDA_PLUGINS if _version_of(p) != "not installed"]
    rows.append(("jax CUDA plugin", ", ".join(plugins) or "not installed (jax runs on the CPU only)"))
    rows += [(label, _version_of(dist)) for label, dist in _COMPONENTS]
    rows += [
        ("numba threading layer", _try(_threading_layer)),
        ("XLA FFI API (runtime built with)", ".".join(map(str, _runtime.FFI_API_VERSION))),
        ("XLA FFI headers", _try(lambda: str(_toolchain.ffi_include_dir()))),
        ("xlakern headers", _try(lambda: str(_toolchain.include_dir()))),
        ("host compiler", _try(lambda: (lambda t: f"{t.path}: {_first_line(t.version)}")(_toolchain.host_compiler()))),
        ("nvcc", _try(lambda: (lambda t: f"{t.path}: {t.version.splitlines()[-1]}")(_toolchain.nvcc()))),
        ("NVIDIA driver", _try(nvidia_driver_version)),
        ("JAX devices", _try(lambda: ", ".join(str(d) for d in jax.devices()))),
        ("GPUs", _try(_gpus)),
        ("GPU arch", _try(lambda: (lambda cc: f"sm_{cc}" if cc else "no GPU visible to JAX")(
            _toolchain.gpu_compute_capability()))),
    ]
    root = _cache.cache_root()
    count, size = _cache.cache_size(root)
    rows.append(("cache dir", f"{root} ({count} builds, {size / 1e6:.1f} MB)"))
    targets = _bridge.registered_targets()  # what list_registered_targets() says
    if targets:
        registered = ", ".join(targets)
    elif command_line:
        registered = ("none yet: this is a new process. FFI targets live in the process that loads them; "
                      "call xlakern.print_diagnostics() in your program to list its targets")
    else:
        registered = "none yet in this process (loading a module or calling a Numba kernel registers them)"
    rows.append(("registered targets", registered))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}", file=out)
