"""Workarounds for the library versions xlakern runs with, applied once on import.

NumPy 2.5 removed ``np.row_stack`` (an alias of ``np.vstack``), and numba-cuda 0.30.4 still
registers an overload for it when ``numba.cuda`` is imported, which then fails. Restoring the
alias before that import is harmless: it is the same function NumPy used to provide.

It also holds the jax internals xlakern reads, each with the public API it stands in for.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # type: ignore[attr-defined]


def jax_backends_started() -> bool:
    """Whether JAX has created its backends (after which XLA_FLAGS changes have no effect).

    Stands in for a public "are backends initialised" query, which jax does not have;
    ``jax._src.xla_bridge.backends_are_initialized`` exists in jax 0.4.3x-0.11 (tested 0.10.2,
    0.11.2). Without it we answer False, and XLA silently keeps the flags it started with.
    """
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover
        return False
    probe = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(probe()) if probe is not None else False
