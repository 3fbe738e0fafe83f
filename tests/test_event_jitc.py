"""Just-in-time connectivity (xlakern.event._jitc): the generator's promise (one seed, one matrix,
in every operator, orientation, batch, backend and device), products against the materialised
matrix, the statistics of connections and weights, AD, vmap, the matrix classes and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import xlakern
from conftest import x64
from test_event_transforms import HAVE_NVCC
from xlakern.event import EventDTypeError, EventShapeError
from xlakern.event._eager import compiled_programs

KINDS = {"s": (0.37,), "u": (-0.2, 0.7), "n": (0.1, 0.3)}


def dense(letter, prob, seed, shape, **kw):
    return getattr(xlakern, "jit" + letter)(*KINDS[letter], prob, seed, shape=shape, **kw)


def product(letter, binary, mm, prob, v, seed, shape, **kw):
    name = ("binary_" if binary else "") + "jit" + letter + ("mm" if mm else "mv")
    return getattr(xlakern, name)(*KINDS[letter], prob, v, seed, shape=shape, **kw)


def operand(rng, n, mm, binary, batch=5, dtype=np.float32):
    size = (n, batch) if mm else (n,)
    if binary:
        return rng.random(size) < 0.3
    return rng.standard_normal(size).astype(dtype)


@pytest.mark.parametrize("prob,shape", [(0.999, (300, 400)), (0.6, (700, 900)), (0.03, (400, 3000)),
                                        (2e-4, (12, 400_000))])
def test_cpu_skips_match_jnp_at_every_prob(prob, shape, rng):
    """The C++ walk estimates each skip from its own logarithm and corrects it on the table; jnp searches
    the table. From skips of ~1 (a tiny table) to ~5,000 (a table of ~110k entries), with 10^5 or more
    draws each, they give the same matrix."""
    seed = int(rng.integers(0, 2**31))
    m_cpp = np.asarray(dense("u", prob, seed, shape))
    m_jnp = np.asarray(dense("u", prob, seed, shape, backend="jnp"))
    np.testing.assert_array_equal(m_cpp, m_jnp)
    assert abs((m_cpp != 0).mean() / prob - 1) < 0.1


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("corder", [True, False])
def test_materialisation_is_bit_identical_in_cpp_and_jnp(letter, corder, rng):
    seed = int(rng.integers(0, 2**31))
    shape = (int(rng.integers(50, 200)), int(rng.integers(50, 200)))
    for transpose in (False, True):
        m_cpp = np.asarray(dense(letter, 0.15, seed, shape, corder=corder, transpose=transpose))
        m_jnp = np.asarray(dense(letter, 0.15, seed, shape, corder=corder, transpose=transpose, backend="jnp"))
        assert m_cpp.shape == (shape[::-1] if transpose else shape)
        np.testing.assert_array_equal(m_cpp, m_jnp)
        assert 0.05 < (m_cpp != 0).mean() < 0.3
    with x64():
        m64 = np.asarray(getattr(xlakern, "jit" + letter)(*(np.float64(a) for a in KINDS[letter]), 0.15, seed,
                                                        shape=shape, corder=corder))
        m64_jnp = np.asarray(getattr(xlakern, "jit" + letter)(*(np.float64(a) for a in KINDS[letter]), 0.15, seed,
                                                            shape=shape, corder=corder, backend="jnp"))
        assert m64.dtype == np.float64
        np.testing.assert_array_equal(m64, m64_jnp)
        # float64 weights draw the same connections as float32 ones
        np.testing.assert_array_equal(m64 != 0, np.asarray(dense(letter, 0.15, seed, shape, corder=corder)) != 0)


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("mm", [False, True])
def test_products_multiply_by_the_materialised_matrix(letter, binary, mm, rng):
    seed = int(rng.integers(0, 2**31))
    shape = (int(rng.integers(30, 120)), int(rng.integers(30, 120)))
    with x64():
        args = tuple(np.float64(a) for a in KINDS[letter])
        for corder in (True, False):
            for transpose in (False, True):
                m = np.asarray(getattr(xlakern, "jit" + letter)(*args, 0.2, seed, shape=shape, corder=corder))
                n_in = shape[0] if transpose else shape[1]
                v = operand(rng, n_in, mm, binary, dtype=np.float64)
                name = ("binary_" if binary else "") + "jit" + letter + ("mm" if mm else "mv")
                fn = getattr(xlakern, name)
                y = np.asarray(fn(*args, 0.2, v, seed, shape=shape, corder=corder, transpose=transpose))
                want = (m.T if transpose else m) @ v.astype(np.float64)
                np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
                y_jnp = np.asarray(fn(*args, 0.2, v, seed, shape=shape, corder=corder, transpose=transpose,
                                      backend="jnp"))
                np.testing.assert_allclose(y_jnp, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("transpose", [False, True])
def test_mm_columns_equal_mv_exactly(letter, transpose, rng):
    # Bit-exact is the CPU kernels' promise (GPU scatters add with atomics in any order and GPU
    # gathers split a row between lanes; the GPU tests compare with a tolerance), so this runs on
    # the CPU whatever the default device is.
    with jax.default_device(jax.devices("cpu")[0]):
        _mm_columns_equal_mv_exactly(letter, transpose, rng)


def _mm_columns_equal_mv_exactly(letter, transpose, rng):
    seed = int(rng.integers(0, 2**31))
    shape = (157, 91)
    for binary in (True, False):
        B = operand(rng, shape[0] if transpose else shape[1], True, binary, batch=13)
        Y = np.asarray(product(letter, binary, True, 0.1, B, seed, shape, transpose=transpose))
        for j in range(B.shape[1]):
            y = np.asarray(product(letter, binary, False, 0.1, B[:, j], seed, shape, transpose=transpose))
            np.testing.assert_array_equal(Y[:, j], y)


@pytest.mark.parametrize("letter", "sun")
def test_both_orientations_use_one_matrix(letter, rng):
    seed = int(rng.integers(0, 2**31))
    shape = (140, 77)
    for corder in (True, False):
        m = np.asarray(dense(letter, 0.2, seed, shape, corder=corder), np.float64)
        np.testing.assert_array_equal(np.asarray(dense(letter, 0.2, seed, shape, corder=corder, transpose=True)), m.T)
        # an indicator vector picks one row (gather) / one column (scatter) out of the same matrix
        i, j = int(rng.integers(0, shape[0])), int(rng.integers(0, shape[1]))
        e_col = np.zeros(shape[1], bool)
        e_col[j] = True
        e_row = np.zeros(shape[0], bool)
        e_row[i] = True
        np.testing.assert_array_equal(np.asarray(product(letter, True, False, 0.2, e_col, seed, shape,
                                                         corder=corder)), m[:, j])
        np.testing.assert_array_equal(np.asarray(product(letter, True, False, 0.2, e_row, seed, shape,
                                                         corder=corder, transpose=True)), m[i])
    # the two corders are different matrices
    assert (np.asarray(dense(letter, 0.2, seed, shape, corder=True)) !=
            np.asarray(dense(letter, 0.2, seed, shape, corder=False))).any()


def test_seed_changes_the_matrix_and_is_traceable(rng):
    seed = int(rng.integers(0, 2**31))
    a = np.asarray(xlakern.jits(1.0, 0.1, seed, shape=(64, 64)))
    b = np.asarray(xlakern.jits(1.0, 0.1, seed + 1, shape=(64, 64)))
    assert (a != b).any()
    v = rng.random(64) < 0.5
    f = jax.jit(lambda s, v: xlakern.binary_jitsmv(1.0, 0.1, v, s, shape=(64, 64)))
    np.testing.assert_allclose(np.asarray(f(jnp.int32(seed), v)), a @ v.astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f(jnp.int32(seed + 1), v)), b @ v.astype(np.float32), rtol=1e-6)


def test_connection_probability_and_uniform_columns(rng):
    seed = int(rng.integers(0, 2**31))
    p = float(rng.uniform(0.05, 0.3))
    m = np.asarray(xlakern.jits(1.0, p, seed, shape=(1000, 1000))) != 0  # 10^6 draws
    n = m.size
    count = m.sum()
    z = (count - n * p) / np.sqrt(n * p * (1 - p))
    assert abs(z) < 5, (count, n * p)
    # every column as likely as any other: chi-square over column totals (and over row totals)
    for totals in (m.sum(axis=0), m.sum(axis=1)):
        chi2 = stats.chisquare(totals).pvalue
        assert chi2 > 1e-4, chi2
    # gaps between consecutive synapses of a row are geometric(p)
    gaps = np.concatenate([np.diff(np.flatnonzero(row)) for row in m[:300]])
    kmax = 30
    observed = np.array([(gaps == k).sum() for k in range(1, kmax)] + [(gaps >= kmax).sum()])
    probs = np.array([(1 - p) ** (k - 1) * p for k in range(1, kmax)] + [(1 - p) ** (kmax - 1)])
    assert stats.chisquare(observed, probs * observed.sum()).pvalue > 1e-4


def test_weight_distributions(rng):
    seed = int(rng.integers(0, 2**31))
    u = np.asarray(xlakern.jitu(-0.5, 1.5, 0.5, seed, shape=(2000, 1000)))
    w = u[u != 0]
    assert w.size > 9e5
    assert w.min() > -0.5 and w.max() <= 1.5
    assert stats.kstest(w, stats.uniform(loc=-0.5, scale=2.0).cdf).pvalue > 1e-4
    nrm = np.asarray(xlakern.jitn(0.3, 2.0, 0.5, seed, shape=(2000, 1000)))
    w = nrm[nrm != 0]
    assert stats.kstest(w, stats.norm(loc=0.3, scale=2.0).cdf).pvalue > 1e-4


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("transpose", [False, True])
def test_grad_wrt_weights_and_vector(letter, transpose, rng):
    seed = int(rng.integers(0, 2**31))
    shape = (60, 45)
    with x64():
        params = tuple(np.float64(a) for a in KINDS[letter])
        m = np.asarray(getattr(xlakern, "jit" + letter)(*params, 0.3, seed, shape=shape))
        mask = (m != 0).astype(np.float64)
        # the random factor of each synapse: weight = a + b * r
        if letter == "s":
            r = np.zeros_like(m)
        elif letter == "u":
            r = np.where(mask > 0, (m - params[0]) / (params[1] - params[0]), 0)
        else:
            r = np.where(mask > 0, (m - params[0]) / params[1], 0)
        v = rng.standard_normal(shape[0] if transpose else shape[1])
        c = rng.standard_normal(shape[1] if transpose else shape[0])

        def ours(ws, v):
            y = getattr(xlakern, "jit" + letter + "mv")(*ws, 0.3, v, seed, shape=shape, transpose=transpose)
            return jnp.sum(y * c)

        def ref(ws, v):
            if letter == "s":
                mat = ws[0] * mask
            elif letter == "u":
                mat = mask * ws[0] + (ws[1] - ws[0]) * r
            else:
                mat = mask * ws[0] + ws[1] * r
            mat = mat.T if transpose else mat
            return jnp.sum((mat @ v) * c)

        ws = tuple(jnp.float64(a) for a in params)
        g_ours = jax.grad(ours, argnums=(0, 1))(ws, jnp.asarray(v))
        g_ref = jax.grad(ref, argnums=(0, 1))(ws, jnp.asarray(v))
        for a, b in zip(g_ours[0], g_ref[0]):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(g_ours[1], g_ref[1], rtol=1e-10, atol=1e-10)
        # forward mode through the binary operator: the spike tangent is the float product
        s = (rng.random(v.shape) < 0.4).astype(np.float64)
        fn = getattr(xlakern, "binary_jit" + letter + "mv")
        _, tangent = jax.jvp(lambda x: fn(*ws, 0.3, x, seed, shape=shape, transpose=transpose), (jnp.asarray(s),),
                             (jnp.asarray(v),))
        np.testing.assert_allclose(tangent, (m.T if transpose else m) @ v, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("letter", "sun")
def test_grad_through_materialisation_and_nan_isolated_weight_cotangents(letter, rng):
    """jit{s,u,n} (and W.todense()) differentiate with respect to the weight parameters: against
    central differences of the same function, exact here because it is linear in them (float64). The
    weight cotangent of a binary product ignores outputs no active spike reached, even where their
    cotangent is NaN, and is exactly zero when no spike is active (BrainEvent 0.3's contract)."""
    seed, shape, prob = int(rng.integers(0, 2**31)), (30, 40), 0.2
    with x64():
        ws = jnp.asarray(KINDS[letter], jnp.float64)
        c = jnp.asarray(rng.standard_normal(shape))

        def f(w):
            return jnp.sum(getattr(xlakern, "jit" + letter)(*w, prob, seed, shape=shape) * c)

        grad = jax.grad(f)(ws)
        for i in range(ws.size):
            e = jnp.zeros_like(ws).at[i].set(1e-3)
            np.testing.assert_allclose(grad[i], (f(ws + e) - f(ws - e)) / 2e-3, rtol=1e-8)
        assert np.all(np.abs(np.asarray(grad)) > 0)
        cls = CLASSES[letter][0]
        via_class = jax.grad(lambda w: jnp.sum(cls((*w, prob, seed), shape=shape, corder=True).todense() * c))(ws)
        via_jit = jax.grad(lambda w: jnp.sum(getattr(xlakern, "jit" + letter)(*w, prob, seed, shape=shape,
                                                                             corder=True) * c))(ws)
        np.testing.assert_allclose(via_class, via_jit, rtol=1e-12)
        m = np.asarray(getattr(xlakern, "jit" + letter)(*ws, prob, seed, shape=shape))
        for spikes in (rng.random(shape[1]) < 0.05, np.zeros(shape[1], bool)):
            def g(w):
                return getattr(xlakern, "binary_jit" + letter + "mv")(*w, prob, jnp.asarray(spikes), seed, shape=shape)

            reached = (m != 0)[:, spikes].any(axis=1)
            ct = jnp.asarray(rng.random(shape[0]))
            bad = jax.vjp(g, ws)[1](jnp.where(reached, ct, jnp.nan))[0]
            good = jax.vjp(g, ws)[1](jnp.where(reached, ct, 0.0))[0]
            assert np.all(np.isfinite(np.asarray(bad)))
            np.testing.assert_allclose(bad, good, rtol=1e-12)
            if not spikes.any():
                np.testing.assert_array_equal(np.asarray(bad), 0)


@pytest.mark.parametrize("letter", "sun")
def test_vmap_over_vectors_is_one_mm_and_over_weights_loops(letter, rng):
    seed = int(rng.integers(0, 2**31))
    shape = (70, 50)
    m = np.asarray(dense(letter, 0.2, seed, shape), np.float64)
    S = rng.random((9, 70)) < 0.3
    f = lambda s: product(letter, True, False, 0.2, s, seed, shape, transpose=True)
    got = np.asarray(jax.vmap(f)(S))
    np.testing.assert_allclose(got, S.astype(np.float64) @ m, rtol=1e-5, atol=1e-5)
    jaxpr = str(jax.make_jaxpr(jax.vmap(f))(S))
    assert "binary_jit" + letter + "mm" in jaxpr and "while" not in jaxpr
    scales = rng.uniform(0.5, 2.0, 4).astype(np.float32)
    fw = lambda k: getattr(xlakern, "jit" + letter + "mv")(*(k * a for a in KINDS[letter]), 0.2,
                                                          jnp.ones(50, jnp.float32), seed, shape=shape)
    got = np.asarray(jax.vmap(fw)(jnp.asarray(scales)))
    np.testing.assert_allclose(got, scales[:, None] * (m @ np.ones(50)), rtol=1e-5, atol=1e-5)


CLASSES = {"s": (xlakern.JITCScalarR, xlakern.JITCScalarC), "u": (xlakern.JITCUniformR, xlakern.JITCUniformC),
           "n": (xlakern.JITCNormalR, xlakern.JITCNormalC)}


@pytest.mark.parametrize("letter", "sun")
@pytest.mark.parametrize("corder", [True, False])
def test_matrix_classes(letter, corder, rng):
    seed = int(rng.integers(0, 2**31))
    R, C = CLASSES[letter]
    W = R(KINDS[letter] + (0.2, seed), shape=(80, 60), corder=corder)
    m = np.asarray(W.todense(), np.float64)
    np.testing.assert_array_equal(m, np.asarray(dense(letter, 0.2, seed, (80, 60), corder=corder)))
    Wt = W.T
    assert isinstance(Wt, C) and Wt.shape == (60, 80)
    np.testing.assert_array_equal(np.asarray(Wt.todense()), m.T)
    np.testing.assert_array_equal(np.asarray(Wt.T.todense()), m)
    s_pre, s_post = rng.random(80) < 0.3, rng.random(60) < 0.3
    x_pre, x_post = rng.standard_normal(80).astype(np.float32), rng.standard_normal(60).astype(np.float32)
    B = rng.random((60, 7)) < 0.3
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xlakern.BinaryArray(s_pre) @ W, s_pre @ m, **tol)
    np.testing.assert_allclose(W @ xlakern.BinaryArray(s_post), m @ s_post, **tol)
    np.testing.assert_allclose(x_pre @ W, x_pre @ m, **tol)
    np.testing.assert_allclose(W @ x_post, m @ x_post, **tol)
    np.testing.assert_allclose(W @ xlakern.BinaryArray(B), m @ B, **tol)
    np.testing.assert_allclose(xlakern.BinaryArray(B.T) @ Wt, B.T @ m.T, **tol)
    np.testing.assert_allclose(Wt @ xlakern.BinaryArray(s_pre), m.T @ s_pre, **tol)
    np.testing.assert_allclose(np.asarray((W * 2.0).todense()), 2 * m, rtol=1e-6, atol=1e-6)
    # a pytree: through jit with a traced seed and weights
    f = jax.jit(lambda W, s: xlakern.BinaryArray(s) @ W)
    np.testing.assert_allclose(f(W, s_pre), s_pre @ m, **tol)
    leaves, tree = jax.tree_util.tree_flatten(W)
    assert len(leaves) == len(KINDS[letter]) + 1
    np.testing.assert_array_equal(np.asarray(jax.tree_util.tree_unflatten(tree, leaves).todense()), m)


def test_brainevent_parameter_names_and_bound_order():
    W = xlakern.JITCUniformC((0.1, 0.5, 0.2, 3), shape=(8, 6))
    assert (W.wlow, W.whigh) == (0.1, 0.5) and W.data == (0.1, 0.5)
    N = xlakern.JITCNormalR((0.2, 0.05, 0.2, 3), shape=(8, 6))
    assert (N.wloc, N.wscale) == (0.2, 0.05)
    assert xlakern.JITCScalarR((0.7, 0.2, 3), shape=(8, 6)).weight == 0.7
    with pytest.raises(ValueError, match="wlow"):
        xlakern.JITCUniformR((1.0, -1.0, 0.1, 3), shape=(8, 6))


def test_deprecated_homo_names():
    with pytest.warns(DeprecationWarning, match="JITCScalarR"):
        cls = xlakern.JITCHomoR
    assert cls is xlakern.JITCScalarR
    with pytest.warns(DeprecationWarning, match="JITCScalarC"):
        assert xlakern.JITCHomoC is xlakern.JITCScalarC


def test_errors_name_the_argument():
    v = np.ones(10, np.float32)
    with pytest.raises(EventShapeError, match="prob"):
        xlakern.jitsmv(1.0, 1.5, v, 0, shape=(5, 10))
    with pytest.raises(EventShapeError, match="vector"):
        xlakern.jitsmv(1.0, 0.1, v, 0, shape=(5, 11))
    with pytest.raises(EventShapeError, match="weight"):
        xlakern.jitsmv(np.ones(3), 0.1, v, 0, shape=(5, 10))
    with pytest.raises(EventDTypeError, match="seed"):
        xlakern.jitsmv(1.0, 0.1, v, 1.5, shape=(5, 10))
    # an array in the seed's place (arguments swapped) is named by its shape, not printed whole
    with pytest.raises(EventDTypeError, match=r"seed must be one integer; got an array of shape \(10,\) and dtype "
                                              r"float32$"):
        xlakern.jitsmv(1.0, 0.1, 0, v, shape=(5, 10))
    with pytest.raises(EventShapeError, match="too small"):
        xlakern.jitsmv(1.0, 1e-9, v, 0, shape=(5, 10))
    with pytest.raises(xlakern.XlakernError):
        xlakern.JITCScalarR((1.0, 0.1), shape=(5, 10))


@pytest.mark.parametrize("letter", "sun")
def test_eager_call_is_one_compiled_program_equal_to_the_jitted_one(letter, rng):
    """Outside jit an operator compiles one XLA program, its kernel's, not one per jnp call of its Python
    side (a first eager JITC product compiled eleven: on a GPU about 0.3 s before the kernel ran). Its
    result is the jitted call's, bit for bit, and a second call of new values compiles nothing."""
    m, n = int(rng.integers(50, 300)), int(rng.integers(50, 300))
    params = {"s": (float(rng.uniform(0.1, 1)),), "u": (-0.5, float(rng.uniform(0.1, 1))),
              "n": (0.3, float(rng.uniform(0.1, 1)))}[letter]
    seed = int(rng.integers(0, 2**31))
    prob = float(rng.uniform(0.05, 0.3))
    spikes = jnp.asarray(rng.random(n) < 0.3)
    x = jnp.asarray(rng.standard_normal((n, 3)).astype(np.float32))
    ops = {"binary_mv": getattr(xlakern, f"binary_jit{letter}mv"), "mm": getattr(xlakern, f"jit{letter}mm"),
           "dense": getattr(xlakern, f"jit{letter}")}
    calls = {"binary_mv": lambda op, *p: op(*p, prob, spikes, seed, shape=(m, n)),
             "mm": lambda op, *p: op(*p, prob, x, seed, shape=(m, n)),
             "dense": lambda op, *p: op(*p, prob, seed, shape=(m, n))}
    for key, op in ops.items():
        with compiled_programs() as programs:
            eager = jax.block_until_ready(calls[key](op, *params))
        assert len(programs) <= 1, (key, programs)  # 0 where an earlier case compiled it
        with compiled_programs() as programs:
            again = calls[key](op, *(p * 0.5 for p in params))
        assert programs == [], (key, programs)
        np.testing.assert_allclose(np.asarray(again), np.asarray(eager) * 0.5, rtol=1e-6, atol=1e-6)
        jitted = jax.jit(lambda *p: calls[key](op, *p))(*params)
        np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))


def test_eager_seed_none_draws_a_new_matrix_each_call():
    """seed=None draws a seed per call in Python, not once inside the cached program."""
    mats = [np.asarray(xlakern.jits(1.0, 0.5, None, shape=(40, 40))) for _ in range(3)]
    assert not np.array_equal(mats[0], mats[1]) and not np.array_equal(mats[1], mats[2])
    for mat in mats:
        assert 0.35 < mat.mean() < 0.65  # a matrix of prob 0.5 each time


def test_eager_errors_carry_no_jit_traceback_note():
    v = np.ones(10, np.float32)
    with pytest.raises(EventShapeError) as info:
        xlakern.binary_jitsmv(1.0, 0.1, v, 0, shape=(5, 11))
    assert "vector" in str(info.value) and not getattr(info.value, "__notes__", None)


def test_edge_probabilities(rng):
    v = rng.standard_normal(30).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(xlakern.jitsmv(1.0, 0.0, v, 3, shape=(20, 30))), np.zeros(20))
    full = np.asarray(xlakern.jits(2.0, 1.0, 3, shape=(20, 30)))
    np.testing.assert_array_equal(full, np.full((20, 30), 2.0, np.float32))
    # Against float64, within float32 summation's bound (n eps times the sum of |terms|): a sum of 30
    # standard normals can cancel to near 0, where a relative tolerance on the sum fails on rounding alone
    # (seen on an H200: 0.0434018 against 0.0434012, 1.1e-5 apart relatively).
    got = np.asarray(xlakern.jitsmv(2.0, 1.0, v, 3, shape=(20, 30)))
    full64, v64 = full.astype(np.float64), v.astype(np.float64)
    bound = 32 * np.finfo(np.float32).eps * (np.abs(full64) @ np.abs(v64))
    np.testing.assert_array_less(np.abs(got - full64 @ v64), bound)


def assert_cuda_compiles(filename: str, functions: set) -> None:
    """The CUDA source compiles for an H100 (sm_90) here, without a GPU, and exports `functions`."""
    if not HAVE_NVCC:
        pytest.skip("nvcc not installed")
    from xlakern.event._kernels import KERNEL_DIR

    mod = xlakern.load_cuda_file(KERNEL_DIR / filename, name=filename.replace(".", "_") + "_check",
                                 compute_capability="9.0")
    assert set(mod.functions) == functions


def test_part2_kernel_sources_ship_in_the_package():
    from pathlib import Path

    from xlakern.event._kernels import KERNEL_DIR

    assert KERNEL_DIR == Path(xlakern.__file__).resolve().parent / "event" / "kernels"
    names = {p.name for p in KERNEL_DIR.iterdir()}
    for stem in ("jitc", "plasticity", "delay"):
        assert {f"{stem}_cpu.cc", f"{stem}_cuda.cu", f"{stem}_common.h"} <= names
    assert {"jitc_cuda.cuh", "jitc_cuda_gather_mv.cuh"} <= names


def test_jitc_cuda_module_names_every_translation_unit():
    """The CUDA JITC module is built from the files it names (kernels/jitc_cuda.cuh): each jitc_cuda*.cu is
    one of them, so a unit added to the folder cannot be left out of the build (whose link would then fail
    on the launcher it defines)."""
    from xlakern.event import _jitc_kernels as JK
    from xlakern.event._kernels import KERNEL_DIR

    on_disk = sorted(p.name for p in KERNEL_DIR.glob("jitc_cuda*.cu"))
    assert sorted(JK.JITC_CUDA_SOURCES) == on_disk
    assert len(on_disk) == len(set(on_disk)) >= 2


def test_jitc_cuda_kernels_compile_and_link():
    """The five units compile for an H100 (sm_90) without a GPU, link into one library whose every symbol
    resolves (the launchers one unit declares and another defines; the header's kernels defined in several
    units), and export the entry points, as the per-combination build and the build of every dtype."""
    if not HAVE_NVCC:
        pytest.skip("nvcc not installed")
    import ctypes
    import os

    from xlakern.event import _jitc_kernels as JK
    from xlakern.event._kernels import KERNEL_DIR, operand_flags

    one = operand_flags("float32", "int32", 1)
    for name, flags in (("jitc_cuda_units_check", one), ("jitc_cuda_units_every_dtype_check", None)):
        mod = xlakern.load_cuda_dir(KERNEL_DIR, file_patterns=list(JK.JITC_CUDA_SOURCES), name=name,
                                    compute_capability="9.0", extra_cuda_cflags=flags)
        assert set(mod.functions) == {"jitc_mv", "jitc_dense", "jitc_skips", "jitc_near_skip_misses"}
        # every symbol bound now (RTLD_NOW), not at a first call on the GPU
        ctypes.CDLL(str(mod.path), mode=os.RTLD_NOW | os.RTLD_LOCAL)


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("letter", "sun")
def test_gpu_draws_the_cpu_matrix(letter):
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    rng = np.random.default_rng()
    seed = int(rng.integers(0, 2**31))
    shape = (3000, 2000)
    for corder in (True, False):
        with jax.default_device(cpu):
            m_cpu = np.asarray(dense(letter, 0.05, seed, shape, corder=corder))
        with jax.default_device(gpu):
            m_gpu = np.asarray(dense(letter, 0.05, seed, shape, corder=corder))
        np.testing.assert_array_equal(m_cpu, m_gpu)
        for binary in (True, False):
            for mm in (False, True):
                for transpose in (False, True):
                    v = operand(rng, shape[0] if transpose else shape[1], mm, binary, batch=19)
                    with jax.default_device(cpu):
                        y_cpu = np.asarray(product(letter, binary, mm, 0.05, v, seed, shape, corder=corder,
                                                   transpose=transpose))
                    with jax.default_device(gpu):
                        y_gpu = np.asarray(product(letter, binary, mm, 0.05, v, seed, shape, corder=corder,
                                                   transpose=transpose))
                    # not bit for bit: scatters add with atomics in any order, gathers split a row
                    # between lanes (kernels/jitc_cuda.cu) and nvcc fuses w * v into the sum
                    np.testing.assert_allclose(y_cpu, y_gpu, rtol=1e-5, atol=1e-4)
                    want = (m_cpu.T if transpose else m_cpu).astype(np.float64) @ v.astype(np.float64)
                    np.testing.assert_allclose(y_gpu, want, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_gpu_jitted_loop_grad_and_vmap():
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng()
    seed = int(rng.integers(0, 2**31))
    n = 20000
    with jax.default_device(gpu):
        W = xlakern.JITCNormalR((0.0, 0.1, 0.01, seed), shape=(n, n))
        spikes = jnp.asarray(rng.random((50, n)) < 0.01)

        @jax.jit
        def run(W, spikes):
            def step(acc, s):
                return acc + xlakern.BinaryArray(s) @ W, None
            return jax.lax.scan(step, jnp.zeros(n, jnp.float32), spikes)[0]

        total = np.asarray(run(W, spikes))
        want = np.asarray(jax.vmap(lambda s: xlakern.BinaryArray(s) @ W)(spikes)).sum(axis=0)
        np.testing.assert_allclose(total, want, rtol=1e-4, atol=1e-4)
        rows = np.flatnonzero(np.asarray(spikes[0]))
        # the rows that spiked, materialised through the gather of indicator vectors
        sub = np.stack([np.asarray(W.T @ jnp.zeros(n, jnp.float32).at[r].set(1.0)) for r in rows[:5]])
        np.testing.assert_allclose(sub.sum(0), np.asarray(
            xlakern.BinaryArray(jnp.zeros(n, bool).at[rows[:5]].set(True)) @ W), rtol=1e-4, atol=1e-4)
        g = jax.grad(lambda w: jnp.sum(xlakern.jitsmv(w, 0.01, jnp.ones(n), seed, shape=(n, n))))(1.0)
        count = float(jnp.sum(xlakern.jitsmv(1.0, 0.01, jnp.ones(n), seed, shape=(n, n))))
        np.testing.assert_allclose(float(g), count, rtol=1e-5)


def test_units_multiply(rng):
    bu = pytest.importorskip("brainunit")
    seed = int(rng.integers(0, 2**31))
    m = np.asarray(xlakern.jitu(0.1, 0.5, 0.2, seed, shape=(40, 30)), np.float64)
    x = rng.standard_normal(30).astype(np.float32)
    y = xlakern.jitumv(0.1 * bu.mS, 0.5 * bu.mS, 0.2, x * bu.mV, seed, shape=(40, 30))
    np.testing.assert_allclose(y.to(bu.mS * bu.mV).mantissa, m @ x, rtol=1e-5, atol=1e-6)
    W = xlakern.JITCScalarR((0.2 * bu.mS, 0.2, seed), shape=(40, 30))
    s = rng.random(40) < 0.5
    np.testing.assert_allclose((xlakern.BinaryArray(s) @ W).to(bu.mS).mantissa,
                               s @ np.asarray(xlakern.jits(0.2, 0.2, seed, shape=(40, 30), corder=False)),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(xlakern.event.EventUnitError):
        xlakern.jitumv(0.1 * bu.mS, 0.5, 0.2, x, seed, shape=(40, 30))


def test_weight_parameters_that_are_not_numbers_are_named(rng):
    """A JITC operator, constructor or with_data given None or a string for a weight parameter: an
    EventDTypeError naming that parameter as the caller wrote it (w_low, w_scale, wscale, ...), not the
    operator's internal name or jax's words; with_data given the wrong count of parameters is an
    EventShapeError. With numbers, the same matrix still multiplies as its materialised form does."""
    import re

    x = rng.standard_normal(30).astype(np.float32)
    shape = (40, 30)
    for call, error, message in [
        (lambda: xlakern.jitumv("0", 1.0, 0.2, x, 3, shape=shape), EventDTypeError, "jitumv: w_low is a str ('0')"),
        (lambda: xlakern.jitnmv(0.0, None, 0.2, x, 3, shape=shape), EventDTypeError, "jitnmv: w_scale is None"),
        (lambda: xlakern.jitn(0.0, None, 0.2, 3, shape=shape), EventDTypeError, "jitn: w_scale is None"),
        (lambda: xlakern.JITCNormalR((0.0, None, 0.2, 3), shape=shape), EventDTypeError, "JITCNormalR: wscale is None"),
        (lambda: xlakern.JITCScalarC((None, 0.2, 3), shape=shape), EventDTypeError, "JITCScalarC: weight is None"),
        (lambda: xlakern.JITCUniformR((0.0, 1.0, 0.2, 3), shape=shape).with_data(0.5), EventShapeError,
         "JITCUniformR.with_data: expected 2 weight parameter(s) (wlow, whigh); got 1"),
        (lambda: xlakern.JITCUniformR((0.0, 1.0, 0.2, 3), shape=shape).with_data(0.5, "1"), EventDTypeError,
         "JITCUniformR.with_data: whigh is a str ('1')"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            call()
    W = xlakern.JITCUniformR((0.0, 1.0, 0.2, 3), shape=shape).with_data(0.5, 2.0)
    dense = np.asarray(W.todense(), np.float64)
    assert dense[dense != 0].min() >= 0.5 and dense.max() <= 2.0
    np.testing.assert_allclose(np.asarray(W @ jnp.asarray(x), np.float64), dense @ x, rtol=1e-5, atol=1e-5)


def test_seeds_are_read_modulo_2_32_and_wider_or_non_integer_seeds_are_refused(rng):
    """The generator reads a seed as a uint32: -7 and 2**32 - 7 give one matrix, a seed in [2**31, 2**32)
    works (jit alone would read it as an int32 and overflow), and one outside [-2**31, 2**32) is an
    EventArgumentError rather than jax's OverflowError or a silent wrap. A string seed, or a Python int too
    wide for a vector, is an xlakern error naming the argument."""
    shape = (50, 40)
    x = rng.standard_normal(40).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(xlakern.jitsmv(0.4, 0.3, x, 2**32 - 7, shape=shape)),
                                  np.asarray(xlakern.jitsmv(0.4, 0.3, x, -7, shape=shape)))
    seed = 2**31 + int(rng.integers(0, 2**31 - 1))
    m = np.asarray(xlakern.jits(0.4, 0.3, seed, shape=shape), np.float64)
    assert 0 < np.count_nonzero(m) < m.size
    np.testing.assert_allclose(np.asarray(xlakern.jitsmv(0.4, 0.3, x, seed, shape=shape)), m @ x, rtol=1e-5,
                               atol=1e-5)
    W = xlakern.JITCScalarR((0.4, 0.3, seed), shape=shape, corder=True)  # jits defaults to corder=True
    np.testing.assert_array_equal(np.asarray(W.tocsr().todense()), m)
    for bad in (2**32, -(2**31) - 1, 2**40):
        with pytest.raises(xlakern.event.EventArgumentError, match="does not fit 32 bits"):
            xlakern.jitsmv(0.4, 0.3, x, bad, shape=shape)
        with pytest.raises(xlakern.event.EventArgumentError, match="does not fit 32 bits"):
            xlakern.JITCScalarR((0.4, 0.3, bad), shape=shape).tocsr()
    with pytest.raises(EventDTypeError, match="seed must be one integer; got str"):
        xlakern.jitsmv(0.4, 0.3, x, "seven", shape=shape)
    with pytest.raises(EventDTypeError, match="vector is the Python int 1099511627776"):
        xlakern.jitsmv(0.4, 0.3, 2**40, 3, shape=shape)
