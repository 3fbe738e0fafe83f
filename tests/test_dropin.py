"""``xlakern.install_as_brainevent()``: ``import brainevent`` resolves to xlakern."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "XLAKERN_QUIET": "1"})


def test_import_brainevent_gets_xlakern_everywhere_after_install():
    out = _run("""
        import sys, types, xlakern
        xlakern.install_as_brainevent()
        xlakern.install_as_brainevent()          # twice is harmless
        import brainevent
        from brainevent import load_cpp_inline
        assert brainevent is xlakern and load_cpp_inline is xlakern.load_cpp_inline
        # a library module importing brainevent later sees xlakern too
        lib = types.ModuleType("some_lib")
        exec("import brainevent as be\\nname = be.__name__", lib.__dict__)
        print(lib.name)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "xlakern"


def test_refuses_when_a_real_brainevent_is_already_loaded():
    out = _run("""
        import sys, types, xlakern
        fake = types.ModuleType("brainevent"); fake.__file__ = "/somewhere/brainevent/__init__.py"
        sys.modules["brainevent"] = fake
        try:
            xlakern.install_as_brainevent()
        except xlakern.ConfigError as e:
            assert "already imported" in str(e) and "/somewhere/brainevent" in str(e), e
        else:
            raise SystemExit("no error")
        assert sys.modules["brainevent"] is fake          # nothing changed
        xlakern.install_as_brainevent(replace=True)
        import brainevent
        assert brainevent is xlakern
        print("ok")
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
