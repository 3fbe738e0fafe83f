"""``print_diagnostics()`` / ``python -m xlakern doctor``: what xlakern sees."""

from __future__ import annotations

import platform
import sys
from typing import Callable, TextIO

from . import _bridge, _cache, _runtime, _toolchain
from ._version import __version__


def _try(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as e:  # a diagnostic report must never fail
        return f"unavailable ({e})"


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def print_diagnostics(file: TextIO | None = None) -> None:
    """Print versions, toolchain paths, GPU arch, cache dir and size, and registered targets.

    Example::

        >>> xlakern.print_diagnostics()
        xlakern 0.1.0 ...
    """
    import jax
    import jaxlib
    import numpy

    out = file or sys.stdout
    rows: list[tuple[str, str]] = [
        ("xlakern", __version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("jax / jaxlib", f"{jax.__version__} / {jaxlib.__version__}"),
        ("numpy", numpy.__version__),
        ("XLA FFI API (runtime built with)", ".".join(map(str, _runtime.FFI_API_VERSION))),
        ("XLA FFI headers", _try(lambda: str(_toolchain.ffi_include_dir()))),
        ("xlakern headers", _try(lambda: str(_toolchain.include_dir()))),
        ("host compiler", _try(lambda: (lambda t: f"{t.path}: {_first_line(t.version)}")(_toolchain.host_compiler()))),
        ("nvcc", _try(lambda: (lambda t: f"{t.path}: {t.version.splitlines()[-1]}")(_toolchain.nvcc()))),
        ("JAX devices", _try(lambda: ", ".join(str(d) for d in jax.devices()))),
        ("GPU arch", _try(lambda: (lambda cc: f"sm_{cc}" if cc else "no GPU visible to JAX")(
            _toolchain.gpu_compute_capability()))),
    ]
    root = _cache.cache_root()
    count, size = _cache.cache_size(root)
    rows.append(("cache dir", f"{root} ({count} builds, {size / 1e6:.1f} MB)"))
    targets = _bridge.registered_targets()  # what list_registered_targets() says
    rows.append(("registered targets", ", ".join(targets) if targets else "none"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}", file=out)
