"""COBA and CUBA networks of Brette et al. (2007), and BrainEvent's scaled COBA, on event operators.

Benchmarks 1 (COBA) and 2 (CUBA) of

    Brette, R., Rudolph, M., Carnevale, T., et al. (2007). Simulation of networks of spiking
    neurons: a review of tools and strategies. J. Comput. Neurosci. 23, 349-398.

which take the balanced network of Vogels & Abbott (2005): 4,000 leaky integrate-and-fire
neurons, 3,200 excitatory and 800 inhibitory, each making 80 synapses (2% of 4,000), dt = 0.1 ms.
The script uses only BrainEvent's API names (``FixedNumPerPre``, ``BinaryArray``), so it runs on
BrainEvent or on xlakern: ``--lib brainevent`` imports ``brainevent``; ``--lib xlakern`` (the
default) does ``import xlakern as brainevent``.

Models (state in float32; v in mV, conductances in units of the leak conductance):

- ``coba``: dv/dt = (El - v + ge (Ee - v) + gi (Ei - v)) / taum; ge, gi decay with taue = 5 ms,
  taui = 10 ms and jump by 0.6 / 6.7 per excitatory / inhibitory spike; El = -60, threshold -50,
  reset -60 mV, 5 ms refractory, Ee = 0, Ei = -80 mV. No external drive: activity comes from the
  initial state (v uniform in [-60, -50], ge ~ N(4, 1.5), gi ~ N(20, 12), as in the benchmark).
- ``cuba``: dv/dt = (ge + gi - (v - El)) / taum with El = -49 mV (above threshold), ge, gi in mV
  jumping by 1.62 / -9 mV; otherwise as COBA, ge = gi = 0 at the start.
- ``coba_scaled``: BrainEvent's ``examples/COBA_2005.py``: COBA synapses (weights 0.6 / 6.7 mS)
  on neurons with a constant drive of 20 mA (R = 1 ohm, so the synaptic current, in µA, is
  1e-3 of the drive's scale), v starting from N(-55, 2) mV, exponential-Euler integration, and
  80 synapses per neuron at every size (``--scale`` multiplies the 4,000 neurons). About 50 Hz.

Connectivity: every presynaptic neuron projects to exactly 80 targets drawn uniformly (the
benchmark draws each pair with p = 2%: the same mean in-degree). Spikes are delivered with the
event operator ``BinaryArray(spikes) @ FixedNumPerPre(...)``: only the rows of neurons that fired
are read.

Usage::

    python examples/brette2007.py coba                      # 1 s simulated, prints rates and timing
    python examples/brette2007.py coba_scaled --scale 100 --duration 10000
    python examples/brette2007.py cuba --raster cuba.png    # raster plot of the first second
    python examples/brette2007.py coba --lib brainevent     # the same script on BrainEvent
    python examples/brette2007.py coba_scaled --fused       # xlakern's one-kernel simulator
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time

import numpy as np

DT = 0.1  # ms
K = 80  # synapses per presynaptic neuron


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    taum: float = 20.0
    taue: float = 5.0
    taui: float = 10.0
    v_th: float = -50.0
    v_reset: float = -60.0
    v_rest: float = -60.0
    t_ref: float = 5.0
    e_exc: float = 0.0
    e_inh: float = -80.0
    w_exc: float = 0.6
    w_inh: float = 6.7
    drive: float = 0.0
    syn_scale: float = 1.0
    conductance: bool = True
    exp_euler: bool = False


MODELS = {
    "coba": Model("coba"),
    "cuba": Model("cuba", v_rest=-49.0, w_exc=60 * 0.27 / 10, w_inh=-20 * 4.5 / 10, conductance=False),
    # BrainEvent's example gives conductances in mS and the drive in mA (R = 1 ohm): the synaptic
    # current g (E - v) comes out in µA, so it enters at 1e-3 of the drive's scale.
    "coba_scaled": Model("coba_scaled", drive=20.0, syn_scale=1e-3, exp_euler=True),
}


def import_lib(lib: str):
    """``brainevent`` or ``xlakern`` (as a drop-in for it)."""
    return importlib.import_module("xlakern" if lib == "xlakern" else "brainevent")


def build(brainevent, model: Model, n: int, seed: int):
    """(connectivity, initial state, step function) of a network of ``n`` neurons."""
    import jax
    import jax.numpy as jnp

    n_exc = int(n * 0.8)
    n_inh = n - n_exc
    k_idx_e, k_idx_i, k_v, k_ge, k_gi = jax.random.split(jax.random.PRNGKey(seed), 5)
    idx_e = jax.random.randint(k_idx_e, (n_exc, K), 0, n, dtype=jnp.int32)
    idx_i = jax.random.randint(k_idx_i, (n_inh, K), 0, n, dtype=jnp.int32)
    conn_e = brainevent.FixedNumPerPre(jnp.full((1,), model.w_exc, jnp.float32), idx_e, shape=(n_exc, n))
    conn_i = brainevent.FixedNumPerPre(jnp.full((1,), model.w_inh, jnp.float32), idx_i, shape=(n_inh, n))

    if model.name == "coba_scaled":
        v0 = -55.0 + 2.0 * jax.random.normal(k_v, (n,), jnp.float32)
    else:
        v0 = jax.random.uniform(k_v, (n,), jnp.float32, model.v_reset, model.v_th)
    if model.name == "coba":
        ge0 = jnp.maximum(4.0 + 1.5 * jax.random.normal(k_ge, (n,), jnp.float32), 0.0)
        gi0 = jnp.maximum(20.0 + 12.0 * jax.random.normal(k_gi, (n,), jnp.float32), 0.0)
    else:
        ge0 = gi0 = jnp.zeros((n,), jnp.float32)
    state = dict(v=v0, ge=ge0, gi=gi0, ref=jnp.zeros((n,), jnp.float32), spk=jnp.zeros((n,), bool))

    de, di = np.float32(np.exp(-DT / model.taue)), np.float32(np.exp(-DT / model.taui))
    dm = np.float32(np.exp(-DT / model.taum))

    def step(conn_e, conn_i, s):
        # Deliver last step's spikes: only rows of neurons that fired are read.
        spk = s["spk"]
        ge = s["ge"] * de + brainevent.BinaryArray(spk[:n_exc]) @ conn_e
        gi = s["gi"] * di + brainevent.BinaryArray(spk[n_exc:]) @ conn_i
        v = s["v"]
        if model.conductance:
            current = model.syn_scale * (ge * (model.e_exc - v) + gi * (model.e_inh - v)) + model.drive
        else:
            current = ge + gi + model.drive
        if model.exp_euler:  # v relaxes exactly towards v_rest + current over dt
            target = model.v_rest + current
            v_new = target + (v - target) * dm
        else:
            v_new = v + DT * (model.v_rest - v + current) / model.taum
        refractory = s["ref"] > 0
        v_new = jnp.where(refractory, model.v_reset, v_new)
        fired = v_new >= model.v_th
        return dict(v=jnp.where(fired, model.v_reset, v_new), ge=ge, gi=gi,
                    ref=jnp.where(fired, model.t_ref, jnp.maximum(s["ref"] - DT, 0.0)), spk=fired)

    return (conn_e, conn_i), state, step


def lif_params(model: Model):
    """The model as ``xlakern.event.LIFParams``, for xlakern's fused simulator (``--fused``)."""
    from xlakern.event import LIFParams

    return LIFParams(tau_m=model.taum, tau_e=model.taue, tau_i=model.taui, v_th=model.v_th, v_reset=model.v_reset,
                     v_rest=model.v_rest, t_ref=model.t_ref, e_exc=model.e_exc, e_inh=model.e_inh,
                     drive=model.drive, syn_scale=model.syn_scale, synapse="coba" if model.conductance else "cuba",
                     integrator="exp_euler" if model.exp_euler else "euler", dt=DT)


def simulate(brainevent, model: Model, n: int, steps: int, seed: int = 0, record: int = 0, fused: bool = False,
             gpu_mode: str = "auto"):
    """Run ``steps`` steps; returns (jitted ``run(conns, state) -> (state, spike count per neuron)``,
    conns, initial state, raster of the first ``record`` steps as a (step, neuron) bool array).

    ``fused``: xlakern only: the same network advanced by ``xlakern.event.run_lif_network``,
    which runs the whole loop (neuron update and spike delivery) in one kernel; ``gpu_mode`` is its
    GPU strategy (``run_lif_network``'s argument)."""
    import jax
    import jax.numpy as jnp

    conns, state0, step = build(brainevent, model, n, seed)
    if fused:
        from xlakern.event import run_lif_network

        params = lif_params(model)

        def raster_fused(conns, state):
            def body(s, _):
                s, _ = run_lif_network(s, *conns, params, 1, gpu_mode=gpu_mode)
                return s, s["spk"]

            return jax.lax.scan(body, state, None, length=record)[1]

        spikes = np.asarray(jax.jit(raster_fused)(conns, state0)) if record else None
        return (jax.jit(lambda conns, state: run_lif_network(state, *conns, params, steps, gpu_mode=gpu_mode)),
                conns, state0, spikes)

    def run(conns, state):
        def body(carry, _):
            s, count = carry
            s = step(*conns, s)
            return (s, count + s["spk"]), None

        (state, count), _ = jax.lax.scan(body, (state, jnp.zeros((n,), jnp.int32)), None, length=steps)
        return state, count

    def raster(conns, state):
        def body(s, _):
            s = step(*conns, s)
            return s, s["spk"]

        return jax.lax.scan(body, state, None, length=record)[1]

    if getattr(brainevent, "__name__", "") == "brainevent":
        # BrainEvent 0.3's layouts cannot be jit arguments (their pytree metadata holds arrays)
        # nor be built from traced indices: with it, the connectivity is closed over and
        # baked into the program as constants.
        run_closed = jax.jit(lambda state: run(conns, state))
        spikes = np.asarray(jax.jit(lambda state: raster(conns, state))(state0)) if record else None
        return (lambda _conns, state: run_closed(state)), conns, state0, spikes
    spikes = np.asarray(jax.jit(raster)(conns, state0)) if record else None
    return jax.jit(run), conns, state0, spikes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--lib", choices=["xlakern", "brainevent"], default="xlakern")
    ap.add_argument("--scale", type=float, default=1.0, help="neurons = 4,000 x scale")
    ap.add_argument("--duration", type=float, default=1000.0, help="simulated time in ms")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raster", help="save a raster plot of the first second here (needs matplotlib)")
    ap.add_argument("--fused", action="store_true",
                    help="xlakern only: run the loop in one kernel (xlakern.event.run_lif_network)")
    ap.add_argument("--gpu-mode", default="auto", choices=["auto", "block", "grid", "stream"],
                    help="with --fused: how the kernel runs the loop on a GPU (run_lif_network's gpu_mode)")
    args = ap.parse_args()
    if args.fused and args.lib != "xlakern":
        ap.error("--fused is xlakern's simulator; it needs --lib xlakern")

    import jax

    brainevent = import_lib(args.lib)
    model = MODELS[args.model]
    n = int(4000 * args.scale)
    steps = int(round(args.duration / DT))
    record = int(round(min(1000.0, args.duration) / DT)) if args.raster else 0
    run, conns, state0, spikes = simulate(brainevent, model, n, steps, args.seed, record, fused=args.fused,
                                          gpu_mode=args.gpu_mode)
    jax.block_until_ready(run(conns, state0))  # compile and warm up
    t0 = time.perf_counter()
    _, count = jax.block_until_ready(run(conns, state0))
    wall = time.perf_counter() - t0
    count = np.asarray(count)
    n_exc = int(n * 0.8)
    seconds = args.duration / 1000.0
    how = args.lib + (", fused" if args.fused else "")
    print(f"{args.model} on {how} ({jax.devices()[0].device_kind}): {n:,} neurons "
          f"({n_exc:,} exc, {n - n_exc:,} inh), {n * K:,} synapses, {args.duration:g} ms simulated")
    print(f"rates: all {count.mean() / seconds:.2f} Hz, exc {count[:n_exc].mean() / seconds:.2f} Hz, "
          f"inh {count[n_exc:].mean() / seconds:.2f} Hz")
    print(f"wall time {wall:.3f} s, {wall / seconds:.3f} s per simulated second (RTF {wall / seconds:.3f})")
    if args.raster:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t_idx, n_idx = np.nonzero(spikes)
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(t_idx * DT, n_idx, ",k")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("neuron")
        ax.set_title(f"{args.model}, {n:,} neurons ({args.lib})")
        fig.savefig(args.raster, dpi=120, bbox_inches="tight")
        print(f"raster saved to {args.raster}")


if __name__ == "__main__":
    main()
