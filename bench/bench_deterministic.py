"""What reproducible sums cost: ``s @ CSR`` (``binary_csrmv``, transpose=True, K = 80) per step of a jitted
100-step loop with the GPU scatter's float atomics and with ``xlakern.config.set_deterministic(True)``
(fixed-point sums, event_exact_scatter_cuda.cuh), the two timed in turns in one process; and whether three
runs of each loop give the same bits.

Usage (GPU machine)::

    python bench/bench_deterministic.py --graph-loops --cases 4000:0.01 40000:0.01 400000:0.01 400000:0.05

On a CPU the two settings run the same kernel (CPU sums are reproducible anyway).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import xlakern
from _benchlib import GRAPH_LOOPS, Table, finish, hashed_spikes, log, machine_info, print_header

STEPS, K = 100, 80
MODES = ("atomic", "deterministic")


def loop(n: int, rate: float):
    rng = np.random.default_rng(1)
    idx = jnp.asarray(rng.integers(0, n, n * K), jnp.int32)
    ptr = jnp.arange(0, n * K + 1, K, dtype=jnp.int32)
    w = jnp.asarray(rng.standard_normal(n * K), jnp.float32)

    @jax.jit
    def run(x):
        def body(t, c):
            return c + xlakern.binary_csrmv(w, idx, ptr, hashed_spikes(t, n, rate), shape=(n, n), transpose=True)
        return jax.lax.fori_loop(0, STEPS, body, x)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["4000:0.01", "40000:0.01", "400000:0.01", "400000:0.05"],
                    help="N:rate, rows (and columns) and the fraction of rows spiking")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the two settings in turns")
    ap.add_argument("--calls", type=int, default=6, help="timed calls of a setting a round")
    ap.add_argument("--json")
    ap.add_argument("--graph-loops", action="store_true", help="(read by _benchlib: loops as CUDA graphs)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    info = machine_info({"graph_loops": GRAPH_LOOPS})
    print_header("Reproducible GPU scatter sums (set_deterministic)", info)
    device = jax.devices()[0]
    table = Table("deterministic", f"s @ CSR per step, float atomics and fixed point ({device.device_kind})",
                  ["N", "active", "atomic", "deterministic", "ratio", "atomic runs equal", "deterministic runs equal",
                   "agree"],
                  note=f"binary_csrmv(transpose=True), K = {K}, float32; µs a step of a jitted {STEPS}-step "
                       f"{'graph ' if GRAPH_LOOPS else ''}loop summing the products; medians of "
                       f"{args.rounds * args.calls} calls; runs equal: three calls of the loop, the same bits")
    for case in args.cases:
        n, rate = case.split(":")
        n, rate = int(n), float(rate)
        run = loop(n, rate)
        x0 = jnp.zeros((n,), jnp.float32)
        outs, times = {}, {m: [] for m in MODES}
        for mode in MODES:
            xlakern.config.set_deterministic(mode == "deterministic")  # part of jit's key: one program each
            run(x0).block_until_ready()
            outs[mode] = [np.asarray(run(x0)) for _ in range(3)]
        for rnd in range(args.rounds):
            for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                xlakern.config.set_deterministic(mode == "deterministic")
                for _ in range(args.calls):
                    t = time.perf_counter()
                    run(x0).block_until_ready()
                    times[mode].append((time.perf_counter() - t) / STEPS)
        xlakern.config.set_deterministic(None)
        med = {m: float(np.median(v)) for m, v in times.items()}
        equal = {m: all(np.array_equal(o, outs[m][0]) for o in outs[m]) for m in MODES}
        agree = bool(np.allclose(outs["deterministic"][0], outs["atomic"][0], rtol=1e-4, atol=1e-3))
        table.add([f"{n:,}", f"{rate:.0%}", f"{med['atomic'] * 1e6:.2f} µs", f"{med['deterministic'] * 1e6:.2f} µs",
                   f"{med['deterministic'] / med['atomic']:.2f}x", str(equal["atomic"]), str(equal["deterministic"]),
                   "ok" if agree else "MISMATCH"],
                  {"n": n, "rate": rate, "atomic_s": med["atomic"], "deterministic_s": med["deterministic"],
                   "atomic_runs_equal": equal["atomic"], "deterministic_runs_equal": equal["deterministic"]})
        log("row: " + " | ".join(table.rows[-1]))
    print(table.markdown(), flush=True)
    finish(t0, info, [table], args.json)


if __name__ == "__main__":
    main()
