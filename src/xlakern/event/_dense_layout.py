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
from jax.tree_util import register_pytree_node_class

from . import _ops
from . import _units
from ._errors import EventIndexError, EventShapeError, EventUnitError
from ._layouts import CSC, CSR, DataRepresentation, _as_array, _shape_arg

__all__ = ["Dense"]


@register_pytree_node_class
class Dense(DataRepresentation):
    """A dense ``(rows, cols)`` weight matrix: ``Dense(data, shape=None, backend=None, buffers=None)``.

    Example::

        W = xlakern.Dense(weights)                       # weights: (n_pre, n_post)
        current = xlakern.BinaryArray(spikes) @ W        # event-driven: rows of the spiking neurons
        W = W.update_on_pre(spikes, post_trace, w_min=0.0, w_max=1.0)
    """

    __module__ = "xlakern"

    def __init__(self, data, *, shape=None, backend: Optional[str] = None, buffers=None):
        data = _as_array(data)
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
        """A CSR of the non-zero entries (needs a concrete matrix); ``nse``, if given, must equal
        their number (``precompute_weight_indices`` is accepted for BrainEvent; nothing needs it).

        Example::

            csr = xlakern.Dense(np.eye(3)).tocsr()
        """
        return self._compress(CSR, nse, index_dtype)

    def tocsc(self, *, nse=None, index_dtype=jnp.int32, precompute_weight_indices: bool = False):
        """A CSC of the non-zero entries (see :meth:`tocsr`).

        Example::

            csc = xlakern.Dense(np.eye(3)).tocsc()
        """
        return self._compress(CSC, nse, index_dtype)

    def _compress(self, cls, nse, index_dtype):
        out = cls.fromdense(self.data, index_dtype=index_dtype)
        if nse is not None and int(nse) != out.nse:
            raise EventShapeError(f"Dense.to{cls.__name__.lower()}: nse={nse} but the matrix has {out.nse} non-zero "
                                  f"entries")
        return cls(out._arrays(), shape=out.shape, backend=self.backend)

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

    # -------------------------------------------------------------- element-wise arithmetic
    def apply2(self, other, fn, *, reverse: bool = False):
        """``fn(W, other)`` (``fn(other, W)`` with ``reverse=True``) element-wise, ``other`` a
        scalar, an array broadcasting to ``shape`` or a Dense of the same shape.

        Example::

            W2 = W.apply2(mask, operator.mul)
        """
        if isinstance(other, Dense):
            operand = other.data
        elif isinstance(other, DataRepresentation):
            raise EventShapeError(f"Dense.apply2: other is a {type(other).__name__}; combine a Dense with a "
                                  f"scalar, an array or another Dense (use other.todense())")
        else:
            operand = other if _units.is_quantity(other) else jnp.asarray(other)
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
