"""Every XLACustomKernel made in this process, by name, with the tags it was given.

XLACustomKernel adds itself here when it is made, so tools (and code written for BrainEvent, whose
names these are) can list the operators that exist and pick them by tag. A later kernel of the same
name replaces the earlier one here (the earlier stays usable: JAX still holds its primitive).

Example::

    import xlakern
    xlakern.binary_csrmv_p                       # makes the event operators
    sorted(xlakern.get_primitives_by_tags({"csr", "binary", "mv"}))  # ['binary_csrmv', 'binary_csrmv_indexed']
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterable

from .errors import XlakernError

if TYPE_CHECKING:
    from ._primitive import XLACustomKernel

_lock = threading.Lock()
_kernels: dict[str, "XLACustomKernel"] = {}


def add(kernel: "XLACustomKernel") -> None:
    """Record ``kernel`` under its name (called by XLACustomKernel itself)."""
    with _lock:
        _kernels[kernel.name] = kernel


def get_registry() -> dict[str, "XLACustomKernel"]:
    """A copy of ``{name: XLACustomKernel}`` for every custom kernel made in this process.

    Example::

        ops = xlakern.get_registry()
        print(ops["binary_csrmv"].available_backends("cpu"))
    """
    with _lock:
        return dict(_kernels)


def get_primitives_by_tags(tags: Iterable[str]) -> dict[str, "XLACustomKernel"]:
    """The kernels whose tags include every one of ``tags`` (see :meth:`XLACustomKernel.def_tags`).

    Example::

        xlakern.get_primitives_by_tags({"jitc", "mv"})
    """
    if isinstance(tags, str):
        tags = {tags}
    try:
        wanted = set(tags)
    except TypeError:
        raise XlakernError(f"get_primitives_by_tags: tags must be a tag or an iterable of tags; got "
                           f"{type(tags).__name__}") from None
    with _lock:
        return {name: k for name, k in _kernels.items() if wanted <= k.tags}


def get_all_primitive_names() -> list[str]:
    """Sorted names of every custom kernel made in this process.

    Example::

        "binary_csrmv" in xlakern.get_all_primitive_names()
    """
    with _lock:
        return sorted(_kernels)


__all__ = ["get_registry", "get_primitives_by_tags", "get_all_primitive_names"]
