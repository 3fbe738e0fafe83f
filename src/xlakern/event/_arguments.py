"""Reading a user's argument as an array, with an error that names the argument when jax cannot.

jax's own words for such a value ("None is not a valid value for jnp.array", "Value 'a' with dtype <U1
is not a valid JAX array type") name neither the call nor the argument. Both the operators (through
run_fused) and the constructors of spikes and layouts use these helpers.

Example::

    data = as_array("CSR", "data", data)   # a jax array, or the Quantity as given
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from . import _units
from ._errors import EventDTypeError


def refused_value(who: str, arg: str, value: Any) -> Optional[EventDTypeError]:
    """The EventDTypeError for a value no array can be made of (None, a string, bytes, a dict or set, a
    Python int wider than jax's integers: 32 bits, or 64 with jax_enable_x64); None for any other."""
    if value is None:
        return EventDTypeError(f"{who}: {arg} is None; expected an array")
    if isinstance(value, (str, bytes, dict, set)):
        return EventDTypeError(f"{who}: {arg} is a {type(value).__name__} ({value!r:.40}); expected a number or "
                               f"an array")
    if type(value) is int:
        bits = 64 if jax.config.jax_enable_x64 else 32
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return EventDTypeError(f"{who}: {arg} is the Python int {value}, wider than JAX's {bits}-bit integers; "
                                   f"pass a smaller number or an array")
    return None


def first_refused(who: str, named_values) -> Optional[EventDTypeError]:
    """refused_value for the first of ``(arg, value)`` pairs that no array can be made of; None if none."""
    for arg, value in named_values:
        refused = refused_value(who, arg, value)
        if refused is not None:
            return refused
    return None


def as_array(who: str, arg: str, value: Any, *, quantity: bool = True) -> Any:
    """``value`` as a jax array (a brainunit Quantity is returned as given when ``quantity``), or an
    EventDTypeError naming ``who``'s argument ``arg`` if it cannot be one."""
    if quantity and _units.is_quantity(value):
        return value
    refused = refused_value(who, arg, value)
    if refused is not None:
        raise refused
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:  # ragged lists, object arrays, other strings
        raise EventDTypeError(f"{who}: {arg} cannot be read as an array: {e}") from None
