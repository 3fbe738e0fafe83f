"""Regressions of the adversarial battery (issue 9) and all-or-nothing registration (issue 12).

One test per finding. Where process state matters (which JAX call comes first, a library
that must stay loaded, an abort inside XLA) the test runs its case in a fresh subprocess.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import xlakern
from xlakern import _bridge, _build, _cache, _runtime, _toolchain
from conftest import unique_name

SDS = jax.ShapeDtypeStruct
pytestmark = pytest.mark.usefixtures("on_cpu")

SCALE = """
// @xk scale arg ret attr.k:float32
void scale(const xk::Tensor x, xk::Tensor out, float k) {
  const float* in = x.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] * k;
}
"""


def run_python(code: str, *, env: dict | None = None, cwd: str | None = None, timeout: int = 300,
               cpu_only: bool = True):
    """Run ``code`` in a fresh interpreter (same cache dir as this process unless ``env`` says).

    ``cpu_only``: JAX sees only the CPU, so the CPU kernels get CPU arrays on a GPU machine too.
    """
    full_env = dict(os.environ, **(env or {}))
    if cpu_only:
        full_env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


def assert_ok(proc) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture
def private_cache(tmp_path):
    """A fresh cache root for this test (restored afterwards)."""
    root = tmp_path / "cache"
    xlakern.set_cache_dir(root)
    try:
        yield root
    finally:
        xlakern.set_cache_dir(None)


# -- 1. registration works whatever JAX call comes first -----------------------------------------

def test_first_jax_call_is_a_jit_of_a_numba_kernel(rng):
    x = rng.standard_normal(16).astype(np.float32)
    out = assert_ok(run_python(f"""
        import json, numpy as np, jax, numba, xlakern

        @numba.njit
        def twice_plus(x, out):
            for i in range(x.size):
                out[i] = 2 * x[i] + 1

        f = xlakern.numba_kernel(twice_plus, outs=jax.ShapeDtypeStruct((16,), np.float32))
        x = np.array({x.tolist()!r}, dtype=np.float32)
        y = jax.jit(f)(x)                       # the first JAX call of the process
        z = f(x + 1)                            # and later calls, eager this time
        print(json.dumps([np.asarray(y).tolist(), np.asarray(z).tolist()]))
    """))
    y, z = (np.array(v) for v in json.loads(out.strip().splitlines()[-1]))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, 2 * x64 + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(z, 2 * (x64 + 1) + 1, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_first_jax_call_is_a_jit_of_a_numba_cuda_kernel(rng):
    x = rng.standard_normal(300).astype(np.float32)
    out = assert_ok(run_python(f"""
        import json, numpy as np, jax, xlakern   # xlakern before numba.cuda (NumPy 2.5 shim)
        from numba import cuda

        @cuda.jit
        def twice_plus(x, out):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = 2 * x[i] + 1

        f = xlakern.numba_cuda_kernel(twice_plus, outs=jax.ShapeDtypeStruct((300,), np.float32), launch_dims=300)
        x = np.array({x.tolist()!r}, dtype=np.float32)
        y = jax.jit(f)(x)                       # the first JAX call of the process, on the GPU
        z = f(jax.device_put(x + 1, jax.devices("gpu")[0]))
        print(json.dumps([np.asarray(y).tolist(), np.asarray(z).tolist()]))
    """, cpu_only=False))
    y, z = (np.array(v) for v in json.loads(out.strip().splitlines()[-1]))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, 2 * x64 + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(z, 2 * (x64 + 1) + 1, rtol=1e-6, atol=1e-6)


def test_a_failed_generic_registration_is_not_marked_done():
    out = assert_ok(run_python("""
        import numpy as np, jax, numba, xlakern

        real = jax.ffi.register_ffi_target
        calls = []
        def flaky(name, *a, **k):
            calls.append(name)
            if len(calls) == 1:
                raise RuntimeError("injected failure")
            return real(name, *a, **k)
        jax.ffi.register_ffi_target = flaky

        @numba.njit
        def neg(x, out):
            for i in range(x.size):
                out[i] = -x[i]

        f = xlakern.numba_kernel(neg, outs=jax.ShapeDtypeStruct((3,), np.float32))
        try:
            f(np.ones(3, np.float32))
        except xlakern.RegistrationError as e:
            print("first:", "xlakern.numba_cpu" in str(e) and "injected failure" in str(e))
        print("targets after failure:", xlakern.list_registered_targets())
        print("second:", np.asarray(f(np.arange(3, dtype=np.float32))).tolist())
    """))
    assert "first: True" in out
    assert "targets after failure: []" in out
    assert "second: [-0.0, -1.0, -2.0]" in out


# -- 2. clear_cache touches only what xlakern created ----------------------------------------------

def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_clear_cache_refuses_names_that_are_not_module_names(tmp_path, private_cache):
    private_cache.mkdir()
    sibling = tmp_path / "precious"
    (sibling / "sub").mkdir(parents=True)
    (sibling / "sub" / "data.txt").write_text("keep me")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "0123456789abcdef0123456789abcdef").mkdir(parents=True)
    before = _tree(tmp_path)
    for bad in ["..", "../precious", str(elsewhere), "/", "", "a/b", "ops\n", 3]:
        with pytest.raises(xlakern.XlakernError, match="not a module name"):
            xlakern.clear_cache(bad)
    assert _tree(tmp_path) == before


def test_clear_cache_never_follows_a_symlinked_module_folder(tmp_path, private_cache):
    key = "0123456789abcdef0123456789abcdef"
    outside = tmp_path / "outside"
    (outside / key).mkdir(parents=True)
    (outside / key / "libfoo.so").write_text("not ours")
    (outside / "data").mkdir()
    private_cache.mkdir(mode=0o700)
    (private_cache / "foo").symlink_to(outside, target_is_directory=True)
    # A real module folder beside it, whose build is cleared, and a link planted in place of a build.
    real = private_cache / "bar"
    (real / key).mkdir(parents=True)
    (real / key / "libbar.so").write_text("x")
    other_key = "f" * 32
    (real / other_key).symlink_to(outside / "data", target_is_directory=True)
    before_outside = _tree(outside)

    result = xlakern.clear_cache()
    assert _tree(outside) == before_outside
    assert str(real / key) in result["removed"]
    assert not (real / key).exists() and not os.path.lexists(real / other_key)
    assert (private_cache / "foo").is_symlink()
    assert str(private_cache / "foo") in result["skipped"]
    result = xlakern.clear_cache("foo")
    assert _tree(outside) == before_outside and result["removed"] == []


# -- 3. the cache's permissions follow ssh's and pip's rules --------------------------------------

def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


def test_new_cache_is_created_private(tmp_path, rng):
    root = tmp_path / "a" / "b" / "cache"  # missing parents too
    xlakern.set_cache_dir(root)
    try:
        mod = xlakern.load_cpp_inline(unique_name("private"), SCALE)
        x = rng.standard_normal(7).astype(np.float32)
        np.testing.assert_allclose(np.asarray(mod.scale(x, outs=SDS(x.shape, x.dtype), k=1.5)),
                                   x.astype(np.float64) * 1.5, rtol=1e-6)
    finally:
        xlakern.set_cache_dir(None)
    modes = _modes(root)
    dirs = {p: m for p, m in modes.items() if (root / p).is_dir()}
    files = {p: m for p, m in modes.items() if not (root / p).is_dir()}
    assert files and all(m == 0o600 for m in files.values()), files
    assert all(m == 0o700 for m in dirs.values()), dirs
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("where", ["root", "module dir"])
def test_group_or_world_writable_cache_is_refused_before_compiling(private_cache, where, monkeypatch):
    name = unique_name("hostile")
    private_cache.mkdir(mode=0o700)
    target = private_cache if where == "root" else private_cache / name
    target.mkdir(exist_ok=True)
    os.chmod(target, 0o777 if where == "root" else 0o775)

    def no_compiler(*a, **k):
        raise AssertionError("the compiler ran although the cache is not private")

    monkeypatch.setattr(_build.Builder, "__call__", no_compiler)
    with pytest.raises(xlakern.CacheError) as err:
        xlakern.load_cpp_inline(name, SCALE)
    msg = str(err.value)
    assert str(target) in msg and "writable by its group or by others" in msg and "chmod" in msg


def test_cache_owned_by_another_user_is_refused(private_cache, monkeypatch):
    private_cache.mkdir(mode=0o700)
    # Only another uid could own the directory: stand in for one in the owner check.
    monkeypatch.setattr(_cache, "_trusted_uids", lambda: frozenset([os.geteuid() + 4242]))
    with pytest.raises(xlakern.CacheError, match=re.escape(f"{private_cache} is owned by uid {os.geteuid()}")):
        xlakern.load_cpp_inline(unique_name("foreign"), SCALE)


@pytest.mark.parametrize("component", ["key dir", "meta.json", "library"])
def test_published_build_with_a_writable_component_is_not_loaded(private_cache, component):
    name = unique_name("planted")
    mod = xlakern.load_cpp_inline(name, SCALE)
    slot = _cache.Entry(private_cache, name, mod.base_key)  # the cache entry is keyed by the base key
    assert slot.valid_library() == slot.library
    path = {"key dir": slot.published, "meta.json": slot.published / "meta.json", "library": slot.library}[component]
    os.chmod(path, 0o777 if path.is_dir() else 0o666)
    with pytest.raises(xlakern.CacheError, match=re.escape(str(path))):
        slot.open_library()
    # The same in a fresh process, through the public loader.
    proc = run_python(f"""
        import xlakern
        xlakern.set_cache_dir({str(private_cache)!r})
        try:
            xlakern.load_cpp_inline({name!r}, {SCALE!r})
        except xlakern.CacheError as e:
            print("refused:", {str(path)!r} in str(e))
    """)
    assert "refused: True" in assert_ok(proc)


def test_library_symlinked_into_the_cache_is_not_followed(private_cache, tmp_path):
    name = unique_name("linked")
    mod = xlakern.load_cpp_inline(name, SCALE)
    slot = _cache.Entry(private_cache, name, mod.base_key)  # the cache entry is keyed by the base key
    real = tmp_path / "elsewhere.so"
    shutil.copy(slot.library, real)
    os.chmod(real, 0o600)
    slot.library.unlink()
    slot.library.symlink_to(real)
    assert slot.open_library() is None  # treated as absent (rebuilt), never loaded through the link


def test_library_swapped_after_the_check_is_not_the_one_loaded(private_cache, monkeypatch, rng):
    # Build a look-alike library: same entry point, another result (x * -7 instead of x * k).
    decoy_src = SCALE.replace("o[i] = in[i] * k", "o[i] = in[i] * -7.0f")
    decoy = xlakern.load_cpp_inline(unique_name("decoy"), decoy_src)
    name = unique_name("swapped")
    real_open = _runtime.open_module
    swapped = []

    def swap_then_open(mod_name, key, path, *rest):
        if mod_name == name:  # between the checks and dlopen, someone replaces the file
            tmp = Path(path).with_name("decoy.tmp")
            shutil.copy(decoy.path, tmp)
            os.replace(tmp, path)
            swapped.append(path)
        return real_open(mod_name, key, path, *rest)

    monkeypatch.setattr(_runtime, "open_module", swap_then_open)
    mod = xlakern.load_cpp_inline(name, SCALE)
    assert swapped
    x = rng.standard_normal(9).astype(np.float32)
    y = np.asarray(mod.scale(x, outs=SDS(x.shape, x.dtype), k=2.5))
    np.testing.assert_allclose(y, x.astype(np.float64) * 2.5, rtol=1e-6)


# -- 4. relative cache paths ------------------------------------------------------------------------

def test_relative_cache_dir_is_made_absolute(tmp_path, monkeypatch, rng):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XLAKERN_CACHE_DIR", "rel/cache")
    root = xlakern.get_cache_dir()
    assert root == tmp_path / "rel" / "cache"
    mod = xlakern.load_cpp_inline(unique_name("relative"), SCALE)
    x = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(np.asarray(mod.scale(x, outs=SDS(x.shape, x.dtype), k=-3.0)),
                               x.astype(np.float64) * -3.0, rtol=1e-6)
    assert Path(mod.path).is_relative_to(tmp_path / "rel" / "cache")


# -- 5. the xlakern. target namespace is reserved ---------------------------------------------------

def test_module_named_xlakern_is_rejected(rng):
    src = "// @xk numba_cpu arg ret\nvoid numba_cpu(const xk::Tensor x, xk::Tensor o) {}\n"
    with pytest.raises(xlakern.SpecError, match="reserved"):
        xlakern.load_cpp_inline("xlakern", src)
    assert "xlakern" not in [m[0] for m in _runtime.modules()]
    numba = pytest.importorskip("numba")

    @numba.njit
    def inc(x, out):
        for i in range(x.size):
            out[i] = x[i] + 1

    x = rng.standard_normal(4).astype(np.float32)
    y = xlakern.numba_kernel(inc, outs=SDS((4,), np.float32))(x)
    np.testing.assert_allclose(np.asarray(y), x.astype(np.float64) + 1, rtol=1e-6)


# -- 6. kernel messages decoded leniently -----------------------------------------------------------

def test_non_utf8_check_message_keeps_kernel_name_and_check(rng):
    mod = xlakern.load_cpp_inline(unique_name("latin"), r"""
// @xk small arg ret
void small(const xk::Tensor x, xk::Tensor out) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    int v = x.data<int32_t>()[i];
    XK_CHECK(v < 128) << "byte " << (uint8_t)v << " at " << i;
    out.data<int32_t>()[i] = v;
  }
}
""")
    x = rng.integers(0, 100, 6).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(mod.small(x, outs=SDS(x.shape, x.dtype))), x)
    x[3] = 200
    with pytest.raises(xlakern.KernelError) as err:
        mod.small(x, outs=SDS(x.shape, x.dtype))
    msg = str(err.value)
    assert re.search(r"kernel 'latin_\w+\.small' failed", msg) and "check failed: v < 128" in msg and "byte \\xC8 at 3" in msg


# -- 7. kernels that cannot write their outputs -----------------------------------------------------

def test_generator_and_keyword_only_kernels_are_rejected():
    numba = pytest.importorskip("numba")

    @numba.njit
    def gen(x, out):
        for i in range(x.size):
            out[i] = x[i]
            yield i

    with pytest.raises(xlakern.CallError, match="generator"):
        xlakern.numba_kernel(gen, outs=SDS((4,), np.float32))

    def kwonly(x, out, *, scale):
        out[:] = x * scale

    with pytest.raises(xlakern.CallError, match="keyword-only"):
        xlakern.numba_kernel(numba.njit(kwonly), outs=SDS((4,), np.float32))


# -- 8. inputs are read-only ------------------------------------------------------------------------

def test_numba_kernel_cannot_write_its_input(rng):
    numba = pytest.importorskip("numba")
    import jax.numpy as jnp

    @numba.njit
    def sneaky(x, out):
        x[0] = 99.0
        for i in range(x.size):
            out[i] = x[i]

    x = jnp.asarray(rng.standard_normal(5).astype(np.float32))
    before = np.array(x)
    f = xlakern.numba_kernel(sneaky, outs=SDS((5,), np.float32))
    with pytest.raises(xlakern.CallError, match="read-only"):
        f(x)
    with pytest.raises(xlakern.CallError, match="read-only"):
        jax.jit(f)(x)
    np.testing.assert_array_equal(np.asarray(x), before)


def test_const_tensor_data_is_read_only_in_cpp():
    src = """
// @xk poke arg ret
void poke(const xk::Tensor x, xk::Tensor out) { x.data<float>()[0] = 1.0f; }
"""
    with pytest.raises(xlakern.CompilationError, match="read-only|const"):
        xlakern.load_cpp_inline(unique_name("poke"), src)


# -- 11. the cache's lookup files heal themselves ---------------------------------------------------

@pytest.mark.parametrize("shape", ["list entries", "dict entries", "top-level list", "not json"])
def test_lookup_files_of_the_wrong_shape_are_rebuilt(tmp_path, shape, rng):
    root = tmp_path / "cache"
    x = rng.standard_normal(3).astype(np.float32)
    load = f"""
        import json, jax, numpy as np, xlakern
        mod = xlakern.load_cpp_inline("lookup", {SCALE!r})
        x = np.array({x.tolist()!r}, dtype=np.float32)
        print(json.dumps(np.asarray(mod.scale(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                              k=4.0)).tolist()))
    """
    env = {"XLAKERN_CACHE_DIR": str(root)}
    assert_ok(run_python(load, env=env))  # a fresh process writes both lookup files
    for fname in ("toolchain-versions.json", "file-digests.json"):
        path = root / fname
        data = json.loads(path.read_text())
        assert data
        bad = {"list entries": json.dumps({k: [1] for k in data}),
               "dict entries": json.dumps({k: {"a": 1} for k in data}),
               "top-level list": json.dumps(list(data)), "not json": "{"}[shape]
        path.write_text(bad)
    out = assert_ok(run_python(load, env=env))  # the next process reads them
    np.testing.assert_allclose(json.loads(out.strip().splitlines()[-1]), x.astype(np.float64) * 4, rtol=1e-6)
    versions = json.loads((root / "toolchain-versions.json").read_text())
    assert versions and all(isinstance(v, dict) and isinstance(v["version"], str) for v in versions.values())
    digests = json.loads((root / "file-digests.json").read_text())
    assert digests and all(isinstance(v, list) and len(v) == 4 for v in digests.values())  # mtime, size, sha, hashed at


# -- 13. attribute names colliding with call keywords -----------------------------------------------

@pytest.mark.parametrize("keyword", ["outs", "vmap_method", "input_output_aliases", "zeroed_outputs"])
def test_attribute_named_like_a_call_keyword_is_rejected(keyword, monkeypatch):
    monkeypatch.setattr(_build.Builder, "__call__", lambda *a, **k: pytest.fail("compiled"))
    src = f"// @xk f arg ret attr.{keyword}:int32\nvoid f(const xk::Tensor x, xk::Tensor o, int32_t {keyword}) {{}}\n"
    with pytest.raises(xlakern.SpecError, match=f"attr.{keyword}"):
        xlakern.load_cpp_inline(unique_name("kw"), src)


# -- 14. module names -------------------------------------------------------------------------------

def test_module_names_are_checked_whole_and_limited_in_length(monkeypatch, rng):
    real_builder = _build.Builder.__call__
    monkeypatch.setattr(_build.Builder, "__call__", lambda *a, **k: pytest.fail("compiled"))
    for bad in ["ops\n", "ops\nx", "a" * 101, "b" * 300, "9ops", "op-s", ""]:
        with pytest.raises(xlakern.SpecError, match="module name"):
            xlakern.load_cpp_inline(bad, SCALE)
    monkeypatch.setattr(_build.Builder, "__call__", real_builder)
    longest = ("m" + unique_name("") + "x" * 100)[:100]
    mod = xlakern.load_cpp_inline(longest, SCALE)
    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(np.asarray(mod.scale(x, outs=SDS(x.shape, x.dtype), k=0.5)),
                               x.astype(np.float64) * 0.5, rtol=1e-6)


# -- 15. element counts checked before the call ------------------------------------------------------

def test_overflowing_shapes_are_refused_before_xla():
    # In a subprocess: before the fix, XLA aborted the whole process.
    out = assert_ok(run_python(f"""
        import numpy as np, jax, numba, xlakern
        mod = xlakern.load_cpp_inline("overflow", {SCALE!r})
        huge = jax.ShapeDtypeStruct((2**31,) * 3, np.float32)
        x = np.ones(3, np.float32)
        for what, call in [
            ("mod.fn", lambda: mod.scale(x, outs=huge, k=1.0)),
            ("mod.fn bytes", lambda: mod.scale(x, outs=jax.ShapeDtypeStruct((2**31, 2**31), np.float64), k=1.0)),
            ("numba", lambda: xlakern.numba_kernel(numba.njit(lambda a, o: None), outs=huge)),
        ]:
            try:
                call()
                print(what, "accepted")
            except xlakern.CallError as e:
                print(what, "refused", "int64" in str(e))
    """))
    assert out.split("\n")[:3] == ["mod.fn refused True", "mod.fn bytes refused True", "numba refused True"]


# -- 16. the eager cache is bounded ------------------------------------------------------------------

def test_eager_cache_is_a_bounded_lru(monkeypatch, rng):
    mod = xlakern.load_cpp_inline(unique_name("lru"), SCALE)
    monkeypatch.setattr(_bridge, "_EAGER_SIZE", 8)
    x = rng.standard_normal(6).astype(np.float32)
    ks = rng.standard_normal(40)
    for k in ks:
        y = mod.scale(x, outs=SDS(x.shape, x.dtype), k=float(k))
        np.testing.assert_allclose(np.asarray(y), x.astype(np.float64) * np.float32(k), rtol=1e-5)
        assert len(_bridge._EAGER) <= 8
    # The most recent entries are the ones kept: calling the last value again adds nothing.
    keys_before = list(_bridge._EAGER)
    mod.scale(x, outs=SDS(x.shape, x.dtype), k=float(ks[-1]))
    assert list(_bridge._EAGER)[:-1] == keys_before[:-1] and len(_bridge._EAGER) == len(keys_before)


def test_eager_cache_size_comes_from_the_environment():
    out = assert_ok(run_python("""
        import numpy as np, jax, numba, xlakern
        from xlakern import _bridge

        @numba.njit
        def fill(out):
            for i in range(out.size):
                out[i] = i

        for n in range(1, 13):
            y = xlakern.numba_kernel(fill, outs=jax.ShapeDtypeStruct((n,), np.int32))()
            assert np.asarray(y).tolist() == list(range(n))
        print("entries", len(_bridge._EAGER))
    """, env={"XLAKERN_EAGER_CACHE_SIZE": "5"}))
    assert "entries 5" in out


# -- issue 12: registration all or nothing ----------------------------------------------------------

THREE = """
// @xk first arg ret
void first(const xk::Tensor x, xk::Tensor o) { for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = x.data<float>()[i] + 1; }
// @xk second arg ret
void second(const xk::Tensor x, xk::Tensor o) { for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = 2; }
// @xk third arg ret
void third(const xk::Tensor x, xk::Tensor o) { for (int64_t i = 0; i < x.numel(); ++i) o.data<float>()[i] = 3; }
"""


def test_registration_failing_halfway_keeps_the_registered_targets_working(rng):
    x = rng.standard_normal(8).astype(np.float32)
    out = assert_ok(run_python(f"""
        import io, numpy as np, jax, xlakern

        real = jax.ffi.register_ffi_target
        seen = []
        def fail_second(name, *a, **k):
            seen.append(name)
            if name == "halfway.second":  # after first and its control twin first.xk
                raise RuntimeError("injected: XLA refused " + name)
            return real(name, *a, **k)
        jax.ffi.register_ffi_target = fail_second

        try:
            xlakern.load_cpp_inline("halfway", {THREE!r})
            print("loaded")
        except xlakern.RegistrationError as e:
            print("error:", "halfway.second" in str(e), "2 of its 6" in str(e))
        jax.ffi.register_ffi_target = real
        import gc; gc.collect()
        x = np.array({x.tolist()!r}, dtype=np.float32)
        y = jax.jit(lambda x: jax.ffi.ffi_call("halfway.first", jax.ShapeDtypeStruct(x.shape, x.dtype))(x))(x)
        print("first:", repr(np.asarray(y).tolist()))
        try:
            xlakern.load_cpp_inline("halfway", {THREE!r})
            print("reloaded")
        except xlakern.RegistrationError as e:
            print("reload refused:", "failed part-way" in str(e))
        targets = xlakern.list_registered_targets()
        print("targets:", targets)
        buf = io.StringIO()
        xlakern.print_diagnostics(buf)
        line = [l for l in buf.getvalue().splitlines() if l.startswith("registered targets")][0]
        print("diagnostics agree:", line.split(None, 2)[2] == ", ".join(targets))
    """))
    assert "error: True True" in out
    first = eval(out.split("first: ", 1)[1].splitlines()[0])
    np.testing.assert_allclose(first, x.astype(np.float64) + 1, rtol=1e-6)
    assert "reload refused: True" in out
    assert "targets: ['halfway.first']" in out
    assert "diagnostics agree: True" in out


def test_list_registered_targets_and_diagnostics_agree(rng):
    numba = pytest.importorskip("numba")

    @numba.njit
    def copy(x, out):
        for i in range(x.size):
            out[i] = x[i]

    x = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(xlakern.numba_kernel(copy, outs=SDS((3,), np.float32))(x)), x)
    xlakern.load_cpp_inline(unique_name("agree"), SCALE)
    targets = xlakern.list_registered_targets()
    assert "xlakern.numba_cpu" in targets
    buf = io.StringIO()
    xlakern.print_diagnostics(buf)
    line = next(l for l in buf.getvalue().splitlines() if l.startswith("registered targets"))
    assert line.split(None, 2)[2] == ", ".join(targets)
