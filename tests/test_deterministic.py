"""xlakern.config.set_deterministic: the GPU stored-layout, indexed and JITC scatters sum in fixed point (the same
bits on every run), the switch reaches jitted code, and products it does not cover warn under it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import OPS, random_fcn
from test_event_transforms import HAVE_NVCC
from conftest import gpu_available


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


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not installed (the CUDA kernels are compiled to lower for CUDA)")
def test_switch_reaches_every_cuda_scatter_after_a_first_trace(rng, monkeypatch):
    """Each covered CUDA scatter (and the fused LIF network with weights per synapse), lowered for CUDA (built
    for sm_90 where JAX sees no GPU): the same jitted function lowered before and after switching on asks its
    kernel for fixed-point sums the second time (XLACustomKernel caches kernel generators across the switch,
    so the setting must be read at lowering)."""
    from xlakern.event import LIFParams, LIFState, run_lif_network
    if not gpu_available():
        monkeypatch.setenv("XLAKERN_CUDA_ARCH", "90")
    rows, cols, k = 60, 50, 4
    dense, w, idx = random_fcn(rng, rows, cols, k)
    w32, idx32 = jnp.asarray(w, jnp.float32), jnp.asarray(idx, jnp.int32)
    ptr = jnp.arange(0, rows * k + 1, k, dtype=jnp.int32)
    s = jnp.asarray(rng.random(rows) < 0.3)
    S = jnp.asarray(rng.random((rows, 3)) < 0.3)
    products = {
        "csr": lambda: xlakern.binary_csrmv(w32.reshape(-1), idx32.reshape(-1), ptr, s, shape=(rows, cols),
                                            transpose=True),
        "fcn mm": lambda: xlakern.binary_fcnmm(w32, idx32, S, shape=(rows, cols), transpose=True),
        "indexed": lambda: xlakern.binary_csrmv_indexed(w32.reshape(-1), idx32.reshape(-1), ptr,
                                                        jnp.arange(rows * k, dtype=jnp.int32), s, shape=(rows, cols),
                                                        transpose=True),
        "dense": lambda: xlakern.binary_densemv(jnp.asarray(dense, jnp.float32), s, transpose=True),
        "jitc mv": lambda: xlakern.binary_jitumv(-1.0, 1.0, 0.1, s, 7, shape=(rows, cols), transpose=True),
        "jitc mm": lambda: xlakern.jitnmm(0.0, 1.0, 0.1, S.astype(jnp.float32), 7, shape=(rows, cols),
                                          transpose=True),
        "lif network": lambda: run_lif_network(LIFState.initial(jnp.full((rows,), -55.0)),
                                               xlakern.FixedNumPerPre((w32[:40], idx32[:40] % rows), shape=(40, rows)),
                                               xlakern.FixedNumPerPre((w32[40:], idx32[40:] % rows), shape=(20, rows)),
                                               LIFParams(), 3),
    }
    try:
        for name, product in products.items():
            f = jax.jit(lambda: product())
            seen = []
            for on in (False, True):
                xlakern.config.set_deterministic(on)
                text = f.trace().lower(lowering_platforms=("cuda",)).as_text()
                seen.append(sorted(set(re.findall(r"deterministic = (true|false)", text))))
            assert seen == [["false"], ["true"]], (name, seen)
    finally:
        xlakern.config.set_deterministic(None)


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not installed (the CUDA kernels are compiled to lower for CUDA)")
def test_uncovered_products_warn_after_a_first_trace(rng, monkeypatch):
    """A GPU product the switch does not cover warns when lowered for CUDA under it, also when its jitted
    function was first lowered with the switch off (the warning is given at lowering, not when XLACustomKernel
    makes the kernel generator it then keeps)."""
    from xlakern.event import _kernels

    if not gpu_available():
        monkeypatch.setenv("XLAKERN_CUDA_ARCH", "90")
    rows, cols, k = 60, 50, 4
    _, w, idx = random_fcn(rng, rows, cols, k)
    w32, idx32 = jnp.asarray(w.reshape(-1), jnp.float32), jnp.asarray(idx.reshape(-1), jnp.int32)
    ptr = jnp.arange(0, rows * k + 1, k, dtype=jnp.int32)
    s = jnp.asarray(rng.random(rows) < 0.3)
    delays = jnp.asarray(rng.integers(1, 4, rows * k), jnp.int32)
    products = {
        "csr_delay_deliver": lambda: xlakern.csr_delay_deliver(jnp.zeros((5, cols), jnp.float32), s, w32, idx32, ptr,
                                                               delays, 0, shape=(rows, cols)),
        "csr_slice_rows": lambda: xlakern.csr_slice_rows(w32, idx32, ptr, jnp.arange(3), shape=(rows, cols)),
    }
    _kernels._warned_atomic_sums.clear()
    try:
        for name, product in products.items():
            f = jax.jit(lambda: product())
            xlakern.config.set_deterministic(False)
            with warnings.catch_warnings():
                warnings.simplefilter("error", xlakern.NotReproducibleWarning)
                f.trace().lower(lowering_platforms=("cuda",))
            xlakern.config.set_deterministic(True)
            with pytest.warns(xlakern.NotReproducibleWarning, match=name):
                f.trace().lower(lowering_platforms=("cuda",))
    finally:
        xlakern.config.set_deterministic(None)
        _kernels._warned_atomic_sums.clear()


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
    covered scatters (stored, indexed and JITC) and the gathers do not."""
    from xlakern.event import _kernels

    _kernels._warned_atomic_sums.clear()
    rows, cols, k = 300, 200, 8
    s = jnp.asarray(rng.random(rows) < 0.3)
    dense, w, idx = random_fcn(rng, rows, cols, k)
    ptr = np.arange(0, rows * k + 1, k)
    delays = rng.integers(1, 5, rows * k).astype(np.int32)

    def deliver(slots):
        return xlakern.csr_delay_deliver(jnp.zeros((slots, cols), jnp.float32), s, jnp.asarray(w.reshape(-1)),
                                         jnp.asarray(idx.reshape(-1), jnp.int32), jnp.asarray(ptr, jnp.int32),
                                         jnp.asarray(delays), 0, shape=(rows, cols))

    with pytest.warns(xlakern.NotReproducibleWarning, match="csr_delay_deliver"):
        deliver(5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        deliver(6)  # traced again: no second warning
        xlakern.binary_jitsmv(0.5, 0.1, s, 7, shape=(rows, cols), transpose=True)  # covered
        xlakern.binary_jitsmv(0.5, 0.1, jnp.asarray(rng.random(cols) < 0.3), 7, shape=(rows, cols))  # a gather
        xlakern.binary_fcnmv(jnp.asarray(w, jnp.float32), jnp.asarray(idx, jnp.int32), s, shape=(rows, cols),
                             transpose=True)  # covered
        xlakern.binary_csrmv_indexed(jnp.asarray(w.reshape(-1), jnp.float32), jnp.asarray(idx.reshape(-1), jnp.int32),
                                     jnp.asarray(ptr, jnp.int32), jnp.arange(rows * k, dtype=jnp.int32)[::-1], s,
                                     shape=(rows, cols), transpose=True)  # covered
    assert not [x for x in seen if issubclass(x.category, xlakern.NotReproducibleWarning)]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("wdtype", [np.float32, np.float64])
def test_gpu_indexed_scatter_gives_the_same_bits_every_run(rng, deterministic, batch, wdtype):
    """binary_csrmv/mm_indexed (slot p weighs data[perm[p]]) in its scatter orientation: 3,000 rows of 50
    synapses into 40 columns, five runs give the same bits, within the fixed-point bound of float64 NumPy."""
    rows, cols, k = 3000, 40, 50
    with jax.enable_x64(wdtype == np.float64):
        w, idx, ptr = _contended(rng, rows, cols, k, wdtype)
        perm = rng.permutation(rows * k)
        data = np.empty(rows * k, wdtype)
        data[perm] = w.reshape(-1)  # so that data[perm[p]] is slot p's weight
        shape = (rows,) if batch is None else (rows, batch)
        s = rng.random(shape) < 0.5
        fn = xlakern.binary_csrmv_indexed if batch is None else xlakern.binary_csrmm_indexed
        run = jax.jit(lambda s: fn(jnp.asarray(data), jnp.asarray(idx.reshape(-1), jnp.int32), jnp.asarray(ptr, jnp.int32),
                                   jnp.asarray(perm, jnp.int32), s, shape=(rows, cols), transpose=True))
        outs = [np.asarray(run(jnp.asarray(s))) for _ in range(5)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    eps = 2.0 ** -53 if wdtype == np.float64 else 2.0 ** -24
    want, bound = _sums_and_bound(w, idx, s, cols, eps)
    assert np.abs(want).max() > 0 and outs[0].shape == want.shape
    err = np.abs(outs[0].astype(np.float64) - want)
    assert np.all(err <= bound), float(np.max(err / bound))


# JITC laws with both signs of weight (so float sums depend on their order), and the scalar one
_JITC_PARAMS = {"s": (0.37,), "u": (-1.0, 1.0), "n": (0.1, 1.0)}


def _jitc(letter, binary, mm, params, prob, v, seed, shape, **kw):
    name = ("binary_" if binary else "") + "jit" + letter + ("mm" if mm else "mv")
    return getattr(xlakern, name)(*params, prob, v, seed, shape=shape, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("x64", [False, True])
def test_gpu_jitc_scatter_gives_the_same_bits_every_run(rng, deterministic, letter, binary, batch, x64):
    """The JITC scatter (generated rows 4,000, reaching 40 columns at prob 0.5, half the spikes active: ~40k adds
    into 40 outputs a column of spikes), in both of its forms (M.T @ v with rows generated, M @ v with columns
    generated): five runs of the jitted product give the same bits, within the fixed-point bound of the
    float64 product with the materialised matrix."""
    gen_rows, gen_cols, prob = 4000, 40, 0.5
    dtype = np.float64 if x64 else np.float32
    with jax.enable_x64(x64):
        params = tuple(jnp.asarray(p, dtype) for p in _JITC_PARAMS[letter])
        size = (gen_rows,) if batch is None else (gen_rows, batch)
        on = rng.random(size) < 0.5
        v = on if binary else np.where(on, rng.uniform(0.5, 2, size) * rng.choice([-1, 1], size), 0).astype(dtype)
        for corder, transpose, shape in ((True, True, (gen_rows, gen_cols)), (False, False, (gen_cols, gen_rows))):
            seed = int(rng.integers(0, 2 ** 31))
            run = jax.jit(lambda v: _jitc(letter, binary, batch is not None, params, prob, v, seed, shape,
                                          corder=corder, transpose=transpose))
            outs = [np.asarray(run(jnp.asarray(v))) for _ in range(5)]
            m = np.asarray(getattr(xlakern, "jit" + letter)(*params, prob, seed, shape=shape, corder=corder))
            assert m.dtype == dtype and outs[0].dtype == dtype
            for o in outs[1:]:
                np.testing.assert_array_equal(o, outs[0])
            g = (m.T if transpose else m).astype(np.float64)  # (outputs, generated rows)
            f = ((v != 0) if binary else v).astype(np.float64)
            want = g @ f
            mag, cnt = np.abs(g) @ np.abs(f), (g != 0).astype(np.float64) @ (f != 0)
            # the addends' and the output's roundings, and each addend's fixed-point rounding: 2^-61 of the
            # generated rows times the bound on |addend| (the law's largest |weight| < 8 max|w| here)
            eps = 2.0 ** -53 if x64 else 2.0 ** -24
            bound = 2 * eps * (mag + np.abs(want)) + cnt * gen_rows * 8 * np.abs(g).max() * np.abs(f).max() * 2.0 ** -61
            assert np.abs(want).max() > 0 and outs[0].shape == want.shape
            err = np.abs(outs[0].astype(np.float64) - want)
            assert np.all(err <= bound), float(np.max(err / bound))


@pytest.mark.gpu
def test_gpu_jitc_scatter_infinities_nans_and_edges(rng, deterministic):
    """JITC scatter under the switch: infinite and NaN spikes give what float sums give (an output that meets
    +inf only is inf, both infinities or a NaN give NaN); no active spike gives zeros; zero generated rows
    give zeros; and the gradient of a JITC gather (which runs through the scatter) repeats bit for bit."""
    gen_rows, gen_cols, prob = 300, 50, 0.2
    params = (jnp.float32(-1.0), jnp.float32(1.0))
    seed = int(rng.integers(0, 2 ** 31))
    m = np.asarray(xlakern.jitu(*params, prob, seed, shape=(gen_rows, gen_cols))).astype(np.float64)
    v = rng.uniform(-2, 2, gen_rows).astype(np.float32)
    v[[3, 7, 11]] = [np.inf, -np.inf, np.nan]
    out = np.asarray(xlakern.jitumv(*params, prob, jnp.asarray(v), seed, shape=(gen_rows, gen_cols), transpose=True))
    with np.errstate(invalid="ignore"):
        want = np.where(m != 0, m * v[:, None].astype(np.float64), 0).sum(axis=0)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out) & (out > 0), np.isinf(want) & (want > 0))
    assert np.isinf(want).any() and np.isnan(want).any() and np.isfinite(want).any()
    ok = np.isfinite(want)
    mag = np.abs(m).T @ np.abs(np.where(np.isfinite(v), v, 0))
    np.testing.assert_array_less(np.abs(out[ok] - want[ok]), 4 * 2.0 ** -24 * mag[ok] + 1e-30)
    zero = np.asarray(xlakern.binary_jitumv(*params, prob, jnp.zeros(gen_rows, bool), seed, shape=(gen_rows, gen_cols),
                                            transpose=True))
    assert zero.shape == (gen_cols,) and not zero.any()
    empty = np.asarray(xlakern.jitumv(*params, prob, jnp.zeros((0,), jnp.float32), seed, shape=(0, gen_cols),
                                      transpose=True))
    assert empty.shape == (gen_cols,) and not empty.any()
    c = rng.standard_normal(gen_rows).astype(np.float32)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(jnp.asarray(c) * xlakern.jitumv(*params, prob, x, seed,
                                                                             shape=(gen_rows, gen_cols)))))
    x = jnp.asarray(rng.standard_normal(gen_cols), jnp.float32)
    gs = [np.asarray(grad(x)) for _ in range(4)]
    for y in gs[1:]:
        np.testing.assert_array_equal(y, gs[0])
    np.testing.assert_allclose(gs[0], m.T @ c.astype(np.float64), rtol=1e-5, atol=1e-5)


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


# ----------------------------------------------------------------------------- the fused LIF network

def _lif_network(rng, n, n_exc, *, exc_shared: bool, special: bool = False):
    """test_lif_network's random network with weights per synapse (the excitatory ones shared when
    exc_shared), some weights non-finite when special."""
    from test_lif_network import random_network

    conn_e, conn_i, s = random_network(rng, n, n_exc, 80, 60, hetero=True)
    if exc_shared:
        conn_e = (conn_e[0], np.array([0.6], np.float32))
    if special:  # rows that spike now, so their infinities and NaNs arrive this step
        rows_e = np.nonzero(s["spk"][:n_exc])[0]
        w_e = conn_e[1].copy()
        w_e[rows_e[0], :3] = [np.inf, np.inf, np.nan]
        w_e[rows_e[1], :2] = [-np.inf, np.inf]
        conn_e = (conn_e[0], w_e)
    return conn_e, conn_i, s


def _run_lif(conn_e, conn_i, s, p, steps, mode):
    from xlakern.event import run_lif_network
    from test_lif_network import _conns

    with jax.default_device(jax.devices("gpu")[0]):
        ce, ci = _conns(conn_e, conn_i, s["v"].shape[0])
        out, count = run_lif_network({k: jnp.asarray(x) for k, x in s.items()}, ce, ci, p, steps, backend="cuda",
                                     gpu_mode=mode)
    return {k: np.asarray(x) for k, x in out.items()}, np.asarray(count)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["block", "grid", "stream"])
@pytest.mark.parametrize("variant", ["coba_euler", "cuba_exp"])
@pytest.mark.parametrize("exc_shared", [False, True], ids=["per-synapse", "exc-shared"])
def test_gpu_lif_network_gives_the_same_bits_every_run(rng, deterministic, mode, variant, exc_shared):
    """Weights per synapse sum in fixed point: three runs of 300 steps give the same bits (state and spike
    counts), one call of 300 steps equals 300 calls of one step exactly, and a first step matches the
    float64 model (each neuron's input rounded once)."""
    from test_lif_network import VARIANTS, assert_step_matches, numpy_step

    p = VARIANTS[variant]
    conn_e, conn_i, s = _lif_network(rng, 3001, 2400, exc_shared=exc_shared)
    out, count = _run_lif(conn_e, conn_i, s, p, 1, mode)
    expect, v_new = numpy_step(p, conn_e, conn_i, s)
    assert_step_matches(p, out, count, expect, v_new)
    runs = [_run_lif(conn_e, conn_i, s, p, 300, mode) for _ in range(3)]
    assert runs[0][1].sum() > 300  # the network is active
    for state, c in runs[1:]:
        np.testing.assert_array_equal(c, runs[0][1])
        for key in state:
            np.testing.assert_array_equal(state[key], runs[0][0][key])
    stepped, total = s, np.zeros(3001, np.int64)
    for _ in range(300):
        stepped, c = _run_lif(conn_e, conn_i, stepped, p, 1, mode)
        total += c
    np.testing.assert_array_equal(total, runs[0][1])
    for key in stepped:
        np.testing.assert_array_equal(stepped[key], runs[0][0][key])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["block", "grid", "stream"])
def test_gpu_lif_network_infinities_and_nans_as_float_sums_give(rng, deterministic, mode):
    """Non-finite weights go to a float side sum: +inf, NaN, and +inf with -inf arrive as the float64 model
    gives them (inf, NaN, NaN); the finite inputs keep their fixed-point sums."""
    from test_lif_network import VARIANTS, numpy_step

    p = VARIANTS["coba_euler"]
    conn_e, conn_i, s = _lif_network(rng, 3001, 2400, exc_shared=False, special=True)
    out, _ = _run_lif(conn_e, conn_i, s, p, 1, mode)
    expect, _ = numpy_step(p, conn_e, conn_i, s)
    assert np.isinf(expect["ge"]).any() and np.isnan(expect["ge"]).any()
    for key in ("ge", "gi"):
        np.testing.assert_allclose(out[key], expect[key], rtol=2e-6, atol=2e-5)  # NaN where NaN, inf where inf
