"""Plot wall time per simulated second against N from bench_network.py JSON files (issue 16).

Several files may be given (e.g. a run beside BrainEvent and a later run of the fused simulator);
a later file's point replaces an earlier one's for the same (library, variant, N).

Usage::

    python bench/plot_network.py bench/network_h100.json --out bench/rtf_vs_n.png
"""

from __future__ import annotations

import argparse
import json

SERIES = (  # (lib, graph, fused) -> label, style
    (("brainevent", False, False), "BrainEvent 0.3.0 (same script)", "s-"),
    (("xlakern", False, False), "xlakern, same script (event operators)", "o-"),
    (("xlakern", True, False), "xlakern, same script, graph loops", "x--"),
    (("xlakern", False, True), "xlakern fused (run_lif_network)", "D-"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", default="rtf_vs_n.png")
    args = ap.parse_args()
    points: dict[tuple, dict[int, float]] = {}
    device = "?"
    for path in args.json:
        with open(path) as fh:
            for r in json.load(fh):
                if r.get("kind") != "single" or "rtf" not in r:
                    continue
                key = (r["lib"], bool(r.get("graph")), bool(r.get("fused")))
                points.setdefault(key, {})[r["n"]] = r["rtf"]
                device = r.get("device", device)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, label, style in SERIES:
        if key in points:
            ns = sorted(points[key])
            ax.loglog(ns, [points[key][n] for n in ns], style, label=label)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("neurons (80 synapses each)")
    ax.set_ylabel("wall s per simulated s (RTF)")
    ax.set_title(f"COBA (BrainEvent's scaled variant), {device}")
    ax.legend(fontsize=8)
    fig.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
