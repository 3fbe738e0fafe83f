"""run_lif_network_sharded (the fused LIF simulator split over devices, issue 16) against an
independent float64 NumPy model of the whole network, against itself (one call of m steps = m
calls of one; 1, 2 and 4 shards give the same spike trains) and against run_lif_network."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from xlakern.event import LIFParams, LIFState, run_lif_network, run_lif_network_sharded

from test_lif_network import assert_step_matches, numpy_membrane  # the float64 model of a step

VARIANTS = {
    "coba_euler": LIFParams(),
    "cuba_exp": LIFParams(synapse="cuba", v_rest=-52.0, drive=3.0, integrator="exp_euler", t_ref=2.0),
    "coba_exp": LIFParams(drive=20.0, syn_scale=1e-3, integrator="exp_euler"),
}
BACKENDS = [pytest.param("cpp", id="cpp"), pytest.param("jnp", id="jnp"),
            pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def _device(backend):
    return jax.devices("gpu")[0] if backend == "cuda" else jax.devices("cpu")[0]


def global_network(rng, blocks, block, exc_per_block, k, *, hetero):
    """The whole network: every neuron's k global targets (a few out of range), weights, state."""
    n = blocks * block
    kinds = (np.arange(n) % block) < exc_per_block
    targets = rng.integers(0, n, size=(n, k)).astype(np.int64)
    targets.flat[rng.choice(targets.size, max(1, targets.size // 100), replace=False)] = -5  # dropped
    if hetero:
        w = np.where(kinds[:, None], rng.uniform(0.2, 1.0, (n, k)), rng.uniform(2.0, 8.0, (n, k))).astype(np.float32)
    else:
        w = np.where(kinds[:, None], np.float32(rng.uniform(0.3, 0.9)), np.float32(rng.uniform(3.0, 7.0)))
        w = np.broadcast_to(w, (n, k)).astype(np.float32)
    state = dict(v=rng.uniform(-62.0, -48.0, n).astype(np.float32), ge=rng.uniform(0.0, 8.0, n).astype(np.float32),
                 gi=rng.uniform(0.0, 30.0, n).astype(np.float32),
                 ref=np.where(rng.random(n) < 0.2, rng.uniform(0.0, 5.0, n), 0.0).astype(np.float32),
                 spk=rng.random(n) < 0.05)
    return dict(n=n, block=block, exc=exc_per_block, kinds=kinds, targets=targets, w=w, hetero=hetero, state=state)


def shard_conns(net, shards, s):
    """Shard s's FixedNumPerPre pair: every neuron's targets inside the shard, as local indices
    (the others replaced by -1, which the kernels drop)."""
    n_local = net["n"] // shards
    local = net["targets"] - s * n_local
    local = np.where((local >= 0) & (local < n_local), local, -1).astype(np.int32)
    out = []
    for mask in (net["kinds"], ~net["kinds"]):
        idx, w = local[mask], net["w"][mask]
        data = w if net["hetero"] else w.reshape(-1)[:1]
        out.append(xlakern.FixedNumPerPre((jnp.asarray(data), jnp.asarray(idx)), shape=(idx.shape[0], n_local)))
    return out


def numpy_step(p: LIFParams, net, s):
    """One step of the whole network in float64 NumPy."""
    n = net["n"]
    inp = [np.zeros(n), np.zeros(n)]
    for pre in np.nonzero(s["spk"])[0]:
        acc = inp[0] if net["kinds"][pre] else inp[1]
        t = net["targets"][pre]
        ok = (t >= 0) & (t < n)
        np.add.at(acc, t[ok], net["w"][pre][ok].astype(np.float64))
    return numpy_membrane(p, s, inp[0], inp[1])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("hetero", [False, True], ids=["shared-w", "per-synapse-w"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_step_matches_float64_numpy(rng, backend, variant, hetero):
    p = VARIANTS[variant]
    net = global_network(rng, blocks=3, block=1003, exc_per_block=802, k=60, hetero=hetero)  # 3009: a partial word
    with jax.default_device(_device(backend)):
        ce, ci = shard_conns(net, 1, 0)
        out, count = run_lif_network_sharded({k: jnp.asarray(x) for k, x in net["state"].items()}, ce, ci, p, 1,
                                             block=1003, exc_per_block=802, backend=backend)
    expect, v_new = numpy_step(p, net, net["state"])
    assert_step_matches(p, out, count, expect, v_new)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_steps_in_one_call_equal_one_step_calls(rng, backend):
    """Shared weights: each conductance receives equal addends, so one call of m steps equals m
    calls of one step to the bit (state, spikes, counts)."""
    p = VARIANTS["coba_exp"]
    net = global_network(rng, blocks=2, block=1000, exc_per_block=800, k=80, hetero=False)
    steps = 150
    with jax.default_device(_device(backend)):
        ce, ci = shard_conns(net, 1, 0)
        s0 = LIFState(**{k: jnp.asarray(x) for k, x in net["state"].items()})
        run = lambda s, m: run_lif_network_sharded(s, ce, ci, p, m, block=1000, backend=backend)  # noqa: E731
        whole, count = jax.jit(lambda s: run(s, steps))(s0)

        def one(s, _):
            s, _ = run(s, 1)
            return s, s.spk

        last, raster = jax.jit(lambda s: jax.lax.scan(one, s, None, length=steps))(s0)
    raster = np.asarray(raster)
    assert isinstance(whole, LIFState) and raster.sum() > steps
    if backend == "jnp":
        # XLA fuses the decay into the update in one case and not the other, and LLVM may then
        # contract a different product into a multiply-add: ulps, and rarely a moved spike.
        assert (np.asarray(count) != raster.sum(0)).mean() < 5e-3
        np.testing.assert_allclose(np.asarray(whole.ge), np.asarray(last.ge), rtol=1e-3, atol=1e-3)
        return
    np.testing.assert_array_equal(np.asarray(count), raster.sum(0))
    for a, b in zip(whole, last):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_shard_is_run_lif_network(rng, backend):
    """With one block, one shard is run_lif_network's network. The GPU's stream mode does the very
    same arithmetic (deliveries into decayed conductances), so there the trains are equal to the
    bit; the CPU's run_lif_network sums a step's input before adding it, so there the spikes of
    the first steps agree and the rates within 2% over 1,000 steps."""
    p = VARIANTS["coba_exp"]
    net = global_network(rng, blocks=1, block=5000, exc_per_block=4000, k=80, hetero=False)
    with jax.default_device(_device(backend)):
        ce, ci = shard_conns(net, 1, 0)
        s0 = LIFState(**{k: jnp.asarray(x) for k, x in net["state"].items()})
        mode = dict(gpu_mode="stream") if backend == "cuda" else {}
        counts = []
        for steps in (20, 1000):
            a, ca = run_lif_network_sharded(s0, ce, ci, p, steps, backend=backend)
            b, cb = run_lif_network(s0, ce, ci, p, steps, backend=backend, **mode)
            counts.append((np.asarray(ca), np.asarray(cb)))
            if backend == "cuda":
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    (a20, b20), (a1k, b1k) = counts
    assert b20.sum() > 0 and (a20 != b20).mean() < 2e-3
    assert abs(a1k.mean() - b1k.mean()) <= 0.02 * b1k.mean()


def test_bad_arguments_raise_xlakern_errors(rng):
    net = global_network(rng, blocks=2, block=64, exc_per_block=50, k=5, hetero=False)
    ce, ci = shard_conns(net, 1, 0)
    st = {k: jnp.asarray(x) for k, x in net["state"].items()}
    p = LIFParams()
    with pytest.raises(xlakern.XlakernError, match="block=100 must be a positive divisor"):
        run_lif_network_sharded(st, ce, ci, p, 1, block=100)
    with pytest.raises(xlakern.XlakernError, match="exc_per_block"):
        run_lif_network_sharded(st, ce, ci, p, 1, block=64, exc_per_block=65)
    with pytest.raises(xlakern.XlakernError, match="needs 80 and 48"):
        run_lif_network_sharded(st, ce, ci, p, 1, block=64, exc_per_block=40)
    with pytest.raises(xlakern.XlakernError, match="state.gi"):
        run_lif_network_sharded(dict(st, gi=st["gi"][:7]), ce, ci, p, 1, block=64)
    with pytest.raises(xlakern.XlakernError, match="columns"):
        run_lif_network_sharded(dict((k, x[:64]) for k, x in st.items()), ce, ci, p, 1)
    with pytest.raises(xlakern.XlakernError, match="steps"):
        run_lif_network_sharded(st, ce, ci, p, -2, block=64)
    with pytest.raises(xlakern.XlakernError, match="underflows"):
        run_lif_network_sharded(st, ce, ci, LIFParams(dt=200.0, tau_e=0.1), 1, block=64)
    with pytest.raises(xlakern.XlakernError, match="at least one neuron"):
        run_lif_network_sharded({k: x[:0] for k, x in st.items()}, ce, ci, p, 1)
    same, count = run_lif_network_sharded(st, ce, ci, p, 0, block=64)
    np.testing.assert_array_equal(np.asarray(same["v"]), np.asarray(st["v"]))
    assert not np.asarray(count).any()
    with pytest.raises(xlakern.errors.UnsupportedOperationError, match="run_lif_network_sharded is not differentiable"):
        jax.grad(lambda v: run_lif_network_sharded(dict(st, v=v), ce, ci, p, 2, block=64)[0]["v"].sum())(st["v"])


SHARDED_CHILD = r"""
import sys, numpy as np, jax, jax.numpy as jnp
from functools import partial
from jax.sharding import Mesh, PartitionSpec as P
sys.path.insert(0, {tests!r})
import test_lif_sharded as t
from xlakern.event import LIFParams, LIFState, run_lif_network_sharded
backend = sys.argv[1]
rng = np.random.default_rng(4)
block = 500
net = t.global_network(rng, blocks=8, block=block, exc_per_block=400, k=40, hetero=False)
p = t.VARIANTS["coba_exp"]
shard_map = getattr(jax, "shard_map", None) or __import__("jax.experimental.shard_map", fromlist=["x"]).shard_map
results = {{}}
for shards in (1, 2, 4):
    conns = [t.shard_conns(net, shards, s) for s in range(shards)]
    stack = lambda f: jnp.stack([f(c) for c in conns])
    idx_e, idx_i = stack(lambda c: c[0].indices), stack(lambda c: c[1].indices)
    w_e, w_i = conns[0][0].data, conns[0][1].data
    mesh = Mesh(np.asarray(jax.devices()[:shards]), ("neurons",))
    state = {{k: jnp.asarray(x) for k, x in net["state"].items()}}

    @jax.jit
    @partial(shard_map, mesh=mesh, in_specs=(P("neurons"), P("neurons"), P("neurons")),
             out_specs=(P("neurons"), P("neurons")))
    def run(state, idx_e, idx_i):
        import xlakern
        n_local = state["v"].shape[0]
        ce = xlakern.FixedNumPerPre((w_e, idx_e[0]), shape=(idx_e.shape[1], n_local))
        ci = xlakern.FixedNumPerPre((w_i, idx_i[0]), shape=(idx_i.shape[1], n_local))
        total = jnp.zeros_like(state["v"], dtype=jnp.int32)
        for _ in range(3):  # three calls of 100 steps: the spikes carry over between calls
            state, c = run_lif_network_sharded(state, ce, ci, p, 100, axis_name="neurons", block=block,
                                               backend=backend)
            total = total + c
        return state, total

    state, total = run(state, idx_e, idx_i)
    results[shards] = {{k: np.asarray(x) for k, x in state.items()}}, np.asarray(total)
ref_state, ref_total = results[1]
assert ref_total.sum() > 1000, ref_total.sum()
for shards in (2, 4):
    st, tot = results[shards]
    assert np.array_equal(tot, ref_total), (shards, np.argwhere(tot != ref_total)[:5])
    for k in ref_state:  # (XLA may contract the jnp backend's products differently at another size)
        same = np.array_equal if backend != "jnp" else lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-4)
        assert same(st[k], ref_state[k]), (shards, k)
print("OK", ref_total.sum())
"""


@pytest.mark.parametrize("backend", ["cpp", "jnp"])
def test_one_two_and_four_cpu_devices_give_the_same_network(backend):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "XLAKERN_QUIET": "1"}
    child = SHARDED_CHILD.format(tests=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", child, backend], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.split()[0] == "OK"


@pytest.mark.gpu
def test_two_gpus_give_the_same_network_as_one():
    if len(jax.devices("gpu")) < 2:
        pytest.skip("needs two GPUs (the nvidia-h200-x2 machine)")
    env = {**os.environ, "XLAKERN_QUIET": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    child = SHARDED_CHILD.replace("(1, 2, 4)", "(1, 2)").replace("(2, 4)", "(2,)").format(
        tests=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", child, "cuda"], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.split()[0] == "OK"
