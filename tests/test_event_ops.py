"""Event-driven operators against dense float64 products (CPU in CI; the same cases on the GPU)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import OPS, call, make, random_csr_with_dropped_slots, reference, spikes
from conftest import x64

FAMILY_CASES = [(f, b, mm) for (f, b, mm) in OPS]


def _check_family(rng, family, binary, mm, transpose, backend):
    with x64():
        for (rows, cols), density in itertools.product([(37, 23), (5, 64), (1, 1)], [0.0, 0.1, 0.6]):
            dense, arrays = make(rng, family, rows, cols, density)
            n = rows if transpose else cols
            for pattern, batch in itertools.product(["random", "zero", "all"], [1, 37] if mm else [None]):
                s = spikes(rng, n, batch, pattern, bool if binary else np.float64)
                out = call(family, binary, mm, dense, arrays, s, transpose, backend, dtype=jnp.float64)
                assert out.dtype == jnp.float64
                np.testing.assert_allclose(np.asarray(out), reference(dense, s, binary, transpose),
                                           rtol=1e-10, atol=1e-10, err_msg=f"{rows}x{cols} d={density} {pattern}")


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("family,binary,mm", FAMILY_CASES)
@pytest.mark.parametrize("backend", ["cpp", "jnp"])
def test_operator_matches_dense_product(rng, on_cpu, family, binary, mm, transpose, backend):
    _check_family(rng, family, binary, mm, transpose, backend)


@pytest.mark.parametrize("family", ["csr", "fcn"])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("rows,cols", [(3000, 500), (1500, 12000)])
def test_large_scatter_split_over_threads_matches_dense(rng, on_cpu, family, binary, rows, cols):
    """Enough active synapses (16k and more) for the C++ scatter to split rows over threads into private
    buffers and sum them: the result is still the dense product. 3,000 x 500: up to ~240k adds into 500
    values. 1,500 x 12,000: ~36k adds at 30% active into 12,000 values, where the buffers' cap (twice the
    adds) holds the parts under the thread count on hosts of 8 cores and more."""
    with x64():
        dense, arrays = make(rng, family, rows, cols, 80 / cols)  # ~80 synapses a row
        for pattern in ("all", "random"):
            s = spikes(rng, rows, None, pattern, bool if binary else np.float64)
            out = call(family, binary, False, dense, arrays, s, True, "cpp", dtype=jnp.float64)
            np.testing.assert_allclose(np.asarray(out), reference(dense, s, binary, True), rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("binary", [True, False])
def test_dense_mm_scatter_over_column_slices_matches_dense(rng, on_cpu, binary):
    """The C++ dense mm scatter sums each thread's columns as (batch, columns) and writes them out
    transposed: columns wide enough to split over threads (5,000), batches of 1, 16 and 37 whose columns
    have different rates, against the float64 product."""
    rows, cols = 400, 5000
    with x64():
        dense = rng.standard_normal((rows, cols))
        for batch in (1, 16, 37):
            rates = np.array([0.0, 0.02, 0.3, 1.0])[np.arange(batch) % 4]
            on = rng.random((rows, batch)) < rates
            s = on if binary else np.where(on, rng.uniform(0.5, 2.0, on.shape), 0.0)
            out = xlakern.binary_densemm(jnp.asarray(dense), jnp.asarray(s), transpose=True, weighted=not binary)
            assert out.shape == (cols, batch)
            np.testing.assert_allclose(np.asarray(out), dense.T @ s.astype(np.float64), rtol=1e-10, atol=1e-9,
                                       err_msg=f"batch {batch}")


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("family,binary,mm", FAMILY_CASES)
def test_operator_matches_dense_product_gpu(rng, family, binary, mm, transpose):
    _check_family(rng, family, binary, mm, transpose, "cuda")


def _dtype_cases(rng, backend):
    rows, cols = 40, 300
    tol = {jnp.float16: 2e-2, jnp.bfloat16: 5e-2, jnp.float32: 1e-5}
    for family, wdt, idt, sdt, transpose in itertools.product(
            ["csr", "fcn", "dense"], [jnp.float16, jnp.bfloat16, jnp.float32], [np.int32, np.int64],
            [bool, np.int8, np.float32, np.float16], [False, True]):
        if family == "dense" and idt == np.int64:
            continue
        dense, arrays = make(rng, family, rows, cols, 0.2)
        # the weights as the kernel sees them (rounded to wdt) make the reference exact
        dense = np.asarray(jnp.asarray(dense, wdt).astype(jnp.float32), np.float64)
        arrays = tuple(np.asarray(jnp.asarray(a, wdt).astype(jnp.float32)) if i == 0 else a
                       for i, a in enumerate(arrays))
        s = spikes(rng, rows if transpose else cols, None, "random", sdt)
        out = call(family, True, False, dense, arrays, s, transpose, backend, dtype=wdt, index_dtype=idt)
        assert out.dtype == wdt
        ref = reference(dense, s, True, transpose)
        np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), ref, rtol=tol[wdt],
                                   atol=tol[wdt] * np.abs(ref).max(initial=1.0),
                                   err_msg=f"{family} {wdt} {idt} {sdt} transpose={transpose}")


def test_weight_index_and_spike_dtypes(rng, on_cpu):
    """float16/bfloat16/float32 weights (accumulated in float32), int32/int64 indices, bool/int/float spikes."""
    with x64():  # int64 indices exist only with x64
        _dtype_cases(rng, "cpp")


@pytest.mark.gpu
def test_weight_index_and_spike_dtypes_gpu(rng):
    with x64():
        _dtype_cases(rng, "cuda")


def test_signed_zeros_are_silent_and_nans_fire(rng, on_cpu):
    """The C++ scatters find active rows (the dense gather, active columns) a 64-bit word of spikes at a
    time, a batch's rows too: -0.0 stays silent and a NaN fires as a binary spike, at every position of a
    word and in the tail past the last whole word, for every spike width."""
    with x64():
        for family, sdt, transpose in itertools.product(["csr", "fcn", "dense"],
                                                        [np.float64, np.float32, np.float16, np.int8, bool],
                                                        [True, False]):
            if family != "dense" and not transpose:
                continue  # the sparse gathers test each synapse's spike; nothing scans
            rows, cols = (45, 31) if transpose else (31, 45)
            dense, arrays = make(rng, family, rows, cols, 0.3)
            n = rows if transpose else cols
            s = np.zeros(n, sdt)
            on = rng.permutation(n)[:6]
            s[on] = 1
            if np.dtype(sdt).kind == "f":
                s[rng.permutation(n)[:10]] = -0.0  # silent (may overwrite some ones)
                s[on[:2]] = np.nan
            for binary in (True, False) if np.dtype(sdt).kind == "f" and family != "dense" else (True,):
                if not binary and np.isnan(s).any():
                    s = np.where(np.isnan(s), 2.5, s).astype(sdt)
                out = call(family, binary, False, dense, arrays, s, transpose, "cpp", dtype=jnp.float64)
                np.testing.assert_allclose(np.asarray(out), reference(dense, s, binary, transpose), rtol=1e-12,
                                           atol=1e-12, err_msg=f"{family} {np.dtype(sdt)} {transpose} {binary}")
                if family == "dense":
                    continue
                for batch in (3, 9):  # a batched scatter scans each row's spikes by words, with a tail
                    sb = np.zeros((n, batch), sdt)
                    if np.dtype(sdt).kind == "f":
                        sb[rng.random((n, batch)) < 0.3] = -0.0
                    sb[:, batch // 2] = s
                    out = call(family, binary, True, dense, arrays, sb, transpose, "cpp", dtype=jnp.float64)
                    np.testing.assert_allclose(np.asarray(out), reference(dense, sb, binary, transpose), rtol=1e-12,
                                               atol=1e-12, err_msg=f"{family} {np.dtype(sdt)} batch {batch} {binary}")


def test_half_weights_accumulate_in_float32(on_cpu):
    # 4096 contributions of 1.0 are exact in float32 but not in float16 (2048 + 1 rounds to 2048)
    n = 4096
    data, idx, ptr = jnp.ones(n, jnp.float16), jnp.zeros(n, jnp.int32), jnp.array([0, n], jnp.int32)
    out = xlakern.binary_csrmv(data, idx, ptr, jnp.ones(1, bool), shape=(1, 1), transpose=True)
    assert out.dtype == jnp.float16 and float(out[0]) == 4096.0


@pytest.mark.parametrize("backend", ["cpp", "jnp"])
def test_homogeneous_weight(rng, on_cpu, backend):
    with x64():
        dense, data, idx, ptr = _csr(rng, 30, 20, 0.3)
        mask = (dense != 0).astype(np.float64)
        s = rng.random(30) < 0.4
        for w in (jnp.asarray([1.7]), jnp.asarray(1.7)):
            out = xlakern.binary_csrmv(w, idx, ptr, s, shape=(30, 20), transpose=True, backend=backend)
            np.testing.assert_allclose(out, 1.7 * (s @ mask), rtol=1e-12)
        _, w_fcn, idx_fcn = _fcn(rng, 30, 20, 4)
        m = np.zeros((30, 20))
        for r in range(30):
            m[r, idx_fcn[r]] += 1.0
        out = xlakern.binary_fcnmv(jnp.asarray([-0.5]), idx_fcn, s, shape=(30, 20), transpose=True, backend=backend)
        np.testing.assert_allclose(out, -0.5 * (s @ m), rtol=1e-12)


def _csr(rng, r, c, d):
    from _event_cases import random_csr

    return random_csr(rng, r, c, d)


def _fcn(rng, r, c, k):
    from _event_cases import random_fcn

    return random_fcn(rng, r, c, k)


@pytest.mark.parametrize("binary", [True, False])
def test_mm_gather_across_bit_words(rng, on_cpu, binary):
    """The C++ mm gather packs each spike row's active columns into 64-bit words and adds a slot's weight
    at the set bits: batches on both sides of a word (2, 63, 64, 65, 130), columns that are silent, sparse,
    busy or all active, and some slots pointing outside the matrix (dropped), against float64."""
    rows, cols = 30, 40
    with x64():
        kept, data, bad, ptr = random_csr_with_dropped_slots(rng, rows, cols, 0.3, 8, [-1, cols, 10**6])
        dense_fcn, w_fcn, idx_fcn = _fcn(rng, rows, cols, 6)
        for batch in (2, 63, 64, 65, 130):
            rates = np.array([0.0, 0.03, 0.3, 1.0])[rng.permutation(batch) % 4]
            on = rng.random((cols, batch)) < rates
            s = on if binary else np.where(on, rng.uniform(-2.0, 2.0, on.shape), 0.0)
            csr = xlakern.csrmm if not binary else xlakern.binary_csrmm
            fcn = xlakern.fcnmm if not binary else xlakern.binary_fcnmm
            out = csr(data, bad, ptr, jnp.asarray(s), shape=(rows, cols), transpose=False)
            np.testing.assert_allclose(out, reference(kept, s, binary, False), rtol=1e-12, atol=1e-12,
                                       err_msg=f"csr batch {batch}")
            out = fcn(w_fcn, idx_fcn, jnp.asarray(s), shape=(rows, cols), transpose=False)
            np.testing.assert_allclose(out, reference(dense_fcn, s, binary, False), rtol=1e-12, atol=1e-12,
                                       err_msg=f"fcn batch {batch}")


def test_fixed_count_with_zero_targets(on_cpu, rng):
    idx = jnp.zeros((7, 0), jnp.int32)
    for transpose in (False, True):
        s = rng.random(7 if transpose else 5) < 0.5
        out = xlakern.binary_fcnmv(jnp.zeros((7, 0)), idx, s, shape=(7, 5), transpose=transpose)
        assert out.shape == ((5,) if transpose else (7,))
        np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("backend", ["cpp", "jnp"])
def test_gather_without_columns(rng, on_cpu, backend):
    # a structure of shape (rows, 0) whose slots all point outside it (the mv gather reads the spike of
    # column 0 for an out-of-range slot, unless there is none): every slot is dropped, in mv and mm
    idx = rng.integers(-3, 4, size=(6, 3)).astype(np.int32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    for op, s in ((xlakern.binary_fcnmv, np.zeros(0, bool)), (xlakern.binary_fcnmm, np.zeros((0, 3), bool))):
        out = op(w, idx, s, shape=(6, 0), transpose=False, backend=backend)
        assert out.shape == (6,) + s.shape[1:]
        np.testing.assert_array_equal(out, 0)
    # the dense layout's weight gradient where the spikes have no rows
    for transpose, wshape, nout in ((False, (6, 0), 6), (True, (0, 5), 5)):
        wd = jnp.asarray(rng.standard_normal(wshape), jnp.float32)
        ct = jnp.asarray(rng.standard_normal(nout), jnp.float32)
        g = jax.grad(lambda m: jnp.vdot(ct, xlakern.binary_densemv(m, jnp.zeros(0, bool), transpose=transpose,
                                                                    backend=backend)))(wd)
        assert g.shape == wshape


def test_gather_scratch_sizes():
    """The CUDA stored-layout gathers' scratch output (sized in Python, read by the launchers): bits for a
    binary mv, a byte a spike for binary spikes wider than a byte in several columns (the tile gather copies
    them there, and falls back to slower kernels where it is short), one word otherwise."""
    from xlakern.event._kernels import bits_scratch

    def words(shape, dtype, transpose=False, binary=True, spike_bytes=True, ncols=None):
        spk = jax.ShapeDtypeStruct(shape, dtype)
        return bits_scratch(spk, shape[0] if ncols is None else ncols, transpose, binary, spike_bytes).shape[0]

    for shape, dtype in (((1000, 16), jnp.float32), ((37, 9), jnp.float16), ((5, 2), jnp.float64),
                         ((3, 70001), jnp.bfloat16)):
        assert words(shape, dtype) * 4 >= shape[0] * shape[1] > (words(shape, dtype) - 1) * 4, (shape, dtype)
    assert words((1000, 16), jnp.bool_) == 1  # one-byte spikes are read in place
    assert words((1000, 16), jnp.float32, transpose=True) == 1  # scatters read the spikes as they are
    assert words((1000, 16), jnp.float32, binary=False) == 1  # float spikes keep the lane groups
    assert words((1000, 16), jnp.float32, spike_bytes=False) == 1  # JITC gathers take no bytes
    assert words((1000, 1), jnp.float32) == 1  # one column: the mv gather
    n = 3_000_000  # a binary mv: a word per 32 columns and the summary's words
    assert words((n,), jnp.bool_, ncols=n) == (n + 31) // 32 + ((n + 31) // 32 + 31) // 32 * 4


@pytest.mark.parametrize("backend", ["cpp", "jnp"])
def test_out_of_range_indices_are_dropped(rng, on_cpu, backend):
    with x64():
        kept, data, bad, ptr = random_csr_with_dropped_slots(rng, 20, 15, 0.4, 4, [-1, -1000, 15, 10**6])
        for transpose in (False, True):
            s = rng.random(20 if transpose else 15) < 0.5
            out = xlakern.binary_csrmv(data, bad, ptr, s, shape=(20, 15), transpose=transpose, backend=backend)
            np.testing.assert_allclose(out, reference(kept, s, True, transpose), rtol=1e-12, atol=1e-12)
        w_fcn = rng.standard_normal((6, 3))
        idx_fcn = np.array([[0, 99, 2]] * 6)
        s = np.ones(6, bool)
        out = xlakern.binary_fcnmv(w_fcn, idx_fcn, s, shape=(6, 4), transpose=True, backend=backend)
        expect = np.zeros(4)
        expect[0], expect[2] = w_fcn[:, 0].sum(), w_fcn[:, 2].sum()
        # atol too: a sum of six normals can cancel near 0, where float64 rounding exceeds any relative tolerance
        np.testing.assert_allclose(out, expect, rtol=1e-12, atol=1e-12)


def test_malformed_indptr_stays_in_bounds(on_cpu):
    # indptr pointing far outside the index array: clamped, so the kernel reads nothing out of bounds
    data, idx = jnp.ones(4), jnp.array([0, 1, 2, 3], jnp.int32)
    ptr = jnp.array([0, 2, 10**6, -5], jnp.int32)
    out = xlakern.binary_csrmv(data, idx, ptr, jnp.ones(3, bool), shape=(3, 4), transpose=True)
    np.testing.assert_allclose(out, [1, 1, 1, 1])  # row 1 clamps to [2, 4); row 2 is empty
    out = xlakern.binary_csrmv(data, idx, ptr, jnp.ones(4, bool), shape=(3, 4), transpose=False)
    np.testing.assert_allclose(out, [2, 2, 0])


def test_weighted_events_use_their_values(rng, on_cpu):
    with x64():
        dense, data, idx, ptr = _csr(rng, 25, 12, 0.3)
        W = xlakern.CSR((data, idx, ptr), shape=(25, 12))
        v = np.where(rng.random(25) < 0.3, rng.standard_normal(25), 0.0)
        np.testing.assert_allclose(xlakern.WeightedArray(v) @ W, v @ dense, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(xlakern.WeightedArray(v) @ jnp.asarray(dense), v @ dense, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(xlakern.BinaryArray(v) @ W, (v != 0) @ dense, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["cpp", "jnp"])
@pytest.mark.parametrize("layout", ["CSR", "CSC", "FixedNumPerPre", "Dense", "array"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("batch", [None, 3])
def test_inactive_events_ignore_nonfinite_weights(rng, on_cpu, backend, layout, side, batch):
    """Event-driven means an inactive event contributes nothing, even through a NaN or infinite weight,
    on every backend (the jnp reference included); a non-finite weight of an active event still
    reaches the output, as in a dense product."""
    m, k = 9, 7
    n_ev = m if side == "left" else k
    on = rng.random(n_ev) < 0.5
    on[0], on[1] = True, False
    vals = np.where(on, rng.uniform(0.5, 2.0, n_ev), 0.0)
    x = vals if batch is None else np.stack([vals * (b + 1) for b in range(batch)], axis=0 if side == "left" else 1)
    if layout == "FixedNumPerPre":
        idx = np.stack([rng.choice(k, 3, replace=False) for _ in range(m)]).astype(np.int32)
        fw = rng.standard_normal((m, 3))
        if side == "left":  # the synapses of inactive rows
            fw[~on] = np.nan
        dense = np.zeros((m, k))
        dense[np.repeat(np.arange(m), 3), idx.ravel()] = fw.ravel()
        make = lambda: xlakern.FixedNumPerPre((jnp.asarray(fw, jnp.float32), jnp.asarray(idx)), shape=(m, k),
                                              backend=backend)
    else:
        dense = np.where(rng.random((m, k)) < 0.7, rng.standard_normal((m, k)), 0.0)
        dense[:, 0] = rng.standard_normal(m)  # every row has a synapse
        if side == "left":
            dense[~on] = np.where(dense[~on] != 0, np.nan, 0.0)
            dense[1, 0] = np.inf
        else:
            dense[:, ~on] = np.where(dense[:, ~on] != 0, -np.inf, 0.0)
            dense[0, 1] = np.nan
        d32 = jnp.asarray(dense, jnp.float32)
        make = {"CSR": lambda: xlakern.CSR.fromdense(d32, backend=backend),
                "CSC": lambda: xlakern.CSC.fromdense(d32, backend=backend),
                "Dense": lambda: xlakern.Dense(d32, backend=backend), "array": lambda: d32}[layout]
    finite = np.where(np.isfinite(dense), dense, 0.0)
    for weighted in (False, True):
        f = x if weighted else (x != 0).astype(float)  # (batch, m) on the left, (k, batch) on the right
        ref = f @ finite if side == "left" else finite @ f
        ev = (xlakern.WeightedArray if weighted else xlakern.BinaryArray)(jnp.asarray(x, jnp.float32))
        W = make()
        out = np.asarray(ev @ W if side == "left" else W @ ev, np.float64)
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # a NaN weight on an active event's synapse does reach its output
    if layout != "FixedNumPerPre":
        hot = dense.copy()
        hot[0, 0] = np.nan  # row 0 (an active event) reaches column 0; column 0 holds a synapse of row 0
        W = {"CSR": lambda: xlakern.CSR.fromdense(jnp.asarray(hot, jnp.float32), backend=backend),
             "CSC": lambda: xlakern.CSC.fromdense(jnp.asarray(hot, jnp.float32), backend=backend),
             "Dense": lambda: xlakern.Dense(jnp.asarray(hot, jnp.float32), backend=backend),
             "array": lambda: jnp.asarray(hot, jnp.float32)}[layout]()
        ev = xlakern.BinaryArray(jnp.asarray(x, jnp.float32))
        out = np.asarray(ev @ W if side == "left" else W @ ev)
        assert np.isnan(out).any()
