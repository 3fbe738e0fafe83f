"""xlakern.config.set_deterministic: the GPU stored-layout scatters sum in fixed point (the same bits on
every run), the switch reaches jitted code, and products it does not cover warn under it."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import OPS, random_fcn


@pytest.fixture
def deterministic():
    xlakern.config.set_deterministic(True)
    yield
    xlakern.config.set_deterministic(None)


# ----------------------------------------------------------------------------- the switch (any platform)

def test_switch_reads_back_and_resets():
    default = xlakern.config._xla_flags_ask_determinism()  # False unless the run's XLA_FLAGS ask for it
    xlakern.config.set_deterministic(True)
    try:
        assert xlakern.config.get_deterministic() is True
        xlakern.config.set_deterministic(False)
        assert xlakern.config.get_deterministic() is False
    finally:
        xlakern.config.set_deterministic(None)
    assert xlakern.config.get_deterministic() is default
    with pytest.raises(xlakern.ConfigError, match="True, False or None"):
        xlakern.config.set_deterministic("yes")


@pytest.mark.parametrize("flags,want", [("--xla_gpu_deterministic_ops=true", True),
                                        ("--xla_gpu_exclude_nondeterministic_ops", True),
                                        ("--xla_gpu_deterministic_ops=false", False),
                                        ("--xla_gpu_autotune_level=0", False)])
def test_default_follows_xla_flags(flags, want):
    code = ("import xlakern; assert xlakern.config.get_deterministic() is " + str(want) +
            "; xlakern.config.set_deterministic(not " + str(want) + "); assert xlakern.config.get_deterministic() "
            "is not " + str(want))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env={**os.environ, "XLA_FLAGS": flags})


def test_switch_retraces_jitted_code(rng):
    """The setting is part of jit's cache key: a jitted product is traced again after a switch (and the
    earlier compilation is found again after switching back)."""
    traces = []
    dense, w, idx = random_fcn(rng, 40, 30, 5)

    @jax.jit
    def f(s):
        traces.append(1)
        return xlakern.binary_fcnmv(jnp.asarray(w, jnp.float32), jnp.asarray(idx, jnp.int32), s, shape=(40, 30),
                                    transpose=True)

    s = jnp.asarray(rng.random(40) < 0.5)
    want = (np.asarray(s) != 0).astype(np.float64) @ dense
    np.testing.assert_allclose(np.asarray(f(s)), want, rtol=1e-5, atol=1e-5)
    xlakern.config.set_deterministic(True)
    try:
        np.testing.assert_allclose(np.asarray(f(s)), want, rtol=1e-5, atol=1e-5)
        assert len(traces) == 2
    finally:
        xlakern.config.set_deterministic(None)
    f(s)
    assert len(traces) == 2


def test_exact_scratch_size():
    from xlakern.event._kernels import exact_scratch

    assert exact_scratch(jax.ShapeDtypeStruct((7, 3), jnp.float32)).shape == (4 + 3 * 21,)
    assert exact_scratch(jax.ShapeDtypeStruct((5,), jnp.float64)).dtype == jnp.uint32


# ----------------------------------------------------------------------------- GPU

def _contended(rng, rows, cols, k, dtype, decades=6):
    """Rows of k synapses into few columns (many adds an output, so the atomic order shows), weights over
    `decades` decades of magnitude and both signs (so float sums depend on their order)."""
    idx = rng.integers(0, cols, size=(rows, k))
    w = (rng.standard_normal((rows, k)) * 10.0 ** rng.uniform(-decades / 2, decades / 2, (rows, k))).astype(dtype)
    return w, idx, np.arange(0, rows * k + 1, k)


def _sums_and_bound(w, idx, f, cols, eps):
    """float64 sums of every addend w[r] f[r] into its column (slots outside [0, cols) dropped), and a bound on
    a reproducible scatter's error: the addends' own rounding in the accumulation type and the output's
    (eps each, relative to the magnitudes), plus each addend's fixed-point rounding (at most 2^-61 of the
    number of addends times the largest one; event_exact_scatter_cuda.cuh)."""
    w = w.astype(np.float64)
    f2 = f.reshape(f.shape[0], -1).astype(np.float64)
    out = np.zeros((cols, f2.shape[1]))
    mag, cnt = np.zeros_like(out), np.zeros_like(out)
    ok = (idx >= 0) & (idx < cols)
    for r in np.nonzero((f2 != 0).any(axis=1))[0]:
        for b in np.nonzero(f2[r])[0]:
            x = w[r][ok[r]] * f2[r, b]
            np.add.at(out[:, b], idx[r][ok[r]], x)
            np.add.at(mag[:, b], idx[r][ok[r]], np.abs(x))
            np.add.at(cnt[:, b], idx[r][ok[r]], 1)
    finite = np.abs(w[np.isfinite(w)])
    largest = (finite.max() if finite.size else 0.0) * np.abs(f2).max()
    bound = 2 * eps * (mag + np.abs(out)) + cnt * cnt.sum() * largest * 2.0 ** -61
    shape = (cols,) if f.ndim == 1 else (cols, f.shape[1])
    return out.reshape(shape), bound.reshape(shape)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["csr", "fcn"])
@pytest.mark.parametrize("wdtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gpu_scatter_gives_the_same_bits_every_run(rng, deterministic, family, wdtype, binary, batch, index_dtype):
    """3,000 rows of 50 synapses into 40 columns, half the spikes active: five runs of the jitted scatter
    give the same bits, within the fixed-point bound of the float64 NumPy sums."""
    rows, cols, k = 3000, 40, 50
    with jax.enable_x64(wdtype == np.float64 or index_dtype == np.int64):  # (int64 indices need x64)
        w, idx, ptr = _contended(rng, rows, cols, k, wdtype, decades=6 if wdtype != np.float16 else 4)
        shape = (rows,) if batch is None else (rows, batch)
        on = rng.random(shape) < 0.5
        s = on if binary else np.where(on, rng.uniform(0.5, 2, shape) * rng.choice([-1, 1], shape), 0).astype(np.float32)
        fn = OPS[(family, binary, batch is not None)]
        args = ((jnp.asarray(w.reshape(-1)), jnp.asarray(idx.reshape(-1), index_dtype), jnp.asarray(ptr, index_dtype))
                if family == "csr" else (jnp.asarray(w), jnp.asarray(idx, index_dtype)))
        run = jax.jit(lambda s: fn(*args, s, shape=(rows, cols), transpose=True))
        outs = [np.asarray(run(jnp.asarray(s))) for _ in range(5)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    # the output's rounding: float16 weights give a float16 product (cast back from float32 sums)
    eps = {np.float64: 2.0 ** -53, np.float32: 2.0 ** -24, np.float16: 2.0 ** -11}[wdtype]
    want, bound = _sums_and_bound(w, idx, (s != 0) if binary else s, cols, eps)
    assert np.abs(want).max() > 0 and outs[0].shape == want.shape
    err = np.abs(outs[0].astype(np.float64) - want)
    assert np.all(err <= bound), float(np.max(err / bound))


@pytest.mark.gpu
def test_gpu_scatter_infinities_and_nans_as_float_sums_give(rng, deterministic):
    """Outputs that meet +inf only, -inf only, both, or a NaN: inf, -inf, NaN and NaN, as float sums give in
    any order; the other outputs keep their fixed-point sums."""
    rows, cols, k = 200, 9, 6
    w, idx, ptr = _contended(rng, rows, cols, k, np.float32)
    idx[:] = rng.integers(4, cols, size=(rows, k))  # columns 0-3 get only the addends planted below
    for (r, c), v in {(0, 0): np.inf, (1, 1): -np.inf, (2, 2): np.inf, (3, 2): -np.inf, (4, 3): np.nan}.items():
        idx[r, 0], w[r, 0] = c, v
    s = np.ones(rows, bool)
    out = np.asarray(xlakern.binary_csrmv(jnp.asarray(w.reshape(-1)), jnp.asarray(idx.reshape(-1), jnp.int32),
                                          jnp.asarray(ptr, jnp.int32), jnp.asarray(s), shape=(rows, cols),
                                          transpose=True))
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2]) and np.isnan(out[3])
    keep = np.where(np.isfinite(w), w, 0)
    want, bound = _sums_and_bound(keep, idx, s, cols, 2.0 ** -24)
    assert np.all(np.abs(out[4:] - want[4:]) <= bound[4:])


@pytest.mark.gpu
def test_gpu_deterministic_edge_cases(rng, deterministic):
    """One shared weight, slots outside the columns (dropped), no active spike (zeros), and a gradient that
    runs through the scatter (the transpose of a gather), repeated bit for bit."""
    rows, cols, k = 500, 30, 20
    w, idx, ptr = _contended(rng, rows, cols, k, np.float32, decades=0)
    bad = rng.random(idx.shape) < 0.1
    idx = np.where(bad, rng.choice([-3, cols, cols + 7], idx.shape), idx)
    s = rng.random(rows) < 0.4
    args = (jnp.asarray(idx.reshape(-1), jnp.int32), jnp.asarray(ptr, jnp.int32))
    out = np.asarray(xlakern.binary_csrmv(jnp.asarray([0.25], jnp.float32), *args, jnp.asarray(s), shape=(rows, cols),
                                          transpose=True))
    want, bound = _sums_and_bound(np.full(idx.shape, 0.25), idx, s, cols, 2.0 ** -24)
    assert np.all(np.abs(out - want) <= bound) and want.max() > 0
    zero = np.asarray(xlakern.binary_csrmv(jnp.asarray(w.reshape(-1)), *args, jnp.zeros(rows, bool),
                                           shape=(rows, cols), transpose=True))
    assert zero.shape == (cols,) and not zero.any()
    # d/dv sum(c * (A v)) = A^T c: the gather's gradient is the scatter
    c = rng.standard_normal(rows).astype(np.float32)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(jnp.asarray(c) * xlakern.csrmv(
        jnp.asarray(w.reshape(-1)), *args, v, shape=(rows, cols), transpose=False))))
    v = jnp.asarray(rng.standard_normal(cols), jnp.float32)
    g = [np.asarray(grad(v)) for _ in range(4)]
    for x in g[1:]:
        np.testing.assert_array_equal(x, g[0])
    want, bound = _sums_and_bound(w, idx, c, cols, 2.0 ** -24)
    assert np.all(np.abs(g[0] - want) <= bound)


@pytest.mark.gpu
def test_gpu_products_it_does_not_cover_warn_once(rng, deterministic):
    """Under the switch, a GPU product that still adds with float atomics warns once, when first traced; the
    covered scatters and the gathers do not."""
    from xlakern.event import _kernels

    _kernels._warned_atomic_sums.clear()
    s = jnp.asarray(rng.random(300) < 0.3)
    with pytest.warns(xlakern.NotReproducibleWarning, match="binary_jitsmv"):
        xlakern.binary_jitsmv(0.5, 0.1, s, 7, shape=(300, 200), transpose=True)
    dense, w, idx = random_fcn(rng, 300, 200, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        xlakern.binary_jitsmv(0.5, 0.1, s, 7, shape=(300, 201), transpose=True)  # traced again: no second warning
        xlakern.binary_jitsmv(0.5, 0.1, jnp.asarray(rng.random(200) < 0.3), 7, shape=(300, 200))  # a gather
        xlakern.binary_fcnmv(jnp.asarray(w, jnp.float32), jnp.asarray(idx, jnp.int32), s, shape=(300, 200),
                             transpose=True)  # covered
    assert not [x for x in seen if issubclass(x.category, xlakern.NotReproducibleWarning)]
    rows, ptr = 300, np.arange(0, 300 * 8 + 1, 8)
    with pytest.warns(xlakern.NotReproducibleWarning, match="binary_csrmv_indexed"):
        xlakern.binary_csrmv_indexed(jnp.asarray(w.reshape(-1), jnp.float32), jnp.asarray(idx.reshape(-1), jnp.int32),
                                     jnp.asarray(ptr, jnp.int32), jnp.arange(rows * 8, dtype=jnp.int32)[::-1], s,
                                     shape=(rows, 200), transpose=True)


@pytest.mark.gpu
@pytest.mark.parametrize("cols,batch", [(8192, None), (8192, 4), (1001, None), (1001, 3), (3, None)])
@pytest.mark.parametrize("binary", [True, False])
def test_gpu_dense_scatter_gives_the_same_bits_every_run(rng, deterministic, cols, batch, binary):
    """`s @ W` on a dense matrix of 20,000 rows (so the scatter would split them into slices that add
    atomically): 8,192 float32 columns take the 16-byte kernel (one slice, or slices in clusters), 1,001 and
    3 the plain one (one slice); five runs give the same bits, within float32 rounding of float64 NumPy."""
    rows = 20000
    w = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    shape = (rows,) if batch is None else (rows, batch)
    on = rng.random(shape) < 0.3
    s = on if binary else np.where(on, rng.uniform(0.5, 2, shape), 0).astype(np.float32)
    fn = xlakern.binary_densemv if batch is None else xlakern.binary_densemm
    run = jax.jit(lambda s: fn(jnp.asarray(w), s, transpose=True, weighted=not binary))
    outs = [np.asarray(run(jnp.asarray(s))) for _ in range(5)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    f = ((s != 0) if binary else s).astype(np.float64)
    want = w.astype(np.float64).T @ f
    mag = np.abs(w.astype(np.float64)).T @ np.abs(f)
    terms = np.count_nonzero(f, axis=0) + 2  # float32 sums of n terms: within (n + 2) 2^-24 of their magnitudes
    assert np.all(np.abs(outs[0] - want) <= 2.0 ** -24 * terms * mag)
