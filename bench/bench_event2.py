#!/usr/bin/env python3
"""Event operators part 2 per simulation step: JITC products and CSR plasticity, beside BrainEvent 0.3.

Usage::

    python bench/bench_event2.py                     # Markdown tables on stdout
    python bench/bench_event2.py --json out.json     # ... and as JSON
    python bench/bench_event2.py --sizes 4000 --runs 5   # a quick run

Each figure is one call inside a jitted ``lax.scan`` of 100 steps (median over ``--runs`` loop
calls after warm-ups, divided by 100); step t uses spike vector t of a (100, N) bool array with
1% of neurons active, and each step's output is the loop carry. xlakern's and BrainEvent's loops for
one product are timed in turns, the order reversed each turn (``per_step_cells`` in _benchlib.py).

JITC table: N neurons, connection probability giving K = 80 or 1,000 synapses per neuron,
``JITCScalarR((0.1, K / N, seed), shape=(N, N), corder=True)``:
  s @ W     ``BinaryArray(s) @ W`` (scatter: only the rows of active neurons are generated)
  W @ s     ``W @ BinaryArray(s)`` (gather: every row is generated)
  W @ S16   ``W @ BinaryArray(S)`` with S of shape (N, 16) (gather, batch 16)
each for xlakern and BrainEvent 0.3 (when ``import brainevent`` works), and the stored-CSR
``BinaryArray(s) @ CSR`` of part 1 with K random targets per neuron where it fits in memory
(indices + weights <= --csr-max-gb). The two libraries' JITC matrices differ (different
generators), so outputs are not compared across them; xlakern's scatter is checked against its own
materialised matrix at N <= 4,000.
Plasticity table: ``update_csr_on_binary_pre`` and ``update_csr_on_binary_post`` (weights carried
through the loop, updated in place) for N neurons x 80 synapses, beside BrainEvent's, with the
outputs compared.
Delay table (``--sections delay``, not run by default): ``csr_delay_deliver`` into a 10-slot ring
for N neurons x 80 synapses with delays in [1, 10), beside BrainEvent's, with the rings compared.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import numpy as np

from _benchlib import (GRAPH_LOOPS, NA_BE, Table, brainevent, err_cell, finish, hashed_spikes, hashed_trains,
                       library_cells, log, machine_info, per_step_cells, print_header, ratio, run_sections, warm_gpu)

import jax
import jax.numpy as jnp

import xlakern

STEPS = 100
RATE = 0.01
CONNS = (80, 1000)
SIZES = {"gpu": [40_000, 400_000, 4_000_000], "cpu": [4_000, 40_000]}
BATCH = 16


def spike_trains(n: int, seed: int = 1, batch: int | None = None):
    if GRAPH_LOOPS:  # the loops below hash each step's spikes from the counter: the same ones
        return hashed_trains(STEPS, n, RATE, batch)
    shape = (STEPS, n) if batch is None else (STEPS, n, batch)
    return jax.random.bernoulli(jax.random.PRNGKey(seed), RATE, shape)


def step_loop(body: Callable, init, S):
    """The 100-step loop: ``body(carry, spikes_t) -> carry`` over the rows of S, or, under
    --graph-loops, over spikes hashed from the step counter (no scanned slice: one CUDA graph)."""
    if GRAPH_LOOPS:
        n, batch = S.shape[1], (S.shape[2] if S.ndim == 3 else None)
        return jax.lax.fori_loop(0, STEPS, lambda t, c: body(c, hashed_spikes(t, n, RATE, batch)), init)
    return jax.lax.scan(lambda c, s: (body(c, s), None), init, S)[0]


def scan_loop(step_fn: Callable, out_shape: tuple) -> Callable:
    """jit of a 100-step loop whose carry is each step's output."""

    @jax.jit
    def run(S):
        return step_loop(lambda c, s: step_fn(s).astype(jnp.float32), jnp.zeros(out_shape, jnp.float32), S)

    return run


def jitc_steps(lib, n: int, prob: float):
    W = lib.JITCScalarR((0.1, prob, 1234), shape=(n, n), corder=True)
    return {"s @ W": (lambda s: lib.BinaryArray(s) @ W, (n,), False),
            "W @ s": (lambda s: W @ lib.BinaryArray(s), (n,), False),
            "W @ S16": (lambda S: W @ lib.BinaryArray(S), (n, BATCH), True)}


def stored_csr(n: int, k: int):
    rng = np.random.default_rng(0)
    idx = jnp.asarray(rng.integers(0, n, size=n * k, dtype=np.int32))
    w = jnp.asarray(rng.standard_normal(n * k, dtype=np.float32))
    ptr = jnp.asarray(np.arange(0, n * k + 1, k, dtype=np.int32))
    return w, idx, ptr


def csr_loop(n: int, w, idx, ptr) -> Callable:
    """The stored-CSR scatter loop, the arrays passed as arguments of the jitted loop (closed over, a
    matrix of 400k x 1,000 synapses would be folded into the program as 3 GB of constants)."""

    @jax.jit
    def run(S, w, idx, ptr):
        C = xlakern.CSR((w, idx, ptr), shape=(n, n))
        return step_loop(lambda c, s: (xlakern.BinaryArray(s) @ C).astype(jnp.float32), jnp.zeros((n,), jnp.float32), S)

    return lambda S: run(S, w, idx, ptr)


def jitc_section(platform: str, args, device) -> Table:
    headers = ["N", "K"]
    for c in ("s @ W", "W @ s", "W @ S16"):
        headers += [f"xlakern {c}", f"BrainEvent {c}", "BE / xk"]
    headers += ["stored CSR s @ W", "JITC / CSR", "check"]
    table = Table(f"jitc_{platform}", f"JITC products per step, {platform} ({device.device_kind})", headers,
                  note=f"Per call inside a jitted {STEPS}-step {'fori_loop as a CUDA graph' if GRAPH_LOOPS else 'scan'}; {RATE:.0%} of neurons spiking; scalar weight "
                       f"0.1, prob = K / N; stored CSR: K random targets, float32 weights, int32 indices.")
    for n in args.sizes or SIZES[platform]:
        S, SB = spike_trains(n), spike_trains(n, batch=BATCH)
        for k in args.conns or CONNS:
            if k > n:
                continue
            log(f"jitc {platform} N={n} K={k}")
            cells, data, checks = [f"{n:,}", str(k)], {"n": n, "k": k}, []
            xk = jitc_steps(xlakern, n, k / n)
            try:
                be, be_err = (jitc_steps(brainevent, n, k / n) if brainevent is not None else None), NA_BE
            except Exception as e:  # noqa: BLE001
                be, be_err = None, err_cell(e)
            xk_scatter = None
            for col, (fn, shape, batched) in xk.items():
                inp = SB if batched else S
                (xc, xt, _), (bc, bt, _) = library_cells(
                    lambda: scan_loop(fn, shape), None if be is None else lambda: scan_loop(be[col][0], shape), inp,
                    args.runs, args.budget, STEPS, missing=be_err)
                cells += [xc, bc, ratio(bt, xt)]
                data[col] = {"xlakern_s": xt, "brainevent_s": bt}
                if col == "s @ W":
                    xk_scatter = xt
            if n * k * 8 <= args.csr_max_gb * 2 ** 30:
                w, idx, ptr = stored_csr(n, k)
                cc, ct, _ = per_step_cells([lambda: csr_loop(n, w, idx, ptr)], S, args.runs, args.budget, STEPS)[0]
                del w, idx, ptr
            else:
                cc, ct = f"— (> {args.csr_max_gb} GB)", None
            cells += [cc, ratio(xk_scatter, ct)]
            data["csr_s"] = ct
            if n <= 4000:
                M = np.asarray(xlakern.jits(0.1, k / n, 1234, shape=(n, n), corder=True), np.float64)
                s = np.asarray(S[-1])
                checks.append(np.allclose(np.asarray(xk["s @ W"][0](S[-1])), s @ M, rtol=1e-4, atol=1e-4))
            cells.append("ok" if checks and all(checks) else ("MISMATCH" if checks else "—"))
            table.add(cells, data)
            log("row: " + " | ".join(cells))  # partial results survive a timeout
    return table


def csc_view(n: int, idx, ptr):
    """The CSC view of CSR synapses that ``update_csr_on_binary_post`` walks: each post neuron's
    sources and where their weights sit in the CSR arrays."""
    cols = np.asarray(idx)
    rows = np.repeat(np.arange(n, dtype=np.int32), np.diff(np.asarray(ptr)))
    perm = np.argsort(cols, kind="stable").astype(np.int32)
    csc_ptr = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=n))]).astype(np.int32)
    return jnp.asarray(rows[perm]), jnp.asarray(csc_ptr), jnp.asarray(perm)


def plasticity_section(platform: str, args, device) -> Table:
    k = 80
    headers = ["N", "K", "xlakern on pre", "BrainEvent on pre", "BE / xk", "xlakern on post", "BrainEvent on post",
               "BE / xk", "check"]
    table = Table(f"plasticity_{platform}", f"CSR plasticity per step, {platform} ({device.device_kind})", headers,
                  note=f"on pre = update_csr_on_binary_pre(w, indices, indptr, pre_spikes, post_trace, 0, 1); on post = "
                       f"update_csr_on_binary_post(w, csc_indices, csc_indptr, weight_indices, pre_trace, post_spikes, "
                       f"0, 1) (the CSC view of the same synapses); each per step of a jitted {STEPS}-step loop "
                       f"carrying the weights; {RATE:.0%} of neurons spiking.")
    for n in args.sizes or SIZES[platform]:
        log(f"plasticity {platform} N={n}")
        w, idx, ptr = stored_csr(n, k)
        w = jnp.abs(w) * 0.1
        csc_idx, csc_ptr, perm = csc_view(n, idx, ptr)
        S = spike_trains(n)
        trace = jax.random.uniform(jax.random.PRNGKey(2), (n,), jnp.float32, -0.01, 0.01)

        def loop(lib, post):
            # the structures and trace are arguments of the jitted loop, not constants folded into it
            # (at 4M the CSC view alone would be 2.6 GB of constants)
            @jax.jit
            def run(S, w, idx, ptr, trace, csc_idx, csc_ptr, perm):
                if post:
                    return step_loop(lambda wc, s: lib.update_csr_on_binary_post(
                        wc, csc_idx, csc_ptr, perm, trace, s, 0.0, 1.0, shape=(n, n)), w, S)
                return step_loop(lambda wc, s: lib.update_csr_on_binary_pre(wc, idx, ptr, s, trace, 0.0, 1.0,
                                                                            shape=(n, n)), w, S)
            return lambda S: run(S, w, idx, ptr, trace, csc_idx, csc_ptr, perm)

        cells, data, checks = [], {"n": n}, []
        for post, name in ((False, "pre"), (True, "post")):
            (xc, xt, xo), (bc, bt, bo) = library_cells(lambda: loop(xlakern, post), lambda: loop(brainevent, post), S,
                                                       args.runs, args.budget, STEPS)
            # each timed call starts from the same w, so the outputs of both libraries must agree
            if xo is not None and bo is not None:
                checks.append(bool(np.allclose(np.asarray(xo), np.asarray(bo), rtol=1e-5, atol=1e-6)))
            cells += [xc, bc, ratio(bt, xt)]
            data.update({f"xlakern_{name}_s": xt, f"brainevent_{name}_s": bt})
        check = "—" if not checks else ("ok" if all(checks) else "MISMATCH")
        table.add([f"{n:,}", str(k), *cells, check], data)
        log(f"row: {n:,} | {k} | {' | '.join(cells)} | {check}")
    return table


def delay_section(platform: str, args, device) -> Table:
    k, slots = 80, 10
    headers = ["N", "K", "xlakern csr_delay_deliver", "BrainEvent", "BE / xk", "check"]
    table = Table(f"delay_{platform}", f"CSR delivery through per-synapse delays per step, {platform} "
                  f"({device.device_kind})", headers,
                  note=f"csr_delay_deliver(ring, spikes, w, indices, indptr, delays, t) into a ring of {slots} slots, "
                       f"delays uniform in [1, {slots}); the ring and the step carried through a jitted {STEPS}-step "
                       f"loop that clears the slot it reads each step; {RATE:.0%} of neurons spiking.")
    for n in args.sizes or SIZES[platform]:
        log(f"delay {platform} N={n}")
        w, idx, ptr = stored_csr(n, k)
        delays = jnp.asarray(np.random.default_rng(3).integers(1, slots, n * k).astype(np.int32))
        S = spike_trains(n)

        def loop(lib):
            @jax.jit
            def run(S, w, idx, ptr, delays):
                def step(carry, s):
                    ring, t = carry
                    ring = lib.csr_delay_deliver(ring, s, w, idx, ptr, delays, t, shape=(n, n))
                    return ring.at[t % slots].set(0), t + 1
                return step_loop(step, (jnp.zeros((slots, n), jnp.float32), jnp.int32(0)), S)[0]
            return lambda S: run(S, w, idx, ptr, delays)

        (xc, xt, xo), (bc, bt, bo) = library_cells(lambda: loop(xlakern), lambda: loop(brainevent), S, args.runs,
                                                   args.budget, STEPS)
        check = "—" if xo is None or bo is None else (
            "ok" if np.allclose(np.asarray(xo), np.asarray(bo), rtol=1e-4, atol=1e-4) else "MISMATCH")
        table.add([f"{n:,}", str(k), xc, bc, ratio(bt, xt), check], {"n": n, "xlakern_s": xt, "brainevent_s": bt})
        log(f"row: {n:,} | {k} | {xc} | {bc} | {ratio(bt, xt)} | {check}")
    return table


def section(platform: str, args) -> list[Table]:
    device = jax.devices(platform)[0]
    makers = {"jitc": jitc_section, "plasticity": plasticity_section, "delay": delay_section}
    with jax.default_device(device):
        return [makers[name](platform, args, device) for name in args.sections]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the tables (and raw data) as JSON")
    ap.add_argument("--runs", type=int, default=20, help="timed loop calls per figure (default 20)")
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per figure before stopping early")
    ap.add_argument("--sizes", type=int, nargs="*", help="override N (default: 40k, 400k, 4M GPU; 4k, 40k CPU)")
    ap.add_argument("--platforms", nargs="*", default=None, help="cpu and/or gpu (default: both where present)")
    ap.add_argument("--graph-loops", action="store_true",
                    help="run under xlakern.config.enable_cuda_graph_loops() (for every library in the run), "
                         "with spikes hashed from the step counter inside the loop")
    ap.add_argument("--csr-max-gb", type=float, default=16.0, help="largest stored CSR (indices + weights) to build")
    ap.add_argument("--sections", nargs="*", default=["jitc", "plasticity"], choices=["jitc", "plasticity", "delay"],
                    help="which tables (default jitc and plasticity; 'plasticity' alone reaches it within a short device run)")
    ap.add_argument("--conns", type=int, nargs="*", help="synapses per neuron for the JITC table (default 80 1000)")
    ap.add_argument("--rate", type=float, default=RATE,
                    help=f"fraction of neurons spiking each step (default {RATE}, the issue's tables)")
    args = ap.parse_args()
    if not 0.0 < args.rate <= 1.0:
        ap.error(f"--rate must be in (0, 1], got {args.rate}")
    globals()["RATE"] = args.rate  # read by spike_trains, step_loop and the tables' notes
    t_start = time.perf_counter()
    info = machine_info()
    print_header("xlakern: event operators part 2 (JITC, plasticity, delays) per simulation step", info)
    platforms = args.platforms or (["gpu", "cpu"] if info["gpu"] else ["cpu"])
    if "gpu" in platforms:
        warm_gpu()
    tables = run_sections([(p, (lambda p=p: section(p, args))) for p in platforms])
    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
