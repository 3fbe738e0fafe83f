#!/usr/bin/env python3
"""Build engine: cold build, one-file-edited rebuild and fresh-process hit of a 4-file module.

Usage::

    python bench/bench_build.py                  # Markdown tables on stdout
    python bench/bench_build.py --json out.json  # ... and the same tables as JSON
    python bench/bench_build.py --repeats 3      # hits timed 3 times (median)

For a 4-file C++ directory (CPU) and, where nvcc exists, a 4-file CUDA directory, each library
in turn, in a fresh source directory and an empty cache:

  cold    the first load (every file compiled, then linked);
  edit    the load after one of the four files was edited (a constant changed);
  hit     a load of the unchanged directory (median over --repeats).

Every figure is the time of the load call alone, inside its own ``python -c`` subprocess that
has already imported jax, initialised its backends and imported the library.

Libraries: xlakern (``load_cpp_dir`` / ``load_cuda_dir``), BrainEvent 0.3.0 (its
``load_cuda_dir``; it has no ``load_cpp_dir``, so its C++ column passes the four files' text to
``load_cpp_inline`` as its ``load_cuda_dir`` does for CUDA) and ``torch.utils.cpp_extension.load``
(a plain shared library, ``is_python_module=False``, ninja-built, with xlakern's headers
force-included so the same files compile). A column whose library is not importable is skipped.
xlakern's and BrainEvent's results are checked against NumPy after each load (not timed); torch
builds only (it does not call the kernels).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _benchlib import BE_ERROR, Table, brainevent, err_cell, finish, fmt_t, log, machine_info, print_header, \
    run_sections

import jax

import xlakern

CPP_FILE = r"""
#include <cmath>
#include "brainevent/common.h"

template <typename T> static T softsign_scale(T v, T f) {{ return f * v / (T(1) + std::fabs(v)); }}

// @BE {fn} arg ret
void {fn}(const BE::Tensor x, BE::Tensor out) {{
  const float* in = static_cast<const float*>(x.data_ptr());
  float* o = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = softsign_scale(in[i], {factor}f);
}}
"""

CUDA_FILE = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

template <typename T> __device__ T softsign_scale(T v, T f) {{ return f * v / (T(1) + fabsf(v)); }}

__global__ void {fn}_kernel(const float* x, float* o, int n) {{
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) o[k] = softsign_scale(x[k], {factor}f);
}}

// @BE {fn} arg ret stream
void {fn}(const BE::Tensor x, BE::Tensor out, int64_t stream) {{
  int n = x.numel();
  {fn}_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(
      static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), n);
}}
"""

WORKER = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
import jax
lib, kind, directory, name, factors = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
jax.devices()
ext = ".cc" if kind == "cpp" else ".cu"
files = sorted(directory.glob("*" + ext))
if lib == "xlakern":
    import xlakern as L
    load = lambda: (L.load_cpp_dir if kind == "cpp" else L.load_cuda_dir)(directory, name=name, quiet=True)
elif lib == "brainevent":
    import brainevent as L
    if kind == "cpp":  # BrainEvent has no load_cpp_dir
        load = lambda: L.load_cpp_inline(name, [f.read_text() for f in files])
    else:
        load = lambda: L.load_cuda_dir(directory, name=name)
else:
    import torch.utils.cpp_extension as L
    import xlakern
    flags = ["-include", "xlakern/xlakern.h"]
    load = lambda: L.load(name, [str(f) for f in files], extra_cflags=flags, extra_cuda_cflags=flags,
                          extra_include_paths=[str(xlakern.include_dir()), jax.ffi.include_dir()],
                          build_directory=os.environ["TORCH_BUILD_DIR"], is_python_module=False, verbose=False)
t = time.perf_counter()
load()
load_s = time.perf_counter() - t
ok = None
has_gpu = any(d.platform == "gpu" for d in jax.devices())
if lib != "torch" and (kind == "cpp" or has_gpu):  # not timed: each kernel against NumPy
    dev = jax.devices("cpu")[0] if kind == "cpp" else jax.devices("gpu")[0]
    x = np.random.default_rng().standard_normal(1000).astype(np.float32)
    xj = jax.device_put(x, dev)
    ok = True
    for fn, f in factors.items():
        y = jax.ffi.ffi_call(f"{name}.{fn}", jax.ShapeDtypeStruct(x.shape, x.dtype))(xj)
        ok = ok and bool(np.allclose(np.asarray(y), f * x / (1 + np.abs(x)), rtol=1e-5, atol=1e-6))
print("XKBENCH " + json.dumps({"load_s": load_s, "ok": ok}), flush=True)
"""

LIBS = ("xlakern", "brainevent", "torch")


def available(lib: str) -> str | None:
    """None when ``lib`` can run here, else why not."""
    if lib == "brainevent":
        return BE_ERROR if brainevent is None else None
    if lib == "torch":
        return None if importlib.util.find_spec("torch") else "n/a (torch not installed)"
    return None


def run_worker(lib: str, kind: str, directory: Path, name: str, factors: dict, env: dict) -> float:
    p = subprocess.run([sys.executable, "-c", WORKER, lib, kind, str(directory), name, json.dumps(factors)],
                       env=env, capture_output=True, text=True, timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("XKBENCH "):
            res = json.loads(line[len("XKBENCH "):])
            if res["ok"] is False:
                raise RuntimeError("kernel result differs from NumPy")
            return res["load_s"]
    tail = (p.stderr or p.stdout).strip().splitlines()
    raise RuntimeError(f"worker exit {p.returncode}: " + (" ".join(tail[-3:]) if tail else "no output"))


def scenario(lib: str, kind: str, repeats: int, tmp_root: str) -> dict[str, Any]:
    """Cold build, one-file-edited rebuild and fresh-process hits for one library and kind."""
    root = Path(tempfile.mkdtemp(prefix=f"{lib}-{kind}-", dir=tmp_root))
    directory = root / "kernels"
    directory.mkdir()
    template, ext = (CPP_FILE, ".cc") if kind == "cpp" else (CUDA_FILE, ".cu")
    factors = {f"k{i}": float(i + 2) for i in range(4)}
    for fn, f in factors.items():
        (directory / f"{fn}{ext}").write_text(template.format(fn=fn, factor=f))
    env = dict(os.environ, XLAKERN_CACHE_DIR=str(root / "xk-cache"), BRAINEVENT_CACHE_DIR=str(root / "be-cache"),
               TORCH_BUILD_DIR=str(root / "torch-build"), TORCH_EXTENSIONS_DIR=str(root / "torch-ext"),
               XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
    env.pop("XLAKERN_QUIET", None)
    (root / "torch-build").mkdir()
    if kind == "cuda" and not xlakern._toolchain.gpu_compute_capability():
        env.setdefault("XLAKERN_CUDA_ARCH", "90")
    name = f"bench_{kind}_dir"
    out: dict[str, Any] = {"cold_s": run_worker(lib, kind, directory, name, factors, env)}
    time.sleep(1.1)  # a later edit must get a new mtime on coarse-timestamp file systems
    factors["k2"] = -1.5
    (directory / f"k2{ext}").write_text(template.format(fn="k2", factor=-1.5))
    out["edit_s"] = run_worker(lib, kind, directory, name, factors, env)
    out["hit_s"] = [run_worker(lib, kind, directory, name, factors, env) for _ in range(repeats)]
    return out


def section(kind: str, repeats: int, tmp_root: str) -> list[Table]:
    title = {"cpp": "4-file C++ directory (CPU)", "cuda": "4-file CUDA directory"}[kind]
    libs = [lib for lib in LIBS if available(lib) is None]
    skipped = [f"{lib}: {available(lib)}" for lib in LIBS if available(lib) is not None]
    note = (f"Load call only, each in a fresh process; hit: median of {repeats}. "
            + (f"Skipped: {'; '.join(skipped)}." if skipped else ""))
    t = Table(f"build_{kind}", title, ["measurement", *libs], note)
    cells: dict[str, dict[str, str]] = {m: {} for m in ("cold", "edit", "hit")}
    data: dict[str, Any] = {}
    for lib in libs:
        log(f"{kind}: {lib}")
        try:
            r = scenario(lib, kind, repeats, tmp_root)
            data[lib] = r
            cells["cold"][lib], cells["edit"][lib] = fmt_t(r["cold_s"]), fmt_t(r["edit_s"])
            cells["hit"][lib] = fmt_t(statistics.median(r["hit_s"]))
        except Exception as e:  # noqa: BLE001 -- the cell says what failed
            for m in cells:
                cells[m][lib] = err_cell(e)
    labels = {"cold": "cold build (empty cache)", "edit": "one of 4 files edited", "hit": "fresh-process cache hit"}
    for m, label in labels.items():
        t.add([label, *(cells[m][lib] for lib in libs)], {"measurement": m, **data})
    return [t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the tables as JSON here")
    ap.add_argument("--repeats", type=int, default=3, help="fresh-process hits to time (median)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    info = machine_info()
    print_header("Build engine: cold, one-file edit, fresh-process hit", info)
    try:
        xlakern._toolchain.find_nvcc()
        kinds = ["cpp", "cuda"]
    except xlakern.ToolchainError:
        kinds = ["cpp"]
    with tempfile.TemporaryDirectory(prefix="xk-bench-build-") as tmp_root:
        tables = run_sections([(k, lambda k=k: section(k, args.repeats, tmp_root)) for k in kinds])
    finish(t_start, info, tables, args.json)


if __name__ == "__main__":
    main()
