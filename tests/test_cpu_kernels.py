"""C++ kernels on the CPU, end to end: jit, vmap, attrs, outputs, dtypes, parallel_for."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import xlakern
from conftest import included_headers, x64

SDS = jax.ShapeDtypeStruct
pytestmark = pytest.mark.usefixtures("on_cpu")

KERNELS = r"""
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <stdexcept>

// iostreams inside a kernel (a toolchain that links libstdc++ statically broke exactly this).
// @xk format_sum arg ret
void format_sum(const xk::Tensor x, xk::Tensor out) {
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += x.data<float>()[i];
  std::ostringstream text;
  text << std::fixed << std::setprecision(3) << s;
  std::string t = text.str();
  uint8_t* o = out.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = i < (int64_t)t.size() ? (uint8_t)t[i] : 0;
}

// @xk decay arg arg ret attr.alpha:float32
void decay(const xk::Tensor v, const xk::Tensor x, xk::Tensor out, float alpha) {
  const float* pv = v.data<float>(); const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < v.numel(); ++i) po[i] = pv[i] * alpha + px[i];
}

// Three outputs of different shapes and dtypes: row sums, row argmax, total (0-d).
// @xk row_stats arg ret ret ret
void row_stats(const xk::Tensor x, xk::Tensor sums, xk::Tensor argmax, xk::Tensor total) {
  XK_CHECK(x.ndim() == 2) << "row_stats wants a matrix, got " << x.ndim() << " dims";
  const float* px = x.data<float>();
  float* ps = sums.data<float>(); int32_t* pa = argmax.data<int32_t>();
  float t = 0;
  for (int64_t r = 0; r < x.shape(0); ++r) {
    float s = 0; int32_t best = 0;
    for (int64_t c = 0; c < x.shape(1); ++c) {
      float v = px[r * x.stride(0) + c];
      s += v;
      if (v > px[r * x.stride(0) + best]) best = static_cast<int32_t>(c);
    }
    ps[r] = s; pa[r] = best; t += s;
  }
  total.data<float>()[0] = t;
}

// Two outputs: min and max of a vector (both 0-d).
// @xk min_max arg ret ret
void min_max(const xk::Tensor x, xk::Tensor lo, xk::Tensor hi) {
  const double* p = x.data<double>();
  double a = p[0], b = p[0];
  for (int64_t i = 1; i < x.numel(); ++i) { a = std::fmin(a, p[i]); b = std::fmax(b, p[i]); }
  *lo.data<double>() = a; *hi.data<double>() = b;
}

// @xk copy_bytes arg ret
void copy_bytes(const xk::Tensor x, xk::Tensor out) {
  XK_CHECK(x.dtype() == out.dtype() && x.nbytes() == out.nbytes()) << "mismatched copy";
  if (x.nbytes()) std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
}

// What the kernel sees of its input: dtype code, element size, ndim, numel, shape/stride of dim -1.
// @xk describe arg ret
void describe(const xk::Tensor x, xk::Tensor out) {
  int32_t* o = out.data<int32_t>();
  o[0] = static_cast<int32_t>(x.dtype());
  o[1] = static_cast<int32_t>(x.element_size());
  o[2] = x.ndim();
  o[3] = static_cast<int32_t>(x.numel());
  o[4] = x.ndim() ? static_cast<int32_t>(x.shape(-1)) : -1;
  o[5] = x.ndim() ? static_cast<int32_t>(x.stride(0)) : -1;
}

// @xk double_any arg ret
void double_any(const xk::Tensor x, xk::Tensor out) {
  XK_DISPATCH_ALL_TYPES(x.dtype(), scalar_t, {
    const scalar_t* in = x.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = static_cast<scalar_t>(in[i] + in[i]);
  });
}

// @xk smooth arg ret attr.grain:int64
void smooth(const xk::Tensor x, xk::Tensor out, int64_t grain) {
  const float* in = x.data<float>(); float* o = out.data<float>();
  xk::parallel_for(x.numel(), grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = std::sin(in[i]) * std::exp(-0.5f * in[i] * in[i]) + in[i];
  });
}

// @xk pool_threads ret
void pool_threads(xk::Tensor out) { out.data<int32_t>()[0] = static_cast<int32_t>(xk::num_threads()); }

// @xk throw_in_range arg ret attr.bad:int64
void throw_in_range(const xk::Tensor x, xk::Tensor out, int64_t bad) {
  float* o = out.data<float>();
  xk::parallel_for(x.numel(), 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i == bad) throw std::out_of_range("element " + std::to_string(i) + " is bad");
      o[i] = 0;
    }
  });
}
"""


@pytest.fixture(scope="module")
def mod():
    return xlakern.load_cpp_inline("cpu_kernels", KERNELS)


def test_iostreams_work_inside_kernels(mod, rng):
    x = rng.standard_normal(50).astype(np.float32)
    raw = np.asarray(mod.format_sum(x, outs=SDS((32,), jnp.uint8)))
    assert bytes(raw).rstrip(b"\0").decode() == f"{x.astype(np.float64).sum():.3f}"


def test_module_describes_itself(mod):
    assert mod.functions["decay"] == "arg arg ret attr.alpha:float32"
    assert mod.targets["row_stats"] == "cpu_kernels.row_stats"
    assert mod.path.is_file()
    assert {"cpu_kernels.decay", "cpu_kernels.min_max"} <= set(xlakern.list_registered_targets())


def test_decay_eager_jit_and_raw_ffi_call(mod, rng):
    v = rng.standard_normal(1000).astype(np.float32)
    x = rng.standard_normal(1000).astype(np.float32)
    want = v.astype(np.float64) * 0.9 + x
    out = SDS(v.shape, v.dtype)
    np.testing.assert_allclose(mod.decay(v, x, outs=out, alpha=0.9), want, rtol=1e-6, atol=1e-6)
    jitted = jax.jit(lambda v, x: mod.decay(v, x, outs=out, alpha=0.9))
    np.testing.assert_allclose(jitted(v, x), want, rtol=1e-6, atol=1e-6)
    raw = jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x, alpha=np.float32(0.9))
    np.testing.assert_allclose(raw, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mistake, message", [
    ("float64 attribute", r"attribute 'alpha' must be a scalar of dtype float32, the call passed a scalar of dtype float64"),
    ("int32 attribute", r"attribute 'alpha' must be a scalar of dtype float32, the call passed a scalar of dtype int32"),
    ("no attribute", r"it takes the attributes \[alpha\], the call passed \[\]"),
    ("misspelt attribute", r"it takes the attributes \[alpha\], the call passed \[alfa\]"),
    ("extra attribute", r"it takes the attributes \[alpha\], the call passed \[alpha, beta\]"),
    ("three inputs", r"it takes 2 input\(s\) and 1 output\(s\), the call passed 3 and 1"),
    ("two outputs", r"it takes 2 input\(s\) and 1 output\(s\), the call passed 2 and 2"),
])
def test_raw_ffi_call_mistakes_name_what_is_wrong(mod, rng, mistake, message):
    # A raw jax.ffi.ffi_call reaches the generated handler without xlakern's Python checks: the handler
    # itself must refuse a call that does not fit its signature, say why, and not run the kernel.
    v = rng.standard_normal(64).astype(np.float32)
    x = rng.standard_normal(64).astype(np.float32)
    out = SDS(v.shape, v.dtype)
    call = {
        "float64 attribute": lambda: jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x, alpha=np.float64(0.9)),
        "int32 attribute": lambda: jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x, alpha=np.int32(1)),
        "no attribute": lambda: jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x),
        "misspelt attribute": lambda: jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x, alfa=np.float32(0.9)),
        "extra attribute": lambda: jax.ffi.ffi_call("cpu_kernels.decay", out)(
            v, x, alpha=np.float32(0.9), beta=np.float32(1)),
        "three inputs": lambda: jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x, x, alpha=np.float32(0.9)),
        "two outputs": lambda: jax.ffi.ffi_call("cpu_kernels.decay", (out, out))(v, x, alpha=np.float32(0.9)),
    }[mistake]
    with pytest.raises(Exception, match=message) as info:
        jax.block_until_ready(call())
    assert "cpu_kernels.decay" in str(info.value)
    # the same target, called rightly afterwards, still works
    good = jax.ffi.ffi_call("cpu_kernels.decay", out)(v, x, alpha=np.float32(0.25))
    np.testing.assert_allclose(good, v.astype(np.float64) * 0.25 + x, rtol=1e-6, atol=1e-6)


def test_kernel_inside_fori_loop(mod, rng):
    v0 = rng.standard_normal(512).astype(np.float32)
    x = rng.standard_normal(512).astype(np.float32)

    @jax.jit
    def run(v, x):
        return jax.lax.fori_loop(0, 50, lambda i, v: mod.decay(v, x, outs=SDS(v.shape, v.dtype), alpha=0.95), v)

    want = v0.astype(np.float64)
    for _ in range(50):
        want = want * np.float32(0.95) + x
    np.testing.assert_allclose(run(v0, x), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["sequential", "broadcast_all", "expand_dims"])
def test_vmap_through_vmap_method(mod, rng, method):
    v = rng.standard_normal((6, 33)).astype(np.float32)
    x = rng.standard_normal((6, 33)).astype(np.float32)
    f = lambda v, x: mod.decay(v, x, outs=SDS(v.shape, v.dtype), alpha=0.5, vmap_method=method)
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(v, x), v * 0.5 + x, rtol=1e-6)


def test_vmap_with_unbatched_argument(mod, rng):
    v = rng.standard_normal((4, 10)).astype(np.float32)
    x = rng.standard_normal(10).astype(np.float32)
    f = lambda v, x: mod.decay(v, x, outs=SDS(v.shape, v.dtype), alpha=2.0, vmap_method="sequential")
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(v, x), v * 2 + x, rtol=1e-6)


def test_three_outputs_of_different_shapes_and_dtypes(mod, rng):
    x = rng.standard_normal((7, 5)).astype(np.float32)
    outs = (SDS((7,), jnp.float32), SDS((7,), jnp.int32), SDS((), jnp.float32))
    sums, argmax, total = jax.jit(lambda x: mod.row_stats(x, outs=outs))(x)
    np.testing.assert_allclose(sums, x.sum(1), rtol=1e-5)
    np.testing.assert_array_equal(argmax, x.argmax(1))
    assert total.shape == () and total.dtype == jnp.float32
    np.testing.assert_allclose(total, x.sum(), rtol=1e-4)


def test_outs_structure_is_kept(mod, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    sums, (argmax, total) = mod.row_stats(x, outs=(SDS((3,), jnp.float32),
                                                   (SDS((3,), jnp.int32), SDS((), jnp.float32))))
    np.testing.assert_array_equal(argmax, x.argmax(1))
    assert total.shape == ()
    single = mod.copy_bytes(x, outs=SDS(x.shape, x.dtype))  # one struct -> one array, not a list
    assert isinstance(single, jax.Array) and single.shape == x.shape


def test_two_float64_outputs_0d(mod, rng):
    with x64():
        x = rng.standard_normal(101)
        lo, hi = mod.min_max(x, outs=[SDS((), jnp.float64), SDS((), jnp.float64)])
        assert float(lo) == x.min() and float(hi) == x.max()


ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]


def _np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_byte_copy_round_trip_and_tensor_view(mod, rng, dtype):
    dt = _np_dtype(dtype)
    with x64():
        raw = rng.integers(0, 256, size=(3, 5) + (dt.itemsize,), dtype=np.uint8)
        if dtype == "bool":
            raw = (raw & 1).astype(np.uint8)
        x = raw.reshape(3, 5 * dt.itemsize).view(dt).reshape(3, 5)
        y = jax.jit(lambda x: mod.copy_bytes(x, outs=SDS(x.shape, x.dtype)))(x)
        np.testing.assert_array_equal(np.asarray(y).view(np.uint8), x.view(np.uint8))
        info = np.asarray(mod.describe(x, outs=SDS((6,), jnp.int32)))
    assert list(info) == [ALL_DTYPES.index(dtype), dt.itemsize, 2, 15, 5, 5]


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 3)])
def test_zero_dim_and_empty_arrays(mod, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    y = mod.copy_bytes(x, outs=SDS(shape, jnp.float32))
    assert y.shape == shape
    np.testing.assert_array_equal(y, x)
    info = np.asarray(mod.describe(x, outs=SDS((6,), jnp.int32)))
    assert info[2] == len(shape) and info[3] == int(np.prod(shape))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int32", "uint64", "bool"])
def test_typed_dispatch(mod, rng, dtype):
    with x64():
        if dtype == "bool":
            x = rng.integers(0, 2, 40).astype(bool)
            want = x | x
        elif dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            x = rng.integers(info.min // 4, info.max // 4, 40, dtype=dtype)
            want = x + x
        else:
            x = rng.standard_normal(40).astype(dtype)
            want = x + x
        y = mod.double_any(x, outs=SDS(x.shape, x.dtype))
        np.testing.assert_array_equal(y, want)


def test_typed_dispatch_rejects_unsupported_dtype(mod):
    x = np.ones(4, np.float16)
    with pytest.raises(xlakern.KernelError, match=r"XK_DISPATCH_ALL_TYPES: unsupported dtype float16"):
        mod.double_any(x, outs=SDS(x.shape, x.dtype))


def test_parallel_for_matches_serial_and_numpy(mod, rng):
    x = rng.standard_normal(200_003).astype(np.float32)
    out = SDS(x.shape, x.dtype)
    serial = np.asarray(mod.smooth(x, outs=out, grain=1 << 40))
    parallel = np.asarray(jax.jit(lambda x: mod.smooth(x, outs=out, grain=64))(x))
    np.testing.assert_array_equal(parallel, serial)
    x64_ = x.astype(np.float64)
    np.testing.assert_allclose(parallel, np.sin(x64_) * np.exp(-0.5 * x64_ * x64_) + x64_, rtol=1e-5, atol=1e-6)


def test_parallel_for_uses_xla_thread_pool(mod):
    n = int(mod.pool_threads(outs=SDS((1,), jnp.int32))[0])
    assert n >= 1
    if (os.cpu_count() or 1) > 1:
        assert n > 1, "XLA's intra-op thread pool should be offered to CPU kernels"


def test_exception_in_parallel_range_becomes_kernel_error(mod, rng):
    x = rng.standard_normal(10_000).astype(np.float32)
    with pytest.raises(xlakern.KernelError, match=r"cpu_kernels.throw_in_range.*element 7777 is bad"):
        mod.throw_in_range(x, outs=SDS(x.shape, x.dtype), bad=7777)
    y = mod.throw_in_range(x, outs=SDS(x.shape, x.dtype), bad=-1)  # the process and module go on
    assert np.all(np.asarray(y) == 0)


def test_failed_check_raises_and_next_call_runs(mod, rng):
    x = rng.standard_normal(6).astype(np.float32)
    outs = (SDS((6,), jnp.float32), SDS((6,), jnp.int32), SDS((), jnp.float32))
    with pytest.raises(xlakern.KernelError) as err:
        mod.row_stats(x, outs=outs)
    msg = str(err.value)
    assert "cpu_kernels.row_stats" in msg and "x.ndim() == 2" in msg and "got 1 dims" in msg
    assert "inline:cpu_kernels:" in msg  # where the check is, in the user's own source
    m = rng.standard_normal((6, 2)).astype(np.float32)
    sums, _, _ = mod.row_stats(m, outs=outs)
    np.testing.assert_allclose(sums, m.sum(1), rtol=1e-5)


def test_failed_check_under_jit_raises(mod):
    outs = (SDS((3,), jnp.float32), SDS((3,), jnp.int32), SDS((), jnp.float32))
    f = jax.jit(lambda x: mod.row_stats(x, outs=outs))
    with pytest.raises(Exception, match=r"xlakern kernel 'cpu_kernels.row_stats' failed"):
        jax.block_until_ready(f(np.ones(3, np.float32)))


ATTRS = r"""
// @xk echo ret ret ret attr.b:bool attr.i8:int8 attr.i16:int16 attr.i32:int32 attr.i64:int64 attr.u8:uint8 attr.u16:uint16 attr.u32:uint32 attr.u64:uint64 attr.f32:float32 attr.f64:float64 attr.h:float16 attr.bh:bfloat16
void echo(xk::Tensor ints, xk::Tensor uints, xk::Tensor floats, bool b, int8_t i8, int16_t i16,
          int32_t i32, int64_t i64, uint8_t u8, uint16_t u16, uint32_t u32, uint64_t u64,
          float f32, double f64, uint16_t h, uint16_t bh) {
  int64_t* pi = ints.data<int64_t>();
  pi[0] = b; pi[1] = i8; pi[2] = i16; pi[3] = i32; pi[4] = i64;
  uint64_t* pu = uints.data<uint64_t>();
  pu[0] = u8; pu[1] = u16; pu[2] = u32; pu[3] = u64; pu[4] = h; pu[5] = bh;
  double* pf = floats.data<double>();
  pf[0] = f32; pf[1] = f64;
}
"""


@pytest.mark.parametrize("b", [True, False])
def test_every_attr_type_with_edge_values(b):
    mod = xlakern.load_cpp_inline("attr_echo", ATTRS)
    outs = [SDS((5,), jnp.int64), SDS((6,), jnp.uint64), SDS((2,), jnp.float64)]
    vals = dict(b=b, i8=-128, i16=-32768, i32=-(2**31), i64=-(2**63), u8=255, u16=65535,
                u32=2**32 - 1, u64=2**64 - 1, f32=np.float32(1.5e-30), f64=1 + 1e-12, h=-2.5, bh=3.0)
    with x64():
        ints, uints, floats = (np.asarray(a) for a in jax.jit(lambda: mod.echo(outs=outs, **vals))())
    assert list(ints) == [int(b), -128, -32768, -(2**31), -(2**63)]
    half_bits = int(np.array(-2.5, np.float16).view(np.uint16))
    bf_bits = int(np.array(3.0, ml_dtypes.bfloat16).view(np.uint16))
    assert [int(u) for u in uints] == [255, 65535, 2**32 - 1, 2**64 - 1, half_bits, bf_bits]
    assert floats[0] == np.float64(np.float32(1.5e-30))
    assert floats[1] == 1 + 1e-12 and floats[1] - 1.0 > 0  # full float64 precision


def test_public_header_leaves_iostreams_and_thread_headers_out_of_cpu_units(tmp_path):
    """xlakern.h formats XK_CHECK's values without <sstream>, and declares parallel_for's pooled half
    without <mutex>/<condition_variable>/<memory> (it is defined once a module, in the generated handler
    unit: xlakern/parallel_run.h). A class with only its own operator<< still streams where the source
    includes <sstream> (below)."""
    src = tmp_path / "empty.cc"
    src.write_text("int f() { return 1; }\n")
    cxx = xlakern._toolchain.host_compiler().command
    headers = included_headers([*cxx, "-std=c++17", "-isystem", str(xlakern._toolchain.include_dir()),
                                "-include", "xlakern/xlakern.h"], src)
    assert {"xlakern.h", "check.h", "parallel.h"} <= headers
    assert not headers & {"sstream", "istream", "ostream", "mutex", "condition_variable", "parallel_run.h"}


CHECK_STREAMS = r"""
%s
struct Coord { int x, y; };
std::ostream& operator<<(std::ostream& os, const Coord& c) { return os << "Coord(" << c.x << ", " << c.y << ")"; }

// @xk fails_with_values arg ret
void fails_with_values(const xk::Tensor x, xk::Tensor out) {
  XK_CHECK(x.numel() < 0) << "n " << x.numel() << ", scale " << 0.1f * x.numel() << ", " << Coord{3, 4};
}
"""


def test_check_streams_numbers_and_classes(rng):
    with pytest.raises(xlakern.CompilationError, match=r"#include <sstream> in this source"):
        xlakern.load_cpp_inline("check_streams_no_sstream", CHECK_STREAMS % "#include <ostream>")
    mod = xlakern.load_cpp_inline("check_streams", CHECK_STREAMS % "#include <sstream>")
    n = int(rng.integers(3, 1000))
    x = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    with pytest.raises(xlakern.KernelError, match=rf"n {n}, scale {0.1 * n:g}, Coord\(3, 4\)"):
        mod.fails_with_values(x, outs=SDS(x.shape, x.dtype))
