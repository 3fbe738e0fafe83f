"""``XLACustomKernel``: one named JAX primitive with a kernel generator per backend and platform.

Example::

    import jax, jax.numpy as jnp, xlakern

    def gen(outs, alpha):                      # called once per (outs, kwargs, backend)
        return lambda x: [jnp.where(x > 0, x, alpha * x)]

    op = xlakern.XLACustomKernel("leaky_relu")
    op.def_kernel("jnp", "cpu", gen)
    y, = jax.jit(lambda x: op(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], alpha=0.1))(x)

How it works. ``op(*arrays, outs=..., **kwargs)`` binds one primitive whose static params
are the output structs, the kwargs, the per-call ``backend=`` and a token of the
process-wide backend choice. At lowering, the platform (cpu / cuda) picks the table of
kernels, the backend is resolved (per call, :func:`xlakern.config.set_backend`,
:meth:`XLACustomKernel.set_default`, first registered), the generator is called (cached per
platform, backend, outs and kwargs) and the function it returns is lowered in place with
``mlir.lower_fun``, so every ``ffi_call`` inside it becomes a custom call of this program.

vmap without a user batching rule binds the same primitive with one more "batch level"
(operand batch axes moved to 0). Such a call lowers to ``jax.vmap`` of the generated
function, which lets the ffi_calls inside batch themselves through their ``vmap_method``
(one launch for the whole batch); a function whose ffi_calls have no ``vmap_method``
(``NotImplementedError`` under vmap) is run as a loop (``lax.map``) instead. AD of a batched
call is the vmap of the unbatched JVP / transpose, so grad-of-vmap and vmap-of-grad both
reach the user's rules with unbatched operands.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, mlir
from jax.interpreters import batching as jax_batching

from . import _bridge, _compat, _registry
from . import config as _config
from ._arrays import as_struct, describes_array
from ._warp import require_warp
# The errors live in errors.py; imported here too, where they were first defined.
from .errors import BackendError, CallError, KernelGenerationError, XlakernError

__all__ = ["XLACustomKernel", "KernelEntry", "BackendError", "KernelGenerationError"]

# mlir lowering platform -> the platform name kernels are registered under.
_LOWERING_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One registered kernel generator: ``op._kernels[platform][backend]``.

    Example::

        >>> op._kernels
        {'cpu': {'numba': KernelEntry(backend='numba', platform='cpu', generator=scale_gen)}}
    """

    backend: str
    platform: str
    kernel_generator: Callable[..., Callable]

    def __repr__(self) -> str:
        g = self.kernel_generator
        gname = getattr(g, "__qualname__", None) or getattr(g, "__name__", None) or repr(g)
        return f"KernelEntry(backend={self.backend!r}, platform={self.platform!r}, generator={gname})"


def _struct(o: Any, op: str, i: int):
    if not describes_array(o):
        raise CallError(f"{op}: outs[{i}] must be a jax.ShapeDtypeStruct (or have .shape and .dtype); "
                        f"got {type(o).__name__}")
    return as_struct(o, lambda: f"{op}: outs[{i}]")


def _rewrap(exc: BaseException, msg: str) -> BaseException:
    """An error carrying ``msg``, of the original xlakern type where there is one."""
    if isinstance(exc, XlakernError):
        try:
            return type(exc)(msg)
        except Exception:  # a subclass with another constructor
            pass
    return KernelGenerationError(msg)


def _as_list(result: Any) -> list:
    """A generated function's result (one array, a tuple/list, any pytree) as a flat list."""
    return list(jax.tree.leaves(result))


def _zero_tangent(x: Any):
    aval = _compat.get_aval(x)
    return ad.Zero(aval.to_tangent_aval())


def _is_zero(t: Any) -> bool:
    return type(t) is ad.Zero


def _instantiate(t: Any, aval: Any):
    if _is_zero(t):
        return jnp.zeros(aval.shape, aval.dtype)
    return t


def _strip_batch(shape: tuple, batch: tuple, i: int) -> tuple:
    """The unbatched shape of operand ``i`` of a call with batch levels ``batch``."""
    shape = tuple(shape)
    for _, dims in reversed(batch):  # outermost level first: its axis leads
        if dims[i] is not None:
            shape = shape[1:]
    return shape


class XLACustomKernel:
    """A named JAX primitive with one kernel generator per (platform, backend).

    A generator is called as ``generator(outs=[ShapeDtypeStruct, ...], **kwargs)`` with the
    call's static keyword arguments and returns a function of the input arrays (one array,
    or a list/tuple with one array per output). Register generators with :meth:`def_kernel`
    or the shorthands :meth:`def_numba_kernel` (cpu), :meth:`def_numba_cuda_kernel` (gpu),
    :meth:`def_warp_kernel` (gpu and cpu), :meth:`def_cpp_kernel` (cpu) and
    :meth:`def_cuda_kernel` (gpu). The platform the arrays live on picks the table; the
    backend within it is chosen per call (``backend=``), then process-wide
    (:func:`xlakern.config.set_backend`), then by :meth:`set_default`, then the first
    registered.

    ``op._kernels`` is ``{platform: {backend: KernelEntry}}``.

    ``batching='auto'`` (default): vmap without :meth:`def_batching_rule` runs the generated
    function under ``jax.vmap``, so each ffi_call inside batches by its own ``vmap_method``
    (one launch when it has one; a loop when it has none). That trusts the kernel to handle
    what its ``vmap_method`` hands it: e.g. Warp's ``jax_kernel`` defaults to
    ``'broadcast_all'`` and gives the kernel the whole batch as larger arrays. Use
    ``batching='loop'`` for an op whose kernels must see one batch element per launch.

    Example::

        op = xlakern.XLACustomKernel("scale")
        op.def_cpp_kernel(lambda outs: lambda x, s: mod.scale(x, s, outs=outs[0]))
        op.def_jvp_rule2(lambda t, x, s, **kw: op(t, s, **kw), None)
        op.def_transpose_rule(lambda cts, x, s, **kw: [op(cts[0], s, **kw)[0], None])
        y, = op(x, s, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)])
    """

    def __init__(self, name: str, doc: Optional[str] = None, batching: str = "auto"):
        # Here, not at the top: jax.extend imports Pallas too (~17 ms that `import xlakern` skips).
        from jax.extend.core import Primitive

        if not isinstance(name, str) or not name:
            raise XlakernError(f"XLACustomKernel needs a non-empty string name; got {name!r}")
        if batching not in ("auto", "loop"):
            raise XlakernError(f"XLACustomKernel batching must be 'auto' (one launch where the kernel's "
                               f"ffi_calls batch, else a loop) or 'loop'; got {batching!r}")
        self.batching = batching
        self.name = name
        if doc is not None:
            self.__doc__ = doc
        self.primitive = Primitive(name)
        self.primitive.multiple_results = True
        self.primitive.def_impl(_compat.eager_impl(self.primitive))
        self.primitive.def_abstract_eval(self._abstract_eval)
        # Every platform gets a lowering now, so a platform without kernels reports which
        # platforms have them instead of jax's "MLIR translation rule not found".
        for lowering_platform, platform in _LOWERING_PLATFORMS.items():
            mlir.register_lowering(self.primitive, functools.partial(self._lower, platform=platform),
                                   platform=lowering_platform)
        jax_batching.primitive_batchers[self.primitive] = self._default_batching
        ad.primitive_jvps[self.primitive] = self._jvp
        ad.primitive_transposes[self.primitive] = self._transpose

        self._kernels: dict[str, dict[str, KernelEntry]] = {}
        self._defaults: dict[str, str] = {}
        self._jvp_rules: Optional[tuple] = None
        self._transpose_rule: Optional[Callable] = None
        self._batching_rule: Optional[Callable] = None
        self._generated: dict[tuple, Callable] = {}
        self._lock = threading.RLock()
        # How many times a generator ran, per (platform, backend); tests and users can see
        # that lowering the same call again built nothing.
        self.generator_calls: dict[tuple[str, str], int] = {}
        self.tags: frozenset[str] = frozenset()
        self._aliases: dict[str, str] = {}  # def_backend_alias: another name -> a backend's
        _registry.add(self)

    def __repr__(self) -> str:
        return f"<XLACustomKernel '{self.name}': {self._describe()}>"

    # ------------------------------------------------------------------ registration

    def def_tags(self, *tags: str) -> None:
        """Labels to find this kernel by (:func:`xlakern.get_primitives_by_tags`); replaces earlier tags.

        Example::

            op.def_tags("csr", "binary", "mv")
        """
        if not all(isinstance(t, str) and t for t in tags):
            raise XlakernError(f"{self.name}.def_tags: tags must be non-empty strings; got {tags!r}")
        self.tags = frozenset(tags)

    def def_kernel(self, backend: str, platform: str, generator: Callable, asdefault: bool = False) -> None:
        """Register ``generator`` as the ``backend`` kernel for ``platform`` ('cpu', 'gpu', 'tpu').

        The first kernel of a platform is its default until :meth:`set_default` or
        ``asdefault=True`` says otherwise. Registering a backend again replaces it.

        Example::

            op.def_kernel("numba", "cpu", my_generator)
        """
        if not isinstance(backend, str) or not backend:
            raise XlakernError(f"{self.name}.def_kernel: backend must be a non-empty string; got {backend!r}")
        platform = _config.canonical_platform(platform)
        if not callable(generator):
            raise XlakernError(f"{self.name}.def_kernel: generator must be callable (outs=..., **kwargs) -> "
                               f"function of arrays; got {type(generator).__name__}")
        with self._lock:
            table = self._kernels.setdefault(platform, {})
            replaced = backend in table
            table[backend] = KernelEntry(backend, platform, generator)
            if replaced:
                self._generated = {k: v for k, v in self._generated.items() if k[:2] != (platform, backend)}
        if asdefault:
            self.set_default(platform, backend)
        elif replaced:
            _config._bump_generation()  # already-jitted code must pick up the new generator

    def def_numba_kernel(self, generator: Callable, asdefault: bool = False) -> None:
        """Register a generator of Numba CPU kernels (backend 'numba', platform 'cpu').

        Example::

            def gen(outs, **kw):
                return lambda x: xlakern.numba_kernel(kern, outs=outs[0])(x)
            op.def_numba_kernel(gen)
        """
        self.def_kernel("numba", "cpu", generator, asdefault)

    def def_numba_cuda_kernel(self, generator: Callable, asdefault: bool = False) -> None:
        """Register a generator of Numba CUDA kernels (backend 'numba_cuda', platform 'gpu').

        Example::

            op.def_numba_cuda_kernel(lambda outs, **kw: xlakern.numba_cuda_kernel(k, outs=outs[0], launch_dims=n))
        """
        self.def_kernel("numba_cuda", "gpu", generator, asdefault)

    def def_warp_kernel(self, generator: Callable, platform: Optional[str] = None, asdefault: bool = False) -> None:
        """Register a generator of Warp kernels (backend 'warp').

        ``platform=None`` registers it for 'gpu' and 'cpu' (Warp's JAX bridge runs kernels on
        both). Warp is imported only when a Warp kernel is chosen; without Warp installed
        that raises an error saying so and naming the other backends.

        Example::

            def gen(outs, **kw):
                t = xlakern.jaxinfo_to_warpinfo(outs[0])
                @warp.kernel
                def k(x: t, out: t):
                    i = warp.tid(); out[i] = 2.0 * x[i]
                return warp.jax_kernel(k, launch_dims=[outs[0].shape[0]])
            op.def_warp_kernel(gen)
        """
        platforms = ("gpu", "cpu") if platform is None else (platform,)
        for p in platforms:
            self.def_kernel("warp", p, generator, asdefault)

    def def_cpp_kernel(self, generator: Callable, asdefault: bool = False) -> None:
        """Register a generator using C++ :class:`CompiledModule` functions (backend 'cpp', platform 'cpu').

        Example::

            op.def_cpp_kernel(lambda outs, **kw: lambda x: mod.add_one(x, outs=outs[0]))
        """
        self.def_kernel("cpp", "cpu", generator, asdefault)

    def def_cuda_kernel(self, generator: Callable, asdefault: bool = False) -> None:
        """Register a generator using CUDA :class:`CompiledModule` functions (backend 'cuda', platform 'gpu').

        Example::

            op.def_cuda_kernel(lambda outs, **kw: lambda x: cmod.add_one(x, outs=outs[0]))
        """
        self.def_kernel("cuda", "gpu", generator, asdefault)

    def def_backend_alias(self, alias: str, backend: str) -> None:
        """Let ``backend=alias`` select the ``backend`` kernel: a name another library gives the same
        kind of kernel, so that calls written for it keep working.

        Example::

            op.def_backend_alias("jax_raw", "jnp")   # op(..., backend="jax_raw") runs the jnp kernel
        """
        if not (isinstance(alias, str) and alias and isinstance(backend, str) and backend):
            raise XlakernError(f"{self.name}.def_backend_alias: alias and backend must be non-empty strings; got "
                               f"{alias!r}, {backend!r}")
        with self._lock:
            if any(alias in table for table in self._kernels.values()):
                raise XlakernError(f"{self.name}.def_backend_alias: '{alias}' is a registered backend, not an alias")
            self._aliases[alias] = backend

    def set_default(self, platform: str, backend: str) -> None:
        """Make ``backend`` this op's default on ``platform`` (takes effect in jitted code too).

        Example::

            op.set_default("cpu", "cpp")
        """
        platform = _config.canonical_platform(platform)
        backend = self._aliases.get(backend, backend)
        with self._lock:
            if backend not in self._kernels.get(platform, {}):
                raise BackendError(f"{self.name}.set_default: no '{backend}' kernel for platform '{platform}'. "
                                   f"Registered: {self._describe()}")
            changed = self._defaults.get(platform) != backend
            self._defaults[platform] = backend
        if changed:
            _config._bump_generation()

    def get_default(self, platform: str) -> Optional[str]:
        """The backend this op uses on ``platform`` when neither the call nor the config chooses.

        Example::

            >>> op.get_default("cpu")
            'numba'
        """
        platform = _config.canonical_platform(platform)
        table = self._kernels.get(platform, {})
        d = self._defaults.get(platform)
        return d if d in table else next(iter(table), None)

    @property
    def defaults(self) -> dict[str, str]:
        """``{platform: default backend}`` for every platform with kernels."""
        return {p: self.get_default(p) for p in self._kernels}

    def available_backends(self, platform: str) -> list[str]:
        """Backends registered for ``platform``, in registration order."""
        return list(self._kernels.get(_config.canonical_platform(platform), {}))

    def def_jvp_rule2(self, *rules: Optional[Callable]) -> None:
        """One forward-mode rule per input: ``rule(tangent, *primals, **kwargs)`` returns a list
        with one tangent (or None) per output; ``None`` for an input that has no contribution.

        ``kwargs`` holds ``outs``, ``backend`` and the call's keyword arguments, so a rule
        may call the op itself: ``lambda t, x, s, **kw: op(t, s, **kw)``. Outputs' tangents
        are the sums over the inputs. Reverse mode also needs :meth:`def_transpose_rule`
        for every primitive a rule uses linearly.

        Example::

            op.def_jvp_rule2(lambda t, x, s, **kw: op(t, s, **kw), lambda t, x, s, **kw: [x * t])
        """
        if not all(r is None or callable(r) for r in rules):
            raise XlakernError(f"{self.name}.def_jvp_rule2: every rule must be callable or None")
        self._jvp_rules = tuple(rules)

    def def_transpose_rule(self, rule: Callable) -> None:
        """``rule(cotangents, *primals, **kwargs)`` returns one cotangent or None per input.

        ``cotangents`` is a list (one array per output; symbolic zeros are given as zeros);
        linear inputs arrive as ``jax.interpreters.ad.UndefinedPrimal`` (test with
        ``ad.is_undefined_primal``); return None for the others.

        Example::

            op.def_transpose_rule(lambda cts, x, s, **kw: [op(cts[0], s, **kw)[0], None])
        """
        if not callable(rule):
            raise XlakernError(f"{self.name}.def_transpose_rule: rule must be callable")
        self._transpose_rule = rule

    def def_batching_rule(self, rule: Callable) -> None:
        """``rule(args, axes, **kwargs)`` returns ``(outputs, out_axes)``, as for any jax primitive.

        Without one, vmap runs the generated function under ``jax.vmap`` (one launch when
        its ffi_calls have a ``vmap_method``), else as a loop.

        Example::

            op.def_batching_rule(lambda args, axes, **kw: (op(*args, **kw), [axes[0]]))
        """
        if not callable(rule):
            raise XlakernError(f"{self.name}.def_batching_rule: rule must be callable")
        self._batching_rule = rule
        jax_batching.primitive_batchers[self.primitive] = self._user_batching

    # ------------------------------------------------------------------ calling

    def __call__(self, *ins: Any, outs: Any, backend: Optional[str] = None, **kwargs: Any) -> Any:
        """Run the op: ``outs`` is a ShapeDtypeStruct or a list/pytree of them; the result has
        its structure. ``kwargs`` must be hashable; they are static (part of the compiled
        program) and reach the generator.

        ``zeroed_outputs=`` (output indices, ``True``, or a callable of the other kwargs
        returning indices) does not reach the generator: every xlakern kernel the generated
        function calls without a ``zeroed_outputs`` of its own (``numba_kernel``,
        ``numba_cuda_kernel``, ``numba_cuda_callable``, ``mod.fn``) zeroes those outputs inside
        its own FFI call. A generated function that calls no xlakern kernel is an error.

        Example::

            y, = op(x, outs=[jax.ShapeDtypeStruct(x.shape, x.dtype)], alpha=0.1)
        """
        flat, tree = jax.tree.flatten(outs)
        if not flat:
            raise CallError(f"{self.name}: outs= must describe at least one output (jax.ShapeDtypeStruct)")
        structs = tuple(_struct(o, self.name, i) for i, o in enumerate(flat))
        if kwargs.get(_ZEROED) is not None:
            kwargs[_ZEROED] = _zeroed_indices(self.name, kwargs[_ZEROED], len(structs), kwargs)
        for k, v in kwargs.items():
            if isinstance(v, _compat.Tracer):
                raise CallError(
                    f"{self.name}: keyword argument '{k}' is a traced value, but keyword arguments are static "
                    f"(they reach the kernel generator at compile time). Pass a Python value (e.g. mark it "
                    f"with jax.jit(..., static_argnames=['{k}'])) or pass it as an input array")
            try:
                hash(v)
            except TypeError:
                raise CallError(f"{self.name}: keyword argument '{k}'={v!r} must be hashable (it is a static "
                                f"parameter); use e.g. a tuple instead of a list") from None
        if backend is not None:
            if not isinstance(backend, str):
                raise CallError(f"{self.name}: backend= must be a backend name or None; got {backend!r}")
            backend = self._aliases.get(backend, backend)
            if not any(backend in t for t in self._kernels.values()):
                raise BackendError(f"{self.name}: unknown backend '{backend}'. Registered: {self._describe()}")
        arrays = [x if isinstance(x, (jax.Array, _compat.Tracer)) else jnp.asarray(x) for x in ins]
        result = self.primitive.bind(
            *arrays, outs=structs, backend=backend, kwargs=tuple(sorted(kwargs.items(), key=lambda kv: kv[0])),
            selection=_config.selection_token(), batch=())
        return jax.tree.unflatten(tree, list(result))

    # ------------------------------------------------------------------ primitive rules

    def _abstract_eval(self, *avals, outs, backend, kwargs, selection, batch):
        lead = tuple(size for size, _ in reversed(batch))
        return [_compat.ShapedArray(lead + tuple(o.shape), o.dtype) for o in outs]

    def _describe(self) -> str:
        if not self._kernels:
            return "no kernels"
        parts = []
        for p, table in self._kernels.items():
            d = self.get_default(p)
            parts.append(f"{p}: [{', '.join(b + (' (default)' if b == d else '') for b in table)}]")
        if self._aliases:
            parts.append("aliases: " + ", ".join(f"{a} -> {b}" for a, b in self._aliases.items()))
        return "; ".join(parts)

    def _resolve(self, platform: str, backend: Optional[str], selection) -> str:
        table = self._kernels.get(platform)
        if not table:
            raise BackendError(
                f"{self.name}: no kernel for platform '{platform}' (registered: {self._describe()}). Register one "
                f"with def_kernel(backend, '{platform}', generator), or run on a platform that has one "
                f"(e.g. inside jax.default_device(jax.devices('cpu')[0]))")
        if backend is not None:
            if backend not in table:
                raise BackendError(
                    f"{self.name}: backend '{backend}' has no kernel for platform '{platform}'; there: "
                    f"{', '.join(table)}. Registered: {self._describe()}")
            return backend
        chosen = dict(selection[0]).get(platform)
        if chosen in table:
            return chosen
        return self.get_default(platform)

    def _alternatives(self, platform: str, backend: str) -> str:
        others = [b for b in self._kernels.get(platform, {}) if b != backend]
        if not others:
            return f"no other backend is registered for '{platform}'"
        return (f"other backends for '{platform}': {', '.join(others)} (choose with op(..., backend='{others[0]}') "
                f"or xlakern.config.set_backend('{platform}', '{others[0]}'))")

    def _generated_function(self, platform: str, backend: str, outs: tuple, kwargs: tuple) -> Callable:
        kwargs = tuple(kv for kv in kwargs if kv[0] != _ZEROED)  # for the kernels, not the generator
        key = (platform, backend, outs, kwargs)
        with self._lock:
            fn = self._generated.get(key)
            if fn is not None:
                return fn
            entry = self._kernels[platform][backend]
            if backend == "warp":
                try:
                    require_warp()
                except XlakernError as e:
                    raise type(e)(f"{self.name}: the 'warp' backend was chosen for '{platform}' but {e}; "
                                  f"{self._alternatives(platform, backend)}") from e
            self.generator_calls[(platform, backend)] = self.generator_calls.get((platform, backend), 0) + 1
            try:
                fn = entry.kernel_generator(outs=list(outs), **dict(kwargs))
            except Exception as e:
                raise _rewrap(e, f"{self.name}: the '{backend}' kernel generator for '{platform}' failed: "
                                 f"{type(e).__name__}: {e}. {self._alternatives(platform, backend)}") from e
            if not callable(fn):
                raise KernelGenerationError(
                    f"{self.name}: the '{backend}' generator for '{platform}' returned {type(fn).__name__}, "
                    f"not a function of arrays")
            self._generated[key] = fn
            return fn

    def _checked(self, fn: Callable, outs: tuple, platform: str, backend: str) -> Callable:
        """``fn`` returning a flat list that matches ``outs`` (else a clear error)."""

        def call(*xs):
            res = _as_list(fn(*xs))
            if len(res) != len(outs):
                raise KernelGenerationError(
                    f"{self.name}: the '{backend}' kernel for '{platform}' returned {len(res)} array(s); outs= "
                    f"describes {len(outs)}")
            for i, (r, o) in enumerate(zip(res, outs)):
                if tuple(r.shape) != tuple(o.shape) or np.dtype(r.dtype) != np.dtype(o.dtype):
                    raise KernelGenerationError(
                        f"{self.name}: the '{backend}' kernel for '{platform}' returned output {i} as "
                        f"{np.dtype(r.dtype).name}{list(r.shape)}; outs= says {np.dtype(o.dtype).name}{list(o.shape)}")
            return res

        return call

    def _lower(self, ctx, *args, platform, outs, backend, kwargs, selection, batch):
        name = self._resolve(platform, backend, selection)
        fn = self._checked(self._generated_function(platform, name, outs, kwargs), outs, platform, name)
        for size, dims in batch:  # innermost level first
            fn = _batched(fn, dims, loop=self.batching == "loop")
        try:
            with _bridge.inherited_zeroed(dict(kwargs).get(_ZEROED) or None) as zeroed:
                lowered = mlir.lower_fun(fn, multiple_results=True)(ctx, *args)
        except (BackendError, KernelGenerationError):
            raise
        except Exception as e:
            raise _rewrap(e, f"{self.name}: tracing the '{name}' kernel for '{platform}' failed: "
                             f"{type(e).__name__}: {e}. {self._alternatives(platform, name)}") from e
        if zeroed is not None and not zeroed.used:
            raise CallError(
                f"{self.name}: zeroed_outputs={zeroed.indices} reached no xlakern kernel: the '{name}' kernel for "
                f"'{platform}' called no numba_kernel / numba_cuda_kernel / numba_cuda_callable / mod.fn while it "
                f"was traced (a jax.jit-ed function may reuse an earlier trace). Zero the outputs in that kernel, "
                f"or pass zeroed_outputs to the wrapper its generator builds")
        return lowered

    def _rule_kwargs(self, outs, backend, kwargs) -> dict:
        return {"outs": list(outs), "backend": backend, **dict(kwargs)}

    # vmap ----------------------------------------------------------------

    def _default_batching(self, args, dims, *, batch, **params):
        if all(d is None for d in dims):
            return self.primitive.bind(*args, batch=batch, **params), [None] * len(params["outs"])
        moved, size = [], None
        for a, d in zip(args, dims):
            if d is None:
                moved.append(a)
            else:
                size = a.shape[d]
                moved.append(a if d == 0 else jnp.moveaxis(a, d, 0))
        level = (int(size), tuple(None if d is None else 0 for d in dims))
        out = self.primitive.bind(*moved, batch=batch + (level,), **params)
        return out, [0] * len(out)

    def _user_batching(self, args, dims, *, outs, backend, kwargs, selection, batch):
        if batch:  # only our own rule makes batch levels
            return self._default_batching(args, dims, outs=outs, backend=backend, kwargs=kwargs,
                                          selection=selection, batch=batch)
        res, out_dims = self._batching_rule(list(args), list(dims), **self._rule_kwargs(outs, backend, kwargs))
        return _as_list(res), list(jax.tree.leaves(out_dims, is_leaf=lambda x: x is None))

    # JVP -----------------------------------------------------------------

    def _jvp(self, primals, tangents, *, outs, backend, kwargs, selection, batch):
        params = dict(outs=outs, backend=backend, kwargs=kwargs, selection=selection)
        if self._jvp_rules is None:
            raise XlakernError(f"{self.name}: no JVP rule; differentiate it after op.def_jvp_rule2(...) "
                               f"(one rule per input)")
        if len(self._jvp_rules) != len(primals):
            raise XlakernError(f"{self.name}: def_jvp_rule2 was given {len(self._jvp_rules)} rule(s) but the op "
                               f"is called with {len(primals)} input(s); give one rule (or None) per input")
        if batch:
            return self._jvp_batched(primals, tangents, params, batch)
        primal_out = self.primitive.bind(*primals, batch=(), **params)
        kw = self._rule_kwargs(outs, backend, kwargs)
        total: list = [None] * len(outs)
        for i, (t, rule) in enumerate(zip(tangents, self._jvp_rules)):
            if rule is None or _is_zero(t):
                continue
            contrib = rule(t, *primals, **kw)
            contrib = list(contrib) if isinstance(contrib, (list, tuple)) else [contrib]
            if len(contrib) != len(outs):
                raise XlakernError(f"{self.name}: the JVP rule of input {i} returned {len(contrib)} tangent(s); "
                                   f"the op has {len(outs)} output(s) (use None for no contribution)")
            for j, c in enumerate(contrib):
                if c is not None and not _is_zero(c):
                    total[j] = c if total[j] is None else total[j] + c
        tangent_out = [_zero_tangent(p) if t is None else t for p, t in zip(primal_out, total)]
        return primal_out, tangent_out

    def _jvp_batched(self, primals, tangents, params, batch):
        n = len(primals)
        nz = [i for i, t in enumerate(tangents) if not _is_zero(t)]

        def unbatched(*xs):
            ps, ts = list(xs[:n]), xs[n:]

            def g(*vals):
                full = list(ps)
                for i, v in zip(nz, vals):
                    full[i] = v
                return self.primitive.bind(*full, batch=(), **params)

            out, tout = jax.jvp(g, tuple(ps[i] for i in nz), tuple(ts))
            return list(out), list(tout)

        fn = unbatched
        for _, dims in batch:
            fn = jax.vmap(fn, in_axes=tuple(dims) + tuple(dims[i] for i in nz), out_axes=0)
        out, tout = fn(*primals, *[tangents[i] for i in nz])
        return out, tout

    # transpose -----------------------------------------------------------

    def _transpose(self, cts, *args, outs, backend, kwargs, selection, batch):
        if self._transpose_rule is None:
            raise XlakernError(f"{self.name}: no transpose rule; reverse-mode AD (jax.grad, jax.vjp) through this "
                               f"op needs op.def_transpose_rule(...)")
        params = dict(outs=outs, backend=backend, kwargs=kwargs, selection=selection)
        lead = tuple(size for size, _ in reversed(batch))
        out_avals = [_compat.ShapedArray(lead + tuple(o.shape), o.dtype) for o in outs]
        cts = [_instantiate(c, a) for c, a in zip(cts, out_avals)]
        if batch:
            return self._transpose_batched(cts, args, params, batch)
        res = self._transpose_rule(list(cts), *args, **self._rule_kwargs(outs, backend, kwargs))
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        if len(res) != len(args):
            raise XlakernError(f"{self.name}: the transpose rule returned {len(res)} cotangent(s); the op has "
                               f"{len(args)} input(s) (None for inputs that are not linear)")
        return [r if ad.is_undefined_primal(a) else None for r, a in zip(res, args)]

    def _transpose_batched(self, cts, args, params, batch):
        lin = [i for i, a in enumerate(args) if ad.is_undefined_primal(a)]
        dfn = [i for i, a in enumerate(args) if not ad.is_undefined_primal(a)]
        lin_avals = [jax.ShapeDtypeStruct(_strip_batch(args[i].aval.shape, batch, i), args[i].aval.dtype) for i in lin]
        nout = len(cts)

        def unbatched(*xs):
            c, d = list(xs[:nout]), xs[nout:]

            def f(*lin_vals):
                full: list = [None] * len(args)
                for i, v in zip(dfn, d):
                    full[i] = v
                for i, v in zip(lin, lin_vals):
                    full[i] = v
                return list(self.primitive.bind(*full, batch=(), **params))

            return list(jax.linear_transpose(f, *lin_avals)(c))

        fn = unbatched
        for _, dims in batch:
            fn = _transpose_level(fn, dims, nout, lin, dfn)
        res = fn(*cts, *[args[i] for i in dfn])
        out: list = [None] * len(args)
        for i, r in zip(lin, res):
            out[i] = r
        return out


_ZEROED = "zeroed_outputs"


def _zeroed_indices(op: str, value: Any, n_outputs: int, kwargs: dict) -> tuple[int, ...]:
    """``zeroed_outputs`` of an op call as a checked tuple of output indices (a static param)."""
    if callable(value):
        params = {k: v for k, v in kwargs.items() if k != _ZEROED}
        mask = _bridge.zeroed_mask(op, value, n_outputs, None, params)
    else:
        mask = _bridge.zeroed_mask(op, value, n_outputs, None)
    return tuple(o for o in range(n_outputs) if mask >> o & 1)


def _transpose_level(fn: Callable, dims: tuple, nout: int, lin: list, dfn: list) -> Callable:
    """vmap of an unbatched transpose over one batch level; cotangents of linear inputs
    that this level does not batch are summed over the level's axis."""

    def level(*xs):
        res = jax.vmap(fn, in_axes=(0,) * nout + tuple(dims[i] for i in dfn), out_axes=0)(*xs)
        return [r if dims[i] == 0 else r.sum(0) for r, i in zip(res, lin)]

    return level


def _batched(fn: Callable, dims: tuple, loop: bool = False) -> Callable:
    """``fn`` over one batch level: one ``jax.vmap`` (inner ffi_calls batch through their
    ``vmap_method``), or a ``lax.map`` loop when an inner call cannot be batched (or ``loop``)."""

    def batched(*xs):
        if not loop:
            try:
                return list(jax.vmap(fn, in_axes=tuple(dims), out_axes=0)(*xs))
            except NotImplementedError:
                # jax.ffi.ffi_call(vmap_method=None) refuses vmap: run one call per element.
                pass
        idx = [i for i, d in enumerate(dims) if d is not None]

        def one(sl):
            full = list(xs)
            for i, v in zip(idx, sl):
                full[i] = v
            return list(fn(*full))

        return list(jax.lax.map(one, tuple(xs[i] for i in idx)))

    return batched
