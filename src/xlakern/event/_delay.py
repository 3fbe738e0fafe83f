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
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_node_class

from .. import XLACustomKernel
from . import _units
from ._errors import EventDTypeError, EventShapeError, EventUnitError
from ._events import EventRepresentation
from ._kernels import kernel_module, SDS, synapse_rows
from ._ops import _index, _shape2, _weights

__all__ = ["csr_delay_deliver", "CSRDelayLayout", "csr_delay_deliver_layout", "csr_delay_deliver_p"]

cpu_module = kernel_module("delay_cpu.cc")
cuda_module = kernel_module("delay_cuda.cu")


def reference_deliver(ring, events, data, indices, indptr, delays, t, *, weighted):
    """jnp form of delay_deliver (delay_common.h)."""
    nslots, ncols = ring.shape
    nrows = events.shape[0]
    nse = indices.shape[0]
    if nse == 0 or ring.size == 0:
        return ring
    rows, inside = synapse_rows(indices, indptr, nrows, -1)
    f = events.astype(ring.dtype) if weighted else (events != 0).astype(ring.dtype)
    w = jnp.broadcast_to(data.reshape(-1), (nse,))
    valid = inside & (indices >= 0) & (indices < ncols) & (events[rows] != 0)
    slot = (jnp.remainder(t[0], nslots) + jnp.remainder(delays, nslots)) % nslots
    contrib = jnp.where(valid, w * f[rows], 0)
    return ring.at[slot, jnp.clip(indices, 0, ncols - 1)].add(contrib)


def _register():
    op = XLACustomKernel("csr_delay_deliver")
    op.def_tags("event", "csr", "delay")

    def compiled(module_fn):
        def generator(outs, weighted):
            def run(*args):
                return module_fn().delay_deliver(*args, outs=outs[0], input_output_aliases={0: 0}, weighted=weighted)
            return run
        return generator

    op.def_cpp_kernel(compiled(cpu_module))
    op.def_cuda_kernel(compiled(cuda_module))
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform, lambda outs, weighted: functools.partial(reference_deliver, weighted=weighted))
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
        weighted = events._weighted if weighted is None else weighted
        events = events.value
    weighted = bool(weighted)
    ring, unit_r = _units.split(ring)
    data, unit_d = _units.split(data)
    events, unit_e = _units.split(events)
    product_unit = [u for u in (unit_d, unit_e if weighted else None) if u is not None]
    if (unit_r is None) != (not product_unit):
        raise EventUnitError(f"{name}: the ring's unit ({unit_r}) must be the unit of data times events "
                             f"({' * '.join(map(str, product_unit)) or 'none'})")
    if unit_r is not None:
        want = product_unit[0] if len(product_unit) == 1 else product_unit[0] * product_unit[1]
        if want != unit_r:
            raise EventUnitError(f"{name}: the ring has unit {unit_r}; expected {want} (data times events)")
    ring = jnp.asarray(ring)
    if ring.ndim != 2 or not jnp.issubdtype(ring.dtype, jnp.floating):
        raise EventShapeError(f"{name}: ring must be a float (L, n_post) array; got {ring.dtype}{tuple(ring.shape)}")
    n_pre, n_post = _shape2(name, shape)
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
    _check_delays(name, delays, nslots)
    delays = jnp.asarray(delays)
    if not jnp.issubdtype(delays.dtype, jnp.integer):
        raise EventDTypeError(f"{name}: delays have dtype {delays.dtype}; they must be integer steps")
    delays = jnp.broadcast_to(delays.astype(jnp.int32), (nse,))
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.integer) or t.size != 1:
        raise EventDTypeError(f"{name}: t must be one integer step; got {t.dtype}{tuple(t.shape)}")
    res = csr_delay_deliver_p(ring.astype(dtype), events, data.reshape(-1), indices, indptr, delays,
                              t.reshape(1).astype(jnp.int32), outs=[SDS(ring.shape, dtype)], backend=backend,
                              weighted=weighted)[0]
    return _units.attach(res.astype(out_dtype), unit_r)


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


@register_pytree_node_class
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
            idx, ptr = np.asarray(indices), np.asarray(indptr)
            d = np.broadcast_to(np.asarray(delays), idx.shape).astype(np.int32)
        except jax.errors.TracerArrayConversionError:
            raise EventShapeError(f"{name}: indices, indptr and delays must be concrete (the layout is built once "
                                  f"on the host); call it outside jit") from None
        if ptr.shape != (n_pre + 1,):
            raise EventShapeError(f"{name}: indptr has shape {ptr.shape}; expected ({n_pre + 1},)")
        _check_delays(name, d, int(n_slots))
        rows = np.repeat(np.arange(n_pre), np.diff(ptr))
        perm = np.lexsort((np.arange(idx.size), d, rows))  # by row, then delay, then original order
        # first position of delay >= d in each row: (row, delay) keys are sorted in layout order
        keys = rows[perm].astype(np.int64) * int(n_slots) + d[perm]
        grid = np.arange(n_pre, dtype=np.int64)[:, None] * int(n_slots) + np.arange(int(n_slots))[None, :]
        delay_ptr = (ptr[0] + np.searchsorted(keys, grid, side="left")).astype(ptr.dtype)
        layout = cls(None, jnp.asarray(idx[perm]), jnp.asarray(ptr), jnp.asarray(d[perm]), jnp.asarray(delay_ptr),
                     jnp.asarray(perm.astype(np.int32)), shape=(n_pre, n_post))
        return layout.with_data(data)

    def with_data(self, data):
        """This layout with weights given in the original synapse order (or one shared weight)."""
        mantissa, unit = _units.split(data)
        mantissa = jnp.asarray(mantissa)
        if mantissa.size > 1:
            mantissa = mantissa.reshape(-1)[self.perm]
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
    return _deliver("csr_delay_deliver_layout", ring, events, layout.data, layout.indices, layout.indptr,
                    layout.delays, t, layout.shape, weighted, backend)
