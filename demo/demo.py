"""xlakern demo: one LIF step written in C++ and in Numba (and, with a GPU, CUDA C++ and Numba
CUDA), each called from jitted JAX code.

Run with `make demo`. Prints results, checks them against jnp and times each call
beside the equivalent jnp op.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

import xlakern

A = 0.1  # dt / tau

CPP = r"""
#include <cmath>

// One Euler step of leaky integrate-and-fire neurons: v <- v + dt/tau (-v + i_ext).
// @xk lif_step arg arg ret attr.dt_over_tau:float32
void lif_step(const xk::Tensor v, const xk::Tensor i_ext, xk::Tensor v_out, float dt_over_tau) {
  XK_CHECK(v.numel() == i_ext.numel()) << "v has " << v.numel() << " neurons, i_ext " << i_ext.numel();
  const float* pv = v.data<float>();
  const float* pi = i_ext.data<float>();
  float* po = v_out.data<float>();
  xk::parallel_for(v.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) po[k] = pv[k] + dt_over_tau * (pi[k] - pv[k]);
  });
}
"""

CUDA = r"""
#include <cuda_runtime.h>

__global__ void lif_kernel(const float* v, const float* i_ext, float* out, int64_t n, float a) {
  int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (k < n) out[k] = v[k] + a * (i_ext[k] - v[k]);
}

// @xk lif_step arg arg ret attr.dt_over_tau:float32 stream
void lif_step(const xk::Tensor v, const xk::Tensor i_ext, xk::Tensor v_out, float dt_over_tau,
              int64_t stream) {
  int64_t n = v.numel();
  lif_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
      v.data<float>(), i_ext.data<float>(), v_out.data<float>(), n, dt_over_tau);
  XK_CHECK_LAUNCH();
}
"""


def per_call_us(fn, *args, repeats=200):
    for _ in range(10):  # warm up: compile, allocate, let the GPU clock up
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


@numba.njit(parallel=True)
def lif_numba(v, i_ext, v_out):
    for k in numba.prange(v.size):
        v_out[k] = v[k] + np.float32(A) * (i_ext[k] - v[k])


def lif_numba_cuda():
    from numba import cuda

    @cuda.jit
    def lif(v, i_ext, v_out):
        k = cuda.grid(1)
        if k < v.size:
            v_out[k] = v[k] + np.float32(A) * (i_ext[k] - v[k])

    return lif


def run(label: str, platform: str, step, n: int) -> None:
    device = jax.devices(platform)[0]
    rng = np.random.default_rng()
    v = jax.device_put(rng.standard_normal(n).astype(np.float32), device)
    i_ext = jax.device_put(rng.standard_normal(n).astype(np.float32), device)

    kernel = jax.jit(step)
    reference = jax.jit(lambda v, i: v + A * (i - v))

    got, want = kernel(v, i_ext), reference(v, i_ext)
    err = float(jnp.max(jnp.abs(got - want)))
    print(f"[{label}] v_out[:3] = {np.asarray(got[:3])}   jnp: {np.asarray(want[:3])}   max |diff| = {err:.2e}")
    assert err < 1e-5, "kernel and jnp disagree"
    print(f"[{label}] N={n:,}: xlakern {per_call_us(kernel, v, i_ext):8.1f} us/call   "
          f"jnp {per_call_us(reference, v, i_ext):8.1f} us/call   (median of 200 jitted calls)")


def main() -> None:
    print(f"xlakern {xlakern.__version__}, jax {jax.__version__}, devices: {jax.devices()}")
    try:
        has_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        has_gpu = False
    out = lambda n: jax.ShapeDtypeStruct((n,), jnp.float32)  # noqa: E731
    t = time.perf_counter()
    cpp = xlakern.load_cpp_inline("demo_lif_cpu", CPP)
    print(f"loaded {cpp} in {time.perf_counter() - t:.2f} s (a second run hits the cache)")
    steps = [("C++", "cpu", lambda n: lambda v, i: cpp.lif_step(v, i, outs=out(n), dt_over_tau=A), (1_000, 1_000_000)),
             ("Numba", "cpu", lambda n: xlakern.numba_kernel(lif_numba, outs=out(n)), (1_000, 1_000_000))]
    if has_gpu:
        cuda_mod = xlakern.load_cuda_inline("demo_lif_cuda", CUDA)
        lif_cuda = lif_numba_cuda()
        steps += [("CUDA C++", "gpu", lambda n: lambda v, i: cuda_mod.lif_step(v, i, outs=out(n), dt_over_tau=A),
                   (10_000, 10_000_000)),
                  ("Numba CUDA", "gpu", lambda n: xlakern.numba_cuda_kernel(lif_cuda, outs=out(n), launch_dims=n),
                   (10_000, 10_000_000))]
    else:
        print("[gpu] no GPU visible to JAX: skipping the CUDA and Numba CUDA kernels")
    for label, platform, make, sizes in steps:
        for n in sizes:
            run(label, platform, make(n), n)
    print("demo OK")


if __name__ == "__main__":
    main()
