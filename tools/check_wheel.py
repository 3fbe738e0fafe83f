"""Check a built xlakern wheel before publishing it: ``python tools/check_wheel.py dist/xlakern-*.whl``.

Fails (exit 1, naming each problem) unless the wheel is tagged manylinux, carries the
extension, the C++ headers, the event kernels' sources, ``py.typed`` and the Apache-2.0 LICENSE, and its metadata holds
the version of ``src/xlakern/_version.py`` and the extras ``numba``, ``cuda``, ``warp``, ``test``.
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = {"numba", "cuda", "warp", "test"}


def problems(wheel: Path) -> list[str]:
    found: list[str] = []
    if "manylinux" not in wheel.name:
        found.append(f"{wheel.name} is not tagged manylinux (run auditwheel repair)")
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/xlakern/_version.py").read_text()).group(1)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        meta = Parser().parsestr(z.read(meta_name).decode()) if meta_name else None
        licenses = [n for n in names if n.endswith("LICENSE") and ".dist-info/" in n]
        license_text = z.read(licenses[0]).decode() if licenses else ""
    if not any(re.fullmatch(r"xlakern/_runtime\.[^/]*\.so", n) for n in names):
        found.append("no xlakern/_runtime extension in the wheel")
    # the event operators compile their kernels from these sources on first use (every unit and header)
    kernel_sources = sorted(p.name for p in (ROOT / "src/xlakern/event/kernels").iterdir() if p.is_file())
    for name in kernel_sources:
        if f"xlakern/event/kernels/{name}" not in names:
            found.append(f"xlakern/event/kernels/{name} missing from the wheel (the event kernels' sources)")
    for required in ("xlakern/py.typed", "xlakern/include/xlakern/xlakern.h", "xlakern/_version.py"):
        if required not in names:
            found.append(f"{required} missing from the wheel")
    if "Apache License" not in license_text or "Version 2.0, January 2004" not in license_text:
        found.append("the wheel carries no Apache-2.0 LICENSE in its .dist-info")
    if meta is None:
        found.append("no METADATA in the wheel")
    else:
        if meta["Version"] != version:
            found.append(f"metadata version {meta['Version']} != _version.py's {version}")
        missing = EXTRAS - set(meta.get_all("Provides-Extra") or [])
        if missing:
            found.append(f"extras missing from the metadata: {', '.join(sorted(missing))}")
    return found


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    bad = 0
    for p in paths:
        issues = problems(Path(p))
        for issue in issues:
            print(f"{p}: {issue}", file=sys.stderr)
        bad += bool(issues)
        if not issues:
            print(f"{p}: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
