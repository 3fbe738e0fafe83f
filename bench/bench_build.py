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
  hit     a load of the unchanged directory (median over --repeats);
  other   the first load of a second 4-file directory (other functions, another module) with the same
          cache: what each new module of a user's costs once the library has built one.

Then the first call of a Numba kernel (``numba_kernel``, and ``numba_cuda_kernel`` with a GPU)
in a fresh process: with empty caches, and in the following processes.

Every figure is the time of the load call alone, inside its own ``python -c`` subprocess that
has already imported jax, initialised its backends and imported the library.

Libraries: xlakern (``load_cpp_dir`` / ``load_cuda_dir``), BrainEvent 0.3.0 (its
``load_cuda_dir``; it has no ``load_cpp_dir``, so its C++ column passes the four files' text to
``load_cpp_inline`` as its ``load_cuda_dir`` does for CUDA) and ``torch.utils.cpp_extension.load``
(a plain shared library, ``is_python_module=False``, ninja-built, with xlakern's headers
force-included so the same files compile). Each file's helper has a name of its own, because
BrainEvent compiles a directory's files as one translation unit. A column whose library is not importable is skipped.
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

template <typename T> static T {fn}_scale(T v, T f) {{ return f * v / (T(1) + std::fabs(v)); }}

// @BE {fn} arg ret
void {fn}(const BE::Tensor x, BE::Tensor out) {{
  const float* in = static_cast<const float*>(x.data_ptr());
  float* o = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = {fn}_scale(in[i], {factor}f);
}}
"""

CUDA_FILE = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

template <typename T> __device__ T {fn}_scale(T v, T f) {{ return f * v / (T(1) + fabsf(v)); }}

__global__ void {fn}_kernel(const float* x, float* o, int n) {{
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) o[k] = {fn}_scale(x[k], {factor}f);
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

# The kernels of the Numba first-call figures, written to a file so Numba's own cache=True can
# keep them (it caches only functions defined in files).
NUMBA_KERNELS = r"""
import numba
from numba import cuda


@numba.njit(cache=True)
def leak(v, i, out):
    for k in range(v.size):
        out[k] = v[k] * 0.95 + i[k]


@cuda.jit(cache=True)
def leak_cuda(v, i, out):
    k = cuda.grid(1)
    if k < v.size:
        out[k] = v[k] * 0.95 + i[k]
"""

NUMBA_WORKER = r"""
import json, sys, time
import numpy as np
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
import jax
lib, kind, kdir = sys.argv[1], sys.argv[2], sys.argv[3]
jax.devices()
sys.path.insert(0, kdir)
if lib == "xlakern":
    import xlakern as L
elif lib == "brainevent":
    import brainevent as L
import leak_kernels as K
dev = jax.devices("cpu" if kind == "cpu" else "gpu")[0]
v = jax.device_put(np.random.default_rng().standard_normal(4096).astype(np.float32), dev)
i = jax.device_put(np.random.default_rng().standard_normal(4096).astype(np.float32), dev)
out = jax.ShapeDtypeStruct(v.shape, v.dtype)
vn, i_n = np.asarray(v), np.asarray(i)
if lib == "numba" and kind == "gpu":  # Numba's own floor: its arrays, its launch
    from numba import cuda
    dv, di, dout = cuda.to_device(vn), cuda.to_device(i_n), cuda.device_array_like(vn)
t = time.perf_counter()
if lib == "numba":
    if kind == "cpu":
        y = np.empty_like(vn)
        K.leak(vn, i_n, y)
    else:
        K.leak_cuda[(vn.size + 255) // 256, 256](dv, di, dout)
        cuda.synchronize()
elif kind == "cpu":
    f = L.numba_kernel(K.leak, outs=out)
    y = jax.block_until_ready(f(v, i))
else:
    f = L.numba_cuda_kernel(K.leak_cuda, outs=out, launch_dims=v.shape[0])
    y = jax.block_until_ready(f(v, i))
load_s = time.perf_counter() - t
if lib == "numba" and kind == "gpu":
    y = dout.copy_to_host()
ok = bool(np.allclose(np.asarray(y), vn * 0.95 + i_n, rtol=1e-5, atol=1e-6))
print("XKBENCH " + json.dumps({"load_s": load_s, "ok": ok}), flush=True)
"""


def available(lib: str) -> str | None:
    """None when ``lib`` can run here, else why not."""
    if lib == "brainevent":
        return BE_ERROR if brainevent is None else None
    if lib == "torch":
        return None if importlib.util.find_spec("torch") else "n/a (torch not installed)"
    return None


def run_worker(lib: str, kind: str, directory: Path, name: str, factors: dict, env: dict,
               script: str = WORKER) -> float:
    p = subprocess.run([sys.executable, "-c", script, lib, kind, str(directory), name, json.dumps(factors)],
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

    def write_files(where: Path, factors: dict[str, float]) -> None:
        for fn, f in factors.items():
            (where / f"{fn}{ext}").write_text(template.format(fn=fn, factor=f))

    factors = {f"k{i}": float(i + 2) for i in range(4)}
    write_files(directory, factors)
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
    write_files(directory, {"k2": -1.5})
    out["edit_s"] = run_worker(lib, kind, directory, name, factors, env)
    out["hit_s"] = [run_worker(lib, kind, directory, name, factors, env) for _ in range(repeats)]
    other = root / "other_kernels"
    other.mkdir()
    other_factors = {f"k{i}": float(i + 2) for i in range(4, 8)}
    write_files(other, other_factors)
    out["other_s"] = run_worker(lib, kind, other, f"bench_{kind}_other", other_factors, env)
    return out


def section(kind: str, repeats: int, tmp_root: str) -> list[Table]:
    title = {"cpp": "4-file C++ directory (CPU)", "cuda": "4-file CUDA directory"}[kind]
    libs = [lib for lib in LIBS if available(lib) is None]
    skipped = [f"{lib}: {available(lib)}" for lib in LIBS if available(lib) is not None]
    note = (f"Load call only, each in a fresh process; hit: median of {repeats}. "
            + (f"Skipped: {'; '.join(skipped)}." if skipped else ""))
    t = Table(f"build_{kind}", title, ["measurement", *libs], note)
    cells: dict[str, dict[str, str]] = {m: {} for m in ("cold", "edit", "hit", "other")}
    data: dict[str, Any] = {}
    for lib in libs:
        log(f"{kind}: {lib}")
        try:
            r = scenario(lib, kind, repeats, tmp_root)
            data[lib] = r
            cells["cold"][lib], cells["edit"][lib] = fmt_t(r["cold_s"]), fmt_t(r["edit_s"])
            cells["hit"][lib] = fmt_t(statistics.median(r["hit_s"]))
            cells["other"][lib] = fmt_t(r["other_s"])
        except Exception as e:  # noqa: BLE001 -- the cell says what failed
            for m in cells:
                cells[m][lib] = err_cell(e)
    labels = {"cold": "cold build (empty cache)", "edit": "one of 4 files edited", "hit": "fresh-process cache hit",
              "other": "another 4-file module, same cache"}
    for m, label in labels.items():
        t.add([label, *(cells[m][lib] for lib in libs)], {"measurement": m, **data})
    return [t]


def numba_section(repeats: int, tmp_root: str, gpu: bool) -> list[Table]:
    """First call of a Numba kernel in a fresh process: with empty caches, then with warm ones."""
    libs = [lib for lib in ("xlakern", "brainevent", "numba") if available(lib) is None]
    kinds = ["cpu"] + (["gpu"] if gpu else [])
    t = Table("build_numba", "First Numba kernel call in a fresh process",
              ["kernel", "measurement", *libs],
              f"Wrapping the kernel plus its first call, inside a fresh process that has imported jax and the "
              f"library; the kernels are @njit(cache=True) / @cuda.jit(cache=True) in a file. first: empty "
              f"Numba and library caches; again: the next processes (median of {repeats}). numba: the kernel "
              f"called by Numba itself on NumPy / Numba device arrays (no JAX): Numba's own first-call floor.")
    for kind in kinds:
        cells: dict[str, dict[str, str]] = {"first": {}, "again": {}}
        data: dict[str, Any] = {}
        for lib in libs:
            log(f"numba {kind}: {lib}")
            try:
                root = Path(tempfile.mkdtemp(prefix=f"numba-{lib}-{kind}-", dir=tmp_root))
                (root / "leak_kernels.py").write_text(NUMBA_KERNELS)
                env = dict(os.environ, XLAKERN_CACHE_DIR=str(root / "xk-cache"),
                           BRAINEVENT_CACHE_DIR=str(root / "be-cache"), NUMBA_CACHE_DIR=str(root / "numba-cache"),
                           XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
                env.pop("XLAKERN_QUIET", None)
                first = run_worker(lib, kind, root, "-", {}, env, NUMBA_WORKER)
                again = [run_worker(lib, kind, root, "-", {}, env, NUMBA_WORKER) for _ in range(repeats)]
                data[f"{lib}_{kind}"] = {"first_s": first, "again_s": again}
                cells["first"][lib], cells["again"][lib] = fmt_t(first), fmt_t(statistics.median(again))
            except Exception as e:  # noqa: BLE001 -- the cell says what failed
                cells["first"][lib] = cells["again"][lib] = err_cell(e)
        label = "numba_kernel (CPU)" if kind == "cpu" else "numba_cuda_kernel (GPU)"
        for m, text in (("first", "first process (empty caches)"), ("again", "next process")):
            t.add([label, text, *(cells[m][lib] for lib in libs)], {"kind": kind, "measurement": m, **data})
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
        sections = [(k, lambda k=k: section(k, args.repeats, tmp_root)) for k in kinds]
        sections.append(("numba", lambda: numba_section(args.repeats, tmp_root, bool(info["gpu"]))))
        tables = run_sections(sections)
    finish(t_start, info, tables, args.json)


if __name__ == "__main__":
    main()
