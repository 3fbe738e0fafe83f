"""The largest network with just-in-time connectivity that one device holds (issue 15).

A JITC matrix stores no synapse: each call regenerates its rows from a seed, so a network's memory
is its neuron state. This doubles N from ``--start`` until a step fails (out of memory, or an index
range the operator refuses) and prints, per size, the time of one simulated step, the device's
peak memory and the bytes per neuron. The model: leaky neurons with one conductance, ``ge``
receiving ``BinaryArray(spk) @ W`` with ``W = JITCScalarR((w, K / N, seed))`` (K synapses a neuron
on average), 10 steps in a jitted ``fori_loop`` with the state donated, after one warm-up call.

Usage (GPU machine)::

    python bench/bench_jitc_capacity.py --start 1000000 --max 2147483647
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # before jax: let the network use the device

STEPS = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=int, default=1_000_000)
    ap.add_argument("--max", type=int, default=2**31 - 1)
    ap.add_argument("--conns", type=int, default=80, help="mean synapses per neuron")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import xlakern

    dev = jax.devices()[0]

    def run_size(n: int):
        W = xlakern.JITCScalarR((0.1, args.conns / n, 1234), shape=(n, n), corder=True)

        @jax.jit
        def init():
            v = jax.random.uniform(jax.random.PRNGKey(0), (n,), jnp.float32, -60.0, -50.0)
            return v, jnp.zeros((n,), jnp.float32), v > -50.5  # about 5% spike in the first step

        def step(_, s):
            v, ge, spk = s
            ge = ge * 0.98 + xlakern.BinaryArray(spk) @ W
            v = v + 0.05 * (-60.0 - v) + 0.02 * ge + 0.6
            spk = v >= -50.0
            return jnp.where(spk, -60.0, v), ge, spk

        run = jax.jit(lambda s: jax.lax.fori_loop(0, STEPS, step, s), donate_argnums=0)
        state = jax.block_until_ready(run(init()))  # compile, warm up
        t0 = time.perf_counter()
        state = jax.block_until_ready(run(state))
        per_step = (time.perf_counter() - t0) / STEPS
        rate = float(jnp.mean(state[2].astype(jnp.float32)))
        stats = dev.memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
        del state
        return per_step, peak, rate

    print(f"### Largest JITC network on one device ({dev.device_kind}), K = {args.conns}\n")
    print("| N | one step | peak device memory | bytes / neuron | spiking in the last step |")
    print("|---|---|---|---|---|")
    n, largest = args.start, None
    while n <= args.max:
        try:
            per_step, peak, rate = run_size(n)
        except Exception as err:  # noqa: BLE001 - the size that fails ends the search, and says why
            print(f"| {n:,} | failed: {str(err).splitlines()[0][:100].replace('|', '/')} | | | |")
            break
        mem = f"{peak / 2**30:.2f} GiB" if peak else "n/a"
        per = f"{peak / n:.1f}" if peak else "n/a"
        print(f"| {n:,} | {per_step * 1e3:.3g} ms | {mem} | {per} | {rate:.2%} |", flush=True)
        print(f"row: n={n} ok", file=sys.stderr, flush=True)
        largest = n
        if n == args.max:
            break
        n = min(2 * n, args.max)
    print(f"\nLargest that ran: {largest:,} neurons" if largest else "\nNone ran.")


if __name__ == "__main__":
    main()
