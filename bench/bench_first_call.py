#!/usr/bin/env python3
"""First event product in a fresh process: what a user waits for before the first step runs.

Usage::

    python bench/bench_first_call.py                        # Markdown tables on stdout
    python bench/bench_first_call.py --json out.json        # ... and the same tables as JSON
    python bench/bench_first_call.py --platforms cpu --repeats 2 --cases "s @ CSR"
    python bench/bench_first_call.py --platforms cpu --cold-repeats 5   # cold figures as medians

Each cell is one ``python -c`` subprocess that imports jax and the library, builds a 4,000-neuron
CSR (80 synapses a row, float32 weights, int32 indices) from NumPy, and makes the case's first jitted
call (its block_until_ready included); the figure is that call's wall time, the layout's construction
included, the library's import and the float64 NumPy reference not (until session 75 the reference matrix,
about 0.3 s, was built inside the timed part, in every arm). "cold": empty build caches (xlakern's,
BrainEvent's and Numba's, in a fresh temporary directory), the median of ``--cold-repeats`` processes, each
on caches of its own, the arms in turns; "warm": the next processes on the caches the first cold one filled
(median of ``--repeats``).

Arms:

  xlakern            one build per combination of operand dtypes (the default): only the kernels of
                     the dtypes the call sees are compiled;
  xlakern, one build ``XLAKERN_EVENT_BUILDS=all``: each kernel file built once with every dtype, as
                     before session 69;
  BrainEvent 0.3.0   its own kernels (Numba on the CPU, its CUDA sources compiled by nvcc on the GPU).

Cases: ``s @ CSR`` (bool spikes, scatter), ``CSR @ s`` (gather), ``grad`` (the gradient of the summed
``s @ CSR`` with respect to the weights: the product and its weight cotangent), ``JITC s @ W``
(``binary_jitsmv``, prob 0.02, transposed). Every call's result is checked: the stored-layout cases against
NumPy in float64, the JITC case for outputs that are whole counts of its one weight, averaging prob times the
active inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from _benchlib import (BE_ERROR, Table, err_cell, finish, fmt_t, log, machine_info, print_header, result_worker,
                       run_sections)

CASES = ["s @ CSR", "CSR @ s", "grad", "JITC s @ W"]
ARMS = {"xlakern": ("xlakern", {}), "xlakern, one build": ("xlakern", {"XLAKERN_EVENT_BUILDS": "all"}),
        "BrainEvent 0.3.0": ("brainevent", {})}

# One first call; prints "RESULT <seconds> <max abs error>" (the error against float64 NumPy).
WORKER = r"""
import sys, time
import numpy as np
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # numba-cuda (BrainEvent's GPU paths) still uses it
import jax
jax.config.update("jax_platforms", {"gpu": "cuda"}.get(sys.argv[2], sys.argv[2]))
jax.config.update("jax_enable_x64", False)
import jax.numpy as jnp
be = __import__(sys.argv[1])
case = sys.argv[3]
jax.devices()
t0 = time.perf_counter()
rng = np.random.default_rng(7)
n, k = 4000, 80
idx = np.sort(rng.integers(0, n, (n, k)), axis=1).astype(np.int32)
indptr = (np.arange(n + 1) * k).astype(np.int32)
w = rng.random(n * k, dtype=np.float32)
spk = rng.random(n) < 0.05


def dense():  # the float64 reference matrix, built after the timed call
    m = np.zeros((n, n))
    np.add.at(m, (np.repeat(np.arange(n), k), idx.reshape(-1)), w.astype(np.float64))
    return m


if case == "JITC s @ W":
    out = be.binary_jitsmv(0.5, 0.02, jnp.asarray(spk), 1234, shape=(n, n), transpose=True)
    got = np.asarray(jax.block_until_ready(out), np.float64)
    t1 = time.perf_counter()
    # Each synapse weighs 0.5, so every output is 0.5 times a count of active inputs, and the counts average
    # prob times the active inputs. (BrainEvent's materialisation need not be the matrix its mv draws, so
    # the check holds for any generator.)
    counts = got / 0.5
    mean_ok = abs(counts.mean() / (0.02 * spk.sum()) - 1) < 0.1
    want = np.round(counts) * 0.5 if mean_ok else np.full_like(got, np.inf)
else:
    csr = be.CSR((jnp.asarray(w), jnp.asarray(idx.reshape(-1)), jnp.asarray(indptr)), shape=(n, n))
    s = jnp.asarray(spk)
    if case == "s @ CSR":
        got = np.asarray(jax.block_until_ready(jax.jit(lambda s: be.BinaryArray(s) @ csr)(s)), np.float64)
        t1 = time.perf_counter()
        want = spk.astype(np.float64) @ dense()
    elif case == "CSR @ s":
        got = np.asarray(jax.block_until_ready(jax.jit(lambda s: csr @ be.BinaryArray(s))(s)), np.float64)
        t1 = time.perf_counter()
        want = dense() @ spk.astype(np.float64)
    else:
        g = jax.jit(jax.grad(lambda data, s: (be.BinaryArray(s) @ csr.with_data(data)).sum()))
        got = np.asarray(jax.block_until_ready(g(jnp.asarray(w), s)), np.float64)
        t1 = time.perf_counter()
        want = np.repeat(spk.astype(np.float64), k)  # d/dw of sum_j sum_i s_i w_ij: s of the row
print("RESULT", t1 - t0, float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf"))
"""


def run_worker(module: str, platform: str, case: str, env: dict[str, str], timeout: float) -> tuple[float, float]:
    """(seconds, max abs error) of one fresh process's first call."""
    return result_worker(WORKER, [module, platform, case], env, timeout)


def section(platform: str, cases: list[str], arms: list[str], repeats: int, cold_repeats: int,
            timeout: float) -> list[Table]:
    t = Table(f"first_call_{platform}", f"First event product in a fresh process, {platform}",
              ["case", "caches", *arms],
              "Wall time of the first jitted call, layout construction included, import and the NumPy reference "
              f"excluded. cold: empty build caches (median of {cold_repeats} processes, each on caches of its own, "
              f"the arms in turns); warm: the next processes on the first cold one's caches (median of {repeats}). "
              "Checked against float64 NumPy.")
    runnable = [a for a in arms if not (ARMS[a][0] == "brainevent" and BE_ERROR)]
    for case in cases:
        cells: dict[str, dict[str, str]] = {"cold": {}, "warm": {}}
        data: dict[str, Any] = {"case": case, "platform": platform}
        for arm in arms:
            if arm not in runnable:
                cells["cold"][arm] = cells["warm"][arm] = BE_ERROR
        with tempfile.TemporaryDirectory(prefix="xk-first-call-") as root:
            def env_of(arm: str, d: str) -> dict[str, str]:
                extra = ARMS[arm][1]
                env = dict(os.environ, XLAKERN_CACHE_DIR=f"{d}/xk", BRAINEVENT_CACHE_DIR=f"{d}/be",
                           NUMBA_CACHE_DIR=f"{d}/numba", XLA_PYTHON_CLIENT_PREALLOCATE="false",
                           XLAKERN_QUIET="1", **extra)
                if "XLAKERN_EVENT_BUILDS" not in extra:
                    env.pop("XLAKERN_EVENT_BUILDS", None)
                return env

            runs: dict[str, list[tuple[float, float]]] = {arm: [] for arm in runnable}
            failed: dict[str, Exception] = {}
            for r in range(cold_repeats):
                for arm in runnable:
                    if arm in failed:
                        continue
                    log(f"{platform} {case}: {arm}, cold {r + 1}/{cold_repeats}")
                    try:
                        runs[arm].append(run_worker(ARMS[arm][0], platform, case,
                                                    env_of(arm, f"{root}/{arms.index(arm)}-{r}"), timeout))
                    except Exception as e:  # noqa: BLE001 -- the cell says what failed
                        failed[arm] = e
            for arm in runnable:
                try:
                    if arm in failed:
                        raise failed[arm]
                    # the warm processes reuse the caches the first cold process filled
                    warm = [run_worker(ARMS[arm][0], platform, case, env_of(arm, f"{root}/{arms.index(arm)}-0"),
                                       timeout) for _ in range(repeats)]
                    errs = [e for _, e in runs[arm]] + [e for _, e in warm]
                    ok = max(errs) <= 1e-3  # float32 sums of up to ~200 weights below 1
                    cold = statistics.median(s for s, _ in runs[arm])
                    data[arm] = {"cold_s": cold, "cold_runs_s": [s for s, _ in runs[arm]],
                                 "warm_s": [s for s, _ in warm], "max_abs_err": max(errs)}
                    log(f"  {platform} {case} {arm}: {json.dumps(data[arm])}")
                    cells["cold"][arm] = fmt_t(cold) + ("" if ok else f" (WRONG: err {max(errs):.3g})")
                    cells["warm"][arm] = fmt_t(statistics.median(s for s, _ in warm)) if warm else "—"
                except Exception as e:  # noqa: BLE001 -- the cell says what failed
                    cells["cold"][arm] = cells["warm"][arm] = err_cell(e)
        for m in ("cold", "warm"):
            t.add([case, m, *(cells[m][arm] for arm in arms)], {"caches": m, **data})
    return [t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the tables as JSON here")
    ap.add_argument("--platforms", nargs="+", default=None, help="cpu and/or gpu (default: cpu, and gpu if present)")
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--repeats", type=int, default=2, help="warm processes to time (median)")
    ap.add_argument("--cold-repeats", type=int, default=1,
                    help="cold processes to time (median), each on empty caches of its own, the arms in turns")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a worker may take")
    args = ap.parse_args()
    t_start = time.perf_counter()
    info = machine_info()
    platforms = args.platforms or (["cpu", "gpu"] if info["gpu"] else ["cpu"])
    print_header("First event product in a fresh process", info)
    tables = run_sections((p, lambda p=p: section(p, args.cases, args.arms, args.repeats, args.cold_repeats, args.timeout))
                          for p in platforms)
    finish(t_start, info, tables, args.json)


if __name__ == "__main__":
    main()
