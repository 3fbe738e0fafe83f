"""Stored connectivity: CSR, CSC, FixedNumPerPre, FixedNumPerPost.

Each is a pytree whose leaves are its arrays (``data``, ``indices`` and, for CSR/CSC, ``indptr``)
and whose static aux data is its logical ``shape``. Nothing else is stored on the object, so a
layout can be built inside ``jit`` from traced arrays, and one object serves both orientations
and any number of traces. ``data`` is one weight per synapse or one shared weight.

Orientation: a layout stores rows of some matrix ``S``: ``S = W`` for CSR / FixedNumPerPre and
``S = W.T`` for CSC / FixedNumPerPost. ``W @ x`` and ``x @ W`` map onto a gather or a scatter of
``S`` accordingly (``_flipped`` says which).

Example::

    W = xlakern.CSR((data, indices, indptr), shape=(n_pre, n_post))
    current = xlakern.BinaryArray(spikes) @ W        # scatter: only the rows that spiked
    grad_like = W @ xlakern.BinaryArray(post_spikes)  # gather
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_node_class

from . import _ops
from . import _units
from ._errors import EventShapeError, EventUnitError
from ._events import EventRepresentation
from ._kernels import synapse_rows

__all__ = ["DataRepresentation", "CSR", "CSC", "FixedNumConn", "FixedNumPerPre", "FixedNumPerPost"]


def _is_scalar(x: Any) -> bool:
    m, _ = _units.split(x)
    return isinstance(m, (int, float, np.number)) or (hasattr(m, "shape") and np.ndim(m) == 0)


class DataRepresentation:
    """Base of the stored-connectivity layouts (BrainEvent's name)."""

    __array_ufunc__ = None  # numpy defers `ndarray @ layout` to __rmatmul__
    __array_priority__ = 200
    _flipped = False
    _fixed = False

    # -------------------------------------------------------------- common properties
    @property
    def nse(self) -> int:
        """Number of stored synapses."""
        return int(np.prod(self.indices.shape))

    @property
    def dtype(self):
        return _units.split(self.data)[0].dtype

    def _stored_shape(self):
        return tuple(self.shape[::-1]) if self._flipped else tuple(self.shape)

    def _arrays(self):
        return (self.data, self.indices) if self._fixed else (self.data, self.indices, self.indptr)

    def tree_flatten(self):
        return self._arrays(), (tuple(self.shape), self.backend)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj._set(children, *aux)
        return obj

    def _set(self, arrays, shape, backend=None):
        self.shape = tuple(int(s) for s in shape)
        self.backend = backend
        if self._fixed:
            self.data, self.indices = arrays
        else:
            self.data, self.indices, self.indptr = arrays

    def with_data(self, data):
        """The same structure with other weights (one per synapse, or one shared weight) in the
        same unit as the current ones.

        Example::

            W2 = W.with_data(W.data * 2)
        """
        old, new = _units.split(self.data)[1], _units.split(data)[1]
        if old != new:
            raise EventUnitError(f"{type(self).__name__}.with_data: the new data's unit ({new or 'none'}) differs "
                                 f"from the current one ({old or 'none'}); convert it first (or build a new "
                                 f"{type(self).__name__})")
        return self._replace_data(data)

    def _replace_data(self, data):
        return type(self)((data,) + self._arrays()[1:], shape=self.shape, backend=self.backend)

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, nse={self.nse}, dtype={self.dtype})"

    # -------------------------------------------------------------- scalar arithmetic
    def _scale(self, other, op, name):
        if not _is_scalar(other):
            raise TypeError(f"{type(self).__name__} {name} supports scalars only (it scales the weights); "
                            f"got {type(other).__name__}. Use todense() for element-wise products")
        return self._replace_data(op(self.data, other))

    def __mul__(self, other):
        return self._scale(other, lambda d, o: d * o, "*")

    def __rmul__(self, other):
        return self._scale(other, lambda d, o: o * d, "*")

    def __truediv__(self, other):
        return self._scale(other, lambda d, o: d / o, "/")

    def __neg__(self):
        return self._replace_data(-self.data)

    def __pos__(self):
        return self

    # -------------------------------------------------------------- products
    def _product(self, x, w_on_left: bool):
        """``W @ x`` (w_on_left) or ``x @ W``."""
        binary, weighted = True, False
        if isinstance(x, EventRepresentation):
            value = x.value
            weighted = x._weighted
        else:
            binary, value = False, x
        mantissa = _units.split(value)[0]
        ndim = np.ndim(mantissa)
        if ndim not in (1, 2):
            raise EventShapeError(f"{type(self).__name__} @: the other operand must be 1-D or 2-D; got shape "
                                  f"{np.shape(mantissa)}")
        transpose = self._flipped if w_on_left else not self._flipped
        if not w_on_left and ndim == 2:  # (k, m) @ W = (W.T @ x.T).T
            value = value.T
        return self._call(value, binary and not weighted, weighted, ndim == 2, transpose)

    def _call(self, v, binary, weighted, mm, transpose):
        kw = dict(shape=self._stored_shape(), transpose=transpose, backend=self.backend)
        if self._fixed:
            if binary or weighted:
                fn = _ops.binary_fcnmm if mm else _ops.binary_fcnmv
                kw["weighted"] = weighted
            else:
                fn = _ops.fcnmm if mm else _ops.fcnmv
            out = fn(self.data, self.indices, v, **kw)
        else:
            if binary or weighted:
                fn = _ops.binary_csrmm if mm else _ops.binary_csrmv
                kw["weighted"] = weighted
            else:
                fn = _ops.csrmm if mm else _ops.csrmv
            out = fn(self.data, self.indices, self.indptr, v, **kw)
        return out

    def __matmul__(self, other):
        return self._product(other, True)

    def __rmatmul__(self, other):
        out = self._product(other, False)
        mantissa = _units.split(other.value if isinstance(other, EventRepresentation) else other)[0]
        return out.T if np.ndim(mantissa) == 2 else out

    # -------------------------------------------------------------- dense views
    def _stored_dense(self):
        data, unit = _units.split(self.data)
        rows, cols = self._stored_shape()
        idx = self.indices.reshape(-1)
        nse = idx.shape[0]
        if self._fixed:
            r = jnp.arange(nse) // max(self.indices.shape[1], 1)
        else:
            r, inside = synapse_rows(idx, self.indptr, rows, -1)
            idx = jnp.where(inside, idx, cols)  # synapses outside every row: dropped like out-of-range ones
        w = jnp.broadcast_to(jnp.asarray(data).reshape(-1), (nse,))
        dense = jnp.zeros((rows, cols), w.dtype).at[r, idx].add(w, mode="drop")
        return dense, unit

    def todense(self):
        """The dense ``shape`` matrix (duplicate indices add; out-of-range ones are dropped).

        Example::

            np.testing.assert_allclose(W.todense() @ x, W @ x)
        """
        dense, unit = self._stored_dense()
        return _units.attach(dense.T if self._flipped else dense, unit)


def _validate_csr(cls_name, data, indices, indptr, stored):
    rows, _ = stored
    if np.ndim(indices) != 1:
        raise EventShapeError(f"{cls_name}: indices has shape {np.shape(indices)}; expected (nse,)")
    if np.shape(indptr) != (rows + 1,):
        raise EventShapeError(f"{cls_name}: indptr has shape {np.shape(indptr)}; expected ({rows + 1},) "
                              f"(one more than the number of stored rows)")
    nse = np.shape(indices)[0]
    m = _units.split(data)[0]
    if np.size(m) != 1 and np.shape(m) != (nse,):
        raise EventShapeError(f"{cls_name}: data has shape {np.shape(m)}; expected (1,) or () for one shared "
                              f"weight, or ({nse},), one per index")


def _as_array(x):
    return x if _units.is_quantity(x) else jnp.asarray(x)


def _unpack(args, n):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    if len(args) != n:
        raise TypeError(f"expected {n} arrays (as one tuple or separately); got {len(args)}")
    return args


def _shape_arg(cls_name, shape):
    try:
        r, c = (int(s) for s in shape)
    except Exception:
        raise EventShapeError(f"{cls_name}: shape must be a (rows, cols) pair of ints; got {shape!r}") from None
    return r, c


@register_pytree_node_class
class CSR(DataRepresentation):
    """Compressed sparse rows: ``CSR((data, indices, indptr), shape=(m, n))``.

    Row ``i``'s synapses are ``indices[indptr[i]:indptr[i+1]]`` (column ids) with weights ``data``
    (one per index, or one shared weight). ``s @ W`` (s of length m) scatters the rows of active
    spikes; ``W @ s`` (length n) gathers.

    Example::

        W = xlakern.CSR((jnp.ones(3), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])), shape=(2, 3))
        xlakern.BinaryArray(jnp.array([True, False])) @ W    # [1., 0., 1.]
    """

    __module__ = "xlakern"

    def __init__(self, *args, shape, backend=None, buffers=None):
        # buffers: BrainEvent's cache of derived index arrays; nothing here needs one (accepted, unused)
        data, indices, indptr = _unpack(args, 3)
        shape = _shape_arg(type(self).__name__, shape)
        arrays = (_as_array(data), jnp.asarray(indices), jnp.asarray(indptr))
        self._set(arrays, shape, backend)
        _validate_csr(type(self).__name__, *arrays, self._stored_shape())

    @property
    def T(self):
        """The transpose: a CSC view of the same arrays."""
        return CSC(self._arrays(), shape=self.shape[::-1], backend=self.backend)

    @classmethod
    def fromdense(cls, mat, *, index_dtype=jnp.int32):
        """From a concrete dense matrix; its non-zero entries become synapses.

        Example::

            W = xlakern.CSR.fromdense(np.array([[0., 1.], [2., 0.]]))
        """
        m, unit = _units.split(mat)
        m = np.asarray(m)
        if m.ndim != 2:
            raise EventShapeError(f"{cls.__name__}.fromdense: expected a 2-D matrix; got shape {m.shape}")
        stored = m.T if cls is CSC else m
        rows, cols = np.nonzero(stored)
        indptr = np.zeros(stored.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=stored.shape[0]), out=indptr[1:])
        data = _units.attach(jnp.asarray(stored[rows, cols]), unit)
        return cls((data, jnp.asarray(cols, index_dtype), jnp.asarray(indptr, index_dtype)), shape=m.shape)


@register_pytree_node_class
class CSC(CSR):
    """Compressed sparse columns: ``CSC((data, indices, indptr), shape=(m, n))``, column ``j``'s
    synapses are ``indices[indptr[j]:indptr[j+1]]`` (row ids). ``s @ W`` gathers, ``W @ s`` scatters.

    Example::

        W = xlakern.CSC.fromdense(np.array([[0., 1.], [2., 0.]]))
        W @ xlakern.BinaryArray(jnp.array([True, True]))   # [1., 2.]
    """

    __module__ = "xlakern"
    _flipped = True

    @property
    def T(self):
        """The transpose: a CSR view of the same arrays."""
        return CSR(self._arrays(), shape=self.shape[::-1], backend=self.backend)


class FixedNumConn(DataRepresentation):
    """Base of the fixed-count layouts: every stored row has exactly K synapses."""

    _fixed = True

    def __init__(self, *args, shape, backend=None, buffers=None, precompute_weight_indices=False):
        # buffers / precompute_weight_indices: BrainEvent's lazily built CSC view; the kernels here
        # need none (accepted, unused)
        data, indices = _unpack(args, 2)
        shape = _shape_arg(type(self).__name__, shape)
        arrays = (_as_array(data), jnp.asarray(indices))
        self._set(arrays, shape, backend)
        rows = self._stored_shape()[0]
        name = type(self).__name__
        if np.ndim(arrays[1]) != 2 or np.shape(arrays[1])[0] != rows:
            raise EventShapeError(f"{name}: indices has shape {np.shape(arrays[1])}; expected ({rows}, K), "
                                  f"K targets for each of the {rows} {self._row_word}")
        m = _units.split(arrays[0])[0]
        if np.size(m) != 1 and np.shape(m) != np.shape(arrays[1]):
            raise EventShapeError(f"{name}: data has shape {np.shape(m)}; expected (1,) or () for one shared "
                                  f"weight, or {np.shape(arrays[1])} like indices")

    @property
    def num_conn(self) -> int:
        return int(self.indices.shape[1])

    @classmethod
    def fromdense(cls, mat, *, num_conn=None, index_dtype=jnp.int32):
        """From a concrete dense matrix whose stored rows all have ``num_conn`` non-zeros (inferred
        when None; shorter rows are padded with zero-weight synapses to column 0).

        Example::

            W = xlakern.FixedNumPerPre.fromdense(np.eye(4))
        """
        m, unit = _units.split(mat)
        m = np.asarray(m)
        if m.ndim != 2:
            raise EventShapeError(f"{cls.__name__}.fromdense: expected a 2-D matrix; got shape {m.shape}")
        stored = m.T if cls._flipped else m
        counts = (stored != 0).sum(axis=1)
        k = int(counts.max(initial=0)) if num_conn is None else int(num_conn)
        if num_conn is None and counts.size and counts.min() != k:
            raise EventShapeError(f"{cls.__name__}.fromdense: rows have {counts.min()} to {k} non-zeros; pass "
                                  f"num_conn= to pad short rows")
        if counts.size and counts.max() > k:
            raise EventShapeError(f"{cls.__name__}.fromdense: a row has {counts.max()} non-zeros > num_conn={k}")
        idx = np.zeros((stored.shape[0], k), np.int64)
        data = np.zeros((stored.shape[0], k), stored.dtype)
        for r in range(stored.shape[0]):
            nz = np.nonzero(stored[r])[0]
            idx[r, :nz.size] = nz
            data[r, :nz.size] = stored[r, nz]
        return cls((_units.attach(jnp.asarray(data), unit), jnp.asarray(idx, index_dtype)), shape=m.shape)


@register_pytree_node_class
class FixedNumPerPre(FixedNumConn):
    """Each presynaptic neuron (row) has exactly K targets: ``indices`` (num_pre, K) of post ids,
    ``W[i, indices[i, k]] = data[i, k]``; ``shape=(num_pre, num_post)``.

    Example::

        W = xlakern.FixedNumPerPre((jnp.ones((4, 2)), idx), shape=(4, 10))
        xlakern.BinaryArray(spikes_4) @ W   # length 10
    """

    __module__ = "xlakern"
    _row_word = "presynaptic neurons"

    @property
    def T(self):
        return FixedNumPerPost(self._arrays(), shape=self.shape[::-1], backend=self.backend)


@register_pytree_node_class
class FixedNumPerPost(FixedNumConn):
    """Each postsynaptic neuron (column) has exactly K sources: ``indices`` (num_post, K) of pre
    ids, ``W[indices[j, k], j] = data[j, k]``; ``shape=(num_pre, num_post)``.

    Example::

        W = xlakern.FixedNumPerPost((jnp.ones((10, 2)), idx), shape=(4, 10))
        xlakern.BinaryArray(spikes_4) @ W   # length 10 (a gather per postsynaptic neuron)
    """

    __module__ = "xlakern"
    _flipped = True
    _row_word = "postsynaptic neurons"

    @property
    def T(self):
        return FixedNumPerPre(self._arrays(), shape=self.shape[::-1], backend=self.backend)

