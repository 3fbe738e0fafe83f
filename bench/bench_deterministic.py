"""What reproducible sums cost: a scatter product per step of a jitted 100-step loop with the GPU's float
atomics and with ``xlakern.config.set_deterministic(True)`` (fixed-point sums: event_exact_scatter_cuda.cuh,
exact_sums_cuda.cuh), the two timed in turns in one process; and whether three runs of each loop give the
same bits. Products: ``csr`` (``binary_csrmv``, transpose=True: s @ CSR), ``indexed`` (the same through a
weight permutation, ``binary_csrmv_indexed``), ``jitc`` (``binary_jitumv``, transpose=True: s @ JITC with
uniform weights, prob = K / N).

Usage (GPU machine)::

    python bench/bench_deterministic.py --graph-loops --cases csr:4000:0.01 csr:400000:0.01 jitc:40000:0.01:1000

A case is product:N:rate[:K] (K = 80 when left out; a bare N:rate is a csr case). On a CPU the two settings
run the same kernel (CPU sums are reproducible anyway).
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
PRODUCTS = {"csr": "s @ CSR", "indexed": "s @ CSR, indexed", "jitc": "s @ JITC uniform"}


def parse_case(case: str) -> tuple[str, int, float, int]:
    """product:N:rate[:K], or N:rate for a csr case."""
    parts = case.split(":")
    if parts[0] not in PRODUCTS:
        parts = ["csr", *parts]
    if len(parts) not in (3, 4):
        raise SystemExit(f"--cases: {case!r} is not product:N:rate[:K]")
    return parts[0], int(parts[1]), float(parts[2]), int(parts[3]) if len(parts) == 4 else K


def loop(product: str, n: int, rate: float, k: int):
    rng = np.random.default_rng(1)
    idx = jnp.asarray(rng.integers(0, n, n * k), jnp.int32)
    ptr = jnp.arange(0, n * k + 1, k, dtype=jnp.int32)
    w = jnp.asarray(rng.standard_normal(n * k), jnp.float32)
    perm = jnp.asarray(rng.permutation(n * k), jnp.int32)

    def step(s):
        if product == "csr":
            return xlakern.binary_csrmv(w, idx, ptr, s, shape=(n, n), transpose=True)
        if product == "indexed":
            return xlakern.binary_csrmv_indexed(w, idx, ptr, perm, s, shape=(n, n), transpose=True)
        return xlakern.binary_jitumv(-1.0, 1.0, k / n, s, 7, shape=(n, n), transpose=True)

    @jax.jit
    def run(x):
        def body(t, c):
            return c + step(hashed_spikes(t, n, rate))
        return jax.lax.fori_loop(0, STEPS, body, x)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["csr:4000:0.01", "csr:40000:0.01", "csr:400000:0.01",
                                                   "csr:400000:0.05", "indexed:400000:0.01", "jitc:40000:0.01",
                                                   "jitc:400000:0.01", "jitc:40000:0.01:1000"],
                    help="product:N:rate[:K]: product (csr, indexed, jitc), rows (and columns), the fraction of "
                         "rows spiking, synapses a row (80)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the two settings in turns")
    ap.add_argument("--calls", type=int, default=6, help="timed calls of a setting a round")
    ap.add_argument("--json")
    ap.add_argument("--graph-loops", action="store_true", help="(read by _benchlib: loops as CUDA graphs)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    info = machine_info({"graph_loops": GRAPH_LOOPS})
    print_header("Reproducible GPU scatter sums (set_deterministic)", info)
    device = jax.devices()[0]
    table = Table("deterministic", f"Scatters per step, float atomics and fixed point ({device.device_kind})",
                  ["product", "N", "K", "active", "atomic", "deterministic", "ratio", "atomic runs equal", "deterministic runs equal",
                   "agree"],
                  note=f"binary_csrmv / binary_csrmv_indexed / binary_jitumv (transpose=True), float32; µs a step of a jitted {STEPS}-step "
                       f"{'graph ' if GRAPH_LOOPS else ''}loop summing the products; medians of "
                       f"{args.rounds * args.calls} calls; runs equal: three calls of the loop, the same bits")
    for case in args.cases:
        product, n, rate, k = parse_case(case)
        run = loop(product, n, rate, k)
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
        table.add([PRODUCTS[product], f"{n:,}", str(k), f"{rate:.0%}", f"{med['atomic'] * 1e6:.2f} µs", f"{med['deterministic'] * 1e6:.2f} µs",
                   f"{med['deterministic'] / med['atomic']:.2f}x", str(equal["atomic"]), str(equal["deterministic"]),
                   "ok" if agree else "MISMATCH"],
                  {"product": product, "n": n, "k": k, "rate": rate, "atomic_s": med["atomic"], "deterministic_s": med["deterministic"],
                   "atomic_runs_equal": equal["atomic"], "deterministic_runs_equal": equal["deterministic"]})
        log("row: " + " | ".join(table.rows[-1]))
    print(table.markdown(), flush=True)
    finish(t0, info, [table], args.json)


if __name__ == "__main__":
    main()
