"""The build cache: content-addressed, locked, self-healing. Uses real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import xlakern
from conftest import unique_name

pytestmark = pytest.mark.usefixtures("on_cpu")

SRC = """
// @xk triple arg ret
void triple(const xk::Tensor x, xk::Tensor out) {
  for (int64_t i = 0; i < x.numel(); ++i) out.data<float>()[i] = 3.0f * x.data<float>()[i];
}
"""

# Child program: load SRC as module NAME, check the result on fresh data, print one JSON line.
CHILD = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, jax
    jax.devices()
    if os.environ.get("FORBID_SUBPROCESS"):
        import subprocess
        def refuse(*a, **k):
            raise AssertionError("a cache hit must not start a subprocess")
        subprocess.Popen.__init__ = refuse
        os.fork = os.posix_spawn = os.posix_spawnp = refuse
        for name in ("execv", "execve", "execvp", "execvpe", "system", "popen"):
            setattr(os, name, refuse)
    import xlakern
    t = time.perf_counter()
    mod = xlakern.load_cpp_inline(os.environ["NAME"], os.environ["SRC"])
    load_s = time.perf_counter() - t
    x = np.random.default_rng().standard_normal(100).astype(np.float32)
    y = np.asarray(mod.triple(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    ok = bool(np.allclose(y, 3 * x))
    print(json.dumps({"ok": ok, "load_s": load_s, "lib": str(mod.path), "ino": os.stat(mod.path).st_ino}))
""")


def child_env(cache: Path, name: str, **extra: str) -> dict:
    env = dict(os.environ, XLAKERN_CACHE_DIR=str(cache), NAME=name, SRC=SRC, XLAKERN_QUIET="1",
               JAX_PLATFORMS="cpu")
    env.update(extra)
    return env


def run_child(cache: Path, name: str, **extra: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], env=child_env(cache, name, **extra),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def counting_cxx(tmp_path):
    """A CXX wrapper that logs each compile/link (not --version) and can stall on request."""
    log = tmp_path / "cxx.log"
    wrapper = tmp_path / "cxx-wrapper"
    real = subprocess.run(["sh", "-c", "command -v g++ || command -v clang++"], capture_output=True,
                          text=True).stdout.strip()
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in --version) exec {real} "$@";; esac
        echo "$$" >> {log}
        if [ -n "$XK_TEST_STALL" ]; then touch "$XK_TEST_STALL"; sleep 60; fi
        exec {real} "$@"
        """))
    wrapper.chmod(0o755)
    return wrapper, log


def test_fresh_process_cache_hit_runs_no_subprocess(tmp_path):
    name = unique_name("hit")
    first = run_child(tmp_path, name)
    assert first["ok"]
    again = run_child(tmp_path, name, FORBID_SUBPROCESS="1")
    assert again["ok"] and again["lib"] == first["lib"] and again["ino"] == first["ino"]


def test_force_rebuild_recompiles(tmp_path):
    xlakern.set_cache_dir(tmp_path)
    try:
        name = unique_name("force")
        mod = xlakern.load_cpp_inline(name, SRC)
        ino = os.stat(mod.path).st_ino
        mod2 = xlakern.load_cpp_inline(name, SRC, force_rebuild=True)
        assert mod2.path == mod.path and os.stat(mod2.path).st_ino != ino
        x = np.arange(4, dtype=np.float32)
        import jax

        np.testing.assert_allclose(mod2.triple(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)), 3 * x)
    finally:
        xlakern.set_cache_dir(None)


def test_clear_cache_by_name(tmp_path):
    xlakern.set_cache_dir(tmp_path)
    try:
        a, b = unique_name("clear_a"), unique_name("clear_b")
        ma = xlakern.load_cpp_inline(a, SRC)
        mb = xlakern.load_cpp_inline(b, SRC)
        result = xlakern.clear_cache(a)
        assert result["removed"] == [str(ma.path.parent)] and not result["skipped"]
        assert not ma.path.exists() and mb.path.exists()
        assert xlakern.get_cache_dir() == tmp_path.resolve()
        result = xlakern.clear_cache()
        assert str(mb.path.parent) in result["removed"] and not mb.path.exists()
    finally:
        xlakern.set_cache_dir(None)


def test_four_processes_build_once(tmp_path, counting_cxx):
    wrapper, log = counting_cxx
    name = unique_name("race")
    env = child_env(tmp_path / "cache", name, CXX=str(wrapper))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    assert len({r["lib"] for r in results}) == 1
    # one build = user source + the generated handlers, pool and error paths + link
    assert len(log.read_text().split()) == 5


def test_killed_build_does_not_block_or_poison(tmp_path, counting_cxx):
    wrapper, log = counting_cxx
    cache = tmp_path / "cache"
    name = unique_name("killed")
    stall = tmp_path / "stalled"
    victim = subprocess.Popen([sys.executable, "-c", CHILD],
                              env=child_env(cache, name, CXX=str(wrapper), XK_TEST_STALL=str(stall)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    while not stall.exists():
        assert victim.poll() is None and time.time() < deadline, "the build never started"
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    leftovers = list((cache / name).glob(".tmp-*"))
    assert leftovers, "the killed build should have left its private temp dir behind"
    result = run_child(cache, name, CXX=str(wrapper))
    assert result["ok"]
    assert not list((cache / name).glob(".tmp-*")), "the next builder sweeps dead temp dirs"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_cached_library_is_rebuilt_not_loaded(tmp_path, damage):
    name = unique_name("corrupt")
    first = run_child(tmp_path, name)
    lib = Path(first["lib"])
    data = bytearray(lib.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    second = run_child(tmp_path, name)
    assert second["ok"] and second["lib"] == first["lib"]
    meta = json.loads((lib.parent / "meta.json").read_text())
    assert xlakern._cache.file_sha256(lib) == meta["sha256"]


def test_cache_key_covers_included_headers(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "factor.h").write_text("#define FACTOR 2.0f\n")
    src = '#include "factor.h"\n// @xk mul arg ret\nvoid mul(const xk::Tensor x, xk::Tensor o) {' \
          ' for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = FACTOR * x.data<float>()[i]; }'
    xlakern.set_cache_dir(tmp_path / "cache")
    try:
        name = unique_name("hdr")
        m1 = xlakern.load_cpp_inline(name, src, extra_include_paths=[str(inc)])
        assert xlakern.load_cpp_inline(name, src, extra_include_paths=[str(inc)]) is m1
        (inc / "factor.h").write_text("#define FACTOR 5.0f\n")
        # Same name and source text, changed header: a different build, so a name clash here.
        with pytest.raises(xlakern.RegistrationError):
            xlakern.load_cpp_inline(name, src, extra_include_paths=[str(inc)])
        m2 = xlakern.load_cpp_inline(unique_name("hdr"), src, extra_include_paths=[str(inc)])
        import jax

        x = np.arange(3, dtype=np.float32)
        np.testing.assert_allclose(m2.mul(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)), 5 * x)
    finally:
        xlakern.set_cache_dir(None)
