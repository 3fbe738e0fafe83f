"""The API describes itself, and the command line (issue 13, Deliver 5).

Loader signatures and docstrings, misspelt options, reloading a name with new content, and
``python -m xlakern`` (doctor, cache list/clear, --help), run in real subprocesses.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import unique_name

LOADERS = [xlakern.load_cpp_inline, xlakern.load_cpp_file, xlakern.load_cuda_inline, xlakern.load_cuda_file,
           xlakern.load_cuda_dir, xlakern.load_cpp_dir]
CPP_OPTIONS = ["optimization_level", "extra_cflags", "extra_ldflags", "extra_include_paths", "build_directory",
               "force_rebuild", "verbose", "quiet"]
CUDA_OPTIONS = CPP_OPTIONS + ["use_fast_math", "extra_cuda_cflags", "compute_capability", "allow_cuda_graph"]

SRC = """
// @xk scale arg ret attr.k:float32
void scale(const xk::Tensor x, xk::Tensor out, float k) {
  const float* in = x.data<float>(); float* o = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = k * in[i];
}
"""


@pytest.mark.parametrize("loader", LOADERS, ids=lambda f: f.__name__)
def test_loaders_spell_out_their_options_with_docs(loader):
    params = inspect.signature(loader).parameters
    expected = CUDA_OPTIONS if "cuda" in loader.__name__ else CPP_OPTIONS
    for option in expected:
        assert option in params, (loader.__name__, option)
        assert params[option].kind is inspect.Parameter.KEYWORD_ONLY
        assert f"{option}:" in loader.__doc__, (loader.__name__, option)  # an Args entry per option
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert "Example::" in loader.__doc__
    if "cuda" not in loader.__name__:
        assert "use_fast_math" not in params  # CUDA options are not offered for C++
    text = _help_text(loader)
    assert "extra_include_paths" in text and "force_rebuild" in text


def _help_text(obj) -> str:
    import io
    import pydoc

    buf = io.StringIO()
    pydoc.Helper(output=buf).help(obj)
    return buf.getvalue()


@pytest.mark.parametrize("loader, args, typo, meant", [
    (xlakern.load_cpp_inline, ("m", SRC), "extra_cflag", "extra_cflags"),
    (xlakern.load_cpp_file, ("k.cc",), "optimisation_level", "optimization_level"),
    (xlakern.load_cuda_inline, ("m", "x"), "use_fastmath", "use_fast_math"),
    (xlakern.load_cuda_file, ("k.cu",), "computecapability", "compute_capability"),
    (xlakern.load_cuda_dir, (".",), "file_pattern", "file_patterns"),
    (xlakern.load_cpp_dir, (".",), "file_pattern", "file_patterns"),
])
def test_misspelt_option_names_the_public_function_and_the_closest_option(loader, args, typo, meant):
    with pytest.raises(xlakern.OptionError) as err:
        loader(*args, **{typo: 1})
    message = str(err.value)
    assert message.startswith(f"{loader.__name__}()"), message
    assert f"did you mean '{meant}'" in message
    assert "_load" not in message
    assert isinstance(err.value, TypeError) and isinstance(err.value, xlakern.XlakernError)


def test_a_far_off_option_lists_what_the_loader_takes():
    with pytest.raises(xlakern.OptionError, match=r"'zzz'\. It takes: .*extra_cflags"):
        xlakern.load_cpp_inline("m", SRC, zzz=True)


def test_options_reach_the_build(rng):
    name = unique_name("opts")
    mod = xlakern.load_cpp_inline(name, SRC, optimization_level=1, extra_cflags=["-DXK_UNUSED=1"], quiet=True)
    x = rng.standard_normal(64).astype(np.float32)
    k = float(rng.uniform(0.5, 2.0))
    with jax.default_device(jax.devices("cpu")[0]):
        y = mod.scale(jnp.asarray(x), outs=jax.ShapeDtypeStruct(x.shape, x.dtype), k=k)
    np.testing.assert_allclose(np.asarray(y), np.float32(k) * x, rtol=1e-6)
    with pytest.raises(xlakern.XlakernError, match="optimization_level"):
        xlakern.load_cpp_inline(unique_name("opts"), SRC, optimization_level=7)


def test_reloading_other_content_under_a_loaded_name_fails_before_compiling(monkeypatch):
    name = unique_name("reload")
    first = xlakern.load_cpp_inline(name, SRC)
    assert xlakern.load_cpp_inline(name, SRC) is first

    def refuse(*args, **kwargs):
        raise AssertionError("compiled a build that could never be registered")

    monkeypatch.setattr(xlakern._module._build, "Builder", refuse)
    changed = SRC.replace("k * in[i]", "k * in[i] + 1")
    for force in (False, True):
        with pytest.raises(xlakern.RegistrationError, match=r"already registered from other content.*new name"):
            xlakern.load_cpp_inline(name, changed, force_rebuild=force)
    assert xlakern.load_cpp_inline(name, SRC) is first


def _cli(*args: str, cache=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if cache is not None:
        env["XLAKERN_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "xlakern", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def test_help_exits_zero_and_lists_the_commands():
    for args in (["--help"], ["cache", "--help"], ["doctor", "--help"]):
        out = _cli(*args)
        assert out.returncode == 0, out.stderr
        assert "usage: python -m xlakern" in out.stdout
    assert "cache" in _cli("--help").stdout and "clear" in _cli("cache", "--help").stdout
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"xlakern {xlakern.__version__}"


def test_doctor_reports_every_component_driver_gpus_and_threading(tmp_path):
    import jaxlib
    import llvmlite
    import numba

    out = _cli("doctor", cache=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {key.strip(): value.strip() for key, value in
            (line.split("  ", 1) for line in out.stdout.splitlines() if line.strip())}
    assert rows["jax / jaxlib"] == f"{jax.__version__} / {jaxlib.__version__}"
    assert rows["numpy"] == np.__version__
    assert rows["numba"] == numba.__version__
    assert rows["llvmlite"] == llvmlite.__version__
    from importlib import metadata

    for label, dist in [("numba-cuda", "numba-cuda"), ("warp", "warp-lang"), ("nanobind (builds only)", "nanobind")]:
        try:
            expected = metadata.version(dist)
        except metadata.PackageNotFoundError:
            expected = "not installed"
        assert rows[label] == expected, label
    # The layer xlakern starts for parallel kernels, by name.
    assert rows["numba threading layer"].split()[0] in ("tbb", "omp", "workqueue")
    assert rows["NVIDIA driver"].startswith(("CUDA ", "no NVIDIA driver", "libcuda.so.1 found"))
    assert "GPUs" in rows and "host compiler" in rows and "nvcc" in rows
    assert rows["registered targets"].startswith("none yet: this is a new process")
    assert str(tmp_path) in rows["cache dir"]


def test_driver_version_decodes_cuDriverGetVersion(monkeypatch):
    from xlakern import _diagnostics

    class FakeLibcuda:
        @staticmethod
        def cuDriverGetVersion(out):
            out._obj.value = 13010
            return 0

    monkeypatch.setattr(_diagnostics.ctypes, "CDLL", lambda name: FakeLibcuda())
    assert _diagnostics.nvidia_driver_version() == "CUDA 13.1 (libcuda.so.1)"

    def missing(name):
        raise OSError("not found")

    monkeypatch.setattr(_diagnostics.ctypes, "CDLL", missing)
    assert _diagnostics.nvidia_driver_version().startswith("no NVIDIA driver")


def test_print_diagnostics_in_a_process_with_targets_lists_them(capsys):
    name = unique_name("diag13")
    xlakern.load_cpp_inline(name, SRC)
    xlakern.print_diagnostics()
    line = [row for row in capsys.readouterr().out.splitlines() if row.startswith("registered targets")][0]
    assert f"{name}.scale" in line


def test_cache_list_and_clear(tmp_path):
    names = [unique_name("cli_a"), unique_name("cli_b")]
    script = ("import xlakern\n" + "".join(
        f"xlakern.load_cpp_inline({n!r}, {SRC!r})\n" for n in names))
    built = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, XLAKERN_CACHE_DIR=str(tmp_path)),
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    listed = _cli("cache", "list", cache=tmp_path)
    assert listed.returncode == 0, listed.stderr
    for n in names:
        row = [line for line in listed.stdout.splitlines() if line.startswith(n + " ")]
        assert row and row[0].split()[1] == "1", listed.stdout
    cleared = _cli("cache", "clear", names[0], cache=tmp_path)
    assert cleared.returncode == 0 and "removed 1 build(s)" in cleared.stdout
    assert [p for p in (tmp_path / names[0]).iterdir() if not p.name.startswith(".")] == []
    assert [p for p in (tmp_path / names[1]).iterdir() if not p.name.startswith(".")] != []
    missing = _cli("cache", "clear", "no_such_module", cache=tmp_path)
    assert missing.returncode == 1 and "cache list" in missing.stderr
    everything = _cli("cache", "clear", cache=tmp_path)
    assert everything.returncode == 0 and "removed 1 build(s) of everything" in everything.stdout
    assert "no builds cached" in _cli("cache", "list", cache=tmp_path).stdout


def test_cuda_option_on_a_cpp_loader_says_it_is_cuda_only():
    with pytest.raises(xlakern.OptionError, match=r"load_cpp_inline\(\).*'use_fast_math' \(it applies to CUDA"):
        xlakern.load_cpp_inline("m", SRC, use_fast_math=True)
