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


class CompilationError(XlakernError):
    """The host compiler or nvcc rejected the sources (message holds the diagnostics)."""


class ToolchainError(XlakernError):
    """A compiler, the CUDA toolkit, jaxlib's FFI headers or the GPU arch could not be found."""


class RegistrationError(XlakernError):
    """An FFI target could not be registered (name clash, broken library, ...)."""


class KernelError(XlakernError):
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
    """A platform name is not one of 'cpu', 'gpu', 'tpu'."""


class BackendError(XlakernError, LookupError):
    """No kernel for the platform, or an unknown backend was asked for (message lists what is registered)."""


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
]
