"""The event-driven operators, with BrainEvent 0.3's names and keyword arguments.

Orientation (BrainEvent's): the stored structure has shape ``shape = (rows, cols)``.
``transpose=False`` computes ``A @ v`` (gather: one output per stored row, ``v`` has ``cols``
entries); ``transpose=True`` computes ``A.T @ v`` (scatter: ``v`` has ``rows`` entries, only the
rows of active entries are read). Binary operators count an entry of ``v`` as 1 when it is
non-zero (bool, int or float; NaN is active, -0.0 is not); float operators use its value.

Example::

    import jax.numpy as jnp, xlakern as brainevent
    data, indices, indptr = jnp.ones(3), jnp.array([0, 2, 1]), jnp.array([0, 2, 3])
    spikes = jnp.array([True, False])
    brainevent.binary_csrmv(data, indices, indptr, spikes, shape=(2, 3), transpose=True)  # [1, 0, 1]
"""

from __future__ import annotations

from typing import Any, Optional


import jax.numpy as jnp


from . import _kernels as K
from . import _units
from ._eager import optional_arguments, run_fused
from ._errors import EventDTypeError, EventShapeError

_FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


def _default_float():
    return jnp.asarray(0.0).dtype


def _weights(name: str, arg: str, x: Any):
    x = jnp.asarray(x)
    if x.dtype not in [jnp.dtype(f) for f in _FLOATS]:
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise EventDTypeError(f"{name}: {arg} has dtype {x.dtype}; weights must be float16, bfloat16, float32 "
                                  f"or float64")
        x = x.astype(_default_float())  # bool / int weights: the default float, as jnp would promote
    return x


def _index_dtype_error(name: str, arg: str, dtype: Any) -> EventDTypeError:
    return EventDTypeError(f"{name}: {arg} has dtype {dtype}; it must be int32 or int64 "
                           f"(convert with {arg}.astype(jnp.int32))")


def _index(name: str, arg: str, x: Any):
    x = jnp.asarray(x)
    if x.dtype not in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)):
        raise _index_dtype_error(name, arg, x.dtype)
    return x


def _spikes(name: str, arg: str, x: Any, binary: bool):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise EventDTypeError(f"{name}: {arg} has dtype {x.dtype}; spikes must be bool, integer or float")
    return x


def _shape2(name: str, shape: Any) -> tuple[int, int]:
    """``shape`` as a (rows, cols) pair of non-negative ints (a whole float like 4.0 passes; 4.5 does not)."""
    try:
        dims = tuple(shape)
        r, c = (int(s) for s in dims)
        whole = all(int(s) == s for s in dims)
    except Exception:
        whole = False
    if not whole:
        raise EventShapeError(f"{name}: shape must be a (rows, cols) pair of ints; got {shape!r}")
    if r < 0 or c < 0:
        raise EventShapeError(f"{name}: shape must be non-negative; got {shape!r}")
    return r, c


def _described(x: Any, arr: Any) -> str:
    """x for an error message: its repr when it is one value, else the shape and dtype of ``arr`` (its array)
    instead of every element."""
    if getattr(arr, "size", 1) == 1:
        return repr(x)
    return f"an array of shape {tuple(arr.shape)} and dtype {arr.dtype}"


def _integer_array(name: str, arg: str, x: Any):
    """Refuses an index array of a non-integer dtype when a layout is built (the products then take int32
    and int64, see _index)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.integer):
        raise _index_dtype_error(name, arg, dtype)


def _check_spikes(name: str, arg: str, v, n: int, mm: bool, transpose: bool):
    what = "rows" if transpose else "cols"
    if mm:
        if v.ndim != 2 or v.shape[0] != n:
            raise EventShapeError(f"{name}: {arg} has shape {tuple(v.shape)}; expected ({n}, batch): its first axis "
                                  f"must match the structure's {what} ({n}) for transpose={transpose}")
    elif v.shape != (n,):
        raise EventShapeError(f"{name}: {arg} has shape {tuple(v.shape)}; expected ({n},), the structure's {what} "
                              f"for transpose={transpose}")


def _prepare_values(name, data, v, binary):
    """Weights (float), spikes and the dtype of the result: the weights', whatever the spikes' dtype, as
    BrainEvent 0.3's operators return (so float64 events under x64 do not turn a float32 network's
    carry into float64). A layout times a plain dense array promotes the weights first (jnp's rule,
    _layouts.DataRepresentation._call)."""
    data = _weights(name, "data", data)
    v = _spikes(name, "v", v, binary)
    if binary:
        return data, v, data.dtype
    return data, v.astype(K.acc_dtype(data.dtype)), data.dtype


def _sparse_call(name, binary, mm, data, indices, indptr, v, shape, transpose, backend, nconn_layout, perm=None):
    """One CSR / fixed-count product, validated; ``perm`` (CSR only): slot ``p`` weighs ``data[perm[p]]``.
    Outside a trace it runs as one jitted program (:func:`run_fused`)."""
    data, unit_d = _units.split(data)
    v, unit_v = _units.split(v)
    static = dict(name=name, binary=binary, mm=mm, shape=_shape2(name, shape), transpose=bool(transpose),
                  backend=backend, nconn_layout=nconn_layout)
    res = run_fused(_sparse_body, (data, indices, indptr, v, perm), static)
    return _units.attach(res, unit_d, unit_v)


@optional_arguments("indptr", "perm")
def _sparse_body(data, indices, indptr, v, perm, *, name, binary, mm, shape, transpose, backend, nconn_layout):
    rows, cols = shape
    data, v, out_dtype = _prepare_values(name, data, v, binary)
    indices = _index(name, "indices", indices)
    if nconn_layout:
        if indices.ndim != 2 or indices.shape[0] != rows:
            raise EventShapeError(f"{name}: indices has shape {tuple(indices.shape)}; expected ({rows}, K): one row "
                                  f"of K target indices per stored row (shape={shape})")
        nse = indices.size
        if data.size != 1 and data.shape != indices.shape:
            raise EventShapeError(f"{name}: weights have shape {tuple(data.shape)}; expected (1,) or () for one "
                                  f"shared weight, or {tuple(indices.shape)} like indices")
    else:
        if indices.ndim != 1:
            raise EventShapeError(f"{name}: indices has shape {tuple(indices.shape)}; expected (nse,)")
        indptr = _index(name, "indptr", indptr)
        if indptr.shape != (rows + 1,):
            raise EventShapeError(f"{name}: indptr has shape {tuple(indptr.shape)}; expected ({rows + 1},), "
                                  f"rows + 1 for shape={shape}")
        indptr = indptr.astype(indices.dtype)
        nse = indices.shape[0]
        if data.size != 1 and data.shape != (nse,):
            raise EventShapeError(f"{name}: data has shape {tuple(data.shape)}; expected (1,) or () for one shared "
                                  f"weight, or ({nse},), one weight per index")
        if perm is not None:
            perm = _index(name, "perm", perm)
            if data.size != 1 and perm.shape != (nse,):
                raise EventShapeError(f"{name}: perm has shape {tuple(perm.shape)}; expected ({nse},), the index "
                                      f"into data of each stored slot's weight")
            perm = perm.astype(indices.dtype) if data.size != 1 else jnp.zeros((0,), indices.dtype)
    _check_spikes(name, "v", v, rows if transpose else cols, mm, transpose)
    if data.size == 1:
        data = data.reshape(1)
    n_out = cols if transpose else rows
    out = K.SDS((n_out,) + tuple(v.shape[1:]), K.acc_dtype(data.dtype))
    if nconn_layout:
        op = K.FCN_OPS.ops[(binary, mm)]
        res = op(data, indices, v, outs=[out], backend=backend, shape=shape, transpose=transpose)[0]
    elif perm is not None:
        op = K.CSR_INDEXED_OPS.ops[(binary, mm)]
        res = op(data, indices, indptr, perm, v, outs=[out], backend=backend, shape=shape, transpose=transpose)[0]
    else:
        op = K.CSR_OPS.ops[(binary, mm)]
        res = op(data, indices, indptr, v, outs=[out], backend=backend, shape=shape, transpose=transpose)[0]
    return res.astype(out_dtype)


def binary_csrmv(data, indices, indptr, v, *, shape, transpose: bool = False, backend: Optional[str] = None,
                 workspace: Any = None, weighted: bool = False):
    """Event-driven ``A @ v`` (or ``A.T @ v`` with ``transpose=True``) for a CSR matrix ``A`` of ``shape``.

    ``v``'s non-zero entries count as 1 (``weighted=True``: their values count). ``data`` holds one
    weight per index, or one shared weight (shape ``(1,)`` or ``()``). ``workspace`` is accepted
    for BrainEvent compatibility and ignored. Units of ``data``/``v`` multiply.

    Example::

        y = xlakern.binary_csrmv(data, indices, indptr, spikes, shape=(n_pre, n_post), transpose=True)
    """
    return _sparse_call("binary_csrmv", not weighted, False, data, indices, indptr, v, shape, transpose, backend,
                        False)


def binary_csrmm(data, indices, indptr, B, *, shape, transpose: bool = False, backend: Optional[str] = None,
                 workspace: Any = None, weighted: bool = False):
    """Event-driven ``A @ B`` (``A.T @ B`` with ``transpose=True``) for a CSR ``A`` and a (k, n) event matrix ``B``.

    Example::

        Y = xlakern.binary_csrmm(data, indices, indptr, spikes_kn, shape=(m, k))
    """
    return _sparse_call("binary_csrmm", not weighted, True, data, indices, indptr, B, shape, transpose, backend,
                        False)


def csrmv(data, indices, indptr, v, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """``A @ v`` (``A.T @ v``) for a CSR ``A`` and a float vector ``v`` (zero entries are skipped).

    Example::

        y = xlakern.csrmv(data, indices, indptr, x, shape=(m, n))
    """
    return _sparse_call("csrmv", False, False, data, indices, indptr, v, shape, transpose, backend, False)


def csrmm(data, indices, indptr, B, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """``A @ B`` (``A.T @ B``) for a CSR ``A`` and a float matrix ``B``.

    Example::

        Y = xlakern.csrmm(data, indices, indptr, X, shape=(m, n))
    """
    return _sparse_call("csrmm", False, True, data, indices, indptr, B, shape, transpose, backend, False)


def binary_fcnmv(weights, indices, spikes, *, shape, transpose: bool = False, backend: Optional[str] = None,
                 weighted: bool = False):
    """Event-driven product with a fixed-count structure: ``indices`` is (rows, K), row ``i`` holds
    ``W[i, indices[i, k]] = weights[i, k]`` (or the one shared weight); ``shape=(rows, cols)``.

    Example::

        y = xlakern.binary_fcnmv(w, idx, spikes, shape=(n_pre, n_post), transpose=True)
    """
    return _sparse_call("binary_fcnmv", not weighted, False, weights, indices, None, spikes, shape, transpose,
                        backend, True)


def binary_fcnmm(weights, indices, matrix, *, shape, transpose: bool = False, backend: Optional[str] = None,
                 weighted: bool = False):
    """:func:`binary_fcnmv` for a (k, n) event matrix.

    Example::

        Y = xlakern.binary_fcnmm(w, idx, spikes_kn, shape=(n_pre, n_post), transpose=True)
    """
    return _sparse_call("binary_fcnmm", not weighted, True, weights, indices, None, matrix, shape, transpose,
                        backend, True)


def fcnmv(weights, indices, vector, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """Float product with a fixed-count structure (see :func:`binary_fcnmv`).

    Example::

        y = xlakern.fcnmv(w, idx, x, shape=(n_pre, n_post))
    """
    return _sparse_call("fcnmv", False, False, weights, indices, None, vector, shape, transpose, backend, True)


def fcnmm(weights, indices, matrix, *, shape, transpose: bool = False, backend: Optional[str] = None):
    """Float matrix product with a fixed-count structure.

    Example::

        Y = xlakern.fcnmm(w, idx, X, shape=(n_pre, n_post))
    """
    return _sparse_call("fcnmm", False, True, weights, indices, None, matrix, shape, transpose, backend, True)


def _dense_call(name, mm, weights, spikes, transpose, backend, weighted):
    weights, unit_w = _units.split(weights)
    spikes, unit_s = _units.split(spikes)
    static = dict(name=name, mm=mm, transpose=bool(transpose), backend=backend, weighted=weighted)
    return _units.attach(run_fused(_dense_body, (weights, spikes), static), unit_w, unit_s)


def _dense_body(weights, spikes, *, name, mm, transpose, backend, weighted):
    weights, spikes, out_dtype = _prepare_values(name, weights, spikes, not weighted)
    if weights.ndim != 2:
        raise EventShapeError(f"{name}: weights has shape {tuple(weights.shape)}; expected a (rows, cols) matrix")
    rows, cols = weights.shape
    _check_spikes(name, "spikes", spikes, rows if transpose else cols, mm, transpose)
    n_out = cols if transpose else rows
    out = K.SDS((n_out,) + tuple(spikes.shape[1:]), K.acc_dtype(weights.dtype))
    op = K.DENSE_OPS.ops[(not weighted, mm)]
    res = op(weights, spikes, outs=[out], backend=backend, transpose=transpose)[0]
    return res.astype(out_dtype)


def binary_densemv(weights, spikes, *, transpose: bool, backend: Optional[str] = None, weighted: bool = False):
    """Event-driven dense product: ``weights @ s`` (``transpose=False``) or ``s @ weights`` (``True``),
    reading only the columns (rows) of active spikes.

    Example::

        y = xlakern.binary_densemv(W, spikes, transpose=True)   # sum of the rows of W that spiked
    """
    return _dense_call("binary_densemv", False, weights, spikes, transpose, backend, weighted)


def binary_densemm(weights, spikes, *, transpose: bool, backend: Optional[str] = None, weighted: bool = False):
    """Event-driven dense product with a (k, n) event matrix: ``weights @ S`` or ``weights.T @ S``.

    Example::

        Y = xlakern.binary_densemm(W, spikes_kn, transpose=False)
    """
    return _dense_call("binary_densemm", True, weights, spikes, transpose, backend, weighted)


__all__ = ["binary_csrmv", "binary_csrmm", "csrmv", "csrmm", "binary_fcnmv", "binary_fcnmm", "fcnmv", "fcnmm",
           "binary_densemv", "binary_densemm"]

