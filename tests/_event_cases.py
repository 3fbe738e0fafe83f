"""Random connectivity and dense float64 references shared by the event-operator tests."""

from __future__ import annotations

import numpy as np

import xlakern

OPS = {
    # (family, binary, mm) -> public function
    ("csr", True, False): xlakern.binary_csrmv, ("csr", True, True): xlakern.binary_csrmm,
    ("csr", False, False): xlakern.csrmv, ("csr", False, True): xlakern.csrmm,
    ("fcn", True, False): xlakern.binary_fcnmv, ("fcn", True, True): xlakern.binary_fcnmm,
    ("fcn", False, False): xlakern.fcnmv, ("fcn", False, True): xlakern.fcnmm,
    ("dense", True, False): xlakern.binary_densemv, ("dense", True, True): xlakern.binary_densemm,
}


def random_csr(rng, rows, cols, density, empty_rows=True):
    mask = rng.random((rows, cols)) < density
    if empty_rows and rows > 2:
        mask[rng.integers(0, rows, size=max(1, rows // 5))] = False
    dense = np.where(mask, rng.standard_normal((rows, cols)), 0.0)
    r, c = np.nonzero(dense)
    indptr = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=rows), out=indptr[1:])
    return dense, dense[r, c], c, indptr


def random_csr_with_dropped_slots(rng, rows, cols, density, every, bad_values):
    """random_csr with one slot in `every` pointing outside the columns (at one of `bad_values`). Returns
    (kept, data, indices, indptr): `kept` is the dense matrix of the slots left in range, the one an
    operator multiplies by (out-of-range slots are dropped)."""
    dense, data, idx, ptr = random_csr(rng, rows, cols, density)
    bad = idx.copy()
    pick = rng.choice(len(idx), size=max(1, len(idx) // every), replace=False)
    bad[pick] = rng.choice(bad_values, size=pick.size)
    kept = np.zeros_like(dense)
    ok = (bad >= 0) & (bad < cols)
    np.add.at(kept, (np.repeat(np.arange(rows), np.diff(ptr))[ok], bad[ok]), data[ok])
    return kept, data, bad, ptr


def random_fcn(rng, rows, cols, k):
    idx = np.stack([rng.choice(cols, size=k, replace=False) for _ in range(rows)]) if k else np.zeros((rows, 0), int)
    w = rng.standard_normal((rows, k))
    dense = np.zeros((rows, cols))
    for r in range(rows):
        dense[r, idx[r]] += w[r]
    return dense, w, idx


def spikes(rng, n, batch, pattern, dtype):
    shape = (n,) if batch is None else (n, batch)
    if pattern == "zero":
        on = np.zeros(shape, bool)
    elif pattern == "all":
        on = np.ones(shape, bool)
    else:
        on = rng.random(shape) < 0.3
    if dtype == bool:
        return on
    vals = rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)  # non-zero values of either sign
    return np.where(on, vals, 0).astype(dtype)


def reference(dense, s, binary, transpose):
    """Dense float64 product: binary spikes count as 1 where non-zero."""
    f = (s != 0).astype(np.float64) if binary else s.astype(np.float64)
    return (dense.T if transpose else dense) @ f


def call(family, binary, mm, dense, arrays, s, transpose, backend, dtype=None, index_dtype=np.int64):
    """The operator on the family's arrays (weights cast to dtype) with jnp inputs."""
    import jax.numpy as jnp

    fn = OPS[(family, binary, mm)]
    if family == "dense":
        return fn(jnp.asarray(dense, dtype), jnp.asarray(s), transpose=transpose, backend=backend)
    shape = dense.shape
    if family == "csr":
        data, idx, ptr = arrays
        return fn(jnp.asarray(data, dtype), jnp.asarray(idx, index_dtype), jnp.asarray(ptr, index_dtype),
                  jnp.asarray(s), shape=shape, transpose=transpose, backend=backend)
    w, idx = arrays
    return fn(jnp.asarray(w, dtype), jnp.asarray(idx, index_dtype), jnp.asarray(s), shape=shape,
              transpose=transpose, backend=backend)


def make(rng, family, rows, cols, density):
    if family == "csr":
        dense, data, idx, ptr = random_csr(rng, rows, cols, density)
        return dense, (data, idx, ptr)
    if family == "fcn":
        k = int(round(density * cols))
        dense, w, idx = random_fcn(rng, rows, cols, k)
        return dense, (w, idx)
    dense = np.where(rng.random((rows, cols)) < max(density, 0.05), rng.standard_normal((rows, cols)), 0.0)
    return dense, ()
