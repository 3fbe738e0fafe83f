"""brainunit support without depending on it: quantities are split into (mantissa, unit) and the
result gets the product unit. brainunit is looked up only if the caller already imported it."""

from __future__ import annotations

import sys
from typing import Any


def _brainunit():
    return sys.modules.get("brainunit")


def is_quantity(x: Any) -> bool:
    bu = _brainunit()
    return bu is not None and isinstance(x, bu.Quantity)


def split(x: Any):
    """``(mantissa, unit or None)``."""
    if is_quantity(x):
        return x.mantissa, x.unit
    return x, None


def attach(value: Any, *units: Any):
    """``value`` carrying the product of ``units`` (None entries are unitless)."""
    real = [u for u in units if u is not None]
    if not real:
        return value
    bu = _brainunit()
    unit = real[0]
    for u in real[1:]:
        unit = unit * u
    return bu.maybe_decimal(bu.Quantity(value, unit=unit))
