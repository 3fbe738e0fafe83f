"""The Numba bridges' runtime contract: content keys, hoisted imports, the shared targets."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import xlakern
from xlakern import _bridge

SDS = jax.ShapeDtypeStruct


def _scaler(alpha):
    @numba.njit
    def scale(x, out):
        for i in range(out.size):
            out[i] = x[i] * alpha

    return scale


def test_closure_values_are_part_of_the_kernel_identity(on_cpu, rng):
    # Textually identical kernels that close over different values must not share a build.
    x = rng.standard_normal(16).astype(np.float32)
    a, b = rng.uniform(0.5, 2.0, 2)
    before = xlakern.numba_kernel_cache_info()["cfuncs"]
    ya = xlakern.numba_kernel(_scaler(np.float32(a)), outs=SDS((16,), jnp.float32))(jnp.asarray(x))
    yb = xlakern.numba_kernel(_scaler(np.float32(b)), outs=SDS((16,), jnp.float32))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(ya), x * np.float32(a), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(yb), x * np.float32(b), rtol=1e-6)
    assert xlakern.numba_kernel_cache_info()["cfuncs"] == before + 2
    # The same closure value again shares the first build.
    xlakern.numba_kernel(_scaler(np.float32(a)), outs=SDS((16,), jnp.float32))(jnp.asarray(x))
    assert xlakern.numba_kernel_cache_info()["cfuncs"] == before + 2


@numba.njit(parallel=True)
def _decay_with_import(trace, spikes, tau_inv, out):
    import math  # as the tutorials write it; Numba alone rejects this

    decay = math.exp(-tau_inv[0])
    for i in numba.prange(out.size):
        out[i] = trace[i] * decay + spikes[i]


def test_kernel_importing_inside_its_body_runs(on_cpu, rng):
    n = 257
    trace = rng.uniform(0, 3, n).astype(np.float32)
    spikes = (rng.random(n) < 0.2).astype(np.float32)
    tau_inv = np.array([rng.uniform(0.01, 0.2)], np.float32)
    f = xlakern.numba_kernel(_decay_with_import, outs=SDS((n,), jnp.float32))
    out = jax.jit(f)(jnp.asarray(trace), jnp.asarray(spikes), jnp.asarray(tau_inv))
    expected = trace.astype(np.float64) * np.exp(-np.float64(tau_inv[0])) + spikes
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5)


def test_all_numba_kernels_share_one_ffi_target(on_cpu, rng):
    x = rng.standard_normal(8).astype(np.float32)
    xlakern.numba_kernel(_scaler(np.float32(3.0)), outs=SDS((8,), jnp.float32))(jnp.asarray(x))
    targets = xlakern.list_registered_targets()
    assert "xlakern.numba_cpu" in targets
    for k in range(5):
        xlakern.numba_kernel(_scaler(np.float32(k + 0.5)), outs=SDS((8,), jnp.float32))(jnp.asarray(x))
    assert xlakern.list_registered_targets() == targets


def test_unknown_kernel_key_fails_clearly_instead_of_calling_anything(on_cpu):
    # What a program from another process's compilation cache would carry for a kernel this
    # process never compiled: the runtime must refuse it with a message saying what to do.
    _bridge.ensure_target(_bridge.NUMBA_CPU_TARGET)
    call = jax.ffi.ffi_call(_bridge.NUMBA_CPU_TARGET, SDS((4,), jnp.float32))
    with pytest.raises(Exception, match="has not compiled"):
        jax.block_until_ready(call(jnp.ones(4, jnp.float32), kernel="0" * 64, zero=np.int64(0)))


@pytest.mark.gpu
def test_wrong_platform_array_is_a_call_error():
    f = xlakern.numba_kernel(_scaler(np.float32(2.0)), outs=SDS((4,), jnp.float32))
    with pytest.raises(xlakern.CallError, match="CPU arrays"):
        f(jax.device_put(jnp.ones(4, jnp.float32), jax.devices("gpu")[0]))


def test_threading_layer_is_thread_safe_or_parallel_kernels_serialise(tmp_path):
    # In a fresh process: xlakern chooses the layer before Numba's first parallel launch.
    script = tmp_path / "layer.py"
    script.write_text(textwrap.dedent('''
        import jax, jax.numpy as jnp, numba, numpy as np, xlakern
        from xlakern import _numba_cpu
        @numba.njit(parallel=True)
        def k(x, out):
            for i in numba.prange(out.size):
                out[i] = x[i] + 1
        f = xlakern.numba_kernel(k, outs=jax.ShapeDtypeStruct((64,), jnp.float32))
        np.testing.assert_allclose(np.asarray(f(jnp.zeros(64, jnp.float32) + 2)), 3)
        print(numba.threading_layer(), _numba_cpu._serialize_parallel)
    '''))
    env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k.startswith(("XLAKERN", "HOME", "PYTHON", "LD_"))})
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    layer, serialize = done.stdout.split()[-2:]
    assert (layer in ("tbb", "omp")) or (layer == "workqueue" and serialize == "True"), done.stdout
