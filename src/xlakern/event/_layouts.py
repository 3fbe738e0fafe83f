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

import contextlib
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_with_keys_class

from . import _ops
from . import _units
from ._arguments import as_array
from ._errors import (EventBufferError, EventDependencyError, EventDTypeError, EventIndexError, EventNDimError,
                      EventOperandError, EventShapeError, EventTracedError, EventUnitError, UnsupportedOperationError)
from ._events import EventRepresentation, _keyed, _raw
from ._kernels import slot_rows

__all__ = ["DataRepresentation", "CSR", "CSC", "FixedNumConn", "FixedNumPerPre", "FixedNumPerPost"]


def _is_scalar(x: Any) -> bool:
    m, _ = _units.split(x)
    return isinstance(m, (int, float, np.number)) or (hasattr(m, "shape") and np.ndim(m) == 0)


def _numeric_operand(name: str, other: Any, shape: tuple) -> Any:
    """``other``'s mantissa where it is a number or a numeric array (a list of numbers too); anything else
    (a string, None, a dict) is an EventOperandError naming the operation, not jax's error about arrays."""
    m = _units.split(other)[0]
    if isinstance(m, (jax.Array, bool, int, float, complex)):
        return m
    if isinstance(m, (np.ndarray, np.generic, list, tuple)):
        try:
            if np.asarray(m).dtype.kind in "biufc":
                return m
        except (TypeError, ValueError):
            pass
    raise EventOperandError(f"{name}: other is a {type(other).__name__}; expected a number, a numeric array "
                            f"(broadcastable to the matrix shape {shape}) or a layout")


def _warn_renamed(obj, old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{type(obj).__name__}.{old} is deprecated; use .{new} instead.", DeprecationWarning, stacklevel=3)


def _row_selector(what: str, index, nrows: int):
    """``W[index]``'s rows: a 0-d array for an int (one row), else 1-d; negative ones wrap. Concrete rows
    outside [0, nrows) raise; traced ones are left to the slice kernel, which gives rows of zeros.
    ``what`` names the caller in messages (``"CSR[...]"``)."""
    if isinstance(index, slice):
        return jnp.arange(*index.indices(nrows), dtype=jnp.int32)
    if index is None or isinstance(index, (str, bytes, dict, set, float)):  # not rows, not even as an array
        raise EventIndexError(f"{what}: rows are selected by an int, a 1-D sequence or array of ints, or a "
                              f"slice; got {index!r:.40}")
    try:
        rows = jnp.asarray(index)
    except (TypeError, ValueError, OverflowError) as e:  # a ragged list, an int wider than jax's
        raise EventIndexError(f"{what}: the rows {index!r:.40} cannot be read as an array of ints: {e}") from None
    if rows.size == 0 and rows.ndim == 1:  # [] is float to jnp: no rows
        rows = rows.astype(jnp.int32)
    if not jnp.issubdtype(rows.dtype, jnp.integer) or rows.ndim > 1:
        raise EventIndexError(f"{what}: rows are selected by an int, a 1-D sequence or array of ints, or a "
                              f"slice; got dtype {rows.dtype}, shape {tuple(rows.shape)}")
    rows = jnp.where(rows < 0, rows + nrows, rows)
    if not isinstance(rows, jax.core.Tracer):
        concrete = np.asarray(rows)
        if concrete.size and (concrete.min() < 0 or concrete.max() >= nrows):
            raise EventIndexError(f"{what}: row index out of range for {nrows} rows "
                                  f"(got {np.asarray(index).tolist()})")
    return rows


def _concrete_rows(who: str, index, nrows: int) -> np.ndarray:
    """slice_rows' rows, read as :func:`_row_selector` reads them, as a 1-d NumPy array: they must be
    known now, since the result's synapse count depends on them."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(index)):
        raise EventTracedError(f"{who}.slice_rows: the row index must be concrete (the result's synapse count "
                               f"depends on it); call it outside jax.jit")
    return np.atleast_1d(np.asarray(_row_selector(f"{who}.slice_rows", index, nrows))).astype(np.int64)


class DataRepresentation:
    """Base of the stored-connectivity layouts (BrainEvent's name).

    A subclass written against BrainEvent's base calls ``super().__init__(arrays, shape=shape,
    buffers=buffers)``: that records ``shape`` and registers ``buffers``. Buffers are plain attributes
    whose names are listed in ``_buffer_registry``, as in BrainEvent, so assigning ``W.name = value``
    updates ``W.buffers`` too.

    Example::

        class Ring(xlakern.DataRepresentation):
            def __init__(self, data, *, shape, buffers=None):
                self.data = data
                super().__init__((data,), shape=shape, buffers=buffers)
    """

    def __init__(self, *args, shape, buffers=None):
        self.shape = _shape_arg(type(self).__name__, shape)
        self._init_buffers(buffers)

    __array_ufunc__ = None  # numpy defers `ndarray @ layout` to __rmatmul__
    __array_priority__ = 200
    _flipped = False
    _fixed = False

    # -------------------------------------------------------------- BrainEvent's contract for subclasses
    @property
    def T(self):
        """The transpose, ``self.transpose()``: a subclass defines one of the two (the layouts here
        define ``T``).

        Example::

            Wt = W.T
        """
        if type(self).transpose is DataRepresentation.transpose:
            raise UnsupportedOperationError(f"{type(self).__name__} defines neither T nor transpose(); define "
                                            f"transpose() to give its transpose")
        return self.transpose()

    @classmethod
    def fromdense(cls, mat, **kwargs):
        """A representation of the dense ``mat``; each layout defines its own (its arguments differ).

        Example::

            W = xlakern.CSR.fromdense(np.eye(3, dtype=np.float32))
        """
        raise UnsupportedOperationError(f"{cls.__name__} defines no fromdense; build it from its own arrays")

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

    def _array_names(self):
        return ("data", "indices") if self._fixed else ("data", "indices", "indptr")

    def tree_flatten(self):
        # the buffers ride as one dict child: leaves (traced under jit), and no extra leaf when empty
        return self._arrays() + (self.buffers,), (tuple(self.shape), self.backend)

    def tree_flatten_with_keys(self):
        # children keyed by the attributes that hold them, so a key path reads `.data` or
        # `.buffers['trace']` (in checkpoints, tree_map_with_path, jax's messages), not a flat index
        children, aux = self.tree_flatten()
        return _keyed(self, DataRepresentation, self._array_names() + ("buffers",), children), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj._set(tuple(children[:-1]), *aux)
        obj._restore_buffers(children[-1])
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
        # same structure: the buffers (derived from it, or the user's) stay valid
        return type(self)((data,) + self._arrays()[1:], shape=self.shape, backend=self.backend,
                          buffers=self.buffers)

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, nse={self.nse}, dtype={self.dtype})"

    # -------------------------------------------------------------- scalar arithmetic
    def _scale(self, other, op, name):
        if not _is_scalar(other):
            raise EventOperandError(f"{type(self).__name__} {name} supports scalars only (it scales the weights); "
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

    def __abs__(self):
        return self._replace_data(abs(self.data))

    # BrainEvent 0.3's other operators, through apply2: + and - with a CSR/CSC give the dense result (the
    # zeros change); on fixed-count layouts they act on the stored entries, as BrainEvent's do. % keeps
    # zeros zero, so it acts on the stored entries of every layout.
    def _combine(self, other, fn, symbol, reverse=False):
        # + - % need one unit on both sides (brainunit would raise its own error deep inside)
        mine = _units.split(self.data)[1]
        theirs = _units.split(other.data if isinstance(other, DataRepresentation) else other)[1]
        if mine != theirs:
            raise EventUnitError(f"{type(self).__name__} {symbol}: the other operand's unit ({theirs or 'none'}) "
                                 f"differs from the weights' ({mine or 'none'}); convert one of them first")
        return self.apply2(other, fn, reverse=reverse)

    def __add__(self, other):
        return self._combine(other, operator.add, "+")

    def __radd__(self, other):
        return self._combine(other, operator.add, "+", reverse=True)

    def __sub__(self, other):
        return self._combine(other, operator.sub, "-")

    def __rsub__(self, other):
        return self._combine(other, operator.sub, "-", reverse=True)

    def __mod__(self, other):
        return self._combine(other, operator.mod, "%")

    def __len__(self):
        return self.shape[0]

    def __iter__(self):
        # the rows; regrouped once, not per row, and stopping at the last (a jax index past it would clamp)
        csr = self.tocsr()
        return (csr[i] for i in range(self.shape[0]))

    def __getitem__(self, index):
        """Rows of the matrix as a dense array, as BrainEvent 0.3's layouts give them: ``W[i]`` is row
        ``i`` (shape ``(n_cols,)``); a slice, a list or tuple, or an integer array gives those rows
        (``(len(rows), n_cols)``). Negative rows count from the end; a concrete row outside the
        matrix raises :class:`EventIndexError` (an ``IndexError``); traced rows outside it give zeros.
        Works under ``jit``; the result is differentiable in the weights.

        Example::

            first, last = W[0], W[-1]
            block = W[10:20]          # (10, n_cols)
        """
        rows = _row_selector(f"{type(self).__name__}[...]", index, self.shape[0])
        from ._csr_tools import csr_slice_rows

        csr = self.tocsr()
        return csr_slice_rows(csr.data, csr.indices, csr.indptr, rows, shape=self.shape, backend=self.backend)

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
            raise EventNDimError(f"{type(self).__name__} @: the other operand must be 1-D or 2-D; got shape "
                                 f"{np.shape(mantissa)}")
        transpose = self._flipped if w_on_left else not self._flipped
        if not w_on_left and ndim == 2:  # (k, m) @ W = (W.T @ x.T).T
            value = value.T
        return self._call(value, binary and not weighted, weighted, ndim == 2, transpose)

    def _call(self, v, binary, weighted, mm, transpose):
        kw = dict(shape=self._stored_shape(), transpose=transpose, backend=self.backend)
        data = self.data
        if not (binary or weighted):
            # a plain dense operand keeps jnp's promotion (float32 weights times a float64 array give
            # float64), as in BrainEvent; the operators themselves return the weights' dtype
            (w, unit_w), x = _units.split(data), _units.split(v)[0]
            dtype = jnp.result_type(w, x)
            if jnp.issubdtype(dtype, jnp.floating) and dtype != jnp.result_type(w):
                data = _units.attach(jnp.asarray(w).astype(dtype), unit_w)
        if self._fixed:
            if binary or weighted:
                fn = _ops.binary_fcnmm if mm else _ops.binary_fcnmv
                kw["weighted"] = weighted
            else:
                fn = _ops.fcnmm if mm else _ops.fcnmv
            out = fn(data, self.indices, v, **kw)
        else:
            if binary or weighted:
                fn = _ops.binary_csrmm if mm else _ops.binary_csrmv
                kw["weighted"] = weighted
            else:
                fn = _ops.csrmm if mm else _ops.csrmv
            out = fn(data, self.indices, self.indptr, v, **kw)
        return out

    def __matmul__(self, other):
        return self._product(other, True)

    def __rmatmul__(self, other):
        out = self._product(other, False)
        mantissa = _units.split(other.value if isinstance(other, EventRepresentation) else other)[0]
        return out.T if np.ndim(mantissa) == 2 else out

    # -------------------------------------------------------------- dense views
    def _stored_structure(self):
        """(indices, indptr) of the stored matrix as compressed rows (a fixed-count layout's rows
        are K apart). Computed now, not staged into a trace, when the layout's arrays are concrete, so
        that a structure a jitted function closes over stays concrete (see
        ``_plasticity.csc_to_csr_view``)."""
        from ._plasticity import traced_structure

        traced = traced_structure(self.indices, None if self._fixed else self.indptr)
        with contextlib.nullcontext() if traced else jax.ensure_compile_time_eval():
            idx = self.indices.reshape(-1)
            if not self._fixed:
                return idx, self.indptr
            rows, k = self.indices.shape
            return idx, jnp.arange(rows + 1, dtype=idx.dtype) * k

    def _stored_entries(self):
        """(row, col, inside) of every stored synapse in storage order, in the stored matrix;
        ``inside`` is False for a synapse outside every row or with an out-of-range index."""
        idx, indptr = self._stored_structure()
        rows, cols = self._stored_shape()
        r, inside = slot_rows(idx, indptr, rows, self.indices.shape[1] if self._fixed else -1)
        return r, idx, inside & (idx >= 0) & (idx < cols)

    def _entries(self):
        """(row, col, inside) of every stored synapse in storage order, in ``W``'s orientation."""
        r, c, inside = self._stored_entries()
        return (c, r, inside) if self._flipped else (r, c, inside)

    def _shared(self) -> bool:
        return np.size(_units.split(self.data)[0]) == 1 and self.nse != 1

    def _flat_data(self):
        """One weight per synapse in storage order (a shared weight broadcast), keeping its unit."""
        data, unit = _units.split(self.data)
        return _units.attach(jnp.broadcast_to(jnp.asarray(data).reshape(-1), (self.nse,)), unit)

    def _stored_dense(self):
        data, unit = _units.split(self._flat_data())
        r, c, inside = self._stored_entries()
        rows, cols = self._stored_shape()
        # synapses outside every row or out of range are dropped
        dense = jnp.zeros((rows, cols), data.dtype).at[r, jnp.where(inside, c, cols)].add(data, mode="drop")
        return dense, unit

    def todense(self):
        """The dense ``shape`` matrix (duplicate indices add; out-of-range ones are dropped).

        Example::

            np.testing.assert_allclose(W.todense() @ x, W @ x)
        """
        dense, unit = self._stored_dense()
        return _units.attach(dense.T if self._flipped else dense, unit)

    # -------------------------------------------------------------- buffers
    def _init_buffers(self, buffers):
        self._buffer_registry = set()
        if buffers is None:
            return
        if not isinstance(buffers, dict):
            raise EventBufferError(f"{type(self).__name__}: buffers must be a dict of name -> value; got "
                                   f"{type(buffers).__name__}")
        for name, value in buffers.items():
            self.register_buffer(name, value)

    def _restore_buffers(self, buffers):
        # a pytree rebuild: the names were checked when they were registered
        self._buffer_registry = set(buffers)
        for name, value in buffers.items():
            setattr(self, name, value)

    @property
    def buffers(self) -> dict:
        """The auxiliary values carried with the layout (a new name -> value dict each call). They
        are pytree leaves, so they go through ``jit`` with the layout.

        Example::

            W = xlakern.CSR((data, indices, indptr), shape=(3, 4), buffers={"delays": d})
            W.buffers["delays"]
        """
        names = self.__dict__.get("_buffer_registry", ())
        return {name: getattr(self, name, None) for name in sorted(names)}

    def register_buffer(self, name: str, value=None):
        """Attach ``value`` under ``name`` (then readable as ``W.name`` and in ``W.buffers``).

        Example::

            W.register_buffer("delays", jnp.zeros(W.nse))
            W.delays
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise EventBufferError(f"{type(self).__name__}.register_buffer: name must be an identifier; got {name!r}")
        registry = self.__dict__.get("_buffer_registry", set())
        if name not in registry and (hasattr(type(self), name) or name in self.__dict__):
            raise EventBufferError(f"{type(self).__name__}.register_buffer: name {name!r} would shadow the layout's "
                                   f"own attribute; pick another name")
        self._buffer_registry = registry | {name}  # a new set: a copy.copy of the layout keeps its own names
        setattr(self, name, value)

    def set_buffer(self, name: str, value):
        """Replace the value of a buffer registered earlier.

        Example::

            W.set_buffer("delays", W.delays + 1)
        """
        if name not in self.__dict__.get("_buffer_registry", ()):
            raise EventBufferError(f"{type(self).__name__}.set_buffer: buffer {name!r} is not registered "
                                   f"(registered: {sorted(self.buffers)}); call register_buffer first")
        setattr(self, name, value)

    # -------------------------------------------------------------- array-like metadata
    @property
    def ndim(self) -> int:
        """2: a layout is a matrix.

        Example::

            assert W.ndim == 2
        """
        return 2

    @property
    def size(self) -> int:
        """Entries of the dense matrix, ``rows * cols`` (``nse`` counts the stored ones).

        Example::

            assert W.size == W.shape[0] * W.shape[1]
        """
        return int(self.shape[0]) * int(self.shape[1])

    def _per_synapse(self, y, w, at_column: bool):
        """``w[j] * y[row or column of synapse j]`` in the stored order (the dt2t functions)."""
        from ._dt2t import csrmv_dt2t, fcnmv_dt2t

        transpose = at_column != self._flipped  # the stored structure's rows are W's columns when flipped
        if self._fixed:
            return fcnmv_dt2t(w, self.indices, y, shape=self._stored_shape(), transpose=transpose)
        return csrmv_dt2t(y, w, self.indices, self.indptr, shape=self._stored_shape(), transpose=transpose,
                          backend=self.backend)

    def dt2t(self, y_dim_arr, w_dim_arr):
        """Per synapse, ``w[j] * y[i]`` for synapse j from presynaptic neuron i (``y`` has ``shape[0]``
        entries; ``w`` and the result are per synapse, in the layout's stored order): the
        ``D^t eps^{t-1}`` term of eligibility traces (:func:`xlakern.csrmv_dt2t` and relatives).

        Example::

            eps = W.dt2t(pre_factor, eps)          # pre_factor: (shape[0],), eps: like W.data
        """
        return self._per_synapse(y_dim_arr, w_dim_arr, at_column=False)

    def dt2t_transposed(self, y_dim_arr, w_dim_arr):
        """Per synapse, ``w[j] * y[k]`` for synapse j onto postsynaptic neuron k (``y`` has ``shape[1]``
        entries); see :meth:`dt2t`.

        Example::

            eps = W.dt2t_transposed(post_factor, eps)   # post_factor: (shape[1],)
        """
        return self._per_synapse(y_dim_arr, w_dim_arr, at_column=True)

    def yw_to_w(self, y_dim_arr, w_dim_arr):
        """BrainEvent's deprecated name of :meth:`dt2t`.

        Example::

            eps = W.yw_to_w(pre_factor, eps)   # DeprecationWarning; same as W.dt2t
        """
        _warn_renamed(self, "yw_to_w", "dt2t")
        return self.dt2t(y_dim_arr, w_dim_arr)

    def yw_to_w_transposed(self, y_dim_arr, w_dim_arr):
        """BrainEvent's deprecated name of :meth:`dt2t_transposed`.

        Example::

            eps = W.yw_to_w_transposed(post_factor, eps)   # DeprecationWarning
        """
        _warn_renamed(self, "yw_to_w_transposed", "dt2t_transposed")
        return self.dt2t_transposed(y_dim_arr, w_dim_arr)

    def slice_rows(self, index):
        """Rows ``index`` of the matrix (an int, a sequence, an array or a slice) as a CSR of shape
        ``(len(rows), shape[1])``, keeping each row's synapses in their order. CSC and FixedNumPerPost
        regroup by rows first (``tocsr``). FixedNumPerPre keeps its fixed count, so its rows may be
        traced (under ``jit``, as BrainEvent 0.3 allows); the others need concrete rows, since the
        result's synapse count depends on them.

        Example::

            sub = W.slice_rows([0, 5, 7])          # rows 0, 5, 7: a (3, n) CSR
        """
        if self._fixed and not self._flipped:
            rows = jnp.atleast_1d(_row_selector(f"{type(self).__name__}.slice_rows", index, self.shape[0]))
            data = self.data if self._shared() else self.data[rows]
            return type(self)((data, self.indices[rows]), shape=(rows.shape[0], self.shape[1]), backend=self.backend)
        rows = _concrete_rows(type(self).__name__, index, self.shape[0])
        if self._flipped:
            return self.tocsr().slice_rows(rows)
        data = self.data if self._shared() else self.data[rows]
        ptr = np.asarray(jax.device_get(_units.split(self.indptr)[0])).astype(np.int64)
        starts, ends = ptr[rows], ptr[rows + 1]
        picked = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends)] or [np.zeros(0, np.int64)])
        indptr = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.asarray(self.indptr).dtype)
        if not self._shared():
            data = self.data[picked]
        return CSR((data, self.indices[picked], jnp.asarray(indptr)), shape=(len(rows), self.shape[1]),
                   backend=self.backend)

    def block_until_ready(self):
        """Wait until every array of the layout is computed; returns the layout.

        Example::

            W = W.update_on_pre(pre_spikes, post_trace).block_until_ready()
        """
        jax.block_until_ready(jax.tree_util.tree_leaves(self))
        return self

    # -------------------------------------------------------------- reductions and maps
    def sum(self, axis=None):
        """Sum of the matrix's entries: a scalar for ``axis=None`` (a shared weight counts once per
        synapse), the row sums for ``axis=1`` and the column sums for ``axis=0``.

        Example::

            total = W.sum()
            out_strength = W.sum(axis=1)   # one value per row
        """
        data, unit = _units.split(self.data)
        if axis is None:
            total = jnp.sum(jnp.asarray(data)) * (self.nse if self._shared() else 1)
            return _units.attach(total, unit)
        try:
            ax = int(axis)
        except Exception:
            raise EventShapeError(f"{type(self).__name__}.sum: axis must be None, 0 or 1; got {axis!r}") from None
        if ax not in (0, 1, -1, -2):
            raise EventShapeError(f"{type(self).__name__}.sum: axis must be None, 0 or 1; got {axis!r}")
        ax %= 2
        w = _units.split(self._flat_data())[0]
        rows, cols, inside = self._entries()
        # axis=1 keeps the rows: each synapse adds into its row
        segment, n = (rows, self.shape[0]) if ax == 1 else (cols, self.shape[1])
        out = jnp.zeros((n,), w.dtype).at[jnp.where(inside, segment, n)].add(w, mode="drop")
        return _units.attach(out, unit)

    def transpose(self, axes=None):
        """The transpose (``W.T``): the same arrays read the other way round.

        Example::

            Wt = W.transpose()    # CSR -> CSC of shape (n, m)
        """
        if axes is not None and tuple(axes) != (1, 0):
            raise EventShapeError(f"{type(self).__name__}.transpose: axes must be None or (1, 0); got {axes!r}")
        return self.T

    def apply(self, fn):
        """The same structure with ``fn(data)`` as weights; ``fn`` may change the dtype or the unit
        but must keep the shape of ``data``.

        Example::

            W2 = W.apply(jnp.abs)
        """
        _function(f"{type(self).__name__}.apply", fn)
        data = fn(self.data)
        old, new = np.shape(_units.split(self.data)[0]), np.shape(_units.split(data)[0])
        if old != new:
            raise EventShapeError(f"{type(self).__name__}.apply: fn returned shape {new}; it must keep data's "
                                  f"shape {old}")
        return self._replace_data(data)

    def apply2(self, other, fn, *, reverse: bool = False):
        """``fn(W, other)`` (``fn(other, W)`` with ``reverse=True``) on the stored entries:
        ``other`` is a scalar, a dense ``shape`` matrix (read at the stored positions) or a layout
        of the same type sharing this one's index arrays. For CSR/CSC, ``operator.add`` and
        ``operator.sub`` change the zeros too, so they return the dense result (as BrainEvent's do).

        Example::

            W2 = W.apply2(2.0, operator.mul)
            W3 = W.apply2(mask_dense, operator.mul)   # weights times mask[i, j]
        """
        name = f"{type(self).__name__}.apply2"
        _function(name, fn)
        dense_result = not self._fixed and fn in (operator.add, operator.sub)
        if not isinstance(other, DataRepresentation):
            operand_shape = np.shape(_numeric_operand(name, other, self.shape))
            if isinstance(other, (list, tuple)):  # jax arrays take no lists as operands
                other = jnp.asarray(other)
            try:
                if dense_result:
                    np.broadcast_shapes(operand_shape, self.shape)
            except ValueError:
                raise EventShapeError(f"{name}: other has shape {operand_shape}, which does not broadcast "
                                      f"against the matrix shape {self.shape}") from None
        if dense_result:
            dense = self.todense()
            return fn(other, dense) if reverse else fn(dense, other)
        if isinstance(other, DataRepresentation):
            same = (type(other) is type(self) and other.shape == self.shape
                    and all(a is b for a, b in zip(self._arrays()[1:], other._arrays()[1:])))
            if not same:
                raise EventShapeError(f"{name}: other is a {type(other).__name__} of shape {other.shape}; a layout "
                                      f"operand must be a {type(self).__name__} sharing this one's index arrays "
                                      f"(e.g. built with with_data); use todense() otherwise")
            operand = other.data
        elif _is_scalar(other):
            operand = other
        else:
            m = _units.split(other)[0]
            if np.shape(m) != self.shape:
                raise EventShapeError(f"{name}: other has shape {np.shape(m)}; expected a scalar or the matrix "
                                      f"shape {self.shape}")
            rows, cols, _ = self._entries()
            operand = (other if _units.is_quantity(other) else jnp.asarray(other))[rows, cols]
            operand = operand.reshape(self.indices.shape)
        return self._replace_data(fn(operand, self.data) if reverse else fn(self.data, operand))

    # -------------------------------------------------------------- conversions
    def _compressed(self, as_stored: bool):
        """(data, indices, indptr) compressing the entries by stored rows (``as_stored``) or by the
        other axis (a stable regrouping, so entries keep their order inside a group)."""
        from ._plasticity import csc_to_csr_view

        data = self.data if self._shared() else self.data.reshape(-1)
        idx, indptr = self._stored_structure()
        if as_stored:
            return data, idx, indptr
        rows, cols = self._stored_shape()
        indptr, idx, perm = csc_to_csr_view(idx, indptr, shape=(cols, rows))
        return (data if self._shared() else data[perm]), idx, indptr

    def tocsr(self):
        """The same matrix (same ``shape``) in compressed rows; a CSR returns itself.

        Example::

            np.testing.assert_allclose(W.tocsr().todense(), W.todense())
        """
        if type(self) is CSR:
            return self
        return CSR(self._compressed(as_stored=not self._flipped), shape=self.shape, backend=self.backend)

    def tocsc(self):
        """The same matrix (same ``shape``) in compressed columns (unlike ``.T``, which is the
        transpose); a CSC returns itself.

        Example::

            np.testing.assert_allclose(W.tocsc().todense(), W.todense())
        """
        if type(self) is CSC:
            return self
        return CSC(self._compressed(as_stored=self._flipped), shape=self.shape, backend=self.backend)

    def tocoo(self):
        """The same matrix as a ``brainunit.sparse.COO`` (one entry per stored synapse, a shared
        weight broadcast); needs brainunit.

        Example::

            coo = W.tocoo()
            np.testing.assert_allclose(coo.todense(), W.todense())
        """
        try:
            import brainunit
        except ImportError:
            raise EventDependencyError(f"{type(self).__name__}.tocoo returns a brainunit.sparse.COO and needs "
                                       f"brainunit (pip install brainunit); tocsr() and todense() do not") from None
        rows, cols, _ = self._entries()
        return brainunit.sparse.COO((self._flat_data(), rows, cols), shape=self.shape,
                                    rows_sorted=type(self) is CSR, cols_sorted=type(self) is CSC)

    # -------------------------------------------------------------- plasticity
    def _plastic_data(self, name):
        if self._shared():
            raise EventShapeError(f"{name}: data holds one shared (homogeneous) weight; plasticity needs one weight "
                                  f"per synapse (W.with_data(jnp.broadcast_to(W.data, W.indices.shape)) first)")
        return self.data.reshape(-1)

    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None):
        """STDP on presynaptic spikes: each synapse ``(i, j)`` of a spiking ``i`` becomes
        ``clip(w + post_trace[j], w_min, w_max)``; returns a new layout (same structure).

        Example::

            W = W.update_on_pre(pre_spikes, post_trace, w_min=0.0, w_max=1.0)
        """
        from . import _plasticity as P

        flat = self._plastic_data(f"{type(self).__name__}.update_on_pre")
        kw = dict(shape=self.shape, backend=self.backend)
        pre_spike = _raw(pre_spike)
        if self._flipped:  # stored by postsynaptic neuron: the CSC update regroups by presynaptic one
            idx, indptr = self._stored_structure()
            new = P.update_csc_on_binary_pre(flat, idx, indptr, pre_spike, post_trace, w_min, w_max, **kw)
        elif self._fixed:
            new = P.update_fixed_post_conn_on_binary_pre(self.data, self.indices, pre_spike, post_trace, w_min,
                                                         w_max, **kw)
        else:
            new = P.update_csr_on_binary_pre(flat, self.indices, self.indptr, pre_spike, post_trace, w_min, w_max,
                                             **kw)
        return self._replace_data(new.reshape(self.data.shape))

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None):
        """STDP on postsynaptic spikes: each synapse ``(i, j)`` of a spiking ``j`` becomes
        ``clip(w + pre_trace[i], w_min, w_max)``; returns a new layout (same structure).

        Example::

            W = W.update_on_post(pre_trace, post_spikes, w_min=0.0, w_max=1.0)
        """
        from . import _plasticity as P

        flat = self._plastic_data(f"{type(self).__name__}.update_on_post")
        kw = dict(shape=self.shape, backend=self.backend)
        post_spike = _raw(post_spike)
        if not self._flipped:  # stored by presynaptic neuron: walk a view grouped by postsynaptic one
            idx, indptr = self._stored_structure()
            if P.traced_structure(idx, indptr):  # the view would sort every synapse each call: one pass instead
                new = P.update_on_index_spikes(f"{type(self).__name__}.update_on_post", flat, idx, indptr,
                                               pre_trace, post_spike, w_min, w_max, nrows=self.shape[0],
                                               ncols=self.shape[1], backend=self.backend)
                return self._replace_data(new.reshape(self.data.shape))
            view_indptr, view_indices, perm = P.csc_to_csr_view(idx, indptr, shape=self.shape[::-1])
            new = P.update_csr_on_binary_post(flat, view_indices, view_indptr, perm, pre_trace, post_spike, w_min,
                                              w_max, **kw)
        elif self._fixed:
            new = P.update_fixed_pre_conn_on_binary_post(self.data, self.indices, pre_trace, post_spike, w_min,
                                                         w_max, **kw)
        else:
            new = P.update_csc_on_binary_post(flat, self.indices, self.indptr, pre_trace, post_spike, w_min, w_max,
                                              **kw)
        return self._replace_data(new.reshape(self.data.shape))


def _validate_csr(cls_name, data, indices, indptr, stored):
    rows, _ = stored
    _ops._integer_array(cls_name, "indices", indices)
    _ops._integer_array(cls_name, "indptr", indptr)
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


def _indptr_dtype(name, requested, nse, auto):
    """The dtype an ``indptr`` gets from an ``indptr_dtype`` argument: ``"auto"`` gives ``auto``;
    int32 and int64 are taken (int32 only while ``nse`` fits it, int64 only with ``jax_enable_x64``)."""
    if isinstance(requested, str) and requested == "auto":
        requested = auto
    try:
        dtype = jnp.dtype(requested)
    except TypeError:
        dtype = None
    if dtype not in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)):
        raise EventDTypeError(f"{name}: indptr_dtype must be 'auto', int32 or int64; got {requested!r}")
    if dtype == jnp.dtype(jnp.int64) and not jax.config.jax_enable_x64:
        raise EventDTypeError(f"{name}: indptr_dtype=int64 needs 64-bit JAX types: enable jax_enable_x64 "
                              f"(or use int32, which holds up to 2^31 - 1 synapses)")
    if dtype == jnp.dtype(jnp.int32) and nse > np.iinfo(np.int32).max:
        raise EventDTypeError(f"{name}: indptr_dtype=int32 cannot hold {nse} synapses (at most 2^31 - 1); use "
                              f"int64 (with jax_enable_x64)")
    return dtype


def _row_counts(name, ptr, nse):
    """Each row's synapse count from a concrete ``indptr``, which must rise from 0 to ``nse``."""
    counts = np.diff(ptr)
    if ptr[0] != 0 or ptr[-1] != nse or (counts < 0).any():
        where = f"; row {int(np.argmax(counts < 0))} ends before it starts" if (counts < 0).any() else ""
        raise EventShapeError(f"{name}: indptr must rise from 0 to nse ({nse}) without falling; got "
                              f"{int(ptr[0])} .. {int(ptr[-1])}{where}")
    return counts


def _check_structure(name, indices, indptr, stored):
    """``check_structure=True``: concrete ``indices``/``indptr`` must form a valid compressed structure
    (traced ones cannot be read, so they pass unchecked; the kernels' bounds policy still holds). Their dtypes
    were checked on construction (_validate_csr)."""
    if isinstance(indices, jax.core.Tracer) or isinstance(indptr, jax.core.Tracer):
        return
    cols = stored[1]
    idx = np.asarray(indices)
    _row_counts(name, np.asarray(indptr), idx.size)
    if idx.size and (idx.min() < 0 or idx.max() >= cols):
        raise EventShapeError(f"{name}: indices must lie in [0, {cols}) for {cols} stored columns; got "
                              f"{int(idx.min())} .. {int(idx.max())}")


def _diagonal_plan(name, indices, indptr, n_diag):
    """The structure of ``S + diag`` for a compressed structure: (indices, indptr, where each old
    synapse moves, where each diagonal value adds). A row's first stored diagonal entry takes the
    value; a row without one gets a new entry at its end."""
    n_rows, nse = indptr.shape[0] - 1, indices.shape[0]
    counts = _row_counts(name, indptr, nse)
    rows = np.repeat(np.arange(n_rows), counts)
    pos = np.arange(nse)
    first = np.full(n_rows, nse)
    hit = indices == rows
    np.minimum.at(first, rows[hit], pos[hit])
    missing = np.zeros(n_rows, bool)
    missing[:n_diag] = first[:n_diag] == nse
    new_indptr = np.zeros(n_rows + 1, indptr.dtype)
    np.cumsum(counts + missing, out=new_indptr[1:])
    moved = new_indptr[rows] + (pos - indptr[rows])
    inserted = new_indptr[:n_diag] + counts[:n_diag]
    new_indices = np.empty(new_indptr[-1], indices.dtype)
    new_indices[moved] = indices
    diag_rows = np.arange(n_diag)
    new_indices[inserted[missing[:n_diag]]] = diag_rows[missing[:n_diag]]
    found = moved[np.minimum(first[:n_diag], nse - 1)] if nse else inserted
    diag = np.where(missing[:n_diag], inserted, found)
    return new_indices, new_indptr, moved, diag


def _function(who: str, fn) -> None:
    if not callable(fn):
        raise EventOperandError(f"{who}: fn must be a function of the weights; got {type(fn).__name__} ({fn!r:.40})")


def _unpack(args, fields: tuple, who: str):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    if len(args) != len(fields):
        raise EventOperandError(f"{who}: expected {len(fields)} arrays ({', '.join(fields)}), as one tuple or "
                                f"separately; got {len(args)}")
    return args


def _shape_arg(cls_name, shape):
    return _ops._shape2(cls_name, shape)


def _check_rhs(name: str, shape, b):
    """b's mantissa and unit for solving with a square matrix of ``shape``."""
    value, unit = _units.split(b)
    value = as_array(name, "b", value, quantity=False)
    if shape[0] != shape[1]:
        raise EventShapeError(f"{name}: the matrix has shape {tuple(shape)}; solving needs a square one")
    if value.shape != (shape[0],):
        raise EventShapeError(f"{name}: b has shape {tuple(value.shape)}; expected ({shape[0]},), one value per row")
    return value, unit


def _solve_unit(unit_b, unit_w):
    """x's unit in ``W @ x = b``: b's over the weights'."""
    if unit_w is None:
        return unit_b
    return 1 / unit_w if unit_b is None else unit_b / unit_w


def _sparse_solve(name, data, indices, indptr, shape, b, tol, reorder):
    """x with ``A @ x = b`` for the CSR arrays of a square ``A``: jax's sparse direct solver (cuSOLVER on
    GPUs, SciPy on CPUs)."""
    from jax.experimental.sparse.linalg import spsolve

    value, unit_b = _check_rhs(name, shape, b)
    data, unit_w = _units.split(data)
    dtype = jnp.promote_types(data.dtype, value.dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.asarray(0.0).dtype
    # the solvers want each row's columns in order (SciPy's CPU path fails on an unsorted row, and
    # diag_add appends to rows): a stable sort by (row, column) keeps indptr as it is
    rows, _ = slot_rows(indices, indptr, shape[0], -1)
    order = jnp.lexsort((indices, rows))
    x = spsolve(jnp.asarray(data, dtype)[order], indices[order], indptr, value.astype(dtype), tol=tol,
                reorder=reorder)
    return _units.attach(x, _solve_unit(unit_b, unit_w))


@register_pytree_with_keys_class
class CSR(DataRepresentation):
    """Compressed sparse rows: ``CSR((data, indices, indptr), shape=(m, n))``.

    Row ``i``'s synapses are ``indices[indptr[i]:indptr[i+1]]`` (column ids) with weights ``data``
    (one per index, or one shared weight). ``s @ W`` (s of length m) scatters the rows of active
    spikes; ``W @ s`` (length n) gathers.

    As in BrainEvent 0.3, ``indptr_dtype`` (``"auto"``, int32 or int64) casts ``indptr``; ``"auto"``
    keeps its dtype. ``check_structure=True`` checks concrete arrays now (``indptr`` rising from 0 to
    ``nse``, ``indices`` inside the matrix) and raises :class:`EventShapeError`; the default
    (``False``, unlike BrainEvent) reads nothing back to the host, and out-of-range indices are then
    dropped by every product (README, "Out of range").

    Example::

        W = xlakern.CSR((jnp.ones(3), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])), shape=(2, 3))
        xlakern.BinaryArray(jnp.array([True, False])) @ W    # [1., 0., 1.]
    """

    __module__ = "xlakern"

    def __init__(self, *args, shape, backend=None, buffers=None, indptr_dtype="auto", check_structure=False):
        # indptr_dtype and check_structure: BrainEvent 0.3's constructor arguments. "auto" keeps indptr's
        # own dtype (the kernels take int32 and int64 alike). The structure is checked only on request:
        # the check reads the arrays back to the host, which a large network pays on every construction.
        data, indices, indptr = _unpack(args, ("data", "indices", "indptr"), type(self).__name__)
        name = type(self).__name__
        shape = _shape_arg(name, shape)
        indices, indptr = as_array(name, "indices", indices, quantity=False), as_array(name, "indptr", indptr,
                                                                                       quantity=False)
        auto = isinstance(indptr_dtype, str) and indptr_dtype == "auto"
        if not auto and jnp.issubdtype(indptr.dtype, jnp.integer):  # a float one is refused by the kernels' checks
            indptr = indptr.astype(_indptr_dtype(name, indptr_dtype, np.size(indices), auto=None))
        arrays = (as_array(name, "data", data), indices, indptr)
        self._set(arrays, shape, backend)
        self._init_buffers(buffers)
        _validate_csr(name, *arrays, self._stored_shape())
        if check_structure:
            _check_structure(name, indices, indptr, self._stored_shape())

    @property
    def T(self):
        """The transpose: a CSC view of the same arrays."""
        return CSC(self._arrays(), shape=self.shape[::-1], backend=self.backend, buffers=self.buffers)

    def build_weight_indices(self):
        """The matrix itself. (BrainEvent caches a column index of a CSR here for its ``W @ s``
        kernels; xlakern's kernels read the stored arrays in both orientations and need none.)

        Example::

            W = W.build_weight_indices()  # the same W
        """
        return self

    def solve(self, b, tol=1e-6, reorder=1):
        """``x`` with ``W @ x = b`` for a square ``W``, by a sparse direct solver (jax's ``spsolve``:
        cuSOLVER on GPUs, SciPy on CPUs; not under ``vmap``). ``tol`` is the singularity threshold,
        ``reorder`` the fill-reducing ordering (0 none, 1 symrcm, 2 symamd, 3 metis), as in BrainEvent.
        Units: ``x`` carries ``b``'s unit over the weights'. A CSC is regrouped into rows first (its
        structure must be concrete).

        Example::

            x = W.solve(b)   # np.allclose(W.todense() @ x, b)
        """
        csr = self if type(self) is CSR else self.tocsr()
        idx, indptr = csr._stored_structure()
        return _sparse_solve(f"{type(self).__name__}.solve", csr._flat_data(), idx, indptr, self.shape, b, tol,
                             reorder)

    def delay_deliver(self, ring, events, delays, t, *, weighted=None, backend=None):
        """:func:`xlakern.csr_delay_deliver` with this matrix as the ``(n_pre, n_post)`` connectivity:
        ``ring[(t + delays[e]) mod L, indices[e]] += data[e] * f(events)[row of e]``. ``delays`` are per
        synapse in storage order (or one scalar). CSR only: a CSC's synapses are stored by column.

        Example::

            ring = W.delay_deliver(ring, spikes, delays, t)
        """
        from ._delay import csr_delay_deliver

        self._require_csr("delay_deliver")
        return csr_delay_deliver(ring, events, self.data, self.indices, self.indptr, delays, t, shape=self.shape,
                                 weighted=weighted, backend=self.backend if backend is None else backend)

    def delay_layout(self, delays, n_slots: int):
        """:class:`xlakern.CSRDelayLayout` of this matrix (each row's synapses sorted by delay; concrete
        structure and delays). CSR only.

        Example::

            layout = W.delay_layout(delays, n_slots=8)
            ring = layout.deliver(ring, spikes, t)
        """
        from ._delay import CSRDelayLayout

        self._require_csr("delay_layout")
        return CSRDelayLayout.build(self.data, self.indices, self.indptr, delays, n_slots=n_slots, shape=self.shape)

    def _require_csr(self, method: str) -> None:
        if type(self) is not CSR:
            raise EventShapeError(f"{type(self).__name__}.{method}: delays are per synapse of a CSR (rows = "
                                  f"presynaptic neurons); convert with .tocsr() and give the delays in its order")

    def diag_add(self, other):
        """``W + diag(other)`` (``other``: one value per diagonal entry, ``min(shape)`` of them, in
        the weights' unit). Diagonal entries missing from the structure are inserted (at the end of
        their row / column), so the result may store more synapses; the structure is planned from
        concrete ``indices``/``indptr`` (not under ``jit``), ``data`` and ``other`` may be traced.

        Example::

            A = W.diag_add(jnp.ones(min(W.shape)))
        """
        name = f"{type(self).__name__}.diag_add"
        n_diag = min(self.shape)
        value, unit_o = _units.split(other)
        value = as_array(name, "other", value, quantity=False)
        if value.shape != (n_diag,):
            raise EventShapeError(f"{name}: other has shape {tuple(value.shape)}; expected ({n_diag},), one value "
                                  f"per diagonal entry")
        data, unit = _units.split(self._flat_data())
        if unit != unit_o:
            raise EventUnitError(f"{name}: other's unit ({unit_o or 'none'}) differs from the weights' "
                                 f"({unit or 'none'}); convert it first")
        if isinstance(self.indices, jax.core.Tracer) or isinstance(self.indptr, jax.core.Tracer):
            raise EventTracedError(f"{name}: indices and indptr must be concrete (the result's structure depends "
                                   f"on them); call diag_add outside jit")
        indices, indptr = np.asarray(self.indices), np.asarray(self.indptr)
        new_indices, new_indptr, moved, diag = _diagonal_plan(name, indices, indptr, n_diag)
        new_data = (jnp.zeros((new_indices.size,), data.dtype).at[moved].set(data)
                    .at[diag].add(value.astype(data.dtype)))
        return type(self)((_units.attach(new_data, unit), jnp.asarray(new_indices), jnp.asarray(new_indptr)),
                          shape=self.shape, backend=self.backend)

    @classmethod
    def fromdense(cls, mat, *, nse=None, index_dtype=jnp.int32, indptr_dtype="auto", backend=None,
                  precompute_weight_indices: bool = False):
        """From a dense matrix; its non-zero entries become synapses (BrainEvent 0.3's arguments).

        Without ``nse`` the matrix must be concrete. With ``nse`` (an int: the number of stored
        slots) it may be traced, under ``jit`` too: the non-zeros fill the first slots in row order
        and the rest are zero-weight slots past the last row, which no product reads; a concrete
        matrix with more than ``nse`` non-zeros is an ``EventShapeError`` (a traced one keeps the
        first ``nse``, as ``jax.experimental.sparse`` does). ``indptr_dtype`` is ``"auto"`` (the
        indices' dtype), int32 or int64 (needs ``jax_enable_x64``). ``precompute_weight_indices`` is
        accepted and unused: xlakern's kernels need no extra index for either orientation.

        Example::

            W = xlakern.CSR.fromdense(np.array([[0., 1.], [2., 0.]]))
            W = jax.jit(lambda m: xlakern.CSR.fromdense(m, nse=4))(jnp.eye(3))   # 4 slots, 3 synapses
        """
        del precompute_weight_indices
        name = f"{cls.__name__}.fromdense"
        m, unit = _units.split(mat)
        if np.ndim(m) != 2:
            raise EventShapeError(f"{name}: expected a 2-D matrix; got shape {np.shape(m)}")
        indptr_dtype = _indptr_dtype(name, indptr_dtype, 0 if nse is None else int(nse), auto=index_dtype)
        if nse is None:
            stored = np.asarray(m)
            stored = stored.T if cls is CSC else stored
            rows, cols = np.nonzero(stored)
            indptr = np.zeros(stored.shape[0] + 1, np.int64)
            np.cumsum(np.bincount(rows, minlength=stored.shape[0]), out=indptr[1:])
            data = jnp.asarray(stored[rows, cols])
        else:
            nse = int(nse)
            if nse < 0:
                raise EventShapeError(f"{name}: nse must be >= 0; got {nse}")
            stored = jnp.asarray(m)
            stored = stored.T if cls is CSC else stored
            if not isinstance(stored, jax.core.Tracer):
                count = int(np.count_nonzero(np.asarray(stored)))
                if count > nse:
                    raise EventShapeError(f"{name}: the matrix has {count} non-zeros, more than nse={nse} slots; "
                                          f"pass nse >= {count} (or leave it out)")
            n_rows = stored.shape[0]
            # row n_rows marks a padding slot: not counted in indptr, so past every row
            rows, cols = jnp.nonzero(stored, size=nse, fill_value=(n_rows, 0))
            real = rows < n_rows
            data = jnp.where(real, stored[jnp.minimum(rows, max(n_rows - 1, 0)), cols], 0) if n_rows else \
                jnp.zeros((nse,), stored.dtype)
            counts = jnp.zeros((n_rows + 1,), jnp.int32).at[rows].add(1)[:n_rows]
            indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
        return cls((_units.attach(data, unit), jnp.asarray(cols, index_dtype), jnp.asarray(indptr, indptr_dtype)),
                   shape=tuple(np.shape(m)), backend=backend)

    # -------------------------------------------------------------- plasticity rules of one's own
    def apply_on_pre(self, rule, pre_spike, *, edge_state=None, pre_vals=None, post_vals=None, params=None):
        """``csr_apply_on_pre`` on this matrix's synapses: each synapse ``e = (i, j)`` of an active ``i``
        takes ``rule(edge_state[e], pre_vals[i], post_vals[j], params)``. ``edge_state`` (any pytree
        of per-synapse leaves in storage order) defaults to ``data``; returns the new state (rebuild the
        matrix with ``with_data``). A ``CSC`` applies the same rule through its stored columns.

        Example::

            new_w = W.apply_on_pre(lambda w, pre, post, lr: w + lr * post, spikes, post_vals=trace, params=0.01)
            W = W.with_data(new_w)
        """
        return self._apply_rule("apply_on_pre", True, rule, pre_spike, edge_state, pre_vals, post_vals, params)

    def apply_on_post(self, rule, post_spike, *, edge_state=None, pre_vals=None, post_vals=None, params=None):
        """``csr_apply_on_post`` on this matrix's synapses: each synapse ``e = (i, j)`` of an active ``j``
        takes ``rule(edge_state[e], pre_vals[i], post_vals[j], params)``; see :meth:`apply_on_pre`.

        Example::

            new_w = W.apply_on_post(lambda w, pre, post, lr: w - lr * pre, spikes, pre_vals=trace, params=0.01)
        """
        return self._apply_rule("apply_on_post", False, rule, post_spike, edge_state, pre_vals, post_vals, params)

    def _apply_rule(self, method, on_pre, rule, spike, edge_state, pre_vals, post_vals, params):
        from . import _plasticity_rules as R

        name, spike = f"{type(self).__name__}.{method}", _raw(spike)
        if edge_state is None:  # the weights, which must be one a synapse (or pass edge_state=)
            edge_state = self._plastic_data(name)
        if not self._flipped:
            return R.apply_on(name, on_pre, rule, edge_state, self.indices, self.indptr, spike, pre_vals, post_vals,
                              params, self.shape)
        # stored by postsynaptic neuron: the stored rows are W's columns, so W's presynaptic side is the
        # stored structure's column side, with the neuron values (and the rule's arguments) swapped
        return R.apply_on(name, not on_pre, lambda e, row_val, col_val, p: rule(e, col_val, row_val, p), edge_state,
                          self.indices, self.indptr, spike, post_vals, pre_vals, params, self.shape[::-1],
                          labels=("post_vals", "pre_vals", "post_spike", "pre_spike"))


@register_pytree_with_keys_class
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
        return CSR(self._arrays(), shape=self.shape[::-1], backend=self.backend, buffers=self.buffers)


class FixedNumConn(DataRepresentation):
    """Base of the fixed-count layouts: every stored row has exactly K synapses."""

    _fixed = True

    def build_weight_indices(self):
        """The matrix itself (BrainEvent caches an index here for one orientation; xlakern's kernels
        need none).

        Example::

            W = W.build_weight_indices()  # the same W
        """
        return self

    def __init__(self, *args, shape, backend=None, buffers=None, precompute_weight_indices=False):
        # precompute_weight_indices: BrainEvent's eagerly built CSC view; the kernels here need none
        # (accepted, unused)
        data, indices = _unpack(args, ("data", "indices"), type(self).__name__)
        shape = _shape_arg(type(self).__name__, shape)
        name = type(self).__name__
        arrays = (as_array(name, "data", data), as_array(name, "indices", indices, quantity=False))
        self._set(arrays, shape, backend)
        self._init_buffers(buffers)
        rows = self._stored_shape()[0]
        _ops._integer_array(name, "indices", arrays[1])
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

    @property
    def num_pre(self) -> int:
        """Presynaptic neurons (rows of ``W``).

        Example::

            assert W.num_pre == W.shape[0]
        """
        return self.shape[0]

    @property
    def num_post(self) -> int:
        """Postsynaptic neurons (columns of ``W``).

        Example::

            assert W.num_post == W.shape[1]
        """
        return self.shape[1]

    @classmethod
    def fromdense(cls, mat, *, num_conn=None, index_dtype=jnp.int32, backend=None):
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
        return cls((_units.attach(jnp.asarray(data), unit), jnp.asarray(idx, index_dtype)), shape=m.shape,
                   backend=backend)


@register_pytree_with_keys_class
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
        return FixedNumPerPost(self._arrays(), shape=self.shape[::-1], backend=self.backend, buffers=self.buffers)


@register_pytree_with_keys_class
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
        return FixedNumPerPre(self._arrays(), shape=self.shape[::-1], backend=self.backend, buffers=self.buffers)

