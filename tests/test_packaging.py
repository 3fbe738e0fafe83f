"""Publishable packaging (issue 13, Deliver 6): license, typing marker, extras, one version,
builds outside the source tree, and the wheel checker CI runs after ``auditwheel repair``.

(CI's ``make docs`` and ``make wheel`` build the API reference with warnings as errors and a
manylinux wheel; these tests cover what an installed package and the source tree must hold.)
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from importlib import metadata, resources
from pathlib import Path

import pytest

import xlakern

ROOT = Path(__file__).resolve().parent.parent
# SHA-256 of the Apache License 2.0 text as the ASF publishes it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_is_the_apache_2_text():
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
    assert _pyproject()["project"]["license"] == {"text": "Apache-2.0"}


def test_installed_package_is_typed_and_versioned_from_one_source():
    assert resources.files("xlakern").joinpath("py.typed").is_file()
    source = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/xlakern/_version.py").read_text()).group(1)
    assert xlakern.__version__ == source
    assert metadata.version("xlakern") == source
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert _pyproject()["tool"]["scikit-build"]["metadata"]["version"]["input"] == "src/xlakern/_version.py"


def test_extras_are_declared():
    extras = set(metadata.metadata("xlakern").get_all("Provides-Extra") or [])
    assert {"numba", "cuda", "warp", "test"} <= extras
    requires = metadata.requires("xlakern") or []
    for extra, dist in [("numba", "numba"), ("cuda", "numba-cuda"), ("warp", "warp-lang"), ("test", "pytest")]:
        assert any(r.startswith(dist) and f'extra == "{extra}"' in r for r in requires), (extra, requires)


def test_build_trees_are_outside_the_source_tree():
    assert "build-dir" not in _pyproject()["tool"]["scikit-build"]  # pip builds in a temp dir
    dry = subprocess.run(["make", "-n", "-W", "requirements-dev.txt", "install", "cpp-test", "VENV=.venv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    build_dirs = re.findall(r"-Cbuild-dir=(\S+)", dry.stdout) + re.findall(r"-B (\S+)", dry.stdout)
    assert len(build_dirs) == 2, dry.stdout
    for d in build_dirs:
        path = Path(d.replace("{wheel_tag}", "tag")).resolve()
        assert ROOT not in path.parents and path != ROOT, d


def _fake_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_wheel_checker_names_what_a_wheel_lacks(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_wheel
    finally:
        sys.path.pop(0)
    meta = "Metadata-Version: 2.1\nName: xlakern\nVersion: 9.9.9\nProvides-Extra: numba\n\n"
    bad = _fake_wheel(tmp_path / "xlakern-9.9.9-cp311-cp311-linux_x86_64.whl",
                      {"xlakern/__init__.py": "", "xlakern-9.9.9.dist-info/METADATA": meta})
    found = "\n".join(check_wheel.problems(bad))
    for expected in ("not tagged manylinux", "_runtime extension", "py.typed", "LICENSE",
                     f"!= _version.py's {xlakern.__version__}", "extras missing from the metadata: cuda, test, warp",
                     "xlakern/event/kernels/jitc_cuda.cuh missing", "xlakern/event/kernels/event_cpu.cc missing"):
        assert expected in found, (expected, found)
    good_meta = (f"Metadata-Version: 2.1\nName: xlakern\nVersion: {xlakern.__version__}\n"
                 + "".join(f"Provides-Extra: {e}\n" for e in ("numba", "cuda", "warp", "test")) + "\n")
    good = _fake_wheel(tmp_path / f"xlakern-{xlakern.__version__}-cp311-cp311-manylinux_2_34_x86_64.whl", {
        "xlakern/_runtime.cpython-311-x86_64-linux-gnu.so": "elf", "xlakern/py.typed": "",
        "xlakern/include/xlakern/xlakern.h": "", "xlakern/_version.py": "",
        f"xlakern-{xlakern.__version__}.dist-info/METADATA": good_meta,
        f"xlakern-{xlakern.__version__}.dist-info/licenses/LICENSE": (ROOT / "LICENSE").read_text(),
        **{f"xlakern/event/kernels/{p.name}": "" for p in (ROOT / "src/xlakern/event/kernels").iterdir()}})
    assert check_wheel.problems(good) == []
    assert check_wheel.main([str(bad)]) == 1 and check_wheel.main([str(good)]) == 0


@pytest.mark.parametrize("target", ["docs", "wheel"])
def test_ci_runs_docs_and_wheel_checks_after_the_tests(target):
    ci = (ROOT / ".ci/run").read_text()
    assert ci.index("make test") < ci.index(f"make {target}")
    dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert ("sphinx-build -W" if target == "docs" else "auditwheel repair") in dry.stdout
