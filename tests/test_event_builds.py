"""The event kernels are built once per combination of operand dtypes (``operand_module``): a product
compiles only the kernels of the dtypes it sees, each build refuses the others with an error that says
so, and ``XLAKERN_EVENT_BUILDS=all`` takes one build of every combination instead."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlakern
from conftest import x64
from xlakern.event import _jitc_kernels as JK
from xlakern.event import _kernels as K


def random_csr(rng, rows, cols, k):
    """Weights, indices and indptr of k random (sorted, possibly repeated) columns a row."""
    idx = np.sort(rng.integers(0, cols, (rows, k)), axis=1).astype(np.int32).reshape(-1)
    indptr = (np.arange(rows + 1) * k).astype(np.int32)
    return rng.standard_normal(rows * k), idx, indptr


def dense_of(w, idx, rows, cols, dtype):
    """The matrix of weights w rounded to dtype, in float64 (repeated columns summed)."""
    dense = np.zeros((rows, cols))
    k = idx.size // rows
    np.add.at(dense, (np.repeat(np.arange(rows), k), idx), np.asarray(w, dtype).astype(np.float64))
    return dense


def direct_scatter(mod, w, idx, indptr, spikes, rows, cols, acc):
    """mod.event_sparse as the CPU primitive calls it: s @ CSR (transpose), fixed count off."""
    return mod.event_sparse(jnp.asarray(w), jnp.asarray(idx), jnp.asarray(indptr), jnp.asarray(spikes),
                            outs=jax.ShapeDtypeStruct((cols,), acc), nrows=rows, ncols=cols, nconn=-1, transpose=True,
                            binary=True)


def test_a_product_builds_only_the_combination_it_sees(tmp_path):
    """A fresh process with an empty cache: bool spikes times float32 and float64 CSRs build exactly two
    event modules, named by their combinations, and both products match NumPy in float64."""
    script = textwrap.dedent("""
        import json, os, sys
        import numpy as np, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)
        import xlakern as be
        rng = np.random.default_rng(int(sys.argv[1]))
        rows, cols, k = 300, 200, 7
        idx = np.sort(rng.integers(0, cols, (rows, k)), axis=1).astype(np.int32).reshape(-1)
        indptr = (np.arange(rows + 1) * k).astype(np.int32)
        w = rng.standard_normal(rows * k)
        s = rng.random(rows) < 0.3
        errs = {}
        for dt in ("float32", "float64"):
            csr = be.CSR((jnp.asarray(w, dt), jnp.asarray(idx), jnp.asarray(indptr)), shape=(rows, cols))
            got = np.asarray(jax.jit(lambda s: be.BinaryArray(s) @ csr)(jnp.asarray(s)), np.float64)
            dense = np.zeros((rows, cols))
            np.add.at(dense, (np.repeat(np.arange(rows), k), idx), w.astype(dt).astype(np.float64))
            want = s.astype(np.float64) @ dense
            errs[dt] = float(np.max(np.abs(got - want)))
        mods = sorted(n for n in os.listdir(be.get_cache_dir()) if n.startswith("xlakern_event"))
        print(json.dumps({"mods": mods, "errs": errs}))
    """)
    path = tmp_path / "first.py"
    path.write_text(script)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLAKERN_CACHE_DIR=str(tmp_path / "cache"), XLAKERN_QUIET="1")
    env.pop("XLAKERN_EVENT_BUILDS", None)
    seed = int(np.random.SeedSequence().entropy % 2**31)
    res = subprocess.run([sys.executable, str(path), str(seed)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["mods"] == ["xlakern_event_cpu_float32_int32_b1", "xlakern_event_cpu_float64_int32_b1"], out
    assert out["errs"]["float64"] < 1e-12 and out["errs"]["float32"] < 1e-4, (seed, out)


def test_a_build_refuses_the_dtypes_it_leaves_out(on_cpu, rng):
    """Called directly (only an FFI call can bring another dtype), the float32/int32/bool build serves its
    own operands and raises a KernelError naming what it leaves out, for weights, indices and spikes."""
    rows, cols = 120, 90
    w, idx, indptr = random_csr(rng, rows, cols, 5)
    s = rng.random(rows) < 0.4
    mod = K.cpu_module("float32", "int32", "bool", True)
    assert mod.name == "xlakern_event_cpu_float32_int32_b1"
    got = np.asarray(direct_scatter(mod, w.astype(np.float32), idx, indptr, s, rows, cols, jnp.float32))
    np.testing.assert_allclose(got, s.astype(np.float64) @ dense_of(w, idx, rows, cols, np.float32), atol=1e-4)
    with pytest.raises(xlakern.KernelError, match="leaves out weights float16"):
        jax.block_until_ready(direct_scatter(mod, w.astype(jnp.float16), idx, indptr, s, rows, cols, jnp.float32))
    with x64(), pytest.raises(xlakern.KernelError, match="leaves out indices int64"):
        jax.block_until_ready(direct_scatter(mod, w.astype(np.float32), idx.astype(np.int64), indptr.astype(np.int64),
                                             s, rows, cols, jnp.float32))
    with pytest.raises(xlakern.KernelError, match="leaves out binary spikes int32"):
        jax.block_until_ready(direct_scatter(mod, w.astype(np.float32), idx, indptr, s.astype(np.int32), rows, cols,
                                             jnp.float32))


def test_jitc_builds_serve_their_spikes_and_refuse_others(on_cpu, rng):
    """The JITC build of float32 parameters and float spikes multiplies by the matrix ``jits`` materialises
    (NumPy, float64); the bool-spike build raises on float spikes, naming them."""
    mod = JK.cpu_module("float32", None, "float32", False)
    assert mod.name == "xlakern_jitc_cpu_float32_int32_f"
    other = JK.cpu_module("float32", None, "bool", True)
    assert other is not mod and other.name == "xlakern_jitc_cpu_float32_int32_b1"
    table = jnp.asarray(JK.skip_table(0.1))
    args = (jnp.asarray([0.5, 0.0], jnp.float32), jnp.asarray([3], jnp.uint32), table, jnp.zeros((1,), jnp.float32))
    v = rng.standard_normal(40).astype(np.float32)
    got = mod.jitc_mv(*args, jnp.asarray(v), outs=jax.ShapeDtypeStruct((30,), jnp.float32), grows=30, gcols=40,
                      kind=0, transpose=False, binary=False)
    m = np.asarray(xlakern.jits(0.5, 0.1, 3, shape=(30, 40)), np.float64)
    assert np.count_nonzero(m) > 0
    np.testing.assert_allclose(np.asarray(got, np.float64), m @ v.astype(np.float64), atol=1e-5)
    with pytest.raises(xlakern.KernelError, match="leaves out float spikes float32"):
        jax.block_until_ready(other.jitc_mv(*args, jnp.ones((40,), jnp.float32),
                                            outs=jax.ShapeDtypeStruct((30,), jnp.float32), grows=30, gcols=40, kind=0,
                                            transpose=False, binary=False))


def test_synapse_kernels_build_per_combination(on_cpu, rng):
    """The per-synapse CSR kernels (the weight gradient, dt2t at the row, each slot's row) are built per
    combination too. The gradient of a float32/int32 product builds and uses the float32/int32 module, which
    also gives int64 rows for an int32 indptr (the rows' dtype is the caller's), and refuses int64 indices."""
    rows, cols, k = 260, 190, 6
    w, idx, indptr = random_csr(rng, rows, cols, k)
    s = rng.random(rows) < 0.3
    csr = xlakern.CSR((jnp.asarray(w, jnp.float32), jnp.asarray(idx), jnp.asarray(indptr)), shape=(rows, cols))
    g = jax.jit(jax.grad(lambda data, s: (xlakern.BinaryArray(s) @ csr.with_data(data)).sum()))
    got = np.asarray(g(jnp.asarray(w, jnp.float32), jnp.asarray(s)), np.float64)
    np.testing.assert_array_equal(got, np.repeat(s.astype(np.float64), k))  # d/dw_p of sum(s @ W): s of p's row
    mod = K.synapse_cpu_module("float32", "int32")
    assert mod.name == "xlakern_csr_synapse_cpu_float32_int32_b1"
    assert mod.name in os.listdir(xlakern.get_cache_dir())
    with x64():
        got_rows = mod.csr_slot_rows(jnp.asarray(indptr), outs=jax.ShapeDtypeStruct((rows * k,), jnp.int64))
        assert got_rows.dtype == jnp.int64
        np.testing.assert_array_equal(np.asarray(got_rows), np.repeat(np.arange(rows), k))
        with pytest.raises(xlakern.KernelError, match="leaves out indices int64"):
            jax.block_until_ready(mod.csr_slot_rows(jnp.asarray(indptr, jnp.int64),
                                                    outs=jax.ShapeDtypeStruct((rows * k,), jnp.int64)))


def test_one_build_of_every_dtype_on_request(on_cpu, rng, monkeypatch):
    """XLAKERN_EVENT_BUILDS=all: the loader gives the one build of every combination, which serves float16
    and float64 weights, int64 indices and int8 spikes alike (checked against NumPy in float64)."""
    monkeypatch.setenv("XLAKERN_EVENT_BUILDS", "all")
    mod = K.cpu_module("float16", "int64", "int8", True)
    assert mod.name == "xlakern_event_cpu" and K.cpu_module() is mod
    rows, cols = 150, 110
    w, idx, indptr = random_csr(rng, rows, cols, 6)
    s = (rng.random(rows) < 0.3).astype(np.int8)
    for wdt, idt, acc in ((jnp.float16, np.int64, jnp.float32), (np.float64, np.int32, jnp.float64)):
        with x64() if acc == jnp.float64 else contextlib.nullcontext():
            got = np.asarray(direct_scatter(mod, jnp.asarray(w, wdt), idx.astype(idt), indptr.astype(idt), s, rows,
                                            cols, acc), np.float64)
        want = s.astype(np.float64) @ dense_of(w, idx, rows, cols, wdt)
        np.testing.assert_allclose(got, want, atol=1e-5 if wdt == jnp.float16 else 1e-12)


def test_an_unknown_builds_setting_is_a_config_error(monkeypatch):
    monkeypatch.setenv("XLAKERN_EVENT_BUILDS", "every")
    with pytest.raises(xlakern.ConfigError, match="XLAKERN_EVENT_BUILDS='every'.*'each'.*'all'"):
        K.cpu_module()


@pytest.mark.gpu
def test_cuda_builds_per_combination_and_on_request(rng, monkeypatch):
    """On the GPU: the default build of a combination serves its operands and refuses float64 weights;
    XLAKERN_EVENT_BUILDS=all serves float16 weights with int64 indices, both against NumPy in float64."""
    rows, cols = 3000, 2500
    w, idx, indptr = random_csr(rng, rows, cols, 40)
    s = rng.random(rows) < 0.05
    mod = K.cuda_module("float32", "int32", "bool", True)
    assert mod.name == "xlakern_event_cuda_float32_int32_b1"
    product, _ = mod.event_sparse(jnp.asarray(w, jnp.float32), jnp.asarray(idx), jnp.asarray(indptr), jnp.asarray(s),
                                  outs=[jax.ShapeDtypeStruct((cols,), jnp.float32), K.bits_scratch(jnp.asarray(s), cols,
                                                                                                   True, True)],
                                  nrows=rows, ncols=cols, nconn=-1, transpose=True, binary=True, deterministic=False)
    want = s.astype(np.float64) @ dense_of(w, idx, rows, cols, np.float32)
    np.testing.assert_allclose(np.asarray(product, np.float64), want, atol=1e-4)
    # (a GPU entry point's error arrives as KernelError if XLA reports it during the call, else as jax's
    # JaxRuntimeError, as in test_cuda.py)
    with x64():
        with pytest.raises((xlakern.KernelError, jax.errors.JaxRuntimeError), match="leaves out weights float64"):
            jax.block_until_ready(mod.event_sparse(
                jnp.asarray(w, jnp.float64), jnp.asarray(idx), jnp.asarray(indptr), jnp.asarray(s),
                outs=[jax.ShapeDtypeStruct((cols,), jnp.float64), jax.ShapeDtypeStruct((1,), jnp.uint32)],
                nrows=rows, ncols=cols, nconn=-1, transpose=True, binary=True, deterministic=False))
    monkeypatch.setenv("XLAKERN_EVENT_BUILDS", "all")
    every = K.cuda_module("float16", "int64", "bool", True)
    assert every.name == "xlakern_event_cuda"
    product, _ = every.event_sparse(jnp.asarray(w, jnp.float16), jnp.asarray(idx, np.int64),
                                    jnp.asarray(indptr, np.int64), jnp.asarray(s),
                                    outs=[jax.ShapeDtypeStruct((cols,), jnp.float32),
                                          jax.ShapeDtypeStruct((1,), jnp.uint32)],
                                    nrows=rows, ncols=cols, nconn=-1, transpose=True, binary=True, deterministic=False)
    want = s.astype(np.float64) @ dense_of(w, idx, rows, cols, np.float16)
    np.testing.assert_allclose(np.asarray(product, np.float64), want, atol=1e-4)
