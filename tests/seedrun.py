"""Runs seed tutorial code cells verbatim, as a notebook would (helpers for tests/test_seed_*.py).

Cells execute in one namespace (the notebook's globals). The only change to their text is that
``brainevent`` names xlakern. Each cell gets a file name in ``linecache`` (as IPython does), so
``inspect.getsource`` finds the kernels it defines.
"""

from __future__ import annotations

import linecache
import re


def as_xlakern(code: str) -> str:
    """The only change to seed code: ``brainevent`` is xlakern."""
    code = code.replace("from brainevent import ", "from xlakern import ")
    return re.sub(r"^(\s*)import brainevent$", r"\1import xlakern as brainevent", code, flags=re.M)


def run_cell(namespace: dict, cells: dict, name: str, seed: str, code: str | None = None) -> None:
    """Execute cell `name` (or `code`, a part of it) in the notebook namespace."""
    source = as_xlakern(cells[name] if code is None else code)
    filename = f"<seed-{seed} cell {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)


def printed_checks(text: str) -> tuple[list[float], list[str]]:
    """The errors (numbers after '... error...:') and booleans a cell printed."""
    errors = [float(m) for m in re.findall(r"error[^:\n]*:\s*([-+0-9.eE]+)", text)]
    flags = re.findall(r":\s*(True|False)\s*$", text, flags=re.M)
    return errors, flags


def assert_printed_checks_pass(printed: str, expect_errors: int = 0, expect_flags: int = 0) -> None:
    """Every printed error is at most 1e-4 and every printed boolean is True."""
    errors, flags = printed_checks(printed)
    assert len(errors) >= expect_errors and len(flags) >= expect_flags, printed
    assert all(e <= 1e-4 for e in errors), printed
    assert all(f == "True" for f in flags), printed
