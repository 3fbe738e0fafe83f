"""XLACustomKernel end to end: backends, selection through warm jit, grad, vmap, shard_map, errors.

CPU kernels are C++ modules (load_cpp_inline) and plain-jnp generators; the seeds' Numba
generators run where xlakern.numba_kernel exists; GPU tests (CUDA modules, Numba CUDA) need
the `gpu` marker's GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import unique_name, x64

SDS = jax.ShapeDtypeStruct

CPP = r"""
#include <cmath>

// @xk leaky arg ret attr.alpha:float32
void leaky(const xk::Tensor x, xk::Tensor out, float alpha) {
  const float* px = x.data<float>(); float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = px[i] > 0 ? px[i] : alpha * px[i];
}

// @xk exp_trace arg arg arg ret
void exp_trace(const xk::Tensor trace, const xk::Tensor spikes, const xk::Tensor tau_inv, xk::Tensor out) {
  const float decay = std::exp(-tau_inv.data<float>()[0]);
  const float* t = trace.data<float>(); const float* s = spikes.data<float>(); float* o = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = t[i] * decay + s[i];
}

// @xk csr_mv arg arg arg arg ret
void csr_mv(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor x,
            xk::Tensor out) {
  const float* d = data.data<float>(); const int32_t* ix = indices.data<int32_t>();
  const int32_t* ip = indptr.data<int32_t>(); const float* px = x.data<float>(); float* o = out.data<float>();
  for (int64_t r = 0; r + 1 < indptr.numel(); ++r) {
    float acc = 0;
    for (int32_t k = ip[r]; k < ip[r + 1]; ++k) acc += d[k] * px[ix[k]];
    o[r] = acc;
  }
}

// @xk scale arg arg ret
void scale(const xk::Tensor x, const xk::Tensor s, xk::Tensor out) {
  const float* px = x.data<float>(); float* po = out.data<float>(); const float f = s.data<float>()[0];
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = px[i] * f;
}
"""


@pytest.fixture(scope="module")
def cpp():
    return xlakern.load_cpp_inline("prim_test_kernels", CPP)


@pytest.fixture(autouse=True)
def _no_global_backend():
    yield
    xlakern.config.clear_backends()


def _leaky_ref(x, alpha):
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x, alpha * x)


def _scale_op(cpp, name, vmap_method=None):
    """x * s[0] with a C++ kernel, linear in x: JVP for both inputs, transpose for x."""
    from jax.interpreters import ad

    op = xlakern.XLACustomKernel(unique_name(name))
    op.def_cpp_kernel(lambda outs, **kw: lambda x, s: cpp.scale(x, s, outs=outs[0], vmap_method=vmap_method))
    op.def_jvp_rule2(lambda t, x, s, **kw: op(t, s, **kw), lambda t, x, s, **kw: [x * t[0]])

    def transpose(cts, x, s, **kw):
        assert ad.is_undefined_primal(x) and not ad.is_undefined_primal(s)
        return [op(cts[0], s, **kw)[0], None]

    op.def_transpose_rule(transpose)
    return op


# ---------------------------------------------------------------- the seeds' ops, on C++ kernels


@pytest.mark.usefixtures("on_cpu")
def test_leaky_relu_alpha_kwarg_and_generator_cache(cpp, rng):
    calls = []

    def gen(**kwargs):
        out_info = kwargs["outs"][0]
        alpha = float(kwargs.get("alpha", 0.01))
        calls.append(alpha)
        return lambda x: cpp.leaky(x, outs=out_info, alpha=alpha)

    op = xlakern.XLACustomKernel(unique_name("leaky"))
    op.def_cpp_kernel(gen)
    x = jnp.asarray(rng.standard_normal(1001).astype(np.float32))
    for alpha in (0.1, 0.3):
        f = jax.jit(lambda x: op(x, outs=[SDS(x.shape, x.dtype)], alpha=alpha)[0])
        np.testing.assert_allclose(f(x), _leaky_ref(x, alpha), rtol=1e-6)
        # A second, distinct jitted function with the same call lowers again but builds nothing.
        g = jax.jit(lambda x: 2 * op(x, outs=[SDS(x.shape, x.dtype)], alpha=alpha)[0])
        np.testing.assert_allclose(g(x), 2 * _leaky_ref(x, alpha), rtol=1e-6)
    assert calls == [0.1, 0.3]
    assert op.generator_calls == {("cpu", "cpp"): 2}
    # Keyword arguments are static: a traced one is refused with a way out.
    with pytest.raises(xlakern.CallError, match="static_argnames=\\['alpha'\\]"):
        jax.jit(lambda x, alpha: op(x, outs=[SDS(x.shape, x.dtype)], alpha=alpha))(x, 0.1)
    with pytest.raises(xlakern.CallError, match="hashable"):
        op(x, outs=[SDS(x.shape, x.dtype)], alpha=[0.1])


@pytest.mark.usefixtures("on_cpu")
def test_stdp_trace_100_steps(cpp, rng):
    def gen(**kwargs):
        out_info = kwargs["outs"][0]
        return lambda trace, spikes, tau_inv: cpp.exp_trace(trace, spikes, tau_inv, outs=out_info)

    trace_op = xlakern.XLACustomKernel(unique_name("exp_trace"))
    trace_op.def_cpp_kernel(gen)
    assert list(trace_op._kernels.keys()) == ["cpu"]
    n = 1000
    tau_inv = jnp.array([1.0 / rng.uniform(10, 30)], jnp.float32)
    spec = SDS((n,), jnp.float32)
    update = jax.jit(lambda t, s, tau: trace_op(t, s, tau, outs=[spec])[0])
    trace, ref = jnp.zeros(n, jnp.float32), np.zeros(n)
    decay = np.exp(-np.float64(tau_inv[0]))
    for _ in range(100):
        spikes = (rng.random(n) < 0.05).astype(np.float32)
        trace = update(trace, jnp.asarray(spikes), tau_inv)
        ref = ref * decay + spikes
    np.testing.assert_allclose(trace, ref, rtol=2e-5, atol=1e-5)
    assert ref.mean() > 0.1


@pytest.mark.usefixtures("on_cpu")
def test_csr_matvec_matches_dense(cpp, rng):
    import scipy.sparse as sp

    def gen(**kwargs):
        return lambda d, i, p, x: cpp.csr_mv(d, i, p, x, outs=kwargs["outs"][0])

    csr_op = xlakern.XLACustomKernel(unique_name("csr"))
    csr_op.def_cpp_kernel(gen)
    n_post, n_pre = 300, 500
    dense = (rng.random((n_post, n_pre)) < 0.05) * rng.uniform(0.01, 0.5, (n_post, n_pre))
    csr = sp.csr_matrix(dense.astype(np.float32))
    x = rng.random(n_pre).astype(np.float32)
    args = (jnp.asarray(csr.data), jnp.asarray(csr.indices, jnp.int32), jnp.asarray(csr.indptr, jnp.int32),
            jnp.asarray(x))
    out = jax.jit(lambda *a: csr_op(*a, outs=[SDS((n_post,), jnp.float32)])[0])(*args)
    np.testing.assert_allclose(out, csr.toarray().astype(np.float64) @ x, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("on_cpu")
def test_multi_backend_scale_and_kernels_table(cpp, rng):
    op = xlakern.XLACustomKernel(unique_name("scale"))
    op.def_cpp_kernel(lambda **kw: lambda x, s: cpp.scale(x, s, outs=kw["outs"][0]))
    op.def_kernel("jnp", "cpu", lambda outs, **kw: lambda x, s: [x * s[0]])
    op.def_cuda_kernel(lambda outs, **kw: None)  # never generated on a CPU run
    assert {p: list(b.keys()) for p, b in op._kernels.items()} == {"cpu": ["cpp", "jnp"], "gpu": ["cuda"]}
    text = repr(op._kernels)
    assert "KernelEntry(backend='cpp', platform='cpu', generator=" in text and "'gpu'" in text
    assert op.defaults == {"cpu": "cpp", "gpu": "cuda"}
    x = jnp.asarray(rng.standard_normal(257).astype(np.float32))
    s = jnp.asarray([rng.uniform(1, 4)], jnp.float32)
    for backend in (None, "cpp", "jnp"):
        r = op(x, s, outs=[SDS(x.shape, jnp.float32)], backend=backend)
        assert isinstance(r, list) and len(r) == 1
        np.testing.assert_allclose(r[0], np.asarray(x, np.float64) * float(s[0]), rtol=1e-6)
    assert op.generator_calls == {("cpu", "cpp"): 1, ("cpu", "jnp"): 1}


# ---------------------------------------------------------------- backend selection


@pytest.mark.usefixtures("on_cpu")
def test_backend_switch_reaches_warm_jit_without_clearing_caches(rng):
    op = xlakern.XLACustomKernel(unique_name("switch"))
    op.def_kernel("plus1", "cpu", lambda outs: lambda x: x + 1)
    op.def_kernel("plus2", "cpu", lambda outs: lambda x: x + 2)
    op.def_kernel("plus3", "cpu", lambda outs: lambda x: x + 3)
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return op(x, outs=[SDS(x.shape, x.dtype)])[0] * 10

    x = jnp.asarray(rng.standard_normal(16).astype(np.float32))
    xs = np.asarray(x, np.float64)
    np.testing.assert_allclose(f(x), (xs + 1) * 10, rtol=1e-6)
    xlakern.config.set_backend("cpu", "plus2")
    assert xlakern.config.get_backend("cpu") == "plus2"
    np.testing.assert_allclose(f(x), (xs + 2) * 10, rtol=1e-6)
    op.set_default("cpu", "plus3")  # the process-wide choice still wins over the op's default
    np.testing.assert_allclose(f(x), (xs + 2) * 10, rtol=1e-6)
    xlakern.config.set_backend("cpu", None)
    np.testing.assert_allclose(f(x), (xs + 3) * 10, rtol=1e-6)
    # The per-call backend wins over everything.
    g = jax.jit(lambda x: op(x, outs=[SDS(x.shape, x.dtype)], backend="plus1")[0])
    xlakern.config.set_backend("cpu", "plus2")
    np.testing.assert_allclose(g(x), xs + 1, rtol=1e-6)
    # A process-wide backend the op does not have is ignored for it (it serves other ops).
    xlakern.config.set_backend("cpu", "numba")
    np.testing.assert_allclose(f(x), (xs + 3) * 10, rtol=1e-6)
    n = len(traces)
    xlakern.config.set_backend("cpu", "plus2")  # seen before: jit's cache still holds it
    np.testing.assert_allclose(f(x), (xs + 2) * 10, rtol=1e-6)
    assert len(traces) == n


@pytest.mark.usefixtures("on_cpu")
def test_selection_errors_list_what_is_registered(rng):
    op = xlakern.XLACustomKernel(unique_name("errs"))
    op.def_kernel("a", "cpu", lambda outs: lambda x: x)
    op.def_kernel("b", "cpu", lambda outs: lambda x: x)
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(xlakern.BackendError, match=r"unknown backend 'zzz'.*cpu: \[a \(default\), b\]"):
        op(x, outs=[SDS(x.shape, x.dtype)], backend="zzz")
    with pytest.raises(xlakern.BackendError, match="no 'zzz' kernel"):
        op.set_default("cpu", "zzz")
    gpu_only = xlakern.XLACustomKernel(unique_name("gpu_only"))
    gpu_only.def_cuda_kernel(lambda outs: lambda x: x)
    with pytest.raises(xlakern.BackendError, match=r"no kernel for platform 'cpu'.*gpu: \[cuda"):
        jax.jit(lambda x: gpu_only(x, outs=[SDS(x.shape, x.dtype)]))(x)
    with pytest.raises(xlakern.config.PlatformError):
        op.def_kernel("c", "fpga", lambda outs: None)


@pytest.mark.usefixtures("on_cpu")
def test_backend_alias_selects_its_backend_everywhere_a_name_is_taken(rng):
    op = xlakern.XLACustomKernel(unique_name("alias"))
    op.def_kernel("plus1", "cpu", lambda outs: lambda x: x + 1)
    op.def_kernel("plus2", "cpu", lambda outs: lambda x: x + 2)
    op.def_backend_alias("other_name", "plus2")
    x = jnp.asarray(rng.standard_normal(8).astype(np.float32))
    xs = np.asarray(x, np.float64)
    run = lambda **kw: np.asarray(jax.jit(lambda x: op(x, outs=[SDS(x.shape, x.dtype)], **kw)[0])(x))
    np.testing.assert_allclose(run(), xs + 1, rtol=1e-6)
    np.testing.assert_allclose(run(backend="other_name"), xs + 2, rtol=1e-6)
    op.set_default("cpu", "other_name")
    assert op.get_default("cpu") == "plus2"
    np.testing.assert_allclose(run(), xs + 2, rtol=1e-6)
    assert "aliases: other_name -> plus2" in repr(op)
    with pytest.raises(xlakern.XlakernError, match="'plus1' is a registered backend"):
        op.def_backend_alias("plus1", "plus2")
    with pytest.raises(xlakern.XlakernError, match="non-empty strings"):
        op.def_backend_alias("", "plus2")
    op.def_backend_alias("dangling", "missing")  # names a backend the op does not have: refused when called
    with pytest.raises(xlakern.BackendError, match="unknown backend 'missing'"):
        run(backend="dangling")


@pytest.mark.usefixtures("on_cpu")
def test_generator_and_tracing_errors_name_op_backend_and_alternatives():
    op = xlakern.XLACustomKernel(unique_name("broken"))

    def bad_generator(outs, **kw):
        raise ZeroDivisionError("boom in generator")

    op.def_kernel("bad", "cpu", bad_generator)
    op.def_kernel("trace_bad", "cpu", lambda outs: lambda x: x.reshape(3, 7))
    op.def_kernel("wrong_count", "cpu", lambda outs: lambda x: [x, x])
    op.def_kernel("good", "cpu", lambda outs: lambda x: x * 2)
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(xlakern.KernelGenerationError) as e:
        op(x, outs=[SDS(x.shape, x.dtype)])
    msg = str(e.value)
    assert op.name in msg and "'bad'" in msg and "boom in generator" in msg and "good" in msg
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    with pytest.raises(xlakern.KernelGenerationError, match="tracing the 'trace_bad' kernel") as e:
        op(x, outs=[SDS(x.shape, x.dtype)], backend="trace_bad")
    assert e.value.__cause__ is not None and "bad" in str(e.value)
    with pytest.raises(xlakern.KernelGenerationError, match="returned 2 array"):
        op(x, outs=[SDS(x.shape, x.dtype)], backend="wrong_count")
    np.testing.assert_allclose(op(x, outs=[SDS(x.shape, x.dtype)], backend="good")[0], 2 * np.ones(4))
    with pytest.raises(xlakern.XlakernError, match="no JVP rule"):
        jax.grad(lambda x: op(x, outs=[SDS(x.shape, x.dtype)], backend="good")[0].sum())(x)


# ---------------------------------------------------------------- grad


@pytest.mark.usefixtures("on_cpu")
def test_grad_through_cpp_op_matches_jnp_reference(cpp, rng):
    op = _scale_op(cpp, "scale_grad")
    x = jnp.asarray(rng.standard_normal(64).astype(np.float32))
    s = jnp.asarray([rng.uniform(0.5, 2)], jnp.float32)
    w = jnp.asarray(rng.standard_normal(64).astype(np.float32))

    def loss(x, s):
        y = op(x, s, outs=[SDS(x.shape, x.dtype)])[0]
        return jnp.sum(jnp.sin(y) * w)

    def ref(x, s):
        return jnp.sum(jnp.sin(x * s[0]) * w)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, s)
    want = jax.grad(ref, argnums=(0, 1))(x, s)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    # the scale's gradient and the tangent are sums of 64 signed float32 terms: atol covers a sum near 0
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
    # forward mode, too
    _, tangent = jax.jvp(loss, (x, s), (w, jnp.ones(1, jnp.float32)))
    _, tangent_ref = jax.jvp(ref, (x, s), (w, jnp.ones(1, jnp.float32)))
    np.testing.assert_allclose(tangent, tangent_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("on_cpu")
def test_grad_matches_finite_differences_float64(rng):
    from jax.test_util import check_grads

    with x64():
        op = xlakern.XLACustomKernel(unique_name("poly"))
        # Two outputs: (x * y, x + y^2); a jnp kernel so float64 runs end to end.
        op.def_kernel("jnp", "cpu", lambda outs: lambda x, y: (x * y, x + y * y))
        op.def_jvp_rule2(lambda t, x, y, **kw: [t * y, t], lambda t, x, y, **kw: [x * t, 2 * y * t])
        x = jnp.asarray(rng.standard_normal(7))
        y = jnp.asarray(rng.standard_normal(7))

        def f(x, y):
            a, b = op(x, y, outs=[SDS(x.shape, x.dtype)] * 2)
            return jnp.sum(jnp.tanh(a) * b)

        check_grads(f, (x, y), order=1, modes=["fwd", "rev"])


# ---------------------------------------------------------------- vmap


def _hlo(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text()


@pytest.mark.usefixtures("on_cpu")
def test_vmap_is_one_launch_when_the_ffi_call_batches(cpp, rng):
    op = xlakern.XLACustomKernel(unique_name("leaky_bc"))
    op.def_cpp_kernel(lambda outs, alpha: lambda x: cpp.leaky(x, outs=outs[0], alpha=alpha,
                                                             vmap_method="broadcast_all"))
    xs = jnp.asarray(rng.standard_normal((5, 3, 33)).astype(np.float32))
    one = lambda x: op(x, outs=[SDS(x.shape, x.dtype)], alpha=0.2)[0]
    nested = jax.vmap(jax.vmap(one))
    np.testing.assert_allclose(nested(xs), _leaky_ref(xs, 0.2), rtol=1e-6)
    text = _hlo(nested, xs)
    assert text.count("custom_call") == 1 and "while" not in text
    # in_axes other than 0
    np.testing.assert_allclose(jax.vmap(one, in_axes=2, out_axes=1)(xs), _leaky_ref(xs, 0.2).transpose(0, 2, 1),
                               rtol=1e-6)


@pytest.mark.usefixtures("on_cpu")
def test_vmap_loops_when_the_ffi_call_cannot_batch_nested_and_unbatched_args(cpp, rng):
    op = _scale_op(cpp, "scale_loop")  # cpp.scale has no vmap_method
    x = rng.standard_normal((4, 3, 17)).astype(np.float32)
    s = rng.uniform(0.5, 2, (3, 1)).astype(np.float32)
    one = lambda x, s: op(x, s, outs=[SDS(x.shape, x.dtype)])[0]
    # outer over x's axis 0 only (s unbatched), inner over both x and s.
    f = jax.vmap(jax.vmap(one, in_axes=(0, 0)), in_axes=(0, None))
    want = np.stack([np.stack([x[i, j] * np.float64(s[j, 0]) for j in range(3)]) for i in range(4)])
    np.testing.assert_allclose(f(jnp.asarray(x), jnp.asarray(s)), want, rtol=1e-6)
    assert "while" in _hlo(f, jnp.asarray(x), jnp.asarray(s))
    # s batched, x not
    g = jax.vmap(one, in_axes=(None, 0))
    np.testing.assert_allclose(g(jnp.asarray(x[0, 0]), jnp.asarray(s)),
                               np.stack([x[0, 0] * np.float64(s[j, 0]) for j in range(3)]), rtol=1e-6)


@pytest.mark.usefixtures("on_cpu")
def test_grad_of_vmap_and_vmap_of_grad(cpp, rng):
    op = _scale_op(cpp, "scale_vg")
    x = jnp.asarray(rng.standard_normal((6, 20)).astype(np.float32))
    s = jnp.asarray(rng.uniform(0.5, 2, (6, 1)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal(20).astype(np.float32))

    def loss(x, s):
        return jnp.sum(jnp.cos(op(x, s, outs=[SDS(x.shape, x.dtype)])[0]) * w)

    def ref(x, s):
        return jnp.sum(jnp.cos(x * s[0]) * w)

    got = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(x, s)
    want = jax.vmap(jax.grad(ref, argnums=(0, 1)))(x, s)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    # grad of a vmapped loss, one s shared by the batch (in_axes=None: its cotangent is summed)
    total = lambda x, s: jnp.sum(jax.vmap(loss, in_axes=(0, None))(x, s) ** 2)
    total_ref = lambda x, s: jnp.sum(jax.vmap(ref, in_axes=(0, None))(x, s) ** 2)
    got = jax.jit(jax.grad(total, argnums=(0, 1)))(x, s[0])
    want = jax.grad(total_ref, argnums=(0, 1))(x, s[0])
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("on_cpu")
def test_user_batching_rule_is_used(rng):
    op = xlakern.XLACustomKernel(unique_name("user_batch"))
    op.def_kernel("jnp", "cpu", lambda outs: lambda x: x * 2)
    seen = []

    def rule(args, axes, **kw):
        seen.append((axes, kw["outs"]))
        x = jnp.moveaxis(args[0], axes[0], 0)
        return op(x, outs=[SDS(x.shape, x.dtype)], backend=kw["backend"]), [0]

    op.def_batching_rule(rule)
    x = jnp.asarray(rng.standard_normal((3, 5)).astype(np.float32))
    out = jax.vmap(lambda x: op(x, outs=[SDS(x.shape, x.dtype)])[0], in_axes=1)(x)
    np.testing.assert_allclose(out, 2 * np.asarray(x).T, rtol=1e-6)
    assert seen and seen[0][0] == [1] and seen[0][1] == [SDS((3,), jnp.float32)]


# ---------------------------------------------------------------- shard_map


SHARD_MAP_SCRIPT = textwrap.dedent(r"""
    import jax, jax.numpy as jnp, numpy as np
    import xlakern
    from jax.sharding import PartitionSpec as P
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    assert len(jax.devices()) == 4, jax.devices()
    mod = xlakern.load_cpp_inline("prim_test_kernels", CPP)
    op = xlakern.XLACustomKernel("sharded_leaky")
    op.def_cpp_kernel(lambda outs, alpha: lambda x: mod.leaky(x, outs=outs[0], alpha=alpha))
    op.def_kernel("jnp", "cpu", lambda outs, alpha: lambda x: jnp.where(x > 0, x, alpha * x))
    mesh = jax.make_mesh((4,), ("d",))
    def local(x):
        return op(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], alpha=0.3)[0]
    x = np.random.default_rng(SEED).standard_normal((8, 40)).astype(np.float32)
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("d")))
    f = jax.jit(shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    y = f(xs)
    assert len(y.sharding.device_set) == 4
    np.testing.assert_allclose(y, np.where(x > 0, x, 0.3 * x.astype(np.float64)), rtol=1e-6)
    xlakern.config.set_backend("cpu", "jnp")
    np.testing.assert_allclose(f(xs), np.where(x > 0, x, 0.3 * x.astype(np.float64)), rtol=1e-6)
    print("SHARD_MAP_OK")
""")


def test_primitive_inside_shard_map_over_4_cpu_devices(rng, tmp_path):
    script = tmp_path / "shard.py"
    script.write_text(f"CPP = {CPP!r}\nSEED = {int(rng.integers(2**31))}\n" + SHARD_MAP_SCRIPT)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "SHARD_MAP_OK" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------- the seeds verbatim (Numba)


@pytest.mark.usefixtures("on_cpu")
def test_seed_numba_exp_trace_and_csr(rng):
    import numba
    import scipy.sparse as sp
    numba_kernel = xlakern.numba_kernel

    def exp_trace_numba_generator(**kwargs):
        out_info = kwargs["outs"][0]
        n = out_info.shape[0]

        @numba.njit(parallel=True)
        def trace_kern(trace, spikes, tau_inv, out):
            import math
            decay = math.exp(-tau_inv[0])
            for i in numba.prange(n):
                out[i] = trace[i] * decay + spikes[i]

        def kernel(trace, spikes, tau_inv):
            result = numba_kernel(trace_kern, outs=out_info)(trace, spikes, tau_inv)
            return result if not isinstance(result, tuple) else result

        return kernel

    trace_op = xlakern.XLACustomKernel(unique_name("tutorial_numba_exp_trace"))
    trace_op.def_numba_kernel(exp_trace_numba_generator)
    assert list(trace_op._kernels.keys()) == ["cpu"]
    n = 1000
    tau_inv = jnp.array([1.0 / 20.0], dtype=jnp.float32)
    out_spec = SDS((n,), jnp.float32)
    update = jax.jit(lambda t, s, tau: trace_op(t, s, tau, outs=[out_spec])[0])
    trace, ref = jnp.zeros(n, jnp.float32), np.zeros(n)
    for _ in range(100):
        spikes = (rng.random(n) < 0.05).astype(np.float32)
        trace = update(trace, jnp.asarray(spikes), tau_inv)
        ref = ref * np.exp(-np.float64(np.float32(0.05))) + spikes
    np.testing.assert_allclose(trace, ref, rtol=2e-5, atol=1e-5)

    @numba.njit(parallel=True)
    def csr_matvec_numba(data, indices, indptr, x, out):
        n_rows = indptr.size - 1
        for i in numba.prange(n_rows):
            total = out.dtype.type(0)
            for k in range(indptr[i], indptr[i + 1]):
                total += data[k] * x[indices[k]]
            out[i] = total

    def csr_mv_numba_generator(**kwargs):
        out_info = kwargs["outs"][0]

        def kernel(data, indices, indptr, x):
            result = numba_kernel(csr_matvec_numba, outs=out_info)(data, indices, indptr, x)
            return result if not isinstance(result, tuple) else result

        return kernel

    csr_mv_op = xlakern.XLACustomKernel(unique_name("tutorial_numba_csr_matvec"))
    csr_mv_op.def_numba_kernel(csr_mv_numba_generator)
    dense = ((rng.random((200, 400)) < 0.05) * rng.uniform(0.01, 0.5, (200, 400))).astype(np.float32)
    csr = sp.csr_matrix(dense)
    x = rng.random(400).astype(np.float32)
    result = csr_mv_op(jnp.array(csr.data), jnp.array(csr.indices, jnp.int32), jnp.array(csr.indptr, jnp.int32),
                       jnp.array(x), outs=[SDS((200,), jnp.float32)])[0]
    np.testing.assert_allclose(result, dense.astype(np.float64) @ x, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("on_cpu")
def test_seed_numba_scale_with_vmap_and_grad(rng):
    import numba

    @numba.njit
    def scale_numba(x, s, out):
        for i in range(out.size):
            out[i] = x[i] * s[0]

    op = xlakern.XLACustomKernel(unique_name("tutorial_multi_backend_scale"))
    op.def_numba_kernel(lambda **kw: lambda x, s: xlakern.numba_kernel(scale_numba, outs=kw["outs"][0])(x, s))
    op.def_jvp_rule2(lambda t, x, s, **kw: op(t, s, **kw), None)
    op.def_transpose_rule(lambda cts, x, s, **kw: [op(cts[0], s, **kw)[0], None])
    x = jnp.asarray(rng.standard_normal((4, 9)).astype(np.float32))
    s = jnp.asarray([[rng.uniform(1, 3)]] * 4, jnp.float32)
    f = lambda x, s: op(x, s, outs=[SDS(x.shape, x.dtype)])[0]
    np.testing.assert_allclose(jax.vmap(f)(x, s), np.asarray(x, np.float64) * np.asarray(s), rtol=1e-6)
    g = jax.grad(lambda x: jnp.sum(f(x, s[0]) ** 2))(x[0])
    np.testing.assert_allclose(g, 2 * np.asarray(x[0], np.float64) * float(s[0, 0]) ** 2, rtol=1e-5)


# ---------------------------------------------------------------- GPU


CUDA = r"""
// @xk scale arg arg ret stream
__global__ void scale_k(const float* x, const float* s, float* o, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) o[i] = x[i] * s[0];
}
void scale(const xk::Tensor x, const xk::Tensor s, xk::Tensor out, int64_t stream) {
  int64_t n = x.numel();
  scale_k<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(x.data<float>(), s.data<float>(),
                                                             out.data<float>(), n);
}
// @xk leaky arg ret attr.alpha:float32 stream
__global__ void leaky_k(const float* x, float* o, int64_t n, float alpha) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) o[i] = x[i] > 0 ? x[i] : alpha * x[i];
}
void leaky(const xk::Tensor x, xk::Tensor out, float alpha, int64_t stream) {
  int64_t n = x.numel();
  leaky_k<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(x.data<float>(), out.data<float>(), n, alpha);
}
"""


@pytest.fixture(scope="module")
def cuda_mod():
    return xlakern.load_cuda_inline("prim_test_cuda", CUDA)


def _gpu(x):
    return jax.device_put(x, jax.devices("gpu")[0])


@pytest.mark.gpu
def test_gpu_and_cpu_backends_dispatch_by_platform_with_grad_and_vmap(cpp, cuda_mod, rng):
    op = xlakern.XLACustomKernel(unique_name("scale_both"))
    op.def_cpp_kernel(lambda outs: lambda x, s: cpp.scale(x, s, outs=outs[0]))
    op.def_cuda_kernel(lambda outs: lambda x, s: cuda_mod.scale(x, s, outs=outs[0]))
    op.def_kernel("jnp", "gpu", lambda outs: lambda x, s: x * s[0] + 1)  # distinguishable on purpose
    op.def_jvp_rule2(lambda t, x, s, **kw: op(t, s, **kw), lambda t, x, s, **kw: [x * t[0]])
    op.def_transpose_rule(lambda cts, x, s, **kw: [op(cts[0], s, **kw)[0], None])
    xn = rng.standard_normal((8, 1000)).astype(np.float32)
    sn = rng.uniform(0.5, 2, (8, 1)).astype(np.float32)
    want = xn.astype(np.float64) * sn
    f = jax.jit(jax.vmap(lambda x, s: op(x, s, outs=[SDS(x.shape, x.dtype)])[0]))
    np.testing.assert_allclose(f(_gpu(xn), _gpu(sn)), want, rtol=1e-6)
    cpu = jax.devices("cpu")[0]
    np.testing.assert_allclose(f(jax.device_put(xn, cpu), jax.device_put(sn, cpu)), want, rtol=1e-6)
    xlakern.config.set_backend("gpu", "jnp")
    np.testing.assert_allclose(f(_gpu(xn), _gpu(sn)), want + 1, rtol=1e-6, atol=1e-6)
    xlakern.config.set_backend("gpu", None)
    loss = lambda x, s: jnp.sum(jnp.sin(op(x, s, outs=[SDS(x.shape, x.dtype)])[0]))
    g = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(_gpu(xn), _gpu(sn))
    r = jax.vmap(jax.grad(lambda x, s: jnp.sum(jnp.sin(x * s[0])), argnums=(0, 1)))(xn, sn)
    np.testing.assert_allclose(g[0], r[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g[1], r[1], rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_gpu_vmap_one_launch(cuda_mod, rng):
    op = xlakern.XLACustomKernel(unique_name("leaky_gpu"))
    op.def_cuda_kernel(lambda outs, alpha: lambda x: cuda_mod.leaky(x, outs=outs[0], alpha=alpha,
                                                                   vmap_method="broadcast_all"))
    x = _gpu(rng.standard_normal((64, 4096)).astype(np.float32))
    f = jax.vmap(lambda x: op(x, outs=[SDS(x.shape, x.dtype)], alpha=0.05)[0])
    np.testing.assert_allclose(jax.jit(f)(x), _leaky_ref(x, 0.05), rtol=1e-6)
    text = _hlo(f, x)
    assert text.count("custom_call") == 1 and "while" not in text


@pytest.mark.gpu
def test_seed_numba_cuda_leaky_relu(rng):
    from numba import cuda
    numba_cuda_kernel = xlakern.numba_cuda_kernel

    def leaky_relu_numba_cuda_generator(**kwargs):
        out_info = kwargs["outs"][0]
        n = out_info.shape[0]
        alpha = float(kwargs.get("alpha", 0.01))

        @cuda.jit
        def leaky_relu_kern(x, out):
            i = cuda.grid(1)
            if i < out.size:
                v = x[i]
                out[i] = v if v > 0.0 else alpha * v

        def kernel(x):
            return numba_cuda_kernel(leaky_relu_kern, outs=out_info, launch_dims=n)(x)

        return kernel

    leaky_relu_op = xlakern.XLACustomKernel(unique_name("tutorial_numba_cuda_leaky_relu"))
    leaky_relu_op.def_numba_cuda_kernel(leaky_relu_numba_cuda_generator)
    assert "numba_cuda" in repr(leaky_relu_op._kernels)
    x = _gpu(rng.standard_normal(256).astype(np.float32))
    # alpha is static here; the seed's jax.jit(..., alpha=0.1) traces it (see the CallError test).
    f = jax.jit(lambda x: leaky_relu_op(x, outs=[SDS(x.shape, x.dtype)], alpha=0.1)[0])
    np.testing.assert_allclose(f(x), _leaky_ref(x, 0.1), rtol=1e-6)
