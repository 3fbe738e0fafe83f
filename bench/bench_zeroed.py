#!/usr/bin/env python3
"""Cost of ``zeroed_outputs`` against a separate ``jnp.zeros`` passed as an aliased input.

Usage::

    python bench/bench_zeroed.py                  # Markdown tables on stdout
    python bench/bench_zeroed.py --json out.json  # ... and the same tables (plus raw samples) as JSON

Two accumulating kernels, each written twice: once writing into its output cleared by
``zeroed_outputs=[0]`` (the handler clears it inside the same FFI call: ``memset`` on the CPU,
``cuMemsetD8Async`` / ``cudaMemsetAsync`` on XLA's stream), once adding into an input that the
caller fills with ``jnp.zeros`` and aliases to the output (``input_output_aliases``), the way
to get cleared outputs without ``zeroed_outputs``:

- ``hist64``: a 64-bin histogram of 1M int32 bin indices (``out[x[i]] += 1``; atomics on the GPU);
- ``scatter4M``: 4096 float32 events scattered into a 4M-element output (``out[idx[i]] += w[i]``),
  where clearing the 16 MB output is most of the work.

Rows per platform: Numba (``numba_kernel`` on the CPU, ``numba_cuda_kernel`` on the GPU) and
C++/CUDA modules (``load_cpp_inline`` / ``load_cuda_inline``, called as ``mod.fn``). Columns:
the eager per-call time (median) of each variant and their ratio, and the per-step time in a
jitted 100-step ``lax.fori_loop`` (each step's input shifted by the step index, so XLA cannot
hoist the call out of the loop) and the ratio. The target: zeroing inside the call is no slower
(ratio zeroed / jnp.zeros ≤ 1). Every variant's result is checked exactly against NumPy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
from _benchlib import GRAPH_LOOPS, Table, err_cell, finish, fmt_t, loaded, log, machine_info, print_header, ratio, run_sections, time_fn

import jax
import jax.numpy as jnp

import xlakern

SDS = jax.ShapeDtypeStruct
STEPS = 100
RUNS = 30
HIST_N, HIST_BINS = 1_000_000, 64
SCATTER_EVENTS, SCATTER_OUT = 4096, 4 * 1024 * 1024

CPP = r"""
static void count(const xk::Tensor& x, xk::Tensor& out) {
  const int32_t* v = x.data<int32_t>(); int32_t* o = out.data<int32_t>();
  for (int64_t i = 0; i < x.numel(); ++i) o[v[i]] += 1;
}
static void add_events(const xk::Tensor& idx, const xk::Tensor& w, xk::Tensor& out) {
  const int32_t* k = idx.data<int32_t>(); const float* v = w.data<float>(); float* o = out.data<float>();
  for (int64_t i = 0; i < idx.numel(); ++i) o[k[i]] += v[i];
}
// @xk hist arg ret
void hist(const xk::Tensor x, xk::Tensor out) { count(x, out); }
// @xk hist_into arg arg ret
void hist_into(const xk::Tensor x, const xk::Tensor zeros, xk::Tensor out) { count(x, out); }
// @xk scatter arg arg ret
void scatter(const xk::Tensor idx, const xk::Tensor w, xk::Tensor out) { add_events(idx, w, out); }
// @xk scatter_into arg arg arg ret
void scatter_into(const xk::Tensor idx, const xk::Tensor w, const xk::Tensor zeros, xk::Tensor out) {
  add_events(idx, w, out);
}
"""

CUDA = r"""
#include <cuda_runtime.h>
__global__ void hist_k(const int* x, int* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&out[x[i]], 1);
}
__global__ void scatter_k(const int* idx, const float* w, float* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&out[idx[i]], w[i]);
}
static unsigned blocks(long long n) { return (unsigned)((n + 255) / 256); }
static void count(const xk::Tensor& x, xk::Tensor& out, cudaStream_t s) {
  hist_k<<<blocks(x.numel()), 256, 0, s>>>(x.data<int>(), out.data<int>(), x.numel());
}
static void add_events(const xk::Tensor& idx, const xk::Tensor& w, xk::Tensor& out, cudaStream_t s) {
  scatter_k<<<blocks(idx.numel()), 256, 0, s>>>(idx.data<int>(), w.data<float>(), out.data<float>(), idx.numel());
}
// @xk hist arg ret stream
void hist(const xk::Tensor x, xk::Tensor out, cudaStream_t s) { count(x, out, s); }
// @xk hist_into arg arg ret stream
void hist_into(const xk::Tensor x, const xk::Tensor zeros, xk::Tensor out, cudaStream_t s) { count(x, out, s); }
// @xk scatter arg arg ret stream
void scatter(const xk::Tensor idx, const xk::Tensor w, xk::Tensor out, cudaStream_t s) { add_events(idx, w, out, s); }
// @xk scatter_into arg arg arg ret stream
void scatter_into(const xk::Tensor idx, const xk::Tensor w, const xk::Tensor zeros, xk::Tensor out,
                  cudaStream_t s) { add_events(idx, w, out, s); }
"""


def _numba_cpu_kernels() -> dict[str, Any]:
    import numba

    @numba.njit
    def hist(x, out):
        for i in range(x.size):
            out[x[i]] += 1

    @numba.njit
    def hist_into(x, zeros, out):
        hist(x, out)

    @numba.njit
    def scatter(idx, w, out):
        for i in range(idx.size):
            out[idx[i]] += w[i]

    @numba.njit
    def scatter_into(idx, w, zeros, out):
        scatter(idx, w, out)

    return {"hist": hist, "hist_into": hist_into, "scatter": scatter, "scatter_into": scatter_into}


def _numba_cuda_kernels() -> dict[str, Any]:
    from numba import cuda

    @cuda.jit
    def hist(x, out):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(out, x[i], 1)

    @cuda.jit
    def hist_into(x, zeros, out):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(out, x[i], 1)

    @cuda.jit
    def scatter(idx, w, out):
        i = cuda.grid(1)
        if i < idx.size:
            cuda.atomic.add(out, idx[i], w[i])

    @cuda.jit
    def scatter_into(idx, w, zeros, out):
        i = cuda.grid(1)
        if i < idx.size:
            cuda.atomic.add(out, idx[i], w[i])

    return {"hist": hist, "hist_into": hist_into, "scatter": scatter, "scatter_into": scatter_into}


def _workloads(rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    x = np.minimum((rng.uniform(0, 1, HIST_N) * HIST_BINS).astype(np.int32), HIST_BINS - 1)
    idx = rng.integers(0, SCATTER_OUT - STEPS, SCATTER_EVENTS).astype(np.int32)
    w = rng.integers(-8, 8, SCATTER_EVENTS).astype(np.float32)  # integers: float32 sums are exact
    return {
        "hist64": {"inputs": (x,), "out": SDS((HIST_BINS,), jnp.int32),
                   "shift": lambda ins, i: ((ins[0] + i) % HIST_BINS,),
                   "ref": lambda ins: np.bincount(ins[0], minlength=HIST_BINS)},
        "scatter4M": {"inputs": (idx, w), "out": SDS((SCATTER_OUT,), jnp.float32),
                      "shift": lambda ins, i: (ins[0] + i, ins[1]),
                      "ref": lambda ins: np.bincount(ins[0], weights=ins[1], minlength=SCATTER_OUT)},
    }


def _variants(path: str, kernels: Any, name: str, out: Any, launch: dict[str, Any]) -> tuple[Callable, Callable]:
    """(zeroed, zeros-aliased) functions of the workload's inputs for one kernel path."""
    base = "hist" if name == "hist64" else "scatter"
    n_in = 1 if base == "hist" else 2
    if path == "module":
        def zeroed(*ins):
            return getattr(kernels, base)(*ins, outs=out, zeroed_outputs=[0])

        def aliased(*ins):
            return getattr(kernels, base + "_into")(*ins, jnp.zeros(out.shape, out.dtype), outs=out,
                                                     input_output_aliases={n_in: 0})
        return zeroed, aliased
    wrap = xlakern.numba_kernel if path == "numba" else xlakern.numba_cuda_kernel
    z = wrap(kernels[base], outs=out, zeroed_outputs=[0], **launch)
    a = wrap(kernels[base + "_into"], outs=out, input_output_aliases={n_in: 0}, **launch)
    return z, (lambda *ins: a(*ins, jnp.zeros(out.shape, out.dtype)))


def _loop(fn: Callable, shift: Callable) -> Callable:
    def run(*ins):
        def body(i, acc):
            return acc + fn(*shift(ins, i))[:8].astype(acc.dtype)  # a slice: the sum stays the kernel's cost
        return jax.lax.fori_loop(0, STEPS, body, jnp.zeros(8, jnp.float32))
    return jax.jit(run)


def _interleaved(fns: Any, args: tuple, runs: int, rounds: int = 5) -> list[float]:
    """Median time of each function, timed in alternating rounds so machine drift hits both alike."""
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            samples[k] += time_fn(fn, args, max(1, runs // rounds), warmup=1)[1]
    return [statistics.median(s) for s in samples]


def _section(platform: str) -> list[Table]:
    device = jax.devices("gpu" if platform == "gpu" else "cpu")[0]
    rng = np.random.default_rng(0)
    table = Table(f"zeroed_{platform}", f"zeroed_outputs vs jnp.zeros + aliased input ({platform.upper()}"
                  + (", loops as CUDA graphs)" if GRAPH_LOOPS else ")"),
                  ["workload", "path", "zeroed / call", "jnp.zeros+alias / call", "ratio", "zeroed / step",
                   "jnp.zeros+alias / step", "ratio", "check"],
                  note=f"Per call: eager median of {RUNS}. Per step: a jitted {STEPS}-step fori_loop / {STEPS}. "
                       "The two variants are timed in alternating rounds. "
                       "Ratio: zeroed time / jnp.zeros time (≤ 1 means zeroing inside the call is no slower).")
    paths = ["numba", "module"] if platform == "cpu" else ["numba_cuda", "module"]
    for name, w in _workloads(rng).items():
        ins = tuple(jax.device_put(a, device) for a in w["inputs"])
        ref = w["ref"](w["inputs"])
        n_threads = len(w["inputs"][0])
        for path in paths:
            label = {"numba": "numba_kernel", "numba_cuda": "numba_cuda_kernel",
                     "module": "load_cpp_inline mod.fn" if platform == "cpu" else "load_cuda_inline mod.fn"}[path]
            log(f"{platform} {name} {label}")
            try:
                if path == "module":
                    kernels = loaded(f"{platform}_module", lambda: (
                        xlakern.load_cpp_inline("bench_zeroed_cpu", CPP) if platform == "cpu"
                        else xlakern.load_cuda_inline("bench_zeroed_cuda", CUDA)))
                elif path == "numba":
                    kernels = loaded("numba", _numba_cpu_kernels)
                else:
                    kernels = loaded("numba_cuda", _numba_cuda_kernels)
                launch = {"launch_dims": n_threads} if path == "numba_cuda" else {}
                zeroed, aliased = _variants(path, kernels, name, w["out"], launch)
                with jax.default_device(device):
                    cells, ok = [], True
                    for fn in (zeroed, aliased):
                        got = np.asarray(fn(*ins))
                        ok = ok and np.array_equal(got, ref.astype(got.dtype))
                    per_call = _interleaved((zeroed, aliased), ins, RUNS)
                    per_step = [t / STEPS for t in _interleaved([_loop(fn, w["shift"]) for fn in (zeroed, aliased)],
                                                                ins, max(5, RUNS // 3))]
                cells = [fmt_t(per_call[0]), fmt_t(per_call[1]), ratio(per_call[0], per_call[1]),
                         fmt_t(per_step[0]), fmt_t(per_step[1]), ratio(per_step[0], per_step[1]),
                         "exact" if ok else "MISMATCH"]
                data = {"per_call_s": per_call, "per_step_s": per_step, "exact": ok}
            except Exception as e:  # noqa: BLE001 -- a failing cell reports itself
                cells = [err_cell(e)] + [""] * 6
                data = {"error": cells[0]}
            table.add([name, label, *cells], data)
    return [table]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the tables (and raw samples) to this JSON file")
    ap.add_argument("--graph-loops", action="store_true",
                    help="run under xlakern.config.enable_cuda_graph_loops(): every loop body becomes a CUDA "
                         "graph, whatever its size (under default flags XLA captures only bodies of >= 5 ops, "
                         "so the variant with one op fewer can fall outside the graph)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    info = machine_info()
    print_header("zeroed_outputs: clearing outputs inside the FFI call", info)
    sections = [("cpu", lambda: _section("cpu"))]
    if info["gpu"]:
        sections.append(("gpu", lambda: _section("gpu")))
    tables = run_sections(sections)
    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
