"""What every bridge does: one kernel as a JAX operation through one of the runtime's targets.

A *bridge* is the path from one kind of Python kernel to one generic FFI target of the C++
runtime: ``numba_kernel`` (``_numba_cpu``, ``csrc/numba_cpu``), ``numba_cuda_kernel``
(``_numba_cuda``, ``csrc/cuda_image``) and ``numba_cuda_callable`` (``_python_callable``,
``csrc/python_callable``). Each is a :class:`BridgeOp` subclass saying how a call signature
becomes a kernel registered with the runtime; :class:`BridgeOp` does the rest of a call: check
the inputs, find the registered kernel for their signature, and call the target once with that
kernel's key. The Numba bridges compile and register through one :class:`RegisteredKernels`
table each, keyed by the kernel's content.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from . import _bridge, _runtime
from ._fingerprint import Fingerprint, fingerprint_dispatcher
from .errors import CallError

# Hooks handed to the runtime in this process, so each is installed once.
_installed_hooks: dict[Any, Callable[..., Any]] = {}
_hooks_lock = threading.Lock()


def install_python_hook(hook: Any, function: Callable[..., Any]) -> None:
    """Make ``function`` the Python function the runtime calls for ``hook``
    (a ``_runtime.PythonHook``), if it is not already."""
    with _hooks_lock:
        if _installed_hooks.get(hook) is not function:
            _runtime.set_python_hook(hook, function)
            _installed_hooks[hook] = function


class BridgeOp:
    """A kernel or function as a JAX operation: check, find the kernel for the call's signature,
    call the bridge's FFI target once.

    Subclasses set the class attributes below and define :meth:`_register`; they may define
    :meth:`_before_call` and :meth:`_arity_note`.
    """

    wrapper: str  # the public function that makes such ops ("numba_kernel"), for messages
    target: str  # the runtime's FFI target of the bridge
    dtypes: frozenset[str]  # element types the bridge takes
    platform: str  # where concrete inputs must live: "cpu" or "gpu"
    kind: str  # what the bridge runs, plural ("Numba CPU kernels"), for messages
    trailing_params = 0  # parameters after the outputs (the callable's stream)
    # (runtime hook, Python function) the bridge's handler may call back, installed before the
    # bridge registers its first kernel; None when its handler never calls Python.
    python_hook: tuple[Any, Callable[..., Any]] | None = None

    def __init__(self, name: str, python_function: Any, outs: Any, vmap_method: str | None,
                 input_output_aliases: Mapping[int, int] | None, zeroed_outputs: Any,
                 zeroed_params: Mapping[str, Any] | None = None):
        self.__name__ = name
        who = self._who()
        self.outs = outs
        self._flat_outs, self._treedef = _bridge.flatten_outs(outs, who)
        self._n_inputs = _bridge.count_inputs(python_function, len(self._flat_outs), who,
                                              trailing=self.trailing_params)
        self.vmap_method = vmap_method
        self.input_output_aliases = dict(input_output_aliases) if input_output_aliases else None
        _bridge.check_aliases(who, self.input_output_aliases, self._n_inputs, self._flat_outs)
        self.zeroed_outputs = zeroed_outputs
        self._zero_mask = None if zeroed_outputs is None else _bridge.zeroed_mask(
            who, zeroed_outputs, len(self._flat_outs), self.input_output_aliases, zeroed_params)
        self._keys: dict[tuple, str] = {}  # call signature -> the runtime key of its kernel

    def _who(self) -> str:
        return f"{self.wrapper}({self.__name__})"

    def __repr__(self) -> str:
        return f"<xlakern {self.wrapper} {self.__name__}: {len(self._flat_outs)} output(s)>"

    def _register(self, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int) -> str:
        """Register the kernel for this signature with the runtime (compiling it if need be) and
        return its key."""
        raise NotImplementedError

    def _before_call(self, key: str) -> None:
        """Called at trace time (and per eager call), never per execution."""

    def _arity_note(self) -> str:
        """Text after "takes N input array(s)" when a call passes another number."""
        return ""

    def __call__(self, *arrays: Any) -> Any:
        who = self._who()
        if self._n_inputs is not None and len(arrays) != self._n_inputs:
            raise CallError(f"{who} takes {self._n_inputs} input array(s){self._arity_note()}; got {len(arrays)}")
        arrays = _bridge.as_arrays(who, arrays)
        dtypes, ranks = _bridge.signature(who, arrays, self._flat_outs, self.dtypes, self.platform, self.kind)
        key = self._keys.get((dtypes, ranks))
        if key is None:
            if self.python_hook is not None:
                install_python_hook(*self.python_hook)
            key = self._keys[(dtypes, ranks)] = self._register(dtypes, ranks, len(arrays))
        self._before_call(key)
        zero = _bridge.call_mask(who, self._zero_mask, len(self._flat_outs), self.input_output_aliases)
        return _bridge.call(self.target, key, arrays, self._flat_outs, self._treedef, self.vmap_method,
                            self.input_output_aliases, zero)


@dataclass(frozen=True)
class RegisteredKernel:
    """A kernel registered with the runtime, and what its registration must keep alive."""

    key: str  # the content key the runtime knows it by (the call's ``kernel`` attribute)
    name: str
    kernel: Any  # the user's dispatcher: identity keys rely on its id staying unique
    compiled: Any  # the compiled form: machine code whose address the runtime holds, or an image


class RegisteredKernels:
    """One bridge's kernels by content key, each compiled and registered once per process.

    The key hashes ``version`` (bumped when the bridge's compiled form changes), Numba's version,
    the kernel's content fingerprint (its identity when it has none) and the bridge's own
    ``parts`` (signature, launch configuration...). The same content in another process gets
    the same key, so a program from JAX's persistent cache finds its kernel once the wrapper
    has been called.
    """

    def __init__(self, version: int):
        self.version = version
        self.lock = threading.RLock()  # held while a kernel compiles
        self._by_key: dict[str, RegisteredKernel] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def find(self, key: str) -> RegisteredKernel | None:
        return self._by_key.get(key)

    def kernel_for(self, kernel: Any, parts: tuple,
                   compile_and_register: Callable[[str, Fingerprint], Any]) -> RegisteredKernel:
        """The registered kernel of ``kernel`` for ``parts``. On a miss, under the lock,
        ``compile_and_register(key, fingerprint)`` compiles it, registers it with the runtime under
        ``key`` and returns its compiled form."""
        import numba

        fp = fingerprint_dispatcher(kernel)
        # Unfingerprintable kernels are keyed by identity; the table keeps them alive, so ids stay unique.
        content = fp.digest or f"identity:{id(kernel)}"
        key = hashlib.sha256(repr((self.version, numba.__version__, content) + parts).encode()).hexdigest()
        found = self._by_key.get(key)
        if found is not None:
            return found
        with self.lock:
            found = self._by_key.get(key)
            if found is None:
                compiled = compile_and_register(key, fp)
                found = self._by_key[key] = RegisteredKernel(key, kernel.__name__, kernel, compiled)
        return found
