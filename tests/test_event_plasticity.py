"""Plasticity updates (xlakern.event._plasticity) against a NumPy STDP loop over 100 steps, for
every layout; in-place aliasing; untouched synapses; errors; deprecated names."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import x64
from test_event_jitc import assert_cuda_compiles
from xlakern.event import EventShapeError

N_PRE, N_POST, STEPS = 40, 30, 100
A_PRE, A_POST, DECAY, W_MIN, W_MAX = 0.03, 0.025, 0.9, 0.0, 1.0


def network(rng, density=0.25):
    mask = rng.random((N_PRE, N_POST)) < density
    mask[3] = False  # an empty row
    w = np.where(mask, rng.uniform(0.2, 0.8, (N_PRE, N_POST)), 0.0)
    return mask, w


def spike_trains(rng):
    return rng.random((STEPS, N_PRE)) < 0.15, rng.random((STEPS, N_POST)) < 0.15


def numpy_stdp(mask, w, pre, post, use_pre=True, use_post=True):
    """Pair-based STDP on the dense matrix: depression on pre spikes, potentiation on post spikes."""
    w = w.copy()
    x_pre, x_post = np.zeros(N_PRE), np.zeros(N_POST)
    for t in range(STEPS):
        x_pre = x_pre * DECAY + pre[t]
        x_post = x_post * DECAY + post[t]
        if use_pre:
            rows = pre[t][:, None] & mask
            w = np.where(rows, np.clip(w - A_PRE * x_post[None, :], W_MIN, W_MAX), w)
        if use_post:
            cols = post[t][None, :] & mask
            w = np.where(cols, np.clip(w + A_POST * x_pre[:, None], W_MIN, W_MAX), w)
    return w


def run_loop(on_pre, on_post, w0, pre, post, structure=()):
    """The same loop in jax: one jitted scan, the weights carried (and updated in place). ``structure``:
    arrays passed into the jitted loop as arguments (so traced) and on to on_pre / on_post after their
    own arguments."""
    @jax.jit
    def loop(w, pre, post, structure):
        def step(carry, s):
            w, x_pre, x_post = carry
            sp, so = s
            x_pre = x_pre * DECAY + sp
            x_post = x_post * DECAY + so
            if on_pre is not None:
                w = on_pre(w, sp, -A_PRE * x_post, *structure)
            if on_post is not None:
                w = on_post(w, A_POST * x_pre, so, *structure)
            return (w, x_pre, x_post), None
        init = (w, jnp.zeros(N_PRE, w.dtype), jnp.zeros(N_POST, w.dtype))
        return jax.lax.scan(step, init, (pre, post))[0][0]
    return np.asarray(loop(w0, jnp.asarray(pre), jnp.asarray(post), tuple(jnp.asarray(a) for a in structure)))


def csr_of(mask, w):
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    perm = np.argsort(cols, kind="stable").astype(np.int32)  # CSC view of the CSR synapses
    csc_indptr = np.concatenate([[0], np.cumsum(mask.sum(0))]).astype(np.int32)
    return w[rows, cols], cols.astype(np.int32), indptr, rows[perm].astype(np.int32), csc_indptr, perm


def to_dense(mask, data):
    out = np.zeros(mask.shape)
    out[mask] = data
    return out


@pytest.mark.parametrize("backend", [None, "jnp"])
def test_csr_stdp_matches_numpy(backend, rng):
    mask, w = network(rng)
    pre, post = spike_trains(rng)
    with x64():
        data, indices, indptr, csc_idx, csc_ptr, perm = csr_of(mask, w)
        kw = dict(w_min=W_MIN, w_max=W_MAX, shape=(N_PRE, N_POST), backend=backend)
        got = run_loop(lambda w, s, tr: xlakern.update_csr_on_binary_pre(w, indices, indptr, s, tr, **kw),
                       lambda w, tr, s: xlakern.update_csr_on_binary_post(w, csc_idx, csc_ptr, perm, tr, s, **kw),
                       jnp.asarray(data), pre, post)
        want = numpy_stdp(mask, w, pre, post)
        np.testing.assert_allclose(to_dense(mask, got), want, rtol=1e-12, atol=1e-12)
        assert (want != w).any() and (want == W_MIN).any()  # the rule moved weights and clipped some


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("backend", [None, "jnp"])
def test_csc_stdp_matches_numpy(backend, traced, rng):
    """Closed over, the CSC structure is regrouped by presynaptic neuron once, while tracing; passed into
    the jitted loop (traced), the presynaptic update is one pass over every synapse instead."""
    mask, w = network(rng)
    pre, post = spike_trains(rng)
    with x64():
        # CSC storage = CSR of the transpose
        data_t, indices_t, indptr_t, *_ = csr_of(mask.T, w.T)
        kw = dict(w_min=W_MIN, w_max=W_MAX, shape=(N_PRE, N_POST), backend=backend)
        closed = (indices_t, indptr_t)
        structure = lambda given: given or closed  # noqa: E731  (the loop's arguments, else the closure)
        got = run_loop(lambda w, s, tr, *g: xlakern.update_csc_on_binary_pre(w, *structure(g), s, tr, **kw),
                       lambda w, tr, s, *g: xlakern.update_csc_on_binary_post(w, *structure(g), tr, s, **kw),
                       jnp.asarray(data_t), pre, post, structure=closed if traced else ())
        want = numpy_stdp(mask, w, pre, post)
        np.testing.assert_allclose(to_dense(mask.T, got).T, want, rtol=1e-12, atol=1e-12)


def test_other_side_updates_never_sort_inside_the_graph(rng):
    """update_csc_on_binary_pre and update_on_post of layouts stored by presynaptic neuron: closed over
    (NumPy, jnp, a layout), the structure is regrouped while tracing; passed in, the update makes one
    pass. Neither stages a sort of every synapse into the jitted graph (which XLA also constant-folded,
    for minutes at 3.2M synapses)."""
    n, k = 30, 4
    idx = rng.integers(0, n, n * k).astype(np.int32)
    ptr = np.arange(0, n * k + 1, k).astype(np.int32)
    w = rng.uniform(0, 1, n * k).astype(np.float32)
    tr = rng.standard_normal(n).astype(np.float32)
    s = rng.random(n) < 0.3
    staged = lambda f, *a: str(jax.make_jaxpr(f)(*a))  # noqa: E731
    csc = lambda w, i, p: xlakern.update_csc_on_binary_pre(w, i, p, s, tr, 0.0, 1.0, shape=(n, n))  # noqa: E731
    fixed = (w.reshape(n, k), idx.reshape(n, k))
    layouts = [xlakern.CSR((w, idx, ptr), shape=(n, n)),
               xlakern.CSR((jnp.asarray(w), jnp.asarray(idx), jnp.asarray(ptr)), shape=(n, n)),
               xlakern.CSC((w, idx, ptr), shape=(n, n)), xlakern.FixedNumPerPre(fixed, shape=(n, n)),
               xlakern.FixedNumPerPost(fixed, shape=(n, n))]
    graphs = [staged(lambda w: csc(w, idx, ptr), w), staged(lambda w: csc(w, idx.tolist(), ptr.tolist()), w),
              staged(lambda w: csc(w, jnp.asarray(idx), jnp.asarray(ptr)), w), staged(csc, w, idx, ptr)]
    for W in layouts:  # the update on the side the layout is not stored by
        flipped = isinstance(W, (xlakern.CSC, xlakern.FixedNumPerPost))
        other_side = (lambda W: W.update_on_pre(s, tr, 0.0, 1.0)) if flipped else \
            (lambda W: W.update_on_post(tr, s, 0.0, 1.0))
        graphs += [staged(lambda: other_side(W).data), staged(lambda W: other_side(W).data, W)]
    for g in graphs:
        assert " sort" not in g, g


def test_csc_pre_update_of_a_traced_structure_matches_the_kernel(rng):
    """The one-pass update (a traced structure) against the kernel's (closed over): float, NaN, negative
    and zero spikes; column indices out of range; slots before the first column and after the last; no
    bounds, one bound, two; weights, trace and bounds differentiated."""
    n_pre, n_post, nse = 23, 17, 150
    indices = rng.integers(0, n_pre, nse).astype(np.int32)
    indices[::11] = n_pre + 3  # out of range: never updated
    indices[5::13] = -2
    indptr = np.concatenate([[4], np.sort(rng.integers(4, nse - 6, n_post - 1)), [nse - 6]]).astype(np.int32)
    spikes = np.where(rng.random(n_pre) < 0.5, rng.standard_normal(n_pre), 0.0).astype(np.float32)
    spikes[:3] = [np.nan, -1.0, 0.0]
    w = rng.uniform(-1, 1, nse).astype(np.float32)
    trace = rng.uniform(-0.6, 0.6, n_post).astype(np.float32)
    c = rng.standard_normal(nse).astype(np.float32)
    for lo, hi in ((None, None), (-0.5, None), (-0.5, 0.5)):
        def loss(w, tr, lo_, hi_, i, p):
            return jnp.sum(c * xlakern.update_csc_on_binary_pre(w, i, p, spikes, tr, lo_, hi_, shape=(n_pre, n_post)))

        bounds = (None if lo is None else jnp.float32(lo), None if hi is None else jnp.float32(hi))
        argnums = (0, 1) + tuple(k + 2 for k, b in enumerate(bounds) if b is not None)
        traced = jax.jit(jax.value_and_grad(loss, argnums=argnums))(w, trace, *bounds, indices, indptr)
        closed = jax.jit(jax.value_and_grad(lambda w, tr, lo_, hi_: loss(w, tr, lo_, hi_, indices, indptr),
                                            argnums=argnums))(w, trace, *bounds)
        np.testing.assert_allclose(traced[0], closed[0], rtol=1e-6, atol=1e-6)
        for g_traced, g_closed in zip(traced[1], closed[1]):
            np.testing.assert_allclose(g_traced, g_closed, rtol=1e-6, atol=1e-6)
    # and against NumPy, the last bounds: the synapses of spiking presynaptic neurons, in range, inside a column
    cols = np.searchsorted(indptr, np.arange(nse), side="right") - 1
    hit = (cols >= 0) & (cols < n_post) & (indices >= 0) & (indices < n_pre)
    hit[hit] &= spikes[indices[hit]] != 0
    want = w.astype(np.float64)
    want[hit] = np.clip(want[hit] + trace[cols[hit]], -0.5, 0.5)
    got = jax.jit(lambda w, i, p: xlakern.update_csc_on_binary_pre(w, i, p, spikes, trace, -0.5, 0.5,
                                                                   shape=(n_pre, n_post)))(w, indices, indptr)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert hit.any() and (~hit).any()


@pytest.mark.parametrize("backend", [None, "jnp"])
def test_dense_stdp_matches_numpy(backend, rng):
    mask = np.ones((N_PRE, N_POST), bool)
    w = rng.uniform(0.2, 0.8, (N_PRE, N_POST))
    pre, post = spike_trains(rng)
    with x64():
        kw = dict(w_min=W_MIN, w_max=W_MAX, backend=backend)
        got = run_loop(lambda w, s, tr: xlakern.update_dense_on_binary_pre(w, s, tr, **kw),
                       lambda w, tr, s: xlakern.update_dense_on_binary_post(w, tr, s, **kw),
                       jnp.asarray(w), pre, post)
        np.testing.assert_allclose(got, numpy_stdp(mask, w, pre, post), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", [None, "jnp"])
def test_fixed_count_stdp_matches_numpy(backend, rng):
    k = 7
    pre, post = spike_trains(rng)
    with x64():
        # fixed post count: each pre neuron has K distinct targets
        idx = np.stack([rng.choice(N_POST, k, replace=False) for _ in range(N_PRE)]).astype(np.int32)
        mask = np.zeros((N_PRE, N_POST), bool)
        mask[np.arange(N_PRE)[:, None], idx] = True
        w = np.where(mask, rng.uniform(0.2, 0.8, mask.shape), 0.0)
        data = w[np.arange(N_PRE)[:, None], idx]
        got = run_loop(lambda w, s, tr: xlakern.update_fixed_post_conn_on_binary_pre(
            w, idx, s, tr, W_MIN, W_MAX, shape=(N_PRE, N_POST), backend=backend), None, jnp.asarray(data), pre, post)
        want = numpy_stdp(mask, w, pre, post, use_post=False)
        np.testing.assert_allclose(got, want[np.arange(N_PRE)[:, None], idx], rtol=1e-12, atol=1e-12)
        # fixed pre count: each post neuron has K distinct sources
        idx = np.stack([rng.choice(N_PRE, k, replace=False) for _ in range(N_POST)]).astype(np.int32)
        mask = np.zeros((N_PRE, N_POST), bool)
        mask[idx, np.arange(N_POST)[:, None]] = True
        w = np.where(mask, rng.uniform(0.2, 0.8, mask.shape), 0.0)
        data = w[idx, np.arange(N_POST)[:, None]]
        got = run_loop(None, lambda w, tr, s: xlakern.update_fixed_pre_conn_on_binary_post(
            w, idx, tr, s, W_MIN, W_MAX, shape=(N_PRE, N_POST), backend=backend), jnp.asarray(data), pre, post)
        want = numpy_stdp(mask, w, pre, post, use_pre=False)
        np.testing.assert_allclose(got, want[idx, np.arange(N_POST)[:, None]], rtol=1e-12, atol=1e-12)


def test_only_active_rows_are_touched_and_unbounded_by_default(rng):
    mask, w = network(rng)
    data, indices, indptr, *_ = csr_of(mask, w)
    data = data.astype(np.float32)
    data[0] = 5.0  # outside any later bound: stays unless its row spikes
    spikes = np.zeros(N_PRE, bool)
    spikes[rng.choice(np.arange(1, N_PRE), 5, replace=False)] = True
    trace = rng.standard_normal(N_POST).astype(np.float32)
    out = np.asarray(xlakern.update_csr_on_binary_pre(data, indices, indptr, spikes, trace, shape=(N_PRE, N_POST)))
    rows = np.repeat(np.arange(N_PRE), np.diff(indptr))
    touched = spikes[rows]
    np.testing.assert_array_equal(out[~touched], data[~touched])
    np.testing.assert_allclose(out[touched], data[touched] + trace[indices[touched]], rtol=1e-6)
    assert out[0] == 5.0


def test_long_walks_over_many_row_chunks(rng):
    """Thousands of rows of 0-300 synapses (some rows' slots span more than the 1 KiB the CPU walk
    requests ahead), spikes in bursts (stretches of rows with none, stretches where every row spikes), so
    the threads' shares of rows end with 0-3 active rows ahead of their walk; the presynaptic update of the
    CSR rows (some indices out of range) and the postsynaptic one through the permuted CSC view of ~1,600
    synapses a column, against NumPy in float64."""
    n_pre, n_post = 3001, 257
    lengths = rng.integers(0, 301, n_pre)
    lengths[rng.random(n_pre) < 0.1] = 0  # empty rows
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    nse = int(indptr[-1])
    indices = rng.integers(0, n_post, nse).astype(np.int32)
    indices[rng.random(nse) < 0.01] = n_post + 7  # out of range: never updated
    rows = np.repeat(np.arange(n_pre), lengths)
    data = rng.uniform(0.2, 0.8, nse)
    burst = np.repeat(rng.random(n_pre // 50 + 1) < 0.3, 50)[:n_pre]  # runs of 50 rows that may spike
    pre_spikes = burst & (rng.random(n_pre) < rng.choice([0.05, 1.0], n_pre))
    post_spikes = rng.random(n_post) < 0.2
    post_trace = rng.normal(0.0, 0.3, n_post)
    pre_trace = rng.normal(0.0, 0.3, n_pre)
    inside = indices < n_post
    cols = np.where(inside, indices, rng.integers(0, n_post, nse))  # the CSC view holds every synapse
    perm = np.argsort(cols, kind="stable").astype(np.int32)
    csc_ptr = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=n_post))]).astype(np.int32)
    csc_idx = rows[perm].astype(np.int32)
    with x64():
        got_pre = np.asarray(xlakern.update_csr_on_binary_pre(data, indices, indptr, pre_spikes, post_trace, W_MIN,
                                                              W_MAX, shape=(n_pre, n_post)))
        got_post = np.asarray(xlakern.update_csr_on_binary_post(data, csc_idx, csc_ptr, perm, pre_trace, post_spikes,
                                                                W_MIN, W_MAX, shape=(n_pre, n_post)))
    hit = pre_spikes[rows] & inside
    want_pre = data.copy()
    want_pre[hit] = np.clip(data[hit] + post_trace[indices[hit]], W_MIN, W_MAX)
    np.testing.assert_allclose(got_pre, want_pre, rtol=1e-12, atol=1e-12)
    hit = post_spikes[cols]
    want_post = data.copy()
    want_post[hit] = np.clip(data[hit] + pre_trace[rows[hit]], W_MIN, W_MAX)
    np.testing.assert_allclose(got_post, want_post, rtol=1e-12, atol=1e-12)
    assert 50 < pre_spikes.sum() < n_pre // 2 and (got_pre != data).sum() > 1000 and (got_post != data).sum() > 1000


def test_updates_alias_the_weight_buffer(rng):
    mask, w = network(rng)
    data, indices, indptr, *_ = csr_of(mask, w)
    f = jax.jit(lambda w, s, tr: xlakern.update_csr_on_binary_pre(w, indices, indptr, s, tr, 0.0, 1.0,
                                                                  shape=(N_PRE, N_POST)), donate_argnums=0)
    hlo = f.lower(jnp.asarray(data, jnp.float32), np.ones(N_PRE, bool), np.ones(N_POST, np.float32)).as_text()
    assert "output_operand_alias" in hlo or "input_output_alias" in hlo
    w0 = jnp.asarray(data, jnp.float32)
    ptr = w0.unsafe_buffer_pointer()
    w1 = f(w0, np.ones(N_PRE, bool), np.full(N_POST, 0.01, np.float32))
    assert w1.unsafe_buffer_pointer() == ptr  # updated where it lay: no copy of the weights
    np.testing.assert_allclose(np.asarray(w1), np.clip(data + 0.01, 0, 1), rtol=1e-6)


def test_units_and_errors(rng):
    mask, w = network(rng)
    data, indices, indptr, *_ = csr_of(mask, w)
    with pytest.raises(EventShapeError, match="one weight per synapse"):
        xlakern.update_csr_on_binary_pre(np.ones(1, np.float32), indices, indptr, np.ones(N_PRE, bool),
                                         np.ones(N_POST, np.float32), shape=(N_PRE, N_POST))
    with pytest.raises(EventShapeError, match="trace"):
        xlakern.update_csr_on_binary_pre(data, indices, indptr, np.ones(N_PRE, bool), np.ones(N_POST + 1),
                                         shape=(N_PRE, N_POST))
    with pytest.raises(EventShapeError, match="spikes"):
        xlakern.update_dense_on_binary_pre(w, np.ones(N_PRE + 1, bool), np.ones(N_POST))
    bu = pytest.importorskip("brainunit")
    out = xlakern.update_dense_on_binary_pre(w * bu.mS, np.ones(N_PRE, bool), np.full(N_POST, 100.0) * bu.uS,
                                             w_max=0.5 * bu.mS)
    np.testing.assert_allclose(out.to(bu.mS).mantissa, np.minimum(w + 0.1, 0.5), rtol=1e-6)


def test_units_convert_or_are_refused_by_argument(rng):
    """A trace and bounds in another unit of the weights' dimension are converted (against NumPy in
    float64 on random spikes and traces); a unit of another dimension, or a unit where the weights have
    none, is an EventUnitError naming the argument (not brainunit's error, which names neither)."""
    bu = pytest.importorskip("brainunit")
    mask, w = network(rng)
    data, indices, indptr, *_ = csr_of(mask, w)
    spikes = rng.random(N_PRE) < 0.4
    trace_us = rng.uniform(-300.0, 300.0, N_POST)  # µS, against weights in mS
    out = xlakern.update_csr_on_binary_pre(data * bu.mS, indices, indptr, spikes, trace_us * bu.uS, 200.0 * bu.uS,
                                           0.7 * bu.mS, shape=(N_PRE, N_POST))
    rows = np.repeat(np.arange(N_PRE), np.diff(indptr))
    want = np.where(spikes[rows], np.clip(data + trace_us[indices] / 1000.0, 0.2, 0.7), data)
    np.testing.assert_allclose(out.to(bu.mS).mantissa, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want, data)  # the update touched synapses

    call = dict(indices=indices, indptr=indptr, pre_spike=spikes, shape=(N_PRE, N_POST))
    trace = trace_us * 1e-3
    for kwargs, arg in [(dict(post_trace=trace * bu.mV), "the trace"),
                        (dict(post_trace=trace * bu.mS, w_min=0.0 * bu.mV), "w_min"),
                        (dict(post_trace=trace * bu.mS, w_max=1.0 * bu.second), "w_max")]:
        with pytest.raises(xlakern.event.EventUnitError, match=f"{arg} is in .* does not convert .* mS"):
            xlakern.update_csr_on_binary_pre(data * bu.mS, **call, **kwargs)
    with pytest.raises(xlakern.event.EventUnitError, match="the trace is in mS but the weights carry no unit"):
        xlakern.update_csr_on_binary_pre(data, **call, post_trace=trace * bu.mS)
    # a dimensionless quantity beside plain weights is a plain number
    plain = xlakern.update_csr_on_binary_pre(data, **call, post_trace=bu.Quantity(trace))
    np.testing.assert_allclose(np.asarray(plain), np.where(spikes[rows], data + trace[indices], data), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("backend", [None, "jnp"])
def test_w_min_above_w_max_is_refused_or_clips_to_w_max_everywhere(backend, rng):
    """Known bounds with w_min > w_max are an error; traced ones (unknown until run) give what jnp.clip gives,
    w_max on every touched synapse, on the kernels and the reference alike, and on the path a traced CSC
    structure takes (its own clip)."""
    from xlakern.event import EventArgumentError

    mask, w = network(rng)
    data, indices, indptr, _, csc_indptr, perm = csr_of(mask, w)
    spikes = rng.random(N_PRE) < 0.4
    trace = rng.uniform(-0.3, 0.3, N_POST).astype(np.float32)
    data32 = data.astype(np.float32)
    with pytest.raises(EventArgumentError, match=r"w_min \(0.8\) is above w_max \(0.2\)"):
        xlakern.update_csr_on_binary_pre(data32, indices, indptr, spikes, trace, 0.8, 0.2, shape=(N_PRE, N_POST),
                                         backend=backend)
    with pytest.raises(EventShapeError, match=r"w_max has shape \(2,\); it must be one number"):
        xlakern.update_csr_on_binary_pre(data32, indices, indptr, spikes, trace, 0.0, np.ones(2), shape=(N_PRE, N_POST),
                                         backend=backend)
    with pytest.raises(EventArgumentError, match="w_min"):
        xlakern.update_dense_on_binary_post(w.astype(np.float32), np.zeros(N_PRE, np.float32), np.ones(N_POST, bool),
                                            np.float32(1.0), np.float32(0.5), backend=backend)

    rows = np.repeat(np.arange(N_PRE), np.diff(indptr))
    touched = spikes[rows]
    want = np.where(touched, np.minimum(np.maximum(data32 + trace[indices], 0.8), 0.2), data32)
    assert touched.any() and (data32[touched] + trace[indices][touched] < 0.8).any()  # the case that differed
    got = jax.jit(lambda lo, hi: xlakern.update_csr_on_binary_pre(
        data32, indices, indptr, spikes, trace, lo, hi, shape=(N_PRE, N_POST), backend=backend))(0.8, 0.2)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    # a traced CSC structure: update_csc_on_binary_pre walks every synapse once with its own clip
    csc_data = data32[perm]
    csc_rows = rows[perm].astype(np.int32)
    got = jax.jit(lambda idx, ptr, lo, hi: xlakern.update_csc_on_binary_pre(
        csc_data, idx, ptr, spikes, trace, lo, hi, shape=(N_PRE, N_POST), backend=backend))(
        csc_rows, csc_indptr, 0.8, 0.2)
    np.testing.assert_allclose(np.asarray(got), want[perm], rtol=1e-6)


def test_deprecated_names():
    with pytest.warns(DeprecationWarning):
        assert xlakern.csr_on_pre is xlakern.update_csr_on_binary_pre
    with pytest.warns(DeprecationWarning):
        assert xlakern.csr2csc_on_post is xlakern.update_csr_on_binary_post
    with pytest.warns(DeprecationWarning):
        assert xlakern.dense_on_pre is xlakern.update_dense_on_binary_pre
    with pytest.warns(DeprecationWarning):
        assert xlakern.dense_on_post is xlakern.update_dense_on_binary_post


def test_plasticity_cuda_kernel_compiles():
    assert_cuda_compiles("plasticity_cuda.cu", {"plastic_update"})


@pytest.mark.gpu
@pytest.mark.parametrize("ranges", ["", "1"], ids=["ranges-ahead", "ranges-per-row"])
@pytest.mark.parametrize("walk", ["", "1"], ids=["32-bit", "64-bit"])
@pytest.mark.parametrize("rows_a_warp", ["", "1", "32"])
def test_gpu_stdp_matches_cpu(rows_a_warp, walk, ranges, monkeypatch):
    """Also with the rows a warp walks forced to one and to 32 (XLAKERN_SCATTER_ROWS; the launcher picks
    from the size, so the default covers one value only), with the 64-bit walk forced
    (XLAKERN_WALK32=1; int32 indices take the 32-bit one), and with both ways of reading the rows'
    ranges (XLAKERN_ROW_RANGES)."""
    if rows_a_warp:
        monkeypatch.setenv("XLAKERN_SCATTER_ROWS", rows_a_warp)
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    monkeypatch.setenv("XLAKERN_ROW_RANGES", ranges)
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng()
    mask, w = network(rng)
    pre, post = spike_trains(rng)
    data, indices, indptr, csc_idx, csc_ptr, perm = csr_of(mask, w)
    data = data.astype(np.float32)
    kw = dict(w_min=W_MIN, w_max=W_MAX, shape=(N_PRE, N_POST))
    on_pre = lambda w, s, tr: xlakern.update_csr_on_binary_pre(w, indices, indptr, s, tr, **kw)
    on_post = lambda w, tr, s: xlakern.update_csr_on_binary_post(w, csc_idx, csc_ptr, perm, tr, s, **kw)
    with jax.default_device(gpu):
        got = run_loop(on_pre, on_post, jnp.asarray(data), pre, post)
    want = numpy_stdp(mask, w.astype(np.float32).astype(np.float64), pre, post)
    np.testing.assert_allclose(to_dense(mask, got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", [None, "jnp"])
def test_grad_wrt_weights_trace_and_bounds(backend, rng):
    """Reverse mode through the update equals jax.grad of the same rule written in jnp."""
    w = rng.uniform(0.0, 1.0, (N_PRE, N_POST))
    spikes = rng.random(N_PRE) < 0.4
    trace = rng.uniform(-0.3, 0.3, N_POST)
    c = rng.standard_normal((N_PRE, N_POST))
    with x64():
        def ours(w, tr, lo, hi):
            return jnp.sum(c * xlakern.update_dense_on_binary_pre(w, spikes, tr, lo, hi, backend=backend))

        def ref(w, tr, lo, hi):
            new = jnp.minimum(jnp.maximum(w + tr[None, :], lo), hi)
            return jnp.sum(c * jnp.where(spikes[:, None], new, w))

        args = (jnp.asarray(w), jnp.asarray(trace), jnp.float64(0.1), jnp.float64(0.9))
        got = jax.grad(ours, argnums=(0, 1, 2, 3))(*args)
        want = jax.grad(ref, argnums=(0, 1, 2, 3))(*args)
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
        assert np.abs(want[2]) > 0 and np.abs(want[3]) > 0  # some synapses hit each bound
        data, indices, indptr, *_ = csr_of(np.ones((N_PRE, N_POST), bool), w)
        g_csr = jax.grad(lambda d, tr: jnp.sum(c.reshape(-1) * xlakern.update_csr_on_binary_pre(
            d, indices, indptr, spikes, tr, 0.1, 0.9, shape=(N_PRE, N_POST), backend=backend)), argnums=(0, 1))(
            jnp.asarray(data), jnp.asarray(trace))
        np.testing.assert_allclose(g_csr[0].reshape(N_PRE, N_POST), want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(g_csr[1], want[1], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spike_dtype", [np.bool_, np.float32])
@pytest.mark.parametrize("shape,density,k", [((500_000, 64), 0.03, 3), ((300, 5_000), 0.1, 400)])
def test_gpu_updates_of_many_rows_and_long_rows_match_numpy(shape, density, k, spike_dtype, dtype):
    """Every layout's GPU update against NumPy in float64, one step: 500k rows (warps that cover up to
    32 rows each) and rows of ~500 synapses (several rounds of a warp's 128), weights pushed past both
    bounds, CSR columns out of range (skipped)."""
    rng = np.random.default_rng()
    n_pre, n_post = shape
    mask = rng.random(shape) < density
    mask[1] = False  # an empty row
    w = np.where(mask, rng.uniform(0.2, 0.8, shape), 0.0).astype(dtype)
    data, indices, indptr, csc_idx, csc_ptr, perm = csr_of(mask, w)
    bad = indices.copy()
    bad[::97] = n_post  # out of range: the update skips these synapses

    def spikes(n):
        on = rng.random(n) < 0.05
        on[rng.integers(n)] = True  # at least one: 64 columns at 5% are all silent 3.7% of the time
        return on, (on if spike_dtype is np.bool_ else np.where(on, rng.uniform(0.5, 2.0, n), 0.0).astype(spike_dtype))

    pre_on, pre = spikes(n_pre)
    post_on, post = spikes(n_post)
    pre_trace = rng.uniform(-0.3, 0.3, n_pre).astype(dtype)
    post_trace = rng.uniform(-0.3, 0.3, n_post).astype(dtype)
    f64 = lambda a: np.asarray(a, np.float64)
    clip = lambda a: np.clip(a, W_MIN, W_MAX)

    want_pre = f64(data).copy()
    rows = np.repeat(np.arange(n_pre), np.diff(indptr))
    hit = pre_on[rows] & (bad < n_post)
    want_pre[hit] = clip(want_pre[hit] + f64(post_trace)[bad[hit]])
    want_post = f64(data).copy()
    hit = post_on[np.repeat(np.arange(n_post), np.diff(csc_ptr))]
    want_post[perm[hit]] = clip(want_post[perm[hit]] + f64(pre_trace)[csc_idx[hit]])
    want_dense_pre = np.where(pre_on[:, None], clip(f64(w) + f64(post_trace)[None, :]), f64(w))
    want_dense_post = np.where(post_on[None, :], clip(f64(w) + f64(pre_trace)[:, None]), f64(w))
    fix_post_idx = rng.integers(0, n_post, (n_pre, k)).astype(np.int32)
    fix_post = rng.uniform(0.2, 0.8, (n_pre, k)).astype(dtype)
    want_fix_post = np.where(pre_on[:, None], clip(f64(fix_post) + f64(post_trace)[fix_post_idx]), f64(fix_post))
    fix_pre_idx = rng.integers(0, n_pre, (n_post, k)).astype(np.int32)
    fix_pre = rng.uniform(0.2, 0.8, (n_post, k)).astype(dtype)
    want_fix_pre = np.where(post_on[:, None], clip(f64(fix_pre) + f64(pre_trace)[fix_pre_idx]), f64(fix_pre))

    kw = dict(w_min=W_MIN, w_max=W_MAX, shape=shape)
    with (x64() if dtype is np.float64 else contextlib.nullcontext()), jax.default_device(jax.devices("gpu")[0]):
        cases = {
            "csr pre": (xlakern.update_csr_on_binary_pre(jnp.asarray(data), bad, indptr, pre, post_trace, **kw),
                        want_pre, data),
            "csr post": (xlakern.update_csr_on_binary_post(jnp.asarray(data), csc_idx, csc_ptr, perm, pre_trace,
                                                           post, **kw), want_post, data),
            "dense pre": (xlakern.update_dense_on_binary_pre(jnp.asarray(w), pre, post_trace, W_MIN, W_MAX),
                          want_dense_pre, w),
            "dense post": (xlakern.update_dense_on_binary_post(jnp.asarray(w), pre_trace, post, W_MIN, W_MAX),
                           want_dense_post, w),
            "fixed post": (xlakern.update_fixed_post_conn_on_binary_pre(jnp.asarray(fix_post), fix_post_idx, pre,
                                                                        post_trace, **kw), want_fix_post, fix_post),
            "fixed pre": (xlakern.update_fixed_pre_conn_on_binary_post(jnp.asarray(fix_pre), fix_pre_idx, pre_trace,
                                                                       post, **kw), want_fix_pre, fix_pre),
        }
        for name, (got, want, before) in cases.items():
            assert got.dtype == dtype, name
            assert list(got.devices())[0].platform == "gpu", name
            assert (want != f64(before)).any(), name  # the update changed weights (some clipped)
            tol = 1e-12 if dtype is np.float64 else 1e-6
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol, err_msg=name)
