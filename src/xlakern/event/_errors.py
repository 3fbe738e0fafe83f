"""Errors of xlakern.event: bad shapes, dtypes and units, each naming the argument and what it expects.

Example::

    try:
        xlakern.binary_csrmv(data, indices, indptr, spikes, shape=(3, 4))
    except xlakern.event.EventShapeError as e:
        print(e)   # "binary_csrmv: v has shape (5,); expected (4,) ..."
"""

from __future__ import annotations

from ..errors import MathError, UnsupportedOperationError, XlakernError

# UnsupportedOperationError (a method a layout deliberately refuses, e.g. a plasticity update on a JITC
# matrix, which stores no per-synapse weight) is xlakern's, defined with the other errors.
__all__ = ["EventShapeError", "EventMatmulError", "EventNDimError", "EventArgumentError", "EventTracedError",
           "EventIndexError", "EventDTypeError", "EventUnitError", "EventOperandError", "EventRuleError", "IndexConversionError",
           "EventDependencyError", "EventBufferError", "UnsupportedOperationError"]


class EventShapeError(XlakernError, ValueError):
    """An operand's shape does not fit the connectivity (the message names the argument and the shape expected)."""


class EventMatmulError(EventShapeError, MathError):
    """An event array multiplied with an operand it cannot multiply: events that are not 1-D or 2-D, a
    matrix that is not 2-D, or inner dimensions that differ. Also a ``MathError``, which BrainEvent 0.3
    raises there, so code that catches that keeps working.

    Example::

        try:
            y = xlakern.BinaryArray(s) @ W
        except xlakern.MathError:   # also xlakern.event.EventMatmulError
            ...
    """


class EventNDimError(EventMatmulError, UnsupportedOperationError):
    """A product with an operand of more than two dimensions (or a 0-D event array): a matrix product
    takes vectors and matrices only. Also a ``MathError`` and a ``NotImplementedError``, the two errors
    BrainEvent 0.3 raises there (the first for an event array times a dense matrix, the second for a
    ``Dense`` times a 3-D operand), so code that catches either keeps working.

    Example::

        try:
            y = W @ xlakern.BinaryArray(spikes_3d)
        except NotImplementedError:   # also xlakern.MathError and xlakern.event.EventNDimError
            y = jnp.stack([W @ xlakern.BinaryArray(s) for s in spikes_3d])
    """


class EventArgumentError(XlakernError, ValueError):
    """Arguments that contradict each other (e.g. ``weighted=False`` with a :class:`WeightedArray`).

    Example::

        try:
            ring = xlakern.csr_delay_deliver(ring, xlakern.WeightedArray(x), w, idx, ptr, d, t, shape=s,
                                             weighted=False)
        except ValueError:   # also xlakern.event.EventArgumentError
            ...
    """


class EventTracedError(EventShapeError, TypeError):
    """A value that decides an output's structure (a synapse count, a layout) was traced under ``jit``:
    it must be known when the call is traced. Also a ``TypeError``, as JAX's own concretization error
    and BrainEvent 0.3 have it.

    Example::

        try:
            sub = jax.jit(lambda r: W.slice_rows(r))(rows)      # CSR rows decide the synapse count
        except xlakern.event.EventTracedError:
            sub = W.slice_rows(np.asarray(rows))
    """


class EventIndexError(EventShapeError, IndexError):
    """A row selector outside the matrix (``W[i]`` with ``i`` out of range) or not of integers. An
    ``IndexError`` too, so ``for row in W`` stops at the last row.

    Example::

        try:
            row = W[1000]
        except IndexError:   # also xlakern.event.EventIndexError
            row = None
    """


class EventDTypeError(XlakernError, TypeError):
    """An operand has a dtype the operator does not take (e.g. float indices)."""


class EventUnitError(XlakernError, TypeError):
    """Operands' brainunit units do not combine (e.g. adding a quantity to a plain array)."""


class EventOperandError(XlakernError, TypeError):
    """An operand of a kind the operation does not take: an array where only a scalar scales a layout, a
    string or None where a matrix goes, the wrong number of arrays for a layout. Also a ``TypeError``, as
    Python raises for an unsupported operand.

    Example::

        try:
            W * np.ones(3)   # W a CSR: * scales its weights by a scalar
        except xlakern.event.EventOperandError as e:
            print(e)   # "CSR * supports scalars only (it scales the weights); got ndarray. ..."
    """


class EventRuleError(XlakernError, TypeError):
    """A plasticity rule (``csr_apply_on_pre/post``) returned a state of another pytree structure than the
    state it was given. Also a ``TypeError``, as BrainEvent 0.3 raises there.

    Example::

        try:
            new = xlakern.csr_apply_on_pre(lambda e, pre, post, p: e["w"], {"w": w}, idx, ptr, s, shape=shape)
        except TypeError:   # also xlakern.event.EventRuleError
            ...
    """


class IndexConversionError(XlakernError, ValueError):
    """A structure conversion (csr_to_csc_index, coo2csr, ...) was given an unknown method or coordinates
    outside the shape."""


class EventDependencyError(XlakernError, ImportError):
    """An optional package a method needs is not installed (e.g. brainunit for ``tocoo()``).

    Example::

        try:
            coo = W.tocoo()
        except xlakern.event.EventDependencyError:
            coo = None   # pip install brainunit
    """


class EventBufferError(XlakernError, ValueError):
    """A layout buffer name that is not registered, or that would shadow one of the layout's own attributes.

    Example::

        W.register_buffer("delays", d)
        W.set_buffer("delays", d + 1)     # fine; set_buffer("other", x) raises EventBufferError
    """
