"""The BrainEvent 0.3 functions xlakern added for drop-in use, beside BrainEvent 0.3.0 in the same run.

Per jitted call and per step of a jitted loop (medians), random CSR with K = 80 synapses per row,
float32 weights, int32 indices:
``binary_csrmv_indexed`` as a scatter with 1% of rows active (and xlakern's plain ``binary_csrmv`` on
the weights gathered first, ``data[perm]``, for comparison), ``csrmv_dt2t`` (one value per synapse),
``csr_slice_rows`` of 256 rows, and the gradient of a ``binary_csrmv`` scatter in its weights (the
training step's weight gradient), also for a fixed-count ``binary_fcnmv``; ``csr_apply_on_pre`` /
``csr_apply_on_post`` with a weight-dependent STDP rule on (weight, eligibility) state, 1% of neurons
active (in the loop, the spikes and the neurons' values change each step). The check column compares
xlakern's result with BrainEvent's.

    python bench/bench_be_api.py [--sizes 40000 400000] [--runs 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import xlakern
from _benchlib import Table, brainevent, err_cell, finish, fmt_t, machine_info, print_header, run_sections, time_fn

K = 80
COLUMNS = ["binary_csrmv_indexed (scatter, 1%)", "binary_csrmv, same weights (xlakern)", "csrmv_dt2t",
           "csr_slice_rows (256 rows)", "grad of binary_csrmv in data (scatter, 1%)",
           "grad of binary_fcnmv in weights (scatter, 1%)", "csr_apply_on_pre (STDP rule, 1%)",
           "csr_apply_on_post (STDP rule, 1%)"]


def stdp_rule(edge, pre, post, p):
    """Weight-dependent STDP with an eligibility trace: the rule both libraries' csr_apply_* run."""
    elig = p * edge["elig"] + post - pre
    return {"w": edge["w"] + 0.01 * (1.5 - edge["w"]) * elig, "elig": elig}


def structure(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=n * K, dtype=np.int32)
    data = rng.standard_normal(n * K).astype(np.float32)
    ptr = np.arange(0, n * K + 1, K, dtype=np.int32)
    perm = rng.permutation(n * K).astype(np.int32)
    spikes = rng.random(n) < 0.01
    y = rng.standard_normal(n).astype(np.float32)
    rows = np.sort(rng.choice(n, 256, replace=False)).astype(np.int32)
    return [jnp.asarray(a) for a in (data, idx, ptr, perm, spikes, y, rows)]


def sliced_rows(arrays, n):
    """The selected rows in float64 NumPy, repeated columns of a row summed (as the dense matrix has them)."""
    data, idx, ptr, _, _, _, rows = (np.asarray(a) for a in arrays)
    out = np.zeros((rows.size, n))
    for k, r in enumerate(rows):
        np.add.at(out[k], idx[ptr[r]:ptr[r + 1]], data[ptr[r]:ptr[r + 1]].astype(np.float64))
    return out


def calls(lib, n, arrays):
    data, idx, ptr, perm, spikes, y, rows = arrays
    shape = (n, n)
    extra = {}
    if lib is brainevent:
        from brainevent._csr.binary import _make_binary_csrmv_benchmark_workspace

        extra = {"workspace": _make_binary_csrmv_benchmark_workspace(ptr)}
    # (function, its arguments, the small argument a timed loop makes each step depend on)
    fns = {
        COLUMNS[0]: (lambda d, i, p, q, s: lib.binary_csrmv_indexed(d, i, p, q, s, shape=shape, transpose=True,
                                                                     **extra), (data, idx, ptr, perm, spikes), 4),
        COLUMNS[2]: (lambda yy, d, i, p: lib.csrmv_dt2t(yy, d, i, p, shape=shape), (y, data, idx, ptr), 0),
        COLUMNS[3]: (lambda d, i, p, r: lib.csr_slice_rows(d, i, p, r, shape=shape), (data, idx, ptr, rows), 3),
        # the weight gradient of a training step: every synapse's row is needed
        COLUMNS[4]: (jax.grad(lambda d, i, p, s, c: jnp.sum(c * lib.binary_csrmv(d, i, p, s, shape=shape,
                                                                                 transpose=True, **extra))),
                     (data, idx, ptr, spikes, y), 4),
        COLUMNS[5]: (jax.grad(lambda d, i, s, c: jnp.sum(c * lib.binary_fcnmv(d, i, s, shape=shape,
                                                                              transpose=True))),
                     (data.reshape(n, K), idx.reshape(n, K), spikes, y), 2),
    }
    for col, apply in ((COLUMNS[6], lib.csr_apply_on_pre), (COLUMNS[7], lib.csr_apply_on_post)):
        def rule_step(d, e, i, p, s, v, apply=apply):
            new = apply(stdp_rule, {"w": d, "elig": e}, i, p, s, pre_vals=v, post_vals=v, params=0.9, shape=shape)
            return new["w"] + new["elig"]
        # the spikes and the neurons' values (traces) change every step, as in a simulation; with the
        # values fixed, XLA computed the whole rule once, outside the loop, and a step was one select
        fns[col] = (rule_step, (data, y[idx], idx, ptr, spikes, y), (4, 5))
    if lib is xlakern:
        fns[COLUMNS[1]] = (lambda d, i, p, q, s: xlakern.binary_csrmv(d[q], i, p, s, shape=shape, transpose=True),
                           (data, idx, ptr, perm, spikes), 4)
    return fns


def in_a_loop(fn, args, vary, steps: int):
    """``fn`` called ``steps`` times in one jitted fori_loop. Each step's ``args[vary]`` (an index, or a
    tuple of them) waits on the previous step (a compare that holds for any finite carry, so the values
    are unchanged) and the carry sums the step's output, so XLA can neither hoist the call nor compute
    the part of it that depends on those arguments outside the loop."""
    def body(a, _, carry):
        a = list(a)
        for k in vary if isinstance(vary, tuple) else (vary,):
            a[k] = jnp.where(carry == carry, a[k], jnp.zeros_like(a[k]))
        return carry + jnp.sum(fn(*a).astype(jnp.float32))
    return jax.jit(lambda *a: jax.lax.fori_loop(0, steps, functools.partial(body, a), jnp.float32(0)))


def _timed(fn, fargs, vary, args):
    """(per jitted call, per loop step, last output, error cell) of one library's function."""
    try:
        t_call, _, out = time_fn(jax.jit(fn), fargs, args.runs, budget=args.budget)
        t_loop, _, _ = time_fn(in_a_loop(fn, fargs, vary, args.steps), fargs, args.runs, budget=args.budget)
        return t_call, t_loop / args.steps, out, None
    except Exception as e:  # noqa: BLE001
        return None, None, None, err_cell(e)


def section(args) -> list[Table]:
    device = jax.devices()[0]
    headers = ["N", "function", "xlakern call", "BrainEvent call", "BE / xk", "xlakern loop step",
               "BrainEvent loop step", "BE / xk", "check"]
    table = Table("be_api", f"BrainEvent 0.3 functions, {device.device_kind}", headers,
                  note=f"K = {K}, float32 weights, int32 indices. Call: one jitted call, dispatch and sync included; "
                       f"loop step: one step of a jitted {args.steps}-step loop whose carry sums each output. "
                       f"Medians of up to {args.runs}.")
    ratio = lambda xk, be: f"{be / xk:.2f}×" if xk and be else ""  # noqa: E731
    for n in args.sizes:
        arrays = structure(n)
        xk = calls(xlakern, n, arrays)
        be = calls(brainevent, n, arrays) if brainevent is not None else {}
        for col in COLUMNS:
            c_xk, l_xk, out_xk, err_xk = _timed(*xk[col], args)
            c_be = l_be = out_be = None
            err_be = "—"
            if col in be:
                c_be, l_be, out_be, err_be = _timed(*be[col], args)
            check = ""
            if out_xk is not None and out_be is not None:
                a, b = np.asarray(out_xk, np.float64), np.asarray(out_be, np.float64)
                check = "ok" if a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-4) else "DIFFERS"
                if col == COLUMNS[3] and check != "ok":  # who is right: the rows in float64 NumPy
                    ref = sliced_rows(arrays, n)
                    check += "; vs NumPy: xk " + ("ok" if np.allclose(a, ref, rtol=1e-4, atol=1e-4) else "wrong")
                    check += ", BE " + ("ok" if np.allclose(b, ref, rtol=1e-4, atol=1e-4) else "wrong")
            cell = lambda t, err: err if err else fmt_t(t)  # noqa: E731
            table.add([f"{n:,}", col, cell(c_xk, err_xk), cell(c_be, err_be), ratio(c_xk, c_be),
                       cell(l_xk, err_xk), cell(l_be, err_be), ratio(l_xk, l_be), check],
                      {"n": n, "fn": col, "xk_call_s": c_xk, "be_call_s": c_be, "xk_step_s": l_xk, "be_step_s": l_be})
    return [table]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[40_000, 400_000])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=20, help="steps of the timed loop")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    info = machine_info()
    print_header("BrainEvent 0.3 functions (bench_be_api.py)", info)
    tables = run_sections([("be_api", lambda: section(args))])
    finish(t0, info, tables, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
