"""The fused LIF network simulator (xlakern.event.run_lif_network) against an independent float64
NumPy model of the same network, against itself (one call of m steps = m calls of one step), and
against the operator path of examples/brette2007.py (the same spike trains)."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from xlakern.event import LIFParams, LIFState, run_lif_network

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

VARIANTS = {
    "coba_euler": LIFParams(),
    "cuba_euler": LIFParams(synapse="cuba", v_rest=-49.0),
    "coba_exp": LIFParams(drive=20.0, syn_scale=1e-3, integrator="exp_euler"),
    "cuba_exp": LIFParams(synapse="cuba", v_rest=-52.0, drive=3.0, integrator="exp_euler", t_ref=2.0),
}

BACKENDS = [
    pytest.param(("cpp", "auto"), id="cpp"),
    pytest.param(("jnp", "auto"), id="jnp"),
    pytest.param(("cuda", "block"), id="cuda-block", marks=pytest.mark.gpu),
    pytest.param(("cuda", "grid"), id="cuda-grid", marks=pytest.mark.gpu),
    pytest.param(("cuda", "stream"), id="cuda-stream", marks=pytest.mark.gpu),
]


def _device_for(backend):
    return jax.devices("gpu")[0] if backend == "cuda" else jax.devices("cpu")[0]


def random_network(rng, n, n_exc, k_e, k_i, *, hetero: bool, out_of_range: bool = True):
    """Fresh random connectivity (a few targets out of range, to be dropped) and state."""
    idx_e = rng.integers(0, n, size=(n_exc, k_e)).astype(np.int32)
    idx_i = rng.integers(0, n, size=(n - n_exc, k_i)).astype(np.int32)
    if out_of_range and idx_e.size and idx_i.size:
        idx_e.flat[rng.choice(idx_e.size, max(1, idx_e.size // 200), replace=False)] = n + 3
        idx_i.flat[rng.choice(idx_i.size, max(1, idx_i.size // 200), replace=False)] = -1
    if hetero:
        w_e = rng.uniform(0.2, 1.0, size=idx_e.shape).astype(np.float32)
        w_i = rng.uniform(2.0, 8.0, size=idx_i.shape).astype(np.float32)
    else:
        w_e = np.array([rng.uniform(0.3, 0.9)], np.float32)
        w_i = np.array([rng.uniform(3.0, 7.0)], np.float32)
    state = dict(
        v=rng.uniform(-62.0, -48.0, n).astype(np.float32),
        ge=rng.uniform(0.0, 8.0, n).astype(np.float32),
        gi=rng.uniform(0.0, 30.0, n).astype(np.float32),
        ref=np.where(rng.random(n) < 0.2, rng.uniform(0.0, 5.0, n), 0.0).astype(np.float32),
        spk=rng.random(n) < 0.05,
    )
    return (idx_e, w_e), (idx_i, w_i), state


def numpy_step(p: LIFParams, conn_e, conn_i, s):
    """One step of the model in float64 NumPy (independent of every backend)."""
    n = s["v"].shape[0]
    n_exc = conn_e[0].shape[0]
    inp = []
    for (idx, w), spk in ((conn_e, s["spk"][:n_exc]), (conn_i, s["spk"][n_exc:])):
        acc = np.zeros(n)
        wfull = np.broadcast_to(np.asarray(w, np.float64).reshape(-1)[0] if np.size(w) == 1 else
                                np.asarray(w, np.float64).reshape(idx.shape), idx.shape)
        rows = np.nonzero(spk)[0]
        tgt, ww = idx[rows].reshape(-1), wfull[rows].reshape(-1)
        ok = (tgt >= 0) & (tgt < n)
        np.add.at(acc, tgt[ok], ww[ok])
        inp.append(acc)
    return numpy_membrane(p, s, inp[0], inp[1])


def numpy_membrane(p: LIFParams, s, in_e, in_i):
    """The rest of numpy_step: the conductances take this step's input, the membrane advances."""
    v, ref = s["v"].astype(np.float64), s["ref"].astype(np.float64)
    ge = s["ge"] * np.exp(-p.dt / p.tau_e) + in_e
    gi = s["gi"] * np.exp(-p.dt / p.tau_i) + in_i
    if p.synapse == "coba":
        current = p.syn_scale * (ge * (p.e_exc - v) + gi * (p.e_inh - v)) + p.drive
    else:
        current = ge + gi + p.drive
    if p.integrator == "exp_euler":
        target = p.v_rest + current
        v_new = target + (v - target) * np.exp(-p.dt / p.tau_m)
    else:
        v_new = v + p.dt * (p.v_rest - v + current) / p.tau_m
    v_new = np.where(ref > 0, p.v_reset, v_new)
    fired = v_new >= p.v_th
    return dict(v=np.where(fired, p.v_reset, v_new), ge=ge, gi=gi,
                ref=np.where(fired, p.t_ref, np.maximum(ref - p.dt, 0.0)), spk=fired), v_new


def _conns(conn_e, conn_i, n):
    (idx_e, w_e), (idx_i, w_i) = conn_e, conn_i
    return (xlakern.FixedNumPerPre((jnp.asarray(w_e), jnp.asarray(idx_e)), shape=(idx_e.shape[0], n)),
            xlakern.FixedNumPerPre((jnp.asarray(w_i), jnp.asarray(idx_i)), shape=(idx_i.shape[0], n)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("hetero", [False, True], ids=["shared-w", "per-synapse-w"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_step_matches_float64_numpy(rng, backend, variant, hetero):
    backend, mode = backend
    p = VARIANTS[variant]
    n, n_exc = 3001, 2400  # odd size: a partial last chunk
    conn_e, conn_i, s = random_network(rng, n, n_exc, 80, 60, hetero=hetero)
    with jax.default_device(_device_for(backend)):
        ce, ci = _conns(conn_e, conn_i, n)
        out, count = run_lif_network({k: jnp.asarray(x) for k, x in s.items()}, ce, ci, p, 1, backend=backend,
                                     gpu_mode=mode)
    expect, v_new = numpy_step(p, conn_e, conn_i, s)
    assert_step_matches(p, out, count, expect, v_new)


def assert_step_matches(p: LIFParams, out, count, expect, v_new):
    """One step's output (state dict and counts) against the float64 model's."""
    clear = np.abs(v_new - p.v_th) > 1e-3  # float32 may settle a threshold tie either way
    assert 0 < expect["spk"].sum() < expect["spk"].size  # the inputs exercise both outcomes
    np.testing.assert_array_equal(np.asarray(out["spk"])[clear], expect["spk"][clear])
    np.testing.assert_array_equal(np.asarray(count), np.asarray(out["spk"]).astype(np.int32))
    for key in ("ge", "gi"):
        np.testing.assert_allclose(np.asarray(out[key]), expect[key], rtol=2e-6, atol=2e-5)
    for key in ("v", "ref"):
        np.testing.assert_allclose(np.asarray(out[key])[clear], expect[key][clear], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_steps_in_one_call_equal_one_step_calls(rng, backend):
    """Shared weights: every input is a sum of equal values, so any order gives the same bits and
    one call of m steps must equal m calls of one step exactly (state, spikes and counts)."""
    backend, mode = backend
    p = VARIANTS["coba_exp"]
    n, n_exc, steps = 2000, 1600, 120
    conn_e, conn_i, s = random_network(rng, n, n_exc, 80, 80, hetero=False)
    with jax.default_device(_device_for(backend)):
        ce, ci = _conns(conn_e, conn_i, n)
        s0 = LIFState(**{k: jnp.asarray(x) for k, x in s.items()})
        whole, count = jax.jit(lambda s: run_lif_network(s, ce, ci, p, steps, backend=backend, gpu_mode=mode))(s0)

        def one(s, _):
            s, c = run_lif_network(s, ce, ci, p, 1, backend=backend, gpu_mode=mode)
            return s, s.spk

        last, raster = jax.jit(lambda s: jax.lax.scan(one, s, None, length=steps))(s0)
    assert isinstance(whole, LIFState)
    raster = np.asarray(raster)
    assert raster.sum() > steps  # the network is active
    np.testing.assert_array_equal(np.asarray(count), raster.sum(0))
    for a, b in zip(whole, last):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("backend", [BACKENDS[0], BACKENDS[1], BACKENDS[4]])
def test_vmap_runs_each_network_of_the_batch(rng, backend):
    """vmap over the state and over a population's shared weight gives, for each batch element, the
    call on that element alone (shared weights: the same bits in any order of adds)."""
    backend, mode = backend
    p = VARIANTS["coba_euler"]
    n, n_exc, steps, batch = 500, 400, 40, 3
    conn_e, conn_i, s = random_network(rng, n, n_exc, 30, 30, hetero=False)
    states = [random_network(rng, n, n_exc, 1, 1, hetero=False)[2] for _ in range(batch)]
    stacked = {k: jnp.asarray(np.stack([st[k] for st in states])) for k in s}
    w_e = jnp.asarray(rng.uniform(0.3, 1.2, batch).astype(np.float32))
    with jax.default_device(_device_for(backend)):
        ce, ci = _conns(conn_e, conn_i, n)

        def run(st, w):
            return run_lif_network(st, ce.with_data(jnp.reshape(w, (1,))), ci, p, steps, backend=backend,
                                   gpu_mode=mode)

        out, count = jax.jit(jax.vmap(run))(stacked, w_e)
        for b in range(batch):
            one, one_count = jax.jit(run)({k: x[b] for k, x in stacked.items()}, w_e[b])
            np.testing.assert_array_equal(np.asarray(count[b]), np.asarray(one_count))
            for k in s:
                if backend == "jnp" and k != "spk":  # XLA fuses the batched jnp step differently: an ulp or two
                    np.testing.assert_allclose(np.asarray(out[k][b]), np.asarray(one[k]), rtol=1e-6, atol=1e-6)
                else:  # the kernels run each element's own call
                    np.testing.assert_array_equal(np.asarray(out[k][b]), np.asarray(one[k]))
    assert (np.asarray(count).sum(1) > 0).all()  # every network spikes
    v = np.asarray(out["v"])
    assert all(not np.array_equal(v[a], v[b]) for a in range(batch) for b in range(a))  # and each its own way


def test_gradients_are_refused_with_what_to_do(rng):
    """run_lif_network has no gradient: jax.grad and jax.jvp raise an XlakernError that says so and what
    to use; a state under stop_gradient passes (its tangents are zero), and the value still flows."""
    conn_e, conn_i, s = random_network(rng, 300, 240, 20, 20, hetero=True)
    ce, ci = _conns(conn_e, conn_i, 300)
    st = {k: jnp.asarray(x) for k, x in s.items()}

    def final_v(v):
        return run_lif_network(dict(st, v=v), ce, ci, LIFParams(), 5)[0]["v"].sum()

    for transform in (lambda: jax.grad(final_v)(st["v"]),
                      lambda: jax.jvp(final_v, (st["v"],), (jnp.ones_like(st["v"]),)),
                      lambda: jax.grad(lambda w: run_lif_network(st, ce.with_data(w), ci, LIFParams(), 5)[0]["v"]
                                       .sum())(ce.data)):
        with pytest.raises(xlakern.errors.UnsupportedOperationError, match="not differentiable.*surrogate"):
            transform()
    scale = jnp.float32(rng.uniform(0.5, 2.0))
    g = jax.grad(lambda a: a * final_v(jax.lax.stop_gradient(st["v"])))(scale)
    np.testing.assert_allclose(float(g), float(final_v(st["v"])), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["grid", "stream"])
def test_gpu_grid_modes_large_network_match_cpu(rng, mode):
    """A network large enough for many blocks: the first steps (before float differences between
    compilers can grow) give the same spikes as the C++ kernel, and rates agree over 1,000 steps."""
    p = VARIANTS["coba_exp"]
    n, n_exc = 60_000, 48_000
    conn_e, conn_i, s = random_network(rng, n, n_exc, 80, 80, hetero=False, out_of_range=False)
    res = {}
    for backend in ("cpp", "cuda"):
        with jax.default_device(_device_for(backend)):
            ce, ci = _conns(conn_e, conn_i, n)
            s0 = {k: jnp.asarray(x) for k, x in s.items()}
            first, c20 = run_lif_network(s0, ce, ci, p, 20, backend=backend, gpu_mode=mode)
            _, c1000 = run_lif_network(s0, ce, ci, p, 1000, backend=backend, gpu_mode=mode)
            res[backend] = np.asarray(c20), np.asarray(c1000)
    assert res["cpp"][0].sum() > 0
    assert (res["cpp"][0] != res["cuda"][0]).mean() < 1e-3
    rate_cpu, rate_gpu = res["cpp"][1].mean(), res["cuda"][1].mean()
    assert rate_cpu > 0 and abs(rate_gpu - rate_cpu) / rate_cpu < 0.02


@pytest.mark.parametrize("backend", BACKENDS[:1] + BACKENDS[2:])
def test_same_spikes_as_the_example_operator_path(backend):
    """examples/brette2007.py on event operators and the fused simulator, same network and seed."""
    backend, mode = backend
    sys.path.insert(0, EXAMPLES)
    import brette2007

    steps = 400
    for name in ("coba", "cuba", "coba_scaled"):
        model = brette2007.MODELS[name]
        with jax.default_device(_device_for(backend)):
            conns, state0, step = brette2007.build(xlakern, model, 2000, 3)

            def scripted(s):
                def body(s, _):
                    s = step(*conns, s)
                    return s, s["spk"]
                return jax.lax.scan(body, s, None, length=steps)[1]

            def fused(s):
                def body(s, _):
                    s, _ = run_lif_network(s, *conns, brette2007.lif_params(model), 1, backend=backend,
                                           gpu_mode=mode)
                    return s, s["spk"]
                return jax.lax.scan(body, s, None, length=steps)[1]

            a, b = np.asarray(jax.jit(scripted)(state0)), np.asarray(jax.jit(fused)(state0))
        assert a.sum() > 100, name
        # Different compilers may round one product differently (fused multiply-add); a spike
        # that moves by a step then perturbs its targets, so allow a sliver of the raster.
        assert (a != b).mean() < 2e-3, (name, (a != b).mean())
        assert abs(b.sum() - a.sum()) <= 0.01 * a.sum(), name


def test_bad_arguments_raise_xlakern_errors(rng):
    conn_e, conn_i, s = random_network(rng, 100, 80, 5, 5, hetero=False)
    ce, ci = _conns(conn_e, conn_i, 100)
    p = LIFParams()
    st = {k: jnp.asarray(x) for k, x in s.items()}
    with pytest.raises(xlakern.XlakernError, match="FixedNumPerPre"):
        run_lif_network(st, ce.T, ci, p, 1)
    with pytest.raises(xlakern.XlakernError, match="rows"):
        run_lif_network(st, ce, ce, p, 1)
    with pytest.raises(xlakern.XlakernError, match="columns"):
        bad = xlakern.FixedNumPerPre((jnp.ones((1,)), jnp.zeros((80, 5), jnp.int32)), shape=(80, 99))
        run_lif_network(st, bad, ci, p, 1)
    with pytest.raises(xlakern.XlakernError, match="state.ge"):
        run_lif_network(dict(st, ge=st["ge"][:50]), ce, ci, p, 1)
    with pytest.raises(xlakern.XlakernError, match="steps"):
        run_lif_network(st, ce, ci, p, -1)
    with pytest.raises(xlakern.XlakernError, match="gpu_mode"):
        run_lif_network(st, ce, ci, p, 1, gpu_mode="warp")
    big = random_network(rng, 5000, 4000, 2, 2, hetero=False)
    with pytest.raises(xlakern.XlakernError, match="'block' runs up to 4096"):
        run_lif_network({k: jnp.asarray(x) for k, x in big[2].items()}, *_conns(big[0], big[1], 5000), p, 1,
                        gpu_mode="block")
    with pytest.raises(xlakern.XlakernError, match="synapse"):
        LIFParams(synapse="alpha")
    with pytest.raises(xlakern.XlakernError, match="tau_m"):
        LIFParams(tau_m=0.0)
    with pytest.raises(xlakern.XlakernError, match="LIFState"):
        run_lif_network([st["v"]], ce, ci, p, 1)
    # values no array or number can be made of: jax's and float()'s own errors named no argument
    from xlakern.event import EventDTypeError
    with pytest.raises(EventDTypeError, match=r"run_lif_network: state\.ref is None"):
        run_lif_network(dict(st, ref=None), ce, ci, p, 1)
    with pytest.raises(EventDTypeError, match=r"state\.v is a str"):
        run_lif_network(dict(st, v="-60"), ce, ci, p, 1)
    for field, value in (("dt", None), ("drive", "20"), ("v_th", [-50.0, -49.0])):
        with pytest.raises(EventDTypeError, match=rf"LIFParams: {field}=.*expected a concrete number"):
            LIFParams(**{field: value})
    with pytest.raises(EventDTypeError, match="drive"):
        jax.jit(lambda d: LIFParams(drive=d).vector())(1.0)
    assert LIFParams(drive=np.float32(2.5), tau_m=10).vector()[11] == np.float32(2.5)


def test_units_are_refused_with_a_hint(rng):
    bu = pytest.importorskip("brainunit")
    conn_e, conn_i, s = random_network(rng, 50, 40, 4, 4, hetero=False)
    ce, ci = _conns(conn_e, conn_i, 50)
    st = {k: jnp.asarray(x) for k, x in s.items()}
    with pytest.raises(xlakern.XlakernError, match="unit"):
        run_lif_network(dict(st, v=st["v"] * bu.mV), ce, ci, LIFParams(), 1)


def test_zero_steps_and_empty_populations(rng):
    conn_e, conn_i, s = random_network(rng, 64, 64, 5, 5, hetero=False)  # no inhibitory neurons
    ce, ci = _conns(conn_e, conn_i, 64)
    st = {k: jnp.asarray(x) for k, x in s.items()}
    same, count = run_lif_network(st, ce, ci, LIFParams(), 0)
    for k in st:
        np.testing.assert_array_equal(np.asarray(same[k]), np.asarray(st[k]))
    assert not np.asarray(count).any()
    out, count = run_lif_network(st, ce, ci, LIFParams(), 3)
    ref = run_lif_network(st, ce, ci, LIFParams(), 3, backend="jnp")
    np.testing.assert_array_equal(np.asarray(count), np.asarray(ref[1]))


def test_cuda_kernel_compiles_for_hopper():
    """The GPU source builds for an H100 (sm_90) on a machine without a GPU and exports both entry points."""
    try:
        xlakern._toolchain.find_nvcc()
    except xlakern.ToolchainError:
        pytest.skip("nvcc not installed")
    from xlakern.event._network import KERNEL_DIR

    assert {"lif_common.h", "lif_cpu.cc", "lif_cuda.cu"} <= {p.name for p in KERNEL_DIR.iterdir()}
    mod = xlakern.load_cuda_file(KERNEL_DIR / "lif_cuda.cu", name="lif_cuda_check", compute_capability="9.0",
                                 allow_cuda_graph=False)
    assert set(mod.functions) == {"lif_run", "lif_shard_step"}


_CACHE_SCRIPT = r"""
import numpy as np, jax.numpy as jnp
import xlakern
from xlakern.event import LIFParams, LIFState, run_lif_network
rng = np.random.default_rng(0)
n = 200
ce = xlakern.FixedNumPerPre((jnp.full((1,), 0.6), jnp.asarray(rng.integers(0, n, (160, 8)), jnp.int32)), shape=(160, n))
ci = xlakern.FixedNumPerPre((jnp.full((1,), 6.7), jnp.asarray(rng.integers(0, n, (40, 8)), jnp.int32)), shape=(40, n))
state = LIFState.initial(rng.uniform(-60.0, -50.0, n))
_, count = run_lif_network(state, ce, ci, LIFParams(drive=12.0), 50)
print("SPIKES", int(np.asarray(count).sum()))
"""


def test_fresh_process_runs_the_cached_kernel_without_a_compiler(tmp_path):
    from _fresh_process import build_then_forbid

    first, second = build_then_forbid(_CACHE_SCRIPT, tmp_path, build_timeout=600)
    spikes = int(second.split("SPIKES")[1].split()[0])
    assert spikes > 0 and spikes == int(first.split("SPIKES")[1].split()[0])
