"""BrainEvent 0.3's brainevent.config settings on xlakern.config: what each one does here."""

from __future__ import annotations

import os
import stat

import pytest

import xlakern
from xlakern import _toolchain


@pytest.fixture
def restore_settings():
    saved = (xlakern.config.get_numba_parallel(), xlakern.config.get_numba_num_threads(),
             xlakern.config.get_lfsr_algorithm(), _toolchain._nvcc_preference, _toolchain.pinned_arch())
    yield
    xlakern.config._numba_parallel, xlakern.config._numba_num_threads = saved[0], saved[1]
    xlakern.config.set_lfsr_algorithm(saved[2])
    _toolchain.set_nvcc_preference(saved[3])
    _toolchain._pinned_arch = saved[4]


def test_numba_parallel_and_lfsr_are_recorded_and_checked(restore_settings):
    numba = pytest.importorskip("numba")
    before = numba.get_num_threads()
    try:
        xlakern.config.set_numba_parallel(True, num_threads=1)
        assert xlakern.config.get_numba_parallel() is True and xlakern.config.get_numba_num_threads() == 1
        assert numba.get_num_threads() == 1  # Numba's own pool, as in BrainEvent
    finally:
        numba.set_num_threads(before)
    xlakern.config.set_numba_parallel(False)
    assert xlakern.config.get_numba_parallel() is False and xlakern.config.get_numba_num_threads() is None
    with pytest.raises(xlakern.ConfigError, match="num_threads"):
        xlakern.config.set_numba_parallel(True, num_threads=0)
    xlakern.config.set_lfsr_algorithm("lfsr113")
    assert xlakern.config.get_lfsr_algorithm() == "lfsr113"
    with pytest.raises(xlakern.ConfigError, match="lfsr88"):
        xlakern.config.set_lfsr_algorithm("mt19937")


def fake_nvcc(directory, name="nvcc"):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho fake\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return os.path.realpath(path)


def test_prefer_system_nvcc_reorders_the_search(restore_settings, tmp_path, monkeypatch):
    """pip's nvidia-cuda-nvcc first by default, PATH first after prefer_system_nvcc(); XLAKERN_NVCC and
    CUDA_HOME before both."""
    system = fake_nvcc(str(tmp_path / "system"))
    pip = fake_nvcc(str(tmp_path / "nvidia" / "cuda_nvcc" / "bin"))
    for var in ("XLAKERN_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "system"))
    monkeypatch.setattr(_toolchain, "_pip_nvcc_candidates", lambda: [_toolchain.Path(pip)])
    assert _toolchain.find_nvcc() == pip
    xlakern.config.prefer_system_nvcc()
    assert _toolchain.find_nvcc() == system
    xlakern.config.prefer_system_nvcc(False)
    assert _toolchain.find_nvcc() == pip
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "system" / ".."))
    fake_nvcc(str(tmp_path / "bin"))
    assert _toolchain.find_nvcc() == os.path.realpath(tmp_path / "bin" / "nvcc")


def test_compute_capability_pin_decides_the_build_arch(restore_settings, monkeypatch):
    monkeypatch.delenv("XLAKERN_CUDA_ARCH", raising=False)
    xlakern.config.set_compute_capability("8.6")
    assert xlakern.config.get_compute_capability() == ["sm_86"]
    assert _toolchain.cuda_arch() == "86"
    assert _toolchain.cuda_arch("9.0") == "90"  # a loader's own argument wins
    monkeypatch.setenv("XLAKERN_CUDA_ARCH", "80")
    assert _toolchain.cuda_arch() == "80"  # and so does the environment
    monkeypatch.delenv("XLAKERN_CUDA_ARCH")
    xlakern.config.set_compute_capability(["sm_90"])
    assert _toolchain.cuda_arch() == "90"
    with pytest.raises(xlakern.ConfigError, match="one architecture"):
        xlakern.config.set_compute_capability(["8.0", "9.0"])
    with pytest.raises(xlakern.GpuArchDetectionError, match="not a compute capability"):
        xlakern.config.set_compute_capability("ninety")
    xlakern.config.set_compute_capability(None)
    assert xlakern.config.get_compute_capability() is None


SCALE = r"""
#include <cuda_runtime.h>
__global__ void scale_kernel(const float* x, float* out, int n, float factor) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) out[idx] = x[idx] * factor;
}
// @xk scale arg ret attr.factor:float32 stream
void scale(const xk::Tensor x, xk::Tensor out, float factor, int64_t stream) {
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), n,
                                                                      factor);
}
"""


@pytest.mark.gpu
def test_gpu_module_built_for_the_pinned_arch_runs(restore_settings, monkeypatch):
    """Pinned to the GPU's own arch, a module builds for it and runs; another pin is another cache entry."""
    import jax
    import numpy as np
    from conftest import unique_name

    monkeypatch.delenv("XLAKERN_CUDA_ARCH", raising=False)
    gpu = jax.devices("gpu")[0]
    xlakern.config.set_compute_capability(gpu.compute_capability)
    name = unique_name("pinned")
    mod = xlakern.load_cuda_inline(name, SCALE)
    x = jax.device_put(np.random.default_rng().standard_normal(10_001).astype(np.float32), gpu)
    out = mod.scale(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), factor=np.float32(2.5))
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) * 2.5, rtol=1e-6)
    xlakern.config.set_compute_capability("8.0")
    other = xlakern.load_cuda_inline(name + "_80", SCALE)
    assert other.path.parent.name != mod.path.parent.name
