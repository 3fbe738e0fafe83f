"""Loading from files, token-less annotations, cache clearing around a build in progress, doctor."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import xlakern
from conftest import unique_name

SDS = jax.ShapeDtypeStruct
pytestmark = pytest.mark.usefixtures("on_cpu")


def test_load_cpp_file_with_header_next_to_it(tmp_path, rng):
    (tmp_path / "gain.h").write_text("#pragma once\ninline float gain(float v) { return 0.5f * v; }\n")
    src = tmp_path / "decay_kernels.cc"
    src.write_text('#include "gain.h"\n'
                   "// @xk halve\n"  # an annotation without tokens: inferred from the signature
                   "void halve(const xk::Tensor x, xk::Tensor out, float bias) {\n"
                   "  for (int64_t i = 0; i < x.numel(); ++i) out.data<float>()[i] = gain(x.data<float>()[i]) + bias;\n"
                   "}\n")
    mod = xlakern.load_cpp_file(src)
    assert mod.name == "decay_kernels"
    assert mod.functions == {"halve": "arg ret attr.bias:float32"}
    x = rng.standard_normal(33).astype(np.float32)
    np.testing.assert_allclose(mod.halve(x, outs=SDS(x.shape, x.dtype), bias=0.25), 0.5 * x + 0.25, rtol=1e-6)


def test_load_cuda_file_compiles(tmp_path):
    try:
        xlakern._toolchain.find_nvcc()
    except xlakern.ToolchainError:
        pytest.skip("nvcc not installed")
    src = tmp_path / "neg.cu"
    src.write_text("__global__ void neg_k(const float* x, float* o, int n) {\n"
                   "  int k = blockIdx.x * blockDim.x + threadIdx.x; if (k < n) o[k] = -x[k]; }\n"
                   "void neg(const xk::Tensor x, xk::Tensor o, int64_t stream) {\n"
                   "  int n = x.numel(); neg_k<<<(n + 127) / 128, 128, 0, (cudaStream_t)stream>>>("
                   "x.data<float>(), o.data<float>(), n); }\n")
    mod = xlakern.load_cuda_file(src, ["neg"], name=unique_name("negf"), compute_capability="9.0")
    assert mod.functions == {"neg": "arg ret stream"} and mod.path.is_file()


def test_clear_cache_never_deletes_a_build_in_progress(tmp_path):
    xlakern.set_cache_dir(tmp_path)
    try:
        name = unique_name("busy")
        mod = xlakern.load_cpp_inline(name, "// @xk f ret\nvoid f(xk::Tensor o) {}")
        key_dir = mod.path.parent
        lock = key_dir.parent / f".{key_dir.name}.lock"
        assert lock.exists()
        with xlakern._cache.file_lock(lock):  # stands for another process building this key
            result = xlakern.clear_cache(name)
            assert result == {"removed": [], "skipped": [str(key_dir)]}
            assert mod.path.exists()
        assert xlakern.clear_cache(name)["removed"] == [str(key_dir)]
        assert not key_dir.exists()
    finally:
        xlakern.set_cache_dir(None)


def test_doctor_reports_toolchain_cache_and_targets():
    out = subprocess.run([sys.executable, "-m", "xlakern", "doctor"], capture_output=True, text=True,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
    assert out.returncode == 0, out.stderr
    for field in ("xlakern", "jax / jaxlib", "XLA FFI headers", "host compiler", "nvcc", "GPU arch",
                  "cache dir", "registered targets"):
        assert field in out.stdout
    bad = subprocess.run([sys.executable, "-m", "xlakern", "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_print_diagnostics_lists_registered_targets(capsys):
    name = unique_name("diag")
    xlakern.load_cpp_inline(name, "// @xk g ret\nvoid g(xk::Tensor o) {}")
    xlakern.print_diagnostics()
    assert f"{name}.g" in capsys.readouterr().out
