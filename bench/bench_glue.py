#!/usr/bin/env python3
"""The generated FFI handlers of C++ modules: XLA's typed FFI API beside xlakern's frame glue.

Usage::

    python bench/bench_glue.py                         # Markdown tables on stdout
    python bench/bench_glue.py --json out.json         # ... and the same tables as JSON
    python bench/bench_glue.py --repeats 3 --sections cold --cases "one function"

Two arms, the same sources: "typed" (the handlers bound with ``ffi::Ffi::Bind()``, ``xlakern/ffi_glue.h``,
what every C++ module had before) and "frame" (``xlakern/ffi_frame.h``, the call frame read through XLA's C
API, the default for C++ modules). The arm is chosen through ``xlakern._codegen.FRAME_GLUE_PLATFORMS``.

Sections:

  cold   one fresh process per figure, with an empty xlakern cache, the arms in turns: the wall time of
         ``load_cpp_inline`` of a one-function module plus its first call, of a four-function module, and the
         first event product ``BinaryArray(s) @ CSR`` (4,000 neurons, 80 synapses a row), each result checked
         against float64 NumPy. Median (min-max) of ``--repeats``.
  step   per step of a jitted ``lax.fori_loop`` of ``--steps`` steps, one process, both arms' modules built
         from the same source: ``out = v * alpha + x`` (float32) through ``mod.decay`` (the control handler)
         and through a raw ``jax.ffi.ffi_call`` (the plain handler), N = 1, 1,000 and 100,000. The arms take
         turns; median over ``--runs`` loops, divided by the steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

import xlakern
from xlakern import _codegen
from _benchlib import Table, err_cell, finish, fmt_t, log, machine_info, print_header, result_worker, run_sections

ARMS = {"typed": frozenset(), "frame": frozenset({"cpu"})}

DECAY = r"""
// @xk decay arg arg ret attr.alpha:float32
void decay(const xk::Tensor v, const xk::Tensor x, xk::Tensor out, float alpha) {
  const float* pv = v.data<float>(); const float* px = x.data<float>(); float* po = out.data<float>();
  xk::parallel_for(v.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = pv[i] * alpha + px[i];
  });
}
"""

# Three more functions, with other signatures (two outputs, int attributes, no attributes).
FOUR = DECAY + r"""
// @xk minmax arg ret ret
void minmax(const xk::Tensor x, xk::Tensor lo, xk::Tensor hi) {
  const float* p = x.data<float>(); float a = p[0], b = p[0];
  for (int64_t i = 1; i < x.numel(); ++i) { a = p[i] < a ? p[i] : a; b = p[i] > b ? p[i] : b; }
  *lo.data<float>() = a; *hi.data<float>() = b;
}
// @xk shift arg ret attr.by:int64 attr.wrap:bool
void shift(const xk::Tensor x, xk::Tensor out, int64_t by, bool wrap) {
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = i - by;
    out.data<float>()[i] = (j >= 0 && j < n) ? x.data<float>()[j] : (wrap ? x.data<float>()[((j % n) + n) % n] : 0.f);
  }
}
// @xk total arg ret
void total(const xk::Tensor x, xk::Tensor out) {
  double s = 0; for (int64_t i = 0; i < x.numel(); ++i) s += x.data<float>()[i];
  *out.data<float>() = float(s);
}
"""

# One cold first call in a fresh process; prints "RESULT <seconds> <max abs error>".
WORKER = r"""
import sys, time
import numpy as np
import jax
jax.config.update("jax_platforms", "cpu")
import jax.numpy as jnp
import xlakern
from xlakern import _codegen
_codegen.FRAME_GLUE_PLATFORMS = frozenset(sys.argv[2].split(",")) - {""}
case, src = sys.argv[1], sys.argv[3]
SDS = jax.ShapeDtypeStruct
rng = np.random.default_rng(11)
jax.devices()
t0 = time.perf_counter()
if case == "s @ CSR":
    n, k = 4000, 80
    idx = np.sort(rng.integers(0, n, (n, k)), axis=1).astype(np.int32)
    w = rng.random(n * k, dtype=np.float32)
    csr = xlakern.CSR((jnp.asarray(w), jnp.asarray(idx.reshape(-1)), jnp.asarray((np.arange(n + 1) * k).astype(np.int32))),
                      shape=(n, n))
    spk = rng.random(n) < 0.05
    got = np.asarray(jax.jit(lambda s: xlakern.BinaryArray(s) @ csr)(jnp.asarray(spk)), np.float64)
    dense = np.zeros((n, n))
    np.add.at(dense, (np.repeat(np.arange(n), k), idx.reshape(-1)), w.astype(np.float64))
    want = spk.astype(np.float64) @ dense
else:
    mod = xlakern.load_cpp_inline("glue_bench_" + case, src)
    v, x = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    got = np.asarray(jax.jit(lambda v, x: mod.decay(v, x, outs=SDS(v.shape, v.dtype), alpha=0.5))(v, x), np.float64)
    want = 0.5 * v.astype(np.float64) + x
t1 = time.perf_counter()
print("RESULT", t1 - t0, float(np.max(np.abs(got - want))))
"""

COLD_CASES = {"one function": DECAY, "four functions": FOUR, "s @ CSR": ""}


def cold_worker(case: str, arm: str, timeout: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="xk-glue-") as d:
        env = dict(os.environ, XLAKERN_CACHE_DIR=d, XLAKERN_QUIET="1")
        key = case if case == "s @ CSR" else case.replace(" ", "_")
        return result_worker(WORKER, [key, ",".join(sorted(ARMS[arm])), COLD_CASES[case]], env, timeout)


def spread(samples: list[float]) -> str:
    return f"{fmt_t(statistics.median(samples))} ({fmt_t(min(samples))}-{fmt_t(max(samples))})"


def cold_section(cases: list[str], repeats: int, timeout: float) -> list[Table]:
    t = Table("glue_cold", "Cold build and first call of a C++ module, fresh process, empty cache (CPU)",
              ["module", "typed glue", "frame glue", "typed / frame"],
              f"Median (min-max) of {repeats} processes an arm, the arms in turns. Load, build and first jitted "
              "call, checked against float64 NumPy.")
    for case in cases:
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        errs: list[float] = []
        try:
            for r in range(repeats):
                for arm in (ARMS if r % 2 == 0 else reversed(list(ARMS))):
                    secs, err = cold_worker(case, arm, timeout)
                    times[arm].append(secs)
                    errs.append(err)
                    log(f"cold {case} {arm}: {secs:.2f} s (err {err:.2g})")
        except Exception as e:  # noqa: BLE001 -- the row says what failed
            t.add([case, err_cell(e), "", ""])
            continue
        ok = max(errs) <= 1e-3
        typed, frame = statistics.median(times["typed"]), statistics.median(times["frame"])
        t.add([case, spread(times["typed"]), spread(times["frame"]) + ("" if ok else " (WRONG)"),
               f"{typed / frame:.2f}x"], {"case": case, "typed_s": times["typed"], "frame_s": times["frame"],
                                          "max_abs_err": max(errs)})
    return [t]


def step_section(steps: int, runs: int) -> list[Table]:
    SDS = jax.ShapeDtypeStruct
    mods = {}
    for arm, platforms in ARMS.items():
        saved = _codegen.FRAME_GLUE_PLATFORMS
        _codegen.FRAME_GLUE_PLATFORMS = platforms
        try:
            mods[arm] = xlakern.load_cpp_inline(f"glue_step_{arm}", DECAY)
        finally:
            _codegen.FRAME_GLUE_PLATFORMS = saved
    t = Table("glue_step", "Per step of a jitted loop, `out = v * alpha + x` (float32), CPU",
              ["N", "call", "typed glue", "frame glue", "typed / frame", "check"],
              f"Median of {runs} loops of {steps} steps an arm, divided by {steps}; the arms in turns.")
    rng = np.random.default_rng(5)
    for n in (1, 1000, 100_000):
        v0 = rng.standard_normal(n).astype(np.float32)
        x = rng.standard_normal(n).astype(np.float32)
        want = v0.astype(np.float64)
        for _ in range(steps):
            want = want * np.float32(0.999) + x
        for call in ("mod.decay", "raw ffi_call"):
            loops = {}
            for arm, mod in mods.items():
                if call == "mod.decay":
                    step = lambda v, x, mod=mod: mod.decay(v, x, outs=SDS(v.shape, v.dtype), alpha=0.999)
                else:
                    step = lambda v, x, mod=mod: jax.ffi.ffi_call(f"{mod.name}.decay", SDS(v.shape, v.dtype))(
                        v, x, alpha=np.float32(0.999))
                loops[arm] = jax.jit(lambda v, x, step=step: jax.lax.fori_loop(0, steps, lambda i, v: step(v, x), v))
            samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
            worst = 0.0
            for arm, f in loops.items():  # compile and check both first
                got = np.asarray(jax.block_until_ready(f(v0, x)), np.float64)
                worst = max(worst, float(np.max(np.abs(got - want)) / (1 + np.max(np.abs(want)))))
            for r in range(runs):
                for arm in (ARMS if r % 2 == 0 else reversed(list(ARMS))):
                    t0 = time.perf_counter()
                    jax.block_until_ready(loops[arm](v0, x))
                    samples[arm].append((time.perf_counter() - t0) / steps)
            typed, frame = statistics.median(samples["typed"]), statistics.median(samples["frame"])
            t.add([f"{n:,}", call, fmt_t(typed), fmt_t(frame), f"{typed / frame:.2f}x",
                   "ok" if worst < 1e-3 else f"WRONG ({worst:.2g})"],
                  {"n": n, "call": call, "typed_s": samples["typed"], "frame_s": samples["frame"], "rel_err": worst})
            log(f"step N={n} {call}: typed {fmt_t(typed)}, frame {fmt_t(frame)}")
    return [t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the tables as JSON here")
    ap.add_argument("--sections", nargs="+", default=["cold", "step"], choices=["cold", "step"])
    ap.add_argument("--cases", nargs="+", default=list(COLD_CASES), choices=list(COLD_CASES),
                    help="the cold section's modules")
    ap.add_argument("--repeats", type=int, default=5, help="cold processes an arm and case")
    ap.add_argument("--steps", type=int, default=200, help="steps of each timed loop")
    ap.add_argument("--runs", type=int, default=51, help="timed loops an arm and row")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a cold worker may take")
    args = ap.parse_args()
    jax.config.update("jax_platforms", "cpu")
    t_start = time.perf_counter()
    info = machine_info()
    print_header("Generated FFI handlers: typed glue and frame glue", info)
    sections = {"cold": lambda: cold_section(args.cases, args.repeats, args.timeout),
                "step": lambda: step_section(args.steps, args.runs)}
    tables = run_sections((s, sections[s]) for s in args.sections)
    finish(t_start, info, tables, args.json)


if __name__ == "__main__":
    main()
