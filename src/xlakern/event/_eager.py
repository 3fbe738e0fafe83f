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

import collections
import contextlib
import functools
import inspect
import logging
import threading
from typing import Any, Callable, Iterator

import jax
import numpy as np

from .._compat import Tracer, jit_placement_key, trace_state_clean
from ..errors import XlakernError
from ._arguments import first_refused
from ._errors import EventDTypeError

# Values jit takes as they are; anything else (a list, a string, an object) goes the plain way, so the
# operator's own check names it.
_PLAIN = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _concrete(leaf: Any) -> bool:
    return isinstance(leaf, _PLAIN) and not isinstance(leaf, Tracer)


# Python numbers given to an operator (plasticity's bounds, a shared weight, a delay's step) as the weak-typed
# arrays jit would make of them, kept for the next call: jit copies a Python number to the device on every
# call (on a GPU, a host-to-device transfer), where a kept array costs nothing. A bounded LRU, since a
# number that changes each call (a step counter) would otherwise fill it.
_NUMBERS: "collections.OrderedDict[tuple, jax.Array]" = collections.OrderedDict()
_NUMBERS_KEPT = 256
_numbers_lock = threading.Lock()


def _kept_number(x: Any) -> Any:
    kind = type(x)
    if kind not in (bool, int, float) or not trace_state_clean():
        return x
    key = (kind, x.hex() if kind is float else x, jit_placement_key())  # hex: -0.0 is not 0.0
    with _numbers_lock:
        arr = _NUMBERS.get(key)
        if arr is not None:
            _NUMBERS.move_to_end(key)
            return arr
    try:
        arr = jax.device_put(x)  # weak-typed, as jit takes a Python number: the same program
    except (OverflowError, TypeError):
        return x  # (an int too wide for 32 bits: jit's own error, from the call)
    with _numbers_lock:
        _NUMBERS[key] = arr
        while len(_NUMBERS) > _NUMBERS_KEPT:
            _NUMBERS.popitem(last=False)
    return arr


@functools.lru_cache(maxsize=None)
def _jitted(impl: Callable, static_names: tuple) -> Callable:
    return jax.jit(impl, static_argnames=static_names)


def run_fused(impl: Callable, dynamic: tuple, static: dict) -> Any:
    """``impl(*dynamic, **static)``, as one jitted program when every leaf of ``dynamic`` is a concrete
    array or number and ``static`` hashes (its values are jit's static arguments). An xlakern error
    raised while tracing it comes from the plain call instead. An argument jax cannot take (None where the
    operator needs an array, a string, a Python int wider than jit's integers) is an EventDTypeError naming
    it, not jax's error, which names neither the operator nor the argument."""
    try:
        return _run(impl, dynamic, static)
    except XlakernError:
        raise
    except (OverflowError, TypeError, ValueError) as e:
        bad = _unreadable_argument(impl, dynamic, static, e)
        if bad is None:
            raise
        raise bad from e


def optional_arguments(*names: str) -> Callable:
    """Marks the arguments of an operator's body that may be None (a permutation, a fixed-count layout's
    indptr), so that run_fused names only the others when jax refuses a None."""
    def mark(impl: Callable) -> Callable:
        impl.optional_arguments = names
        return impl
    return mark


def _unreadable_argument(impl: Callable, dynamic: tuple, static: dict, error: Exception) -> Any:
    """An EventDTypeError for the argument of ``impl`` that jax could not read (see refused_value; a None
    only where the operator needs an array and jax said so), else None."""
    name = static.get("name", impl.__name__)
    params = list(inspect.signature(impl).parameters)
    if isinstance(error, ValueError) and "None is not a valid value" in str(error):  # jax's words for None
        optional = getattr(impl, "optional_arguments", ())
        nones = [arg for arg, value in zip(params, dynamic) if value is None and arg not in optional]
        if nones:
            return EventDTypeError(f"{name}: {' and '.join(nones)} {'is' if len(nones) == 1 else 'are'} None; "
                                   f"expected an array")
    return first_refused(name, ((arg, value) for arg, value in zip(params, dynamic) if value is not None))


def _run(impl: Callable, dynamic: tuple, static: dict) -> Any:
    if not all(_concrete(leaf) for leaf in jax.tree_util.tree_leaves(dynamic)):
        return impl(*dynamic, **static)
    try:
        hash(tuple(static.values()))
    except TypeError:
        return impl(*dynamic, **static)
    try:
        return _jitted(impl, tuple(sorted(static)))(*jax.tree_util.tree_map(_kept_number, dynamic), **static)
    except XlakernError:
        # Raised again by the plain call, as it always was: without the note jax adds to an error
        # that crossed jit (and were some check to need concrete values, the plain call answers).
        return impl(*dynamic, **static)


@contextlib.contextmanager
def compiled_programs() -> Iterator[list]:
    """The names of the XLA programs jax compiles inside the block (``jax.log_compiles``' records), in a
    list that fills while the block runs: how the tests and ``bench/bench_eager.py`` count an eager
    call's programs.

    Example::

        with compiled_programs() as names:
            xlakern.binary_csrmv(data, indices, indptr, spikes, shape=shape)
        assert len(names) <= 1
    """
    names: list = []

    class Log(logging.Handler):
        def emit(self, record):
            text = record.getMessage()
            if text.startswith("Compiling "):
                names.append(text.split()[1])

    handler, logger = Log(logging.DEBUG), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield names
    finally:
        logger.removeHandler(handler)
