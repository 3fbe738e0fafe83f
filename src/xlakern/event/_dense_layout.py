"""Dense: a full weight matrix wearing the layout interface (BrainEvent 0.3's ``Dense``).

It is a pytree with one array leaf, ``data`` (plus any registered buffers), so it goes through
``jit`` like CSR. ``W @ events`` and ``events @ W`` with :class:`BinaryArray` /
:class:`WeightedArray` operands run the event-driven dense kernels (only active rows or columns
are read); plain arrays use ``jnp`` matrix products.

Example::

    W = xlakern.Dense(jnp.array([[1.0, 0.0], [2.0, 3.0]]))
    y = xlakern.BinaryArray(jnp.array([True, False])) @ W     # row 0: [1., 0.]
"""

from __future__ import annotations

import operator
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_with_keys_class

from . import _ops
from . import _units
from ._errors import EventIndexError, EventShapeError, EventUnitError, UnsupportedOperationError
from ._arguments import as_array
from ._layouts import CSC, CSR, DataRepresentation, _function, _numeric_operand, _row_selector, _shape_arg

__all__ = ["Dense"]


@register_pytree_with_keys_class
class Dense(DataRepresentation):
    """A dense ``(rows, cols)`` weight matrix: ``Dense(data, shape=None, backend=None, buffers=None)``.

    Example::

        W = xlakern.Dense(weights)                       # weights: (n_pre, n_post)
        current = xlakern.BinaryArray(spikes) @ W        # event-driven: rows of the spiking neurons
        W = W.update_on_pre(spikes, post_trace, w_min=0.0, w_max=1.0)
    """

    __module__ = "xlakern"

    def __init__(self, data, *, shape=None, backend: Optional[str] = None, buffers=None):
        data = as_array("Dense", "data", data)
        actual = tuple(np.shape(_units.split(data)[0]))
        if len(actual) != 2:
            raise EventShapeError(f"Dense: data has shape {actual}; expected a 2-D (rows, cols) matrix")
        if shape is not None and _shape_arg("Dense", shape) != actual:
            raise EventShapeError(f"Dense: shape={tuple(shape)} does not match data's shape {actual}")
        self._set((data,), actual, backend)
        self._init_buffers(buffers)

    # the pytree and the base class's helpers see one array, the matrix itself
    def _arrays(self):
        return (self.data,)

    def _array_names(self):
        return ("data",)

    def _set(self, arrays, shape, backend=None):
        (self.data,) = arrays
        self.shape = tuple(int(s) for s in shape)
        self.backend = backend

    def _replace_data(self, data):
        return Dense(data, backend=self.backend, buffers=self.buffers)

    @property
    def nse(self) -> int:
        """Stored entries: all of them, ``rows * cols``."""
        return self.size

    @classmethod
    def fromdense(cls, mat, *, backend: Optional[str] = None, buffers=None):
        """Wrap a dense matrix (the constructor under BrainEvent's common name).

        Example::

            W = xlakern.Dense.fromdense(np.eye(3))
        """
        return cls(mat, backend=backend, buffers=buffers)

    def with_data(self, data):
        """The same layout with another matrix of the same shape and unit.

        Example::

            W2 = W.with_data(W.data * 0.5)
        """
        data = as_array("Dense", "data", data)
        new = tuple(np.shape(_units.split(data)[0]))
        if new != self.shape:
            raise EventShapeError(f"Dense.with_data: data has shape {new}; expected {self.shape}")
        return super().with_data(data)

    def solve(self, b, tol=1e-6, reorder=1):
        """``x`` with ``W @ x = b`` for a square ``W`` (``jnp.linalg.solve``; ``tol`` and ``reorder``
        are BrainEvent's sparse-solver arguments, accepted and unused here). Units: ``x`` carries
        ``b``'s unit over the weights'.

        Example::

            x = W.solve(b)   # np.allclose(W.data @ x, b)
        """
        from ._layouts import _check_rhs, _solve_unit

        value, unit_b = _check_rhs("Dense.solve", self.shape, b)
        w, unit_w = _units.split(self.data)
        dtype = jnp.promote_types(w.dtype, value.dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            dtype = jnp.asarray(0.0).dtype
        x = jnp.linalg.solve(jnp.asarray(w, dtype), value.astype(dtype))
        return _units.attach(x, _solve_unit(unit_b, unit_w))

    def todense(self):
        """The matrix itself.

        Example::

            np.testing.assert_array_equal(W.todense(), W.data)
        """
        return self.data

    @property
    def T(self):
        """The transpose, a Dense of shape ``(cols, rows)``."""
        return Dense(self.data.T, backend=self.backend, buffers=self.buffers)

    def tocsr(self, *, nse=None, index_dtype=jnp.int32, precompute_weight_indices: bool = False):
        """A CSR of the non-zero entries, through :meth:`CSR.fromdense` with this layout's backend (``nse``,
        ``index_dtype`` and ``precompute_weight_indices`` are its arguments: without ``nse`` the matrix
        must be concrete).

        Example::

            csr = xlakern.Dense(np.eye(3)).tocsr()
        """
        return CSR.fromdense(self.data, nse=nse, index_dtype=index_dtype, backend=self.backend,
                             precompute_weight_indices=precompute_weight_indices)

    def tocsc(self, *, nse=None, index_dtype=jnp.int32, precompute_weight_indices: bool = False):
        """A CSC of the non-zero entries (see :meth:`tocsr`).

        Example::

            csc = xlakern.Dense(np.eye(3)).tocsc()
        """
        return CSC.fromdense(self.data, nse=nse, index_dtype=index_dtype, backend=self.backend,
                             precompute_weight_indices=precompute_weight_indices)

    def tocoo(self):
        """The non-zero entries as a ``brainunit.sparse.COO`` (needs brainunit).

        Example::

            coo = xlakern.Dense(np.eye(3)).tocoo()
        """
        return self.tocsr().tocoo()

    def sum(self, axis=None):
        """Sum of all entries (``axis=None``), or along ``axis``.

        Example::

            W.sum(axis=0)   # column sums
        """
        data, unit = _units.split(self.data)
        return _units.attach(jnp.sum(data, axis=axis), unit)

    def diag_add(self, other):
        """``W + diag(other)``, ``other`` holding ``min(shape)`` values in the weights' unit.

        Example::

            A = W.diag_add(jnp.ones(min(W.shape)))
        """
        n = min(self.shape)
        value, unit_o = _units.split(other)
        value = jnp.asarray(value)
        data, unit = _units.split(self.data)
        if value.shape != (n,):
            raise EventShapeError(f"Dense.diag_add: other has shape {tuple(value.shape)}; expected ({n},), one value "
                                  f"per diagonal entry")
        if unit != unit_o:
            raise EventUnitError(f"Dense.diag_add: other's unit ({unit_o or 'none'}) differs from the weights' "
                                 f"({unit or 'none'}); convert it first")
        d = jnp.arange(n)
        return self._replace_data(_units.attach(data.at[d, d].add(value.astype(data.dtype)), unit))

    def slice_rows(self, index):
        """Rows ``index`` (an int, a sequence, an array or a slice) as a Dense of shape ``(len(rows),
        cols)`` with this layout's backend and buffers; the rows may be traced (under ``jit``).

        Example::

            sub = W.slice_rows([0, 5, 7])          # a (3, cols) Dense
        """
        rows = jnp.atleast_1d(_row_selector("Dense.slice_rows", index, self.shape[0]))
        return Dense(self.data[rows], backend=self.backend, buffers=self.buffers)

    def _per_synapse(self, y, w, at_column: bool):
        """``w[i, j] * y[i]`` (``y[j]`` at_column) for every entry: each entry of a Dense is a synapse."""
        name = "Dense.dt2t_transposed" if at_column else "Dense.dt2t"
        (yv, unit_y), (wv, unit_w) = _units.split(y), _units.split(w)
        yv, wv = jnp.asarray(yv), jnp.asarray(wv)
        n = self.shape[1] if at_column else self.shape[0]
        if yv.shape != (n,):
            raise EventShapeError(f"{name}: y has shape {tuple(yv.shape)}; expected ({n},), one value per "
                                  f"{'column' if at_column else 'row'}")
        if wv.shape != self.shape:
            raise EventShapeError(f"{name}: w has shape {tuple(wv.shape)}; expected {self.shape}, one value per "
                                  f"entry")
        return _units.attach(wv * (yv[None, :] if at_column else yv[:, None]), unit_w, unit_y)

    def dt2t(self, y_dim_arr, w_dim_arr):
        """Per entry, ``w[i, j] * y[i]`` (``y`` has ``shape[0]`` entries, ``w`` the matrix's shape): the
        ``D^t eps^{t-1}`` term of eligibility traces, as :meth:`CSR.dt2t` computes it for stored synapses.

        Example::

            eps = W.dt2t(pre_factor, eps)          # pre_factor: (rows,), eps: (rows, cols)
        """
        return self._per_synapse(y_dim_arr, w_dim_arr, at_column=False)

    def dt2t_transposed(self, y_dim_arr, w_dim_arr):
        """Per entry, ``w[i, j] * y[j]`` (``y`` has ``shape[1]`` entries); see :meth:`dt2t`.

        Example::

            eps = W.dt2t_transposed(post_factor, eps)   # post_factor: (cols,)
        """
        return self._per_synapse(y_dim_arr, w_dim_arr, at_column=True)

    # -------------------------------------------------------------- element-wise arithmetic
    def apply2(self, other, fn, *, reverse: bool = False):
        """``fn(W, other)`` (``fn(other, W)`` with ``reverse=True``) element-wise, ``other`` a
        scalar, an array broadcasting to ``shape`` or a Dense of the same shape.

        Example::

            W2 = W.apply2(mask, operator.mul)
        """
        _function("Dense.apply2", fn)
        if isinstance(other, Dense):
            operand = other.data
        elif isinstance(other, DataRepresentation):
            raise UnsupportedOperationError(f"Dense.apply2: other is a {type(other).__name__}; combine a Dense with "
                                            f"a scalar, an array or another Dense (use other.todense())")
        else:
            _numeric_operand("Dense.apply2", other, self.shape)
            operand = as_array("Dense.apply2", "other", other)
        shape = np.shape(_units.split(operand)[0])
        try:
            fits = jnp.broadcast_shapes(self.shape, shape) == self.shape
        except ValueError:
            fits = False
        if not fits:
            raise EventShapeError(f"Dense.apply2: other has shape {shape}; it must broadcast to the matrix shape "
                                  f"{self.shape}")
        return self._replace_data(fn(operand, self.data) if reverse else fn(self.data, operand))

    def _scale(self, other, op, name):
        return self.apply2(other, op)

    # (+, - and % are the layouts' own: apply2 with one unit on both sides)
    def __rtruediv__(self, other):
        return self.apply2(other, operator.truediv, reverse=True)

    def __abs__(self):
        return self.apply(abs)

    def __iter__(self):
        return (self.data[i] for i in range(self.shape[0]))

    def __getitem__(self, index):
        """NumPy indexing of the dense matrix (``W[i]`` a row, ``W[:, j]`` a column, ``W[i, j]`` an entry),
        as BrainEvent 0.3's ``Dense`` does.

        Example::

            row = W[3]
        """
        # a list selects rows as in NumPy (jax refuses a non-tuple sequence as an index)
        if isinstance(index, list):
            index = np.asarray(index)
        elif isinstance(index, tuple):
            index = tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
        first = index[0] if isinstance(index, tuple) and index else index
        if isinstance(first, (int, np.integer)) and not -self.shape[0] <= first < self.shape[0]:
            # (jax would clamp it to the last row)
            raise EventIndexError(f"Dense[...]: row {first} is out of range for {self.shape[0]} rows")
        return self.data[index]

    # -------------------------------------------------------------- products
    def _call(self, v, binary, weighted, mm, transpose):
        if binary or weighted:
            fn = _ops.binary_densemm if mm else _ops.binary_densemv
            return fn(self.data, v, transpose=transpose, backend=self.backend, weighted=weighted)
        (w, unit_w), (x, unit_x) = _units.split(self.data), _units.split(v)
        n = self.shape[0] if transpose else self.shape[1]
        if np.shape(x)[0] != n:
            what = "rows" if transpose else "columns"
            raise EventShapeError(f"Dense @: the other operand's contracted axis has {np.shape(x)[0]} entries; "
                                  f"expected {n}, the matrix's {what}")
        w, x = jnp.asarray(w), jnp.asarray(x)
        dtype = jnp.promote_types(w.dtype, x.dtype)
        w = w.astype(dtype)
        # HIGHEST: float32 products in float32, as the event kernels compute them (XLA's GPU default would
        # round the operands to TF32, a relative error near 1e-3)
        product = jnp.matmul(w.T if transpose else w, x.astype(dtype), precision=jax.lax.Precision.HIGHEST)
        return _units.attach(product, unit_w, unit_x)

    # -------------------------------------------------------------- plasticity
    def update_on_pre(self, pre_spike, post_trace, w_min=None, w_max=None):
        """Rows of spiking presynaptic neurons: ``W[i, :] <- clip(W[i, :] + post_trace, w_min, w_max)``.

        Example::

            W = W.update_on_pre(pre_spikes, post_trace, w_min=0.0, w_max=1.0)
        """
        from ._events import _raw
        from ._plasticity import update_dense_on_binary_pre

        return self._replace_data(update_dense_on_binary_pre(self.data, _raw(pre_spike), post_trace, w_min, w_max,
                                                             backend=self.backend))

    def update_on_post(self, pre_trace, post_spike, w_min=None, w_max=None):
        """Columns of spiking postsynaptic neurons: ``W[:, j] <- clip(W[:, j] + pre_trace, w_min, w_max)``.

        Example::

            W = W.update_on_post(pre_trace, post_spikes, w_min=0.0, w_max=1.0)
        """
        from ._events import _raw
        from ._plasticity import update_dense_on_binary_post

        return self._replace_data(update_dense_on_binary_post(self.data, pre_trace, _raw(post_spike), w_min, w_max,
                                                              backend=self.backend))
