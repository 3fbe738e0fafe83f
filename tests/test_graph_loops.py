"""Whole jitted loops as CUDA graphs: ``xlakern.config.enable_cuda_graph_loops()`` (issue 11).

XLA reads its flags when the backend starts, so every test here runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(__file__)


def _run(script: str, env_extra: dict | None = None, timeout: int = 400) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({"XLAKERN_QUIET": "1", **(env_extra or {})})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                         text=True, timeout=timeout, cwd=HERE)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def test_flags_are_set_before_the_backend_and_refused_after():
    out = _run("""
        import os, xlakern
        xlakern.config.enable_cuda_graph_loops()
        flags = os.environ["XLA_FLAGS"].split()
        # the user's unrelated flag survives; a conflicting one is replaced, not duplicated
        assert "--xla_dump_hlo_as_text" in flags, flags
        assert flags.count("--xla_gpu_graph_min_graph_size=1") == 1, flags
        assert not any(f.startswith("--xla_gpu_graph_min_graph_size=7") for f in flags), flags
        assert set(xlakern.config.cuda_graph_loop_flags().split()) <= set(flags)
        xlakern.config.enable_cuda_graph_loops()            # idempotent before the backend starts
        assert os.environ["XLA_FLAGS"].split() == flags
        import jax
        jax.devices()
        try:
            xlakern.config.enable_cuda_graph_loops()
        except xlakern.ConfigError as e:
            assert "before JAX starts its backends" in str(e) and "XLA_FLAGS=" in str(e), e
            print("refused")
    """, {"XLA_FLAGS": "--xla_dump_hlo_as_text --xla_gpu_graph_min_graph_size=7"})
    assert out.strip().splitlines()[-1] == "refused"


GRAPH_CHILD = r"""
import numpy as np
import xlakern
xlakern.config.enable_cuda_graph_loops()
import jax, jax.numpy as jnp
from numba import cuda

rng = np.random.default_rng()
N, STEPS = 4096, 500
A = np.float32(0.95)

@cuda.jit
def decay(v, x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = v[i] * 0.95 + x[i]

mod = xlakern.load_cuda_inline("graph_loop_scale", r'''
#include <cuda_runtime.h>
__global__ void k(const float* v, float s, float* o, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) o[i] = v[i] * s;
}
// @xk scale arg ret attr.s:float32 stream
void scale(const xk::Tensor v, xk::Tensor o, float s, int64_t stream) {
  int64_t n = v.numel();
  if (n) k<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(v.data<float>(), s, o.data<float>(), n);
}''')

sds = jax.ShapeDtypeStruct((N,), jnp.float32)
nb = xlakern.numba_cuda_kernel(decay, outs=sds, launch_dims=N, input_output_aliases={0: 0})

def step(v, x):
    v = nb(v, x)                                               # Numba CUDA kernel, aliased carry
    v = mod.scale(v, outs=sds, s=1.01, input_output_aliases={0: 0})   # CUDA C++ kernel
    return jnp.minimum(v, 50.0)                                # jnp glue

loops = {
    "fori": jax.jit(lambda v, x: jax.lax.fori_loop(0, STEPS, lambda i, v: step(v, x), v)),
    "scan": jax.jit(lambda v, x: jax.lax.scan(lambda v, _: (step(v, x), None), v, None, length=STEPS)[0]),
    "while": jax.jit(lambda v, x, n: jax.lax.while_loop(
        lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1], x)), (jnp.int32(0), v))[1]),
}

def reference(v, x):
    v = v.astype(np.float64); x = x.astype(np.float64)
    for _ in range(STEPS):
        v = np.minimum((v * 0.95 + x) * 1.01, 50.0)
    return v

for name, f in loops.items():
    args = lambda v, x: (v, x, jnp.int32(STEPS)) if name == "while" else (v, x)
    # XLA runs a command buffer's first execution eagerly and captures on a later one.
    for _ in range(3):
        v0 = rng.uniform(-1, 1, N).astype(np.float32); x0 = rng.uniform(0, 1, N).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(*args(jnp.asarray(v0), jnp.asarray(x0)))), reference(v0, x0),
                                   rtol=2e-4, atol=1e-5)
    xlakern._runtime.enable_launch_probe(True)
    for rep in range(4):
        v0 = rng.uniform(-1, 1, N).astype(np.float32); x0 = rng.uniform(0, 1, N).astype(np.float32)
        got = f(*args(jnp.asarray(v0), jnp.asarray(x0)))
        np.testing.assert_allclose(np.asarray(got), reference(v0, x0), rtol=2e-4, atol=1e-5)
    executions, captured = xlakern._runtime.launch_probe()
    xlakern._runtime.enable_launch_probe(False)
    # 4 runs x 500 steps launched the Numba kernel 2,000 times on the device; the host-side
    # handler ran at most once per run, and only while XLA was capturing: the loop is a graph.
    print(name, executions, captured, flush=True)
    assert executions <= 4 and captured == executions, (name, executions, captured)
print("OK")
"""


@pytest.mark.gpu
def test_whole_loops_run_as_cuda_graphs():
    out = _run(GRAPH_CHILD)
    assert out.strip().splitlines()[-1] == "OK", out


CHUNK_CHILD = r"""
import os
import numpy as np
import xlakern
xlakern.config.enable_cuda_graph_loops()
import jax, jax.numpy as jnp

rng = np.random.default_rng()
N, K, STEPS, CHUNKS = 3000, 24, 60, 5
indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 2 * K, N))]).astype(np.int32)
indices = rng.integers(0, N, indptr[-1]).astype(np.int32)
data = rng.standard_normal(indptr[-1]).astype(np.float32)
W = xlakern.CSR((jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr)), shape=(N, N))
dense = np.zeros((N, N)); np.add.at(dense, (np.repeat(np.arange(N), np.diff(indptr)), indices), data)
salt = np.uint32(rng.integers(1, 2**31))

def spikes(t, xp):  # about 5% of neurons a step, from a hash of (neuron, step): the same in NumPy and jnp
    step = xp.full((N,), t, dtype=xp.uint32) + xp.uint32(salt)
    x = xp.arange(N, dtype=xp.uint32) * xp.uint32(0x9E3779B1) + step * xp.uint32(0x85EBCA77)
    x = (x ^ (x >> 16)) * xp.uint32(0x7FEB352D)
    return (x ^ (x >> 15)) < xp.uint32(int(0.05 * 2**32))

scale = xlakern.load_cuda_inline("graph_chunk_decay", r'''
#include <cuda_runtime.h>
__global__ void k(const float* v, const float* i, float* o, int64_t n) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) o[j] = v[j] * 0.9f + i[j];
}
// @xk decay arg arg ret stream
void decay(const xk::Tensor v, const xk::Tensor i, xk::Tensor o, int64_t stream) {
  int64_t n = v.numel();
  if (n) k<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(v.data<float>(), i.data<float>(), o.data<float>(), n);
}''')
sds = jax.ShapeDtypeStruct((N,), jnp.float32)

BOUNDS = os.environ["XK_CHUNK_BOUNDS"]

def step(t, v):
    s = spikes(t, jnp)
    current = xlakern.BinaryArray(s) @ W + W @ xlakern.BinaryArray(s)     # scatter and gather
    return scale.decay(v, current, outs=sds, input_output_aliases={0: 0})

def run(state, W):
    v, t0 = state
    if BOUNDS == "traced":   # bounds from the state: a loop with a device-side condition
        return jax.lax.fori_loop(t0, t0 + STEPS, step, v), t0 + STEPS
    # static bounds, the offset carried: a known trip count, which XLA unrolls into one graph
    return jax.lax.fori_loop(0, STEPS, lambda k, v: step(t0 + k, v), v), t0 + STEPS

def reference(v, t0):
    for t in range(t0, t0 + STEPS):
        s = spikes(t, np).astype(np.float64)
        v = v * 0.9 + s @ dense + dense @ s
    return v

hlo = jax.jit(run).lower((jnp.zeros(N, jnp.float32), jnp.int32(0)), W).compile().as_text()
assert (f'"known_trip_count":{{"n":"{STEPS}"}}' in hlo) == (BOUNDS == "static"), "not the loop this test is about"

for mode in ("donated", "chained", "held"):
    f = jax.jit(run, donate_argnums=(0,) if mode == "donated" else ())
    v_ref = rng.uniform(-1, 1, N)
    state = (jnp.asarray(v_ref, jnp.float32), jnp.int32(0))
    start, kept = state, []
    first_chunk = reference(v_ref, 0)
    for c in range(CHUNKS):
        v_ref = reference(v_ref, c * STEPS)
        given = state
        state = f(start if mode == "held" else state, W)
        kept.append(state)            # held: every result stays alive, so each call's output moves
        if mode == "donated":
            assert given[0].is_deleted(), "the donated state was not consumed"
        if mode == "held":
            np.testing.assert_allclose(np.asarray(state[0]), first_chunk, rtol=1e-4, atol=1e-3)
        else:
            assert int(state[1]) == (c + 1) * STEPS
            np.testing.assert_allclose(np.asarray(state[0]), v_ref, rtol=1e-4, atol=1e-3)
    print(mode, "ok", flush=True)
print("OK")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("bounds", ["traced", "static"])
def test_chunked_graph_loops_with_moving_and_donated_state(bounds):
    # A long simulation runs as chunks, state = run(state). The recorded graph is replayed with its
    # buffers moved (chained, held) or in place (donated): every chunk must match NumPy in float64.
    # Traced bounds (from the state) keep a graph with a device-side loop condition; static bounds with
    # the offset carried give a known trip count, and XLA unrolls the loop into one graph, whose every
    # node it updates when the buffers move (the regime of bench_event's loops). The child checks which.
    out = _run(CHUNK_CHILD, {"XK_CHUNK_BOUNDS": bounds})
    assert out.strip().splitlines()[-1] == "OK", out
