"""Cost per simulated step of each GPU strategy of ``xlakern.event.run_lif_network`` (issue 16).

``run_lif_network`` runs the whole simulation loop in one kernel, in one of three ways (its
``gpu_mode``): ``block`` (one thread block, state in registers; up to 4,096 neurons), ``grid``
(every SM, one grid barrier a step) and ``stream`` (every SM, two grid barriers a step, no input
buffers). This prints µs per step of each at each size on BrainEvent's scaled COBA network
(``examples/brette2007.py coba_scaled``: 80 synapses a neuron, ~50 Hz), so the ``auto`` choice
can be set where the curves cross. Each figure: the median of ``--runs`` timed calls of
``--steps`` steps, after a warm-up call of the same compiled program; the firing rate shows that
every mode simulates the same network.

Usage (GPU machine)::

    python bench/bench_lif_modes.py --sizes 4000,40000,400000,4000000 --modes block,grid,stream
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4000,40000,400000,4000000")
    ap.add_argument("--modes", default="auto,block,grid,stream")
    ap.add_argument("--steps", type=int, default=20000, help="steps per timed call (0.1 ms each)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import jax
    import numpy as np

    import brette2007
    import xlakern

    model = brette2007.MODELS["coba_scaled"]
    device = jax.devices()[0].device_kind
    rows = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        row = {"n": n}
        for mode in [m for m in args.modes.split(",") if m]:
            try:
                run, conns, state0, _ = brette2007.simulate(xlakern, model, n, args.steps, 0, fused=True,
                                                            gpu_mode=mode)
                jax.block_until_ready(run(conns, state0))
                times = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    _, count = jax.block_until_ready(run(conns, state0))
                    times.append(time.perf_counter() - t0)
                rate = float(np.asarray(count).mean() / (args.steps * 1e-4))
                row[mode] = f"{statistics.median(times) / args.steps * 1e6:.3g} µs ({rate:.2f} Hz)"
            except xlakern.XlakernError as err:  # a mode that does not take this size says why
                row[mode] = "n/a: " + str(err).splitlines()[0][:60].replace("|", "/")
            print(f"row: n={n} {mode}: {row[mode]}", file=sys.stderr, flush=True)
        rows.append(row)
    modes = [m for m in args.modes.split(",") if m]
    print(f"### run_lif_network per step by gpu_mode, {device}\n")
    print(f"coba_scaled, {args.steps} steps per call, median of {args.runs} calls.\n")
    print("| N | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for row in rows:
        print(f"| {row['n']:,} | " + " | ".join(row.get(m, "") for m in modes) + " |")


if __name__ == "__main__":
    main()
