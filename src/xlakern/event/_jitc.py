"""Just-in-time connectivity (JITC): random matrices regenerated from a seed inside the kernel on
every call, so a network of N neurons costs O(N) memory whatever its synapse count.

Names and arguments are BrainEvent 0.3's. A matrix ``M`` of ``shape=(m, n)`` connects each pair
with probability ``prob``; its weights are one scalar (``jits*``), uniform in ``(w_low, w_high]``
(``jitu*``) or normal ``(w_loc, w_scale)`` (``jitn*``). ``corder=True`` generates ``M`` row by row
(``M @ v`` is a gather), ``corder=False`` column by column (``M @ v`` is a scatter); the two are
different matrices. ``transpose=True`` computes ``M.T @ v``.

Pick ``corder`` for the product a loop calls every step with sparse spikes: the scatter regenerates only
the generated rows of the active entries (1% of them at 1% activity), the gather regenerates every
row. On an H100 at 4M neurons, K = 1,000 and 1% active, ``BinaryArray(s) @ M`` with ``corder=True`` (a
scatter) took 0.48 ms a step and ``M @ BinaryArray(s)`` (a gather) 8.8 ms (bench/RESULTS.md, sessions 80
and 83); ``corder=False`` swaps the two.

The promise: one ``(seed, prob, shape, corder)`` is one matrix, bit for bit, on CPU and GPU, in
the mv and mm operators, in both orientations, with any batch, and ``jit{s,u,n}`` materialises
exactly the weights the products multiply by (``_jitc_kernels`` explains the generator).

Example::

    import jax.numpy as jnp, xlakern as brainevent
    W = brainevent.JITCScalarR((0.1, 0.02, 42), shape=(4000, 4000))
    current = brainevent.BinaryArray(spikes) @ W     # spikes: (4000,) bool; W is never stored
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_with_keys_class

from . import _jitc_kernels as JK
from . import _units
from ._arguments import first_refused
from ._errors import (EventArgumentError, EventDTypeError, EventNDimError, EventOperandError, EventShapeError,
                      EventUnitError, UnsupportedOperationError)
from ._events import EventRepresentation, _keyed
from ._eager import optional_arguments, run_fused
from ._kernels import SDS, acc_dtype
from ._layouts import DataRepresentation, _warn_renamed
from ._ops import _check_spikes, _described, _shape2, _spikes, _weights

__all__ = [
    "JITCMatrix", "JITCScalarMatrix", "JITCUniformMatrix", "JITCNormalMatrix",
    "JITCScalarR", "JITCScalarC", "JITCUniformR", "JITCUniformC", "JITCNormalR", "JITCNormalC",
    "jits", "jitsmv", "jitsmm", "binary_jitsmv", "binary_jitsmm",
    "jitu", "jitumv", "jitumm", "binary_jitumv", "binary_jitumm",
    "jitn", "jitnmv", "jitnmm", "binary_jitnmv", "binary_jitnmm",
]


# ----------------------------------------------------------------------------- argument handling

def _prob(name: str, prob: Any) -> float:
    try:
        p = float(prob)
    except Exception:
        raise EventShapeError(f"{name}: prob must be a concrete float in [0, 1] (it sets the generator's "
                              f"tables at trace time); got {prob!r}") from None
    if not 0.0 <= p <= 1.0:
        raise EventShapeError(f"{name}: prob must lie in [0, 1]; got {p!r}")
    return p


def _seed_in_range(name: str, value: int) -> int:
    """``value``, a concrete seed, where it fits the generator's 32 bits: [-2^31, 2^32), read modulo 2^32
    (as a uint32). Wider ones are refused rather than wrapped, so two seeds never meet by surprise."""
    if not -(2 ** 31) <= value < 2 ** 32:
        raise EventArgumentError(f"{name}: seed {value} does not fit 32 bits; the generator takes seeds in "
                                 f"[-2**31, 2**32), read modulo 2**32 (pass seed % 2**32)")
    return value


def _drawn_seed(name: str, seed: Any):
    """``seed``, or a fresh one for None (as BrainEvent does), drawn here in Python: a draw inside the
    traced body would be one constant for every later call of the cached program. A Python int in
    [2^31, 2^32) goes on as a uint32 (jit would read it as an int32 and overflow)."""
    if seed is None:
        return np.random.randint(0, 10 ** 8)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        if _seed_in_range(name, int(seed)) >= 2 ** 31:
            return np.uint32(seed)
    return seed


def _seed(name: str, seed: Any):
    """uint32 (1,) seed; traced seeds are fine."""
    try:
        s = jnp.asarray(seed)
    except TypeError:  # a string, None, an object: jax names neither the call nor the argument
        raise EventDTypeError(f"{name}: seed must be one integer; got {type(seed).__name__} {seed!r}") from None
    if not (jnp.issubdtype(s.dtype, jnp.integer) and s.size == 1):
        raise EventDTypeError(f"{name}: seed must be one integer; got {_described(seed, s)}")
    return s.reshape(1).astype(jnp.uint32)


def _params(name: str, first, second, letter: str):
    """(params (a, b) in the accumulation dtype, the weights' dtype, unit)."""
    a, unit_a = _units.split(first)
    a = _weights(name, "weight", a)
    if letter == "s":
        if a.size != 1:
            raise EventShapeError(f"{name}: weight must be a scalar; got shape {tuple(a.shape)}")
        dtype = a.dtype
        acc = acc_dtype(dtype)
        a = a.reshape(()).astype(acc)
        return jnp.stack([a, jnp.zeros((), acc)]), dtype, unit_a
    b, unit_b = _units.split(second)
    b = _weights(name, "weight", b)
    if unit_a != unit_b:
        raise EventUnitError(f"{name}: the two weight parameters carry different units ({unit_a} and {unit_b}); "
                             f"give both in one unit")
    for arg, x in (("first weight parameter", a), ("second weight parameter", b)):
        if x.size != 1:
            raise EventShapeError(f"{name}: the {arg} must be a scalar; got shape {tuple(x.shape)}")
    dtype = jnp.promote_types(a.dtype, b.dtype)
    acc = acc_dtype(dtype)
    a, b = a.reshape(()).astype(acc), b.reshape(()).astype(acc)
    if letter == "u":  # weight = low + (high - low) * U(0, 1]
        return jnp.stack([a, b - a]), dtype, unit_a
    return jnp.stack([a, b]), dtype, unit_a  # weight = loc + scale * N(0, 1)


def _generated(shape, transpose: bool, corder: bool):
    """(generated (grows, gcols), kernel transpose) for M of `shape`: G = M (corder) or M.T."""
    m, n = shape
    if corder:
        return (m, n), bool(transpose)
    return (n, m), not transpose


def _tables(name: str, letter: str, prob: float, acc):
    table = jnp.asarray(JK.skip_table(prob))
    q = JK.quantile_table(jnp.dtype(acc).name) if letter == "n" else np.zeros((1,), jnp.dtype(acc))
    return table, jnp.asarray(q)


# the operators' names for their weight parameters, in messages about them
_WEIGHT_ARGS = {"s": ("weight",), "u": ("w_low", "w_high"), "n": ("w_loc", "w_scale")}


def _readable_weights(name: str, names: tuple, weights: tuple) -> None:
    """Refuses, naming it, a weight parameter no array can be made of (None, a string, ...): the
    bodies' own check names their internal parameters and takes a None second one for a scalar matrix."""
    refused = first_refused(name, zip(names, weights))
    if refused is not None:
        raise refused


def _product(name, letter, binary, mm, first, second, prob, vector, seed, shape, transpose, corder, backend):
    # prob and shape set the program (tables, grid); outside a trace it is compiled once (_eager)
    _readable_weights(name, _WEIGHT_ARGS[letter], (first, second))
    static = dict(name=name, letter=letter, binary=binary, mm=mm, prob=_prob(name, prob), shape=_shape2(name, shape),
                  transpose=transpose, corder=corder, backend=backend)
    return run_fused(_product_body, (first, second, vector, _drawn_seed(name, seed)), static)


@optional_arguments("weight2")
def _product_body(weight, weight2, vector, seed, *, name, letter, binary, mm, prob, shape, transpose, corder, backend):
    params, w_dtype, unit_w = _params(name, weight, weight2, letter)
    seed = _seed(name, seed)
    v, unit_v = _units.split(vector)
    v = _spikes(name, "vector", v, binary)
    out_dtype = w_dtype
    if not binary and jnp.issubdtype(v.dtype, jnp.floating):
        out_dtype = jnp.promote_types(w_dtype, v.dtype)
    acc = acc_dtype(out_dtype)
    params = params.astype(acc)
    if not binary:
        v = v.astype(acc)
    m, n = shape
    _check_spikes(name, "vector", v, m if transpose else n, mm, transpose)
    gshape, ktrans = _generated(shape, transpose, corder)
    n_out = n if transpose else m
    if prob == 0.0 or n_out == 0 or v.shape[0] == 0:
        res = jnp.zeros((n_out,) + tuple(v.shape[1:]), acc)
    else:
        table, qtable = _tables(name, letter, prob, acc)
        op = JK.JITC_KINDS[letter].ops[(binary, mm)]
        out = SDS((n_out,) + tuple(v.shape[1:]), acc)
        res = op(params, seed, table, qtable, v, outs=[out], backend=backend, transpose=ktrans, shape=gshape,
                 log_keep=JK.log_keep(prob))[0]
    return _units.attach(res.astype(out_dtype), unit_w, unit_v)


def _dense(name, letter, first, second, prob, seed, shape, transpose, corder, backend):
    _readable_weights(name, _WEIGHT_ARGS[letter], (first, second))
    static = dict(name=name, letter=letter, prob=_prob(name, prob), shape=_shape2(name, shape), transpose=transpose,
                  corder=corder, backend=backend)
    return run_fused(_dense_body, (first, second, _drawn_seed(name, seed)), static)


@optional_arguments("weight2")
def _dense_body(weight, weight2, seed, *, name, letter, prob, shape, transpose, corder, backend):
    params, w_dtype, unit_w = _params(name, weight, weight2, letter)
    seed = _seed(name, seed)
    gshape, _ = _generated(shape, False, corder)
    acc = acc_dtype(w_dtype)
    if prob == 0.0 or 0 in gshape:
        g = jnp.zeros(gshape, acc)
    else:
        table, qtable = _tables(name, letter, prob, acc)
        g = JK.JITC_KINDS[letter].dense(params.astype(acc), seed, table, qtable, outs=[SDS(gshape, acc)],
                                         backend=backend, shape=gshape)[0]
    m = g if corder else g.T
    m = m.T if transpose else m
    return _units.attach(m.astype(w_dtype), unit_w)


# ----------------------------------------------------------------------------- operators

def jits(weight, prob, seed, *, shape, transpose: bool = False, corder: bool = True, backend: Optional[str] = None):
    """The dense matrix ``M`` (``M.T`` with ``transpose=True``) that :func:`jitsmv` multiplies by.

    Example::

        M = xlakern.jits(0.5, 0.1, 42, shape=(100, 200))   # (100, 200), ~10% entries equal 0.5
    """
    return _dense("jits", "s", weight, None, prob, seed, shape, transpose, corder, backend)


def jitsmv(weight, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
           backend: Optional[str] = None):
    """``M @ vector`` (``M.T @ vector``) for the JITC matrix of one scalar ``weight``.

    Example::

        y = xlakern.jitsmv(0.5, 0.1, x, 42, shape=(100, 200))   # x: (200,)
    """
    return _product("jitsmv", "s", False, False, weight, None, prob, vector, seed, shape, transpose, corder, backend)


def jitsmm(weight, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
           backend: Optional[str] = None):
    """``M @ B`` (``M.T @ B``) for a (k, batch) matrix ``B``; column j equals ``jitsmv`` of ``B[:, j]``.

    Example::

        Y = xlakern.jitsmm(0.5, 0.1, X, 42, shape=(100, 200))   # X: (200, 16)
    """
    return _product("jitsmm", "s", False, True, weight, None, prob, B, seed, shape, transpose, corder, backend)


def binary_jitsmv(weight, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
                  backend: Optional[str] = None):
    """Event-driven :func:`jitsmv`: non-zero entries of ``vector`` count as 1.

    Example::

        current = xlakern.binary_jitsmv(0.5, 0.02, spikes, 42, shape=(n_pre, n_post), transpose=True)
    """
    return _product("binary_jitsmv", "s", True, False, weight, None, prob, vector, seed, shape, transpose, corder,
                    backend)


def binary_jitsmm(weight, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
                  backend: Optional[str] = None):
    """Event-driven :func:`jitsmm`.

    Example::

        Y = xlakern.binary_jitsmm(0.5, 0.02, spikes_kb, 42, shape=(n_pre, n_post), transpose=True)
    """
    return _product("binary_jitsmm", "s", True, True, weight, None, prob, B, seed, shape, transpose, corder, backend)


def jitu(w_low, w_high, prob, seed, *, shape, transpose: bool = False, corder: bool = True,
         backend: Optional[str] = None):
    """The dense matrix with weights uniform in ``(w_low, w_high]`` that :func:`jitumv` multiplies by.

    Example::

        M = xlakern.jitu(0.0, 1.0, 0.1, 42, shape=(100, 200))
    """
    return _dense("jitu", "u", w_low, w_high, prob, seed, shape, transpose, corder, backend)


def jitumv(w_low, w_high, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
           backend: Optional[str] = None):
    """``M @ vector`` for the JITC matrix with uniform weights.

    Example::

        y = xlakern.jitumv(0.0, 1.0, 0.1, x, 42, shape=(100, 200))
    """
    return _product("jitumv", "u", False, False, w_low, w_high, prob, vector, seed, shape, transpose, corder,
                    backend)


def jitumm(w_low, w_high, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
           backend: Optional[str] = None):
    """``M @ B`` for the JITC matrix with uniform weights.

    Example::

        Y = xlakern.jitumm(0.0, 1.0, 0.1, X, 42, shape=(100, 200))
    """
    return _product("jitumm", "u", False, True, w_low, w_high, prob, B, seed, shape, transpose, corder, backend)


def binary_jitumv(w_low, w_high, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
                  backend: Optional[str] = None):
    """Event-driven :func:`jitumv`.

    Example::

        y = xlakern.binary_jitumv(0.0, 1.0, 0.02, spikes, 42, shape=(n_pre, n_post), transpose=True)
    """
    return _product("binary_jitumv", "u", True, False, w_low, w_high, prob, vector, seed, shape, transpose, corder,
                    backend)


def binary_jitumm(w_low, w_high, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
                  backend: Optional[str] = None):
    """Event-driven :func:`jitumm`.

    Example::

        Y = xlakern.binary_jitumm(0.0, 1.0, 0.02, spikes_kb, 42, shape=(n_pre, n_post), transpose=True)
    """
    return _product("binary_jitumm", "u", True, True, w_low, w_high, prob, B, seed, shape, transpose, corder,
                    backend)


def jitn(w_loc, w_scale, prob, seed, *, shape, transpose: bool = False, corder: bool = True,
         backend: Optional[str] = None):
    """The dense matrix with normal weights ``(w_loc, w_scale)`` that :func:`jitnmv` multiplies by.

    Example::

        M = xlakern.jitn(0.0, 1.0, 0.1, 42, shape=(100, 200))
    """
    return _dense("jitn", "n", w_loc, w_scale, prob, seed, shape, transpose, corder, backend)


def jitnmv(w_loc, w_scale, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
           backend: Optional[str] = None):
    """``M @ vector`` for the JITC matrix with normal weights.

    Example::

        y = xlakern.jitnmv(0.0, 1.0, 0.1, x, 42, shape=(100, 200))
    """
    return _product("jitnmv", "n", False, False, w_loc, w_scale, prob, vector, seed, shape, transpose, corder,
                    backend)


def jitnmm(w_loc, w_scale, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
           backend: Optional[str] = None):
    """``M @ B`` for the JITC matrix with normal weights.

    Example::

        Y = xlakern.jitnmm(0.0, 1.0, 0.1, X, 42, shape=(100, 200))
    """
    return _product("jitnmm", "n", False, True, w_loc, w_scale, prob, B, seed, shape, transpose, corder, backend)


def binary_jitnmv(w_loc, w_scale, prob, vector, seed=None, *, shape, transpose: bool = False, corder: bool = True,
                  backend: Optional[str] = None):
    """Event-driven :func:`jitnmv`.

    Example::

        y = xlakern.binary_jitnmv(0.0, 1.0, 0.02, spikes, 42, shape=(n_pre, n_post), transpose=True)
    """
    return _product("binary_jitnmv", "n", True, False, w_loc, w_scale, prob, vector, seed, shape, transpose, corder,
                    backend)


def binary_jitnmm(w_loc, w_scale, prob, B, seed=None, *, shape, transpose: bool = False, corder: bool = True,
                  backend: Optional[str] = None):
    """Event-driven :func:`jitnmm`.

    Example::

        Y = xlakern.binary_jitnmm(0.0, 1.0, 0.02, spikes_kb, 42, shape=(n_pre, n_post), transpose=True)
    """
    return _product("binary_jitnmm", "n", True, True, w_loc, w_scale, prob, B, seed, shape, transpose, corder,
                    backend)


_PRODUCTS = {
    "s": {(True, False): binary_jitsmv, (True, True): binary_jitsmm, (False, False): jitsmv, (False, True): jitsmm},
    "u": {(True, False): binary_jitumv, (True, True): binary_jitumm, (False, False): jitumv, (False, True): jitumm},
    "n": {(True, False): binary_jitnmv, (True, True): binary_jitnmm, (False, False): jitnmv, (False, True): jitnmm},
}
_DENSE = {"s": jits, "u": jitu, "n": jitn}


# ----------------------------------------------------------------------------- matrices

class JITCMatrix(DataRepresentation):
    """Base of the JITC matrices (BrainEvent's name). Leaves: the weight parameter(s), the seed and
    any registered buffers; static: prob, shape, corder, backend. ``R`` classes are the matrix ``M``
    of ``shape`` as the operators define it; ``C`` classes of shape (m, n) are the transpose of the
    ``R`` matrix of shape (n, m) with the same arguments, so ``.T`` flips between them without
    changing a weight.

    Example::

        W = xlakern.JITCNormalR((0.0, 0.1, 0.02, 42), shape=(1000, 2000))
        assert isinstance(W, xlakern.JITCMatrix)
    """

    __module__ = "xlakern"

    _letter = "s"
    _columns = False  # the C classes
    _nparams = 1
    _param_names = ("weight",)  # BrainEvent's attribute names, in messages

    def __init__(self, *args, shape, corder: bool = False, backend: Optional[str] = None, buffers: Any = None):
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = tuple(args[0])
        n = self._nparams
        if len(args) != n + 2:
            what = "(weight, prob, seed)" if n == 1 else "(w_low, w_high, prob, seed) / (w_loc, w_scale, prob, seed)"
            raise EventShapeError(f"{type(self).__name__}: expected the arguments {what}; got {len(args)} values")
        weights, prob, seed = args[:n], args[n], args[n + 1]
        _readable_weights(type(self).__name__, self._param_names, weights)
        if seed is None:
            seed = np.random.randint(0, 10 ** 8)
        self._set(tuple(weights) + (seed,), _prob(type(self).__name__, prob), shape, corder, backend)
        self._check_params()
        self._init_buffers(buffers)

    def _check_params(self):
        """Concrete weight parameters that cannot make a matrix raise here (the uniform bounds' order)."""

    def _set(self, children, prob, shape, corder, backend):
        self.weights = tuple(children[:-1])
        self.seed = children[-1]
        self.prob = prob
        self.shape = _shape2(type(self).__name__, shape)
        self.corder = bool(corder)
        self.backend = backend

    def tree_flatten(self):
        return self.weights + (self.seed, self.buffers), (self.prob, self.shape, self.corder, self.backend)

    def tree_flatten_with_keys(self):  # `.wlow`, `.seed`, `.buffers['name']`: BrainEvent's attribute names
        children, aux = self.tree_flatten()
        return _keyed(self, JITCMatrix, self._param_names + ("seed", "buffers"), children), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj._set(tuple(children[:-1]), *aux)
        obj._restore_buffers(children[-1])
        return obj

    @property
    def dtype(self):
        return jnp.asarray(_units.split(self.weights[0])[0]).dtype

    @property
    def nse(self):
        """Expected number of synapses (they are never stored)."""
        return int(round(self.prob * self.shape[0] * self.shape[1]))

    def _pair(self):
        return (self.weights[0], self.weights[1] if self._nparams == 2 else None)

    def _stored(self):
        """(shape of the R matrix the operators see, whether this object is its transpose)."""
        return (self.shape[::-1], True) if self._columns else (self.shape, False)

    def todense(self):
        """The dense matrix, exactly the weights the products use.

        Example::

            M = xlakern.JITCScalarR((0.5, 0.1, 42), shape=(100, 200)).todense()
        """
        shape, flipped = self._stored()
        first, second = self._pair()
        args = (first,) if self._nparams == 1 else (first, second)
        return _DENSE[self._letter](*args, self.prob, self.seed, shape=shape, transpose=flipped,
                                    corder=self.corder, backend=self.backend)

    @property
    def T(self):
        other = _TRANSPOSED[type(self)]
        return other.tree_unflatten((self.prob, self.shape[::-1], self.corder, self.backend),
                                    self.weights + (self.seed, self.buffers))

    def transpose(self, axes=None):
        """The transpose (the C form of an R matrix and back), no weight changed.

        Example::

            Wt = W.transpose()
        """
        if axes is not None and tuple(axes) != (1, 0):
            raise EventShapeError(f"{type(self).__name__}.transpose: axes must be None or (1, 0); got {axes!r}")
        return self.T

    def sum(self, axis=None):
        """Sum of the entries (``axis=None``) or along ``axis``, of exactly the materialised weights
        (costs a dense ``shape`` matrix).

        Example::

            total = W.sum()
        """
        dense, unit = _units.split(self.todense())
        return _units.attach(jnp.sum(dense, axis=axis), unit)

    def tocsr(self):
        """The same matrix in compressed rows, one entry per generated synapse with exactly the weight
        the products use (a synapse whose weight is 0 is kept). The generator is walked row by row, so
        memory stays near the synapse count; the seed must be concrete (the structure depends on it).

        Example::

            csr = xlakern.JITCScalarR((0.5, 0.1, 42), shape=(100, 200)).tocsr()
        """
        from ._dt2t import _concrete_seed, jitc_synapses
        from ._layouts import CSR

        name = f"{type(self).__name__}.tocsr"
        shape, flipped = self._stored()
        rows, cols, _, _ = jitc_synapses(_concrete_seed(name, self.seed), self.prob, shape, self.corder)
        # the generated matrix's weights in its row-major order: dt2t by ones, exact (w * 1)
        ones = jnp.ones((self.shape[1] if flipped else self.shape[0],), self.dtype)
        w = self._per_synapse(ones, at_column=flipped)
        if flipped:  # this matrix is the generated one's transpose: regroup by its rows
            rows, cols = cols, rows
            order = np.lexsort((cols, rows))
            rows, cols, w = rows[order], cols[order], w[order]
        indptr = np.zeros(self.shape[0] + 1, rows.dtype)
        np.cumsum(np.bincount(rows, minlength=self.shape[0]), out=indptr[1:])
        return CSR((w, jnp.asarray(cols), jnp.asarray(indptr)), shape=self.shape, backend=self.backend)

    def tocsc(self):
        """The same matrix in compressed columns (see :meth:`tocsr`).

        Example::

            csc = xlakern.JITCScalarR((0.5, 0.1, 42), shape=(100, 200)).tocsc()
        """
        return self.tocsr().tocsc()

    def tocoo(self):
        """The same matrix as a ``brainunit.sparse.COO`` (see :meth:`tocsr`; needs brainunit).

        Example::

            coo = xlakern.JITCScalarR((0.5, 0.1, 42), shape=(100, 200)).tocoo()
        """
        return self.tocsr().tocoo()

    @classmethod
    def fromdense(cls, mat, **kwargs):
        """Refused, as in BrainEvent: the ``(prob, seed)`` behind a dense matrix cannot be recovered.

        Example::

            W = xlakern.CSR.fromdense(mat)   # a stored layout instead
        """
        raise UnsupportedOperationError(f"{cls.__name__}.fromdense: a JITC matrix is generated from (prob, seed), "
                                        f"which a dense matrix does not determine; use CSR.fromdense")

    def _refuse(self, method):
        raise UnsupportedOperationError(f"{type(self).__name__}.{method}: a JITC matrix stores no per-synapse "
                                        f"weight; materialise it first (W.tocsr().{method}(...))")

    def update_on_pre(self, *args, **kwargs):
        """Refused, as in BrainEvent (no per-synapse weight to update); use ``W.tocsr().update_on_pre``.

        Example::

            W2 = W.tocsr().update_on_pre(pre_spikes, post_trace)
        """
        self._refuse("update_on_pre")

    def update_on_post(self, *args, **kwargs):
        """Refused, as in BrainEvent (no per-synapse weight to update); use ``W.tocsr().update_on_post``.

        Example::

            W2 = W.tocsr().update_on_post(pre_trace, post_spikes)
        """
        self._refuse("update_on_post")

    def apply(self, fn):
        """Not supported here (BrainEvent maps the distribution's parameters, a different operation
        per kind); use ``with_data`` with the new parameters, or ``W.tocsr().apply(fn)``.

        Example::

            W2 = W.with_data(*(2 * w for w in W.weights))
        """
        self._refuse("apply")

    def apply2(self, other, fn, *, reverse: bool = False):
        """Not supported here (see :meth:`apply`); scalar ``*`` and ``/`` scale the weights.

        Example::

            W2 = W * 2.0
        """
        self._refuse("apply2")

    @property
    def data(self):
        """The trainable weight parameter(s), as BrainEvent names them: the weight of a scalar matrix,
        ``(w_low, w_high)`` or ``(w_loc, w_scale)`` of the others; ``W.with_data(W.data)`` round-trips.

        Example::

            W2 = W.with_data(W.data)
        """
        return self.weights[0] if self._nparams == 1 else tuple(self.weights)

    def with_data(self, *weights):
        """The same connectivity (seed, prob) with other weight parameter(s), given one by one or as the
        tuple :attr:`data` returns.

        Example::

            W2 = W.with_data(W.weights[0] * 2)
        """
        if len(weights) == 1 and self._nparams > 1 and isinstance(weights[0], tuple):
            weights = weights[0]
        name = f"{type(self).__name__}.with_data"
        if len(weights) != self._nparams:
            raise EventShapeError(f"{name}: expected {self._nparams} weight parameter(s) "
                                  f"({', '.join(self._param_names)}); got {len(weights)}")
        _readable_weights(name, self._param_names, weights)
        return type(self).tree_unflatten((self.prob, self.shape, self.corder, self.backend),
                                         tuple(weights) + (self.seed, self.buffers))

    def _replace_data(self, data):
        return self.with_data(data) if self._nparams == 1 else NotImplemented

    def _scale(self, other, op, name):
        from ._layouts import _is_scalar

        if not _is_scalar(other):
            raise EventOperandError(f"{type(self).__name__} {name} supports scalars only (it scales the weights); "
                                    f"got {type(other).__name__}")
        # every kind's weight is affine in its parameters: scaling both scales each weight
        return self.with_data(*(op(w, other) for w in self.weights))

    def __neg__(self):
        return self.with_data(*(-w for w in self.weights))

    def __repr__(self):
        return (f"{type(self).__name__}(shape={self.shape}, prob={self.prob}, corder={self.corder}, "
                f"dtype={self.dtype})")

    def _per_synapse(self, y, at_column: bool):
        from . import _dt2t

        shape, flipped = self._stored()
        first, second = self._pair()
        fn = {"s": _dt2t.jitsmv_dt2t, "u": _dt2t.jitumv_dt2t, "n": _dt2t.jitnmv_dt2t}[self._letter]
        args = (first,) if self._nparams == 1 else (first, second)
        return fn(*args, self.prob, y, self.seed, shape=shape, transpose=at_column != flipped, corder=self.corder,
                  backend=self.backend)

    def dt2t(self, y_dim_arr, w_dim_arr=None):
        """Per generated synapse, its weight times ``y[i]`` (i its presynaptic neuron; ``y`` has ``shape[0]``
        entries), in the row-major order of the matrix the kernels generate (an R matrix's own, a C
        matrix's transpose). A JITC matrix's per-synapse weights are its own, so ``w_dim_arr`` (BrainEvent's
        second argument) is ignored. Needs a concrete seed: the synapse count depends on it.

        Example::

            per_synapse = W.dt2t(pre_factor)
        """
        del w_dim_arr
        return self._per_synapse(y_dim_arr, at_column=False)

    def dt2t_transposed(self, y_dim_arr, w_dim_arr=None):
        """As :meth:`dt2t`, with ``y`` read at each synapse's postsynaptic neuron (``shape[1]`` entries).

        Example::

            per_synapse = W.dt2t_transposed(post_factor)
        """
        del w_dim_arr
        return self._per_synapse(y_dim_arr, at_column=True)

    def yw_to_w(self, y_dim_arr, w_dim_arr=None):
        """BrainEvent's deprecated name of :meth:`dt2t`.

        Example::

            per_synapse = W.yw_to_w(pre_factor)   # DeprecationWarning
        """
        _warn_renamed(self, "yw_to_w", "dt2t")
        return self.dt2t(y_dim_arr, w_dim_arr)

    def yw_to_w_transposed(self, y_dim_arr, w_dim_arr=None):
        """BrainEvent's deprecated name of :meth:`dt2t_transposed`.

        Example::

            per_synapse = W.yw_to_w_transposed(post_factor)   # DeprecationWarning
        """
        _warn_renamed(self, "yw_to_w_transposed", "dt2t_transposed")
        return self.dt2t_transposed(y_dim_arr, w_dim_arr)

    def _mul_vector(self, x, transpose: bool):
        """``R @ x`` (transpose False) or ``R.T @ x`` for the underlying R matrix; x is 1-D or (k, b)."""
        binary = isinstance(x, EventRepresentation)
        if binary and x._weighted:
            binary, value = False, x.value
        else:
            value = x.value if binary else x
        mantissa = _units.split(value)[0]
        ndim = np.ndim(mantissa)
        if ndim not in (1, 2):
            raise EventNDimError(f"{type(self).__name__} @: the other operand must be 1-D or 2-D; got shape "
                                 f"{np.shape(mantissa)}")
        shape, _ = self._stored()
        first, second = self._pair()
        fn = _PRODUCTS[self._letter][(binary, ndim == 2)]
        args = (first,) if self._nparams == 1 else (first, second)
        return fn(*args, self.prob, value, self.seed, shape=shape, transpose=transpose, corder=self.corder,
                  backend=self.backend)

    def _product(self, x, w_on_left: bool):
        _, flipped = self._stored()
        # this @ x = (R or R.T) @ x ; x @ this = this.T @ x (1-D) or (this.T @ x.T).T (2-D)
        transpose = flipped if w_on_left else not flipped
        value = x.value if isinstance(x, EventRepresentation) else x
        if not w_on_left and np.ndim(_units.split(value)[0]) == 2:
            xt = type(x)(value.T) if isinstance(x, EventRepresentation) else value.T
            return self._mul_vector(xt, transpose).T
        return self._mul_vector(x, transpose)

    def __matmul__(self, other):
        return self._product(other, True)

    def __rmatmul__(self, other):
        return self._product(other, False)


class JITCScalarMatrix(JITCMatrix):
    """Base of the one-scalar-weight JITC matrices, :class:`JITCScalarR` and :class:`JITCScalarC`.

    Example::

        assert isinstance(xlakern.JITCScalarC((0.1, 0.02, 42), shape=(10, 20)), xlakern.JITCScalarMatrix)
    """

    weight = property(lambda self: self.weights[0], doc="The weight of every synapse (BrainEvent's name).")


@register_pytree_with_keys_class
class JITCScalarR(JITCScalarMatrix):
    """JITC matrix with one scalar weight: ``JITCScalarR((weight, prob, seed), shape=(m, n), corder=False)``.

    Example::

        W = xlakern.JITCScalarR((0.1, 0.02, 42), shape=(1000, 2000))
        y = xlakern.BinaryArray(spikes) @ W      # spikes: (1000,)
    """


@register_pytree_with_keys_class
class JITCScalarC(JITCScalarMatrix):
    """The transpose form of :class:`JITCScalarR` (``JITCScalarR(..., shape=(n, m)).T``).

    Example::

        W = xlakern.JITCScalarC((0.1, 0.02, 42), shape=(1000, 2000))
    """

    _columns = True


class JITCUniformMatrix(JITCMatrix):
    """Base of the uniform-weight JITC matrices, :class:`JITCUniformR` and :class:`JITCUniformC`.

    Example::

        assert isinstance(xlakern.JITCUniformR((0.0, 0.2, 0.02, 42), shape=(10, 20)), xlakern.JITCUniformMatrix)
    """

    _letter = "u"
    _nparams = 2
    _param_names = ("wlow", "whigh")

    wlow = property(lambda self: self.weights[0], doc="The weights' lower bound (BrainEvent's name).")
    whigh = property(lambda self: self.weights[1], doc="The weights' upper bound (BrainEvent's name).")

    def _check_params(self):
        lo, hi = (_units.split(w)[0] for w in self.weights)
        try:
            bad = bool(np.any(np.asarray(lo) > np.asarray(hi)))
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
            return  # traced bounds are not checked
        if bad:
            raise EventArgumentError(f"{type(self).__name__}: wlow ({lo}) must not exceed whigh ({hi})")


@register_pytree_with_keys_class
class JITCUniformR(JITCUniformMatrix):
    """JITC matrix with weights uniform in ``(w_low, w_high]``: ``JITCUniformR((w_low, w_high, prob, seed), shape=...)``.

    Example::

        W = xlakern.JITCUniformR((0.0, 0.2, 0.02, 42), shape=(1000, 2000))
    """


@register_pytree_with_keys_class
class JITCUniformC(JITCUniformMatrix):
    """The transpose form of :class:`JITCUniformR`.

    Example::

        W = xlakern.JITCUniformC((0.0, 0.2, 0.02, 42), shape=(1000, 2000))
    """

    _columns = True


class JITCNormalMatrix(JITCMatrix):
    """Base of the normal-weight JITC matrices, :class:`JITCNormalR` and :class:`JITCNormalC`.

    Example::

        assert isinstance(xlakern.JITCNormalC((0.0, 0.1, 0.02, 42), shape=(10, 20)), xlakern.JITCNormalMatrix)
    """

    _letter = "n"
    _nparams = 2
    _param_names = ("wloc", "wscale")

    wloc = property(lambda self: self.weights[0], doc="The weights' mean (BrainEvent's name).")
    wscale = property(lambda self: self.weights[1], doc="The weights' standard deviation (BrainEvent's name).")


@register_pytree_with_keys_class
class JITCNormalR(JITCNormalMatrix):
    """JITC matrix with normal weights: ``JITCNormalR((w_loc, w_scale, prob, seed), shape=...)``.

    Example::

        W = xlakern.JITCNormalR((0.0, 0.1, 0.02, 42), shape=(1000, 2000))
    """


@register_pytree_with_keys_class
class JITCNormalC(JITCNormalMatrix):
    """The transpose form of :class:`JITCNormalR`.

    Example::

        W = xlakern.JITCNormalC((0.0, 0.1, 0.02, 42), shape=(1000, 2000))
    """

    _columns = True


_TRANSPOSED = {
    JITCScalarR: JITCScalarC, JITCScalarC: JITCScalarR,
    JITCUniformR: JITCUniformC, JITCUniformC: JITCUniformR,
    JITCNormalR: JITCNormalC, JITCNormalC: JITCNormalR,
}
