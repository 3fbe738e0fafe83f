"""jax.export of programs that call xlakern's kernels (xlakern.export), run in a fresh process
(xlakern.deserialize / prepare_exported): event operators, a module of the user's and a Numba kernel."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import xlakern
from conftest import gpu_available

try:
    xlakern._toolchain.find_nvcc()
    HAVE_NVCC = True
except xlakern.ToolchainError:
    HAVE_NVCC = False

pytest.importorskip("flatbuffers", reason="jax.export's serialization needs flatbuffers (make test installs it)")

SCALE_SRC = r"""
// @xk scale arg ret attr.a:float32
void scale(const xk::Tensor v, xk::Tensor out, float a) {
  const float* pv = v.data<float>(); float* po = out.data<float>();
  for (int64_t i = 0; i < v.numel(); ++i) po[i] = pv[i] * a;
}
"""
SCALE_CUDA_SRC = r"""
__global__ void scale_kernel(const float* v, float* out, float a, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = v[i] * a;
}
// @xk scale arg ret attr.a:float32 stream
void scale(const xk::Tensor v, xk::Tensor out, float a, int64_t stream) {
  const int64_t n = v.numel();
  if (n > 0) scale_kernel<<<unsigned((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(v.data<float>(), out.data<float>(), a, n);
  XK_CHECK_LAUNCH();
}
"""

# The child: optionally loads the user's module again, prepares the program and calls it on the saved inputs.
CHILD = r"""
import pickle, sys
import numpy as np, jax, xlakern
blob_path, io_path, out_path, load_ops = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
if load_ops:  # the user's module, with the call that built it in the exporting process
    {load}({name!r}, {source!r})
try:
    exp = xlakern.deserialize(open(blob_path, "rb").read())
except xlakern.RegistrationError as e:
    print("RegistrationError:", e)
    sys.exit(3)
args = pickle.load(open(io_path, "rb"))
out = exp.call(*args)
np.savez(out_path, *[np.asarray(o) for o in jax.tree_util.tree_leaves(out)])
"""


def _network_inputs(rng, n: int, k: int):
    idx = rng.integers(0, n, size=n * k).astype(np.int32)
    idx[:k] = 0  # a row into one column: its weights add
    ptr = np.arange(0, n * k + 1, k, dtype=np.int32)
    ptr[3:6] = ptr[3]  # empty rows 3 and 4
    ptr[6:] -= 2 * k
    idx, w = idx[:ptr[-1]], rng.uniform(0.1, 1.0, ptr[-1]).astype(np.float32)
    spikes = rng.random(n) < 0.3
    trace = rng.uniform(-0.2, 0.2, n).astype(np.float32)
    return w, idx, ptr, spikes, trace


def _user_module(platform: str):
    """(loader's name, source) of the user's module for ``platform``."""
    return ("load_cuda_inline", SCALE_CUDA_SRC) if platform == "gpu" else ("load_cpp_inline", SCALE_SRC)


def _program(n: int, idx, ptr, fcn_idx, platform: str):
    """One step of a small network: both orientations of a CSR product, a fixed-count product, a JITC
    product, a plasticity update, then the user's module scales the currents."""
    load, source = _user_module(platform)
    ops = getattr(xlakern, load)(f"export_ops_{platform}", source)
    jitc = xlakern.JITCScalarR((0.5, 0.1, 1234), shape=(n, n))

    def step(w, fcn_w, spikes, trace):
        csr = xlakern.CSR((w, jnp.asarray(idx), jnp.asarray(ptr)), shape=(n, n))
        fcn = xlakern.FixedNumPerPre((fcn_w, jnp.asarray(fcn_idx)), shape=(n, n))
        s = xlakern.BinaryArray(spikes)
        currents = s @ csr + csr @ s + s @ fcn + s @ jitc
        scaled = ops.scale(currents, outs=jax.ShapeDtypeStruct(currents.shape, currents.dtype), a=np.float32(2.0))
        w2 = xlakern.update_csr_on_binary_pre(w, jnp.asarray(idx), jnp.asarray(ptr), spikes, trace, 0.0, 1.0,
                                              shape=(n, n))
        return scaled, w2

    return step, jitc


def _reference(n, w, idx, ptr, fcn_w, fcn_idx, spikes, trace, jitc_dense):
    """float64 NumPy: the dense matrices' products and the update, synapse by synapse."""
    rows = np.repeat(np.arange(n), np.diff(ptr))
    A = np.zeros((n, n))
    np.add.at(A, (rows, idx), w.astype(np.float64))
    F = np.zeros((n, n))
    np.add.at(F, (np.repeat(np.arange(n), fcn_idx.shape[1]), fcn_idx.ravel()), fcn_w.astype(np.float64).ravel())
    s = spikes.astype(np.float64)
    currents = s @ A + A @ s + s @ F + s @ jitc_dense
    w2 = w.astype(np.float64).copy()
    for p in range(len(w)):
        if spikes[rows[p]]:
            w2[p] = min(max(w2[p] + trace[idx[p]], 0.0), 1.0)
    return 2.0 * currents, w2


def _run_child(tmp_path, blob, args, *, load_ops: bool, platform: str):
    (tmp_path / "prog.bin").write_bytes(blob)
    with open(tmp_path / "args.pkl", "wb") as f:
        pickle.dump([np.asarray(a) for a in args], f)
    script = tmp_path / "child.py"
    load, source = _user_module("cpu" if platform == "cpu" else "gpu")
    script.write_text(CHILD.format(load="xlakern." + load, name=f"export_ops_{'cpu' if platform == 'cpu' else 'gpu'}",
                                   source=source))
    env = dict(os.environ, JAX_PLATFORMS=platform)
    out = tmp_path / "out.npz"
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "prog.bin"), str(tmp_path / "args.pkl"),
                          str(out), "1" if load_ops else "0"], capture_output=True, text=True, timeout=900, env=env)
    return res, (np.load(out) if out.exists() else None)


def _export_and_check(tmp_path, rng, platform: str, jax_platform: str):
    n, k = 120, 9
    w, idx, ptr, spikes, trace = _network_inputs(rng, n, k)
    fcn_idx = rng.integers(0, n, size=(n, 5)).astype(np.int32)
    fcn_w = rng.normal(size=(n, 5)).astype(np.float32)
    step, jitc = _program(n, idx, ptr, fcn_idx, platform)
    args = (w, fcn_w, spikes, trace)
    exp = xlakern.export(jax.jit(step), platforms=[jax_platform])(*args)
    targets = xlakern._exporting.custom_call_targets(exp)
    assert any(t.startswith(f"export_ops_{platform}.scale") for t in targets), targets
    assert any(t.startswith(f"xlakern_event_{'cuda' if platform == 'gpu' else 'cpu'}_") for t in targets), targets
    blob = exp.serialize()

    # without the user's module the child names it, and nothing else
    res, _ = _run_child(tmp_path, blob, args, load_ops=False, platform=jax_platform)
    assert res.returncode == 3, res.stderr[-3000:]
    assert f"export_ops_{platform}.scale" in res.stdout and f"'export_ops_{platform}'" in res.stdout, res.stdout
    assert "xlakern_event" not in res.stdout, res.stdout

    # with it, the child's result is the float64 reference
    res, got = _run_child(tmp_path, blob, args, load_ops=True, platform=jax_platform)
    assert res.returncode == 0, res.stderr[-3000:]
    with jax.default_device(jax.devices(platform)[0]):
        jitc_dense = np.asarray(jitc.todense(), np.float64)
    assert np.count_nonzero(jitc_dense) > 0
    ref_currents, ref_w = _reference(n, w, idx, ptr, fcn_w, fcn_idx, spikes, trace, jitc_dense)
    assert np.abs(ref_currents).sum() > 0 and not np.allclose(ref_w, w)
    np.testing.assert_allclose(got["arr_0"], ref_currents, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["arr_1"], ref_w, rtol=1e-6, atol=1e-6)


def test_exported_event_program_runs_in_a_fresh_process(tmp_path, rng):
    """CSR both ways, fixed count, JITC and plasticity plus a module of the user's, exported for the CPU,
    serialized, then run in a fresh process: the event kernels load there by name; the user's module,
    until loaded, is named as missing."""
    _export_and_check(tmp_path, rng, "cpu", "cpu")


@pytest.mark.gpu
def test_exported_event_program_runs_in_a_fresh_process_on_the_gpu(tmp_path, rng):
    """The same program exported for CUDA, with the user's module in CUDA C++: the child (on the GPU) loads
    the CUDA event kernels by name."""
    _export_and_check(tmp_path, rng, "gpu", "cuda")


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not installed (the CUDA half of the program is compiled here)")
def test_a_program_exported_for_cpu_and_cuda_runs_on_the_cpu(tmp_path, rng, monkeypatch):
    """One export for both platforms (CUDA kernels built for sm_90 where JAX sees no GPU) names both
    platforms' event modules; a CPU process loads only the CPU one and runs it."""
    if not gpu_available():
        monkeypatch.setenv("XLAKERN_CUDA_ARCH", "90")
    n = 60
    dense = ((rng.random((n, n)) < 0.1) * rng.uniform(0.1, 1.0, (n, n))).astype(np.float32)
    csr = xlakern.CSR.fromdense(dense)
    s = rng.random(n) < 0.3
    exp = xlakern.export(jax.jit(lambda s: xlakern.BinaryArray(s) @ csr), platforms=["cpu", "cuda"])(s)
    targets = xlakern._exporting.custom_call_targets(exp)
    assert any("xlakern_event_cpu_" in t for t in targets) and any("xlakern_event_cuda_" in t for t in targets)
    (tmp_path / "prog.bin").write_bytes(exp.serialize())
    np.save(tmp_path / "s.npy", s)
    code = ("import sys, numpy as np, xlakern\n"
            "exp = xlakern.deserialize(open(sys.argv[1], 'rb').read())\n"
            "np.save(sys.argv[3], np.asarray(exp.call(np.load(sys.argv[2]))))\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "prog.bin"), str(tmp_path / "s.npy"),
                          str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0, res.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), s.astype(np.float64) @ dense, rtol=1e-5, atol=1e-6)


def test_exported_vjp_matches_the_dense_gradient(rng):
    """serialize(vjp_order=1) exports the backward pass too (other kernels: the weight gradient's); its
    gradient in the weights and in float spikes is jnp's on the dense matrix. Exported for the CPU and
    called on CPU arrays, also in a process whose default device is a GPU (prepare_exported serves every
    platform the process has, not only the default one's)."""
    n = 70
    dense = (rng.random((n, n)) < 0.1) * rng.normal(size=(n, n))
    csr = xlakern.CSR.fromdense(dense.astype(np.float32))
    s = jnp.asarray((rng.normal(size=n) * (rng.random(n) < 0.4)).astype(np.float32))

    def loss(data, s):
        return jnp.sum(jnp.tanh(s @ csr.with_data(data)) ** 2)

    exp = xlakern.export(jax.jit(loss), platforms=["cpu"])(csr.data, s)
    back = xlakern.deserialize(exp.serialize(vjp_order=1)).vjp()
    on_cpu = jax.devices("cpu")[0]
    g_data, g_s = back.call(jax.device_put(csr.data, on_cpu), jax.device_put(s, on_cpu),
                            jax.device_put(jnp.float32(1.0), on_cpu))
    with jax.default_device(on_cpu):
        D = jnp.asarray(dense, jnp.float32)
        ref_D, ref_s = jax.grad(lambda D, s: jnp.sum(jnp.tanh(s @ D) ** 2), argnums=(0, 1))(D, s)
    rows, cols = np.nonzero(dense)  # fromdense keeps row-major order
    np.testing.assert_allclose(g_data, np.asarray(ref_D)[rows, cols], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g_s, ref_s, rtol=1e-4, atol=1e-5)
    assert np.abs(np.asarray(g_data)).sum() > 0


def test_export_leaves_other_custom_calls_to_jax(rng):
    """A custom call that is not xlakern's fails export as it does in jax.export, unless the caller's own
    disabled_checks allow it; a program with no custom call exports as before."""
    x = jnp.asarray(rng.normal(size=8).astype(np.float32))

    def foreign(x):  # lowering does not look the target up: only export's check sees it
        return jax.ffi.ffi_call("not_xlakerns_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility guarantees"):
        xlakern.export(foreign, platforms=["cpu"])(x)
    allowed = jax.export.DisabledSafetyCheck.custom_call("not_xlakerns_target")
    exp = xlakern.export(foreign, platforms=["cpu"], disabled_checks=[allowed])(x)
    assert xlakern._exporting.custom_call_targets(exp) == ["not_xlakerns_target"]
    exp = xlakern.export(jnp.sin, platforms=["cpu"])(x)
    on_cpu = jax.device_put(x, jax.devices("cpu")[0])  # where the program was exported for
    np.testing.assert_allclose(exp.call(on_cpu), np.sin(np.asarray(x)), rtol=1e-6)


def test_event_kernel_modules_load_by_name():
    """What prepare_exported asks of xlakern.event: each of its module names loads (or is refused) by name."""
    load = xlakern.event.load_kernel_module
    assert load("xlakern_lif_cpu", "cpu")  # a simulator's module, loaded its own way
    assert load("xlakern_event_cpu_float32_int64_f", "cpu")  # one combination of dtypes
    assert "xlakern_event_cpu_float32_int64_f.event_sparse" in xlakern.list_registered_targets()
    assert not load("xlakern_event_cuda_float32_int32_b1", "cpu")  # another platform's
    assert not load("xlakern_event_cpu_float32_int32_b3", "cpu")  # no such spike width
    assert not load("xlakern_not_a_kernel", "cpu")


def test_symbolic_shapes_are_refused_with_a_message():
    """jax.export's shape polymorphism reaches a kernel as a symbolic dimension: a CallError naming the call
    and the dimension (it used to be jax's InconclusiveDimensionOperation from deep inside xlakern)."""
    b, = jax.export.symbolic_shape("b")
    n = 50
    ops = xlakern.load_cpp_inline("export_symbolic", SCALE_SRC)
    csr = xlakern.CSR.fromdense(np.eye(n, dtype=np.float32))
    calls = {
        "export_symbolic.scale: input 0": lambda x: ops.scale(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                              a=np.float32(2.0)),
        "binary_csrmm: outs[0]": lambda S: xlakern.BinaryArray(S) @ csr,
    }
    args = {"export_symbolic.scale: input 0": jax.ShapeDtypeStruct((b,), jnp.float32),
            "binary_csrmm: outs[0]": jax.ShapeDtypeStruct((b, n), jnp.bool_)}
    for what, fn in calls.items():
        with pytest.raises(xlakern.CallError, match=rf"{re.escape(what)} has shape .*symbolic dimension b"):
            xlakern.export(jax.jit(fn), platforms=["cpu"])(args[what])


def test_prepare_refuses_a_program_of_another_platform(rng):
    exp = jax.export.export(jax.jit(jnp.cos), platforms=["tpu"])(jnp.ones(3))
    with pytest.raises(xlakern.PlatformError, match="exported for tpu"):
        xlakern.prepare_exported(exp)
    # one of several platforms is enough: the CPU, which every process has
    x = rng.normal(size=5).astype(np.float32)
    exp = xlakern.export(jax.jit(jnp.cos), platforms=["tpu", "cpu"])(x)
    assert xlakern.prepare_exported(exp) is exp
    on_cpu = jax.devices("cpu")[0]
    np.testing.assert_allclose(exp.call(jax.device_put(x, on_cpu)), np.cos(x), rtol=1e-6)


# The same kernel text in both processes: a Numba kernel is found by its content (bytecode, names, constants).
NUMBA_KERNEL = """
from numba import njit
@njit
def twice(x, out):
    for i in range(x.size):
        out[i] = 2.0 * x[i]
"""

NUMBA_CHILD = r"""
import sys
import numpy as np, jax, xlakern
from test_kernel_text import NUMBA_KERNEL
namespace = {}
exec(compile(NUMBA_KERNEL, "<kernel>", "exec", dont_inherit=True), namespace)
op = xlakern.numba_kernel(namespace["twice"], outs=jax.ShapeDtypeStruct((16,), np.float32))
exp = xlakern.deserialize(open(sys.argv[1], "rb").read())
x = np.load(sys.argv[2])
try:
    exp.call(x)
    print("ran before the kernel was compiled here")
except Exception as e:
    print("first:", e)
op(x)  # the kernel compiled and registered in this process
np.save(sys.argv[3], np.asarray(exp.call(x)))
"""


def test_exported_numba_kernel_runs_once_compiled_in_the_new_process(tmp_path, rng):
    """A Numba kernel's program: the bridge's target registers on prepare; the kernel itself is found by its
    content once the process has made the same numba_kernel, and the message says so until then."""
    pytest.importorskip("numba")
    namespace = {}  # compiled without this file's __future__ flags, which are part of the kernel's content
    exec(compile(NUMBA_KERNEL, "<kernel>", "exec", dont_inherit=True), namespace)
    op = xlakern.numba_kernel(namespace["twice"], outs=jax.ShapeDtypeStruct((16,), np.float32))
    x = rng.normal(size=16).astype(np.float32)
    exp = xlakern.export(lambda x: op(x), platforms=["cpu"])(x)
    (tmp_path / "prog.bin").write_bytes(exp.serialize())
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "test_kernel_text.py").write_text(f"NUMBA_KERNEL = {NUMBA_KERNEL!r}\n")
    (tmp_path / "child.py").write_text(NUMBA_CHILD)
    res = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "prog.bin"),
                          str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "first:" in res.stdout and "has not compiled" in res.stdout and "numba_kernel" in res.stdout, res.stdout
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), 2.0 * x.astype(np.float64), rtol=1e-6)
