"""Warp helpers: JAX dtypes and ShapeDtypeStructs as Warp types, for ``def_warp_kernel`` generators.

Warp is optional: nothing here imports it until a helper is called or a Warp backend is
chosen, and then its absence is reported as :class:`WarpNotInstalledError`.

Example::

    import warp, xlakern

    def gen(outs, **kw):
        t = xlakern.jaxinfo_to_warpinfo(outs[0])       # warp.array(dtype=warp.float32, ndim=1)

        @warp.kernel
        def double(x: t, out: t):
            i = warp.tid()
            out[i] = x[i] * t.dtype(2.0)

        return warp.jax_kernel(double, launch_dims=[outs[0].shape[0]])
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The errors live in errors.py; importable from here too, where they were first defined.
from ._arrays import describes_array
from ._dtypes import WARP_SCALARS  # numpy dtype name -> Warp scalar name (no bfloat16, no complex)
from .errors import WarpNotInstalledError, WarpTypeError

__all__ = ["jaxtype_to_warptype", "jaxinfo_to_warpinfo", "WarpNotInstalledError", "WarpTypeError",
           "require_warp"]


def require_warp() -> Any:
    """The ``warp`` module, or :class:`WarpNotInstalledError` saying how to get it."""
    try:
        import warp
    except ImportError as e:
        raise WarpNotInstalledError(
            f"Warp is not installed ({e}); install it with `pip install warp-lang`") from None
    return warp


def jaxtype_to_warptype(dtype: Any) -> Any:
    """The Warp scalar type of a JAX / NumPy dtype (``jnp.float32`` -> ``warp.float32``).

    Raises :class:`WarpTypeError` (a ValueError) for bfloat16 and complex dtypes, which Warp
    has no scalar type for.

    Example::

        >>> xlakern.jaxtype_to_warptype(jnp.int32)
        <class 'warp.types.int32'>
    """
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(getattr(dtype, "name", dtype))
    if name not in WARP_SCALARS:
        hint = ("Warp has no bfloat16; compute in float32 (x.astype(jnp.float32)) around the kernel"
                if name == "bfloat16" else
                "Warp has no complex scalars; pass real and imaginary parts as two float arrays"
                if name.startswith("complex") else
                f"supported: {', '.join(WARP_SCALARS)}")
        raise WarpTypeError(f"dtype {name} cannot be a Warp array element: {hint}")
    warp = require_warp()
    return getattr(warp, WARP_SCALARS[name])


def jaxinfo_to_warpinfo(jax_info: Any) -> Any:
    """The Warp array type of a ``jax.ShapeDtypeStruct`` (or any object with shape and dtype):
    ``warp.array(dtype=<scalar>, ndim=len(shape))``, usable as a ``@warp.kernel`` annotation;
    its ``.dtype`` is the Warp scalar type.

    Raises :class:`WarpTypeError` for 0-d shapes (Warp arrays have at least one dimension:
    describe a scalar as shape ``(1,)``) and unsupported dtypes.

    Example::

        t = xlakern.jaxinfo_to_warpinfo(jax.ShapeDtypeStruct((n,), jnp.float32))
        t.dtype      # warp.float32
        t.ndim       # 1
    """
    if not describes_array(jax_info):
        raise WarpTypeError(f"jaxinfo_to_warpinfo needs a jax.ShapeDtypeStruct (shape and dtype); "
                            f"got {type(jax_info).__name__}")
    shape, dtype = jax_info.shape, jax_info.dtype
    if len(shape) == 0:
        raise WarpTypeError("a 0-d array cannot be a Warp array (Warp arrays have 1 to 4 dimensions); "
                            "describe the scalar as shape (1,) and index it with [0]")
    if len(shape) > 4:
        raise WarpTypeError(f"Warp arrays have at most 4 dimensions; got shape {tuple(shape)}")
    scalar = jaxtype_to_warptype(dtype)
    warp = require_warp()
    return warp.array(dtype=scalar, ndim=len(shape))

