"""The xlakern exception hierarchy.

Every error xlakern raises for bad input or a broken toolchain derives from
:class:`XlakernError`, and its message says what went wrong and what to do.

Example::

    try:
        mod = xlakern.load_cpp_inline("m", "void f(xk::Tensor o) { oops }")
    except xlakern.CompilationError as e:
        print(e)          # the compiler's diagnostics, with your line numbers
"""

from __future__ import annotations


class XlakernError(Exception):
    """Base class of every error raised by xlakern."""


class SpecError(XlakernError, ValueError):
    """An entry point's arg_spec does not match its C++ signature, or is malformed."""


class KernelError(XlakernError):
    """A kernel could not be built, loaded, registered or run (the base of the errors below).

    Catching it catches every kernel failure: :class:`CompilationError`, :class:`ToolchainError`,
    :class:`RegistrationError`, :class:`BackendError` and :class:`KernelExecutionError`.
    """


class CompilationError(KernelError):
    """The host compiler or nvcc rejected the sources (message holds the diagnostics)."""


class HostCompilerIncompatibleError(CompilationError):
    """nvcc refused the host C++ compiler's version (pass a supported one through CXX)."""


class ToolchainError(KernelError):
    """A compiler, the CUDA toolkit, jaxlib's FFI headers or the GPU arch could not be found."""


class NvccNotFoundError(ToolchainError):
    """nvcc could not be found (install the CUDA toolkit, or set XLAKERN_NVCC / CUDA_HOME)."""


class HostCompilerNotFoundError(ToolchainError):
    """No host C++ compiler (g++, clang++) could be found, or CXX names none."""


class HeaderNotFoundError(ToolchainError):
    """xlakern's C++ headers or jaxlib's XLA FFI headers are missing."""


class GpuArchDetectionError(ToolchainError):
    """The GPU's compute capability could not be told (no GPU visible, or a malformed override)."""


class UnsupportedArchError(ToolchainError):
    """nvcc cannot build for the requested GPU architecture."""


class CUDANotInstalledError(ToolchainError):
    """A CUDA feature was asked for where the CUDA toolkit or runtime is not installed."""


class RegistrationError(KernelError):
    """An FFI target could not be registered (name clash, broken library, ...)."""


class KernelLoadError(RegistrationError):
    """A compiled library could not be loaded (dlopen failed, or its symbols are missing)."""


class KernelExecutionError(KernelError):
    """A kernel failed while running (a failed XK_CHECK, a C++ exception, a CUDA error)."""


class CallError(XlakernError, TypeError):
    """A compiled function was called with the wrong arrays, outputs or attributes."""


class ConfigError(XlakernError, RuntimeError):
    """A setting was changed at a time it can no longer take effect (e.g. XLA flags after JAX started)."""


class CacheError(XlakernError):
    """The build cache cannot be trusted: a path in it is another user's or writable by others."""


class OptionError(XlakernError, TypeError):
    """A loader was given a keyword option it does not take (message names the closest one)."""


class PlatformError(XlakernError, ValueError):
    """A platform name is not one of 'cpu', 'gpu', 'tpu', or a program cannot run on this platform."""


class BackendError(KernelError, LookupError):
    """No kernel for the platform, or an unknown backend was asked for (message lists what is registered)."""


class KernelFallbackExhaustedError(BackendError):
    """No backend could run the call. (xlakern never falls back silently from one backend to another, so
    it raises :class:`BackendError` itself; the name exists for code written against BrainEvent.)"""


class MathError(XlakernError, ValueError):
    """An operation is mathematically ill-defined for its operands (e.g. a singular system)."""


class UnsupportedOperationError(XlakernError, NotImplementedError):
    """An operation the representation deliberately refuses (e.g. a plasticity update on a JITC matrix, which
    stores no per-synapse weight); the message says what to do instead."""


class NotProvidedError(XlakernError, AttributeError):
    """A BrainEvent 0.3 name xlakern deliberately does not provide; the message says what to use instead.

    It is an AttributeError, so ``hasattr(xlakern, name)`` is False for these names.
    """


class BenchmarkDataFnNotProvidedError(XlakernError):
    """A benchmark was asked of a primitive that has no benchmark data. (xlakern ships no benchmark harness
    for primitives; the name exists for code written against BrainEvent.)"""


class KernelGenerationError(XlakernError, RuntimeError):
    """A kernel generator, or tracing the function it returned, failed (the cause is chained)."""


class WarpNotInstalledError(XlakernError, ImportError):
    """A Warp backend or helper was used but the ``warp-lang`` package is not installed."""


class WarpTypeError(XlakernError, ValueError):
    """A dtype or shape that Warp arrays cannot carry (bfloat16, complex, 0-d)."""


__all__ = [
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
    "BackendError",
    "KernelGenerationError",
    "WarpNotInstalledError",
    "WarpTypeError",
    "HostCompilerIncompatibleError",
    "NvccNotFoundError",
    "HostCompilerNotFoundError",
    "HeaderNotFoundError",
    "GpuArchDetectionError",
    "UnsupportedArchError",
    "CUDANotInstalledError",
    "KernelLoadError",
    "KernelExecutionError",
    "KernelFallbackExhaustedError",
    "MathError",
    "UnsupportedOperationError",
    "BenchmarkDataFnNotProvidedError",
    "NotProvidedError",
    "NotReproducibleWarning",
    # BrainEvent 0.3's names for xlakern's classes (the same class objects)
    "BrainEventError",
    "KernelCompilationError",
    "KernelToolchainError",
    "KernelRegistrationError",
    "KernelNotAvailableError",
]

class NotReproducibleWarning(UserWarning):
    """A GPU product traced under :func:`xlakern.config.set_deterministic` still sums with float atomic
    adds, so its output may differ in its last bits from run to run (issued once per product)."""


# BrainEvent 0.3 spells some of these differently; the names below are the same classes, so an
# `except brainevent.KernelCompilationError` in code written for it catches xlakern's CompilationError.
BrainEventError = XlakernError
KernelCompilationError = CompilationError
KernelToolchainError = ToolchainError
KernelRegistrationError = RegistrationError
KernelNotAvailableError = BackendError
