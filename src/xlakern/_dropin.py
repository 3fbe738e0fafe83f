"""``install_as_brainevent()``: let libraries that ``import brainevent`` run on xlakern.

The pattern of PyMySQL's ``install_as_MySQLdb``: xlakern registers itself in ``sys.modules``
under the name ``brainevent``, so every later ``import brainevent`` (inside brainstate's
``EventFixedProb``/``EventLinear`` layers, brainpy networks, your own code) gets xlakern, whose
event operators carry BrainEvent 0.3's names.
"""

from __future__ import annotations

import sys

import xlakern  # the package itself, already being imported when this module is

from .errors import ConfigError

__all__ = ["install_as_brainevent"]


def install_as_brainevent(*, replace: bool = False) -> None:
    """Make ``import brainevent`` return xlakern in this process.

    Call it before anything imports ``brainevent`` (brainstate imports it when it is imported).
    If a real ``brainevent`` module is already loaded, modules that imported it keep it, so this
    raises :class:`xlakern.ConfigError` unless ``replace=True`` (then only later imports get
    xlakern). Calling it twice is harmless.

    Example::

        import xlakern
        xlakern.install_as_brainevent()
        import brainstate                      # its event layers now run xlakern's kernels
        layer = brainstate.nn.EventFixedProb(1000, 1000, conn_num=0.02, conn_weight=0.1)
    """
    current = sys.modules.get("brainevent")
    if current is xlakern:
        return
    if current is not None and not replace:
        raise ConfigError(
            f"brainevent is already imported (from {getattr(current, '__file__', '?')}), and modules that "
            "imported it keep using it. Call xlakern.install_as_brainevent() before importing brainevent or "
            "any library that uses it (brainstate, brainpy), or pass replace=True to redirect only later "
            "imports")
    sys.modules["brainevent"] = xlakern
