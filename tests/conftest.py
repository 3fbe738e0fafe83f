"""Test-wide setup: a private build cache, the `gpu` marker, small helpers."""

from __future__ import annotations

import contextlib
import os
import tempfile

import pytest

# Every test process (and the subprocesses tests start) builds into a fresh
# cache, so results never depend on what an earlier run left behind.
os.environ.setdefault("XLAKERN_CACHE_DIR", tempfile.mkdtemp(prefix="xlakern-test-cache-"))
os.environ.setdefault("XLAKERN_QUIET", "1")


def gpu_available() -> bool:
    try:
        import jax

        return len(jax.devices("gpu")) > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU visible to JAX")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def x64():
    """64-bit dtypes enabled for the duration of the block."""
    import jax

    with jax.enable_x64(True):
        yield


@contextlib.contextmanager
def x64_everywhere():
    """64-bit dtypes enabled in every thread for the duration of the block. ``x64()`` sets this thread's
    flag only, and a host callback (jax's CPU spsolve) may run on one of XLA's threads, where the flag is
    off: JAX then canonicalises its float64 result to float32 and fails the call (seen once in a full
    sequential run)."""
    import jax

    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


@pytest.fixture
def rng(request):
    import numpy as np

    # Fresh inputs each run; the seed is printed on failure for reproduction.
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def unique_name(prefix: str) -> str:
    """A module name no other test (or earlier run in this process) used."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}"


import itertools  # noqa: E402

_counter = itertools.count()


def included_headers(command: list, src) -> set:
    """Base names of every file ``command -M src`` lists (the preprocessor's Make rule; g++ and nvcc)."""
    import subprocess
    from pathlib import Path

    from xlakern import _build

    out = subprocess.run([*command, "-M", str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {Path(p).name for p in _build.parse_depfile(out.stdout)}


@pytest.fixture
def on_cpu():
    """Run the test with JAX's default device set to the CPU (CPU kernels need CPU arrays)."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        yield
