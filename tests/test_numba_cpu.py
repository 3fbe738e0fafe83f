"""xlakern.numba_kernel: @numba.njit kernels called from JAX on the CPU through XLA's FFI.

Covers BrainEvent's Numba CPU tutorial (sections 3-6 and the CSR kernel of section 8) run
through ``numba_kernel`` directly, plus errors, concurrency, caching, memory, vmap, aliasing
and dtypes.  Every input is fresh random data checked against numpy.
"""

from __future__ import annotations

import gc
import math
import os
import resource
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numba
import numpy as np
import pytest

import xlakern
from conftest import x64

SDS = jax.ShapeDtypeStruct
pytestmark = pytest.mark.usefixtures("on_cpu")


def _j(a):
    """A JAX array on the (CPU) default device, dtype kept."""
    return jnp.asarray(a)


def _cfuncs() -> int:
    info = xlakern.numba_kernel_cache_info()
    assert isinstance(info, dict) and "cfuncs" in info, info
    return int(info["cfuncs"])


# ---------------------------------------------------------------------------------------------
# The tutorial's kernels (section 3, 5, 6, 8), as written there.
# ---------------------------------------------------------------------------------------------

@numba.njit
def add_kernel(x, y, out):
    """out[i] = x[i] + y[i]"""
    for i in range(out.size):
        out[i] = x[i] + y[i]


@numba.njit
def relu_kernel(x, out):
    """out[i] = max(x[i], 0.0)"""
    for i in range(out.size):
        v = x[i]
        out[i] = v if v > 0.0 else 0.0


@numba.njit
def matvec_kernel(A, x, out):
    """Dense matrix-vector product: out = A @ x"""
    rows, cols = A.shape
    for i in range(rows):
        total = A.dtype.type(0)
        for j in range(cols):
            total += A[i, j] * x[j]
        out[i] = total


@numba.njit
def sum_kernel(x, out):
    """out[0] = sum(x)."""
    total = x.dtype.type(0)
    for i in range(x.size):
        total += x[i]
    out[0] = total


@numba.njit
def max_kernel(x, out):
    """out[0] = max(x)."""
    m = x[0]
    for i in range(1, x.size):
        if x[i] > m:
            m = x[i]
    out[0] = m


@numba.njit
def running_stats_kernel(x, mean_out, std_out):
    """Compute mean and std in a single pass."""
    n = x.size
    s = x.dtype.type(0)
    for i in range(n):
        s += x[i]
    mean = s / n
    var = x.dtype.type(0)
    for i in range(n):
        d = x[i] - mean
        var += d * d
    mean_out[0] = mean
    std_out[0] = (var / n) ** 0.5


@numba.njit(parallel=True)
def parallel_add_kernel(x, y, out):
    """Parallel element-wise add using prange."""
    for i in numba.prange(out.size):
        out[i] = x[i] + y[i]


@numba.njit(parallel=True)
def parallel_matvec_kernel(A, x, out):
    """Parallel matrix-vector product: each row computed by a separate thread."""
    rows, cols = A.shape
    for i in numba.prange(rows):
        total = A.dtype.type(0)
        for j in range(cols):
            total += A[i, j] * x[j]
        out[i] = total


# The tutorial has `import math` inside this kernel; Numba 0.68 rejects an import statement in
# nopython mode (UnsupportedBytecodeError: IMPORT_NAME), so `math` is the module-level import.
@numba.njit(parallel=True)
def parallel_exp_decay_kernel(trace, spikes, tau_inv, out):
    """out[i] = trace[i] * exp(-tau_inv) + spikes[i]  (STDP trace)"""
    decay = math.exp(-tau_inv[0])
    for i in numba.prange(out.size):
        out[i] = trace[i] * decay + spikes[i]


@numba.njit(parallel=True)
def lif_dynamics_kernel(V, I_ext, tau_inv, V_th, V_rest, dt, V_out, spikes):
    """One Euler step of leaky integrate-and-fire dynamics, then threshold and reset."""
    th = V_th[0]
    vr = V_rest[0]
    ti = tau_inv[0]
    step = dt[0]
    for i in numba.prange(V.size):
        v_new = V[i] + step * (-(V[i] - vr) * ti + I_ext[i])
        if v_new >= th:
            spikes[i] = 1
            V_out[i] = vr
        else:
            spikes[i] = 0
            V_out[i] = v_new


@numba.njit(parallel=True)
def csr_matvec_numba(data, indices, indptr, x, out):
    """Sparse matrix-vector product (CSR format), parallel over rows."""
    n_rows = indptr.size - 1
    for i in numba.prange(n_rows):
        total = out.dtype.type(0)
        for k in range(indptr[i], indptr[i + 1]):
            total += data[k] * x[indices[k]]
        out[i] = total


# ---------------------------------------------------------------------------------------------
# Helper kernels for dtypes, ranks, errors, aliasing.
# ---------------------------------------------------------------------------------------------

@numba.njit
def copy_and_widen(x, same, wide):
    """same = x (same dtype, bit exact); wide = float64(x) (proves the dtype was read right)."""
    for i in range(x.size):
        same[i] = x[i]
        wide[i] = x[i]


@numba.njit
def copy_kernel(x, out):
    for i in range(x.size):
        out[i] = x[i]


@numba.njit
def double_0d(x, out):
    out[()] = x[()] * 2


@numba.njit
def double_nd(x, out):
    for idx in np.ndindex(x.shape):
        out[idx] = x[idx] * 2


@numba.njit
def raise_on_negative(x, out):
    for i in range(x.size):
        if x[i] < 0:
            raise ValueError("negative input found")
        out[i] = x[i] * 2


@numba.njit(boundscheck=True)
def out_of_bounds_read(x, out):
    for i in range(out.size + 1):  # reads and writes one element past the end
        out[i] = x[i]


@numba.njit
def add_one(x, out):
    for i in range(out.size):
        out[i] = x[i] + 1


@numba.njit
def bump_first(x, out):
    """Writes only out[0]; with out aliased to x the rest of out is x."""
    out[0] = x[0] + 1


# =============================================================================================
# Section 3/4: element-wise, dense matvec, reductions, multiple outputs, jit.
# =============================================================================================

@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_add_kernel_eager_and_jit(rng, dtype):
    with x64():
        n = 512
        if dtype == "int32":
            x = rng.integers(-(2**20), 2**20, n, dtype=np.int32)
            y = rng.integers(-(2**20), 2**20, n, dtype=np.int32)
        else:
            x = rng.standard_normal(n).astype(dtype)
            y = rng.standard_normal(n).astype(dtype)
        fn = xlakern.numba_kernel(add_kernel, outs=SDS((n,), dtype))
        r = fn(_j(x), _j(y))
        assert isinstance(r, jax.Array), "one ShapeDtypeStruct -> one array (not a tuple)"
        assert r.shape == (n,) and r.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.asarray(r), x + y)
        rj = jax.jit(fn)(_j(x), _j(y))
        np.testing.assert_array_equal(np.asarray(rj), x + y)


def test_relu_kernel(rng):
    n = 1000
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    fn = xlakern.numba_kernel(relu_kernel, outs=SDS((n,), jnp.float32))
    np.testing.assert_array_equal(np.asarray(fn(_j(x))), np.maximum(x, 0))
    lin = np.linspace(-3.0, 3.0, n, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(_j(lin))), np.maximum(lin, 0))


@pytest.mark.parametrize("kernel", [matvec_kernel, parallel_matvec_kernel], ids=["serial", "prange"])
def test_dense_matvec(rng, kernel):
    m, k = 123, 77
    A = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    fn = xlakern.numba_kernel(kernel, outs=SDS((m,), jnp.float32))
    want = A.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(np.asarray(fn(_j(A), _j(x))), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(_j(A), _j(x))), want, rtol=1e-4, atol=1e-4)


def test_dense_matvec_float64(rng):
    with x64():
        A = rng.standard_normal((40, 31))
        x = rng.standard_normal(31)
        fn = xlakern.numba_kernel(matvec_kernel, outs=SDS((40,), jnp.float64))
        np.testing.assert_allclose(np.asarray(fn(_j(A), _j(x))), A @ x, rtol=1e-12, atol=1e-12)


def test_sum_kernel_float32_and_int32(rng):
    n = 10_000
    x = rng.uniform(0, 1, n).astype(np.float32)
    fn = xlakern.numba_kernel(sum_kernel, outs=SDS((1,), jnp.float32))
    s = fn(_j(x))
    assert s.shape == (1,)
    np.testing.assert_allclose(float(s[0]), x.astype(np.float64).sum(), rtol=1e-4)
    xi = rng.integers(-1000, 1000, n, dtype=np.int32)
    fi = xlakern.numba_kernel(sum_kernel, outs=SDS((1,), jnp.int32))
    assert int(jax.jit(fi)(_j(xi))[0]) == int(xi.sum())


def test_max_kernel(rng):
    x = rng.standard_normal(4097).astype(np.float32)
    fn = xlakern.numba_kernel(max_kernel, outs=SDS((1,), jnp.float32))
    assert float(fn(_j(x))[0]) == float(x.max())
    xi = rng.integers(-(2**31), 2**31 - 1, 300, dtype=np.int32)
    fi = xlakern.numba_kernel(max_kernel, outs=SDS((1,), jnp.int32))
    assert int(jax.jit(fi)(_j(xi))[0]) == int(xi.max())


def test_running_stats_two_outputs(rng):
    n = 5000
    x = (rng.standard_normal(n) * 2 + 3).astype(np.float32)
    fn = xlakern.numba_kernel(running_stats_kernel, outs=[SDS((1,), jnp.float32), SDS((1,), jnp.float32)])
    res = fn(_j(x))
    assert isinstance(res, list) and len(res) == 2, "a list of structs -> a list of arrays"
    mean, std = res
    x64_ = x.astype(np.float64)
    np.testing.assert_allclose(float(mean[0]), x64_.mean(), rtol=1e-4)
    np.testing.assert_allclose(float(std[0]), x64_.std(), rtol=1e-3)
    mean_j, std_j = jax.jit(fn)(_j(x))
    np.testing.assert_allclose(float(mean_j[0]), x64_.mean(), rtol=1e-4)
    np.testing.assert_allclose(float(std_j[0]), x64_.std(), rtol=1e-3)


def test_outs_structure_is_kept(rng):
    x = rng.standard_normal(64).astype(np.float32)
    pair = (SDS((1,), jnp.float32), SDS((1,), jnp.float32))
    res = xlakern.numba_kernel(running_stats_kernel, outs=pair)(_j(x))
    assert isinstance(res, tuple) and len(res) == 2, "tuple outs -> tuple of arrays"
    nested = (SDS((1,), jnp.float32), [SDS((1,), jnp.float32)])
    mean, (std,) = xlakern.numba_kernel(running_stats_kernel, outs=nested)(_j(x))
    np.testing.assert_allclose(float(mean[0]), x.astype(np.float64).mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(std[0]), x.astype(np.float64).std(), rtol=1e-3)
    one = xlakern.numba_kernel(relu_kernel, outs=[SDS((64,), jnp.float32)])(_j(x))
    assert isinstance(one, list) and len(one) == 1, "a list of one struct -> a list of one array"
    np.testing.assert_array_equal(np.asarray(one[0]), np.maximum(x, 0))


def test_jitted_pipeline_mixing_numba_and_jax(rng):
    n = 128
    fn = xlakern.numba_kernel(add_kernel, outs=SDS((n,), jnp.float32))

    @jax.jit
    def pipeline(a, b):
        t = fn(a, b)
        return jnp.sin(t) * jnp.sqrt(jnp.abs(t) + 1.0)

    for _ in range(3):  # later calls reuse the compiled executable with new data
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        t = (a + b).astype(np.float64)
        np.testing.assert_allclose(np.asarray(pipeline(_j(a), _j(b))), np.sin(t) * np.sqrt(np.abs(t) + 1),
                                   rtol=1e-5, atol=1e-6)


def test_kernel_in_fori_loop(rng):
    n = 256
    x0 = rng.standard_normal(n).astype(np.float32)
    fn = xlakern.numba_kernel(relu_kernel, outs=SDS((n,), jnp.float32))
    step = xlakern.numba_kernel(add_kernel, outs=SDS((n,), jnp.float32))
    d = rng.standard_normal(n).astype(np.float32)

    @jax.jit
    def run(x, d):
        return jax.lax.fori_loop(0, 10, lambda i, x: fn(step(x, d)), x)

    want = x0
    for _ in range(10):
        want = np.maximum(want + d, 0)
    np.testing.assert_allclose(np.asarray(run(_j(x0), _j(d))), want, rtol=1e-5, atol=1e-5)


# =============================================================================================
# Section 5/6/8: parallel kernels (prange): add, exp decay, LIF, CSR.
# =============================================================================================

def test_parallel_add_matches_serial_add(rng):
    n = 200_003
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = SDS((n,), jnp.float32)
    par = np.asarray(xlakern.numba_kernel(parallel_add_kernel, outs=out)(_j(a), _j(b)))
    ser = np.asarray(xlakern.numba_kernel(add_kernel, outs=out)(_j(a), _j(b)))
    np.testing.assert_array_equal(par, a + b)
    np.testing.assert_array_equal(ser, a + b)
    parj = np.asarray(jax.jit(xlakern.numba_kernel(parallel_add_kernel, outs=out))(_j(a), _j(b)))
    np.testing.assert_array_equal(parj, a + b)


def test_parallel_exp_decay_trace(rng):
    n = 10_000
    trace = rng.uniform(0, 3, n).astype(np.float32)
    spikes = (rng.random(n) < 0.1).astype(np.float32)
    tau_inv = np.array([1.0 / rng.uniform(5, 50)], np.float32)
    fn = xlakern.numba_kernel(parallel_exp_decay_kernel, outs=SDS((n,), jnp.float32))
    want = trace.astype(np.float64) * np.exp(-np.float64(tau_inv[0])) + spikes
    np.testing.assert_allclose(np.asarray(fn(_j(trace), _j(spikes), _j(tau_inv))), want, rtol=1e-5, atol=1e-6)

    # 30 steps under jit, feeding the trace back (new spikes each step).
    step = jax.jit(fn)
    tr, ref = _j(trace), trace.astype(np.float64)
    for _ in range(30):
        s = (rng.random(n) < 0.05).astype(np.float32)
        tr = step(tr, _j(s), _j(tau_inv))
        ref = ref * np.exp(-np.float64(tau_inv[0])) + s
    np.testing.assert_allclose(np.asarray(tr), ref, rtol=1e-4, atol=1e-5)


def test_lif_dynamics_v_and_int32_spikes(rng):
    n = 5000
    V = rng.uniform(-75.0, -50.0, n).astype(np.float32)
    I_ext = rng.uniform(0.0, 5.0, n).astype(np.float32)
    tau_inv = np.array([1.0 / rng.uniform(10, 30)], np.float32)
    V_th = np.array([-55.0], np.float32)
    V_rest = np.array([-70.0], np.float32)
    dt = np.array([rng.uniform(0.05, 0.5)], np.float32)
    fn = xlakern.numba_kernel(lif_dynamics_kernel, outs=[SDS((n,), jnp.float32), SDS((n,), jnp.int32)])
    args = [_j(a) for a in (V, I_ext, tau_inv, V_th, V_rest, dt)]

    # Reference in float64; elements within 1e-3 mV of the threshold may go either way.
    v64 = V.astype(np.float64)
    v_new = v64 + np.float64(dt[0]) * (-(v64 - np.float64(V_rest[0])) * np.float64(tau_inv[0]) + I_ext)
    spk_ref = (v_new >= V_th[0]).astype(np.int32)
    v_ref = np.where(spk_ref == 1, np.float64(V_rest[0]), v_new)
    clear = np.abs(v_new - np.float64(V_th[0])) > 1e-3
    assert 0 < spk_ref.sum() < n, "the random inputs should make some, not all, neurons spike"

    for V_out, spikes in (fn(*args), jax.jit(fn)(*args)):
        assert V_out.dtype == jnp.float32 and spikes.dtype == jnp.int32
        V_out, spikes = np.asarray(V_out), np.asarray(spikes)
        assert set(np.unique(spikes)) <= {0, 1}
        np.testing.assert_array_equal(spikes[clear], spk_ref[clear])
        np.testing.assert_allclose(V_out[clear], v_ref[clear], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("n_post,n_pre,density", [(1000, 2000, 0.05), (300, 40, 0.01)])
def test_csr_matvec_float32_against_scipy_and_dense(rng, n_post, n_pre, density):
    import scipy.sparse as sp

    csr = sp.random(n_post, n_pre, density=density, format="csr", dtype=np.float32, random_state=rng)
    csr.data[:] = rng.uniform(0.01, 0.5, csr.nnz).astype(np.float32)
    x = rng.random(n_pre).astype(np.float32)
    fn = xlakern.numba_kernel(csr_matvec_numba, outs=SDS((n_post,), jnp.float32))
    args = (_j(csr.data.astype(np.float32)), _j(csr.indices.astype(np.int32)),
            _j(csr.indptr.astype(np.int32)), _j(x))
    dense = csr.toarray().astype(np.float64)
    want = dense @ x.astype(np.float64)
    for got in (fn(*args), jax.jit(fn)(*args)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(got), csr @ x, rtol=1e-4, atol=1e-5)


def test_csr_matvec_float64_int64_indices(rng):
    import scipy.sparse as sp

    with x64():
        csr = sp.random(500, 700, density=0.03, format="csr", dtype=np.float64, random_state=rng)
        x = rng.standard_normal(700)
        fn = xlakern.numba_kernel(csr_matvec_numba, outs=SDS((500,), jnp.float64))
        got = fn(_j(csr.data), _j(csr.indices.astype(np.int64)), _j(csr.indptr.astype(np.int64)), _j(x))
        np.testing.assert_allclose(np.asarray(got), csr.toarray() @ x, rtol=1e-10, atol=1e-12)


def test_two_independent_parallel_kernels_in_one_jit(rng):
    n, m, k = 50_000, 256, 128
    add = xlakern.numba_kernel(parallel_add_kernel, outs=SDS((n,), jnp.float32))
    mv = xlakern.numba_kernel(parallel_matvec_kernel, outs=SDS((m,), jnp.float32))
    decay = xlakern.numba_kernel(parallel_exp_decay_kernel, outs=SDS((n,), jnp.float32))

    @jax.jit
    def both(a, b, A, v, tau):
        return add(a, b), mv(A, v), decay(a, b, tau)  # independent: XLA may run them concurrently

    for _ in range(20):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        A = rng.standard_normal((m, k)).astype(np.float32)
        v = rng.standard_normal(k).astype(np.float32)
        tau = np.array([rng.uniform(0.01, 1)], np.float32)
        s, p, d = both(_j(a), _j(b), _j(A), _j(v), _j(tau))
        np.testing.assert_array_equal(np.asarray(s), a + b)
        np.testing.assert_allclose(np.asarray(p), A.astype(np.float64) @ v, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(d), a.astype(np.float64) * np.exp(-np.float64(tau[0])) + b,
                                   rtol=1e-5, atol=1e-5)


# A kernel built inside a generator that closes over a value (the pattern of tutorial section 7):
# textually identical kernels with different closure values are different kernels.
def _make_scaler(k):
    @numba.njit
    def scale(x, out):
        for i in range(out.size):
            out[i] = x[i] * k

    return scale


def _make_trace_kernel(n):
    @numba.njit(parallel=True)
    def trace_kern(trace, spikes, tau_inv, out):
        decay = math.exp(-tau_inv[0])
        for i in numba.prange(n):
            out[i] = trace[i] * decay + spikes[i]

    return trace_kern


def test_closure_kernels_with_different_constants_are_not_confused(rng):
    x = rng.standard_normal(100).astype(np.float32)
    out = SDS((100,), jnp.float32)
    f2 = xlakern.numba_kernel(_make_scaler(2.0), outs=out)
    f5 = xlakern.numba_kernel(_make_scaler(5.0), outs=out)
    np.testing.assert_array_equal(np.asarray(f2(_j(x))), x * np.float32(2.0))
    np.testing.assert_array_equal(np.asarray(f5(_j(x))), x * np.float32(5.0))
    np.testing.assert_array_equal(np.asarray(jax.jit(f2)(_j(x))), x * np.float32(2.0))
    np.testing.assert_array_equal(np.asarray(jax.jit(f5)(_j(x))), x * np.float32(5.0))

    # The section-7 generator: the prange bound n is a closure constant.
    n = 1000
    fn = xlakern.numba_kernel(_make_trace_kernel(n), outs=SDS((n,), jnp.float32))
    tau = np.array([1.0 / 20.0], np.float32)
    step = jax.jit(fn)
    tr, ref = jnp.zeros(n, jnp.float32), np.zeros(n)
    for _ in range(20):
        s = (rng.random(n) < 0.05).astype(np.float32)
        tr = step(tr, _j(s), _j(tau))
        ref = ref * np.exp(-np.float64(tau[0])) + s
    np.testing.assert_allclose(np.asarray(tr), ref, rtol=1e-4, atol=1e-5)


# =============================================================================================
# Dtypes and ranks.
# =============================================================================================

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]


def _random_of(rng, dtype, n):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        x[:2] = [info.min, info.max]
        return x
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(dt)
    f = np.finfo(dt)
    x[:6] = [f.max, -f.max, f.tiny, -0.0, np.inf, np.nan]
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips(rng, dtype):
    n = 97
    with x64():
        x = _random_of(rng, dtype, n)
        fn = xlakern.numba_kernel(copy_and_widen, outs=(SDS((n,), dtype), SDS((n,), jnp.float64)))
        for same, wide in (fn(_j(x)), jax.jit(fn)(_j(x))):
            assert same.dtype == np.dtype(dtype) and wide.dtype == np.float64
            np.testing.assert_array_equal(np.asarray(same), x)  # bit-exact copy in and out
            np.testing.assert_array_equal(np.asarray(wide), x.astype(np.float64))  # read as `dtype`


def _numba_supports_float16() -> bool:
    try:
        a = np.ones(3, np.float16)
        numba.njit(copy_kernel.py_func)(a, np.empty_like(a))
        return True
    except Exception:
        return False


def test_float16_round_trips_or_is_a_clear_error(rng):
    x = rng.standard_normal(16).astype(np.float16)
    fn = xlakern.numba_kernel(copy_kernel, outs=SDS((16,), jnp.float16))
    if _numba_supports_float16():
        np.testing.assert_array_equal(np.asarray(fn(_j(x))), x)
    else:
        with pytest.raises(xlakern.CallError, match="float16"):
            fn(_j(x))
        with pytest.raises(xlakern.CallError, match="float16"):
            jax.jit(fn)(_j(x))


@numba.njit
def complex_rotate(z, out):
    for i in range(out.size):
        out[i] = z[i] * 1j + z[i].conjugate()


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_dtypes_work(on_cpu, rng, dtype):
    # Numba handles complex numbers on the CPU, so xlakern passes them through.
    n = 33
    with x64():
        z = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
        fn = xlakern.numba_kernel(complex_rotate, outs=SDS((n,), dtype))
        out = np.asarray(jax.jit(fn)(_j(z)))
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, z * 1j + np.conj(z), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_unsupported_input_dtype_is_a_call_error(rng, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = rng.standard_normal(8).astype(dt)
    fn = xlakern.numba_kernel(copy_kernel, outs=SDS((8,), jnp.float32))
    with pytest.raises(xlakern.CallError, match=dtype) as err:
        fn(_j(x))
    assert isinstance(err.value, xlakern.XlakernError)
    with pytest.raises(xlakern.CallError, match=dtype):
        jax.jit(fn)(_j(x))  # raised while tracing
    ok = rng.standard_normal(8).astype(np.float32)  # the wrapper still works afterwards
    np.testing.assert_array_equal(np.asarray(fn(_j(ok))), ok)


def test_unsupported_output_dtype_is_a_call_error(rng):
    x = rng.standard_normal(8).astype(np.float32)
    fn = xlakern.numba_kernel(copy_kernel, outs=SDS((8,), jnp.bfloat16))
    with pytest.raises(xlakern.CallError, match="bfloat16"):
        fn(_j(x))


def test_zero_dim_arrays(rng):
    x = np.float32(rng.standard_normal())
    fn = xlakern.numba_kernel(double_0d, outs=SDS((), jnp.float32))
    for y in (fn(_j(x)), jax.jit(fn)(_j(x))):
        assert y.shape == () and float(y) == float(x) * 2
    with x64():
        xi = np.int64(rng.integers(-(2**40), 2**40))
        fi = xlakern.numba_kernel(double_0d, outs=SDS((), jnp.int64))
        assert int(fi(_j(xi))) == int(xi) * 2


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2)])
def test_empty_arrays(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    kern = copy_kernel if len(shape) == 1 else double_nd
    fn = xlakern.numba_kernel(kern, outs=SDS(shape, jnp.float32))
    for y in (fn(_j(x)), jax.jit(fn)(_j(x))):
        assert y.shape == shape and y.dtype == jnp.float32


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 3, 1, 5)], ids=["1d", "2d", "3d", "4d"])
def test_ranks_one_to_four(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    fn = xlakern.numba_kernel(double_nd, outs=SDS(shape, jnp.float32))
    for y in (fn(_j(x)), jax.jit(fn)(_j(x))):
        assert y.shape == shape
        np.testing.assert_array_equal(np.asarray(y), x * 2)  # row-major layout, nothing transposed
    xi = rng.integers(-1000, 1000, shape, dtype=np.int16)
    fi = xlakern.numba_kernel(double_nd, outs=SDS(shape, jnp.int16))
    np.testing.assert_array_equal(np.asarray(fi(_j(xi))), xi * 2)


# =============================================================================================
# Errors.
# =============================================================================================

def _plain_python(x, out):
    out[0] = x[0]


def test_non_numba_kernels_are_rejected_when_wrapping():
    out = SDS((4,), jnp.float32)
    cands = {"plain python": _plain_python, "lambda": lambda x, out: None,
             "cfunc": numba.cfunc("void(float64)")(lambda a: None)}
    try:
        from numba import cuda

        cands["cuda.jit"] = cuda.jit(_plain_python)
    except Exception:  # no CUDA support in this numba build: covered by the others
        pass
    for what, k in cands.items():
        with pytest.raises(xlakern.CallError) as err:
            xlakern.numba_kernel(k, outs=out)
        assert isinstance(err.value, TypeError), what
        assert isinstance(err.value, xlakern.XlakernError), what


def test_wrong_number_of_inputs_is_a_call_error(rng):
    n = 8
    x = _j(rng.standard_normal(n).astype(np.float32))
    fn = xlakern.numba_kernel(add_kernel, outs=SDS((n,), jnp.float32))
    with pytest.raises(xlakern.CallError, match="add_kernel"):
        fn(x)
    with pytest.raises(xlakern.CallError, match="add_kernel"):
        fn(x, x, x)
    with pytest.raises(xlakern.CallError, match="add_kernel"):
        jax.jit(fn)(x)  # at trace time
    # Too many outputs for the kernel's parameters reads as a wrong count too.
    two_outs = xlakern.numba_kernel(add_kernel, outs=[SDS((n,), jnp.float32), SDS((n,), jnp.float32)])
    with pytest.raises(xlakern.CallError):
        two_outs(x, x)
    np.testing.assert_array_equal(np.asarray(fn(x, x)), np.asarray(x) * 2)


def test_kernel_raising_value_error_eager(rng):
    n = 64
    fn = xlakern.numba_kernel(raise_on_negative, outs=SDS((n,), jnp.float32))
    bad = rng.uniform(0, 1, n).astype(np.float32)
    bad[rng.integers(n)] = -1.0
    with pytest.raises(xlakern.KernelError) as err:
        jax.block_until_ready(fn(_j(bad)))
    msg = str(err.value)
    assert "raise_on_negative" in msg and "ValueError" in msg and "negative input found" in msg, msg
    good = rng.uniform(0, 1, n).astype(np.float32)  # the process and the wrapper go on
    np.testing.assert_array_equal(np.asarray(fn(_j(good))), good * 2)


def test_kernel_raising_under_jit(rng):
    n = 64
    f = jax.jit(xlakern.numba_kernel(raise_on_negative, outs=SDS((n,), jnp.float32)))
    bad = -rng.uniform(0.1, 1, n).astype(np.float32)
    with pytest.raises(Exception, match="raise_on_negative"):
        np.asarray(jax.block_until_ready(f(_j(bad))))
    good = rng.uniform(0, 1, n).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(f(_j(good))), good * 2)
    # Errors repeat and never turn into silently wrong outputs.
    for _ in range(3):
        with pytest.raises(Exception, match="raise_on_negative"):
            np.asarray(jax.block_until_ready(f(_j(bad))))


def test_out_of_bounds_with_boundscheck(rng):
    n = 32
    x = rng.standard_normal(n).astype(np.float32)
    fn = xlakern.numba_kernel(out_of_bounds_read, outs=SDS((n,), jnp.float32))
    with pytest.raises(xlakern.KernelError) as err:
        jax.block_until_ready(fn(_j(x)))
    msg = str(err.value)
    assert "out_of_bounds_read" in msg and "IndexError" in msg, msg
    with pytest.raises(Exception, match="out_of_bounds_read"):
        np.asarray(jax.block_until_ready(jax.jit(fn)(_j(x))))
    ok = xlakern.numba_kernel(copy_kernel, outs=SDS((n,), jnp.float32))
    np.testing.assert_array_equal(np.asarray(ok(_j(x))), x)


def test_error_in_one_of_several_kernels_under_jit(rng):
    n = 128
    good = xlakern.numba_kernel(parallel_add_kernel, outs=SDS((n,), jnp.float32))
    bad = xlakern.numba_kernel(raise_on_negative, outs=SDS((n,), jnp.float32))
    f = jax.jit(lambda a, b: (good(a, b), bad(a)))
    a = -rng.uniform(0.1, 1, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    with pytest.raises(Exception, match="raise_on_negative"):
        jax.block_until_ready(f(_j(a), _j(b)))
    s, d = f(_j(-a), _j(b))
    np.testing.assert_array_equal(np.asarray(s), -a + b)
    np.testing.assert_array_equal(np.asarray(d), -a * 2)


# =============================================================================================
# vmap_method and input_output_aliases.
# =============================================================================================

@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_vmap_elementwise(rng, method):
    B, n = 5, 33
    x = rng.standard_normal((B, n)).astype(np.float32)
    y = rng.standard_normal((B, n)).astype(np.float32)
    fn = xlakern.numba_kernel(add_kernel, outs=SDS((n,), jnp.float32), vmap_method=method)
    np.testing.assert_array_equal(np.asarray(jax.vmap(fn)(_j(x), _j(y))), x + y)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(fn))(_j(x), _j(y))), x + y)
    # One unbatched argument.
    y1 = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.vmap(fn, in_axes=(0, None))(_j(x), _j(y1))), x + y1)


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_vmap_calls_kernel_per_batch_element(rng, method):
    # A reduction writes only out[0]; if the kernel saw the whole batch, rows 1.. would be wrong.
    B, n = 6, 50
    x = rng.standard_normal((B, n)).astype(np.float32)
    fn = xlakern.numba_kernel(sum_kernel, outs=SDS((1,), jnp.float32), vmap_method=method)
    got = np.asarray(jax.jit(jax.vmap(fn))(_j(x)))
    assert got.shape == (B, 1)
    np.testing.assert_allclose(got[:, 0], x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)

    # Matvec with the matrix unbatched: the kernel unpacks `rows, cols = A.shape`.
    m, k = 9, 13
    A = rng.standard_normal((m, k)).astype(np.float32)
    v = rng.standard_normal((B, k)).astype(np.float32)
    mv = xlakern.numba_kernel(matvec_kernel, outs=SDS((m,), jnp.float32), vmap_method=method)
    got = np.asarray(jax.vmap(mv, in_axes=(None, 0))(_j(A), _j(v)))
    assert got.shape == (B, m)
    np.testing.assert_allclose(got, v.astype(np.float64) @ A.T.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_nested_vmap(rng, method):
    B1, B2, n = 3, 4, 21
    x = rng.standard_normal((B1, B2, n)).astype(np.float32)
    fn = xlakern.numba_kernel(sum_kernel, outs=SDS((1,), jnp.float32), vmap_method=method)
    got = np.asarray(jax.jit(jax.vmap(jax.vmap(fn)))(_j(x)))
    assert got.shape == (B1, B2, 1)
    np.testing.assert_allclose(got[..., 0], x.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-4)
    # Batched along different axes for the two arguments.
    y = rng.standard_normal((B2, B1, n)).astype(np.float32)
    add = xlakern.numba_kernel(add_kernel, outs=SDS((n,), jnp.float32), vmap_method=method)
    got = np.asarray(jax.vmap(jax.vmap(add, in_axes=(0, 0)), in_axes=(0, 1))(_j(x), _j(y)))
    np.testing.assert_array_equal(got, x + y.transpose(1, 0, 2))


def test_vmap_without_vmap_method_raises(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    fn = xlakern.numba_kernel(relu_kernel, outs=SDS((8,), jnp.float32))
    with pytest.raises(Exception):
        jax.block_until_ready(jax.vmap(fn)(_j(x)))


def test_input_output_aliases_in_place_update(rng):
    n = 257
    x = rng.standard_normal(n).astype(np.float32)
    fn = xlakern.numba_kernel(add_one, outs=SDS((n,), jnp.float32), input_output_aliases={0: 0})
    xj = _j(x)
    np.testing.assert_array_equal(np.asarray(fn(xj)), x + 1)
    np.testing.assert_array_equal(np.asarray(xj), x)  # without donation JAX keeps the input intact

    step = jax.jit(fn, donate_argnums=0)
    s = _j(x)
    for _ in range(5):
        s = step(s)
    np.testing.assert_allclose(np.asarray(s), x + 5, rtol=1e-6, atol=1e-5)


def test_input_output_aliases_share_the_buffer(rng):
    # The kernel writes only out[0]; the rest of the output is the aliased input's contents.
    n = 100
    x = rng.standard_normal(n).astype(np.float32)
    want = x.copy()
    want[0] += 1
    fn = xlakern.numba_kernel(bump_first, outs=SDS((n,), jnp.float32), input_output_aliases={0: 0})
    np.testing.assert_array_equal(np.asarray(fn(_j(x))), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(_j(x))), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn, donate_argnums=0)(_j(x))), want)
    # Aliasing the second input of a two-input kernel.
    y = rng.standard_normal(n).astype(np.float32)
    f2 = xlakern.numba_kernel(add_kernel, outs=SDS((n,), jnp.float32), input_output_aliases={1: 0})
    np.testing.assert_array_equal(np.asarray(jax.jit(f2, donate_argnums=1)(_j(x), _j(y))), x + y)


# =============================================================================================
# Caching: one handler target, one cfunc per (kernel, options, dtypes, ranks).
# =============================================================================================

def _cache_probe(x, out):  # wrapped by numba.njit with different options below
    for i in numba.prange(out.size):
        out[i] = x[i] * 3 + 1


def _twin_factory_one():
    @numba.njit
    def twin(x, out):
        for i in range(out.size):
            out[i] = x[i] - 7

    return twin


def _twin_factory_two():
    @numba.njit
    def twin(x, out):
        for i in range(out.size):
            out[i] = x[i] - 7

    return twin


@numba.njit
def rank_probe(x, out):
    for idx in np.ndindex(x.shape):
        out[idx] = x[idx] + 5


def test_identical_kernels_share_a_cfunc_options_do_not(rng):
    n = 40
    x = rng.standard_normal(n).astype(np.float32)
    out = SDS((n,), jnp.float32)

    def run(kernel):
        y = np.asarray(xlakern.numba_kernel(kernel, outs=out)(_j(x)))
        np.testing.assert_allclose(y, x * np.float32(3) + np.float32(1), rtol=1e-6, atol=1e-6)

    c0 = _cfuncs()
    run(numba.njit(_cache_probe))
    assert _cfuncs() == c0 + 1
    run(numba.njit(_cache_probe))  # a second dispatcher of the same source
    assert _cfuncs() == c0 + 1, "two identical kernels must share one cfunc"
    run(numba.njit(parallel=True)(_cache_probe))
    assert _cfuncs() == c0 + 2, "parallel=True must compile its own cfunc"
    run(numba.njit(fastmath=True)(_cache_probe))
    assert _cfuncs() == c0 + 3, "fastmath=True must compile its own cfunc"
    run(numba.njit(boundscheck=True)(_cache_probe))
    assert _cfuncs() == c0 + 4, "boundscheck=True must compile its own cfunc"
    run(numba.njit(parallel=True)(_cache_probe))
    assert _cfuncs() == c0 + 4


def test_textually_identical_kernels_defined_separately_share_a_cfunc(rng):
    n = 24
    x = rng.standard_normal(n).astype(np.float32)
    out = SDS((n,), jnp.float32)
    c0 = _cfuncs()
    for kern in (_twin_factory_one(), _twin_factory_two(), _twin_factory_one()):
        np.testing.assert_array_equal(np.asarray(xlakern.numba_kernel(kern, outs=out)(_j(x))), x - np.float32(7))
    assert _cfuncs() == c0 + 1


def test_new_cfunc_per_dtype_and_rank_not_per_shape(rng):
    fn = lambda x: xlakern.numba_kernel(rank_probe, outs=SDS(x.shape, x.dtype))(_j(x))  # noqa: E731
    c0 = _cfuncs()
    a8 = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(fn(a8)), a8 + 5)
    assert _cfuncs() == c0 + 1
    a16 = rng.standard_normal(16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(fn(a16)), a16 + 5)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(a16)), a16 + 5)
    assert _cfuncs() == c0 + 1, "same dtype and rank, other shape: no new cfunc"
    m = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(fn(m)), m + 5)
    assert _cfuncs() == c0 + 2, "another rank: a new cfunc"
    i = rng.integers(-100, 100, 8, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(fn(i)), i + 5)
    assert _cfuncs() == c0 + 3, "another dtype: a new cfunc"
    i30 = rng.integers(-100, 100, 30, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(fn(i30)), i30 + 5)
    assert _cfuncs() == c0 + 3


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: peak RSS is an upper bound on growth too
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def test_rewrapping_and_many_eager_calls_do_not_grow(rng):
    n = 16
    x = _j(rng.standard_normal(n).astype(np.float32))
    y = _j(rng.standard_normal(n).astype(np.float32))
    want = np.asarray(x) + np.asarray(y)
    out = SDS((n,), jnp.float32)
    fn = xlakern.numba_kernel(add_kernel, outs=out)
    np.testing.assert_array_equal(np.asarray(fn(x, y)), want)
    targets = list(xlakern.list_registered_targets())
    assert all(isinstance(t, str) for t in targets)
    c0 = _cfuncs()

    # Wrapping the same kernel again (and other kernels) adds no FFI target and no cfunc.
    for _ in range(50):
        np.testing.assert_array_equal(np.asarray(xlakern.numba_kernel(add_kernel, outs=out)(x, y)), want)
    assert len(xlakern.list_registered_targets()) == len(targets)
    assert _cfuncs() == c0
    xlakern.numba_kernel(relu_kernel, outs=out)(x)
    xlakern.numba_kernel(sum_kernel, outs=SDS((1,), jnp.float32))(x)
    xlakern.numba_kernel(_make_scaler(rng.uniform()), outs=out)(x)
    assert len(xlakern.list_registered_targets()) == len(targets), "one shared handler target for all kernels"
    c1 = _cfuncs()

    for _ in range(1000):  # warm-up
        r = fn(x, y)
    jax.block_until_ready(r)
    gc.collect()
    before = _rss_bytes()
    for _ in range(10_000):
        r = fn(x, y)
    jax.block_until_ready(r)
    gc.collect()
    grown = _rss_bytes() - before
    np.testing.assert_array_equal(np.asarray(r), want)
    assert grown < 20 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 10,000 eager calls"
    assert len(xlakern.list_registered_targets()) == len(targets)
    assert _cfuncs() == c1, "no cfunc from the 10,000 calls"


# =============================================================================================
# Concurrency and persisted compilation caches (separate processes: a crash fails one test).
# =============================================================================================

def _run_script(tmp_path, name, source, *args, timeout=420):
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, (f"{name} {args} exited with {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}")
    return proc.stdout


THREADS_SCRIPT = r"""
import sys, threading, traceback
import numpy as np, jax, jax.numpy as jnp, numba
import xlakern

SDS = jax.ShapeDtypeStruct

@numba.njit(parallel=True)
def padd(x, y, out):
    for i in numba.prange(out.size):
        out[i] = x[i] + y[i]

@numba.njit(parallel=True)
def pmatvec(A, x, out):
    rows, cols = A.shape
    for i in numba.prange(rows):
        total = A.dtype.type(0)
        for j in range(cols):
            total += A[i, j] * x[j]
        out[i] = total

@numba.njit(parallel=True)
def pdecay(trace, spikes, tau_inv, out):
    a = tau_inv[0]
    for i in numba.prange(out.size):
        out[i] = trace[i] * (1.0 - a) + spikes[i]

N, M, K, THREADS, ITERS = 20_000, 96, 64, 8, 12
seed = int(sys.argv[1])
add = xlakern.numba_kernel(padd, outs=SDS((N,), jnp.float32))
mv = xlakern.numba_kernel(pmatvec, outs=SDS((M,), jnp.float32))
dec = xlakern.numba_kernel(pdecay, outs=SDS((N,), jnp.float32))
jadd, jmv = jax.jit(add), jax.jit(mv)
both = jax.jit(lambda x, y, A, v, t: (add(x, y), mv(A, v), dec(x, y, t)))

errors = []
barrier = threading.Barrier(THREADS)

def worker(tid):
    rng = np.random.default_rng(seed + tid)
    try:
        barrier.wait()  # cold start: every thread races to the first compile and call
        for it in range(ITERS):
            x = rng.standard_normal(N).astype(np.float32)
            y = rng.standard_normal(N).astype(np.float32)
            A = rng.standard_normal((M, K)).astype(np.float32)
            v = rng.standard_normal(K).astype(np.float32)
            t = np.array([rng.uniform(0, 0.5)], np.float32)
            xj, yj, Aj, vj, tj = map(jnp.asarray, (x, y, A, v, t))
            mv_ref = A.astype(np.float64) @ v
            np.testing.assert_array_equal(np.asarray(add(xj, yj)), x + y)
            np.testing.assert_array_equal(np.asarray(jadd(xj, yj)), x + y)
            np.testing.assert_allclose(np.asarray(mv(Aj, vj)), mv_ref, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(jmv(Aj, vj)), mv_ref, rtol=1e-4, atol=1e-4)
            s, p, d = both(xj, yj, Aj, vj, tj)
            np.testing.assert_array_equal(np.asarray(s), x + y)
            np.testing.assert_allclose(np.asarray(p), mv_ref, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(d), x * (1.0 - np.float64(t[0])) + y, rtol=1e-5, atol=1e-5)
    except BaseException:
        errors.append(f"thread {tid}:\n{traceback.format_exc()}")

threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
for th in threads:
    th.start()
for th in threads:
    th.join()
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("threads ok")
"""


def test_eight_python_threads_running_parallel_kernels(tmp_path, rng):
    out = _run_script(tmp_path, "threads.py", THREADS_SCRIPT, int(rng.integers(2**31)))
    assert "threads ok" in out


PERSISTENT_CACHE_SCRIPT = r"""
import sys
import numpy as np, jax, jax.numpy as jnp, numba
import xlakern

cache_dir, order, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
jax.config.update("jax_compilation_cache_dir", cache_dir)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
hits = []
jax.monitoring.register_event_listener(lambda ev, **kw: hits.append(ev) if ev.endswith("cache_hits") else None)

@numba.njit
def affine_a(x, out):
    for i in range(out.size):
        out[i] = x[i] * 2 + 1

@numba.njit(parallel=True)
def affine_b(x, out):
    for i in numba.prange(out.size):
        out[i] = x[i] * -3 + 7

kernels = {"a": affine_a, "b": affine_b}
refs = {"a": lambda x: x * 2 + 1, "b": lambda x: x * -3 + 7}
rng = np.random.default_rng(seed)
for name in order:
    fn = xlakern.numba_kernel(kernels[name], outs=jax.ShapeDtypeStruct((64,), jnp.float32))
    def run(x):  # one name for both kernels: the HLO differs only in what the custom call names
        return fn(x) * 1.0
    for _ in range(2):
        x = rng.standard_normal(64).astype(np.float32)
        y = np.asarray(jax.jit(run)(jnp.asarray(x)))
        np.testing.assert_allclose(y, refs[name](x.astype(np.float64)), rtol=1e-6, atol=1e-5,
                                   err_msg=f"kernel {name} in order {order}")
print("persistent cache ok, hits:", len(hits))
"""


def test_persisted_compilation_cache_in_new_processes(tmp_path, rng):
    cache = tmp_path / "jax-cache"
    cache.mkdir()
    outs = []
    # Later processes load executables compiled by earlier ones, with the kernels compiled in another
    # order (other addresses, other registration order): they must still call the right, live code.
    for order in ("ab", "ba", "ab", "b"):
        outs.append(_run_script(tmp_path, "pcache.py", PERSISTENT_CACHE_SCRIPT, cache, order,
                                int(rng.integers(2**31))))
    assert all("persistent cache ok" in o for o in outs), outs
    assert any(p.is_file() for p in cache.rglob("*")), "the first process should have written the cache"
