"""xlakern demo: a C++ kernel (and, with a GPU, a CUDA kernel) called from jitted JAX code.

Run with `make demo`. Prints results, checks them against jnp and times each call
beside the equivalent jnp op.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import xlakern

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


def run(platform: str, mod, n: int) -> None:
    device = jax.devices(platform)[0]
    rng = np.random.default_rng()
    v = jax.device_put(rng.standard_normal(n).astype(np.float32), device)
    i_ext = jax.device_put(rng.standard_normal(n).astype(np.float32), device)
    a = 0.1

    kernel = jax.jit(lambda v, i: mod.lif_step(v, i, outs=jax.ShapeDtypeStruct(v.shape, v.dtype), dt_over_tau=a))
    reference = jax.jit(lambda v, i: v + a * (i - v))

    got, want = kernel(v, i_ext), reference(v, i_ext)
    err = float(jnp.max(jnp.abs(got - want)))
    print(f"[{platform}] v_out[:4] = {np.asarray(got[:4])}   jnp: {np.asarray(want[:4])}   max |diff| = {err:.2e}")
    assert err < 1e-5, "kernel and jnp disagree"
    print(f"[{platform}] N={n:,}: xlakern {per_call_us(kernel, v, i_ext):8.1f} us/call   "
          f"jnp {per_call_us(reference, v, i_ext):8.1f} us/call   (median of 200 jitted calls)")


def main() -> None:
    print(f"xlakern {xlakern.__version__}, jax {jax.__version__}, devices: {jax.devices()}")
    try:
        has_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        has_gpu = False
    setups = [("cpu", xlakern.load_cpp_inline, "demo_lif_cpu", CPP, (1_000, 1_000_000))]
    if has_gpu:
        setups.append(("gpu", xlakern.load_cuda_inline, "demo_lif_cuda", CUDA, (10_000, 10_000_000)))
    else:
        print("[gpu] no GPU visible to JAX: skipping the CUDA kernel")
    for platform, load, name, source, sizes in setups:
        t = time.perf_counter()
        mod = load(name, source)
        print(f"loaded {mod} in {time.perf_counter() - t:.2f} s (a second run hits the cache)")
        for n in sizes:
            run(platform, mod, n)
    print("demo OK")


if __name__ == "__main__":
    main()
