#!/usr/bin/env python3
"""Run a BrainEvent tutorial notebook on xlakern, cell by cell, as a reader would.

Usage::

    python tools/run_tutorial.py path/to/04_cpp.ipynb [more.ipynb ...]

The seed-fidelity audit (issue 10): BrainEvent's custom-operator tutorials must run to their end with
``import brainevent`` pointed at xlakern and nothing else changed. This tool does not carry their
code: give it the notebooks (from BrainEvent's repository, ``docs/tutorials/custom-operators/``).

For each notebook, every code cell runs in order in one namespace, after ``sys.modules["brainevent"]``
is made xlakern (so the cells' own ``import brainevent`` / ``from brainevent import ...`` lines run
unchanged). Shell and magic lines (``!pip ...``, ``%timeit``) are skipped, as outside Jupyter.
Printed output is checked: a line that names an error or a difference followed by a number must show
at most 1e-4, and no line may print ``False`` where a check is printed (``allclose``, ``match``,
``equal``, ``correct``). The report lists each cell, its output and the verdict; the exit status is
0 when every notebook ran to its end with every check passing.
"""

from __future__ import annotations

import contextlib
import io
import json
import linecache
import re
import sys
import traceback
from pathlib import Path

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
ERROR_LINE = re.compile(r"(error|diff|deviation)[^=:\n]*[=:]\s*(" + NUMBER + ")", re.IGNORECASE)
CHECK_WORDS = ("allclose", "match", "equal", "correct", "same", "close")


def code_cells(path: Path) -> list[str]:
    """The notebook's code cells, with shell/magic lines removed."""
    nb = json.loads(path.read_text())
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell.get("source", []))
        kept = [line for line in src.splitlines() if not line.lstrip().startswith(("!", "%"))]
        cells.append("\n".join(kept))
    return cells


def output_problems(text: str) -> list[str]:
    """What the printed output says went wrong: errors above 1e-4, checks printing False."""
    problems = []
    for line in text.splitlines():
        for m in ERROR_LINE.finditer(line):
            if abs(float(m.group(2))) > 1e-4:
                problems.append(f"error above 1e-4: {line.strip()}")
        low = line.lower()
        if "false" in low and any(w in low for w in CHECK_WORDS):
            problems.append(f"a check printed False: {line.strip()}")
    return problems


def run_notebook(path: Path) -> bool:
    import xlakern

    sys.modules["brainevent"] = xlakern  # the cells' own imports now load xlakern
    namespace: dict = {"__name__": "__main__"}
    print(f"# {path.name}")
    ok = True
    for k, src in enumerate(code_cells(path), 1):
        buf = io.StringIO()
        filename = f"<{path.stem}-cell-{k}>"
        # As IPython does: the cell's text is findable by its file name, so inspect.getsource
        # works on functions defined in it (Numba and xlakern read kernels' sources).
        linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(src, filename, "exec"), namespace)
        except Exception:  # noqa: BLE001 -- the report says which cell stopped the notebook
            print(f"## cell {k}: STOPPED\n{buf.getvalue()}{traceback.format_exc(limit=4)}")
            return False
        out = buf.getvalue()
        problems = output_problems(out)
        ok = ok and not problems
        shown = out if len(out) < 2000 else out[:2000] + "\n[... output cut ...]"
        print(f"## cell {k}: {'ok' if not problems else 'CHECK FAILED'}\n{shown}", end="")
        for p in problems:
            print(f"   !! {p}")
    print(f"# {path.name}: {'ran to its end, every check passed' if ok else 'ran to its end, a check failed'}\n")
    return ok


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    results = {p: run_notebook(Path(p)) for p in argv}
    for p, ok in results.items():
        print(f"{'PASS' if ok else 'FAIL'}  {p}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
