"""Every bad input gives an XlakernError subclass that says what is wrong and what to do."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import unique_name

SDS = jax.ShapeDtypeStruct
pytestmark = pytest.mark.usefixtures("on_cpu")

GOOD = """
// @xk scale arg ret attr.k:float32
void scale(const xk::Tensor x, xk::Tensor out, float k) {
  for (int64_t i = 0; i < x.numel(); ++i) out.data<float>()[i] = x.data<float>()[i] * k;
}
"""


def spec_error(src, functions=None, match=None, loader=xlakern.load_cpp_inline, **kw):
    with pytest.raises(xlakern.SpecError, match=match) as err:
        loader(unique_name("spec"), src, functions, **kw)
    return str(err.value)


# -- arg_spec / signature mismatches (raised before any compiler runs) ------------------------------

def test_unknown_token_names_function_token_and_line():
    msg = spec_error("\n\n// @xk f arg output\nvoid f(const xk::Tensor a, xk::Tensor b) {}\n")
    assert "'f'" in msg and "'output'" in msg and "line 4" in msg and "valid tokens" in msg


def test_unknown_attr_type_lists_supported_types():
    msg = spec_error("// @xk f ret attr.k:float128\nvoid f(xk::Tensor o, double k) {}")
    assert "float128" in msg and "float64" in msg and "line 2" in msg


def test_token_count_mismatch():
    msg = spec_error("// @xk f arg ret\nvoid f(const xk::Tensor a, xk::Tensor b, xk::Tensor c) {}")
    assert "2 token(s)" in msg and "3 parameter(s)" in msg


def test_arg_token_on_non_const_tensor():
    spec_error("void f(xk::Tensor a, xk::Tensor b) {}", {"f": "arg ret"}, match=r"'arg'.*const xk::Tensor")


def test_ret_token_on_const_tensor():
    spec_error("void f(const xk::Tensor a, const xk::Tensor b) {}", {"f": "arg ret"}, match=r"non-const")


def test_attr_type_disagreeing_with_cpp_type():
    spec_error("void f(xk::Tensor o, float k) {}", {"f": "ret attr.k:float64"},
               match=r"attr type 'float64' is passed as C\+\+ 'double', but the parameter is 'float'")


def test_float16_attr_needs_uint16_bits_parameter():
    spec_error("void f(xk::Tensor o, float h) {}", {"f": "ret attr.h:float16"}, match=r"uint16_t")


def test_missing_function():
    msg = spec_error(GOOD, {"scale": "arg ret attr.k", "nope": "ret"})
    assert "'nope'" in msg and "not defined" in msg


def test_annotation_for_missing_function_names_its_line():
    msg = spec_error("\n// @xk ghost arg ret\n")
    assert "ghost" in msg and "line 2" in msg


def test_all_const_tensors_no_output():
    spec_error("void f(const xk::Tensor a) {}", ["f"], match=r"no output")


def test_stream_in_cpu_module():
    spec_error("void f(xk::Tensor o, int64_t stream) {}", {"f": "ret stream"},
               match=r"CPU module has no CUDA stream")


def test_cuda_entry_without_stream():
    spec_error("void f(xk::Tensor o) {}", ["f"], loader=xlakern.load_cuda_inline,
               compute_capability="9.0", match=r"must take XLA's stream")


def test_no_entry_points_at_all():
    spec_error("void f(xk::Tensor o) {}", match=r"no entry points found.*@xk")


def test_static_and_non_void_entry_points():
    spec_error("static void f(xk::Tensor o) {}", ["f"], match=r"static")
    spec_error("int f(xk::Tensor o) { return 0; }", ["f"], match=r"must return void")


def test_uninferable_parameter_type():
    spec_error("void f(xk::Tensor o, const char* s) {}", ["f"], match=r"cannot infer a token.*const char\* s")


def test_bad_functions_argument_type():
    spec_error(GOOD, 42, match=r"functions= must be")


def test_comments_and_strings_do_not_confuse_the_parser():
    src = '''
    /* void scale(int nonsense) {} */
    const char* s = "void scale(float)";
    // @xk scale arg ret attr.k
    void scale(const BE::Tensor x, BE::Tensor out, float k) { (void)s; }
    '''
    mod = xlakern.load_cpp_inline(unique_name("parse"), ["#include \"brainevent/common.h\"\n" + src])
    assert list(mod.functions.values()) == ["arg ret attr.k:float32"]


def test_macro_lines_and_extern_c_entry_points(rng):
    src = (
        "#define TWICE(v) ((v) * 2)\n"
        "void doubled(const xk::Tensor x, xk::Tensor o) {\n"
        "  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = TWICE(x.data<float>()[i]);\n}\n"
        'extern "C" void negated(const xk::Tensor x, xk::Tensor o) {\n'
        "  for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = -x.data<float>()[i];\n}\n"
    )
    mod = xlakern.load_cpp_inline(unique_name("linkage"), src, ["doubled", "negated"])
    x = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_allclose(mod.doubled(x, outs=SDS(x.shape, x.dtype)), 2 * x)
    np.testing.assert_allclose(mod.negated(x, outs=SDS(x.shape, x.dtype)), -x)


def test_inferred_spec_from_list_and_dict_forms():
    src = "void g(const xk::Tensor a, xk::Tensor b, int32_t n, double w, bool flag) {}"
    m1 = xlakern.load_cpp_inline(unique_name("infer"), src, ["g"])
    assert m1.functions["g"] == "arg ret attr.n:int32 attr.w:float64 attr.flag:bool"
    m2 = xlakern.load_cpp_inline(unique_name("infer"), src, {"g": "args rets attrs.n attrs.w:float64 attr.flag"})
    assert m2.functions["g"] == m1.functions["g"]


# -- compiler -------------------------------------------------------------------------------------

def test_compile_error_points_at_user_source_lines():
    src = "// @xk f ret\nvoid f(xk::Tensor o) {\n  int x = ;\n}\n"
    name = unique_name("broken")
    with pytest.raises(xlakern.CompilationError) as err:
        xlakern.load_cpp_inline(name, src)
    msg = str(err.value)
    assert re.search(rf"inline:{name}:3:\d+: error", msg), msg
    assert "verbose=True" in msg
    with pytest.raises(xlakern.CompilationError, match=r"command: .*-c"):
        xlakern.load_cpp_inline(name, src, verbose=True)


def test_compile_error_in_file_names_the_file(tmp_path):
    f = tmp_path / "bad_kernel.cc"
    f.write_text("// @xk f ret\nvoid f(xk::Tensor o) { undefined_call(); }\n")
    with pytest.raises(xlakern.CompilationError, match=rf"{re.escape(str(f))}:2:\d+: error"):
        xlakern.load_cpp_file(f, name=unique_name("badfile"))


def test_missing_host_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(xlakern.HostCompilerNotFoundError, match=r"CXX=.*not an executable.*unset CXX"):
        xlakern.load_cpp_inline(unique_name("nocxx"), GOOD)


def test_missing_nvcc(monkeypatch):
    monkeypatch.setenv("XLAKERN_NVCC", "/nonexistent/nvcc")
    with pytest.raises(xlakern.NvccNotFoundError, match=r"XLAKERN_NVCC"):
        xlakern.load_cuda_inline(unique_name("nonvcc"), "void f(xk::Tensor o, int64_t stream) {}", ["f"],
                                 compute_capability="9.0")


def test_bad_compute_capability():
    with pytest.raises(xlakern.GpuArchDetectionError, match=r"not a compute capability"):
        xlakern.load_cuda_inline(unique_name("arch"), "void f(xk::Tensor o, int64_t stream) {}", ["f"],
                                 compute_capability="ninety")


def test_cuda_options_on_cpu_module_rejected():
    with pytest.raises(xlakern.XlakernError, match=r"CUDA modules only"):
        xlakern.load_cpp_inline(unique_name("opt"), GOOD, use_fast_math=True)


def test_bad_module_name_and_optimization_level():
    with pytest.raises(xlakern.XlakernError, match=r"C identifier"):
        xlakern.load_cpp_inline("my-kernels", GOOD)
    with pytest.raises(xlakern.XlakernError, match=r"optimization_level"):
        xlakern.load_cpp_inline(unique_name("opt"), GOOD, optimization_level=7)


def test_paths_tags_and_programs_that_are_not_are_named(tmp_path, rng):
    """A loader's file or directory, the cache directory, get_primitives_by_tags' tags, export's function
    and deserialize's bytes given a value of the wrong kind: an XlakernError naming the argument (pathlib's,
    Python's, jax's or the flatbuffer parser's own errors named neither). A file given as a Path still
    loads and computes what NumPy does."""
    for call, message in [
        (lambda: xlakern.load_cpp_file(None), r"filepath must be a path .*; got NoneType"),
        (lambda: xlakern.load_cuda_file(3), r"filepath must be a path .*; got int 3"),
        (lambda: xlakern.load_cpp_dir(None), r"the source directory must be a path"),
        (lambda: xlakern.set_cache_dir(123), r"set_cache_dir: path must be a path .*; got int 123"),
        (lambda: xlakern.get_primitives_by_tags(None), r"tags must be a tag or an iterable of tags; got NoneType"),
        (lambda: xlakern.export(None), r"export: fun must be a function"),
        (lambda: xlakern.deserialize("program"), r"deserialize: blob must be the bytes .*; got str"),
        (lambda: xlakern.deserialize(rng.bytes(64)), r"these 64 bytes are not a serialized jax.export program"),
    ]:
        with pytest.raises(xlakern.XlakernError, match=message):
            call()
    src = tmp_path / "scale_by_path.cc"
    src.write_text(GOOD)
    mod = xlakern.load_cpp_file(src, name=unique_name("path"))
    x = rng.standard_normal(7).astype(np.float32)
    np.testing.assert_allclose(np.asarray(mod.scale(jnp.asarray(x), outs=SDS(x.shape, x.dtype), k=1.5)),
                               x.astype(np.float64) * 1.5, rtol=1e-6)


# -- registration ---------------------------------------------------------------------------------

def test_same_content_is_a_no_op_and_changed_content_is_refused():
    name = unique_name("reg")
    m1 = xlakern.load_cpp_inline(name, GOOD)
    m2 = xlakern.load_cpp_inline(name, GOOD)
    assert m1 is m2
    with pytest.raises(xlakern.RegistrationError, match=r"already registered from other content.*new name"):
        xlakern.load_cpp_inline(name, GOOD.replace("* k", "* k * 2"))
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(m1.scale(x, outs=SDS(x.shape, x.dtype), k=3), x * 3)  # old one still works


# -- calls ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scale_mod():
    return xlakern.load_cpp_inline("err_calls", GOOD)


def test_wrong_number_of_inputs(scale_mod):
    x = jnp.ones(3)
    with pytest.raises(xlakern.CallError, match=r"takes 1 input array\(s\).*got 2"):
        scale_mod.scale(x, x, outs=SDS(x.shape, x.dtype), k=1.0)


def test_wrong_number_of_outputs(scale_mod):
    x = jnp.ones(3)
    with pytest.raises(xlakern.CallError, match=r"writes 1 output"):
        scale_mod.scale(x, outs=[SDS(x.shape, x.dtype)] * 2, k=1.0)


def test_missing_and_unknown_attributes(scale_mod):
    x = jnp.ones(3)
    with pytest.raises(xlakern.CallError, match=r"missing attribute\(s\) k.*It takes: k: float32"):
        scale_mod.scale(x, outs=SDS(x.shape, x.dtype))
    with pytest.raises(xlakern.CallError, match=r"unknown keyword\(s\) kk"):
        scale_mod.scale(x, outs=SDS(x.shape, x.dtype), k=1.0, kk=2.0)


def test_attribute_of_wrong_type_or_range():
    mod = xlakern.load_cpp_inline(unique_name("attrs"), "// @xk f ret attr.n:uint8 attr.b:bool\n"
                                                        "void f(xk::Tensor o, uint8_t n, bool b) {}")
    o = SDS((1,), jnp.float32)
    with pytest.raises(xlakern.CallError, match=r"300 does not fit in uint8"):
        mod.f(outs=o, n=300, b=True)
    with pytest.raises(xlakern.CallError, match=r"declared uint8; got 1.5"):
        mod.f(outs=o, n=1.5, b=True)
    with pytest.raises(xlakern.CallError, match=r"declared bool"):
        mod.f(outs=o, n=1, b=1)


def test_traced_attribute_is_rejected(scale_mod):
    x = jnp.ones(3)
    with pytest.raises(xlakern.CallError, match=r"static"):
        jax.jit(lambda x, k: scale_mod.scale(x, outs=SDS(x.shape, x.dtype), k=k))(x, 2.0)


def test_unsupported_dtype_and_rank(scale_mod):
    x = jnp.ones(3, dtype=jnp.float8_e4m3fn)
    with pytest.raises(xlakern.CallError, match=r"float8_e4m3fn.*supported"):
        scale_mod.scale(x, outs=SDS(x.shape, jnp.float32), k=1.0)
    y = jnp.ones((1,) * 9)
    with pytest.raises(xlakern.CallError, match=r"9 dimensions"):
        scale_mod.scale(y, outs=SDS(y.shape, y.dtype), k=1.0)


def test_non_array_input(scale_mod):
    with pytest.raises(xlakern.CallError, match=r"must be an array"):
        scale_mod.scale([1.0, 2.0], outs=SDS((2,), jnp.float32), k=1.0)


def test_unknown_function_attribute(scale_mod):
    with pytest.raises(AttributeError, match=r"has no function 'scal'.*scale"):
        scale_mod.scal
