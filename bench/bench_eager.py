#!/usr/bin/env python3
"""Event operators called outside jit: what one call costs, xlakern beside BrainEvent 0.3.0.

Usage::

    python bench/bench_eager.py                           # Markdown tables on stdout
    python bench/bench_eager.py --json out.json           # ... and the same tables as JSON
    python bench/bench_eager.py --platforms cpu --sizes 4000 --runs 50

A user who steps a network from Python (brainstate's layers called one step at a time, a notebook, a
debugging session) calls each operator eagerly: every call pays the operator's Python side and its
dispatch, besides the kernel. Each cell is the median wall time of one call (``block_until_ready``
included), the two libraries timed in turns in one process, on one CSR of N neurons (80 synapses a row,
float32 weights, int32 indices) with 5% of the neurons active. "programs" is the number of XLA programs
the library's first call in the process compiled (its kernels' builds are not programs, and the build
caches are warm after the first size). Every result is checked against float64 NumPy (the JITC row: its
outputs are whole counts of its one weight, averaging prob times the active inputs).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

from _benchlib import (BE_ERROR, Table, brainevent, finish, jax, library_cells, log, machine_info, print_header,
                       ratio, run_sections, warm_gpu, xlakern)
from xlakern.event._eager import compiled_programs

CASES = ["s @ CSR", "CSR @ s", "s @ FCN", "s @ dense", "JITC s @ W", "update_csr_on_binary_pre",
         "update_csr_on_binary_post"]
K = 80
RATE = 0.05


def network(n: int, seed: int = 7) -> dict[str, Any]:
    """A CSR of n x n (K synapses a row), its CSC view, the spikes and the traces, as device arrays, and the
    float64 matrix for the checks."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.integers(0, n, (n, K)), axis=1).astype(np.int32)
    indptr = (np.arange(n + 1) * K).astype(np.int32)
    w = rng.uniform(0, 1, n * K).astype(np.float32)
    rows = np.repeat(np.arange(n), K)
    order = np.argsort(idx.reshape(-1), kind="stable")
    csc_ptr = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(idx.reshape(-1), minlength=n), out=csc_ptr[1:])
    spk = rng.random(n) < RATE
    host = dict(w=w, idx=idx.reshape(-1), rows=rows, spk=spk, trace=rng.uniform(-0.1, 0.1, n).astype(np.float32))
    dev = {k: jax.device_put(v) for k, v in dict(w=w, idx=idx.reshape(-1), indptr=indptr, fidx=idx,
                                                   fw=w.reshape(n, K), spk=spk, csc_idx=rows[order].astype(np.int32),
                                                   csc_ptr=csc_ptr, perm=order.astype(np.int32),
                                                   trace=host["trace"]).items()}
    dev["dense"] = None  # the dense matrix only where it is small (N <= 8,000: 256 MB)
    if n <= 8000:
        d = np.zeros((n, n), np.float32)
        np.add.at(d, (rows, host["idx"]), w)
        dev["dense"] = jax.device_put(d)
    host["n"] = n
    return {"host": host, "dev": dev}


def call(lib: Any, case: str, net: dict[str, Any]) -> Callable[[Any], Any]:
    """f(spikes): the library's eager call of `case` (structures built once, outside the timed call)."""
    d, n = net["dev"], net["host"]["n"]
    shape = (n, n)
    if case in ("s @ CSR", "CSR @ s"):
        csr = lib.CSR((d["w"], d["idx"], d["indptr"]), shape=shape)
        if case == "s @ CSR":
            return lambda s: lib.BinaryArray(s) @ csr
        return lambda s: csr @ lib.BinaryArray(s)
    if case == "s @ FCN":
        fcn = lib.FixedPostNumConn((d["fw"], d["fidx"]), shape=shape)
        return lambda s: lib.BinaryArray(s) @ fcn
    if case == "s @ dense":
        W = d["dense"]
        return lambda s: lib.BinaryArray(s) @ W
    if case == "JITC s @ W":
        return lambda s: lib.binary_jitsmv(0.5, 0.02, s, 1234, shape=shape, transpose=True)
    if case == "update_csr_on_binary_pre":
        return lambda s: lib.update_csr_on_binary_pre(d["w"], d["idx"], d["indptr"], s, d["trace"], 0.0, 1.0,
                                                      shape=shape)
    if case == "update_csr_on_binary_post":
        return lambda s: lib.update_csr_on_binary_post(d["w"], d["csc_idx"], d["csc_ptr"], d["perm"], d["trace"],
                                                       s, 0.0, 1.0, shape=shape)
    raise ValueError(case)


def expected(case: str, net: dict[str, Any]) -> np.ndarray | None:
    """float64 NumPy result of `case` (None for JITC, checked by counts)."""
    h = net["host"]
    n, s = h["n"], h["spk"].astype(np.float64)
    w, idx, rows = h["w"].astype(np.float64), h["idx"], h["rows"]
    if case in ("s @ CSR", "s @ FCN", "s @ dense"):
        return np.bincount(idx, weights=w * s[rows], minlength=n)
    if case == "CSR @ s":
        return np.bincount(rows, weights=w * s[idx], minlength=n)
    if case == "update_csr_on_binary_pre":
        on = h["spk"][rows]
        return np.where(on, np.clip(w + h["trace"][idx], 0, 1), w)
    if case == "update_csr_on_binary_post":
        on = h["spk"][idx]
        return np.where(on, np.clip(w + h["trace"][rows], 0, 1), w)
    return None


def matches(case: str, net: dict[str, Any], out: Any) -> bool:
    got = np.asarray(out, np.float64).reshape(-1)
    want = expected(case, net)
    if want is None:  # JITC: whole counts of 0.5 averaging prob times the active inputs
        counts = got / 0.5
        return bool(np.allclose(counts, np.round(counts), atol=1e-4)
                    and abs(counts.mean() / (0.02 * net["host"]["spk"].sum()) - 1) < 0.1)
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-4, atol=1e-4))


def section(platform: str, args) -> list[Table]:
    device = jax.devices({"gpu": "cuda"}.get(platform, platform))[0]
    t = Table(f"eager_{platform}", f"Event operators called outside jit, {platform}",
              ["N", "case", "xlakern", "BrainEvent", "BE / xk", "programs, xk / BE", "check"],
              f"Median wall time of one eager call ({args.runs} calls a library, in turns), K = {K}, {RATE:.0%} "
              "active; programs: XLA programs the first call in the process compiled.")
    with jax.default_device(device):
        if platform == "gpu":
            warm_gpu()
        for n in args.sizes:
            net = network(n)
            S = net["dev"]["spk"]
            for case in args.cases:
                if case == "s @ dense" and net["dev"]["dense"] is None:
                    continue
                log(f"{platform} N={n} {case}")
                programs: dict[str, int] = {}

                def make(lib, key, case=case, net=net):
                    def first():
                        f = call(lib, case, net)
                        with compiled_programs() as names:
                            jax.block_until_ready(f(S))
                        programs[key] = len(names)
                        return f
                    return first

                (xc, xt, xo), (bc, bt, bo) = library_cells(
                    make(xlakern, "xk"), make(brainevent, "be") if brainevent else None, S, args.runs,
                    args.budget, 1)
                ok = []
                for name, out in (("xk", xo), ("be", bo)):
                    if out is not None:
                        ok.append(name if matches(case, net, out) else f"{name} WRONG")
                check = "ok" if ok and all(" " not in c for c in ok) else ", ".join(ok) or "—"
                progs = f"{programs.get('xk', '—')} / {programs.get('be', '—')}"
                log(f"  {platform} N={n} {case}: xlakern {xc}, BrainEvent {bc}, programs {progs}, {check}")
                t.add([f"{n:,}", case, xc, bc, ratio(bt, xt), progs, check],
                      {"n": n, "case": case, "xlakern_s": xt, "brainevent_s": bt, "programs": programs,
                       "check": check})
    return [t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the tables as JSON here")
    ap.add_argument("--platforms", nargs="+", default=None, help="cpu and/or gpu (default: cpu, and gpu if present)")
    ap.add_argument("--sizes", nargs="+", type=int, default=[4000, 40000])
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    ap.add_argument("--runs", type=int, default=60, help="timed calls a library (median)")
    ap.add_argument("--budget", type=float, default=3.0, help="seconds a cell may time")
    args = ap.parse_args()
    t_start = time.perf_counter()
    info = machine_info()
    platforms = args.platforms or (["cpu", "gpu"] if info["gpu"] else ["cpu"])
    print_header("Event operators called outside jit", info)
    if BE_ERROR:
        log(BE_ERROR)
    tables = run_sections((p, lambda p=p: section(p, args)) for p in platforms)
    finish(t_start, info, tables, args.json)


if __name__ == "__main__":
    main()
