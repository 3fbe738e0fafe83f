"""What counts as an array description: the one "is this a ShapeDtypeStruct" check.

Wherever xlakern takes ``outs=`` (or an array whose shape and dtype are all it needs), it accepts
anything with a ``shape`` and a ``dtype``: a ``jax.ShapeDtypeStruct``, a JAX or NumPy array, a
tracer.

Example::

    >>> describes_array(jax.ShapeDtypeStruct((3,), jnp.float32)), describes_array([1, 2, 3])
    (True, False)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def describes_array(x: Any) -> bool:
    """Whether ``x`` has a shape and a dtype (a ShapeDtypeStruct, an array, a tracer)."""
    return getattr(x, "shape", None) is not None and getattr(x, "dtype", None) is not None


def as_struct(x: Any) -> jax.ShapeDtypeStruct:
    """``x``'s shape and dtype as a ``jax.ShapeDtypeStruct`` of Python ints and a NumPy dtype
    (hashable and comparable, whatever kind of description ``x`` was)."""
    return jax.ShapeDtypeStruct(tuple(int(d) for d in x.shape), np.dtype(x.dtype))
