#!/usr/bin/env python3
"""xlakern vs BrainEvent, side by side in one run: build/load times and per-call costs.

Usage::

    python bench/bench_foundation.py                  # Markdown tables on stdout
    python bench/bench_foundation.py --json out.json  # ... and the same tables (plus raw samples) as JSON

Sections (every figure is a median over repeats):

  a. Cold build (empty cache) and fresh-process cache hit (load + register) of one small C++
     module and, when JAX sees a GPU, one small CUDA module. Each figure is taken inside its
     own ``python -c`` subprocess that has already imported jax, initialised its backends and
     imported the library; only the ``load_*_inline`` call is timed. xlakern's cache goes to a
     temporary ``XLAKERN_CACHE_DIR``, BrainEvent's to a temporary ``BRAINEVENT_CACHE_DIR``.
  b. Per-step cost of an elementwise decay kernel (v = v*a + x, float32) inside a jitted
     100-step ``lax.fori_loop``: jnp vs xlakern vs BrainEvent; C++ at N=1e3 and 1e5 and, on a
     GPU, CUDA at N=1e4, 1e6 and 1.6e7.
  c. One jitted call of an elementwise C++ kernel at N=4e6: xlakern with ``xk::parallel_for``
     beside serial loops (xlakern and BrainEvent, which has no parallel_for) and jnp.

The same kernel sources (BrainEvent spelling: ``brainevent/common.h``, ``BE::Tensor``,
``// @BE`` annotations) are given to both libraries. Every cell is computed in its own
try/except: a failure prints the error in its cell rather than stopping the run. Every kernel
result is checked against NumPy ("check" columns).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

# _benchlib restores np.row_stack for numba-cuda and tries `import brainevent` (None if it fails).
from _benchlib import (NA_BE, Table, brainevent, err_cell, finish, fmt_t, loaded, log, machine_info, print_header,
                       ratio, run_sections, time_fn, timed_call_cell)

import jax

import xlakern

# --------------------------------------------------------------------------------------------
# Kernel sources (BrainEvent spelling; xlakern accepts it unchanged)
# --------------------------------------------------------------------------------------------

CPP_DECAY = r"""
#include "brainevent/common.h"

// @BE decay arg arg ret attr.a:float32
void decay(const BE::Tensor v, const BE::Tensor x, BE::Tensor out, float a) {
  const float* pv = static_cast<const float*>(v.data_ptr());
  const float* px = static_cast<const float*>(x.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) po[i] = pv[i] * a + px[i];
}
"""

CUDA_DECAY = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

__global__ void decay_kernel(const float* v, const float* x, float* out, float a, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v[i] * a + x[i];
}

// @BE decay arg arg ret attr.a:float32 stream
void decay(const BE::Tensor v, const BE::Tensor x, BE::Tensor out, float a, int64_t stream) {
  const int64_t n = v.numel();
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  decay_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
      static_cast<const float*>(v.data_ptr()), static_cast<const float*>(x.data_ptr()),
      static_cast<float*>(out.data_ptr()), a, n);
}
"""

CPP_ADD_ONE_SERIAL = r"""
#include "brainevent/common.h"

// @BE add_one arg ret
void add_one(const BE::Tensor x, BE::Tensor out) {
  const float* in = static_cast<const float*>(x.data_ptr());
  float* o = static_cast<float*>(out.data_ptr());
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = in[i] + 1.0f;
}
"""

CPP_ADD_ONE_PARALLEL = r"""
#include <xlakern/xlakern.h>

// @xk add_one arg ret
void add_one(const xk::Tensor x, xk::Tensor out) {
  const float* in = x.data<float>();
  float* o = out.data<float>();
  xk::parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = in[i] + 1.0f;
  });
}
"""

DECAY_A = 0.9

# --------------------------------------------------------------------------------------------
# Fresh-process worker for section a (run as `python -c WORKER lib platform name src_path`)
# --------------------------------------------------------------------------------------------

WORKER = r"""
import json, os, sys, time
import numpy as np
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
import jax
import jax.numpy as jnp
lib, plat, name, src_path = sys.argv[1:5]
src = open(src_path).read()
jax.devices()
cpu = jax.devices("cpu")[0]
t0 = time.perf_counter()
if lib == "xlakern":
    import xlakern as L
    kw = {"quiet": True}
else:
    import brainevent as L
    kw = {}
t1 = time.perf_counter()
load = L.load_cpp_inline if plat == "cpp" else L.load_cuda_inline
t2 = time.perf_counter()
load(name, src, **kw)
t3 = time.perf_counter()
# Not timed: run the kernel once and compare with NumPy.
v = np.linspace(-1, 1, 1000, dtype=np.float32)
x = np.linspace(0, 2, 1000, dtype=np.float32)
dev = cpu if plat == "cpp" else jax.devices()[0]
vj, xj = jax.device_put(v, dev), jax.device_put(x, dev)
out = jax.ffi.ffi_call(name + ".decay", jax.ShapeDtypeStruct(v.shape, v.dtype))(vj, xj, a=np.float32(0.9))
ok = bool(np.allclose(np.asarray(out), v * np.float32(0.9) + x, rtol=1e-5, atol=1e-6))
print("XKBENCH " + json.dumps({"import_s": t1 - t0, "load_s": t3 - t2, "ok": ok}), flush=True)
"""

# --------------------------------------------------------------------------------------------
# Section a: cold build and fresh-process cache hit
# --------------------------------------------------------------------------------------------


def run_worker(lib: str, plat: str, name: str, src_path: str, cache_dir: str, timeout: int) -> dict[str, Any]:
    env = dict(os.environ)
    env["XLAKERN_CACHE_DIR" if lib == "xlakern" else "BRAINEVENT_CACHE_DIR"] = cache_dir
    # The parent may hold most of the GPU's memory (JAX preallocates); the child must not try to.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("XLAKERN_QUIET", None)
    p = subprocess.run([sys.executable, "-c", WORKER, lib, plat, name, src_path], env=env,
                       capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("XKBENCH "):
            res = json.loads(line[len("XKBENCH "):])
            if not res.get("ok"):
                raise RuntimeError("kernel result differs from NumPy")
            return res
    tail = (p.stderr or p.stdout).strip().splitlines()
    raise RuntimeError(f"worker exit {p.returncode}: " + (" ".join(tail[-3:]) if tail else "no output"))


def build_times(lib: str, plat: str, src: str, cold_repeats: int, hit_repeats: int,
                tmp_root: str) -> dict[str, Any]:
    """Cold builds, each in an empty cache, then fresh-process hits on the last one's cache."""
    src_path = os.path.join(tmp_root, f"{lib}_{plat}.src")
    Path(src_path).write_text(src)
    name = f"bench_{plat}"
    cold, hit, imports = [], [], []
    cache_dir = None
    for i in range(cold_repeats):
        cache_dir = tempfile.mkdtemp(prefix=f"{lib}-{plat}-cache{i}-", dir=tmp_root)
        r = run_worker(lib, plat, name, src_path, cache_dir, timeout=900)
        cold.append(r["load_s"])
        imports.append(r["import_s"])
    for _ in range(hit_repeats):
        r = run_worker(lib, plat, name, src_path, cache_dir, timeout=300)
        hit.append(r["load_s"])
        imports.append(r["import_s"])
    return {"cold_s": cold, "hit_s": hit, "import_s": imports}


def section_a(args, info, tmp_root: str) -> Table:
    t = Table("build", "a. Build and load: cold build (empty cache) and fresh-process cache hit",
              ["measurement", "xlakern", "BrainEvent", "BrainEvent / xlakern"],
              note=(f"Each figure is one `load_*_inline` call timed inside a fresh `python -c` process that has "
                    f"already imported jax, initialised its backends and imported the library. Medians: cold "
                    f"over {args.cold_repeats} empty caches, hit over {args.hit_repeats} processes. "
                    f"xlakern: `XLAKERN_CACHE_DIR`; BrainEvent: `BRAINEVENT_CACHE_DIR` (both temporary)."))
    plats = [("cpp", "C++", CPP_DECAY)]
    if info["gpu"]:
        plats.append(("cuda", "CUDA", CUDA_DECAY))
    for plat, label, src in plats:
        res: dict[str, Any] = {}
        for lib in ("xlakern", "brainevent"):
            if lib == "brainevent" and brainevent is None:
                res[lib] = NA_BE
                continue
            t0 = time.perf_counter()
            try:
                res[lib] = build_times(lib, plat, src, args.cold_repeats, args.hit_repeats, tmp_root)
            except Exception as e:  # noqa: BLE001
                res[lib] = err_cell(e)
            log(f"  a. {label} {lib}: {time.perf_counter() - t0:.1f} s")

        def cell(lib: str, key: str) -> tuple[str, float | None]:
            r = res[lib]
            if isinstance(r, str):
                return r, None
            m = statistics.median(r[key])
            return fmt_t(m), m

        for key, what in (("cold_s", f"{label} cold build, empty cache"),
                          ("hit_s", f"{label} fresh-process cache hit (load + register)"),
                          ("import_s", f"{label}: `import` of the library in those processes (not in the above)")):
            (cx, vx), (cb, vb) = cell("xlakern", key), cell("brainevent", key)
            t.add([what, cx, cb, ratio(vb, vx)],
                  {"platform": plat, "metric": key,
                   "xlakern": res["xlakern"] if isinstance(res["xlakern"], str) else res["xlakern"][key],
                   "brainevent": res["brainevent"] if isinstance(res["brainevent"], str) else res["brainevent"][key]})
    if not info["gpu"]:
        t.add(["CUDA cold build / cache hit", "skipped (JAX sees no GPU)", "skipped (JAX sees no GPU)", ""],
              {"platform": "cuda", "skipped": True})
    return t


# --------------------------------------------------------------------------------------------
# Sections b and c: timings inside this process
# --------------------------------------------------------------------------------------------

def ffi(target: str) -> Callable[..., Any]:
    def call(*arrays, **attrs):
        a0 = arrays[0]
        return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(a0.shape, a0.dtype))(*arrays, **attrs)

    return call


def decay_loop(step: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @jax.jit
    def run(v, x):
        return jax.lax.fori_loop(0, 100, lambda i, v: step(v, x), v)

    return run


def decay_ref(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    a = np.float32(DECAY_A)
    for _ in range(100):
        v = v * a + x
    return v


def section_b(args, info) -> list[Table]:
    tables = []
    cpu = jax.devices("cpu")[0]
    a32 = np.float32(DECAY_A)

    def decay_variants(platform: str, src: str, with_o3: bool):
        """(column, make) pairs; make() loads the module on first use and returns f(v, x)."""
        xk_load = xlakern.load_cpp_inline if platform == "cpp" else xlakern.load_cuda_inline

        def xk():
            name = f"xk_{platform}_decay"
            mod = loaded(name, lambda: xk_load(name, src, quiet=True))
            return lambda v, x: mod.decay(v, x, outs=jax.ShapeDtypeStruct(v.shape, v.dtype), a=DECAY_A)

        def be(name: str, **options):
            def make():
                be_load = brainevent.load_cpp_inline if platform == "cpp" else brainevent.load_cuda_inline
                loaded(name, lambda: be_load(name, src, **options))
                return lambda v, x: ffi(f"{name}.decay")(v, x, a=a32)
            return make

        yield "jnp", lambda: (lambda v, x: v * DECAY_A + x)
        yield "xlakern", xk
        yield "brainevent", be(f"be_{platform}_decay")
        if with_o3:
            yield "brainevent_O3", be(f"be_{platform}_decay_o3", extra_cflags=["-O3"])

    def run_table(t: Table, sizes: list[int], variants, device, be_cols: set[str]):
        for n in sizes:
            rng = np.random.default_rng(n)
            v0 = rng.standard_normal(n).astype(np.float32)
            x0 = rng.random(n).astype(np.float32)
            ref = decay_ref(v0, x0)
            v, x = jax.device_put(v0, device), jax.device_put(x0, device)
            cells, data, bad = [], {}, []
            for col, make in variants():
                if col in be_cols and brainevent is None:
                    cells.append(NA_BE)
                    data[col] = None
                    continue
                try:
                    f = decay_loop(make())
                    med, samples, out = time_fn(f, (v, x), args.runs)
                    if not np.allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4):
                        bad.append(col)
                    cells.append(fmt_t(med / 100))
                    data[col] = {"per_step_s": med / 100, "loop_samples_s": samples}
                except Exception as e:  # noqa: BLE001
                    cells.append(err_cell(e))
                    data[col] = {"error": cells[-1]}
            check = "ok (= NumPy)" if not bad else "MISMATCH: " + ", ".join(bad)
            t.add([f"N={n:,}", *cells, check], {"n": n, **data})
            log(f"  b. {t.key} N={n}: {' / '.join(cells)}")

    t = Table("step_cpp", "b. Per-step cost, C++ decay kernel `v = v*a + x` (float32), CPU",
              ["size", "jnp", "xlakern `load_cpp_inline`", "BrainEvent `load_cpp_inline`",
               "BrainEvent + `extra_cflags=['-O3']`", "check"],
              note=(f"Median of {args.runs} runs (after 3 warm-ups) of a jitted 100-step `lax.fori_loop`, "
                    "divided by 100. Same source for both libraries; BrainEvent's C++ build passes no -O flag "
                    "by default (xlakern builds with -O3), hence the extra column."))
    run_table(t, [1_000, 100_000], lambda: decay_variants("cpp", CPP_DECAY, True), cpu, {"brainevent", "brainevent_O3"})
    tables.append(t)

    if info["gpu"]:
        gpu = [d for d in jax.devices() if d.platform == "gpu"][0]
        t = Table("step_cuda", f"b. Per-step cost, CUDA decay kernel `v = v*a + x` (float32), {info['gpu']}",
                  ["size", "jnp", "xlakern `load_cuda_inline`", "BrainEvent `load_cuda_inline`", "check"],
                  note=(f"Median of {args.runs} runs (after 3 warm-ups) of a jitted 100-step `lax.fori_loop`, "
                        "divided by 100. The kernel launches on the `int64_t stream` argument; 256 threads a block."))
        run_table(t, [10_000, 1_000_000, 16_000_000], lambda: decay_variants("cuda", CUDA_DECAY, False), gpu, {"brainevent"})
        tables.append(t)
    else:
        t = Table("step_cuda", "b. Per-step cost, CUDA decay kernel", ["size", "jnp", "xlakern", "BrainEvent"])
        t.add(["N=10k, 1M, 16M", "skipped (JAX sees no GPU)", "skipped", "skipped"], {"skipped": True})
        tables.append(t)
    return tables


def section_c(args, info) -> Table:
    n = 4_000_000
    cpu = jax.devices("cpu")[0]
    t = Table("parallel_for", f"c. One jitted call of a C++ elementwise kernel `out = x + 1` (float32), N={n:,}, CPU",
              ["size", "jnp", "xlakern `xk::parallel_for`", "xlakern serial loop", "BrainEvent serial loop",
               "BrainEvent serial loop + `-O3`", "check"],
              note=(f"Median of {args.runs} jitted calls from Python (after 3 warm-ups), dispatch included. "
                    f"BrainEvent has no parallel_for, so its kernel is the plain serial loop; the xlakern serial "
                    f"column runs that very source. {info['cpu_cores_usable']} usable cores."))
    x0 = np.random.default_rng(0).random(n).astype(np.float32)
    ref = x0 + np.float32(1)
    x = jax.device_put(x0, cpu)

    def sd(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    variants = [
        ("jnp", False, lambda: (lambda x: x + 1.0)),
        ("xlakern_parallel_for", False, lambda: (lambda m: (lambda x: m.add_one(x, outs=sd(x))))(
            loaded("xk_add_par", lambda: xlakern.load_cpp_inline("xk_add_par", CPP_ADD_ONE_PARALLEL, quiet=True)))),
        ("xlakern_serial", False, lambda: (lambda m: (lambda x: m.add_one(x, outs=sd(x))))(
            loaded("xk_add_ser", lambda: xlakern.load_cpp_inline("xk_add_ser", CPP_ADD_ONE_SERIAL, quiet=True)))),
        ("brainevent_serial", True, lambda: (loaded("be_add_ser", lambda: brainevent.load_cpp_inline(
            "be_add_ser", CPP_ADD_ONE_SERIAL)), ffi("be_add_ser.add_one"))[1]),
        ("brainevent_serial_O3", True, lambda: (loaded("be_add_ser_o3", lambda: brainevent.load_cpp_inline(
            "be_add_ser_o3", CPP_ADD_ONE_SERIAL, extra_cflags=["-O3"])), ffi("be_add_ser_o3.add_one"))[1]),
    ]
    cells, data, bad = [], {}, []
    for col, is_be, make in variants:
        if is_be and brainevent is None:
            cells.append(NA_BE)
            data[col] = None
            continue
        cell, data[col], ok = timed_call_cell(lambda: jax.jit(make()), (x,), args.runs,
                                              lambda out: np.array_equal(np.asarray(out), ref))
        cells.append(cell)
        if ok is False:
            bad.append(col)
    check = "ok (= NumPy)" if not bad else "MISMATCH: " + ", ".join(bad)
    t.add([f"N={n:,}", *cells, check], {"n": n, **data})
    log(f"  c. N={n}: {' / '.join(cells)}")
    return t


# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the tables (and raw samples) as JSON")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per figure in b and c (default 30, min 20)")
    ap.add_argument("--cold-repeats", type=int, default=3, help="cold builds per module (default 3)")
    ap.add_argument("--hit-repeats", type=int, default=5, help="fresh-process cache hits per module (default 5)")
    ap.add_argument("--sections", default="abc", help="which sections to run (default abc)")
    args = ap.parse_args()
    args.runs = max(args.runs, 20)
    args.hit_repeats = max(args.hit_repeats, 5)
    args.cold_repeats = max(args.cold_repeats, 1)

    t_start = time.perf_counter()
    info = machine_info()
    print_header("xlakern vs BrainEvent: foundation benchmarks", info)

    tmp_root = tempfile.mkdtemp(prefix="xkbench-")
    try:
        steps = [("a", lambda: [section_a(args, info, tmp_root)]),
                 ("b", lambda: section_b(args, info)),
                 ("c", lambda: [section_c(args, info)])]
        tables = run_sections((key, fn) for key, fn in steps if key in args.sections)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)

    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
