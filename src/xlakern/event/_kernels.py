"""The operators' primitives: one XLACustomKernel per operator, with three backends each.

* ``cpp`` (cpu): ``kernels/event_cpu.cc`` compiled by :func:`xlakern.load_cpp_file` on first use,
  once per combination of operand dtypes (:func:`operand_module`).
* ``cuda`` (gpu): ``kernels/event_cuda.cu`` compiled by :func:`xlakern.load_cuda_file`, the same way.
* ``jnp`` (cpu, gpu, tpu): the same arithmetic in jax.numpy, the reference the tests compare with
  and the kernel on platforms without a compiled one.

Every primitive takes the normalised operands (weights, int32/int64 indices, spikes) and returns
the product in the accumulation dtype (float32, or float64 for float64 weights); the public
functions in ``_ops`` validate, cast back and attach units. Static keyword arguments: ``shape``
(the stored structure's (rows, cols)), ``transpose`` (False gathers rows, True scatters them).
Only the public core API is used: XLACustomKernel, the loaders and their cache.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from .. import (ConfigError, NotReproducibleWarning, XLACustomKernel, config, general_batching_rule, load_cpp_dir,
               load_cpp_file, load_cuda_dir, load_cuda_file)
from .._dtypes import DTYPES

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
SDS = jax.ShapeDtypeStruct


def _loader_of(sources: tuple[str, ...]):
    """(load function, its option for extra compiler flags) for ``kernels/<sources>``: one file through
    :func:`xlakern.load_cpp_file` / :func:`xlakern.load_cuda_file`, several (one translation unit each,
    compiled side by side, one module) through :func:`xlakern.load_cpp_dir` / :func:`xlakern.load_cuda_dir`."""
    cuda = sources[0].endswith(".cu")
    flags_option = "extra_cuda_cflags" if cuda else "extra_cflags"
    if len(sources) == 1:
        load_file = load_cuda_file if cuda else load_cpp_file
        return (lambda **kw: load_file(KERNEL_DIR / sources[0], **kw)), flags_option
    load_dir = load_cuda_dir if cuda else load_cpp_dir
    return (lambda **kw: load_dir(KERNEL_DIR, file_patterns=list(sources), **kw)), flags_option


# Every kernel module by the start of its name, for load_named_module: "xlakern_<stem>" -> (platform,
# loader of the module built for every combination of dtypes, loader of one combination or None).
_BY_STEM: dict[str, tuple[str, Callable[[], object], Callable[[str, str, int], object] | None]] = {}


def kernel_module(source: str, *more_sources: str):
    """The loader of ``kernels/<source>`` (C++, or CUDA for a ``.cu``; with ``more_sources``, the
    further translation units of the same module), module ``xlakern_<stem>``: it compiles on its first
    call (once per machine), then loads from xlakern's cache, once a process."""
    load, _ = _loader_of((source, *more_sources))
    loader = functools.lru_cache(maxsize=None)(lambda: load(name="xlakern_" + Path(source).stem))
    _BY_STEM.setdefault("xlakern_" + Path(source).stem, ("gpu" if source.endswith(".cu") else "cpu", loader, None))
    return loader


# The xk::DType enumerators that event_common.h's XK_EVENT_ONLY_* macros take, by NumPy dtype name (from the
# package's one dtype table, which a test checks against the C++ enum).
_DTYPE_ENUM = {d.name: d.cpp_enum for d in DTYPES}


def operand_flags(weights: str, indices: str, spikes: int) -> list[str]:
    """The compiler flags that keep one combination of operand dtypes (``XK_EVENT_ONLY_*`` in
    event_common.h): NumPy dtype names for ``weights`` and ``indices``, ``spikes`` a binary spike's
    width in bytes or 0 for float spikes."""
    return [f"-DXK_EVENT_ONLY_WEIGHTS={_DTYPE_ENUM[weights]}", f"-DXK_EVENT_ONLY_INDICES={_DTYPE_ENUM[indices]}",
            f"-DXK_EVENT_ONLY_SPIKES={spikes}"]


def operand_module(source: str, *more_sources: str):
    """The loader of ``kernels/<source>`` (and ``more_sources``, the further translation units of the
    same module, compiled side by side) built for one combination of operand dtypes.

    ``loader(weights, indices, spikes, binary)`` takes the dtypes the entry point will see (``weights``:
    the weights', or a JITC product's parameters'; ``indices`` None where the entry point reads none)
    and returns the module ``xlakern_<stem>_<weights>_<indices>_<spikes>``, compiled with only that
    combination's kernels (``XK_EVENT_ONLY_*`` in event_common.h): a binary spike is its width in bytes
    (``b1`` for bool), float spikes ``f``. Each module compiles on its first call (once per machine), then
    loads from xlakern's cache, once a process. The defaults are the common case (float32 weights,
    int32 indices, bool spikes). A first product so compiles one combination of ~50: on 2 cores
    event_cuda.cu took 6 s instead of 40 s and event_cpu.cc 1.7 s instead of 27 s (bench/RESULTS.md).
    ``XLAKERN_EVENT_BUILDS=all`` takes one build of every combination instead (``xlakern_<stem>``),
    e.g. to fill a cache that many dtypes will share with one compile."""
    load, flags_option = _loader_of((source, *more_sources))
    stem = Path(source).stem
    every_dtype = kernel_module(source, *more_sources)

    @functools.lru_cache(maxsize=None)
    def build(weights: str, indices: str, spikes: int):
        name = f"xlakern_{stem}_{weights}_{indices}_{f'b{spikes}' if spikes else 'f'}"
        return load(name=name, **{flags_option: operand_flags(weights, indices, spikes)})

    platform, _, _ = _BY_STEM[f"xlakern_{stem}"]
    _BY_STEM[f"xlakern_{stem}"] = (platform, every_dtype, build)

    def loader(weights="float32", indices="int32", spikes="bool", binary: bool = True):
        builds = os.environ.get("XLAKERN_EVENT_BUILDS", "")
        if builds == "all":
            return every_dtype()
        if builds not in ("", "each"):
            raise ConfigError(f"XLAKERN_EVENT_BUILDS={builds!r}: use 'each' (one build per combination of "
                              f"operand dtypes, the default) or 'all' (one build of every combination)")
        # an entry point without indices dispatches none: any build serves it, so take the common one
        index_name = "int32" if indices is None else jnp.dtype(indices).name
        return build(jnp.dtype(weights).name, index_name, jnp.dtype(spikes).itemsize if binary else 0)

    return loader


def known_module(name: str, platform: str, loader: Callable[[], object]) -> None:
    """Let :func:`load_named_module` find module ``name``, which ``loader()`` loads some other way."""
    _BY_STEM.setdefault(name, (platform, loader, None))


def load_named_module(name: str, platform: str) -> bool:
    """Load the kernel module ``name`` (``xlakern_<stem>`` or ``xlakern_<stem>_<weights>_<indices>_<spikes>``,
    as the loaders above name them) if it is one of this package's and runs on ``platform`` ('cpu' or 'gpu'):
    compiled on its first use on this machine, else taken from the cache. Returns whether it was one.
    What :func:`xlakern.prepare_exported` calls for a program exported in another process."""
    for prefix, (where, every_dtype, build) in _BY_STEM.items():
        if where != platform:
            continue
        if name == prefix:
            every_dtype()
            return True
        if build is None or not name.startswith(prefix + "_"):
            continue
        parts = name[len(prefix) + 1:].split("_")
        if len(parts) == 3 and parts[0] in _DTYPE_ENUM and parts[1] in ("int32", "int64") and (
                parts[2] == "f" or parts[2] in ("b1", "b2", "b4", "b8")):
            build(parts[0], parts[1], 0 if parts[2] == "f" else int(parts[2][1:]))
            return True
    return False


cpu_module = operand_module("event_cpu.cc")
cuda_module = operand_module("event_cuda.cu")
# the per-synapse CSR kernels: dt2t at the row, the weight gradient's row x column product, each slot's
# row; built per combination too (weights: dt2t's; indices: the layout's), since a first gradient waits on
# them (csr_synapse_cpu.cc: 2.7 s for every dtype, 1.4 s for one, on 2 cores)
synapse_cpu_module = operand_module("csr_synapse_cpu.cc")
synapse_cuda_module = operand_module("csr_synapse_cuda.cu")
# The indexed products (weights read through a permutation) are separate modules, so that the
# modules every product compiles do not carry their instantiations.
indexed_cpu_module = operand_module("event_indexed_cpu.cc")
indexed_cuda_module = operand_module("event_indexed_cuda.cu")


def acc_dtype(weight_dtype) -> jnp.dtype:
    return jnp.dtype(jnp.float64) if jnp.dtype(weight_dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def bits_scratch(spikes, ncols: int, transpose: bool, binary: bool, spike_bytes: bool = False) -> jax.ShapeDtypeStruct:
    """The CUDA gathers' second output: room for binary spikes as bits (a word per 32 columns) and
    their summary (a bit per 8 columns: ``spike_summary_words`` in event_common.h) when they are one
    column (mv), else one word. XLA allocates it per call as a temporary; the kernel packs the spikes
    there when the bitmask does not fit a block's shared memory (from ~1.8M columns). With
    ``spike_bytes`` (the stored-layout gathers), binary spikes wider than a byte in several columns get
    a byte each instead: the mm gather copies them there for its tiles (gather_wide_binary_as_bytes)."""
    if not (binary and not transpose):
        return SDS((1,), jnp.uint32)
    if spikes.ndim == 2:
        if spike_bytes and jnp.dtype(spikes.dtype).itemsize > 1 and spikes.shape[1] > 1:
            return SDS((max((spikes.size + 3) // 4, 1),), jnp.uint32)
        return SDS((1,), jnp.uint32)
    words = (ncols + 31) // 32
    summary = (words + 31) // 32 * 4
    return SDS((max(words + summary, 1),), jnp.uint32)


def exact_scratch(out: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """The scratch of a reproducible GPU scatter into ``out`` (``exact_scatter_words`` in
    event_exact_scatter_cuda.cuh): a header of 4 words, then an int64 sum and a word of flags per output."""
    return SDS((4 + 3 * math.prod(out.shape),), jnp.uint32)


def call_product(entry, *arrays, out, scratch: bool, spike_cols: int, transpose: bool, binary: bool,
                 spike_bytes: bool = False, room: jax.ShapeDtypeStruct | None = None, **attrs):
    """One product through a compiled entry point whose last array is the spikes (``spike_cols`` columns
    of the stored or generated matrix). With ``scratch`` (the CUDA entry points) it also passes
    ``room`` (default :func:`bits_scratch`) as a second output and returns the product alone."""
    kw = dict(transpose=transpose, binary=binary, **attrs)
    if not scratch:
        return entry(*arrays, outs=out, **kw)
    if room is None:
        room = bits_scratch(arrays[-1], spike_cols, transpose, binary, spike_bytes)
    product, _ = entry(*arrays, outs=[out, room], **kw)
    return product


_warned_atomic_sums: set[str] = set()


def note_atomic_sums(product: str) -> None:
    """Warns once per ``product`` (a GPU kernel that adds with float atomics) when it is traced under
    :func:`xlakern.config.set_deterministic`, which does not cover it."""
    if product in _warned_atomic_sums or not config.get_deterministic():
        return
    _warned_atomic_sums.add(product)
    warnings.warn(f"{product} on the GPU adds with float atomics, so its output may differ in its last bits from "
                  f"run to run even with xlakern.config.set_deterministic(True), which covers the stored-layout, "
                  f"dense and JITC scatters (CSR, CSC, FixedNumPerPre/Post, indexed CSR, dense, JITC*) and "
                  f"run_lif_network only",
                  NotReproducibleWarning, stacklevel=2)


def spike_factor(spikes, binary: bool, dtype):
    """What a spike contributes: 1 where active (non-zero) for binary operators, else its value."""
    return (spikes != 0).astype(dtype) if binary else spikes.astype(dtype)


# ----------------------------------------------------------------------------- COO view (jnp)

def counted_rows(indptr, nse: int, dtype=None):
    """The row of each of ``nse`` slots, in ``[-1, rows]``: the number of row starts (``indptr``
    clipped into ``[0, nse]``) at or before the slot, less one. -1 lies before the first row and
    ``rows`` after the last; for a non-decreasing ``indptr`` the rest is the row whose range holds
    the slot. A count scattered into ``nse + 1`` bins, then a cumulative sum: two linear passes,
    where a binary search per synapse cost 4-7x more on the CPU and ~8 ms for 32M synapses on an H100."""
    if dtype is None:
        dtype = jnp.int32 if nse < 2**31 - 1 else jnp.int64
    starts = jnp.zeros((nse + 1,), dtype).at[jnp.clip(indptr, 0, nse)].add(1)
    return jnp.cumsum(starts[:nse]) - 1


def synapse_rows(indices, indptr, nrows: int, nconn: int):
    """Row of every synapse and whether it lies inside a row (the kernels' indptr clamping), in jnp:
    the references' form (:func:`slot_rows` is the compiled one). ``nconn >= 0``: fixed-count rows."""
    nse = indices.size
    if nconn >= 0:
        return jnp.arange(nse) // max(nconn, 1), jnp.ones((nse,), bool)
    rows = counted_rows(indptr, nse)
    inside = (rows >= 0) & (rows < nrows)
    return jnp.clip(rows, 0, max(nrows - 1, 0)), inside


def _slot_rows_primitive() -> XLACustomKernel:
    """``csr_slot_rows``: operand indptr (int32/int64, rows + 1); output (nse,) int32/int64, each slot's
    row in ``[-1, rows]`` as :func:`counted_rows` gives it (on GPUs, for a non-decreasing indptr).
    C++/CUDA kernels find the rows as they go (csr_rows.h); XLA's CPU scan took ~4 ns a slot."""
    op = XLACustomKernel("csr_slot_rows")
    op.def_tags("event", "csr")

    def compiled(module_fn):
        return lambda outs: (lambda indptr: module_fn(indices=indptr.dtype).csr_slot_rows(indptr, outs=outs[0]))

    op.def_cpp_kernel(compiled(synapse_cpu_module))
    op.def_cuda_kernel(compiled(synapse_cuda_module))
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform,
                      lambda outs: (lambda indptr: counted_rows(indptr, outs[0].shape[0], outs[0].dtype)))
    return op


slot_rows_p = _slot_rows_primitive()


def slot_rows(indices, indptr, nrows: int, nconn: int = -1, backend=None):
    """:func:`synapse_rows` through ``csr_slot_rows``'s kernels: (row clipped into ``[0, rows)``,
    inside a row) for every synapse. For the paths users run (csr_apply, layout conversions), not
    for references. Fixed-count rows (``nconn >= 0``) and index dtypes other than int32/int64 stay jnp."""
    nse = indices.size
    if nconn >= 0 or nse == 0 or jnp.dtype(indptr.dtype) not in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)):
        return synapse_rows(indices, indptr, nrows, nconn)
    dtype = jnp.int32 if nrows < 2**31 - 1 else jnp.int64
    rows = slot_rows_p(indptr, outs=[SDS((nse,), dtype)], backend=backend)[0]
    inside = (rows >= 0) & (rows < nrows)
    return jnp.clip(rows, 0, max(nrows - 1, 0)), inside


def rows_for(backend):
    """The row finder of a rule run under ``backend``: the jnp count (:func:`synapse_rows`) for the jnp
    reference, so it stays independent of the kernels; the kernel (:func:`slot_rows`) otherwise."""
    return synapse_rows if backend == "jnp" else slot_rows


def _coo(data, indices, indptr, shape, nconn):
    nrows, ncols = shape
    cols = indices.reshape(-1)
    rows, inside = synapse_rows(indices, indptr, nrows, nconn)
    valid = inside & (cols >= 0) & (cols < ncols)  # out-of-range synapses are dropped
    acc = acc_dtype(data.dtype)
    w = jnp.broadcast_to(data.reshape(-1).astype(acc), cols.shape)
    return rows, jnp.clip(cols, 0, max(ncols - 1, 0)), valid, w


def as_columns(x):
    """``x`` as (rows, columns): its leading axis, then the rest flattened (a plain ``reshape(n, -1)``
    cannot tell the columns when there are no rows)."""
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


def reference_sparse(data, indices, indptr, spikes, *, shape, transpose, binary, nconn):
    """jnp form of event_sparse: the product through a COO view of the structure."""
    nrows, ncols = shape
    acc = acc_dtype(data.dtype)
    s2 = as_columns(spikes)
    nout = ncols if transpose else nrows
    if nrows == 0 or ncols == 0 or indices.size == 0:
        return jnp.zeros((nout,) + spikes.shape[1:], acc)
    rows, cols, valid, w = _coo(data, indices, indptr, shape, nconn)
    f = spike_factor(s2, binary, acc)
    src, dst = (rows, cols) if transpose else (cols, rows)
    # an inactive spike contributes nothing, even through a NaN or infinite weight, as in the kernels
    contrib = jnp.where(valid[:, None] & (f[src] != 0), w[:, None] * f[src], 0)
    out = jnp.zeros((nout, s2.shape[1]), acc).at[dst].add(contrib)
    return out.reshape((nout,) + spikes.shape[1:])


def row_col_product_jnp(a, b, indices, indptr, *, shape, nconn=-1):
    """Per slot: the sum over batch columns of ``a[row] * b[column]`` (0 for a slot outside every row
    or a column outside ``[0, cols)``); ``a`` is (rows, batch), ``b`` (cols, batch). CSR rows, or
    fixed-count rows of ``nconn`` slots when ``nconn >= 0``."""
    if indices.size == 0 or shape[0] == 0 or shape[1] == 0:
        return jnp.zeros((indices.size,), a.dtype)
    rows, cols, valid, _ = _coo(jnp.zeros((1,), a.dtype), indices.reshape(-1), indptr, shape, nconn)
    return jnp.where(valid, jnp.sum(a[rows] * b[cols], axis=1), 0).astype(a.dtype)


def _row_col_primitive() -> XLACustomKernel:
    """``csr_row_col_product``: operands (a, b, indices, indptr) as in :func:`row_col_product_jnp`, a
    and b float32 or float64, indptr in indices' dtype (unread for fixed-count rows); statics
    ``shape`` and ``nconn``; output (nse,) in a's dtype.
    The weight gradient of every CSR product: C++/CUDA kernels find each slot's row as they go and
    skip the columns of rows whose ``a`` is zero (a silent neuron's synapses, in a scatter's gradient)."""
    op = XLACustomKernel("csr_row_col_product")
    op.def_tags("event", "csr", "gradient")

    def compiled(module_fn):
        def generator(outs, shape, nconn):
            return lambda a, b, indices, indptr: module_fn(indices=indices.dtype).csr_row_col_product(
                a, b, indices, indptr, outs=outs[0], nconn=nconn)
        return generator

    op.def_cpp_kernel(compiled(synapse_cpu_module))
    op.def_cuda_kernel(compiled(synapse_cuda_module))
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform,
                      lambda outs, shape, nconn: functools.partial(row_col_product_jnp, shape=shape, nconn=nconn))

    # bilinear in a and b; the jnp tangents are what jax transposes for higher-order gradients
    def wrt_a(t, a, b, indices, indptr, *, shape, nconn, **_):
        return [row_col_product_jnp(t, b, indices, indptr, shape=shape, nconn=nconn)]

    def wrt_b(t, a, b, indices, indptr, *, shape, nconn, **_):
        return [row_col_product_jnp(a, t, indices, indptr, shape=shape, nconn=nconn)]

    op.def_jvp_rule2(wrt_a, wrt_b, None, None)
    return op


def sparse_data_cotangent(ct, data_aval, indices, indptr, spikes, *, shape, transpose, binary, nconn,
                          backend=None):
    """Cotangent of the weights: the output cotangent at each synapse's output times its spike factor
    (through ``csr_row_col_product``, for CSR and fixed-count rows; ``backend="jnp"`` keeps it in jnp)."""
    acc = acc_dtype(data_aval.dtype)
    nse = indices.size
    if nse == 0 or shape[0] == 0 or shape[1] == 0:
        return jnp.zeros(data_aval.shape, data_aval.dtype)
    s2 = spike_factor(as_columns(spikes), binary, acc)
    c2 = as_columns(ct).astype(acc)
    a, b = (s2, c2) if transpose else (c2, s2)
    ptr = jnp.zeros((1,), indices.dtype) if indptr is None else indptr.astype(indices.dtype)  # fixed count: unread
    per = row_col_p(a, b, indices.reshape(-1), ptr, outs=[SDS((nse,), acc)],
                    backend="jnp" if backend == "jnp" else None, shape=tuple(shape), nconn=int(nconn))[0]
    if data_aval.size == 1:
        return per.sum().reshape(data_aval.shape).astype(data_aval.dtype)
    return per.reshape(data_aval.shape).astype(data_aval.dtype)


def reference_dense(weights, spikes, *, transpose, binary):
    acc = acc_dtype(weights.dtype)
    w = weights.astype(acc)
    f = spike_factor(spikes, binary, acc)
    hi = jax.lax.Precision.HIGHEST

    def product(w):
        return jnp.matmul(w.T, f, precision=hi) if transpose else jnp.matmul(w, f, precision=hi)

    def column(fv):
        # one spike column, the weights of its inactive spikes masked out
        active = fv != 0
        masked = jnp.where(active[:, None] if transpose else active[None, :], w, 0)
        return jnp.matmul(masked.T, fv, precision=hi) if transpose else jnp.matmul(masked, fv, precision=hi)

    def masked_product(w):
        return column(f) if f.ndim == 1 else jax.lax.map(column, f.T).T

    # An inactive spike contributes nothing, even through a NaN or infinite weight, as in the kernels: a
    # matmul would give 0 * inf = NaN there. Weights that are all finite (the usual case) take the plain
    # matmul; the masked one costs a pass over the weights per spike column.
    return jax.lax.cond(jnp.isfinite(w).all(), product, masked_product, w)


def dense_weight_cotangent(ct, w_aval, spikes, *, transpose, binary):
    acc = acc_dtype(w_aval.dtype)
    f = as_columns(spike_factor(spikes, binary, acc))
    c = as_columns(ct.astype(acc))
    hi = jax.lax.Precision.HIGHEST
    g = jnp.matmul(f, c.T, precision=hi) if transpose else jnp.matmul(c, f.T, precision=hi)
    return g.astype(w_aval.dtype)


# ----------------------------------------------------------------------------- primitives

def _undefined(x):
    return ad.is_undefined_primal(x)


def _aval(x):
    return x.aval if _undefined(x) else x


def permuted(data, perm):
    """The weight of each stored slot: ``data[perm]``, 0 where ``perm`` is outside ``[0, data.size)``
    (as the kernels read it); one shared weight stays as it is."""
    if data.size == 1:
        return data
    ok = (perm >= 0) & (perm < data.size)
    return jnp.where(ok, data[jnp.clip(perm, 0, data.size - 1)], 0).astype(data.dtype)


def unpermuted(per_slot, perm, n: int):
    """The transpose of :func:`permuted` for ``n`` weights: each slot's value added to the weight it read."""
    ok = (perm >= 0) & (perm < n)
    return jnp.zeros((n,), per_slot.dtype).at[jnp.where(ok, perm, n)].add(per_slot, mode="drop")


class _Family:
    """The primitives of one storage family (csr, fcn, dense, or csr_indexed: CSR whose slot ``p``
    weighs ``data[perm[p]]``, an operand after indptr): binary/float x mv/mm."""

    def __init__(self, family: str):
        self.family = family
        self.indexed = family == "csr_indexed"
        self.ops: dict[tuple[bool, bool], XLACustomKernel] = {}
        for binary in (True, False):
            for mm in (False, True):
                base = "csr" if self.indexed else family
                name = ("binary_" if binary else "") + base + ("mm" if mm else "mv") + ("_indexed" if self.indexed else "")
                op = XLACustomKernel(name)
                op.def_tags("event", "csr" if self.indexed else family, "binary" if binary else "float",
                            "mm" if mm else "mv", *(["indexed"] if self.indexed else []))
                self._register(op, binary)
                self.ops[(binary, mm)] = op

    # the arrays the primitive takes before the spikes
    def n_struct(self) -> int:
        return {"csr": 3, "csr_indexed": 4, "fcn": 2, "dense": 1}[self.family]

    def _split(self, args):
        """(data, indices, indptr, spikes, nconn, perm) from a call's arrays (dense: indices is None;
        perm is None but for csr_indexed)."""
        if self.family == "csr":
            data, indices, indptr, spikes = args
            return data, indices, indptr, spikes, -1, None
        if self.indexed:
            data, indices, indptr, perm, spikes = args
            return data, indices, indptr, spikes, -1, perm
        if self.family == "fcn":
            data, indices, spikes = args
            return data, indices, None, spikes, _aval(indices).shape[1], None
        weights, spikes = args
        return weights, None, None, spikes, None, None

    def _register(self, op: XLACustomKernel, binary: bool) -> None:
        family = self.family

        def compiled(module_fn, gpu: bool):
            def generator(outs, transpose, shape=None):
                def run(*args):
                    data, indices, indptr, spikes, nconn, perm = self._split(args)
                    index_dtype = None if indices is None else indices.dtype
                    mod = module_fn(data.dtype, index_dtype, spikes.dtype, binary)
                    # the CUDA scatters sum reproducibly (in fixed point) under config.set_deterministic
                    # (read at each lowering: XLACustomKernel caches this generator across the switch)
                    exact = gpu and transpose and config.get_deterministic()
                    on_gpu = {"deterministic": exact} if gpu else {}
                    if perm is not None:  # (the CUDA entry's scratch serves only its reproducible scatter)
                        return call_product(mod.event_sparse_indexed, data, indices, indptr, perm, spikes,
                                            out=outs[0], scratch=gpu, spike_cols=shape[1], nrows=shape[0],
                                            ncols=shape[1], transpose=transpose, binary=binary,
                                            room=exact_scratch(outs[0]) if exact else SDS((1,), jnp.uint32),
                                            **on_gpu)
                    if family == "dense":  # (its CUDA scatter adds no slices atomically under set_deterministic)
                        return mod.event_dense(data, spikes, outs=outs[0], transpose=transpose, binary=binary,
                                               **on_gpu)
                    if indptr is None:  # fixed count per row: the kernel ignores indptr
                        indptr = jnp.zeros((1,), indices.dtype)
                    return call_product(mod.event_sparse, data, indices.reshape(-1), indptr, spikes, out=outs[0],
                                        scratch=gpu, spike_cols=shape[1], spike_bytes=True, nrows=shape[0],
                                        ncols=shape[1], nconn=nconn, transpose=transpose, binary=binary,
                                        room=exact_scratch(outs[0]) if exact else None, **on_gpu)
                return run
            return generator

        def reference(outs, transpose, shape=None):
            def run(*args):
                data, indices, indptr, spikes, nconn, perm = self._split(args)
                if family == "dense":
                    return reference_dense(data, spikes, transpose=transpose, binary=binary)
                if perm is not None:
                    data = permuted(data, perm)
                return reference_sparse(data, indices, indptr, spikes, shape=shape, transpose=transpose,
                                        binary=binary, nconn=nconn)
            return run

        op.def_cpp_kernel(compiled(indexed_cpu_module if self.indexed else cpu_module, gpu=False))
        op.def_cuda_kernel(compiled(indexed_cuda_module if self.indexed else cuda_module, gpu=True))
        for platform in ("cpu", "gpu", "tpu"):
            op.def_kernel("jnp", platform, reference)
        op.def_jvp_rule2(*self._jvp_rules(op, binary))
        op.def_transpose_rule(functools.partial(self._transpose, op, binary))
        op.def_batching_rule(functools.partial(self._batch, op, binary))

    # JVP: linear in the weights; the spike tangent goes through the float operator (for binary
    # operators that is the surrogate gradient: the spikes' values instead of their activity).
    def _jvp_rules(self, op, binary):
        n = self.n_struct()

        def wrt_data(t, *args, **kw):
            return op(t, *args[1:], **kw)

        def wrt_spikes(t, *args, **kw):
            float_op = self.ops[(False, args[-1].ndim == 2)]
            acc = acc_dtype(args[0].dtype)
            return float_op(*args[:-1], t.astype(acc), **kw)

        return [wrt_data] + [None] * (n - 1) + [wrt_spikes]

    def _transpose(self, op, binary, cts, *args, outs, backend, transpose, shape=None):
        data, indices, indptr, spikes, nconn, perm = self._split(args)
        ct = cts[0]
        res = [None] * len(args)
        if _undefined(data) and not _undefined(spikes):
            if self.family == "dense":
                res[0] = dense_weight_cotangent(ct, data.aval, spikes, transpose=transpose, binary=binary)
            elif perm is not None and data.aval.size != 1:
                # each slot's cotangent goes back to the weight it read, data[perm[p]]
                slots = jax.core.ShapedArray(indices.shape, data.aval.dtype)
                per_slot = sparse_data_cotangent(ct, slots, indices, indptr, spikes, shape=shape,
                                                 transpose=transpose, binary=binary, nconn=nconn, backend=backend)
                res[0] = unpermuted(per_slot, perm, data.aval.size).reshape(data.aval.shape)
            else:
                res[0] = sparse_data_cotangent(ct, data.aval, indices, indptr, spikes, shape=shape,
                                               transpose=transpose, binary=binary, nconn=nconn, backend=backend)
        if _undefined(spikes) and not _undefined(data):
            # the product in the opposite orientation, with the cotangent as (float) spikes
            s_aval = spikes.aval
            float_op = self.ops[(False, s_aval.ndim == 2)]
            acc = acc_dtype(data.dtype)
            kw = {} if shape is None else {"shape": shape}
            back = float_op(*args[:-1], ct.astype(acc), outs=[SDS(s_aval.shape, acc)], backend=backend,
                            transpose=not transpose, **kw)[0]
            res[-1] = back.astype(s_aval.dtype)
        return res

    # vmap over the spikes alone becomes one mm launch; anything else runs as a loop.
    def _batch(self, op, binary, args, axes, *, outs, backend, transpose, shape=None):
        kw = {"transpose": transpose, "backend": backend}
        if shape is not None:
            kw["shape"] = shape
        spikes, s_axis = args[-1], axes[-1]
        if s_axis is not None and all(a is None for a in axes[:-1]):
            mm = self.ops[(binary, True)]
            out = outs[0]
            if spikes.ndim == 2:  # mv: (batch, n) -> (n, batch)
                s = jnp.moveaxis(spikes, s_axis, 1)
                res = mm(*args[:-1], s, outs=[SDS((out.shape[0], s.shape[1]), out.dtype)], **kw)[0]
                return [res], [1]
            s = jnp.moveaxis(spikes, s_axis, 1)  # (k, batch, n) -> (k, batch * n)
            k, b, n = s.shape
            res = mm(*args[:-1], s.reshape(k, b * n), outs=[SDS((out.shape[0], b * n), out.dtype)], **kw)[0]
            return [res.reshape(out.shape[0], b, n)], [1]
        return general_batching_rule(op, args, axes, outs=list(outs), **kw)


row_col_p = _row_col_primitive()
CSR_OPS = _Family("csr")
CSR_INDEXED_OPS = _Family("csr_indexed")
FCN_OPS = _Family("fcn")
DENSE_OPS = _Family("dense")

binary_csrmv_p = CSR_OPS.ops[(True, False)]
binary_csrmm_p = CSR_OPS.ops[(True, True)]
csrmv_p = CSR_OPS.ops[(False, False)]
csrmm_p = CSR_OPS.ops[(False, True)]
binary_fcnmv_p = FCN_OPS.ops[(True, False)]
binary_fcnmm_p = FCN_OPS.ops[(True, True)]
fcnmv_p = FCN_OPS.ops[(False, False)]
fcnmm_p = FCN_OPS.ops[(False, True)]
binary_densemv_p = DENSE_OPS.ops[(True, False)]
binary_densemm_p = DENSE_OPS.ops[(True, True)]
densemv_p = DENSE_OPS.ops[(False, False)]
densemm_p = DENSE_OPS.ops[(False, True)]

ALL_PRIMITIVES = (binary_csrmv_p, binary_csrmm_p, csrmv_p, csrmm_p, binary_fcnmv_p, binary_fcnmm_p, fcnmv_p,
                  fcnmm_p, binary_densemv_p, binary_densemm_p, densemv_p, densemm_p)
