"""Numba bridge entries cached across processes (issue 13, Deliver 4).

Each test runs real Python processes sharing one cache directory: process A compiles a
kernel; process B, with every Numba compiler entry point patched to raise, must still call
it and get the right answer. Editing the kernel must miss the cache, never reuse old code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Replaces each Numba compiler entry point (CPU: the njit and cfunc paths; CUDA: numba-cuda's
# compiler and its PTX/cubin front ends) with one that raises, then proves the patch bites.
PATCH_COMPILERS = textwrap.dedent("""
    import numba
    import numba.core.ccallback as _ccb
    import numba.core.compiler as _compiler
    import numba.core.dispatcher as _dispatcher

    def _refuse(*args, **kwargs):
        raise AssertionError("Numba's compiler was called")

    for _owner, _name in [(_compiler, "compile_extra"), (_compiler, "compile_ir"),
                          (_compiler.CompilerBase, "compile_extra"), (_compiler.CompilerBase, "compile_ir"),
                          (_ccb._CFuncCompiler, "compile"), (_dispatcher._FunctionCompiler, "compile"),
                          (_dispatcher.Dispatcher, "compile")]:
        setattr(_owner, _name, _refuse)
    try:
        import xlakern._numba_cuda
        from numba import cuda as _cuda
        import numba.cuda.compiler as _cuda_compiler
        import numba.cuda.dispatcher as _cuda_dispatcher

        for _owner, _name in [(_cuda_compiler, "compile_extra"), (_cuda_compiler, "compile_ir"),
                              (_cuda_compiler, "compile_cuda"), (_cuda_compiler, "compile_ptx"),
                              (_cuda_compiler, "compile"), (_cuda, "compile_ptx"), (_cuda, "compile"),
                              (_cuda_dispatcher.CUDADispatcher, "compile")]:
            if hasattr(_owner, _name):
                setattr(_owner, _name, _refuse)
    except ImportError:
        pass

    def _assert_patched():
        try:
            numba.cfunc("float64(float64)")(lambda v: v + 1.0)
        except AssertionError:
            return
        raise RuntimeError("the compiler patch did not take effect")
""")

CPU_KERNEL = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import numba
    import jax, jax.numpy as jnp
    {patch}
    import xlakern

    SCALE = {scale}

    @numba.njit
    def axpy(x, y, out):
        scaled = np.empty(out.size, np.float64)  # allocates: the stored code links Numba's runtime
        for i in range(out.size):
            scaled[i] = SCALE * x[i]
        for i in range(out.size):
            out[i] = scaled[i] + y[i]

    rng = np.random.default_rng({seed})
    x = rng.standard_normal(257).astype(np.float32)
    y = rng.standard_normal(257).astype(np.float32)
    f = xlakern.numba_kernel(axpy, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))
    start = time.perf_counter()
    z = np.asarray(jax.block_until_ready(f(x, y)))
    seconds = time.perf_counter() - start
    expected = SCALE * x.astype(np.float64) + y
    np.testing.assert_allclose(z, expected, rtol=1e-6, atol=1e-6)
    {after}
    print(json.dumps({{"first_call_s": seconds}}))
""")


def _run(script: str, cache: Path, *, check: bool = True, quiet: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLAKERN_CACHE_DIR=str(cache), JAX_PLATFORMS="cpu")
    if not quiet:
        env.pop("XLAKERN_QUIET", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _cpu_script(scale: float, seed: int, *, patched: bool, after: str = "") -> str:
    patch = PATCH_COMPILERS + "\n_assert_patched()\n" if patched else ""
    return CPU_KERNEL.format(patch=textwrap.indent(patch, ""), scale=scale, seed=seed, after=after)


def _entries(cache: Path, kind: str) -> list[Path]:
    d = cache / kind
    return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")) if d.is_dir() else []


def test_fresh_process_runs_a_cached_numba_cpu_kernel_without_the_compiler(tmp_path, rng):
    scale = float(rng.uniform(1.5, 4.0))
    a = _run(_cpu_script(scale, int(rng.integers(1 << 30)), patched=False), tmp_path)
    assert len(_entries(tmp_path, "numba-cpu")) == 1
    # Fresh inputs in B: the cached code computes, it does not replay A's result.
    b = _run(_cpu_script(scale, int(rng.integers(1 << 30)), patched=True), tmp_path)
    times = [json.loads(p.stdout.strip().splitlines()[-1])["first_call_s"] for p in (a, b)]
    print(f"first call: compiling {times[0]:.3f} s, from the cache {times[1]:.3f} s")
    assert len(_entries(tmp_path, "numba-cpu")) == 1


def test_edited_numba_kernel_misses_the_cache(tmp_path, rng):
    _run(_cpu_script(2.0, int(rng.integers(1 << 30)), patched=False), tmp_path)
    # The same kernel with another constant must not reuse the stored code: with the compiler
    # refused, the call fails instead of returning 2*x + y.
    edited = _run(_cpu_script(3.0, int(rng.integers(1 << 30)), patched=True), tmp_path, check=False)
    assert edited.returncode != 0
    assert "Numba's compiler was called" in edited.stdout + edited.stderr
    _run(_cpu_script(3.0, int(rng.integers(1 << 30)), patched=False), tmp_path)
    assert len(_entries(tmp_path, "numba-cpu")) == 2


def test_damaged_numba_cache_entry_is_recompiled(tmp_path, rng):
    _run(_cpu_script(2.5, int(rng.integers(1 << 30)), patched=False), tmp_path)
    (entry,) = _entries(tmp_path, "numba-cpu")
    blob = (entry / "entry.bin").read_bytes()
    damaged = blob[:-40] + bytes(40)
    (entry / "entry.bin").write_bytes(damaged)
    _run(_cpu_script(2.5, int(rng.integers(1 << 30)), patched=False), tmp_path)  # recompiles, right result
    republished = (entry / "entry.bin").read_bytes()
    assert republished != damaged
    # ... and the republished entry serves a process that cannot compile.
    _run(_cpu_script(2.5, int(rng.integers(1 << 30)), patched=True), tmp_path)


def test_kernel_reading_a_user_module_is_not_stored(tmp_path, rng):
    # helpers.FACTOR is read through the module object: the fingerprint names the module but
    # cannot see the value, so such a kernel must stay out of the cross-process cache.
    (tmp_path / "helpers_i13b.py").write_text("FACTOR = 3.0\n")
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np, numba, jax, helpers_i13b
        import xlakern
        from xlakern._fingerprint import fingerprint_dispatcher

        @numba.njit
        def scaled(x, out):
            for i in range(out.size):
                out[i] = helpers_i13b.FACTOR * x[i]

        assert not fingerprint_dispatcher(scaled).portable
        x = np.random.default_rng({int(rng.integers(1 << 30))}).standard_normal(33)
        z = xlakern.numba_kernel(scaled, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))(x.astype(np.float32))
        np.testing.assert_allclose(np.asarray(z), 3.0 * x, rtol=1e-6)
    """)
    _run(script, tmp_path / "cache")
    assert _entries(tmp_path / "cache", "numba-cpu") == []


def test_parallel_kernel_is_compiled_in_each_process_not_stored(tmp_path, rng):
    # Reloading a cfunc that calls a parfor kernel from object code crashes (Numba's own
    # cfunc cache=True does too), so parallel kernels stay out of the cross-process cache.
    script = textwrap.dedent(f"""
        import numpy as np, numba, jax
        import xlakern

        @numba.njit(parallel=True)
        def affine(x, out):
            for i in numba.prange(out.size):
                out[i] = x[i] * -3.0 + 7.0

        x = np.random.default_rng({int(rng.integers(1 << 30))}).standard_normal(64).astype(np.float32)
        z = xlakern.numba_kernel(affine, outs=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        np.testing.assert_allclose(np.asarray(z), x.astype(np.float64) * -3.0 + 7.0, rtol=1e-6, atol=1e-6)
    """)
    for _ in range(2):
        _run(script, tmp_path)
    assert _entries(tmp_path, "numba-cpu") == []


def test_slow_numba_compile_shows_a_progress_line(tmp_path, rng):
    show_now = ("import functools, xlakern._numba_cpu as m\n"
                "m.Progress = functools.partial(m.Progress, delay=0.0)\n")
    script = _cpu_script(1.5, int(rng.integers(1 << 30)), patched=False).replace("import xlakern\n",
                                                                                  "import xlakern\n" + show_now)
    shown = _run(script, tmp_path / "a", quiet=False)
    assert "compiling numba kernel axpy" in shown.stderr
    hushed = _run(script, tmp_path / "b", quiet=True)
    assert "compiling numba kernel" not in hushed.stderr


PTX_SCRIPT = textwrap.dedent("""
    import sys
    {patch}
    import numba
    from numba import cuda
    import xlakern._numba_cuda as nc
    from xlakern._fingerprint import fingerprint_dispatcher

    @cuda.jit
    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a[0] * x[i] + y[i] + {offset}

    img = nc.cached_kernel_image(saxpy, fingerprint_dispatcher(saxpy), ("float32",) * 4, (1, 1, 1, 1),
                                 (8, 0), prefer="ptx")
    sys.stdout.buffer.write(img.kind.encode() + b"|" + img.entry.encode() + b"|" + img.data)
""")


def test_numba_cuda_kernel_image_is_cached_across_processes(tmp_path):
    pytest.importorskip("numba.cuda")
    a = subprocess.run([sys.executable, "-c", PTX_SCRIPT.format(patch="", offset=1.0)], capture_output=True,
                       env=dict(os.environ, XLAKERN_CACHE_DIR=str(tmp_path)), timeout=300)
    if a.returncode != 0:
        pytest.skip(f"numba-cuda cannot generate PTX here: {a.stderr.decode()[-400:]}")
    kind, entry, data = a.stdout.split(b"|", 2)
    assert kind == b"ptx" and b".entry " + entry in data
    assert len(_entries(tmp_path, "numba-cuda")) == 1
    patched = PATCH_COMPILERS + "\n_assert_patched()\n"
    b = subprocess.run([sys.executable, "-c", PTX_SCRIPT.format(patch=patched, offset=1.0)], capture_output=True,
                       env=dict(os.environ, XLAKERN_CACHE_DIR=str(tmp_path)), timeout=300)
    assert b.returncode == 0, b.stderr.decode()
    assert b.stdout == a.stdout
    edited = subprocess.run([sys.executable, "-c", PTX_SCRIPT.format(patch=patched, offset=2.0)],
                            capture_output=True, env=dict(os.environ, XLAKERN_CACHE_DIR=str(tmp_path)), timeout=300)
    assert edited.returncode != 0 and b"Numba's compiler was called" in edited.stderr


GPU_SCRIPT = textwrap.dedent("""
    import numpy as np
    {patch}
    import jax, jax.numpy as jnp
    from numba import cuda
    import xlakern

    @cuda.jit
    def saxpy(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = 2.5 * x[i] + y[i]

    rng = np.random.default_rng({seed})
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    f = xlakern.numba_cuda_kernel(saxpy, outs=jax.ShapeDtypeStruct(x.shape, x.dtype), launch_dims=x.size)
    gpu = jax.devices("gpu")[0]
    z = jax.jit(f)(jax.device_put(x, gpu), jax.device_put(y, gpu))
    np.testing.assert_allclose(np.asarray(z), 2.5 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-6)
""")


@pytest.mark.gpu
def test_fresh_process_launches_a_cached_numba_cuda_kernel_without_the_compiler(tmp_path, rng):
    env = dict(os.environ, XLAKERN_CACHE_DIR=str(tmp_path))
    for patch in ("", PATCH_COMPILERS + "\n_assert_patched()\n"):
        out = subprocess.run([sys.executable, "-c", GPU_SCRIPT.format(patch=patch, seed=int(rng.integers(1 << 30)))],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    assert len(_entries(tmp_path, "numba-cuda")) == 1
