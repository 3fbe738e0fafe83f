"""Wall time per simulated second of BrainEvent's scaled COBA network (issue 16).

One GPU: ``examples/brette2007.py``'s ``coba_scaled`` model, the same code with
``import xlakern as brainevent`` and with ``import brainevent`` (BrainEvent 0.3.0, when it is
installed), at N = 4k, 40k, 400k, 4M. Several GPUs: ``examples/coba_spmd.py`` (``shard_map``
over a Mesh, one bit-packed all_gather a step), on event operators and fused (``--fused``:
``run_lif_network_sharded``), on 1 and on every visible GPU, at 4M and 16M, beside the best
one-GPU path (``run_lif_network`` on ``brette2007.py``'s same model) at those sizes.
Each figure: one timed run of ``--duration`` ms simulated, after a warm-up run of the same
compiled loop. Graph mode (``xlakern.config.enable_cuda_graph_loops()``) is set per process
with ``--graph``.

Usage (GPU machine)::

    python bench/bench_network.py --single 4000,40000,400000,4000000 --multi 4000000,16000000 --plot rtf.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def child(args) -> None:
    import xlakern

    if args.graph:
        xlakern.config.enable_cuda_graph_loops()
    import jax
    import numpy as np

    sys.path.insert(0, EXAMPLES)
    steps = int(round(args.duration / 0.1))
    lib = __import__("xlakern" if args.lib == "xlakern" else "brainevent")
    if args.kind == "single":
        import brette2007

        run, conns, state0, _ = brette2007.simulate(lib, brette2007.MODELS["coba_scaled"], args.n, steps, 0,
                                                    fused=args.fused)
        go = lambda: run(conns, state0)  # noqa: E731
        n_dev = 1
    else:
        import coba_spmd

        devices = jax.devices()[: args.devices]
        run = coba_spmd.simulator(lib, args.n, steps, devices, 0, fused=args.fused)
        go = run
        n_dev = len(devices)
    t0 = time.perf_counter()
    jax.block_until_ready(go())
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(go())
    wall = time.perf_counter() - t0
    count = np.asarray(out[1] if args.kind == "single" else out[0])
    rate = float(count.mean() / (args.duration / 1000.0))
    res = dict(kind=args.kind, lib=args.lib, n=args.n, devices=n_dev, graph=args.graph, fused=args.fused,
               duration_ms=args.duration,
               wall_s=wall, first_s=first, rtf=wall / (args.duration / 1000.0), rate_hz=rate,
               device=jax.devices()[0].device_kind)
    print(json.dumps(res), flush=True)


def spawn(kind, lib, n, duration, graph, devices, timeout, fused=False) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--lib", lib, "--n", str(n), "--duration", str(duration),
           "--devices", str(devices)] + (["--graph"] if graph else []) + (["--fused"] if fused else [])
    what = dict(kind=kind, lib=lib, n=n, devices=devices, graph=graph, fused=fused)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(what, error=f"over {timeout} s")
    if out.returncode != 0:
        return dict(what, error=(out.stderr.strip().splitlines() or ["?"])[-1][:200])
    return json.loads(out.stdout.strip().splitlines()[-1])


def cell(r: dict | None) -> str:
    if r is None:
        return ""
    if "error" in r:
        return "error: " + r["error"][:80].replace("|", "/")
    return f"{r['wall_s'] / (r['duration_ms'] / 1000):.3g} s ({r['rate_hz']:.1f} Hz)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=["single", "multi"], help=argparse.SUPPRESS)
    ap.add_argument("--lib", default="xlakern")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--devices", type=int, default=0)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--skip-brainevent", action="store_true", help="leave BrainEvent out even where installed")
    ap.add_argument("--variants", default="ops,fused",
                    help="xlakern columns: ops (the script on event operators), graph (the same with graph loops), "
                         "fused (run_lif_network)")
    ap.add_argument("--duration", type=float, default=10000.0, help="simulated ms per timed run")
    ap.add_argument("--single", default="4000,40000,400000,4000000")
    ap.add_argument("--multi", default="4000000,16000000")
    ap.add_argument("--multi-variants", default="ops,fused", help="coba_spmd.py columns: ops, fused")
    ap.add_argument("--multi-graph", action="store_true", help="run coba_spmd.py's loops as CUDA graphs")
    ap.add_argument("--multi-best", action="store_true", default=True,
                    help="also run_lif_network on one GPU at the --multi sizes (the best one-GPU path)")
    ap.add_argument("--no-multi-best", dest="multi_best", action="store_false")
    ap.add_argument("--be-duration", type=float, default=None, help="simulated ms for BrainEvent (default: --duration)")
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--json")
    ap.add_argument("--plot", help="PNG of RTF against N")
    args = ap.parse_args()
    if args.child:
        args.kind = args.child
        child(args)
        return
    try:
        import brainevent  # noqa: F401

        have_be = not args.skip_brainevent
    except Exception:  # noqa: BLE001
        have_be = False
    import jax

    n_gpus = len(jax.devices())
    results = []
    t0 = time.time()
    variants = {"ops": ("xlakern", False, False), "graph": ("xlakern", True, False), "fused": ("xlakern", False, True)}
    runs = [variants[v] for v in args.variants.split(",") if v] + ([("brainevent", False, False)] if have_be else [])
    for n in [int(x) for x in args.single.split(",") if x]:
        for lib, graph, fused in runs:
            dur = args.be_duration if (lib == "brainevent" and args.be_duration) else args.duration
            results.append(spawn("single", lib, n, dur, graph, 1, args.timeout, fused))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    for n in [int(x) for x in args.multi.split(",") if x]:
        if args.multi_best and n not in [int(x) for x in args.single.split(",") if x]:
            results.append(spawn("single", "xlakern", n, args.duration, False, 1, args.timeout, True))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        for variant in [v for v in args.multi_variants.split(",") if v]:
            for devs in sorted({1, n_gpus}):
                results.append(spawn("multi", "xlakern", n, args.duration, args.multi_graph, devs, args.timeout,
                                     variant == "fused"))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)

    def find(**kw):
        return next((r for r in results if all(r.get(k) == v for k, v in kw.items())), None)

    dev = next((r["device"] for r in results if "device" in r), "?")
    print(f"\n## COBA (BrainEvent's scaled variant): wall time per simulated second ({dev})\n")
    print("| N | BrainEvent 0.3.0 | xlakern, same script | BE / xlakern | xlakern, graph loops | "
          "xlakern fused (`run_lif_network`) | BE / fused |")
    print("|---|---|---|---|---|---|---|")

    def ratio(b, x):
        return f"{b['rtf'] / x['rtf']:.2f}x" if (b and x and "rtf" in b and "rtf" in x) else ""

    for n in [int(x) for x in args.single.split(",") if x]:
        a = find(kind="single", lib="xlakern", n=n, graph=False, fused=False)
        g = find(kind="single", lib="xlakern", n=n, graph=True)
        f = find(kind="single", lib="xlakern", n=n, fused=True)
        b = find(kind="single", lib="brainevent", n=n)
        print(f"| {n:,} | {cell(b) if have_be else 'not installed'} | {cell(a)} | {ratio(b, a)} | {cell(g)} | "
              f"{cell(f)} | {ratio(b, f)} |")
    multi = [int(x) for x in args.multi.split(",") if x]
    if multi:
        print(f"\n## Across GPUs (`examples/coba_spmd.py`{', graph loops' if args.multi_graph else ''}): wall time per "
              f"simulated second\n")
        head, rule = "| N | best 1-GPU path (`run_lif_network`) |", "|---|---|"
        for variant in [v for v in args.multi_variants.split(",") if v]:
            head += f" {variant}, 1 GPU |" + (f" {variant}, {n_gpus} GPUs | speed-up | vs best 1-GPU |" if n_gpus > 1 else "")
            rule += "---|" + ("---|---|---|" if n_gpus > 1 else "")
        print(head)
        print(rule)

        def speedup(a, b):
            return f"{a['rtf'] / b['rtf']:.2f}x" if (a and b and "rtf" in a and "rtf" in b) else ""

        for n in multi:
            best = find(kind="single", lib="xlakern", n=n, fused=True)
            row = f"| {n:,} | {cell(best)} |"
            for variant in [v for v in args.multi_variants.split(",") if v]:
                one = find(kind="multi", n=n, devices=1, fused=variant == "fused")
                many = find(kind="multi", n=n, devices=n_gpus, fused=variant == "fused")
                row += f" {cell(one)} |"
                if n_gpus > 1:
                    row += f" {cell(many)} | {speedup(one, many)} | {speedup(best, many)} |"
            print(row)
    print(f"\n_Total: {time.time() - t0:.0f} s_")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for lib, graph, fused, label in (("xlakern", False, False, "xlakern, same script"),
                                         ("xlakern", True, False, "xlakern, same script, graph loops"),
                                         ("xlakern", False, True, "xlakern fused (run_lif_network)"),
                                         ("brainevent", False, False, "BrainEvent 0.3.0")):
            pts = [(r["n"], r["rtf"]) for r in results if r.get("kind") == "single" and r.get("lib") == lib
                   and r.get("graph") == graph and r.get("fused", False) == fused and "rtf" in r]
            if pts:
                ax.loglog(*zip(*pts), "o-", label=label)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("neurons")
        ax.set_ylabel("wall s per simulated s (RTF)")
        ax.set_title(f"COBA (scaled), {dev}")
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
