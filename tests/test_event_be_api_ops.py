"""BrainEvent 0.3 functions added to xlakern.event: per-synapse dt2t products, indexed event
products, CSR row slices and index conversions, each against an independent NumPy reference."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import random_csr, random_fcn
from conftest import x64
from xlakern.event import _csr_tools as T
from xlakern.event import _dt2t as D

SHAPES = [(37, 23), (5, 64), (1, 1)]
DENSITIES = [0.0, 0.1, 0.6]


def _rows_of(indptr):
    return np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))


def _csc_of(dense):
    """CSC arrays of dense (indptr over columns, row indices ascending within a column)."""
    c, r = np.nonzero(dense.T)
    indptr = np.zeros(dense.shape[1] + 1, np.int64)
    np.cumsum(np.bincount(c, minlength=dense.shape[1]), out=indptr[1:])
    return dense[r, c], r, indptr


def _structures(rng):
    for shape, density in itertools.product(SHAPES, DENSITIES):
        yield shape, random_csr(rng, *shape, density)


# ----------------------------------------------------------------------------- dt2t, CSR and CSC

def _check_compressed_dt2t(rng, csc, mm, index_dtype):
    fn = {(False, False): D.csrmv_dt2t, (False, True): D.csrmm_dt2t,
          (True, False): D.cscmv_dt2t, (True, True): D.cscmm_dt2t}[(csc, mm)]
    for (shape, (dense, data, idx, ptr)), transpose in itertools.product(_structures(rng), [False, True]):
        if csc:
            data, idx, ptr = _csc_of(dense)
            rows, cols = idx, _rows_of(ptr)  # CSC: indices are rows, indptr walks columns
        else:
            rows, cols = _rows_of(ptr), idx
        read = cols if transpose else rows
        n = shape[1] if transpose else shape[0]
        for batch in ([1, 37, 70] if mm else [None]):  # 70: the CPU mm gather's two bit words
            lead = () if batch is None else (batch,)
            y = rng.standard_normal(lead + (n,))
            w = rng.standard_normal(lead + (len(idx),))
            call = jax.jit(lambda y, w, i, p: fn(y, w, i, p, shape=shape, transpose=transpose))
            out = call(y, w, jnp.asarray(idx, index_dtype), jnp.asarray(ptr, index_dtype))
            assert out.shape == w.shape and out.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(out), w * y[..., read], rtol=1e-14, atol=0,
                                       err_msg=f"{shape} transpose={transpose} batch={batch}")


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("mm", [False, True])
@pytest.mark.parametrize("csc", [False, True])
def test_compressed_dt2t_matches_numpy(rng, csc, mm, index_dtype):
    with x64():
        _check_compressed_dt2t(rng, csc, mm, index_dtype)


def test_csr_dt2t_grads_match_dense_formula(rng):
    with x64():
        dense, data, idx, ptr = random_csr(rng, 30, 17, 0.3)
        rows = _rows_of(ptr)
        for transpose in (False, True):
            read = idx if transpose else rows
            y = rng.standard_normal(17 if transpose else 30)
            w = rng.standard_normal(len(idx))
            c = rng.standard_normal(len(idx))
            loss = jax.jit(jax.grad(lambda y, w: jnp.sum(c * D.csrmv_dt2t(y, w, idx, ptr, shape=(30, 17),
                                                                          transpose=transpose)), argnums=(0, 1)))
            gy, gw = loss(y, w)
            expect_y = np.zeros_like(y)
            np.add.at(expect_y, read, c * w)
            np.testing.assert_allclose(np.asarray(gw), c * y[read], rtol=1e-13)
            np.testing.assert_allclose(np.asarray(gy), expect_y, rtol=1e-12, atol=1e-13)
            # forward mode and vmap over a batch of y
            ty = rng.standard_normal(y.shape)
            _, tangent = jax.jvp(lambda y: D.csrmv_dt2t(y, w, idx, ptr, shape=(30, 17), transpose=transpose),
                                 (y,), (ty,))
            np.testing.assert_allclose(np.asarray(tangent), w * ty[read], rtol=1e-13)
            ys = rng.standard_normal((4,) + y.shape)
            vm = jax.vmap(lambda y: D.csrmv_dt2t(y, w, idx, ptr, shape=(30, 17), transpose=transpose))(ys)
            np.testing.assert_allclose(np.asarray(vm), w * ys[:, read], rtol=1e-13)


def test_csr_dt2t_primitive_is_an_xla_custom_kernel():
    for op in (D.csrmv_dt2t_p, D.csrmm_dt2t_p):
        assert isinstance(op, xlakern.XLACustomKernel)
        assert op.available_backends("cpu") == ["cpp", "jnp"] and op.available_backends("gpu") == ["cuda", "jnp"]
        assert op.available_backends("tpu") == ["jnp"]


def _check_dt2t_rows_kernel(rng):
    """The row kernel (default backend) against NumPy and the jnp reference on rows long and short,
    runs of empty rows (the kernel's step-forward gives up and searches again), slots before the
    first row and after the last one (0), enough slots for many warps and CPU chunks, and half dtypes."""
    nrows = 3000
    lens = rng.integers(0, 40, nrows)
    lens[rng.random(nrows) < 0.5] = 0
    lens[100:400] = 0  # a long run of empty rows
    lens[7] = 5000  # one long row
    head, tail = 3, 5  # slots outside every row
    ptr = head + np.concatenate([[0], np.cumsum(lens)])
    nse = int(ptr[-1]) + tail
    rows = np.full(nse, -1)
    rows[head:nse - tail] = np.repeat(np.arange(nrows), lens)
    for dtype, tol in ((np.float64, 1e-15), (np.float32, 1e-6), (jnp.bfloat16, 1e-2), (np.float16, 1e-3)):
        for batch in (None, 3):
            lead = () if batch is None else (batch,)
            y = rng.standard_normal(lead + (nrows,)).astype(dtype)
            w = rng.standard_normal(lead + (nse,)).astype(dtype)
            expect = np.where(rows >= 0, np.asarray(w, np.float64) * np.asarray(y, np.float64)[..., rows], 0.0)
            fn = D.csrmv_dt2t if batch is None else D.csrmm_dt2t
            with x64():
                for backend in (None, "jnp"):
                    out = fn(y, w, jnp.zeros(nse, jnp.int32), jnp.asarray(ptr, jnp.int32), shape=(nrows, 4),
                             backend=backend)
                    assert out.dtype == w.dtype and out.shape == w.shape
                    np.testing.assert_allclose(np.asarray(out, np.float64), expect, rtol=tol, atol=tol,
                                               err_msg=f"{dtype} batch={batch} backend={backend}")


def test_csr_dt2t_rows_kernel(rng):
    _check_dt2t_rows_kernel(rng)


def _numpy_slot_rows(ptr, nse):
    """Each slot's row as the reference counts it: row starts (clipped into [0, nse]) at or before it, less one."""
    return np.searchsorted(np.sort(np.clip(ptr, 0, nse)), np.arange(nse), side="right") - 1


def _slot_rows_cases(rng):
    """(indptr, nse): rows long and short, runs of empty rows, slots before the first row and after the
    last, enough slots for several CPU chunks and many warps; no rows; no slots; one slot."""
    lens = rng.integers(0, 120, 3000)
    lens[rng.random(lens.size) < 0.4] = 0
    lens[500:900] = 0
    lens[11] = 20_000
    ptr = 7 + np.concatenate([[0], np.cumsum(lens)])
    yield ptr, int(ptr[-1]) + 9
    yield np.concatenate([[0], np.cumsum(rng.integers(1, 5, 40))]), None  # nse = ptr[-1]
    # rows of 6-11 slots: a GPU warp's 256 slots cross about 32 row starts, some windows more, some fewer
    yield np.concatenate([[0], np.cumsum(rng.integers(6, 12, 5000))]), None
    # rows of one length (the GPU's first guess of a warp's row is right, or one off after the offset
    # of 3 slots before the first row), then lengths around 80 with every 50th row empty
    yield 3 + np.arange(0, 80 * 4000 + 1, 80), None
    lens = rng.integers(70, 91, 4000)
    lens[::50] = 0
    yield np.concatenate([[0], np.cumsum(lens)]), None
    yield np.array([3]), 10  # no rows: every slot lies before the first one
    yield np.array([0, 0, 0]), 0
    yield np.array([-4, 0, 1]), 1


def _check_slot_rows(rng, exact_when_malformed):
    """csr_slot_rows (the default backend, and jnp) against NumPy for both index dtypes and both output
    dtypes; then on malformed indptrs (shuffled, out of range): exact, or at least rows in [-1, rows]."""
    from xlakern.event import _kernels as K

    with x64():
        for ptr, nse in _slot_rows_cases(rng):
            nse = int(ptr[-1]) if nse is None else nse
            for index_dtype, out_dtype in ((np.int32, np.int32), (np.int64, np.int32), (np.int64, np.int64)):
                for backend in (None, "jnp"):
                    got = K.slot_rows_p(jnp.asarray(ptr, index_dtype), outs=[K.SDS((nse,), out_dtype)],
                                        backend=backend)[0]
                    assert got.dtype == out_dtype
                    np.testing.assert_array_equal(got, _numpy_slot_rows(ptr, nse),
                                                  err_msg=f"{index_dtype.__name__} -> {out_dtype.__name__}, {backend}")
            nrows = ptr.size - 1
            rows, inside = K.slot_rows(jnp.zeros(nse, jnp.int32), jnp.asarray(ptr, jnp.int32), nrows)
            want = _numpy_slot_rows(ptr, nse)
            np.testing.assert_array_equal(inside, (want >= 0) & (want < nrows))
            np.testing.assert_array_equal(np.asarray(rows)[want >= 0], np.clip(want, 0, max(nrows - 1, 0))[want >= 0])
        for _ in range(6):
            nrows, nse = int(rng.integers(1, 300)), int(rng.integers(1, 5000))
            ptr = rng.integers(-20, nse + 20, nrows + 1)
            got = np.asarray(K.slot_rows_p(jnp.asarray(ptr, jnp.int32), outs=[K.SDS((nse,), jnp.int32)])[0])
            if exact_when_malformed:
                np.testing.assert_array_equal(got, _numpy_slot_rows(ptr, nse))
            else:
                assert got.min() >= -1 and got.max() <= nrows


def test_slot_rows_kernel_matches_numpy(rng, on_cpu):
    from xlakern.event import _kernels as K

    _check_slot_rows(rng, exact_when_malformed=True)  # the C++ kernel counts a malformed indptr exactly
    # a direct call with operands the wrapper never passes fails as an error, not a crash
    for ptr, out, msg in ((jnp.zeros(3, jnp.float32), jnp.int32, "int32 or int64, got float32"),
                          (jnp.zeros(3, jnp.int32), jnp.float32, "one int32 row a slot"),
                          (jnp.zeros((2, 2), jnp.int32), jnp.int32, "rows \\+ 1 offsets")):
        with pytest.raises(Exception, match=msg):
            jax.block_until_ready(K.slot_rows_p(ptr, outs=[K.SDS((4,), out)])[0])


def test_malformed_structure_reads_nothing_out_of_bounds(rng):
    data, idx = jnp.ones(4), jnp.array([0, 7, 2, -1], jnp.int32)
    ptr = jnp.array([0, 2, 3], jnp.int32)  # the last synapse is in no row
    y_rows, y_cols = jnp.array([2.0, 3.0]), jnp.arange(1.0, 5.0)
    np.testing.assert_array_equal(D.csrmv_dt2t(y_rows, data, idx, ptr, shape=(2, 4)), [2, 2, 3, 0])
    np.testing.assert_array_equal(D.csrmv_dt2t(y_cols, data, idx, ptr, shape=(2, 4), transpose=True), [1, 0, 3, 0])


# ----------------------------------------------------------------------------- dt2t, fixed count

@pytest.mark.parametrize("mm", [False, True])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_fcn_dt2t_matches_numpy(rng, mm, index_dtype):
    fn = D.fcnmm_dt2t if mm else D.fcnmv_dt2t
    with x64():
        for (rows, cols), k, transpose, shared in itertools.product(
                [(37, 23), (5, 64), (1, 1)], [0, 1, 3], [False, True], [False, True]):
            k = min(k, cols)
            _, _, idx = random_fcn(rng, rows, cols, k)
            n = cols if transpose else rows
            for batch in ([1, 37, 70] if mm else [None]):  # 70: the CPU mm gather's two bit words
                lead = () if batch is None else (batch,)
                y = rng.standard_normal(lead + (n,))
                w = rng.standard_normal((1,)) if shared else rng.standard_normal(lead + idx.shape)
                read = idx if transpose else np.broadcast_to(np.arange(rows)[:, None], idx.shape)
                out = jax.jit(lambda w, i, y: fn(w, i, y, shape=(rows, cols), transpose=transpose))(
                    w, jnp.asarray(idx, index_dtype), y)
                expect = (w[0] if shared else w) * y[..., read]
                assert out.shape == lead + idx.shape
                np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-14, atol=0)


def test_fcn_dt2t_grad(rng):
    with x64():
        _, _, idx = random_fcn(rng, 12, 9, 4)
        w, y, c = rng.standard_normal(idx.shape), rng.standard_normal(9), rng.standard_normal(idx.shape)
        gw, gy = jax.grad(lambda w, y: jnp.sum(c * D.fcnmv_dt2t(w, idx, y, shape=(12, 9), transpose=True)),
                          argnums=(0, 1))(w, y)
        expect_y = np.zeros(9)
        np.add.at(expect_y, idx, c * w)
        np.testing.assert_allclose(np.asarray(gw), c * y[idx], rtol=1e-13)
        np.testing.assert_allclose(np.asarray(gy), expect_y, rtol=1e-12)


# ----------------------------------------------------------------------------- dt2t, JITC

JITC = [("s", D.jitsmv_dt2t, (0.7,)), ("u", D.jitumv_dt2t, (-0.5, 1.5)), ("n", D.jitnmv_dt2t, (0.2, 1.3))]


def _jitc_dense(letter, params, prob, seed, shape, corder):
    fn = {"s": xlakern.jits, "u": xlakern.jitu, "n": xlakern.jitn}[letter]
    return np.asarray(fn(*params, prob, seed, shape=shape, corder=corder))


@pytest.mark.parametrize("letter,fn,params", JITC)
def test_jitc_dt2t_matches_the_materialised_matrix(rng, letter, fn, params):
    with x64():
        for shape, prob, corder, transpose in itertools.product([(40, 27), (3, 90)], [0.05, 0.4], [True, False],
                                                                [False, True]):
            seed = int(rng.integers(0, 2 ** 31))
            # the structure from another weight kind, never zero: (1, 2] uniform weights
            mask = _jitc_dense("u", (1.0, 2.0), prob, seed, shape, corder) != 0
            r, c = np.nonzero(mask)
            weights = _jitc_dense(letter, params, prob, seed, shape, corder)[r, c]
            y = rng.standard_normal(shape[1] if transpose else shape[0])
            out = jax.jit(lambda y: fn(*params, prob, y, seed, shape=shape, transpose=transpose, corder=corder))(y)
            assert out.shape == (mask.sum(),)
            np.testing.assert_allclose(np.asarray(out), weights * y[c if transpose else r], rtol=1e-14, atol=0)


def test_jitc_dt2t_keeps_zero_weight_synapses_and_empty_cases(rng):
    seed = int(rng.integers(0, 2 ** 31))
    y = jnp.asarray(rng.standard_normal(30), jnp.float32)
    nnz = int((np.asarray(xlakern.jits(1.0, 0.2, seed, shape=(30, 20))) != 0).sum())
    zero = D.jitsmv_dt2t(0.0, 0.2, y, seed, shape=(30, 20))
    assert zero.shape == (nnz,) and not np.any(np.asarray(zero))
    assert D.jitumv_dt2t(0.0, 1.0, 0.0, y, seed, shape=(30, 20)).shape == (0,)


def test_jitc_dt2t_grad_wrt_y(rng):
    with x64():
        seed = int(rng.integers(0, 2 ** 31))
        dense = _jitc_dense("n", (0.0, 1.0), 0.3, seed, (15, 11), True)
        r, c = np.nonzero(_jitc_dense("s", (1.0,), 0.3, seed, (15, 11), True))
        coef = rng.standard_normal(len(r))
        g = jax.grad(lambda y: jnp.sum(coef * D.jitnmv_dt2t(0.0, 1.0, 0.3, y, seed, shape=(15, 11),
                                                             transpose=True)))(rng.standard_normal(11))
        expect = np.zeros(11)
        np.add.at(expect, c, coef * dense[r, c])
        np.testing.assert_allclose(np.asarray(g), expect, rtol=1e-12, atol=1e-14)


def test_jitc_dt2t_traced_seed_raises():
    y = jnp.ones(10)
    with pytest.raises(xlakern.event.EventShapeError, match="seed"):
        jax.jit(lambda s: D.jitsmv_dt2t(0.5, 0.1, y, s, shape=(10, 10)))(3)


# ----------------------------------------------------------------------------- units

def test_units_multiply():
    u = pytest.importorskip("brainunit")
    data, idx, ptr = jnp.array([0.5, 2.0, 1.0]), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
    y = jnp.array([3.0, 4.0])
    out = D.csrmv_dt2t(y * u.mV, data * u.nS, idx, ptr, shape=(2, 3))
    assert u.get_unit(out) == u.get_unit(u.mV * u.nS)
    np.testing.assert_allclose(u.get_mantissa(out.to(u.mV * u.nS)), [1.5, 6.0, 4.0])
    perm = jnp.array([2, 0, 1])
    spikes = jnp.array([True, True])
    got = T.binary_csrmv_indexed(data * u.nS, idx, ptr, perm, spikes, shape=(2, 3), transpose=True)
    assert u.get_unit(got) == u.get_unit(u.nS)
    np.testing.assert_allclose(u.get_mantissa(got.to(u.nS)), [1.0, 2.0, 0.5])  # data[perm] = [1, .5, 2]


# ----------------------------------------------------------------------------- indexed event products

def _check_indexed(rng, mm, index_dtype, use_primitive):
    for (shape, (dense, data, idx, ptr)), transpose, shared, weighted in itertools.product(
            _structures(rng), [False, True], [False, True], [False, True]):
        perm = rng.permutation(len(idx))
        canonical = np.empty_like(data)
        canonical[perm] = data  # so that canonical[perm] is the CSR order
        weights = rng.standard_normal(1) if shared else canonical
        mat = (dense != 0) * weights[0] if shared else dense
        n = shape[0] if transpose else shape[1]
        for batch in ([1, 37, 70] if mm else [None]):  # 70: the CPU mm gather's two bit words
            lead = (n,) if batch is None else (n, batch)
            v = np.where(rng.random(lead) < 0.4, rng.standard_normal(lead), 0.0)
            factor = v if weighted else (v != 0).astype(float)
            expect = (mat.T if transpose else mat) @ factor
            args = (weights, jnp.asarray(idx, index_dtype), jnp.asarray(ptr, index_dtype),
                    jnp.asarray(perm, index_dtype), v)
            if use_primitive:  # weighted products are the float primitives of the same family
                op = (T.binary_csrmm_indexed_p if mm else T.binary_csrmv_indexed_p) if not weighted else \
                    xlakern.event._kernels.CSR_INDEXED_OPS.ops[(False, mm)]
                out = jax.jit(lambda *a: op(*a, outs=[jax.ShapeDtypeStruct(expect.shape, jnp.float64)], shape=shape,
                                            transpose=transpose)[0])(*args)
            else:
                fn = T.binary_csrmm_indexed if mm else T.binary_csrmv_indexed
                out = jax.jit(lambda *a: fn(*a, shape=shape, workspace=None, transpose=transpose,
                                            weighted=weighted))(*args)
            np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{shape} transpose={transpose} shared={shared}")


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("mm", [False, True])
def test_indexed_products_match_numpy(rng, on_cpu, mm, index_dtype):
    with x64():
        _check_indexed(rng, mm, index_dtype, use_primitive=False)


@pytest.mark.parametrize("mm", [False, True])
def test_indexed_primitives_match_numpy(rng, on_cpu, mm):
    with x64():
        _check_indexed(rng, mm, np.int32, use_primitive=True)


def test_indexed_primitive_grad_wrt_data(rng, on_cpu):
    with x64():
        dense, data, idx, ptr = random_csr(rng, 20, 14, 0.3)
        perm = rng.permutation(len(idx))
        v = (rng.random(20) < 0.5).astype(np.float64)
        c = rng.standard_normal(14)

        def loss(d):
            out = T.binary_csrmv_indexed_p(d, idx, ptr, perm, v, outs=[jax.ShapeDtypeStruct((14,), jnp.float64)],
                                           shape=(20, 14), transpose=True)[0]
            return jnp.sum(c * out)

        g = jax.grad(loss)(rng.standard_normal(len(idx)))
        per_slot = v[_rows_of(ptr)] * c[idx]  # d loss / d (slot j's weight)
        expect = np.zeros(len(idx))
        expect[perm] = per_slot
        np.testing.assert_allclose(np.asarray(g), expect, rtol=1e-12, atol=1e-14)


def _check_indexed_transforms(rng):
    """grad in data and in float spikes, vmap over spikes, and out-of-range perm entries (weight 0)."""
    dense, data, idx, ptr = random_csr(rng, 30, 17, 0.3)
    nse = len(idx)
    perm = rng.permutation(nse)
    perm[rng.random(nse) < 0.1] = nse + 3  # outside data: these slots weigh 0
    perm[0] = -1
    w = rng.standard_normal(nse)
    slot_w = np.where((perm >= 0) & (perm < nse), w[np.clip(perm, 0, nse - 1)], 0.0)
    rows = _rows_of(ptr)
    mat = np.zeros((30, 17))
    np.add.at(mat, (rows, idx), slot_w)
    for transpose in (False, True):
        n_in, n_out = (30, 17) if transpose else (17, 30)
        m = mat.T if transpose else mat
        v = np.where(rng.random(n_in) < 0.5, rng.standard_normal(n_in), 0.0)
        c = rng.standard_normal(n_out)
        for weighted in (False, True):
            f = v if weighted else (v != 0).astype(float)
            for backend in (None, "jnp"):  # the kernel and the reference backend
                out = T.binary_csrmv_indexed(w, idx, ptr, perm, v, shape=(30, 17), transpose=transpose,
                                             weighted=weighted, backend=backend)
                np.testing.assert_allclose(np.asarray(out), m @ f, rtol=1e-12, atol=1e-12)
            g = jax.grad(lambda d: jnp.sum(c * T.binary_csrmv_indexed(d, idx, ptr, perm, v, shape=(30, 17),
                                                                      transpose=transpose, weighted=weighted)))(w)
            src, dst = (rows, idx) if transpose else (idx, rows)
            per_slot = c[dst] * f[src]
            ok = (perm >= 0) & (perm < nse)
            expect = np.zeros(nse)
            np.add.at(expect, perm[ok], per_slot[ok])
            np.testing.assert_allclose(np.asarray(g), expect, rtol=1e-12, atol=1e-12)
        gv = jax.grad(lambda x: jnp.sum(c * T.binary_csrmv_indexed(w, idx, ptr, perm, x, shape=(30, 17),
                                                                   transpose=transpose, weighted=True)))(v)
        np.testing.assert_allclose(np.asarray(gv), m.T @ c, rtol=1e-12, atol=1e-12)
        batch = np.where(rng.random((5, n_in)) < 0.3, 1.0, 0.0)
        out = jax.vmap(lambda s: T.binary_csrmv_indexed(w, idx, ptr, perm, s, shape=(30, 17),
                                                        transpose=transpose))(batch)
        np.testing.assert_allclose(np.asarray(out), batch @ m.T, rtol=1e-12, atol=1e-12)


def test_indexed_products_grad_vmap_and_bad_perm(rng, on_cpu):
    with x64():
        _check_indexed_transforms(rng)


# ----------------------------------------------------------------------------- csr_slice_rows

def _slice_reference(dense, rows):
    m = dense.shape[0]
    return np.stack([dense[r] if 0 <= r < m else np.zeros(dense.shape[1]) for r in rows]).reshape(len(rows), -1)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_csr_slice_rows_matches_numpy(rng, index_dtype):
    with x64():
        for shape, (dense, data, idx, ptr) in _structures(rng):
            m = shape[0]
            rows = rng.integers(-2, m + 2, size=int(rng.integers(1, 12)))
            rows[0] = rng.integers(0, m)  # at least one real row
            rows = np.concatenate([rows, rows[:1]])  # and a repeat
            call = jax.jit(lambda d, i, p, r: T.csr_slice_rows(d, i, p, r, shape=shape))
            out = call(data, jnp.asarray(idx, index_dtype), jnp.asarray(ptr, index_dtype), jnp.asarray(rows, index_dtype))
            np.testing.assert_allclose(np.asarray(out), _slice_reference(dense, rows), rtol=0, atol=0)
            one = T.csr_slice_rows(data, idx, ptr, int(rows[0]), shape=shape)
            np.testing.assert_array_equal(np.asarray(one), dense[rows[0]])
            shared = T.csr_slice_rows(jnp.array([2.5]), idx, ptr, rows, shape=shape)
            np.testing.assert_array_equal(np.asarray(shared), _slice_reference(2.5 * (dense != 0), rows))


def test_csr_slice_rows_sums_repeated_columns_and_vmaps(rng):
    data, idx, ptr = jnp.array([1.0, 2.0, 4.0]), jnp.array([1, 1, 0]), jnp.array([0, 2, 3])
    np.testing.assert_array_equal(T.csr_slice_rows(data, idx, ptr, jnp.array([0, 1]), shape=(2, 3)),
                                  [[0, 3, 0], [4, 0, 0]])
    with x64():
        dense, data, idx, ptr = random_csr(rng, 25, 13, 0.3)
        batch = rng.integers(0, 25, size=(6, 4))
        out = jax.vmap(lambda r: T.csr_slice_rows(data, idx, ptr, r, shape=(25, 13)))(batch)
        np.testing.assert_array_equal(np.asarray(out), dense[batch])


def _check_slice_kernel_against_reference(rng):
    """The kernel (default backend) and the jnp reference agree, for repeated and out-of-range columns,
    rows outside the matrix (an int64 row past 2^32 must not wrap onto a real one) and half weights."""
    m, n, nse = 40, 23, 300
    idx = rng.integers(-2, n + 2, nse).astype(np.int32)
    ptr = np.sort(rng.integers(0, nse + 1, m + 1)).astype(np.int32)
    ptr[0], ptr[-1] = 0, nse
    rows = np.array([0, 5, 5, -1, m, 2**32 + 5, int(rng.integers(0, m))], np.int64)
    dense = np.zeros((m, n))
    syn_rows = _rows_of(ptr)
    ok = (idx >= 0) & (idx < n)
    for dtype in (np.float32, np.float16, np.float64):
        data = rng.standard_normal(nse).astype(dtype)
        dense[:] = 0
        np.add.at(dense, (syn_rows[ok], idx[ok]), data[ok].astype(np.float64))
        with x64():
            outs = [T.csr_slice_rows(data, idx, ptr, rows, shape=(m, n), backend=b) for b in (None, "jnp")]
        expect = _slice_reference(dense, [r if r < m else -1 for r in rows])
        for out in outs:
            assert out.dtype == dtype
            tol = 1e-2 if dtype == np.float16 else 1e-5
            np.testing.assert_allclose(np.asarray(out, np.float64), expect, rtol=tol, atol=tol)


def test_csr_slice_rows_kernel_matches_reference(rng):
    _check_slice_kernel_against_reference(rng)


def test_csr_slice_rows_grad_wrt_data(rng):
    with x64():
        for shared in (False, True):
            dense, data, idx, ptr = random_csr(rng, 18, 11, 0.35)
            rows = np.array([3, -1, 3, 17, 40, int(rng.integers(0, 18))])
            c = rng.standard_normal((len(rows), 11))
            d0 = rng.standard_normal(1) if shared else data
            g = jax.jit(jax.grad(lambda d: jnp.sum(c * T.csr_slice_rows(d, idx, ptr, rows, shape=(18, 11)))))(d0)
            syn_rows = _rows_of(ptr)
            per_syn = np.array([sum(c[k, idx[j]] for k, r in enumerate(rows) if r == syn_rows[j])
                                for j in range(len(idx))])
            expect = per_syn.sum(keepdims=True) if shared else per_syn
            np.testing.assert_allclose(np.asarray(g), expect, rtol=1e-12, atol=1e-13)


# ----------------------------------------------------------------------------- index conversions

@pytest.mark.parametrize("as_jax", [False, True])
def test_index_conversions_match_numpy(rng, as_jax):
    conv = jnp.asarray if as_jax else np.asarray
    for shape, density in itertools.product([(37, 23), (5, 64), (1, 1)], DENSITIES):
        dense = np.where(rng.random(shape) < density, rng.random(shape) + 1.0, 0.0)  # distinct, non-zero
        r, c = np.nonzero(dense)
        ptr = np.r_[0, np.cumsum(np.bincount(r, minlength=shape[0]))]
        data = dense[r, c]
        rows, cols = T.csr_to_coo_index(conv(ptr), conv(c))
        np.testing.assert_array_equal(np.asarray(rows), r)
        np.testing.assert_array_equal(np.asarray(cols), c)
        for method in ("coo", "numpy", "gpu_column_block"):
            cptr, crow, perm = T.csr_to_csc_index(conv(ptr), conv(c), shape=shape, method=method)
            assert isinstance(cptr, jax.Array) == as_jax and crow.dtype == np.int32
            ccol = np.repeat(np.arange(shape[1]), np.diff(np.asarray(cptr)))
            order = np.lexsort((r, c))  # column-major, rows ascending
            np.testing.assert_array_equal(crow, r[order])
            np.testing.assert_array_equal(ccol, c[order])
            np.testing.assert_array_equal(data[np.asarray(perm)], dense[crow, ccol])
            assert T.csr_to_csc_index(conv(ptr), conv(c), shape=shape, include_perm=False, method=method)[2] is None
        bptr, bidx, bperm = T.csc_to_csr_index(cptr, crow, shape=shape)
        np.testing.assert_array_equal(bptr, ptr)
        np.testing.assert_array_equal(bidx, c)
        np.testing.assert_array_equal(np.asarray(perm)[np.asarray(bperm)], np.arange(len(c)))
        # COO in a random order: grouping is stable, so each row keeps its shuffled order
        shuffle = rng.permutation(len(r))
        sr, sc = r[shuffle], c[shuffle]
        for fn, keys, others, n in ((T.coo2csr, sr, sc, shape[0]), (T.coo_to_csc_index, sc, sr, shape[1])):
            args = (sr, sc) if fn is T.coo2csr else (sr, sc)
            p, other, order = fn(*map(conv, args), shape=shape)
            expect_order = np.argsort(keys, kind="stable")
            np.testing.assert_array_equal(order, expect_order)
            np.testing.assert_array_equal(other, others[expect_order])
            np.testing.assert_array_equal(p, np.r_[0, np.cumsum(np.bincount(keys, minlength=n))])


def test_index_conversions_under_jit(rng):
    dense = rng.random((12, 9)) < 0.3
    r, c = np.nonzero(dense)
    shuffle = rng.permutation(len(r))
    p, cols, order = jax.jit(lambda a, b: T.coo2csr(a, b, shape=(12, 9)))(r[shuffle], c[shuffle])
    np.testing.assert_array_equal(p, np.r_[0, np.cumsum(np.bincount(r, minlength=12))])
    np.testing.assert_array_equal(np.asarray(r[shuffle])[np.asarray(order)], r)


# ----------------------------------------------------------------------------- bad inputs

def test_bad_inputs_name_the_argument():
    data, idx, ptr = jnp.ones(3), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
    cases = [
        (lambda: D.csrmv_dt2t(jnp.ones(2), data, idx.astype(jnp.float32), ptr, shape=(2, 3)), "indices"),
        (lambda: D.csrmv_dt2t(jnp.ones(3), data, idx, ptr, shape=(2, 3)), "y has shape"),
        (lambda: D.csrmv_dt2t(jnp.ones(2), jnp.ones(4), idx, ptr, shape=(2, 3)), "w has shape"),
        (lambda: D.cscmm_dt2t(jnp.ones((2, 2)), jnp.ones((2, 3)), idx, ptr, shape=(3, 2)), "y has shape"),
        (lambda: D.fcnmv_dt2t(jnp.ones((2, 2)), jnp.zeros((2, 2), jnp.int32), jnp.ones(5), shape=(2, 3),
                              transpose=True), "y has shape"),
        (lambda: D.jitsmv_dt2t(0.5, 0.1, jnp.ones(4), 1, shape=(3, 4)), "y has shape"),
        (lambda: T.binary_csrmv_indexed(data, idx, ptr, jnp.array([0.0, 1, 2]), jnp.ones(3, bool), shape=(2, 3)),
         "perm"),
        (lambda: T.binary_csrmv_indexed(data, idx, ptr, jnp.array([0, 1, 2]), jnp.ones(5, bool), shape=(2, 3)),
         "v has shape"),
        (lambda: T.csr_slice_rows(data, idx, ptr, jnp.array([0.0]), shape=(2, 3)), "row_indices"),
        (lambda: T.csr_slice_rows(data, idx, ptr.astype(jnp.float32), jnp.array([0]), shape=(2, 3)), "indptr"),
        (lambda: T.coo2csr(np.array([0, 5]), np.array([0, 1]), shape=(2, 3)), "row_ids"),
        (lambda: T.csr_to_csc_index(np.array([0, 2, 3]), np.array([0, 2, 1]), shape=(2, 3), method="x"), "method"),
    ]
    for call, needle in cases:
        with pytest.raises(xlakern.XlakernError, match=needle):
            call()


def test_conversions_name_an_argument_jax_cannot_read(rng):
    """None, a string, a float array or arrays of different lengths given to the index conversions and
    csr_slice_rows: an XlakernError naming the function and the argument (jax's or NumPy's own errors
    named neither). Lists of ints still convert as NumPy groups them."""
    import re

    from xlakern.event import EventDTypeError, EventShapeError

    ptr, idx = np.array([0, 2, 3]), np.array([0, 2, 1])
    data = jnp.asarray(rng.standard_normal(3), jnp.float32)
    cases = [
        (EventDTypeError, lambda: T.csr_to_coo_index(None, idx), "csr_to_coo_index: indptr is None"),
        (EventDTypeError, lambda: T.csr_to_coo_index(ptr, "0 2 1"), "csr_to_coo_index: indices is a str"),
        (EventDTypeError, lambda: T.csr_to_coo_index(ptr.astype(float), idx),
         "csr_to_coo_index: indptr has dtype float64; expected an integer array"),
        (EventDTypeError, lambda: T.csr_to_csc_index(None, idx, shape=(2, 3)), "csr_to_csc_index: csr_indptr is None"),
        (EventDTypeError, lambda: T.csc_to_csr_index(ptr, None, shape=(3, 2)), "csc_to_csr_index: csc_indices is None"),
        (EventDTypeError, lambda: T.coo2csr("rows", idx, shape=(2, 3)), "coo2csr: row_ids is a str ('rows')"),
        (EventShapeError, lambda: T.coo2csr(np.array([0, 1]), idx, shape=(2, 3)),
         "coo2csr: row_ids has shape (2,) and col_ids (3,)"),
        (EventShapeError, lambda: T.coo_to_csc_index(np.zeros((3, 1), int), idx, shape=(2, 3)),
         "coo_to_csc_index: pre_ids has shape (3, 1); expected a 1-D array"),
        (EventDTypeError, lambda: T.csr_slice_rows(data, idx, ptr, None, shape=(2, 3)),
         "csr_slice_rows: row_indices is None"),
    ]
    for error, call, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            call()
    r, c = rng.integers(0, 4, 20), rng.integers(0, 5, 20)
    p, cols, order = T.coo2csr(r.tolist(), c.tolist(), shape=(4, 5))
    np.testing.assert_array_equal(np.asarray(order), np.argsort(r, kind="stable"))
    np.testing.assert_array_equal(np.asarray(cols), c[np.argsort(r, kind="stable")])
    np.testing.assert_array_equal(np.asarray(p), np.r_[0, np.cumsum(np.bincount(r, minlength=4))])


# ----------------------------------------------------------------------------- the same on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("csc,mm", [(False, False), (True, True)])
def test_compressed_dt2t_gpu(rng, csc, mm):
    with jax.default_device(jax.devices("gpu")[0]), x64():
        _check_compressed_dt2t(rng, csc, mm, np.int32)
        if not csc:
            _check_dt2t_rows_kernel(rng)


@pytest.mark.gpu
def test_slot_rows_kernel_gpu(rng):
    with jax.default_device(jax.devices("gpu")[0]):
        _check_slot_rows(rng, exact_when_malformed=False)


@pytest.mark.gpu
@pytest.mark.parametrize("mm", [False, True])
def test_indexed_products_gpu(rng, mm):
    with jax.default_device(jax.devices("gpu")[0]), x64():
        _check_indexed(rng, mm, np.int32, use_primitive=False)
        _check_indexed(rng, mm, np.int32, use_primitive=True)
        if not mm:
            _check_indexed_transforms(rng)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["1", "2"])
def test_indexed_products_with_bad_perm_entries_gpu(rng, monkeypatch, kernel):
    """The GPU indexed products read each permuted weight at a chosen address, not behind a branch on its
    entry: entries outside [0, nse) (-1, nse + 3) must still weigh 0 in the mv and mm gathers (lane groups,
    1, and tiles, 2, forced), the scatters, and for bool and float32 0/1 spikes, against float64 NumPy."""
    monkeypatch.setenv("XLAKERN_MM_GATHER", kernel)
    dense, data, idx, ptr = random_csr(rng, 90, 70, 0.4)
    nse = len(idx)
    perm = rng.permutation(nse)
    perm[rng.random(nse) < 0.15] = nse + 3
    perm[rng.random(nse) < 0.05] = -1
    w = rng.standard_normal(nse)
    mat = np.zeros((90, 70))
    np.add.at(mat, (_rows_of(ptr), idx), np.where((perm >= 0) & (perm < nse), w[np.clip(perm, 0, nse - 1)], 0.0))
    with jax.default_device(jax.devices("gpu")[0]), x64():
        for transpose in (False, True):
            m = mat.T if transpose else mat
            n_in = m.shape[1]
            for batch in (None, 5, 16, 37):
                on = rng.random((n_in,) if batch is None else (n_in, batch)) < 0.4
                op = T.binary_csrmv_indexed if batch is None else T.binary_csrmm_indexed
                for spikes in (on, on.astype(np.float32)):
                    out = op(w, idx, ptr, perm, jnp.asarray(spikes), shape=(90, 70), transpose=transpose)
                    np.testing.assert_allclose(np.asarray(out, np.float64), m @ on.astype(np.float64), rtol=1e-12,
                                               atol=1e-12, err_msg=f"transpose={transpose} batch={batch} "
                                                                   f"{spikes.dtype}")


@pytest.mark.gpu
def test_csr_slice_rows_gpu(rng):
    with jax.default_device(jax.devices("gpu")[0]):
        test_csr_slice_rows_matches_numpy(rng, np.int32)
        test_csr_slice_rows_grad_wrt_data(rng)
        _check_slice_kernel_against_reference(rng)


def test_jitc_dt2t_walks_the_generator_without_the_dense_matrix(rng):
    # 100k x 100k: the dense matrix would be 40 GB; the synapses (about 10 a row) are 1M.
    shape, prob, seed = (100_000, 100_000), 1e-4, int(rng.integers(1 << 30))
    y = rng.standard_normal(shape[0]).astype(np.float32)
    got = np.asarray(D.jitumv_dt2t(0.5, 1.5, prob, y, seed, shape=shape), np.float64)
    rows, cols, _, _ = D.jitc_synapses(seed, prob, shape, True)
    n = shape[0] * shape[1] * prob
    assert abs(got.size - n) < 6 * np.sqrt(n) and got.size == rows.size
    assert np.all(np.diff(rows) >= 0) and np.all((np.diff(cols) > 0) | (np.diff(rows) > 0))
    # rows depend only on (seed, row, columns): the first 40 equal those of a 40-row matrix made dense
    small = np.asarray(xlakern.jitu(0.5, 1.5, prob, seed, shape=(40, shape[1])), np.float64)
    r, c = np.nonzero(small)
    head = rows < 40
    np.testing.assert_array_equal(rows[head], r)
    np.testing.assert_array_equal(cols[head], c)
    np.testing.assert_allclose(got[head], small[r, c] * y[r], rtol=1e-6)
