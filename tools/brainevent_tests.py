#!/usr/bin/env python3
"""Run BrainEvent 0.3.0's own test files against xlakern, to find what code written for BrainEvent meets.

Usage::

    pip install --no-deps --target /tmp/be brainevent==0.3.0      # its package, tests included
    python tools/brainevent_tests.py /tmp/be/brainevent _csr/main_test.py _fcn/main_test.py [pytest args]

The test files stay BrainEvent's (nothing is copied into this repository). They are copied to a temp
directory and run with a stand-in ``brainevent`` package first on the path: its namespace is
xlakern's public one, and its submodules are BrainEvent's own files, so ``brainevent.CSR`` is
xlakern's while ``from brainevent._test_util import ...`` still finds BrainEvent's test helpers.

Read the failures with care: tests that import BrainEvent's private modules (``brainevent._csr.binary``
and the like) exercise BrainEvent itself, and many tests pin BrainEvent's internals (its workspaces,
weight indices, backend list, JITC generator) that xlakern deliberately does not have. Tests written
against the public names are the ones that tell of a gap. Some files need brainstate, braintools
(and optax, matplotlib) importable too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

STAND_IN = '''\
import xlakern as _xk
for _name in dir(_xk):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_xk, _name)
__all__ = list(getattr(_xk, "__all__", []))


def __getattr__(name):  # names xlakern resolves lazily (BrainEvent's deprecated and retired ones)
    return getattr(_xk, name)


__path__ = [{package!r}]  # submodules: BrainEvent's own files
__version__ = "0.3.0"
'''


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    package = Path(argv[0]).resolve()
    if not (package / "__init__.py").is_file():
        print(f"{package} is not a brainevent package directory (no __init__.py)")
        return 2
    files = [a for a in argv[1:] if a.endswith(".py")]
    pytest_args = [a for a in argv[1:] if not a.endswith(".py")]
    with tempfile.TemporaryDirectory(prefix="be_tests_") as tmp:
        root = Path(tmp)
        (root / "stand_in" / "brainevent").mkdir(parents=True)
        (root / "stand_in" / "brainevent" / "__init__.py").write_text(STAND_IN.format(package=str(package)))
        copied = []
        for rel in files:
            src = package / rel
            if not src.is_file():
                print(f"no test file {src}")
                return 2
            dst = root / ("be_" + rel.replace("/", "_"))  # flat, unique module names
            shutil.copy(src, dst)
            copied.append(str(dst))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(root / "stand_in")] + env.get("PYTHONPATH", "").split(os.pathsep))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", "-rf",
               "--tb=line", *pytest_args, *copied]
        return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
