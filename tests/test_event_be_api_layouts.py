"""BrainEvent 0.3's layout-class API on xlakern's layouts: metadata, reductions, maps, format
conversions, plasticity methods, buffers, the Dense layout and the JITC base classes, each checked
against an independent float64 NumPy computation on fresh random matrices."""

from __future__ import annotations

import contextlib
import copy
import operator
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import x64, x64_everywhere
from xlakern.event._dense_layout import Dense
from xlakern.event._errors import EventBufferError, EventDependencyError, UnsupportedOperationError
from xlakern.event._jitc import JITCMatrix, JITCNormalMatrix, JITCScalarMatrix, JITCUniformMatrix

try:
    import brainunit  # noqa: F401

    HAS_BRAINUNIT = True
except ImportError:
    HAS_BRAINUNIT = False

KINDS = ["CSR", "CSC", "FixedNumPerPre", "FixedNumPerPost"]
TOL = dict(rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- random layouts

class Case:
    """A random layout and its float64 description: every stored synapse's (row, col) in ``W``'s
    orientation, in storage order, and its weight."""

    def __init__(self, layout, rows, cols, weights):
        self.W, self.rows, self.cols, self.weights = layout, rows, cols, weights

    @property
    def dense(self):
        d = np.zeros(self.W.shape)
        np.add.at(d, (self.rows, self.cols), self.weights)
        return d

    @property
    def mask(self):
        m = np.zeros(self.W.shape, bool)
        m[self.rows, self.cols] = True
        return m


def make_case(rng, kind, shape, density, index_dtype=np.int32, shared=False):
    m, n = shape
    flipped = kind in ("CSC", "FixedNumPerPost")
    srows, scols = (n, m) if flipped else (m, n)
    if kind in ("CSR", "CSC"):
        mask = rng.random((srows, scols)) < density
        if srows > 2:
            mask[rng.integers(0, srows, size=max(1, srows // 4))] = False  # empty rows
        r, c = np.nonzero(mask)
        indptr = np.zeros(srows + 1, np.int64)
        np.cumsum(np.bincount(r, minlength=srows), out=indptr[1:])
        nse = r.size
    else:
        k = max(1, min(scols, int(round(density * scols))))
        idx = np.stack([rng.choice(scols, size=k, replace=False) for _ in range(srows)])
        r, c = np.repeat(np.arange(srows), k), idx.reshape(-1)
        nse = r.size
    w = np.float32(rng.standard_normal()) if shared else rng.standard_normal(nse).astype(np.float32)
    weights = np.broadcast_to(np.asarray(w, np.float64).reshape(-1), (nse,)).copy()
    cls = getattr(xlakern, kind)
    if kind in ("CSR", "CSC"):
        data = jnp.asarray(np.reshape(w, (1,)) if shared else w)
        W = cls((data, jnp.asarray(c, index_dtype), jnp.asarray(indptr, index_dtype)), shape=shape)
    else:
        data = jnp.asarray(np.reshape(w, (1,)) if shared else w.reshape(idx.shape))
        W = cls((data, jnp.asarray(idx, index_dtype)), shape=shape)
    rows, cols = (c, r) if flipped else (r, c)
    return Case(W, rows, cols, weights)


def index_context(index_dtype):
    return x64() if index_dtype == np.int64 else contextlib.nullcontext()


SHAPES = [(9, 13), (13, 9), (1, 7), (6, 6)]


# ----------------------------------------------------------------------------- stored layouts

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shared", [False, True])
def test_metadata_sum_and_transpose(kind, index_dtype, shared, rng):
    with index_context(index_dtype):
        for shape in SHAPES:
            for density in (0.05, 0.3, 0.9):
                case = make_case(rng, kind, shape, density, index_dtype, shared)
                W, dense = case.W, case.dense
                assert W.ndim == 2 and W.size == shape[0] * shape[1]
                np.testing.assert_allclose(W.sum(), dense.sum(), **TOL)
                np.testing.assert_allclose(W.sum(axis=0), dense.sum(axis=0), **TOL)
                np.testing.assert_allclose(W.sum(axis=1), dense.sum(axis=1), **TOL)
                np.testing.assert_allclose(W.sum(axis=-1), dense.sum(axis=1), **TOL)
                Wt = W.transpose()
                assert Wt.shape == shape[::-1] and type(Wt) is type(W.T)
                np.testing.assert_allclose(Wt.todense(), dense.T, **TOL)
                assert W.block_until_ready() is W
                if kind.startswith("Fixed"):
                    assert (W.num_pre, W.num_post) == shape
    with pytest.raises(xlakern.XlakernError, match="axis"):
        W.sum(axis=2)
    with pytest.raises(xlakern.XlakernError, match="axes"):
        W.transpose(axes=(0, 1))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_tocsr_tocsc_are_the_same_matrix(kind, index_dtype, rng):
    with index_context(index_dtype):
        for shape in SHAPES:
            for shared in (False, True):
                case = make_case(rng, kind, shape, rng.uniform(0.05, 0.8), index_dtype, shared)
                W, dense = case.W, case.dense
                csr, csc = W.tocsr(), W.tocsc()
                assert type(csr) is xlakern.CSR and type(csc) is xlakern.CSC
                assert csr.shape == csc.shape == shape and csr.nse == csc.nse == W.nse
                assert csr.indices.dtype == csc.indices.dtype == W.indices.dtype
                np.testing.assert_allclose(csr.todense(), dense, **TOL)
                np.testing.assert_allclose(csc.todense(), dense, **TOL)
                # compressed rows really are rows: row i's columns are csr.indices[indptr[i]:indptr[i+1]]
                ptr, idx = np.asarray(csr.indptr), np.asarray(csr.indices)
                for i in range(shape[0]):
                    assert sorted(idx[ptr[i]:ptr[i + 1]]) == sorted(case.cols[case.rows == i])
                ptr, idx = np.asarray(csc.indptr), np.asarray(csc.indices)
                for j in range(shape[1]):
                    assert sorted(idx[ptr[j]:ptr[j + 1]]) == sorted(case.rows[case.cols == j])
                # round trips
                np.testing.assert_allclose(csr.tocsc().tocsr().todense(), dense, **TOL)
                np.testing.assert_allclose(csc.tocsr().tocsc().todense(), dense, **TOL)
                # and the products agree with the original layout's
                s = rng.random(shape[0]) < 0.4
                np.testing.assert_allclose(xlakern.BinaryArray(s) @ csc, s @ dense, **TOL)
    assert csr.tocsr() is csr and csc.tocsc() is csc


@pytest.mark.parametrize("kind", KINDS)
def test_tocoo(kind, rng, monkeypatch):
    brainunit = pytest.importorskip("brainunit")

    for shared in (False, True):
        case = make_case(rng, kind, (7, 11), 0.3, shared=shared)
        coo = case.W.tocoo()
        assert isinstance(coo, brainunit.sparse.COO) and coo.shape == (7, 11)
        np.testing.assert_allclose(coo.todense(), case.dense, **TOL)
    monkeypatch.setitem(sys.modules, "brainunit", None)  # import brainunit now fails
    with pytest.raises(EventDependencyError, match="brainunit"):
        case.W.tocoo()


@pytest.mark.parametrize("kind", KINDS)
def test_apply_and_apply2(kind, rng):
    for shape in SHAPES:
        for shared in (False, True):
            case = make_case(rng, kind, shape, rng.uniform(0.1, 0.7), shared=shared)
            W, dense, mask = case.W, case.dense, case.mask
            other = rng.standard_normal(shape)
            scalar = float(rng.uniform(0.5, 2.0))
            np.testing.assert_allclose(W.apply(jnp.exp).todense(), np.where(mask, np.exp(dense), 0), **TOL)
            np.testing.assert_allclose(W.apply2(scalar, operator.mul).todense(), scalar * dense, **TOL)
            np.testing.assert_allclose(W.apply2(scalar, operator.truediv, reverse=True).todense(),
                                       np.where(mask, scalar / np.where(mask, dense, 1), 0), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(W.apply2(other, operator.mul).todense(), np.where(mask, dense * other, 0),
                                       **TOL)
            np.testing.assert_allclose(W.apply2(W.apply(jnp.abs), operator.mul).todense(), dense * np.abs(dense),
                                       **TOL)
            added = W.apply2(other, operator.add)
            if kind in ("CSR", "CSC"):  # a sum changes the zeros: the dense result (BrainEvent's)
                np.testing.assert_allclose(added, dense + other, **TOL)
                np.testing.assert_allclose(W.apply2(other, operator.sub, reverse=True), other - dense, **TOL)
            else:  # the fixed-count layouts add at the stored entries (BrainEvent's)
                np.testing.assert_allclose(added.todense(), np.where(mask, dense + other, 0), **TOL)
    with pytest.raises(xlakern.XlakernError, match="fn"):
        W.apply(lambda d: jnp.zeros(np.shape(d) + (2,)))
    with pytest.raises(xlakern.XlakernError, match="other"):
        W.apply2(np.ones((2, 3)), operator.mul)
    unrelated = make_case(rng, kind, shape, 0.5).W
    with pytest.raises(xlakern.XlakernError, match="other"):
        W.apply2(unrelated, operator.mul)
    # operands of the wrong kind are xlakern errors naming them, not jax's errors about arrays
    for junk in (None, "w", {"a": 1}):
        with pytest.raises(xlakern.event.EventOperandError, match=f"other is a {type(junk).__name__}"):
            W.apply2(junk, operator.mul)
        with pytest.raises(xlakern.event.EventOperandError, match=f"other is a {type(junk).__name__}"):
            W + junk
    with pytest.raises(xlakern.event.EventOperandError, match="scalars only"):
        W * np.ones(3)
    with pytest.raises(xlakern.event.EventOperandError, match=f"{type(W).__name__}: expected"):
        type(W)(W.data, shape=W.shape)
    if kind in ("CSR", "CSC"):  # a sum is dense: jnp's broadcasting, or an error naming both shapes
        row = rng.standard_normal(shape[1])
        np.testing.assert_allclose(W + row, dense + row, **TOL)
        with pytest.raises(xlakern.event.EventShapeError, match="does not broadcast against the matrix shape"):
            W + np.ones((shape[0] + 1, shape[1] + 2))


def stdp_reference(case, spikes, trace, w_min, w_max, on_pre):
    """float64 pair-based STDP over the synapse list: a touched synapse gains its partner's trace
    and is clipped."""
    w = case.weights.copy()
    driver, partner = (case.rows, case.cols) if on_pre else (case.cols, case.rows)
    touched = spikes[driver] != 0
    w[touched] = np.clip(w[touched] + trace[partner[touched]], -np.inf if w_min is None else w_min,
                         np.inf if w_max is None else w_max)
    return w


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_update_on_pre_and_post_match_numpy_stdp(kind, index_dtype, rng):
    with index_context(index_dtype):
        for shape in SHAPES:
            for bounds in ((None, None), (-0.5, 0.5), (0.0, None)):
                case = make_case(rng, kind, shape, rng.uniform(0.05, 0.8), index_dtype)
                W = case.W
                pre = rng.random(shape[0]) < 0.5
                post = rng.random(shape[1]) < 0.5
                pre_trace = rng.standard_normal(shape[0]).astype(np.float32)
                post_trace = rng.standard_normal(shape[1]).astype(np.float32)
                for on_pre, new in ((True, W.update_on_pre(pre, post_trace, *bounds)),
                                    (False, W.update_on_post(pre_trace, post, *bounds))):
                    ref = stdp_reference(case, pre if on_pre else post, post_trace if on_pre else pre_trace,
                                         *bounds, on_pre)
                    assert type(new) is type(W) and new.shape == W.shape and new.indices is W.indices
                    np.testing.assert_allclose(np.asarray(new.data).reshape(-1), ref, **TOL)
                # under jit, the layout a pytree argument (traced: update_on_post of a layout stored by
                # presynaptic neuron makes one pass over every synapse, not a sorted view)
                jitted = jax.jit(lambda W, s, t: W.update_on_pre(xlakern.BinaryArray(s), t, *bounds))(W, pre,
                                                                                                       post_trace)
                ref = stdp_reference(case, pre, post_trace, *bounds, True)
                np.testing.assert_allclose(np.asarray(jitted.data).reshape(-1), ref, **TOL)
                jitted = jax.jit(lambda W, t, s: W.update_on_post(t, xlakern.BinaryArray(s), *bounds))(W, pre_trace,
                                                                                                        post)
                ref = stdp_reference(case, post, pre_trace, *bounds, False)
                np.testing.assert_allclose(np.asarray(jitted.data).reshape(-1), ref, **TOL)
        shared = make_case(rng, kind, (5, 6), 0.5, index_dtype, shared=True).W
        with pytest.raises(xlakern.XlakernError, match="data"):
            shared.update_on_pre(np.ones(5, bool), np.ones(6, np.float32))
        with pytest.raises(xlakern.XlakernError, match="trace"):
            W.update_on_post(np.ones(shape[0] + 1, np.float32), post)


@pytest.mark.parametrize("kind", ["CSR", "CSC"])
def test_diag_add(kind, rng):
    for shape in SHAPES + [(0, 4)]:
        for density in (0.0, 0.2, 0.8):
            for shared in (False, True):
                case = make_case(rng, kind, shape, density, shared=shared)
                W, dense = case.W, case.dense
                n = min(shape)
                v = rng.standard_normal(n).astype(np.float32)
                out = W.diag_add(v)
                expected = dense.copy()
                expected[np.arange(n), np.arange(n)] += v
                assert type(out) is type(W) and out.shape == shape
                np.testing.assert_allclose(out.todense(), expected, **TOL)
                present = case.mask[np.arange(n), np.arange(n)]
                assert out.nse == W.nse + int((~present).sum())
                np.testing.assert_allclose(out.diag_add(-v).todense(), dense, **TOL)  # the diagonal now stored
    with pytest.raises(xlakern.XlakernError, match="other"):
        W.diag_add(np.ones(n + 1, np.float32))
    with pytest.raises(xlakern.XlakernError, match="concrete"):
        jax.jit(lambda W, v: W.diag_add(v).data)(W, v)


@pytest.mark.parametrize("kind", KINDS)
def test_buffers(kind, rng):
    case = make_case(rng, kind, (6, 8), 0.4)
    extra = rng.standard_normal(case.W.nse).astype(np.float32)
    W = type(case.W)(case.W._arrays(), shape=case.W.shape, buffers={"extra": jnp.asarray(extra)})
    np.testing.assert_array_equal(W.extra, extra)
    assert set(W.buffers) == {"extra"}
    W.register_buffer("delays", jnp.arange(3))
    W.set_buffer("delays", W.delays + 1)
    np.testing.assert_array_equal(W.buffers["delays"], np.arange(3) + 1)
    # the buffers are pytree leaves: they go through jit and survive structure-keeping maps
    doubled = jax.jit(lambda W: W.extra * 2 + W.delays.sum())(W)
    np.testing.assert_allclose(doubled, extra * 2 + (np.arange(3) + 1).sum(), **TOL)
    np.testing.assert_array_equal(W.apply(jnp.abs).extra, extra)
    assert set(jax.jit(lambda W: W.with_data(W.data * 2))(W).buffers) == {"extra", "delays"}
    with pytest.raises(EventBufferError, match="missing"):
        W.set_buffer("missing", 1)
    with pytest.raises(EventBufferError, match="data"):
        W.register_buffer("data", 1)
    assert isinstance(EventBufferError("x"), xlakern.XlakernError)


@pytest.mark.parametrize("kind", ["CSR", "CSC"])
def test_constructor_indptr_dtype_and_check_structure(kind, rng):
    """BrainEvent 0.3's constructor arguments: indptr_dtype casts indptr ("auto" keeps it), and
    check_structure=True rejects a concrete malformed structure while a valid one multiplies as before."""
    case = make_case(rng, kind, (9, 7), 0.4)
    data, indices, indptr = case.W._arrays()
    cls = type(case.W)
    x = rng.standard_normal(case.W.shape[1]).astype(np.float32)
    expected = case.dense @ x
    with x64():
        wide = jnp.asarray(np.asarray(indptr), jnp.int64)
        assert cls((data, indices, wide), shape=case.W.shape).indptr.dtype == jnp.int64  # "auto" keeps it
        narrowed = cls((data, indices, wide), shape=case.W.shape, indptr_dtype=jnp.int32)
        assert narrowed.indptr.dtype == jnp.int32
        np.testing.assert_allclose(narrowed @ x, expected, rtol=1e-5, atol=1e-5)
        assert cls((data, indices, indptr), shape=case.W.shape, indptr_dtype="int64").indptr.dtype == jnp.int64
    with pytest.raises(xlakern.XlakernError, match="jax_enable_x64"):
        cls((data, indices, indptr), shape=case.W.shape, indptr_dtype=np.int64)
    with pytest.raises(xlakern.XlakernError, match="indptr_dtype must be"):
        cls((data, indices, indptr), shape=case.W.shape, indptr_dtype="float32")

    checked = cls(data, indices, indptr, shape=case.W.shape, check_structure=True)
    np.testing.assert_allclose(checked @ x, expected, rtol=1e-5, atol=1e-5)
    ptr, idx = np.asarray(indptr), np.asarray(indices)
    n_secondary = case.W.shape[1] if kind == "CSR" else case.W.shape[0]
    bad_start = ptr + 1
    falling = ptr.copy()
    row = int(np.argmax(np.diff(ptr) > 0))  # a row with synapses: make it end before it starts
    falling[row + 1] = falling[row] - 1
    out_of_range = idx.copy()
    out_of_range[rng.integers(idx.size)] = n_secondary + int(rng.integers(1, 5))
    negative = idx.copy()
    negative[rng.integers(idx.size)] = -1
    for bad_idx, bad_ptr, message in ((idx, bad_start, "rise from 0"), (idx, falling, f"row {row} ends"),
                                      (out_of_range, ptr, "indices must lie"), (negative, ptr, "indices must lie")):
        with pytest.raises(xlakern.event.EventShapeError, match=message):
            cls((data, jnp.asarray(bad_idx), jnp.asarray(bad_ptr)), shape=case.W.shape, check_structure=True)
        cls((data, jnp.asarray(bad_idx), jnp.asarray(bad_ptr)), shape=case.W.shape)  # unchecked by default
    for check in (True, False):  # index dtypes are checked on every construction
        with pytest.raises(xlakern.event.EventDTypeError, match="indices has dtype float32; it must be int32 or int64"):
            cls((data, jnp.asarray(idx, jnp.float32), indptr), shape=case.W.shape, check_structure=check)
        with pytest.raises(xlakern.event.EventDTypeError, match="indptr has dtype bool"):
            cls((data, indices, jnp.asarray(ptr) > 0), shape=case.W.shape, check_structure=check)
    # traced arrays cannot be read: the check lets them pass, and the product is unchanged
    traced = jax.jit(lambda d, i, p: cls((d, i, p), shape=case.W.shape, check_structure=True) @ x)
    np.testing.assert_allclose(traced(data, indices, indptr), expected, rtol=1e-5, atol=1e-5)


def _follow(obj, path):
    """The value a key path names, read through the attributes and dict entries it lists."""
    for key in path:
        obj = getattr(obj, key.name) if isinstance(key, jax.tree_util.GetAttrKey) else obj[key.key]
    return obj


def test_key_paths_name_the_attributes(rng):
    """Every pytree of the event package flattens with key paths that name the attribute holding each
    leaf (BrainEvent 0.3 gives flat indices), so checkpoints and tree_map_with_path can address
    `.data` or a buffer; following a path on the object reaches that very leaf."""
    dense = np.where(rng.random((9, 6)) < 0.4, rng.standard_normal((9, 6)), 0.0).astype(np.float32)
    trace = jnp.asarray(rng.standard_normal(6).astype(np.float32))
    csr = xlakern.CSR.fromdense(dense)
    csr.register_buffer("trace", trace)
    k = 3
    fixed = xlakern.FixedNumPerPre((jnp.asarray(rng.standard_normal((9, k)), jnp.float32),
                                    jnp.asarray(rng.integers(0, 6, (9, k)), jnp.int32)), shape=(9, 6))
    delays = rng.integers(1, 4, csr.nse).astype(np.int32)
    ring_layout = xlakern.CSRDelayLayout.build(csr.data, csr.indices, csr.indptr, delays, n_slots=4, shape=(9, 6))
    spikes = jnp.asarray(rng.random(9) < 0.5)
    cases = [
        (csr, [".data", ".indices", ".indptr", ".buffers['trace']"]),
        (csr.T, [".data", ".indices", ".indptr", ".buffers['trace']"]),
        (fixed, [".data", ".indices"]),
        (fixed.T, [".data", ".indices"]),
        (Dense(jnp.asarray(dense)), [".data"]),
        (xlakern.JITCScalarR((0.5, 0.2, 7), shape=(9, 6)), [".weight", ".seed"]),
        (xlakern.JITCUniformC((-1.0, 1.0, 0.2, 7), shape=(9, 6)), [".wlow", ".whigh", ".seed"]),
        (xlakern.JITCNormalR((0.0, 1.0, 0.2, 7), shape=(9, 6)), [".wloc", ".wscale", ".seed"]),
        (ring_layout, [".data", ".indices", ".indptr", ".delays", ".delay_ptr", ".perm"]),
        (xlakern.BinaryArray(spikes), [".value"]),
        (xlakern.BitPackedBinary(spikes), [".value"]),
        (xlakern.CompactBinary.from_array(spikes), [".value"]),
        (xlakern.WeightedArray(jnp.asarray(rng.standard_normal(9))), [".value"]),
    ]
    for obj, expected in cases:
        pairs, treedef = jax.tree_util.tree_flatten_with_path(obj)
        assert [jax.tree_util.keystr(path) for path, _ in pairs] == expected, type(obj).__name__
        for path, leaf in pairs:
            assert _follow(obj, path) is leaf, (type(obj).__name__, jax.tree_util.keystr(path))
        # the keyed flattening is the plain one: same leaves, same order, same structure
        leaves, plain = jax.tree_util.tree_flatten(obj)
        assert plain == treedef and all(a is b for a, b in zip(leaves, (leaf for _, leaf in pairs)))
    # a path-addressed update: scale the weights only, under jit, and get the scaled matrix back
    scale_weights = jax.jit(lambda W: jax.tree_util.tree_map_with_path(
        lambda path, x: x * 3 if jax.tree_util.keystr(path) == ".data" else x, W))
    scaled = scale_weights(csr)
    np.testing.assert_allclose(np.asarray(scaled.todense()), 3 * dense, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(scaled.trace), np.asarray(trace))

    # a subclass whose tree_flatten returns children of its own keeps positional keys, not wrong names
    @jax.tree_util.register_pytree_with_keys_class
    class Tagged(xlakern.CSR):
        def tree_flatten(self):
            return (self.data, self.indices, self.indptr, self.tag), self.shape

        @classmethod
        def tree_unflatten(cls, shape, children):
            obj = cls(tuple(children[:3]), shape=shape)
            obj.tag = children[3]
            return obj

    tagged = Tagged((csr.data, csr.indices, csr.indptr), shape=csr.shape)
    tagged.tag = jnp.float32(2.0)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tagged)[0]]
    assert paths == [f"[<flat index {i}>]" for i in range(4)]


def test_subclass_of_the_base_and_attribute_buffers(rng):
    """A subclass written against BrainEvent's base (``super().__init__(arrays, shape=...)``) gets its shape
    and buffers; buffers are attributes listed in _buffer_registry, so plain assignment updates
    ``buffers``, and they survive the pytree round trip and jit."""

    @jax.tree_util.register_pytree_node_class
    class Scaled(xlakern.DataRepresentation):
        def __init__(self, value, *, shape, buffers=None):
            self.value = jnp.asarray(value)
            super().__init__((self.value,), shape=shape, buffers=buffers)
            self.register_buffer("norm", None)

        def tree_flatten(self):
            return (self.value, self.buffers), self.shape

        @classmethod
        def tree_unflatten(cls, shape, children):
            obj = object.__new__(cls)
            obj.value, obj.shape = children[0], shape
            obj._restore_buffers(children[1])
            return obj

    value = rng.standard_normal(3).astype(np.float32)
    tag = rng.standard_normal(2).astype(np.float32)
    obj = Scaled(value, shape=[3, 1], buffers={"tag": jnp.asarray(tag)})
    assert obj.shape == (3, 1)
    assert set(obj.buffers) == {"tag", "norm"} == obj._buffer_registry
    assert obj.norm is None
    obj.norm = jnp.float32(np.abs(value).sum())  # plain assignment is the buffer's value
    np.testing.assert_allclose(obj.buffers["norm"], np.abs(value).sum(), rtol=1e-6)
    out = jax.jit(lambda o: o)(obj)
    assert isinstance(out, Scaled) and out._buffer_registry == {"tag", "norm"}
    np.testing.assert_array_equal(out.tag, tag)
    np.testing.assert_allclose(out.norm, np.abs(value).sum(), rtol=1e-6)
    with pytest.raises(EventBufferError, match="not registered"):
        obj.set_buffer("missing", 1)
    # the rest of the base's contract: T is transpose() where a subclass defines it, and refuses otherwise
    with pytest.raises(UnsupportedOperationError, match="neither T nor transpose"):
        obj.T
    with pytest.raises(UnsupportedOperationError, match="fromdense"):
        Scaled.fromdense(np.eye(3))

    class Flipped(Scaled):
        def transpose(self, axes=None):
            return Flipped(self.value, shape=self.shape[::-1])

    assert Flipped(value, shape=(3, 1)).T.shape == (1, 3)
    # a layout's buffer is an attribute too, and a transform that keeps the structure keeps it
    W = make_case(rng, "CSR", (5, 4), 0.5).W
    W.register_buffer("delays", jnp.arange(W.nse))
    W.delays = W.delays + 2
    np.testing.assert_array_equal((W * 2.0).buffers["delays"], np.arange(W.nse) + 2)
    assert "delays" in jax.jit(lambda W: W.T)(W)._buffer_registry
    twin = copy.copy(W)  # a shallow copy registers its own buffers without touching the original's
    twin.register_buffer("gain", 2.0)
    assert set(twin.buffers) == {"delays", "gain"} and set(W.buffers) == {"delays"}


# ----------------------------------------------------------------------------- Dense

def test_dense_products_under_jit(rng):
    for shape in [(9, 13), (13, 9), (1, 5)]:
        d = rng.standard_normal(shape).astype(np.float32)
        W = Dense(d)
        m, n = shape
        s_pre, s_post = rng.random(m) < 0.4, rng.random(n) < 0.4
        B_pre, B_post = rng.random((3, m)) < 0.4, rng.random((n, 4)) < 0.4
        x_pre = np.where(rng.random(m) < 0.5, rng.standard_normal(m), 0).astype(np.float32)
        d64 = d.astype(np.float64)
        left = jax.jit(lambda W, s: xlakern.BinaryArray(s) @ W)
        right = jax.jit(lambda W, s: W @ xlakern.BinaryArray(s))
        np.testing.assert_allclose(left(W, s_pre), s_pre @ d64, **TOL)
        np.testing.assert_allclose(right(W, s_post), d64 @ s_post, **TOL)
        np.testing.assert_allclose(left(W, B_pre), B_pre @ d64, **TOL)
        np.testing.assert_allclose(right(W, B_post), d64 @ B_post, **TOL)
        np.testing.assert_allclose(jax.jit(lambda W, x: xlakern.WeightedArray(x) @ W)(W, x_pre), x_pre @ d64, **TOL)
        np.testing.assert_allclose(jax.jit(lambda W, x: x @ W)(W, x_pre), x_pre @ d64, **TOL)
        np.testing.assert_allclose(W @ s_post.astype(np.float32), d64 @ s_post, **TOL)
        np.testing.assert_allclose(B_pre.astype(np.float32) @ W, B_pre @ d64, **TOL)
    with pytest.raises(xlakern.XlakernError, match="expected"):
        W @ np.ones(n + 1, np.float32)
    with pytest.raises(xlakern.XlakernError):
        xlakern.BinaryArray(np.ones(m + 1, bool)) @ W


def test_dense_methods(rng):
    d = rng.standard_normal((7, 5)).astype(np.float32)
    d[rng.random(d.shape) < 0.4] = 0
    W = Dense(d)
    d64 = d.astype(np.float64)
    assert W.shape == (7, 5) and W.ndim == 2 and W.size == W.nse == 35
    assert Dense.fromdense(d).shape == (7, 5)
    np.testing.assert_array_equal(W.todense(), d)
    assert type(W.T) is Dense and W.transpose().shape == (5, 7)
    np.testing.assert_array_equal(W.T.todense(), d.T)
    for conv, cls in ((W.tocsr, xlakern.CSR), (W.tocsc, xlakern.CSC)):
        out = conv()
        assert type(out) is cls and out.nse == np.count_nonzero(d)
        np.testing.assert_allclose(out.todense(), d64, **TOL)
    if HAS_BRAINUNIT:  # tocoo returns a brainunit COO
        np.testing.assert_allclose(W.tocoo().todense(), d64, **TOL)
    else:
        with pytest.raises(EventDependencyError, match="brainunit"):
            W.tocoo()
    s = float(rng.uniform(0.5, 2))
    np.testing.assert_allclose((W * s).todense(), d64 * s, **TOL)
    np.testing.assert_allclose((s * W).todense(), d64 * s, **TOL)
    np.testing.assert_allclose((W / s).todense(), d64 / s, **TOL)
    np.testing.assert_allclose((W + s).todense(), d64 + s, **TOL)
    np.testing.assert_allclose((s - W).todense(), s - d64, **TOL)
    np.testing.assert_allclose((-W).todense(), -d64, **TOL)
    np.testing.assert_allclose(abs(W).todense(), np.abs(d64), **TOL)
    row = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose((W * row).todense(), d64 * row, **TOL)
    np.testing.assert_allclose(W.apply2(W, operator.mul).todense(), d64 * d64, **TOL)
    np.testing.assert_allclose(W.sum(), d64.sum(), **TOL)
    np.testing.assert_allclose(W.sum(axis=0), d64.sum(axis=0), **TOL)
    v = rng.standard_normal(5).astype(np.float32)
    expected = d64.copy()
    expected[np.arange(5), np.arange(5)] += v
    np.testing.assert_allclose(W.diag_add(v).todense(), expected, **TOL)
    np.testing.assert_allclose(W.with_data(W.data * 2).todense(), 2 * d64, **TOL)
    np.testing.assert_allclose(W.apply(jnp.exp).todense(), np.exp(d64), **TOL)
    # plasticity: whole rows / columns of the spiking neurons
    pre, post = rng.random(7) < 0.5, rng.random(5) < 0.5
    pre_trace, post_trace = rng.standard_normal(7).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    ref = d64.copy()
    ref[pre] = np.clip(ref[pre] + post_trace, -0.3, 0.6)
    got = jax.jit(lambda W, s, t: W.update_on_pre(s, t, -0.3, 0.6))(W, pre, post_trace)
    assert type(got) is Dense
    np.testing.assert_allclose(got.todense(), ref, **TOL)
    ref = d64.copy()
    ref[:, post] = ref[:, post] + pre_trace[:, None]
    np.testing.assert_allclose(W.update_on_post(pre_trace, xlakern.BinaryArray(post)).todense(), ref, **TOL)
    # bad inputs name the argument
    with pytest.raises(xlakern.XlakernError, match="data"):
        Dense(np.ones(3))
    with pytest.raises(xlakern.XlakernError, match="shape"):
        Dense(d, shape=(5, 7))
    with pytest.raises(xlakern.XlakernError, match="other"):
        W.diag_add(np.ones(4, np.float32))
    with pytest.raises(xlakern.XlakernError, match="other"):
        W + np.ones((3, 5))
    with pytest.raises(xlakern.XlakernError, match="nse"):
        W.tocsr(nse=1)
    with pytest.raises(xlakern.XlakernError, match="data"):
        W.with_data(np.ones((5, 7), np.float32))


def test_dense_slice_rows_dt2t_conversions_and_refusals(rng):
    """What BrainEvent 0.3's own Dense tests ask of it, beside a NumPy reference: rows as a Dense (traced
    rows too), per-entry dt2t, tocsr/tocsc through fromdense's arguments, and the errors it raises."""
    d = rng.standard_normal((6, 4)).astype(np.float32)
    d[rng.random(d.shape) < 0.5] = 0
    d64 = d.astype(np.float64)
    W = Dense(d, backend="jnp", buffers={"tag": jnp.ones(2)})
    rows = rng.permutation(6)[:3]
    for index, expect in ((int(rows[0]), d64[rows[:1]]), (list(rows), d64[rows]), (slice(1, 5, 2), d64[1:5:2])):
        sub = W.slice_rows(index)
        assert type(sub) is Dense and sub.backend == "jnp" and sub.shape == expect.shape
        assert sorted(sub.buffers) == ["tag"]
        np.testing.assert_allclose(sub.todense(), expect, **TOL)
    traced = jax.jit(lambda W, r: W.slice_rows(r).todense())(W, jnp.asarray(rows))
    np.testing.assert_allclose(traced, d64[rows], **TOL)
    y_pre, y_post = rng.standard_normal(6).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(W.dt2t(y_pre, w), w.astype(np.float64) * y_pre[:, None], **TOL)
    np.testing.assert_allclose(W.dt2t_transposed(y_post, w), w.astype(np.float64) * y_post[None, :], **TOL)
    with pytest.warns(DeprecationWarning, match="yw_to_w"):
        np.testing.assert_allclose(W.yw_to_w(y_pre, w), w.astype(np.float64) * y_pre[:, None], **TOL)
    with pytest.raises(xlakern.event.EventShapeError, match="y has shape"):
        W.dt2t(y_post, w)
    with pytest.raises(xlakern.event.EventShapeError, match="w has shape"):
        W.dt2t_transposed(y_post, w.T)
    nnz = int(np.count_nonzero(d))
    for conv, cls in ((W.tocsr, xlakern.CSR), (W.tocsc, xlakern.CSC)):
        out = conv(nse=nnz + 3, index_dtype=jnp.int32, precompute_weight_indices=True)
        assert type(out) is cls and out.backend == "jnp" and out.nse == nnz + 3
        np.testing.assert_allclose(out.todense(), d64, **TOL)
    # a Dense combined with a sparse layout, and 3-D operands, are refused as BrainEvent refuses them
    with pytest.raises(NotImplementedError, match="todense"):
        W * xlakern.CSR.fromdense(d)
    with pytest.raises(UnsupportedOperationError):
        W + xlakern.CSR.fromdense(d)
    for bad in (lambda: W.T @ xlakern.WeightedArray(jnp.ones((6, 2, 2))), lambda: W @ jnp.ones((4, 2, 2)),
                lambda: xlakern.BinaryArray(jnp.ones((2, 2, 6))) @ d, lambda: xlakern.BinaryArray(jnp.ones(())) @ d):
        with pytest.raises(NotImplementedError, match="1-D or 2-D"):
            bad()
        with pytest.raises(xlakern.MathError):
            bad()


# ----------------------------------------------------------------------------- JITC

JITC = [("JITCScalar", (0.7,)), ("JITCUniform", (-0.2, 0.5)), ("JITCNormal", (0.1, 0.3))]
BASES = {"JITCScalar": JITCScalarMatrix, "JITCUniform": JITCUniformMatrix, "JITCNormal": JITCNormalMatrix}


@pytest.mark.parametrize("family,params", JITC)
@pytest.mark.parametrize("side", ["R", "C"])
def test_jitc_classes(family, params, side, rng):
    cls = getattr(xlakern, family + side)
    other = getattr(xlakern, family + ("C" if side == "R" else "R"))
    seed = int(rng.integers(0, 2 ** 31))
    W = cls(params + (0.2, seed), shape=(23, 17))
    assert isinstance(W, JITCMatrix) and isinstance(W, BASES[family]) and not isinstance(W, other)
    assert W.ndim == 2 and W.size == 23 * 17 and W.block_until_ready() is W
    dense = np.asarray(W.todense(), np.float64)
    for conv, out_cls in ((W.tocsr, xlakern.CSR), (W.tocsc, xlakern.CSC)):
        out = conv()
        assert type(out) is out_cls and out.shape == W.shape and out.nse == np.count_nonzero(dense)
        np.testing.assert_array_equal(np.asarray(out.todense(), np.float64), dense)
    if HAS_BRAINUNIT:  # tocoo returns a brainunit COO
        np.testing.assert_array_equal(np.asarray(W.tocoo().todense(), np.float64), dense)
    else:
        with pytest.raises(EventDependencyError, match="brainunit"):
            W.tocoo()
    np.testing.assert_allclose(W.sum(), dense.sum(), **TOL)
    np.testing.assert_allclose(W.sum(axis=0), dense.sum(axis=0), **TOL)
    assert type(W.transpose()) is other
    W.register_buffer("tag", jnp.arange(2))
    np.testing.assert_array_equal(W.T.tag, np.arange(2))
    np.testing.assert_array_equal(jax.jit(lambda W: W.tag + 1)(W), np.arange(2) + 1)
    for call in (lambda: W.update_on_pre(np.ones(23, bool), np.ones(17)),
                 lambda: W.update_on_post(np.ones(23), np.ones(17, bool)),
                 lambda: W.apply(jnp.abs), lambda: cls.fromdense(dense)):
        with pytest.raises(UnsupportedOperationError):
            call()
    with pytest.raises(xlakern.XlakernError, match="concrete"):
        jax.jit(lambda W: W.tocsr().data)(W)


def test_jitc_data_round_trips(rng):
    for family, params in JITC:
        W = getattr(xlakern, family + "R")(params + (0.3, int(rng.integers(0, 2 ** 31))), shape=(19, 11))
        assert W.data == (params[0] if len(params) == 1 else params)
        np.testing.assert_array_equal(W.with_data(W.data).todense(), W.todense())
        doubled = W.with_data(*(2 * p for p in params))
        np.testing.assert_allclose(doubled.todense(), 2 * np.asarray(W.todense()), rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- solve, delays, weight indices

def _square_case(rng, kind, n=12, shared=False):
    """A well-conditioned square layout: a random sparse matrix plus a diagonal that dominates it."""
    case = make_case(rng, kind, (n, n), 0.3, shared=shared)
    return case.W.diag_add(jnp.full((n,), 4.0 + case.W.nse / n, case.W.dtype)) if not shared else case.W


@pytest.mark.parametrize("kind", ["CSR", "CSC"])
def test_solve_matches_numpy(kind, rng):
    u = pytest.importorskip("brainunit")
    with x64_everywhere():
        W = _square_case(rng, kind)
        W = type(W)((jnp.asarray(W.data, jnp.float64), W.indices, W.indptr), shape=W.shape)
        dense = np.asarray(W.todense(), np.float64)
        b = rng.standard_normal(W.shape[0])
        x = W.solve(jnp.asarray(b))
        np.testing.assert_allclose(np.asarray(x), np.linalg.solve(dense, b), rtol=1e-9, atol=1e-10)
        # units: x = b / W
        Wu = type(W)((W.data * u.nS, W.indices, W.indptr), shape=W.shape)
        xu = Wu.solve(jnp.asarray(b) * u.mA)
        assert u.get_unit(xu) == u.get_unit(u.mA / u.nS)
        np.testing.assert_allclose(u.get_mantissa(xu.to(u.mA / u.nS)), np.linalg.solve(dense, b), rtol=1e-9)
        Dn = Dense(jnp.asarray(dense))
        np.testing.assert_allclose(np.asarray(Dn.solve(b)), np.linalg.solve(dense, b), rtol=1e-9, atol=1e-10)
    with pytest.raises(xlakern.XlakernError, match="square"):
        make_case(rng, kind, (5, 7), 0.5).W.solve(jnp.ones(5))
    with pytest.raises(xlakern.XlakernError, match="b has shape"):
        W.solve(jnp.ones(3))


@pytest.mark.parametrize("kind", KINDS)
def test_build_weight_indices_is_the_matrix(kind, rng):
    W = make_case(rng, kind, (9, 13), 0.3).W
    assert W.build_weight_indices() is W


def test_csr_delay_methods_match_the_functions(rng):
    case = make_case(rng, "CSR", (14, 10), 0.3)
    W, L = case.W, 6
    delays = jnp.asarray(rng.integers(1, L, W.nse), jnp.int32)
    ring = jnp.asarray(rng.standard_normal((L, 10)), jnp.float32)
    spikes = rng.random(14) < 0.5
    expect = np.asarray(ring, np.float64).copy()
    active = spikes[case.rows]
    np.add.at(expect, ((3 + np.asarray(delays)[active]) % L, case.cols[active]), case.weights[active])
    got = W.delay_deliver(ring, spikes, delays, 3)
    np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-5, atol=1e-5)
    layout = W.delay_layout(np.asarray(delays), n_slots=L)
    np.testing.assert_allclose(np.asarray(layout.deliver(ring, spikes, 3)), expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(xlakern.XlakernError, match="tocsr"):
        W.T.delay_deliver(jnp.zeros((L, 14)), np.ones(10, bool), 1, 0)


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["CSR", "CSC"])
def test_gpu_solve_and_delay_methods(kind, rng):
    with jax.default_device(jax.devices("gpu")[0]):
        test_solve_matches_numpy(kind, rng)  # cuSOLVER
        test_csr_delay_methods_match_the_functions(rng)


@pytest.mark.gpu
def test_gpu_dense_products_and_updates(rng):
    gpu = jax.devices("gpu")[0]
    d = rng.standard_normal((33, 21)).astype(np.float32)
    s_pre, s_post = rng.random(33) < 0.3, rng.random(21) < 0.3
    trace = rng.standard_normal(21).astype(np.float32)
    with jax.default_device(gpu):
        W = Dense(jnp.asarray(d))
        left = jax.jit(lambda W, s: xlakern.BinaryArray(s) @ W)(W, jnp.asarray(s_pre))
        right = jax.jit(lambda W, s: W @ xlakern.BinaryArray(s))(W, jnp.asarray(s_post))
        new = jax.jit(lambda W, s, t: W.update_on_pre(s, t, -1.0, 1.0))(W, jnp.asarray(s_pre), jnp.asarray(trace))
        assert left.devices() == {gpu}
    d64 = d.astype(np.float64)
    np.testing.assert_allclose(left, s_pre @ d64, **TOL)
    np.testing.assert_allclose(right, d64 @ s_post, **TOL)
    ref = d64.copy()
    ref[s_pre] = np.clip(ref[s_pre] + trace, -1.0, 1.0)
    np.testing.assert_allclose(new.todense(), ref, **TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_layout_conversions_and_updates(kind, rng):
    gpu = jax.devices("gpu")[0]
    with jax.default_device(gpu):
        case = make_case(rng, kind, (40, 27), 0.2)
        W = jax.device_put(case.W, gpu)
        post = rng.random(27) < 0.4
        pre_trace = rng.standard_normal(40).astype(np.float32)
        new = jax.jit(lambda W, t, s: W.update_on_post(t, s, -0.5, 0.5))(W, jnp.asarray(pre_trace), jnp.asarray(post))
        csc, csr = W.tocsc(), W.tocsr()
        assert new.data.devices() == {gpu}
    np.testing.assert_allclose(np.asarray(new.data).reshape(-1),
                               stdp_reference(case, post, pre_trace, -0.5, 0.5, on_pre=False), **TOL)
    np.testing.assert_allclose(csc.todense(), case.dense, **TOL)
    np.testing.assert_allclose(csr.todense(), case.dense, **TOL)
    np.testing.assert_allclose(W.sum(axis=1), case.dense.sum(axis=1), **TOL)


# ----------------------------------------------------------------------------- per-synapse products, row slices

@pytest.mark.parametrize("kind", KINDS)
def test_dt2t_methods_read_y_at_each_synapses_pre_or_post_neuron(rng, kind):
    case = make_case(rng, kind, (23, 31), 0.2)
    W = case.W
    w = rng.standard_normal(np.shape(W.data)).astype(np.float32)
    y_pre, y_post = rng.standard_normal(23), rng.standard_normal(31)
    w_flat = w.reshape(-1).astype(np.float64)
    got = np.asarray(W.dt2t(y_pre.astype(np.float32), w), np.float64).reshape(-1)
    np.testing.assert_allclose(got, w_flat * y_pre[case.rows], **TOL)
    got_t = np.asarray(jax.jit(lambda W, y, w: W.dt2t_transposed(y, w))(W, y_post.astype(np.float32), w))
    np.testing.assert_allclose(got_t.reshape(-1), w_flat * y_post[case.cols], **TOL)
    with pytest.warns(DeprecationWarning, match="use .dt2t instead"):
        np.testing.assert_allclose(np.asarray(W.yw_to_w(y_pre.astype(np.float32), w)).reshape(-1), got, **TOL)
    with pytest.raises(xlakern.XlakernError, match="y"):
        W.dt2t(y_post.astype(np.float32), w)  # 31 entries where shape[0] = 23


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shared", [False, True])
def test_slice_rows_is_the_dense_rows(rng, kind, shared):
    case = make_case(rng, kind, (19, 27), 0.25, shared=shared)
    dense = case.dense
    for index in ([3, 0, 18, 3], -1, slice(2, 11, 3), np.array([], np.int64)):
        sub = case.W.slice_rows(index)
        rows = np.arange(19)[index] if isinstance(index, slice) else np.atleast_1d(np.arange(19)[index])
        assert sub.shape == (len(rows), 27)
        np.testing.assert_allclose(np.asarray(sub.todense(), np.float64), dense[rows], **TOL)
    with pytest.raises(xlakern.XlakernError, match="out of range"):
        case.W.slice_rows([19])
    jitted = jax.jit(lambda W, i: W.slice_rows(i).todense())
    if type(case.W) is xlakern.FixedNumPerPre:  # a fixed count: the rows may be traced, as in BrainEvent
        picked = np.array([4, 0, 18, 4])
        np.testing.assert_allclose(np.asarray(jitted(case.W, jnp.asarray(picked)), np.float64), dense[picked],
                                   **TOL)
    else:
        with pytest.raises(xlakern.XlakernError, match="concrete"):
            jitted(case.W, jnp.array([1]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shared", [False, True])
def test_operators_and_row_indexing_as_brainevent(rng, kind, shared):
    """BrainEvent 0.3's operators on a layout: abs and % on the stored entries; + and - (either side) the
    dense result on CSR/CSC and the stored entries on fixed-count layouts; W[rows] the dense rows (an
    int, a negative int, a list, a tuple, an array, a slice; under jit too); len() and iteration over
    the rows. Against float64 numpy on a random layout."""
    m, n = 23, 31
    case = make_case(rng, kind, (m, n), 0.3, shared=shared)
    W, dense, mask = case.W, case.dense, case.mask
    other, scalar = rng.standard_normal((m, n)), float(rng.uniform(0.5, 2.0))
    np.testing.assert_allclose(abs(W).todense(), np.abs(dense), **TOL)
    assert type(abs(W)) is type(W)
    np.testing.assert_allclose((W % 0.7).todense(), np.where(mask, np.mod(dense, 0.7), 0), **TOL)
    for got, want_dense, want_stored in ((W + scalar, dense + scalar, np.where(mask, dense + scalar, 0)),
                                         (scalar + W, dense + scalar, np.where(mask, dense + scalar, 0)),
                                         (W - other, dense - other, np.where(mask, dense - other, 0)),
                                         (other - W, other - dense, np.where(mask, other - dense, 0))):
        if kind in ("CSR", "CSC"):
            np.testing.assert_allclose(got, want_dense, **TOL)
        else:
            np.testing.assert_allclose(got.todense(), want_stored, **TOL)
    assert len(W) == m
    for index in (0, m - 1, -1, -m, [3, 0, 3, m - 1], (5, 2), np.array([7, -2]), jnp.array([1, 4]), slice(2, 19, 4),
                  slice(None), []):
        want = dense[np.asarray(index, np.int64) if isinstance(index, (list, tuple)) else index]
        np.testing.assert_allclose(np.asarray(W[index], np.float64), want, **TOL, err_msg=repr(index))
    np.testing.assert_allclose(np.stack([np.asarray(r, np.float64) for r in W]), dense, **TOL)
    rows = jnp.array([m - 1, 2, -3])
    np.testing.assert_allclose(jax.jit(lambda W, r: W[r])(W, rows), dense[np.asarray(rows)], **TOL)
    for bad in (m, -m - 1, [0, m]):
        with pytest.raises(IndexError, match="out of range"):
            W[bad]
    for bad in (0.5, None, "a", [0, [1, 2]]):  # not rows; jax's own errors for the last three named no call
        with pytest.raises(xlakern.EventIndexError, match=r"CSR|CSC|FixedNum"):
            W[bad]


@pytest.mark.parametrize("kind", KINDS + ["Dense"])
def test_layouts_name_an_array_jax_cannot_read(rng, kind):
    """A layout built (or given new weights by with_data) from None, a string or a ragged list: an
    EventDTypeError naming the layout and the argument, where jax's own error named neither. The layout
    built from the same arrays as lists still multiplies as float64 NumPy does."""
    import re

    from xlakern.event import EventDTypeError

    if kind == "Dense":
        d = rng.standard_normal((5, 4))
        W, dense = Dense(jnp.asarray(d, jnp.float32)), d
        builds = {"Dense: data is None": lambda: Dense(None), "Dense: data is a str": lambda: Dense("w")}
        again = Dense(d.astype(np.float32).tolist())
    else:
        case = make_case(rng, kind, (9, 13), 0.3)
        W, dense = case.W, case.dense
        arrays = [np.asarray(a) for a in W._arrays()]
        cls = type(W)
        builds = {f"{kind}: data is None": lambda: cls((None, *arrays[1:]), shape=W.shape),
                  f"{kind}: indices is a str": lambda: cls((arrays[0], "0 1", *arrays[2:]), shape=W.shape),
                  f"{kind}: indices cannot be read as an array": lambda: cls((arrays[0], [[0, 1], [2]],
                                                                              *arrays[2:]), shape=W.shape)}
        if len(arrays) == 3:
            builds[f"{kind}: indptr is None"] = lambda: cls((arrays[0], arrays[1], None), shape=W.shape)
        again = cls(tuple(a.tolist() for a in arrays), shape=W.shape)
    builds[f"{kind}: data is None"] = lambda: W.with_data(None)
    builds[f"{kind}: data is a str ('heavy')"] = lambda: W.with_data("heavy")
    for message, build in builds.items():
        with pytest.raises(EventDTypeError, match=re.escape(message)):
            build()
    x = rng.standard_normal(dense.shape[1])
    np.testing.assert_allclose(np.asarray(again @ jnp.asarray(x, jnp.float32), np.float64), dense @ x, **TOL)


def test_layout_methods_name_an_argument_they_cannot_use(rng):
    """solve, diag_add, delay_layout, apply and apply2 given None, a string or a non-integer slot count: an
    XlakernError naming the method and the argument. An integral float slot count is read as an int."""
    import re

    from xlakern.event import EventArgumentError, EventDTypeError, EventOperandError

    case = make_case(rng, "CSR", (6, 6), 0.5)
    W = case.W
    delays = rng.integers(1, 4, W.nse).astype(np.int32)
    cases = [
        (EventDTypeError, lambda: W.solve(None), "CSR.solve: b is None"),
        (EventDTypeError, lambda: W.T.diag_add("1"), "CSC.diag_add: other is a str ('1')"),
        (EventArgumentError, lambda: W.delay_layout(delays, None), "CSRDelayLayout.build: n_slots must be an int; got None"),
        (EventArgumentError, lambda: W.delay_layout(delays, 4.5), "n_slots must be an int; got 4.5"),
        (EventOperandError, lambda: W.apply(None), "CSR.apply: fn must be a function of the weights; got NoneType"),
        (EventOperandError, lambda: W.apply2(2.0, "mul"), "CSR.apply2: fn must be a function of the weights; got str"),
        (EventOperandError, lambda: Dense(jnp.ones((3, 3))).apply2(None, operator.mul), "Dense.apply2: other is a NoneType"),
    ]
    for error, call, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            call()
    assert W.delay_layout(delays, 4.0).n_slots == 4
    d = rng.standard_normal(6)
    np.testing.assert_allclose(np.asarray(W.diag_add(jnp.asarray(d, jnp.float32)).todense(), np.float64),
                               case.dense + np.diag(d), **TOL)


@pytest.mark.parametrize("kind", KINDS + ["Dense"])
def test_operators_keep_units(rng, kind):
    u = pytest.importorskip("brainunit")
    if kind == "Dense":
        dense = rng.standard_normal((5, 8))
        W, mask = xlakern.Dense(jnp.asarray(dense, jnp.float32) * u.mV), np.ones((5, 8), bool)
    else:
        case = make_case(rng, kind, (5, 8), 0.4)
        dense, mask = case.dense, case.mask
        W = type(case.W)((case.W.data * u.mV,) + case.W._arrays()[1:], shape=case.W.shape)
    as_mv = lambda x: np.asarray((x.todense() if hasattr(x, "todense") else x).to_decimal(u.mV), np.float64)
    np.testing.assert_allclose(as_mv(abs(W)), np.abs(dense), **TOL)
    np.testing.assert_allclose(as_mv(W[1]), dense[1], **TOL)
    summed = W + 0.5 * u.mV
    want = dense + 0.5 if kind in ("CSR", "CSC", "Dense") else np.where(mask, dense + 0.5, 0)
    np.testing.assert_allclose(as_mv(summed), want, **TOL)
    for bad in (lambda: W + 0.5, lambda: 0.5 - W, lambda: W % (1 * u.second)):
        with pytest.raises(xlakern.event.EventUnitError, match="unit"):
            bad()


def test_dense_indexing_and_iteration(rng):
    d = rng.standard_normal((6, 4)).astype(np.float32)
    W = xlakern.Dense(d)
    assert len(W) == 6
    np.testing.assert_array_equal(W[2], d[2])
    np.testing.assert_array_equal(W[:, 1], d[:, 1])
    np.testing.assert_array_equal(W[-1, 3], d[-1, 3])
    np.testing.assert_array_equal(W[[4, 0, 4]], d[[4, 0, 4]])  # a list selects rows, as in NumPy
    np.testing.assert_array_equal(W[[1, 3], [0, 2]], d[[1, 3], [0, 2]])
    np.testing.assert_array_equal(np.stack([np.asarray(r) for r in W]), d)
    np.testing.assert_allclose((W % 0.5).todense(), np.mod(d, 0.5), rtol=1e-6, atol=1e-6)
    with pytest.raises(IndexError, match="out of range"):
        W[6]


@pytest.mark.parametrize("cls", ["JITCUniformR", "JITCUniformC", "JITCNormalR", "JITCScalarC"])
def test_jitc_dt2t_methods_list_the_generated_synapses(rng, cls):
    shape = (37, 29)
    params = {"JITCUniformR": (0.1, 0.9), "JITCUniformC": (0.1, 0.9), "JITCNormalR": (0.5, 0.2),
              "JITCScalarC": (0.7,)}[cls]
    W = getattr(xlakern, cls)((*params, 0.15, int(rng.integers(1 << 30))), shape=shape)
    dense = np.asarray(W.todense(), np.float64)
    stored = dense.T if cls.endswith("C") else dense  # the kernels generate this matrix's rows
    r, c = np.nonzero(stored)
    pre, post = (c, r) if cls.endswith("C") else (r, c)
    y_pre, y_post = rng.standard_normal(shape[0]), rng.standard_normal(shape[1])
    got = np.asarray(W.dt2t(y_pre.astype(np.float32), None), np.float64)
    np.testing.assert_allclose(got, dense[pre, post] * y_pre[pre], **TOL)
    got_t = np.asarray(W.dt2t_transposed(y_post.astype(np.float32), None), np.float64)
    np.testing.assert_allclose(got_t, dense[pre, post] * y_post[post], **TOL)


@pytest.mark.parametrize("cls", ["CSR", "CSC"])
def test_fromdense_takes_brainevent_arguments_and_nse_under_jit(rng, cls):
    """BrainEvent 0.3's fromdense(mat, *, nse, index_dtype, indptr_dtype, backend,
    precompute_weight_indices): nse pads with slots no product reads and works on a traced matrix."""
    klass = getattr(xlakern, cls)
    dense = np.where(rng.random((6, 5)) < 0.4, rng.standard_normal((6, 5)), 0.0).astype(np.float32)
    dense[2] = 0.0  # an empty row
    dense[0, 0] = 1.5
    count = int(np.count_nonzero(dense))
    s_left, s_right = rng.random(6) < 0.6, rng.random(5) < 0.6
    for W in (klass.fromdense(dense, nse=count + 4, backend="jnp", precompute_weight_indices=True),
              jax.jit(lambda m: klass.fromdense(m, nse=count + 4))(jnp.asarray(dense))):
        assert W.nse == count + 4
        np.testing.assert_array_equal(np.asarray(W.todense()), dense)
        np.testing.assert_allclose(xlakern.BinaryArray(s_left) @ W, s_left @ dense.astype(np.float64), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(W @ xlakern.BinaryArray(s_right), dense.astype(np.float64) @ s_right, rtol=1e-5,
                                   atol=1e-6)
    assert klass.fromdense(dense, backend="jnp").backend == "jnp"
    traced = jax.jit(lambda m: klass.fromdense(m, nse=count).todense())(jnp.asarray(dense))
    np.testing.assert_array_equal(np.asarray(traced), dense)
    with pytest.raises(xlakern.event.EventShapeError, match=rf"{count} non-zeros, more than nse={count - 1}"):
        klass.fromdense(dense, nse=count - 1)
    with pytest.raises(xlakern.event.EventDTypeError, match="indptr_dtype=int64 needs 64-bit"):
        klass.fromdense(dense, indptr_dtype=jnp.int64)
    with x64():
        assert klass.fromdense(dense, indptr_dtype=jnp.int64).indptr.dtype == jnp.int64
    with pytest.raises(xlakern.event.EventDTypeError, match="indptr_dtype must be"):
        klass.fromdense(dense, indptr_dtype=jnp.float32)
    assert xlakern.FixedNumPerPre.fromdense(np.eye(4), backend="jnp").backend == "jnp"
