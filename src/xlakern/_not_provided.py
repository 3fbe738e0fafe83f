"""BrainEvent 0.3 names that xlakern does not provide, each with the reason and what to use instead.

``xlakern.<name>`` for one of these raises :class:`xlakern.NotProvidedError` (an AttributeError, so
``hasattr`` stays False) with that text, rather than a bare "no attribute". Every other public name
of BrainEvent 0.3.0 is provided (``tests/data/brainevent_0_3_0_all.txt`` lists them;
``tests/test_brainevent_api.py`` checks both). The names BrainEvent retired in 0.1 (``RETIRED``) raise
the same error, with what replaces them.
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
}

# Names BrainEvent itself retired in 0.1 (BrainEvent 0.3 answers them with an AttributeError that says
# what replaced them): code written for BrainEvent 0.0.x gets the same kind of answer here, pointing at
# xlakern's replacement.
_COO = ("the COO format, which BrainEvent retired in 0.1. Store the synapses as xlakern.CSR or xlakern.CSC: "
        "xlakern.coo2csr (or the *_index converters, such as coo_to_csc_index) turns COO indices into "
        "either, and their products and plasticity updates replace the COO ones")
_FCN_KERNELS = ("one of the bit-packed / compact fixed-count kernels BrainEvent folded into fcnmv / fcnmm "
                "in 0.1. Wrap the spikes in xlakern.BitPackedBinary or xlakern.CompactBinary and call "
                "xlakern.binary_fcnmv / binary_fcnmm (or multiply with @): the event type picks the kernel")
_FCN_LAYOUT = ("a fixed-count layout object BrainEvent retired in 0.1. Use xlakern.FixedNumPerPre or "
               "xlakern.FixedNumPerPost: their products pick the kernel for each orientation themselves")
RETIRED: dict[str, str] = {
    **{name: _COO for name in (
        "COO", "binary_coomv", "binary_coomv_p", "binary_coomm", "binary_coomm_p", "coomv", "coomv_p", "coomm",
        "coomm_p", "update_coo_on_binary_pre", "update_coo_on_binary_post", "update_coo_on_binary_pre_p",
        "update_coo_on_binary_post_p")},
    **{f"{kind}_binary_fcn{op}{p}": _FCN_KERNELS
       for kind in ("bitpack", "compact") for op in ("mv", "mm") for p in ("", "_p")},
    "EllLayout": _FCN_LAYOUT,
    "CscLayout": _FCN_LAYOUT,
}


def message(name: str, module: str) -> str:
    return f"{module}.{name} is not provided: it is {REASONS.get(name) or RETIRED[name]}."
