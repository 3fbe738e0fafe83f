"""Numba CUDA kernels called from JAX: `numba_cuda_kernel`, `numba_cuda_callable`, `numba_cuda_launch_config`.

CPU-only tests (argument validation, launch-config arithmetic, PTX generation) run anywhere;
everything that launches a kernel is marked `gpu`. numba-cuda may be missing in CI, so this
file never imports `numba.cuda` at module level: the kernels below are plain Python functions,
turned into `@cuda.jit` dispatchers by the `K` fixture (which skips when numba.cuda is absent).
They read `cuda`, `numba` and `math` as module globals, bound by that fixture before any kernel
is compiled.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import types as pytypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern  # before numba.cuda: xlakern makes numba-cuda importable on numpy >= 2.5
from conftest import x64

SDS = jax.ShapeDtypeStruct

# Bound by the `K` fixture (module globals the kernels resolve when numba compiles them).
cuda = None
numba = None

BLOCK_SIZE = 256  # static shared-memory size of the tutorial's block-sum kernel
HALF = np.float32(0.5)  # float32 constants keep the LIF kernel in float32 arithmetic
ONE = np.float32(1.0)
ZERO = np.float32(0.0)


def _import_numba_cuda():
    """numba.cuda after xlakern's numpy shim, or a pytest skip."""
    try:  # the module that holds xlakern's numba-cuda glue (it makes numba-cuda importable)
        __import__("xlakern._numba_cuda")
    except Exception:
        pass
    mod = pytest.importorskip("numba.cuda")
    import numba as nb

    return nb, mod


def _dispatcher_or_skip(fn, **options):
    """`cuda.jit(fn)` or a skip when this numba-cuda cannot even build a dispatcher."""
    _, nc = _import_numba_cuda()
    try:
        return nc.jit(**options)(fn) if options else nc.jit(fn)
    except Exception as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"numba.cuda cannot build a dispatcher here: {type(e).__name__}: {e}")


# -- kernels (plain functions; `K` turns them into @cuda.jit dispatchers) -------------------------
# The tutorial's kernels, verbatim except that `math` is a module global: numba rejects
# `import math` inside a kernel body ("unsupported opcode IMPORT_NAME").

def elementwise_relu_kernel(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = max(x[i], 0.0)


def elementwise_sigmoid_kernel(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 1.0 / (1.0 + math.exp(-x[i]))


def block_sum_kernel(x, block_sums):
    shared = cuda.shared.array(BLOCK_SIZE, dtype=numba.float32)
    tx = cuda.threadIdx.x
    pos = cuda.grid(1)
    shared[tx] = x[pos] if pos < x.size else 0.0
    cuda.syncthreads()
    stride = BLOCK_SIZE // 2
    while stride > 0:
        if tx < stride:
            shared[tx] += shared[tx + stride]
        cuda.syncthreads()
        stride //= 2
    if tx == 0:
        block_sums[cuda.blockIdx.x] = shared[0]


def split_kernel(x, pos_out, neg_out):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        pos_out[i] = max(v, 0.0)
        neg_out[i] = min(v, 0.0)


def add_kernel(x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


def matmul_element_kernel(A, B, C):
    i, j = cuda.grid(2)
    if i < C.shape[0] and j < C.shape[1]:
        C[i, j] = A[i, j] * B[i, j]


def square_kernel(x, temp):
    i = cuda.grid(1)
    if i < temp.size:
        temp[i] = x[i] * x[i]


def sqrt_kernel(temp, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.sqrt(temp[i])


def detect_spikes_kernel(V, V_th, spikes):
    i = cuda.grid(1)
    if i < V.size:
        spikes[i] = 1 if V[i] >= V_th[0] else 0


def reset_potential_kernel(V, spikes, V_rest, V_out):
    i = cuda.grid(1)
    if i < V.size:
        V_out[i] = V_rest[0] if spikes[i] else V[i]


def exp_decay_kernel(x, decay, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * math.exp(-decay[0])


# -- kernels of these tests ------------------------------------------------------------------------

def affine_3d_kernel(x, out):
    i, j, k = cuda.grid(3)
    if i < out.shape[0] and j < out.shape[1] and k < out.shape[2]:
        out[i, j, k] = 2.0 * x[i, j, k] + 100.0 * i + 10.0 * j + k


def block_reverse_dynamic_kernel(x, out):
    """Each block reverses its slice of x, through dynamic shared memory of blockDim.x floats."""
    sh = cuda.shared.array(0, dtype=numba.float32)
    tx = cuda.threadIdx.x
    pos = cuda.grid(1)
    if pos < x.size:
        sh[tx] = x[pos]
    cuda.syncthreads()
    if pos < out.size:
        out[pos] = sh[cuda.blockDim.x - 1 - tx]


def fill_zero_kernel(h):
    i = cuda.grid(1)
    if i < h.size:
        h[i] = 0


def histogram_kernel(x, hist):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(hist, x[i], 1)


def histogram_aliased_kernel(x, hist_in, hist):
    # hist_in and hist are one buffer (input_output_aliases={1: 0}); hist_in holds zeros
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(hist, x[i], 1)


def lif_update_kernel(v, i_ext, v_out, spk):
    """v' = v/2 + i_ext; fire at 1: exact in float32 (multiplying by 1/2 never rounds)."""
    i = cuda.grid(1)
    if i < v.size:
        nv = v[i] * HALF + i_ext[i]
        if nv >= ONE:
            v_out[i] = ZERO
            spk[i] = 1
        else:
            v_out[i] = nv
            spk[i] = 0


def copy_kernel(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i]


def inc_kernel(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + 1


def scalar_double_kernel(x, out):
    out[()] = x[()] * 2


def slow_affine_kernel(x, out):
    """out = 3x + 1, computed slowly (a long dependent loop), to expose a launch on the wrong stream."""
    i = cuda.grid(1)
    if i < out.size:
        s = 0.0
        for _ in range(4000):  # converges to 2 x[i]; the compiler cannot drop it (used below)
            s = s * 0.5 + x[i]
        out[i] = s if s == 12345.678 else 3.0 * x[i] + 1.0


_KERNELS = [
    elementwise_relu_kernel, elementwise_sigmoid_kernel, block_sum_kernel, split_kernel, add_kernel,
    matmul_element_kernel, square_kernel, sqrt_kernel, detect_spikes_kernel, reset_potential_kernel,
    exp_decay_kernel, affine_3d_kernel, block_reverse_dynamic_kernel, fill_zero_kernel,
    histogram_kernel, histogram_aliased_kernel, lif_update_kernel, copy_kernel, inc_kernel,
    scalar_double_kernel, slow_affine_kernel,
]


@pytest.fixture(scope="module")
def K():
    """Namespace of @cuda.jit dispatchers (name without the `_kernel` suffix), plus `cuda`."""
    global cuda, numba
    numba, cuda = _import_numba_cuda()
    ns = pytypes.SimpleNamespace(cuda=cuda)
    try:
        for fn in _KERNELS:
            setattr(ns, fn.__name__.removesuffix("_kernel"), cuda.jit(fn))
    except Exception as e:  # pragma: no cover
        pytest.skip(f"numba.cuda cannot build a dispatcher here: {type(e).__name__}: {e}")
    _CALLABLE_KERNELS.__dict__.update(vars(ns))
    return ns


# The dispatchers the multi-kernel Python functions below launch (filled in by `K`).
_CALLABLE_KERNELS = pytypes.SimpleNamespace()


def abs_via_two_kernels(x, out, stream):
    """The tutorial's |x| = sqrt(x^2): two kernels and a temporary device buffer."""
    n = x.shape[0]
    threads = 256
    blocks = (n + threads - 1) // threads
    temp = cuda.device_array(n, dtype=np.float32)
    _CALLABLE_KERNELS.square[blocks, threads, stream](x, temp)
    _CALLABLE_KERNELS.sqrt[blocks, threads, stream](temp, out)


def lif_step(V, V_th, V_rest, spikes_out, V_out, stream):
    """The tutorial's LIF step: detect spikes, then reset."""
    n = V.shape[0]
    threads = 256
    blocks = (n + threads - 1) // threads
    _CALLABLE_KERNELS.detect_spikes[blocks, threads, stream](V, V_th, spikes_out)
    _CALLABLE_KERNELS.reset_potential[blocks, threads, stream](V, spikes_out, V_rest, V_out)


def histogram_func(x, hist, stream):
    """Clear the (uninitialised) output, then count with atomics."""
    _CALLABLE_KERNELS.fill_zero[(hist.size + 255) // 256, 256, stream](hist)
    _CALLABLE_KERNELS.histogram[(x.size + 255) // 256, 256, stream](x, hist)


def _dev(x):
    """On JAX's default device (the GPU on the GPU machine)."""
    return jax.device_put(x)


def _f32(a):
    return np.asarray(a, dtype=np.float32)


# =================================================================================================
# CPU: public names and launch configuration
# =================================================================================================

def test_public_names_exported_for_brainevent_seed_code():
    import xlakern as brainevent
    from xlakern import numba_cuda_callable, numba_cuda_kernel, numba_cuda_launch_config  # noqa: F401

    for name in ("numba_cuda_kernel", "numba_cuda_callable"):
        assert callable(getattr(brainevent, name))
        assert name in xlakern.__all__


@pytest.mark.parametrize("launch_dims, tpb, grid, block", [
    (1024, 256, (4, 1, 1), (256, 1, 1)),
    (1000, 256, (4, 1, 1), (256, 1, 1)),
    (1000, 128, (8, 1, 1), (128, 1, 1)),
    (1, 256, (1, 1, 1), (256, 1, 1)),
    (257, 64, (5, 1, 1), (64, 1, 1)),
    ((1000,), 128, (8, 1, 1), (128, 1, 1)),
    ((64, 64), 256, (4, 4, 1), (16, 16, 1)),
    ((33, 17), 256, (3, 2, 1), (16, 16, 1)),
    ((1, 1), 256, (1, 1, 1), (16, 16, 1)),
    ((10, 20, 5), 256, (2, 3, 2), (8, 8, 4)),
    ((8, 8, 4), 256, (1, 1, 1), (8, 8, 4)),
    ((9, 17, 5), 256, (2, 3, 2), (8, 8, 4)),
])
def test_launch_config_defaults(launch_dims, tpb, grid, block):
    got_grid, got_block = xlakern.numba_cuda_launch_config(launch_dims, threads_per_block=tpb)
    assert tuple(got_grid) == grid and tuple(got_block) == block
    # the launch covers every requested index
    dims = (launch_dims,) if isinstance(launch_dims, int) else tuple(launch_dims)
    for d, g, b in zip(dims, got_grid, got_block):
        assert g * b >= d


def test_launch_config_default_threads_per_block_is_256():
    assert tuple(map(tuple, xlakern.numba_cuda_launch_config(5000))) == ((20, 1, 1), (256, 1, 1))


@pytest.mark.parametrize("launch_dims", [-3, (4, -1), (2, 2, 2, 2), (), 2.5, "8"])
def test_launch_config_rejects_bad_dims(launch_dims):
    with pytest.raises(ValueError):
        xlakern.numba_cuda_launch_config(launch_dims)


@pytest.mark.parametrize("launch_dims, grid", [(0, (0, 1, 1)), ((4, 0), (1, 0, 1)), ((0, 4, 4), (0, 1, 1))])
def test_launch_config_of_an_empty_problem_is_an_empty_grid(launch_dims, grid):
    # A zero-size problem (N = 0) is valid: the call launches nothing and zero-fills its outputs.
    assert xlakern.numba_cuda_launch_config(launch_dims)[0] == grid


# =================================================================================================
# CPU: argument validation (no kernel object needed: launch arguments are checked first)
# =================================================================================================

def _not_a_kernel(x, out):
    out[0] = x[0]


OUT8 = SDS((8,), jnp.float32)


@pytest.mark.parametrize("kw", [
    {},                                                 # no launch configuration
    dict(grid=1, block=8, launch_dims=8),               # both
    dict(grid=1, launch_dims=8),
    dict(block=8, launch_dims=8),
    dict(grid=1),                                       # grid without block
    dict(block=8),                                      # block without grid
    dict(launch_dims=-8),                               # negative dims
    dict(launch_dims=(8, -1)),
    dict(launch_dims=(2, 2, 2, 2)),                     # more than 3 dims
    dict(grid=0, block=8),
    dict(grid=1, block=0),
    dict(grid=(1, -1), block=(8, 8)),
    dict(grid=(1, 1, 1, 1), block=8),
    dict(grid=1, block=(2, 2, 2, 2)),
    dict(grid=1, block=2048),                           # > 1024 threads per block
    dict(grid=1, block=(64, 32)),
    dict(grid=1, block=(16, 16, 8)),
    dict(grid=1, block=8, shared_mem=-1),               # negative dynamic shared memory
    dict(launch_dims=8, shared_mem=-4),
])
def test_bad_launch_arguments_raise_value_error_before_kernel_check(kw):
    # A plain lambda is not a kernel either, but launch arguments are validated first.
    with pytest.raises(ValueError) as err:
        xlakern.numba_cuda_kernel(lambda x, o: None, OUT8, **kw)
    assert isinstance(err.value, xlakern.SpecError)
    assert not isinstance(err.value, xlakern.CallError)
    assert str(err.value)  # says what is wrong


@pytest.mark.parametrize("tpb", [0, -256, 2048])
def test_bad_threads_per_block_raises_value_error(tpb):
    with pytest.raises(ValueError):
        xlakern.numba_cuda_kernel(lambda x, o: None, OUT8, launch_dims=8, threads_per_block=tpb)


@pytest.mark.parametrize("kw", [dict(grid=1, block=8), dict(launch_dims=8), dict(launch_dims=(4, 4)),
                                dict(grid=(1, 1), block=(8, 8), shared_mem=64)])
@pytest.mark.parametrize("kind", ["lambda", "function", "none", "string"])
def test_non_cuda_jit_kernel_is_rejected_with_call_error(kind, kw):
    kernel = {"lambda": lambda x, o: None, "function": _not_a_kernel, "none": None, "string": "relu"}[kind]
    with pytest.raises(xlakern.CallError, match=r"(?i)cuda\.jit|CUDADispatcher|numba"):
        xlakern.numba_cuda_kernel(kernel, OUT8, **kw)


def test_numba_njit_function_is_rejected_with_call_error():
    nb = pytest.importorskip("numba")
    cpu_kernel = nb.njit(_not_a_kernel)
    with pytest.raises(xlakern.CallError, match=r"(?i)cuda\.jit|CUDADispatcher"):
        xlakern.numba_cuda_kernel(cpu_kernel, OUT8, launch_dims=8)
    assert issubclass(xlakern.CallError, TypeError)


def test_real_dispatcher_wraps_on_cpu_and_bad_config_still_raises():
    kern = _dispatcher_or_skip(copy_kernel)
    # construction needs no GPU: it only validates and returns a callable
    assert callable(xlakern.numba_cuda_kernel(kern, OUT8, launch_dims=8))
    assert callable(xlakern.numba_cuda_kernel(kern, [OUT8, OUT8], grid=(1, 1), block=(8, 1), shared_mem=0))
    assert callable(xlakern.numba_cuda_kernel(kern, OUT8, launch_dims=(2, 2, 2), vmap_method="sequential",
                                              input_output_aliases={0: 0}))
    for kw in ({}, dict(grid=1, block=8, launch_dims=8), dict(grid=1), dict(launch_dims=(1, 2, 3, 4)),
               dict(grid=1, block=1025), dict(launch_dims=8, shared_mem=-1)):
        with pytest.raises(ValueError):
            xlakern.numba_cuda_kernel(kern, OUT8, **kw)


def test_numba_cuda_callable_wraps_on_cpu():
    fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=OUT8)
    assert callable(fn)
    assert callable(xlakern.numba_cuda_callable(lif_step, outs=[OUT8, OUT8], vmap_method="sequential"))


# =================================================================================================
# CPU: PTX generation where the toolkit allows it
# =================================================================================================

@pytest.mark.parametrize("cc", [(9, 0), (8, 0)])
@pytest.mark.parametrize("py_kernel, n_args", [(copy_kernel, 2), (add_kernel, 3)])
def test_kernel_image_ptx_on_cpu(cc, py_kernel, n_args):
    # (kernels calling max()/min() on mixed float types need a CUDA driver even to compile to PTX
    # with numba's built-in numba.cuda, so the CPU test uses kernels without them)
    nb, nc = _import_numba_cuda()
    from numba import types

    kern = _dispatcher_or_skip(py_kernel)
    global cuda
    cuda = nc  # the kernel's `cuda` global
    arr = types.Array(types.float32, 1, "C")
    arg_types = (arr,) * n_args
    try:  # probe numba-cuda's own compiler: without NVVM there is nothing to test
        nc.compile_ptx(py_kernel, arg_types, cc=cc)
    except Exception as e:
        pytest.skip(f"numba-cuda cannot generate PTX here: {type(e).__name__}: {e}")

    img = xlakern._numba_cuda.kernel_image(kern, arg_types, cc=cc, prefer="ptx")
    assert img.kind in ("ptx", "cubin")
    assert isinstance(img.data, bytes) and len(img.data) > 0
    assert isinstance(img.entry, str) and img.entry
    if img.kind == "ptx":
        text = img.data.decode()
        assert re.search(r"(\.visible\s+)?\.entry\s+" + re.escape(img.entry) + r"\s*\(", text), img.entry
        assert f".target sm_{cc[0]}{cc[1]}" in text
    else:
        assert img.data[:4] == b"\x7fELF"
        assert img.entry.encode() in img.data


# =================================================================================================
# GPU: the tutorial's examples, with fresh random inputs
# =================================================================================================

@pytest.mark.gpu
def test_relu_explicit_grid_block(K, rng):
    N = 1024
    x = _dev(rng.standard_normal(N).astype(np.float32))
    relu_fn = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((N,), jnp.float32), grid=4, block=256)
    y = relu_fn(x)
    assert isinstance(y, jax.Array) and y.shape == (N,) and y.dtype == jnp.float32
    np.testing.assert_array_equal(y, np.maximum(np.asarray(x), 0))
    np.testing.assert_array_equal(jax.jit(relu_fn)(x), jnp.maximum(x, 0.0))


@pytest.mark.gpu
@pytest.mark.parametrize("N, tpb", [(1024, 128), (1000, 128), (77_777, 256), (5, 32)])
def test_sigmoid_launch_dims(K, rng, N, tpb):
    x = _dev(rng.uniform(-6, 6, N).astype(np.float32))
    sigmoid_fn = xlakern.numba_cuda_kernel(K.elementwise_sigmoid, outs=SDS((N,), jnp.float32),
                                           launch_dims=N, threads_per_block=tpb)
    ref = 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))
    np.testing.assert_allclose(sigmoid_fn(x), ref, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(jax.jit(sigmoid_fn)(x), 1.0 / (1.0 + jnp.exp(-x)), rtol=2e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("container", [list, tuple])
def test_split_two_outputs_keeps_outs_structure(K, rng, container):
    N = 512 + int(rng.integers(0, 300))
    x = _dev(rng.standard_normal(N).astype(np.float32))
    outs = container([SDS((N,), jnp.float32), SDS((N,), jnp.float32)])
    split_fn = xlakern.numba_cuda_kernel(K.split, outs=outs, launch_dims=N)
    res = split_fn(x)
    assert type(res) is container and len(res) == 2
    pos, neg = res
    xn = np.asarray(x)
    np.testing.assert_array_equal(pos, np.maximum(xn, 0))
    np.testing.assert_array_equal(neg, np.minimum(xn, 0))
    np.testing.assert_array_equal(np.asarray(pos) + np.asarray(neg), xn)
    jpos, jneg = jax.jit(split_fn)(x)
    np.testing.assert_array_equal(jpos, pos)
    np.testing.assert_array_equal(jneg, neg)


@pytest.mark.gpu
def test_single_struct_in_a_list_gives_a_list(K, rng):
    N = 300
    x = _dev(rng.standard_normal(N).astype(np.float32))
    res = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=[SDS((N,), jnp.float32)], launch_dims=N)(x)
    assert isinstance(res, list) and len(res) == 1
    np.testing.assert_array_equal(res[0], np.maximum(np.asarray(x), 0))


@pytest.mark.gpu
def test_jit_add_repeated_calls_fresh_data(K, rng):
    N = 256
    add_fn = xlakern.numba_cuda_kernel(K.add, outs=SDS((N,), jnp.float32), launch_dims=N)
    jitted_add = jax.jit(lambda a, b: add_fn(a, b))
    for _ in range(6):
        a = _dev(rng.standard_normal(N).astype(np.float32))
        b = _dev(rng.standard_normal(N).astype(np.float32))
        np.testing.assert_array_equal(jitted_add(a, b), np.asarray(a) + np.asarray(b))
    # composed with XLA ops inside one jit
    f = jax.jit(lambda a, b: jnp.sin(add_fn(a * 2.0, b)) + add_fn(a, b))
    an, bn = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(f(a, b), np.sin(2 * an + bn) + an + bn, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N", [(64, 64), (50, 70), (1, 33), (129, 3)])
def test_hadamard_2d_launch_dims(K, rng, M, N):
    A = _dev(rng.standard_normal((M, N)).astype(np.float32))
    B = _dev(rng.standard_normal((M, N)).astype(np.float32))
    hadamard_fn = xlakern.numba_cuda_kernel(K.matmul_element, outs=SDS((M, N), jnp.float32), launch_dims=(M, N))
    np.testing.assert_array_equal(hadamard_fn(A, B), np.asarray(A) * np.asarray(B))
    np.testing.assert_array_equal(jax.jit(hadamard_fn)(A, B), np.asarray(A) * np.asarray(B))


@pytest.mark.gpu
def test_hadamard_2d_explicit_grid_block_tuples(K, rng):
    M, N = 40, 90
    A = _dev(rng.standard_normal((M, N)).astype(np.float32))
    B = _dev(rng.standard_normal((M, N)).astype(np.float32))
    fn = xlakern.numba_cuda_kernel(K.matmul_element, outs=SDS((M, N), jnp.float32), grid=(5, 3), block=(8, 32))
    np.testing.assert_array_equal(fn(A, B), np.asarray(A) * np.asarray(B))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(10, 20, 5), (8, 8, 4), (3, 17, 9)])
def test_3d_launch_dims(K, rng, shape):
    x = _dev(rng.standard_normal(shape).astype(np.float32))
    fn = xlakern.numba_cuda_kernel(K.affine_3d, outs=SDS(shape, jnp.float32), launch_dims=shape)
    i, j, k = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
    ref = 2.0 * np.asarray(x, np.float64) + 100.0 * i + 10.0 * j + k
    np.testing.assert_allclose(fn(x), ref, rtol=1e-6, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [256 * 8, 256 * 8 + 37, 100])
def test_block_sum_static_shared_memory(K, rng, N):
    grid = (N + BLOCK_SIZE - 1) // BLOCK_SIZE
    x = _dev(rng.standard_normal(N).astype(np.float32))
    fn = xlakern.numba_cuda_kernel(K.block_sum, outs=SDS((grid,), jnp.float32), grid=grid, block=BLOCK_SIZE)
    xn = np.zeros(grid * BLOCK_SIZE)
    xn[:N] = np.asarray(x, np.float64)
    ref = xn.reshape(grid, BLOCK_SIZE).sum(axis=1)
    np.testing.assert_allclose(fn(x), ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(jax.jit(fn)(x), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [64, 256, 1024])
def test_dynamic_shared_memory_block_reversal(K, rng, block):
    grid = int(rng.integers(3, 9))
    N = grid * block
    x = _dev(rng.standard_normal(N).astype(np.float32))
    fn = xlakern.numba_cuda_kernel(K.block_reverse_dynamic, outs=SDS((N,), jnp.float32),
                                   grid=grid, block=block, shared_mem=block * 4)
    ref = np.asarray(x).reshape(grid, block)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(fn(x), ref)
    np.testing.assert_array_equal(jax.jit(fn)(x), ref)


@pytest.mark.gpu
def test_dynamic_shared_memory_with_launch_dims(K, rng):
    tpb = 128
    N = tpb * 7
    x = _dev(rng.standard_normal(N).astype(np.float32))
    fn = xlakern.numba_cuda_kernel(K.block_reverse_dynamic, outs=SDS((N,), jnp.float32),
                                   launch_dims=N, threads_per_block=tpb, shared_mem=tpb * 4)
    np.testing.assert_array_equal(fn(x), np.asarray(x).reshape(-1, tpb)[:, ::-1].reshape(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("N", [512, 10_001])
def test_abs_via_two_kernels_and_temporary_buffer(K, rng, N):
    x = _dev(rng.uniform(-5, 5, N).astype(np.float32))
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32))
    y = abs_fn(x)
    assert isinstance(y, jax.Array) and y.shape == (N,)
    np.testing.assert_allclose(y, np.abs(np.asarray(x, np.float64)), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda x: abs_fn(x) + 1.0)(x), np.abs(np.asarray(x)) + 1, rtol=1e-6)


@pytest.mark.gpu
def test_lif_detect_and_reset_callable(K, rng):
    n = 10_000
    V = _dev(rng.uniform(-75.0, -50.0, n).astype(np.float32))
    V_th = _dev(np.array([rng.uniform(-60, -55)], np.float32))
    V_rest = _dev(np.array([rng.uniform(-72, -68)], np.float32))
    lif_fn = xlakern.numba_cuda_callable(lif_step, outs=[SDS((n,), jnp.int32), SDS((n,), jnp.float32)])
    Vn, th, rest = np.asarray(V), np.asarray(V_th)[0], np.asarray(V_rest)[0]
    exp_spk = (Vn >= th).astype(np.int32)
    exp_V = np.where(exp_spk, rest, Vn)
    for fn in (lif_fn, jax.jit(lif_fn)):
        res = fn(V, V_th, V_rest)
        assert isinstance(res, list) and len(res) == 2
        spikes, V_out = res
        assert spikes.dtype == jnp.int32 and V_out.dtype == jnp.float32
        np.testing.assert_array_equal(spikes, exp_spk)
        np.testing.assert_array_equal(V_out, exp_V)
    assert 0 < exp_spk.sum() < n


@pytest.mark.gpu
def test_exp_decay(K, rng):
    N = 1024
    fn = xlakern.numba_cuda_kernel(K.exp_decay, outs=SDS((N,), jnp.float32), launch_dims=N)
    apply = jax.jit(lambda x, d: fn(x, d))
    for _ in range(3):
        x = _dev(rng.standard_normal(N).astype(np.float32))
        decay = _dev(np.array([rng.uniform(0.01, 2.0)], np.float32))
        ref = np.asarray(x, np.float64) * np.exp(-np.float64(np.asarray(decay)[0]))
        np.testing.assert_allclose(apply(x, decay), ref, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(fn(x, decay), ref, rtol=1e-6, atol=1e-7)


# =================================================================================================
# GPU: atomics, aliasing, dtypes, 0-d and empty arrays
# =================================================================================================

@pytest.mark.gpu
@pytest.mark.parametrize("nbins", [7, 64, 1000])
def test_histogram_atomics_callable_clears_then_counts(K, rng, nbins):
    n = 100_003
    x = _dev(rng.integers(0, nbins, n).astype(np.int32))
    fn = xlakern.numba_cuda_callable(histogram_func, outs=SDS((nbins,), jnp.int32))
    ref = np.bincount(np.asarray(x), minlength=nbins)
    for f in (fn, jax.jit(fn), fn):  # repeated calls never accumulate into stale memory
        np.testing.assert_array_equal(f(x), ref)


@pytest.mark.gpu
def test_histogram_atomics_kernel_with_aliased_zero_input(K, rng):
    n, nbins = 50_000 + int(rng.integers(0, 1000)), 37
    vals = rng.uniform(0, 1, n)
    x = _dev(np.minimum((vals * nbins).astype(np.int32), nbins - 1))
    ref = np.histogram(vals, bins=nbins, range=(0, 1))[0]
    fn = xlakern.numba_cuda_kernel(K.histogram_aliased, outs=SDS((nbins,), jnp.int32), launch_dims=n,
                                   input_output_aliases={1: 0})
    zeros = _dev(np.zeros(nbins, np.int32))
    np.testing.assert_array_equal(fn(x, zeros), ref)
    np.testing.assert_array_equal(fn(x, zeros), ref)  # the zeros input was not consumed
    np.testing.assert_array_equal(np.asarray(zeros), 0)
    jf = jax.jit(lambda x: fn(x, jnp.zeros(nbins, jnp.int32)))
    np.testing.assert_array_equal(jf(x), ref)
    np.testing.assert_array_equal(jf(x), ref)
    assert int(np.asarray(ref).sum()) == n


@pytest.mark.gpu
def test_input_output_aliases_in_place_increment(K, rng):
    N = 4097
    x_host = rng.standard_normal(N).astype(np.float32)
    fn = xlakern.numba_cuda_kernel(K.inc, outs=SDS((N,), jnp.float32), launch_dims=N, input_output_aliases={0: 0})
    x = _dev(x_host)
    np.testing.assert_array_equal(fn(x), x_host + 1)
    np.testing.assert_array_equal(np.asarray(x), x_host)  # not donated: the caller's array is intact
    # donated under jit: updated in place, repeatedly
    step = jax.jit(lambda x: fn(x), donate_argnums=0)
    y = _dev(x_host)
    for _ in range(5):
        y = step(y)
    np.testing.assert_allclose(y, x_host.astype(np.float64) + 5, rtol=1e-6, atol=1e-6)
    # inside a loop
    z = jax.jit(lambda x: jax.lax.fori_loop(0, 10, lambda i, v: fn(v), x))(x)
    np.testing.assert_allclose(z, x_host.astype(np.float64) + 10, rtol=1e-6, atol=1e-5)


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]


def _random_of(rng, dtype, shape):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dt)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_round_trip_copy(K, rng, dtype):
    n = 1001
    with x64():
        x_host = _random_of(rng, dtype, n)
        x = _dev(x_host)
        assert x.dtype == np.dtype(dtype)
        fn = xlakern.numba_cuda_kernel(K.copy, outs=SDS((n,), np.dtype(dtype)), launch_dims=n)
        y = fn(x)
        assert y.dtype == np.dtype(dtype) and y.shape == (n,)
        np.testing.assert_array_equal(np.asarray(y), x_host)
        np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), x_host)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64", "float16", "float32", "float64"])
def test_dtype_arithmetic_increment(K, rng, dtype):
    n = 333
    with x64():
        x_host = _random_of(rng, dtype, n)
        if np.dtype(dtype).kind in "iu":  # stay clear of overflow
            x_host = (x_host // 2).astype(dtype)
        fn = xlakern.numba_cuda_kernel(K.inc, outs=SDS((n,), np.dtype(dtype)), launch_dims=n)
        y = np.asarray(fn(_dev(x_host)))
        assert y.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(y, (x_host + np.array(1, dtype)).astype(dtype))


@pytest.mark.gpu
def test_mixed_dtypes_in_one_call(K, rng):
    n = 2000
    V = _dev(rng.uniform(-75, -50, n).astype(np.float32))
    spikes = _dev(rng.integers(0, 2, n).astype(np.int32))
    V_rest = _dev(np.array([-70.0], np.float32))
    fn = xlakern.numba_cuda_kernel(K.reset_potential, outs=SDS((n,), jnp.float32), launch_dims=n)
    np.testing.assert_array_equal(fn(V, spikes, V_rest), np.where(np.asarray(spikes) != 0, np.float32(-70), np.asarray(V)))


@pytest.mark.gpu
def test_zero_dim_arrays(K, rng):
    x_host = np.float32(rng.standard_normal())
    fn = xlakern.numba_cuda_kernel(K.scalar_double, outs=SDS((), jnp.float32), grid=1, block=1)
    y = fn(_dev(np.asarray(x_host)))
    assert y.shape == () and y.dtype == jnp.float32
    assert float(y) == float(x_host * np.float32(2))
    assert float(jax.jit(fn)(_dev(np.asarray(x_host)))) == float(x_host * np.float32(2))


@pytest.mark.gpu
def test_empty_arrays(K, rng):
    x = _dev(np.zeros((0,), np.float32))
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((0,), jnp.float32), grid=1, block=256)
    y = relu(x)
    assert y.shape == (0,) and y.dtype == jnp.float32
    assert jax.jit(relu)(x).shape == (0,)
    pos, neg = xlakern.numba_cuda_kernel(K.split, outs=[SDS((0,), jnp.float32)] * 2, grid=1, block=32)(x)
    assert pos.shape == (0,) and neg.shape == (0,)
    # launch_dims=0 (an empty problem): nothing launches, outputs come back empty / zero-filled
    y0 = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((0,), jnp.float32), launch_dims=0)(x)
    assert y0.shape == (0,)
    w = _dev(rng.standard_normal(5).astype(np.float32) + 10)
    filled = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((5,), jnp.float32), launch_dims=0)
    np.testing.assert_array_equal(filled(w), np.zeros(5, np.float32))
    np.testing.assert_array_equal(jax.jit(filled)(w), np.zeros(5, np.float32))
    # the GPU keeps working afterwards
    z = _dev(rng.standard_normal(100).astype(np.float32))
    relu100 = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((100,), jnp.float32), grid=1, block=128)
    np.testing.assert_array_equal(relu100(z), np.maximum(np.asarray(z), 0))


# =================================================================================================
# GPU: vmap
# =================================================================================================

@pytest.mark.gpu
def test_vmap_sequential_kernel(K, rng):
    B, N = 5, 700
    X = _dev(rng.standard_normal((B, N)).astype(np.float32))
    Y = _dev(rng.standard_normal((B, N)).astype(np.float32))
    y1 = _dev(rng.standard_normal(N).astype(np.float32))
    add_fn = xlakern.numba_cuda_kernel(K.add, outs=SDS((N,), jnp.float32), launch_dims=N, vmap_method="sequential")
    Xn, Yn, y1n = np.asarray(X), np.asarray(Y), np.asarray(y1)
    np.testing.assert_array_equal(jax.vmap(add_fn)(X, Y), Xn + Yn)
    np.testing.assert_array_equal(jax.jit(jax.vmap(add_fn))(X, Y), Xn + Yn)
    np.testing.assert_array_equal(jax.vmap(add_fn, in_axes=(0, None))(X, y1), Xn + y1n[None])
    np.testing.assert_array_equal(jax.vmap(add_fn, in_axes=(None, 1))(y1, Y.T), y1n[None] + Yn)
    rows = np.stack([np.asarray(add_fn(X[b], Y[b])) for b in range(B)])
    np.testing.assert_array_equal(jax.vmap(add_fn)(X, Y), rows)


@pytest.mark.gpu
def test_vmap_sequential_callable(K, rng):
    B, N = 4, 1000
    X = _dev(rng.uniform(-5, 5, (B, N)).astype(np.float32))
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32), vmap_method="sequential")
    ref = np.abs(np.asarray(X, np.float64))
    np.testing.assert_allclose(jax.vmap(abs_fn)(X), ref, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(abs_fn))(X), ref, rtol=1e-6)


@pytest.mark.gpu
def test_vmap_broadcast_all_launch_dims_1d(K, rng):
    B, N = 6, 1000  # N not a multiple of the block: bounds checks per batch element matter
    X = _dev(rng.standard_normal((B, N)).astype(np.float32))
    Y = _dev(rng.standard_normal((B, N)).astype(np.float32))
    y1 = _dev(rng.standard_normal(N).astype(np.float32))
    add_fn = xlakern.numba_cuda_kernel(K.add, outs=SDS((N,), jnp.float32), launch_dims=N,
                                       vmap_method="broadcast_all")
    Xn, Yn, y1n = np.asarray(X), np.asarray(Y), np.asarray(y1)
    np.testing.assert_array_equal(jax.vmap(add_fn)(X, Y), Xn + Yn)
    np.testing.assert_array_equal(jax.jit(jax.vmap(add_fn))(X, Y), Xn + Yn)
    np.testing.assert_array_equal(jax.vmap(add_fn, in_axes=(0, None))(X, y1), Xn + y1n[None])
    np.testing.assert_array_equal(jax.jit(jax.vmap(add_fn, in_axes=(None, 0)))(y1, Y), y1n[None] + Yn)
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((N,), jnp.float32), launch_dims=N,
                                     vmap_method="broadcast_all")
    np.testing.assert_array_equal(jax.vmap(relu)(X), np.maximum(Xn, 0))


@pytest.mark.gpu
def test_vmap_broadcast_all_launch_dims_2d(K, rng):
    B, M, N = 3, 40, 50
    A = _dev(rng.standard_normal((B, M, N)).astype(np.float32))
    Bm = _dev(rng.standard_normal((M, N)).astype(np.float32))
    fn = xlakern.numba_cuda_kernel(K.matmul_element, outs=SDS((M, N), jnp.float32), launch_dims=(M, N),
                                   vmap_method="broadcast_all")
    ref = np.asarray(A) * np.asarray(Bm)[None]
    np.testing.assert_array_equal(jax.jit(jax.vmap(fn, in_axes=(0, None)))(A, Bm), ref)


@pytest.mark.gpu
def test_vmap_broadcast_all_two_outputs(K, rng):
    B, N = 4, 513
    X = _dev(rng.standard_normal((B, N)).astype(np.float32))
    split = xlakern.numba_cuda_kernel(K.split, outs=[SDS((N,), jnp.float32)] * 2, launch_dims=N,
                                      vmap_method="broadcast_all")
    pos, neg = jax.vmap(split)(X)
    np.testing.assert_array_equal(pos, np.maximum(np.asarray(X), 0))
    np.testing.assert_array_equal(neg, np.minimum(np.asarray(X), 0))


# =================================================================================================
# GPU: loops (graph capture), threads, registrations, streams, devices
# =================================================================================================

@pytest.mark.gpu
def test_exp_decay_kernel_in_1000_step_fori_loop(K, rng):
    N = 4096
    fn = xlakern.numba_cuda_kernel(K.exp_decay, outs=SDS((N,), jnp.float32), launch_dims=N)
    x0 = _dev(rng.uniform(0.5, 2.0, N).astype(np.float32))
    drive = _dev(rng.uniform(0, 1e-3, N).astype(np.float32))
    decay = _dev(np.array([rng.uniform(5e-4, 2e-3)], np.float32))

    @jax.jit
    def run(x, decay, drive):
        return jax.lax.fori_loop(0, 1000, lambda i, x: fn(x, decay) + drive, x)

    @jax.jit
    def run_jnp(x, decay, drive):
        return jax.lax.fori_loop(0, 1000, lambda i, x: x * jnp.exp(-decay[0]) + drive, x)

    x, d, dr = np.asarray(x0, np.float64), np.exp(-np.float64(np.asarray(decay)[0])), np.asarray(drive, np.float64)
    for _ in range(1000):
        x = x * d + dr
    got = run(x0, decay, drive)
    np.testing.assert_allclose(got, x, rtol=5e-4)
    np.testing.assert_allclose(got, run_jnp(x0, decay, drive), rtol=5e-4)
    np.testing.assert_allclose(run(x0, decay, drive), got, rtol=0, atol=0)  # replay: same result


def _lif_reference(v, i_ext, steps):
    v, i_ext = np.asarray(v, np.float32).copy(), np.asarray(i_ext, np.float32)
    spikes = np.zeros((steps,) + v.shape, np.int32)
    for t in range(steps):
        nv = v * np.float32(0.5) + i_ext
        fire = nv >= np.float32(1.0)
        v = np.where(fire, np.float32(0), nv).astype(np.float32)
        spikes[t] = fire
    return v, spikes


@pytest.mark.gpu
def test_lif_kernel_in_1000_step_scan_and_fori_loop(K, rng):
    N = 2048
    outs = [SDS((N,), jnp.float32), SDS((N,), jnp.int32)]
    lif = xlakern.numba_cuda_kernel(K.lif_update, outs=outs, launch_dims=N)
    v0 = _dev(rng.uniform(0, 1, N).astype(np.float32))
    i_ext = _dev(rng.uniform(0.3, 0.8, N).astype(np.float32))

    @jax.jit
    def scan(v, i_ext):
        def step(v, _):
            v, spk = lif(v, i_ext)
            return v, spk
        return jax.lax.scan(step, v, None, length=1000)

    @jax.jit
    def scan_jnp(v, i_ext):
        def step(v, _):
            nv = v * jnp.float32(0.5) + i_ext
            fire = nv >= 1.0
            return jnp.where(fire, jnp.float32(0), nv), fire.astype(jnp.int32)
        return jax.lax.scan(step, v, None, length=1000)

    @jax.jit
    def fori(v, i_ext):
        def body(_, c):
            v, cnt = c
            v, spk = lif(v, i_ext)
            return v, cnt + spk
        return jax.lax.fori_loop(0, 1000, body, (v, jnp.zeros(v.shape, jnp.int32)))

    rv, rspikes = _lif_reference(v0, i_ext, 1000)
    for _ in range(2):  # second run replays
        v, spikes = scan(v0, i_ext)
        np.testing.assert_array_equal(v, rv)
        np.testing.assert_array_equal(spikes, rspikes)
    jv, jspikes = scan_jnp(v0, i_ext)
    np.testing.assert_array_equal(v, jv)
    np.testing.assert_array_equal(spikes, jspikes)
    fv, count = fori(v0, i_ext)
    np.testing.assert_array_equal(fv, rv)
    np.testing.assert_array_equal(count, rspikes.sum(axis=0))
    assert 0 < rspikes.sum() < rspikes.size


@pytest.mark.gpu
def test_callable_inside_jitted_fori_loop(K, rng):
    n, steps = 3000, 200
    lif_fn = xlakern.numba_cuda_callable(lif_step, outs=[SDS((n,), jnp.int32), SDS((n,), jnp.float32)])
    V0 = _dev(rng.uniform(-75, -60, n).astype(np.float32))
    I = _dev(rng.uniform(0, 1, n).astype(np.float32))
    V_th, V_rest = _dev(np.array([-55.0], np.float32)), _dev(np.array([-70.0], np.float32))

    @jax.jit
    def run(V, I):
        def body(_, c):
            V, cnt = c
            spk, V = lif_fn(V + I, V_th, V_rest)
            return V, cnt + spk
        return jax.lax.fori_loop(0, steps, body, (V, jnp.zeros(n, jnp.int32)))

    V, cnt = np.asarray(V0), np.zeros(n, np.int32)
    In = np.asarray(I)
    for _ in range(steps):
        V = V + In
        spk = V >= np.float32(-55)
        V = np.where(spk, np.float32(-70), V).astype(np.float32)
        cnt += spk
    gV, gcnt = run(V0, I)
    np.testing.assert_array_equal(gV, V)
    np.testing.assert_array_equal(gcnt, cnt)
    assert cnt.sum() > 0


COMMAND_BUFFER_CHILD = r'''
import numpy as np
import xlakern  # before numba.cuda
import jax, jax.numpy as jnp
import math
from numba import cuda

SDS = jax.ShapeDtypeStruct
HALF, ONE, ZERO = np.float32(0.5), np.float32(1.0), np.float32(0.0)

@cuda.jit
def exp_decay_kernel(x, decay, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * math.exp(-decay[0])

@cuda.jit
def lif_update_kernel(v, i_ext, v_out, spk):
    i = cuda.grid(1)
    if i < v.size:
        nv = v[i] * HALF + i_ext[i]
        if nv >= ONE:
            v_out[i] = ZERO
            spk[i] = 1
        else:
            v_out[i] = nv
            spk[i] = 0

@cuda.jit
def square_kernel(x, temp):
    i = cuda.grid(1)
    if i < temp.size:
        temp[i] = x[i] * x[i]

@cuda.jit
def sqrt_kernel(temp, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.sqrt(temp[i])

def abs_via_two_kernels(x, out, stream):
    n = x.shape[0]
    blocks = (n + 255) // 256
    temp = cuda.device_array(n, dtype=np.float32)
    square_kernel[blocks, 256, stream](x, temp)
    sqrt_kernel[blocks, 256, stream](temp, out)

N = 4096
decay_fn = xlakern.numba_cuda_kernel(exp_decay_kernel, outs=SDS((N,), jnp.float32), launch_dims=N)
lif = xlakern.numba_cuda_kernel(lif_update_kernel, outs=[SDS((N,), jnp.float32), SDS((N,), jnp.int32)],
                                launch_dims=N)
abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32))

@jax.jit
def decay_loop(x, decay, drive):
    return jax.lax.fori_loop(0, 1000, lambda i, x: decay_fn(x, decay) + drive, x)

@jax.jit
def lif_loop(v, i_ext):
    def body(_, c):
        v, cnt = c
        v, spk = lif(v, i_ext)
        return v, cnt + spk
    return jax.lax.fori_loop(0, 1000, body, (v, jnp.zeros(v.shape, jnp.int32)))

@jax.jit
def mixed_loop(x):  # a graph-compatible kernel and a Python callable in one loop
    def body(_, x):
        return abs_fn(decay_fn(x, jnp.array([0.001], jnp.float32)) - 0.5) + 0.25
    return jax.lax.fori_loop(0, 50, body, x)

rng = np.random.default_rng()
for rep in range(3):  # the first run records the command buffer, later runs replay it on new buffers
    x0 = rng.uniform(0.5, 2.0, N).astype(np.float32)
    drive = rng.uniform(0, 1e-3, N).astype(np.float32)
    d = np.float32(rng.uniform(5e-4, 2e-3))
    x, e = x0.astype(np.float64), np.exp(-np.float64(d))
    for _ in range(1000):
        x = x * e + drive
    got = decay_loop(jnp.asarray(x0), jnp.asarray([d]), jnp.asarray(drive))
    np.testing.assert_allclose(np.asarray(got), x, rtol=5e-4)

    v0 = rng.uniform(0, 1, N).astype(np.float32)
    i_ext = rng.uniform(0.3, 0.8, N).astype(np.float32)
    v, cnt = v0.copy(), np.zeros(N, np.int32)
    for _ in range(1000):
        nv = v * np.float32(0.5) + i_ext
        fire = nv >= np.float32(1.0)
        v = np.where(fire, np.float32(0), nv).astype(np.float32)
        cnt += fire
    gv, gcnt = lif_loop(jnp.asarray(v0), jnp.asarray(i_ext))
    np.testing.assert_array_equal(np.asarray(gv), v)
    np.testing.assert_array_equal(np.asarray(gcnt), cnt)
    assert cnt.sum() > 0

    y = x0.astype(np.float64)
    for _ in range(50):
        y = np.abs(y * np.exp(-0.001) - 0.5) + 0.25
    np.testing.assert_allclose(np.asarray(mixed_loop(jnp.asarray(x0))), y, rtol=1e-4, atol=5e-5)
# Proof of capture. XLA runs a command buffer's first execution eagerly, then records it into a
# CUDA graph and replays that. From here on, 2,000 more loop steps must call the launch handler
# at most once per run, and only while XLA is capturing the stream.
xlakern._runtime.enable_launch_probe(True)
for rep in range(2):
    x0 = rng.uniform(0.5, 2.0, N).astype(np.float32)
    x = x0.astype(np.float64)
    for _ in range(1000):
        x = x * e + drive
    got = decay_loop(jnp.asarray(x0), jnp.asarray([d]), jnp.asarray(drive))
    np.testing.assert_allclose(np.asarray(got), x, rtol=5e-4)
executions, captured = xlakern._runtime.launch_probe()
print("probe", executions, captured)
assert executions <= 2 and captured == executions, (executions, captured)
print("OK")
'''


@pytest.mark.gpu
def test_loops_under_forced_command_buffers_subprocess(K, tmp_path):
    # XLA_FLAGS must be set before jax initialises, hence a fresh interpreter.
    script = tmp_path / "command_buffer_child.py"
    script.write_text(COMMAND_BUFFER_CHILD)
    flags = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE --xla_gpu_graph_min_graph_size=1"
    env = {**os.environ, "XLAKERN_QUIET": "1", "XLA_FLAGS": flags}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=500,
                         cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.strip().splitlines()[-1] == "OK"


@pytest.mark.gpu
def test_concurrent_calls_from_four_threads(K, rng):
    N = 20_000
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((N,), jnp.float32), launch_dims=N)
    relu_jit = jax.jit(lambda x: relu(x) * 2.0)
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32))
    xs = [_dev(rng.standard_normal(N).astype(np.float32)) for _ in range(4)]
    errors = []

    def work(x):
        try:
            xn = np.asarray(x)
            for _ in range(40):
                np.testing.assert_array_equal(relu(x), np.maximum(xn, 0))
                np.testing.assert_array_equal(relu_jit(x), 2 * np.maximum(xn, 0))
                np.testing.assert_allclose(abs_fn(x), np.abs(xn), rtol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors[0]


@pytest.mark.gpu
def test_ten_thousand_eager_calls_add_no_registrations(K, rng):
    N = 64
    x = _dev(rng.standard_normal(N).astype(np.float32))
    y = _dev(rng.standard_normal(N).astype(np.float32))
    add_fn = xlakern.numba_cuda_kernel(K.add, outs=SDS((N,), jnp.float32), launch_dims=N)
    out = add_fn(x, y)
    jax.block_until_ready(out)
    before = len(xlakern.list_registered_targets())
    for _ in range(10_000):
        out = add_fn(x, y)
    np.testing.assert_array_equal(out, np.asarray(x) + np.asarray(y))
    assert len(xlakern.list_registered_targets()) == before
    # wrapping the same kernel again, and jitting fresh closures around it, registers nothing new
    again = xlakern.numba_cuda_kernel(K.add, outs=SDS((N,), jnp.float32), launch_dims=N)
    np.testing.assert_array_equal(again(x, y), np.asarray(x) + np.asarray(y))
    for _ in range(20):
        jax.jit(lambda a, b: again(a, b))(x, y)
    assert len(xlakern.list_registered_targets()) == before


@pytest.mark.gpu
def test_many_eager_callable_calls_add_no_registrations(K, rng):
    N = 64
    x = _dev(rng.standard_normal(N).astype(np.float32))
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32))
    jax.block_until_ready(abs_fn(x))
    before = len(xlakern.list_registered_targets())
    for _ in range(2_000):
        out = abs_fn(x)
    np.testing.assert_allclose(out, np.abs(np.asarray(x)), rtol=1e-6)
    assert len(xlakern.list_registered_targets()) == before


@pytest.mark.gpu
def test_callable_receives_device_arrays_aliasing_xla_buffers(K, rng):
    N = 1000
    seen = {}

    def probe(x, out, stream):
        seen["in_ptr"] = x.__cuda_array_interface__["data"][0]
        seen["out_ptr"] = out.__cuda_array_interface__["data"][0]
        seen["shapes"] = (tuple(x.shape), tuple(out.shape))
        seen["dtypes"] = (np.dtype(x.dtype), np.dtype(out.dtype))
        seen["cuda_arrays"] = cuda.is_cuda_array(x) and cuda.is_cuda_array(out)
        seen["stream"] = stream
        abs_via_two_kernels(x, out, stream)

    fn = xlakern.numba_cuda_callable(probe, outs=SDS((N,), jnp.float32))
    x = _dev(rng.standard_normal(N).astype(np.float32))
    y = fn(x)
    np.testing.assert_allclose(y, np.abs(np.asarray(x)), rtol=1e-6)
    assert seen["shapes"] == ((N,), (N,))
    assert seen["dtypes"] == (np.dtype(np.float32), np.dtype(np.float32))
    assert seen["cuda_arrays"]
    assert seen["stream"] is not None
    # zero copy: the device arrays are XLA's own buffers
    assert seen["in_ptr"] == x.unsafe_buffer_pointer()
    assert seen["out_ptr"] == y.unsafe_buffer_pointer()


@pytest.mark.gpu
def test_launches_are_ordered_on_xlas_stream(K, rng):
    # A slow kernel immediately consumed by XLA ops in the same jit: a launch on any other
    # stream would let XLA read the output before it is written.
    N = 1 << 20
    slow = xlakern.numba_cuda_kernel(K.slow_affine, outs=SDS((N,), jnp.float32), launch_dims=N)

    def slow_callable(x, out, stream):
        K.slow_affine[(x.size + 255) // 256, 256, stream](x, out)

    slow_c = xlakern.numba_cuda_callable(slow_callable, outs=SDS((N,), jnp.float32))
    for fn in (slow, slow_c):
        f = jax.jit(lambda x: jnp.sum(fn(x) - 3.0 * x))
        for _ in range(3):
            x = _dev(rng.standard_normal(N).astype(np.float32))
            assert abs(float(f(x)) - N) < 1e-3 * N
            g = jax.jit(lambda x: fn(fn(x)))  # output of one launch is the next launch's input
            xn = np.asarray(x, np.float64)
            np.testing.assert_allclose(g(x), 3 * (3 * xn + 1) + 1, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_runs_on_the_device_xla_placed_the_call_on(K, rng):
    gpus = jax.devices("gpu")
    N = 3000
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((N,), jnp.float32), launch_dims=N)
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32))
    for dev in gpus:  # every GPU (with one GPU: device 0 only)
        xh = rng.standard_normal(N).astype(np.float32)
        x = jax.device_put(xh, dev)
        for fn, ref in ((relu, np.maximum(xh, 0)), (abs_fn, np.abs(xh))):
            for call in (fn, jax.jit(fn)):
                y = call(x)
                assert y.devices() == {dev}
                np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-6)


# =================================================================================================
# GPU: call-time errors
# =================================================================================================

@pytest.mark.gpu
def test_wrong_number_of_inputs_is_call_error(K, rng):
    N = 128
    x = _dev(rng.standard_normal(N).astype(np.float32))
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((N,), jnp.float32), launch_dims=N)
    with pytest.raises(xlakern.CallError):
        relu(x, x)
    with pytest.raises(xlakern.CallError):
        relu()
    add = xlakern.numba_cuda_kernel(K.add, outs=SDS((N,), jnp.float32), launch_dims=N)
    with pytest.raises(xlakern.CallError):
        jax.jit(lambda x: add(x))(x)
    np.testing.assert_array_equal(relu(x), np.maximum(np.asarray(x), 0))  # still usable


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_dtypes_round_trip(K, rng, dtype):
    # Numba CUDA handles complex numbers, so xlakern passes them through.
    n = 257
    with x64():
        z = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
        fn = xlakern.numba_cuda_kernel(K.copy, outs=SDS((n,), np.dtype(dtype)), launch_dims=n)
        np.testing.assert_array_equal(np.asarray(jax.jit(fn)(_dev(z))), z)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_unsupported_dtype_is_call_error(K, rng, dtype):
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    N = 64
    x = _dev(rng.standard_normal(N).astype(dt))
    with pytest.raises(xlakern.CallError, match=dtype):
        fn = xlakern.numba_cuda_kernel(K.copy, outs=SDS((N,), dt), launch_dims=N)
        jax.block_until_ready(fn(x))
    with pytest.raises(xlakern.CallError, match=dtype):  # an unsupported input with a supported output
        fn = xlakern.numba_cuda_kernel(K.copy, outs=SDS((N,), jnp.float32), launch_dims=N)
        jax.block_until_ready(fn(x))


@pytest.mark.gpu
def test_debug_kernel_is_rejected(K, rng):
    dbg = K.cuda.jit(debug=True, opt=False)(copy_kernel)
    N = 32
    x = _dev(rng.standard_normal(N).astype(np.float32))
    with pytest.raises(xlakern.CallError, match="(?i)debug"):
        fn = xlakern.numba_cuda_kernel(dbg, outs=SDS((N,), jnp.float32), launch_dims=N)
        jax.block_until_ready(fn(x))


@pytest.mark.gpu
def test_exception_in_callable_names_function_and_gpu_keeps_working(K, rng):
    token = f"boom-{int(rng.integers(1 << 30))}"

    def exploding_pipeline(x, out, stream):
        raise RuntimeError(token)

    N = 256
    x = _dev(rng.standard_normal(N).astype(np.float32))
    fn = xlakern.numba_cuda_callable(exploding_pipeline, outs=SDS((N,), jnp.float32))
    for call in (fn, jax.jit(lambda x: fn(x) + 1.0)):
        with pytest.raises(Exception) as err:
            jax.block_until_ready(call(x))
        assert "exploding_pipeline" in str(err.value) and token in str(err.value)
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((N,), jnp.float32))
    np.testing.assert_allclose(abs_fn(x), np.abs(np.asarray(x)), rtol=1e-6)
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((N,), jnp.float32), launch_dims=N)
    np.testing.assert_array_equal(relu(x), np.maximum(np.asarray(x), 0))


# =================================================================================================
# GPU: shard_map over every GPU (each shard launches on its own device's context)
# =================================================================================================

@pytest.mark.gpu
def test_kernels_and_primitive_inside_shard_map_over_all_gpus(K, rng):
    from jax.sharding import NamedSharding, PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    gpus = jax.devices("gpu")
    n_dev, per = len(gpus), 2048
    mesh = jax.sharding.Mesh(np.array(gpus), ("d",))
    relu = xlakern.numba_cuda_kernel(K.elementwise_relu, outs=SDS((per,), jnp.float32), launch_dims=per)
    abs_fn = xlakern.numba_cuda_callable(abs_via_two_kernels, outs=SDS((per,), jnp.float32))
    op = xlakern.XLACustomKernel(f"sharded_relu_{n_dev}_{rng.integers(1 << 30)}")
    op.def_numba_cuda_kernel(lambda outs: xlakern.numba_cuda_kernel(K.elementwise_relu, outs=outs[0],
                                                                     launch_dims=outs[0].shape[0]))

    def local(x):
        return relu(x) + abs_fn(x) + op(x, outs=[SDS(x.shape, x.dtype)])[0]

    xh = rng.standard_normal(n_dev * per).astype(np.float32)
    x = jax.device_put(xh, NamedSharding(mesh, P("d")))
    y = jax.jit(shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=P("d")))(x)
    assert y.sharding.device_set == set(gpus)
    np.testing.assert_allclose(np.asarray(y), 2 * np.maximum(xh, 0) + np.abs(xh), rtol=1e-6)
