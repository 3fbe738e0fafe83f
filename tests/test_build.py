"""The build engine: object reuse, header tracking, job limit, streaming, warnings, launchers,
timeouts, Ctrl-C, odd compilers, namespaces and wrong-platform calls. Uses real compilers."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from xlakern import _build, _cache, _toolchain
from conftest import gpu_available, unique_name

SDS = jax.ShapeDtypeStruct
pytestmark = pytest.mark.usefixtures("on_cpu")

REAL_CXX = os.path.realpath(shutil.which("g++") or shutil.which("clang++"))
try:
    REAL_NVCC = _toolchain.find_nvcc()
except xlakern.ToolchainError:
    REAL_NVCC = None
needs_nvcc = pytest.mark.skipif(REAL_NVCC is None, reason="nvcc not installed")
REAL_CLANG = shutil.which("clang++")
ARCH = {} if gpu_available() else {"compute_capability": "9.0"}


@pytest.fixture
def fresh_cache(tmp_path):
    """A cache root (and so an object store) of this test's own."""
    root = tmp_path / "cache"
    xlakern.set_cache_dir(root)
    yield root
    xlakern.set_cache_dir(None)


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def counting_wrapper(tmp_path: Path, real: str, name: str = "cc-wrapper") -> tuple[Path, Path]:
    """A compiler wrapper that logs the arguments of every compile/link (not --version)."""
    log = tmp_path / f"{name}.log"
    wrapper = script(tmp_path / name, f"""\
        case "$1" in --version) exec {real} "$@";; esac
        echo "$*" >> {log}
        exec {real} "$@"
        """)
    return wrapper, log


def compiles_of(log: Path, needle: str) -> list[str]:
    """Logged compile commands (``-c``) that mention ``needle``."""
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if " -c " in f" {line} " and needle in line]


def scale_kernel(fn: str, factor: str) -> str:
    return (f"// @xk {fn} arg ret\n"
            f"void {fn}(const xk::Tensor x, xk::Tensor o) {{\n"
            f"  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = {factor} * x.data<float>()[i];\n"
            f"}}\n")


def call(mod, fn: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(getattr(mod, fn)(x, outs=SDS(x.shape, x.dtype)))


# -- headers ---------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, jax
    import xlakern
    spec = json.loads(os.environ["XK_SPEC"])
    t = time.perf_counter()
    mod = getattr(xlakern, spec["loader"])(*spec["args"], **spec["kwargs"])
    load_s = time.perf_counter() - t
    x = np.random.default_rng().standard_normal(16).astype(np.float32)
    y = np.asarray(getattr(mod, spec["fn"])(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    print(json.dumps({"ratio": float(np.median(y / x)), "load_s": load_s, "lib": str(mod.path)}))
""")


def run_child(cache: Path, spec: dict, cwd: Path | None = None, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, cwd=cwd,
                         env=dict(os.environ, XLAKERN_CACHE_DIR=str(cache), XK_SPEC=json.dumps(spec),
                                  JAX_PLATFORMS="cpu", XLAKERN_QUIET="1", **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_header_reached_through_dash_I_in_extra_cflags_invalidates_the_build(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "factor.h").write_text("#define FACTOR 2.0f\n")
    src = '#include "factor.h"\n' + scale_kernel("mul", "FACTOR")
    spec = {"loader": "load_cpp_inline", "args": [unique_name("hdr_flag"), src], "fn": "mul",
            "kwargs": {"extra_cflags": [f"-I{inc}"]}}
    first = run_child(tmp_path / "cache", spec)
    assert first["ratio"] == pytest.approx(2.0)
    assert run_child(tmp_path / "cache", spec)["ratio"] == pytest.approx(2.0)  # a hit
    (inc / "factor.h").write_text("#define FACTOR 5.0f\n")
    second = run_child(tmp_path / "cache", spec)
    assert second["ratio"] == pytest.approx(5.0), "an edited header must rebuild, not hit the old build"
    assert second["lib"] == first["lib"]  # same module entry, rebuilt in place


def test_header_included_by_a_header_invalidates_the_build_in_process(fresh_cache, tmp_path, rng):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "outer.h").write_text('#include "inner.h"\n')
    (inc / "inner.h").write_text("#define FACTOR 3.0f\n")
    src = '#include "outer.h"\n' + scale_kernel("mul", "FACTOR")
    name = unique_name("hdr_nested")
    mod = xlakern.load_cpp_inline(name, src, extra_include_paths=[str(inc)])
    x = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_allclose(call(mod, "mul", x), 3 * x, rtol=1e-6)
    assert str(inc / "inner.h") in mod.headers
    assert xlakern.load_cpp_inline(name, src, extra_include_paths=[str(inc)]) is mod
    (inc / "inner.h").write_text("#define FACTOR 7.0f\n")
    with pytest.raises(xlakern.RegistrationError, match="changed"):
        xlakern.load_cpp_inline(name, src, extra_include_paths=[str(inc)])
    mod2 = xlakern.load_cpp_inline(unique_name("hdr_nested"), src, extra_include_paths=[str(inc)])
    np.testing.assert_allclose(call(mod2, "mul", x), 7 * x, rtol=1e-6)


def test_relative_include_paths_resolve_against_the_callers_cwd(fresh_cache, tmp_path, monkeypatch, rng):
    for d, factor in (("incA", "2.0f"), ("incB", "0.5f")):
        (tmp_path / d).mkdir()
    (tmp_path / "incA" / "a.h").write_text("#define FA 2.0f\n")
    (tmp_path / "incB" / "b.h").write_text("#define FB 0.5f\n")
    monkeypatch.chdir(tmp_path)
    src = '#include "a.h"\n#include "b.h"\n' + scale_kernel("mul", "(FA * FB * 3.0f)")
    mod = xlakern.load_cpp_inline(unique_name("relinc"), src, extra_cflags=["-IincA"],
                                  extra_include_paths=["incB"])
    x = rng.standard_normal(12).astype(np.float32)
    np.testing.assert_allclose(call(mod, "mul", x), 3 * x, rtol=1e-6)
    assert str(tmp_path / "incA" / "a.h") in mod.headers


def test_absolute_path_flags():
    flags = ("-Iinc", "-I", "sub/dir", "-isystem", "sys", "-DX=1", "-I/abs", "--include-path=rel", "-O2", "-L", "lib")
    assert _build.absolute_path_flags(flags, "/w") == (
        "-I/w/inc", "-I", "/w/sub/dir", "-isystem", "/w/sys", "-DX=1", "-I/abs", "--include-path=/w/rel", "-O2",
        "-L", "/w/lib")


def test_parse_depfile_gcc_and_nvcc_styles():
    gcc = "src_0.o: /a/src.cc /x/my\\ dir/h.h \\\n /y/$$v.h\n"
    assert _build.parse_depfile(gcc) == ["/a/src.cc", "/x/my dir/h.h", "/y/$v.h"]
    nvcc = "a.o : a.cu \\\n    /usr/local/cuda/include/cuda_runtime.h \\\n    h.h\n"
    assert _build.parse_depfile(nvcc) == ["a.cu", "/usr/local/cuda/include/cuda_runtime.h", "h.h"]


# -- one object per edited file --------------------------------------------------


def test_load_cpp_dir_edit_one_file_recompiles_one_object(fresh_cache, tmp_path, monkeypatch, rng):
    d = tmp_path / "kernels"
    d.mkdir()
    factors = {f"k{i}": float(i + 2) for i in range(4)}
    for i, (fn, f) in enumerate(factors.items()):
        (d / f"{fn}.{('cc', 'cpp', 'cxx', 'cc')[i]}").write_text(scale_kernel(fn, f"{f}f"))
    (d / "notes.txt").write_text("not a source")
    wrapper, log = counting_wrapper(tmp_path, REAL_CXX)
    monkeypatch.setenv("CXX", str(wrapper))
    mod = xlakern.load_cpp_dir(d, name=unique_name("cppdir"))
    assert set(mod.functions) == set(factors)
    assert len(compiles_of(log, str(d))) == 4
    (d / "k2.cxx").write_text(scale_kernel("k2", "-1.5f"))
    factors["k2"] = -1.5
    log.unlink()
    mod2 = xlakern.load_cpp_dir(d, name=unique_name("cppdir"))
    recompiled = compiles_of(log, str(d))
    assert len(recompiled) == 1 and "k2.cxx" in recompiled[0], recompiled
    x = rng.standard_normal(21).astype(np.float32)
    for fn, f in factors.items():
        np.testing.assert_allclose(call(mod2, fn, x), f * x, rtol=1e-6)
    # Unchanged sources under another module name reuse every user object.
    log.unlink()
    xlakern.load_cpp_dir(d, name=unique_name("cppdir"))
    assert compiles_of(log, str(d)) == []


@pytest.mark.parametrize("upgraded", ["_our_headers", "_ffi_headers_digest"])
def test_objects_built_against_other_xlakern_or_jaxlib_headers_are_not_reused(
        fresh_cache, tmp_path, monkeypatch, rng, upgraded):
    # xlakern's and jaxlib's headers are -isystem, so depfiles do not list them. An object store
    # that kept objects across an upgrade of either would link an object compiled against the old
    # headers (another XLA_FFI_CallFrame, another xk::Tensor) into a module built now.
    d = tmp_path / "kernels"
    d.mkdir()
    (d / "k.cc").write_text(scale_kernel("k", "3.0f"))
    wrapper, log = counting_wrapper(tmp_path, REAL_CXX)
    monkeypatch.setenv("CXX", str(wrapper))
    xlakern.load_cpp_dir(d, name=unique_name("upgrade"))
    assert len(compiles_of(log, str(d))) == 1 and len(compiles_of(log, "xlakern_handlers.cc")) == 1
    log.unlink()
    xlakern.load_cpp_dir(d, name=unique_name("upgrade"))  # same headers: both objects are reused
    assert compiles_of(log, str(d)) == [] and compiles_of(log, "xlakern_handlers.cc") == []
    log.unlink(missing_ok=True)
    before = getattr(_build, upgraded)()
    monkeypatch.setattr(_build, upgraded, lambda: (before, "upgraded"))
    mod = xlakern.load_cpp_dir(d, name=unique_name("upgrade"))
    assert len(compiles_of(log, str(d))) == 1 and len(compiles_of(log, "xlakern_handlers.cc")) == 1
    x = rng.standard_normal(17).astype(np.float32)
    np.testing.assert_allclose(call(mod, "k", x), 3.0 * x, rtol=1e-6)


TWIN = r"""
// @xk scaled arg ret attr.k:float32
void scaled(const xk::Tensor x, xk::Tensor out, float k) {
  XK_CHECK(k >= 0) << "k must not be negative, got " << k;
  for (int64_t i = 0; i < x.numel(); ++i) out.data<float>()[i] = k * x.data<float>()[i];
}
"""


def test_modules_with_the_same_entry_points_share_one_handler_object_and_keep_their_names(
        fresh_cache, tmp_path, monkeypatch, rng):
    # The frame glue names no module: the second module reuses the first one's handlers, and each
    # library still reports its own name (xk_module_name, compiled at its link).
    wrapper, log = counting_wrapper(tmp_path, REAL_CXX)
    monkeypatch.setenv("CXX", str(wrapper))
    a = xlakern.load_cpp_inline(unique_name("twin_a"), TWIN)
    b = xlakern.load_cpp_inline(unique_name("twin_b"), TWIN)
    assert len(compiles_of(log, "xlakern_handlers.cc")) == 1
    other = xlakern.load_cpp_inline(unique_name("twin_other"), scale_kernel("g", "2.0f"))  # other entry points
    assert len(compiles_of(log, "xlakern_handlers.cc")) == 2
    assert len(compiles_of(log, "xlakern_pool.cc")) == 1  # parallel_for's pool: one object for every module
    assert len(compiles_of(log, "xlakern_frame_errors.cc")) == 1  # the glue's error paths: the same
    x = rng.standard_normal(40).astype(np.float32)
    np.testing.assert_allclose(call(other, "g", x), 2.0 * x.astype(np.float64), rtol=1e-6)
    x = rng.standard_normal(33).astype(np.float32)
    for mod, k in ((a, 1.5), (b, 0.25)):
        np.testing.assert_allclose(mod.scaled(x, outs=SDS(x.shape, x.dtype), k=k), k * x.astype(np.float64),
                                   rtol=1e-6)
    for mod, other in ((a, b), (b, a)):
        with pytest.raises(Exception, match=rf"xlakern kernel '{mod.name}\.scaled' failed: .*k must not be "
                                            r"negative, got -2") as info:
            jax.block_until_ready(mod.scaled(x, outs=SDS(x.shape, x.dtype), k=-2.0))
        assert other.name not in str(info.value)
        with pytest.raises(Exception, match=rf"xlakern handler '{mod.name}\.scaled' was called wrongly: "
                                            r"it takes the attributes \[k\], the call passed \[\]"):
            jax.block_until_ready(jax.ffi.ffi_call(f"{mod.name}.scaled", SDS(x.shape, x.dtype))(x))


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) not installed")
def test_handlers_call_the_glue_error_paths_defined_in_their_own_unit(fresh_cache, tmp_path):
    # The handlers' unit only calls the error paths (each module compiles it); their one definition comes from
    # the generated error-paths unit, compiled once for every module.
    mod = xlakern.load_cpp_inline(unique_name("errors_unit"), scale_kernel("f", "3.0f"))
    objects = {}
    for stem in ("xlakern_handlers", "xlakern_frame_errors"):
        obj = tmp_path / f"{stem}.o"
        subprocess.run([REAL_CXX, "-std=c++17", "-fPIC", "-O2", f"-I{xlakern.include_dir()}",
                        f"-I{jax.ffi.include_dir()}", "-c", str(mod.path.parent / f"{stem}.cc"), "-o", str(obj)],
                       check=True, capture_output=True)
        listing = subprocess.run(["nm", "-C", str(obj)], check=True, capture_output=True, text=True).stdout
        rows = (re.match(r"^\s*[0-9a-f]*\s+([A-Za-z])\s+(.*)$", line) for line in listing.splitlines())
        objects[stem] = {m.group(2): m.group(1) for m in rows if m and "xk::frame::" in m.group(2)}
    for fn in ("frame_mismatch", "kernel_failed", "answer_metadata"):
        used = [kind for sym, kind in objects["xlakern_handlers"].items() if f"xk::frame::{fn}(" in sym]
        defined = [kind for sym, kind in objects["xlakern_frame_errors"].items() if f"xk::frame::{fn}(" in sym]
        assert used == ["U"], (fn, used)
        assert defined == ["T"], (fn, defined)


@pytest.mark.parametrize("level, glue_level", [(3, 2), (1, 1)])
def test_generated_units_compile_at_most_at_O2(fresh_cache, tmp_path, monkeypatch, rng, level, glue_level):
    # The user's units take the module's -O level; the handlers' and the pool's units take it up to -O2
    # (_GLUE_MAX_LEVEL), and the glue's error paths compile at -O0 (_ERRORS_LEVEL).
    wrapper, log = counting_wrapper(tmp_path, REAL_CXX)
    monkeypatch.setenv("CXX", str(wrapper))
    mod = xlakern.load_cpp_inline(unique_name("glue_level"), scale_kernel("f", "3.0f"), optimization_level=level)
    generated = compiles_of(log, "xlakern_handlers.cc") + compiles_of(log, "xlakern_pool.cc")
    (errors,) = compiles_of(log, "xlakern_frame_errors.cc")
    (user,) = [c for c in compiles_of(log, "-c") if c not in generated and c != errors]
    assert len(generated) == 2
    for command in generated:
        assert [w for w in command.split() if w.startswith("-O")] == [f"-O{glue_level}"]
    assert [w for w in errors.split() if w.startswith("-O")] == ["-O0"]
    assert [w for w in user.split() if w.startswith("-O")] == [f"-O{level}"]
    x = rng.standard_normal(29).astype(np.float32)
    np.testing.assert_allclose(call(mod, "f", x), 3.0 * x.astype(np.float64), rtol=1e-6)


def test_load_cpp_dir_rejects_a_bad_directory(tmp_path):
    with pytest.raises(xlakern.XlakernError, match="not a directory"):
        xlakern.load_cpp_dir(tmp_path / "missing")
    with pytest.raises(xlakern.XlakernError, match="no files matching"):
        xlakern.load_cpp_dir(tmp_path)


CUDA_FILE = """
__global__ void {fn}_kernel(const float* x, float* o, int n) {{
  int k = blockIdx.x * blockDim.x + threadIdx.x; if (k < n) o[k] = {factor} * x[k];
}}
// @xk {fn} arg ret stream
void {fn}(const xk::Tensor x, xk::Tensor o, int64_t stream) {{
  int n = x.numel();
  {fn}_kernel<<<(n + 127) / 128, 128, 0, (cudaStream_t)stream>>>(x.data<float>(), o.data<float>(), n);
}}
"""


@needs_nvcc
def test_load_cuda_dir_edit_one_file_recompiles_one_object(fresh_cache, tmp_path, monkeypatch):
    d = tmp_path / "cu"
    d.mkdir()
    for i in range(4):
        (d / f"k{i}.cu").write_text(CUDA_FILE.format(fn=f"k{i}", factor=f"{i + 2}.0f"))
    wrapper, log = counting_wrapper(tmp_path, REAL_NVCC, "nvcc-wrapper")
    monkeypatch.setenv("XLAKERN_NVCC", str(wrapper))
    mod = xlakern.load_cuda_dir(d, name=unique_name("cudir"), **ARCH)
    assert len(compiles_of(log, str(d))) == 4 and mod.path.is_file()
    (d / "k1.cu").write_text(CUDA_FILE.format(fn="k1", factor="-3.0f"))
    log.unlink()
    mod2 = xlakern.load_cuda_dir(d, name=unique_name("cudir"), **ARCH)
    recompiled = compiles_of(log, str(d))
    assert len(recompiled) == 1 and "k1.cu" in recompiled[0], recompiled
    assert mod2.path.is_file() and set(mod2.functions) == {"k0", "k1", "k2", "k3"}


# -- the compiler driver -----------------------------------------------------------


def concurrency_wrapper(tmp_path: Path) -> tuple[Path, Path]:
    """A wrapper whose compiles each last 0.6 s and log how many compiles were running."""
    running = tmp_path / "running"
    running.mkdir()
    log = tmp_path / "concurrency.log"
    wrapper = script(tmp_path / "slow-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        case " $* " in *" -c "*)
          touch {running}/$$; sleep 0.6; ls {running} | wc -l >> {log}; rm -f {running}/$$;;
        esac
        exec {REAL_CXX} "$@"
        """)
    return wrapper, log


@pytest.mark.parametrize("env,limit", [({"MAX_JOBS": "1"}, 1), ({"XLAKERN_MAX_JOBS": "1", "MAX_JOBS": "8"}, 1),
                                       ({"XLAKERN_MAX_JOBS": "3"}, 3)])
def test_max_jobs_limits_parallel_compiles(tmp_path, monkeypatch, env, limit):
    d = tmp_path / "kernels"
    d.mkdir()
    for i in range(4):
        (d / f"k{i}.cc").write_text(scale_kernel(f"k{i}", f"{i}.5f"))
    wrapper, log = concurrency_wrapper(tmp_path)
    monkeypatch.setenv("CXX", str(wrapper))
    for var in ("MAX_JOBS", "XLAKERN_MAX_JOBS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    xlakern.set_cache_dir(tmp_path / "cache")
    try:
        xlakern.load_cpp_dir(d, name=unique_name("jobs"))
    finally:
        xlakern.set_cache_dir(None)
    seen = [int(n) for n in log.read_text().split()]
    assert len(seen) == 7  # four sources; the generated handlers, pool and error paths
    assert max(seen) <= limit
    if limit > 1:
        assert max(seen) >= 2, "compiles should overlap when allowed"


@pytest.mark.parametrize("value", ["0", "-2", "four"])
def test_bad_max_jobs_is_a_toolchain_error(monkeypatch, value):
    monkeypatch.setenv("XLAKERN_MAX_JOBS", value)
    with pytest.raises(xlakern.ToolchainError, match="XLAKERN_MAX_JOBS"):
        _build.max_jobs()


def test_verbose_streams_commands_and_output_while_compiling(tmp_path):
    go = tmp_path / "go"
    wrapper = script(tmp_path / "talky-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        case " $* " in *" -c "*)
          echo "XK-MARK compiling" >&2
          n=0; while [ ! -e {go} ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done;;
        esac
        exec {REAL_CXX} "$@"
        """)
    child = textwrap.dedent("""
        import os, xlakern
        xlakern.load_cpp_inline(os.environ["NAME"], os.environ["SRC"], verbose=True)
        print("LOADED")
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, CXX=str(wrapper), XLAKERN_CACHE_DIR=str(tmp_path / "cache"),
                                     NAME=unique_name("verbose"), SRC=scale_kernel("f", "2.0f"),
                                     JAX_PLATFORMS="cpu"))
    seen: list[str] = []
    marked = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            seen.append(line)
            if "XK-MARK" in line:
                marked.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert marked.wait(120), "the compiler's output did not appear while it ran:\n" + "".join(seen)
        assert proc.poll() is None  # still compiling: the line was streamed, not printed afterwards
        assert any(line.startswith("xlakern: ") and str(wrapper) in line and " -c " in line for line in seen)
    finally:
        go.touch()
        out, _ = proc.communicate(timeout=300)
        reader.join(10)
    assert proc.returncode == 0 and "LOADED" in out, "".join(seen)[-3000:]


def test_warnings_go_to_the_xlakern_logger(fresh_cache, caplog, rng):
    src = '#warning "xk-test-warning: check me"\n' + scale_kernel("f", "2.0f")
    with caplog.at_level(logging.WARNING, logger="xlakern"):
        mod = xlakern.load_cpp_inline(unique_name("warn"), src)
    msgs = [r.getMessage() for r in caplog.records if r.name == "xlakern" and r.levelno == logging.WARNING]
    assert any("xk-test-warning: check me" in m for m in msgs), msgs
    x = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(call(mod, "f", x), 2 * x, rtol=1e-6)


def test_ccache_style_launcher_in_cxx(fresh_cache, tmp_path, monkeypatch, rng):
    launch_log = tmp_path / "launcher.log"
    launcher = script(tmp_path / "fakecache", f"""\
        echo "$*" >> {launch_log}
        exec "$@"
        """)
    monkeypatch.setenv("CXX", f"{launcher} g++")
    tool = _toolchain.host_compiler()
    assert tool.command[0] == str(launcher) and tool.path == os.path.realpath(shutil.which("g++"))
    assert tool.version == _toolchain.tool_version(tool.path)  # the real compiler's, not the launcher's
    assert str(launcher) not in json.dumps(tool.identity)
    mod = xlakern.load_cpp_inline(unique_name("launch"), scale_kernel("f", "4.0f"))
    assert compiles_of(launch_log, "g++"), "compiles go through the launcher"
    x = rng.standard_normal(7).astype(np.float32)
    np.testing.assert_allclose(call(mod, "f", x), 4 * x, rtol=1e-6)
    if REAL_NVCC is None:
        return
    nvcc_wrapper, nvcc_log = counting_wrapper(tmp_path, REAL_NVCC, "nvcc-wrapper")
    monkeypatch.setenv("XLAKERN_NVCC", str(nvcc_wrapper))
    xlakern.load_cuda_inline(unique_name("launch_cu"), CUDA_FILE.format(fn="g", factor="2.0f"), **ARCH)
    lines = nvcc_log.read_text().splitlines()
    assert lines and all(f"-ccbin {tool.path} " in line for line in lines), lines


CLANG_KERNEL = r"""
// @xk clamp_scale arg ret attr.k:float32
void clamp_scale(const xk::Tensor x, xk::Tensor out, float k) {
  XK_CHECK(k > 0) << "k must be positive, got " << k;
  const float* in = x.data<float>();
  float* o = out.data<float>();
  xk::parallel_for(x.numel(), 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = in[i] > 1.0f ? k : k * in[i];
  });
}
"""


@pytest.mark.skipif(REAL_CLANG is None, reason="clang++ not installed")
def test_clang_builds_a_module_with_checks_parallel_for_and_vmap(fresh_cache, monkeypatch, rng):
    # The README promises g++ or clang++. clang refuses a GNU attribute before [[noreturn]], which the frame
    # glue and XK_CHECK's error paths once had: every C++ module failed to build under CXX=clang++.
    monkeypatch.setenv("CXX", REAL_CLANG)
    mod = xlakern.load_cpp_inline(unique_name("clang"), CLANG_KERNEL)
    assert "clang" in _toolchain.host_compiler().version
    x = rng.standard_normal((3, 4000)).astype(np.float32) * 2
    want = np.where(x > 1, 0.5, 0.5 * x.astype(np.float64))
    got = jax.jit(jax.vmap(lambda r: mod.clamp_scale(r, outs=SDS(r.shape, r.dtype), k=0.5,
                                                     vmap_method="broadcast_all")))(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    with pytest.raises(xlakern.KernelError, match=r"k must be positive, got -2"):
        jax.block_until_ready(mod.clamp_scale(x[0], outs=SDS(x[0].shape, x.dtype), k=-2.0))


def test_ccache_masquerade_symlink(tmp_path, monkeypatch):
    bindir, masq = tmp_path / "bin", tmp_path / "masq"
    bindir.mkdir()
    masq.mkdir()
    fake = script(bindir / "ccache", f'exec {REAL_CXX} "$@"\n')
    (masq / "g++").symlink_to(fake)
    monkeypatch.setenv("CXX", str(masq / "g++"))
    tool = _toolchain.host_compiler()
    assert tool.command[0] == str(masq / "g++")  # called by its name, as ccache needs
    assert tool.path == os.path.realpath(shutil.which("g++"))


def test_compiler_stdin_is_closed(tmp_path):
    src = '#include "/dev/stdin"\n' + scale_kernel("f", "2.0f")
    child = textwrap.dedent("""
        import os, xlakern
        xlakern.load_cpp_inline(os.environ["NAME"], os.environ["SRC"])
        print("LOADED")
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, XLAKERN_CACHE_DIR=str(tmp_path / "cache"), SRC=src,
                                     NAME=unique_name("stdin"), JAX_PLATFORMS="cpu", XLAKERN_QUIET="1"))
    try:
        # stdin stays open and empty (communicate() would close it): a compiler reading it waits forever.
        deadline = time.time() + 150
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert proc.poll() is not None, "the build hung reading stdin"
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdin.close()
    assert proc.returncode == 0 and "LOADED" in out, err[-3000:]


def test_timeout_kills_the_compiler_and_releases_the_lock(fresh_cache, tmp_path, monkeypatch, rng):
    pids = tmp_path / "pids"
    wrapper = script(tmp_path / "stuck-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        echo $$ >> {pids}
        exec sleep 60
        """)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("XLAKERN_BUILD_TIMEOUT", "1.5")
    name = unique_name("timeout")
    t = time.perf_counter()
    with pytest.raises(xlakern.CompilationError, match="did not finish within 1.5 s") as info:
        xlakern.load_cpp_inline(name, scale_kernel("f", "2.0f"))
    assert time.perf_counter() - t < 30
    assert "XLAKERN_BUILD_TIMEOUT" in str(info.value)
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    module_dir = fresh_cache / name
    locks = list(module_dir.glob(".*.lock"))
    assert locks and not list(module_dir.glob(".tmp-*"))
    for lock in locks:
        with _cache.file_lock(lock, blocking=False) as got:
            assert got, "the build lock must be released"
    monkeypatch.delenv("CXX")
    monkeypatch.delenv("XLAKERN_BUILD_TIMEOUT")
    mod = xlakern.load_cpp_inline(name, scale_kernel("f", "2.0f"))
    x = rng.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(call(mod, "f", x), 2 * x, rtol=1e-6)


def test_bad_build_timeout_is_a_toolchain_error(monkeypatch):
    monkeypatch.setenv("XLAKERN_BUILD_TIMEOUT", "soon")
    with pytest.raises(xlakern.ToolchainError, match="XLAKERN_BUILD_TIMEOUT"):
        _build.build_timeout()


def test_ctrl_c_stops_the_compilers_and_leaves_no_build(tmp_path):
    pids, stall = tmp_path / "pids", tmp_path / "stalled"
    wrapper = script(tmp_path / "stall-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        echo $$ >> {pids}
        touch {stall}
        exec sleep 120
        """)
    cache, name = tmp_path / "cache", unique_name("sigint")
    child = textwrap.dedent("""
        import os, signal, xlakern
        # As in an interactive session: a background parent (make ... &) hands SIGINT down ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        xlakern.load_cpp_inline(os.environ["NAME"], os.environ["SRC"])
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, CXX=str(wrapper), XLAKERN_CACHE_DIR=str(cache), NAME=name,
                                     SRC=scale_kernel("f", "2.0f"), JAX_PLATFORMS="cpu", XLAKERN_QUIET="1"))
    try:
        deadline = time.time() + 120
        while not stall.exists():
            assert proc.poll() is None and time.time() < deadline, "the build never started"
            time.sleep(0.05)
        time.sleep(0.3)  # let every parallel compile start
        t = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.perf_counter() - t < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    module_dir = cache / name
    assert not [p for p in module_dir.iterdir() if not p.name.endswith(".lock")], list(module_dir.iterdir())


def test_compiler_exiting_zero_without_output_is_a_compilation_error(fresh_cache, tmp_path, monkeypatch):
    wrapper = script(tmp_path / "lazy-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        exit 0
        """)
    monkeypatch.setenv("CXX", str(wrapper))
    with pytest.raises(xlakern.CompilationError, match="did not write its output"):
        xlakern.load_cpp_inline(unique_name("lazy"), scale_kernel("f", "2.0f"))


def test_missing_compiler_is_a_toolchain_error(fresh_cache, tmp_path, monkeypatch):
    wrapper = script(tmp_path / "vanishing-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        exit 0
        """)
    monkeypatch.setenv("CXX", str(wrapper))
    tool = _toolchain.host_compiler()
    wrapper.unlink()
    builder = _build.Builder(unique_name("gone"), [xlakern._spec.Source("inline:x", scale_kernel("f", "2.0f"))],
                             [], _build.BuildOptions("cpu"), tool, None, False)
    with pytest.raises(xlakern.ToolchainError, match="cannot start"):
        builder(tmp_path)


def test_latin1_byte_in_a_source_file_loads(fresh_cache, tmp_path, rng):
    src = tmp_path / "latin.cc"
    src.write_bytes(b"// gr\xfc\xdfe aus K\xf6ln: not UTF-8\n" + scale_kernel("f", "1.5f").encode())
    mod = xlakern.load_cpp_file(src, name=unique_name("latin"))
    x = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(call(mod, "f", x), 1.5 * x, rtol=1e-6)


def test_unreadable_source_names_the_file(tmp_path):
    src = tmp_path / "secret.cc"
    src.write_text(scale_kernel("f", "1.0f"))
    src.chmod(0)
    if os.access(src, os.R_OK):
        pytest.skip("running as root: permissions do not stop reads")
    with pytest.raises(xlakern.XlakernError, match="secret.cc"):
        xlakern.load_cpp_file(src, name=unique_name("unreadable"))


# -- entry points in namespaces ------------------------------------------------------

NAMESPACED = """
namespace ops {
namespace detail { inline float gain() { return 2.0f; } }
// @xk twice arg ret
void twice(const xk::Tensor x, xk::Tensor o) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = detail::gain() * x.data<float>()[i];
}
}  // namespace ops

namespace a::b {
void negate(const xk::Tensor x, xk::Tensor o);
inline namespace v1 {
// @xk shift arg ret attr.by:float32
void shift(const xk::Tensor x, xk::Tensor o, float by) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = x.data<float>()[i] + by;
}
}
}
// @xk negate arg ret
void a::b::negate(const xk::Tensor x, xk::Tensor o) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = -x.data<float>()[i];
}
extern "C" {
// @xk cube arg ret
void cube(const xk::Tensor x, xk::Tensor o) {
  for (int64_t i = 0; i < x.numel(); ++i) { float v = x.data<float>()[i]; o.data<float>()[i] = v * v * v; }
}
}
struct Helper { void twice(int) {} };
"""


def test_entry_points_in_namespaces(fresh_cache, rng):
    mod = xlakern.load_cpp_inline(unique_name("ns"), NAMESPACED)
    assert mod.entries["twice"].namespace == ("ops",)
    assert mod.entries["shift"].namespace == ("a", "b", "v1")
    assert mod.entries["negate"].namespace == ("a", "b")
    assert mod.entries["cube"].c_linkage
    x = rng.standard_normal(10).astype(np.float32)
    np.testing.assert_allclose(call(mod, "twice", x), 2 * x, rtol=1e-6)
    np.testing.assert_allclose(mod.shift(x, outs=SDS(x.shape, x.dtype), by=0.25), x + 0.25, rtol=1e-6)
    np.testing.assert_allclose(call(mod, "negate", x), -x)
    np.testing.assert_allclose(call(mod, "cube", x), x.astype(np.float64) ** 3, rtol=1e-5)


@pytest.mark.parametrize("src,match", [
    ("namespace {\n// @xk f arg ret\nvoid f(const xk::Tensor x, xk::Tensor o) {} }", "anonymous namespace"),
    ("struct S {\n// @xk f arg ret\nvoid f(const xk::Tensor x, xk::Tensor o) {} };", "class member"),
    ("namespace p { void f(const xk::Tensor x, xk::Tensor o) {} }\n"
     "namespace q { void f(const xk::Tensor x, xk::Tensor o) {} }\n// @xk f arg ret\n", "several namespaces"),
])
def test_entry_points_that_cannot_be_called_are_spec_errors(src, match, tmp_path, monkeypatch):
    # Raised before any compiler runs: a compiler that fails loudly proves it.
    monkeypatch.setenv("CXX", str(script(tmp_path / "no-cxx", f"""\
        case "$1" in --version) exec {REAL_CXX} "$@";; esac
        exit 1
        """)))
    with pytest.raises(xlakern.SpecError, match=match):
        xlakern.load_cpp_inline(unique_name("badns"), src)


# -- wrong platform --------------------------------------------------------------------

CUDA_NO_INPUT = """
__global__ void fill_kernel(float* o, int n) { int k = threadIdx.x; if (k < n) o[k] = 1.0f; }
// @xk fill ret stream
void fill(xk::Tensor o, int64_t stream) { fill_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(o.data<float>(), 4); }
"""


@needs_nvcc
@pytest.mark.skipif(gpu_available(), reason="needs a machine where the default device is the CPU")
def test_cuda_module_called_on_cpu_is_a_call_error(fresh_cache, rng):
    mod = xlakern.load_cuda_inline(unique_name("wrongplat"), CUDA_FILE.format(fn="g", factor="2.0f") + CUDA_NO_INPUT,
                                   compute_capability="9.0")
    x = jax.numpy.asarray(rng.standard_normal(4).astype(np.float32))
    with pytest.raises(xlakern.CallError, match="CUDA kernel.*platform 'cpu'"):
        mod.g(x, outs=SDS(x.shape, x.dtype))
    with pytest.raises(xlakern.CallError, match="CUDA kernel.*platform 'cpu'"):
        mod.g(np.asarray(x), outs=SDS(x.shape, x.dtype))
    with pytest.raises(xlakern.CallError, match="lowered on platform 'cpu'"):
        jax.jit(lambda v: mod.g(v, outs=SDS(v.shape, v.dtype)) + 1)(x)
    with pytest.raises(xlakern.CallError, match="lowered on platform 'cpu'"):
        jax.jit(jax.vmap(lambda v: mod.g(v, outs=SDS(v.shape, v.dtype), vmap_method="sequential")))(x[None])
    with pytest.raises(xlakern.CallError, match="platform 'cpu'"):
        mod.fill(outs=SDS((4,), np.float32))
    with pytest.raises(xlakern.CallError, match="lowered on platform 'cpu'"):
        jax.jit(lambda: mod.fill(outs=SDS((4,), np.float32)))()


@pytest.mark.gpu
def test_cpu_module_called_on_gpu_is_a_call_error(rng):
    mod = xlakern.load_cpp_inline(unique_name("wrongplat_cpu"), scale_kernel("f", "2.0f"))
    gpu = jax.devices("gpu")[0]
    x = jax.device_put(rng.standard_normal(4).astype(np.float32), gpu)
    with pytest.raises(xlakern.CallError, match="CPU kernel.*platform 'gpu'"):
        mod.f(x, outs=SDS(x.shape, x.dtype))
    with jax.default_device(gpu):
        with pytest.raises(xlakern.CallError, match="CPU kernel.*platform"):
            mod.f(np.ones(4, np.float32), outs=SDS((4,), np.float32))
    with pytest.raises(xlakern.CallError, match="lowered on platform 'cuda'"):
        jax.jit(lambda v: mod.f(v, outs=SDS(v.shape, v.dtype)))(x)
    # The right platform still works, on CPU arrays.
    xc = jax.device_put(np.asarray(x), jax.devices("cpu")[0])
    np.testing.assert_allclose(np.asarray(jax.jit(lambda v: mod.f(v, outs=SDS(v.shape, v.dtype)))(xc)),
                               2 * np.asarray(x), rtol=1e-6)


@pytest.mark.gpu
def test_cuda_dir_rebuilds_one_object_and_runs(tmp_path, rng):
    d = tmp_path / "cu"
    d.mkdir()
    for i in range(4):
        (d / f"k{i}.cu").write_text(CUDA_FILE.format(fn=f"k{i}", factor=f"{i + 2}.0f"))
    gpu = jax.devices("gpu")[0]
    x = jax.device_put(rng.standard_normal(1000).astype(np.float32), gpu)
    mod = xlakern.load_cuda_dir(d, name=unique_name("cudir_gpu"))
    for i in range(4):
        np.testing.assert_allclose(np.asarray(getattr(mod, f"k{i}")(x, outs=SDS(x.shape, x.dtype))),
                                   (i + 2) * np.asarray(x), rtol=1e-6)
    (d / "k3.cu").write_text(CUDA_FILE.format(fn="k3", factor="-0.5f"))
    mod2 = xlakern.load_cuda_dir(d, name=unique_name("cudir_gpu"))
    y = jax.jit(lambda v: mod2.k3(v, outs=SDS(v.shape, v.dtype)))(x)
    np.testing.assert_allclose(np.asarray(y), -0.5 * np.asarray(x), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mod2.k0(x, outs=SDS(x.shape, x.dtype))), 2 * np.asarray(x), rtol=1e-6)


def test_unusable_cache_dir_is_a_compilation_error_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    xlakern.set_cache_dir(blocker / "cache")
    try:
        with pytest.raises(xlakern.CompilationError, match="a-file.*writable"):
            xlakern.load_cpp_inline(unique_name("nocache"), scale_kernel("f", "2.0f"))
    finally:
        xlakern.set_cache_dir(None)


# The generated handlers of CUDA modules (ffi_frame.h, as for C++ modules): built here on any
# machine with nvcc, run on a GPU. One kernel takes an attribute, the stream as cudaStream_t and
# as int64_t, and accumulates into an output that only zeroed_outputs clears.
CUDA_FRAME_SRC = r"""
__global__ void binned_kernel(const float* x, const int32_t* bin, float* hist, float w, int n) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) atomicAdd(hist + bin[k], w * x[k]);
}
// @xk binned arg arg ret attr.w:float32 stream
void binned(const xk::Tensor x, const xk::Tensor bin, xk::Tensor hist, float w, cudaStream_t stream) {
  int n = x.numel();
  if (n > 0) binned_kernel<<<(n + 127) / 128, 128, 0, stream>>>(x.data<float>(), bin.data<int32_t>(),
                                                                hist.data<float>(), w, n);
}
__global__ void twice_kernel(const float* x, float* o, int n) {
  int k = blockIdx.x * blockDim.x + threadIdx.x; if (k < n) o[k] = 2.0f * x[k];
}
// @xk twice arg ret stream
void twice(const xk::Tensor x, xk::Tensor o, int64_t stream) {
  int n = x.numel();
  if (n > 0) twice_kernel<<<(n + 127) / 128, 128, 0, (cudaStream_t)stream>>>(x.data<float>(), o.data<float>(), n);
}
"""


def _cuda_frame_module(name: str):
    mod = xlakern.load_cuda_inline(unique_name(name), CUDA_FRAME_SRC, **ARCH)
    glue = (mod.path.parent / "xlakern_handlers.cc").read_text()
    assert '#include "xlakern/ffi_frame.h"' in glue and "ffi::Bind" not in glue
    assert "XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE" in glue
    # the glue's error paths come from their generated unit (the link has --no-undefined); a CUDA
    # module needs no pool unit
    assert '#include "xlakern/ffi_frame_errors.h"' in (mod.path.parent / "xlakern_frame_errors.cc").read_text()
    assert not (mod.path.parent / "xlakern_pool.cc").exists()
    return mod


@needs_nvcc
def test_cuda_modules_build_on_the_frame_glue(fresh_cache):
    mod = _cuda_frame_module("cuframe_build")
    assert mod.functions == {"binned": "arg arg ret attr.w:float32 stream", "twice": "arg ret stream"}


@pytest.mark.gpu
def test_cuda_modules_run_on_the_frame_glue(fresh_cache, rng):
    mod = _cuda_frame_module("cuframe_run")
    gpu = jax.devices("gpu")[0]
    n, bins = 5000, 37
    x = rng.standard_normal((3, n)).astype(np.float32)
    b = rng.integers(0, bins, (3, n)).astype(np.int32)
    want = np.zeros((3, bins))
    for r in range(3):
        np.add.at(want[r], b[r], 0.5 * x[r].astype(np.float64))
    xs, bs = jax.device_put(x, gpu), jax.device_put(b, gpu)
    hist = lambda x, b: mod.binned(x, b, outs=SDS((bins,), jnp.float32), w=0.5, zeroed_outputs=[0],
                                   vmap_method="broadcast_all")
    np.testing.assert_allclose(np.asarray(hist(xs[0], bs[0])), want[0], rtol=1e-4, atol=1e-4)
    # vmap through the control handler's per-element loop, each element's output cleared
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(hist))(xs, bs)), want, rtol=1e-4, atol=1e-4)

    # in a jitted loop (a command buffer, the handlers declaring themselves compatible), the output
    # cleared again every step
    @jax.jit
    def loop(x, b):
        return jax.lax.fori_loop(0, 20, lambda i, acc: acc + hist(x, b), jnp.zeros((bins,), jnp.float32))

    np.testing.assert_allclose(np.asarray(loop(xs[1], bs[1])), 20 * want[1], rtol=1e-4, atol=1e-3)
    y = jax.jit(lambda v: mod.twice(v, outs=SDS(v.shape, v.dtype)))(xs[2])
    np.testing.assert_allclose(np.asarray(y), 2 * x[2], rtol=1e-6)
    # a raw call that does not fit the signature is refused with the reason
    with pytest.raises(Exception, match=r"it takes the attributes \[w\], the call passed \[\]"):
        jax.block_until_ready(jax.ffi.ffi_call(f"{mod.name}.binned", SDS((bins,), jnp.float32))(xs[0], bs[0]))
