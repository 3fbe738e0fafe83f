"""Warp helpers and Warp backends of XLACustomKernel (Warp's JAX bridge runs on the CPU too)."""

# No `from __future__ import annotations`: Warp reads kernel annotations as live objects.

import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import xlakern
from conftest import unique_name

SDS = jax.ShapeDtypeStruct

try:
    import warp

    warp.config.quiet = True
    HAVE_WARP = True
except ImportError:
    HAVE_WARP = False

needs_warp = pytest.mark.skipif(not HAVE_WARP, reason="warp-lang not installed")


@pytest.mark.parametrize("dtype, reason", [(ml_dtypes.bfloat16, "no bfloat16"), (np.complex64, "no complex"),
                                           (jnp.complex128, "no complex")])
def test_unsupported_dtypes_are_clear_errors(dtype, reason):
    with pytest.raises(xlakern.WarpTypeError, match=reason):
        xlakern.jaxtype_to_warptype(dtype)
    with pytest.raises(ValueError):  # WarpTypeError is a ValueError
        xlakern.jaxinfo_to_warpinfo(SDS((4,), dtype))


def test_zero_d_and_too_many_dims_are_clear_errors():
    with pytest.raises(xlakern.WarpTypeError, match="0-d.*shape \\(1,\\)"):
        xlakern.jaxinfo_to_warpinfo(SDS((), jnp.float32))
    with pytest.raises(xlakern.WarpTypeError, match="at most 4"):
        xlakern.jaxinfo_to_warpinfo(SDS((1, 1, 1, 1, 1), jnp.float32))


def test_missing_warp_is_reported_only_when_chosen(monkeypatch):
    monkeypatch.setitem(sys.modules, "warp", None)  # `import warp` now raises ImportError
    with pytest.raises(xlakern.WarpNotInstalledError, match="pip install warp-lang"):
        xlakern.jaxtype_to_warptype(jnp.float32)
    op = xlakern.XLACustomKernel(unique_name("warp_missing"))
    op.def_kernel("jnp", "cpu", lambda outs: lambda x: x + 1)
    op.def_warp_kernel(lambda outs: lambda x: x)  # registering needs no Warp
    assert {p: list(b) for p, b in op._kernels.items()} == {"cpu": ["jnp", "warp"], "gpu": ["warp"]}
    with jax.default_device(jax.devices("cpu")[0]):
        x = jnp.arange(3.0)
        np.testing.assert_allclose(op(x, outs=[SDS(x.shape, x.dtype)])[0], [1, 2, 3])
        with pytest.raises(xlakern.WarpNotInstalledError, match="'warp' backend was chosen.*other backends.*jnp"):
            op(x, outs=[SDS(x.shape, x.dtype)], backend="warp")


@needs_warp
@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                   "uint64", "float16", "float32", "float64"])
def test_dtype_mapping(dtype):
    assert xlakern.jaxtype_to_warptype(jnp.dtype(dtype)) is getattr(warp, dtype)
    info = xlakern.jaxinfo_to_warpinfo(SDS((3, 2), dtype))
    assert info.dtype is getattr(warp, dtype) and info.ndim == 2


def _bridge():
    return getattr(warp, "jax_kernel", None) or __import__("warp.jax_experimental", fromlist=["jax_kernel"]).jax_kernel


def scale_warp_generator(**kwargs):
    # The seed's generator, with Warp's current bridge name.
    warp_jax_kernel = _bridge()
    out_info = kwargs["outs"][0]
    n = out_info.shape[0]
    t = xlakern.jaxinfo_to_warpinfo(out_info)
    s_type = warp.array(dtype=xlakern.jaxinfo_to_warpinfo(out_info).dtype, ndim=1)

    @warp.kernel
    def kern(x: t, s: s_type, out: t):
        i = warp.tid()
        out[i] = x[i] * s[0]

    def kernel(x, s):
        fn = warp_jax_kernel(kern, launch_dims=[n], num_outputs=1, output_dims={"out": (n,)})
        return fn(x, s)

    return kernel


@needs_warp
@pytest.mark.usefixtures("on_cpu")
def test_seed_multi_backend_scale_with_warp_on_cpu(rng):
    scale_op = xlakern.XLACustomKernel(unique_name("tutorial_multi_backend_scale"))
    scale_op.def_kernel("jnp", "cpu", lambda **kw: lambda x, s: x * s[0])
    scale_op.def_warp_kernel(scale_warp_generator)
    assert {p: list(b.keys()) for p, b in scale_op._kernels.items()} == {"cpu": ["jnp", "warp"], "gpu": ["warp"]}
    n = 256
    x = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    s = jnp.array([rng.uniform(1, 4)], dtype=jnp.float32)
    want = np.asarray(x, np.float64) * float(s[0])
    r = scale_op(x, s, outs=[SDS((n,), jnp.float32)], backend="warp")[0]
    np.testing.assert_allclose(r, want, rtol=1e-6)
    f = jax.jit(lambda x, s: scale_op(x, s, outs=[SDS((n,), jnp.float32)])[0] + 1)
    xlakern.config.set_backend("cpu", "warp")
    try:
        np.testing.assert_allclose(f(x, s), want + 1, rtol=1e-6, atol=1e-6)
        assert scale_op.generator_calls[("cpu", "warp")] == 1
    finally:
        xlakern.config.set_backend("cpu", None)


@needs_warp
@pytest.mark.usefixtures("on_cpu")
def test_warp_vmap_loop_for_a_kernel_that_indexes_one_element(rng):
    # The seed kernel reads s[0] and launches n threads, so it must see one batch element per
    # launch; Warp's bridge defaults to vmap_method="broadcast_all" (the batch as larger
    # arrays), which this kernel does not handle. batching="loop" gives one launch per element.
    x = rng.standard_normal((5, 64)).astype(np.float32)
    s = rng.uniform(1, 3, (5, 1)).astype(np.float32)
    want = x.astype(np.float64) * s
    looped = xlakern.XLACustomKernel(unique_name("warp_vmap_loop"), batching="loop")
    looped.def_warp_kernel(scale_warp_generator, platform="cpu")
    f = jax.jit(jax.vmap(lambda x, s: looped(x, s, outs=[SDS(x.shape, x.dtype)])[0]))
    np.testing.assert_allclose(f(jnp.asarray(x), jnp.asarray(s)), want, rtol=1e-6)
    assert "while" in f.lower(jnp.asarray(x), jnp.asarray(s)).as_text()
    # batching="auto" hands Warp the batch: wrong for this kernel, which is why "loop" exists.
    auto = xlakern.XLACustomKernel(unique_name("warp_vmap_auto"))
    auto.def_warp_kernel(scale_warp_generator, platform="cpu")
    out = jax.vmap(lambda x, s: auto(x, s, outs=[SDS(x.shape, x.dtype)])[0])(jnp.asarray(x), jnp.asarray(s))
    np.testing.assert_allclose(out[0], want[0], rtol=1e-6)
    assert not np.allclose(out[1:], want[1:])


@needs_warp
@pytest.mark.gpu
def test_seed_multi_backend_scale_numba_on_cpu_and_warp_on_gpu(rng):
    # The seed's op: a Numba CPU backend and a Warp GPU backend; the arrays' platform picks one.
    import numba

    @numba.njit(parallel=True)
    def scale_numba(x, s, out):
        for i in numba.prange(out.size):
            out[i] = x[i] * s[0]

    def scale_numba_generator(**kwargs):
        out_info = kwargs["outs"][0]
        return lambda x, s: xlakern.numba_kernel(scale_numba, outs=out_info)(x, s)

    scale_op = xlakern.XLACustomKernel(unique_name("tutorial_multi_backend_scale_gpu"))
    scale_op.def_numba_kernel(scale_numba_generator)
    scale_op.def_warp_kernel(scale_warp_generator)
    n = 4096
    xh = rng.standard_normal(n).astype(np.float32)
    sh = np.array([rng.uniform(1, 4)], np.float32)
    want = xh.astype(np.float64) * np.float64(sh[0])
    f = jax.jit(lambda x, s: scale_op(x, s, outs=[SDS((n,), jnp.float32)])[0])
    for dev in (jax.devices("cpu")[0], jax.devices("gpu")[0]):
        x, s = jax.device_put(xh, dev), jax.device_put(sh, dev)
        y = f(x, s)
        assert y.devices() == {dev}
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
    assert scale_op.generator_calls[("cpu", "numba")] == 1 and scale_op.generator_calls[("gpu", "warp")] == 1
