"""jax.export for programs that call xlakern's kernels, and running them in another process.

``jax.export`` refuses a custom call unless told that its target is stable; :func:`export` allows
the xlakern targets the program calls and leaves every other target to jax's own check. An exported
program names its targets but carries no code, so the process that runs it must register them first:
:func:`prepare_exported` (and :func:`deserialize`, which calls it) loads what xlakern can load by name,
the event operators' kernel modules (from the cache, or compiled once) and the bridges' generic targets,
and says which of the user's own modules are missing.

Example::

    exp = xlakern.export(jax.jit(step))(v, spikes)
    blob = exp.serialize()                          # needs the flatbuffers package
    # later, in another process:
    ops = xlakern.load_cpp_inline("ops", SOURCE)    # the program's own modules, as they were built
    exp = xlakern.deserialize(blob)                 # event kernels load by name
    v = exp.call(v, spikes)
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Sequence

import jax
from jax import export as _jax_export

from . import _bridge, _compat, _runtime
from ._codegen import entry_target
from .config import canonical_platform
from .errors import PlatformError, RegistrationError, XlakernError

_CHECK = _jax_export.DisabledSafetyCheck
# a custom call printed in the pretty form (@name or @"name") or the generic one (call_target_name = "name")
_TARGET_RE = re.compile(r'stablehlo\.custom_call @(?:"((?:[^"\\]|\\.)*)"|([\w.$-]+))|call_target_name = "((?:[^"\\]|\\.)*)"')


def custom_call_targets(exported: Any) -> list[str]:
    """The custom-call targets an exported program (:class:`jax.export.Exported`) calls, sorted."""
    text = exported.mlir_module()
    return sorted({next(g for g in m.groups() if g is not None) for m in _TARGET_RE.finditer(text)})


def export(fun: Callable[..., Any], *, disabled_checks: Sequence[Any] = (), **kwargs: Any) -> Callable[..., Any]:
    """:func:`jax.export.export` for a function that calls xlakern's kernels.

    Returns ``do_export(*args, **kwargs) -> jax.export.Exported``, like jax's. The program may call
    the custom calls of xlakern's modules and bridges; any other custom call goes through jax's own
    check, with the ``disabled_checks`` given. Other keywords (``platforms``, ...) are jax's.

    Example::

        exp = xlakern.export(jax.jit(lambda s: brainevent.BinaryArray(s) @ W))(spikes)
        open("step.bin", "wb").write(exp.serialize())
    """
    if not callable(fun):
        raise XlakernError(f"export: fun must be a function to export (or a jax.jit of one); got "
                           f"{type(fun).__name__}")
    if not hasattr(fun, "trace"):
        fun = jax.jit(fun)

    def do_export(*args: Any, **kw: Any) -> Any:
        # Lowering is what builds and registers the modules, so xlakern's targets are known only after
        # it: export once allowing every custom call, then check the foreign ones as jax would.
        lenient = _jax_export.export(fun, disabled_checks=[*disabled_checks,
                                                          _CHECK.custom_call(_compat.EXPORT_ALL_CUSTOM_CALLS)],
                                     **kwargs)(*args, **kw)
        allowed = {c.is_custom_call() for c in disabled_checks} | _compat.export_stable_targets()
        ours = _bridge.owned_targets()
        foreign = [t for t in custom_call_targets(lenient) if t not in ours and t not in allowed]
        if foreign:  # jax's own error, naming them
            _jax_export.export(fun, disabled_checks=[*disabled_checks, *map(_CHECK.custom_call, sorted(ours))],
                               **kwargs)(*args, **kw)
        return lenient

    return do_export


def _platforms_here() -> list[str]:
    """The platforms this process can run programs on, in jax.export's spelling ('cpu', 'cuda', 'rocm',
    'tpu'): the CPU always, and each other backend JAX has devices of."""
    found = ["cpu"]
    for device in jax.devices():
        name = device.platform
        if name == "gpu":
            name = "rocm" if "rocm" in getattr(device.client, "platform_version", "").lower() else "cuda"
        if name not in found:
            found.append(name)
    return found


def prepare_exported(exported: Any) -> Any:
    """Register the FFI targets an exported program calls, so that ``exported.call(...)`` runs here.

    xlakern's event operators and LIF simulators load by name (a cache hit, or one build on a new
    machine); the bridges' generic targets are registered. Modules of your own must already be loaded
    in this process (the same ``load_*`` call that built them: a cache hit). Returns ``exported``.
    Raises :class:`PlatformError` if the program was exported for other platforms only, and
    :class:`RegistrationError` naming every target still missing.

    Example::

        ops = xlakern.load_cuda_inline("ops", SOURCE)
        exp = xlakern.prepare_exported(jax.export.deserialize(blob))
        out = exp.call(x)
    """
    available = _platforms_here()
    here = [p for p in exported.platforms if p in available]
    if not here:
        raise PlatformError(f"this program was exported for {', '.join(exported.platforms)} and this process "
                            f"runs on {', '.join(available)}: export it again with platforms=[{available[-1]!r}, ...]")
    known = set().union(*map(_known_targets, here))
    missing = [t for t in custom_call_targets(exported) if t not in known]
    if not missing:
        return exported
    bridges = {b.name for b in _runtime.bridge_targets() if b.platform.lower() in here}
    event = None
    for target in missing:
        if target in bridges:
            _bridge.ensure_target(target)
            continue
        module = target.split(".", 1)[0]
        if module.startswith("xlakern_"):
            event = event or importlib.import_module(".event", __package__)
            for platform in here:  # (a module's name says its platform: at most one loads it)
                if event.load_kernel_module(module, canonical_platform(platform)):
                    break
    known = set().union(*map(_known_targets, here))
    missing = [t for t in missing if t not in known]
    # a program exported for several platforms names every platform's targets, and a process may load the
    # user's modules of the platform it runs on only: only a single-platform program's must all be here
    if missing and len(exported.platforms) == 1:
        modules = sorted({t.split(".", 1)[0] for t in missing})
        named = sorted({entry_target(t) for t in missing})  # as the user spells them
        raise RegistrationError(
            f"the exported program calls FFI targets that no module in this process provides: "
            f"{', '.join(named)}. Load the module{'s' if len(modules) > 1 else ''} {', '.join(map(repr, modules))} "
            f"first, with the same load_* call (name, sources, options) that built "
            f"{'them' if len(modules) > 1 else 'it'} when the program was exported (a cache hit; or call once the "
            f"operation whose kernel generator loads it), then prepare again")
    return exported


def _known_targets(platform: str) -> set[str]:
    """Targets a program may call here: xlakern's, jax's stable ones and any XLA holds for ``platform``."""
    held = _compat.xla_custom_call_targets(platform) or frozenset()
    return _bridge.owned_targets() | _compat.export_stable_targets() | held


def deserialize(blob: bytes | bytearray) -> Any:
    """:func:`jax.export.deserialize`, then :func:`prepare_exported`: an exported program ready to call.

    Example::

        exp = xlakern.deserialize(open("step.bin", "rb").read())
        currents = exp.call(spikes)
    """
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise XlakernError(f"deserialize: blob must be the bytes of Exported.serialize(); got {type(blob).__name__}")
    try:
        exported = _jax_export.deserialize(bytearray(blob))
    except Exception as e:  # noqa: BLE001  (a flatbuffer parser's many errors on bytes that are not one)
        raise XlakernError(f"deserialize: these {len(blob)} bytes are not a serialized jax.export program "
                           f"({type(e).__name__}: {e!s:.120}); pass what Exported.serialize() wrote") from e
    return prepare_exported(exported)
