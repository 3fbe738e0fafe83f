"""BrainEvent's scaled COBA network across devices with JAX's own SPMD (``shard_map`` over a Mesh).

Neurons are split into equal contiguous ranges, one per device; each device keeps the synapses
that end on its neurons and updates its neurons' state. Every step the devices exchange spikes with
one collective: each packs its spikes into bits (N/8 bytes in all) and ``all_gather`` hands every
device the whole spike vector. No communication code of our own: XLA emits the collective (NCCL
on GPUs). Two ways to run a device's part of a step:

- the event operators (default; the script runs unchanged with ``import brainevent``): the spikes
  are delivered to the device's neurons with ``BinaryArray(spikes) @ FixedNumPerPre(...)`` (only
  the rows of neurons that fired are read) and the neurons are updated in jnp;
- ``--fused`` (xlakern only): ``xlakern.event.run_lif_network_sharded``, the same model with the
  delivery and the update fused into two kernel launches a step, the spikes gathered as uint32 words.

Connectivity does not depend on the device count, so the same seed gives the same network, and
the same spike trains, on 1, 2 or 4 devices: the neurons are cut into ``BLOCKS`` equal blocks
(the first 80% of each block excitatory, the rest inhibitory, as in the benchmark), every
presynaptic neuron sends ``K / BLOCKS`` synapses into each block (targets uniform inside the
block, drawn from a key folded with the neuron and block numbers), and a device holds whole blocks.

Multi-host: start each process with ``jax.distributed.initialize()``; the Mesh then spans every
host's devices and nothing else changes (each process builds only its own blocks).

Usage::

    python examples/coba_spmd.py --scale 1000 --duration 10000           # 4M neurons, all local GPUs
    python examples/coba_spmd.py --scale 4000 --duration 10000 --fused   # 16M neurons, fused steps
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/coba_spmd.py --devices 4
"""

from __future__ import annotations

import argparse
import importlib
import time
from functools import partial

import numpy as np

DT = 0.1  # ms
K = 80  # synapses per presynaptic neuron
BLOCKS = 16  # neuron blocks (a multiple of every device count used)
TAU_M, TAU_E, TAU_I = 20.0, 5.0, 10.0
V_TH, V_RESET, V_REST, T_REF = -50.0, -60.0, -60.0, 5.0
E_EXC, E_INH, W_EXC, W_INH = 0.0, -80.0, 0.6, 6.7
DRIVE, SYN_SCALE = 20.0, 1e-3  # BrainEvent's example: 20 mA drive; g (E - v) in µA


def network(brainevent, n: int, n_dev: int, seed: int, axis: str = "neurons"):
    """(init, step, layout) to run inside ``shard_map`` over ``n_dev`` devices along ``axis``."""
    import jax
    import jax.numpy as jnp

    if n % (5 * 8 * BLOCKS) or BLOCKS % n_dev or K % BLOCKS:
        raise ValueError(f"n must be a multiple of {5 * 8 * BLOCKS} and the device count must divide {BLOCKS}")
    n_local, n_block = n // n_dev, n // BLOCKS
    n_exc_block = n_block * 4 // 5  # the first 80% of a block are excitatory
    blocks_per_dev, k_block = BLOCKS // n_dev, K // BLOCKS
    key_conn, key_v = jax.random.split(jax.random.PRNGKey(seed))
    de, di, dm = (np.float32(np.exp(-DT / t)) for t in (TAU_E, TAU_I, TAU_M))

    def local_targets(dev, pre_ids):
        """(len(pre_ids), K / n_dev) local targets of ``pre_ids`` in device ``dev``'s blocks."""
        def per_pre(i):
            def per_block(b):
                k = jax.random.fold_in(key_conn, i * BLOCKS + b)
                return (b - dev * blocks_per_dev) * n_block + jax.random.randint(k, (k_block,), 0, n_block)
            blocks = dev * blocks_per_dev + jnp.arange(blocks_per_dev)
            return jax.vmap(per_block)(blocks).reshape(-1).astype(jnp.int32)
        return jax.vmap(per_pre)(pre_ids)

    def init():
        dev = jax.lax.axis_index(axis)
        ids = dev * n_local + jnp.arange(n_local)
        v = jax.vmap(lambda i: -55.0 + 2.0 * jax.random.normal(jax.random.fold_in(key_v, i)))(ids)
        by_block = jnp.arange(n).reshape(BLOCKS, n_block)
        exc_ids, inh_ids = by_block[:, :n_exc_block].reshape(-1), by_block[:, n_exc_block:].reshape(-1)
        conn_e = brainevent.FixedNumPerPre(jnp.full((1,), W_EXC, jnp.float32), local_targets(dev, exc_ids),
                                           shape=(exc_ids.size, n_local))
        conn_i = brainevent.FixedNumPerPre(jnp.full((1,), W_INH, jnp.float32), local_targets(dev, inh_ids),
                                           shape=(inh_ids.size, n_local))
        v = v.astype(jnp.float32)
        zeros = v * 0.0  # derived from v, so it varies along the device axis as the carry must
        state = dict(v=v, ge=zeros, gi=zeros, ref=zeros, spk=zeros > 0)
        return (conn_e, conn_i), state

    def step(conns, s):
        conn_e, conn_i = conns
        # One collective a step: the spikes of every device, as bits.
        packed = jnp.packbits(s["spk"])
        spikes = jnp.unpackbits(jax.lax.all_gather(packed, axis, tiled=True)).astype(bool)
        by_block = spikes.reshape(BLOCKS, n_block)
        ge = s["ge"] * de + brainevent.BinaryArray(by_block[:, :n_exc_block].reshape(-1)) @ conn_e
        gi = s["gi"] * di + brainevent.BinaryArray(by_block[:, n_exc_block:].reshape(-1)) @ conn_i
        v = s["v"]
        target = V_REST + DRIVE + SYN_SCALE * (ge * (E_EXC - v) + gi * (E_INH - v))
        v_new = jnp.where(s["ref"] > 0, V_RESET, target + (v - target) * dm)
        fired = v_new >= V_TH
        return dict(v=jnp.where(fired, V_RESET, v_new), ge=ge, gi=gi,
                    ref=jnp.where(fired, T_REF, jnp.maximum(s["ref"] - DT, 0.0)), spk=fired)

    return init, step, dict(block=n_block, exc_per_block=n_exc_block)


def lif_params():
    """The model as xlakern.event.LIFParams (for --fused)."""
    from xlakern.event import LIFParams

    return LIFParams(tau_m=TAU_M, tau_e=TAU_E, tau_i=TAU_I, v_th=V_TH, v_reset=V_RESET, v_rest=V_REST, t_ref=T_REF,
                     e_exc=E_EXC, e_inh=E_INH, drive=DRIVE, syn_scale=SYN_SCALE, synapse="coba",
                     integrator="exp_euler", dt=DT)


def simulator(brainevent, n: int, steps: int, devices, seed: int = 0, record: int = 0, fused: bool = False):
    """A jitted ``run()`` -> (spike counts per neuron, raster of the first ``record`` steps or None).
    ``fused``: each device's step is ``xlakern.event.run_lif_network_sharded`` (xlakern only)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # jax < 0.7
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.asarray(devices), ("neurons",))
    init, step, layout = network(brainevent, n, len(devices), seed)
    if fused:
        from xlakern.event import run_lif_network_sharded

        params = lif_params()

        def advance(conns, s, m):
            s, c = run_lif_network_sharded(s, *conns, params, m, axis_name="neurons", **layout)
            return s, c

    @partial(shard_map, mesh=mesh, in_specs=(), out_specs=(P("neurons"), P(None, "neurons")))
    def run_sharded():
        conns, s = init()
        count = s["ref"].astype(jnp.int32)  # zeros, varying along the device axis
        if fused and not record:
            s, count = advance(conns, s, steps)
            return count, jnp.zeros((0, s["v"].shape[0]), bool)

        def body(carry, i):
            s, count = carry
            if fused:
                s, _ = advance(conns, s, 1)
            else:
                s = step(conns, s)
            return (s, count + s["spk"]), (s["spk"] if record else None)

        (s, count), raster = jax.lax.scan(body, (s, count), None, length=steps)
        if not record:
            raster = jnp.zeros((0, s["v"].shape[0]), bool)
        return count, raster[:record]

    return jax.jit(run_sharded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", choices=["xlakern", "brainevent"], default="xlakern")
    ap.add_argument("--scale", type=float, default=1.0, help="neurons = 4,000 x scale (rounded to a valid size)")
    ap.add_argument("--duration", type=float, default=1000.0, help="simulated time in ms")
    ap.add_argument("--devices", type=int, default=0, help="how many devices (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fused", action="store_true", help="xlakern.event.run_lif_network_sharded (xlakern only)")
    args = ap.parse_args()

    import jax

    brainevent = importlib.import_module("xlakern" if args.lib == "xlakern" else "brainevent")
    devices = jax.devices()[: args.devices or None]
    unit = 5 * 8 * BLOCKS
    n = max(unit, int(round(4000 * args.scale / unit)) * unit)
    steps = int(round(args.duration / DT))
    run = simulator(brainevent, n, steps, devices, args.seed, fused=args.fused)
    jax.block_until_ready(run())  # compile and warm up
    t0 = time.perf_counter()
    count, _ = jax.block_until_ready(run())
    wall = time.perf_counter() - t0
    count = np.asarray(count)
    seconds = args.duration / 1000.0
    n_block = n // BLOCKS
    inh = np.arange(n) % n_block >= n_block * 4 // 5
    print(f"COBA (BrainEvent's scaled variant) on {len(devices)} x {devices[0].device_kind} with {args.lib}{' (fused)' if args.fused else ''}: "
          f"{n:,} neurons, {n * K:,} synapses, {args.duration:g} ms simulated")
    print(f"rates: all {count.mean() / seconds:.2f} Hz, exc {count[~inh].mean() / seconds:.2f} Hz, "
          f"inh {count[inh].mean() / seconds:.2f} Hz")
    print(f"wall time {wall:.3f} s, {wall / seconds:.3f} s per simulated second")


if __name__ == "__main__":
    main()
