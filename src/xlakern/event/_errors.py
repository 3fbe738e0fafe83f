"""Errors of xlakern.event: bad shapes, dtypes and units, each naming the argument and what it expects.

Example::

    try:
        xlakern.binary_csrmv(data, indices, indptr, spikes, shape=(3, 4))
    except xlakern.event.EventShapeError as e:
        print(e)   # "binary_csrmv: v has shape (5,); expected (4,) ..."
"""

from __future__ import annotations

from ..errors import XlakernError


class EventShapeError(XlakernError, ValueError):
    """An operand's shape does not fit the connectivity (the message names the argument and the shape expected)."""


class EventDTypeError(XlakernError, TypeError):
    """An operand has a dtype the operator does not take (e.g. float indices)."""


class EventUnitError(XlakernError, TypeError):
    """Operands' brainunit units do not combine (e.g. adding a quantity to a plain array)."""


class IndexConversionError(XlakernError, ValueError):
    """A structure conversion (csr_to_csc_index, coo2csr, ...) was given an unknown method or coordinates
    outside the shape."""
