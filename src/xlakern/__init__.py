"""xlakern: compute kernels in C++, CUDA, Numba and Warp, called from JAX through XLA's FFI.

Example::

    import jax, jax.numpy as jnp, xlakern

    mod = xlakern.load_cpp_inline("ops", '''
    // @xk add_one arg ret
    void add_one(const xk::Tensor x, xk::Tensor out) {
      const float* in = x.data<float>(); float* o = out.data<float>();
      xk::parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = in[i] + 1.0f;
      });
    }''')
    x = jnp.arange(8, dtype=jnp.float32)
    print(jax.jit(lambda x: mod.add_one(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype)))(x))

Seed code written for BrainEvent runs with ``import xlakern as brainevent``.
"""

import importlib as _importlib

from . import _not_provided

from ._version import __version__
from . import _compat  # noqa: F401  (NumPy 2.5 alias numba-cuda needs; see _compat)
from .errors import (
    BackendError,
    BenchmarkDataFnNotProvidedError,
    CacheError,
    CallError,
    CompilationError,
    ConfigError,
    CUDANotInstalledError,
    GpuArchDetectionError,
    HeaderNotFoundError,
    HostCompilerIncompatibleError,
    HostCompilerNotFoundError,
    KernelError,
    KernelExecutionError,
    KernelFallbackExhaustedError,
    KernelGenerationError,
    KernelLoadError,
    MathError,
    NotProvidedError,
    NotReproducibleWarning,
    NvccNotFoundError,
    OptionError,
    PlatformError,
    RegistrationError,
    SpecError,
    ToolchainError,
    UnsupportedArchError,
    UnsupportedOperationError,
    WarpNotInstalledError,
    WarpTypeError,
    XlakernError,
)
# BrainEvent 0.3's spellings of the same classes
from .errors import (
    BrainEventError,
    KernelCompilationError,
    KernelNotAvailableError,
    KernelRegistrationError,
    KernelToolchainError,
)
from ._cache import get_cache_dir, set_cache_dir
from ._toolchain import include_dir
from ._calling import CompiledFunction, CompiledModule
from ._loading import (
    clear_cache,
    list_registered_targets,
    load_cpp_dir,
    load_cpp_file,
    load_cpp_inline,
    load_cuda_dir,
    load_cuda_file,
    load_cuda_inline,
    register_ffi_target,
)
from . import _module  # noqa: F401  (the loaders' old home, reached as xlakern._module)
from ._diagnostics import print_diagnostics
from ._exporting import deserialize, export, prepare_exported
from ._dropin import install_as_brainevent
from ._numba_cpu import numba_kernel, numba_kernel_cache_info
from ._numba_cuda import numba_cuda_kernel, numba_cuda_launch_config
from ._python_callable import numba_cuda_callable
# Custom primitives (XLACustomKernel), backend config and Warp helpers.
from . import config
from ._primitive import KernelEntry, XLACustomKernel
from ._registry import get_all_primitive_names, get_primitives_by_tags, get_registry
from ._rules import defjvp, general_batching_rule
from ._spec import normalize_tokens
from ._warp import jaxinfo_to_warpinfo, jaxtype_to_warptype

__all__ = [
    "__version__",
    "XlakernError",
    "SpecError",
    "CompilationError",
    "ToolchainError",
    "RegistrationError",
    "KernelError",
    "CallError",
    "ConfigError",
    "CacheError",
    "OptionError",
    "PlatformError",
    "CompiledModule",
    "CompiledFunction",
    "load_cpp_inline",
    "load_cpp_file",
    "load_cpp_dir",
    "load_cuda_inline",
    "load_cuda_file",
    "load_cuda_dir",
    "list_registered_targets",
    "clear_cache",
    "get_cache_dir",
    "set_cache_dir",
    "include_dir",
    "print_diagnostics",
    "install_as_brainevent",
    "numba_kernel",
    "numba_kernel_cache_info",
    "numba_cuda_kernel",
    "numba_cuda_callable",
    "numba_cuda_launch_config",
    # Custom primitives (XLACustomKernel), backend config and Warp helpers.
    "XLACustomKernel",
    "KernelEntry",
    "BackendError",
    "KernelGenerationError",
    "config",
    "jaxtype_to_warptype",
    "jaxinfo_to_warpinfo",
    "WarpNotInstalledError",
    "WarpTypeError",
    # the rest of the error hierarchy (errors.py), and BrainEvent 0.3's names for some of its classes
    "KernelExecutionError", "KernelLoadError", "HostCompilerIncompatibleError", "NvccNotFoundError",
    "HostCompilerNotFoundError", "HeaderNotFoundError", "GpuArchDetectionError", "UnsupportedArchError",
    "CUDANotInstalledError", "KernelFallbackExhaustedError", "MathError", "UnsupportedOperationError",
    "BenchmarkDataFnNotProvidedError", "NotProvidedError", "NotReproducibleWarning",
    "BrainEventError", "KernelCompilationError", "KernelToolchainError", "KernelRegistrationError",
    "KernelNotAvailableError",
    # every XLACustomKernel by name and tag; rules for any primitive; arg_spec spelling; extra target names
    "get_registry", "get_primitives_by_tags", "get_all_primitive_names", "defjvp", "general_batching_rule",
    "normalize_tokens", "register_ffi_target",
    # jax.export of programs that call xlakern's kernels, and running them in another process
    "export", "prepare_exported", "deserialize",
]

# Event-driven operators (xlakern.event) under BrainEvent 0.3's names; the subpackage uses only
# the public API above. Imported on first use (it builds a dozen primitives: ~30 ms that plain
# `import xlakern` should not pay); renamed BrainEvent names resolve with a DeprecationWarning.
_EVENT_NAMES = (
    "EventRepresentation", "BinaryArray", "WeightedArray", "BitPackedBinary", "bitpack", "CompactBinary",
    "DataRepresentation", "CSR", "CSC", "FixedNumConn", "FixedNumPerPre", "FixedNumPerPost",
    "binary_csrmv", "binary_csrmv_p", "binary_csrmm", "binary_csrmm_p", "csrmv", "csrmv_p", "csrmm", "csrmm_p",
    "binary_fcnmv", "binary_fcnmv_p", "binary_fcnmm", "binary_fcnmm_p", "fcnmv", "fcnmv_p", "fcnmm", "fcnmm_p",
    "binary_densemv", "binary_densemv_p", "binary_densemm", "binary_densemm_p",
)
# Part 2: just-in-time connectivity (JITC), plasticity, delays.
_EVENT_NAMES += (
    "JITCScalarR", "JITCScalarC", "JITCUniformR", "JITCUniformC", "JITCNormalR", "JITCNormalC",
    "jits", "jitsmv", "jitsmm", "binary_jitsmv", "binary_jitsmm", "jitu", "jitumv", "jitumm", "binary_jitumv",
    "binary_jitumm", "jitn", "jitnmv", "jitnmm", "binary_jitnmv", "binary_jitnmm",
    "update_csr_on_binary_pre", "update_csr_on_binary_post", "update_csc_on_binary_pre", "update_csc_on_binary_post",
    "update_dense_on_binary_pre", "update_dense_on_binary_post", "update_fixed_post_conn_on_binary_pre",
    "update_fixed_pre_conn_on_binary_post", "csr_apply_on_pre", "csr_apply_on_post",
    "CSRDelayLayout", "csr_delay_deliver", "csr_delay_deliver_layout",
    # the primitives (XLACustomKernel objects) under BrainEvent's names
    "jits_p", "jitsmv_p", "jitsmm_p", "binary_jitsmv_p", "binary_jitsmm_p", "jitu_p", "jitumv_p", "jitumm_p",
    "binary_jitumv_p", "binary_jitumm_p", "jitn_p", "jitnmv_p", "jitnmm_p", "binary_jitnmv_p", "binary_jitnmm_p",
    "update_csr_on_binary_pre_p", "update_csr_on_binary_post_p", "update_dense_on_binary_pre_p",
    "update_dense_on_binary_post_p", "fcn_plasticity_row_p", "csr_delay_deliver_p", "csr_delay_deliver_layout_p",
)
# BrainEvent 0.3's per-synapse (dt2t) products, indexed CSR products, row slices and index conversions
_EVENT_NAMES += (
    "csrmv_dt2t", "cscmv_dt2t", "csrmm_dt2t", "cscmm_dt2t", "csrmv_dt2t_p", "csrmm_dt2t_p", "fcnmv_dt2t", "fcnmm_dt2t",
    "jitsmv_dt2t", "jitumv_dt2t", "jitnmv_dt2t",
    "binary_csrmv_indexed", "binary_csrmm_indexed", "binary_csrmv_indexed_p", "binary_csrmm_indexed_p",
    "csr_slice_rows", "csr_slice_rows_p", "csr_to_coo_index", "coo_to_csc_index", "csr_to_csc_index",
    "csc_to_csr_index", "coo2csr", "IndexConversionError",
    # BrainEvent 0.3's dense layout and JITC base classes; the layouts' errors
    "Dense", "JITCMatrix", "JITCScalarMatrix", "JITCUniformMatrix", "JITCNormalMatrix", "EventDependencyError",
    "EventBufferError", "EventIndexError", "EventMatmulError", "EventNDimError",
    "EventArgumentError", "EventTracedError", "EventRuleError",
)
__all__ += ["event", *_EVENT_NAMES]


def __getattr__(name):
    event = _importlib.import_module(".event", __name__)
    if name == "event":
        return event
    if name in _EVENT_NAMES:
        return getattr(event, name)
    if name in _not_provided.REASONS or name in _not_provided.RETIRED:
        raise NotProvidedError(_not_provided.message(name, __name__))
    return event.resolve_deprecated(name, vars(event), __name__)


def __dir__():
    return sorted(set(globals()) | set(__all__))
