"""Primitives of just-in-time connectivity (JITC): the generator's tables, its jnp mirror, and one
XLACustomKernel per operator (``binary_jit{s,u,n}{mv,mm}``, ``jit{s,u,n}{mv,mm}``, ``jit{s,u,n}``).

The generated matrix ``G`` has shape ``(grows, gcols)``; its row ``r`` comes from hashing
``(seed, r, k)`` (``kernels/jitc_common.h`` documents the scheme, and ``reference_dense`` below is
its line-by-line jnp mirror). Everything that decides ``G`` is uint32 arithmetic, a table look-up
or a correctly rounded multiply/add, so C++, CUDA and jnp produce the same bits for one seed.

Primitive operands: ``params = (a, b)`` (float32/float64; a synapse weighs ``a + b * r``),
``seed`` (uint32, shape (1,)), the skip table (uint32, ascending), the normal quantile table
(params' dtype) and, for products, the vector. Static: ``shape=(grows, gcols)`` and
``transpose`` (False: ``G @ v``, gather; True: ``G.T @ v``, scatter over active rows).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from .. import XLACustomKernel, config, general_batching_rule
from ._errors import EventShapeError
from ._kernels import operand_module, SDS, call_product, exact_scratch, spike_factor

KINDS = {"s": 0, "u": 1, "n": 2}
QTABLE_SIZE = 65537
MAX_SKIP_TABLE = 1 << 25  # entries; sets the smallest supported prob (about 6.6e-7)


# The compiled kernels: built once per machine, then served from xlakern's cache.
cpu_module = operand_module("jitc_cpu.cc")
# The CUDA module is six translation units that compile side by side (kernels/jitc_cuda.cuh): a first
# product waits on the slowest (6 s of nvcc on 2 cores) instead of one file of every kernel (12-14 s).
JITC_CUDA_SOURCES = ("jitc_cuda.cu", "jitc_cuda_scatter.cu", "jitc_cuda_mv_shared.cu", "jitc_cuda_mv_part.cu",
                     "jitc_cuda_mv_exact.cu", "jitc_cuda_mv_wide.cu")
cuda_module = operand_module(*JITC_CUDA_SOURCES)


# ----------------------------------------------------------------------------- tables

def log_keep(prob: float) -> float:
    """ln(1 - prob) as :func:`skip_table` computes it (0.0 for prob >= 1, which has no table): the CUDA
    mv gather decides skips from it where the table is too long for shared memory."""
    p = float(prob)
    return math.log1p(-p) if p < 1.0 else 0.0


@functools.lru_cache(maxsize=64)
def skip_table(prob: float) -> np.ndarray:
    """Ascending uint32 thresholds floor(2^32 (1-p)^i), i >= 1, that are >= 1 (empty for p >= 1)."""
    p = float(prob)
    if p >= 1.0:
        return np.zeros((0,), np.uint32)
    keep = log_keep(p)
    n = int(math.ceil(32 * math.log(2) / -keep)) + 2
    if n > MAX_SKIP_TABLE:
        raise EventShapeError(f"prob={p!r} is too small for the JITC generator (its skip table would hold {n} "
                              f"entries); use prob >= {1 - math.exp(-32 * math.log(2) / MAX_SKIP_TABLE):.2g}")
    i = np.arange(1, n + 1, dtype=np.float64)
    t = np.floor(np.exp(i * keep) * 2.0 ** 32)
    t = np.minimum(t[t >= 1.0], 2.0 ** 32 - 1)
    return t[::-1].astype(np.uint32)


@functools.lru_cache(maxsize=2)
def quantile_table(dtype_name: str) -> np.ndarray:
    """Standard normal quantiles at (i + 0.5) / 65537, i = 0..65536 (interpolated by the kernels)."""
    inv = NormalDist().inv_cdf
    q = np.array([inv((i + 0.5) / QTABLE_SIZE) for i in range(QTABLE_SIZE)], np.float64)
    return q.astype(dtype_name)


# ----------------------------------------------------------------------------- jnp mirror

def _u32(x):
    # a NumPy scalar: with jax arrays the hash below is traced; with NumPy arrays it runs in NumPy
    # (generated_synapses' eager walk, which compiles nothing)
    return np.uint32(x)


def mix32(x):
    x = x ^ (x >> _u32(16))
    x = x * _u32(0x7FEB352D)
    x = x ^ (x >> _u32(15))
    x = x * _u32(0x846CA68B)
    return x ^ (x >> _u32(16))


def row_key(seed, rows):
    return mix32(mix32(seed ^ _u32(0x9E3779B9)) ^ (rows * _u32(0x85EBCA6B)))


def draw(key, k):
    return mix32(mix32(key ^ (k * _u32(0x9E3779B9) + _u32(0x632BE5AB))))


def _hi_part(x):
    bits = jnp.uint32 if x.dtype == jnp.float32 else jnp.uint64
    mask = 0xFFFFF000 if x.dtype == jnp.float32 else 0xFFFFFFFFF8000000
    return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, bits) & bits(mask), x.dtype)


def split_mul(x, y):
    """The kernels' split_mul (jitc_common.h): a product from exact partial products, so XLA's
    multiply-add fusion cannot change a bit."""
    xh, yh = _hi_part(x), _hi_part(y)
    xl, yl = x - xh, y - yh
    s = xh * yh
    s = s + xh * yl
    s = s + xl * yh
    return s + xl * yl if x.dtype == jnp.float32 else s


def weight_factor(kind: int, h2, qtable, dtype):
    if kind == KINDS["u"]:
        return ((h2 >> _u32(8)).astype(jnp.int32) + 1).astype(dtype) * dtype.type(1.0 / 16777216.0)
    if kind == KINDS["n"]:
        i = (h2 >> _u32(16)).astype(jnp.int32)
        frac = (h2 & _u32(0xFFFF)).astype(jnp.int32).astype(dtype) * dtype.type(1.0 / 65536.0)
        lo, hi = qtable[i], qtable[i + 1]
        return lo + split_mul(hi - lo, frac)
    return jnp.zeros(h2.shape, dtype)


def reference_dense(params, seed, table, qtable, *, kind: int, shape):
    """G, (grows, gcols), generated in jnp exactly as the kernels do (draws up to gcols per row)."""
    grows, gcols = shape
    dtype = jnp.dtype(params.dtype)
    if grows == 0 or gcols == 0:
        return jnp.zeros((grows, gcols), dtype)
    key = row_key(seed.reshape(()), jnp.arange(grows, dtype=jnp.uint32))[:, None]
    k = jnp.arange(gcols, dtype=jnp.uint32)[None, :]
    h = draw(key, k * _u32(2))
    h2 = draw(key, k * _u32(2) + _u32(1))
    n = table.shape[0]
    skip = 1 + (n - jnp.searchsorted(table, h.reshape(-1), side="right").reshape(h.shape))
    skip = jnp.minimum(skip, gcols + 1)  # the rest of the row is empty anyway; avoids overflow
    cols = jnp.cumsum(skip, axis=1) - 1
    r = weight_factor(kind, h2, qtable, dtype)
    w = params[0] + split_mul(jnp.broadcast_to(params[1], r.shape), r)
    rows = jnp.broadcast_to(jnp.arange(grows)[:, None], cols.shape)
    cols = jnp.where(cols < gcols, cols, gcols)  # past the row's end: dropped
    return jnp.zeros((grows, gcols), dtype).at[rows, cols].set(w, mode="drop")


def generated_synapses(seed: int, table: np.ndarray, *, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, draw index k) of every synapse of G, in row-major order, as NumPy arrays: the draws
    of :func:`reference_dense` (so the same synapses), walked in blocks of draws per row until each row
    passes its end, so memory stays near the synapse count instead of grows * gcols. Eager."""
    grows, gcols = shape
    table = np.asarray(table)
    n = table.shape[0]
    expected = gcols * (1.0 if n == 0 else -math.expm1(-32 * math.log(2) / n))
    block = int(min(gcols, expected + 6 * math.sqrt(expected) + 16)) + 1
    key_of = row_key(np.full(1, seed, np.uint32), np.arange(grows, dtype=np.uint32))  # NumPy all along
    live = np.arange(grows)  # rows not yet past their end
    last = np.full(grows, -1, np.int64)  # each row's last column so far
    k0 = 0
    found = []
    while live.size:
        k = np.arange(k0, k0 + block, dtype=np.uint32)[None, :]
        h = draw(key_of[live][:, None], k * _u32(2))
        skip = 1 + (n - np.searchsorted(table, h.reshape(-1), side="right").reshape(h.shape))
        cols = last[live][:, None] + np.cumsum(np.minimum(skip, gcols + 1).astype(np.int64), axis=1)
        r, j = np.nonzero(cols < gcols)
        found.append((live[r], cols[r, j], k0 + j))
        last[live] = cols[:, -1]
        live = live[cols[:, -1] < gcols]
        k0 += block
    rows, cols, ks = (np.concatenate([f[i] for f in found]).astype(np.int64) for i in range(3))
    order = np.lexsort((cols, rows))
    return rows[order], cols[order], ks[order]


def synapse_weights(params, seed, qtable, *, kind: int, rows, ks):
    """The weights of G's synapses (rows, draw indices k), as :func:`reference_dense` computes them."""
    dtype = jnp.dtype(params.dtype)
    key = row_key(jnp.asarray(seed, jnp.uint32).reshape(()), jnp.asarray(rows, jnp.uint32))
    h2 = draw(key, jnp.asarray(ks, jnp.uint32) * _u32(2) + _u32(1))
    r = weight_factor(kind, h2, qtable, dtype)
    return params[0] + split_mul(jnp.broadcast_to(params[1], r.shape), r)


def reference_product(params, seed, table, qtable, v, *, kind, shape, transpose, binary):
    g = reference_dense(params, seed, table, qtable, kind=kind, shape=shape)
    f = spike_factor(v, binary, g.dtype)
    hi = jax.lax.Precision.HIGHEST
    return jnp.matmul(g.T, f, precision=hi) if transpose else jnp.matmul(g, f, precision=hi)


# ----------------------------------------------------------------------------- primitives

def _undefined(x):
    return ad.is_undefined_primal(x)


_WEIGHT_LAW = {"s": "scalar", "u": "uniform", "n": "normal"}  # tags of each family


def _params_cotangent(generated, ct, dtype):
    """The cotangent of params (a, b), for an output linear in them: ct summed against the output made
    with params (1, 0) and with (0, 1). Outputs no synapse reached (exactly 0) are skipped, not
    multiplied, so a NaN cotangent there (an output that no active event fed) leaves the params' finite."""
    parts = []
    for unit in (jnp.array([1, 0], dtype), jnp.array([0, 1], dtype)):
        y = generated(unit)
        parts.append(jnp.sum(jnp.where(y != 0, y * ct.astype(y.dtype), 0)))
    return jnp.stack(parts).astype(dtype)


class _JitcKind:
    """The primitives of one weight kind: binary/float x mv/mm products and the materialisation."""

    def __init__(self, letter: str):
        self.letter = letter
        self.kind = KINDS[letter]
        self.ops: dict[tuple[bool, bool], XLACustomKernel] = {}
        for binary in (True, False):
            for mm in (False, True):
                name = ("binary_" if binary else "") + f"jit{letter}" + ("mm" if mm else "mv")
                op = XLACustomKernel(name)
                op.def_tags("event", "jitc", _WEIGHT_LAW[letter], "binary" if binary else "float", "mm" if mm else "mv")
                self._register_product(op, binary)
                self.ops[(binary, mm)] = op
        self.dense = XLACustomKernel(f"jit{letter}")
        self.dense.def_tags("event", "jitc", _WEIGHT_LAW[letter], "dense")
        self._register_dense(self.dense)

    def _register_product(self, op, binary):
        kind = self.kind

        # The CUDA entry point also takes log_keep (ln(1 - prob), the float64 the table was built from),
        # with which its mv gather decides skips without the table where that is long, and
        # `deterministic`: under config.set_deterministic its scatter sums in fixed point, in a scratch
        # of exact_scratch's size.
        def compiled(module_fn, cuda: bool):
            def generator(outs, transpose, shape, log_keep=0.0):
                def run(params, seed, table, qtable, v):
                    # read at each lowering: XLACustomKernel caches this generator across the switch
                    exact = cuda and transpose and config.get_deterministic()
                    extra = {"log_keep": float(log_keep), "deterministic": exact} if cuda else {}
                    mod = module_fn(params.dtype, None, v.dtype, binary)
                    return call_product(mod.jitc_mv, params, seed, table, qtable, v, out=outs[0],
                                        scratch=cuda, spike_cols=shape[1], grows=shape[0], gcols=shape[1], kind=kind,
                                        transpose=transpose, binary=binary,
                                        room=exact_scratch(outs[0]) if exact else None, **extra)
                return run
            return generator

        def reference(outs, transpose, shape, log_keep=0.0):
            def run(params, seed, table, qtable, v):
                return reference_product(params, seed, table, qtable, v, kind=kind, shape=shape,
                                         transpose=transpose, binary=binary)
            return run

        op.def_cpp_kernel(compiled(cpu_module, cuda=False))
        op.def_cuda_kernel(compiled(cuda_module, cuda=True))
        for platform in ("cpu", "gpu", "tpu"):
            op.def_kernel("jnp", platform, reference)
        op.def_jvp_rule2(*self._jvp_rules(op))
        op.def_transpose_rule(functools.partial(self._transpose, binary))
        op.def_batching_rule(functools.partial(self._batch, binary))

    def _register_dense(self, op):
        kind = self.kind

        def compiled(module_fn):
            def generator(outs, shape):
                def run(params, seed, table, qtable):
                    # the materialisation reads no spikes: the parameters' build with bool spikes serves it
                    return module_fn(params.dtype).jitc_dense(params, seed, table, qtable, outs=outs[0], kind=kind)
                return run
            return generator

        def reference(outs, shape):
            def run(params, seed, table, qtable):
                return reference_dense(params, seed, table, qtable, kind=kind, shape=shape)
            return run

        op.def_cpp_kernel(compiled(cpu_module))
        op.def_cuda_kernel(compiled(cuda_module))
        for platform in ("cpu", "gpu", "tpu"):
            op.def_kernel("jnp", platform, reference)
        # G is linear in params: its tangent is G generated with the tangent as params, and the
        # cotangent of params is the cotangent's sum against G(1, 0) and G(0, 1).
        op.def_jvp_rule2(lambda t, params, *rest, **kw: op(t, *rest, **kw), None, None, None)

        def transpose(cts, params, seed, table, qtable, *, outs, backend, shape):
            if not _undefined(params) or _undefined(seed):
                return [None] * 4
            return [_params_cotangent(lambda unit: op(unit, seed, table, qtable, outs=list(outs), backend=backend,
                                                      shape=shape)[0], cts[0], params.aval.dtype), None, None, None]

        op.def_transpose_rule(transpose)

    # The product is linear in params (a, b) and in the vector; the spike tangent of a binary
    # operator goes through the float operator (surrogate gradient), as in the stored layouts.
    def _jvp_rules(self, op):
        def wrt_params(t, params, *rest, **kw):
            return op(t, *rest, **kw)

        def wrt_vector(t, params, seed, table, qtable, v, **kw):
            return self.ops[(False, v.ndim == 2)](params, seed, table, qtable, t.astype(params.dtype), **kw)

        return [wrt_params, None, None, None, wrt_vector]

    def _transpose(self, binary, cts, params, seed, table, qtable, v, *, outs, backend, transpose, shape,
                   log_keep=0.0):
        ct = cts[0]
        res = [None] * 5
        if _undefined(params) and not _undefined(v):
            op = self.ops[(binary, v.ndim == 2)]
            res[0] = _params_cotangent(lambda unit: op(unit, seed, table, qtable, v, outs=list(outs), backend=backend,
                                                       transpose=transpose, shape=shape, log_keep=log_keep)[0],
                                       ct, params.aval.dtype)
        if _undefined(v) and not _undefined(params):
            v_aval = v.aval
            float_op = self.ops[(False, v_aval.ndim == 2)]
            back = float_op(params, seed, table, qtable, ct.astype(params.dtype),
                            outs=[SDS(v_aval.shape, params.dtype)], backend=backend, transpose=not transpose,
                            shape=shape, log_keep=log_keep)[0]
            res[4] = back.astype(v_aval.dtype)
        return res

    # vmap over the vector alone becomes one mm launch; anything else loops.
    def _batch(self, binary, args, axes, *, outs, backend, transpose, shape, log_keep=0.0):
        kw = {"transpose": transpose, "backend": backend, "shape": shape, "log_keep": log_keep}
        out = outs[0]
        v, v_axis = args[-1], axes[-1]
        if v_axis is not None and all(a is None for a in axes[:-1]):
            mm = self.ops[(binary, True)]
            s = jnp.moveaxis(v, v_axis, 1)
            if s.ndim == 2:  # mv: (n, batch)
                res = mm(*args[:-1], s, outs=[SDS((out.shape[0], s.shape[1]), out.dtype)], **kw)[0]
                return [res], [1]
            k, b, n = s.shape  # mm: (k, batch, n) -> (k, batch * n)
            res = mm(*args[:-1], s.reshape(k, b * n), outs=[SDS((out.shape[0], b * n), out.dtype)], **kw)[0]
            return [res.reshape(out.shape[0], b, n)], [1]
        op = self.ops[(binary, v.ndim - (v_axis is not None) == 2)]
        return general_batching_rule(op, args, axes, outs=list(outs), **kw)


JITC_KINDS = {letter: _JitcKind(letter) for letter in "sun"}

binary_jitsmv_p = JITC_KINDS["s"].ops[(True, False)]
binary_jitsmm_p = JITC_KINDS["s"].ops[(True, True)]
jitsmv_p = JITC_KINDS["s"].ops[(False, False)]
jitsmm_p = JITC_KINDS["s"].ops[(False, True)]
jits_p = JITC_KINDS["s"].dense
binary_jitumv_p = JITC_KINDS["u"].ops[(True, False)]
binary_jitumm_p = JITC_KINDS["u"].ops[(True, True)]
jitumv_p = JITC_KINDS["u"].ops[(False, False)]
jitumm_p = JITC_KINDS["u"].ops[(False, True)]
jitu_p = JITC_KINDS["u"].dense
binary_jitnmv_p = JITC_KINDS["n"].ops[(True, False)]
binary_jitnmm_p = JITC_KINDS["n"].ops[(True, True)]
jitnmv_p = JITC_KINDS["n"].ops[(False, False)]
jitnmm_p = JITC_KINDS["n"].ops[(False, True)]
jitn_p = JITC_KINDS["n"].dense
