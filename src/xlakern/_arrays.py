"""What counts as an array description: the one "is this a ShapeDtypeStruct" check.

Wherever xlakern takes ``outs=`` (or an array whose shape and dtype are all it needs), it accepts
anything with a ``shape`` and a ``dtype``: a ``jax.ShapeDtypeStruct``, a JAX or NumPy array, a
tracer.

Example::

    >>> describes_array(jax.ShapeDtypeStruct((3,), jnp.float32)), describes_array([1, 2, 3])
    (True, False)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from .errors import CallError


def describes_array(x: Any) -> bool:
    """Whether ``x`` has a shape and a dtype (a ShapeDtypeStruct, an array, a tracer)."""
    return getattr(x, "shape", None) is not None and getattr(x, "dtype", None) is not None


def static_shape(shape: Any, what: Callable[[], str]) -> tuple[int, ...]:
    """``shape`` as Python ints; a symbolic dimension (``jax.export``'s shape polymorphism) is a
    :class:`CallError` naming ``what()`` (called only then: this runs on every call of a kernel), since
    a kernel's launch and its attributes are fixed per shape."""
    try:
        return tuple(map(int, shape))
    except Exception:  # jax's InconclusiveDimensionOperation, or any dimension int() refuses
        pass
    for d in shape:
        try:
            int(d)
        except Exception:
            shown = "(" + ", ".join(str(e) for e in shape) + ("," if len(shape) == 1 else "") + ")"
            raise CallError(f"{what()} has shape {shown}, with the symbolic dimension {d}: "
                            f"xlakern's kernels take static shapes. Export the program once for each size it "
                            f"runs at (concrete shapes), or keep this call out of the polymorphic part") from None
    raise AssertionError("unreachable")  # pragma: no cover


def as_struct(x: Any, what: Callable[[], str] = lambda: "an array") -> jax.ShapeDtypeStruct:
    """``x``'s shape and dtype as a ``jax.ShapeDtypeStruct`` of Python ints and a NumPy dtype
    (hashable and comparable, whatever kind of description ``x`` was); ``what()`` names it in errors."""
    return jax.ShapeDtypeStruct(static_shape(x.shape, what), np.dtype(x.dtype))
