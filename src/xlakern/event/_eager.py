"""One compiled program for an operator called outside any trace.

An operator's Python side (checks, dtype casts, the seed as a uint32 array, its tables) is made of jnp
calls. Outside ``jit`` each of them is its own XLA program, compiled on first use: the first eager JITC
product compiled eleven, about 30-40 ms each on a GPU, before its kernel's. ``run_fused`` traces the
whole operator once under ``jax.jit`` instead, and caches it like any jitted function. Inside a trace
(``jit``, ``grad``, ``vmap``) the operator runs as it is: the outer trace already fuses it.

Example::

    y = run_fused(_product_body, (weight, None, vector, seed), dict(name="jitsmv", letter="s", ...))
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from .._compat import Tracer
from ..errors import XlakernError

# Values jit takes as they are; anything else (a list, a string, an object) goes the plain way, so the
# operator's own check names it.
_PLAIN = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _concrete(leaf: Any) -> bool:
    return isinstance(leaf, _PLAIN) and not isinstance(leaf, Tracer)


@functools.lru_cache(maxsize=None)
def _jitted(impl: Callable, static_names: tuple) -> Callable:
    return jax.jit(impl, static_argnames=static_names)


def run_fused(impl: Callable, dynamic: tuple, static: dict) -> Any:
    """``impl(*dynamic, **static)``, as one jitted program when every leaf of ``dynamic`` is a concrete
    array or number and ``static`` hashes (its values are jit's static arguments). An xlakern error
    raised while tracing it comes from the plain call instead."""
    if not all(_concrete(leaf) for leaf in jax.tree_util.tree_leaves(dynamic)):
        return impl(*dynamic, **static)
    try:
        hash(tuple(static.values()))
    except TypeError:
        return impl(*dynamic, **static)
    try:
        return _jitted(impl, tuple(sorted(static)))(*dynamic, **static)
    except XlakernError:
        # Raised again by the plain call, as it always was: without the note jax adds to an error
        # that crossed jit (and were some check to need concrete values, the plain call answers).
        return impl(*dynamic, **static)
