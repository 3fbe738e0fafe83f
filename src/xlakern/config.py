"""Process-wide settings: which backend :class:`xlakern.XLACustomKernel` ops use per platform.

Example::

    import xlakern
    xlakern.config.set_backend("cpu", "cpp")     # every op that has a 'cpp' CPU kernel uses it
    xlakern.config.get_backend("cpu")            # 'cpp'
    xlakern.config.set_backend("cpu", None)      # back to each op's own default

The choice is part of jax's jit cache key, so a switch takes effect in functions that were
already jitted (they are traced again on their next call) without clearing jax's caches;
switching back finds the earlier compilation still cached.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import jax

from . import _compat
# PlatformError lives in errors.py; importable from here too, where it was first defined.
from .errors import ConfigError, PlatformError, XlakernError

__all__ = ["set_backend", "get_backend", "clear_backends", "backends", "PLATFORMS",
           "enable_cuda_graph_loops", "cuda_graph_loop_flags", "set_numba_parallel", "get_numba_parallel",
           "get_numba_num_threads", "set_lfsr_algorithm", "get_lfsr_algorithm", "prefer_system_nvcc",
           "set_compute_capability", "get_compute_capability", "set_deterministic", "get_deterministic"]

# Platforms an op can have kernels for. 'gpu' covers CUDA (and ROCm, should jax report it).
PLATFORMS = ("cpu", "gpu", "tpu")
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}

_lock = threading.Lock()
_backends: dict[str, str] = {}
# Bumped whenever any op's default backend changes (XLACustomKernel.set_default), so that
# change, too, reaches already-jitted code.
_generation = 0
# set_deterministic's choice; None: what XLA_FLAGS asks of XLA's own GPU ops (get_deterministic)
_deterministic: Optional[bool] = None

# How the selection reaches jax's caches: a jax config state keyed into jit's cache and the
# trace context, as jax's own options that change what a traced function lowers to (e.g.
# jax_enable_x64) are. If jax ever lacks it (see _compat.jit_keyed_state) we fall back to
# jax.clear_caches() on each switch, which is correct but throws away every compilation.
_STATE_NAME = "xlakern_backend_selection"
_state = _compat.jit_keyed_state(
    _STATE_NAME, help="xlakern: process-wide backend choice per platform (set with xlakern.config.set_backend).")


def canonical_platform(platform: str) -> str:
    """'cpu', 'gpu' or 'tpu' for ``platform`` (accepts 'cuda'/'rocm' for 'gpu')."""
    if not isinstance(platform, str):
        raise PlatformError(f"platform must be a string ('cpu', 'gpu' or 'tpu'); got {platform!r}")
    p = _ALIASES.get(platform.lower(), platform.lower())
    if p not in PLATFORMS:
        raise PlatformError(f"unknown platform {platform!r}; use one of {', '.join(PLATFORMS)} "
                            f"('cuda' is accepted for 'gpu')")
    return p


def _publish() -> None:
    """Push the current selection into jax's cache key (caller holds _lock)."""
    token = (tuple(sorted(_backends.items())), _generation, _deterministic)
    if _state is not None:
        _state._set(token)
    else:  # pragma: no cover
        jax.clear_caches()


# the state holds a token from the start, so that a setting switched back finds the first compilation again
with _lock:
    _publish()


def selection_token():
    """The hashable value that identifies the current process-wide selection."""
    with _lock:
        return (tuple(sorted(_backends.items())), _generation, _deterministic)


def _bump_generation() -> None:
    global _generation
    with _lock:
        _generation += 1
        _publish()


def set_backend(platform: str, backend: Optional[str]) -> None:
    """Make ``backend`` the choice on ``platform`` for every op that registered it.

    Precedence, per call: ``op(..., backend=...)``, then this setting, then the op's
    default (:meth:`XLACustomKernel.set_default`), then the op's first registered kernel.
    An op without a kernel of this backend for the platform keeps its own default.
    ``backend=None`` removes the setting.

    Example::

        xlakern.config.set_backend("gpu", "warp")
        y = jitted_fn(x)          # re-traced: now lowers the Warp kernels
        xlakern.config.set_backend("gpu", None)
    """
    p = canonical_platform(platform)
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise XlakernError(f"set_backend: backend must be a backend name such as 'numba' or None; got {backend!r}")
    with _lock:
        if backend is None:
            if p not in _backends:
                return
            del _backends[p]
        else:
            if _backends.get(p) == backend:
                return
            _backends[p] = backend
        _publish()


def get_backend(platform: str) -> Optional[str]:
    """The process-wide backend for ``platform``, or None.

    Example::

        >>> xlakern.config.get_backend("cpu") is None
        True
    """
    p = canonical_platform(platform)
    with _lock:
        return _backends.get(p)


def clear_backends() -> None:
    """Remove every process-wide backend choice.

    Example::

        xlakern.config.clear_backends()
    """
    with _lock:
        if not _backends:
            return
        _backends.clear()
        _publish()


def backends() -> dict[str, str]:
    """A copy of the process-wide choices, platform -> backend.

    Example::

        >>> xlakern.config.backends()
        {'gpu': 'warp'}
    """
    with _lock:
        return dict(_backends)


# ---------------------------------------------------------------------------------------------
# Reproducible sums
# ---------------------------------------------------------------------------------------------

# XLA's own switches for reproducible GPU ops; either, set true in XLA_FLAGS, turns xlakern's on too.
_XLA_DETERMINISM_FLAGS = ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops")


def _xla_flags_ask_determinism() -> bool:
    for token in os.environ.get("XLA_FLAGS", "").split():
        name, _, value = token.partition("=")
        if name in _XLA_DETERMINISM_FLAGS and value.lower() in ("", "true", "1"):
            return True
    return False


def set_deterministic(enable: Optional[bool] = True) -> None:
    """Make the GPU event products that sum with atomic adds give the same bits on every run.

    On the GPU, a scatter product (``s @ W``, ``W.T @ s``: each active row's synapses added into the
    output) adds with float ``atomicAdd``, in whatever order the GPU runs them, so an output can
    differ in its last bits from run to run; a chaotic network's spike trains then part after a while.
    With this on, the stored-layout scatters (``CSR``, ``CSC``, ``FixedNumPerPre``/``Post``: the
    ``binary_csrmv/mm``, ``csrmv/mm``, ``binary_fcnmv/mm`` and ``fcnmv/mm`` products in their scatter
    orientation, their ``@``, ``binary_csrmv/mm_indexed``, and the gradients that run through them) sum
    in 64-bit fixed point instead, in three passes: the same bits on every run, at about twice the time.
    Each addend is rounded to 2^-62 of (number of addends x largest addend): far below float32's
    rounding, but coarser than float64's (about 2^-40 of the largest addend). Infinities and NaNs give
    what float sums give. The JITC scatters (the ``jit{s,u,n}mv/mm`` products whose generated rows meet
    the spikes, and their ``@``) sum in the same fixed point, scaled from a bound on each addend (the
    weight law's largest weight times the largest spike) instead of a measuring pass; each addend is
    rounded to 2^-62 of (generated rows x that bound). The dense scatter (``binary_densemv/mm``,
    ``s @ W``) splits no rows into slices that add atomically: each column is summed by one thread, or
    its slices in a thread block cluster. :func:`xlakern.event.run_lif_network` sums each step's
    synaptic input in the same fixed point where a population's weights differ (scaled from its largest
    finite weight and its synapse count; equal weights give the same bits in any order already).
    Other GPU products that add atomically stay as they are, and tracing one with this on warns once
    (:class:`xlakern.NotReproducibleWarning`). CPU kernels give the same bits on every run anyway (on one
    machine: a CPU scatter's split follows its thread count).

    ``enable=None`` goes back to the default: on when ``XLA_FLAGS`` sets ``--xla_gpu_deterministic_ops``
    or ``--xla_gpu_exclude_nondeterministic_ops`` (XLA's own switches for its GPU ops), else off. The
    setting is part of jax's jit cache key, like :func:`set_backend`: jitted functions are traced again
    on their next call.

    Example::

        xlakern.config.set_deterministic(True)
        out = jax.jit(lambda s: xlakern.BinaryArray(s) @ conn)(spikes)   # the same bits on every run
    """
    global _deterministic
    if enable is not None and not isinstance(enable, (bool, int)):
        raise ConfigError(f"set_deterministic: enable must be True, False or None; got {enable!r}")
    with _lock:
        _deterministic = None if enable is None else bool(enable)
        _publish()


def get_deterministic() -> bool:
    """Whether the GPU scatters sum reproducibly (:func:`set_deterministic`).

    Example::

        >>> xlakern.config.get_deterministic()
        False
    """
    with _lock:
        chosen = _deterministic
    return _xla_flags_ask_determinism() if chosen is None else chosen


# ---------------------------------------------------------------------------------------------
# Whole jitted loops as CUDA graphs
# ---------------------------------------------------------------------------------------------

# What each flag does (measured on an H100, jax 0.11.2; bench/bench_loops.py, bench/RESULTS.md):
# - WHILE/CONDITIONAL let a loop live inside a command buffer (a CUDA graph);
# - min_graph_size=1 makes XLA build command buffers even for a body of one or two ops (the
#   default, 5, leaves small loop bodies as separate launches, with the host in the loop);
# - unroll_loops turns a loop of known trip count (fori_loop with static bounds, scan) into one
#   graph of its unrolled body: no host round trip per step;
# - CONCURRENT scheduling lets independent nodes of a step (the loop counter, a kernel) overlap
#   instead of chaining every node: about 1 µs less per step.
_GRAPH_LOOP_FLAGS = (
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL",
    "--xla_gpu_graph_min_graph_size=1",
    "--xla_gpu_command_buffer_unroll_loops=true",
    "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT",
)


def cuda_graph_loop_flags() -> str:
    """The ``XLA_FLAGS`` that make XLA run whole jitted GPU loops as CUDA graphs.

    Example::

        $ XLA_FLAGS="$(python -c 'import xlakern; print(xlakern.config.cuda_graph_loop_flags())')" python sim.py
    """
    return " ".join(_GRAPH_LOOP_FLAGS)


def enable_cuda_graph_loops() -> None:
    """Run jitted GPU loops (``fori_loop``, ``scan``, ``while_loop``) as CUDA graphs on the device.

    Adds :func:`cuda_graph_loop_flags` to ``XLA_FLAGS``. XLA reads them once, when JAX starts its
    backends, so call this before the first JAX computation (``jax.devices()`` included);
    afterwards it raises :class:`ConfigError`. xlakern's CUDA kernels (``load_cuda_*`` modules
    built with ``allow_cuda_graph=True``, the default, and ``numba_cuda_kernel``) are recorded
    into the graph; ``numba_cuda_callable`` and other host-side calls split it.
    A loop of known trip count is unrolled into one graph (about 2 µs a small step on an H100
    instead of about 8-9 µs); a ``while_loop`` whose end depends on data runs as a graph with a
    device-side condition (about 6.5 µs a step instead of about 20 µs). Loop-carried state updated by a kernel should be aliased
    (``input_output_aliases={i: o}``), or XLA copies the output into the carry every step.
    A loop called again and again (``state = run(state)``) should donate its state
    (``jax.jit(run, donate_argnums=0)``): XLA updates every node of the recorded graph on each call
    whose buffers moved, which doubled a small step's cost on an H100.

    Example::

        import xlakern
        xlakern.config.enable_cuda_graph_loops()   # first thing, before jax runs anything
        import jax
        v = jax.jit(lambda v: jax.lax.fori_loop(0, 10_000, lambda i, v: step(v), v))(v0)
        run = jax.jit(lambda v: jax.lax.fori_loop(0, 1_000, lambda i, v: step(v), v), donate_argnums=0)
        for chunk in range(100):
            v = run(v)                      # donated: the graph is replayed in place
    """
    if _compat.jax_backends_started():
        raise ConfigError(
            "enable_cuda_graph_loops() must be called before JAX starts its backends (before the first "
            "JAX computation or jax.devices()); XLA reads its flags only then. Call it at the top of your "
            "program, or set XLA_FLAGS=\"" + cuda_graph_loop_flags() + "\" in the environment")
    current = os.environ.get("XLA_FLAGS", "")
    names = {f.split("=")[0] for f in _GRAPH_LOOP_FLAGS}
    kept = [f for f in current.split() if f.split("=")[0] not in names]
    os.environ["XLA_FLAGS"] = " ".join(kept + list(_GRAPH_LOOP_FLAGS))



# ----------------------------------------------------------------------------- BrainEvent 0.3's other settings
# brainevent.config has these too; code that calls them at set-up keeps working. Each docstring says what
# the setting does here.

_numba_parallel = False
_numba_num_threads: Optional[int] = None
_LFSR_ALGORITHMS = ("lfsr88", "lfsr113", "lfsr128")
_lfsr_algorithm = "lfsr88"


def set_numba_parallel(parallel: bool = True, num_threads: Optional[int] = None) -> None:
    """BrainEvent's switch for its Numba CPU kernels. xlakern's event kernels are C++ and always spread
    over XLA's CPU thread pool, so ``parallel`` is only recorded (:func:`get_numba_parallel` reads it
    back). ``num_threads``, as in BrainEvent, sets Numba's thread pool, which your own
    ``@numba.njit(parallel=True)`` kernels use (needs numba).

    Example::

        xlakern.config.set_numba_parallel(True, num_threads=4)
        xlakern.config.get_numba_num_threads()   # 4
    """
    global _numba_parallel, _numba_num_threads
    if num_threads is not None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ConfigError(f"set_numba_parallel: num_threads must be a positive int or None; got {num_threads!r}")
        try:
            import numba
        except ImportError:
            raise ConfigError("set_numba_parallel: num_threads sets Numba's thread pool, and numba is not "
                              "installed (pip install numba), or pass num_threads=None") from None
        numba.set_num_threads(num_threads)
    with _lock:
        _numba_parallel, _numba_num_threads = bool(parallel), num_threads


def get_numba_parallel() -> bool:
    """The flag :func:`set_numba_parallel` recorded (False until it is called).

    Example::

        assert xlakern.config.get_numba_parallel() in (True, False)
    """
    return _numba_parallel


def get_numba_num_threads() -> Optional[int]:
    """The Numba thread count :func:`set_numba_parallel` set, or None.

    Example::

        n = xlakern.config.get_numba_num_threads()
    """
    return _numba_num_threads


def set_lfsr_algorithm(algorithm: str) -> None:
    """BrainEvent's choice of random generator for its Pallas JITC kernels (``'lfsr88'``, ``'lfsr113'``,
    ``'lfsr128'``). xlakern's JITC matrices come from one counter-based hash on every platform (the
    same seed gives the same matrix on CPU and GPU), so the choice is checked and recorded only.

    Example::

        xlakern.config.set_lfsr_algorithm("lfsr113")
    """
    global _lfsr_algorithm
    if algorithm not in _LFSR_ALGORITHMS:
        raise ConfigError(f"set_lfsr_algorithm: algorithm must be one of {_LFSR_ALGORITHMS}; got {algorithm!r}")
    with _lock:
        _lfsr_algorithm = algorithm


def get_lfsr_algorithm() -> str:
    """The name :func:`set_lfsr_algorithm` recorded (``'lfsr88'`` by default).

    Example::

        assert xlakern.config.get_lfsr_algorithm() in ("lfsr88", "lfsr113", "lfsr128")
    """
    return _lfsr_algorithm


def prefer_system_nvcc(enable: bool = True) -> None:
    """Where xlakern looks for nvcc first: ``True`` the system's (``$CUDA_HOME``/``$CUDA_PATH``, ``PATH``,
    ``/usr/local/cuda``) before pip's ``nvidia-cuda-nvcc``; ``False`` (the default) pip's before ``PATH``.
    ``$XLAKERN_NVCC`` always wins. Modules built by another nvcc are cached under another key.

    Example::

        xlakern.config.prefer_system_nvcc()        # system nvcc first
        xlakern.config.prefer_system_nvcc(False)   # back to the default order
    """
    from . import _toolchain

    _toolchain.set_nvcc_preference("system" if enable else "pip")


def set_compute_capability(value=None) -> None:
    """Build CUDA modules for this GPU architecture instead of the one JAX's GPU reports (``"9.0"``,
    ``"sm_90"``, ``"90"``, ``(9, 0)``, or a list of one of them; ``None`` detects again). For building
    without a GPU, or for another GPU than this one. ``$XLAKERN_CUDA_ARCH`` and a loader's own
    ``compute_capability=`` take precedence. xlakern builds one architecture per module, so a list of
    several is refused.

    Example::

        xlakern.config.set_compute_capability("9.0")
        xlakern.config.get_compute_capability()    # ['sm_90']
        xlakern.config.set_compute_capability(None)
    """
    from . import _toolchain

    if isinstance(value, (list, tuple)) and not (isinstance(value, tuple) and len(value) == 2
                                                  and all(isinstance(v, int) for v in value)):
        if len(value) != 1:
            raise ConfigError(f"set_compute_capability: xlakern builds one architecture per module; pass one "
                              f"value, not {len(value)} ({list(value)!r})")
        value = value[0]
    _toolchain.set_pinned_arch(value)


def get_compute_capability() -> Optional[list]:
    """The architecture :func:`set_compute_capability` pinned, as ``['sm_90']``, or None (detected).

    Example::

        pinned = xlakern.config.get_compute_capability()
    """
    from . import _toolchain

    arch = _toolchain.pinned_arch()
    return None if arch is None else [f"sm_{arch}"]
