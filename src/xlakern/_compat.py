"""Workarounds for the library versions xlakern runs with, applied once on import.

NumPy 2.5 removed ``np.row_stack`` (an alias of ``np.vstack``), and numba-cuda 0.30.4 still
registers an overload for it when ``numba.cuda`` is imported, which then fails. Restoring the
alias before that import is harmless: it is the same function NumPy used to provide.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # type: ignore[attr-defined]
