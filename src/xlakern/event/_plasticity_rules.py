"""Plasticity rules of your own on CSR synapses (BrainEvent 0.3's ``csr_apply_on_pre`` / ``csr_apply_on_post``).

``rule(edge, pre, post, params) -> new_edge`` is evaluated for every stored synapse ``e = (i, j)``
with ``jax.vmap``: ``edge`` is the per-synapse state (any pytree of ``(nse, ...)`` leaves) at ``e``,
``pre`` / ``post`` the per-neuron values at ``i`` / ``j``, ``params`` the same for every synapse. A
synapse takes the rule's result when its presynaptic (``_on_pre``) or postsynaptic (``_on_post``)
neuron is active, a non-zero spike (NaN is active), and keeps its state otherwise. The rule can be
anything jnp can write (eligibility traces, weight-dependent STDP, reward modulation), so it runs as
one fused jnp pass over the synapses rather than as a kernel: the cost is the synapse count, not the
spike count. Only each synapse's row comes from a kernel (``csr_slot_rows``; XLA's scan for it was
most of a CPU step). For the additive trace rule, ``update_csr_on_binary_pre/post`` touch only the
synapses of active neurons.

Policy: a synapse whose column index is out of range, or that lies outside every row of ``indptr``,
is never updated (the event operators drop such synapses too). ``indptr`` is taken to be
non-decreasing; for one that is not, which synapse counts as in which row may differ between the CPU
and a GPU, but nothing is read or written outside the arrays. Leaves keep their dtype and unit: a
rule's result with a unit is converted to its leaf's unit. Gradients flow through the rule, the state,
the neuron values and ``params`` (inactive synapses pass a zero cotangent into the rule, as with any
``jnp.where``).

Example::

    def stdp(edge, pre, post, p):
        elig = p["decay"] * edge["elig"] + post
        return {"w": edge["w"] + p["lr"] * elig, "elig": elig}

    state = xlakern.csr_apply_on_pre(stdp, {"w": w, "elig": elig}, indices, indptr, pre_spikes,
                                     post_vals=post_trace, params={"lr": 0.01, "decay": 0.9}, shape=(n_pre, n_post))
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _units
from ._arguments import as_array
from ._errors import EventDTypeError, EventRuleError, EventShapeError, EventUnitError
from ._kernels import slot_rows
from ._ops import _shape2

__all__ = ["csr_apply_on_pre", "csr_apply_on_post"]

Rule = Callable[[Any, Any, Any, Any], Any]


def _check_leading(name: str, arg: str, tree, size: int, what: str) -> None:
    for leaf in jax.tree_util.tree_leaves(tree, is_leaf=_units.is_quantity):
        shape = tuple(np.shape(_units.split(leaf)[0]))
        if not shape or shape[0] != size:
            raise EventShapeError(f"{name}: a leaf of {arg} has shape {shape}; every leaf needs a leading "
                                  f"dimension of {size} ({what})")


def _active(name: str, arg: str, spike, size: int):
    s = as_array(name, arg, _units.split(spike)[0], quantity=False)
    if s.shape != (size,):
        raise EventShapeError(f"{name}: {arg} has shape {s.shape}; expected ({size},) (one spike a neuron)")
    return s != 0  # bool spikes: True; numbers: non-zero, NaN included


def _take(v, at):
    """``v[at]`` for indices already inside ``v`` (clipped by the caller): no wrapping of negative ones."""
    return jnp.asarray(v).at[at].get(mode="promise_in_bounds")


def _fired_in_bits(fired, at):
    """``fired[at]`` read from a word of bits per 32 neurons: 32x fewer bytes for the random reads of a
    GPU's caches (H200, 400k x 80 synapses, bench_be_api's loop: csr_apply_on_post 587 -> 406 µs a step,
    _on_pre 470 -> 393). XLA's CPU code for it was 5x slower than the plain gather."""
    pad = (-fired.shape[0]) % 32
    bits = jnp.pad(fired, (0, pad)).reshape(-1, 32).astype(jnp.uint32) << jnp.arange(32, dtype=jnp.uint32)
    words = bits.sum(axis=1, dtype=jnp.uint32)  # distinct bits: the sum is their OR
    word = words.at[at >> 5].get(mode="promise_in_bounds")
    return ((word >> (at & 31).astype(jnp.uint32)) & 1) != 0


def _fired_at(fired, at):
    """``fired[at]`` (bool, ``at`` inside ``fired``): from bits on CUDA GPUs, a plain gather elsewhere."""
    return jax.lax.platform_dependent(fired, at, cuda=_fired_in_bits, default=_take)


def _gather(tree, at):
    return jax.tree_util.tree_map(lambda v: v[at] if _units.is_quantity(v) else _take(v, at), tree,
                                  is_leaf=_units.is_quantity)


def _in_unit_of(name: str, new, unit):
    """The mantissa of ``new`` in ``unit`` (None: ``new`` must carry no unit)."""
    mantissa, new_unit = _units.split(new)
    if unit is None:
        if new_unit is not None and not new_unit.is_unitless:
            raise EventUnitError(f"{name}: the rule returned a leaf in {new_unit} for a state leaf without a "
                                 "unit; return the leaf without one")
        return mantissa
    if new_unit is None:
        raise EventUnitError(f"{name}: the rule returned a leaf without a unit for a state leaf in {unit}; "
                             "keep the unit (return a brainunit quantity)")
    try:
        return new.to(unit).mantissa
    except Exception as e:  # noqa: BLE001  (brainunit's unit mismatch)
        raise EventUnitError(f"{name}: the rule returned a leaf in {new_unit}, which does not convert to "
                             f"its state leaf's {unit}") from e


def _apply(name: str, rule: Rule, edge_state, active, pre_e, post_e, params):
    new_state = jax.vmap(rule, in_axes=(0, 0, 0, None))(edge_state, pre_e, post_e, params)
    want = jax.tree_util.tree_structure(edge_state, is_leaf=_units.is_quantity)
    got = jax.tree_util.tree_structure(new_state, is_leaf=_units.is_quantity)
    if got != want:
        raise EventRuleError(f"{name}: the rule must return a state of the same structure as edge_state; it "
                             f"returned {got}, expected {want}")

    def select(new, old):
        old_m, unit = _units.split(old)
        old_m = jnp.asarray(old_m)
        mask = active.reshape(active.shape + (1,) * (old_m.ndim - 1))
        out = jnp.where(mask, _in_unit_of(name, new, unit), old_m).astype(old_m.dtype)
        return _units.attach(out, unit)  # (no unit: out as it is)

    return jax.tree_util.tree_map(select, new_state, edge_state, is_leaf=_units.is_quantity)


def _check_rule(name: str, rule) -> None:
    """A rule is called as ``rule(edge, pre, post, params)``: refused here when it cannot be, rather than
    by Python's error inside jax.vmap, which names neither the call nor the rule."""
    if not callable(rule):
        raise EventRuleError(f"{name}: rule must be a function rule(edge, pre, post, params); got "
                             f"{type(rule).__name__}")
    try:
        inspect.signature(rule).bind(None, None, None, None)
    except TypeError as e:
        raise EventRuleError(f"{name}: rule is called as rule(edge, pre, post, params), four arguments; its "
                             f"signature does not take them ({e})") from None
    except ValueError:  # a callable without a readable signature (some builtins): let the call decide
        pass


def _structure(name, edge_state, indices, indptr, row_vals, col_vals, shape, labels):
    n_rows, n_cols = _shape2(name, shape)
    indices = as_array(name, "indices", indices, quantity=False)
    indptr = as_array(name, "indptr", indptr, quantity=False)
    if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise EventDTypeError(f"{name}: indices must be a 1-D integer array (one column a synapse); got "
                              f"{indices.dtype} of shape {indices.shape}")
    if indptr.shape != (n_rows + 1,) or not jnp.issubdtype(indptr.dtype, jnp.integer):
        raise EventShapeError(f"{name}: indptr has shape {indptr.shape} ({indptr.dtype}); expected integers of "
                              f"shape ({n_rows + 1},) for a structure of {n_rows} rows")
    nse = indices.shape[0]
    if not jax.tree_util.tree_leaves(edge_state, is_leaf=_units.is_quantity):
        raise EventShapeError(f"{name}: edge_state holds no array; give the per-synapse state the rule updates "
                              f"(an array or a pytree of arrays with leading dimension {nse})")
    _check_leading(name, "edge_state", edge_state, nse, "nse, one entry a synapse")
    for vals, label, size in ((row_vals, labels[0], n_rows), (col_vals, labels[1], n_cols)):
        side = "presynaptic" if label.startswith("pre") else "postsynaptic"
        _check_leading(name, label, vals, size, f"one entry a {side} neuron")
    cols_ok = (indices >= 0) & (indices < n_cols)
    return n_rows, n_cols, indices, indptr, jnp.clip(indices, 0, max(n_cols - 1, 0)), cols_ok


def apply_on(name: str, on_rows: bool, rule: Rule, edge_state, indices, indptr, spike, row_vals, col_vals, params,
             shape, labels=("pre_vals", "post_vals", "pre_spike", "post_spike"), backend=None):
    """The rule on the synapses of active rows (``on_rows``) or columns of a CSR structure of ``shape``;
    ``rule(edge, row_val, col_val, params)``. ``labels`` name the row values, the column values and the
    row and column spikes in error messages (a CSC's methods call this with its stored structure);
    ``backend`` is the rows kernel's (``"jnp"``: the count and scan)."""
    _check_rule(name, rule)
    n_rows, n_cols, indices, indptr, cols, cols_ok = _structure(name, edge_state, indices, indptr, row_vals,
                                                                col_vals, shape, labels)
    nse = indices.shape[0]
    rows = None
    if on_rows:
        fired = _active(name, labels[2], spike, n_rows)
        rows, inside = slot_rows(indices, indptr, n_rows, -1, backend=backend)
        at = rows
    else:
        fired = _active(name, labels[3], spike, n_cols)
        slot = jnp.arange(nse, dtype=indptr.dtype if nse < 2**31 - 1 else jnp.int64)
        # a slot inside a row lies in [indptr[0], indptr[-1]) (for a rising indptr: the policy's case)
        inside = (slot >= jnp.clip(indptr[0], 0, nse)) & (slot < jnp.clip(indptr[-1], 0, nse))
        at = cols
    # A synapse never updated reads a False placed after the neurons: one gather decides, and the
    # structure's part (which XLA hoists out of a loop) is one index array, not index and masks.
    at = jnp.where(inside & cols_ok, at, fired.shape[0])
    active = _fired_at(jnp.concatenate([fired, jnp.zeros((1,), bool)]), at)
    row_e = None
    if row_vals is not None:  # the rows are found only where a rule needs them
        if rows is None:
            rows, _ = slot_rows(indices, indptr, n_rows, -1, backend=backend)
        row_e = _gather(row_vals, rows)
    return _apply(name, rule, edge_state, active, row_e, _gather(col_vals, cols), params)


def csr_apply_on_pre(rule: Rule, edge_state, indices, indptr, pre_spike, *, pre_vals=None, post_vals=None,
                     params=None, shape):
    """Apply ``rule`` to the synapses of active presynaptic neurons (rows) of a CSR structure.

    For each stored synapse ``e = (i, j)`` with ``pre_spike[i]`` non-zero, the new state is
    ``rule(edge_state[e], pre_vals[i], post_vals[j], params)``; every other synapse keeps its state.
    ``edge_state``, ``pre_vals`` and ``post_vals`` are pytrees whose leaves have leading dimension
    ``nse``, ``n_pre`` and ``n_post`` (``None`` passes ``None`` to the rule). Returns the new state,
    leaves in their dtypes and units. See the module docstring for the policy on malformed structure.

    Example::

        new_w = xlakern.csr_apply_on_pre(lambda w, pre, post, lr: w + lr * post, w, indices, indptr, spikes,
                                         post_vals=post_trace, params=0.01, shape=(n_pre, n_post))
    """
    return apply_on("csr_apply_on_pre", True, rule, edge_state, indices, indptr, pre_spike, pre_vals, post_vals,
                    params, shape)


def csr_apply_on_post(rule: Rule, edge_state, indices, indptr, post_spike, *, pre_vals=None, post_vals=None,
                      params=None, shape):
    """Apply ``rule`` to the synapses of active postsynaptic neurons (columns) of a CSR structure.

    As :func:`csr_apply_on_pre`, for the synapses ``e = (i, j)`` with ``post_spike[j]`` non-zero. The
    state stays in CSR order: a synapse's column is ``indices[e]``, so no CSC permutation is needed.

    Example::

        new_w = xlakern.csr_apply_on_post(lambda w, pre, post, lr: w - lr * pre, w, indices, indptr, spikes,
                                          pre_vals=pre_trace, params=0.01, shape=(n_pre, n_post))
    """
    return apply_on("csr_apply_on_post", False, rule, edge_state, indices, indptr, post_spike, pre_vals, post_vals,
                    params, shape)
