"""Event operators called outside jit (xlakern.event._eager.run_fused): each call is one compiled XLA
program, the one ``jax.jit`` of the same call compiles, with the same result bit for bit; a call with new
values of the same shapes compiles nothing; units, the checks that need concrete values (the order of
plasticity's bounds, the range of delays) and the errors stay as they were. Runs on the default device
(the GPU's kernels on the GPU machine)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import xlakern
from _event_cases import random_csr, random_fcn
from conftest import x64
from xlakern.event import EventArgumentError, EventShapeError
from xlakern.event._eager import compiled_programs


def _cases(rng):
    """name -> (call, first values, second values, float64 reference of the values)."""
    m, n = int(rng.integers(30, 120)), int(rng.integers(30, 120))
    dense, data, idx, ptr = random_csr(rng, m, n, 0.15)
    idx, ptr = idx.astype(np.int32), ptr.astype(np.int32)
    rows = np.repeat(np.arange(m), np.diff(ptr))
    k = int(rng.integers(1, min(m, n) // 2))
    _, fw, fidx = random_fcn(rng, m, n, k)
    fidx = fidx.astype(np.int32)
    f32 = lambda a: np.asarray(a, np.float32)
    spk = lambda size: rng.random(size) < 0.3
    csr_dense = lambda d: np.bincount(rows * n + idx, weights=np.asarray(d, np.float64),
                                      minlength=m * n).reshape(m, n)

    def fcn_dense(w):
        out = np.zeros((m, n))
        for r in range(m):
            out[r, fidx[r]] += np.asarray(w, np.float64)[r]
        return out

    order = np.argsort(idx, kind="stable")  # the CSC view of the CSR: its synapses by column
    csc_idx, csc_ptr = rows[order].astype(np.int32), np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(idx, minlength=n), out=csc_ptr[1:])
    perm = order.astype(np.int32)

    def post_update(w, pre_trace, post_spike):
        w = np.asarray(w, np.float64).copy()
        on = np.asarray(post_spike)[idx]
        w[on] = np.clip(w[on] + np.asarray(pre_trace, np.float64)[rows[on]], -0.5, 0.8)
        return w

    def dense_pre_update(W, pre_spike, post_trace):
        W = np.asarray(W, np.float64).copy()
        W[pre_spike] = np.clip(W[pre_spike] + np.asarray(post_trace, np.float64), -1.0, 1.0)
        return W

    L = 5
    delays = rng.integers(1, L, idx.size).astype(np.int32)

    def delivered(ring, s, d, t):
        ring = np.asarray(ring, np.float64).copy()
        on = np.asarray(s)[rows]
        np.add.at(ring, ((t + delays[on]) % L, idx[on]), np.asarray(d, np.float64)[on])
        return ring

    return {
        "s @ CSR": (lambda d, s: xlakern.binary_csrmv(d, idx, ptr, s, shape=(m, n), transpose=True),
                    (f32(data), spk(m)), (f32(rng.standard_normal(idx.size)), spk(m)),
                    lambda d, s: csr_dense(d).T @ s),
        "s @ CSR, one shared weight": (
            lambda w, s: xlakern.binary_csrmv(w, idx, ptr, s, shape=(m, n), transpose=True),
            (float(rng.uniform(0.5, 2)), spk(m)), (float(rng.uniform(-2, -0.5)), spk(m)),
            lambda w, s: csr_dense(np.full(idx.size, w)).T @ s),
        "CSR @ X": (lambda d, x: xlakern.csrmm(d, idx, ptr, x, shape=(m, n)),
                    (f32(data), f32(rng.standard_normal((n, 3)))),
                    (f32(rng.standard_normal(idx.size)), f32(rng.standard_normal((n, 3)))),
                    lambda d, x: csr_dense(d) @ x),
        "FCN @ s": (lambda w, s: xlakern.binary_fcnmv(w, fidx, s, shape=(m, n)),
                    (f32(fw), spk(n)), (f32(rng.standard_normal(fw.shape)), spk(n)),
                    lambda w, s: fcn_dense(w) @ s),
        "s @ dense": (lambda W, s: xlakern.binary_densemv(W, s, transpose=True),
                      (f32(dense), spk(m)), (f32(rng.standard_normal((m, n))), spk(m)),
                      lambda W, s: np.asarray(W, np.float64).T @ s),
        # device arrays: a layout takes NumPy arrays with jnp.asarray, which compiles a copy program a shape
        "BinaryArray(s) @ CSR": (
            lambda d, s: xlakern.BinaryArray(s) @ xlakern.CSR((d, *jax.device_put((idx, ptr))), shape=(m, n)),
            jax.device_put((f32(data), spk(m))), jax.device_put((f32(rng.standard_normal(idx.size)), spk(m))),
            lambda d, s: csr_dense(d).T @ np.asarray(s)),
        "update_csr_on_binary_post": (
            lambda w, tr, s: xlakern.update_csr_on_binary_post(w, csc_idx, csc_ptr, perm, tr, s, -0.5, 0.8,
                                                               shape=(m, n)),
            (f32(rng.uniform(-0.5, 0.8, idx.size)), f32(rng.uniform(-0.3, 0.3, m)), spk(n)),
            (f32(rng.uniform(-0.5, 0.8, idx.size)), f32(rng.uniform(-0.3, 0.3, m)), spk(n)),
            post_update),
        "update_dense_on_binary_pre": (
            lambda W, s, tr: xlakern.update_dense_on_binary_pre(W, s, tr, -1.0, 1.0),
            (f32(rng.uniform(-1, 1, (m, n))), spk(m), f32(rng.uniform(-0.3, 0.3, n))),
            (f32(rng.uniform(-1, 1, (m, n))), spk(m), f32(rng.uniform(-0.3, 0.3, n))),
            dense_pre_update),
        "csr_delay_deliver": (
            lambda ring, s, d, t: xlakern.csr_delay_deliver(ring, s, d, idx, ptr, delays, t, shape=(m, n)),
            (f32(rng.standard_normal((L, n))), spk(m), f32(data), int(rng.integers(0, 100))),
            (f32(rng.standard_normal((L, n))), spk(m), f32(rng.standard_normal(idx.size)), int(rng.integers(0, 100))),
            delivered),
        "csrmv_dt2t": (lambda y, w: xlakern.csrmv_dt2t(y, w, idx, ptr, shape=(m, n)),
                       (f32(rng.standard_normal(m)), f32(data)),
                       (f32(rng.standard_normal(m)), f32(rng.standard_normal(idx.size))),
                       lambda y, w: np.asarray(w, np.float64) * np.asarray(y, np.float64)[rows]),
        "fcnmv_dt2t": (lambda w, y: xlakern.fcnmv_dt2t(w, fidx, y, shape=(m, n), transpose=True),
                       (f32(fw), f32(rng.standard_normal(n))),
                       (f32(rng.standard_normal(fw.shape)), f32(rng.standard_normal(n))),
                       lambda w, y: np.asarray(w, np.float64) * np.asarray(y, np.float64)[fidx]),
    }


CASES = list(_cases(np.random.default_rng(0)))


@pytest.mark.parametrize("case", CASES)
def test_eager_call_is_one_program_equal_to_the_jitted_one(case, rng):
    """Outside jit an operator compiles one XLA program (its Python side's jnp calls were programs of
    their own: an eager plasticity update compiled four, and each call dispatched them all). The result
    matches float64 NumPy and jit's (bit for bit on the CPU), and new values of the same shapes compile nothing."""
    call, first, second, reference = _cases(rng)[case]
    with compiled_programs() as programs:
        eager = np.asarray(jax.block_until_ready(call(*first)))
    assert len(programs) <= 1, programs  # none where an earlier case compiled the same program
    with compiled_programs() as programs:
        again = np.asarray(jax.block_until_ready(call(*second)))
    assert programs == [], programs
    for got, values in ((eager, first), (again, second)):
        want = reference(*values)
        assert np.abs(want).sum() > 0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    jitted = np.asarray(jax.jit(call)(*first))
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(eager, jitted)
    else:  # GPU scatters add with atomics, in an order that differs between any two calls
        np.testing.assert_allclose(eager, jitted, rtol=1e-6, atol=1e-6 * max(1.0, np.abs(eager).max()))


def test_eager_calls_keep_units(rng):
    u = pytest.importorskip("brainunit")
    m, n = 40, 30
    dense, data, idx, ptr = random_csr(rng, m, n, 0.2)
    s = rng.random(m) < 0.4
    data = data.astype(np.float32)
    y = xlakern.binary_csrmv(data * u.mS, idx, ptr, s, shape=(m, n), transpose=True)
    assert y.unit == u.mS
    np.testing.assert_allclose(y.to_decimal(u.mS), dense.T @ s, rtol=1e-5, atol=1e-5)
    w = rng.uniform(0, 1, idx.size).astype(np.float32)
    trace = rng.uniform(-0.2, 0.2, n).astype(np.float32)
    new = xlakern.update_csr_on_binary_pre(w * u.mS, idx, ptr, s, trace * 1000 * u.uS, 0 * u.mS, 1 * u.mS,
                                           shape=(m, n))
    assert new.unit == u.mS
    rows = np.repeat(np.arange(m), np.diff(ptr))
    want = np.where(s[rows], np.clip(w + trace[idx], 0, 1), w)
    np.testing.assert_allclose(new.to_decimal(u.mS), want, rtol=1e-5, atol=1e-6)


def test_eager_checks_that_need_values_still_run(rng):
    """Inside the fused program the bounds and delays are traced, so their checks run before it."""
    m, n = 20, 15
    _, data, idx, ptr = random_csr(rng, m, n, 0.3)
    s = rng.random(m) < 0.5
    with pytest.raises(EventArgumentError, match="w_min .* is above w_max") as info:
        xlakern.update_csr_on_binary_pre(data, idx, ptr, s, np.zeros(n, np.float32), 0.9, 0.1, shape=(m, n))
    assert not getattr(info.value, "__notes__", None)
    ring = np.zeros((4, n), np.float32)
    with pytest.raises(EventShapeError, match="1 <= d < L = 4"):
        xlakern.csr_delay_deliver(ring, s, data, idx, ptr, np.full(idx.size, 4, np.int32), 0, shape=(m, n))
    with pytest.raises(EventShapeError, match=r"indptr has shape \(20,\); expected \(21,\)") as info:
        xlakern.binary_csrmv(data, idx, ptr[:-1], s, shape=(m, n), transpose=True)
    assert not getattr(info.value, "__notes__", None)
    # traced bounds in the wrong order are lowered to w_max, as before (jnp.clip's rule)
    got = jax.jit(lambda lo, hi: xlakern.update_csr_on_binary_pre(data.astype(np.float32), idx, ptr, s,
                                                                  np.zeros(n, np.float32), lo, hi,
                                                                  shape=(m, n)))(0.9, 0.1)
    rows = np.repeat(np.arange(m), np.diff(ptr))
    np.testing.assert_allclose(np.asarray(got), np.where(s[rows], 0.1, data), rtol=1e-6)


def test_eager_python_numbers_are_kept_per_width_and_device(rng):
    """A Python number (a shared weight, a bound, a step) is copied to the device once and kept, keyed by
    its type and bits, the x64 flag and the default device, in a bounded LRU: the same values and dtypes
    as jit's own conversion, on the device the call runs on."""
    from xlakern import _compat
    from xlakern.event import _eager

    m, n = 30, 25
    dense, data, idx, ptr = random_csr(rng, m, n, 0.3)
    s = rng.random(m) < 0.5
    counts = (dense != 0).T.astype(np.float64) @ s
    for w in (0.5, -1.25, 0.5):
        y = xlakern.binary_csrmv(w, idx, ptr, s, shape=(m, n), transpose=True)
        assert y.dtype == np.float32
        np.testing.assert_allclose(np.asarray(y), w * counts, rtol=1e-6)
    here = _compat.jit_placement_key()  # other tests keep numbers too, under other placements
    keys = [k for k in _eager._NUMBERS if k[0] is float and k[1] in ((0.5).hex(), (-1.25).hex()) and k[2] == here]
    assert len(keys) == 2, keys  # 0.5 twice is one entry
    with x64():
        y = xlakern.binary_csrmv(0.5, idx, ptr, s, shape=(m, n), transpose=True)
        assert y.dtype == np.float64  # as the plain call (and jit) make a Python float under x64
        np.testing.assert_allclose(np.asarray(y), 0.5 * counts, rtol=1e-12)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        y = xlakern.binary_csrmv(0.75, idx, ptr, s, shape=(m, n), transpose=True)
    assert y.devices() == {cpu}
    np.testing.assert_allclose(np.asarray(y), 0.75 * counts, rtol=1e-6)
    ring = np.zeros((3, n), np.float32)
    for t in range(_eager._NUMBERS_KEPT + 20):  # a step counter: new numbers each call, the LRU stays bounded
        ring = xlakern.csr_delay_deliver(ring, s, data.astype(np.float32), idx, ptr, 1, t, shape=(m, n))
    assert len(_eager._NUMBERS) <= _eager._NUMBERS_KEPT
    # every step delivered once (delay 1 into a ring of 3): the ring sums all of them
    np.testing.assert_allclose(np.asarray(ring).sum(0), (_eager._NUMBERS_KEPT + 20) * (dense.T @ s), rtol=1e-4)


def test_arguments_jax_cannot_read_are_named_eagerly_and_under_jit(rng):
    """None where an array is needed, a string, or a Python int wider than jit's integers: an
    EventDTypeError naming the operator and its argument (jax's own errors name neither), outside jit and
    closed over inside it. A None the operator allows (a CSR product's permutation, a scalar JITC
    matrix's second weight) still works."""
    import re

    import jax.numpy as jnp

    from xlakern.event import EventDTypeError

    n_pre, n_post, k = 30, 20, 4
    idx = np.concatenate([np.sort(rng.choice(n_post, k, replace=False)) for _ in range(n_pre)]).astype(np.int32)
    ptr = np.arange(0, n_pre * k + 1, k, dtype=np.int32)
    w = rng.uniform(0.1, 1.0, n_pre * k).astype(np.float32)
    spikes = rng.random(n_pre) < 0.3
    trace = rng.uniform(-0.1, 0.1, n_post).astype(np.float32)
    x = rng.standard_normal(n_post).astype(np.float32)
    ring, delays = jnp.zeros((5, n_post), jnp.float32), rng.integers(1, 5, n_pre * k).astype(np.int32)
    shape = (n_pre, n_post)
    cases = [
        (lambda: xlakern.binary_csrmv(w, idx, ptr, None, shape=shape, transpose=True), "binary_csrmv: v is None"),
        (lambda: xlakern.csrmv(w, None, ptr, x, shape=shape), "csrmv: indices is None"),
        (lambda: xlakern.update_csr_on_binary_pre(w, idx, ptr, None, trace, shape=shape),
         "update_csr_on_binary_pre: spikes is None"),
        (lambda: xlakern.update_csr_on_binary_pre(w, idx, ptr, spikes, trace, "low", 1.0, shape=shape),
         "update_csr_on_binary_pre: w_min is a str ('low')"),
        (lambda: xlakern.csr_delay_deliver(ring, spikes, w, idx, ptr, delays, "t", shape=shape),
         "csr_delay_deliver: t is a str"),
        (lambda: xlakern.csr_delay_deliver(ring, spikes, w, idx, ptr, delays, 2**40, shape=shape),
         "csr_delay_deliver: t is the Python int 1099511627776"),
        (lambda: xlakern.jitsmv(None, 0.1, x, 3, shape=shape), "jitsmv: weight is None"),
    ]
    for call, message in cases:
        with pytest.raises(EventDTypeError, match=re.escape(message)):
            call()
    with pytest.raises(EventDTypeError, match=re.escape("binary_csrmv: v is None")):
        jax.jit(lambda d: xlakern.binary_csrmv(d, idx, ptr, None, shape=shape, transpose=True))(w)
    with pytest.raises(EventDTypeError, match=re.escape("t is the Python int 1099511627776")):
        jax.jit(lambda r: xlakern.csr_delay_deliver(r, spikes, w, idx, ptr, delays, 2**40, shape=shape))(ring)
    dense = np.zeros(shape)
    dense[np.repeat(np.arange(n_pre), k), idx] = w
    np.testing.assert_allclose(np.asarray(xlakern.binary_csrmv(w, idx, ptr, spikes, shape=shape, transpose=True)),
                               spikes @ dense, rtol=1e-5, atol=1e-6)
    m = np.asarray(xlakern.jits(0.3, 0.2, 7, shape=shape), np.float64)
    np.testing.assert_allclose(np.asarray(xlakern.jitsmv(0.3, 0.2, x, 7, shape=shape)), m @ x, rtol=1e-5, atol=1e-5)
