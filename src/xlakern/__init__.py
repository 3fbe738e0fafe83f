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

from ._version import __version__
from . import _compat  # noqa: F401  (NumPy 2.5 alias numba-cuda needs; see _compat)
from .errors import (
    CallError,
    CompilationError,
    KernelError,
    RegistrationError,
    SpecError,
    ToolchainError,
    XlakernError,
)
from ._cache import get_cache_dir, set_cache_dir
from ._toolchain import include_dir
from ._module import (
    CompiledFunction,
    CompiledModule,
    clear_cache,
    list_registered_targets,
    load_cpp_dir,
    load_cpp_file,
    load_cpp_inline,
    load_cuda_dir,
    load_cuda_file,
    load_cuda_inline,
)
from ._diagnostics import print_diagnostics
from ._numba_cpu import numba_kernel, numba_kernel_cache_info
from ._numba_cuda import numba_cuda_callable, numba_cuda_kernel, numba_cuda_launch_config
# Custom primitives (XLACustomKernel), backend config and Warp helpers.
from . import config
from ._primitive import BackendError, KernelEntry, KernelGenerationError, XLACustomKernel
from ._warp import WarpNotInstalledError, WarpTypeError, jaxinfo_to_warpinfo, jaxtype_to_warptype

__all__ = [
    "__version__",
    "XlakernError",
    "SpecError",
    "CompilationError",
    "ToolchainError",
    "RegistrationError",
    "KernelError",
    "CallError",
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
]
