"""Event operators under jit / grad / vmap, layouts as pytrees, units, errors and the kernel cache."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import random_csr, random_fcn
from conftest import x64

pytestmark = pytest.mark.usefixtures("on_cpu")


def _dense_from(data, rows, cols, shape):
    """Differentiable dense matrix with data[p] at (rows[p], cols[p])."""
    return jnp.zeros(shape, data.dtype).at[rows, cols].add(data)


def _csr_case(rng, m=23, n=17, density=0.3):
    dense, data, idx, ptr = random_csr(rng, m, n, density)
    rows = np.repeat(np.arange(m), np.diff(ptr))
    return dense, jnp.asarray(data), jnp.asarray(idx), jnp.asarray(ptr), rows


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
def test_grad_wrt_weights_matches_dense(rng, binary, transpose):
    with x64():
        dense, data, idx, ptr, rows = _csr_case(rng)
        m, n = dense.shape
        s = np.where(rng.random(m if transpose else n) < 0.4, rng.standard_normal(m if transpose else n), 0.0)
        c = rng.standard_normal(n if transpose else m)
        f = (s != 0).astype(float) if binary else s
        op = xlakern.binary_csrmv if binary else xlakern.csrmv

        def sparse_loss(d):
            return jnp.dot(c, op(d, idx, ptr, s, shape=(m, n), transpose=transpose))

        def dense_loss(d):
            D = _dense_from(d, rows, np.asarray(idx), (m, n))
            return jnp.dot(c, (D.T if transpose else D) @ f)

        np.testing.assert_allclose(jax.grad(sparse_loss)(data), jax.grad(dense_loss)(data), rtol=1e-10, atol=1e-12)
        # homogeneous weight: the gradient is the sum over synapses
        g = jax.grad(sparse_loss)(jnp.asarray([0.7]))
        np.testing.assert_allclose(g, [jax.grad(dense_loss)(jnp.full(data.shape, 0.7)).sum()], rtol=1e-10)
        # forward mode agrees too
        t = jnp.asarray(rng.standard_normal(data.shape))
        np.testing.assert_allclose(jax.jvp(sparse_loss, (data,), (t,))[1], jax.jvp(dense_loss, (data,), (t,))[1],
                                   rtol=1e-10)


def _row_col_geometries(rng):
    """(rows, cols, indptr or None, nconn, each slot's row or -1): small CSR rows with slots before the
    first row and after the last; CSR rows long enough for several CPU chunks, with a run of empty rows
    (chunks start inside rows, the walk searches again); fixed-count rows of 7 (chunk edges inside rows)."""
    for m, n, maxlen, head, tail in ((41, 29, 12, 2, 3), (3000, 500, 40, 3, 5)):
        lens = rng.integers(0, maxlen, m)
        lens[rng.random(m) < 0.3] = 0
        if m > 100:
            lens[100:400] = 0
        ptr = head + np.concatenate([[0], np.cumsum(lens)])
        nse = int(ptr[-1]) + tail
        rows = np.full(nse, -1)
        rows[head:nse - tail] = np.repeat(np.arange(m), lens)
        yield m, n, ptr, -1, rows
    m, n, k = 9001, 300, 7
    yield m, n, None, k, np.repeat(np.arange(m), k)


def _check_row_col_kernel(rng):
    """The CSR weight gradient's kernel (csr_row_col_product) against NumPy and its jnp form: slots
    before the first row and after the last, columns out of range, rows whose factor is zero (skipped),
    CSR and fixed-count rows over several CPU chunks, batch 1 and 5, int32 and int64, float32 and
    float64; and its own gradient (higher-order grads)."""
    from xlakern.event import _kernels as K

    for m, n, ptr, nconn, rows in _row_col_geometries(rng):
        nse = rows.size
        idx = rng.integers(-2, n + 2, nse)
        ok = (rows >= 0) & (idx >= 0) & (idx < n)
        for dtype, itype, batch in ((np.float64, np.int64, 1), (np.float32, np.int32, 5), (np.float64, np.int32, 5),
                                    (np.float32, np.int32, 1)):
            a = rng.standard_normal((m, batch)) * (rng.random((m, 1)) < 0.5)  # half the rows silent
            b = rng.standard_normal((n, batch))
            expect = np.where(ok, (a[np.clip(rows, 0, m - 1)] * b[np.clip(idx, 0, n - 1)]).sum(1), 0.0)
            tol = 1e-12 if dtype == np.float64 else 1e-5
            with x64():
                args = (jnp.asarray(a, dtype), jnp.asarray(b, dtype), jnp.asarray(idx, itype),
                        jnp.asarray(np.zeros(1) if ptr is None else ptr, itype))
                for backend in (None, "jnp"):
                    out = K.row_col_p(*args, outs=[jax.ShapeDtypeStruct((nse,), dtype)], backend=backend,
                                      shape=(m, n), nconn=nconn)[0]
                    np.testing.assert_allclose(np.asarray(out), expect, rtol=tol, atol=tol,
                                               err_msg=f"{m}x{n} nconn={nconn} {dtype} batch={batch} {backend}")
                if dtype == np.float64 and m < 100:
                    c = rng.standard_normal(nse)
                    ga = jax.grad(lambda x: jnp.sum(c * K.row_col_p(x, *args[1:], outs=[jax.ShapeDtypeStruct(
                        (nse,), dtype)], shape=(m, n), nconn=nconn)[0]))(args[0])
                    expect_a = np.zeros((m, batch))
                    np.add.at(expect_a, rows[ok], c[ok, None] * b[idx[ok]])
                    np.testing.assert_allclose(np.asarray(ga), expect_a, rtol=1e-12, atol=1e-12)


def test_weight_gradient_kernel(rng):
    _check_row_col_kernel(rng)


def _check_fcn_weight_gradients(rng):
    """Fixed-count weight gradients (the kernel sees rows K apart) against jax's gradient of the dense
    product: binary and float, mv and mm, both orientations, per-synapse and shared weights, and the
    jnp backend."""
    m, n, k = 23, 17, 4
    with x64():
        dense, w, idx = random_fcn(rng, m, n, k)
        rows = np.repeat(np.arange(m), k)
        for binary, transpose, batch, backend in [(True, True, None, None), (False, False, None, None),
                                                  (True, False, 3, None), (False, True, 3, "jnp")]:
            n_in = m if transpose else n
            lead = (n_in,) if batch is None else (n_in, batch)
            v = np.where(rng.random(lead) < 0.4, rng.standard_normal(lead), 0.0)
            f = (v != 0).astype(float) if binary else v
            c = rng.standard_normal(((n if transpose else m),) + lead[1:])
            op = {(True, None): xlakern.binary_fcnmv, (False, None): xlakern.fcnmv,
                  (True, 3): xlakern.binary_fcnmm, (False, 3): xlakern.fcnmm}[(binary, batch)]

            def sparse_loss(d):
                return jnp.sum(c * op(d, idx, v, shape=(m, n), transpose=transpose, backend=backend))

            def dense_loss(d):
                entries = jnp.broadcast_to(d.reshape(-1), rows.shape)
                D = jnp.zeros((m, n), d.dtype).at[rows, idx.reshape(-1)].add(entries)
                return jnp.sum(c * ((D.T if transpose else D) @ f))

            np.testing.assert_allclose(jax.grad(sparse_loss)(jnp.asarray(w)), jax.grad(dense_loss)(jnp.asarray(w)),
                                       rtol=1e-10, atol=1e-12, err_msg=f"{binary} {transpose} {batch}")
            shared = jnp.asarray([0.3])
            np.testing.assert_allclose(jax.grad(sparse_loss)(shared), jax.grad(dense_loss)(shared), rtol=1e-10)


def test_fcn_weight_gradients_match_dense(rng):
    _check_fcn_weight_gradients(rng)


@pytest.mark.gpu
def test_weight_gradient_kernel_gpu(rng):
    with jax.default_device(jax.devices("gpu")[0]):
        _check_row_col_kernel(rng)
        _check_fcn_weight_gradients(rng)
        test_grad_wrt_weights_matches_dense(rng, True, True)
        test_grad_wrt_weights_matches_dense(rng, False, False)
        test_mm_gradients(rng)


@pytest.mark.parametrize("family", ["csr", "fcn", "dense"])
@pytest.mark.parametrize("transpose", [False, True])
def test_spike_gradient_is_the_product_in_the_other_orientation(rng, family, transpose):
    """Float spikes: exact gradient; binary spikes: the surrogate (the same dense product)."""
    with x64():
        m, n = 19, 13
        if family == "csr":
            dense, data, idx, ptr = random_csr(rng, m, n, 0.4)
            ops = (lambda v: xlakern.binary_csrmv(data, idx, ptr, v, shape=(m, n), transpose=transpose),
                   lambda v: xlakern.csrmv(data, idx, ptr, v, shape=(m, n), transpose=transpose))
        elif family == "fcn":
            dense, w, idx = random_fcn(rng, m, n, 3)
            ops = (lambda v: xlakern.binary_fcnmv(w, idx, v, shape=(m, n), transpose=transpose),
                   lambda v: xlakern.fcnmv(w, idx, v, shape=(m, n), transpose=transpose))
        else:
            dense = rng.standard_normal((m, n))
            ops = (lambda v: xlakern.binary_densemv(dense, v, transpose=transpose),
                   lambda v: xlakern.binary_densemv(dense, v, transpose=transpose, weighted=True))
        s = np.where(rng.random(m if transpose else n) < 0.5, rng.uniform(0.5, 1.5, m if transpose else n), 0.0)
        c = rng.standard_normal(n if transpose else m)
        expect = (dense if transpose else dense.T) @ c
        for op in ops:
            g = jax.grad(lambda v: jnp.dot(c, op(v)))(jnp.asarray(s))
            np.testing.assert_allclose(g, expect, rtol=1e-10, atol=1e-12)


def test_mm_gradients(rng):
    with x64():
        dense, data, idx, ptr, rows = _csr_case(rng)
        m, n = dense.shape
        B = np.where(rng.random((n, 5)) < 0.3, rng.standard_normal((n, 5)), 0.0)
        C = rng.standard_normal((m, 5))

        def sparse_loss(d, b):
            return jnp.sum(C * xlakern.csrmm(d, idx, ptr, b, shape=(m, n)))

        def dense_loss(d, b):
            return jnp.sum(C * (_dense_from(d, rows, np.asarray(idx), (m, n)) @ b))

        for a, b in zip(jax.grad(sparse_loss, (0, 1))(data, B), jax.grad(dense_loss, (0, 1))(data, B)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _primitive_names(jaxpr):
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            names |= _primitive_names(sub)
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None:
                names |= _primitive_names(getattr(inner, "jaxpr", inner))
    return names


@pytest.mark.parametrize("batch", [1, 37])
def test_vmap_over_spikes_is_one_mm_launch(rng, batch):
    with x64():
        dense, data, idx, ptr, _ = _csr_case(rng)
        m, n = dense.shape
        S = rng.random((batch, m)) < 0.3
        f = lambda s: xlakern.binary_csrmv(data, idx, ptr, s, shape=(m, n), transpose=True)
        out = jax.vmap(f)(S)
        np.testing.assert_allclose(out, S.astype(float) @ dense, rtol=1e-10, atol=1e-12)
        names = _primitive_names(jax.make_jaxpr(jax.vmap(f))(S).jaxpr)
        assert "binary_csrmm" in names and "binary_csrmv" not in names
        # in_axes=1 and an mm op under vmap
        np.testing.assert_allclose(jax.vmap(f, in_axes=1)(S.T), S.astype(float) @ dense, rtol=1e-10, atol=1e-12)
        S3 = rng.random((3, m, 4)) < 0.3
        g = lambda s: xlakern.binary_csrmm(data, idx, ptr, s, shape=(m, n), transpose=True)
        np.testing.assert_allclose(jax.vmap(g)(S3), np.einsum("bmk,mn->bnk", S3.astype(float), dense),
                                   rtol=1e-10, atol=1e-12)
        w_fcn_dense, w, fidx = random_fcn(rng, m, n, 4)
        h = lambda s: xlakern.binary_fcnmv(w, fidx, s, shape=(m, n), transpose=True)
        np.testing.assert_allclose(jax.vmap(h)(S), S.astype(float) @ w_fcn_dense, rtol=1e-10, atol=1e-12)


def test_vmap_over_weights_and_grad_of_vmap(rng):
    with x64():
        dense, data, idx, ptr, rows = _csr_case(rng)
        m, n = dense.shape
        datas = jnp.stack([data, 2 * data, -data])
        s = rng.random(m) < 0.5
        out = jax.vmap(lambda d: xlakern.binary_csrmv(d, idx, ptr, s, shape=(m, n), transpose=True))(datas)
        np.testing.assert_allclose(out, np.stack([1, 2, -1])[:, None] * (s @ dense), rtol=1e-10, atol=1e-12)
        S = (rng.random((4, m)) < 0.5).astype(float)
        loss = lambda d: jnp.sum(jax.vmap(lambda v: xlakern.csrmv(d, idx, ptr, v, shape=(m, n), transpose=True))(S))
        dloss = lambda d: jnp.sum(S @ _dense_from(d, rows, np.asarray(idx), (m, n)))
        np.testing.assert_allclose(jax.grad(loss)(data), jax.grad(dloss)(data), rtol=1e-10)


def test_layouts_inside_jit_both_orientations_and_repeated_traces(rng):
    dense, data, idx, ptr = random_csr(rng, 30, 20, 0.3)
    idx32, ptr32 = idx.astype(np.int32), ptr.astype(np.int32)
    traces = []

    @jax.jit
    def step(d, i, p, pre, post):
        traces.append(1)
        W = xlakern.CSR((d, i, p), shape=(30, 20))  # built from traced arrays
        return xlakern.BinaryArray(pre) @ W, W @ xlakern.BinaryArray(post), W.T @ xlakern.BinaryArray(pre)

    for scale in (1.0, -2.0, 0.5):
        pre, post = rng.random(30) < 0.3, rng.random(20) < 0.3
        a, b, c = step(jnp.asarray(data * scale, jnp.float32), idx32, ptr32, pre, post)
        np.testing.assert_allclose(a, scale * (pre @ dense), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b, scale * (dense @ post), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(c, scale * (pre @ dense), rtol=1e-5, atol=1e-5)
    assert len(traces) == 1

    # one layout object: passed through jit as a pytree, then used eagerly the other way
    W = xlakern.CSR((jnp.asarray(data, jnp.float32), idx32, ptr32), shape=(30, 20))
    pre, post = rng.random(30) < 0.3, rng.random(20) < 0.3
    fwd = jax.jit(lambda W, s: xlakern.BinaryArray(s) @ W)
    np.testing.assert_allclose(fwd(W, pre), pre @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda s: xlakern.BinaryArray(s) @ W)(pre), pre @ dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(W @ xlakern.BinaryArray(post), dense @ post, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fwd(W.with_data(W.data * 3), pre), 3 * (pre @ dense), rtol=1e-5, atol=1e-5)
    # grad with respect to the layout itself
    g = jax.grad(lambda W: jnp.sum(xlakern.BinaryArray(pre) @ W), allow_int=True)(W)
    assert isinstance(g, xlakern.CSR) and g.shape == W.shape
    rows = np.repeat(np.arange(30), np.diff(ptr))
    np.testing.assert_allclose(g.data, pre[rows].astype(np.float32))


def test_fixed_count_layouts_and_transposes(rng):
    with x64():
        dense, w, idx = random_fcn(rng, 12, 9, 3)
        pre = xlakern.FixedNumPerPre((w, idx), shape=(12, 9))
        post = pre.T
        assert isinstance(post, xlakern.FixedNumPerPost) and post.shape == (9, 12)
        np.testing.assert_allclose(pre.todense(), dense)
        np.testing.assert_allclose(post.todense(), dense.T)
        s_pre, s_post = rng.random(12) < 0.5, rng.random(9) < 0.5
        np.testing.assert_allclose(xlakern.BinaryArray(s_pre) @ pre, s_pre @ dense, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pre @ xlakern.BinaryArray(s_post), dense @ s_post, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(xlakern.BinaryArray(s_post) @ post, s_post @ dense.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(post @ xlakern.BinaryArray(s_pre), dense.T @ s_pre, rtol=1e-12, atol=1e-12)
        S = rng.random((4, 12)) < 0.5
        np.testing.assert_allclose(xlakern.BinaryArray(S) @ pre, S @ dense, rtol=1e-12, atol=1e-12)
        X = rng.standard_normal((9, 3))
        np.testing.assert_allclose(pre @ X, dense @ X, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose((2 * pre).todense(), 2 * dense)
        np.testing.assert_allclose((pre / 4).todense(), dense / 4)
        np.testing.assert_allclose((-pre).todense(), -dense)
        assert pre.nse == 36 and pre.dtype == jnp.float64 and pre.num_conn == 3
        np.testing.assert_allclose(xlakern.FixedNumPerPre.fromdense(dense).todense(), dense)
        np.testing.assert_allclose(xlakern.FixedNumPerPost.fromdense(dense.T).todense(), dense.T)
        with pytest.raises(xlakern.event.EventShapeError, match="num_conn"):
            xlakern.FixedNumPerPost.fromdense(np.concatenate([np.ones((12, 1)), dense], 1))  # column counts vary


def test_csr_csc_fromdense_todense_and_arithmetic(rng):
    with x64():
        dense = np.where(rng.random((11, 7)) < 0.3, rng.standard_normal((11, 7)), 0.0)
        for cls in (xlakern.CSR, xlakern.CSC):
            W = cls.fromdense(dense)
            np.testing.assert_allclose(W.todense(), dense)
            np.testing.assert_allclose(W.T.todense(), dense.T)
            assert W.nse == np.count_nonzero(dense) and W.shape == (11, 7)
            np.testing.assert_allclose((W * 3).todense(), 3 * dense)
            np.testing.assert_allclose((W / 2).todense(), dense / 2)
            x, y = rng.standard_normal(7), rng.standard_normal(11)
            np.testing.assert_allclose(W @ x, dense @ x, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(y @ W, y @ dense, rtol=1e-12, atol=1e-12)
            X = rng.standard_normal((7, 3))
            np.testing.assert_allclose(W @ X, dense @ X, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(X.T @ W.T, X.T @ dense.T, rtol=1e-12, atol=1e-12)
            leaves, tree = jax.tree_util.tree_flatten(W)
            assert len(leaves) == 3 and jax.tree_util.tree_unflatten(tree, leaves).shape == W.shape
        # a layout's backend= reaches its products and survives flattening and .T
        Wj = xlakern.CSR.fromdense(dense)
        Wj = xlakern.CSR((Wj.data, Wj.indices, Wj.indptr), shape=Wj.shape, backend="jnp")
        assert jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(Wj))).backend == "jnp"
        assert Wj.T.backend == "jnp"
        y = rng.standard_normal(11)
        np.testing.assert_allclose(y @ Wj, y @ dense, rtol=1e-12, atol=1e-12)
        assert isinstance(Wj, xlakern.DataRepresentation) and isinstance(xlakern.FixedNumPerPre.fromdense(
            np.eye(3)), xlakern.FixedNumConn)
        with pytest.raises(TypeError, match="scalars only"):
            xlakern.CSR.fromdense(dense) * np.ones(3)


def test_event_containers(rng):
    v = jnp.asarray(rng.random((6, 5)) < 0.4)
    b = xlakern.BinaryArray(v)
    assert b.shape == (6, 5) and b.ndim == 2 and b.size == 30 and b.dtype == jnp.bool_ and len(b) == 6
    np.testing.assert_array_equal(b[1:3], v[1:3])
    np.testing.assert_array_equal(b.value, v)
    np.testing.assert_array_equal(b.T, v.T)
    np.testing.assert_array_equal(b + 1, v + 1)
    np.testing.assert_array_equal(2 * b, 2 * v)
    np.testing.assert_array_equal(np.stack(list(b)), v)
    assert isinstance(b.with_value(~v), xlakern.BinaryArray)
    out = jax.jit(lambda e: e)(b)
    assert isinstance(out, xlakern.BinaryArray)
    np.testing.assert_array_equal(out.value, v)
    # bitpack: bit k of word w is element 32 w + k
    x = rng.random(70) < 0.5
    expect = [int(sum(int(x[32 * w + k]) << k for k in range(32) if 32 * w + k < 70)) for w in range(3)]
    np.testing.assert_array_equal(xlakern.bitpack(x, axis=0), np.asarray(expect, np.uint32))
    np.testing.assert_array_equal(xlakern.bitpack(x[None], axis=-1)[0], np.asarray(expect, np.uint32))
    for bad_axis in (1, -2, 0.0):  # not wrapped around (axis 1 of a 1-D array once packed axis 0)
        with pytest.raises(xlakern.event.EventShapeError, match="axis"):
            xlakern.bitpack(x, axis=bad_axis)
    with pytest.raises(xlakern.event.EventShapeError, match=r"shape \(\)"):
        xlakern.bitpack(np.float32(1.0))
    packed = xlakern.BitPackedBinary(x)
    np.testing.assert_array_equal(packed.packed[0], expect)
    c = xlakern.CompactBinary.from_array(jnp.asarray(x))
    k = int(x.sum())
    assert int(c.n_active[0]) == k
    np.testing.assert_array_equal(c.active_ids[:k], np.nonzero(x)[0])
    W = rng.standard_normal((70, 4)).astype(np.float32)
    for e in (packed, c, xlakern.BinaryArray(x)):
        np.testing.assert_allclose(e @ jnp.asarray(W), x @ W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.asarray(W.T) @ xlakern.BinaryArray(x), W.T @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(W.T) @ xlakern.BinaryArray(x), W.T @ x, rtol=1e-5, atol=1e-5)


def test_compact_binary_from_brainevents_parts(rng):
    """BrainEvent's constructor CompactBinary(packed, active_ids, n_active, value, n_orig, batch_size) and
    from_packed / from_array_light / compacy_only_vector give the spikes of ``value``: their compaction
    and their products agree with NumPy; a value that does not match n_orig or batch_size is refused."""
    from xlakern.event import EventShapeError

    for shape in ((70,), (45, 3)):
        x = rng.random(shape) < 0.3
        rows = x if x.ndim == 1 else x.any(axis=1)
        ids = np.full(shape[0], shape[0], np.int32)
        ids[:rows.sum()] = np.nonzero(rows)[0]
        packed = np.asarray(xlakern.bitpack(x, axis=x.ndim - 1))
        batch = None if x.ndim == 1 else shape[1]
        W = rng.standard_normal((shape[0], 4))
        made = [xlakern.CompactBinary(packed, ids, np.array([rows.sum()], np.int32), jnp.asarray(x), shape[0], batch),
                xlakern.CompactBinary(packed, ids, rows.sum(), value=jnp.asarray(x), n_orig=shape[0],
                                      batch_size=batch, bit_width=32),
                xlakern.CompactBinary.from_packed(packed, ids, rows.sum(), jnp.asarray(x), shape[0], batch),
                xlakern.CompactBinary.from_array_light(jnp.asarray(x))]
        for c in made:
            assert type(c) is xlakern.CompactBinary and c.shape == shape and c.batch_size == batch
            assert int(c.n_active[0]) == rows.sum()
            np.testing.assert_array_equal(c.active_ids, ids)
            np.testing.assert_array_equal(c.packed, packed)
            expect = (x.astype(np.float64).T @ W).T if x.ndim == 2 else x.astype(np.float64) @ W
            got = c @ jnp.asarray(W, jnp.float32) if x.ndim == 1 else jnp.asarray(W.T, jnp.float32) @ c
            np.testing.assert_allclose(np.asarray(got, np.float64), expect, rtol=1e-5, atol=1e-5)
        with pytest.raises(EventShapeError, match=rf"value has shape \({shape[0]},"):
            xlakern.CompactBinary(packed, ids, rows.sum(), jnp.asarray(x), shape[0] + 1, batch)
        with pytest.raises(EventShapeError, match="value has shape"):
            xlakern.CompactBinary.from_packed(packed, ids, rows.sum(), jnp.asarray(x), shape[0], 7)
    v = rng.random(40) < 0.5
    np.testing.assert_array_equal(xlakern.CompactBinary.compacy_only_vector(v).value, v)
    with pytest.raises(EventShapeError, match="1-D"):
        xlakern.CompactBinary.compacy_only_vector(np.ones((4, 2)))


def test_spike_containers_name_an_argument_jax_cannot_read(rng):
    """bitpack and CompactBinary.from_array given None or a string: an EventDTypeError naming the
    argument (jax's error names neither the call nor the argument); valid spikes still pack as NumPy does."""
    import re

    from xlakern.event import EventDTypeError

    for call, message in [(lambda: xlakern.bitpack(None), "bitpack: arr is None"),
                          (lambda: xlakern.bitpack("1010"), "bitpack: arr is a str ('1010')"),
                          (lambda: xlakern.bitpack([[1, 0], [1]]), "bitpack: arr cannot be read as an array"),
                          (lambda: xlakern.CompactBinary.from_array(None), "CompactBinary.from_array: x is None"),
                          (lambda: xlakern.CompactBinary.from_array({1: 2}), "from_array: x is a dict")]:
        with pytest.raises(EventDTypeError, match=re.escape(message)):
            call()
    x = rng.random(40) < 0.5
    np.testing.assert_array_equal(np.asarray(xlakern.bitpack(list(x))),
                                  [int(sum(int(b) << k for k, b in enumerate(x[w:w + 32]))) for w in (0, 32)])


def test_deprecated_names_warn_and_resolve():
    for old, new in [("EventArray", "BinaryArray"), ("FixedPostNumConn", "FixedNumPerPre"),
                     ("FixedPreNumConn", "FixedNumPerPost")]:
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(xlakern, old) is getattr(xlakern, new)
        assert old not in xlakern.__all__
    with pytest.raises(AttributeError):
        xlakern.no_such_name  # noqa: B018


@pytest.mark.parametrize("cls", ["BinaryArray", "WeightedArray"])
def test_event_array_products_with_misshapen_operands_raise_math_errors(rng, cls):
    """As BrainEvent 0.3 does, an event array times an operand it cannot multiply raises MathError
    (xlakern's EventMatmulError, also an EventShapeError); a product that fits still matches jnp."""
    from xlakern.event import EventMatmulError, EventShapeError

    wrap = getattr(xlakern, cls)
    W = rng.standard_normal((3, 2))
    bad = {
        r"events must be 1-D or 2-D; got shape \(\)": lambda: wrap(jnp.array(1.0)) @ W,
        r"events must be 1-D or 2-D; got shape \(2, 2, 3\)": lambda: wrap(jnp.ones((2, 2, 3))) @ W,
        r"incompatible shapes \(4,\) and \(3, 2\) \(inner dimensions 4 and 3": lambda: wrap(jnp.ones(4)) @ W,
        r"incompatible shapes \(3, 2\) and \(3,\) \(inner dimensions 2 and 3": lambda: W @ wrap(jnp.ones(3)),
        r"matrix @ .*: incompatible shapes \(4, 2\) and \(3, 5\)": lambda: np.ones((4, 2)) @ wrap(jnp.ones((3, 5))),
        r"the matrix must be 2-D; got shape \(3,\)": lambda: wrap(jnp.ones(3)) @ jnp.ones(3),
        r"the matrix must be 2-D; got shape \(2, 3, 3\)": lambda: jnp.ones((2, 3, 3)) @ wrap(jnp.ones(3)),
    }
    for pattern, product in bad.items():
        with pytest.raises(xlakern.MathError, match=pattern) as err:
            product()
        assert isinstance(err.value, EventMatmulError) and isinstance(err.value, EventShapeError)
    s = np.where(rng.random((2, 3)) < 0.5, rng.uniform(0.5, 2.0, (2, 3)), 0.0)
    scale = s if cls == "WeightedArray" else (s != 0)
    np.testing.assert_allclose(wrap(jnp.asarray(s)) @ W, scale @ W, rtol=1e-5, atol=1e-6)


def test_weighted_events_must_be_real():
    from xlakern.event import EventDTypeError

    with pytest.raises(EventDTypeError, match="boolean, integer or floating-point; got complex64") as err:
        xlakern.WeightedArray(jnp.zeros(3, jnp.complex64))
    assert isinstance(err.value, TypeError)
    for dtype in (jnp.bool_, jnp.int8, jnp.float16, jnp.float32):
        assert xlakern.WeightedArray(jnp.ones(3, dtype)).value.dtype == dtype


def test_event_products_return_the_weights_dtype_and_dense_operands_promote(rng, on_cpu):
    """As in BrainEvent 0.3: a product with events (binary or weighted, of any dtype) and the functional
    operators return the weights' dtype, so float64 events under x64 keep a float32 network float32 (a
    scan carry included); a layout times a plain dense array follows jnp (float32 weights times a
    float64 array compute and return float64)."""
    with x64():
        dense = np.where(rng.random((12, 9)) < 0.4, rng.standard_normal((12, 9)), 0.0).astype(np.float32)
        d64 = dense.astype(np.float64)
        W = xlakern.CSR.fromdense(jnp.asarray(dense))
        idx = rng.integers(0, 9, (12, 3)).astype(np.int32)
        fw = rng.standard_normal((12, 3)).astype(np.float32)
        F = xlakern.FixedNumPerPre((jnp.asarray(fw), jnp.asarray(idx)), shape=(12, 9))
        f_dense = np.zeros((12, 9))
        np.add.at(f_dense, (np.repeat(np.arange(12), 3), idx.ravel()), fw.ravel().astype(np.float64))
        x = rng.standard_normal(12)  # float64
        y = rng.standard_normal(9)
        for got, want in [
            (xlakern.WeightedArray(x) @ W, x @ d64), (W @ xlakern.WeightedArray(y), d64 @ y),
            (xlakern.WeightedArray(x) @ W.T.T, x @ d64), (xlakern.WeightedArray(x) @ F, x @ f_dense),
            (xlakern.WeightedArray(x) @ jnp.asarray(dense), x @ d64),
            (xlakern.WeightedArray(x) @ xlakern.Dense(jnp.asarray(dense)), x @ d64),
            (xlakern.csrmv(W.data, W.indices, W.indptr, x, shape=(12, 9), transpose=True), x @ d64),
            (xlakern.fcnmv(jnp.asarray(fw), jnp.asarray(idx), x, shape=(12, 9), transpose=True), x @ f_dense),
            (xlakern.BinaryArray(x) @ W, (x != 0) @ d64),
        ]:
            assert got.dtype == jnp.float32
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)
        for got, want in [(jnp.asarray(x) @ W, x @ d64), (W @ jnp.asarray(y), d64 @ y), (jnp.asarray(x) @ F, x @ f_dense)]:
            assert got.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)  # computed in float64

        def step(carry, xs):
            return carry + xlakern.WeightedArray(xs) @ W, None

        out = jax.lax.scan(step, jnp.zeros(9, jnp.float32), jnp.asarray(rng.standard_normal((4, 12))))[0]
        assert out.dtype == jnp.float32
        g = jax.grad(lambda v: jnp.sum(xlakern.WeightedArray(v) @ W))(jnp.asarray(x))
        assert g.dtype == jnp.float64
        np.testing.assert_allclose(g, d64.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise_named_errors(rng):
    from xlakern.event import EventDTypeError, EventShapeError

    dense, data, idx, ptr = random_csr(rng, 8, 6, 0.5)
    data32, idx32, ptr32 = data.astype(np.float32), idx.astype(np.int32), ptr.astype(np.int32)
    s = np.ones(6, bool)
    with pytest.raises(EventShapeError, match=r"v has shape \(5,\); expected \(6,\)") as e:
        xlakern.binary_csrmv(data32, idx32, ptr32, np.ones(5, bool), shape=(8, 6))
    assert isinstance(e.value, xlakern.XlakernError) and isinstance(e.value, ValueError)
    with pytest.raises(EventShapeError, match=r"expected \(8,\)"):
        xlakern.binary_csrmv(data32, idx32, ptr32, s, shape=(8, 6), transpose=True)
    with pytest.raises(EventDTypeError, match="indices has dtype float32"):
        xlakern.binary_csrmv(data32, idx32.astype(np.float32), ptr32, s, shape=(8, 6))
    with pytest.raises(EventDTypeError, match="indptr"):
        xlakern.csrmv(data32, idx32, ptr32.astype(np.uint8), s, shape=(8, 6))
    with pytest.raises(EventShapeError, match="data has shape"):
        xlakern.binary_csrmv(data32[:-1], idx32, ptr32, s, shape=(8, 6))
    with pytest.raises(EventShapeError, match=r"indptr has shape \(9,\); expected \(10,\)"):
        xlakern.binary_csrmv(data32, idx32, ptr32, np.ones(6, bool), shape=(9, 6))
    with pytest.raises(EventShapeError, match=r"\(8, batch\)"):
        xlakern.binary_csrmm(data32, idx32, ptr32, np.ones((6, 2), bool), shape=(8, 6), transpose=True)
    with pytest.raises(EventShapeError, match="indices has shape"):
        xlakern.binary_fcnmv(np.ones((4, 2)), np.zeros((5, 2), np.int32), np.ones(4, bool), shape=(4, 3))
    with pytest.raises(EventShapeError, match="weights have shape"):
        xlakern.fcnmv(np.ones((4, 3)), np.zeros((4, 2), np.int32), np.ones(3), shape=(4, 3))
    with pytest.raises(EventShapeError, match="weights has shape"):
        xlakern.binary_densemv(np.ones(4), np.ones(4, bool), transpose=True)
    with pytest.raises(EventShapeError, match="indptr"):
        xlakern.CSR((data32, idx32, ptr32[:-1]), shape=(8, 6))
    with pytest.raises(EventShapeError, match="data has shape"):
        xlakern.CSR((data32[:2], idx32, ptr32), shape=(8, 6))
    with pytest.raises(EventShapeError, match="shape must be non-negative"):
        xlakern.CSR((data32, idx32, ptr32), shape=(-8, 6))
    with pytest.raises(EventShapeError, match="pair of ints"):  # 4.5 is not truncated to 4
        xlakern.FixedNumPerPre((np.ones((4, 2)), np.zeros((4, 2), np.int32)), shape=(4.5, 3))
    with pytest.raises(EventDTypeError, match="indices has dtype float32"):  # refused when built, not when used
        xlakern.FixedNumPerPre((np.ones((4, 2)), np.zeros((4, 2), np.float32)), shape=(4, 3))
    with pytest.raises(EventShapeError, match=r"expected \(6, K\)"):
        xlakern.FixedNumPerPost((np.ones((4, 2)), np.zeros((4, 2), np.int32)), shape=(4, 6))
    with pytest.raises(EventShapeError, match="1-D or 2-D"):
        xlakern.BinaryArray(np.ones((2, 2, 2), bool)) @ xlakern.CSR((data32, idx32, ptr32), shape=(8, 6))


def test_units_multiply(rng):
    u = pytest.importorskip("brainunit")
    dense, data, idx, ptr = random_csr(rng, 10, 8, 0.4)
    data = data.astype(np.float32)
    s = rng.random(10) < 0.5
    W = xlakern.CSR((data * u.nS, idx.astype(np.int32), ptr.astype(np.int32)), shape=(10, 8))
    out = xlakern.BinaryArray(s) @ W
    assert isinstance(out, u.Quantity) and out.unit == u.nS
    np.testing.assert_allclose(out.to_decimal(u.nS), s @ dense, rtol=1e-5, atol=1e-5)
    v = rng.standard_normal(8).astype(np.float32)
    out = W @ (v * u.mV)
    assert out.unit == u.nS * u.mV
    np.testing.assert_allclose(out.to_decimal(u.nS * u.mV), dense @ v, rtol=1e-5, atol=1e-5)
    assert (W * 2).todense().unit == u.nS
    np.testing.assert_allclose(W.todense().to_decimal(u.nS), dense, rtol=1e-6)
    back = xlakern.CSR.fromdense(dense.astype(np.float32) * u.nS)
    assert back.data.unit == u.nS
    out = xlakern.binary_densemv(dense.astype(np.float32) * u.nS, s, transpose=True)
    assert out.unit == u.nS
    out = jax.jit(lambda W, s: xlakern.BinaryArray(s) @ W)(W, s)
    assert out.unit == u.nS
    assert (W * (2 * u.mV)).data.unit == u.nS * u.mV  # scalar arithmetic carries units along
    with pytest.raises(xlakern.event.EventUnitError, match="unit"):
        W.with_data(W.data.mantissa)  # dropping the unit is refused
    with pytest.raises(xlakern.event.EventUnitError, match="unit"):
        W.with_data(W.data.mantissa * u.mV)


_CACHE_SCRIPT = textwrap.dedent(r"""
    import time
    import numpy as np, jax, jax.numpy as jnp
    import xlakern
    from xlakern.event import _kernels
    t = time.perf_counter()
    _kernels.cpu_module()
    load_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    d = (rng.random((9, 7)) < 0.4) * rng.standard_normal((9, 7)).astype(np.float32)
    W, F = xlakern.CSR.fromdense(d), xlakern.FixedNumPerPre((jnp.ones((9, 2)), jnp.zeros((9, 2), jnp.int32)), shape=(9, 7))
    s9, s7 = rng.random(9) < 0.5, rng.random(7) < 0.5
    res = [xlakern.BinaryArray(s9) @ W, W @ xlakern.BinaryArray(s7), W @ s7.astype(np.float32),
           xlakern.BinaryArray(s9) @ F, F @ s7.astype(np.float32), xlakern.BinaryArray(s9) @ jnp.asarray(d),
           xlakern.WeightedArray(s9.astype(np.float32)) @ jnp.asarray(d),
           xlakern.binary_csrmm(W.data, W.indices, W.indptr, np.ones((7, 3), bool), shape=(9, 7)),
           xlakern.binary_fcnmm(F.data, F.indices, np.ones((9, 3), bool), shape=(9, 7), transpose=True),
           xlakern.binary_densemm(jnp.asarray(d), np.ones((7, 3), bool), transpose=False),
           # the drop-in CSR helpers' own kernels
           xlakern.binary_csrmv_indexed(W.data, W.indices, W.indptr, jnp.arange(W.nse, dtype=jnp.int32), s9,
                                        shape=(9, 7), transpose=True),
           xlakern.csr_slice_rows(W.data, W.indices, W.indptr, jnp.array([1, 4]), shape=(9, 7)),
           xlakern.csrmv_dt2t(jnp.ones(9), W.data, W.indices, W.indptr, shape=(9, 7)),
           jax.grad(lambda w: jnp.sum(xlakern.binary_csrmv(w, W.indices, W.indptr, s9, shape=(9, 7),
                                                           transpose=True)))(W.data)]
    np.testing.assert_allclose(res[0], s9 @ d, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[-4], s9 @ d, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[-3], d[[1, 4]], rtol=1e-6)
    jax.block_until_ready(res)
    print(f"LOAD_S={load_s:.4f}")
""")


def test_fresh_process_serves_kernels_from_cache_without_compiler(tmp_path):
    from _fresh_process import build_then_forbid

    _, second = build_then_forbid(_CACHE_SCRIPT, tmp_path)
    load_s = float(second.split("LOAD_S=")[1].split()[0])
    assert load_s < 1.0, f"loading the cached kernels took {load_s:.3f} s"


HAVE_NVCC = True
try:
    xlakern._toolchain.find_nvcc()
except xlakern.ToolchainError:
    HAVE_NVCC = False


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not installed")
def test_cuda_kernels_compile():
    from xlakern.event._kernels import KERNEL_DIR

    mod = xlakern.load_cuda_file(KERNEL_DIR / "event_cuda.cu", name="xlakern_event_cuda_check",
                                 compute_capability="9.0")
    assert set(mod.functions) == {"event_sparse", "event_dense"}
    assert mod.functions["event_sparse"].endswith("stream")
    for source, entries in (("event_indexed_cuda.cu", {"event_sparse_indexed"}), ("csr_slice_cuda.cu", {"csr_slice_rows"}),
                            ("csr_synapse_cuda.cu", {"csr_dt2t_rows", "csr_row_col_product", "csr_slot_rows"})):
        mod = xlakern.load_cuda_file(KERNEL_DIR / source, name="xlakern_check_" + source[:-3], compute_capability="9.0")
        assert set(mod.functions) == entries and all(mod.functions[e].endswith("stream") for e in entries)


def test_kernel_sources_ship_in_the_package():
    from xlakern.event._kernels import KERNEL_DIR

    from pathlib import Path

    # the installed package (not the source tree) carries the sources the loaders compile
    assert KERNEL_DIR == Path(xlakern.__file__).resolve().parent / "event" / "kernels"
    assert {p.name for p in KERNEL_DIR.iterdir()} >= {
        "event_cpu.cc", "event_cuda.cu", "event_common.h", "event_sparse_cpu.h", "event_sparse_cuda.cuh",
        "event_indexed_cpu.cc", "event_indexed_cuda.cu", "csr_slice_cpu.cc", "csr_slice_cuda.cu", "csr_rows.h",
        "csr_synapse_cpu.cc", "csr_synapse_cuda.cu", "csr_tools_common.h", "event_exact_scatter_cuda.cuh",
        "exact_sums_cuda.cuh"}


def test_plain_import_leaves_the_event_subpackage_for_first_use():
    code = ("import sys, xlakern; assert 'xlakern.event' not in sys.modules; "
            "from xlakern import binary_csrmv, CSR; assert 'xlakern.event' in sys.modules; "
            "assert xlakern.CSR is CSR and 'CSR' in dir(xlakern) and 'CSR' in xlakern.__all__")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
