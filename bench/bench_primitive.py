#!/usr/bin/env python3
"""vmap over a batch of 64 through an XLACustomKernel op: one batched launch vs loops, in one run.

Usage::

    python bench/bench_primitive.py                 # Markdown table on stdout
    python bench/bench_primitive.py --json out.json # ... and the raw figures as JSON

The op is an elementwise leaky ReLU (``alpha`` kwarg) as a C++ kernel on the CPU and, when
JAX sees a GPU, a CUDA kernel on it. ``jax.jit(jax.vmap(op))`` over a (64, N) float32 batch is
timed four ways (median per call, after a warm-up; the figure is per vmapped step, i.e. for
the whole batch of 64):

  one launch   xlakern default batching; the kernel's ffi_call has vmap_method='broadcast_all',
               so the batch is one custom call over 64*N elements.
  lax.map      xlakern default batching when the ffi_call has no vmap_method: a loop of 64 calls.
  lax.scan     a user batching rule that scans one call per element (BrainEvent's default
               strategy, written here against xlakern's API).
  BrainEvent   brainevent's own ``general_batching_rule`` installed as the op's batching rule
               (n/a when brainevent is not importable).

Every result is checked against NumPy ("check" column). Each cell is computed in its own
try/except, so a failure shows in its cell instead of stopping the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback

import numpy as np
import jax
import jax.numpy as jnp

import xlakern

try:
    from brainevent._op.util import general_batching_rule as be_general_batching_rule
    BE_ERROR = None
except Exception as _e:  # noqa: BLE001 - any import failure just disables the column
    be_general_batching_rule = None
    BE_ERROR = f"n/a ({type(_e).__name__}: {_e})"

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


def make_ops(mod, platform: str) -> dict:
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
    if be_general_batching_rule is not None:
        be_op = op("be", None)
        be_op.def_batching_rule(lambda args, axes, **kw: be_general_batching_rule(be_op, args, axes, **kw))
        ops["BrainEvent general_batching_rule"] = be_op
    return ops


def time_call(f, *args, repeats: int) -> float:
    jax.block_until_ready(f(*args))  # compile + warm-up
    jax.block_until_ready(f(*args))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run(platform: str, mod, sizes, repeats: int, rows: list) -> None:
    device = jax.devices("cpu" if platform == "cpu" else "gpu")[0]
    ops = make_ops(mod, platform)
    rng = np.random.default_rng()
    for n in sizes:
        x_np = rng.standard_normal((BATCH, n)).astype(np.float32)
        want = np.where(x_np > 0, x_np, np.float32(0.1) * x_np)
        x = jax.device_put(x_np, device)
        row = {"platform": platform, "N": n, "check": []}
        for label, op in ops.items():
            try:
                f = jax.jit(jax.vmap(lambda v, op=op: op(v, outs=[SDS(v.shape, v.dtype)], alpha=0.1)[0]))
                ok = np.allclose(np.asarray(f(x)), want, rtol=1e-6)
                row[label] = time_call(f, x, repeats=repeats)
                row["check"].append("ok" if ok else f"MISMATCH({label})")
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(file=sys.stderr)
                row[label] = f"error: {type(e).__name__}: {str(e)[:80]}"
        if be_general_batching_rule is None:
            row["BrainEvent general_batching_rule"] = BE_ERROR
        rows.append(row)


def fmt(v) -> str:
    return f"{v * 1e6:,.1f} µs" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()

    rows: list = []
    cpu_mod = xlakern.load_cpp_inline("bench_prim_cpu", CPP)
    with jax.default_device(jax.devices("cpu")[0]):
        run("cpu", cpu_mod, [1_000, 100_000], args.repeats, rows)
    try:
        has_gpu = len(jax.devices("gpu")) > 0
    except RuntimeError:
        has_gpu = False
    if has_gpu:
        gpu_mod = xlakern.load_cuda_inline("bench_prim_gpu", CUDA)
        run("gpu", gpu_mod, [10_000, 1_000_000], args.repeats, rows)

    import jaxlib

    cols = ["one launch", "lax.map", "lax.scan", "BrainEvent general_batching_rule"]
    print(f"vmap over a batch of {BATCH}, time per vmapped call (median of {args.repeats}); jax {jax.__version__}, "
          f"jaxlib {jaxlib.__version__}, devices: {', '.join(sorted({d.device_kind for d in jax.devices()}))}\n")
    print("| platform | N per element | " + " | ".join(cols) + " | check |")
    print("|---|---:|" + "---:|" * len(cols) + "---|")
    for r in rows:
        check = "ok" if all(c == "ok" for c in r["check"]) else ", ".join(c for c in r["check"] if c != "ok")
        print(f"| {r['platform']} | {r['N']:,} | " + " | ".join(fmt(r.get(c, 'n/a')) for c in cols) + f" | {check} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
