"""CSR helpers with BrainEvent 0.3's names: event products whose weights are read through a
permutation, dense row slices of a CSR matrix, and the index conversions between CSR, CSC and COO.

* ``binary_csrmv_indexed`` / ``binary_csrmm_indexed``: ``binary_csrmv(data[perm], ...)`` with the
  permutation read inside the kernels (``kernels/event_indexed_*``), so a scatter reads the
  weights of active rows only.
* ``csr_slice_rows``: the dense rows of a CSR matrix; its kernels (``kernels/csr_slice_*``) read the
  selected rows' synapses only. Differentiable in ``data``.
* ``csr_to_coo_index``, ``coo_to_csc_index``, ``csr_to_csc_index``, ``csc_to_csr_index``,
  ``coo2csr``: structure conversions. NumPy inputs give NumPy outputs (built on the host);
  other inputs give jax arrays. Coordinates (``indices``) are int32; offsets (``indptr``) and
  permutations are int32, or int64 past 2^31 - 1 entries (jax arrays then need x64).

Example::

    import numpy as np, xlakern as brainevent
    indptr, indices = np.array([0, 2, 3]), np.array([0, 2, 1])
    csc_indptr, csc_indices, perm = brainevent.csr_to_csc_index(indptr, indices, shape=(2, 3))
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import XLACustomKernel
from . import _kernels as K
from . import _units
from ._arguments import as_array
from ._errors import EventDTypeError, EventShapeError, IndexConversionError
from ._ops import _index, _shape2, _sparse_call, _weights

__all__ = [
    "binary_csrmv_indexed", "binary_csrmm_indexed", "binary_csrmv_indexed_p", "binary_csrmm_indexed_p",
    "csr_slice_rows", "csr_slice_rows_p",
    "csr_to_coo_index", "coo_to_csc_index", "csr_to_csc_index", "csc_to_csr_index", "coo2csr",
]

_PLATFORMS = ("cpu", "gpu", "tpu")


# ----------------------------------------------------------------------------- indexed event products

def binary_csrmv_indexed(data, indices, indptr, perm, v, *, shape, workspace: Any = None, transpose: bool = False,
                         backend: Optional[str] = None, weighted: bool = False):
    """Event-driven CSR product whose slot ``j`` weighs ``data[perm[j]]``: ``binary_csrmv(data[perm], ...)``
    without building ``data[perm]``.

    ``binary_csrmv_indexed(data, indices, indptr, perm, v, *, shape, workspace=None, transpose=False,
    backend=None, weighted=False)``. The kernels read ``data[perm[j]]`` in place, so a scatter
    (``transpose=True``) reads the weights of active rows only. One shared weight (size 1) ignores
    ``perm``; a ``perm`` entry outside ``[0, len(data))`` reads weight 0. ``workspace`` is accepted for
    BrainEvent compatibility and ignored (xlakern's kernels need none). Differentiable in ``data``
    (each slot's gradient goes to the weight it read) and in float ``v``.

    Example::

        # event @ CSC through the CSR arrays of the transpose, weights kept in CSC order
        y = xlakern.binary_csrmv_indexed(w_csc, csr_indices, csr_indptr, perm, spikes, shape=(m, n))
    """
    return _sparse_call("binary_csrmv_indexed", not weighted, False, data, indices, indptr, v, shape, transpose,
                        backend, False, perm=perm)


def binary_csrmm_indexed(data, indices, indptr, perm, B, *, shape, workspace: Any = None, transpose: bool = False,
                         backend: Optional[str] = None, weighted: bool = False):
    """:func:`binary_csrmv_indexed` for a (k, batch) event matrix ``B``: ``binary_csrmm(data[perm], ...)``.

    ``binary_csrmm_indexed(data, indices, indptr, perm, B, *, shape, workspace=None, transpose=False,
    backend=None, weighted=False)``.

    Example::

        Y = xlakern.binary_csrmm_indexed(w_csc, csr_indices, csr_indptr, perm, spikes_kb, shape=(m, n))
    """
    return _sparse_call("binary_csrmm_indexed", not weighted, True, data, indices, indptr, B, shape, transpose,
                        backend, False, perm=perm)


# the primitives (binary spikes; weighted=True uses the float ones, K.CSR_INDEXED_OPS.ops[(False, mm)])
binary_csrmv_indexed_p = K.CSR_INDEXED_OPS.ops[(True, False)]
binary_csrmm_indexed_p = K.CSR_INDEXED_OPS.ops[(True, True)]


# ----------------------------------------------------------------------------- row slices

def slice_rows_jnp(data, indices, indptr, row_indices, *, shape):
    """Dense ``(len(row_indices), cols)`` rows of the CSR matrix in the accumulation dtype; rows outside
    ``[0, rows)`` are zero, columns outside ``[0, cols)`` dropped, repeated columns within a row summed.
    (The reference backend: it scatters every synapse, where the kernels read the selected rows only.)"""
    m, n = shape
    s = row_indices.shape[0]
    acc = K.acc_dtype(data.dtype)
    if s == 0 or n == 0 or m == 0 or indices.size == 0:
        return jnp.zeros((s, n), acc)
    rows, inside = K.synapse_rows(indices, indptr, m, -1)
    wanted = (row_indices >= 0) & (row_indices < m)
    # slot[r]: one output row that asks for row r (-1: none). Each synapse is scattered once, into its
    # row's slot; a row selected twice is then copied from that slot, so the work is O(nse + s * cols).
    slot = jnp.full((m + 1,), -1, jnp.int32).at[jnp.where(wanted, row_indices, m)].set(
        jnp.arange(s, dtype=jnp.int32))[:m]
    target = jnp.where(inside, slot[rows], -1)
    ok = (target >= 0) & (indices >= 0) & (indices < n)
    w = jnp.broadcast_to(data.reshape(-1).astype(acc), indices.shape)
    block = jnp.zeros((s, n), acc).at[jnp.where(ok, target, s), jnp.where(ok, indices, 0)].add(
        jnp.where(ok, w, 0), mode="drop")
    source = jnp.where(wanted, slot[jnp.clip(row_indices, 0, m - 1)], -1)
    return jnp.where((source >= 0)[:, None], block[jnp.clip(source, 0, s - 1)], 0)


_slice_cpu_module = K.kernel_module("csr_slice_cpu.cc")
_slice_cuda_module = K.kernel_module("csr_slice_cuda.cu")


def _slice_rows_primitive() -> XLACustomKernel:
    """Operands (data, indices, indptr, selected rows), indptr and rows in indices' dtype; static
    ``shape``; output ``(len(rows), cols)`` in the accumulation dtype."""
    op = XLACustomKernel("csr_slice_rows")
    op.def_tags("event", "csr", "slice")

    def generator(outs, shape):
        return functools.partial(slice_rows_jnp, shape=shape)

    def compiled(module_fn):
        def gen(outs, shape):
            def run(data, indices, indptr, rows):
                if module_fn is _slice_cuda_module:  # at each lowering: the generator outlives the switch
                    K.note_atomic_sums("csr_slice_rows (rows that repeat a column)")
                return module_fn().csr_slice_rows(data, indices, indptr, rows, outs=outs[0], ncols=shape[1])
            return run
        return gen

    op.def_cpp_kernel(compiled(_slice_cpu_module))
    op.def_cuda_kernel(compiled(_slice_cuda_module))
    for platform in _PLATFORMS:
        op.def_kernel("jnp", platform, generator)

    # linear in data: the jnp form is its own tangent, and jax transposes it for grad
    def wrt_data(t, data, indices, indptr, row_indices, *, shape, **_):
        return [slice_rows_jnp(t, indices, indptr, row_indices, shape=shape)]

    op.def_jvp_rule2(wrt_data, None, None, None)
    return op


csr_slice_rows_p = _slice_rows_primitive()


def csr_slice_rows(data, indices, indptr, row_indices, *, shape, backend: Optional[str] = None):
    """Rows ``row_indices`` of the CSR matrix of ``shape=(rows, cols)``, as a dense array.

    ``csr_slice_rows(data, indices, indptr, row_indices, *, shape, backend=None)`` returns
    ``(len(row_indices), cols)`` (``(cols,)`` for a scalar row index) in ``data``'s dtype and unit.
    A row index outside ``[0, rows)`` (negative ones too) gives a row of zeros; repeated columns
    within a row are summed. ``data`` is one weight per synapse or one shared weight; the result is
    differentiable in ``data`` and works under jit and vmap.

    Example::

        rows = xlakern.csr_slice_rows(data, indices, indptr, jnp.array([0, 5]), shape=(100, 50))  # (2, 50)
    """
    name = "csr_slice_rows"
    data, unit = _units.split(data)
    data = _weights(name, "data", data)
    shape = _shape2(name, shape)
    indices = _index(name, "indices", indices)
    indptr = _index(name, "indptr", indptr)
    row_indices = as_array(name, "row_indices", row_indices, quantity=False)
    if not jnp.issubdtype(row_indices.dtype, jnp.integer):
        raise EventDTypeError(f"{name}: row_indices has dtype {row_indices.dtype}; it must be an integer array")
    if row_indices.ndim > 1:
        raise EventShapeError(f"{name}: row_indices has shape {tuple(row_indices.shape)}; expected a scalar or 1-D")
    if indices.ndim != 1:
        raise EventShapeError(f"{name}: indices has shape {tuple(indices.shape)}; expected (nse,)")
    if indptr.shape != (shape[0] + 1,):
        raise EventShapeError(f"{name}: indptr has shape {tuple(indptr.shape)}; expected ({shape[0] + 1},), rows + 1 "
                              f"for shape={shape}")
    if data.size != 1 and data.shape != indices.shape:
        raise EventShapeError(f"{name}: data has shape {tuple(data.shape)}; expected {tuple(indices.shape)}, one "
                              f"weight per index, or one shared weight")
    data = data.reshape(-1)
    selected = row_indices.reshape(-1)
    # rows outside the matrix become -1 before the cast, so a wide index cannot wrap onto a real row
    selected = jnp.where((selected >= 0) & (selected < shape[0]), selected, -1).astype(indices.dtype)
    res = csr_slice_rows_p(data, indices, indptr.astype(indices.dtype), selected,
                           outs=[K.SDS((selected.shape[0], shape[1]), K.acc_dtype(data.dtype))], backend=backend,
                           shape=shape)[0].astype(data.dtype)
    return _units.attach(res[0] if row_indices.ndim == 0 else res, unit)


# ----------------------------------------------------------------------------- index conversions

_INT32_MAX = np.iinfo(np.int32).max


def _offset_dtype(name: str, nse: int, host: bool):
    """int32 offsets, or int64 once they would overflow (jax arrays then need x64)."""
    if nse <= _INT32_MAX:
        return np.dtype(np.int32)
    if not host and not jax.config.jax_enable_x64:
        raise EventDTypeError(f"{name}: {nse} entries need int64 offsets, but JAX x64 is disabled; enable it with "
                              f"jax.config.update('jax_enable_x64', True) at start-up")
    return np.dtype(np.int64)


def _coords(name: str, arg: str, x):
    """An index array of a conversion: NumPy arrays stay on the host, anything else becomes a jax array;
    None, strings and non-integer arrays are refused naming the argument."""
    x = x if isinstance(x, np.ndarray) else as_array(name, arg, x, quantity=False)
    if not (np.issubdtype(x.dtype, np.integer) or (x.size == 0 and x.ndim == 1)):
        raise EventDTypeError(f"{name}: {arg} has dtype {x.dtype}; expected an integer array")
    if x.ndim != 1:
        raise EventShapeError(f"{name}: {arg} has shape {tuple(x.shape)}; expected a 1-D array")
    return x if np.issubdtype(x.dtype, np.integer) else x.astype(np.int32)


def _on_host(*arrays) -> bool:
    return all(isinstance(a, np.ndarray) for a in arrays)


def _check_coords(name: str, arg: str, coords, n: int) -> None:
    """Coordinates must lie in [0, n); checked wherever their values are known (not under a trace)."""
    if isinstance(coords, jax.core.Tracer) or np.size(coords) == 0:
        return
    lo, hi = int(np.min(coords)), int(np.max(coords))
    if lo < 0 or hi >= n:
        raise IndexConversionError(f"{name}: {arg} holds values in [{lo}, {hi}]; they must lie in [0, {n})")


def _compress(name, keys, others, n_keys: int, keys_arg: str, others_arg: str):
    """Group entries by ``keys`` (stable): (pointer over n_keys, others in that order (int32), order)."""
    host = _on_host(keys, others)
    xp = np if host else jnp
    keys, others = xp.asarray(keys), xp.asarray(others)
    if keys.shape != others.shape:
        raise EventShapeError(f"{name}: {keys_arg} has shape {tuple(keys.shape)} and {others_arg} "
                              f"{tuple(others.shape)}; give one row and one column for each entry")
    _check_coords(name, keys_arg, keys, n_keys)
    offset = _offset_dtype(name, int(keys.size), host)
    order = xp.argsort(keys, kind="stable") if host else jnp.argsort(keys, stable=True)
    counts = np.bincount(keys, minlength=n_keys) if host else jnp.bincount(keys, length=n_keys)
    ptr = xp.concatenate([xp.zeros((1,), offset), xp.cumsum(counts).astype(offset)])
    return ptr, others[order].astype(np.int32), order.astype(offset)


def csr_to_coo_index(indptr, indices):
    """COO coordinates of a CSR structure: ``(row ids, column ids)``, the latter ``indices`` itself.

    ``csr_to_coo_index(indptr, indices)``; NumPy in, NumPy out, else jax arrays (usable under jit).

    Example::

        rows, cols = xlakern.csr_to_coo_index(np.array([0, 2, 3]), np.array([0, 2, 1]))  # [0 0 1], [0 2 1]
    """
    indptr, indices = _coords("csr_to_coo_index", "indptr", indptr), _coords("csr_to_coo_index", "indices", indices)
    if isinstance(indptr, np.ndarray):
        return np.repeat(np.arange(indptr.size - 1), np.diff(indptr)), indices
    nse = int(np.shape(indices)[0])
    return jnp.repeat(jnp.arange(indptr.size - 1), jnp.diff(indptr), total_repeat_length=nse), indices


def coo_to_csc_index(pre_ids, indices, *, shape):
    """CSC structure of COO coordinates: ``(csc_indptr, csc_indices, perm)``, ``data[perm]`` in CSC order.

    ``coo_to_csc_index(pre_ids, indices, *, shape)``: ``pre_ids`` are rows and ``indices`` columns;
    entries of one column keep their COO order.

    Example::

        indptr, rows, perm = xlakern.coo_to_csc_index(np.array([0, 0, 1]), np.array([0, 2, 1]), shape=(2, 3))
    """
    name = "coo_to_csc_index"
    shape = _shape2(name, shape)
    return _compress(name, _coords(name, "indices", indices), _coords(name, "pre_ids", pre_ids), shape[1], "indices",
                     "pre_ids")


def coo2csr(row_ids, col_ids, *, shape):
    """CSR structure of COO coordinates: ``(csr_indptr, csr_indices, order)``, ``data[order]`` in CSR order.

    ``coo2csr(row_ids, col_ids, *, shape)``; entries of one row keep their COO order (columns are
    not sorted).

    Example::

        indptr, cols, order = xlakern.coo2csr(np.array([1, 0, 1]), np.array([2, 0, 1]), shape=(2, 3))
    """
    shape = _shape2("coo2csr", shape)
    return _compress("coo2csr", _coords("coo2csr", "row_ids", row_ids), _coords("coo2csr", "col_ids", col_ids),
                     shape[0], "row_ids", "col_ids")


_METHODS = ("coo", "numpy", "gpu_column_block")


def csr_to_csc_index(csr_indptr, csr_indices, *, shape, include_perm: bool = True, method: str = "coo",
                     column_block_size: int = 4096):
    """CSC structure of a CSR one: ``(csc_indptr, csc_indices, perm)`` with ``csr_data[perm]`` in CSC order.

    ``csr_to_csc_index(csr_indptr, csr_indices, *, shape, include_perm=True, method="coo",
    column_block_size=4096)``; ``include_perm=False`` returns None as ``perm``. Every ``method``
    gives the same arrays here (a stable sort by column); ``"numpy"`` builds on the host and returns
    jax arrays for jax inputs, as BrainEvent's does, and ``"gpu_column_block"`` (BrainEvent's CUDA
    builder) is served the same way; ``column_block_size`` is accepted and ignored.

    Example::

        csc_indptr, csc_indices, perm = xlakern.csr_to_csc_index(indptr, indices, shape=(n_pre, n_post))
        csc_data = data[perm]
    """
    name = "csr_to_csc_index"
    if method not in _METHODS:
        raise IndexConversionError(f"{name}: method must be one of {_METHODS}; got {method!r}")
    shape = _shape2(name, shape)
    csr_indptr, csr_indices = _coords(name, "csr_indptr", csr_indptr), _coords(name, "csr_indices", csr_indices)
    host = method != "coo" and not _on_host(csr_indptr, csr_indices)
    indptr, indices = (np.asarray(csr_indptr), np.asarray(csr_indices)) if host else (csr_indptr, csr_indices)
    rows, cols = csr_to_coo_index(indptr, indices)
    out = _compress(name, cols, rows, shape[1], "csr_indices", "csr_indptr's rows")
    if host:
        out = tuple(jnp.asarray(a) for a in out)
    return out[0], out[1], out[2] if include_perm else None


def csc_to_csr_index(csc_indptr, csc_indices, *, shape, include_perm: bool = True):
    """CSR structure of a CSC one of ``shape=(rows, cols)``: ``(csr_indptr, csr_indices, perm)`` with
    ``csc_data[perm]`` in CSR order (the CSC arrays are the CSR arrays of the transpose).

    ``csc_to_csr_index(csc_indptr, csc_indices, *, shape, include_perm=True)``.

    Example::

        indptr, indices, perm = xlakern.csc_to_csr_index(csc_indptr, csc_indices, shape=(n_pre, n_post))
    """
    name = "csc_to_csr_index"
    rows, cols = _shape2(name, shape)
    csc_indptr, csc_indices = _coords(name, "csc_indptr", csc_indptr), _coords(name, "csc_indices", csc_indices)
    return csr_to_csc_index(csc_indptr, csc_indices, shape=(cols, rows), include_perm=include_perm)
