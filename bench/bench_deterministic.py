"""What reproducible sums cost: a scatter product per step of a jitted 100-step loop with the GPU's float
atomics and with ``xlakern.config.set_deterministic(True)`` (fixed-point sums: event_exact_scatter_cuda.cuh,
exact_sums_cuda.cuh), the two timed in turns in one process; and whether three runs of each loop give the
same bits. Products: ``csr`` (``binary_csrmv``, transpose=True: s @ CSR), ``indexed`` (the same through a
weight permutation, ``binary_csrmv_indexed``), ``jitc`` (``binary_jitumv``, transpose=True: s @ JITC with
uniform weights, prob = K / N), ``lif`` (``xlakern.event.run_lif_network``: examples/brette2007.py's
``coba_scaled`` network of N neurons, K synapses each, with weights per synapse (the model's weights times
uniform(0.5, 1.5)), 100 steps a call in one kernel; its rate is the network's own, and the case's is ignored).

Usage (GPU machine)::

    python bench/bench_deterministic.py --graph-loops --cases csr:4000:0.01 csr:400000:0.01 jitc:40000:0.01:1000 \
        lif:4000:0 lif:40000:0

A case is product:N:rate[:K] (K = 80 when left out; a bare N:rate is a csr case). On a CPU the two settings
run the same kernel (CPU sums are reproducible anyway).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import xlakern
from _benchlib import GRAPH_LOOPS, Table, finish, hashed_spikes, log, machine_info, print_header

STEPS, K = 100, 80
MODES = ("atomic", "deterministic")
PRODUCTS = {"csr": "s @ CSR", "indexed": "s @ CSR, indexed", "jitc": "s @ JITC uniform",
            "lif": "run_lif_network, w per synapse"}
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def parse_case(case: str) -> tuple[str, int, float, int]:
    """product:N:rate[:K], or N:rate for a csr case."""
    parts = case.split(":")
    if parts[0] not in PRODUCTS:
        parts = ["csr", *parts]
    if len(parts) not in (3, 4):
        raise SystemExit(f"--cases: {case!r} is not product:N:rate[:K]")
    return parts[0], int(parts[1]), float(parts[2]), int(parts[3]) if len(parts) == 4 else K


def network(n: int, k: int):
    """(run(state) -> (state, counts) for STEPS steps, the initial state) of the ``lif`` case."""
    sys.path.insert(0, EXAMPLES)
    import brette2007
    from xlakern.event import run_lif_network

    brette2007.K = k
    model = brette2007.MODELS["coba_scaled"]
    (conn_e, conn_i), state0, _ = brette2007.build(xlakern, model, n, 0)
    keys = jax.random.split(jax.random.PRNGKey(2))  # drawn on the device: 4M x 80 weights in NumPy take long
    conns = [c.with_data(c.data[0] * jax.random.uniform(key, c.indices.shape, jnp.float32, 0.5, 1.5))
             for c, key in zip((conn_e, conn_i), keys)]
    params = brette2007.lif_params(model)
    return jax.jit(lambda s: run_lif_network(s, *conns, params, STEPS)), state0


def loop(product: str, n: int, rate: float, k: int):
    if product == "lif":
        run, state0 = network(n, k)
        return lambda x: run(state0)
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


def flat(out) -> np.ndarray:
    """A loop's output as one float64 vector (the lif case: the state, then the spike counts)."""
    return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in jax.tree_util.tree_leaves(out)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["csr:4000:0.01", "csr:40000:0.01", "csr:400000:0.01",
                                                   "csr:400000:0.05", "indexed:400000:0.01", "jitc:40000:0.01",
                                                   "jitc:400000:0.01", "jitc:40000:0.01:1000"],
                    help="product:N:rate[:K]: product (csr, indexed, jitc, lif), rows (and columns) or neurons, the "
                         "fraction of rows spiking (lif: ignored), synapses a row (80)")
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
                  note=f"binary_csrmv / binary_csrmv_indexed / binary_jitumv (transpose=True), float32; µs a "
                       f"step of a jitted {STEPS}-step {'graph ' if GRAPH_LOOPS else ''}loop summing the products "
                       f"(run_lif_network: {STEPS} steps in one call, active = the network's spikes a neuron a "
                       f"step, agree = spike counts within 5%); medians of {args.rounds * args.calls} calls; runs "
                       f"equal: three calls of the loop, the same bits")
    for case in args.cases:
        product, n, rate, k = parse_case(case)
        run = loop(product, n, rate, k)
        x0 = jnp.zeros((n,), jnp.float32)
        outs, times = {}, {m: [] for m in MODES}
        for mode in MODES:
            xlakern.config.set_deterministic(mode == "deterministic")  # part of jit's key: one program each
            jax.block_until_ready(run(x0))
            outs[mode] = [flat(run(x0)) for _ in range(3)]
        for rnd in range(args.rounds):
            for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                xlakern.config.set_deterministic(mode == "deterministic")
                for _ in range(args.calls):
                    t = time.perf_counter()
                    jax.block_until_ready(run(x0))
                    times[mode].append((time.perf_counter() - t) / STEPS)
        xlakern.config.set_deterministic(None)
        med = {m: float(np.median(v)) for m, v in times.items()}
        equal = {m: all(np.array_equal(o, outs[m][0]) for o in outs[m]) for m in MODES}
        if product == "lif":  # a chaotic network: the two settings part after a while; compare the spike counts
            counts = {m: outs[m][0][-n:].sum() for m in MODES}
            agree = abs(counts["deterministic"] - counts["atomic"]) <= 0.05 * counts["atomic"]
            rate = float(counts["atomic"]) / (n * STEPS)  # the fraction of neurons spiking a step
        else:
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
