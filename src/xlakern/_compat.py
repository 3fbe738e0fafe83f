"""Workarounds for the library versions xlakern runs with, and every jax internal it reads.

NumPy 2.5 removed ``np.row_stack`` (an alias of ``np.vstack``), and numba-cuda 0.30.4 still
registers an overload for it when ``numba.cuda`` is imported, which then fails. Restoring the
alias before that import is harmless: it is the same function NumPy used to provide.

Every use of ``jax._src`` in xlakern goes through this module. Each function says which public
API it stands in for and the jax versions it was tested with (0.10.2 on the CPU, 0.11.2 on the
GPU machine); where jax could drop the internal, a fallback keeps xlakern working with less.

Example::

    >>> from xlakern import _compat
    >>> _compat.jax_backends_started()
    False
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # type: ignore[attr-defined]

from jax._src import config as _jax_config  # noqa: E402  (after the NumPy fix, which must come first)
from jax._src import core as _jax_core  # noqa: E402
from jax._src import dispatch as _jax_dispatch  # noqa: E402

try:  # the jax internals below have fallbacks: each may be missing from some jax
    from jax._src.interpreters import mlir as _jax_mlir
    from jax._src.lib.mlir import ir as _mlir_ir
except ImportError:  # pragma: no cover
    _jax_mlir = _mlir_ir = None
try:
    from jax._src.lib import xla_client as _xla_client
except ImportError:  # pragma: no cover
    _xla_client = None

# jax's tracer and abstract array types. Public as jax.core.Tracer / jax.core.ShapedArray in the
# versions tested, but jax keeps trimming jax.core (it deprecated get_aval in 0.10), so xlakern
# takes them from where jax defines them (jax._src.core, tested 0.10.2 and 0.11.2).
Tracer = _jax_core.Tracer
ShapedArray = _jax_core.ShapedArray


def get_aval(x: Any) -> Any:
    """The abstract value (shape, dtype, ...) of ``x``.

    Stands in for ``jax.typeof`` (public since jax 0.6; ``jax.core.get_aval`` is deprecated);
    ``jax._src.core.get_aval`` is what both call (tested 0.10.2, 0.11.2).
    """
    return _jax_core.get_aval(x)


def trace_state_clean() -> bool:
    """Whether no trace (jit, vmap, grad, ...) is active.

    jax has no public query; ``jax._src.core.trace_state_clean`` exists in jax 0.4.3x-0.11
    (tested 0.10.2, 0.11.2). Without it we answer True, and callers check eagerly only.
    """
    check = getattr(_jax_core, "trace_state_clean", None)
    return check is None or bool(check())


def eager_impl(primitive: Any) -> Callable[..., Any]:
    """The implementation that runs ``primitive`` outside a trace: compile it alone and run it.

    Stands in for the default a public ``jax.extend.core.Primitive`` does not have; every jax
    primitive uses ``jax._src.dispatch.apply_primitive`` (tested 0.10.2, 0.11.2).
    """
    return functools.partial(_jax_dispatch.apply_primitive, primitive)


def register_attribute_lowering(python_type: type, lower: Callable[[Any, Any], Any]) -> bool:
    """Lower FFI attributes of ``python_type`` with ``lower(value, ir)`` (``ir`` is jax's MLIR module).

    Stands in for a public way to add attribute types to ``jax.ffi.ffi_call``, which jax does not
    have; ``jax._src.interpreters.mlir.register_attribute_handler`` exists in jax 0.4.3x-0.11
    (tested 0.10.2, 0.11.2). Returns False where it is missing.
    """
    if _jax_mlir is None or not hasattr(_jax_mlir, "register_attribute_handler"):
        return False  # pragma: no cover
    _jax_mlir.register_attribute_handler(python_type, lambda value: lower(value, _mlir_ir))
    return True


def jit_keyed_state(name: str, help: str) -> Any:
    """A jax config state whose value is part of jit's cache key and of the trace context, or None.

    Stands in for nothing public: jax creates such states for its own options (``jax_enable_x64``)
    with ``jax._src.config.string_or_object_state(include_in_jit_key=True,
    include_in_trace_context=True)``, present with this signature in jax 0.4.3x-0.11 (tested
    0.10.2, 0.11.2). None where it is missing or refuses; the caller then clears jax's caches.
    """
    try:
        return _jax_config.string_or_object_state(name, default=None, help=help, include_in_jit_key=True,
                                                  include_in_trace_context=True)
    except Exception:  # pragma: no cover - a jax without this internal API
        return None


def command_buffer_traits() -> dict[str, Any]:
    """Keywords of ``jax.ffi.register_ffi_target`` that mark a target CUDA-graph (command buffer) safe.

    Stands in for the ``traits`` a handler bundle cannot report through the public API;
    ``jax._src.lib.xla_client.CustomCallTargetTraits`` exists in jax 0.4.3x-0.11 (tested 0.10.2,
    0.11.2). Empty where it is missing: graphs are an optimisation.
    """
    traits = getattr(_xla_client, "CustomCallTargetTraits", None)
    return {"traits": traits.COMMAND_BUFFER_COMPATIBLE} if traits is not None else {}


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
