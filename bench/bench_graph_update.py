"""What a graph loop's step costs when the caller's buffers move between calls (GPU, CUDA graphs).

Under ``xlakern.config.enable_cuda_graph_loops()`` XLA records a jitted ``fori_loop`` once, unrolled
into one CUDA graph, and replays it on later calls. When a call's input or output buffer sits at
another address than in the recording, XLA updates the graph's nodes before the replay, on every
such call. A caller moves them by holding the last result while the next call allocates its own,
or by passing the result back in as the next state without donating it.

Each row is bench_event's graph-loop step (each step's spikes hashed from the counter, 1% active,
K = 80), xlakern and BrainEvent 0.3, timed four ways:

  held      the last call's result is still alive during the next call (bench_event before session 40)
  released  the last call's result is dropped before the next call (bench_event since session 40)
  chained   state = run(state): the result is the next call's initial state, not donated
  donated   the same with ``jax.jit(run, donate_argnums=0)``

Figures: µs a step of a 100-step loop (one call / 100, the issue's measure), and ``+step``, the cost
of one more step, (T(1,000 steps) - T(100 steps)) / 900, medians of ``--runs`` calls each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import xlakern

xlakern.config.enable_cuda_graph_loops()  # before _benchlib starts JAX

from _benchlib import (Table, brainevent, err_cell, finish, fmt_t, log, machine_info,  # noqa: E402
                       print_header, run_sections, warm_gpu)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bench_event as ev  # noqa: E402

RATE = 0.01
REGIMES = ("held", "released", "chained", "donated")
STEP_COUNTS = (100, 1000)


def looped(step: tuple[Callable, Any], n: int, steps: int, donate: bool) -> Callable:
    """jit of run(c, M): `steps` steps of bench_event's graph-loop body, the carry starting at c."""
    def run(c, M):
        return jax.lax.fori_loop(0, steps, ev.hashed_step(step[0], M, n, RATE), c)

    return jax.jit(run, donate_argnums=(0,) if donate else ())


def time_regime(step: tuple[Callable, Any], n: int, steps: int, regime: str, runs: int) -> float:
    """Median seconds of one call under `regime` (see the module docstring), after 3 warm-up calls."""
    M = step[1]
    f = looped(step, n, steps, regime == "donated")
    zeros = jnp.zeros((n,), jnp.float32)
    chained = regime in ("chained", "donated")
    out = jnp.zeros((n,), jnp.float32)  # the state a chained run carries (donated runs consume it)
    samples = []
    for i in range(3 + runs):
        if regime == "released":
            out = None
        t = time.perf_counter()
        out = jax.block_until_ready(f(out if chained else zeros, M))
        if i >= 3:
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def section(args) -> list[Table]:
    headers = ["N", "step"]
    for r in REGIMES:
        headers += [f"{r}, 100 steps", f"{r}, +step"]
    table = Table("gpu", f"Graph-loop step by caller, µs ({jax.devices()[0].device_kind}; {RATE:.0%} active, K = {ev.K})",
                  headers, note="100 steps: one 100-step call / 100. +step: (T(1,000) - T(100)) / 900.")
    for n in args.sizes:
        w, idx, ptr = ev.connectivity(n)
        xk, _ = ev.xlakern_steps(w, idx, ptr, n)
        cases = [("loop alone", (lambda s, M: s.astype(jnp.float32), None))]
        cases += [(f"xlakern {c}", xk[c]) for c in ("s @ CSR", "CSR @ s", "s @ FCN")]
        if brainevent is not None:
            be = ev.brainevent_steps(w, idx, ptr, n)
            cases += [(f"BrainEvent {c}", be[c]) for c in ("s @ CSR", "CSR @ s", "s @ FCN")]
        for name, step in cases:
            cells, data = [f"{n:,}", name], {"n": n, "step": name}
            for regime in REGIMES:
                try:
                    t = {k: time_regime(step, n, k, regime, args.runs) for k in STEP_COUNTS}
                    per100 = t[100] / 100
                    extra = (t[1000] - t[100]) / 900
                    cells += [fmt_t(per100), fmt_t(extra)]
                    data[regime] = {"per_step_100": per100, "extra_step": extra, "t": t}
                except Exception as e:  # noqa: BLE001
                    cells += [err_cell(e), ""]
                    data[regime] = {"error": err_cell(e)}
            table.add(cells, data)
            log("row: " + " | ".join(cells))
    return [table]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[4_000, 40_000], help="N (default 4k and 40k)")
    ap.add_argument("--runs", type=int, default=20, help="timed calls per figure (default 20)")
    ap.add_argument("--json", metavar="PATH", help="also write the table (and raw data) as JSON")
    ap.add_argument("--cpu", action="store_true",
                    help="run on the CPU (no CUDA graphs: the figures mean nothing; it checks that the script runs)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    info = machine_info()
    print_header("xlakern: graph-loop steps by how the caller holds its buffers", info)
    if not info["gpu"] and not args.cpu:
        print("This benchmark needs a GPU (CUDA graphs); none is visible.")
        return 0
    if info["gpu"]:
        warm_gpu()
    tables = run_sections([("gpu", lambda: section(args))])
    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
