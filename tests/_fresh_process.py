"""Run a script twice in fresh processes: once to build (and cache) what it uses, then with every way of
starting a subprocess refused, so a compiler started on the second run fails it."""

from __future__ import annotations

import os
import subprocess
import sys

_FORBID = r"""
import subprocess as _sp
def _refuse(*a, **k):
    raise AssertionError(f"a compiler was started: {a[:1]}")
_sp.Popen = _sp.run = _sp.check_output = _sp.call = _refuse
"""


def build_then_forbid(script: str, tmp_path, *, build_timeout: int = 900, timeout: int = 300) -> tuple[str, str]:
    """(stdout of the building run, stdout of the run that may start no subprocess); both must succeed.
    The processes see only the CPU (JAX_PLATFORMS=cpu)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    outs = []
    for name, text, limit in (("build", script, build_timeout), ("forbid", _FORBID + script, timeout)):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        res = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=limit)
        assert res.returncode == 0, (name, res.stderr[-3000:])
        outs.append(res.stdout)
    return outs[0], outs[1]
