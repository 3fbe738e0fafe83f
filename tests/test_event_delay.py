"""Synaptic delays (xlakern.event._delay) against a NumPy ring buffer over a simulated run."""

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

N_PRE, N_POST, L, STEPS = 35, 25, 6, 60


def network(rng, density=0.3):
    mask = rng.random((N_PRE, N_POST)) < density
    mask[5] = False
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    data = rng.standard_normal(rows.size)
    delays = rng.integers(1, L, rows.size).astype(np.int32)
    return rows, cols.astype(np.int32), indptr, data, delays


def numpy_run(rows, cols, data, delays, events, weighted):
    """The arrivals each step: ring of L rows, read and cleared at t mod L after delivery."""
    ring = np.zeros((L, N_POST))
    arrivals = []
    for t, ev in enumerate(events):
        for e in range(rows.size):
            x = ev[rows[e]]
            if x != 0:
                ring[(t + delays[e]) % L, cols[e]] += data[e] * (x if weighted else 1.0)
        arrivals.append(ring[t % L].copy())
        ring[t % L] = 0
    return np.array(arrivals)


def jax_run(deliver, events):
    @jax.jit
    def run(events):
        def step(ring, xs):
            t, ev = xs
            ring = deliver(ring, ev, t)
            now = ring[t % L]
            return ring.at[t % L].set(0), now
        return jax.lax.scan(step, jnp.zeros((L, N_POST), jnp.float64), (jnp.arange(len(events)), events))[1]
    return np.asarray(run(jnp.asarray(events)))


@pytest.mark.parametrize("backend", [None, "jnp"])
@pytest.mark.parametrize("weighted", [False, True])
def test_csr_delay_deliver_matches_numpy_ring(backend, weighted, rng):
    rows, cols, indptr, data, delays = network(rng)
    events = rng.random((STEPS, N_PRE)) < 0.2
    if weighted:
        events = np.where(events, rng.standard_normal(events.shape), 0.0)
    with x64():
        got = jax_run(lambda ring, ev, t: xlakern.csr_delay_deliver(
            ring, ev, data, cols, indptr, delays, t, shape=(N_PRE, N_POST), weighted=weighted, backend=backend),
            events)
    want = numpy_run(rows, cols, data, delays, events, weighted)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.abs(want).sum() > 0


def test_layout_matches_plain_delivery_and_keeps_weights(rng):
    rows, cols, indptr, data, delays = network(rng)
    events = rng.random((STEPS, N_PRE)) < 0.2
    with x64():
        layout = xlakern.CSRDelayLayout.build(data, cols, indptr, delays, n_slots=L, shape=(N_PRE, N_POST))
        np.testing.assert_array_equal(np.asarray(layout.original_data()), data)
        ld = np.asarray(layout.delays)
        lp = np.asarray(layout.delay_ptr)
        for i in range(N_PRE):  # each row sorted by delay; delay_ptr marks where each delay starts
            seg = ld[indptr[i]:indptr[i + 1]]
            assert (np.diff(seg) >= 0).all()
            for d in range(L):
                assert lp[i, d] == indptr[i] + np.count_nonzero(seg < d)
        got = jax_run(lambda ring, ev, t: layout.deliver(ring, xlakern.BinaryArray(ev), t), events)
        got2 = jax_run(lambda ring, ev, t: xlakern.csr_delay_deliver_layout(ring, ev, layout, t), events)
    want = numpy_run(rows, cols, data, delays, events, False)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got2, want, rtol=1e-12, atol=1e-12)


def test_ring_is_updated_in_place(rng):
    rows, cols, indptr, data, delays = network(rng)
    f = jax.jit(lambda ring, ev, t: xlakern.csr_delay_deliver(ring, ev, data.astype(np.float32), cols, indptr,
                                                               delays, t, shape=(N_PRE, N_POST)), donate_argnums=0)
    ring = jnp.zeros((L, N_POST), jnp.float32)
    ptr = ring.unsafe_buffer_pointer()
    ev = np.zeros(N_PRE, bool)
    ev[0] = True
    out = f(ring, ev, 3)
    assert out.unsafe_buffer_pointer() == ptr
    want = np.zeros((L, N_POST))
    for e in range(indptr[0], indptr[1]):
        want[(3 + delays[e]) % L, cols[e]] += data[e]
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)


def test_errors(rng):
    rows, cols, indptr, data, delays = network(rng)
    ring = np.zeros((L, N_POST), np.float32)
    with pytest.raises(EventShapeError, match="1 <= d < L"):
        xlakern.csr_delay_deliver(ring, np.ones(N_PRE, bool), data, cols, indptr, np.full(rows.size, L), 0,
                                  shape=(N_PRE, N_POST))
    with pytest.raises(EventShapeError, match="ring"):
        xlakern.csr_delay_deliver(np.zeros((L, N_POST + 1)), np.ones(N_PRE, bool), data, cols, indptr, delays, 0,
                                  shape=(N_PRE, N_POST))
    # traced delays cannot be checked: they wrap modulo L instead
    traced = jax.jit(lambda d: xlakern.csr_delay_deliver(ring, np.ones(N_PRE, bool), data, cols, indptr, d, 0,
                                                         shape=(N_PRE, N_POST)))(delays)
    assert np.isfinite(np.asarray(traced)).all()
    with pytest.raises(xlakern.XlakernError, match="t must be"):
        xlakern.csr_delay_deliver(ring, np.ones(N_PRE, bool), data, cols, indptr, delays, 0.5,
                                  shape=(N_PRE, N_POST))


def delivery_tensor(data, rows, cols, delays, t):
    """M[s, post, pre] with ring_new = ring + M @ f(events): jnp, so JAX differentiates it (float64)."""
    w = jnp.broadcast_to(jnp.asarray(data).reshape(-1), (rows.size,))
    return jnp.zeros((L, N_POST, N_PRE), w.dtype).at[(t + delays) % L, cols, rows].add(w)


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("backend", [None, "jnp"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_gradients_match_the_dense_delivery_tensor(platform, backend, weighted, shared, rng):
    """grad, jvp and vmap(grad) with respect to the ring, the weights and float events, against
    ring + M(data) @ z in float64 (z: the events for weighted delivery, their mask for binary; the event
    gradient is M's transpose either way, the straight-through estimate for binary events)."""
    rows, cols, indptr, data, delays = network(rng)
    if shared:
        data = data[:1]
    t = int(rng.integers(0, 50))
    ev = np.where(rng.random(N_PRE) < 0.4, rng.choice([2.0, -1.0, 0.5], N_PRE), 0.0)
    ring = rng.standard_normal((L, N_POST))
    ct = rng.standard_normal((L, N_POST))

    def op(ring, data, ev):
        return xlakern.csr_delay_deliver(ring, ev, data, cols, indptr, delays, t, shape=(N_PRE, N_POST),
                                         weighted=weighted, backend=backend)

    def ref(ring, data, ev):
        z = ev if weighted else jax.lax.stop_gradient((ev != 0).astype(ev.dtype)) + ev - jax.lax.stop_gradient(ev)
        return ring + jnp.einsum("spi,i->sp", delivery_tensor(data, rows, cols, delays, t), z)

    def loss(f):
        return lambda *a: jnp.sum(jnp.sin(f(*a)) * ct)

    with x64(), jax.default_device(jax.devices(platform)[0]):
        args = (jnp.asarray(ring), jnp.asarray(data), jnp.asarray(ev))
        np.testing.assert_allclose(op(*args), ref(*args), rtol=1e-12, atol=1e-12)
        got = jax.grad(loss(op), argnums=(0, 1, 2))(*args)
        want = jax.grad(loss(ref), argnums=(0, 1, 2))(*args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
        assert np.abs(want[1]).max() > 0 and np.abs(want[2]).max() > 0
        # inactive events' synapses get an exact zero weight gradient even where the cotangent is NaN
        if not shared:
            inactive = ev[rows] == 0
            bad_ct = jnp.where(jnp.asarray(rng.random((L, N_POST)) < 0.3), jnp.nan, 1.0)
            g = jax.vjp(lambda d: op(args[0], d, args[2]), args[1])[1](bad_ct)[0]
            assert np.all(np.asarray(g)[inactive] == 0)
        tangents = tuple(jnp.asarray(rng.standard_normal(np.shape(a))) for a in args)
        np.testing.assert_allclose(jax.jvp(op, args, tangents)[1], jax.jvp(ref, args, tangents)[1],
                                   rtol=1e-10, atol=1e-12)
        evs = jnp.stack([args[2], -args[2] * 0.5])
        got = jax.vmap(jax.grad(loss(op), argnums=1), in_axes=(None, None, 0))(args[0], args[1], evs)
        want = jax.vmap(jax.grad(loss(ref), argnums=1), in_axes=(None, None, 0))(args[0], args[1], evs)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_units_int64_steps_and_argument_checks(rng):
    """A ring in a unit of the delivered dimension is converted to it; int64 steps and delays past
    2**31 wrap modulo L as the int64 formula does; contradictory flags and bad layouts are refused."""
    u = pytest.importorskip("brainunit")

    rows, cols, indptr, data, delays = network(rng)
    ev = rng.random(N_PRE) < 0.4
    ring = rng.standard_normal((L, N_POST))
    want = ring * 1000.0
    np.add.at(want, ((7 + delays[ev[rows]]) % L, cols[ev[rows]]), data[ev[rows]])
    with x64():
        out = xlakern.csr_delay_deliver(ring * u.volt, ev, data * u.mV, cols, indptr, delays, 7,
                                        shape=(N_PRE, N_POST))
        assert u.get_unit(out) == u.mV
        np.testing.assert_allclose(out.to_decimal(u.mV), want, rtol=1e-12)
        with pytest.raises(xlakern.event.EventUnitError, match="same dimension"):
            xlakern.csr_delay_deliver(ring * u.second, ev, data * u.mV, cols, indptr, delays, 7,
                                      shape=(N_PRE, N_POST))
        big_t = np.int64(2) ** 33 + 5
        big_d = delays.astype(np.int64) + np.int64(3) * 2 ** 31
        want = np.zeros((L, N_POST))
        np.add.at(want, ((int(big_t) + big_d[ev[rows]]) % L, cols[ev[rows]]), data[ev[rows]])
        got = jax.jit(lambda d, tt: xlakern.csr_delay_deliver(jnp.zeros((L, N_POST)), ev, data, cols, indptr, d, tt,
                                                              shape=(N_PRE, N_POST)))(jnp.asarray(big_d),
                                                                                      jnp.asarray(big_t))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="contradicts"):
        xlakern.csr_delay_deliver(ring, xlakern.WeightedArray(ev.astype(np.float32)), data, cols, indptr, delays, 0,
                                  shape=(N_PRE, N_POST), weighted=False)
    layout = xlakern.CSRDelayLayout.build(0.5, cols, indptr, 3, n_slots=L, shape=(N_PRE, N_POST))
    assert layout.data.shape == (1,) and layout.original_data().shape == (1,)
    np.testing.assert_array_equal(np.asarray(layout.delays), np.full(cols.size, 3))
    with pytest.raises(xlakern.event.EventShapeError, match="n_slots"):
        layout.deliver(np.zeros((L + 1, N_POST)), ev, 0)
    with pytest.raises(TypeError, match="CSRDelayLayout"):
        xlakern.csr_delay_deliver_layout(ring, ev, object(), 0)
    build = xlakern.CSRDelayLayout.build
    for bad, match, err in (
            (dict(delays=delays.astype(np.float32)), "integer", TypeError),
            (dict(n_slots=1, delays=1), "n_slots", ValueError),
            (dict(indices=cols[:-1], delays=delays[:-1]), "nse", ValueError),
            (dict(delays=delays[:-1]), "delays must have shape", ValueError),
            (dict(data=data[:-1]), "data must be", ValueError)):
        kw = dict(data=data, indices=cols, indptr=indptr, delays=delays, n_slots=L, shape=(N_PRE, N_POST)) | bad
        with pytest.raises(err, match=match):
            build(kw.pop("data"), kw.pop("indices"), kw.pop("indptr"), kw.pop("delays"), **kw)
    with pytest.raises(xlakern.event.EventTracedError, match="concrete"):
        jax.jit(lambda d: build(data, cols, indptr, d, n_slots=L, shape=(N_PRE, N_POST)).data)(delays)


def test_delay_cuda_kernel_compiles():
    assert_cuda_compiles("delay_cuda.cu", {"delay_deliver"})


@pytest.mark.gpu
@pytest.mark.parametrize("ranges", ["", "1"], ids=["ranges-ahead", "ranges-per-row"])
@pytest.mark.parametrize("walk", ["", "1"], ids=["32-bit", "64-bit"])
@pytest.mark.parametrize("rows_a_warp", ["", "1", "32"])
def test_gpu_delay_matches_numpy(rows_a_warp, walk, ranges, monkeypatch):
    """Also with the rows a warp walks forced to one and to 32 (XLAKERN_SCATTER_ROWS), with the
    64-bit walk forced (XLAKERN_WALK32=1; int32 indices take the 32-bit one), and with both ways of
    reading the rows' ranges (XLAKERN_ROW_RANGES)."""
    if rows_a_warp:
        monkeypatch.setenv("XLAKERN_SCATTER_ROWS", rows_a_warp)
    monkeypatch.setenv("XLAKERN_WALK32", walk)
    monkeypatch.setenv("XLAKERN_ROW_RANGES", ranges)
    rng = np.random.default_rng()
    rows, cols, indptr, data, delays = network(rng)
    events = rng.random((STEPS, N_PRE)) < 0.2
    with jax.default_device(jax.devices("gpu")[0]), x64():
        got = jax_run(lambda ring, ev, t: xlakern.csr_delay_deliver(ring, ev, data, cols, indptr, delays, t,
                                                                     shape=(N_PRE, N_POST)), events)
    np.testing.assert_allclose(got, numpy_run(rows, cols, data, delays, events, False), rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,density", [((500_000, 64), 0.03), ((300, 5_000), 0.1)])
def test_gpu_delivery_over_many_rows_and_long_rows_matches_numpy(shape, density, dtype, weighted):
    """One delivery on the GPU against NumPy in float64: 500k rows (warps that cover up to 32 rows
    each) and rows of ~500 synapses (several rounds of a warp's 128), columns out of range skipped."""
    rng = np.random.default_rng()
    n_pre, n_post = shape
    mask = rng.random(shape) < density
    mask[1] = False  # an empty row
    rows, cols = np.nonzero(mask)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    cols = cols.astype(np.int32)
    cols[::97] = n_post  # out of range: skipped
    data = rng.standard_normal(rows.size).astype(dtype)
    delays = rng.integers(1, L, rows.size).astype(np.int32)
    on = rng.random(n_pre) < 0.05
    ev = np.where(on, rng.uniform(0.5, 2.0, n_pre), 0.0).astype(dtype) if weighted else on
    ring0 = rng.standard_normal((L, n_post)).astype(dtype)
    t = int(rng.integers(0, 1000))
    want = ring0.astype(np.float64)
    hit = on[rows] & (cols < n_post)
    factor = np.asarray(ev, np.float64)[rows[hit]] if weighted else 1.0
    np.add.at(want, ((t + delays[hit]) % L, cols[hit]), data[hit].astype(np.float64) * factor)
    with (x64() if dtype is np.float64 else contextlib.nullcontext()), jax.default_device(jax.devices("gpu")[0]):
        got = xlakern.csr_delay_deliver(jnp.asarray(ring0), ev, data, cols, indptr, delays, t, shape=shape,
                                        weighted=weighted)
        assert got.dtype == dtype and list(got.devices())[0].platform == "gpu"
        assert np.abs(want - ring0).max() > 0.1  # the delivery changed the ring
        tol = 1e-10 if dtype is np.float64 else 2e-5
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)
