#!/usr/bin/env python3
"""xlakern vs BrainEvent, side by side in one run: Numba kernels called from JAX.

Usage::

    python bench/bench_numba.py                        # Markdown tables on stdout
    python bench/bench_numba.py --json out.json        # ... and the same tables (plus raw samples) as JSON
    python bench/bench_numba.py --sections cpu,eager   # a subset (cpu, gpu, eager)

Sections (every figure is a median over repeats):

  cpu.   Per-step cost of one leaky integrate-and-fire Euler step (float32) inside a jitted
         200-step ``lax.fori_loop`` at N=1e3, 1e5 and 4e6, on the CPU:
         ``V_new = V + dt*(-(V - V_rest)*tau_inv + I)``, ``spike = V_new >= V_th``,
         ``V_out = where(spike, V_rest, V_new)``; the loop carries V (and the last spikes).
         Rows: jnp; xlakern ``numba_kernel`` of the tutorial's ``@numba.njit(parallel=True)``
         ``prange`` kernel and of the same body as a serial ``@numba.njit`` loop; xlakern
         ``load_cpp_inline`` of the same step in C++ with ``xk::parallel_for`` and as a serial
         loop (BrainEvent spelling); BrainEvent ``numba_kernel`` of the parallel kernel. The
         kernels take V, I and the scalar parameters as (1,)-arrays (tau_inv, V_th, V_rest, dt)
         and write V_out (float32) and spikes (int32). A derived table gives the fixed cost of
         each Numba variant at N=1e3 (its per-step time minus that of the serial C++ kernel).
  gpu.   (Only when JAX sees a GPU.) Per-step cost of the LIF detect+reset step
         ``spikes[i] = V[i] >= V_th[0]; V_out[i] = V_rest[0] if spikes[i] else V[i]`` inside a
         jitted 100-step ``lax.fori_loop`` at N=1e4, 1e6 and 1.6e7; the loop carries
         ``V = V_out + 0.5``. Rows: jnp; xlakern ``numba_cuda_kernel`` (one fused kernel,
         ``launch_dims=N``); xlakern ``numba_cuda_callable`` (the tutorial's two kernels, detect
         then reset, launched on XLA's stream); xlakern ``load_cuda_inline`` (the fused kernel in
         CUDA C++, launched on the ``stream`` argument); BrainEvent ``numba_cuda_kernel`` (fused)
         and ``numba_cuda_callable`` (two kernels). A derived table checks the targets.
  eager. One eager (not jitted) call of a ``numba_kernel`` wrapper at N=1e3 on the CPU, per call,
         xlakern vs BrainEvent (the parallel and the serial LIF kernel).

The same kernels are given to both libraries. Every cell is computed in its own try/except: a
failure prints the error in its cell rather than stopping the run. Every result is checked
against NumPy ("check" columns): the CPU LIF against a float64 NumPy loop (V within 1e-2 mV and
the last spikes equal, except for at most max(1, N/1000) neurons whose float32 trajectory
crossed the threshold on the other side of float64's), the GPU step against a float32 NumPy
loop (exact).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

# _benchlib restores np.row_stack for numba-cuda (imported by the GPU section and by some
# BrainEvent paths) and tries `import brainevent` (None if it fails).
from _benchlib import (MIN_SAMPLES, NA_BE, Table, brainevent, err_cell, finish, fmt_t, loaded, log, machine_info,
                       print_header, ratio, run_sections, time_fn)

import jax
import jax.numpy as jnp
import numba

import xlakern

SDS = jax.ShapeDtypeStruct

CPU_SIZES = [1_000, 100_000, 4_000_000]
CPU_STEPS = 200
GPU_SIZES = [10_000, 1_000_000, 16_000_000]
GPU_STEPS = 100
EAGER_N = 1_000
GPU_ROUNDS = 5  # interleaved timing rounds per size in the GPU section
WARMUP = 2  # untimed calls before a cell's timed runs (the eager section uses 5)

# LIF parameters (tutorial values), float32 as the kernels see them
TAU_INV = np.float32(1.0 / 20.0)
V_TH = np.float32(-55.0)
V_REST = np.float32(-70.0)
DT = np.float32(0.1)
DRIFT = np.float32(0.5)  # GPU loop: V = V_out + DRIFT

# --------------------------------------------------------------------------------------------
# Numba CPU kernels (the tutorial's lif_dynamics_kernel, and the same body as a serial loop)
# --------------------------------------------------------------------------------------------


@numba.njit(parallel=True)
def lif_dynamics_kernel(V, I_ext, tau_inv, V_th, V_rest, dt, V_out, spikes):
    th = V_th[0]
    vr = V_rest[0]
    ti = tau_inv[0]
    step = dt[0]
    for i in numba.prange(V.size):
        v_new = V[i] + step * (-(V[i] - vr) * ti + I_ext[i])
        if v_new >= th:
            spikes[i] = 1
            V_out[i] = vr
        else:
            spikes[i] = 0
            V_out[i] = v_new


@numba.njit
def lif_dynamics_kernel_serial(V, I_ext, tau_inv, V_th, V_rest, dt, V_out, spikes):
    th = V_th[0]
    vr = V_rest[0]
    ti = tau_inv[0]
    step = dt[0]
    for i in range(V.size):
        v_new = V[i] + step * (-(V[i] - vr) * ti + I_ext[i])
        if v_new >= th:
            spikes[i] = 1
            V_out[i] = vr
        else:
            spikes[i] = 0
            V_out[i] = v_new


# --------------------------------------------------------------------------------------------
# C++ / CUDA sources (BrainEvent spelling for the serial and CUDA ones; xlakern accepts it)
# --------------------------------------------------------------------------------------------

CPP_LIF_SERIAL = r"""
#include "brainevent/common.h"

// @BE lif arg arg arg arg arg arg ret ret
void lif(const BE::Tensor V, const BE::Tensor I, const BE::Tensor tau_inv, const BE::Tensor V_th,
         const BE::Tensor V_rest, const BE::Tensor dt, BE::Tensor V_out, BE::Tensor spikes) {
  const float* pv = static_cast<const float*>(V.data_ptr());
  const float* pi = static_cast<const float*>(I.data_ptr());
  const float ti = static_cast<const float*>(tau_inv.data_ptr())[0];
  const float th = static_cast<const float*>(V_th.data_ptr())[0];
  const float vr = static_cast<const float*>(V_rest.data_ptr())[0];
  const float step = static_cast<const float*>(dt.data_ptr())[0];
  float* po = static_cast<float*>(V_out.data_ptr());
  int32_t* ps = static_cast<int32_t*>(spikes.data_ptr());
  const int64_t n = V.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v_new = pv[i] + step * (-(pv[i] - vr) * ti + pi[i]);
    if (v_new >= th) { ps[i] = 1; po[i] = vr; } else { ps[i] = 0; po[i] = v_new; }
  }
}
"""

CPP_LIF_PARALLEL = r"""
#include <xlakern/xlakern.h>

// @xk lif arg arg arg arg arg arg ret ret
void lif(const xk::Tensor V, const xk::Tensor I, const xk::Tensor tau_inv, const xk::Tensor V_th,
         const xk::Tensor V_rest, const xk::Tensor dt, xk::Tensor V_out, xk::Tensor spikes) {
  const float* pv = V.data<float>();
  const float* pi = I.data<float>();
  const float ti = tau_inv.data<float>()[0];
  const float th = V_th.data<float>()[0];
  const float vr = V_rest.data<float>()[0];
  const float step = dt.data<float>()[0];
  float* po = V_out.data<float>();
  int32_t* ps = spikes.data<int32_t>();
  xk::parallel_for(V.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v_new = pv[i] + step * (-(pv[i] - vr) * ti + pi[i]);
      if (v_new >= th) { ps[i] = 1; po[i] = vr; } else { ps[i] = 0; po[i] = v_new; }
    }
  });
}
"""

CUDA_LIF = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

__global__ void lif_kernel(const float* V, const float* V_th, const float* V_rest,
                           int32_t* spikes, float* V_out, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = V[i];
    if (v >= V_th[0]) { spikes[i] = 1; V_out[i] = V_rest[0]; } else { spikes[i] = 0; V_out[i] = v; }
  }
}

// @BE lif arg arg arg ret ret stream
void lif(const BE::Tensor V, const BE::Tensor V_th, const BE::Tensor V_rest,
         BE::Tensor spikes, BE::Tensor V_out, int64_t stream) {
  const int64_t n = V.numel();
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  lif_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
      static_cast<const float*>(V.data_ptr()), static_cast<const float*>(V_th.data_ptr()),
      static_cast<const float*>(V_rest.data_ptr()), static_cast<int32_t*>(spikes.data_ptr()),
      static_cast<float*>(V_out.data_ptr()), n);
}
"""

def fmt_us(sec: float) -> str:
    """A signed difference in seconds as '+1.23 µs'."""
    return f"{sec * 1e6:+.2f} µs"


# --------------------------------------------------------------------------------------------
# Section cpu: LIF Euler step, 200-step fori_loop, CPU
# --------------------------------------------------------------------------------------------


def lif_inputs(n: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(n)
    V = rng.uniform(-75.0, -50.0, n).astype(np.float32)
    I = rng.uniform(0.0, 5.0, n).astype(np.float32)
    params = [np.array([p], dtype=np.float32) for p in (TAU_INV, V_TH, V_REST, DT)]
    return (V, I, *params)


def lif_ref(V: np.ndarray, I: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 NumPy loop (from the float32 inputs and parameters)."""
    v = V.astype(np.float64)
    i_ext = I.astype(np.float64)
    ti, th, vr, dt = (float(p) for p in (TAU_INV, V_TH, V_REST, DT))
    tmp = np.empty_like(v)
    spk = np.zeros(v.shape, dtype=bool)
    for _ in range(steps):
        np.subtract(v, vr, out=tmp)
        tmp *= -ti
        tmp += i_ext
        tmp *= dt
        v += tmp
        np.greater_equal(v, th, out=spk)
        v[spk] = vr
    return v, spk.astype(np.int32)


def lif_check(v: np.ndarray, spk: np.ndarray, v_ref: np.ndarray, spk_ref: np.ndarray) -> tuple[bool, str]:
    n = v_ref.size
    allowed = max(1, n // 1000)
    bad_v = int(np.count_nonzero(~(np.abs(v.astype(np.float64) - v_ref) <= 1e-2)))
    bad_s = int(np.count_nonzero(spk != spk_ref))
    ok = bad_v <= allowed and bad_s <= allowed
    return ok, f"{bad_v} V / {bad_s} spikes off (≤{allowed} allowed)"


def lif_loop(step: Callable[..., Any], steps: int) -> Callable[..., Any]:
    @jax.jit
    def run(V, I, ti, th, vr, dt):
        def body(_, carry):
            V_out, spikes = step(carry[0], I, ti, th, vr, dt)
            return (V_out, spikes)

        return jax.lax.fori_loop(0, steps, body, (V, jnp.zeros(V.shape, jnp.int32)))

    return run


def jnp_lif_step(V, I, ti, th, vr, dt):
    v_new = V + dt[0] * (-(V - vr[0]) * ti[0] + I)
    spike = v_new >= th[0]
    return jnp.where(spike, vr[0], v_new), spike.astype(jnp.int32)


def lif_outs(n: int) -> list:
    return [SDS((n,), jnp.float32), SDS((n,), jnp.int32)]


def cpu_variants(n: int) -> list[tuple[str, str, bool, Callable[[], Callable[..., Any]]]]:
    """(key, row label, is_brainevent, make) — make() returns step(V, I, ti, th, vr, dt) -> (V_out, spikes)."""

    def xk_numba(kernel):
        def make():
            f = xlakern.numba_kernel(kernel, lif_outs(n))
            return lambda *a: tuple(f(*a))
        return make

    def xk_cpp(name, src):
        def make():
            mod = loaded(name, lambda: xlakern.load_cpp_inline(name, src, quiet=True))
            return lambda *a: tuple(mod.lif(*a, outs=lif_outs(n)))
        return make

    def be_numba(kernel):
        def make():
            f = brainevent.numba_kernel(kernel, lif_outs(n))
            return lambda *a: tuple(f(*a))
        return make

    return [
        ("jnp", "jnp", False, lambda: jnp_lif_step),
        ("xk_numba_parallel", "xlakern `numba_kernel`, `@njit(parallel=True)` + `prange`", False,
         xk_numba(lif_dynamics_kernel)),
        ("xk_numba_serial", "xlakern `numba_kernel`, serial `@njit` (`range`)", False,
         xk_numba(lif_dynamics_kernel_serial)),
        ("xk_cpp_parallel", "xlakern `load_cpp_inline`, `xk::parallel_for`", False,
         xk_cpp("xk_numba_bench_lif_par", CPP_LIF_PARALLEL)),
        ("xk_cpp_serial", "xlakern `load_cpp_inline`, serial loop (BrainEvent spelling)", False,
         xk_cpp("xk_numba_bench_lif_ser", CPP_LIF_SERIAL)),
        ("be_numba_parallel", "BrainEvent `numba_kernel`, `@njit(parallel=True)` + `prange`", True,
         be_numba(lif_dynamics_kernel)),
    ]


_ALONE_DRIVERS: dict[str, Any] = {}


def numba_alone_per_step(kernel: Any, host: tuple[np.ndarray, ...], runs: int, budget: float) -> float:
    """The kernel's own cost per call: called CPU_STEPS times from an @njit loop, no JAX involved.

    Includes what Numba itself pays per call (for a prange kernel, its parallel launch), so the
    difference to a JAX per-step time is what the bridge adds.
    """
    driver = _ALONE_DRIVERS.get(kernel.__name__)
    if driver is None:
        @numba.njit
        def driver(V, I, ti, th, vr, dt, Vo, spikes, steps):  # noqa: E306
            for _ in range(steps):
                kernel(V, I, ti, th, vr, dt, Vo, spikes)
                V, Vo = Vo, V
            return V
        _ALONE_DRIVERS[kernel.__name__] = driver
    V, I, ti, th, vr, dt = (np.array(a) for a in host)
    Vo, spikes = np.empty_like(V), np.empty(V.shape, np.int32)
    driver(V.copy(), I, ti, th, vr, dt, Vo, spikes, 2)  # compile + warm up
    samples = []
    t_end = time.perf_counter() + budget
    for _ in range(runs):
        v = V.copy()
        t = time.perf_counter()
        driver(v, I, ti, th, vr, dt, Vo, spikes, CPU_STEPS)
        samples.append(time.perf_counter() - t)
        if len(samples) >= MIN_SAMPLES and time.perf_counter() > t_end:
            break
    return statistics.median(samples) / CPU_STEPS


ALONE_ROWS = [("alone_parallel", "Numba alone: `prange` kernel from an `@njit` loop (no JAX)", "lif_dynamics_kernel"),
              ("alone_serial", "Numba alone: serial kernel from an `@njit` loop (no JAX)", "lif_dynamics_kernel_serial")]


def section_cpu(args, info) -> list[Table]:
    cpu = jax.devices("cpu")[0]
    headers = ["variant", *[f"N={n:,}" for n in CPU_SIZES], "check"]
    t = Table("lif_cpu", f"cpu. Per-step cost, LIF Euler step (float32), jitted {CPU_STEPS}-step `fori_loop`, CPU",
              headers,
              note=(f"Median over up to {args.runs} runs (after 2 warm-ups; a cell stops early past "
                    f"{args.budget:g} s once it has {MIN_SAMPLES} samples) of one jitted {CPU_STEPS}-step loop, "
                    f"divided by {CPU_STEPS}. Inputs V, I and (1,)-arrays tau_inv, V_th, V_rest, dt; outputs "
                    f"V_out (float32), spikes (int32). {info['cpu_cores_usable']} usable cores; "
                    f"NUMBA_NUM_THREADS={info['numba_num_threads']}. Check: after {CPU_STEPS} steps vs a float64 "
                    f"NumPy loop."))
    per_step: dict[str, dict[int, float]] = {}
    row_cells: dict[str, list[str]] = {}
    row_data: dict[str, dict[str, Any]] = {}
    row_bad: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    with jax.default_device(cpu):
        for n in CPU_SIZES:
            t0 = time.perf_counter()
            host = lif_inputs(n)
            v_ref, spk_ref = lif_ref(host[0], host[1], CPU_STEPS)
            dev = tuple(jax.device_put(a, cpu) for a in host)
            log(f"  cpu N={n}: inputs + NumPy reference {time.perf_counter() - t0:.1f} s")
            for key, label, is_be, make in cpu_variants(n):
                labels[key] = label
                cells = row_cells.setdefault(key, [])
                data = row_data.setdefault(key, {})
                bad = row_bad.setdefault(key, [])
                if is_be and brainevent is None:
                    cells.append(NA_BE)
                    data[str(n)] = None
                    continue
                t1 = time.perf_counter()
                try:
                    f = lif_loop(make(), CPU_STEPS)
                    med, samples, out = time_fn(f, dev, args.runs, args.budget, warmup=WARMUP)
                    ok, detail = lif_check(np.asarray(out[0]), np.asarray(out[1]), v_ref, spk_ref)
                    if not ok:
                        bad.append(f"N={n:,}: {detail}")
                    per_step.setdefault(key, {})[n] = med / CPU_STEPS
                    cells.append(fmt_t(med / CPU_STEPS))
                    data[str(n)] = {"per_step_s": med / CPU_STEPS, "loop_samples_s": samples, "check": detail}
                except Exception as e:  # noqa: BLE001
                    cells.append(err_cell(e))
                    data[str(n)] = {"error": cells[-1]}
                log(f"  cpu N={n} {key}: {cells[-1]} ({time.perf_counter() - t1:.1f} s)")
            for key, label, kernel_name in ALONE_ROWS:
                labels[key] = label
                row_bad.setdefault(key, [])
                try:
                    per = numba_alone_per_step(globals()[kernel_name], host, args.runs, args.budget)
                    per_step.setdefault(key, {})[n] = per
                    row_cells.setdefault(key, []).append(fmt_t(per))
                    row_data.setdefault(key, {})[str(n)] = {"per_step_s": per}
                except Exception as e:  # noqa: BLE001
                    row_cells.setdefault(key, []).append(err_cell(e))
                    row_data.setdefault(key, {})[str(n)] = {"error": row_cells[key][-1]}
    alone_keys = {key for key, _, _ in ALONE_ROWS}
    for key, cells in row_cells.items():
        if key in alone_keys:
            check = "timing only"
        elif all(c.startswith(("n/a", "error")) for c in cells):
            check = ""
        else:
            check = "ok (≈ NumPy float64)" if not row_bad[key] else "MISMATCH: " + "; ".join(row_bad[key])
        t.add([labels[key], *cells, check], {"variant": key, **row_data[key]})
    try:
        layer = numba.threading_layer()
    except Exception:  # noqa: BLE001  (no parallel kernel ran)
        layer = "n/a (no parallel Numba kernel ran)"
    t.note += f" Numba threading layer: {layer}."
    return [t, derived_cpu(per_step)]


def derived_cpu(per_step: dict[str, dict[int, float]]) -> Table:
    n = CPU_SIZES[0]
    t = Table("lif_cpu_overhead", f"cpu. Fixed cost at N={n:,}: per-step time minus the serial C++ kernel's",
              ["comparison", "per-step", "minus C++ serial", "target", "met?"],
              note=("Overhead = a variant's per-step time minus that of the serial C++ kernel (`load_cpp_inline`) "
                    f"at N={n:,}, where the arithmetic is ~1 µs or less; raw per-step numbers are given so the "
                    "reader can judge. For the `prange` kernels the overhead includes Numba's own parallel "
                    "launch, which the serial kernel does not pay. Bridge overhead = per-step time through JAX "
                    "minus the same kernel's per-call time when an `@njit` loop calls it directly (Numba alone): "
                    "what getting from XLA into the kernel costs."))
    at = {k: v.get(n) for k, v in per_step.items()}
    cpp_ser, cpp_par = at.get("xk_cpp_serial"), at.get("xk_cpp_parallel")

    def row(label, key, ref, ref_label, target_us=None):
        v = at.get(key)
        if v is None or ref is None:
            t.add([label, fmt_t(v), "n/a", f"≤ {ref_label} + {target_us} µs" if target_us else "", "n/a"],
                  {"key": key})
            return
        ovh = v - ref
        tgt, met = "", ""
        if target_us is not None:
            tgt = f"≤ {ref_label} + {target_us} µs"
            met = "yes" if ovh <= target_us * 1e-6 else "NO"
        t.add([label, fmt_t(v), fmt_us(v - cpp_ser) if cpp_ser else "n/a", tgt, met],
              {"key": key, "per_step_s": v, "minus_cpp_serial_s": (v - cpp_ser) if cpp_ser else None,
               "ref_s": ref})

    row("C++ serial (`load_cpp_inline`)", "xk_cpp_serial", cpp_ser, "C++ serial")
    row("C++ `xk::parallel_for`", "xk_cpp_parallel", cpp_ser, "C++ serial")
    row("jnp", "jnp", cpp_ser, "C++ serial")
    row("xlakern `numba_kernel`, serial kernel", "xk_numba_serial", cpp_ser, "C++ serial", 1)
    row("xlakern `numba_kernel`, `prange` kernel", "xk_numba_parallel", cpp_ser, "C++ serial", 1)
    row("BrainEvent `numba_kernel`, `prange` kernel", "be_numba_parallel", cpp_ser, "C++ serial")
    # xlakern prange vs C++ parallel_for (like for like) and the BrainEvent ratio
    xp, bp = at.get("xk_numba_parallel"), at.get("be_numba_parallel")
    if xp is not None and cpp_par is not None:
        t.add(["xlakern `prange` kernel vs C++ `xk::parallel_for`", fmt_t(xp), fmt_us(xp - cpp_par) + " (vs parallel_for)",
               "≤ C++ + 1 µs", "yes" if xp - cpp_par <= 1e-6 else "NO"],
              {"key": "xk_numba_parallel_vs_cpp_parallel", "diff_s": xp - cpp_par})
    alone = at.get("alone_parallel")
    for label, key, ref_key in (("xlakern bridge overhead, serial kernel", "xk_numba_serial", "alone_serial"),
                                ("xlakern bridge overhead, `prange` kernel", "xk_numba_parallel", "alone_parallel"),
                                ("BrainEvent bridge overhead, `prange` kernel", "be_numba_parallel", "alone_parallel")):
        v, ref = at.get(key), at.get(ref_key)
        if v is not None and ref is not None:
            t.add([label, fmt_t(v), f"{fmt_us(v - ref)} over Numba alone ({fmt_t(ref)})", "", ""],
                  {"key": f"{key}_bridge_overhead", "per_step_s": v, "alone_s": ref, "overhead_s": v - ref})
    if xp is not None and bp is not None and alone is not None:
        xo, bo = xp - alone, bp - alone
        if xo > 0:
            r = f"{bo / xo:.1f}× less overhead than BrainEvent ({fmt_us(bo)} vs {fmt_us(xo)})"
            met = "yes" if bo / xo >= 10 else "NO"
        else:
            r = f"xlakern overhead ≤ 0 (within noise); BrainEvent {fmt_us(bo)}"
            met = "yes" if bo > 0 else "?"
        t.add(["bridge overhead ratio, `prange` kernel: BrainEvent / xlakern (both over Numba alone)", r, "",
               "≥ 10×", met],
              {"key": "overhead_ratio", "xk_overhead_s": xo, "be_overhead_s": bo})
    else:
        t.add(["overhead ratio, `prange` kernel: BrainEvent / xlakern", "n/a", "", "≥ 10×", "n/a"],
              {"key": "overhead_ratio"})
    return t


# --------------------------------------------------------------------------------------------
# Section gpu: LIF detect + reset, 100-step fori_loop, GPU
# --------------------------------------------------------------------------------------------


def make_cuda_kernels(cuda) -> dict[str, Any]:
    @cuda.jit
    def lif_detect_reset_kernel(V, V_th, V_rest, spikes, V_out):
        """Fused: spikes[i] = V[i] >= V_th[0]; V_out[i] = V_rest[0] if spiking else V[i]."""
        i = cuda.grid(1)
        if i < V.size:
            v = V[i]
            if v >= V_th[0]:
                spikes[i] = 1
                V_out[i] = V_rest[0]
            else:
                spikes[i] = 0
                V_out[i] = v

    @cuda.jit
    def detect_spikes_kernel(V, V_th, spikes):
        i = cuda.grid(1)
        if i < V.size:
            spikes[i] = 1 if V[i] >= V_th[0] else 0

    @cuda.jit
    def reset_potential_kernel(V, spikes, V_rest, V_out):
        i = cuda.grid(1)
        if i < V.size:
            V_out[i] = V_rest[0] if spikes[i] else V[i]

    def lif_step(V, V_th, V_rest, spikes_out, V_out, stream):
        """The tutorial's two-kernel step, launched on XLA's stream."""
        n = V.shape[0]
        threads = 256
        blocks = (n + threads - 1) // threads
        detect_spikes_kernel[blocks, threads, stream](V, V_th, spikes_out)
        reset_potential_kernel[blocks, threads, stream](V, spikes_out, V_rest, V_out)

    return {"fused": lif_detect_reset_kernel, "callable": lif_step}


def gpu_outs(n: int) -> list:
    return [SDS((n,), jnp.int32), SDS((n,), jnp.float32)]


def gpu_loop(step: Callable[..., Any], steps: int) -> Callable[..., Any]:
    @jax.jit
    def run(V, th, vr):
        def body(_, carry):
            spikes, V_out = step(carry[0], th, vr)
            return (V_out + DRIFT, spikes)

        return jax.lax.fori_loop(0, steps, body, (V, jnp.zeros(V.shape, jnp.int32)))

    return run


def gpu_ref(V: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    v = V.copy()
    spk = np.zeros(v.shape, dtype=bool)
    for _ in range(steps):
        np.greater_equal(v, V_TH, out=spk)
        v[spk] = V_REST
        v += DRIFT
    return v, spk.astype(np.int32)


def jnp_detect_reset(V, th, vr):
    spike = V >= th[0]
    return spike.astype(jnp.int32), jnp.where(spike, vr[0], V)


def gpu_variants(n: int, kernels: dict[str, Any], kernels_err: Exception | None
                 ) -> list[tuple[str, str, bool, Callable[[], Callable[..., Any]]]]:
    def xk_cuda():
        mod = loaded("xk_numba_bench_lif_cuda",
                     lambda: xlakern.load_cuda_inline("xk_numba_bench_lif_cuda", CUDA_LIF, quiet=True))
        return lambda V, th, vr: tuple(mod.lif(V, th, vr, outs=gpu_outs(n)))

    def wrap(lib_fn, kernel, *a, **kw):
        def make():
            if kernel is None:  # numba.cuda could not be imported / build the kernels
                raise kernels_err  # type: ignore[misc]
            f = lib_fn()(kernel, *a, **kw)
            return lambda V, th, vr: tuple(f(V, th, vr))
        return make

    return [
        ("jnp", "jnp", False, lambda: jnp_detect_reset),
        ("xk_numba_cuda_kernel", "xlakern `numba_cuda_kernel` (fused, `launch_dims=N`)", False,
         wrap(lambda: xlakern.numba_cuda_kernel, kernels["fused"], gpu_outs(n), launch_dims=n)),
        ("xk_numba_cuda_callable", "xlakern `numba_cuda_callable` (detect + reset kernels)", False,
         wrap(lambda: xlakern.numba_cuda_callable, kernels["callable"], gpu_outs(n))),
        ("xk_cuda", "xlakern `load_cuda_inline` (fused, CUDA C++)", False, xk_cuda),
        ("be_numba_cuda_kernel", "BrainEvent `numba_cuda_kernel` (fused, `launch_dims=N`)", True,
         wrap(lambda: brainevent.numba_cuda_kernel, kernels["fused"], gpu_outs(n), launch_dims=n)),
        ("be_numba_cuda_callable", "BrainEvent `numba_cuda_callable` (detect + reset kernels)", True,
         wrap(lambda: brainevent.numba_cuda_callable, kernels["callable"], gpu_outs(n))),
    ]


def section_gpu(args, info) -> list[Table]:
    if not info["gpu"]:
        t = Table("lif_gpu", "gpu. Per-step cost, LIF detect + reset", ["size", "all variants"])
        t.add([", ".join(f"N={n:,}" for n in GPU_SIZES), "skipped (JAX sees no GPU)"], {"skipped": True})
        return [t]
    gpu = [d for d in jax.devices() if d.platform == "gpu"][0]
    t = Table("lif_gpu", f"gpu. Per-step cost, LIF detect + reset (float32 V, int32 spikes), jitted "
              f"{GPU_STEPS}-step `fori_loop`, {info['gpu']}",
              ["variant", *[f"N={n:,}" for n in GPU_SIZES], "check"],
              note=(f"Median over about {args.runs} runs of one jitted {GPU_STEPS}-step loop (after 2 warm-ups), "
                    f"taken in {GPU_ROUNDS} interleaved rounds over all variants, divided by {GPU_STEPS}. Each step: the variant's detect + reset, then `V = V_out + {float(DRIFT)}` "
                    "(same jnp add for all). 256 threads a block everywhere. Check: final V and last spikes "
                    "vs a float32 NumPy loop (exact)."))
    try:
        from numba import cuda

        kernels = make_cuda_kernels(cuda)
        kernels_err = None
    except Exception as e:  # noqa: BLE001
        kernels, kernels_err = {"fused": None, "callable": None}, e

    per_step: dict[str, dict[int, float]] = {}
    row_cells: dict[str, list[str]] = {}
    row_data: dict[str, dict[str, Any]] = {}
    row_bad: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    for n in GPU_SIZES:
        t0 = time.perf_counter()
        V0 = np.random.default_rng(n).uniform(-75.0, -50.0, n).astype(np.float32)
        v_ref, spk_ref = gpu_ref(V0, GPU_STEPS)
        args_dev = tuple(jax.device_put(a, gpu) for a in (V0, np.array([V_TH], np.float32),
                                                           np.array([V_REST], np.float32)))
        log(f"  gpu N={n}: inputs + NumPy reference {time.perf_counter() - t0:.1f} s")
        # Build, warm up and check every variant first, then time them in interleaved rounds,
        # so that drift in the machine's state (clocks, other tenants) spreads over all rows.
        ready: dict[str, Callable[..., Any]] = {}
        samples_of: dict[str, list[float]] = {}
        for key, label, is_be, make in gpu_variants(n, kernels, kernels_err):
            labels[key] = label
            row_cells.setdefault(key, [])
            row_data.setdefault(key, {})
            bad = row_bad.setdefault(key, [])
            if is_be and brainevent is None:
                row_cells[key].append(NA_BE)
                row_data[key][str(n)] = None
                continue
            try:
                f = gpu_loop(make(), GPU_STEPS)
                _, _, out = time_fn(f, args_dev, 1, warmup=WARMUP)
                v_out, spk_out = np.asarray(out[0]), np.asarray(out[1])
                n_bad_v = int(np.count_nonzero(v_out != v_ref))
                n_bad_s = int(np.count_nonzero(spk_out != spk_ref))
                if n_bad_v or n_bad_s:
                    bad.append(f"N={n:,}: {n_bad_v} V / {n_bad_s} spikes differ")
                ready[key] = f
                samples_of[key] = []
                row_data[key][str(n)] = {"mismatched_v": n_bad_v, "mismatched_spikes": n_bad_s}
            except Exception as e:  # noqa: BLE001
                row_cells[key].append(err_cell(e))
                row_data[key][str(n)] = {"error": row_cells[key][-1]}
        per_round = max(1, args.runs // GPU_ROUNDS)
        for _ in range(GPU_ROUNDS):
            for key, f in ready.items():
                samples_of[key] += time_fn(f, args_dev, per_round, args.budget / GPU_ROUNDS, warmup=0)[1]
        for key, samples in samples_of.items():
            med = statistics.median(samples)
            per_step.setdefault(key, {})[n] = med / GPU_STEPS
            row_cells[key].append(fmt_t(med / GPU_STEPS))
            row_data[key][str(n)].update({"per_step_s": med / GPU_STEPS, "loop_samples_s": samples})
            log(f"  gpu N={n} {key}: {row_cells[key][-1]}")
    alone_keys = {key for key, _, _ in ALONE_ROWS}
    for key, cells in row_cells.items():
        if key in alone_keys:
            check = "timing only"
        elif all(c.startswith(("n/a", "error")) for c in cells):
            check = ""
        else:
            check = "ok (= NumPy)" if not row_bad[key] else "MISMATCH: " + "; ".join(row_bad[key])
        t.add([labels[key], *cells, check], {"variant": key, **row_data[key]})
    return [t, derived_gpu(per_step)]


def derived_gpu(per_step: dict[str, dict[int, float]]) -> Table:
    t = Table("lif_gpu_targets", "gpu. Targets", ["target", *[f"N={n:,}" for n in GPU_SIZES]],
              note="Ratios of the per-step medians above; each cell gives the ratio and whether the target is met.")

    def row(label, num_key, den_key, ok: Callable[[float], bool | None]):
        cells, data = [], {}
        for n in GPU_SIZES:
            a, b = per_step.get(num_key, {}).get(n), per_step.get(den_key, {}).get(n)
            if a is None or b is None:
                cells.append("n/a")
                continue
            r = a / b
            verdict = ok(r)
            cells.append(f"{r:.2f}×" + ("" if verdict is None else f" ({'met' if verdict else 'NOT met'})"))
            data[str(n)] = r
        t.add([label, *cells], {"target": label, **data})

    row("`numba_cuda_kernel` / CUDA C++ kernel ≤ 1.1×", "xk_numba_cuda_kernel", "xk_cuda", lambda r: r <= 1.1)
    row("BrainEvent `numba_cuda_kernel` / xlakern `numba_cuda_kernel` ≥ 15×", "be_numba_cuda_kernel",
        "xk_numba_cuda_kernel", lambda r: r >= 15)
    row("xlakern `numba_cuda_callable` / BrainEvent `numba_cuda_callable` ≤ 1×", "xk_numba_cuda_callable",
        "be_numba_cuda_callable", lambda r: r <= 1.0)
    row("xlakern `numba_cuda_kernel` / jnp (for reference)", "xk_numba_cuda_kernel", "jnp", lambda r: None)
    return t


# --------------------------------------------------------------------------------------------
# Section eager: one eager numba_kernel call at N=1e3, CPU
# --------------------------------------------------------------------------------------------


def section_eager(args, info) -> list[Table]:
    n = EAGER_N
    cpu = jax.devices("cpu")[0]
    runs = max(args.runs * 10, 20)
    t = Table("eager", f"eager. One eager (not jitted) `numba_kernel` call, LIF Euler step, N={n:,}, CPU",
              ["kernel", "xlakern", "BrainEvent", "BrainEvent / xlakern", "check"],
              note=(f"Median over up to {runs} eager calls (after 5 warm-ups; stops early past {args.budget:g} s), "
                    "each `block_until_ready`; JAX's eager dispatch of the FFI call included. Check: one step "
                    "vs a float64 NumPy step."))
    host = lif_inputs(n)
    v_ref, spk_ref = lif_ref(host[0], host[1], 1)
    with jax.default_device(cpu):
        dev = tuple(jax.device_put(a, cpu) for a in host)
        for label, kernel in (("`@njit(parallel=True)` + `prange`", lif_dynamics_kernel),
                              ("serial `@njit`", lif_dynamics_kernel_serial)):
            cells, data, meds, bad = [], {}, {}, []
            for lib in ("xlakern", "brainevent"):
                if lib == "brainevent" and brainevent is None:
                    cells.append(NA_BE)
                    data[lib] = None
                    continue
                try:
                    f = (xlakern if lib == "xlakern" else brainevent).numba_kernel(kernel, lif_outs(n))
                    med, samples, out = time_fn(f, dev, runs, args.budget, warmup=5)
                    ok, detail = lif_check(np.asarray(out[0]), np.asarray(out[1]), v_ref, spk_ref)
                    if not ok:
                        bad.append(f"{lib}: {detail}")
                    meds[lib] = med
                    cells.append(fmt_t(med))
                    data[lib] = {"per_call_s": med, "samples_s": samples}
                except Exception as e:  # noqa: BLE001
                    cells.append(err_cell(e))
                    data[lib] = {"error": cells[-1]}
                log(f"  eager {label} {lib}: {cells[-1]}")
            check = "" if not meds else ("ok (≈ NumPy float64)" if not bad else "MISMATCH: " + "; ".join(bad))
            t.add([label, *cells, ratio(meds.get("brainevent"), meds.get("xlakern")), check],
                  {"kernel": kernel.__name__, "n": n, **data})
    return [t]


# --------------------------------------------------------------------------------------------


SECTIONS = ("cpu", "gpu", "eager")


def numba_info() -> dict[str, Any]:
    """Numba's version, numba-cuda's (or 'not installed') and NUMBA_NUM_THREADS, for machine_info."""
    try:
        from importlib.metadata import version

        numba_cuda = version("numba-cuda")
    except Exception:  # noqa: BLE001
        numba_cuda = "not installed"
    return {"numba": numba.__version__, "numba_cuda": numba_cuda,
            "numba_num_threads": numba.config.NUMBA_NUM_THREADS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the tables (and raw samples) as JSON")
    ap.add_argument("--runs", type=int, default=30,
                    help="timed runs per figure (default 30; each is one full jitted loop; eager: 10× this)")
    ap.add_argument("--budget", type=float, default=4.0,
                    help=f"seconds of timed runs per cell before it stops early (at >= {MIN_SAMPLES} samples; "
                         "default 4)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run (default {','.join(SECTIONS)})")
    args = ap.parse_args()
    args.runs = max(args.runs, 1)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")

    t_start = time.perf_counter()
    info = machine_info(numba_info())
    print_header("xlakern vs BrainEvent: Numba kernels from JAX", info,
                 f", numba {info['numba']}, numba-cuda {info['numba_cuda']}")

    steps = {"cpu": section_cpu, "gpu": section_gpu, "eager": section_eager}
    tables = run_sections((key, lambda key=key: steps[key](args, info)) for key in SECTIONS if key in wanted)
    finish(t_start, info, tables, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
