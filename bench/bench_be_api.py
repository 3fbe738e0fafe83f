"""The BrainEvent 0.3 functions xlakern added for drop-in use, beside BrainEvent 0.3.0 in the same run.

Per jitted call (median), random CSR with K = 80 synapses per row, float32 weights, int32 indices:
``binary_csrmv_indexed`` as a scatter with 1% of rows active (and xlakern's plain ``binary_csrmv`` on
the same weights, to show what the ``data[perm]`` gather costs), ``csrmv_dt2t`` (one value per synapse)
and ``csr_slice_rows`` of 256 rows. The check column compares xlakern's result with BrainEvent's.

    python bench/bench_be_api.py [--sizes 40000 400000] [--runs 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import xlakern
from _benchlib import Table, brainevent, err_cell, finish, fmt_t, machine_info, print_header, run_sections, time_fn

K = 80
COLUMNS = ["binary_csrmv_indexed (scatter, 1%)", "binary_csrmv, same weights (xlakern)", "csrmv_dt2t",
           "csr_slice_rows (256 rows)"]


def structure(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=n * K, dtype=np.int32)
    data = rng.standard_normal(n * K).astype(np.float32)
    ptr = np.arange(0, n * K + 1, K, dtype=np.int32)
    perm = rng.permutation(n * K).astype(np.int32)
    spikes = rng.random(n) < 0.01
    y = rng.standard_normal(n).astype(np.float32)
    rows = np.sort(rng.choice(n, 256, replace=False)).astype(np.int32)
    return [jnp.asarray(a) for a in (data, idx, ptr, perm, spikes, y, rows)]


def sliced_rows(arrays, n):
    """The selected rows in float64 NumPy, repeated columns of a row summed (as the dense matrix has them)."""
    data, idx, ptr, _, _, _, rows = (np.asarray(a) for a in arrays)
    out = np.zeros((rows.size, n))
    for k, r in enumerate(rows):
        np.add.at(out[k], idx[ptr[r]:ptr[r + 1]], data[ptr[r]:ptr[r + 1]].astype(np.float64))
    return out


def calls(lib, n, arrays):
    data, idx, ptr, perm, spikes, y, rows = arrays
    shape = (n, n)
    extra = {}
    if lib is brainevent:
        from brainevent._csr.binary import _make_binary_csrmv_benchmark_workspace

        extra = {"workspace": _make_binary_csrmv_benchmark_workspace(ptr)}
    fns = {
        COLUMNS[0]: (lambda d, i, p, q, s: lib.binary_csrmv_indexed(d, i, p, q, s, shape=shape, transpose=True,
                                                                     **extra), (data, idx, ptr, perm, spikes)),
        COLUMNS[2]: (lambda yy, d, i, p: lib.csrmv_dt2t(yy, d, i, p, shape=shape), (y, data, idx, ptr)),
        COLUMNS[3]: (lambda d, i, p, r: lib.csr_slice_rows(d, i, p, r, shape=shape), (data, idx, ptr, rows)),
    }
    if lib is xlakern:
        fns[COLUMNS[1]] = (lambda d, i, p, q, s: xlakern.binary_csrmv(d[q], i, p, s, shape=shape, transpose=True),
                           (data, idx, ptr, perm, spikes))
    return fns


def section(args) -> list[Table]:
    device = jax.devices()[0]
    headers = ["N", "function", "xlakern", "BrainEvent 0.3.0", "BE / xk", "check"]
    table = Table("be_api", f"BrainEvent 0.3 functions per jitted call, {device.device_kind}", headers,
                  note=f"K = {K}, float32 weights, int32 indices; median of up to {args.runs} calls.")
    for n in args.sizes:
        arrays = structure(n)
        xk = calls(xlakern, n, arrays)
        be = calls(brainevent, n, arrays) if brainevent is not None else {}
        for col in COLUMNS:
            fn, fargs = xk[col]
            try:
                t_xk, _, out_xk = time_fn(jax.jit(fn), fargs, args.runs, budget=args.budget)
                cell_xk = fmt_t(t_xk)
            except Exception as e:  # noqa: BLE001
                t_xk, out_xk, cell_xk = None, None, err_cell(e)
            t_be, out_be, cell_be = None, None, "—"
            if col in be:
                bfn, bargs = be[col]
                try:
                    t_be, _, out_be = time_fn(jax.jit(bfn), bargs, args.runs, budget=args.budget)
                    cell_be = fmt_t(t_be)
                except Exception as e:  # noqa: BLE001
                    cell_be = err_cell(e)
            check = ""
            if out_xk is not None and out_be is not None:
                a, b = np.asarray(out_xk, np.float64), np.asarray(out_be, np.float64)
                check = "ok" if a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-4) else "DIFFERS"
                if col == COLUMNS[3] and check != "ok":  # who is right: the rows in float64 NumPy
                    ref = sliced_rows(arrays, n)
                    check += "; vs NumPy: xk " + ("ok" if np.allclose(a, ref, rtol=1e-4, atol=1e-4) else "wrong")
                    check += ", BE " + ("ok" if np.allclose(b, ref, rtol=1e-4, atol=1e-4) else "wrong")
            ratio = f"{t_be / t_xk:.2f}×" if t_xk and t_be else ""
            table.add([f"{n:,}", col, cell_xk, cell_be, ratio, check], {"n": n, "fn": col, "xk_s": t_xk, "be_s": t_be})
    return [table]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[40_000, 400_000])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    info = machine_info()
    print_header("BrainEvent 0.3 functions (bench_be_api.py)", info)
    tables = run_sections([("be_api", lambda: section(args))])
    finish(t0, info, tables, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
