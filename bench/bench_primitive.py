#!/usr/bin/env python3
"""vmap over a batch of 64 through an XLACustomKernel op: one batched launch vs loops, in one run.

Usage::

    python bench/bench_primitive.py                  # Markdown table on stdout
    python bench/bench_primitive.py --json out.json  # ... and the same table (plus raw samples) as JSON
    python bench/bench_primitive.py --runs 5         # fewer timed calls per figure

The op is an elementwise leaky ReLU (``alpha`` kwarg) as a C++ kernel on the CPU and, when
JAX sees a GPU, a CUDA kernel on it. ``jax.jit(jax.vmap(op))`` over a (64, N) float32 batch is
timed four ways (median over ``--runs`` calls, after 3 warm-ups; the figure is per vmapped
call, i.e. for the whole batch of 64):

  one launch   xlakern default batching; the kernel's ffi_call has vmap_method='broadcast_all',
               so the batch is one custom call over 64*N elements.
  lax.map      xlakern default batching when the ffi_call has no vmap_method: a loop of 64 calls.
  lax.scan     a user batching rule that scans one call per element (BrainEvent's default
               strategy, written here against xlakern's API).
  BrainEvent   brainevent's own ``general_batching_rule`` (``brainevent._op.util``) installed as
               the batching rule of the same op (same kernel, no vmap_method); the cell is an
               error if that rule was not called while tracing (n/a when brainevent is not
               importable).

Every result is checked against NumPy ("check" column). Each cell is computed in its own
try/except, so a failure shows in its cell instead of stopping the run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

# _benchlib restores np.row_stack for numba-cuda and tries `import brainevent` (None if it fails).
from _benchlib import (BE_ERROR, NA_BE, Table, brainevent, err_cell, finish, loaded, log, machine_info, print_header,
                       run_sections, timed_call_cell)

import jax
import jax.numpy as jnp

import xlakern

if brainevent is None:
    be_general_batching_rule = None
    BE_RULE_ERROR = NA_BE
else:
    try:
        from brainevent._op.util import general_batching_rule as be_general_batching_rule
        BE_RULE_ERROR = BE_ERROR
    except Exception as _e:  # noqa: BLE001 - any import failure just disables the column
        be_general_batching_rule = None
        BE_RULE_ERROR = f"n/a (brainevent._op.util.general_batching_rule: {type(_e).__name__}: {_e})"

BATCH = 64
SDS = jax.ShapeDtypeStruct

CPP = r"""
// @xk leaky arg ret attr.alpha:float32
void leaky(const xk::Tensor x, xk::Tensor out, float alpha) {
  const float* px = x.data<float>(); float* po = out.data<float>();
  xk::parallel_for(x.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = px[i] > 0 ? px[i] : alpha * px[i];
  });
}
"""

CUDA = r"""
__global__ void leaky_k(const float* x, float* o, int64_t n, float alpha) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) o[i] = x[i] > 0 ? x[i] : alpha * x[i];
}
// @xk leaky arg ret attr.alpha:float32 stream
void leaky(const xk::Tensor x, xk::Tensor out, float alpha, int64_t stream) {
  int64_t n = x.numel();
  leaky_k<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(x.data<float>(), out.data<float>(), n, alpha);
}
"""


COLUMNS = ["one launch", "lax.map", "lax.scan", "BrainEvent general_batching_rule"]
BE_COLUMN = COLUMNS[-1]
SIZES = {"cpu": [1_000, 100_000], "gpu": [10_000, 1_000_000]}
ALPHA = 0.1


def make_ops(mod, platform: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The ops by column, and a counter of calls to BrainEvent's batching rule (to show it ran)."""
    def gen(vmap_method):
        return lambda outs, alpha: lambda x: mod.leaky(x, outs=outs[0], alpha=alpha, vmap_method=vmap_method)

    def op(tag, vmap_method):
        o = xlakern.XLACustomKernel(f"bench_leaky_{platform}_{tag}")
        o.def_kernel("xk", platform, gen(vmap_method))
        return o

    ops = {"one launch": op("bcast", "broadcast_all"), "lax.map": op("map", None)}

    scan_op = op("scan", None)

    def scan_rule(args, axes, **kw):
        xs = jnp.moveaxis(args[0], axes[0], 0)
        _, ys = jax.lax.scan(lambda c, x: (c, scan_op(x, **kw)[0]), 0, xs)
        return [ys], [0]

    scan_op.def_batching_rule(scan_rule)
    ops["lax.scan"] = scan_op

    be_calls = {"n": 0}
    if be_general_batching_rule is not None:
        be_op = op("be", None)

        def be_rule(args, axes, **kw):
            # kw holds outs, backend and alpha; BrainEvent's rule moves the batch axes to 0 and
            # lax.scan's be_op (not a jax Primitive, so it is called as be_op(*x, **kw)) per element.
            be_calls["n"] += 1
            return be_general_batching_rule(be_op, args, axes, **kw)

        be_op.def_batching_rule(be_rule)
        ops[BE_COLUMN] = be_op
    return ops, be_calls


def section(platform: str, args) -> list[Table]:
    """One table: every column at every size of `platform` ('cpu' or 'gpu')."""
    device = jax.devices(platform)[0]
    name = f"bench_prim_{platform}"

    def load():
        if platform == "cpu":
            return xlakern.load_cpp_inline(name, CPP, quiet=True)
        return xlakern.load_cuda_inline(name, CUDA, quiet=True)

    kernel = "C++ (`load_cpp_inline`, `xk::parallel_for`)" if platform == "cpu" else "CUDA (`load_cuda_inline`)"
    t = Table(f"vmap_{platform}",
              f"vmap over a batch of {BATCH} of an `XLACustomKernel` leaky ReLU (float32), {kernel}, "
              f"{device.device_kind}",
              ["N per element", *[f"`{c}`" if c != BE_COLUMN else "BrainEvent `general_batching_rule`"
                                  for c in COLUMNS], "check"],
              note=(f"Time per `jax.jit(jax.vmap(op))` call over the whole ({BATCH}, N) batch: median of "
                    f"{args.runs} calls after 3 warm-ups. Check: the output vs NumPy."))
    load_error = ""
    try:
        ops, be_calls = make_ops(loaded(name, load), platform)
    except Exception as e:  # noqa: BLE001 - the kernel did not build: every cell says why
        ops, be_calls = {}, {"n": 0}
        load_error = err_cell(e)
    with jax.default_device(device):
        for n in SIZES[platform]:
            rng = np.random.default_rng(n)
            x_np = rng.standard_normal((BATCH, n)).astype(np.float32)
            want = np.where(x_np > 0, x_np, np.float32(ALPHA) * x_np)
            x = jax.device_put(x_np, device)
            cells, data, bad = [], {}, []
            for col in COLUMNS:
                if col == BE_COLUMN and be_general_batching_rule is None:
                    cells.append(BE_RULE_ERROR)
                    data[col] = None
                    continue
                if col not in ops:
                    cells.append(load_error)
                    data[col] = {"error": load_error}
                    continue
                op, before = ops[col], be_calls["n"]

                def matches(out, col=col, before=before):
                    if col == BE_COLUMN and be_calls["n"] == before:
                        raise RuntimeError("BrainEvent's general_batching_rule was not called while tracing")
                    return np.allclose(np.asarray(out), want, rtol=1e-6)

                cell, data[col], ok = timed_call_cell(
                    lambda op=op: jax.jit(jax.vmap(lambda v: op(v, outs=[jax.ShapeDtypeStruct(v.shape, v.dtype)],
                                                                alpha=ALPHA)[0])),
                    (x,), args.runs, matches)
                cells.append(cell)
                if ok is False:
                    bad.append(col)
            computed = [c for c in COLUMNS if data.get(c) and "error" not in data[c]]
            check = "" if not computed else ("ok (= NumPy)" if not bad else "MISMATCH: " + ", ".join(bad))
            t.add([f"N={n:,}", *cells, check], {"platform": platform, "n": n, **data})
            log(f"  {platform} N={n}: {' / '.join(cells)}")
    return [t]


def gpu_skipped() -> Table:
    """The GPU table's stand-in when JAX sees no GPU."""
    t = Table("vmap_gpu", "vmap over a batch of 64, CUDA kernel", ["N per element", "all columns"])
    t.add([", ".join(f"N={n:,}" for n in SIZES["gpu"]), "skipped (JAX sees no GPU)"], {"skipped": True})
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the table (and raw samples) as JSON")
    ap.add_argument("--runs", "--repeats", dest="runs", type=int, default=50,
                    help="timed calls per figure (default 50; --repeats is the old name)")
    args = ap.parse_args()
    args.runs = max(args.runs, 1)

    t_start = time.perf_counter()
    info = machine_info()
    print_header(f"xlakern: vmap over a batch of {BATCH} through an XLACustomKernel op", info)
    tables = run_sections([("cpu", lambda: section("cpu", args)),
                           ("gpu", lambda: section("gpu", args) if info["gpu"] else [gpu_skipped()])])
    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
