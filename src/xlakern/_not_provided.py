"""BrainEvent 0.3 names that xlakern does not provide, each with the reason and what to use instead.

``xlakern.<name>`` for one of these raises :class:`xlakern.NotProvidedError` (an AttributeError, so
``hasattr`` stays False) with that text, rather than a bare "no attribute". Every other public name
of BrainEvent 0.3.0 is provided (``tests/data/brainevent_0_3_0_all.txt`` lists them;
``tests/test_brainevent_api.py`` checks both).
"""

from __future__ import annotations

_BACKENDS = ("BrainEvent's pluggable compiler back ends. xlakern's loaders find g++/clang++ and nvcc "
             "themselves: choose them with CXX and XLAKERN_NVCC (or CUDA_HOME)")
_PALLAS = ("BrainEvent's random number generators for its Pallas kernels. xlakern has no Pallas kernels: "
           "draw random numbers with jax.random, or inside a kernel with your own generator")
_BENCH = ("BrainEvent's benchmark harness for primitives. xlakern keeps its timings in bench/ scripts; time a "
          "jitted call yourself (jax.block_until_ready around time.perf_counter)")
_HYBRID = ("the tuning of BrainEvent's hybrid CSR kernels. xlakern's CSR kernels choose their launch from the "
           "matrix and need no tuning or workspace: drop the call")

REASONS: dict[str, str] = {
    "CompilerBackend": _BACKENDS,
    "CUDABackend": _BACKENDS,
    "CPPBackend": _BACKENDS,
    "HIPBackend": _BACKENDS + "; xlakern builds no HIP (ROCm) kernels",
    "PallasLFSR88RNG": _PALLAS,
    "PallasLFSR113RNG": _PALLAS,
    "PallasLFSR128RNG": _PALLAS,
    "PallasLFSRRNG": _PALLAS,
    "get_pallas_lfsr_rng_class": _PALLAS,
    "BenchmarkConfig": _BENCH,
    "BenchmarkRecord": _BENCH,
    "BenchmarkResult": _BENCH,
    "benchmark_function": _BENCH,
    "HybridConfig": _HYBRID,
    "get_hybrid_config": _HYBRID,
    "init_csr_config": _HYBRID,
    "TCSR": ("BrainEvent's tiled CSR storage. Use xlakern.CSR (CSR.fromdense, or CSR((data, indices, indptr), "
             "shape=...)): the same matrix and the same products, with no tiling needed by xlakern's kernels"),
    "csr_apply_on_pre": ("BrainEvent's user-defined plasticity rules on CSR. For trace-based STDP use "
                         "update_csr_on_binary_pre, which touches only the rows of spiking neurons"),
    "csr_apply_on_post": ("BrainEvent's user-defined plasticity rules on CSR. For trace-based STDP use "
                          "update_csr_on_binary_post, which touches only the columns of spiking neurons"),
}


def message(name: str, module: str) -> str:
    return f"{module}.{name} is not provided: it is {REASONS[name]}."
