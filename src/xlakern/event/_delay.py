"""Synaptic delays: spikes delivered through CSR synapses, each with its own delay, into an
arrival ring buffer (BrainEvent 0.3's ``csr_delay_deliver``, ``CSRDelayLayout`` and
``csr_delay_deliver_layout``).

The ring has shape ``(L, n_post)``; row ``s`` holds the input that arrives at the steps ``t`` with
``t mod L == s``. At step ``t`` every synapse ``e`` of an active presynaptic row adds its weight
(times the event value when weighted) to ``ring[(t + delays[e]) mod L, indices[e]]``; delays lie
in ``[1, L)``. The kernels add into the ring's own buffer (``input_output_aliases``) and visit the
active rows only. A simulation reads ``ring[t mod L]`` and clears that row after using it.

Example::

    ring = brainevent.csr_delay_deliver(ring, spikes, data, indices, indptr, delays, t, shape=(n_pre, n_post))
    current = ring[t % L]; ring = ring.at[t % L].set(0)
"""

from __future__ import annotations

import functools
import operator
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_with_keys_class

from .. import XLACustomKernel
from . import _units
from ._eager import run_fused
from ._errors import EventArgumentError, EventDTypeError, EventShapeError, EventTracedError, EventUnitError
from ._events import EventRepresentation, _keyed
from ._kernels import kernel_module, note_atomic_sums, rows_for, SDS, synapse_rows
from ._ops import _index, _shape2, _weights

__all__ = ["csr_delay_deliver", "CSRDelayLayout", "csr_delay_deliver_layout", "csr_delay_deliver_p"]

cpu_module = kernel_module("delay_cpu.cc")
cuda_module = kernel_module("delay_cuda.cu")


def _synapses(ring, events, indices, indptr, delays, t, rows_of=synapse_rows):
    """Every synapse's row, arrival slot and clamped column, and whether it delivers at all (inside a row,
    column in range); the kernels' rules (delay_common.h). ``rows_of``: the jnp rows (the reference) or
    :func:`slot_rows` (the forward-mode rules, which run in every gradient)."""
    nslots, ncols = ring.shape
    rows, inside = rows_of(indices, indptr, events.shape[0], -1)
    valid = inside & (indices >= 0) & (indices < ncols)
    slot = (jnp.remainder(t[0], nslots) + jnp.remainder(delays, nslots)) % nslots
    return rows, valid, slot, jnp.clip(indices, 0, ncols - 1)


def _factor(events, dtype, weighted):
    """f(x): the event's value (weighted) or 1 for an active event."""
    return events.astype(dtype) if weighted else (events != 0).astype(dtype)


def _delivered(ring, events, indices, indptr, delays, t, per_synapse, rows_of=synapse_rows):
    """Zeros shaped like the ring plus ``per_synapse(rows)`` added at each valid synapse's slot and
    column (rows: each synapse's presynaptic row)."""
    if indices.shape[0] == 0 or ring.size == 0:
        return jnp.zeros(ring.shape, ring.dtype)
    rows, valid, slot, cols = _synapses(ring, events, indices, indptr, delays, t, rows_of)
    return jnp.zeros(ring.shape, ring.dtype).at[slot, cols].add(jnp.where(valid, per_synapse(rows), 0))


def _weights_times_events(data, events, weighted, nse):
    """A synapse's weight times f(its row's event), zero (selected, not multiplied) for inactive events."""
    w = jnp.broadcast_to(data.reshape(-1), (nse,))
    return lambda rows: jnp.where(events[rows] != 0, w * _factor(events, w.dtype, weighted)[rows], 0)


def reference_deliver(ring, events, data, indices, indptr, delays, t, *, weighted):
    """jnp form of delay_deliver (delay_common.h)."""
    return ring + _delivered(ring, events, indices, indptr, delays, t,
                             _weights_times_events(data, events, weighted, indices.shape[0]))


# Forward-mode rules. The output is ring + M(data) f(events), linear in the ring and in the weights; the
# events' tangent goes through M itself (for binary events the straight-through estimate, as for the
# event products: the spike gradient is the dense product). The rules are jnp scatter-adds, which JAX
# transposes to gathers for reverse mode; an inactive event's synapses get an exact zero weight gradient.
def _jvp_ring(t_ring, ring, *rest, outs, backend, weighted):
    return [t_ring]


def _jvp_data(t_data, ring, events, data, indices, indptr, delays, t, *, outs, backend, weighted):
    return [_delivered(ring, events, indices, indptr, delays, t,
                       _weights_times_events(t_data, events, weighted, indices.shape[0]), rows_for(backend))]


def _jvp_events(t_events, ring, events, data, indices, indptr, delays, t, *, outs, backend, weighted):
    w = jnp.broadcast_to(data.reshape(-1), (indices.shape[0],))
    return [_delivered(ring, events, indices, indptr, delays, t, lambda rows: w * t_events.astype(w.dtype)[rows],
                       rows_for(backend))]


def _register():
    op = XLACustomKernel("csr_delay_deliver")
    op.def_tags("event", "csr", "delay")

    def compiled(module_fn):
        def generator(outs, weighted):
            def run(*args):
                if module_fn is cuda_module:  # at each lowering: this generator outlives set_deterministic's switches
                    note_atomic_sums("csr_delay_deliver")
                return module_fn().delay_deliver(*args, outs=outs[0], input_output_aliases={0: 0}, weighted=weighted)
            return run
        return generator

    op.def_cpp_kernel(compiled(cpu_module))
    op.def_cuda_kernel(compiled(cuda_module))
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform, lambda outs, weighted: functools.partial(reference_deliver, weighted=weighted))
    op.def_jvp_rule2(_jvp_ring, _jvp_events, _jvp_data, None, None, None, None)
    return op


csr_delay_deliver_p = _register()


def _check_delays(name, delays, nslots):
    """Concrete delays must lie in [1, L) (traced ones wrap modulo L)."""
    try:
        d = np.asarray(delays)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    if d.size == 0:
        return
    if d.min() < 1 or d.max() >= nslots:
        raise EventShapeError(f"{name}: delays must satisfy 1 <= d < L = {nslots} (the ring's length); got values in "
                              f"[{d.min()}, {d.max()}]. Use a longer ring")


def _deliver(name, ring, events, data, indices, indptr, delays, t, shape, weighted, backend):
    if isinstance(events, EventRepresentation):
        if weighted is not None and bool(weighted) != events._weighted:
            raise EventArgumentError(f"{name}: weighted={weighted} contradicts the event type "
                                  f"({type(events).__name__}); leave weighted=None or pass a plain array")
        weighted = events._weighted
        events = events.value
    weighted = bool(weighted)
    ring, unit_r = _units.split(ring)
    data, unit_d = _units.split(data)
    events, unit_e = _units.split(events)
    product_unit = [u for u in (unit_d, unit_e if weighted else None) if u is not None]
    if (unit_r is None) != (not product_unit):
        raise EventUnitError(f"{name}: the ring's unit ({unit_r}) must be the unit of data times events "
                             f"({' * '.join(map(str, product_unit)) or 'none'})")
    want = None
    if unit_r is not None:
        want = product_unit[0] if len(product_unit) == 1 else product_unit[0] * product_unit[1]
        if want != unit_r:
            # a ring in a unit of the same dimension (V for mV deliveries) is converted to the delivered one
            if not unit_r.has_same_dim(want):
                raise EventUnitError(f"{name}: the ring has unit {unit_r}; expected {want} (data times events) or "
                                     f"a unit of the same dimension")
            ring = _units.attach(ring, unit_r).to_decimal(want)
    slots = np.shape(ring)
    if len(slots) == 2:  # (else the body refuses the ring) checked now: in the fused program delays are traced
        _check_delays(name, delays, slots[0])
    static = dict(name=name, shape=_shape2(name, shape), weighted=weighted, backend=backend)
    res = run_fused(_deliver_body, (ring, events, data, indices, indptr, delays, t), static)
    return _units.attach(res, want)


def _deliver_body(ring, events, data, indices, indptr, delays, t, *, name, shape, weighted, backend):
    """_deliver past its units: outside a trace, one jitted program (:func:`run_fused`)."""
    ring = jnp.asarray(ring)
    if ring.ndim != 2 or not jnp.issubdtype(ring.dtype, jnp.floating):
        raise EventShapeError(f"{name}: ring must be a 2-D float (L, n_post) array; got {ring.dtype}"
                              f"{tuple(ring.shape)}")
    n_pre, n_post = shape
    nslots = ring.shape[0]
    if ring.shape[1] != n_post:
        raise EventShapeError(f"{name}: ring has shape {tuple(ring.shape)}; expected (L, {n_post})")
    out_dtype = ring.dtype
    dtype = out_dtype if out_dtype in (jnp.float32, jnp.float64) else jnp.dtype(jnp.float32)
    indices = _index(name, "indices", indices)
    indptr = _index(name, "indptr", indptr).astype(indices.dtype)
    if indptr.shape != (n_pre + 1,):
        raise EventShapeError(f"{name}: indptr has shape {tuple(indptr.shape)}; expected ({n_pre + 1},)")
    nse = indices.shape[0]
    data = _weights(name, "data", data).astype(dtype)
    if data.size != 1 and data.shape != (nse,):
        raise EventShapeError(f"{name}: data has shape {tuple(data.shape)}; expected (1,) or ({nse},)")
    events = jnp.asarray(events)
    if events.shape != (n_pre,):
        raise EventShapeError(f"{name}: events have shape {tuple(events.shape)}; expected ({n_pre},)")
    if weighted:
        events = events.astype(dtype)
    delays = jnp.asarray(delays)
    if not jnp.issubdtype(delays.dtype, jnp.integer):
        raise EventDTypeError(f"{name}: delays must be an integer array (steps); got dtype {delays.dtype}")
    if delays.ndim > 1 or delays.size not in (1, nse):
        raise EventShapeError(f"{name}: delays have shape {tuple(delays.shape)}; expected ({nse},) or a scalar")
    if jnp.iinfo(delays.dtype).max > np.iinfo(np.int32).max:
        delays = jnp.remainder(delays, nslots)  # (int64, uint32: wrapped before they are narrowed to int32)
    delays = jnp.broadcast_to(delays.astype(jnp.int32), (nse,))
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.integer):
        raise EventDTypeError(f"{name}: t must be an integer step; got dtype {t.dtype}")
    if t.size != 1:
        raise EventShapeError(f"{name}: t must be a scalar step; got shape {tuple(t.shape)}")
    if jnp.iinfo(t.dtype).max > np.iinfo(np.int32).max:
        t = jnp.remainder(t, nslots)
    res = csr_delay_deliver_p(ring.astype(dtype), events, data.reshape(-1), indices, indptr, delays,
                              t.reshape(1).astype(jnp.int32), outs=[SDS(ring.shape, dtype)], backend=backend,
                              weighted=weighted)[0]
    return res.astype(out_dtype)


def csr_delay_deliver(ring, events, data, indices, indptr, delays, t, *, shape, weighted: Optional[bool] = None,
                      backend: Optional[str] = None):
    """Adds each active presynaptic row's synapses into ``ring[(t + delays[e]) mod L, indices[e]]``.

    ``events``: (n_pre,) array, :class:`BinaryArray` or :class:`WeightedArray` (weighted delivery
    multiplies by the event value; ``weighted`` overrides). ``data``: one shared weight or one per
    synapse. ``delays``: one per synapse or a scalar, in ``[1, L)``. ``t`` may be traced.

    Example::

        ring = xlakern.csr_delay_deliver(ring, spikes, data, indices, indptr, delays, t, shape=(n_pre, n_post))
    """
    return _deliver("csr_delay_deliver", ring, events, data, indices, indptr, delays, t, shape, weighted, backend)


@register_pytree_with_keys_class
class CSRDelayLayout:
    """CSR synapses with their delays, each row's synapses sorted by delay (ties keep their order);
    ``delay_ptr[i, d]`` is where row ``i``'s synapses of delay ``d`` start, ``perm[k]`` the original
    position of layout synapse ``k``. Weights live in layout order (:meth:`with_data` loads
    weights in the original order, :meth:`original_data` reads them back).

    Example::

        layout = xlakern.CSRDelayLayout.build(data, indices, indptr, delays, n_slots=L, shape=(n_pre, n_post))
        ring = layout.deliver(ring, spikes, t)
    """

    def __init__(self, data, indices, indptr, delays, delay_ptr, perm, *, shape):
        self.data, self.indices, self.indptr = data, indices, indptr
        self.delays, self.delay_ptr, self.perm = delays, delay_ptr, perm
        self.shape = (int(shape[0]), int(shape[1]))

    @property
    def n_slots(self) -> int:
        return int(self.delay_ptr.shape[1])

    @property
    def nse(self) -> int:
        return int(self.indices.shape[0])

    def tree_flatten(self):
        return (self.data, self.indices, self.indptr, self.delays, self.delay_ptr, self.perm), self.shape

    def tree_flatten_with_keys(self):  # key paths name the attributes: `.data`, `.delays`, ...
        children, aux = self.tree_flatten()
        names = ("data", "indices", "indptr", "delays", "delay_ptr", "perm")
        return _keyed(self, CSRDelayLayout, names, children), aux

    @classmethod
    def tree_unflatten(cls, shape, children):
        return cls(*children, shape=shape)

    @classmethod
    def build(cls, data, indices, indptr, delays, *, n_slots: int, shape):
        """The layout of a CSR structure (concrete indices, indptr and delays; ``data`` may be traced).

        Example::

            layout = xlakern.CSRDelayLayout.build(w, indices, indptr, delays, n_slots=8, shape=(3, 4))
        """
        name = "CSRDelayLayout.build"
        n_pre, n_post = _shape2(name, shape)
        try:
            n_slots = operator.index(n_slots)
        except TypeError:
            if not (isinstance(n_slots, float) and n_slots.is_integer()):
                raise EventArgumentError(f"{name}: n_slots must be an int; got {n_slots!r:.40}") from None
            n_slots = int(n_slots)
        if n_slots < 2:
            raise EventShapeError(f"{name}: n_slots must be at least 2 (delays lie in [1, n_slots)); got {n_slots}")
        if any(isinstance(a, jax.core.Tracer) for a in (indices, indptr, delays)):
            raise EventTracedError(f"{name}: indices, indptr and delays must be concrete (the layout is built once "
                                   f"on the host); call it outside jit")
        idx, ptr, d = np.asarray(indices), np.asarray(indptr), np.asarray(delays)
        if not np.issubdtype(d.dtype, np.integer):
            raise EventDTypeError(f"{name}: delays must be integer steps; got dtype {d.dtype}")
        if ptr.shape != (n_pre + 1,):
            raise EventShapeError(f"{name}: indptr has shape {ptr.shape}; expected ({n_pre + 1},)")
        if idx.ndim != 1 or (ptr.size and int(ptr[-1]) != idx.size):
            raise EventShapeError(f"{name}: indices has shape {idx.shape}; expected (nse,) with nse = indptr[-1] = "
                                  f"{int(ptr[-1]) if ptr.size else 0}")
        if d.ndim > 1 or d.size not in (1, idx.size):
            raise EventShapeError(f"{name}: delays must have shape ({idx.size},), one per synapse, or be a scalar; "
                                  f"got {d.shape}")
        d = np.broadcast_to(d, idx.shape)
        _check_delays(name, d, n_slots)
        d = d.astype(np.int32)
        rows = np.repeat(np.arange(n_pre), np.diff(ptr))
        perm = np.lexsort((np.arange(idx.size), d, rows))  # by row, then delay, then original order
        # first position of delay >= d in each row: (row, delay) keys are sorted in layout order
        keys = rows[perm].astype(np.int64) * n_slots + d[perm]
        grid = np.arange(n_pre, dtype=np.int64)[:, None] * n_slots + np.arange(n_slots)[None, :]
        delay_ptr = (ptr[0] + np.searchsorted(keys, grid, side="left")).astype(ptr.dtype)
        layout = cls(None, jnp.asarray(idx[perm]), jnp.asarray(ptr), jnp.asarray(d[perm]), jnp.asarray(delay_ptr),
                     jnp.asarray(perm.astype(np.int32)), shape=(n_pre, n_post))
        return layout.with_data(data)

    def with_data(self, data):
        """This layout with weights given in the original synapse order (one per synapse), or one shared
        weight (a scalar or shape ``(1,)``, kept as shape ``(1,)``).

        Example::

            layout = layout.with_data(new_weights)      # new_weights: (nse,), in the CSR's order
        """
        mantissa, unit = _units.split(data)
        mantissa = jnp.asarray(mantissa)
        if mantissa.size == 1 and mantissa.ndim <= 1:
            mantissa = mantissa.reshape(1)
        elif mantissa.shape == (self.nse,):
            mantissa = mantissa[self.perm]
        else:
            raise EventShapeError(f"CSRDelayLayout: data must be one weight per synapse ({self.nse},) or one shared "
                                  f"weight; got shape {tuple(mantissa.shape)}")
        return CSRDelayLayout(_units.attach(mantissa, unit), self.indices, self.indptr, self.delays, self.delay_ptr,
                              self.perm, shape=self.shape)

    def original_data(self):
        """The weights in the original synapse order."""
        mantissa, unit = _units.split(self.data)
        if jnp.size(mantissa) > 1:
            mantissa = jnp.zeros_like(mantissa).at[self.perm].set(mantissa)
        return _units.attach(mantissa, unit)

    def deliver(self, ring, events, t, *, weighted: Optional[bool] = None, backend: Optional[str] = None):
        """:func:`csr_delay_deliver_layout` on this layout."""
        return csr_delay_deliver_layout(ring, events, self, t, weighted=weighted, backend=backend)


def csr_delay_deliver_layout(ring, events, layout: CSRDelayLayout, t, *, weighted: Optional[bool] = None,
                             backend: Optional[str] = None):
    """:func:`csr_delay_deliver` on a :class:`CSRDelayLayout` (the same result as on the CSR it was
    built from, up to the order of floating-point additions).

    Example::

        ring = xlakern.csr_delay_deliver_layout(ring, spikes, layout, t)
    """
    name = "csr_delay_deliver_layout"
    if not isinstance(layout, CSRDelayLayout):
        raise EventDTypeError(f"{name}: layout must be a CSRDelayLayout (CSRDelayLayout.build); got "
                              f"{type(layout).__name__}")
    slots = np.shape(_units.split(ring)[0])
    if len(slots) == 2 and slots[0] != layout.n_slots:
        raise EventShapeError(f"{name}: ring has shape {slots}; expected (n_slots, n_post) = ({layout.n_slots}, "
                              f"{layout.shape[1]}), the layout's")
    return _deliver("csr_delay_deliver_layout", ring, events, layout.data, layout.indices, layout.indptr,
                    layout.delays, t, layout.shape, weighted, backend)
