"""Plasticity: spike-triggered weight updates on stored connectivity (BrainEvent 0.3's names).

Every update has the form ``w <- clip(w + trace[partner], w_min, w_max)`` for each synapse of a
neuron that spiked: ``*_on_binary_pre`` visits the synapses of spiking presynaptic neurons and
adds the postsynaptic trace, ``*_on_binary_post`` visits those of spiking postsynaptic neurons
and adds the presynaptic trace (the two halves of pair-based STDP). Only the synapses of active
neurons are read or written, and the kernels update the weight buffer in place
(``input_output_aliases``): inside a jitted training loop XLA reuses the buffer instead of
copying the weights every step. ``w_min``/``w_max`` default to no bound and clip only the
synapses an update touches (BrainEvent 0.3 clips every weight, which reads and writes all of them;
the results agree whenever the weights start inside the bounds). Traces and bounds are converted to
the weights' unit. Updates are differentiable with respect to the weights, the trace and the bounds
(forward and reverse mode).

Example::

    import xlakern as brainevent
    w = brainevent.update_csr_on_binary_pre(w, indices, indptr, pre_spikes, post_trace, 0.0, 1.0,
                                            shape=(n_pre, n_post))
"""

from __future__ import annotations

import contextlib
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import XLACustomKernel
from . import _units
from ._eager import optional_arguments, run_fused
from ._errors import EventArgumentError, EventDTypeError, EventShapeError, EventUnitError
from ._kernels import kernel_module, rows_for, SDS, slot_rows, synapse_rows
from ._ops import _index, _shape2

__all__ = [
    "update_csr_on_binary_pre", "update_csr_on_binary_post", "update_csc_on_binary_pre",
    "update_csc_on_binary_post", "update_dense_on_binary_pre", "update_dense_on_binary_post",
    "update_fixed_post_conn_on_binary_pre", "update_fixed_pre_conn_on_binary_post", "plasticity_update_p",
]

SPARSE, DENSE = 0, 1

cpu_module = kernel_module("plasticity_cpu.cc")
cuda_module = kernel_module("plasticity_cuda.cu")


def _touched(weight, indices, indptr, perm, spikes, trace, *, ncols, nconn, mode, row_stride, col_stride, permuted,
             rows_of=synapse_rows):
    """(pos, cols, valid): each synapse's flat weight position and trace index, and whether the
    update touches it (its neuron spiked and its indices are in range). ``rows_of``: the jnp rows (the
    reference) or :func:`slot_rows` (the forward-mode rules, which run in every gradient)."""
    nse = weight.size
    nrows = spikes.shape[0]
    active = spikes != 0
    if mode == DENSE:
        pos = (jnp.arange(nrows)[:, None] * row_stride + jnp.arange(ncols)[None, :] * col_stride).reshape(-1)
        cols = jnp.tile(jnp.arange(ncols), nrows)
        valid = jnp.repeat(active, ncols)
    else:
        rows, inside = rows_of(indices, indptr, nrows, nconn)
        cols = indices.reshape(-1)
        pos = perm.reshape(-1) if permuted else jnp.arange(nse)
        valid = inside & (cols >= 0) & (cols < ncols) & (pos >= 0) & (pos < nse) & active[rows]
    return jnp.where(valid, pos, nse), jnp.clip(cols, 0, max(ncols - 1, 0)), valid


def _unclipped(weight, trace, pos, cols):
    flat = weight.reshape(-1)
    return flat[jnp.clip(pos, 0, max(flat.shape[0] - 1, 0))] + trace[cols]


def reference_update(weight, indices, indptr, perm, spikes, trace, bounds, **static):
    """jnp form of plastic_update (plasticity_common.h): the same synapses, the same rule."""
    pos, cols, _ = _touched(weight, indices, indptr, perm, spikes, trace, **static)
    new = jnp.clip(_unclipped(weight, trace, pos, cols), bounds[0], bounds[1])
    return weight.reshape(-1).at[pos].set(new, mode="drop").reshape(weight.shape)


# Forward-mode rules (linear in the tangent, so JAX transposes them for reverse mode): a touched
# synapse strictly inside [w_min, w_max] follows its weight and its trace; a clipped one follows
# the bound it hit; untouched synapses follow their weight.
def _jvp_parts(weight, indices, indptr, perm, spikes, trace, bounds, static, backend):
    pos, cols, _ = _touched(weight, indices, indptr, perm, spikes, trace, rows_of=rows_for(backend), **static)
    new = _unclipped(weight, trace, pos, cols)
    return pos, cols, new < bounds[0], new > bounds[1]


def _jvp_weight(t, weight, indices, indptr, perm, spikes, trace, bounds, *, outs, backend, **static):
    pos, _, below, above = _jvp_parts(weight, indices, indptr, perm, spikes, trace, bounds, static, backend)
    keep = jnp.ones((weight.size,), t.dtype).at[jnp.where(below | above, pos, weight.size)].set(0, mode="drop")
    return [t * keep.reshape(t.shape)]


def _scatter_tangent(per_synapse, pos, weight):
    # a scatter-add (not a set): its transpose is a gather, so reverse mode works
    return [jnp.zeros((weight.size,), per_synapse.dtype).at[pos].add(per_synapse, mode="drop").reshape(weight.shape)]


def _jvp_trace(t, weight, indices, indptr, perm, spikes, trace, bounds, *, outs, backend, **static):
    pos, cols, below, above = _jvp_parts(weight, indices, indptr, perm, spikes, trace, bounds, static, backend)
    return _scatter_tangent(jnp.where(below | above, 0, t[cols]), pos, weight)


def _jvp_bounds(t, weight, indices, indptr, perm, spikes, trace, bounds, *, outs, backend, **static):
    pos, _, below, above = _jvp_parts(weight, indices, indptr, perm, spikes, trace, bounds, static, backend)
    return _scatter_tangent(jnp.where(below, t[0], 0) + jnp.where(above, t[1], 0), pos, weight)


def _register():
    op = XLACustomKernel("plasticity_update")
    op.def_tags("event", "plasticity")

    def compiled(module_fn):
        def generator(outs, **static):
            def run(*args):
                # the output is the weights' own buffer: only active rows' synapses are rewritten
                return module_fn().plastic_update(*args, outs=outs[0], input_output_aliases={0: 0}, **static)
            return run
        return generator

    def reference(outs, **static):
        return lambda *args: reference_update(*args, **static)

    op.def_cpp_kernel(compiled(cpu_module))
    op.def_cuda_kernel(compiled(cuda_module))
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform, reference)
    op.def_jvp_rule2(_jvp_weight, None, None, None, None, _jvp_trace, _jvp_bounds)
    return op


plasticity_update_p = _register()


def _clipped_sum(w, row_trace, _, bounds):
    """The kernels' rule for one synapse: a bound is followed only where it is crossed (derivatives too)."""
    new = w + row_trace
    return jnp.where(new < bounds[0], bounds[0], jnp.where(new > bounds[1], bounds[1], new))


def update_at_index(name, weight, indices, indptr, spikes, trace, bounds, backend=None):
    """The rule on the synapses whose index neuron spiked, ``spikes[indices[p]]``, with the trace read at
    each synapse's row: one jnp pass over every synapse (``csr_apply_on_post``'s, with the kernels'
    rule). What a traced structure gets instead of a view regrouped by the index neuron (a sort of every
    synapse each call)."""
    nrows, ncols = trace.shape[0], spikes.shape[0]
    if nrows == 0 or ncols == 0 or indices.size == 0:
        return weight
    from ._plasticity_rules import apply_on

    new = apply_on(name, False, _clipped_sum, weight.reshape(-1), indices.reshape(-1), indptr, spikes, trace, None,
                   bounds, (nrows, ncols), backend=backend)
    return new.reshape(weight.shape)


# ----------------------------------------------------------------------------- argument handling

def _in_unit(name: str, arg: str, x, unit):
    """x's mantissa in `unit` (plain numbers are taken to be in it already). A unit of another dimension
    is an EventUnitError naming the argument (brainunit's own error names neither it nor the call)."""
    if not _units.is_quantity(x):
        return x
    if unit is None:
        if x.unit.is_unitless:
            return x.mantissa
        raise EventUnitError(f"{name}: {arg} is in {x.unit} but the weights carry no unit; pass {arg} as plain "
                             f"numbers, or give the weights a unit of the same dimension")
    if not x.unit.has_same_dim(unit):
        raise EventUnitError(f"{name}: {arg} is in {x.unit}, which does not convert to the weights' unit {unit}; "
                             f"pass it in a unit of the weights' dimension")
    return x.to(unit).mantissa


def _concrete_bound(x) -> Optional[float]:
    """x as a float, or None when it is traced (or not one number)."""
    try:
        value = np.asarray(x, np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError, ValueError):
        return None
    return float(value.reshape(())) if value.size == 1 else None


def _checked_bounds(name, lo, hi) -> bool:
    """Whether both bounds are known now; a w_min above w_max is refused then."""
    for arg, x in (("w_min", lo), ("w_max", hi)):
        if np.size(x) != 1:
            raise EventShapeError(f"{name}: {arg} has shape {np.shape(x)}; it must be one number (or None)")
    lo_value, hi_value = _concrete_bound(lo), _concrete_bound(hi)
    if lo_value is None or hi_value is None:
        return False
    if lo_value > hi_value:
        raise EventArgumentError(f"{name}: w_min ({lo_value:g}) is above w_max ({hi_value:g}); the weights are "
                                 f"clipped to [w_min, w_max], so w_min must not exceed w_max")
    return True


def _bounds(name, lo, hi, dtype):
    """[w_min, w_max] as the kernels take them. A w_min above w_max is refused where both are known; a
    traced one is lowered to w_max, so every backend sets the synapses it touches to w_max, as jnp.clip
    does (the kernels' and the jnp reference's clips would otherwise differ there)."""
    if not _checked_bounds(name, lo, hi):
        lo = jnp.minimum(jnp.asarray(lo, dtype), jnp.asarray(hi, dtype))
    return jnp.stack([jnp.asarray(lo, dtype).reshape(()), jnp.asarray(hi, dtype).reshape(())])


def _update(name, weight, indices, indptr, perm, spikes, trace, w_min, w_max, *, nrows, ncols, nconn, mode,
            row_stride=0, col_stride=0, backend=None, at_index=False):
    """The update through plasticity_update_p, or (``at_index``: spikes of the ``ncols`` index neurons,
    a trace of the ``nrows`` stored rows) through :func:`update_at_index`. Units and the order of the
    bounds are settled here; outside a trace the rest runs as one jitted program (:func:`run_fused`),
    where the bounds are traced: so they are checked first."""
    weight, unit = _units.split(weight)
    trace = _in_unit(name, "the trace", trace, unit)
    lo = -np.inf if w_min is None else _in_unit(name, "w_min", w_min, unit)
    hi = np.inf if w_max is None else _in_unit(name, "w_max", w_max, unit)
    _checked_bounds(name, lo, hi)
    static = dict(name=name, nrows=int(nrows), ncols=int(ncols), nconn=int(nconn), mode=mode,
                  row_stride=int(row_stride), col_stride=int(col_stride), backend=backend, at_index=at_index)
    res = run_fused(_update_body, (weight, indices, indptr, perm, spikes, trace, lo, hi), static)
    return _units.attach(res, unit)


@optional_arguments("indices", "indptr", "perm")
def _update_body(weight, indices, indptr, perm, spikes, trace, w_min, w_max, *, name, nrows, ncols, nconn, mode,
                 row_stride, col_stride, backend, at_index):
    if at_index:  # the checks below read spikes at rows and the trace at columns
        nrows, ncols = ncols, nrows
    weight = jnp.asarray(weight)
    if not jnp.issubdtype(weight.dtype, jnp.floating):
        raise EventDTypeError(f"{name}: weight has dtype {weight.dtype}; plasticity needs float weights")
    out_dtype = weight.dtype
    dtype = out_dtype if out_dtype in (jnp.float32, jnp.float64) else jnp.dtype(jnp.float32)
    spikes = jnp.asarray(spikes)
    if spikes.shape != (nrows,):
        raise EventShapeError(f"{name}: the spikes have shape {tuple(spikes.shape)}; expected ({nrows},)")
    trace = jnp.asarray(trace, dtype)
    if trace.shape != (ncols,):
        raise EventShapeError(f"{name}: the trace has shape {tuple(trace.shape)}; expected ({ncols},)")
    bounds = _bounds(name, w_min, w_max, dtype)
    if mode == SPARSE:
        indices = _index(name, "indices", indices)
        if weight.size == 1 and indices.size > 1:
            raise EventShapeError(f"{name}: weight holds one shared value; plasticity needs one weight per synapse "
                                  f"(broadcast it to indices' shape {tuple(indices.shape)} first)")
        if weight.size != indices.size:
            raise EventShapeError(f"{name}: weight has shape {tuple(weight.shape)}; expected one weight per index "
                                  f"({tuple(indices.shape)})")
        indptr = jnp.zeros((1,), indices.dtype) if indptr is None else _index(name, "indptr", indptr)
        stored_rows = ncols if at_index else nrows
        if nconn < 0 and indptr.shape != (stored_rows + 1,):
            raise EventShapeError(f"{name}: indptr has shape {tuple(indptr.shape)}; expected ({stored_rows + 1},)")
        indptr = indptr.astype(indices.dtype)
        permuted = perm is not None
        if permuted:
            perm = _index(name, "weight_indices", perm)
            if perm.size != indices.size:
                raise EventShapeError(f"{name}: weight_indices has shape {tuple(perm.shape)}; expected one position "
                                      f"per index ({tuple(indices.shape)})")
        else:
            perm = jnp.zeros((1,), indices.dtype)
    else:
        indices = indptr = perm = jnp.zeros((1,), jnp.int32)
        permuted = False
    if at_index:
        res = update_at_index(name, weight.astype(dtype), indices, indptr.astype(indices.dtype), spikes, trace,
                              bounds, backend=backend)
        return res.astype(out_dtype)
    res = plasticity_update_p(weight.astype(dtype), indices, indptr, perm.astype(indices.dtype), spikes, trace,
                              bounds, outs=[SDS(weight.shape, dtype)], backend=backend, ncols=int(ncols),
                              nconn=int(nconn), mode=mode, row_stride=int(row_stride), col_stride=int(col_stride),
                              permuted=bool(permuted))[0]
    return res.astype(out_dtype)


def update_on_index_spikes(name, weight, indices, indptr, row_trace, index_spike, w_min, w_max, *, nrows, ncols,
                           backend=None):
    """For each synapse (stored row ``r``, index ``j``) of a compressed structure of ``nrows`` rows and
    ``ncols`` index neurons whose index neuron spiked: ``w <- clip(w + row_trace[r], w_min, w_max)``, in
    one pass over every synapse (:func:`update_at_index`; for traced structures)."""
    return _update(name, weight, indices, indptr, None, index_spike, row_trace, w_min, w_max, nrows=nrows,
                   ncols=ncols, nconn=-1, mode=SPARSE, backend=backend, at_index=True)


# ----------------------------------------------------------------------------- public updates

def update_csr_on_binary_pre(weight, indices, indptr, pre_spike, post_trace, w_min=None, w_max=None, *, shape,
                             backend: Optional[str] = None):
    """For each spiking presynaptic neuron ``i`` and stored synapse ``(i, j)`` of a CSR matrix of
    ``shape=(n_pre, n_post)``: ``w <- clip(w + post_trace[j], w_min, w_max)``.

    Example::

        w = xlakern.update_csr_on_binary_pre(w, indices, indptr, pre_spikes, post_trace, 0.0, 1.0, shape=(3, 4))
    """
    n_pre, n_post = _shape2("update_csr_on_binary_pre", shape)
    return _update("update_csr_on_binary_pre", weight, indices, indptr, None, pre_spike, post_trace, w_min, w_max,
                   nrows=n_pre, ncols=n_post, nconn=-1, mode=SPARSE, backend=backend)


def update_csr_on_binary_post(weight, indices, indptr, weight_indices, pre_trace, post_spike, w_min=None,
                              w_max=None, *, shape, backend: Optional[str] = None):
    """For each spiking postsynaptic neuron ``j`` and synapse ``(i, j)``: ``w <- clip(w + pre_trace[i])``.

    ``weight`` is in CSR order for ``shape=(n_pre, n_post)``; ``indices``/``indptr`` are the CSC
    view (``indptr`` has ``n_post + 1`` entries, ``indices`` are presynaptic ids) and
    ``weight_indices[p]`` is the CSR position of the view's p-th synapse.

    Example::

        w = xlakern.update_csr_on_binary_post(w, csc_indices, csc_indptr, perm, pre_trace, post_spikes,
                                              shape=(n_pre, n_post))
    """
    n_pre, n_post = _shape2("update_csr_on_binary_post", shape)
    return _update("update_csr_on_binary_post", weight, indices, indptr, weight_indices, post_spike, pre_trace,
                   w_min, w_max, nrows=n_post, ncols=n_pre, nconn=-1, mode=SPARSE, backend=backend)


def traced_structure(*arrays) -> bool:
    """Whether a structure's arrays are abstract (jit arguments, values computed in the trace)."""
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def csc_to_csr_view(indices, indptr, *, shape):
    """(csr_indptr, csr_indices, perm) of a CSC structure of ``shape=(n_pre, n_post)``: its synapses
    grouped by presynaptic neuron; ``perm[p]`` is the CSC position of the view's p-th synapse. Synapses
    outside every column or with a row outside ``[0, n_pre)`` come last, after every row of the view.
    Traceable (a stable sort), so it also works on indices built inside ``jit``. Concrete indices (a
    structure closed over by a jitted function) are regrouped once, while tracing: in the graph, the
    sort ran every call, and XLA spent over a minute constant-folding it at 3.2M synapses.

    Example::

        indptr_r, indices_r, perm = csc_to_csr_view(csc.indices, csc.indptr, shape=csc.shape)
    """
    n_pre, n_post = shape
    with contextlib.nullcontext() if traced_structure(indices, indptr) else jax.ensure_compile_time_eval():
        indices = jnp.asarray(indices)
        cols, inside = slot_rows(indices, jnp.asarray(indptr), n_post, -1)  # the post neuron of each synapse
        # a synapse outside every column, or whose row is outside [0, n_pre), goes last, in no row of the view
        key = jnp.where(inside & (indices >= 0) & (indices < n_pre), indices, n_pre).astype(indices.dtype)
        perm = jnp.argsort(key, stable=True).astype(indices.dtype)
        counts = jnp.zeros((n_pre,), indices.dtype).at[key].add(1, mode="drop")
        csr_indptr = jnp.concatenate([jnp.zeros((1,), indices.dtype), jnp.cumsum(counts).astype(indices.dtype)])
        return csr_indptr, cols[perm].astype(indices.dtype), perm


def update_csc_on_binary_pre(weight, indices, indptr, pre_spike, post_trace, w_min=None, w_max=None, *, shape,
                             backend: Optional[str] = None):
    """:func:`update_csr_on_binary_pre` for weights stored in CSC order (``shape=(n_pre, n_post)``).

    Example::

        w = xlakern.update_csc_on_binary_pre(csc.data, csc.indices, csc.indptr, pre_spikes, post_trace,
                                             shape=csc.shape)
    """
    name = "update_csc_on_binary_pre"
    n_pre, n_post = _shape2(name, shape)
    if traced_structure(indices, indptr):  # a view would sort every synapse each call: one pass instead
        return update_on_index_spikes(name, weight, _index(name, "indices", indices), _index(name, "indptr", indptr),
                                      post_trace, pre_spike, w_min, w_max, nrows=n_post, ncols=n_pre, backend=backend)
    with jax.ensure_compile_time_eval():  # concrete (NumPy, or closed over by jit): regrouped once, now
        indices = _index(name, "indices", indices)
        csr_indptr, csr_indices, perm = csc_to_csr_view(indices, _index(name, "indptr", indptr), shape=(n_pre, n_post))
    return _update(name, weight, csr_indices, csr_indptr, perm, pre_spike, post_trace, w_min, w_max, nrows=n_pre,
                   ncols=n_post, nconn=-1, mode=SPARSE, backend=backend)


def update_csc_on_binary_post(weight, indices, indptr, pre_trace, post_spike, w_min=None, w_max=None, *, shape,
                              backend: Optional[str] = None):
    """For each spiking postsynaptic neuron ``j`` (a stored CSC column): ``w <- clip(w + pre_trace[i])``.

    Example::

        w = xlakern.update_csc_on_binary_post(csc.data, csc.indices, csc.indptr, pre_trace, post_spikes,
                                              shape=csc.shape)
    """
    n_pre, n_post = _shape2("update_csc_on_binary_post", shape)
    return _update("update_csc_on_binary_post", weight, indices, indptr, None, post_spike, pre_trace, w_min, w_max,
                   nrows=n_post, ncols=n_pre, nconn=-1, mode=SPARSE, backend=backend)


def _dense_shape(name, weight):
    m = np.shape(_units.split(weight)[0])
    if len(m) != 2:
        raise EventShapeError(f"{name}: weight has shape {m}; expected a (n_pre, n_post) matrix")
    return m


def update_dense_on_binary_pre(weight, pre_spike, post_trace, w_min=None, w_max=None, *,
                               backend: Optional[str] = None):
    """Rows of spiking presynaptic neurons: ``W[i, :] <- clip(W[i, :] + post_trace)``.

    Example::

        W = xlakern.update_dense_on_binary_pre(W, pre_spikes, post_trace, 0.0, 1.0)
    """
    n_pre, n_post = _dense_shape("update_dense_on_binary_pre", weight)
    return _update("update_dense_on_binary_pre", weight, None, None, None, pre_spike, post_trace, w_min, w_max,
                   nrows=n_pre, ncols=n_post, nconn=-1, mode=DENSE, row_stride=n_post, col_stride=1,
                   backend=backend)


def update_dense_on_binary_post(weight, pre_trace, post_spike, w_min=None, w_max=None, *,
                                backend: Optional[str] = None):
    """Columns of spiking postsynaptic neurons: ``W[:, j] <- clip(W[:, j] + pre_trace)``.

    Example::

        W = xlakern.update_dense_on_binary_post(W, pre_trace, post_spikes, 0.0, 1.0)
    """
    n_pre, n_post = _dense_shape("update_dense_on_binary_post", weight)
    return _update("update_dense_on_binary_post", weight, None, None, None, post_spike, pre_trace, w_min, w_max,
                   nrows=n_post, ncols=n_pre, nconn=-1, mode=DENSE, row_stride=1, col_stride=n_post,
                   backend=backend)


def _fixed(name, weight, indices, spikes, trace, w_min, w_max, nrows, ncols, backend):
    k = np.shape(indices)
    if len(k) != 2 or k[0] != nrows:
        raise EventShapeError(f"{name}: indices has shape {k}; expected ({nrows}, K)")
    return _update(name, weight, indices, None, None, spikes, trace, w_min, w_max, nrows=nrows, ncols=ncols,
                   nconn=k[1], mode=SPARSE, backend=backend)


def update_fixed_post_conn_on_binary_pre(data, indices, pre_spike, post_trace, w_min=None, w_max=None, *, shape,
                                         backend: Optional[str] = None):
    """Fixed-count rows (``indices``: (n_pre, K) post ids): ``data[i, k] <- clip(data[i, k] + post_trace[indices[i, k]])``
    for each spiking presynaptic ``i``.

    Example::

        data = xlakern.update_fixed_post_conn_on_binary_pre(data, idx, pre_spikes, post_trace, shape=(n_pre, n_post))
    """
    n_pre, n_post = _shape2("update_fixed_post_conn_on_binary_pre", shape)
    return _fixed("update_fixed_post_conn_on_binary_pre", data, indices, pre_spike, post_trace, w_min, w_max, n_pre,
                  n_post, backend)


def update_fixed_pre_conn_on_binary_post(data, indices, pre_trace, post_spike, w_min=None, w_max=None, *, shape,
                                         backend: Optional[str] = None):
    """Fixed-count columns (``indices``: (n_post, K) pre ids): ``data[j, k] <- clip(data[j, k] + pre_trace[indices[j, k]])``
    for each spiking postsynaptic ``j``.

    Example::

        data = xlakern.update_fixed_pre_conn_on_binary_post(data, idx, pre_trace, post_spikes, shape=(n_pre, n_post))
    """
    n_pre, n_post = _shape2("update_fixed_pre_conn_on_binary_post", shape)
    return _fixed("update_fixed_pre_conn_on_binary_post", data, indices, post_spike, pre_trace, w_min, w_max, n_post,
                  n_pre, backend)
