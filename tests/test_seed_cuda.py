"""BrainEvent's CUDA C++ tutorial (seed 004), every code block verbatim, run as a notebook would.

Blocks run in order in one namespace with ``import brainevent`` pointed at xlakern; the seed's
C++/CUDA sources are unchanged (``BE::Tensor``, ``// @BE``, ``brainevent/common.h``). The seed calls
its modules through raw ``jax.ffi.ffi_call("<module>.<fn>")``, so this also checks that those
targets keep the arg_spec's exact attribute interface. The printed results become asserts.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from seedrun import run_cell

# (name, code) of every code block of seed 004, in order, verbatim.
SEED_CELLS = [
    ("imports", r'''
import jax
import jax.numpy as jnp
import numpy as np
import brainevent
'''),
    ("vector_add_1", r'''
CUDA_SRC = r"""
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

mod = brainevent.load_cuda_inline(
    name="my_kernels",
    cuda_sources=CUDA_SRC,
    functions=None,  # discovered from the // @BE annotation
)
a = jnp.ones(1024, dtype=jnp.float32)
b = jnp.full(1024, 2.0, dtype=jnp.float32)

result = jax.ffi.ffi_call(
    "my_kernels.vector_add",
    jax.ShapeDtypeStruct(a.shape, a.dtype),
)(a, b)

print(result[:5])  # [3. 3. 3. 3. 3.]
'''),
    ("scale_by_2", r'''
CUDA_SRC = r"""
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

mod = brainevent.load_cuda_inline(name="scale_ops", cuda_sources=CUDA_SRC)
result = jax.ffi.ffi_call(
    "scale_ops.scale_by",
    jax.ShapeDtypeStruct(a.shape, a.dtype),
)(a, scale_factor=np.float32(3.0))

print(result[:5])  # [3. 3. 3. 3. 3.]
'''),
    ("compiler_options_3", r'''
mod = brainevent.load_cuda_inline(
    name="fast_kernels",
    cuda_sources=CUDA_SRC,
    optimization_level=3,
    use_fast_math=True,
)
'''),
    ("file_and_jit_4", r'''
# mod = brainevent.load_cuda_file("kernels/my_kernel.cu")

@jax.jit
def add_jit(a, b):
    return jax.ffi.ffi_call(
        "my_kernels.vector_add",
        jax.ShapeDtypeStruct(a.shape, a.dtype),
    )(a, b)

print(add_jit(a, b)[:5])
'''),
]
CELLS = dict(SEED_CELLS)


@pytest.mark.gpu
def test_seed_004_every_block(capsys):
    ns = {"__name__": "seed004_notebook"}
    run = lambda name: run_cell(ns, CELLS, name, "004")  # noqa: E731
    run("imports")
    assert ns["brainevent"] is xlakern
    run("vector_add_1")
    np.testing.assert_array_equal(ns["result"], np.full(1024, 3.0, np.float32))
    run("scale_by_2")
    np.testing.assert_array_equal(ns["result"], np.full(1024, 3.0, np.float32))
    run("compiler_options_3")
    fast = ns["mod"]
    assert fast.name == "fast_kernels"
    x = jnp.asarray(np.random.default_rng().standard_normal(4099).astype(np.float32))
    scaled = fast.scale_by(x, outs=jax_struct(x), scale_factor=1.5)
    np.testing.assert_allclose(scaled, np.asarray(x) * 1.5, rtol=1e-6)
    run("file_and_jit_4")
    np.testing.assert_array_equal(ns["add_jit"](ns["a"], ns["b"]), np.full(1024, 3.0, np.float32))
    out = capsys.readouterr().out
    assert out.count("[3. 3. 3. 3. 3.]") == 3, out


def jax_struct(x):
    import jax

    return jax.ShapeDtypeStruct(x.shape, x.dtype)
