"""Event operators on the GPU (CUDA kernels): sizes, repeated calls in a jitted loop, AD, vmap, policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import random_csr, random_csr_with_dropped_slots, random_fcn

pytestmark = pytest.mark.gpu


def _big_csr(rng, n, k):
    idx = rng.integers(0, n, size=(n, k))
    data = rng.standard_normal((n, k)).astype(np.float32)
    ptr = np.arange(0, n * k + 1, k)
    return data.reshape(-1), idx.reshape(-1).astype(np.int32), ptr.astype(np.int32), idx, data


def _ref_scatter(idx, data, active, n):
    out = np.zeros(n)
    rows = np.nonzero(active)[0]
    np.add.at(out, idx[rows].reshape(-1), data[rows].reshape(-1).astype(np.float64))
    return out


def test_cuda_is_the_default_gpu_backend():
    for p in xlakern.event._kernels.ALL_PRIMITIVES:
        assert p.get_default("gpu") == "cuda"


@pytest.mark.parametrize("rate", [0.01, 0.5])
def test_large_csr_and_fcn_both_orientations(rng, rate):
    n, k = 20000, 80
    data, idx, ptr, idx2, data2 = _big_csr(rng, n, k)
    s = rng.random(n) < rate
    expect_scatter = _ref_scatter(idx2, data2, s, n)
    out = xlakern.binary_csrmv(data, idx, ptr, s, shape=(n, n), transpose=True)
    np.testing.assert_allclose(np.asarray(out), expect_scatter, rtol=1e-4, atol=1e-3)
    out = xlakern.binary_fcnmv(data2, idx2.astype(np.int32), s, shape=(n, n), transpose=True)
    np.testing.assert_allclose(np.asarray(out), expect_scatter, rtol=1e-4, atol=1e-3)
    expect_gather = (data2.astype(np.float64) * s[idx2]).sum(1)
    out = xlakern.binary_csrmv(data, idx, ptr, s, shape=(n, n), transpose=False)
    np.testing.assert_allclose(np.asarray(out), expect_gather, rtol=1e-4, atol=1e-3)
    out = xlakern.binary_fcnmv(data2, idx2.astype(np.int32), s, shape=(n, n), transpose=False)
    np.testing.assert_allclose(np.asarray(out), expect_gather, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rows_a_warp", ["1", "2", "4", "8", "16", "32"])
def test_scatter_with_the_rows_a_warp_forced(rng, rows_a_warp, monkeypatch):
    """The CSR and fixed-count scatters with the rows a warp walks forced (XLAKERN_SCATTER_ROWS), as the
    launcher would pick them at other sizes: a warp reads one spike a lane for that many rows, then walks
    the active ones. 5,003 rows (not a multiple of any choice), 3,001 columns, rows of 0 to 150 synapses
    (CSR) or 70 (fixed count), an mv and a batch of 3, against NumPy in float64."""
    monkeypatch.setenv("XLAKERN_SCATTER_ROWS", rows_a_warp)
    nrows, ncols, k = 5003, 3001, 70
    counts = rng.integers(0, 151, nrows)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    idx = rng.integers(0, ncols, ptr[-1]).astype(np.int32)
    data = rng.standard_normal(ptr[-1]).astype(np.float32)
    rows = np.repeat(np.arange(nrows), counts)
    f_idx = rng.integers(0, ncols, (nrows, k)).astype(np.int32)
    f_data = rng.standard_normal((nrows, k)).astype(np.float32)
    S = rng.random((nrows, 3)) < np.array([0.02, 0.3, 1.0])

    def reference(s, r, c, w):
        out = np.zeros(ncols)
        np.add.at(out, c[s[r]], w[s[r]].astype(np.float64))
        return out

    csr = xlakern.CSR((data, idx, ptr), shape=(nrows, ncols))
    fcn = xlakern.FixedNumPerPre((f_data, f_idx), shape=(nrows, ncols))
    f_rows = np.repeat(np.arange(nrows), k)
    for name, M, r, c, w in (("csr", csr, rows, idx, data),
                             ("fcn", fcn, f_rows, f_idx.reshape(-1), f_data.reshape(-1))):
        want = np.stack([reference(S[:, b], r, c, w) for b in range(3)], axis=1)
        got_mv = np.asarray(xlakern.BinaryArray(S[:, 0]) @ M)
        np.testing.assert_allclose(got_mv, want[:, 0], rtol=1e-5, atol=1e-4, err_msg=name)
        got_mm = np.asarray(xlakern.BinaryArray(S.T) @ M).T
        np.testing.assert_allclose(got_mm, want, rtol=1e-5, atol=1e-4, err_msg=name)


def _ragged_csr(rng, nrows, ncols, max_len, n_bad):
    """A CSR of rows of 0..max_len synapses with n_bad int32 indices out of range (negative, at ncols and
    past it, near 2^31: dropped), and a malformed copy of its indptr: row 99 ends before it starts (empty),
    row 100 starts earlier, the last row runs past nse. Returns idx, ptr, messy (int64), and the row and
    slot of every synapse a kernel walks under messy, read as the kernels clamp it:
    [clamp(messy[r]), max(clamp(messy[r]), clamp(messy[r+1]))) with clamp to [0, nse]."""
    counts = rng.integers(0, max_len + 1, nrows)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    nse = int(ptr[-1])
    idx = rng.integers(0, ncols, nse).astype(np.int32)
    bad = rng.choice(nse, n_bad, replace=False)
    idx[bad] = rng.choice(np.array([-1, -7, ncols, ncols + 3, 2**31 - 1], np.int32), n_bad)
    messy = ptr.copy()
    messy[100] = messy[99] - 5
    messy[-1] = nse + 40
    lo = np.clip(messy[:-1], 0, nse)
    hi = np.maximum(lo, np.clip(messy[1:], 0, nse))
    m_rows = np.concatenate([np.full(h - l, r) for r, (l, h) in enumerate(zip(lo, hi))]).astype(np.int64)
    m_slots = np.concatenate([np.arange(l, h) for l, h in zip(lo, hi)]).astype(np.int64)
    return idx, ptr, messy, m_rows, m_slots


@pytest.mark.parametrize("ranges", ["", "1"], ids=["ranges-ahead", "ranges-per-row"])
@pytest.mark.parametrize("walk", ["", "1"], ids=["mv32", "64-bit"])
@pytest.mark.parametrize("wdtype", [np.float16, np.float32, np.float64])
def test_scatter_mv_in_32_and_64_bit_arithmetic(rng, walk, wdtype, ranges, monkeypatch):
    """An mv scatter with int32 indices takes the 32-bit walk unless XLAKERN_WALK32=1 forces the
    64-bit one; both must give NumPy's float64 sums. Rows of 0-150 synapses, some indices out of range
    (negative, at ncols, near 2^31: dropped), an indptr that decreases in places and overshoots nse
    (clamped), bool and float spikes, one weight per synapse and a shared one, fixed-count rows of 70 and 0.
    Both ways of reading the rows' ranges too (XLAKERN_ROW_RANGES: every lane's beside its spike, the
    default; or each active row's as the walk comes to it)."""
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    monkeypatch.setenv("XLAKERN_ROW_RANGES", ranges)
    nrows, ncols, k = 7001, 2999, 70
    idx, ptr, messy, m_rows, m_slots = _ragged_csr(rng, nrows, ncols, 150, 50)
    nse = idx.size
    data = rng.standard_normal(nse).astype(wdtype)
    ptr32, messy32 = ptr.astype(np.int32), messy.astype(np.int32)
    rows = np.repeat(np.arange(nrows), np.diff(ptr))
    tol = dict(rtol=1e-5, atol=1e-4) if wdtype != np.float16 else dict(rtol=2e-3, atol=2e-2)

    def reference(value, r, c, w):  # value: each row's factor (0 where the row is silent)
        keep = (c >= 0) & (c < ncols)
        out = np.zeros(ncols)
        np.add.at(out, c[keep], (w.astype(np.float64) * value[r])[keep])
        return out

    b_spk = rng.random(nrows) < 0.03
    f_spk = np.where(rng.random(nrows) < 0.5, rng.standard_normal(nrows), 0).astype(np.float32)
    for spk in (b_spk, f_spk):
        value = spk.astype(np.float64)
        binary = spk.dtype == bool
        got = xlakern.csrmv(data, idx, ptr32, spk, shape=(nrows, ncols), transpose=True) if not binary else \
            xlakern.binary_csrmv(data, idx, ptr32, spk, shape=(nrows, ncols), transpose=True)
        np.testing.assert_allclose(np.asarray(got, np.float64), reference(value, rows, idx, data), **tol)
        got = xlakern.binary_csrmv(data, idx, messy32, b_spk, shape=(nrows, ncols), transpose=True)
        want = reference(b_spk.astype(np.float64), m_rows, idx[m_slots], data[m_slots])
        np.testing.assert_allclose(np.asarray(got, np.float64), want, **tol)
        shared = np.asarray([1.5], wdtype)
        got = xlakern.binary_csrmv(shared, idx, ptr32, b_spk, shape=(nrows, ncols), transpose=True)
        want = reference(b_spk.astype(np.float64), rows, idx, np.full(nse, 1.5))
        np.testing.assert_allclose(np.asarray(got, np.float64), want, **tol)
    for kk in (k, 0):
        f_idx = rng.integers(-2, ncols + 2, (nrows, kk)).astype(np.int32)
        f_data = rng.standard_normal((nrows, kk)).astype(wdtype)
        got = xlakern.fcnmv(f_data, f_idx, f_spk, shape=(nrows, ncols), transpose=True)
        want = reference(f_spk.astype(np.float64), np.repeat(np.arange(nrows), kk), f_idx.reshape(-1),
                         f_data.reshape(-1))
        np.testing.assert_allclose(np.asarray(got, np.float64), want, **tol)


# The binary mv gather's walks: int32 indices take the 32-bit one unless XLAKERN_WALK32=1 forces the
# 64-bit one, which int64 indices always take.
GATHER_WALKS = [pytest.param(np.int32, "", id="int32-walk32"), pytest.param(np.int32, "1", id="int32-walk64"),
                pytest.param(np.int64, "", id="int64")]


def test_plain_gather_rounds(rng):
    """The warp-a-row gather (float spikes, batched spikes) takes four slots a lane a round: rows of 0-400
    synapses (up to four rounds), a quarter of the entries of x zero (some -0.0), indices out of range, an
    indptr that decreases in places and overshoots nse, mv and a batch of 3, float32 and float16 weights, and
    a shared weight. data[0] is NaN and slot 0's column is silent: inactive slots read weight 0's address,
    and no NaN may reach a sum. Against numpy in float64."""
    nrows, ncols = 3001, 2003
    idx, _, messy, rows, slots = _ragged_csr(rng, nrows, ncols, 400, 300)
    nse = idx.size
    x = rng.standard_normal((ncols, 3)).astype(np.float32)
    x[rng.random((ncols, 3)) < 0.2] = 0.0
    x[rng.random((ncols, 3)) < 0.05] = -0.0
    x[idx[0]] = 0.0  # slot 0 silent in every column, so its NaN weight never counts
    ptr32 = messy.astype(np.int32)

    def reference(w, xs):  # xs: (ncols, b)
        c = idx[slots]
        keep = (c >= 0) & (c < ncols)
        out = np.zeros((nrows, xs.shape[1]))
        xv = xs[c[keep]].astype(np.float64)
        terms = np.where(xv != 0, w[slots][keep, None].astype(np.float64) * xv, 0.0)  # zero entries are skipped
        np.add.at(out, rows[keep], terms)
        return out

    for wdtype, tol in ((np.float32, dict(rtol=1e-5, atol=1e-4)), (np.float16, dict(rtol=2e-3, atol=3e-2))):
        data = rng.standard_normal(nse).astype(wdtype)
        data[0] = np.nan
        want = reference(data, x)
        got = xlakern.csrmv(data, idx, ptr32, x[:, 0], shape=(nrows, ncols))
        assert not np.isnan(np.asarray(got, np.float64)).any()
        np.testing.assert_allclose(np.asarray(got, np.float64), want[:, 0], **tol)
        got = xlakern.csrmm(data, idx, ptr32, x, shape=(nrows, ncols))
        np.testing.assert_allclose(np.asarray(got, np.float64), want, **tol)
    w0 = np.asarray([0.75], np.float32)
    got = xlakern.csrmv(w0, idx, ptr32, x[:, 1], shape=(nrows, ncols))
    np.testing.assert_allclose(np.asarray(got, np.float64), reference(np.full(nse, 0.75), x[:, 1:2])[:, 0],
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("index_dtype, walk", GATHER_WALKS)
@pytest.mark.parametrize("rate", [0.3, 0.01])
@pytest.mark.parametrize("summary", ["", "1"])
def test_binary_gather_wider_than_shared_memory(rng, index_dtype, walk, rate, summary, monkeypatch):
    """2,000,003 columns: the spikes as bits (250 KB) exceed a block's shared memory, so the binary mv
    gather packs them into its scratch output and tests them there, behind their summary in shared
    memory (or without it: XLAKERN_SPIKE_SUMMARY=1). CSR and fixed-count rows, against numpy in float64;
    a jitted loop reuses the scratch, so each step's product is checked too. At 1% most bytes of bits
    are empty, so a summary bit wrongly clear would drop synapses."""
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    if summary:
        monkeypatch.setenv("XLAKERN_SPIKE_SUMMARY", summary)
    nrows, ncols, k = 3000, 2_000_003, 140  # rows of 140: two rounds a row
    idx = rng.integers(0, ncols, size=(nrows, k)).astype(index_dtype)
    idx[:, -1] = ncols - 1  # the last word's last column
    data = rng.standard_normal((nrows, k)).astype(np.float32)
    ptr = np.arange(0, nrows * k + 1, k).astype(index_dtype)
    S = rng.random((3, ncols)) < rate
    S[:, -1] = rng.random(3) < 0.5  # the last column, in the last (partial) packing warp
    expect = np.stack([(data.astype(np.float64) * s[idx]).sum(1) for s in S])
    with jax.enable_x64(index_dtype == np.int64):  # else jnp would narrow the int64 indices
        i1, p1 = jnp.asarray(idx.reshape(-1)), jnp.asarray(ptr)
        assert i1.dtype == index_dtype
        got = xlakern.binary_csrmv(data.reshape(-1), i1, p1, S[0], shape=(nrows, ncols))
        np.testing.assert_allclose(np.asarray(got), expect[0], rtol=1e-4, atol=1e-3)
        got = xlakern.binary_fcnmv(data, jnp.asarray(idx), S[1], shape=(nrows, ncols))
        np.testing.assert_allclose(np.asarray(got), expect[1], rtol=1e-4, atol=1e-3)
        W = xlakern.CSR((jnp.asarray(data.reshape(-1)), i1, p1), shape=(nrows, ncols))
        ys = jax.jit(lambda W, S: jax.lax.map(lambda s: W @ xlakern.BinaryArray(s), S))(W, S)
        np.testing.assert_allclose(np.asarray(ys), expect, rtol=1e-4, atol=1e-3)
        # one shared weight (its own kernel variant): the count of active synapses a row, times it
        w0 = np.float32(rng.uniform(0.5, 2.0))
        got = xlakern.binary_csrmv(np.asarray([w0]), i1, p1, S[2], shape=(nrows, ncols))
        np.testing.assert_allclose(np.asarray(got), float(w0) * S[2][idx].sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("walk", ["", "1"], ids=["walk32", "walk64"])
def test_binary_gather_edge_cases(rng, walk, monkeypatch):
    """The binary mv gather's edge cases on the GPU, in both walks. Its bitmask kernel reads weight 0 and
    bit word 0 in the slots of inactive synapses, so no synapses or no columns must leave it for the plain
    gather; out-of-range indices are dropped and a malformed indptr is clamped, with rows of different
    lengths walked in pairs. Against numpy in float64."""
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    out = xlakern.binary_fcnmv(jnp.zeros((7, 0)), jnp.zeros((7, 0), jnp.int32), rng.random(5) < 0.5, shape=(7, 5))
    np.testing.assert_array_equal(np.asarray(out), 0)
    out = xlakern.binary_csrmv(jnp.zeros(0), jnp.zeros(0, jnp.int32), jnp.zeros(8, jnp.int32), rng.random(6) < 0.5,
                               shape=(7, 6))
    np.testing.assert_array_equal(np.asarray(out), 0)
    out = xlakern.binary_csrmv(jnp.ones(3), jnp.zeros(3, jnp.int32), jnp.array([0, 1, 3], jnp.int32),
                               jnp.zeros(0, bool), shape=(2, 0))
    np.testing.assert_array_equal(np.asarray(out), 0)
    # rows of 0-300 synapses (one to four rounds), a quarter of the indices out of range
    nrows, ncols = 301, 1000
    lens = rng.integers(0, 300, nrows)
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    idx = rng.integers(0, ncols, ptr[-1])
    bad = rng.random(idx.size) < 0.25
    idx[bad] = rng.choice([-1, -7, ncols, 10**6], bad.sum())
    data = rng.standard_normal(idx.size).astype(np.float32)
    s = rng.random(ncols) < 0.3
    rows = np.repeat(np.arange(nrows), lens)
    ok = (idx >= 0) & (idx < ncols)
    expect = np.zeros(nrows)
    np.add.at(expect, rows[ok], data[ok].astype(np.float64) * s[idx[ok]])
    out = xlakern.binary_csrmv(data, idx.astype(np.int32), ptr, s, shape=(nrows, ncols))
    np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-4, atol=1e-4)
    # indptr far outside the index array: row 1 clamps to [2, 4), row 2 is empty
    out = xlakern.binary_csrmv(jnp.ones(4), jnp.array([0, 1, 2, 3], jnp.int32), jnp.array([0, 2, 10**6, -5], jnp.int32),
                               jnp.ones(4, bool), shape=(3, 4))
    np.testing.assert_allclose(np.asarray(out), [2, 2, 0])


def _ragged_rows(rng, nrows, ncols, max_len, index_dtype):
    """A CSR of rows of 0..max_len synapses, 2% of its indices out of range (dropped). Returns ptr, idx
    (both index_dtype), each synapse's row, and which synapses are in range."""
    lens = rng.integers(0, max_len + 1, nrows)
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(index_dtype)
    idx = rng.integers(0, ncols, int(ptr[-1]))
    bad = rng.random(idx.size) < 0.02
    idx[bad] = rng.choice([-1, ncols, 10**6], bad.sum())
    idx = idx.astype(index_dtype)
    return ptr, idx, np.repeat(np.arange(nrows), lens), (idx >= 0) & (idx < ncols)


@pytest.mark.parametrize("index_dtype, walk", GATHER_WALKS)
@pytest.mark.parametrize("max_len, nrows", [(40, 150_001), (12, 150_001), (300, 20_001)],
                         ids=["weights-after-bits", "weights-eager", "rounds-of-long-rows"])
def test_binary_gather_in_shared_memory_over_several_row_groups(rng, index_dtype, walk, max_len, nrows,
                                                                 monkeypatch):
    """The binary mv gather with its bits in shared memory where each warp walks several groups of 32
    rows (150,001 ragged rows over ~4k warps; a warp loads its first group's rows before the block packs
    the spikes): every weight dtype, one shared weight, bool and float spikes (-0.0 silent), indices out
    of range; against numpy in float64. Rows of up to 40 synapses (~3M: every weight is read after its
    bit) and of up to 12 (~0.9M: in the 32-bit walk, weights of 4 bytes or fewer, at most 4 MiB, are
    loaded beside their indices). And 20,001 rows of up to 300 (~3M): one to four rounds a row, with the
    32-bit walk's four rows a round ending in different rounds, and a warp's last round short of rows."""
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    ncols = 3001
    ptr, idx, rows, ok = _ragged_rows(rng, nrows, ncols, max_len, index_dtype)
    on = rng.random(ncols) < 0.2
    spikes = {"bool": on, "float": np.where(on, rng.uniform(0.5, 2.0, ncols), -0.0).astype(np.float32)}

    def expect(weights, active):
        out = np.zeros(nrows)
        np.add.at(out, rows[ok], weights[ok] * active[idx[ok]])
        return out

    with jax.enable_x64(True):  # float64 weights and int64 indices stay as they are
        i1, p1 = jnp.asarray(idx), jnp.asarray(ptr)
        for dtype in (np.float32, jnp.float16, jnp.bfloat16, np.float64):
            data = jnp.asarray(rng.standard_normal(idx.size), dtype)
            want = expect(np.asarray(data, np.float64), on)
            tol = 1e-5 if dtype in (np.float32, np.float64) else 2e-2
            for kind, s in spikes.items():
                got = xlakern.binary_csrmv(data, i1, p1, s, shape=(nrows, ncols))
                assert got.shape == (nrows,), kind
                np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol, err_msg=kind)
        w0 = np.float32(rng.uniform(0.5, 2.0))
        got = xlakern.binary_csrmv(jnp.asarray([w0]), i1, p1, on, shape=(nrows, ncols))
        np.testing.assert_allclose(np.asarray(got), expect(np.full(idx.size, float(w0)), on), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("index_dtype, walk", GATHER_WALKS)
def test_binary_gather_small_products_in_small_blocks(rng, index_dtype, walk, monkeypatch):
    """The binary mv gather of a small product (32 rows an SM at most, 8,192 columns at most) runs in
    blocks of 8 warps that walk two rows each. Row counts about that bound (this GPU's SM count), odd
    and even, one row, and column counts about the bitmask's bound; ragged rows of 0-200 synapses (up to
    three rounds), indices out of range; weights of 4 and 8 bytes, one shared weight, bool and float
    spikes. CSR and fixed-count rows against numpy in float64."""
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    sms = getattr(jax.devices("gpu")[0], "core_count", None)
    assert sms, "this jax reports no SM count (Device.core_count), which the test needs for the bound"
    bound = 32 * sms  # the rows a small product has at most
    shapes = [(1, 5), (2, 1), (33, 8192), (301, 4000), (bound - 1, 3000), (bound, 8192), (bound + 1, 4000),
              (bound, 8193)]  # the last two: the 1,024-thread blocks, as a check on the same data
    with jax.enable_x64(True):  # float64 weights and int64 indices stay as they are
        for nrows, ncols in shapes:
            ptr, idx, rows, ok = _ragged_rows(rng, nrows, ncols, 200, index_dtype)
            on = rng.random(ncols) < 0.3
            fs = np.where(on, rng.uniform(0.5, 2.0, ncols), 0.0).astype(np.float32)
            for dtype in (np.float32, np.float64):
                data = rng.standard_normal(idx.size).astype(dtype)
                want = np.zeros(nrows)
                np.add.at(want, rows[ok], data[ok].astype(np.float64) * on[idx[ok]])
                for s in (on, fs):
                    got = xlakern.binary_csrmv(jnp.asarray(data), jnp.asarray(idx), jnp.asarray(ptr), s,
                                               shape=(nrows, ncols))
                    # (atol: float32 sums of up to ~60 signed terms that cancel to near zero)
                    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-4,
                                               err_msg=f"{nrows}x{ncols} {np.dtype(dtype).name} {s.dtype}")
            w0 = np.float32(rng.uniform(0.5, 2.0))
            want = np.zeros(nrows)
            np.add.at(want, rows[ok], float(w0) * on[idx[ok]])
            got = xlakern.binary_csrmv(jnp.asarray([w0]), jnp.asarray(idx), jnp.asarray(ptr), on, shape=(nrows, ncols))
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=f"{nrows}x{ncols} shared")
            # fixed-count rows of 100 (two rounds, the second partial)
            fidx = rng.integers(0, ncols, (nrows, 100)).astype(index_dtype)
            fdata = rng.standard_normal((nrows, 100)).astype(np.float32)
            got = xlakern.binary_fcnmv(jnp.asarray(fdata), jnp.asarray(fidx), on, shape=(nrows, ncols))
            np.testing.assert_allclose(np.asarray(got), (fdata.astype(np.float64) * on[fidx]).sum(1), rtol=1e-5,
                                       atol=1e-4, err_msg=f"{nrows}x{ncols} fixed-count")


def test_dense_scatter_over_chunks_and_slices(rng):
    """The dense scatter `s @ W` where one block walks more rows than a chunk (1,024) (262,200 columns:
    one row slice), and where few columns split the rows into many slices: bool and float32 spikes,
    batches of 8 weight loads and their remainders, mv and mm (batch 3). float16 weights accumulate in
    float32 and the product is float16: against jnp's float32 sums over the active rows, to a unit in the
    last place of float16 (a missed or doubled row moves a sum by ~1)."""
    close = lambda got, want: np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=1e-3,
                                                         atol=1e-3)
    key = jax.random.PRNGKey(int(rng.integers(2**31)))
    for nrows, ncols in ((2500, 262_200), (3000, 700)):
        W = jax.random.normal(key, (nrows, ncols), jnp.float16)
        for rate in (0.004, 0.3):
            s = rng.random(nrows) < rate
            on = np.nonzero(s)[0]
            Wa = jnp.asarray(W[on], jnp.float32)
            got = xlakern.binary_densemv(W, s, transpose=True)
            close(got, Wa.sum(0))
            v = (rng.standard_normal(nrows) * s).astype(np.float32)  # float spikes: active where non-zero
            close(xlakern.binary_densemv(W, v, transpose=True), Wa.sum(0))
        B = rng.random((nrows, 3)) < 0.05
        got = np.asarray(xlakern.binary_densemm(W, B, transpose=True))
        for j in range(3):
            close(got[:, j], jnp.asarray(W[np.nonzero(B[:, j])[0]], jnp.float32).sum(0))


@pytest.mark.parametrize("dtype", [np.float32, jnp.float16, jnp.bfloat16, np.float64])
def test_dense_scatter_with_16_byte_rows(rng, dtype):
    """The mv dense scatter `s @ W` whose rows start on 16-byte boundaries (16-byte loads, each block's
    row slice listed in shared memory first; 2,048 threads of columns or more): one slice (200 rows),
    a few (2,100 rows) and many (6,000); no, 1%, 30% and all rows active; bool and float spikes,
    unweighted and weighted (the float spike's value), against float64 NumPy. 16,386 columns of 2-byte
    weights (rows 4 bytes off a 16-byte boundary) take the other kernel, and agree too."""
    itemsize = np.dtype(np.float32 if dtype is np.float32 else dtype).itemsize
    tol = 1e-4 if itemsize >= 4 else 2e-2
    shapes = [(200, 16384), (2100, 16384), (6000, 16384)] + ([(500, 16386)] if itemsize == 2 else [])
    with jax.enable_x64(True):
        for nrows, ncols in shapes:
            W = jnp.asarray(rng.standard_normal((nrows, ncols)), dtype)
            Wd = np.asarray(W, np.float64)
            for rate in (0.0, 0.01, 0.3, 1.0):
                s = rng.random(nrows) < rate
                v = (rng.standard_normal(nrows) * s).astype(np.float32)
                for spikes, weighted, weights in ((s, False, s), (v, False, v != 0), (v, True, v)):
                    got = xlakern.binary_densemv(W, spikes, transpose=True, weighted=weighted)
                    want = np.asarray(weights, np.float64) @ Wd
                    assert got.shape == (ncols,)
                    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol,
                                               atol=tol * max(1.0, np.sqrt(np.count_nonzero(weights))),
                                               err_msg=f"{nrows}x{ncols} rate {rate} weighted={weighted}")


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float64])
def test_dense_mm_scatter_with_16_byte_rows(rng, dtype):
    """The batched dense scatter `W.T @ S` (binary_densemm, transpose=True; vmap of binary_densemv over
    spikes) on the 16-byte path: each batch column lists its own active rows. One slice (300 rows) and
    several (5,000); batches of 2, 16 and 37 whose columns have different rates (none, 1%, 30%, all);
    bool and float spikes, unweighted and weighted, against float64 NumPy."""
    itemsize = np.dtype(np.float32 if dtype is np.float32 else dtype).itemsize
    tol = 1e-4 if itemsize >= 4 else 2e-2
    with jax.enable_x64(True):
        for nrows, ncols in ((300, 16384), (5000, 16384)):
            W = jnp.asarray(rng.standard_normal((nrows, ncols)), dtype)
            Wd = np.asarray(W, np.float64)
            for batch in (2, 16, 37):
                rates = np.array([0.0, 0.01, 0.3, 1.0])[np.arange(batch) % 4]
                s = rng.random((nrows, batch)) < rates
                v = (rng.standard_normal((nrows, batch)) * s).astype(np.float32)
                for spikes, weighted, weights in ((s, False, s), (v, False, v != 0), (v, True, v)):
                    got = xlakern.binary_densemm(W, spikes, transpose=True, weighted=weighted)
                    want = Wd.T @ np.asarray(weights, np.float64)
                    assert got.shape == (ncols, batch)
                    atol = tol * max(1.0, np.sqrt(nrows))
                    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=atol,
                                               err_msg=f"{nrows}x{ncols} batch {batch} weighted={weighted}")
                # vmap over the spikes' batch turns the mv into this mm
                mapped = jax.vmap(lambda x: xlakern.binary_densemv(W, x, transpose=True), in_axes=1, out_axes=1)(s)
                np.testing.assert_allclose(np.asarray(mapped, np.float64), Wd.T @ s.astype(np.float64), rtol=tol,
                                           atol=tol * max(1.0, np.sqrt(nrows)), err_msg=f"vmap, batch {batch}")


def _slices_summed_in_order(W, S, slices):
    """float32 `W.T @ S` for binary S as the clustered dense scatter sums it: within each of `slices` equal
    row slices the active rows in ascending order, then the slices' partials in order, from zero."""
    nrows = W.shape[0]
    per = -(-nrows // slices)
    out = np.zeros((W.shape[1], S.shape[1]), np.float32)
    for b in range(S.shape[1]):
        total = np.zeros(W.shape[1], np.float32)
        for q in range(slices):
            part = np.zeros(W.shape[1], np.float32)
            for r in np.nonzero(S[q * per:(q + 1) * per, b])[0] + q * per:
                part = part + W[r]
            total = total + part
        out[:, b] = total
    return out


@pytest.mark.parametrize("cluster", ["rule", "off", "2", "4", "16"])
def test_dense_scatter_slices_summed_in_clusters(rng, cluster, monkeypatch):
    """On sm_90 and up, the dense scatter's row slices of one column tile can run as a thread block
    cluster and sum their partials through distributed shared memory: the output is written once, with
    no clear and no atomic add. 3,000 x 8,200 float32 weights (the last block of a tile runs past the
    columns), batches of 16 (mm) and 1 (mv) with columns at 0%, 1%, 20% and 100% active, against float64
    NumPy: in the launcher's own choice (on an H100 or H200, the mm's 2 slices in clusters and the mv's 11
    added atomically), with clusters off (XLAKERN_DENSE_CLUSTER=1), and with 2, 4 and 16 slices forced into clusters
    (XLAKERN_DENSE_SLICES, XLAKERN_DENSE_CLUSTER=2). A cluster must give, bit for bit, the float32 sums in
    its fixed order (rows ascending within a slice, then slices in order), and the same bits on every
    call; atomic adds in arrival order would not."""
    if cluster != "rule":
        monkeypatch.setenv("XLAKERN_DENSE_CLUSTER", "1" if cluster == "off" else "2")
        if cluster != "off":
            monkeypatch.setenv("XLAKERN_DENSE_SLICES", cluster)
    nrows, ncols = 3000, 8200
    W = rng.standard_normal((nrows, ncols)).astype(np.float32)
    S = rng.random((nrows, 16)) < np.array([0.0, 0.01, 0.2, 1.0])[np.arange(16) % 4]
    v = (rng.standard_normal((nrows, 16)) * S).astype(np.float32)
    mm = jax.jit(lambda W, S: xlakern.binary_densemm(W, S, transpose=True))  # a fresh executable per case
    mv = jax.jit(lambda W, s: xlakern.binary_densemv(W, s, transpose=True))
    Wj = jnp.asarray(W)
    got = np.asarray(mm(Wj, S))
    np.testing.assert_allclose(got, W.T.astype(np.float64) @ S, rtol=1e-4, atol=1e-3)
    weighted = np.asarray(xlakern.binary_densemm(Wj, v, transpose=True, weighted=True))
    np.testing.assert_allclose(weighted, W.T.astype(np.float64) @ v, rtol=1e-4, atol=1e-3)
    for b in (1, 2):
        np.testing.assert_allclose(np.asarray(mv(Wj, S[:, b])), W.T.astype(np.float64) @ S[:, b], rtol=1e-4,
                                   atol=1e-3)
    major = int(str(jax.devices("gpu")[0].compute_capability).split(".")[0])
    if cluster in ("2", "4", "16") and major >= 9:
        np.testing.assert_array_equal(got, _slices_summed_in_order(W, S, int(cluster)))
        np.testing.assert_array_equal(np.asarray(mm(Wj, S)), got)
        np.testing.assert_array_equal(np.asarray(mv(Wj, S[:, 2])), _slices_summed_in_order(W, S[:, 2:3],
                                                                                            int(cluster))[:, 0])


def test_jitted_loop_clears_outputs_every_step(rng):
    """A 100-step scan: each step's scatter output must start from zero (buffers are reused)."""
    n, k, steps = 3000, 20, 100
    data, idx, ptr, idx2, data2 = _big_csr(rng, n, k)
    W = xlakern.CSR((data, idx, ptr), shape=(n, n))
    S = rng.random((steps, n)) < 0.05

    @jax.jit
    def run(W, S):
        def step(c, s):
            y = xlakern.BinaryArray(s) @ W
            return c + y, y
        return jax.lax.scan(step, jnp.zeros(n, jnp.float32), S)

    total, ys = run(W, S)
    expect = np.stack([_ref_scatter(idx2, data2, s, n) for s in S])
    np.testing.assert_allclose(np.asarray(ys), expect, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(total), expect.sum(0), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("overlap", [True, False])
def test_scatter_adds_wait_for_their_output_clear(rng, overlap, monkeypatch):
    """On sm_90 and up a scatter's output is cleared by a kernel that the scatter overlaps (programmatic
    dependent launch): the scatter reads its spikes, rows and weights meanwhile, and its adds must wait
    for the clear. Here the clear is long (8M columns, 32 MB) and the active rows few and short, so an
    add that did not wait would land while the clear still runs, and be wiped (with the waits taken out,
    the CSR case failed on an H200). A step with no spike at all adds nothing, and must still not end
    before its clear: the kernel after it reads the output. In a jitted scan the output buffer holds the
    previous step's sums. CSR, fixed-count and JITC scatters against float64 NumPy, with the overlap
    (the default) and with a memset instead (XLAKERN_PDL=1)."""
    if not overlap:
        monkeypatch.setenv("XLAKERN_PDL", "1")
    nrows, ncols, k, steps = 96, 8_000_000, 40, 5
    idx = rng.integers(0, ncols, size=(nrows, k))
    data = rng.standard_normal((nrows, k)).astype(np.float32)
    ptr = np.arange(0, nrows * k + 1, k).astype(np.int32)
    S = rng.random((steps, nrows)) < np.array([1.0, 0.0, 0.5, 0.9, 0.2])[:, None]
    csr = xlakern.CSR((data.reshape(-1), idx.reshape(-1).astype(np.int32), ptr), shape=(nrows, ncols))
    fcn = xlakern.FixedNumPerPre((data, idx.astype(np.int32)), shape=(nrows, ncols))
    jitc = xlakern.JITCScalarR((0.75, k / ncols, int(rng.integers(2**31))), shape=(nrows, ncols), corder=True)
    stored = jitc.tocsr()  # the JITC matrix's synapses, exactly as its products generate them
    j_data, j_idx, j_ptr = (np.asarray(a) for a in (stored.data, stored.indices, stored.indptr))
    j_rows = np.repeat(np.arange(nrows), np.diff(j_ptr))
    assert j_idx.size > nrows * k // 2

    def reference(s, rows, cols, weights):
        out = np.zeros(ncols)
        on = s[rows]
        np.add.at(out, cols[on], np.broadcast_to(weights, cols.shape)[on].astype(np.float64))
        return out

    expected = {
        "csr": [reference(s, np.repeat(np.arange(nrows), k), idx.reshape(-1), data.reshape(-1)) for s in S],
        "jitc": [reference(s, j_rows, j_idx, j_data) for s in S],
    }
    expected["fcn"] = expected["csr"]
    for name, M in (("csr", csr), ("fcn", fcn), ("jitc", jitc)):
        run = jax.jit(lambda M, S: jax.lax.scan(lambda c, s: (c, xlakern.BinaryArray(s) @ M), 0, S)[1])
        ys = np.asarray(run(M, S))
        for t in range(steps):
            np.testing.assert_allclose(ys[t], expected[name][t], rtol=1e-5, atol=1e-5, err_msg=f"{name}, step {t}")


def test_grad_and_vmap_on_gpu(rng):
    dense, data, idx, ptr = random_csr(rng, 300, 200, 0.05)
    data, idx, ptr = data.astype(np.float32), idx.astype(np.int32), ptr.astype(np.int32)
    rows = np.repeat(np.arange(300), np.diff(ptr))
    S = rng.random((37, 300)) < 0.2
    f = lambda s: xlakern.binary_csrmv(data, idx, ptr, s, shape=(300, 200), transpose=True)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(S)), S @ dense, rtol=1e-4, atol=1e-4)
    c = rng.standard_normal(200).astype(np.float32)
    s = S[0]
    g = jax.grad(lambda d: jnp.dot(c, xlakern.binary_csrmv(d, idx, ptr, s, shape=(300, 200), transpose=True)))(
        jnp.asarray(data))
    np.testing.assert_allclose(np.asarray(g), s[rows] * c[idx], rtol=1e-5, atol=1e-6)
    v = np.where(s, rng.uniform(0.5, 1.5, 300), 0).astype(np.float32)
    gs = jax.grad(lambda v: jnp.dot(c, xlakern.binary_csrmv(data, idx, ptr, v, shape=(300, 200), transpose=True)))(
        jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(gs), dense @ c, rtol=1e-4, atol=1e-4)


def test_out_of_range_indices_dropped_on_gpu(rng):
    data = rng.standard_normal(6).astype(np.float32)
    idx = np.array([0, 7, -1, 2, 100000, 3], np.int32)
    ptr = np.array([0, 3, 6], np.int32)
    out = xlakern.binary_csrmv(data, idx, ptr, np.ones(2, bool), shape=(2, 4), transpose=True)
    expect = np.zeros(4)
    expect[0], expect[2], expect[3] = data[0], data[3], data[5]
    np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-6)
    out = xlakern.binary_csrmv(data, idx, ptr, np.ones(4, bool), shape=(2, 4), transpose=False)
    np.testing.assert_allclose(np.asarray(out), [data[0], data[3] + data[5]], rtol=1e-6)


# The GPU mm gather's two kernels, each forced through XLAKERN_MM_GATHER on every batch: 1, lane groups
# (a row to a group of 8, 16 or 32 lanes, a lane a batch column); 2, tiles (a warp a row and 16 batch
# columns, a lane a slot), which take one-byte binary spikes, and wider binary spikes once copied a byte
# each into the call's scratch (float spikes keep the lane groups). By default binary spikes take the tiles
# above 8 columns.
@pytest.mark.parametrize("kernel", ["1", "2"])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_mm_gather_kernels(rng, monkeypatch, kernel, binary, index_dtype):
    """Both mm gathers: batches on each side of the group and tile widths and over several tiles (whole
    tiles take 16-byte spike loads, partial ones a load a spike), rows of 0 to ~100 slots and of ~300 (a
    tile walks rows 96 slots a round), slots outside the matrix, CSR and fixed-count, float64 and float32
    weights, float32 spikes read as binary, against float64 NumPy; and a matrix with no columns."""
    monkeypatch.setenv("XLAKERN_MM_GATHER", kernel)
    rows, cols = 300, 150
    kept, data, bad, ptr = random_csr_with_dropped_slots(rng, rows, cols, 0.5, 8, [-1, cols, 10**6])
    long_kept, long_data, long_bad, long_ptr = random_csr_with_dropped_slots(rng, 40, 700, 0.45, 8, [-1, 700])
    dense_fcn, w_fcn, idx_fcn = random_fcn(rng, rows, cols, 40)
    csr_op = xlakern.binary_csrmm if binary else xlakern.csrmm
    fcn_op = xlakern.binary_fcnmm if binary else xlakern.fcnmm
    with jax.enable_x64(True):
        for batch in (2, 8, 9, 16, 17, 32, 33, 70):
            rates = np.array([0.0, 0.05, 0.4, 1.0])[rng.permutation(batch) % 4]
            on = rng.random((cols, batch)) < rates
            s = on if binary else np.where(on, rng.uniform(-2.0, 2.0, on.shape), 0.0)
            f = on.astype(np.float64) if binary else s
            for wdt, tol in ((np.float64, 1e-12), (np.float32, 2e-5)):
                args = (jnp.asarray(bad, index_dtype), jnp.asarray(ptr, index_dtype), jnp.asarray(s))
                out = csr_op(jnp.asarray(data, wdt), *args, shape=(rows, cols))
                np.testing.assert_allclose(np.asarray(out, np.float64), kept @ f, rtol=tol, atol=tol * 30,
                                           err_msg=f"csr batch {batch} {wdt.__name__}")
                out = fcn_op(jnp.asarray(w_fcn, wdt), jnp.asarray(idx_fcn, index_dtype), jnp.asarray(s),
                             shape=(rows, cols))
                np.testing.assert_allclose(np.asarray(out, np.float64), dense_fcn @ f, rtol=tol, atol=tol * 30,
                                           err_msg=f"fcn batch {batch} {wdt.__name__}")
            if binary:  # float32 spikes, read as binary (-0.0 silent, NaN active): tiles copy them to bytes first
                wide = np.where(on, rng.choice(np.array([1.0, -3.5, np.nan], np.float32), on.shape),
                                rng.choice(np.array([0.0, -0.0], np.float32), on.shape))
                out = csr_op(jnp.asarray(data, np.float32), jnp.asarray(bad, index_dtype), jnp.asarray(ptr, index_dtype),
                             jnp.asarray(wide), shape=(rows, cols))
                np.testing.assert_allclose(np.asarray(out, np.float64), kept @ f, rtol=2e-5, atol=6e-4,
                                           err_msg=f"float32 binary spikes, batch {batch}")
        for batch in (16, 40):
            on = rng.random((700, batch)) < 0.3
            s = on if binary else np.where(on, rng.uniform(-2.0, 2.0, on.shape), 0.0)
            out = csr_op(jnp.asarray(long_data), jnp.asarray(long_bad, index_dtype), jnp.asarray(long_ptr, index_dtype),
                         jnp.asarray(s), shape=(40, 700))
            np.testing.assert_allclose(np.asarray(out), long_kept @ np.asarray(s, np.float64), rtol=1e-12,
                                       atol=1e-11, err_msg=f"long rows, batch {batch}")
    # no columns: every slot is out of range, and the tiles read no spike
    w = rng.standard_normal((6, 3)).astype(np.float32)
    out = xlakern.binary_fcnmm(w, rng.integers(-3, 4, size=(6, 3)).astype(index_dtype), np.zeros((0, 20), bool),
                               shape=(6, 0))
    assert out.shape == (6, 20)
    np.testing.assert_array_equal(np.asarray(out), 0)


def test_batch_wider_than_one_grid_dimension(rng):
    """More batch columns than gridDim.y allows (65535): the kernels stride over the rest."""
    dense, w, idx = random_fcn(rng, 3, 4, 2)
    B = rng.random((3, 70000)) < 0.5
    out = xlakern.binary_fcnmm(w.astype(np.float32), idx.astype(np.int32), B, shape=(3, 4), transpose=True)
    np.testing.assert_allclose(np.asarray(out), dense.T @ B, rtol=1e-5, atol=1e-5)
    B2 = rng.random((4, 70000)) < 0.5
    # the sparse mm gather of bool spikes takes 16 columns a tile: over 65535 tiles, its blocks stride too
    B3 = rng.random((4, 32 * 65535 + 70)) < 0.5
    out = xlakern.binary_fcnmm(w.astype(np.float32), idx.astype(np.int32), B3, shape=(3, 4), transpose=False)
    np.testing.assert_allclose(np.asarray(out), dense @ B3, rtol=1e-5, atol=1e-5)
    out = xlakern.binary_densemm(jnp.asarray(dense, jnp.float32), B2, transpose=False)
    np.testing.assert_allclose(np.asarray(out), dense @ B2, rtol=1e-5, atol=1e-5)
    out = xlakern.binary_densemm(jnp.asarray(dense, jnp.float32), B, transpose=True)
    np.testing.assert_allclose(np.asarray(out), dense.T @ B, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- JITC

# (shape, prob): ~500 synapses a row (the scatter's 4-warp teams); ~1,500 (8-warp teams, several team
# rounds a row); ~40 (the gather's 8-lane groups); a third of the rows with no synapse; 7 columns (every
# row ends in the first round); four rows in five with no synapse; more rows than the mv gather's
# resident blocks take at once (they stride over the rows); a skip table too long for the mv gather's
# shared memory (its long skips read the table in global memory) beside spikes that fit there as bits.
# No width is a multiple of 32.
JITC_GPU_CASES = [((1001, 999), 0.5), ((300, 5003), 0.3), ((1001, 999), 0.04), ((1001, 999), 0.001),
                  ((45, 7), 0.5), ((2000, 100), 0.002), ((40000, 300), 0.05), ((500, 20011), 3e-4)]


# Every launch path of the JITC kernels, forced through their environment knobs (the default choice
# first): the gather's lanes per row (and, with 32 lanes, its rounds drawn at once), the scatter's draws
# per team round (one warp: 32 or 128; 4 or 8 warps together: 512 or 1024) and its rows a block. The mv
# gather's 4 rounds are runs of 4 draws a lane.
KNOB_VARS = ("XLAKERN_JITC_GATHER_LANES", "XLAKERN_JITC_GATHER_ROUNDS", "XLAKERN_JITC_SCATTER_DRAWS",
             "XLAKERN_JITC_GATHER_SKIPS", "XLAKERN_JITC_SCATTER_ROWS")
GATHER_KNOBS = ({}, {"XLAKERN_JITC_GATHER_LANES": "1"}, {"XLAKERN_JITC_GATHER_LANES": "8"},
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "1"},
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "4"},
                # skips decided in double precision (ExactSkip), which the mv gather takes for long tables
                {"XLAKERN_JITC_GATHER_LANES": "1", "XLAKERN_JITC_GATHER_SKIPS": "2"},
                {"XLAKERN_JITC_GATHER_LANES": "8", "XLAKERN_JITC_GATHER_SKIPS": "2"},
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "1", "XLAKERN_JITC_GATHER_SKIPS": "2"},
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "4", "XLAKERN_JITC_GATHER_SKIPS": "2"},
                # the table's short end in a 512-thread block, the rest in global memory (predicated loads);
                # and the wide gather's (1,024 threads, the rest behind a branch), which long tables take
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "4", "XLAKERN_JITC_GATHER_SKIPS": "1"},
                {"XLAKERN_JITC_GATHER_LANES": "8", "XLAKERN_JITC_GATHER_SKIPS": "3"},
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "4", "XLAKERN_JITC_GATHER_SKIPS": "3"},
                # every table with two look-ups a draw (ExtSkip), as one without its ln(1 - p) takes
                {"XLAKERN_JITC_GATHER_LANES": "1", "XLAKERN_JITC_GATHER_SKIPS": "4"},
                {"XLAKERN_JITC_GATHER_LANES": "32", "XLAKERN_JITC_GATHER_ROUNDS": "4", "XLAKERN_JITC_GATHER_SKIPS": "4"})
SCATTER_KNOBS = (({},) + tuple({"XLAKERN_JITC_SCATTER_DRAWS": d} for d in ("32", "128", "512", "1024")) +
                 # a block per row, and 256 rows a block (a team walking many active rows in turn)
                 tuple({"XLAKERN_JITC_SCATTER_DRAWS": d, "XLAKERN_JITC_SCATTER_ROWS": r}
                       for d in ("32", "1024") for r in ("1", "256")))


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("shape,prob", JITC_GPU_CASES)
@pytest.mark.parametrize("x64", [False, True])
def test_jitc_gpu_scatter_and_gather_multiply_by_the_materialised_matrix(letter, shape, prob, x64, monkeypatch):
    """The warp-walked rows are the generator's: each product equals the matrix the CPU materialises
    (in float64 numpy), on every launch path (forced through the kernels' knobs)."""
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng()
    seed = int(rng.integers(0, 2**31))
    dtype = np.float64 if x64 else np.float32
    tol = dict(rtol=1e-11, atol=1e-11) if x64 else dict(rtol=1e-5, atol=1e-4)
    ws = tuple(dtype(a) for a in {"s": (-0.4,), "u": (-0.2, 0.7), "n": (0.1, 0.3)}[letter])
    with jax.enable_x64(x64):
        with jax.default_device(cpu):
            m = np.asarray(getattr(xlakern, "jit" + letter)(*ws, prob, seed, shape=shape))
        assert m.dtype == dtype
        with jax.default_device(gpu):
            np.testing.assert_array_equal(np.asarray(getattr(xlakern, "jit" + letter)(*ws, prob, seed, shape=shape)), m)
        nonempty = (m != 0).any(axis=1).mean()  # rows with a synapse: 1 - (1 - p)^gcols of them
        assert abs(nonempty - (1 - (1 - prob) ** shape[1])) < 0.1 and nonempty > 0, nonempty
        m = m.astype(np.float64)
        for transpose in (False, True):  # corder=True: M @ v gathers over generated rows, M.T @ v scatters
            n_in = shape[0] if transpose else shape[1]
            mat = m.T if transpose else m
            for batch in (None, 1, 37, 32):  # 32: the mm gather's whole chunks, loaded 16 spikes at once
                size = (n_in,) if batch is None else (n_in, batch)
                s = rng.random(size) < 0.3
                s[rng.integers(0, n_in)] = True  # at least one active spike (the short shapes)
                x = np.where(rng.random(size) < 0.3, rng.standard_normal(size), 0.0).astype(dtype)
                x[rng.integers(0, n_in)] = dtype(1.5)
                for binary, v in ((True, s), (False, x)):
                    want = mat @ v.astype(np.float64)
                    assert np.abs(want).max() > 0
                    name = ("binary_" if binary else "") + "jit" + letter + ("mv" if batch is None else "mm")
                    for knobs in (SCATTER_KNOBS if transpose else GATHER_KNOBS):
                        for var in KNOB_VARS:
                            monkeypatch.delenv(var, raising=False)
                        for var, value in knobs.items():
                            monkeypatch.setenv(var, value)
                        with jax.default_device(gpu):
                            y = getattr(xlakern, name)(*ws, prob, v, seed, shape=shape, transpose=transpose)
                            y = np.asarray(y)
                        assert y.dtype == dtype and y.shape == want.shape
                        np.testing.assert_allclose(y, want, **tol, err_msg=f"{name} transpose={transpose} "
                                                   f"batch={batch} {knobs}")
                    for var in KNOB_VARS:
                        monkeypatch.delenv(var, raising=False)


def test_jitc_gpu_mv_gather_too_long_for_int32_sums_takes_the_int64_walk(monkeypatch):
    """prob = 1e-6: a skip table of 22M entries. Four 32-lane rounds of its longest skips would pass
    2^31, so the mv gather with 4 rounds forced walks in int64 (the mm gather's kernel); one round
    stays in the int32 kernel, whose long skips read the table in global memory. Both equal the CPU."""
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng()
    seed, shape, prob = int(rng.integers(0, 2**31)), (64, 3_000_017), 1e-6  # ~3 synapses a row
    s = rng.random(shape[1]) < 0.5
    x = np.where(s, rng.standard_normal(shape[1]), 0.0).astype(np.float32)
    for name, v in (("binary_jitsmv", s), ("jitsmv", x)):
        with jax.default_device(cpu):
            want = np.asarray(getattr(xlakern, name)(0.3, prob, v, seed, shape=shape), np.float64)
        assert np.count_nonzero(want) > 16
        for rounds in ("1", "4"):
            monkeypatch.setenv("XLAKERN_JITC_GATHER_LANES", "32")
            monkeypatch.setenv("XLAKERN_JITC_GATHER_ROUNDS", rounds)
            with jax.default_device(gpu):
                got = np.asarray(getattr(xlakern, name)(0.3, prob, v, seed, shape=shape), np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} rounds={rounds}")


WIDE_KNOBS = ({}, {"XLAKERN_SPIKE_SUMMARY": "1"}, {"XLAKERN_JITC_GATHER_SKIPS": "1"},
              {"XLAKERN_JITC_GATHER_SKIPS": "2"}, {"XLAKERN_JITC_GATHER_SKIPS": "2", "XLAKERN_SPIKE_SUMMARY": "2"},
              {"XLAKERN_JITC_GATHER_SKIPS": "1", "XLAKERN_SPIKE_SUMMARY": "1"}, {"XLAKERN_JITC_GATHER_SKIPS": "3"},
              {"XLAKERN_JITC_GATHER_SKIPS": "3", "XLAKERN_SPIKE_SUMMARY": "1"}, {"XLAKERN_JITC_GATHER_SKIPS": "4"})


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("shape,prob,rate", [((300, 1_200_007), 2e-4, 0.05), ((200, 4_000_037), 2e-5, 0.01),
                                             ((300, 800_009), 1e-4, 0.01), ((150, 4_000_037), 2.5e-4, 0.01)])
def test_jitc_gpu_wide_binary_gather_matches_the_cpu(letter, shape, prob, rate, monkeypatch):
    """Binary spikes over more columns than shared memory holds as bits (1.2M, 4M): the mv gather reads
    them from global memory, behind their summary in shared memory. At 1.2M columns (~240 synapses a
    row) the table's short end serves most skips; at 4M (~80 a row, a 1.1M-entry table) it would miss
    most of them, so the gather decides skips in double precision (ExactSkip). At 800k columns the bits
    fit shared memory but leave the table little room, so ExactSkip is taken and its powers push the
    bits out to global memory. At 4M columns and ~1,000 synapses a row (an 89k-entry table) the wide
    gather (a 1,024-thread block an SM) holds half the table beside the summary, and its rare longer
    skips read the rest in global memory. Every path, forced through the knobs, equals the CPU's product
    (float32 sums, so to rounding)."""
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng()
    seed = int(rng.integers(0, 2**31))
    ws = {"s": (-0.4,), "u": (-0.2, 0.7), "n": (0.1, 0.3)}[letter]
    s = rng.random(shape[1]) < rate
    name = "binary_jit" + letter + "mv"
    with jax.default_device(cpu):
        want = np.asarray(getattr(xlakern, name)(*ws, prob, s, seed, shape=shape), np.float64)
    # a row of ~80 synapses at 1% meets an active spike with probability ~55%
    assert np.count_nonzero(want) > shape[0] // 4
    for knobs in WIDE_KNOBS:
        for var in KNOB_VARS + ("XLAKERN_SPIKE_SUMMARY",):
            monkeypatch.delenv(var, raising=False)
        for var, value in knobs.items():
            monkeypatch.setenv(var, value)
        with jax.default_device(gpu):
            got = np.asarray(getattr(xlakern, name)(*ws, prob, s, seed, shape=shape), np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(knobs))


@pytest.mark.parametrize("prob", [0.9, 0.3, 0.01, 2.5e-4, 2e-5, 1e-6])
def test_jitc_gpu_exact_skips_equal_the_tables(prob):
    """ExactSkip (the mv gather's skips from powers of 1 - p in double precision, kernels/jitc_cuda.cu)
    against the table it replaces, where a wrong margin or an off-by-one in h + 1 would show: the
    hashes at, just below and just above every threshold (a random 2M of them for the 22M-entry table
    of prob = 1e-6), the ends of the range, and a million random ones. Its fallback for draws too close
    to call (forced for every draw with fallback=True) must agree too."""
    from xlakern.event import _jitc_kernels as JK

    rng = np.random.default_rng()
    table = JK.skip_table(prob)
    n = table.size
    t = table.astype(np.int64)
    if n > 2_000_000:
        t = rng.choice(t, 2_000_000, replace=False)
    h = np.concatenate([t - 1, t, t + 1, [0, 1, 2**32 - 2, 2**32 - 1], rng.integers(0, 2**32, 1_000_000)])
    h = np.clip(h, 0, 2**32 - 1).astype(np.uint32)
    want = 1 + (n - np.searchsorted(table, h, side="right"))
    gpu = jax.devices("gpu")[0]
    with jax.default_device(gpu):
        for use_table in (False, True):
            got = JK.cuda_module().jitc_skips(jnp.asarray(table), jnp.asarray(h),
                                              outs=jax.ShapeDtypeStruct(h.shape, jnp.int32),
                                              log_keep=JK.log_keep(prob), fallback=use_table)
            got = np.asarray(got)
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, (use_table, h[bad[:5]], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("prob", [0.9, 0.5, 0.3, 0.05, 0.01, 2.5e-3, 1e-3, 2.5e-4, 1e-4, 8.47e-5, "random"])
def test_jitc_gpu_near_skips_equal_the_tables_for_every_hash(prob):
    """NearSkip (the mv gather's skip from one look-up, kernels/jitc_cuda.cuh) against the table, for
    every one of the 2^32 hashes: its rounding bound says the float estimate is within 0.1 of the
    table's count for tables up to 2^18 entries (prob >= 8.47e-5, the last case here), so an error in
    that bound, in the nearest integer or in the clamps at either end shows as a mismatch. "random" is a
    fresh log-uniform prob in that range."""
    from xlakern.event import _jitc_kernels as JK

    if prob == "random":
        prob = float(np.exp(np.random.default_rng().uniform(np.log(8.5e-5), np.log(0.99))))
    table = JK.skip_table(prob)
    assert 1 <= table.size <= 2**18, table.size
    ext = np.concatenate([[0], table, [2**32 - 1]]).astype(np.uint32)
    with jax.default_device(jax.devices("gpu")[0]):
        got = JK.cuda_module().jitc_near_skip_misses(jnp.asarray(ext), outs=jax.ShapeDtypeStruct((3,), jnp.uint32),
                                                      log_keep=JK.log_keep(prob), first=0, count=2**32)
    misses, least, any_missed = (int(v) for v in np.asarray(got))
    assert any_missed == 0 and misses == 0, (prob, table.size, misses, least)


def test_jitc_gpu_near_skip_check_finds_a_wrong_table():
    """The check above can fail: with one threshold of the table lowered to the next one down (T_k =
    T_{k+1}), the hashes from T_{k+1} up to about halfway to the old T_k count k - 1 in the table, while
    NearSkip's estimate rounds to k + 1 and reads T_{k+1}, which says k. The least of them is T_{k+1}."""
    from xlakern.event import _jitc_kernels as JK

    rng = np.random.default_rng()
    prob = 2.5e-4
    table = JK.skip_table(prob).copy()
    # among thresholds above 2^24, which are thousands apart (the low ones repeat: T_k = T_{k+1} already)
    i = int(rng.integers(np.searchsorted(table, 2**24) + 1, table.size - 1))
    table[i] = table[i - 1]
    ext = np.concatenate([[0], table, [2**32 - 1]]).astype(np.uint32)
    with jax.default_device(jax.devices("gpu")[0]):
        got = JK.cuda_module().jitc_near_skip_misses(jnp.asarray(ext), outs=jax.ShapeDtypeStruct((3,), jnp.uint32),
                                                      log_keep=JK.log_keep(prob), first=0, count=2**32)
    misses, least, any_missed = (int(v) for v in np.asarray(got))
    assert any_missed == 1 and misses >= 1 and least == int(table[i - 1]), (misses, least, int(table[i - 1]))
