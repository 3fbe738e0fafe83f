"""Randomised sweeps of the event operators (and their grad, jvp and vmap), the JITC products and the
plasticity updates.

The other event tests pin small shapes and a few large ones. The GPU kernels choose their launch from
the sizes (rows a warp, the bitmask gather's shared memory, batch chunks, scatter teams, dense slices),
so each sweep draws many cases at once: sizes from 1 to 400k (log-uniform), densities, spike rates from
none to all, batches around the chunk widths, every weight, index and spike dtype, one shared weight,
duplicate and unsorted indices. Each case is checked against float64 NumPy, with a bound from each
output's count and sum of absolute terms (so it holds for any order of the adds, atomics included).

A failure lists every failing check with its case's seed, which rebuilds the case
(``_product_case(np.random.default_rng(seed), gpu)`` for a product, and so on).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from _event_cases import OPS
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
    """out (of dtype) against expected = (float64 reference, sum of |terms|, count of terms), within the
    bound above; a zero count and sum ask for the reference exactly."""
    ref, absref, count = expected
    if np.dtype(out.dtype) != np.dtype(dtype):
        failures.append(f"{what}: dtype {out.dtype}, expected {np.dtype(dtype)}")
    out = np.asarray(jnp.asarray(out).astype(jnp.float64 if dtype == np.float64 else jnp.float32), np.float64)
    if out.shape != ref.shape:
        failures.append(f"{what}: shape {out.shape}, expected {ref.shape}")
        return
    err = np.abs(out - ref)
    dt = np.dtype(dtype)
    bound = (2 * count * U_ACC[dt] + U_OUT[dt]) * 1.01 * absref + ATOL.get(dt, 0.0)
    bad = ~(err <= bound)
    # An output whose exact sum may lie past the dtype's largest finite value rounds to an infinity of
    # its sign: that is the right float16 answer for sums beyond 65,504, not an error.
    may_overflow = np.abs(ref) + bound > float(jnp.finfo(dtype).max)
    bad &= ~(may_overflow & np.isinf(out) & (np.sign(out) == np.sign(ref)))
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        failures.append(f"{what}: {int(bad.sum())} of {bad.size} outputs off, e.g. at {i}: "
                        f"{float(out[i])!r} against {float(ref[i])!r} (bound {float(bound[i]):.3g})")


def _sweep(case, cases, gpu, failures):
    """Draws `cases` cases, each from its own seed: case(rng, gpu) -> (description, compute), where
    compute(backend) returns the checks [(label, result, expected, dtype)]."""
    backend = "cuda" if gpu else "cpp"
    for seed in np.random.SeedSequence().generate_state(cases):
        what, compute = case(np.random.default_rng(int(seed)), gpu)
        what = f"[seed {seed}] {what}"
        try:
            results = compute(backend)
        except Exception as e:  # noqa: BLE001 (every failure is listed with its case)
            failures.append(f"{what}: raised {type(e).__name__}: {e}")
            continue
        for label, out, expected, dtype in results:
            check(out, expected, dtype, what + label, failures)


def _run(case, cases, gpu):
    """_sweep with 64-bit dtypes on (int64 indices and float64 weights need them); fails with every
    failing check listed."""
    failures: list[str] = []
    with x64():
        _sweep(case, cases, gpu, failures)
    assert not failures, f"{len(failures)} failed checks in {cases} cases:\n" + "\n".join(failures)


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


class Layout:
    """A random structure of one family: a dense (rows, cols) matrix, or CSR / fixed-count synapses."""

    def __init__(self, rng, family, rows, cols, cap):
        self.family = family
        if family == "dense":
            while rows * cols > cap:
                rows, cols = max(1, rows // 2), max(1, cols // 2)
        else:
            k_mean = min(logu(rng, 0.3, 300), cap / max(rows, 1))
            self.counts, self.idx, self.row_of = sparse_rows(rng, rows, cols, k_mean, family == "fcn")
        self.rows, self.cols = rows, cols

    def weights(self, rng, dtype, homo=False, density=1.0):
        """Random weights in the layout's shape (one shared weight if homo), rounded to dtype, in float64."""
        if self.family == "dense":
            shape = (self.rows, self.cols)
            return rounded(np.where(rng.random(shape) < density, rng.standard_normal(shape), 0.0), dtype)
        return rounded(rng.standard_normal(1 if homo else self.idx.size), dtype)

    def ends(self, transpose):
        """Each synapse's input (its row, or its column for transpose=False) and output: (src, dst)."""
        return (self.row_of, self.idx) if transpose else (self.idx, self.row_of)

    def call(self, binary, d, x, transpose, idt, backend):
        """The family's operator (_event_cases.OPS) on weights d (this layout's) and inputs x."""
        fn = OPS[(self.family, binary or self.family == "dense", x.ndim == 2)]
        if self.family == "dense":
            return fn(d, x, transpose=transpose, weighted=not binary, backend=backend)
        shape, idx = (self.rows, self.cols), jnp.asarray(self.idx, idt)
        if self.family == "csr":
            indptr = jnp.asarray(np.concatenate([[0], np.cumsum(self.counts)]), idt)
            return fn(d, idx, indptr, x, shape=shape, transpose=transpose, backend=backend)
        k = int(self.counts[0]) if self.rows else 0
        return fn(d if d.size == 1 else d.reshape(self.rows, k), idx.reshape(self.rows, k), x, shape=shape,
                  transpose=transpose, backend=backend)

    def product(self, binary, w, x, transpose):
        """float64 product of weights w (float64, this layout's) with inputs x (n_in, batch), as matmul_ref
        returns it."""
        f = (x != 0).astype(np.float64) if binary else x.astype(np.float64)
        if self.family == "dense":
            return matmul_ref(w.T if transpose else w, f)
        src, dst = self.ends(transpose)
        n_out = self.cols if transpose else self.rows
        return scatter_ref(n_out, dst, np.broadcast_to(w, src.shape)[:, None] * f[src])

    def describe(self, w):
        if self.family == "dense":
            return f"dense {self.rows}x{self.cols}"
        return f"{self.family} {self.rows}x{self.cols} nse={self.idx.size}{' shared weight' if w.size == 1 else ''}"


def _sizes(rng, limit):
    return int(logu(rng, 1, limit)), int(logu(rng, 1, limit))


def _product_case(rng, gpu):
    """One random event product against float64 NumPy."""
    family = pick(rng, ["csr", "csr", "fcn", "dense"])
    binary, mm, transpose = bool(rng.random() < 0.7), bool(rng.random() < 0.4), bool(rng.random() < 0.5)
    wdt = pick(rng, WEIGHT_DTYPES)
    idt = pick(rng, [np.int32, np.int64])
    sdt = pick(rng, [bool, bool, np.int8, np.int32, np.float32, np.float16]) if binary \
        else pick(rng, [np.float32, np.float64])
    rows, cols = _sizes(rng, 400_000 if gpu and rng.random() < 0.35 else 5_000)
    batch = pick(rng, [1, 2, 7, 8, 9, 16, 17, 33, 40]) if mm else None
    if family == "dense":
        layout = Layout(rng, family, rows, cols, 4_000_000 if gpu else 250_000)
        w = layout.weights(rng, wdt, density=logu(rng, 0.01, 1.0))
    else:
        layout = Layout(rng, family, rows, cols, 3_000_000 if gpu else 200_000)
        w = layout.weights(rng, wdt, homo=rng.random() < 0.25)
    n_in = layout.rows if transpose else layout.cols
    v = event_values(rng, (n_in,) if batch is None else (n_in, batch), binary, sdt)
    expected = layout.product(binary, w, v if v.ndim == 2 else v[:, None], transpose)
    if v.ndim == 1:
        expected = reshaped(expected, expected[0].shape[:1])
    what = (f"{layout.describe(w)} binary={binary} transpose={transpose} batch={batch} "
            f"weights={np.dtype(wdt).name} indices={np.dtype(idt).name} spikes={np.dtype(sdt).name} "
            f"active={int((v != 0).sum())}")
    return what, lambda backend: [
        ("", layout.call(binary, jnp.asarray(w, wdt), jnp.asarray(v), transpose, idt, backend), expected, wdt)]


def test_event_products_sweep(on_cpu):
    _run(_product_case, 40, False)


@pytest.mark.gpu
def test_event_products_sweep_gpu():
    _run(_product_case, 160, True)


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
    rows, cols = _sizes(rng, limit)
    while rows * cols > cap:
        rows, cols = max(1, rows // 2), max(1, cols // 2)
    gcols = cols if corder else rows  # the length of the rows the generator walks (its table's columns)
    prob = min(1.0, logu(rng, 0.3, 1_500) / max(gcols, 1))
    seed = int(rng.integers(0, 2**31))
    params = tuple(wdt(p) for p in JITC_PARAMS[letter](rng))
    batch = pick(rng, [1, 3, 8, 9, 16, 17, 40]) if mm else None
    n_in = rows if transpose else cols
    v = event_values(rng, (n_in,) if batch is None else (n_in, batch), binary,
                     pick(rng, [bool, np.float32]) if binary else wdt)
    name = ("binary_" if binary else "") + "jit" + letter + ("mm" if mm else "mv")
    kw = dict(shape=(rows, cols), corder=corder)

    def compute(backend):
        m = np.asarray(getattr(xlakern, "jit" + letter)(*params, prob, seed, **kw, backend=backend), np.float64)
        out = getattr(xlakern, name)(*params, prob, jnp.asarray(v), seed, **kw, transpose=transpose, backend=backend)
        f = (v != 0).astype(np.float64) if binary else v.astype(np.float64)
        return [("", out, matmul_ref(m.T if transpose else m, f), wdt)]

    return (f"{name} shape={(rows, cols)} prob={prob:.3g} seed={seed} transpose={transpose} corder={corder} "
            f"weights={np.dtype(wdt).name} v={v.shape}/{np.dtype(v.dtype).name}"), compute


def test_jitc_products_sweep(on_cpu):
    _run(_jitc_case, 16, False)


@pytest.mark.gpu
def test_jitc_products_sweep_gpu():
    _run(_jitc_case, 60, True)


# ----------------------------------------------------------------------------- plasticity

def _plasticity_case(rng, gpu):
    """update_csr_on_binary_pre / _post or update_fixed_post_conn_on_binary_pre on a random structure
    (duplicates included: each slot owns its weight), one step, against NumPy exactly: a weight takes one
    add and a clip, so it is the float64 result rounded once."""
    which = pick(rng, ["csr_pre", "csr_post", "fcn_pre"])
    wdt = pick(rng, [np.float32, np.float64])
    idt = pick(rng, [np.int32, np.int64])
    limit, cap = (400_000, 3_000_000) if gpu and rng.random() < 0.4 else (5_000, 200_000)
    n_pre, n_post = _sizes(rng, limit)
    layout = Layout(rng, "fcn" if which == "fcn_pre" else "csr", n_pre, n_post, cap)
    idx, row_of = layout.idx, layout.row_of
    w = rng.uniform(0, 1, idx.size).astype(wdt)
    lo, hi = (wdt(0.1), wdt(0.9)) if rng.random() < 0.8 else (None, None)
    rate = logu(rng, 1e-3, 0.6) if rng.random() < 0.8 else float(pick(rng, [0.0, 1.0]))
    on_pre = which != "csr_post"
    spk = rng.random(n_pre if on_pre else n_post) < rate
    trace = rng.uniform(-0.5, 0.5, n_post if on_pre else n_pre).astype(wdt)
    touched = spk[row_of] if on_pre else spk[idx]
    want = w.astype(np.float64)
    want[touched] += trace[idx[touched]] if on_pre else trace[row_of[touched]]
    if lo is not None:
        want[touched] = np.clip(want[touched], lo, hi)
    exact = (want.astype(wdt).astype(np.float64), np.zeros_like(want), np.zeros_like(want))

    def compute(backend):
        spikes, traces, kw = jnp.asarray(spk), jnp.asarray(trace), dict(shape=(n_pre, n_post), backend=backend)
        if which == "csr_pre":
            indptr = np.concatenate([[0], np.cumsum(layout.counts)])
            out = xlakern.update_csr_on_binary_pre(jnp.asarray(w), jnp.asarray(idx, idt), jnp.asarray(indptr, idt),
                                                   spikes, traces, lo, hi, **kw)
        elif which == "fcn_pre":
            k = int(layout.counts[0])
            out = xlakern.update_fixed_post_conn_on_binary_pre(jnp.asarray(w.reshape(n_pre, k)),
                                                               jnp.asarray(idx.reshape(n_pre, k), idt), spikes,
                                                               traces, lo, hi, **kw).reshape(-1)
        else:
            perm = np.argsort(idx, kind="stable")  # the CSC view of the CSR synapses
            csc_indptr = np.concatenate([[0], np.cumsum(np.bincount(idx, minlength=n_post))])
            out = xlakern.update_csr_on_binary_post(jnp.asarray(w), jnp.asarray(row_of[perm], idt),
                                                    jnp.asarray(csc_indptr, idt), jnp.asarray(perm, idt), traces,
                                                    spikes, lo, hi, **kw)
        return [("", out, exact, wdt)]

    return (f"{which} {n_pre}x{n_post} nse={idx.size} weights={np.dtype(wdt).name} indices={np.dtype(idt).name} "
            f"rate={rate:.3g} bounds={lo, hi}"), compute


def test_plasticity_sweep(on_cpu):
    _run(_plasticity_case, 24, False)


@pytest.mark.gpu
def test_plasticity_sweep_gpu():
    _run(_plasticity_case, 60, True)


# ----------------------------------------------------------------------------- transformations

def _transform_case(rng, gpu):
    """One random product under grad (weights and float spikes), jvp (weights) and, for an mv, vmap over
    spikes; each checked against float64 NumPy with the same bound."""
    family = pick(rng, ["csr", "csr", "fcn", "dense"])
    binary, transpose, mm = bool(rng.random() < 0.5), bool(rng.random() < 0.5), bool(rng.random() < 0.3)
    wdt = pick(rng, [np.float32, np.float64])
    idt = pick(rng, [np.int32, np.int64])
    limit, cap = (100_000, 1_000_000) if gpu and rng.random() < 0.35 else (2_000, 100_000)
    rows, cols = _sizes(rng, limit)
    batch = pick(rng, [1, 2, 8, 9, 17]) if mm else None
    layout = Layout(rng, family, rows, cols, cap)
    w = layout.weights(rng, wdt, homo=family != "dense" and rng.random() < 0.25)
    n_in = layout.rows if transpose else layout.cols
    v = event_values(rng, (n_in,) if batch is None else (n_in, batch), False, wdt)
    x2 = v if v.ndim == 2 else v[:, None]

    def grads(cot):
        """float64 gradients of sum(cot * out) in the weights and in the spikes (the dense product in the
        other orientation, the surrogate for binary ones), as matmul_ref returns them."""
        f = (x2 != 0).astype(np.float64) if binary else x2.astype(np.float64)
        if family == "dense":
            gw = matmul_ref(f, cot.T) if transpose else matmul_ref(cot, f.T)
            return gw, matmul_ref(w, cot) if transpose else matmul_ref(w.T, cot)
        src, dst = layout.ends(transpose)
        per = cot[dst] * f[src]  # (synapse, batch column)
        gw = row_sums_ref(per.reshape(1, -1) if w.size == 1 else per)
        return gw, scatter_ref(n_in, src, np.broadcast_to(w, src.shape)[:, None] * cot[dst])

    def compute(backend):
        def forward(d, x):
            return layout.call(binary, d, x, transpose, idt, backend)

        d, x = jnp.asarray(w, wdt), jnp.asarray(v)
        expected = layout.product(binary, w, x2, transpose)
        shape = expected[0].shape if v.ndim == 2 else expected[0].shape[:1]
        cot = rng.standard_normal(expected[0].shape).astype(wdt)  # as the kernels see it
        gd, gx = jax.jit(jax.grad(lambda d, x: jnp.sum(jnp.asarray(cot.reshape(shape)) * forward(d, x)), (0, 1)))(d, x)
        gw, gv = grads(cot.astype(np.float64))
        t = rounded(rng.standard_normal(w.shape), wdt)
        checks = [(" forward", forward(d, x), reshaped(expected, shape), wdt),
                  (" d/dweights", gd, reshaped(gw, w.shape), wdt),
                  (" d/dspikes", gx, reshaped(gv, v.shape), wdt),
                  (" jvp in the weights", jax.jvp(lambda d: forward(d, x), (d,), (jnp.asarray(t, wdt),))[1],
                   reshaped(layout.product(binary, t, x2, transpose), shape), wdt)]
        if v.ndim == 1:  # a batch of mv spikes, mapped: one mm launch
            S = event_values(rng, (int(rng.integers(1, 6)), n_in), False, wdt)
            checks.append((f" vmap over {S.shape[0]} spike vectors", jax.vmap(lambda s: forward(d, s))(jnp.asarray(S)),
                           tuple(a.T for a in layout.product(binary, w, S.T, transpose)), wdt))
        return checks

    return (f"{layout.describe(w)} {'binary' if binary else 'float'} transpose={transpose} batch={batch} "
            f"weights={np.dtype(wdt).name} indices={np.dtype(idt).name}"), compute


def test_transformations_sweep(on_cpu):
    _run(_transform_case, 24, False)


@pytest.mark.gpu
def test_transformations_sweep_gpu():
    _run(_transform_case, 60, True)
