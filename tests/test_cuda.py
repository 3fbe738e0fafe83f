"""CUDA modules. Compile-only tests run anywhere nvcc exists; execution tests need a GPU (`gpu`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import gpu_available, included_headers, unique_name

SDS = jax.ShapeDtypeStruct

try:
    xlakern._toolchain.find_nvcc()
    HAVE_NVCC = True
except xlakern.ToolchainError:
    HAVE_NVCC = False

needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not installed")
# Without a GPU we must say which arch to build for; with one, the GPU's own arch is used.
ARCH = {} if gpu_available() else {"compute_capability": "9.0"}

# The seed sources of the CUDA tutorial, verbatim.
VECTOR_ADD = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) out[idx] = a[idx] + b[idx];
}

// @BE vector_add arg arg ret stream
void vector_add(const BE::Tensor a, const BE::Tensor b,
                BE::Tensor out, int64_t stream) {
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(
        static_cast<const float*>(a.data_ptr()),
        static_cast<const float*>(b.data_ptr()),
        static_cast<float*>(out.data_ptr()), n);
}
"""

SCALE_BY = r"""
#include <cuda_runtime.h>
#include "brainevent/common.h"

__global__ void scale_kernel(const float* x, float* out, int n, float factor) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) out[idx] = x[idx] * factor;
}

// @BE scale_by arg ret attr.scale_factor:float32 stream
void scale_by(const BE::Tensor x, BE::Tensor out,
              float scale_factor, int64_t stream) {
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(
        static_cast<const float*>(x.data_ptr()),
        static_cast<float*>(out.data_ptr()), n, scale_factor);
    BE_CHECK_KERNEL_LAUNCH();
}
"""

# xlakern-style kernels: a Tensor passed into __global__, two outputs, fast math, checks.
EXTRA = r"""
#include <cuda_runtime.h>

__global__ void lif_kernel(const xk::Tensor v, const xk::Tensor i_ext, xk::Tensor v_out, xk::Tensor spk,
                           float decay, float thresh) {
  int64_t n = v.numel();
  int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (k >= n) return;
  float nv = v.data<float>()[k] * decay + i_ext.data<float>()[k];
  bool fire = nv >= thresh;
  v_out.data<float>()[k] = fire ? 0.0f : nv;
  spk.data<bool>()[k] = fire;
}

// @xk lif_step arg arg ret ret attr.decay:float32 attr.thresh:float32 stream
void lif_step(const xk::Tensor v, const xk::Tensor i_ext, xk::Tensor v_out, xk::Tensor spk,
              float decay, float thresh, int64_t stream) {
  XK_CHECK(v.numel() == i_ext.numel()) << "v and i_ext differ in size: " << v.numel() << " vs " << i_ext.numel();
  int64_t n = v.numel();
  if (n == 0) return;
  lif_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(v, i_ext, v_out, spk, decay, thresh);
  XK_CHECK_LAUNCH();
}

__global__ void gauss_kernel(const float* x, float* out, int64_t n) {
  int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (k < n) out[k] = expf(-x[k] * x[k]) * sinf(x[k]);
}

// @xk gauss arg ret attr.block:int32 stream
void gauss(const xk::Tensor x, xk::Tensor out, int32_t block, int64_t stream) {
  int64_t n = x.numel();
  gauss_kernel<<<(unsigned)((n + block - 1) / block), block, 0, (cudaStream_t)stream>>>(
      x.data<float>(), out.data<float>(), n);
  XK_CHECK_LAUNCH();
}

// @xk copy_any arg ret stream
void copy_any(const xk::Tensor x, xk::Tensor out, int64_t stream) {
  XK_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), x.data_ptr(), x.nbytes(), cudaMemcpyDeviceToDevice,
                                (cudaStream_t)stream));
}
"""


# -- compile-only (CI) ------------------------------------------------------------------------------

@needs_nvcc
def test_seed_sources_compile_to_real_machine_code(capfd):
    mod = xlakern.load_cuda_inline(name=unique_name("seed_compile"), cuda_sources=VECTOR_ADD,
                                   functions=None, compute_capability="9.0", verbose=True)
    assert mod.functions == {"vector_add": "arg arg ret stream"}
    assert mod.platform == "cuda"
    # real SASS for Hopper (sm_90) plus PTX for newer GPUs, not only PTX
    assert "code=[sm_90,compute_90]" in capfd.readouterr().err
    from pathlib import Path

    cuobjdump = shutil.which("cuobjdump") or str(Path(xlakern._toolchain.find_nvcc()).with_name("cuobjdump"))
    if Path(cuobjdump).exists():
        listing = subprocess.run([cuobjdump, "--list-elf", str(mod.path)], capture_output=True, text=True)
        assert listing.returncode == 0, listing.stderr
        assert "sm_90" in listing.stdout


@needs_nvcc
def test_fast_math_and_arch_are_part_of_the_key():
    name = unique_name("fm")
    a = xlakern.load_cuda_inline(name, SCALE_BY, compute_capability="9.0")
    b = xlakern.load_cuda_inline(name + "_fast", SCALE_BY, compute_capability="9.0", use_fast_math=True)
    c = xlakern.load_cuda_inline(name + "_80", SCALE_BY, compute_capability="8.0")
    assert len({a.path.parent.name, b.path.parent.name, c.path.parent.name}) == 3
    assert a.functions == {"scale_by": "arg ret attr.scale_factor:float32 stream"}


@needs_nvcc
def test_cuda_compile_error_shows_user_line():
    name = unique_name("cuda_broken")
    src = "// @xk f ret stream\nvoid f(xk::Tensor o, int64_t stream) {\n\n  undefined_thing<<<1, 1>>>();\n}\n"
    with pytest.raises(xlakern.CompilationError, match=rf"inline:{name}\(4\)|inline:{name}:4"):
        xlakern.load_cuda_inline(name, src, compute_capability="9.0")


@needs_nvcc
def test_cuda_dir_compiles_each_file(tmp_path):
    (tmp_path / "common.cuh").write_text("#pragma once\n__device__ inline float twice(float v) { return 2 * v; }\n")
    for i in range(2):
        (tmp_path / f"k{i}.cu").write_text(
            f'#include "common.cuh"\n__global__ void kern{i}(const float* x, float* o, int n) {{\n'
            f'  int k = blockIdx.x * blockDim.x + threadIdx.x; if (k < n) o[k] = twice(x[k]) + {i};\n}}\n'
            f"// @xk add{i} arg ret stream\n"
            f"void add{i}(const xk::Tensor x, xk::Tensor o, int64_t stream) {{\n"
            f"  int n = x.numel(); kern{i}<<<(n + 127) / 128, 128, 0, (cudaStream_t)stream>>>(x.data<float>(), o.data<float>(), n);\n}}\n")
    (tmp_path / "notes.txt").write_text("not a source")
    mod = xlakern.load_cuda_dir(tmp_path, name=unique_name("cudadir"), **(ARCH or {}))
    # each file is its own translation unit; both include the shared header
    assert set(mod.functions) == {"add0", "add1"}
    if gpu_available():
        x = jnp.asarray(np.random.default_rng().standard_normal(1000).astype(np.float32))
        np.testing.assert_allclose(mod.add1(x, outs=SDS(x.shape, x.dtype)), 2 * np.asarray(x) + 1, rtol=1e-6)


@needs_nvcc
def test_public_header_leaves_iostreams_and_thread_headers_out_of_cuda_units(tmp_path):
    """Every CUDA source gets xlakern.h. It pulls in neither <sstream> (XK_CHECK formats values itself)
    nor <mutex>/<condition_variable> (parallel_for is serial in CUDA units): together about 1.1 s of nvcc
    on each translation unit of every CUDA module (the 2-core VM, session 73)."""
    src = tmp_path / "empty.cu"
    src.write_text("__global__ void k(float* p) { p[0] = 1; }\n")
    nvcc = xlakern._toolchain.find_nvcc()
    headers = included_headers([nvcc, "-std=c++17", "-x", "cu", "-isystem", str(xlakern._toolchain.include_dir()),
                                 "-include", "xlakern/xlakern.h"], src)
    assert {"xlakern.h", "check.h", "parallel.h", "cuda_fp16.h"} <= headers  # the listing is complete
    assert not headers & {"sstream", "istream", "ostream", "mutex", "condition_variable", "thread"}


STREAMED_CHECK = r"""
#include <cuda_fp16.h>
%(include)s
struct Coord { int x, y; };
std::ostream& operator<<(std::ostream& os, const Coord& c) { return os << "Coord(" << c.x << ", " << c.y << ")"; }

// @xk fails_with_values arg ret stream
void fails_with_values(const xk::Tensor x, xk::Tensor out, int64_t stream) {
  int64_t covered = 0;
  xk::parallel_for(x.numel(), 16, [&](int64_t b, int64_t e) { covered += e - b; });
  const float first = x.numel() ? 1.5f : 0.0f;
  XK_CHECK(covered == -1) << "covered " << covered << " of " << x.numel() << ", threads " << xk::num_threads()
      << ", half " << __float2half(2.5f) << ", float " << first %(custom)s;
}
"""


@needs_nvcc
def test_check_streaming_a_class_needs_sstream_and_says_so():
    """A type with only its own operator<< needs <sstream>, which xlakern.h no longer brings: the build error
    says to include it, and with it the same source compiles."""
    without = STREAMED_CHECK % {"include": "#include <ostream>", "custom": '<< ", " << Coord{3, 4}'}
    with pytest.raises(xlakern.CompilationError, match=r"#include <sstream> in this source"):
        xlakern.load_cuda_inline(unique_name("check_custom"), without, compute_capability="9.0")
    with_sstream = STREAMED_CHECK % {"include": "#include <sstream>", "custom": '<< ", " << Coord{3, 4}'}
    mod = xlakern.load_cuda_inline(unique_name("check_custom_ok"), with_sstream, compute_capability="9.0")
    assert set(mod.functions) == {"fails_with_values"}


# -- execution (GPU) --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seeds():
    xlakern.load_cuda_inline(name="my_kernels", cuda_sources=VECTOR_ADD, functions=None)
    xlakern.load_cuda_inline(name="scale_ops", cuda_sources=SCALE_BY)
    return xlakern.load_cuda_inline(name="cuda_extra", cuda_sources=EXTRA)


def _gpu(x):
    return jax.device_put(x, jax.devices("gpu")[0])


@pytest.mark.gpu
def test_seed_vector_add_and_scale_by_via_plain_ffi_call(seeds, rng):
    a = _gpu(rng.standard_normal(100_003).astype(np.float32))
    b = _gpu(rng.standard_normal(100_003).astype(np.float32))
    out = jax.ffi.ffi_call("my_kernels.vector_add", SDS(a.shape, a.dtype))(a, b)
    np.testing.assert_allclose(out, np.asarray(a) + np.asarray(b), rtol=1e-6)
    add_jit = jax.jit(lambda a, b: jax.ffi.ffi_call("my_kernels.vector_add", SDS(a.shape, a.dtype))(a, b))
    np.testing.assert_allclose(add_jit(a, b), np.asarray(a) + np.asarray(b), rtol=1e-6)
    scaled = jax.ffi.ffi_call("scale_ops.scale_by", SDS(a.shape, a.dtype))(a, scale_factor=np.float32(3.0))
    np.testing.assert_allclose(scaled, np.asarray(a) * 3, rtol=1e-6)


@pytest.mark.gpu
def test_two_outputs_tensor_passed_to_global(seeds, rng):
    v = _gpu(rng.uniform(0, 1.2, 50_001).astype(np.float32))
    i_ext = _gpu(rng.uniform(0, 0.3, 50_001).astype(np.float32))
    v_out, spk = jax.jit(lambda v, i: seeds.lif_step(v, i, outs=(SDS(v.shape, v.dtype), SDS(v.shape, jnp.bool_)),
                                                     decay=0.9, thresh=1.0))(v, i_ext)
    nv = np.asarray(v) * np.float32(0.9) + np.asarray(i_ext)
    np.testing.assert_array_equal(spk, nv >= 1.0)
    np.testing.assert_allclose(v_out, np.where(nv >= 1.0, 0, nv), rtol=1e-6)
    assert 0 < int(np.asarray(spk).sum()) < v.size


@pytest.mark.gpu
def test_kernel_inside_fori_loop_1000_steps(seeds, rng):
    v0 = _gpu(rng.uniform(0, 1, 4096).astype(np.float32))
    i_ext = _gpu(rng.uniform(0, 0.2, 4096).astype(np.float32))

    @jax.jit
    def run(v, i_ext):
        def step(_, carry):
            v, count = carry
            v, spk = seeds.lif_step(v, i_ext, outs=(SDS(v.shape, v.dtype), SDS(v.shape, jnp.bool_)),
                                    decay=0.95, thresh=1.0)
            return v, count + spk.astype(jnp.int32)
        return jax.lax.fori_loop(0, 1000, step, (v, jnp.zeros(v.shape, jnp.int32)))

    def reference(v, i_ext):
        v, count = np.asarray(v), np.zeros(v.shape, np.int32)
        i_ext = np.asarray(i_ext)
        for _ in range(1000):
            nv = v * np.float32(0.95) + i_ext
            fire = nv >= 1.0
            v, count = np.where(fire, np.float32(0), nv).astype(np.float32), count + fire
        return v, count

    v, count = run(v0, i_ext)
    rv, rcount = reference(v0, i_ext)
    # nvcc contracts v*0.95 + i into one FMA, NumPy rounds twice: a neuron that lands on the
    # threshold within that rounding fires one step apart, and its trajectory shifts. Allow one
    # such neuron in a thousand; every other must match closely, spike counts within one.
    v, count = np.asarray(v), np.asarray(count)
    off = ~np.isclose(v, rv, rtol=1e-5, atol=1e-5)
    assert off.mean() <= 1e-3, off.sum()
    assert np.abs(count.astype(np.int64) - rcount).max() <= 1
    assert (count == rcount).mean() >= 0.999
    assert rcount.sum() > 0


@pytest.mark.gpu
def test_use_fast_math_result_is_close(rng):
    name = unique_name("fast")
    fast = xlakern.load_cuda_inline(name, EXTRA, use_fast_math=True)
    x = _gpu(rng.uniform(-3, 3, 70_000).astype(np.float32))
    y = fast.gauss(x, outs=SDS(x.shape, x.dtype), block=256)
    xd = np.asarray(x).astype(np.float64)
    np.testing.assert_allclose(y, np.exp(-xd * xd) * np.sin(xd), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_failed_check_and_bad_launch_raise_and_gpu_keeps_working(seeds, rng):
    v = _gpu(rng.standard_normal(10).astype(np.float32))
    w = _gpu(rng.standard_normal(11).astype(np.float32))
    outs = (SDS(v.shape, v.dtype), SDS(v.shape, jnp.bool_))
    # GPU dispatch is asynchronous: the error surfaces when the result is synchronised
    # (as xlakern.KernelError if XLA reports it during the call, else as jax's JaxRuntimeError).
    errors = (xlakern.KernelError, jax.errors.JaxRuntimeError)
    with pytest.raises(errors, match=r"xlakern kernel 'cuda_extra.lif_step' failed.*differ in size: 10 vs 11"):
        jax.block_until_ready(seeds.lif_step(v, w, outs=outs, decay=0.5, thresh=1.0))
    with pytest.raises(errors, match=r"xlakern kernel 'cuda_extra.gauss' failed.*cudaErrorInvalid(Value|Configuration)"):
        jax.block_until_ready(seeds.gauss(v, outs=SDS(v.shape, v.dtype), block=4096))  # > 1024 threads/block
    with pytest.raises(errors, match=r"cuda_extra.lif_step.*differ in size"):  # and under jit
        jax.block_until_ready(jax.jit(lambda v, w: seeds.lif_step(v, w, outs=outs, decay=0.5, thresh=1.0))(v, w))
    y = seeds.gauss(v, outs=SDS(v.shape, v.dtype), block=128)
    vd = np.asarray(v).astype(np.float64)
    np.testing.assert_allclose(y, np.exp(-vd * vd) * np.sin(vd), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_check_message_of_a_cuda_unit_reads_as_ostream_writes_it(rng):
    """XK_CHECK in a CUDA unit formats numbers, half values and (with <sstream>) a class as std::ostream
    would; parallel_for there covers the range serially, on one thread."""
    src = STREAMED_CHECK % {"include": "#include <sstream>", "custom": '<< ", " << Coord{3, 4}'}
    mod = xlakern.load_cuda_inline(unique_name("check_values"), src)
    n = int(rng.integers(20, 200))
    x = _gpu(rng.standard_normal(n).astype(np.float32))
    want = f"covered {n} of {n}, threads 1, half 2.5, float 1.5, Coord(3, 4)"
    with pytest.raises((xlakern.KernelError, jax.errors.JaxRuntimeError), match=re.escape(want)):
        jax.block_until_ready(mod.fails_with_values(x, outs=SDS(x.shape, x.dtype)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "float16", "bfloat16", "float32", "complex64"])
def test_byte_copy_on_gpu(seeds, rng, dtype):
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    raw = rng.integers(0, 256, size=(257, dt.itemsize), dtype=np.uint8)
    if dtype == "bool":
        raw &= 1
    x = raw.reshape(-1).view(dt)
    y = seeds.copy_any(_gpu(x), outs=SDS(x.shape, x.dtype))
    np.testing.assert_array_equal(np.asarray(y).view(np.uint8), x.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(), (0,)])
def test_zero_dim_and_empty_on_gpu(seeds, rng, shape):
    v = _gpu(rng.uniform(0, 1, shape).astype(np.float32))
    v_out, spk = seeds.lif_step(v, v, outs=(SDS(shape, jnp.float32), SDS(shape, jnp.bool_)), decay=1.0, thresh=1.5)
    assert v_out.shape == shape and spk.shape == shape
    np.testing.assert_allclose(v_out, np.where(2 * np.asarray(v) >= 1.5, 0, 2 * np.asarray(v)), rtol=1e-6)


@pytest.mark.gpu
def test_vmap_broadcast_all_on_gpu(seeds, rng):
    x = _gpu(rng.uniform(-2, 2, (8, 1000)).astype(np.float32))
    f = lambda x: seeds.gauss(x, outs=SDS(x.shape, x.dtype), block=256, vmap_method="broadcast_all")
    xd = np.asarray(x).astype(np.float64)
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(x), np.exp(-xd * xd) * np.sin(xd), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_concurrent_calls_from_threads(seeds, rng):
    xs = [_gpu(rng.uniform(-2, 2, 20_000).astype(np.float32)) for _ in range(4)]
    f = jax.jit(lambda x: seeds.gauss(x, outs=SDS(x.shape, x.dtype), block=256))
    results = [None] * 4

    def work(i):
        for _ in range(50):
            results[i] = np.asarray(f(xs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for x, y in zip(xs, results):
        xd = np.asarray(x).astype(np.float64)
        np.testing.assert_allclose(y, np.exp(-xd * xd) * np.sin(xd), rtol=1e-5, atol=1e-6)


# A kernel that records, in its output, whether XLA's stream was being captured into a CUDA
# graph when the handler ran. Under a captured command buffer the value written during capture
# is what every replay writes.
CAPTURE_PROBE = r"""
#include <cuda_runtime.h>
__global__ void put(int32_t* out, int32_t status, const float* x, float* y, int64_t n) {
  int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (k == 0) out[0] = status;
  if (k < n) y[k] = 2.0f * x[k];
}
// @xk probe arg ret ret stream
void probe(const xk::Tensor x, xk::Tensor status, xk::Tensor y, int64_t stream) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  XK_CUDA_CHECK(cudaStreamIsCapturing((cudaStream_t)stream, &s));
  int64_t n = x.numel();
  put<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
      status.data<int32_t>(), (int32_t)s, x.data<float>(), y.data<float>(), n);
  XK_CHECK_LAUNCH();
}
"""

CAPTURE_CHILD = r"""
import os, sys, json, numpy as np, jax, jax.numpy as jnp, xlakern
mod = xlakern.load_cuda_inline(sys.argv[1], os.environ["PROBE_SRC"], allow_cuda_graph=sys.argv[2] == "1")
x = jax.device_put(np.random.default_rng().standard_normal(4096).astype(np.float32))

@jax.jit
def f(x):
    def body(i, carry):
        s, y = mod.probe(carry[1], outs=(jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct(x.shape, x.dtype)))
        return s, jnp.sin(y) + 1.0
    return jax.lax.fori_loop(0, 5, body, (jnp.zeros((1,), jnp.int32), x))

want = np.asarray(x).astype(np.float64)
for _ in range(5):
    want = np.sin(2 * want) + 1
for _ in range(3):  # first run records the graph, later runs replay it
    s, y = f(x)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
print(json.dumps({"status": int(np.asarray(s)[0])}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("allow_cuda_graph", [True, False])
def test_cuda_graph_capture_follows_allow_cuda_graph(allow_cuda_graph):
    import json
    import os
    import sys

    flags = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE --xla_gpu_graph_min_graph_size=1"
    env = dict(os.environ, PROBE_SRC=CAPTURE_PROBE, XLAKERN_QUIET="1", XLA_FLAGS=flags)
    out = subprocess.run([sys.executable, "-c", CAPTURE_CHILD, unique_name("probe"), "1" if allow_cuda_graph else "0"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    status = json.loads(out.stdout.strip().splitlines()[-1])["status"]
    # cudaStreamCaptureStatusActive == 1: the handler ran inside stream capture (graph-compatible);
    # without the trait XLA must run it eagerly, outside any capture.
    assert status == (1 if allow_cuda_graph else 0)
