"""`zeroed_outputs` on every path that creates outputs, and per-element vmap of C++/CUDA modules.

XLA hands kernels uninitialised output buffers; a kernel that accumulates (a histogram, a
scatter-add) needs them cleared. These tests check exact integer counts against NumPy, on
repeated eager calls, inside `fori_loop` (where XLA reuses the loop's buffers) and under vmap,
so a missing or partial clear shows up as wrong counts. The CPU half runs in CI; the GPU half
(marked `gpu`) runs the same checks with Numba CUDA kernels, a callable and a CUDA module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import unique_name

SDS = jax.ShapeDtypeStruct
NBINS = 64

CPP = r"""
// Counts x's values (bin indices) into out, adding to what out holds.
// @xk histogram arg ret
void histogram(const xk::Tensor x, xk::Tensor out) {
  const int32_t* v = x.data<int32_t>();
  int32_t* counts = out.data<int32_t>();
  for (int64_t i = 0; i < x.numel(); ++i) counts[v[i]] += 1;
}

// out[idx[i]] += w[i]; the second output copies what the first held on entry.
// @xk scatter_peek arg arg ret ret
void scatter_peek(const xk::Tensor idx, const xk::Tensor w, xk::Tensor out, xk::Tensor seen) {
  float* o = out.data<float>();
  float* s = seen.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) s[i] = o[i];
  for (int64_t i = 0; i < idx.numel(); ++i) o[idx.data<int32_t>()[i]] += w.data<float>()[i];
}

// acc (aliased to acc_in) and fresh both get w scattered into them.
// @xk scatter_two arg arg arg ret ret
void scatter_two(const xk::Tensor idx, const xk::Tensor w, const xk::Tensor acc_in, xk::Tensor acc,
                 xk::Tensor fresh) {
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const int32_t k = idx.data<int32_t>()[i];
    acc.data<float>()[k] += w.data<float>()[i];
    fresh.data<float>()[k] += w.data<float>()[i];
  }
}

// A kernel written for one example: its vector divided by its own sum, plus a per-example offset.
// @xk normalise arg arg ret attr.scale:float32
void normalise(const xk::Tensor x, const xk::Tensor offset, xk::Tensor out, float scale) {
  XK_CHECK(x.ndim() == 1 && offset.ndim() == 0) << "normalise takes a vector and a scalar, got ranks "
                                                 << x.ndim() << " and " << offset.ndim();
  const float* v = x.data<float>();
  double total = 0;
  for (int64_t i = 0; i < x.numel(); ++i) total += v[i];
  for (int64_t i = 0; i < x.numel(); ++i)
    out.data<float>()[i] = static_cast<float>(v[i] / total) * scale + offset.data<float>()[0];
}
"""


@pytest.fixture(scope="module")
def mod():
    return xlakern.load_cpp_inline(unique_name("zeroed_cpu"), CPP)


def _bins(rng, n):
    """Bin indices of n uniforms in [0, 1) over NBINS bins, and the exact counts."""
    u = rng.uniform(0.0, 1.0, n)
    bins = np.minimum((u * NBINS).astype(np.int32), NBINS - 1)
    return bins, np.bincount(bins, minlength=NBINS)


def _numba_histogram():
    numba = pytest.importorskip("numba")

    @numba.njit
    def histogram(x, out):
        for i in range(x.size):
            out[x[i]] += 1

    return histogram


# ================================================================== CPU (CI)

@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("path", ["numba_kernel", "cpp"])
def test_histogram_eager_loop_and_vmap_exact(mod, rng, path):
    n = 1_000_000
    bins, ref = _bins(rng, n)
    x = jnp.asarray(bins)
    if path == "numba_kernel":
        hist = xlakern.numba_kernel(_numba_histogram(), outs=SDS((NBINS,), jnp.int32), zeroed_outputs=[0],
                                    vmap_method="broadcast_all")
    else:
        def hist(v):
            return mod.histogram(v, outs=SDS((NBINS,), jnp.int32), zeroed_outputs=[0], vmap_method="broadcast_all")
    for _ in range(3):
        np.testing.assert_array_equal(hist(x), ref)
    # 100 steps: every step's counts are exact only if every step starts from zeros.
    total = jax.jit(lambda v: jax.lax.fori_loop(0, 100, lambda i, acc: acc + hist(v), jnp.zeros(NBINS, jnp.int32)))
    np.testing.assert_array_equal(total(x), 100 * ref)
    small, _ = _bins(rng, 3 * 20_000)
    xb = small.reshape(3, -1)
    refs = np.stack([np.bincount(row, minlength=NBINS) for row in xb])
    np.testing.assert_array_equal(jax.jit(jax.vmap(hist))(jnp.asarray(xb)), refs)


@pytest.mark.usefixtures("on_cpu")
def test_kernel_sees_zeros_on_entry_and_aliased_output_keeps_its_input(mod, rng):
    n, m = 5000, 97
    idx = rng.integers(0, m, n).astype(np.int32)
    w = rng.standard_normal(n).astype(np.float32)
    base = rng.standard_normal(m).astype(np.float32)
    ref = np.zeros(m)
    np.add.at(ref, idx, w.astype(np.float64))
    f = jax.jit(lambda i, w: mod.scatter_peek(i, w, outs=(SDS((m,), jnp.float32), SDS((m,), jnp.float32)),
                                              zeroed_outputs=True))
    for _ in range(3):
        out, seen = f(jnp.asarray(idx), jnp.asarray(w))
        np.testing.assert_array_equal(seen, 0.0)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("path", ["numba_kernel", "cpp"])
def test_scatter_add_with_zeroed_output_beside_aliased_output(mod, rng, path):
    n, m = 20_000, 513
    idx = rng.integers(0, m, n).astype(np.int32)
    w = rng.standard_normal(n).astype(np.float32)
    base = rng.standard_normal(m).astype(np.float32)
    add = np.zeros(m)
    np.add.at(add, idx, w.astype(np.float64))
    outs = [SDS((m,), jnp.float32)] * 2
    if path == "numba_kernel":
        numba = pytest.importorskip("numba")

        @numba.njit
        def scatter_two(idx, w, acc_in, acc, fresh):
            for i in range(idx.size):
                acc[idx[i]] += w[i]
                fresh[idx[i]] += w[i]

        f = xlakern.numba_kernel(scatter_two, outs=outs, input_output_aliases={2: 0}, zeroed_outputs=[1])
    else:
        def f(i, w, b):
            return mod.scatter_two(i, w, b, outs=outs, input_output_aliases={2: 0}, zeroed_outputs=[1])
    jf = jax.jit(f)
    for call in (f, jf, jf):
        acc, fresh = call(jnp.asarray(idx), jnp.asarray(w), jnp.asarray(base))
        np.testing.assert_allclose(acc, base + add, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(fresh, add, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("on_cpu")
def test_callable_zeroed_outputs_gets_the_static_parameters(mod, rng):
    bins, ref = _bins(rng, 10_000)
    seen = []

    def which(params):
        seen.append(dict(params))
        return [0]

    np.testing.assert_array_equal(mod.histogram(jnp.asarray(bins), outs=SDS((NBINS,), jnp.int32),
                                                zeroed_outputs=which), ref)
    assert seen == [{}]
    x = jnp.asarray(rng.uniform(1, 2, 16).astype(np.float32))
    out = mod.normalise(x, jnp.float32(0.0), outs=SDS((16,), jnp.float32), scale=2.0,
                        zeroed_outputs=lambda p: [0] if p["scale"] == 2.0 else [])
    np.testing.assert_allclose(out, np.asarray(x) / np.asarray(x, np.float64).sum() * 2, rtol=1e-5)


def _bad_values():
    return [([1], "output 1"), ([0, 0], "output 0 twice"), ([-1], "output -1"), (["0"], "'0'"),
            ([True], "True"), (3.5, "3.5")]


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("value, words", _bad_values())
def test_bad_zeroed_outputs_is_call_error_naming_the_index(mod, value, words):
    x = jnp.zeros(8, jnp.int32)
    with pytest.raises(xlakern.CallError, match="zeroed_outputs") as info:
        mod.histogram(x, outs=SDS((NBINS,), jnp.int32), zeroed_outputs=value)
    assert words in str(info.value)
    with pytest.raises(xlakern.CallError, match="zeroed_outputs") as info:
        xlakern.numba_kernel(_numba_histogram(), outs=SDS((NBINS,), jnp.int32), zeroed_outputs=value)
    assert words in str(info.value)


@pytest.mark.usefixtures("on_cpu")
def test_zeroed_and_aliased_output_is_call_error_saying_so(mod):
    with pytest.raises(xlakern.CallError, match=r"output 0 is named by zeroed_outputs and aliases input 0"):
        mod.histogram(jnp.zeros(NBINS, jnp.int32), outs=SDS((NBINS,), jnp.int32), zeroed_outputs=[0],
                      input_output_aliases={0: 0})
    with pytest.raises(xlakern.CallError, match=r"output 0 is named by zeroed_outputs and aliases input 0"):
        xlakern.numba_kernel(_numba_histogram(), outs=SDS((NBINS,), jnp.int32), zeroed_outputs=True,
                             input_output_aliases={0: 0})


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("backend", ["numba", "cpp"])
def test_xla_custom_kernel_passes_zeroed_outputs_to_what_its_generator_builds(mod, rng, backend):
    kern = _numba_histogram()
    got_kwargs = []

    def numba_gen(outs, **kw):
        got_kwargs.append(kw)
        return xlakern.numba_kernel(kern, outs=outs[0], vmap_method="broadcast_all")

    def cpp_gen(outs, **kw):
        got_kwargs.append(kw)
        return lambda x: mod.histogram(x, outs=outs[0], vmap_method="broadcast_all")

    op = xlakern.XLACustomKernel(unique_name("zeroed_hist"))
    op.def_kernel(backend, "cpu", numba_gen if backend == "numba" else cpp_gen)
    bins, ref = _bins(rng, 200_000)
    x = jnp.asarray(bins)
    out = [SDS((NBINS,), jnp.int32)]
    for _ in range(2):
        np.testing.assert_array_equal(op(x, outs=out, zeroed_outputs=[0], tag=3)[0], ref)
    loop = jax.jit(lambda v: jax.lax.fori_loop(
        0, 20, lambda i, acc: acc + op(v, outs=out, zeroed_outputs=lambda kw: [0] * (kw["tag"] == 3), tag=3)[0],
        jnp.zeros(NBINS, jnp.int32)))
    np.testing.assert_array_equal(loop(x), 20 * ref)
    xb = jnp.stack([x[:1000], x[1000:2000]])
    np.testing.assert_array_equal(
        jax.vmap(lambda v: op(v, outs=out, zeroed_outputs=True, tag=3)[0])(xb),
        np.stack([np.bincount(bins[:1000], minlength=NBINS), np.bincount(bins[1000:2000], minlength=NBINS)]))
    assert all("zeroed_outputs" not in kw and kw == {"tag": 3} for kw in got_kwargs)
    with pytest.raises(xlakern.CallError, match="output 2"):
        op(x, outs=out, zeroed_outputs=[2], tag=3)


@pytest.mark.usefixtures("on_cpu")
def test_xla_custom_kernel_zeroed_outputs_reaching_no_kernel_is_an_error(rng):
    op = xlakern.XLACustomKernel(unique_name("zeroed_jnp"))
    op.def_kernel("jnp", "cpu", lambda outs, **kw: lambda x: [x + 1])
    x = jnp.asarray(rng.standard_normal(4).astype(np.float32))
    np.testing.assert_allclose(op(x, outs=[SDS((4,), jnp.float32)])[0], np.asarray(x) + 1, rtol=1e-6)
    with pytest.raises(xlakern.CallError, match="reached no xlakern kernel"):
        op(x, outs=[SDS((4,), jnp.float32)], zeroed_outputs=[0])
    np.testing.assert_allclose(op(x, outs=[SDS((4,), jnp.float32)], zeroed_outputs=[])[0], np.asarray(x) + 1,
                               rtol=1e-6)  # nothing to zero: nothing to check


@pytest.mark.usefixtures("on_cpu")
def test_xla_custom_kernel_wrapper_with_its_own_zeroed_outputs_wins(rng):
    kern = _numba_histogram()
    op = xlakern.XLACustomKernel(unique_name("zeroed_own"))
    op.def_numba_kernel(lambda outs, **kw: xlakern.numba_kernel(kern, outs=outs[0], zeroed_outputs=[0]))
    bins, ref = _bins(rng, 50_000)
    for zeroed in (None, [0], True):
        np.testing.assert_array_equal(op(jnp.asarray(bins), outs=[SDS((NBINS,), jnp.int32)],
                                         zeroed_outputs=zeroed)[0], ref)


# ---------------------------------------------------------------- per-element vmap of C++ modules

@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("method", ["broadcast_all", "expand_dims"])
def test_vmap_of_one_example_cpp_kernel_equals_the_loop(mod, rng, method):
    x = jnp.asarray(rng.uniform(0.5, 2.0, (4, 3, 33)).astype(np.float32))
    offset = jnp.asarray(rng.standard_normal(4).astype(np.float32))
    one = lambda v, o: mod.normalise(v, o, outs=SDS(v.shape, v.dtype), scale=1.5, vmap_method=method)
    loop = np.stack([np.stack([np.asarray(one(x[i, j], offset[i])) for j in range(3)]) for i in range(4)])
    xd = np.asarray(x, np.float64)
    np.testing.assert_allclose(loop, xd / xd.sum(-1, keepdims=True) * 1.5 + np.asarray(offset)[:, None, None],
                               rtol=1e-5, atol=1e-6)
    # Two vmap levels; the offset batched only by the outer one (broadcast over the inner one).
    nested = jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(0, 0))
    np.testing.assert_allclose(jax.jit(nested)(x, offset), loop, rtol=1e-6)
    np.testing.assert_allclose(nested(x, offset), loop, rtol=1e-6)
    # Batched along axis 1 of the input: vmap moves it, the kernel still sees one example.
    xt = jnp.swapaxes(x[:, 0, :], 0, 1)
    np.testing.assert_allclose(jax.vmap(one, in_axes=(1, 0))(xt, offset), loop[:, 0], rtol=1e-6)


@pytest.mark.usefixtures("on_cpu")
def test_plain_target_keeps_its_attribute_interface_and_whole_tensor_contract(mod, rng):
    # Raw jax.ffi.ffi_call on "<module>.<fn>" (what the seeds do) sees exactly the arg_spec's
    # attributes and hands the kernel whatever arrays it is given.
    x = rng.uniform(0.5, 2.0, 12).astype(np.float32)
    out = jax.ffi.ffi_call(f"{mod.name}.normalise", SDS((12,), jnp.float32))(
        jnp.asarray(x), jnp.float32(1.0), scale=np.float32(2.0))
    np.testing.assert_allclose(out, x / x.astype(np.float64).sum() * 2 + 1, rtol=1e-5)
    assert f"{mod.name}.normalise" in xlakern.list_registered_targets()


# ================================================================== GPU

NUMBA_CUDA = None


def _cuda_kernels():
    """The GPU kernels, built on first use (numba-cuda may be absent in CI)."""
    global NUMBA_CUDA
    if NUMBA_CUDA is None:
        cuda = xlakern._numba_cuda.import_numba_cuda()

        @cuda.jit
        def histogram(x, out):
            i = cuda.grid(1)
            if i < x.size:
                cuda.atomic.add(out, x[i], 1)

        @cuda.jit
        def scatter_two(idx, w, acc_in, acc, fresh):
            i = cuda.grid(1)
            if i < idx.size:
                cuda.atomic.add(acc, idx[i], w[i])
                cuda.atomic.add(fresh, idx[i], w[i])

        def histogram_callable(x, out, stream):
            histogram[(x.size + 255) // 256, 256, stream](x, out)

        NUMBA_CUDA = {"histogram": histogram, "scatter_two": scatter_two, "callable": histogram_callable}
    return NUMBA_CUDA


CUDA_SRC = r"""
#include <cuda_runtime.h>

__global__ void hist_kernel(const int* x, int* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&out[x[i]], 1);
}

// @xk histogram arg ret stream
void histogram(const xk::Tensor x, xk::Tensor out, cudaStream_t stream) {
  long long n = x.numel();
  if (n == 0) return;
  hist_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x.data<int>(), out.data<int>(), n);
}

__global__ void sum_kernel(const float* x, float* total, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(total, x[i]);
}
__global__ void divide_kernel(const float* x, const float* total, float* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] / total[0];
}

// A kernel written for one example: its vector divided by its own sum. `total` is a
// zeroed scratch output holding the sum.
// @xk normalise arg ret ret stream
void normalise(const xk::Tensor x, xk::Tensor out, xk::Tensor total, cudaStream_t stream) {
  long long n = x.numel();
  unsigned blocks = (unsigned)((n + 255) / 256);
  sum_kernel<<<blocks, 256, 0, stream>>>(x.data<float>(), total.data<float>(), n);
  divide_kernel<<<blocks, 256, 0, stream>>>(x.data<float>(), total.data<float>(), out.data<float>(), n);
}
"""


@pytest.fixture(scope="module")
def cuda_mod():
    return xlakern.load_cuda_inline(unique_name("zeroed_cuda"), CUDA_SRC)


def _gpu(x):
    return jax.device_put(x, jax.devices("gpu")[0])


def _gpu_histograms(cuda_mod):
    k = _cuda_kernels()
    n = 1_000_000
    yield "numba_cuda_kernel", xlakern.numba_cuda_kernel(
        k["histogram"], outs=SDS((NBINS,), jnp.int32), launch_dims=n, zeroed_outputs=[0],
        vmap_method="broadcast_all")
    yield "numba_cuda_callable", xlakern.numba_cuda_callable(
        k["callable"], outs=SDS((NBINS,), jnp.int32), zeroed_outputs=True, vmap_method="sequential")
    yield "cuda module", lambda x: cuda_mod.histogram(x, outs=SDS((NBINS,), jnp.int32), zeroed_outputs=[0],
                                                      vmap_method="broadcast_all")


@pytest.mark.gpu
def test_gpu_histogram_of_1m_uniforms_eager_loop_and_vmap(cuda_mod, rng):
    n = 1_000_000
    bins, ref = _bins(rng, n)
    x = _gpu(bins)
    for name, hist in _gpu_histograms(cuda_mod):
        for _ in range(3):
            np.testing.assert_array_equal(hist(x), ref, err_msg=name)
        total = jax.jit(lambda v: jax.lax.fori_loop(0, 100, lambda i, acc: acc + hist(v),
                                                    jnp.zeros(NBINS, jnp.int32)))
        np.testing.assert_array_equal(total(x), 100 * ref, err_msg=name)
        per_step = jax.jit(lambda v: jax.lax.scan(lambda c, _: (c, hist(v)), 0, None, length=100)[1])
        np.testing.assert_array_equal(per_step(x), np.broadcast_to(ref, (100, NBINS)), err_msg=name)
        other, ref2 = _bins(rng, n)
        xb = _gpu(np.stack([bins, other]))
        np.testing.assert_array_equal(jax.jit(jax.vmap(hist))(xb), np.stack([ref, ref2]), err_msg=name)


@pytest.mark.gpu
def test_gpu_scatter_add_with_zeroed_output_beside_aliased_output(rng):
    k = _cuda_kernels()
    n, m = 300_000, 1031
    idx = rng.integers(0, m, n).astype(np.int32)
    w = rng.integers(-8, 8, n).astype(np.float32)  # integers: float32 atomics sum them exactly
    base = rng.integers(-100, 100, m).astype(np.float32)
    add = np.zeros(m)
    np.add.at(add, idx, w.astype(np.float64))
    f = xlakern.numba_cuda_kernel(k["scatter_two"], outs=[SDS((m,), jnp.float32)] * 2, launch_dims=n,
                                  input_output_aliases={2: 0}, zeroed_outputs=[1])
    jf = jax.jit(f)
    for call in (f, jf, jf):
        acc, fresh = call(_gpu(idx), _gpu(w), _gpu(base))
        np.testing.assert_array_equal(acc, base + add)
        np.testing.assert_array_equal(fresh, add)
    with pytest.raises(xlakern.CallError, match="output 0 is named by zeroed_outputs and aliases input 2"):
        xlakern.numba_cuda_kernel(k["scatter_two"], outs=[SDS((m,), jnp.float32)] * 2, launch_dims=n,
                                  input_output_aliases={2: 0}, zeroed_outputs=[0, 1])


@pytest.mark.gpu
def test_gpu_vmap_of_one_example_cuda_kernel_equals_the_loop(cuda_mod, rng):
    x = _gpu(rng.uniform(0.5, 2.0, (5, 1000)).astype(np.float32))
    one = lambda v: cuda_mod.normalise(v, outs=(SDS(v.shape, v.dtype), SDS((1,), jnp.float32)),
                                       zeroed_outputs=[1], vmap_method="broadcast_all")[0]
    loop = np.stack([np.asarray(one(x[i])) for i in range(5)])
    xd = np.asarray(x, np.float64)
    np.testing.assert_allclose(loop, xd / xd.sum(-1, keepdims=True), rtol=1e-5)
    # The kernel sums with atomics (any order): vmap and the loop agree to float32 rounding.
    np.testing.assert_allclose(jax.jit(jax.vmap(one))(x), loop, rtol=1e-5)
    steps = jax.jit(lambda v: jax.lax.fori_loop(0, 100, lambda i, acc: acc + jax.vmap(one)(v), jnp.zeros_like(v)))
    np.testing.assert_allclose(steps(x), 100 * loop, rtol=1e-4)


@pytest.mark.gpu
def test_gpu_xla_custom_kernel_passes_zeroed_outputs_through(rng):
    k = _cuda_kernels()
    n = 1_000_000
    op = xlakern.XLACustomKernel(unique_name("zeroed_gpu_hist"))
    op.def_numba_cuda_kernel(lambda outs, **kw: xlakern.numba_cuda_kernel(k["histogram"], outs=outs[0],
                                                                          launch_dims=n))
    bins, ref = _bins(rng, n)
    out = [SDS((NBINS,), jnp.int32)]
    loop = jax.jit(lambda v: jax.lax.fori_loop(0, 100, lambda i, acc: acc + op(v, outs=out, zeroed_outputs=[0])[0],
                                               jnp.zeros(NBINS, jnp.int32)))
    np.testing.assert_array_equal(loop(_gpu(bins)), 100 * ref)


@pytest.mark.usefixtures("on_cpu")
def test_zeroing_adds_no_xla_op(mod, rng):
    # The clear happens inside the kernel's own custom call: the program holds that one call
    # and no zeros of its own (no constant, broadcast or copy for the output).
    x = jnp.asarray(_bins(rng, 1000)[0])
    nk = xlakern.numba_kernel(_numba_histogram(), outs=SDS((NBINS,), jnp.int32), zeroed_outputs=[0])
    for f in (nk, lambda v: mod.histogram(v, outs=SDS((NBINS,), jnp.int32), zeroed_outputs=[0])):
        text = jax.jit(f).lower(x).as_text()
        ops = [line.split("=", 1)[1].split()[0] for line in text.splitlines()
               if "=" in line and line.strip().startswith("%")]
        assert ops.count("stablehlo.custom_call") == 1, text
        assert not [op for op in ops if op != "stablehlo.custom_call"], text


ZEROED_GRAPH_CHILD = r'''
import numpy as np
import xlakern  # before numba.cuda
xlakern.config.enable_cuda_graph_loops()  # before jax starts: whole loops become CUDA graphs
import jax, jax.numpy as jnp
from numba import cuda

SDS = jax.ShapeDtypeStruct
N, BINS = 1_000_000, 64

@cuda.jit
def histogram(x, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, x[i], 1)

mod = xlakern.load_cuda_inline("zeroed_graph_child", r"""
#include <cuda_runtime.h>
__global__ void hist_kernel(const int* x, int* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&out[x[i]], 1);
}
// @xk histogram arg ret stream
void histogram(const xk::Tensor x, xk::Tensor out, cudaStream_t stream) {
  hist_kernel<<<(unsigned)((x.numel() + 255) / 256), 256, 0, stream>>>(x.data<int>(), out.data<int>(), x.numel());
}
""")
nk = xlakern.numba_cuda_kernel(histogram, outs=SDS((BINS,), jnp.int32), launch_dims=N, zeroed_outputs=[0])
ck = lambda x: mod.histogram(x, outs=SDS((BINS,), jnp.int32), zeroed_outputs=[0])
# Per-step inputs come from the loop counter (no slicing of a scanned array, which XLA keeps out
# of command buffers), and the loop sums the 100 histograms.
loops = [jax.jit(lambda x, f=f: jax.lax.fori_loop(0, 100, lambda i, c: c + f((x + i) % BINS),
                                                  jnp.zeros((BINS,), jnp.int32)))
         for f in (nk, ck)]

rng = np.random.default_rng()

def check():
    x = rng.integers(0, BINS, N).astype(np.int32)
    ref = sum(np.bincount((x + i) % BINS, minlength=BINS) for i in range(100))
    for loop in loops:
        np.testing.assert_array_equal(np.asarray(loop(jnp.asarray(x))), ref)

for rep in range(3):  # the first run records the command buffer, later runs replay it
    check()
xlakern._runtime.enable_launch_probe(True)
for rep in range(2):
    check()
executions, captured = xlakern._runtime.launch_probe()
print("probe", executions, captured)
assert executions <= 2 and captured == executions, (executions, captured)
print("OK")
'''


@pytest.mark.gpu
def test_gpu_zeroing_is_captured_into_cuda_graphs_subprocess(tmp_path):
    import os
    import subprocess
    import sys

    # XLA_FLAGS must be set before jax initialises, hence a fresh interpreter.
    script = tmp_path / "zeroed_graph_child.py"
    script.write_text(ZEROED_GRAPH_CHILD)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLAKERN_QUIET"] = "1"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=500,
                         cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.strip().splitlines()[-1] == "OK"
