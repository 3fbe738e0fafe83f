"""Rules for any primitive, under BrainEvent's names: per-input JVP rules and a loop batching rule.

:class:`XLACustomKernel` has its own ``def_jvp_rule2`` / ``def_batching_rule``; these two functions
also serve plain ``jax.extend.core.Primitive`` objects, which is how code written for BrainEvent
uses them.

Example::

    from jax.interpreters import batching
    batching.primitive_batchers[prim] = functools.partial(xlakern.general_batching_rule, prim)
    xlakern.defjvp(prim, lambda t, x, y, **kw: t * y, lambda t, x, y, **kw: t * x)
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from ._primitive import XLACustomKernel, _zero_tangent
from .errors import XlakernError


def _add(a: Any, b: Any) -> Any:
    """a + b where None stands for no contribution."""
    if a is None:
        return b
    return a if b is None else a + b


def defjvp(primitive: Any, *jvp_rules: Optional[Callable]) -> None:
    """One forward-mode rule per input of ``primitive``: ``rule(tangent, *primals, **params)`` gives that
    input's contribution to the output tangent (a list of them for a primitive with several results),
    or pass ``None`` for an input with none. The output tangent is the sum of the contributions.

    ``primitive`` is an :class:`XLACustomKernel` (same as ``op.def_jvp_rule2(*jvp_rules)``) or a plain
    ``jax.extend.core.Primitive``; for the latter ``params`` are its bind parameters.

    Example::

        prim = jax.extend.core.Primitive("mul2")
        prim.def_impl(lambda x, y: x * y); prim.def_abstract_eval(lambda x, y: x)
        xlakern.defjvp(prim, lambda t, x, y: t * y, lambda t, x, y: t * x)
        jax.jvp(prim.bind, (2.0, 3.0), (1.0, 0.0))   # (6.0, 3.0)
    """
    if not all(r is None or callable(r) for r in jvp_rules):
        raise XlakernError("defjvp: every rule must be callable or None (one per input of the primitive)")
    if isinstance(primitive, XLACustomKernel):
        primitive.def_jvp_rule2(*jvp_rules)
        return
    from jax.extend.core import Primitive

    if not isinstance(primitive, Primitive):
        raise XlakernError(f"defjvp: expected a jax Primitive or an xlakern.XLACustomKernel; "
                           f"got {type(primitive).__name__}")
    name = primitive.name

    def jvp(primals, tangents, **params):
        if len(primals) != len(jvp_rules):
            raise XlakernError(f"defjvp: {name} was given {len(jvp_rules)} rule(s) but is bound with "
                               f"{len(primals)} input(s); give one rule (or None) per input")
        out = primitive.bind(*primals, **params)
        total = None
        for rule, t in zip(jvp_rules, tangents):
            if rule is None or type(t) is ad.Zero:
                continue
            contrib = rule(t, *primals, **params)
            if primitive.multiple_results:
                contrib = list(contrib)
                total = contrib if total is None else [_add(a, b) for a, b in zip(total, contrib)]
            else:
                total = _add(total, contrib)
        if primitive.multiple_results:
            zeros = [_zero_tangent(o) for o in out]
            total = zeros if total is None else [z if t is None else t for z, t in zip(zeros, total)]
        elif total is None:
            total = _zero_tangent(out)
        return out, total

    ad.primitive_jvps[primitive] = jvp


def general_batching_rule(prim: Any, args: Sequence[Any], axes: Sequence[Optional[int]], **kwargs: Any):
    """A batching rule for any primitive: each batch element runs the unbatched primitive, one after
    another (``jax.lax.map``). Returns ``(outputs, out_axes)`` with the batch on axis 0 (``None`` axes
    when nothing is batched, which runs the primitive once).

    ``prim`` is a plain ``jax.extend.core.Primitive`` (``kwargs`` are its bind parameters) or an
    :class:`XLACustomKernel` (``kwargs`` are what its batching rule receives: ``outs``, ``backend`` and
    the call's keywords).

    Example::

        from jax.interpreters import batching
        batching.primitive_batchers[prim] = functools.partial(xlakern.general_batching_rule, prim)
        # or, for an XLACustomKernel:
        op.def_batching_rule(functools.partial(xlakern.general_batching_rule, op))
    """
    if len(args) != len(axes):
        raise XlakernError(f"general_batching_rule: {len(args)} argument(s) but {len(axes)} batch axes")
    custom = isinstance(prim, XLACustomKernel)
    multiple = True if custom else prim.multiple_results

    def call(xs):
        return prim(*xs, **kwargs) if custom else prim.bind(*xs, **kwargs)

    def axes_like(out, axis):
        return [axis] * len(out) if multiple else axis

    if all(a is None for a in axes):
        out = call(list(args))
        return out, axes_like(out, None)
    batched = [i for i, a in enumerate(axes) if a is not None]
    moved = [jnp.moveaxis(args[i], axes[i], 0) for i in batched]

    def one(slices):
        full = list(args)
        for i, x in zip(batched, slices):
            full[i] = x
        return call(full)

    out = jax.lax.map(one, moved)
    return out, axes_like(out, 0)


__all__ = ["defjvp", "general_batching_rule"]
