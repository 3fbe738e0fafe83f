"""The bridges' generic FFI targets, and the call machinery compiled modules share with them.

A bridge is the path from one kind of Python kernel to one generic FFI target of the runtime
(see ``_bridge_op``): Numba CPU kernels, Numba CUDA kernels and Python callables run through
three targets registered once per process (``xlakern.numba_cpu``, ``xlakern.cuda_image``,
``xlakern.python_callable``). A call names its kernel by content key in the ``kernel``
attribute; the runtime finds the kernel at XLA's instantiate stage. Registering a new kernel
therefore never registers a new FFI target. Registration with XLA (:func:`register_targets`),
the eager-call cache (:func:`run_ffi`), ``zeroed_outputs`` masks and the size checks also
serve compiled modules' functions.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import math
import os
import re
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, _runtime
from ._arrays import describes_array, static_shape
from ._codegen import is_control_target
from .errors import CallError, KernelExecutionError, RegistrationError

NUMBA_CPU_TARGET = "xlakern.numba_cpu"
CUDA_IMAGE_TARGET = "xlakern.cuda_image"
PYTHON_CALLABLE_TARGET = "xlakern.python_callable"
# Target names under this prefix belong to the runtime's generic targets.
RESERVED_PREFIX = "xlakern."

_lock = threading.RLock()
_registered: set[str] = set()
_registered_types: set[str] = set()


def start_backend(platform: str) -> None:
    """Initialise jax's backend for ``platform`` ("cpu" or "CUDA") before registering with it.

    Registrations made before a backend exists are queued by jaxlib and replayed when it
    starts: targets before types, so a target whose state type was queued fails, and the failure
    surfaces later as "Unable to initialize backend". Registering with a running backend happens
    at once, and its errors reach the caller.
    """
    try:
        jax.devices("cpu" if platform == "cpu" else "gpu")
    except RuntimeError:
        if platform == "cpu":
            raise
        # No GPU backend in this process: the queued registration is never replayed, and the
        # target can never be called, so queueing it is harmless.


def register_targets(platform: str, targets: Sequence[tuple[str, Any, Mapping[str, Any]]],
                     types: Sequence[tuple[str, Mapping[str, Any]]] = (),
                     accepted: Callable[[str], None] | None = None) -> None:
    """Register FFI ``types`` then ``targets`` [(name, handler(s), keywords)] with XLA.

    The one place xlakern hands handlers to XLA, for modules and the generic targets alike.
    The backend is started first, so a failure raises here; ``accepted(name)`` is called for
    each target XLA took, so the caller can record exactly what XLA may hold. Any failure
    becomes :class:`RegistrationError` naming the target.
    """
    with _lock:
        try:
            start_backend(platform)
        except Exception as exc:
            raise RegistrationError(f"cannot start jax's {platform} backend to register FFI targets: "
                                    f"{exc}") from exc
        for type_name, type_spec in types:
            if type_name in _registered_types:
                continue
            try:
                jax.ffi.register_ffi_type(type_name, dict(type_spec), platform=platform)
            except Exception as exc:
                raise RegistrationError(f"registering the FFI type {type_name} with XLA failed: {exc}") from exc
            _registered_types.add(type_name)
        for name, handler, keywords in targets:
            try:
                jax.ffi.register_ffi_target(name, handler, platform=platform, **keywords)
            except Exception as exc:
                raise RegistrationError(f"registering the FFI target {name} with XLA failed: {exc}") from exc
            if accepted is not None:
                accepted(name)


def ensure_target(target: str) -> None:
    """Register ``target`` and its state type with XLA, once per process.

    A target is marked registered only once XLA accepted it, so a failure is reported again
    on the next call rather than leaving a target that was never there.
    """
    if target in _registered:
        return
    with _lock:
        if target in _registered:
            return
        for bridge in _runtime.bridge_targets():
            if bridge.name == target:
                register_targets(bridge.platform,
                                 [(bridge.name, bridge.stage_handlers, _traits(bridge.command_buffer_compatible))],
                                 types=[(bridge.state_type_name, bridge.state_type)], accepted=_registered.add)
                return
        raise AssertionError(f"the runtime has no bridge target {target}")  # pragma: no cover


def _traits(graph_compatible: bool) -> dict[str, Any]:
    """Registration keywords marking a target command-buffer compatible.

    A target registered as a bundle of stage handlers does not report its execute handler's
    traits to XLA, so they are passed with the registration itself.
    """
    return _compat.command_buffer_traits() if graph_compatible else {}


# Extra names given to modules' handlers (register_ffi_target): name -> (module key, entry point).
_aliases: dict[str, tuple[str, str]] = {}


def register_alias(platform: str, name: str, handler: Any, owner: tuple[str, str]) -> None:
    """Register ``handler`` (a module's entry point, ``owner`` = (module key, entry name)) under one more
    target ``name``. The same owner again is a no-op; any other target already under ``name`` is a
    :class:`RegistrationError` (XLA cannot re-point a live target)."""
    with _lock:
        if _aliases.get(name) == owner:
            return
        if name in _aliases or name in registered_targets():
            raise RegistrationError(f"an FFI target named '{name}' is already registered to other code; "
                                    f"XLA cannot re-point it. Register under another name")
        register_targets(platform, [(name, handler, {})], accepted=lambda n: _aliases.__setitem__(n, owner))


def owned_targets() -> set[str]:
    """Every FFI target xlakern handed to XLA in this process, the modules' control twins included."""
    modules = {t for (_, _, _, _, targets) in _runtime.modules() for t in targets}
    return modules | set(_registered) | set(_aliases)


def registered_targets() -> list[str]:
    """Every FFI target xlakern handed to XLA in this process: modules' and generic ones."""
    return sorted(t for t in owned_targets() if not is_control_target(t))


# Largest element count and byte size XLA can address (int64).
_INT64_MAX = 2**63 - 1


def check_size(who: str, role: str, i: int, shape: Sequence[int], dtype: Any) -> tuple[int, ...]:
    """Refuse a shape whose element count or byte size does not fit in int64; return it as Python ints.

    XLA computes both in int64 and aborts the process on overflow, so it must never see one.
    """
    shape = static_shape(shape, lambda: f"{who}: {role} {i}")
    count = math.prod(shape)
    nbytes = count * np.dtype(dtype).itemsize
    if (shape and min(shape) < 0) or nbytes > _INT64_MAX or count > _INT64_MAX:
        raise CallError(f"{who}: {role} {i} has shape {shape}, whose element count or "
                        f"size in bytes does not fit in int64; no buffer can have it. Check the shape")
    return shape


def flatten_outs(outs: Any, who: str) -> tuple[list[Any], Any]:
    """``outs`` (one ShapeDtypeStruct, or a sequence/pytree of them) as a flat list and treedef."""
    flat, treedef = jax.tree.flatten(outs)
    if not flat:
        raise CallError(f"{who}: outs= describes no output; pass a jax.ShapeDtypeStruct per output")
    structs = []
    for i, o in enumerate(flat):
        if not describes_array(o):
            raise CallError(f"{who}: outs= entry {i} is {type(o).__name__}, not a jax.ShapeDtypeStruct")
        structs.append(jax.ShapeDtypeStruct(check_size(who, "outs= entry", i, o.shape, o.dtype), np.dtype(o.dtype)))
    return structs, treedef


def as_arrays(who: str, arrays: Sequence[Any]) -> list[Any]:
    """Inputs as JAX values (arrays or tracers); Python scalars and NumPy arrays are converted."""
    out = []
    for i, x in enumerate(arrays):
        if isinstance(x, (jax.Array, jax.core.Tracer)):
            out.append(x)
        elif isinstance(x, (np.ndarray, np.generic, int, float, bool)):
            out.append(jnp.asarray(x))
        else:
            raise CallError(f"{who}: input {i} is a {type(x).__name__}; pass JAX or NumPy arrays")
    return out


def _eager_cache_size() -> int:
    try:
        return max(1, int(os.environ.get("XLAKERN_EAGER_CACHE_SIZE", "512")))
    except ValueError:
        return 512


# Jitted single calls for eager use, least recently used first. Bounded: each entry keeps a
# compiled executable, and a caller passing a new attribute value each time adds one per call.
_EAGER: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
_EAGER_SIZE = _eager_cache_size()
_eager_lock = threading.Lock()


def _eager_jitted(cache_key: tuple, make: Callable[[], Any]) -> Any:
    with _eager_lock:
        jitted = _EAGER.get(cache_key)
        if jitted is not None:
            _EAGER.move_to_end(cache_key)
            return jitted
    jitted = make()  # outside the lock: building it may trace
    with _eager_lock:
        jitted = _EAGER.setdefault(cache_key, jitted)
        _EAGER.move_to_end(cache_key)
        while len(_EAGER) > _EAGER_SIZE:
            _EAGER.popitem(last=False)
    return jitted


_XLA_STATUS = re.compile(r"[A-Z_]+: ")


def _attr_key(value: Any) -> Any:
    """An attribute as part of a cache key: its repr, so a NaN still finds its entry; an array
    (mod.fn's control attribute) by its bytes, several times cheaper than NumPy's repr."""
    if isinstance(value, np.ndarray):
        return value.dtype.str, value.shape, value.tobytes()
    return repr(value)


def run_ffi(target: str, flat_outs: list[Any], arrays: Sequence[Any], attrs: Mapping[str, Any],
            vmap_method: str | None, input_output_aliases: Mapping[int, int] | None) -> list[Any]:
    """``jax.ffi.ffi_call(target, flat_outs, ...)(*arrays, **attrs)`` as a list of results.

    Eager calls go through a cached ``jax.jit`` of the single call: JAX's compiled-function fast
    path dispatches several times faster than binding the primitive eagerly each time. A
    failure reported by an xlakern handler becomes :class:`KernelExecutionError` (a :class:`KernelError`).
    """
    aliases = dict(input_output_aliases) if input_output_aliases else None

    def make() -> Any:
        return jax.ffi.ffi_call(target, flat_outs, vmap_method=vmap_method, input_output_aliases=aliases)

    if any(isinstance(x, jax.core.Tracer) for x in arrays):
        return list(make()(*arrays, **attrs))
    cache_key = (target, tuple((o.shape, o.dtype) for o in flat_outs), vmap_method,
                 tuple(sorted(aliases.items())) if aliases else None,
                 tuple(sorted((k, type(v).__name__, _attr_key(v)) for k, v in attrs.items())))

    def make_jitted() -> Any:  # the ffi_call is built only on a miss: a hit does no work but the lookup
        fn = make()
        return jax.jit(lambda *a: fn(*a, **attrs))

    jitted = _eager_jitted(cache_key, make_jitted)
    try:
        return list(jitted(*arrays))
    except (jax.errors.JaxRuntimeError, ValueError) as err:
        # jaxlib's compiled-call fast path reports a failed execution as ValueError, not
        # JaxRuntimeError: both carry XLA's status ("INTERNAL: xlakern kernel ... failed").
        text = str(err)
        if "xlakern" in text and (isinstance(err, jax.errors.JaxRuntimeError) or _XLA_STATUS.match(text)):
            raise KernelExecutionError(text) from err
        raise


def call(target: str, key: str, arrays: Sequence[Any], flat_outs: list[Any], treedef: Any,
         vmap_method: str | None, input_output_aliases: Mapping[int, int] | None, zero_mask: int = 0) -> Any:
    """One call of a bridge target for the kernel registered under ``key``, shaped like ``outs``.

    ``zero_mask`` (see :func:`zeroed_mask`) names the outputs the handler clears before the kernel.
    """
    ensure_target(target)
    results = run_ffi(target, flat_outs, arrays, {"kernel": key, "zero": np.int64(zero_mask)}, vmap_method,
                      input_output_aliases)
    return jax.tree.unflatten(treedef, results)


# A bit per output in an int64 attribute; bit 63 is left alone so the mask stays non-negative.
MAX_ZEROED_OUTPUT = 62
_inherited_zeroed = threading.local()  # set by XLACustomKernel while it traces a generated function


class _Inherited:
    def __init__(self, indices: tuple[int, ...]):
        self.indices = indices
        self.used = False  # whether a kernel call took the value


@contextlib.contextmanager
def inherited_zeroed(indices: tuple[int, ...] | None) -> Iterator[_Inherited | None]:
    """Within the block, kernel calls given no ``zeroed_outputs`` of their own zero ``indices``."""
    if indices is None:
        yield None
        return
    previous = getattr(_inherited_zeroed, "value", None)
    _inherited_zeroed.value = state = _Inherited(indices)
    try:
        yield state
    finally:
        _inherited_zeroed.value = previous


def zeroed_mask(who: str, zeroed_outputs: Any, n_outputs: int, aliases: Mapping[int, int] | None,
                params: Mapping[str, Any] | None = None) -> int:
    """``zeroed_outputs`` (indices, ``True`` for all, or a callable of the call's static
    parameters returning indices) as a bit mask of outputs, checked against ``aliases``.

    ``None`` takes the value an enclosing :class:`XLACustomKernel` call passes down (else none).
    """
    inherited = getattr(_inherited_zeroed, "value", None)
    if inherited is not None:
        inherited.used = True  # a kernel was called; its own zeroed_outputs, if any, wins
    if zeroed_outputs is None:
        if inherited is None:
            return 0
        zeroed_outputs = inherited.indices
    if callable(zeroed_outputs):
        try:
            zeroed_outputs = zeroed_outputs(dict(params or {}))
        except Exception as e:
            raise CallError(f"{who}: zeroed_outputs(params) raised {type(e).__name__}: {e}; it is called with a "
                            f"dict of the call's static parameters and returns output indices") from e
    if zeroed_outputs is True:
        indices = list(range(n_outputs))
    elif zeroed_outputs is False:
        indices = []
    elif isinstance(zeroed_outputs, (int, np.integer)):
        indices = [zeroed_outputs]
    else:
        try:
            indices = list(zeroed_outputs)
        except TypeError:
            raise CallError(f"{who}: zeroed_outputs must be output indices, True (all outputs) or a callable "
                            f"returning indices; got {zeroed_outputs!r}") from None
    aliased = {int(o): int(i) for i, o in (aliases or {}).items()}
    mask = 0
    for index in indices:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise CallError(f"{who}: zeroed_outputs entry {index!r} is not an output index (an int)")
        o = int(index)
        if not 0 <= o < n_outputs:
            raise CallError(f"{who}: zeroed_outputs names output {o}, but the call has {n_outputs} output(s) "
                            f"(indices 0 to {n_outputs - 1})")
        if o > MAX_ZEROED_OUTPUT:
            raise CallError(f"{who}: zeroed_outputs names output {o}; only outputs 0 to {MAX_ZEROED_OUTPUT} can be "
                            f"zeroed. Clear later outputs in the kernel")
        if mask >> o & 1:
            raise CallError(f"{who}: zeroed_outputs names output {o} twice; name each output once")
        if o in aliased:
            raise CallError(f"{who}: output {o} is named by zeroed_outputs and aliases input {aliased[o]} "
                            f"(input_output_aliases): an aliased output starts with the input's contents and is "
                            f"never zeroed. Remove {o} from zeroed_outputs, or pass zeros as input {aliased[o]}")
        mask |= 1 << o
    return mask


def call_mask(who: str, fixed: int | None, n_outputs: int, aliases: Mapping[int, int] | None) -> int:
    """The zero mask of one call: the wrapper's own (``fixed``), else an enclosing op's, else 0."""
    if fixed is None:
        return zeroed_mask(who, None, n_outputs, aliases)
    inherited = getattr(_inherited_zeroed, "value", None)
    if inherited is not None:
        inherited.used = True  # a kernel was called; the wrapper's own zeroed_outputs wins
    return fixed


def check_aliases(who: str, aliases: Mapping[int, int] | None, n_inputs_hint: int | None,
                  flat_outs: list[Any]) -> None:
    if aliases is None:
        return
    if not isinstance(aliases, Mapping):
        raise CallError(f"{who}: input_output_aliases must be a dict {{input index: output index}}")
    for i, o in aliases.items():
        if not (isinstance(i, int) and isinstance(o, int)) or o < 0 or o >= len(flat_outs) or i < 0 or (
                n_inputs_hint is not None and i >= n_inputs_hint):
            raise CallError(f"{who}: input_output_aliases entry {i!r}: {o!r} does not name an input and one of "
                            f"the {len(flat_outs)} output(s)")


def count_inputs(fn: Any, n_outputs: int, who: str, trailing: int = 0) -> int | None:
    """How many inputs ``fn`` takes: its parameters minus the outputs (and ``trailing`` extras,
    e.g. a stream); None when it takes ``*args``."""
    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise CallError(f"{who}: the function is a generator or coroutine (it uses yield or async): its "
                        f"body would not run when called, and its outputs would never be written. Write "
                        f"the outputs into the output arrays it takes, with no yield")
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_kwonlyargcount > len(getattr(fn, "__kwdefaults__", None) or {}):
        raise CallError(f"{who}: the function has keyword-only parameters without defaults; xlakern passes "
                        f"inputs and outputs positionally, so it could never be called")
    if code is None or code.co_flags & 0x04:
        return None
    n = code.co_argcount - n_outputs - trailing
    if n < 0:
        extra = f" and {trailing} more" if trailing else ""
        raise CallError(f"{who}: the function takes {code.co_argcount} parameters, fewer than its {n_outputs} "
                        f"output(s){extra}; it takes its inputs, then one array per output")
    return n


def signature(who: str, arrays: Sequence[Any], flat_outs: Sequence[Any], supported: frozenset,
              platform: str, kind: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(dtype names, ranks) of inputs then outputs, checking dtypes and that concrete inputs
    live on ``platform`` ("cpu" or "gpu")."""
    dtypes, ranks = [], []
    for role, items in (("input", arrays), ("output", flat_outs)):
        for i, x in enumerate(items):
            name = np.dtype(x.dtype).name
            if name not in supported:
                raise CallError(f"{who}: {role} {i} has dtype {name}, which {kind} cannot take; "
                                f"supported: {', '.join(sorted(supported))}")
            if role == "input" and isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
                platforms = {d.platform for d in x.devices()}
                if platforms and platforms != {platform}:
                    raise CallError(f"{who}: input {i} lives on {', '.join(sorted(platforms))}; {kind} take "
                                    f"{platform.upper()} arrays (jax.device_put(x, jax.devices('{platform}')[0]))")
            if role == "input":  # outputs were checked when outs= was flattened
                check_size(who, role, i, x.shape, x.dtype)
            dtypes.append(name)
            ranks.append(len(x.shape))
    return tuple(dtypes), tuple(ranks)
