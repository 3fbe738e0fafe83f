"""The same BrainEvent 0.3 code on xlakern and on BrainEvent 0.3.0 itself (its CPU kernels), on fresh
random inputs: products of every stored layout and event type in both orientations, the functional
operators, per-synapse products, plasticity, delays, row slices, index conversions, bit packing,
units, the layouts' operators and methods, and grad / vmap / jit of the products. BrainEvent is the reference here (the other event tests check
xlakern against NumPy), so a convention BrainEvent has and xlakern misses fails a case.

Runs where BrainEvent 0.3.0 imports (`make test` installs it). Left out, by design: JITC matrices
(xlakern's generator differs from BrainEvent's, see the README; shapes and dtypes are compared), and
plasticity on weights outside [w_min, w_max]: BrainEvent clips every weight, xlakern only those an
update touches (the weights start inside the bounds here).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern as XK

try:
    import brainevent as BE
except Exception as e:  # not installed, or not importable on this Python
    pytest.skip(f"BrainEvent 0.3.0, the reference of these tests, does not import: {e}", allow_module_level=True)
if getattr(BE, "__version__", None) != "0.3.0" or BE is XK:
    pytest.skip(f"needs BrainEvent 0.3.0 itself (found {getattr(BE, '__version__', '?')})", allow_module_level=True)
u = pytest.importorskip("brainunit")

M, N, K, LAGS = 37, 53, 6, 5


class Inputs:
    """One draw of every operand the cases use (fresh per test: the rng fixture is seeded per run)."""

    def __init__(self, rng, homo):
        mask = rng.random((M, N)) < 0.2
        mask[rng.choice(np.arange(5, M - 1), 4, replace=False)] = False  # empty rows, none of those W[...] reads
        mask[1] = True  # every column has a synapse, so every row of the transposed layouts has one
        r, c = np.nonzero(mask)
        ptr = np.zeros(M + 1, np.int32)
        np.cumsum(np.bincount(r, minlength=M), out=ptr[1:])
        w = rng.standard_normal(r.size).astype(np.float32)
        self.d = jnp.asarray([np.float32(rng.uniform(0.5, 1.5))]) if homo else jnp.asarray(w)
        self.w_in = jnp.asarray(rng.uniform(-0.5, 0.8, r.size).astype(np.float32))  # inside the bounds
        self.i, self.p = jnp.asarray(c.astype(np.int32)), jnp.asarray(ptr)
        self.delays = jnp.asarray(rng.integers(1, LAGS, r.size).astype(np.int32))
        fidx = np.stack([rng.choice(N, K, replace=False) for _ in range(M)])
        fidx[1] = np.concatenate([[0, 3, N - 1], rng.choice(np.arange(4, N - 1), K - 3, replace=False)])
        self.fidx = jnp.asarray(fidx.astype(np.int32))  # (row 1 reaches the columns W[...] reads transposed)
        self.fidx_post = jnp.asarray(np.stack([rng.choice(M, K, replace=False) for _ in range(N)]).astype(np.int32))
        self.fw = jnp.asarray([np.float32(0.7)]) if homo else jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
        self.fw_in = jnp.asarray(rng.uniform(-0.5, 0.8, (M, K)).astype(np.float32))
        self.fw_post_in = jnp.asarray(rng.uniform(-0.5, 0.8, (N, K)).astype(np.float32))
        self.W = jnp.asarray(rng.standard_normal((M, N)), jnp.float32)
        self.W_in = jnp.asarray(rng.uniform(-0.5, 0.8, (M, N)).astype(np.float32))
        on = lambda *shape: jnp.asarray(rng.random(shape) < 0.3)
        self.sm, self.sn, self.Bn, self.Bm = on(M), on(N), on(N, 5), on(M, 5)
        self.fm = jnp.asarray((rng.standard_normal(M) * (rng.random(M) < 0.4)).astype(np.float32))
        self.fn = jnp.asarray((rng.standard_normal(N) * (rng.random(N) < 0.4)).astype(np.float32))
        self.Xn = jnp.asarray(rng.standard_normal((N, 4)), jnp.float32)
        self.Ym = jnp.asarray(rng.standard_normal((4, M)), jnp.float32)
        self.tm, self.tn = (jnp.asarray(rng.random(k).astype(np.float32)) for k in (M, N))
        self.ring = jnp.asarray(rng.standard_normal((LAGS, N)), jnp.float32)
        self.perm = jnp.asarray(rng.permutation(r.size).astype(np.int32))
        self.packable = on(3, 40)
        self.rows = [3, 0, -1, 3]


def _layout(L, x, kind, data=None):
    if kind == "CSR":
        return L.CSR((x.d if data is None else data, x.i, x.p), shape=(M, N))
    if kind == "CSC":  # the same arrays read as the transpose
        return L.CSC((x.d if data is None else data, x.i, x.p), shape=(N, M))
    if kind == "FixedNumPerPre":
        return L.FixedNumPerPre((x.fw if data is None else data, x.fidx), shape=(M, N))
    return L.FixedNumPerPost((x.fw if data is None else data, x.fidx), shape=(N, M))


def _rows_in(kind):  # spikes of the layout's rows / columns
    return (lambda x: x.sm, lambda x: x.sn) if kind in ("CSR", "FixedNumPerPre") else (lambda x: x.sn, lambda x: x.sm)


LAYOUT_CASES = {
    "s @ W": lambda L, x, k: L.BinaryArray(_rows_in(k)[0](x)) @ _layout(L, x, k),
    "W @ s": lambda L, x, k: _layout(L, x, k) @ L.BinaryArray(_rows_in(k)[1](x)),
    "float spikes @ W": lambda L, x, k: L.BinaryArray(_rows_in(k)[0](x).astype(jnp.float32) * 1.5) @ _layout(L, x, k),
    "W @ vector": lambda L, x, k: _layout(L, x, k) @ _rows_in(k)[1](x).astype(jnp.float32),
    "vector @ W": lambda L, x, k: _rows_in(k)[0](x).astype(jnp.float32) @ _layout(L, x, k),
    "W.T @ s": lambda L, x, k: _layout(L, x, k).T @ L.BinaryArray(_rows_in(k)[0](x)),
    "todense": lambda L, x, k: _layout(L, x, k).todense(),
    "T.todense": lambda L, x, k: _layout(L, x, k).T.todense(),
    "2 * W": lambda L, x, k: (2.0 * _layout(L, x, k)).todense(),
    "W / 4": lambda L, x, k: (_layout(L, x, k) / 4.0).todense(),
    "-W": lambda L, x, k: (-_layout(L, x, k)).todense(),
    "abs(W)": lambda L, x, k: abs(_layout(L, x, k)).todense(),
    "W[rows]": lambda L, x, k: _layout(L, x, k)[x.rows],
    "W[-1]": lambda L, x, k: _layout(L, x, k)[-1],
    "W[2:9]": lambda L, x, k: _layout(L, x, k)[2:9],
    "len(W)": lambda L, x, k: np.asarray(len(_layout(L, x, k))),
    "tocsr": lambda L, x, k: _layout(L, x, k).tocsr().todense(),
    "tocsc": lambda L, x, k: _layout(L, x, k).tocsc().todense(),
    "weights in mV, s @ W": lambda L, x, k: L.BinaryArray(_rows_in(k)[0](x)) @ _layout(L, x, k, data=(
        x.d if k in ("CSR", "CSC") else x.fw) * u.mV),
    "weights in nS, W @ vector in mV": lambda L, x, k: _layout(L, x, k, data=(
        x.d if k in ("CSR", "CSC") else x.fw) * u.nS) @ (_rows_in(k)[1](x).astype(jnp.float32) * u.mV),
}
# the compressed layouts' own
LAYOUT_CASES_CSR = {
    "W @ matrix": lambda L, x, k: _layout(L, x, k) @ (x.Xn if k == "CSR" else x.Bm.astype(jnp.float32)),
    "W @ BinaryArray(matrix)": lambda L, x, k: _layout(L, x, k) @ L.BinaryArray(x.Bn if k == "CSR" else x.Bm),
    "BinaryArray(matrix.T) @ W": lambda L, x, k: L.BinaryArray((x.Bm if k == "CSR" else x.Bn).T) @ _layout(L, x, k),
    "WeightedArray @ W": lambda L, x, k: L.WeightedArray(x.fm if k == "CSR" else x.fn) @ _layout(L, x, k),
    "W + W (dense)": lambda L, x, k: _layout(L, x, k) + _layout(L, x, k),
    "W + matrix (dense)": lambda L, x, k: _layout(L, x, k) + jnp.ones((M, N) if k == "CSR" else (N, M)),
    "with_data": lambda L, x, k: _layout(L, x, k).with_data(x.d * 3).todense(),
    "fromdense": lambda L, x, k: getattr(L, k).fromdense(_layout(L, x, k).todense()).todense(),
}
# the fixed-count layouts' own: scalars act on the stored entries
LAYOUT_CASES_FCN = {
    "W + 1 (stored entries)": lambda L, x, k: (_layout(L, x, k) + 1.0).todense(),
    "1 - W (stored entries)": lambda L, x, k: (1.0 - _layout(L, x, k)).todense(),
    "W % 0.5": lambda L, x, k: (_layout(L, x, k) % 0.5).todense(),
}

FUNCTION_CASES = {
    "csrmv": lambda L, x: L.csrmv(x.d, x.i, x.p, x.fn, shape=(M, N)),
    "csrmv transpose": lambda L, x: L.csrmv(x.d, x.i, x.p, x.fm, shape=(M, N), transpose=True),
    "csrmm": lambda L, x: L.csrmm(x.d, x.i, x.p, x.Xn, shape=(M, N)),
    "binary_fcnmv": lambda L, x: L.binary_fcnmv(x.fw, x.fidx, x.sn, shape=(M, N), transpose=False),
    "binary_fcnmv transpose": lambda L, x: L.binary_fcnmv(x.fw, x.fidx, x.sm, shape=(M, N), transpose=True),
    "fcnmv": lambda L, x: L.fcnmv(x.fw, x.fidx, x.fn, shape=(M, N), transpose=False),
    "fcnmm transpose": lambda L, x: L.fcnmm(x.fw, x.fidx, x.Bm.astype(jnp.float32), shape=(M, N), transpose=True),
    "binary_densemv": lambda L, x: L.binary_densemv(x.W, x.sn, transpose=False),
    "binary_densemv transpose": lambda L, x: L.binary_densemv(x.W, x.sm, transpose=True),
    "binary_densemm": lambda L, x: L.binary_densemm(x.W, x.Bn, transpose=False),
    "BinaryArray @ dense": lambda L, x: L.BinaryArray(x.sm) @ x.W,
    "dense @ BinaryArray": lambda L, x: x.W @ L.BinaryArray(x.sn),
    "BinaryArray(matrix) @ dense": lambda L, x: L.BinaryArray(x.Bm.T) @ x.W,
    "EventArray @ dense": lambda L, x: L.EventArray(x.sm) @ x.W,
    "Dense @ s": lambda L, x: L.Dense(x.W) @ L.BinaryArray(x.sn),
    "s @ Dense": lambda L, x: L.BinaryArray(x.sm) @ L.Dense(x.W),
    "Dense[2]": lambda L, x: L.Dense(x.W)[2],
    "csr_slice_rows": lambda L, x: L.csr_slice_rows(x.d, x.i, x.p, jnp.array([3, 0, 3, M - 1]), shape=(M, N)),
    "csrmv_dt2t": lambda L, x: L.csrmv_dt2t(x.fm, x.w_in, x.i, x.p, shape=(M, N)),
    "csrmv_dt2t transpose": lambda L, x: L.csrmv_dt2t(x.fn, x.w_in, x.i, x.p, shape=(M, N), transpose=True),
    "cscmv_dt2t": lambda L, x: L.cscmv_dt2t(x.fn, x.w_in, x.i, x.p, shape=(N, M)),
    "csrmm_dt2t": lambda L, x: L.csrmm_dt2t(x.Ym, jnp.stack([x.w_in] * 4), x.i, x.p, shape=(M, N)),
    "fcnmv_dt2t": lambda L, x: L.fcnmv_dt2t(x.fw_in, x.fidx, x.fm, shape=(M, N), transpose=False),
    "fcnmv_dt2t transpose": lambda L, x: L.fcnmv_dt2t(x.fw_in, x.fidx, x.fn, shape=(M, N), transpose=True),
    "update_csr_on_binary_pre": lambda L, x: L.update_csr_on_binary_pre(x.w_in, x.i, x.p, x.sm, x.tn, -0.5, 0.8,
                                                                         shape=(M, N)),
    "update_csc_on_binary_pre": lambda L, x: L.update_csc_on_binary_pre(x.w_in, x.i, x.p, x.sn, x.tm, -0.5, 0.8,
                                                                         shape=(N, M)),
    "update_csc_on_binary_post": lambda L, x: L.update_csc_on_binary_post(x.w_in, x.i, x.p, x.tn, x.sm, -0.5, 0.8,
                                                                           shape=(N, M)),
    "CSR.update_on_pre": lambda L, x: L.CSR((x.w_in, x.i, x.p), shape=(M, N)).update_on_pre(
        x.sm, x.tn, -0.5, 0.8).todense(),
    "update_dense_on_binary_pre": lambda L, x: L.update_dense_on_binary_pre(x.W_in, x.sm, x.tn, -0.5, 0.8),
    "update_dense_on_binary_post": lambda L, x: L.update_dense_on_binary_post(x.W_in, x.tm, x.sn, -0.5, 0.8),
    "update_fixed_post_conn_on_binary_pre": lambda L, x: L.update_fixed_post_conn_on_binary_pre(
        x.fw_in, x.fidx, x.sm, x.tn, -0.5, 0.8, shape=(M, N)),
    "update_fixed_pre_conn_on_binary_post": lambda L, x: L.update_fixed_pre_conn_on_binary_post(
        x.fw_post_in, x.fidx_post, x.tm, x.sn, -0.5, 0.8, shape=(M, N)),
    "csr_delay_deliver": lambda L, x: L.csr_delay_deliver(x.ring, x.sm, x.w_in, x.i, x.p, x.delays, 2, shape=(M, N)),
    "csr_to_coo_index": lambda L, x: L.csr_to_coo_index(np.asarray(x.p), np.asarray(x.i)),
    "csr_to_csc_index": lambda L, x: L.csr_to_csc_index(np.asarray(x.p), np.asarray(x.i), shape=(M, N)),
    "bitpack axis 1": lambda L, x: L.bitpack(x.packable, 1),
    "bitpack axis 0": lambda L, x: L.bitpack(x.packable, 0),
    "BitPackedBinary @ dense": lambda L, x: L.BitPackedBinary(x.sm) @ x.W,
    "BitPackedBinary(matrix).value": lambda L, x: L.BitPackedBinary(x.packable).value,
    "repr of BinaryArray and WeightedArray": lambda L, x: (repr(L.BinaryArray(x.sm)), repr(L.WeightedArray(x.fm))),
    "BitPackedBinary @ CSR": lambda L, x: L.BitPackedBinary(x.sm) @ L.CSR((x.d, x.i, x.p), shape=(M, N)),
    "CSR @ BitPackedBinary": lambda L, x: L.CSR((x.d, x.i, x.p), shape=(M, N)) @ L.BitPackedBinary(x.sn),
    "WeightedArray @ FixedNumPerPre": lambda L, x: L.WeightedArray(x.fm) @ L.FixedNumPerPre((x.fw, x.fidx),
                                                                                           shape=(M, N)),
    "binary_fcnmm": lambda L, x: L.binary_fcnmm(x.fw, x.fidx, x.Bn, shape=(M, N), transpose=False),
    "fcnmv in nS and mV": lambda L, x: L.fcnmv(x.fw * u.nS, x.fidx, x.fn * u.mV, shape=(M, N), transpose=False),
    "coo2csr": lambda L, x: L.coo2csr(np.asarray([0, 2, 1, 2]), np.asarray([1, 0, 3, 2]), shape=(3, 4)),
    "coo_to_csc_index": lambda L, x: L.coo_to_csc_index(np.asarray([0, 2, 1, 2]), np.asarray([1, 0, 3, 2]),
                                                        shape=(3, 4)),
    "csc_to_csr_index": lambda L, x: L.csc_to_csr_index(np.asarray(x.p), np.asarray(x.i), shape=(N, M)),
    "CSR.sum": lambda L, x: L.CSR((x.d, x.i, x.p), shape=(M, N)).sum(),
    "FixedNumPerPre.sum": lambda L, x: L.FixedNumPerPre((x.fw, x.fidx), shape=(M, N)).sum(),
    "CSR.dt2t": lambda L, x: L.CSR((x.d, x.i, x.p), shape=(M, N)).dt2t(x.fm, x.w_in),
    "CSR.dt2t_transposed": lambda L, x: L.CSR((x.d, x.i, x.p), shape=(M, N)).dt2t_transposed(x.fn, x.w_in),
    "CSR.slice_rows": lambda L, x: L.CSR((x.d, x.i, x.p), shape=(M, N)).slice_rows([4, 1]).todense(),
    "CSR.delay_deliver": lambda L, x: L.CSR((x.w_in, x.i, x.p), shape=(M, N)).delay_deliver(x.ring, x.sm, x.delays, 3),
    "CSR.diag_add": lambda L, x: L.CSR.fromdense(np.eye(6, dtype=np.float32) + np.triu(
        np.ones((6, 6), np.float32), 2)).diag_add(x.tm[:6]).todense(),
    "CSR.solve": lambda L, x: L.CSR.fromdense(np.eye(5, dtype=np.float32) * 3 + np.diag(
        np.ones(4, np.float32), 1)).solve(x.tm[:5]),
    "Dense.update_on_pre": lambda L, x: L.Dense(x.W_in).update_on_pre(x.sm, x.tn, -0.5, 0.8).todense(),
    "Dense.T @ s": lambda L, x: L.Dense(x.W).T @ L.BinaryArray(x.sm),
    "Dense.tocsr": lambda L, x: L.Dense(x.W * (x.W > 1)).tocsr().todense(),
    # transformations
    "grad of csrmv in data": lambda L, x: jax.grad(lambda d: L.csrmv(d, x.i, x.p, x.fn, shape=(M, N)).sum())(x.d),
    "grad of s @ CSR in data": lambda L, x: jax.grad(
        lambda d: (L.BinaryArray(x.sm) @ L.CSR((d, x.i, x.p), shape=(M, N))).sum())(x.d),
    "grad of CSR @ v in v": lambda L, x: jax.grad(lambda v: (L.CSR((x.d, x.i, x.p), shape=(M, N)) @ v).sum())(x.fn),
    "grad of s @ FCN in weights": lambda L, x: jax.grad(
        lambda w: (L.BinaryArray(x.sm) @ L.FixedNumPerPre((w, x.fidx), shape=(M, N))).sum())(x.fw),
    "grad of update_csr_on_binary_pre in the trace": lambda L, x: jax.grad(
        lambda t: L.update_csr_on_binary_pre(x.w_in, x.i, x.p, x.sm, t, -0.5, 0.8, shape=(M, N)).sum())(x.tn),
    "vmap of s @ CSR": lambda L, x: jax.vmap(lambda s: L.BinaryArray(s) @ L.CSR((x.d, x.i, x.p), shape=(M, N)))(
        x.Bm.T),
    "jit of s @ FCN": lambda L, x: jax.jit(
        lambda s: L.BinaryArray(s) @ L.FixedNumPerPre((x.fw, x.fidx), shape=(M, N)))(x.sm),
}


def _plain(x):
    """Arrays (and tuples of them) as NumPy; a quantity as ('unit', mantissa)."""
    if isinstance(x, u.Quantity):
        return (str(x.unit), np.asarray(x.mantissa))
    if isinstance(x, (tuple, list)):
        return tuple(_plain(a) for a in x)
    return np.asarray(x)


def _assert_same(ours, theirs, what):
    if isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), what
        for a, b in zip(ours, theirs):
            _assert_same(a, b, what)
        return
    if isinstance(theirs, str):  # a unit
        assert ours == theirs, what
        return
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape}, BrainEvent {theirs.shape}"
    if theirs.dtype.kind in "fc":
        assert ours.dtype.kind == theirs.dtype.kind, f"{what}: dtype {ours.dtype}, BrainEvent {theirs.dtype}"
        np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=1e-4, atol=1e-4,
                                   err_msg=what)
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=what)


def _compare(fn, what):
    with jax.default_device(jax.devices("cpu")[0]):
        ours, theirs = _plain(fn(XK)), _plain(fn(BE))
    _assert_same(ours, theirs, what)
    if isinstance(theirs, np.ndarray) and theirs.dtype.kind == "f":
        assert np.abs(theirs).sum() > 0, f"{what}: BrainEvent's result is all zeros; the case tests nothing"


@pytest.mark.parametrize("homo", [False, True], ids=["per-synapse", "shared weight"])
@pytest.mark.parametrize("kind", ["CSR", "CSC", "FixedNumPerPre", "FixedNumPerPost"])
def test_layouts_as_brainevent(rng, kind, homo):
    x = Inputs(rng, homo)
    cases = dict(LAYOUT_CASES)
    cases.update(LAYOUT_CASES_CSR if kind in ("CSR", "CSC") else LAYOUT_CASES_FCN)
    if homo:  # a shared weight cannot be rebuilt from the dense matrix
        cases.pop("fromdense", None)
    for name, case in cases.items():
        _compare(lambda L: case(L, x, kind), f"{kind} {name}")


@pytest.mark.parametrize("homo", [False, True], ids=["per-synapse", "shared weight"])
def test_functions_as_brainevent(rng, homo):
    x = Inputs(rng, homo)
    for name, case in FUNCTION_CASES.items():
        _compare(lambda L: case(L, x), name)


@pytest.mark.parametrize("cls", ["JITCScalarR", "JITCScalarC", "JITCUniformR", "JITCNormalC"])
def test_jitc_shapes_and_dtypes_as_brainevent(rng, cls):
    """xlakern's JITC matrices are its own (the same matrix on every platform and in mv and mm, which
    BrainEvent's are not), so only what a user's code sees of them structurally is compared."""
    params = {"JITCScalarR": (0.5,), "JITCScalarC": (0.5,), "JITCUniformR": (0.1, 0.4), "JITCNormalC": (0.0, 0.2)}
    x = Inputs(rng, False)
    for name, fn in {
        "@ vector": lambda L: (getattr(L, cls)(params[cls] + (0.2, 3), shape=(M, N)) @ x.fn).shape,
        "vector @": lambda L: (x.fm @ getattr(L, cls)(params[cls] + (0.2, 3), shape=(M, N))).shape,
        "@ matrix": lambda L: (getattr(L, cls)(params[cls] + (0.2, 3), shape=(M, N)) @ x.Xn).shape,
        ".T.shape": lambda L: getattr(L, cls)(params[cls] + (0.2, 3), shape=(M, N)).T.shape,
        "todense": lambda L: (lambda d: (d.shape, str(d.dtype)))(getattr(L, cls)(params[cls] + (0.2, 3),
                                                                                  shape=(M, N)).todense()),
    }.items():
        with jax.default_device(jax.devices("cpu")[0]):
            assert fn(XK) == fn(BE), f"{cls} {name}"
