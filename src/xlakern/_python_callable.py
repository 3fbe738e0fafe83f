"""Python functions that launch Numba CUDA kernels, as JAX operations: ``numba_cuda_callable``.

The runtime's ``xlakern.python_callable`` handler clears the outputs asked for on XLA's stream,
then takes the GIL and calls this module's hook, which runs the user's function on Numba device
arrays aliasing XLA's buffers and on XLA's stream: Python per call, which is the point. The
function is registered under a key naming it, so the HLO carries only that key.
"""

from __future__ import annotations

import traceback
from typing import Any, Mapping

from . import _bridge, _compat, _runtime
from ._bridge_op import BridgeOp
from ._hoist import KernelSwap, without_body_imports
from ._numba_cuda import NUMBA_CUDA_DTYPES, import_numba_cuda
from .errors import CallError

_CALLABLES: dict[str, Any] = {}  # key -> function; kept for the life of the process, like its FFI state
_streams: dict[int, Any] = {}  # XLA's stream handle -> Numba's external stream on it
_contexts: dict[int, Any] = {}  # device ordinal -> Numba's context for it


def _hoisted_twin(value: Any) -> Any:
    """A ``@cuda.jit`` kernel with body imports as its hoisted twin; anything else as it is."""
    if not _compat.is_cuda_dispatcher(value):
        return value
    return without_body_imports(value, lambda fn: import_numba_cuda().jit(**dict(value.targetoptions))(fn))


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno}, in {f.name})"


def _run_callable(key: str, arrays: list, n_inputs: int, stream: int, device: int) -> str | None:
    """Runtime hook: run a numba_cuda_callable on XLA's buffers and stream."""
    func = _CALLABLES.get(key)
    if func is None:
        return "its Python function is not registered in this process"
    try:
        cuda = import_numba_cuda()
        ctx = _contexts.get(device)
        if ctx is None:
            with cuda.gpus[device]:
                ctx = _contexts[device] = cuda.current_context()
        if cuda.current_context() is not ctx:
            with cuda.gpus[device]:
                return _invoke(cuda, ctx, func, arrays, stream)
        return _invoke(cuda, ctx, func, arrays, stream)
    except Exception as e:
        return f"{type(e).__name__}: {e}{_where(e)}"


def _invoke(cuda: Any, ctx: Any, func: Any, arrays: list, stream: int) -> None:
    s = _streams.get(stream)
    if s is None:
        s = _streams[stream] = cuda.external_stream(stream)
    views = [_compat.device_array_at(cuda, ctx, addr, shape, dtype) for addr, shape, dtype in arrays]
    func(*views, s)
    return None


class NumbaCudaCallable(BridgeOp):
    """A Python function of Numba device arrays and a stream, as a JAX operation; see :func:`numba_cuda_callable`."""

    wrapper = "numba_cuda_callable"
    target = _bridge.PYTHON_CALLABLE_TARGET
    dtypes = NUMBA_CUDA_DTYPES
    platform = "gpu"
    kind = "Numba CUDA kernels"
    trailing_params = 1  # the stream
    python_hook = (_runtime.PythonHook.RUN_CALLABLE, _run_callable)

    def __init__(self, func: Any, outs: Any, vmap_method: str | None,
                 input_output_aliases: Mapping[int, int] | None, zeroed_outputs: Any = None):
        self.func = func
        super().__init__(getattr(func, "__name__", type(func).__name__), func, outs, vmap_method,
                         input_output_aliases, zeroed_outputs)
        self._swap = KernelSwap(func, _hoisted_twin)  # kernels that import inside their bodies

    def _register(self, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int) -> str:
        # One key per input count: the function itself takes any dtypes and ranks.
        key = f"python:{id(self.func):x}:{n_inputs}"
        _runtime.register_python_callable(key, self.__name__, n_inputs)
        return key

    def _before_call(self, key: str) -> None:
        # At trace time (and per eager call), never per execution: the runtime runs what is stored here.
        _CALLABLES[key] = self._swap.function()


def numba_cuda_callable(func: Any, outs: Any, *, vmap_method: str | None = None,
                        input_output_aliases: Mapping[int, int] | None = None,
                        zeroed_outputs: Any = None) -> NumbaCudaCallable:
    """Wrap a Python function that launches Numba CUDA kernels as a JAX operation.

    ``func(*inputs, *outputs, stream)`` receives Numba device arrays aliasing XLA's buffers
    (zero copy) and XLA's stream as a Numba stream; it may launch several kernels on that
    stream and allocate temporaries. It runs in Python on every call, so it is slower than
    :func:`numba_cuda_kernel` and is never captured into CUDA graphs. An exception inside
    ``func`` makes the call fail with an error naming it. ``zeroed_outputs`` (indices,
    ``True``, or a callable of an empty dict) clears those outputs on XLA's stream before
    ``func`` runs. Kernels ``func`` launches may ``import`` inside their bodies: xlakern runs
    ``func`` with such kernels replaced by hoisted twins (the module's globals are untouched).

    Example::

        def abs_two_pass(x, out, stream):
            tmp = cuda.device_array(x.shape[0], dtype=np.float32)
            square[blocks, 256, stream](x, tmp)
            sqrt[blocks, 256, stream](tmp, out)

        f = xlakern.numba_cuda_callable(abs_two_pass, outs=jax.ShapeDtypeStruct((n,), jnp.float32))
    """
    if not callable(func):
        raise CallError(f"numba_cuda_callable needs a Python function; got {type(func).__name__}")
    return NumbaCudaCallable(func, outs, vmap_method, input_output_aliases, zeroed_outputs)
