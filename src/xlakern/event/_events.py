"""Spike containers: BinaryArray, WeightedArray, BitPackedBinary, CompactBinary.

Each wraps one array (its ``value``); an element is active when it is non-zero. ``@`` with a
layout (CSR, CSC, FixedNumPerPre/Post) or a dense matrix, on either side, runs the event-driven
operator; everything else (indexing, arithmetic) acts on the plain array and returns plain arrays.

Example::

    s = xlakern.BinaryArray(v >= v_th)
    i_syn = s @ W            # W: CSR / FixedNumPerPre / dense (n_pre, n_post)
"""

from __future__ import annotations

import operator
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.tree_util import FlattenedIndexKey, GetAttrKey, register_pytree_with_keys_class

from . import _units
from ._arguments import as_array
from ._errors import EventDTypeError, EventMatmulError, EventNDimError, EventShapeError

__all__ = ["EventRepresentation", "BinaryArray", "WeightedArray", "BitPackedBinary", "bitpack", "CompactBinary"]


def _raw(x):
    return x.value if isinstance(x, EventRepresentation) else x


def _keyed(obj, base, names, children):
    """``(GetAttrKey(name), child)`` pairs, where ``obj`` flattens by ``base``'s tree_flatten; a subclass
    that flattens its own way (a user's) gets its children's positions, since the names may not fit."""
    if type(obj).tree_flatten is not base.tree_flatten or len(names) != len(children):
        return tuple((FlattenedIndexKey(i), c) for i, c in enumerate(children))
    return tuple((GetAttrKey(n), c) for n, c in zip(names, children))


class EventRepresentation:
    """Base of the spike containers: a pytree with one leaf, the wrapped array."""

    __array_ufunc__ = None  # numpy defers `ndarray @ events` to our __rmatmul__
    __array_priority__ = 100
    _weighted = False

    def __init__(self, value: Any):
        value = _raw(value)
        if isinstance(value, (list, tuple, np.ndarray, bool, int, float)):
            value = jnp.asarray(value)
        self._value = value

    @property
    def value(self):
        """The wrapped array."""
        return self._value

    @value.setter
    def value(self, v):
        self._value = v

    def with_value(self, value):
        """The same container type around another array."""
        return type(self)(value)

    shape = property(lambda self: tuple(np.shape(_units.split(self._value)[0])), doc="the array's shape")
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))
    dtype = property(lambda self: _units.split(self._value)[0].dtype)
    T = property(lambda self: self._value.T, doc="the transposed plain array")

    def transpose(self, *axes):
        return self._value.transpose(*axes)

    def __repr__(self):  # BrainEvent 0.3's form, so printed tutorials read the same
        return f"{type(self).__name__}(value={self._value}, dtype={self.dtype})"

    def __len__(self):
        return len(self._value)

    def __iter__(self):
        for i in range(len(self)):
            yield self._value[i]

    def __getitem__(self, index):
        if isinstance(index, tuple):
            index = tuple(_raw(i) for i in index)
        return self._value[_raw(index)]

    def tree_flatten(self):
        return (self._value,), None

    def tree_flatten_with_keys(self):  # the key path `.value`, the public name of the one leaf
        children, aux = self.tree_flatten()
        return _keyed(self, EventRepresentation, ("value",), children), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj._value = children[0]
        return obj

    # Arithmetic acts on the plain array (as jnp would), returning plain arrays.
    def _bin(op):
        def f(self, other):
            return op(self._value, _raw(other))
        return f

    def _rbin(op):
        def f(self, other):
            return op(_raw(other), self._value)
        return f

    __add__, __radd__ = _bin(lambda a, b: a + b), _rbin(lambda a, b: a + b)
    __sub__, __rsub__ = _bin(lambda a, b: a - b), _rbin(lambda a, b: a - b)
    __mul__, __rmul__ = _bin(lambda a, b: a * b), _rbin(lambda a, b: a * b)
    __truediv__, __rtruediv__ = _bin(lambda a, b: a / b), _rbin(lambda a, b: a / b)
    __eq__, __ne__ = _bin(lambda a, b: a == b), _bin(lambda a, b: a != b)
    __lt__, __le__ = _bin(lambda a, b: a < b), _bin(lambda a, b: a <= b)
    __gt__, __ge__ = _bin(lambda a, b: a > b), _bin(lambda a, b: a >= b)
    __and__, __or__ = _bin(lambda a, b: a & b), _bin(lambda a, b: a | b)
    del _bin, _rbin
    __hash__ = None

    def __neg__(self):
        return -self._value

    def __invert__(self):
        return ~self._value

    # ------------------------------------------------------------------ products
    def _check_dense_product(self, matrix, events_left: bool):
        """The shapes of ``self @ matrix`` (events_left) or ``matrix @ self`` for a dense matrix."""
        name = type(self).__name__
        where = f"{name} @ matrix" if events_left else f"matrix @ {name}"
        if self.ndim not in (1, 2):
            raise EventNDimError(f"{where}: events must be 1-D or 2-D; got shape {self.shape}")
        shape = np.shape(_units.split(matrix)[0])
        if len(shape) != 2:
            raise EventNDimError(f"{where}: the matrix must be 2-D; got shape {shape}")
        left, right = (tuple(self.shape), shape) if events_left else (shape, tuple(self.shape))
        if left[-1] != right[0]:
            raise EventMatmulError(f"{where}: incompatible shapes {left} and {right} (inner dimensions {left[-1]} "
                                   f"and {right[0]} differ)")

    def __matmul__(self, other):
        from ._layouts import DataRepresentation
        from . import _ops

        if isinstance(other, DataRepresentation):
            return other.__rmatmul__(self)
        if isinstance(other, EventRepresentation):
            return NotImplemented
        self._check_dense_product(other, events_left=True)
        if self.ndim == 1:
            return _ops.binary_densemv(other, self._value, transpose=True, weighted=self._weighted)
        return _ops.binary_densemm(other, self._value.T, transpose=True, weighted=self._weighted).T

    def __rmatmul__(self, other):
        from ._layouts import DataRepresentation
        from . import _ops

        if isinstance(other, DataRepresentation):
            return other.__matmul__(self)
        self._check_dense_product(other, events_left=False)
        fn = _ops.binary_densemv if self.ndim == 1 else _ops.binary_densemm
        return fn(other, self._value, transpose=False, weighted=self._weighted)


@register_pytree_with_keys_class
class BinaryArray(EventRepresentation):
    """Binary spikes: each non-zero element counts as 1 (the value itself is never multiplied in).

    Example::

        s = xlakern.BinaryArray(jnp.array([True, False, True]))
        s @ jnp.ones((3, 4))     # [2., 2., 2., 2.]
    """

    __module__ = "xlakern"

    def bitpack(self):
        """This array as a :class:`BitPackedBinary`."""
        return BitPackedBinary(self._value)


@register_pytree_with_keys_class
class WeightedArray(EventRepresentation):
    """Float events: zero elements are skipped, non-zero ones contribute their value.

    Example::

        xlakern.WeightedArray(jnp.array([0., 2.])) @ W   # 2 * W[1]
    """

    __module__ = "xlakern"
    _weighted = True

    def __init__(self, value: Any):
        super().__init__(value)
        dtype = getattr(self._value, "dtype", None)
        # the operators' own rule for spikes (_ops._spikes): anything but complex
        if dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
            raise EventDTypeError(f"WeightedArray values must be boolean, integer or floating-point; got {dtype} "
                                  f"(its values multiply the weights)")


def bitpack(arr, axis: int = 0):
    """Pack activity (non-zero) of ``arr`` into uint32 words along ``axis`` (bit b of word w is
    element ``32 * w + b``).

    Example::

        xlakern.bitpack(jnp.array([1, 0, 1]), axis=0)   # [5]
    """
    arr = as_array("bitpack", "arr", _raw(arr), quantity=False) != 0
    try:
        axis = operator.index(axis)
    except TypeError:
        raise EventShapeError(f"bitpack: axis must be an int; got {axis!r}") from None
    if not -arr.ndim <= axis < arr.ndim:  # (a 0-D array has no axis to pack)
        raise EventShapeError(f"bitpack: axis {axis} is outside an array of shape {tuple(arr.shape)}; pick one of "
                              f"its {arr.ndim} axes")
    axis %= arr.ndim
    n = arr.shape[axis]
    words = (n + 31) // 32
    pad = [(0, 0)] * arr.ndim
    pad[axis] = (0, words * 32 - n)
    bits = jnp.pad(arr, pad).astype(jnp.uint32)
    shape = list(bits.shape)
    shape[axis:axis + 1] = [words, 32]
    shifts = jnp.arange(32, dtype=jnp.uint32).reshape([32 if i == axis + 1 else 1 for i in range(len(shape))])
    return jnp.sum(bits.reshape(shape) << shifts, axis=axis + 1, dtype=jnp.uint32)


@register_pytree_with_keys_class
class BitPackedBinary(BinaryArray):
    """Binary spikes with their bit-packed form (``packed``: one uint32 array per axis).
    Products use the unpacked ``value``.

    Example::

        b = xlakern.BitPackedBinary(jnp.array([True, False, True]))
        b.packed[0]   # [5]
    """

    __module__ = "xlakern"

    @property
    def packed(self):
        return tuple(bitpack(self._value, a) for a in range(self.ndim))

    @property
    def original_shape(self) -> tuple:
        """The shape of the unpacked spikes."""
        return tuple(self.shape)

    def dot(self, other):
        """``self @ other``.

        Example::

            y = xlakern.BitPackedBinary(spikes).dot(W)
        """
        return self @ other


@register_pytree_with_keys_class
class CompactBinary(BinaryArray):
    """Binary spikes with the indices of active rows (``active_ids``, padded with the row count)
    and their count (``n_active``, shape (1,)). Products use ``value``. Built from the spikes alone
    (``CompactBinary(value)``, :meth:`from_array`) or, as in BrainEvent, from
    ``(packed, active_ids, n_active, value, n_orig, batch_size=None, bit_width=32)``, whose compaction is
    recomputed from ``value`` when asked for.

    Example::

        c = xlakern.CompactBinary.from_array(jnp.array([0, 1, 1, 0]))
        c.active_ids, c.n_active    # [1, 2, 4, 4], [2]
    """

    __module__ = "xlakern"

    def __init__(self, *args, **kwargs):
        # CompactBinary(value), or BrainEvent's CompactBinary(packed, active_ids, n_active, value, n_orig,
        # batch_size=None, bit_width=32), which from_packed checks against value
        if len(args) + len(kwargs) == 1 and set(kwargs) <= {"value"}:
            super().__init__(args[0] if args else kwargs["value"])
        else:
            super().__init__(type(self).from_packed(*args, **kwargs).value)

    @classmethod
    def from_array(cls, x, bit_width: int = 32, *, name: str = "CompactBinary.from_array"):
        if bit_width != 32:
            raise EventShapeError(f"{name}: bit_width must be 32; got {bit_width}")
        x = as_array(name, "x", _raw(x), quantity=False)
        if x.ndim not in (1, 2):
            raise EventShapeError(f"{name}: expected a 1-D or 2-D array; got shape {x.shape}")
        return cls(x)

    # BrainEvent's other constructors. Its kernels read the precomputed compaction; xlakern's read the
    # spikes, and active_ids / n_active / packed are computed from them when asked for, so these all
    # come down to from_array.
    @classmethod
    def from_array_light(cls, x, bit_width: int = 32):
        """:meth:`from_array` (BrainEvent defers the compaction here; xlakern always does)."""
        return cls.from_array(x, bit_width, name="CompactBinary.from_array_light")

    @classmethod
    def from_packed(cls, packed, active_ids, n_active, value, n_orig, batch_size=None, bit_width: int = 32):
        """From the spikes ``value`` (the precomputed ``packed``, ``active_ids`` and ``n_active`` are
        accepted and recomputed from ``value`` when needed)."""
        c = cls.from_array(value, bit_width, name="CompactBinary.from_packed")
        if c.shape[0] != n_orig or (c.ndim == 2) != (batch_size is not None) or \
                (batch_size is not None and c.shape[1] != batch_size):
            raise EventShapeError(f"CompactBinary.from_packed: value has shape {tuple(c.shape)}; expected "
                                  f"({n_orig},{'' if batch_size is None else f' {batch_size}'})")
        return c

    @classmethod
    def compacy_only_vector(cls, x):
        """A 1-D :class:`CompactBinary` (BrainEvent's name, spelling included)."""
        c = cls.from_array(x, name="CompactBinary.compacy_only_vector")
        if c.ndim != 1:
            raise EventShapeError(f"CompactBinary.compacy_only_vector: expected a 1-D array; got shape {c.shape}")
        return c

    @property
    def n_orig(self) -> int:
        """Rows of the spikes."""
        return int(self.shape[0])

    @property
    def batch_size(self):
        """Columns of 2-D spikes; None for a vector."""
        return int(self.shape[1]) if self.ndim == 2 else None

    @property
    def bit_width(self) -> int:
        return 32

    def to_dense(self):
        """The spikes as an array."""
        return self._value

    @property
    def _row_active(self):
        v = self._value != 0
        return v if v.ndim == 1 else v.any(axis=1)

    @property
    def active_ids(self):
        n = self.shape[0]
        return jnp.nonzero(self._row_active, size=n, fill_value=n)[0].astype(jnp.int32)

    @property
    def n_active(self):
        return jnp.sum(self._row_active, dtype=jnp.int32).reshape(1)

    @property
    def packed(self):
        return bitpack(self._value, self.ndim - 1)
