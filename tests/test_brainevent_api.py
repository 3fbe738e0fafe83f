"""BrainEvent 0.3's public names on xlakern: each resolves, or says why it is not provided; the error
classes under BrainEvent's names; the primitive registry and tags; defjvp / general_batching_rule on
plain primitives; normalize_tokens; register_ffi_target."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import unique_name

NAMES_FILE = Path(__file__).parent / "data" / "brainevent_0_3_0_all.txt"
F32 = dict(rtol=1e-5, atol=1e-6)  # jax computes these in float32; sums may cancel


def brainevent_names() -> list[str]:
    return [line.strip() for line in NAMES_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_every_brainevent_0_3_name_resolves_or_says_why_not():
    names = brainevent_names()
    assert len(names) == len(set(names)) > 150
    not_provided = xlakern._not_provided.REASONS
    assert set(not_provided) <= set(names), "a reason for a name BrainEvent 0.3 does not have"
    for name in names:
        if name in not_provided:
            with pytest.raises(xlakern.NotProvidedError, match=rf"xlakern\.{name} is not provided: it is "):
                getattr(xlakern, name)
            assert not hasattr(xlakern, name)
        else:
            assert getattr(xlakern, name) is not None, name
            assert name in dir(xlakern), f"{name} resolves but dir(xlakern) does not list it"


@pytest.mark.parametrize("name, replacement", [
    ("COO", "xlakern.CSR"), ("binary_coomv", "coo2csr"), ("update_coo_on_binary_post_p", "xlakern.CSC"),
    ("bitpack_binary_fcnmv", "BitPackedBinary"), ("compact_binary_fcnmm_p", "binary_fcnmm"),
    ("EllLayout", "FixedNumPerPre"), ("CscLayout", "FixedNumPerPost"),
])
def test_names_brainevent_retired_in_0_1_say_what_replaced_them(name, replacement):
    """BrainEvent 0.3 answers these with an AttributeError naming the migration; so does xlakern, naming
    its own replacement, and hasattr stays False (the names are in neither library's __all__)."""
    assert name in xlakern._not_provided.RETIRED and name not in brainevent_names()
    with pytest.raises(xlakern.NotProvidedError, match=rf"xlakern\.{name} is not provided: .*{replacement}"):
        getattr(xlakern, name)
    assert not hasattr(xlakern, name)
    assert name not in dir(xlakern)


def test_brainevent_backend_names_select_xlakerns_kernels(rng, on_cpu):
    """backend='jax_raw' / 'numba' (BrainEvent 0.3's names) run xlakern's jnp / C++ kernels of every
    event operator, and the product is the same."""
    import xlakern.event

    ops = xlakern.get_primitives_by_tags("event")
    assert len(ops) > 30
    for op in ops.values():
        for alias, backend in xlakern.event.BRAINEVENT_BACKENDS.items():
            assert f"{alias} -> {backend}" in repr(op), op.name
    n_rows, n_cols = 7, int(rng.integers(50, 5000))  # a fresh shape: each backend generates its kernel anew
    dense = np.where(rng.random((n_rows, n_cols)) < 0.3, rng.standard_normal((n_rows, n_cols)), 0.0).astype(np.float32)
    W = xlakern.CSR.fromdense(jnp.asarray(dense))
    s = rng.random(n_rows) < 0.5
    op = xlakern.binary_csrmv_p
    for alias, backend in (("jax_raw", "jnp"), ("numba", "cpp")):
        before = op.generator_calls.get(("cpu", backend), 0)
        out = xlakern.binary_csrmv(W.data, W.indices, W.indptr, s, shape=(n_rows, n_cols), transpose=True,
                                   backend=alias)
        assert op.generator_calls.get(("cpu", backend), 0) == before + 1, alias
        np.testing.assert_allclose(out, s.astype(np.float64) @ dense, rtol=1e-5, atol=1e-5)
    # BrainEvent's cuBLAS dense products are XLA's matrix product: the jnp kernel
    op = xlakern.binary_densemv_p
    before = op.generator_calls.get(("cpu", "jnp"), 0)
    out = xlakern.binary_densemv(jnp.asarray(dense), s, transpose=True, backend="cublas")
    assert op.generator_calls.get(("cpu", "jnp"), 0) == before + 1
    np.testing.assert_allclose(out, s.astype(np.float64) @ dense, rtol=1e-5, atol=1e-5)


def test_names_file_is_brainevent_0_3_0s_all():
    brainevent = pytest.importorskip("brainevent")
    if brainevent.__version__ != "0.3.0":
        pytest.skip(f"brainevent {brainevent.__version__} installed, not 0.3.0")
    assert brainevent_names() == list(brainevent.__all__)


MEMBERS_FILE = Path(__file__).parent / "data" / "brainevent_0_3_0_members.json"
# members BrainEvent 0.3 has that xlakern deliberately leaves out (they raise NotProvidedError): none now
MEMBERS_NOT_PROVIDED: dict[str, set[str]] = {}


def _instances():
    """One small instance of each class, as BrainEvent code builds them."""
    d = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 4.0]], np.float32)
    idx = jnp.array([[0], [2], [1]], jnp.int32)
    spikes = jnp.array([True, False, True])
    made = {"CSR": xlakern.CSR.fromdense(d), "CSC": xlakern.CSC.fromdense(d), "Dense": xlakern.Dense(d),
            "FixedNumPerPre": xlakern.FixedNumPerPre((jnp.ones((3, 1)), idx), shape=(3, 3)),
            "FixedNumPerPost": xlakern.FixedNumPerPost((jnp.ones((3, 1)), idx), shape=(3, 3)),
            "BinaryArray": xlakern.BinaryArray(spikes), "BitPackedBinary": xlakern.BitPackedBinary(spikes),
            "CompactBinary": xlakern.CompactBinary.from_array(spikes), "WeightedArray": xlakern.WeightedArray(d[0])}
    for family, params in (("Scalar", (0.5,)), ("Uniform", (0.1, 0.4)), ("Normal", (0.0, 0.2))):
        for side in "RC":
            made[f"JITC{family}{side}"] = getattr(xlakern, f"JITC{family}{side}")(params + (0.3, 7), shape=(3, 3))
    return made


def test_every_brainevent_0_3_layout_and_event_member_resolves():
    members = json.loads(MEMBERS_FILE.read_text())
    assert len(members) == 15 and sum(map(len, members.values())) > 350
    for cls_name, obj in _instances().items():
        for name in members[cls_name]:
            if name in MEMBERS_NOT_PROVIDED.get(cls_name, ()):
                with pytest.raises(xlakern.NotProvidedError, match="not provided"):
                    getattr(obj, name)
                assert not hasattr(obj, name)
            else:
                assert hasattr(obj, name), f"{cls_name}.{name}"


def test_members_file_is_brainevent_0_3_0s():
    brainevent = pytest.importorskip("brainevent")
    if brainevent.__version__ != "0.3.0":
        pytest.skip(f"brainevent {brainevent.__version__} installed, not 0.3.0")
    members = json.loads(MEMBERS_FILE.read_text())
    for cls_name, names in members.items():
        assert names == sorted(m for m in dir(getattr(brainevent, cls_name)) if not m.startswith("_")), cls_name


def test_an_unknown_name_is_still_a_plain_attribute_error():
    with pytest.raises(AttributeError) as err:
        xlakern.no_such_operator
    assert not isinstance(err.value, xlakern.NotProvidedError)


# ----------------------------------------------------------------------------- errors

def test_brainevent_error_names_are_xlakerns_classes():
    assert xlakern.BrainEventError is xlakern.XlakernError
    assert xlakern.KernelCompilationError is xlakern.CompilationError
    assert xlakern.KernelToolchainError is xlakern.ToolchainError
    assert xlakern.KernelRegistrationError is xlakern.RegistrationError
    assert xlakern.KernelNotAvailableError is xlakern.BackendError
    kernel_errors = [xlakern.CompilationError, xlakern.HostCompilerIncompatibleError, xlakern.ToolchainError,
                     xlakern.NvccNotFoundError, xlakern.HostCompilerNotFoundError, xlakern.HeaderNotFoundError,
                     xlakern.GpuArchDetectionError, xlakern.UnsupportedArchError, xlakern.CUDANotInstalledError,
                     xlakern.RegistrationError, xlakern.KernelLoadError, xlakern.KernelExecutionError,
                     xlakern.BackendError, xlakern.KernelFallbackExhaustedError]
    for cls in kernel_errors:
        assert issubclass(cls, xlakern.KernelError) and issubclass(cls, xlakern.BrainEventError), cls
    for cls in (xlakern.MathError, xlakern.UnsupportedOperationError, xlakern.BenchmarkDataFnNotProvidedError,
                xlakern.SpecError, xlakern.CallError):
        assert issubclass(cls, xlakern.BrainEventError) and not issubclass(cls, xlakern.KernelError), cls


def test_a_missing_nvcc_is_caught_by_brainevents_names(monkeypatch):
    monkeypatch.setenv("XLAKERN_NVCC", "/nonexistent/nvcc")
    with pytest.raises(xlakern.KernelToolchainError) as err:
        xlakern.load_cuda_inline(unique_name("be_nonvcc"), "void f(xk::Tensor o, int64_t stream) {}", ["f"],
                                 compute_capability="9.0")
    assert isinstance(err.value, xlakern.NvccNotFoundError)
    assert isinstance(err.value, xlakern.KernelError)


def test_a_compile_error_is_a_kernel_compilation_error():
    with pytest.raises(xlakern.KernelCompilationError, match="error"):
        xlakern.load_cpp_inline(unique_name("be_badsrc"), "// @xk f ret\nvoid f(xk::Tensor o) { nope(); }\n")


def test_a_failing_kernel_is_a_kernel_execution_error(on_cpu):
    src = ('// @xk must_be_positive arg ret\n'
           'void must_be_positive(const xk::Tensor x, xk::Tensor o) {\n'
           '  XK_CHECK(x.data<float>()[0] > 0) << "first element must be positive";\n'
           '  o.data<float>()[0] = x.data<float>()[0]; }\n')
    mod = xlakern.load_cpp_inline(unique_name("be_exec"), src)
    x = jnp.asarray([-1.0], jnp.float32)
    with pytest.raises(xlakern.KernelError, match="first element must be positive") as err:
        jax.block_until_ready(mod.must_be_positive(x, outs=jax.ShapeDtypeStruct((1,), jnp.float32)))
    assert isinstance(err.value, xlakern.KernelExecutionError)


# ----------------------------------------------------------------------------- registry

def test_registry_lists_event_primitives_by_tag():
    assert xlakern.binary_csrmv_p is xlakern.get_registry()["binary_csrmv"]
    names = xlakern.get_all_primitive_names()
    assert names == sorted(names) and {"binary_csrmv", "jitsmv", "plasticity_update"} <= set(names)
    csr_binary = xlakern.get_primitives_by_tags({"csr", "binary"})
    assert set(csr_binary) == {"binary_csrmv", "binary_csrmm", "binary_csrmv_indexed", "binary_csrmm_indexed"}
    assert set(xlakern.get_primitives_by_tags({"csr", "dt2t"})) == {"csrmv_dt2t", "csrmm_dt2t"}
    assert set(xlakern.get_primitives_by_tags({"jitc", "scalar", "mv"})) == {"jitsmv", "binary_jitsmv"}
    assert set(xlakern.get_primitives_by_tags("plasticity")) == {"plasticity_update"}


def test_a_new_kernel_is_registered_with_its_tags():
    name = unique_name("be_registry")
    op = xlakern.XLACustomKernel(name)
    assert xlakern.get_registry()[name] is op and op.tags == frozenset()
    op.def_tags("mine", "demo")
    assert xlakern.get_primitives_by_tags({"mine", "demo"}) == {name: op}
    assert xlakern.get_primitives_by_tags({"mine", "absent"}) == {}
    with pytest.raises(xlakern.XlakernError, match="tags must be non-empty strings"):
        op.def_tags("ok", "")
    copy = xlakern.get_registry()
    copy.clear()
    assert name in xlakern.get_registry()


# ----------------------------------------------------------------------------- rules on plain primitives

def _plain_primitive(name, multiple=False):
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive(unique_name(name))
    prim.multiple_results = multiple
    if multiple:
        impl = lambda x, y: [x * y, jnp.sin(x)]  # noqa: E731
        prim.def_abstract_eval(lambda x, y: [x, x])
    else:
        impl = lambda x, y: x * y  # noqa: E731
        prim.def_abstract_eval(lambda x, y: x)
    prim.def_impl(impl)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=multiple))
    return prim


def test_defjvp_on_a_plain_primitive_matches_the_analytic_derivative(rng):
    prim = _plain_primitive("be_mul")
    xlakern.defjvp(prim, lambda t, x, y: t * y, lambda t, x, y: t * x)
    x, y = rng.standard_normal(5), rng.standard_normal(5)
    tx, ty = rng.standard_normal(5), rng.standard_normal(5)
    out, tan = jax.jvp(prim.bind, (x, y), (tx, ty))
    np.testing.assert_allclose(out, x * y, **F32)
    np.testing.assert_allclose(tan, tx * y + x * ty, **F32)
    # one input without a rule: its tangent contributes nothing
    prim2 = _plain_primitive("be_mul_half")
    xlakern.defjvp(prim2, lambda t, x, y: t * y, None)
    _, tan2 = jax.jvp(prim2.bind, (x, y), (tx, ty))
    np.testing.assert_allclose(tan2, tx * y, **F32)
    g = jax.grad(lambda x: prim.bind(x, y).sum())(x)  # reverse mode through jax's linearisation
    np.testing.assert_allclose(g, y, **F32)


def test_defjvp_with_several_results(rng):
    prim = _plain_primitive("be_two", multiple=True)
    xlakern.defjvp(prim, lambda t, x, y: [t * y, jnp.cos(x) * t], lambda t, x, y: [t * x, None])
    x, y, tx, ty = (rng.standard_normal(4) for _ in range(4))
    (a, b), (ta, tb) = jax.jvp(lambda x, y: prim.bind(x, y), (x, y), (tx, ty))
    np.testing.assert_allclose(ta, tx * y + x * ty, **F32)
    np.testing.assert_allclose(tb, np.cos(x) * tx, **F32)


def test_defjvp_refuses_a_rule_count_that_does_not_fit():
    prim = _plain_primitive("be_count")
    xlakern.defjvp(prim, lambda t, x, y: t * y)
    with pytest.raises(xlakern.XlakernError, match="1 rule"):
        jax.jvp(prim.bind, (1.0, 2.0), (1.0, 1.0))
    with pytest.raises(xlakern.XlakernError, match="callable or None"):
        xlakern.defjvp(prim, "not a rule")


def test_general_batching_rule_on_a_plain_primitive(rng):
    from jax.interpreters import batching

    prim = _plain_primitive("be_batch")
    batching.primitive_batchers[prim] = functools.partial(xlakern.general_batching_rule, prim)
    xs, y = rng.standard_normal((6, 3)), rng.standard_normal(3)
    np.testing.assert_allclose(jax.vmap(lambda x: prim.bind(x, y))(xs), xs * y, **F32)
    np.testing.assert_allclose(jax.vmap(prim.bind, in_axes=(1, 1))(xs.T, xs.T), xs * xs, **F32)
    out, axis = xlakern.general_batching_rule(prim, [xs[0], y], [None, None])
    assert axis is None
    np.testing.assert_allclose(out, xs[0] * y, **F32)


def test_general_batching_rule_as_an_xlacustomkernel_rule(rng, on_cpu):
    mod = xlakern.load_cpp_inline(unique_name("be_scale"), """
// @xk scale arg ret attr.alpha:float32
void scale(const xk::Tensor x, xk::Tensor o, float alpha) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = alpha * x.data<float>()[i]; }
""")
    op = xlakern.XLACustomKernel(unique_name("be_scale_op"))
    op.def_cpp_kernel(lambda outs, alpha: lambda x: mod.scale(x, outs=outs[0], alpha=alpha))
    op.def_batching_rule(functools.partial(xlakern.general_batching_rule, op))
    xs = rng.standard_normal((5, 7)).astype(np.float32)
    got = jax.vmap(lambda x: op(x, outs=[jax.ShapeDtypeStruct((7,), jnp.float32)], alpha=1.5)[0])(xs)
    np.testing.assert_allclose(got, 1.5 * xs, **F32)


# ----------------------------------------------------------------------------- arg_spec and targets

def test_normalize_tokens():
    assert xlakern.normalize_tokens(["args", "rets", "attrs.alpha:float32", "ctx.stream", "arg", "attr.n"]) == \
        ["arg", "ret", "attr.alpha:float32", "stream", "arg", "attr.n"]
    with pytest.raises(xlakern.SpecError, match="unknown token 'output'"):
        xlakern.normalize_tokens(["arg", "output"])
    # a string is not a list of tokens (its letters would each be read as one), nor is None or a number
    with pytest.raises(xlakern.SpecError, match=r"list of token strings; got str; .* pass 'arg ret'\.split\(\)"):
        xlakern.normalize_tokens("arg ret")
    for bad, message in ((None, "got NoneType"), (["arg", None], "token None is a NoneType"), ([3], "token 3 is a int")):
        with pytest.raises(xlakern.SpecError, match=message):
            xlakern.normalize_tokens(bad)
    assert xlakern.normalize_tokens(tuple("args rets".split())) == ["arg", "ret"]


def test_register_ffi_target_gives_an_entry_point_a_second_name(rng, on_cpu):
    mod = xlakern.load_cpp_inline(unique_name("be_target"), """
// @xk add_one arg ret
void add_one(const xk::Tensor x, xk::Tensor o) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = x.data<float>()[i] + 1.0f; }
// @xk twice arg ret
void twice(const xk::Tensor x, xk::Tensor o) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = 2.0f * x.data<float>()[i]; }
""")
    target = unique_name("be_alias")
    xlakern.register_ffi_target(target, mod, "add_one", platform="cpu")
    xlakern.register_ffi_target(target, mod, "add_one")  # the same again: nothing to do
    assert target in xlakern.list_registered_targets()
    x = rng.standard_normal(9).astype(np.float32)
    y = jax.jit(lambda x: jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x))(x)
    np.testing.assert_allclose(y, x + 1, rtol=1e-6)
    with pytest.raises(xlakern.RegistrationError, match="already registered to other code"):
        xlakern.register_ffi_target(target, mod, "twice")
    with pytest.raises(xlakern.RegistrationError, match="already registered to other code"):
        xlakern.register_ffi_target(mod.targets["twice"], mod, "add_one")
    with pytest.raises(xlakern.RegistrationError, match="has no entry point 'nope'; it has: add_one, twice"):
        xlakern.register_ffi_target(unique_name("be_alias"), mod, "nope")
    with pytest.raises(xlakern.RegistrationError, match="built for the CPU"):
        xlakern.register_ffi_target(unique_name("be_alias"), mod, "twice", platform="CUDA")
    with pytest.raises(xlakern.RegistrationError, match="must be a CompiledModule"):
        xlakern.register_ffi_target(unique_name("be_alias"), "mod", "twice")


ADD_TWO_SRC = """
// @xk add_two arg ret
void add_two(const xk::Tensor x, xk::Tensor o) {
  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = x.data<float>()[i] + 2.0f; }
"""


def _ffi_add_two(target, x):
    return jax.jit(lambda x: jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x))(x)


def test_loaders_take_brainevent_0_3s_registration_options(rng, on_cpu, tmp_path):
    """target_prefix names the extra targets '<prefix>.<fn>'; auto_register=False leaves them out; replace=
    is accepted and changes nothing (other content under a loaded name still raises); the file loaders take
    BrainEvent's filepath= (and xlakern's earlier path=); the folder loaders take file_patterns=None."""
    x = rng.standard_normal(7).astype(np.float32)
    name, prefix = unique_name("be_prefixed"), unique_name("be_prefix")
    mod = xlakern.load_cpp_inline(name, ADD_TWO_SRC, target_prefix=prefix, replace=True)
    for target in (f"{prefix}.add_two", f"{name}.add_two"):
        assert target in xlakern.list_registered_targets()
        np.testing.assert_allclose(_ffi_add_two(target, x), x + 2, rtol=1e-6)
    np.testing.assert_allclose(mod.add_two(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)), x + 2, rtol=1e-6)
    # loading the same module again with a second prefix adds that prefix's names too (BrainEvent does)
    prefix2 = unique_name("be_prefix")
    assert xlakern.load_cpp_inline(name, ADD_TWO_SRC, target_prefix=prefix2) is mod
    np.testing.assert_allclose(_ffi_add_two(f"{prefix2}.add_two", x), x + 2, rtol=1e-6)
    # auto_register=False: no prefixed names; the module still works and can be given one by hand
    name3, prefix3 = unique_name("be_unregistered"), unique_name("be_prefix")
    mod3 = xlakern.load_cpp_inline(name3, ADD_TWO_SRC.replace("2.0f", "3.0f"), auto_register=False,
                                   target_prefix=prefix3)
    assert f"{prefix3}.add_two" not in xlakern.list_registered_targets()
    np.testing.assert_allclose(mod3.add_two(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)), x + 3, rtol=1e-6)
    xlakern.register_ffi_target(f"{prefix3}.add_two", mod3, "add_two")
    np.testing.assert_allclose(_ffi_add_two(f"{prefix3}.add_two", x), x + 3, rtol=1e-6)
    # replace=True does not re-point a name loaded from other content
    with pytest.raises(xlakern.RegistrationError, match="already registered from other content"):
        xlakern.load_cpp_inline(name, ADD_TWO_SRC.replace("2.0f", "4.0f"), replace=True)
    # a prefix whose names belong to another module's code is refused
    with pytest.raises(xlakern.RegistrationError, match="already registered to other code"):
        xlakern.load_cpp_inline(name3, ADD_TWO_SRC.replace("2.0f", "3.0f"), target_prefix=prefix)
    for bad in ("", " p", 3):
        with pytest.raises(xlakern.XlakernError, match="target_prefix must be a non-empty string"):
            xlakern.load_cpp_inline(unique_name("be_bad_prefix"), ADD_TWO_SRC, target_prefix=bad)
    # filepath= (BrainEvent's keyword) and path= (xlakern's earlier one)
    src = tmp_path / "be_add_two.cc"
    src.write_text(ADD_TWO_SRC)
    by_filepath = xlakern.load_cpp_file(filepath=src, name=unique_name("be_file"))
    by_path = xlakern.load_cpp_file(path=src, name=unique_name("be_file"))
    for m in (by_filepath, by_path):
        np.testing.assert_allclose(m.add_two(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)), x + 2, rtol=1e-6)
    with pytest.raises(xlakern.OptionError, match="got both filepath= and path="):
        xlakern.load_cpp_file(filepath=src, path=src)
    # file_patterns=None: the default patterns; a pattern that is no list says so
    by_dir = xlakern.load_cpp_dir(tmp_path, name=unique_name("be_dir"), file_patterns=None)
    np.testing.assert_allclose(by_dir.add_two(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)), x + 2, rtol=1e-6)
    with pytest.raises(xlakern.XlakernError, match="file_patterns must be a list of glob patterns"):
        xlakern.load_cpp_dir(tmp_path, name=unique_name("be_dir"), file_patterns=3)


def test_jaxinfo_to_warpinfo_takes_brainevents_keyword():
    pytest.importorskip("warp")
    t = xlakern.jaxinfo_to_warpinfo(jax_info=jax.ShapeDtypeStruct((5, 2), jnp.float32))
    assert t.ndim == 2


def test_defjvp_on_an_xlacustomkernel_leaves_an_output_without_tangent(rng, on_cpu):
    mod = xlakern.load_cpp_inline(unique_name("be_two_out"), """
// @xk double_and_sign arg ret ret
void double_and_sign(const xk::Tensor x, xk::Tensor d, xk::Tensor s) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.data<float>()[i];
    d.data<float>()[i] = 2.0f * v; s.data<float>()[i] = v > 0 ? 1.0f : -1.0f; } }
""")
    op = xlakern.XLACustomKernel(unique_name("be_two_out_op"))
    op.def_cpp_kernel(lambda outs: lambda x: mod.double_and_sign(x, outs=list(outs)))
    xlakern.defjvp(op, lambda t, x, **kw: [2 * t, None])  # the sign has no derivative
    x, t = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
    outs = [jax.ShapeDtypeStruct((6,), jnp.float32)] * 2
    (d, s), (td, ts) = jax.jvp(lambda x: tuple(op(x, outs=outs)), (x,), (t,))
    np.testing.assert_allclose(d, 2 * x, rtol=1e-6)
    np.testing.assert_array_equal(s, np.sign(x))
    np.testing.assert_allclose(td, 2 * t, rtol=1e-6)
    np.testing.assert_array_equal(ts, np.zeros(6))
