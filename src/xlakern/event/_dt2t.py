"""Per-synapse ("dt2t") products: one value per stored synapse, ``w[j] * y[row of j]`` or
``w[j] * y[column of j]``, with BrainEvent 0.3's names and arguments.

They compute the ``D^t eps^{t-1}`` term of D-RTRL eligibility traces: ``y`` is a per-neuron factor,
``w`` a per-synapse trace stored in the structure's order, and the result has ``w``'s layout.

Orientation (BrainEvent's dt2t convention, which differs from the products'): for a structure of
``shape=(rows, cols)``, ``transpose=False`` reads ``y`` at each synapse's row (``y`` has ``rows``
entries) and ``transpose=True`` at its column (``y`` has ``cols`` entries). Synapses outside every
row (a malformed ``indptr``) or with a column outside ``[0, cols)`` give 0, never an
out-of-bounds read.

Kernels: read at each synapse's column (and for the fixed-count and JITC forms) the product is a
gather and a multiply per synapse, which XLA fuses into one memory-bound loop, so it stays in jnp.
Read at each CSR synapse's row, jnp must first count and scan the row starts over every synapse;
``kernels/csr_synapse_*`` find the rows as they go (C++ on cpu, CUDA on gpu; jnp on tpu and as the
reference). The JVPs are the jnp form (the product is bilinear in ``y`` and ``w``), which jax
transposes for reverse mode. A non-decreasing ``indptr`` is assumed; for a malformed one every read
still stays inside the arrays.

Units (brainunit): the result carries the product of ``y``'s and ``w``'s units. (BrainEvent's CSR
forms keep ``w``'s alone; its fixed-count forms multiply both, as here.)

Example::

    import jax.numpy as jnp, xlakern as brainevent
    w = jnp.array([0.5, 0.3, 0.7])
    indices, indptr = jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
    brainevent.csrmv_dt2t(jnp.array([1.0, 2.0]), w, indices, indptr, shape=(2, 3))  # [0.5, 0.3, 1.4]
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import XLACustomKernel
from . import _jitc, _units
from . import _jitc_kernels as JK
from ._eager import run_fused
from ._errors import EventDTypeError, EventShapeError, EventTracedError
from ._kernels import SDS, acc_dtype, synapse_cpu_module, synapse_cuda_module, synapse_rows
from ._ops import _described, _index, _shape2, _weights

__all__ = [
    "csrmv_dt2t", "cscmv_dt2t", "csrmm_dt2t", "cscmm_dt2t", "csrmv_dt2t_p", "csrmm_dt2t_p",
    "fcnmv_dt2t", "fcnmm_dt2t", "jitsmv_dt2t", "jitumv_dt2t", "jitnmv_dt2t",
]


# ----------------------------------------------------------------------------- the jnp form

def gather_product(y, w, pos, ok):
    """``w * y[..., pos]`` where ``ok``, else 0; shape ``y.shape[:-1] + pos.shape``."""
    n = y.shape[-1]
    out_shape = y.shape[:-1] + pos.shape
    dtype = jnp.result_type(y, w)
    if n == 0 or pos.size == 0:  # no synapse can be read (and take() refuses an empty axis)
        return jnp.zeros(out_shape, dtype)
    picked = jnp.take(y, jnp.clip(pos, 0, n - 1), axis=-1)
    return jnp.broadcast_to(jnp.where(ok, w * picked, 0), out_shape).astype(dtype)


def csr_dt2t_jnp(y, w, indices, indptr, *, shape, transpose):
    """The CSR dt2t product of the primitives below (mv: y (n,), w (nse,); mm: y (b, n), w (b, nse)),
    in the accumulation dtype."""
    acc = acc_dtype(w.dtype)
    rows, inside = synapse_rows(indices, indptr, shape[0], -1)
    if not transpose:
        return gather_product(y, w, rows, inside).astype(acc)
    return gather_product(y, w, indices, inside & (indices >= 0) & (indices < shape[1])).astype(acc)


def _csr_dt2t_primitive(name: str) -> XLACustomKernel:
    """Operands (y, w, indices, indptr), y and w of one float dtype; statics shape, transpose; output
    w's shape in the accumulation dtype."""
    op = XLACustomKernel(name)
    op.def_tags("event", "csr", "dt2t", "mm" if name.startswith("csrmm") else "mv")

    def generator(outs, shape, transpose):
        return functools.partial(csr_dt2t_jnp, shape=shape, transpose=transpose)

    # Read at each synapse's row, a kernel finds the rows as it goes (the jnp form needs a count and a
    # scan over all synapses first); read at its column, the product is one fused gather in jnp.
    def compiled(module_fn):
        def gen(outs, shape, transpose):
            if transpose:
                return generator(outs, shape, transpose)
            return lambda y, w, indices, indptr: module_fn(w.dtype, indptr.dtype).csr_dt2t_rows(y, w, indptr,
                                                                                                 outs=outs[0])
        return gen

    op.def_cpp_kernel(compiled(synapse_cpu_module))
    op.def_cuda_kernel(compiled(synapse_cuda_module))
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform, generator)

    def wrt_y(t, y, w, indices, indptr, *, shape, transpose, **_):
        return [csr_dt2t_jnp(t, w, indices, indptr, shape=shape, transpose=transpose)]

    def wrt_w(t, y, w, indices, indptr, *, shape, transpose, **_):
        return [csr_dt2t_jnp(y, t, indices, indptr, shape=shape, transpose=transpose)]

    op.def_jvp_rule2(wrt_y, wrt_w, None, None)
    return op


csrmv_dt2t_p = _csr_dt2t_primitive("csrmv_dt2t")
csrmm_dt2t_p = _csr_dt2t_primitive("csrmm_dt2t")


# ----------------------------------------------------------------------------- CSR / CSC

def _float_pair(name, y, w, y_arg="y", w_arg="w"):
    """y and w (unitless) as floats of one dtype."""
    y, w = _weights(name, y_arg, y), _weights(name, w_arg, w)
    dtype = jnp.promote_types(y.dtype, w.dtype)
    return y.astype(dtype), w.astype(dtype)


def _check_y(name, y, n, mm, transpose, shape):
    what, axis = ("column", 1) if transpose else ("row", 0)
    expected = f"(batch, {n})" if mm else f"({n},)"
    if (mm and (y.ndim != 2 or y.shape[1] != n)) or (not mm and y.shape != (n,)):
        raise EventShapeError(f"{name}: y has shape {tuple(y.shape)}; expected {expected}: with transpose={transpose} "
                              f"y is read at each synapse's {what}, so it has shape[{axis}] = {n} entries "
                              f"(shape={shape})")


def _compressed_dt2t(name, mm, csc, y, w, indices, indptr, shape, transpose, backend):
    (y, unit_y), (w, unit_w) = _units.split(y), _units.split(w)
    static = dict(name=name, mm=mm, csc=csc, shape=_shape2(name, shape), transpose=bool(transpose), backend=backend)
    return _units.attach(run_fused(_compressed_body, (y, w, indices, indptr), static), unit_y, unit_w)


def _compressed_body(y, w, indices, indptr, *, name, mm, csc, shape, transpose, backend):
    """_compressed_dt2t past its units: outside a trace, one jitted program (:func:`run_fused`)."""
    y, w = _float_pair(name, y, w)
    indices = _index(name, "indices", indices)
    indptr = _index(name, "indptr", indptr)
    n_ptr = shape[1] if csc else shape[0]
    if indices.ndim != 1:
        raise EventShapeError(f"{name}: indices has shape {tuple(indices.shape)}; expected (nse,)")
    if indptr.shape != (n_ptr + 1,):
        raise EventShapeError(f"{name}: indptr has shape {tuple(indptr.shape)}; expected ({n_ptr + 1},), one more "
                              f"than the {'columns' if csc else 'rows'} of shape={shape}")
    _check_y(name, y, shape[1] if transpose else shape[0], mm, transpose, shape)
    nse = indices.shape[0]
    w_shape = (y.shape[0], nse) if mm else (nse,)
    if w.shape != w_shape:
        raise EventShapeError(f"{name}: w has shape {tuple(w.shape)}; expected {w_shape}: "
                              f"{'a row of ' if mm else ''}one value per stored synapse"
                              f"{' for each batch row of y' if mm else ''}")
    # CSC arrays of a (rows, cols) matrix are the CSR arrays of its (cols, rows) transpose
    view_shape, view_transpose = (shape[::-1], not transpose) if csc else (shape, transpose)
    op = csrmm_dt2t_p if mm else csrmv_dt2t_p
    return op(y, w, indices, indptr.astype(indices.dtype), outs=[SDS(w.shape, acc_dtype(w.dtype))], backend=backend,
              shape=tuple(view_shape), transpose=view_transpose)[0].astype(w.dtype)


def csrmv_dt2t(y, w, indices, indptr, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """Per-synapse product of a vector and CSR-ordered values: ``out[j] = w[j] * y[row_j]``
    (``transpose=True``: ``w[j] * y[indices[j]]``).

    ``csrmv_dt2t(y, w, indices, indptr, *, shape, transpose=False, backend=None)``: ``w`` has one
    value per stored synapse, shape ``(nse,)``; the result has ``w``'s shape and dtype (promoted
    with ``y``'s), and the product of their units.

    Example::

        eps = xlakern.csrmv_dt2t(d_post, eps_prev, indices, indptr, shape=(n_pre, n_post), transpose=True)
    """
    return _compressed_dt2t("csrmv_dt2t", False, False, y, w, indices, indptr, shape, transpose, backend)


def cscmv_dt2t(y, w, indices, indptr, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """:func:`csrmv_dt2t` for CSC arrays of a ``shape=(rows, cols)`` matrix (``indptr`` over columns,
    ``indices`` rows): ``y`` is read at each synapse's row (``transpose=True``: its column).

    ``cscmv_dt2t(y, w, indices, indptr, *, shape, transpose=False, backend=None)``.

    Example::

        eps = xlakern.cscmv_dt2t(d_pre, eps_prev, row_indices, col_ptr, shape=(n_pre, n_post))
    """
    return _compressed_dt2t("cscmv_dt2t", False, True, y, w, indices, indptr, shape, transpose, backend)


def csrmm_dt2t(y, w, indices, indptr, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """Batched :func:`csrmv_dt2t`: ``out[b, j] = w[b, j] * y[b, row_j]`` (or ``y[b, indices[j]]``).

    ``csrmm_dt2t(y, w, indices, indptr, *, shape, transpose=False, backend=None)`` with ``y`` of
    shape ``(batch, shape[0])`` (``(batch, shape[1])`` with ``transpose=True``) and ``w`` of shape
    ``(batch, nse)``; the result has ``w``'s shape.

    Example::

        eps = xlakern.csrmm_dt2t(d_pre_b, eps_prev_b, indices, indptr, shape=(n_pre, n_post))
    """
    return _compressed_dt2t("csrmm_dt2t", True, False, y, w, indices, indptr, shape, transpose, backend)


def cscmm_dt2t(y, w, indices, indptr, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """Batched :func:`cscmv_dt2t` (``y``: ``(batch, n)``, ``w``: ``(batch, nse)``).

    ``cscmm_dt2t(y, w, indices, indptr, *, shape, transpose=False, backend=None)``.

    Example::

        eps = xlakern.cscmm_dt2t(d_post_b, eps_prev_b, row_indices, col_ptr, shape=(n_pre, n_post), transpose=True)
    """
    return _compressed_dt2t("cscmm_dt2t", True, True, y, w, indices, indptr, shape, transpose, backend)


# ----------------------------------------------------------------------------- fixed count per row

def _fcn_dt2t(name, mm, weights, indices, y, shape, transpose):
    (y, unit_y), (weights, unit_w) = _units.split(y), _units.split(weights)
    static = dict(name=name, mm=mm, shape=_shape2(name, shape), transpose=bool(transpose))
    return _units.attach(run_fused(_fcn_body, (weights, indices, y), static), unit_w, unit_y)


def _fcn_body(weights, indices, y, *, name, mm, shape, transpose):
    """_fcn_dt2t past its units: outside a trace, one jitted program (:func:`run_fused`)."""
    y, weights = _float_pair(name, y, weights, w_arg="weights")
    rows, cols = shape
    indices = _index(name, "indices", indices)
    if indices.ndim != 2 or indices.shape[0] != rows:
        raise EventShapeError(f"{name}: indices has shape {tuple(indices.shape)}; expected ({rows}, n_conn): one "
                              f"row of targets per row of shape={shape}")
    _check_y(name, y, cols if transpose else rows, mm, transpose, shape)
    full = ((y.shape[0],) if mm else ()) + tuple(indices.shape)
    if weights.size != 1 and weights.shape != full:
        raise EventShapeError(f"{name}: weights has shape {tuple(weights.shape)}; expected {full}, or one shared "
                              f"value (size 1)")
    if weights.size == 1:
        weights = weights.reshape(())
    if transpose:
        pos, ok = indices, (indices >= 0) & (indices < cols)
    else:
        pos, ok = jnp.broadcast_to(jnp.arange(rows)[:, None], indices.shape), True
    # a gather-multiply that XLA fuses; jax differentiates it directly, so no primitive is needed
    return gather_product(y, weights, pos, ok)


def fcnmv_dt2t(weights, indices, y, *, shape, transpose: bool):
    """Per-synapse product for a fixed-count structure: ``out[i, k] = weights[i, k] * y[i]``
    (``transpose=True``: ``weights[i, k] * y[indices[i, k]]``), shaped like ``indices``.

    ``fcnmv_dt2t(weights, indices, y, *, shape, transpose)``: ``indices`` is ``(rows, n_conn)``,
    ``weights`` is shaped like it or one shared value. (``transpose`` selects how ``y`` is read,
    as in :func:`csrmv_dt2t`, the opposite sense of :func:`fcnmv`'s.)

    Example::

        eps = xlakern.fcnmv_dt2t(eps_prev, indices, d_post, shape=(n_pre, n_post), transpose=True)
    """
    return _fcn_dt2t("fcnmv_dt2t", False, weights, indices, y, shape, transpose)


def fcnmm_dt2t(weights, indices, y, *, shape, transpose: bool):
    """Batched :func:`fcnmv_dt2t`: ``out[b, i, k] = weights[b, i, k] * y[b, i]`` (or ``y[b, indices[i, k]]``).

    ``fcnmm_dt2t(weights, indices, y, *, shape, transpose)`` with ``y`` of shape ``(batch, n)`` and
    ``weights`` of shape ``(batch, rows, n_conn)`` or one shared value; the result is
    ``(batch, rows, n_conn)``.

    Example::

        eps = xlakern.fcnmm_dt2t(eps_prev_b, indices, d_pre_b, shape=(n_pre, n_post), transpose=False)
    """
    return _fcn_dt2t("fcnmm_dt2t", True, weights, indices, y, shape, transpose)


# ----------------------------------------------------------------------------- JITC

def _concrete_seed(name: str, seed: Any) -> int:
    if seed is None:
        seed = np.random.randint(0, 10 ** 8)  # as BrainEvent: a fresh matrix per call
    try:
        value = np.asarray(seed)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise EventTracedError(
            f"{name}: seed is a traced value (e.g. an argument of jax.jit), but the number of synapses, and so "
            f"the result's length, depends on it: pass a concrete integer (close over it, or mark it static with "
            f"jax.jit(..., static_argnums=...))") from None
    if not (np.issubdtype(value.dtype, np.integer) and value.size == 1):
        raise EventDTypeError(f"{name}: seed must be one integer; got {_described(seed, value)}")
    return _jitc._seed_in_range(name, int(value.reshape(()))) & 0xFFFFFFFF  # the generator reads it as uint32


@functools.lru_cache(maxsize=16)
def jitc_synapses(seed: int, prob: float, shape: tuple[int, int], corder: bool):
    """(rows and cols in ``M``, and rows and draw indices in the generated G) of every synapse of the JITC
    matrix ``M`` of ``shape``, in ``M``'s row-major order. The generator is walked row by row
    (``_jitc_kernels.generated_synapses``: the draws of ``jits/jitu/jitn``), in memory near the synapse
    count, never the dense matrix. The positions do not depend on the weights (separate draws)."""
    gshape, _ = _jitc._generated(shape, False, corder)
    with jax.ensure_compile_time_eval():  # concrete even inside a jit trace
        g_rows, g_cols, ks = JK.generated_synapses(seed, JK.skip_table(prob), shape=gshape)
    rows, cols = (g_rows, g_cols) if corder else (g_cols, g_rows)
    if not corder:  # G = M.T was walked: back to M's row-major order
        order = np.lexsort((cols, rows))
        rows, cols, g_rows, ks = rows[order], cols[order], g_rows[order], ks[order]
    index = np.int32 if max(shape) < 2 ** 31 else np.int64
    return rows.astype(index), cols.astype(index), g_rows, ks


def _jitc_dt2t(name, letter, first, second, prob, y, seed, shape, transpose, corder, backend):
    prob = _jitc._prob(name, prob)
    shape = _shape2(name, shape)
    seed = _concrete_seed(name, seed)
    _, w_dtype, unit_w = _jitc._params(name, first, second, letter)
    y, unit_y = _units.split(y)
    y = _weights(name, "y", y)
    _check_y(name, y, shape[1] if transpose else shape[0], False, transpose, shape)
    dtype = jnp.promote_types(w_dtype, y.dtype)
    if prob == 0.0 or 0 in shape:
        return _units.attach(jnp.zeros((0,), dtype), unit_w, unit_y)
    rows, cols, g_rows, ks = jitc_synapses(seed, prob, shape, bool(corder))
    params, _, _ = _jitc._params(name, first, second, letter)
    if letter == "s":
        values = params[0].astype(w_dtype)
    else:  # drawn as the kernels draw them, so the same bits as jitu/jitn
        _, qtable = _jitc._tables(name, letter, prob, params.dtype)
        values = JK.synapse_weights(params, jnp.uint32(seed), qtable, kind=JK.KINDS[letter], rows=g_rows,
                                    ks=ks).astype(w_dtype)
    res = gather_product(y.astype(dtype), values.astype(dtype), cols if transpose else rows, True)
    return _units.attach(res, unit_w, unit_y)


def jitsmv_dt2t(weight, prob, y, seed, *, shape, transpose: bool = False, corder: bool = True,
                backend: Optional[str] = None):
    """Per-synapse ``weight * y[row]`` (``transpose=True``: ``weight * y[col]``) for the scalar JITC
    matrix ``M = jits(weight, prob, seed, shape=shape, corder=corder)``, one value per synapse in
    row-major (canonical CSR) order.

    ``jitsmv_dt2t(weight, prob, y, seed, *, shape, transpose=False, corder=True, backend=None)``.
    The result's length is ``M``'s synapse count, which depends on ``seed``: ``seed`` and ``prob``
    must be concrete (a traced seed raises :class:`EventTracedError`).

    Example::

        eps = xlakern.jitsmv_dt2t(0.5, 0.1, d_pre, 42, shape=(100, 200))   # d_pre: (100,)
    """
    return _jitc_dt2t("jitsmv_dt2t", "s", weight, None, prob, y, seed, shape, transpose, corder, backend)


def jitumv_dt2t(w_low, w_high, prob, y, seed, *, shape, transpose: bool = False, corder: bool = True,
                backend: Optional[str] = None):
    """Per-synapse ``M[row, col] * y[row]`` (``transpose=True``: ``* y[col]``) for the uniform JITC
    matrix ``M = jitu(w_low, w_high, prob, seed, ...)``, in row-major order.

    ``jitumv_dt2t(w_low, w_high, prob, y, seed, *, shape, transpose=False, corder=True, backend=None)``;
    ``seed`` and ``prob`` must be concrete (see :func:`jitsmv_dt2t`).

    Example::

        eps = xlakern.jitumv_dt2t(0.0, 1.0, 0.1, d_post, 42, shape=(100, 200), transpose=True)
    """
    return _jitc_dt2t("jitumv_dt2t", "u", w_low, w_high, prob, y, seed, shape, transpose, corder, backend)


def jitnmv_dt2t(w_loc, w_scale, prob, y, seed, *, shape, transpose: bool = False, corder: bool = True,
                backend: Optional[str] = None):
    """Per-synapse ``M[row, col] * y[row]`` (``transpose=True``: ``* y[col]``) for the normal JITC
    matrix ``M = jitn(w_loc, w_scale, prob, seed, ...)``, in row-major order.

    ``jitnmv_dt2t(w_loc, w_scale, prob, y, seed, *, shape, transpose=False, corder=True, backend=None)``;
    ``seed`` and ``prob`` must be concrete (see :func:`jitsmv_dt2t`).

    Example::

        eps = xlakern.jitnmv_dt2t(0.0, 0.1, 0.1, d_pre, 42, shape=(100, 200))
    """
    return _jitc_dt2t("jitnmv_dt2t", "n", w_loc, w_scale, prob, y, seed, shape, transpose, corder, backend)
