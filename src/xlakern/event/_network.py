"""A fused simulator for networks of LIF neurons: many steps of neuron update + spike delivery per call.

The operator path (``BinaryArray(spikes) @ conn`` inside a ``lax.scan``) costs a few kernel
launches per simulated step, which at thousands of neurons is nearly all of a step's time. For the
model most spiking-network benchmarks use (Brette et al. 2007: leaky integrate-and-fire neurons,
exponential excitatory/inhibitory synapses, conductance- or current-based, fixed out-degree),
:func:`run_lif_network` runs the whole loop in one kernel: on the GPU in one block for small
networks and over the whole GPU (one cooperative launch, one or two grid barriers a step) for
larger ones; on the CPU in C++ over XLA's thread pool. A jnp backend of the same arithmetic is
registered too.

It advances exactly the step of ``examples/brette2007.py``::

    ge = ge * exp(-dt/tau_e) + (weights delivered by last step's excitatory spikes)
    gi = gi * exp(-dt/tau_i) + (... inhibitory spikes)
    current = syn_scale * (ge (E_exc - v) + gi (E_inh - v)) + drive      # synapse="coba"
            = ge + gi + drive                                           # synapse="cuba"
    v' = v + dt (v_rest - v + current) / tau_m                          # integrator="euler"
       = target + (v - target) exp(-dt/tau_m), target = v_rest + current  # "exp_euler"
    v' = v_reset while refractory; fire when v' >= v_th, then v = v_reset for t_ref

Example::

    import jax, jax.numpy as jnp, xlakern as brainevent
    from xlakern.event import LIFParams, LIFState, run_lif_network
    n, n_exc, k = 4000, 3200, 80
    ke, ki = jax.random.split(jax.random.PRNGKey(0))
    conn_e = brainevent.FixedNumPerPre(jnp.full((1,), 0.6), jax.random.randint(ke, (n_exc, k), 0, n), shape=(n_exc, n))
    conn_i = brainevent.FixedNumPerPre(jnp.full((1,), 6.7), jax.random.randint(ki, (n - n_exc, k), 0, n),
                                       shape=(n - n_exc, n))
    state = LIFState.initial(jax.random.uniform(jax.random.PRNGKey(1), (n,), minval=-60.0, maxval=-50.0))
    state, counts = run_lif_network(state, conn_e, conn_i, LIFParams(), steps=10_000)  # 1 s simulated
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import XLACustomKernel, config, load_cpp_file, load_cuda_file
from ._kernels import known_module
from . import _units
from ._arguments import as_array
from ._errors import EventDTypeError, EventShapeError, EventUnitError, UnsupportedOperationError
from ._layouts import FixedNumPerPre

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
SDS = jax.ShapeDtypeStruct

_GPU_MODES = {"auto": 0, "block": 1, "grid": 2, "stream": 3}
BLOCK_MODE_MAX_NEURONS = 4096  # lif_cuda.cu's kBlockMaxNeurons: 1,024 threads x 4 neurons in registers


@functools.lru_cache(maxsize=None)
def _cpu_module():
    return load_cpp_file(KERNEL_DIR / "lif_cpu.cc", name="xlakern_lif_cpu")


@functools.lru_cache(maxsize=None)
def _cuda_module():
    # One call is a whole simulation: a CUDA graph around it would gain nothing, and its grid
    # mode is a cooperative launch, which stream capture need not accept.
    return load_cuda_file(KERNEL_DIR / "lif_cuda.cu", name="xlakern_lif_cuda", allow_cuda_graph=False)


known_module("xlakern_lif_cpu", "cpu", _cpu_module)
known_module("xlakern_lif_cuda", "gpu", _cuda_module)


@dataclasses.dataclass(frozen=True)
class LIFParams:
    """Parameters of :func:`run_lif_network`'s neurons and synapses (plain numbers: mV, ms).

    ``synapse``: ``"coba"`` (conductances ge, gi in units of the leak conductance, scaled by
    ``syn_scale``) or ``"cuba"`` (ge, gi are currents in mV). ``integrator``: ``"euler"`` or
    ``"exp_euler"``. Defaults: Brette et al. (2007) benchmark 1 (COBA).

    Example::

        cuba = LIFParams(synapse="cuba", v_rest=-49.0)
    """

    tau_m: float = 20.0
    tau_e: float = 5.0
    tau_i: float = 10.0
    v_th: float = -50.0
    v_reset: float = -60.0
    v_rest: float = -60.0
    t_ref: float = 5.0
    e_exc: float = 0.0
    e_inh: float = -80.0
    drive: float = 0.0
    syn_scale: float = 1.0
    synapse: str = "coba"
    integrator: str = "euler"
    dt: float = 0.1

    def __post_init__(self):
        if self.synapse not in ("coba", "cuba"):
            raise EventShapeError(f"LIFParams: synapse={self.synapse!r}; expected 'coba' or 'cuba'")
        if self.integrator not in ("euler", "exp_euler"):
            raise EventShapeError(f"LIFParams: integrator={self.integrator!r}; expected 'euler' or 'exp_euler'")
        for f in dataclasses.fields(self):  # numbers the kernels read from a host vector (see vector())
            value = getattr(self, f.name)
            if f.type in (float, "float"):
                try:
                    if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
                        raise TypeError
                    float(value)
                except (TypeError, ValueError):
                    raise EventDTypeError(f"LIFParams: {f.name}={value!r:.40}; expected a concrete number (the "
                                          f"parameters are read on the host, not under jit)") from None
        for f in ("tau_m", "tau_e", "tau_i", "dt"):
            if not float(getattr(self, f)) > 0:
                raise EventShapeError(f"LIFParams: {f}={getattr(self, f)!r}; it must be > 0")

    def vector(self) -> np.ndarray:
        """The float32 vector the kernels read (order: lif_common.h's ``Param``)."""
        f32 = np.float32
        return np.array([
            np.exp(-self.dt / self.tau_e), np.exp(-self.dt / self.tau_i), np.exp(-self.dt / self.tau_m),
            self.dt, self.tau_m, self.v_rest, self.v_th, self.v_reset, self.t_ref, self.e_exc, self.e_inh,
            self.drive, self.syn_scale,
        ], dtype=np.float64).astype(f32)


class LIFState(NamedTuple):
    """Per-neuron state: membrane potential ``v`` (mV), synaptic ``ge``/``gi``, remaining
    refractory time ``ref`` (ms), and last step's spikes ``spk`` (delivered at the next step).

    Example::

        state = LIFState.initial(v0)                   # ge = gi = ref = 0, no spikes
    """

    v: Any
    ge: Any
    gi: Any
    ref: Any
    spk: Any

    @classmethod
    def initial(cls, v, ge=None, gi=None) -> "LIFState":
        v = jnp.asarray(v, jnp.float32)
        zeros = jnp.zeros(v.shape, jnp.float32)
        return cls(v, zeros if ge is None else jnp.asarray(ge, jnp.float32),
                   zeros if gi is None else jnp.asarray(gi, jnp.float32), zeros, jnp.zeros(v.shape, bool))


# ----------------------------------------------------------------------------- jnp reference

def _deliver(spk, idx, w, n):
    """Sum of the weights each neuron receives from the active rows (out-of-range targets dropped)."""
    if idx.size == 0:
        return jnp.zeros((n,), jnp.float32)
    flat = idx.reshape(-1)
    target = jnp.where((flat >= 0) & (flat < n), flat, n)
    wfull = jnp.broadcast_to(w.reshape(()) if w.size == 1 else w.reshape(idx.shape), idx.shape)
    contrib = jnp.where(spk[:, None], wfull, jnp.float32(0)).reshape(-1)
    return jnp.zeros((n,), jnp.float32).at[target].add(contrib, mode="drop")


def membrane(v, ref, ge, gi, params, *, conductance, exp_euler):
    """jnp form of lif_common.h's lif_membrane: (v, ref, fired) after one step, given this step's ge, gi."""
    # the vector's order is LIFParams.vector()'s (lif_common.h's Param); unpacking checks its length
    de, di, dm, dt, tau_m, v_rest, v_th, v_reset, t_ref, e_exc, e_inh, drive, syn_scale = (
        params[k] for k in range(params.shape[0]))
    if conductance:
        current = syn_scale * (ge * (e_exc - v) + gi * (e_inh - v)) + drive
    else:
        current = ge + gi + drive
    if exp_euler:
        target = v_rest + current
        v_new = target + (v - target) * dm
    else:
        v_new = v + dt * (v_rest - v + current) / tau_m
    v_new = jnp.where(ref > 0, v_reset, v_new)
    fired = v_new >= v_th
    left = ref - dt
    return jnp.where(fired, v_reset, v_new), jnp.where(fired, t_ref, jnp.where(left > 0, left, jnp.float32(0))), fired


def reference_run(v, ge, gi, ref, spk, idx_e, w_e, idx_i, w_i, params, *, n_exc, steps, conductance, exp_euler):
    """jnp form of the kernels: the same step, in the same float32 arithmetic, under a scan."""
    n = v.shape[0]
    de, di = params[0], params[1]

    def step(carry, _):
        v, ge, gi, ref, spk, count = carry
        ge = ge * de + _deliver(spk[:n_exc], idx_e, w_e, n)
        gi = gi * di + _deliver(spk[n_exc:], idx_i, w_i, n)
        v, ref, fired = membrane(v, ref, ge, gi, params, conductance=conductance, exp_euler=exp_euler)
        return (v, ge, gi, ref, fired, count + fired.astype(jnp.int32)), None

    init = (v, ge, gi, ref, spk, jnp.zeros((n,), jnp.int32))
    return jax.lax.scan(step, init, None, length=steps)[0]


# ----------------------------------------------------------------------------- primitive

def lif_workspace_words(n: int, fixed: bool) -> int:
    """Float32 words of lif_cuda.cu's workspace (its ``workspace_words``): with float sums, the grid mode's
    input buffers or the stream mode's spike list; with fixed-point sums, a header, int64 sums and float
    side sums, and the list."""
    stride = (n + 3) // 4 * 4  # padded for vector access
    return 8 + 12 * stride if fixed else 4 * stride


def refuse_gradients(op: XLACustomKernel, n_inputs: int, fn: str) -> None:
    """Give ``op`` a forward rule for each input that raises a user's error (jax.grad, jvp, jacfwd...) in place
    of the generic "no JVP rule" one, which speaks to op authors. Inputs with zero tangents (ints, bools,
    values under stop_gradient) never reach it."""
    def refuse(*_, **__):
        raise UnsupportedOperationError(
            f"{fn} is not differentiable: its kernel thresholds spikes and has no gradient. To train a network, "
            f"step it with the event operators (BinaryArray(spikes) @ conn inside lax.scan) and a surrogate spike "
            f"function; to use this simulator's output as data, wrap its inputs in jax.lax.stop_gradient")
    op.def_jvp_rule2(*[refuse] * n_inputs)


def _register() -> XLACustomKernel:
    op = XLACustomKernel("lif_network_run")
    op.def_tags("event", "network")
    state_aliases = {i: i for i in range(5)}  # the state is updated in its own buffers

    def cpu(outs, **static):
        static = {k: v for k, v in static.items() if k != "mode"}  # the CPU kernel has one mode

        def run(*args):
            return _cpu_module().lif_run(*args, outs=list(outs), input_output_aliases=state_aliases, **static)
        return run

    def gpu(outs, **static):
        def run(*args):
            # Under config.set_deterministic the kernel sums its input in fixed point where a population's
            # weights differ (equal weights give the same bits in any order). Read here, at each lowering:
            # XLACustomKernel keeps this generator across switches.
            fixed = config.get_deterministic() and not (args[6].size == 1 and args[8].size == 1)
            scratch = SDS((lif_workspace_words(args[0].shape[0], fixed),), jnp.float32)
            res = _cuda_module().lif_run(*args, outs=list(outs) + [scratch], input_output_aliases=state_aliases,
                                         deterministic=fixed, **static)
            return tuple(res[:6])  # the last output is the kernel's scratch (synaptic input buffers)
        return run

    def reference(outs, **static):
        static = {k: v for k, v in static.items() if k != "mode"}
        return lambda *args: reference_run(*args, **static)

    op.def_cpp_kernel(cpu)
    op.def_cuda_kernel(gpu)
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform, reference)
    # v, ge, gi, ref, spk, idx_e, w_e, idx_i, w_i, params
    refuse_gradients(op, 10, "run_lif_network")
    return op


lif_network_run_p = _register()


def _population(name: str, conn, n: int):
    """(int32 indices (rows, k), float32 weights (1,) or (rows, k)) of one population's connectivity."""
    if not isinstance(conn, FixedNumPerPre):
        raise EventShapeError(f"run_lif_network: {name} must be a FixedNumPerPre (rows = presynaptic neurons), "
                              f"got {type(conn).__name__}")
    rows, cols = conn.shape
    if cols != n:
        raise EventShapeError(f"run_lif_network: {name} has shape {conn.shape}; its columns must be the network's "
                              f"{n} neurons")
    data, unit = _units.split(conn.data)
    if unit is not None:
        raise EventUnitError(f"run_lif_network: {name}'s weights carry the unit {unit}; pass plain numbers in the "
                             f"units LIFParams documents (e.g. conn.with_data(w.mantissa))")
    data = jnp.asarray(data)
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise EventDTypeError(f"run_lif_network: {name}'s weights have dtype {data.dtype}; expected a float dtype")
    idx = jnp.asarray(conn.indices)
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise EventDTypeError(f"run_lif_network: {name}'s indices have dtype {idx.dtype}; expected int32 or int64")
    # FixedNumPerPre guarantees (rows, k) indices
    if data.size not in (1, idx.size):
        raise EventShapeError(f"run_lif_network: {name}'s data has shape {tuple(data.shape)}; expected one shared "
                              f"weight (1,) or one per synapse {tuple(idx.shape)}")
    return idx.astype(jnp.int32), data.astype(jnp.float32).reshape((1,) if data.size == 1 else idx.shape)


def _checked_call(state, params, steps, fn: str):
    """(kind of ``state``, its five (n,) arrays as float32/bool) after the checks both simulators share."""
    if isinstance(state, Mapping):
        kind, fields = dict, [state[k] for k in LIFState._fields]
    elif isinstance(state, LIFState):
        kind, fields = LIFState, list(state)
    else:
        raise EventShapeError(f"{fn}: state is a {type(state).__name__}; expected an LIFState or a mapping with keys "
                              f"{LIFState._fields}")
    if not isinstance(params, LIFParams):
        raise EventShapeError(f"{fn}: params is a {type(params).__name__}; expected an LIFParams")
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise EventShapeError(f"{fn}: steps={steps!r}; expected a non-negative int")
    arrays = []
    for name, x in zip(LIFState._fields, fields):
        x, unit = _units.split(x)
        if unit is not None:
            raise EventUnitError(f"{fn}: state.{name} carries the unit {unit}; pass plain numbers (mV, ms) as "
                                 f"LIFParams documents")
        arrays.append(as_array(fn, f"state.{name}", x, quantity=False).astype(bool if name == "spk" else jnp.float32))
    n = arrays[0].shape[0] if arrays[0].ndim == 1 else None
    for name, x in zip(LIFState._fields, arrays):
        if x.ndim != 1 or x.shape[0] != n:
            raise EventShapeError(f"{fn}: state.{name} has shape {tuple(x.shape)}; expected (n,) like state.v "
                                  f"(one value per neuron)")
    return kind, arrays


def run_lif_network(state, conn_exc, conn_inh, params: LIFParams, steps: int, *, backend: str | None = None,
                    gpu_mode: str = "auto"):
    """Advance a network of LIF neurons ``steps`` steps in one call; returns ``(state, spike counts)``.

    Args:
        state: a :class:`LIFState` (or a mapping with keys ``v, ge, gi, ref, spk``) of ``n`` neurons;
            neurons ``[0, n_exc)`` are excitatory and ``[n_exc, n)`` inhibitory.
        conn_exc: ``FixedNumPerPre`` of shape ``(n_exc, n)``: each excitatory neuron's targets and
            weights (one shared or one per synapse). Out-of-range targets are dropped.
        conn_inh: ``FixedNumPerPre`` of shape ``(n - n_exc, n)``.
        params: :class:`LIFParams` (static: a new value compiles a new program).
        steps: number of steps (static).
        backend: ``"cpp"``/``"cuda"`` (the compiled kernels, default) or ``"jnp"``.
        gpu_mode: how the GPU kernel runs the loop: ``"block"`` (one thread block, the state in
            registers; up to 4,096 neurons, or 3,616 with fixed-point sums on a GPU with 99 KB of
            shared memory a block, sm_86/sm_89), ``"grid"`` (every SM, one grid barrier a step: mid-size
            networks), ``"stream"`` (every SM, two grid barriers a step and no input buffers: large
            networks, where the state traffic is the cost) or ``"auto"`` (picks by size).

    Returns the state after ``steps`` steps, of the same kind as ``state``, and each neuron's
    number of spikes over them (int32). Weights accumulate in float32 (in the GPU's one-block mode, with
    one shared weight a population, as a count of arrivals times the weight). On the GPU, weights per
    synapse arrive through float atomics, whose order varies from run to run; under
    :func:`xlakern.config.set_deterministic` they sum in 64-bit fixed point instead, rounded once to
    float32, and every run gives the same bits. Spikes of the last step are
    in ``state.spk`` and are delivered at the start of the next call, so ``k`` calls of ``m`` steps
    equal one of ``k * m``. Not differentiable: ``jax.grad`` raises ``UnsupportedOperationError``
    (train with the event operators and a surrogate spike function). Under ``vmap`` the networks of a
    batch run one after another, each exactly as alone (a parameter sweep works; one larger network
    fills a GPU better). Example in the module docstring.

    Speed (one H100, 80 synapses a neuron, 50 Hz, ``gpu_mode="auto"``): 1.8 / 3.6 / 7.8 / 95 µs a
    step at 4k / 40k / 400k / 4M neurons, 6.05x / 3.47x / 3.17x / 1.22x faster than BrainEvent 0.3.0
    running the same model (``bench/RESULTS.md``, "Whole networks").
    """
    kind, arrays = _checked_call(state, params, steps, "run_lif_network")
    if gpu_mode not in _GPU_MODES:
        raise EventShapeError(f"run_lif_network: gpu_mode={gpu_mode!r}; expected one of {sorted(_GPU_MODES)}")
    n = arrays[0].shape[0]
    if gpu_mode == "block" and n > BLOCK_MODE_MAX_NEURONS:
        raise EventShapeError(f"run_lif_network: gpu_mode='block' runs up to {BLOCK_MODE_MAX_NEURONS} neurons in one "
                              f"thread block; this network has {n}: use 'grid', 'stream' or 'auto'")
    idx_e, w_e = _population("conn_exc", conn_exc, n)
    idx_i, w_i = _population("conn_inh", conn_inh, n)
    n_exc = idx_e.shape[0]
    if n_exc + idx_i.shape[0] != n:
        raise EventShapeError(f"run_lif_network: conn_exc has {n_exc} rows and conn_inh {idx_i.shape[0]}; together "
                              f"they must be the network's {n} neurons")
    f32 = SDS((n,), jnp.float32)
    outs = [f32, f32, f32, f32, SDS((n,), jnp.bool_), SDS((n,), jnp.int32)]
    res = lif_network_run_p(*arrays, idx_e, w_e, idx_i, w_i, jnp.asarray(params.vector()), outs=outs,
                            backend=backend, n_exc=int(n_exc), steps=int(steps),
                            conductance=params.synapse == "coba", exp_euler=params.integrator == "exp_euler",
                            mode=_GPU_MODES[gpu_mode])
    new = res[:5]
    out_state = dict(zip(LIFState._fields, new)) if kind is dict else LIFState(*new)
    return out_state, res[5]
