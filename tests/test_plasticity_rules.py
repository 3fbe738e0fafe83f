"""Plasticity rules of one's own on CSR synapses (csr_apply_on_pre / csr_apply_on_post, CSR/CSC
.apply_on_pre/post) against NumPy loops over the synapses in float64, on random structures."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import random_csr
from conftest import x64

N_PRE, N_POST = 23, 17
P = {"lr": 0.07, "w_max": 1.5, "decay": 0.8}


def stdp(edge, pre, post, p):
    """Weight-dependent STDP with an eligibility trace and a 2-wide tag (a leaf with a trailing dimension)."""
    elig = p["decay"] * edge["elig"] + post["y"] - pre["x"]
    w = edge["w"] + p["lr"] * (p["w_max"] - edge["w"]) * elig
    return {"w": w, "elig": elig, "tag": edge["tag"] * 0.5 + post["y"]}


def stdp_numpy(state, rows, cols, on, x, y, p):
    w, elig, tag = (np.array(state[k], np.float64) for k in ("w", "elig", "tag"))
    for e in range(w.shape[0]):
        if on[e]:
            i, j = rows[e], cols[e]
            elig[e] = p["decay"] * elig[e] + y[j] - x[i]
            w[e] = w[e] + p["lr"] * (p["w_max"] - w[e]) * elig[e]
            tag[e] = tag[e] * 0.5 + y[j]
    return {"w": w, "elig": elig, "tag": tag}


def problem(rng):
    dense, data, cols, indptr = random_csr(rng, N_PRE, N_POST, 0.3)
    rows = np.repeat(np.arange(N_PRE), np.diff(indptr))
    nse = data.shape[0]
    state = {"w": data, "elig": rng.standard_normal(nse), "tag": rng.standard_normal((nse, 2))}
    x, y = rng.random(N_PRE), rng.random(N_POST)
    return dense, cols, indptr, rows, state, x, y


def spikes_of(rng, n):
    """Numeric spikes: zeros (silent) and non-zeros of both signs and NaN (active)."""
    s = rng.choice([0.0, 0.0, 0.0, 2.0, -1.0, np.nan], size=n)
    return s, ~(s == 0)


@pytest.mark.parametrize("on_pre", [True, False])
def test_rule_matches_numpy_loop(rng, on_cpu, on_pre):
    with x64():
        _, cols, indptr, rows, state, x, y = problem(rng)
        s, fired = spikes_of(rng, N_PRE if on_pre else N_POST)
        fn = xlakern.csr_apply_on_pre if on_pre else xlakern.csr_apply_on_post
        got = jax.jit(lambda st, s: fn(stdp, st, jnp.asarray(cols), jnp.asarray(indptr), s, pre_vals={"x": x},
                                       post_vals={"y": y}, params=P, shape=(N_PRE, N_POST)))(state, s)
        on = fired[rows] if on_pre else fired[cols]
        want = stdp_numpy(state, rows, cols, on, x, y, P)
        assert on.any() and not on.all()
        for k in want:
            assert got[k].dtype == jnp.float64 and got[k].shape == want[k].shape
            np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-12, atol=1e-12, err_msg=k)
            # the others keep their state to the bit
            np.testing.assert_array_equal(np.asarray(got[k])[~on], np.asarray(state[k])[~on])


def test_bool_spikes_silent_and_all_active(rng, on_cpu):
    _, cols, indptr, rows, state, x, y = problem(rng)
    w = jnp.asarray(state["w"], jnp.float32)
    rule = lambda e, pre, post, p: e + p * post  # noqa: E731
    for s in (np.zeros(N_PRE, bool), np.ones(N_PRE, bool), rng.random(N_PRE) < 0.4):
        got = xlakern.csr_apply_on_pre(rule, w, cols, indptr, s, post_vals=y, params=0.25, shape=(N_PRE, N_POST))
        want = np.asarray(w, np.float64) + 0.25 * y[cols] * s[rows]
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
        assert got.dtype == jnp.float32


@pytest.mark.parametrize("on_pre", [True, False])
def test_nan_values_of_silent_neurons_do_not_leak(rng, on_cpu, on_pre):
    with x64():
        _, cols, indptr, rows, state, x, y = problem(rng)
        s, fired = spikes_of(rng, N_PRE if on_pre else N_POST)
        if on_pre:
            x = np.where(fired, x, np.nan)
        else:
            y = np.where(fired, y, np.nan)
        fn = xlakern.csr_apply_on_pre if on_pre else xlakern.csr_apply_on_post
        got = fn(stdp, state, cols, indptr, s, pre_vals={"x": x}, post_vals={"y": y}, params=P,
                 shape=(N_PRE, N_POST))
        on = fired[rows] if on_pre else fired[cols]
        for k in got:
            np.testing.assert_array_equal(np.asarray(got[k])[~on], np.asarray(state[k])[~on])


def test_gradients_through_params_state_and_neuron_values(rng, on_cpu):
    """rule = w + lr * post * pre: d(sum)/d lr, d/d w, d/d post and d/d pre in closed form."""
    with x64():
        _, cols, indptr, rows, state, x, y = problem(rng)
        s = rng.random(N_POST) < 0.5
        on = s[cols]
        rule = lambda e, pre, post, lr: e + lr * post * pre  # noqa: E731

        def loss(w, x, y, lr):
            return jnp.sum(xlakern.csr_apply_on_post(rule, w, cols, indptr, s, pre_vals=x, post_vals=y, params=lr,
                                                     shape=(N_PRE, N_POST)))

        gw, gx, gy, glr = jax.grad(loss, argnums=(0, 1, 2, 3))(state["w"], x, y, 0.3)
        np.testing.assert_allclose(gw, np.ones_like(state["w"]))
        np.testing.assert_allclose(glr, np.sum((y[cols] * x[rows])[on]), rtol=1e-12)
        np.testing.assert_allclose(gx, 0.3 * np.bincount(rows[on], weights=y[cols][on], minlength=N_PRE), rtol=1e-12)
        np.testing.assert_allclose(gy, 0.3 * np.bincount(cols[on], weights=x[rows][on], minlength=N_POST),
                                   rtol=1e-12)


def test_vmap_and_scan(rng, on_cpu):
    _, cols, indptr, rows, state, x, y = problem(rng)
    w = jnp.asarray(state["w"], jnp.float32)
    rule = lambda e, pre, post, lr: e + lr * post  # noqa: E731
    S = rng.random((3, N_PRE)) < 0.5
    lrs = jnp.asarray([0.1, 0.2, 0.3], jnp.float32)
    run = lambda w, s, lr: xlakern.csr_apply_on_pre(rule, w, cols, indptr, s, post_vals=y, params=lr,  # noqa: E731
                                                    shape=(N_PRE, N_POST))
    got = jax.vmap(run)(jnp.stack([w, 2 * w, 3 * w]), S, lrs)
    for b in range(3):
        want = (b + 1) * np.asarray(w, np.float64) + float(lrs[b]) * y[cols] * S[b][rows]
        np.testing.assert_allclose(np.asarray(got[b]), want, rtol=1e-6, atol=1e-6)
    # a scan carries the state in its own dtype (a Python-float parameter must not promote it)
    out, _ = jax.lax.scan(lambda w, s: (run(w, s, 0.5), None), w.astype(jnp.bfloat16), S)
    assert out.dtype == jnp.bfloat16
    want = np.asarray(w, np.float64) + 0.5 * y[cols] * S[:, rows].sum(0)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2e-2, atol=2e-2)


def test_units_convert_to_the_state_leaf(rng, on_cpu):
    u = pytest.importorskip("brainunit")
    _, cols, indptr, rows, state, x, y = problem(rng)
    w = jnp.asarray(state["w"], jnp.float32) * u.mV
    s = rng.random(N_PRE) < 0.5
    add = lambda e, pre, post, p: e + 1e-3 * post  # noqa: E731  (volt added to mV)
    got = xlakern.csr_apply_on_pre(add, w, cols, indptr, s, post_vals=jnp.asarray(y) * u.volt, shape=(N_PRE, N_POST))
    assert isinstance(got, u.Quantity) and got.unit == u.mV
    np.testing.assert_allclose(np.asarray(got.mantissa), state["w"] + y[cols] * s[rows], rtol=1e-5, atol=1e-5)
    with pytest.raises(xlakern.event.EventUnitError, match="without a unit"):
        xlakern.csr_apply_on_pre(lambda e, pre, post, p: e.mantissa, w, cols, indptr, s, shape=(N_PRE, N_POST))
    with pytest.raises(xlakern.event.EventUnitError, match="does not convert"):
        xlakern.csr_apply_on_pre(lambda e, pre, post, p: e / u.second, w, cols, indptr, s, shape=(N_PRE, N_POST))
    with pytest.raises(xlakern.event.EventUnitError, match="without a unit"):
        xlakern.csr_apply_on_pre(lambda e, pre, post, p: e * u.mV, jnp.asarray(state["w"]), cols, indptr, s,
                                 shape=(N_PRE, N_POST))


def test_bad_arguments_name_what_is_wrong(rng, on_cpu):
    _, cols, indptr, rows, state, x, y = problem(rng)
    w, s_pre, s_post = state["w"], rng.random(N_PRE) < 0.5, rng.random(N_POST) < 0.5
    same = lambda e, pre, post, p: e  # noqa: E731
    shape = (N_PRE, N_POST)
    with pytest.raises(TypeError, match="same structure"):
        xlakern.csr_apply_on_pre(lambda e, pre, post, p: e["w"], state, cols, indptr, s_pre, shape=shape)
    with pytest.raises(xlakern.event.EventRuleError):
        xlakern.csr_apply_on_post(lambda e, pre, post, p: (e, e), w, cols, indptr, s_post, shape=shape)
    for kwargs, arg in (({"pre_vals": y}, "pre_vals"), ({"post_vals": x}, "post_vals")):
        with pytest.raises(xlakern.event.EventShapeError, match=arg):
            xlakern.csr_apply_on_pre(same, w, cols, indptr, s_pre, shape=shape, **kwargs)
    with pytest.raises(xlakern.event.EventShapeError, match="edge_state"):
        xlakern.csr_apply_on_pre(same, w[:-1], cols, indptr, s_pre, shape=shape)
    with pytest.raises(ValueError, match="edge_state"):
        xlakern.csr_apply_on_pre(same, jnp.float32(1.0), cols, indptr, s_pre, shape=shape)
    with pytest.raises(xlakern.event.EventShapeError, match="pre_spike"):
        xlakern.csr_apply_on_pre(same, w, cols, indptr, s_post, shape=shape)
    with pytest.raises(xlakern.event.EventShapeError, match="post_spike"):
        xlakern.csr_apply_on_post(same, w, cols, indptr, s_pre, shape=shape)
    with pytest.raises(xlakern.event.EventShapeError, match="indptr"):
        xlakern.csr_apply_on_pre(same, w, cols, indptr, s_pre[:-1], shape=(N_PRE - 1, N_POST))
    with pytest.raises(xlakern.event.EventDTypeError, match="indices"):
        xlakern.csr_apply_on_pre(same, w, cols.astype(np.float32), indptr, s_pre, shape=shape)
    # what jax, Python or vmap refused without naming the call or the argument
    rule_error, dtype_error = xlakern.event.EventRuleError, xlakern.event.EventDTypeError
    for call, error, message in [
        (lambda: xlakern.csr_apply_on_pre(None, w, cols, indptr, s_pre, shape=shape), rule_error,
         r"csr_apply_on_pre: rule must be a function rule\(edge, pre, post, params\); got NoneType"),
        (lambda: xlakern.csr_apply_on_post(lambda e, pre: e, w, cols, indptr, s_post, shape=shape), rule_error,
         r"csr_apply_on_post: rule is called as rule\(edge, pre, post, params\), four arguments"),
        (lambda: xlakern.csr_apply_on_pre(same, w, None, indptr, s_pre, shape=shape), dtype_error,
         "csr_apply_on_pre: indices is None"),
        (lambda: xlakern.csr_apply_on_post(same, w, cols, indptr, "1011", shape=shape), dtype_error,
         r"csr_apply_on_post: post_spike is a str \('1011'\)"),
        (lambda: xlakern.csr_apply_on_pre(same, None, cols, indptr, s_pre, shape=shape),
         xlakern.event.EventShapeError, "csr_apply_on_pre: edge_state holds no array"),
        (lambda: xlakern.csr_apply_on_pre(same, w, cols, indptr, s_pre, shape=(N_PRE,)),
         xlakern.event.EventShapeError, r"shape must be a \(rows, cols\) pair of ints; got \(%d,\)" % N_PRE),
    ]:
        with pytest.raises(error, match=message):
            call()
    class Doubling:  # a callable object is a rule too
        def __call__(self, e, pre, post, p):
            return e * 2.0

    got = xlakern.csr_apply_on_pre(Doubling(), w, cols, indptr, s_pre, shape=shape)
    np.testing.assert_allclose(np.asarray(got, np.float64),
                               np.where(s_pre[rows], 2.0 * np.asarray(w, np.float64), np.asarray(w, np.float64)),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("on_pre", [True, False])
def test_out_of_range_and_rowless_synapses_are_never_updated(rng, on_cpu, on_pre):
    _, cols, indptr, rows, state, x, y = problem(rng)
    cols = cols.copy()
    cols[::5] = N_POST + 3  # out of range
    cols[1::7] = -1
    short = np.minimum(indptr, indptr[-1] - 4)  # the last 4 slots lie in no row (indptr still rises)
    w = jnp.asarray(state["w"], jnp.float32)
    fired = np.ones(N_PRE if on_pre else N_POST, bool)
    fn = xlakern.csr_apply_on_pre if on_pre else xlakern.csr_apply_on_post
    got = np.asarray(fn(lambda e, pre, post, p: e + 1.0, w, cols, short, fired, shape=(N_PRE, N_POST)))
    changed = (cols >= 0) & (cols < N_POST)
    changed[short[-1]:] = False
    np.testing.assert_allclose(got, np.asarray(w) + changed, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("on_pre", [True, False])
def test_layout_methods_on_csr_and_csc(rng, on_cpu, on_pre):
    """W.apply_on_pre/post on a CSR and on a CSC of the same matrix change the same synapses the same
    way (compared as dense matrices: the two store them in different orders)."""
    with x64():
        dense, cols, indptr, rows, state, x, y = problem(rng)
        s = (rng.random(N_PRE if on_pre else N_POST) < 0.5)
        rule = lambda w, pre, post, p: w * (1 + p * pre) - post  # noqa: E731
        method = "apply_on_pre" if on_pre else "apply_on_post"
        want = np.where(dense != 0, dense * (1 + 0.2 * x[:, None]) - y[None, :], 0.0)
        fired = s[:, None] if on_pre else s[None, :]
        want = np.where(fired, want, dense)
        for W in (xlakern.CSR.fromdense(dense), xlakern.CSC.fromdense(dense)):
            new = getattr(W, method)(rule, s, pre_vals=x, post_vals=y, params=0.2)
            np.testing.assert_allclose(np.asarray(W.with_data(new).todense()), want, rtol=1e-12, atol=1e-12,
                                       err_msg=type(W).__name__)
        W = xlakern.CSR.fromdense(dense)
        fn = xlakern.csr_apply_on_pre if on_pre else xlakern.csr_apply_on_post
        np.testing.assert_array_equal(getattr(W, method)(rule, s, pre_vals=x, post_vals=y, params=0.2),
                                      fn(rule, W.data, W.indices, W.indptr, s, pre_vals=x, post_vals=y, params=0.2,
                                         shape=W.shape))
        # a gradient with respect to the layout (its index arrays are leaves: allow_int)
        g = jax.grad(lambda W: jnp.sum(getattr(W, method)(rule, s, pre_vals=x, post_vals=y, params=0.2)),
                     allow_int=True)(W)
        on = s[rows] if on_pre else s[cols]
        np.testing.assert_allclose(np.asarray(g.data), np.where(on, 1 + 0.2 * x[rows], 1.0), rtol=1e-12)


@pytest.mark.parametrize("cls", ["CSR", "CSC"])
def test_layout_methods_name_the_caller_and_argument(rng, on_cpu, cls):
    """A CSC applies the rule through its stored columns, yet its errors speak of W's own sides."""
    dense = random_csr(rng, N_PRE, N_POST, 0.3)[0]
    W = getattr(xlakern, cls).fromdense(dense)
    same = lambda e, pre, post, p: e  # noqa: E731
    s_pre, s_post = rng.random(N_PRE) < 0.5, rng.random(N_POST) < 0.5
    with pytest.raises(xlakern.event.EventShapeError, match=rf"{cls}\.apply_on_pre: a leaf of pre_vals .* {N_PRE}"):
        W.apply_on_pre(same, s_pre, pre_vals=np.ones(N_POST))
    with pytest.raises(xlakern.event.EventShapeError, match=rf"{cls}\.apply_on_post: a leaf of post_vals .* {N_POST}"):
        W.apply_on_post(same, s_post, post_vals=np.ones(N_PRE))
    with pytest.raises(xlakern.event.EventShapeError, match=rf"{cls}\.apply_on_pre: pre_spike has shape"):
        W.apply_on_pre(same, s_post)
    with pytest.raises(xlakern.event.EventShapeError, match=rf"{cls}\.apply_on_post: post_spike has shape"):
        W.apply_on_post(same, s_pre)


def test_shared_weight_needs_an_explicit_state(rng, on_cpu):
    _, cols, indptr, rows, state, x, y = problem(rng)
    W = xlakern.CSR((jnp.ones(1), cols, indptr), shape=(N_PRE, N_POST))
    s = rng.random(N_PRE) < 0.5
    rule = lambda w, pre, post, p: w + p  # noqa: E731
    with pytest.raises(xlakern.event.EventShapeError, match="homogeneous"):
        W.apply_on_pre(rule, s, params=0.5)
    got = W.apply_on_pre(rule, s, edge_state=jnp.asarray(state["w"], jnp.float32), params=0.5)
    np.testing.assert_allclose(np.asarray(got), state["w"] + 0.5 * s[rows], rtol=1e-6, atol=1e-6)


def test_spike_bits_read_what_the_gather_reads(rng):
    """The CUDA path's bit test (a word per 32 neurons) against the plain gather: sizes on and off a
    multiple of 32, one neuron, int32 and int64 positions, every neuron read."""
    from xlakern.event import _plasticity_rules as R

    with x64():
        for n in (1, 31, 32, 33, 1000):
            fired = jnp.asarray(rng.random(n) < 0.3)
            for dtype in (jnp.int32, jnp.int64):
                at = jnp.asarray(np.concatenate([np.arange(n), rng.integers(0, n, 500)]), dtype)
                np.testing.assert_array_equal(R._fired_in_bits(fired, at), np.asarray(fired)[np.asarray(at)])


@pytest.mark.gpu
@pytest.mark.parametrize("on_pre", [True, False])
def test_rules_on_the_gpu(rng, on_pre):
    """The tests above with the GPU as the default device (the spikes are read from bits there)."""
    with jax.default_device(jax.devices("gpu")[0]):
        assert jnp.zeros(1).devices() == {jax.devices("gpu")[0]}
        test_rule_matches_numpy_loop(rng, None, on_pre)
        test_nan_values_of_silent_neurons_do_not_leak(rng, None, on_pre)
        test_out_of_range_and_rowless_synapses_are_never_updated(rng, None, on_pre)
        test_layout_methods_on_csr_and_csc(rng, None, on_pre)
        if on_pre:
            test_bool_spikes_silent_and_all_active(rng, None)
            test_gradients_through_params_state_and_neuron_values(rng, None)
            test_vmap_and_scan(rng, None)
