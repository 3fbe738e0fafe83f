#!/usr/bin/env python3
"""Event-driven operators per simulation step: xlakern beside BrainEvent, JAX's BCSR and cuSPARSE.

Usage::

    python bench/bench_event.py                    # Markdown tables on stdout
    python bench/bench_event.py --json out.json    # ... and the tables (with raw samples) as JSON
    python bench/bench_event.py --sizes 4000 --runs 5   # a quick run

Each figure is the time of one call inside a jitted ``lax.scan`` of 100 steps (median over
``--runs`` loop calls, after warm-ups, divided by 100); step t uses spike vector t of a
precomputed (100, N) bool array, and each step's output is the loop carry (so nothing is dead
code and no extra arithmetic is timed; each step's spikes also wait on the last product, so an
unrolled body keeps every product). Connectivity: N neurons, K = 80 random targets per
neuron, float32 weights, int32 indices; the same arrays serve every library.

Rows: N = 4k, 40k, 400k, 4M on the GPU (4k, 40k on the CPU), 1% and 5% of neurons spiking (``--rates``;
0 times what a step costs with no spike).
Columns:
  s @ CSR     ``BinaryArray(s) @ CSR`` (scatter: only rows of active neurons are read)
  CSR @ s     ``CSR @ BinaryArray(s)`` (gather: every row is read)
  s @ FCN     ``BinaryArray(s) @ FixedNumPerPre`` (scatter)
  s @ dense   ``BinaryArray(s) @ W`` with a dense (N, N) matrix (N <= 40k)
  S16 @ dense ``binary_densemm(W, S, transpose=True)``: the same matrix and a batch of 16 spike
              vectors (S of shape (N, 16), each column at the row's rate), as a batched EventLinear
each for xlakern and BrainEvent 0.3 (when ``import brainevent`` works; its CPU kernels are Numba), the two
libraries' loops timed in turns, the order reversed each turn (``per_step_cells``);
``jax.experimental.sparse`` BCSR (``BCSR.T @ s`` as float32), and cuSPARSE through CuPy
(``csr.T @ s``; a Python loop of 100 calls timed with CUDA events; GPU only, when cupy imports).
loop alone: the same 100-step loop with the product left out (the spikes of each step and the carry):
what every column's step pays before any library's kernel runs.
floor: bytes the scatter must touch (indices + weights of the active rows, the output written,
the spikes read) / the copy bandwidth measured here (bytes read plus written a second by a device-to-device
copy of 1 GiB through CuPy, or by jitted passes over it without CuPy or on the CPU: ``copy_bandwidth``).
Results are checked: xlakern's against the jnp reference backend (N <= 400k) and BrainEvent's.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import numpy as np

from _benchlib import (NA_BE, Table, brainevent, err_cell, finish, fmt_t, hashed_spikes, hashed_trains,
                       library_cells, log, machine_info, per_step_cells, print_header, ratio, run_sections, time_fn,
                       warm_gpu)

import jax
import jax.numpy as jnp

import xlakern

STEPS = 100
K = 80
RATES = (0.01, 0.05)
SIZES = {"gpu": [4_000, 40_000, 400_000, 4_000_000], "cpu": [4_000, 40_000]}
DENSE_MAX = 40_000
COLUMNS = ["s @ CSR", "CSR @ s", "s @ FCN", "s @ dense", "S16 @ dense"]
EXTRA_COLUMNS = ["CSR @ S16", "S16 @ CSR"]  # timed only when named in --columns (the table is COLUMNS)
DENSE_BATCH = 16  # the spike columns of "S16 @ dense", "CSR @ S16" and "S16 @ CSR"
BATCHED = {"S16 @ dense": DENSE_BATCH, "CSR @ S16": DENSE_BATCH, "S16 @ CSR": DENSE_BATCH}


def connectivity(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n, K), dtype=np.int32)
    w = rng.standard_normal((n, K), dtype=np.float32)
    ptr = np.arange(0, n * K + 1, K, dtype=np.int32)
    return w, idx, ptr


def spike_trains(n: int, rate: float, seed: int = 1):
    key = jax.random.PRNGKey(seed)
    return jax.random.bernoulli(key, rate, (STEPS, n))


UNROLL = 1  # set by --unroll


def late(c):
    """False for any carry a run produces, but XLA cannot know that: each step's spikes wait on it, as a
    network's spikes wait for its state. Without it an unrolled body (--unroll) would keep only its last
    product live and drop the others as dead code."""
    return c.reshape(-1)[0] > jnp.float32(3e38)


def hashed_step(step_fn: Callable, M: Any, n_in: int, rate: float, batch: int | None = None) -> Callable:
    """The fori_loop body (t, c) -> product of step t's spikes hashed from the counter (--graph-loops),
    waiting on the last product."""
    return lambda t, c: step_fn(hashed_spikes(t + late(c).astype(t.dtype), n_in, rate, batch), M).astype(jnp.float32)


def scan_loop(step: tuple[Callable, Any], n_out: int, rate: float | None = None, batch: int | None = None) -> Callable:
    """jit of a 100-step loop whose carry is each step's output. ``step`` is (fn(s, M), M): the
    connectivity M is an argument of the jitted loop, never a constant baked into the program.
    With ``rate`` (--graph-loops) each step's spikes are hashed from the counter instead of S.
    ``batch``: each step's spikes (and output) have that many columns."""
    shape = (n_out,) if batch is None else (n_out, batch)
    step_fn, operand = step

    @jax.jit
    def run(S, M):
        if rate is not None:  # spikes from the counter: the loop can be one CUDA graph
            return jax.lax.fori_loop(0, STEPS, hashed_step(step_fn, M, S.shape[1], rate, batch),
                                     jnp.zeros(shape, jnp.float32), unroll=UNROLL)

        def body(c, s):
            return step_fn(s & ~late(c), M).astype(jnp.float32), None
        out, _ = jax.lax.scan(body, jnp.zeros(shape, jnp.float32), S, unroll=UNROLL)
        return out

    return lambda S: run(S, operand)


COPY_PASSES = 10


def copy_bandwidth(device) -> tuple[float, str]:
    """(bytes per second, how it was measured) of streaming a 1 GiB float32 array (128 MiB on the CPU),
    counting bytes read plus bytes written.

    On a GPU where CuPy imports: ``cudaMemcpyAsync`` device to device, timed with CUDA events (as the
    device machine's KINDS.md measures it). Otherwise ``COPY_PASSES`` passes of ``y * a + b`` in one
    jitted loop, timed as a whole, which XLA can neither fold into a copy nor fuse across the loop's
    steps. One jitted ``x + 0.0`` timed from the host (this bench's first method) became an XLA copy and
    also counted the output's allocation and the dispatch: it read 2.07 TB/s on an H200 whose device copy
    moves 4.27 (session 59), so the floor column came out twice too generous."""
    n = (1 << 28) if device.platform == "gpu" else (1 << 25)
    cupy = None
    if device.platform == "gpu":
        try:
            import cupy
        except ImportError:
            pass
    if cupy is not None:
        try:
            with cupy.cuda.Device(device.id):
                src = cupy.ones(n, cupy.float32)
                dst = cupy.empty_like(src)
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                to_device = cupy.cuda.runtime.memcpyDeviceToDevice
                times = []
                for r in range(23):
                    start.record()
                    cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, to_device, 0)
                    stop.record()
                    stop.synchronize()
                    if r >= 3:
                        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
                del src, dst
                cupy.get_default_memory_pool().free_all_blocks()  # the 2 GiB go back to the device, not CuPy's pool
            return 2 * 4 * n / float(np.median(times)), "device-to-device cudaMemcpy through CuPy"
        except Exception as e:  # noqa: BLE001
            log(f"copy bandwidth through CuPy failed ({type(e).__name__}: {e}); timing jitted passes instead")
    x = jax.device_put(jnp.ones((n,), jnp.float32), device)
    passes = jax.jit(lambda x: jax.lax.fori_loop(0, COPY_PASSES, lambda i, y: y * 1.0001 + 0.25, x))
    med, _, _ = time_fn(passes, (x,), 10)
    return COPY_PASSES * 2 * 4 * n / med, f"{COPY_PASSES} jitted passes of y * a + b"


def xlakern_steps(w, idx, ptr, n):
    W = xlakern.CSR((jnp.asarray(w.reshape(-1)), jnp.asarray(idx.reshape(-1)), jnp.asarray(ptr)), shape=(n, n))
    F = xlakern.FixedNumPerPre((jnp.asarray(w), jnp.asarray(idx)), shape=(n, n))
    steps = {"s @ CSR": (lambda s, M: xlakern.BinaryArray(s) @ M, W),
             "CSR @ s": (lambda s, M: M @ xlakern.BinaryArray(s), W),
             "s @ FCN": (lambda s, M: xlakern.BinaryArray(s) @ M, F),
             "CSR @ S16": (lambda S, M: xlakern.binary_csrmm(M.data, M.indices, M.indptr, S, shape=(n, n)), W),
             "S16 @ CSR": (lambda S, M: xlakern.binary_csrmm(M.data, M.indices, M.indptr, S, shape=(n, n),
                                                            transpose=True), W)}
    return steps, W


def brainevent_steps(w, idx, ptr, n):
    # BrainEvent's layouts cannot be jit arguments (their pytree metadata holds arrays), so its
    # functional operators (what its `@` calls) take the raw arrays.
    # Its binary CSR operators also take the task workspace its CSR class prepares from indptr
    # (made here by the helper its own docstring and benchmarks use).
    be = brainevent
    from brainevent._csr.binary import _make_binary_csrmv_benchmark_workspace

    ws = _make_binary_csrmv_benchmark_workspace(jnp.asarray(ptr))
    csr = (jnp.asarray(w.reshape(-1)), jnp.asarray(idx.reshape(-1)), jnp.asarray(ptr), ws)

    def be_csr(transpose):
        return lambda s, M: be.binary_csrmv(*M[:3], s, shape=(n, n), workspace=M[3], transpose=transpose)

    fcn = (jnp.asarray(w), jnp.asarray(idx))
    return {"s @ CSR": (be_csr(True), csr),
            "CSR @ s": (be_csr(False), csr),
            "s @ FCN": (lambda s, M: be.binary_fcnmv(*M, s, shape=(n, n), transpose=True), fcn),
            "CSR @ S16": (lambda S, M: be.binary_csrmm(*M[:3], S, shape=(n, n), workspace=M[3]), csr),
            "S16 @ CSR": (lambda S, M: be.binary_csrmm(*M[:3], S, shape=(n, n), workspace=M[3], transpose=True), csr)}


def dense_matrix(w, idx, n):
    rows = np.repeat(np.arange(n), K)
    return jnp.zeros((n, n), jnp.float32).at[rows, idx.reshape(-1)].add(jnp.asarray(w.reshape(-1)))


def bcsr_step(w, idx, ptr, n):
    from jax.experimental import sparse

    # The transpose of the CSR structure as a BCSR, so the scatter is a plain BCSR @ vector.
    order = np.argsort(idx.reshape(-1), kind="stable")
    cols = np.repeat(np.arange(n, dtype=np.int32), K)[order]
    tptr = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(idx.reshape(-1), minlength=n), out=tptr[1:])
    MT = sparse.BCSR((jnp.asarray(w.reshape(-1)[order]), jnp.asarray(cols), jnp.asarray(tptr)), shape=(n, n))
    return (lambda s, M: M @ s.astype(jnp.float32)), MT


def cusparse_cell(w, idx, ptr, n, S, runs):
    try:
        import cupy
        import cupyx.scipy.sparse as cps
    except Exception as e:  # noqa: BLE001
        return f"n/a (cupy: {type(e).__name__})", None
    try:
        M = cps.csr_matrix((cupy.asarray(w.reshape(-1)), cupy.asarray(idx.reshape(-1)), cupy.asarray(ptr)),
                           shape=(n, n))
        MT = M.T.tocsr()
        Sc = cupy.asarray(np.asarray(S, dtype=np.float32))
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for r in range(runs + 2):
            start.record()
            for t in range(STEPS):
                y = MT @ Sc[t]
            stop.record()
            stop.synchronize()
            if r >= 2:
                times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / STEPS)
        del y
        med = float(np.median(times))
        return fmt_t(med), med
    except Exception as e:  # noqa: BLE001
        return err_cell(e), None


def floor_bytes(n: int, rate: float) -> float:
    active = rate * n
    return active * K * (4 + 4) + 4 * n + n  # indices + weights of active rows, output, bool spikes


def section(platform: str, args) -> list[Table]:
    device = jax.devices(platform)[0]
    sizes = args.sizes or SIZES[platform]
    columns = args.columns or COLUMNS
    bw, bw_method = copy_bandwidth(device)
    log(f"{platform}: copy bandwidth {bw / 1e9:.0f} GB/s ({bw_method})")
    be_name = "BrainEvent" + (" (Numba)" if platform == "cpu" else "")
    headers = ["N", "active"]
    for c in columns:
        headers += [f"xlakern {c}", f"{be_name} {c}", "BE / xk"]
    headers += ["BCSR s @ M"] + (["cuSPARSE s @ M"] if platform == "gpu" else []) + ["loop alone", "floor", "xk / floor",
                                                                                     "check"]
    table = Table(f"event_{platform}", f"Event-driven products per step, {platform} ({device.device_kind})", headers,
                  note=(f"Per call inside a jitted {STEPS}-step fori_loop under enable_cuda_graph_loops() (spikes hashed "
                        "from the step counter); " if args.graph_loops else
                        f"Per call inside a jitted {STEPS}-step scan (unroll={UNROLL}); ") +
                       f"K = {K}; float32 weights, int32 indices. "
                       f"loop alone = the same loop with the product left out (each step's spikes and the carry, "
                       f"which every column pays too). floor = scatter bytes / copy bandwidth ({bw / 1e9:.0f} GB/s "
                       f"measured, {bw_method}).")
    with jax.default_device(device):
        for n in sizes:
            w, idx, ptr = connectivity(n)
            xk_steps, W = xlakern_steps(w, idx, ptr, n)
            try:
                be_steps = brainevent_steps(w, idx, ptr, n) if brainevent is not None else None
                be_err = NA_BE
            except Exception as e:  # noqa: BLE001
                be_steps, be_err = None, err_cell(e)
            dense = dense_matrix(w, idx, n) if n <= DENSE_MAX else None
            if dense is not None:
                xk_steps["s @ dense"] = (lambda s, D: xlakern.BinaryArray(s) @ D, dense)
                xk_steps["S16 @ dense"] = (lambda s, D: xlakern.binary_densemm(D, s, transpose=True), dense)
                if be_steps is not None:
                    be_steps["s @ dense"] = (lambda s, D: brainevent.binary_densemv(D, s, transpose=True), dense)
                    be_steps["S16 @ dense"] = (lambda s, D: brainevent.binary_densemm(D, s, transpose=True), dense)
            for rate in args.rates:
                hashed = rate if args.graph_loops else None
                S = hashed_trains(STEPS, n, rate) if hashed is not None else spike_trains(n, rate)
                log(f"{platform} N={n} rate={rate}")
                cells, data, checks = [f"{n:,}", f"{rate:.0%}"], {"n": n, "rate": rate}, []
                xk_scatter = None
                for col in columns:
                    if col not in xk_steps:
                        cells += ["—", "—", ""]
                        continue
                    nb = BATCHED.get(col)
                    Sc = S if nb is None else (hashed_trains(STEPS, n, rate, nb) if hashed is not None else
                                               jnp.asarray(np.random.default_rng(2).random((STEPS, n, nb)) < rate))
                    (xc, xt, xo), (bc, bt, bo) = library_cells(
                        lambda: scan_loop(xk_steps[col], n, hashed, nb),
                        None if be_steps is None else lambda: scan_loop(be_steps[col], n, hashed, nb), Sc, args.runs,
                        args.budget, STEPS, missing=be_err)
                    del Sc
                    cells += [xc, bc, ratio(bt, xt)]
                    data[col] = {"xlakern_s": xt, "brainevent_s": bt}
                    if col == "s @ CSR":
                        xk_scatter = xt
                    if xo is not None and bo is not None:
                        checks.append(bool(np.allclose(np.asarray(xo), np.asarray(bo), rtol=1e-3, atol=1e-3)))
                if args.no_baselines:
                    cells += ["— (not timed)"] * (2 if platform == "gpu" else 1)
                else:
                    bc, bt, _ = per_step_cells([lambda: scan_loop(bcsr_step(w, idx, ptr, n), n, hashed)], S,
                                               args.runs, args.budget, STEPS)[0]
                    cells.append(bc)
                    data["bcsr_s"] = bt
                    if platform == "gpu":
                        cc, ct = cusparse_cell(w, idx, ptr, n, S, max(3, args.runs // 4))
                        cells.append(cc)
                        data["cusparse_s"] = ct
                lc, lt, _ = per_step_cells([lambda: scan_loop((lambda s, M: s.astype(jnp.float32), None), n, hashed)],
                                           S, args.runs, args.budget, STEPS)[0]
                cells.append(lc)
                data["loop_s"] = lt
                fl = floor_bytes(n, rate) / bw
                cells += [fmt_t(fl), ratio(xk_scatter, fl)]
                data["floor_s"] = fl
                if n <= 400_000:  # the reference backend's COO view of 4M x 80 synapses is slow to build
                    s = S[-1]
                    ref = xlakern.binary_csrmv(W.data, W.indices, W.indptr, s, shape=(n, n), transpose=True,
                                               backend="jnp")
                    got = xlakern.BinaryArray(s) @ W
                    checks.append(bool(np.allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-3)))
                cells.append("ok" if checks and all(checks) else ("MISMATCH" if checks else "—"))
                table.add(cells, data)
                log("row: " + " | ".join(cells))  # partial results survive a timeout
            del dense
    return [table]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the tables (and raw data) as JSON")
    ap.add_argument("--runs", type=int, default=20, help="timed loop calls per figure (default 20)")
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per figure before stopping early")
    ap.add_argument("--sizes", type=int, nargs="*", help="override N (default: 4k..4M GPU, 4k, 40k CPU)")
    ap.add_argument("--columns", nargs="*", choices=COLUMNS + EXTRA_COLUMNS, metavar="COLUMN",
                    help=f"time only these products (default: all of {', '.join(COLUMNS)}; "
                         f"also {', '.join(EXTRA_COLUMNS)}, the batched CSR gather and scatter)")
    ap.add_argument("--rates", type=float, nargs="*", default=list(RATES),
                    help="shares of neurons spiking (default 0.01 0.05); 0 times a step's fixed cost")
    ap.add_argument("--platforms", nargs="*", default=None, help="cpu and/or gpu (default: both where present)")
    ap.add_argument("--unroll", type=int, default=1,
                    help="lax.scan unroll (default 1); a larger one removes the loop's per-step overhead from "
                         "every column alike")
    ap.add_argument("--no-baselines", action="store_true",
                    help="leave out the BCSR and cuSPARSE columns (at 4M neurons they take most of a row's time, "
                         "and a 4M row with them does not fit one 10-minute device call)")
    ap.add_argument("--graph-loops", action="store_true",
                    help="run with xlakern.config.enable_cuda_graph_loops() (loops as CUDA graphs where every "
                         "op allows it; the flags apply to every library in the run) and spikes hashed from "
                         "the step counter inside the loop")
    args = ap.parse_args()
    global UNROLL
    UNROLL = args.unroll
    t_start = time.perf_counter()
    info = machine_info()
    print_header("xlakern: event-driven operators per simulation step", info)
    platforms = args.platforms or (["gpu", "cpu"] if info["gpu"] else ["cpu"])
    if "gpu" in platforms:
        warm_gpu()
    tables = run_sections([(p, (lambda p=p: section(p, args))) for p in platforms])
    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
