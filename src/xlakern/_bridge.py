"""The runtime's generic FFI targets, shared by every bridge that is not compiled source.

Numba CPU kernels, Numba CUDA kernels and Python callables all run through three targets
registered once per process (``xlakern.numba_cpu``, ``xlakern.cuda_image``,
``xlakern.python_callable``). A call names its kernel by content key in the ``kernel``
attribute; the runtime finds the kernel at XLA's instantiate stage. Registering a new kernel
therefore never registers a new FFI target.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import _runtime
from .errors import CallError, KernelError

NUMBA_CPU_TARGET = "xlakern.numba_cpu"
CUDA_IMAGE_TARGET = "xlakern.cuda_image"
PYTHON_CALLABLE_TARGET = "xlakern.python_callable"

_lock = threading.Lock()
_registered: set[str] = set()


def ensure_target(target: str) -> None:
    """Register ``target`` and its state type with XLA, once per process."""
    if target in _registered:
        return
    import jax

    with _lock:
        if target in _registered:
            return
        for name, platform, stages, (type_name, type_id, type_info), graph_ok in _runtime.bridge_targets():
            if name == target:
                jax.ffi.register_ffi_type(type_name, {"type_id": type_id, "type_info": type_info},
                                          platform=platform)
                jax.ffi.register_ffi_target(name, stages, platform=platform, **_traits(graph_ok))
                _registered.add(name)
                return
        raise AssertionError(f"the runtime has no bridge target {target}")  # pragma: no cover


def _traits(graph_compatible: bool) -> dict[str, Any]:
    """Registration keywords marking a target command-buffer compatible.

    A target registered as a bundle of stage handlers does not report its execute handler's
    traits to XLA, so they are passed with the registration itself.
    """
    if not graph_compatible:
        return {}
    try:
        from jax._src.lib import xla_client
    except ImportError:  # pragma: no cover - a jax without this module: graphs are an optimisation
        return {}
    traits = getattr(xla_client, "CustomCallTargetTraits", None)
    return {"traits": traits.COMMAND_BUFFER_COMPATIBLE} if traits is not None else {}


def registered_targets() -> list[str]:
    return sorted(_registered)


def flatten_outs(outs: Any, who: str) -> tuple[list[Any], Any]:
    """``outs`` (one ShapeDtypeStruct, or a sequence/pytree of them) as a flat list and treedef."""
    import jax

    flat, treedef = jax.tree.flatten(outs)
    if not flat:
        raise CallError(f"{who}: outs= describes no output; pass a jax.ShapeDtypeStruct per output")
    structs = []
    for i, o in enumerate(flat):
        if not (hasattr(o, "shape") and hasattr(o, "dtype")):
            raise CallError(f"{who}: outs= entry {i} is {type(o).__name__}, not a jax.ShapeDtypeStruct")
        structs.append(jax.ShapeDtypeStruct(tuple(int(d) for d in o.shape), np.dtype(o.dtype)))
    return structs, treedef


def as_arrays(who: str, arrays: Sequence[Any]) -> list[Any]:
    """Inputs as JAX values (arrays or tracers); Python scalars and NumPy arrays are converted."""
    import jax
    import jax.numpy as jnp

    out = []
    for i, x in enumerate(arrays):
        if isinstance(x, (jax.Array, jax.core.Tracer)):
            out.append(x)
        elif isinstance(x, (np.ndarray, np.generic, int, float, bool)):
            out.append(jnp.asarray(x))
        else:
            raise CallError(f"{who}: input {i} is a {type(x).__name__}; pass JAX or NumPy arrays")
    return out


_EAGER: dict[tuple, Any] = {}  # jitted single calls, for eager use


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
    failure reported by an xlakern handler becomes :class:`KernelError`.
    """
    import jax

    aliases = dict(input_output_aliases) if input_output_aliases else None

    def make() -> Any:
        return jax.ffi.ffi_call(target, flat_outs, vmap_method=vmap_method, input_output_aliases=aliases)

    if any(isinstance(x, jax.core.Tracer) for x in arrays):
        return list(make()(*arrays, **attrs))
    cache_key = (target, tuple((o.shape, o.dtype) for o in flat_outs), vmap_method,
                 tuple(sorted(aliases.items())) if aliases else None,
                 tuple(sorted((k, type(v).__name__, _attr_key(v)) for k, v in attrs.items())))
    jitted = _EAGER.get(cache_key)
    if jitted is None:  # the ffi_call is built only here: a cache hit does no work but the lookup
        fn = make()
        jitted = _EAGER.setdefault(cache_key, jax.jit(lambda *a: fn(*a, **attrs)))
    try:
        return list(jitted(*arrays))
    except jax.errors.JaxRuntimeError as err:
        if "xlakern" in str(err):
            raise KernelError(str(err)) from err
        raise


def call(target: str, key: str, arrays: Sequence[Any], flat_outs: list[Any], treedef: Any,
         vmap_method: str | None, input_output_aliases: Mapping[int, int] | None, zero_mask: int = 0) -> Any:
    """One call of a bridge target for the kernel registered under ``key``, shaped like ``outs``.

    ``zero_mask`` (see :func:`zeroed_mask`) names the outputs the handler clears before the kernel.
    """
    import jax

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
    code = getattr(fn, "__code__", None)
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
    import jax

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
            dtypes.append(name)
            ranks.append(len(x.shape))
    return tuple(dtypes), tuple(ranks)
