"""Randomised sweeps of the event operators (and their grad, jvp and vmap), the JITC products and the
plasticity updates.

The other event tests pin small shapes and a few large ones. The GPU kernels choose their launch from
the sizes (rows a warp, the bitmask gather's shared memory, batch chunks, scatter teams, dense slices),
so each sweep draws many cases at once: sizes from 1 to 400k (log-uniform), densities, spike rates from
none to all, batches around the chunk widths, every weight, index and spike dtype, one shared weight,
duplicate and unsorted indices. Each case is checked against float64 NumPy, with a bound from each
output's count and sum of absolute terms (so it holds for any order of the adds, atomics included).

A failure lists every failing check with its case's seed, which rebuilds the case
(``_product_case(np.random.default_rng(seed), gpu)`` for a product).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import x64

# The error bound of an output of n non-zero terms, summed in any order: n roundings of the accumulator
# (float32 for every weight dtype but float64) and n of the products or inputs cast to it, each at most
# U_ACC of the sum of |terms|, then one rounding of the result to the weight dtype (U_OUT), plus an
# absolute floor for float16's subnormals (an output of one tiny weight rounds by that spacing).
U_ACC = {np.dtype(np.float64): 2.0**-53, np.dtype(np.float32): 2.0**-24, np.dtype(jnp.float16): 2.0**-24,
         np.dtype(jnp.bfloat16): 2.0**-24}
U_OUT = {np.dtype(np.float64): 2.0**-53, np.dtype(np.float32): 2.0**-24, np.dtype(jnp.float16): 2.0**-11,
         np.dtype(jnp.bfloat16): 2.0**-8}
ATOL = {np.dtype(jnp.float16): 6e-8}
WEIGHT_DTYPES = [np.float32, np.float32, np.float64, jnp.float16, jnp.bfloat16]


def logu(rng, lo, hi):
    """Log-uniform in [lo, hi]."""
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def pick(rng, options):
    return options[int(rng.integers(len(options)))]


def rounded(x, dtype):
    """x as the kernel sees it (rounded to dtype), in float64."""
    return np.asarray(jnp.asarray(x, dtype).astype(jnp.float32 if dtype != np.float64 else jnp.float64),
                      np.float64)


def event_values(rng, shape, binary, spike_dtype):
    """Spikes at a rate drawn per case (none, all, or log-uniform); float ones carry signed values."""
    rate = pick(rng, [0.0, 1.0, None, None, None])
    rate = logu(rng, 1e-3, 0.6) if rate is None else rate
    if len(shape) == 2 and rng.random() < 0.5:  # a different rate in each batch column
        rate = np.where(rng.random(shape[1]) < 0.2, 0.0, rng.uniform(0.0, 2 * rate, shape[1]))
    on = rng.random(shape) < rate
    if spike_dtype == bool:
        return on
    vals = rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)
    return np.where(on, vals if (not binary or np.dtype(spike_dtype).kind == "f") else 1, 0).astype(spike_dtype)


def matmul_ref(a, f):
    """float64 a @ f, with each output's sum of |terms| and count of non-zero terms: what check takes."""
    return a @ f, np.abs(a) @ np.abs(f), (a != 0).astype(np.float64) @ (f != 0).astype(np.float64)


def scatter_ref(n_out, dst, terms):
    """Sums of the rows of `terms` into rows `dst` of an (n_out, ...) output, as matmul_ref returns them."""
    shape = (n_out,) + terms.shape[1:]
    ref, absref, count = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    np.add.at(ref, dst, terms)
    np.add.at(absref, dst, np.abs(terms))
    np.add.at(count, dst, (terms != 0).astype(np.float64))
    return ref, absref, count


def row_sums_ref(terms):
    """Each row's sum of `terms` (rows: outputs), as matmul_ref returns them."""
    return terms.sum(1), np.abs(terms).sum(1), (terms != 0).sum(1).astype(np.float64)


def reshaped(expected, shape):
    return tuple(x.reshape(shape) for x in expected)


def check(out, expected, dtype, what, failures):
    """out against expected = (float64 reference, sum of |terms|, count of terms), within the bound above."""
    ref, absref, count = expected
    out = np.asarray(jnp.asarray(out).astype(jnp.float64 if dtype == np.float64 else jnp.float32), np.float64)
    if out.shape != ref.shape:
        failures.append(f"{what}: shape {out.shape}, expected {ref.shape}")
        return
    err = np.abs(out - ref)
    dt = np.dtype(dtype)
    bound = (2 * count * U_ACC[dt] + U_OUT[dt]) * 1.01 * absref + ATOL.get(dt, 1e-300)
    bad = ~(err <= bound)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        failures.append(f"{what}: {int(bad.sum())} of {bad.size} outputs off, e.g. at {i}: "
                        f"{float(out[i])!r} against {float(ref[i])!r} (bound {float(bound[i]):.3g})")


def sparse_rows(rng, rows, cols, k_mean, fixed):
    """Row lengths and column indices: Poisson lengths with some empty rows (CSR) or exactly K a row
    (fixed count). Columns are drawn with replacement (duplicates add), sorted in some cases only."""
    if fixed:
        counts = np.full(rows, min(int(round(k_mean)), cols) if cols else 0)
    else:
        counts = rng.poisson(k_mean, rows) if cols else np.zeros(rows, int)
        if rows > 2 and rng.random() < 0.4:
            counts[rng.random(rows) < 0.3] = 0
    idx = rng.integers(0, max(cols, 1), int(counts.sum()))
    row_of = np.repeat(np.arange(rows), counts)
    if rng.random() < 0.5:  # each row's columns in order
        order = np.lexsort((idx, row_of))
        idx = idx[order]
    return counts, idx, row_of


def _product_case(rng, gpu):
    """One random event product: (description, (function, args, kwargs), expected as check takes it, weight
    dtype)."""
    family = pick(rng, ["csr", "csr", "fcn", "dense"])
    binary, mm, transpose = bool(rng.random() < 0.7), bool(rng.random() < 0.4), bool(rng.random() < 0.5)
    wdt = pick(rng, WEIGHT_DTYPES)
    idt = pick(rng, [np.int32, np.int64])
    sdt = pick(rng, [bool, bool, np.int8, np.int32, np.float32, np.float16]) if binary \
        else pick(rng, [np.float32, np.float64])
    big = gpu and rng.random() < 0.35
    limit = 400_000 if big else 5_000
    rows, cols = int(logu(rng, 1, limit)), int(logu(rng, 1, limit))
    batch = pick(rng, [1, 2, 7, 8, 9, 16, 17, 33, 40]) if mm else None
    n_in, n_out = (rows, cols) if transpose else (cols, rows)
    if family == "dense":
        cap = 4_000_000 if gpu else 250_000
        while rows * cols > cap:
            rows, cols = max(1, rows // 2), max(1, cols // 2)
        n_in, n_out = (rows, cols) if transpose else (cols, rows)
        dense = rounded(np.where(rng.random((rows, cols)) < logu(rng, 0.01, 1.0),
                                 rng.standard_normal((rows, cols)), 0.0), wdt)
        v = event_values(rng, (n_in,) if batch is None else (n_in, batch), binary, sdt)
        f = (v != 0).astype(np.float64) if binary else v.astype(np.float64)
        expected = matmul_ref(dense.T if transpose else dense, f)
        fn = xlakern.binary_densemm if mm else xlakern.binary_densemv
        args = (jnp.asarray(dense, wdt), jnp.asarray(v))
        kw = dict(transpose=transpose, weighted=not binary)
        what = f"dense {rows}x{cols}"
    else:
        cap = 3_000_000 if gpu else 200_000
        k_mean = min(logu(rng, 0.3, 300), cap / max(rows, 1))
        counts, idx, row_of = sparse_rows(rng, rows, cols, k_mean, family == "fcn")
        homo = rng.random() < 0.25
        w = rounded(rng.standard_normal(1 if homo else idx.size), wdt)
        w_syn = np.broadcast_to(w, idx.shape)
        v = event_values(rng, (n_in,) if batch is None else (n_in, batch), binary, sdt)
        f = (v != 0).astype(np.float64) if binary else v.astype(np.float64)
        f2 = f if f.ndim == 2 else f[:, None]
        src, dst = (row_of, idx) if transpose else (idx, row_of)  # the input each synapse reads, where it adds
        expected = scatter_ref(n_out, dst, w_syn[:, None] * f2[src])
        if f.ndim == 1:
            expected = reshaped(expected, (n_out,))
        data = jnp.asarray(w, wdt)
        if family == "csr":
            indptr = np.concatenate([[0], np.cumsum(counts)])
            fn = {(True, False): xlakern.binary_csrmv, (True, True): xlakern.binary_csrmm,
                  (False, False): xlakern.csrmv, (False, True): xlakern.csrmm}[(binary, mm)]
            args = (data, jnp.asarray(idx, idt), jnp.asarray(indptr, idt), jnp.asarray(v))
        else:
            fn = {(True, False): xlakern.binary_fcnmv, (True, True): xlakern.binary_fcnmm,
                  (False, False): xlakern.fcnmv, (False, True): xlakern.fcnmm}[(binary, mm)]
            k = int(counts[0]) if rows else 0
            w2 = data if homo else data.reshape(rows, k)
            args = (w2, jnp.asarray(idx.reshape(rows, k), idt), jnp.asarray(v))
        kw = dict(shape=(rows, cols), transpose=transpose)
        what = f"{family} {rows}x{cols} nse={idx.size}{' shared weight' if homo else ''}"
    what += (f" {fn.__name__} transpose={transpose} batch={batch} weights={np.dtype(wdt).name} "
             f"indices={np.dtype(idt).name} spikes={np.dtype(sdt).name} active={int((v != 0).sum())}")
    return what, (fn, args, kw), expected, wdt


def _product_sweep(cases, gpu, failures):
    """Runs `cases` product cases, each from its own seed (listed with its failure)."""
    backend = "cuda" if gpu else "cpp"
    for seed in np.random.SeedSequence().generate_state(cases):
        what, (fn, args, kw), expected, wdt = _product_case(np.random.default_rng(int(seed)), gpu)
        try:
            out = fn(*args, **kw, backend=backend)
        except Exception as e:  # noqa: BLE001 (every failure is listed with its case)
            failures.append(f"[seed {seed}] {what}: raised {type(e).__name__}: {e}")
            continue
        if np.dtype(out.dtype) != np.dtype(wdt):
            failures.append(f"[seed {seed}] {what}: result dtype {out.dtype}, expected {np.dtype(wdt)}")
        check(out, expected, wdt, f"[seed {seed}] {what}", failures)


def _run(sweep, cases, gpu):
    """sweep(cases, gpu, failures) with 64-bit dtypes on (int64 indices and float64 weights need them);
    fails with every failing case listed."""
    failures: list[str] = []
    with x64():
        sweep(cases, gpu, failures)
    assert not failures, f"{len(failures)} failed checks in {cases} cases:\n" + "\n".join(failures)


def test_event_products_sweep(on_cpu):
    _run(_product_sweep, 40, False)


@pytest.mark.gpu
def test_event_products_sweep_gpu():
    _run(_product_sweep, 160, True)


# ----------------------------------------------------------------------------- just-in-time connectivity

JITC_PARAMS = {"s": lambda rng: (rng.uniform(-1, 1),), "u": lambda rng: tuple(np.sort(rng.uniform(-1, 1, 2))),
               "n": lambda rng: (rng.uniform(-1, 1), rng.uniform(0.05, 1))}


def _jitc_case(rng, gpu):
    """One random JITC product against its own materialised matrix (``jit{s,u,n}``, on the same
    platform, which other tests tie to the CPU's and jnp's bit for bit)."""
    letter = pick(rng, "sun")
    binary, mm, transpose, corder = (bool(rng.random() < 0.6), bool(rng.random() < 0.4), bool(rng.random() < 0.5),
                                     bool(rng.random() < 0.5))
    wdt = pick(rng, [np.float32, np.float64])
    limit, cap = (60_000, 4_000_000) if gpu else (3_000, 300_000)
    rows, cols = int(logu(rng, 1, limit)), int(logu(rng, 1, limit))
    while rows * cols > cap:
        rows, cols = max(1, rows // 2), max(1, cols // 2)
    gcols = cols if corder else rows  # the length of the rows the generator walks (its table's columns)
    prob = min(1.0, logu(rng, 0.3, 1_500) / max(gcols, 1))
    seed = int(rng.integers(0, 2**31))
    params = tuple(wdt(p) for p in JITC_PARAMS[letter](rng))
    batch = pick(rng, [1, 3, 8, 9, 16, 17, 40]) if mm else None
    n_in = rows if transpose else cols
    sdt = pick(rng, [bool, np.float32]) if binary else wdt
    v = event_values(rng, (n_in,) if batch is None else (n_in, batch), binary, sdt)
    name = ("binary_" if binary else "") + "jit" + letter + ("mm" if mm else "mv")
    fn = getattr(xlakern, name)
    return name, (fn, params, prob, v, seed, (rows, cols), transpose, corder), letter, wdt


def _jitc_sweep(cases, gpu, failures):
    backend = "cuda" if gpu else "cpp"
    for case_seed in np.random.SeedSequence().generate_state(cases):
        name, (fn, params, prob, v, seed, shape, transpose, corder), letter, wdt = _jitc_case(
            np.random.default_rng(int(case_seed)), gpu)
        what = (f"[seed {case_seed}] {name} shape={shape} prob={prob:.3g} seed={seed} transpose={transpose} "
                f"corder={corder} weights={np.dtype(wdt).name} v={v.shape}/{np.dtype(v.dtype).name}")
        try:
            m = np.asarray(getattr(xlakern, "jit" + letter)(*params, prob, seed, shape=shape, corder=corder,
                                                            backend=backend), np.float64)
            out = fn(*params, prob, jnp.asarray(v), seed, shape=shape, transpose=transpose, corder=corder,
                     backend=backend)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{what}: raised {type(e).__name__}: {e}")
            continue
        f = (v != 0).astype(np.float64) if name.startswith("binary") else v.astype(np.float64)
        a = m.T if transpose else m
        if np.dtype(out.dtype) != np.dtype(wdt):
            failures.append(f"{what}: result dtype {out.dtype}, expected {np.dtype(wdt)}")
        check(out, matmul_ref(a, f), wdt, what, failures)


def test_jitc_products_sweep(on_cpu):
    _run(_jitc_sweep, 16, False)


@pytest.mark.gpu
def test_jitc_products_sweep_gpu():
    _run(_jitc_sweep, 60, True)


# ----------------------------------------------------------------------------- plasticity

def _plasticity_sweep(cases, gpu, failures):
    """update_csr_on_binary_pre / _post and update_fixed_post_conn_on_binary_pre on random structures
    (duplicates included: each slot owns its weight), one step each, against NumPy."""
    backend = "cuda" if gpu else "cpp"
    for case_seed in np.random.SeedSequence().generate_state(cases):
        rng = np.random.default_rng(int(case_seed))
        which = pick(rng, ["csr_pre", "csr_post", "fcn_pre"])
        wdt = pick(rng, [np.float32, np.float64])
        idt = pick(rng, [np.int32, np.int64])
        limit, cap = (400_000, 3_000_000) if gpu and rng.random() < 0.4 else (5_000, 200_000)
        n_pre, n_post = int(logu(rng, 1, limit)), int(logu(rng, 1, limit))
        k_mean = min(logu(rng, 0.3, 300), cap / n_pre)
        counts, idx, row_of = sparse_rows(rng, n_pre, n_post, k_mean, which == "fcn_pre")
        w = rng.uniform(0, 1, idx.size).astype(wdt)
        lo, hi = (wdt(0.1), wdt(0.9)) if rng.random() < 0.8 else (None, None)
        rate = logu(rng, 1e-3, 0.6) if rng.random() < 0.8 else float(pick(rng, [0.0, 1.0]))
        what = (f"[seed {case_seed}] {which} {n_pre}x{n_post} nse={idx.size} weights={np.dtype(wdt).name} "
                f"indices={np.dtype(idt).name} rate={rate:.3g} bounds={lo, hi}")
        want = w.astype(np.float64)
        try:
            if which in ("csr_pre", "fcn_pre"):
                spk = rng.random(n_pre) < rate
                trace = rng.uniform(-0.5, 0.5, n_post).astype(wdt)
                touched = spk[row_of]
                want[touched] += trace[idx[touched]]
                if which == "csr_pre":
                    indptr = np.concatenate([[0], np.cumsum(counts)])
                    out = xlakern.update_csr_on_binary_pre(jnp.asarray(w), jnp.asarray(idx, idt),
                                                           jnp.asarray(indptr, idt), jnp.asarray(spk),
                                                           jnp.asarray(trace), lo, hi, shape=(n_pre, n_post),
                                                           backend=backend)
                else:
                    k = int(counts[0])
                    out = xlakern.update_fixed_post_conn_on_binary_pre(
                        jnp.asarray(w.reshape(n_pre, k)), jnp.asarray(idx.reshape(n_pre, k), idt), jnp.asarray(spk),
                        jnp.asarray(trace), lo, hi, shape=(n_pre, n_post), backend=backend).reshape(-1)
            else:
                spk = rng.random(n_post) < rate
                trace = rng.uniform(-0.5, 0.5, n_pre).astype(wdt)
                touched = spk[idx]
                want[touched] += trace[row_of[touched]]
                perm = np.argsort(idx, kind="stable")  # the CSC view of the CSR synapses
                csc_indptr = np.concatenate([[0], np.cumsum(np.bincount(idx, minlength=n_post))])
                out = xlakern.update_csr_on_binary_post(jnp.asarray(w), jnp.asarray(row_of[perm], idt),
                                                        jnp.asarray(csc_indptr, idt), jnp.asarray(perm, idt),
                                                        jnp.asarray(trace), jnp.asarray(spk), lo, hi,
                                                        shape=(n_pre, n_post), backend=backend)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{what}: raised {type(e).__name__}: {e}")
            continue
        if lo is not None:
            want[touched] = np.clip(want[touched], lo, hi)
        # one rounding of one add (and a clip, exact): the result equals the float64 sum rounded to wdt
        want = want.astype(wdt)
        got = np.asarray(out)
        if got.dtype != np.dtype(wdt) or got.shape != want.shape or not np.array_equal(got, want):
            bad = np.flatnonzero(got != want) if got.shape == want.shape else []
            failures.append(f"{what}: dtype {got.dtype}, shape {got.shape}; {len(bad)} weights differ"
                            + (f", e.g. slot {bad[0]}: {got[bad[0]]!r} against {want[bad[0]]!r}" if len(bad) else ""))


def test_plasticity_sweep(on_cpu):
    _run(_plasticity_sweep, 24, False)


@pytest.mark.gpu
def test_plasticity_sweep_gpu():
    _run(_plasticity_sweep, 60, True)


# ----------------------------------------------------------------------------- transformations

def _transform_case(rng, gpu):
    """One random product under grad (weights and float spikes), jvp (weights) and, for an mv, vmap over
    spikes; each checked against float64 NumPy with the same |terms| bound."""
    family = pick(rng, ["csr", "csr", "fcn", "dense"])
    binary, transpose, mm = bool(rng.random() < 0.5), bool(rng.random() < 0.5), bool(rng.random() < 0.3)
    wdt = pick(rng, [np.float32, np.float64])
    idt = pick(rng, [np.int32, np.int64])
    limit, cap = (100_000, 1_000_000) if gpu and rng.random() < 0.35 else (2_000, 100_000)
    rows, cols = int(logu(rng, 1, limit)), int(logu(rng, 1, limit))
    batch = pick(rng, [1, 2, 8, 9, 17]) if mm else None
    n_in, n_out = (rows, cols) if transpose else (cols, rows)
    if family == "dense":
        while rows * cols > cap:
            rows, cols = max(1, rows // 2), max(1, cols // 2)
        n_in, n_out = (rows, cols) if transpose else (cols, rows)
        w = rng.standard_normal((rows, cols)).astype(wdt)
        src = dst = None
    else:
        k_mean = min(logu(rng, 0.3, 200), cap / max(rows, 1))
        counts, idx, row_of = sparse_rows(rng, rows, cols, k_mean, family == "fcn")
        homo = rng.random() < 0.25
        w = rng.standard_normal(1 if homo else idx.size).astype(wdt)
        src, dst = (row_of, idx) if transpose else (idx, row_of)
    v = event_values(rng, (n_in,) if batch is None else (n_in, batch), False, wdt)

    def forward(d, x):
        if family == "dense":
            fn = xlakern.binary_densemm if x.ndim == 2 else xlakern.binary_densemv
            return fn(d, x, transpose=transpose, weighted=not binary)
        if family == "csr":
            fn = {(True, 1): xlakern.binary_csrmv, (True, 2): xlakern.binary_csrmm, (False, 1): xlakern.csrmv,
                  (False, 2): xlakern.csrmm}[(binary, x.ndim)]
            indptr = np.concatenate([[0], np.cumsum(counts)])
            return fn(d, jnp.asarray(idx, idt), jnp.asarray(indptr, idt), x, shape=(rows, cols), transpose=transpose)
        fn = {(True, 1): xlakern.binary_fcnmv, (True, 2): xlakern.binary_fcnmm, (False, 1): xlakern.fcnmv,
              (False, 2): xlakern.fcnmm}[(binary, x.ndim)]
        k = int(counts[0])
        dd = d if d.size == 1 else d.reshape(rows, k)
        return fn(dd, jnp.asarray(idx.reshape(rows, k), idt), x, shape=(rows, cols), transpose=transpose)

    def product(wv, x):
        """float64 product of weights wv (w's layout) with inputs x (n_in, b), as matmul_ref returns it."""
        f = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
        if family == "dense":
            a = wv.astype(np.float64)
            return matmul_ref(a.T if transpose else a, f)
        return scatter_ref(n_out, dst, np.broadcast_to(wv.astype(np.float64), src.shape)[:, None] * f[src])

    def grads(cot, x):
        """float64 gradients of sum(cot * out) in the weights and in the spikes (the dense product in the
        other orientation, the surrogate for binary ones), as matmul_ref returns them."""
        f = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
        if family == "dense":
            a = w.astype(np.float64)
            gw = matmul_ref(f, cot.T) if transpose else matmul_ref(cot, f.T)
            return gw, matmul_ref(a, cot) if transpose else matmul_ref(a.T, cot)
        per = cot[dst] * f[src]  # (synapse, batch column)
        gw = row_sums_ref(per.reshape(1, -1) if w.size == 1 else per)
        wsyn = np.broadcast_to(w.astype(np.float64), src.shape)[:, None]
        return gw, scatter_ref(n_in, src, wsyn * cot[dst])

    what = (f"{family} {rows}x{cols} {'binary' if binary else 'float'} transpose={transpose} batch={batch} "
            f"weights={np.dtype(wdt).name} indices={np.dtype(idt).name}"
            + (f" nse={src.size}{' shared weight' if w.size == 1 else ''}" if src is not None else ""))
    return what, forward, product, grads, w, v, wdt, n_in


def _transform_sweep(cases, gpu, failures):
    device = jax.devices("gpu" if gpu else "cpu")[0]
    for case_seed in np.random.SeedSequence().generate_state(cases):
        rng = np.random.default_rng(int(case_seed))
        what, forward, product, grads, w, v, wdt, n_in = _transform_case(rng, gpu)
        what = f"[seed {case_seed}] {what}"
        x2 = v if v.ndim == 2 else v[:, None]
        try:
            with jax.default_device(device):
                d, x = jnp.asarray(w), jnp.asarray(v)
                out = forward(d, x)
                cot = rng.standard_normal(out.shape).astype(wdt)  # as the kernels see it
                gd, gx = jax.jit(jax.grad(lambda d, x: jnp.sum(jnp.asarray(cot) * forward(d, x)), (0, 1)))(d, x)
                t = rng.standard_normal(w.shape).astype(wdt)
                tangent = jax.jvp(lambda d: forward(d, x), (d,), (jnp.asarray(t),))[1]
                S = None
                if v.ndim == 1:  # a batch of mv spikes, mapped: one mm launch
                    S = event_values(rng, (int(rng.integers(1, 6)), n_in), False, wdt)
                    mapped = jax.vmap(lambda s: forward(d, s))(jnp.asarray(S))
        except Exception as e:  # noqa: BLE001
            failures.append(f"{what}: raised {type(e).__name__}: {e}")
            continue
        expected = product(w, x2)
        shape = expected[0].shape if v.ndim == 2 else expected[0].shape[:1]
        check(out, reshaped(expected, shape), wdt, f"{what} forward", failures)
        gw, gv = grads(cot.astype(np.float64).reshape(expected[0].shape), x2)
        check(gd, reshaped(gw, w.shape), wdt, f"{what} d/dweights", failures)
        check(gx, reshaped(gv, v.shape), wdt, f"{what} d/dspikes", failures)
        check(tangent, reshaped(product(t, x2), shape), wdt, f"{what} jvp in the weights", failures)
        if S is not None:
            check(mapped, tuple(x.T for x in product(w, S.T)), wdt, f"{what} vmap over {S.shape[0]} spike vectors",
                  failures)


def test_transformations_sweep(on_cpu):
    _run(_transform_sweep, 24, False)


@pytest.mark.gpu
def test_transformations_sweep_gpu():
    _run(_transform_sweep, 60, True)
