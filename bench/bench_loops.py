"""Per-step cost of xlakern kernels inside jitted GPU loops (issue 11), beside jnp and BrainEvent.

Each figure is the median over ``--runs`` runs of one jitted ``lax.fori_loop`` (or ``lax.scan``)
of ``--steps`` steps, divided by the step count. A step is one elementwise update ``v*0.9 + x``
(or a three-kernel LIF step). The script runs itself once per flag mode in a fresh process,
because XLA reads ``XLA_FLAGS`` when its backend starts:

- ``default``: XLA's own flags;
- ``graph``: the flags ``xlakern.config.enable_cuda_graph_loops()`` sets (whole loops as CUDA
  graphs), set by that very call in the child process.

Usage (GPU machine)::

    python bench/bench_loops.py                  # both modes, tables on stdout
    python bench/bench_loops.py --dump DIR       # also dump XLA's optimised HLO of N=4k loops
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

EXTRA_MODES = {
    # Investigation modes: each isolates one flag of the graph mode (bench/RESULTS.md).
    "while_only": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL",
    "min1_only": "--xla_gpu_graph_min_graph_size=1",
    "while_min1": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL "
                  "--xla_gpu_graph_min_graph_size=1",
    # graph mode with XLA's default (serial) command-buffer scheduling
    "graph_serial": "--xla_gpu_command_buffer_scheduling_mode=SERIALIZE",
}
SIZES = (4_000, 100_000, 1_000_000)
LOOPS = ("fori", "scan", "while")
LOOP_NAMES = {"fori": "fori_loop", "scan": "scan", "while": "while_loop (trip count known only at run time)"}

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

__global__ void decay_kernel(const float* v, const float* x, float* out, float a, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v[i] * a + x[i];
}
__global__ void spike_kernel(const float* v, float th, float* spk, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) spk[i] = v[i] >= th ? 1.0f : 0.0f;
}
__global__ void reset_kernel(const float* v, const float* spk, float vr, float* out, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = spk[i] > 0.0f ? vr : v[i];
}
static unsigned blocks(int64_t n) { return (unsigned)((n + 255) / 256); }

// @BE decay arg arg ret attr.a:float32 stream
void decay(const BE::Tensor v, const BE::Tensor x, BE::Tensor out, float a, int64_t stream) {
  const int64_t n = v.numel();
  if (n == 0) return;
  decay_kernel<<<blocks(n), 256, 0, (cudaStream_t)stream>>>(
      static_cast<const float*>(v.data_ptr()), static_cast<const float*>(x.data_ptr()),
      static_cast<float*>(out.data_ptr()), a, n);
}

// @BE spike arg ret attr.th:float32 stream
void spike(const BE::Tensor v, BE::Tensor spk, float th, int64_t stream) {
  const int64_t n = v.numel();
  if (n == 0) return;
  spike_kernel<<<blocks(n), 256, 0, (cudaStream_t)stream>>>(
      static_cast<const float*>(v.data_ptr()), th, static_cast<float*>(spk.data_ptr()), n);
}

// @BE reset arg arg ret attr.vr:float32 stream
void reset(const BE::Tensor v, const BE::Tensor spk, BE::Tensor out, float vr, int64_t stream) {
  const int64_t n = v.numel();
  if (n == 0) return;
  reset_kernel<<<blocks(n), 256, 0, (cudaStream_t)stream>>>(
      static_cast<const float*>(v.data_ptr()), static_cast<const float*>(spk.data_ptr()), vr,
      static_cast<float*>(out.data_ptr()), n);
}
"""

A, TH, VR = 0.9, 1.0, 0.0


def child(mode: str, runs: int, steps: int, dump: str | None, out_json: str) -> None:
    import numpy as np

    import xlakern

    if mode.startswith("graph"):
        xlakern.config.enable_cuda_graph_loops()
        if mode in EXTRA_MODES:  # a variation of the graph mode: its flags override the helper's
            names = {f.split("=")[0] for f in EXTRA_MODES[mode].split()}
            kept = [f for f in os.environ["XLA_FLAGS"].split() if f.split("=")[0] not in names]
            os.environ["XLA_FLAGS"] = " ".join(kept + EXTRA_MODES[mode].split())

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # numba-cuda 0.30.4 on NumPy 2.5
    import jax
    import jax.numpy as jnp
    from numba import cuda

    try:
        import brainevent
    except Exception:  # noqa: BLE001
        brainevent = None

    gpu = jax.devices("gpu")[0]
    mod = xlakern.load_cuda_inline("bench_loops", CUDA_SRC, quiet=True)
    be_mod = None
    if brainevent is not None:
        try:
            brainevent.load_cuda_inline("be_bench_loops", CUDA_SRC)
            be_mod = "be_bench_loops"
        except Exception as e:  # noqa: BLE001
            print(f"brainevent load failed: {e}", file=sys.stderr)

    @cuda.jit
    def nb_decay(v, x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = v[i] * 0.9 + x[i]

    def sds(v):
        return jax.ShapeDtypeStruct(v.shape, v.dtype)

    def xk_decay(v, x):
        return mod.decay(v, x, outs=sds(v), a=A)

    def xk_decay_alias(v, x):
        return mod.decay(v, x, outs=sds(v), a=A, input_output_aliases={0: 0})

    def nb_step(v, x):
        return xlakern.numba_cuda_kernel(nb_decay, outs=sds(v), launch_dims=v.shape[0])(v, x)

    def nb_step_alias(v, x):
        return xlakern.numba_cuda_kernel(nb_decay, outs=sds(v), launch_dims=v.shape[0],
                                         input_output_aliases={0: 0})(v, x)

    def be_step(v, x):
        return jax.ffi.ffi_call(f"{be_mod}.decay", sds(v))(v, x, a=np.float32(A))

    # A LIF step: input current (jnp glue), decay, threshold, reset.
    def lif_jnp(v, x):
        v = v * A + x * 1.5
        spk = (v >= TH).astype(v.dtype)
        return jnp.where(spk > 0, VR, v)

    def lif_xk(v, x, alias=False):
        al = {0: 0} if alias else None
        v = mod.decay(v, x * 1.5, outs=sds(v), a=A, input_output_aliases=al)
        spk = mod.spike(v, outs=sds(v), th=TH)
        return mod.reset(v, spk, outs=sds(v), vr=VR, input_output_aliases=al)

    variants = [
        ("jnp", lambda v, x: v * A + x, "decay"),
        ("xk_cuda", xk_decay, "decay"),
        ("xk_cuda_alias", xk_decay_alias, "decay"),
        ("xk_numba", nb_step, "decay"),
        ("xk_numba_alias", nb_step_alias, "decay"),
        ("xk_cuda_then_jnp", lambda v, x: xk_decay(v, x) * 1.0000001, "decay_mul"),
        ("lif_jnp", lif_jnp, "lif"),
        ("lif_xk3", lif_xk, "lif"),
        ("lif_xk3_alias", lambda v, x: lif_xk(v, x, True), "lif"),
    ]
    if be_mod is not None:
        variants.append(("be_cuda", be_step, "decay"))

    def reference(kind, v, x):
        v = v.astype(np.float64)
        x = x.astype(np.float64)
        for _ in range(steps):
            if kind == "decay":
                v = v * A + x
            elif kind == "decay_mul":
                v = (v * A + x) * 1.0000001
            else:  # float32, as the kernels compute it
                v = (v.astype(np.float32) * np.float32(A) + x.astype(np.float32) * np.float32(1.5))
                v = np.where(v >= np.float32(TH), np.float32(VR), v)
        return v

    def matches(kind, out, ref):
        if kind == "lif":  # threshold crossings amplify rounding: compare element by element
            return float(np.mean(np.abs(out - ref) > 1e-3))
        return float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-30))

    results = []
    for n in SIZES:
        rng = np.random.default_rng(n)
        v0 = jax.device_put(rng.standard_normal(n).astype(np.float32), gpu)
        x0 = jax.device_put((rng.random(n) * 0.2).astype(np.float32), gpu)
        refs = {}
        for name, step, kind in variants:
            for loop in LOOPS:
                if loop == "fori":
                    def run(v, x, n_steps, step=step):
                        return jax.lax.fori_loop(0, steps, lambda i, v: step(v, x), v)
                elif loop == "scan":
                    def run(v, x, n_steps, step=step):
                        return jax.lax.scan(lambda v, _: (step(v, x), None), v, None, length=steps)[0]
                else:  # a while_loop whose trip count is only known at run time
                    def run(v, x, n_steps, step=step):
                        return jax.lax.while_loop(lambda c: c[0] < n_steps, lambda c: (c[0] + 1, step(c[1], x)),
                                                  (jnp.int32(0), v))[1]
                run.__name__ = f"loop_{loop}_{name}_{n}"
                f = jax.jit(run)
                args = (v0, x0, jnp.int32(steps))
                try:
                    out = np.asarray(jax.block_until_ready(f(*args)))
                    if kind not in refs:
                        refs[kind] = reference(kind, np.asarray(v0), np.asarray(x0))
                    err = matches(kind, out, refs[kind])
                    for _ in range(2):
                        jax.block_until_ready(f(*args))
                    samples = []
                    for _ in range(runs):
                        t = time.perf_counter()
                        jax.block_until_ready(f(*args))
                        samples.append(time.perf_counter() - t)
                    med = statistics.median(samples) / steps
                    results.append(dict(mode=mode, n=n, loop=loop, variant=name, per_step_us=med * 1e6,
                                        err=err, ok=err < (1e-2 if kind == "lif" else 1e-4)))
                except Exception as e:  # noqa: BLE001
                    results.append(dict(mode=mode, n=n, loop=loop, variant=name, error=f"{type(e).__name__}: "
                                        f"{str(e)[:200]}"))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    with open(out_json, "w") as fh:
        json.dump(results, fh)


def table(results: list[dict], loop: str, modes: list[str]) -> str:
    variants = []
    for r in results:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    lines = [f"| mode | N | {' | '.join(variants)} |", "|---|---|" + "---|" * len(variants)]
    for mode in modes:
        for n in SIZES:
            cells = []
            for v in variants:
                r = next((r for r in results if r["mode"] == mode and r["n"] == n and r["loop"] == loop
                          and r["variant"] == v), None)
                if r is None:
                    cells.append("")
                elif "error" in r:
                    cells.append("error: " + r["error"][:60].replace("|", "/"))
                else:
                    cells.append(f"{r['per_step_us']:.2f}" + ("" if r["ok"] else " (WRONG)"))
            lines.append(f"| {mode} | {n:,} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write all results as JSON here")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--modes", default="default,graph", help="comma list of: default, graph, " +
                    ", ".join(EXTRA_MODES))
    ap.add_argument("--dump", help="directory for XLA's HLO dumps (default mode and graph mode)")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.runs, args.steps, args.dump, args.json)
        return
    modes = args.modes.split(",")
    results = []
    t0 = time.time()
    for mode in modes:
        env = dict(os.environ)
        flags = env.get("XLA_FLAGS", "")
        if mode in EXTRA_MODES:
            flags += " " + EXTRA_MODES[mode]
        if args.dump:
            d = os.path.join(args.dump, mode)
            flags += f" --xla_dump_to={d} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*_4000"
        env["XLA_FLAGS"] = flags.strip()
        path = f"/tmp/bench_loops_{mode}_{os.getpid()}.json"
        subprocess.run([sys.executable, __file__, "--child", mode, "--json", path, "--runs", str(args.runs),
                        "--steps", str(args.steps)], env=env, check=True)
        with open(path) as fh:
            results += json.load(fh)
    import jax

    print(f"\n## Per-step cost in a jitted {args.steps}-step loop (µs, median of {args.runs} runs)\n")
    import xlakern

    print(f"Device: {jax.devices()[0].device_kind}; jax {jax.__version__}; graph flags: "
          f"`{xlakern.config.cuda_graph_loop_flags()}`\n")
    for loop in LOOPS:
        print(f"### lax.{LOOP_NAMES[loop]}\n")
        print(table(results, loop, modes))
        print()
    print(f"_Total: {time.time() - t0:.0f} s_")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
