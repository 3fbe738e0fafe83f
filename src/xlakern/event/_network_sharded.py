"""The fused LIF simulator across devices: :func:`run_lif_network_sharded`, for use inside ``shard_map``.

Each device (shard) holds a contiguous range of the network's neurons, their state, and the
synapses that end on them. A step is: XLA's ``all_gather`` hands every shard the whole network's
spikes of the last step, bit-packed (N/8 bytes); one call of the ``lif_shard_step`` primitive
adds the rows of every spike into this shard's conductances and advances its neurons, packing
their spikes for the next gather. On the GPU that call is two plain kernel launches; the only
communication is the collective XLA emits (NCCL), so the same code runs on one device, on every
GPU of a host, or across hosts after ``jax.distributed.initialize()``.

The arithmetic is ``run_lif_network``'s stream mode: between steps the conductances hold
``ge * exp(-dt/tau_e)`` (``gi`` likewise) and deliveries add straight into them. With one shared
weight per population every conductance receives equal addends, so its sum does not depend on
the order the GPU adds them in: the same seed gives the same spike trains on 1, 2 or 4 devices,
and on one device the same as ``run_lif_network(..., gpu_mode="stream")``.

Layout: the network is ``n_global / block`` blocks of ``block`` neurons, the first
``exc_per_block`` of each excitatory (one block: neurons ``[0, n_exc)`` excitatory, as in
``run_lif_network``). ``conn_exc`` has one row per excitatory neuron of the whole network, in
order, and its columns are this shard's neurons (``conn_inh`` likewise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import XLACustomKernel
from ._errors import EventShapeError
from ._events import bitpack
from ._kernels import note_atomic_sums
from ._network import (LIFParams, LIFState, SDS, _checked_call, _cpu_module, _cuda_module, _population, membrane,
                       refuse_gradients)

_STATE_ALIASES = {i: i for i in range(5)}  # v, ge, gi, ref, count: updated in their own buffers


def unpack_spikes(words, n: int):
    """Bool spikes of ``n`` neurons from uint32 words (bit b of word w: neuron 32 w + b)."""
    bits = (words[:, None] >> jnp.arange(32, dtype=jnp.uint32)) & jnp.uint32(1)
    return bits.reshape(-1)[:n].astype(bool)


def reference_shard_step(v, ge, gi, ref, count, spikes, idx_e, w_e, idx_i, w_i, params, *, block, exc_per_block,
                         conductance, exp_euler, decay):
    """jnp form of the kernels' one step: deliver every spike into (decayed) ge, gi, then advance."""
    n = v.shape[0]
    words_local = (n + 31) // 32
    shards = spikes.shape[0] // words_local
    spk = jax.vmap(lambda w: unpack_spikes(w, n))(spikes.reshape(shards, words_local)).reshape(-1, block)

    def add_rows(g, idx, w, rows):
        """g plus the weights of the active rows, added straight into it in row order (as the C++ kernel)."""
        if idx.size == 0:
            return g
        wfull = jnp.broadcast_to(w.reshape(()) if w.size == 1 else w.reshape(idx.shape), idx.shape)
        contrib = jnp.where(rows.reshape(-1)[:, None], wfull, jnp.float32(0)).reshape(-1)
        flat = idx.reshape(-1)
        target = jnp.where((flat >= 0) & (flat < n) & (contrib != 0), flat, n)  # n: dropped
        return g.at[target].add(contrib, mode="drop")

    ge = add_rows(ge, idx_e, w_e, spk[:, :exc_per_block])
    gi = add_rows(gi, idx_i, w_i, spk[:, exc_per_block:])
    v, ref, fired = membrane(v, ref, ge, gi, params, conductance=conductance, exp_euler=exp_euler)
    if decay:
        ge, gi = ge * params[0], gi * params[1]
    return v, ge, gi, ref, count + fired.astype(jnp.int32), bitpack(fired)


def _register() -> XLACustomKernel:
    op = XLACustomKernel("lif_shard_step")
    op.def_tags("event", "network")

    def cpu(outs, **static):
        return lambda *args: _cpu_module().lif_shard_step(*args, outs=list(outs), input_output_aliases=_STATE_ALIASES,
                                                          **static)

    def gpu(outs, **static):
        def run(*args):
            if not (args[7].size == 1 and args[9].size == 1):  # equal weights sum alike in any order
                note_atomic_sums("run_lif_network_sharded (weights per synapse)")
            return _cuda_module().lif_shard_step(*args, outs=list(outs), input_output_aliases=_STATE_ALIASES, **static)
        return run

    def reference(outs, **static):
        return lambda *args: reference_shard_step(*args, **static)

    op.def_cpp_kernel(cpu)
    op.def_cuda_kernel(gpu)
    for platform in ("cpu", "gpu", "tpu"):
        op.def_kernel("jnp", platform, reference)
    # v, ge, gi, ref, count, spike words, idx_e, w_e, idx_i, w_i, params
    refuse_gradients(op, 11, "run_lif_network_sharded")
    return op


lif_shard_step_p = _register()


def _axis_size(axis_name) -> int:
    if axis_name is None:
        return 1
    size = getattr(jax.lax, "axis_size", None)
    return int(size(axis_name)) if size is not None else int(jax.lax.psum(1, axis_name))


def _varying(xs, axis_name):
    """The kernel's outputs typed as varying along ``axis_name`` (as shard_map's loop carries must be):
    a cast for the type checker, no operation at run time."""
    if axis_name is None:
        return tuple(xs)
    cast = getattr(jax.lax, "pcast", None)  # jax >= 0.8; pvary before
    out = []
    for x in xs:
        try:
            out.append(cast(x, axis_name, to="varying") if cast is not None else jax.lax.pvary(x, axis_name))
        except (ValueError, TypeError):  # already varying (a jax whose ffi_call types its outputs so)
            out.append(x)
    return tuple(out)


def run_lif_network_sharded(state, conn_exc, conn_inh, params: LIFParams, steps: int, *, axis_name=None,
                            block: int | None = None, exc_per_block: int | None = None, backend: str | None = None):
    """Advance this device's part of a LIF network ``steps`` steps, exchanging spikes every step.

    Call it inside ``jax.shard_map`` over a mesh axis ``axis_name`` (or with ``axis_name=None`` on
    one device). Every step costs one ``all_gather`` of the network's bit-packed spikes and one
    fused step on each device (on a GPU: two kernel launches). Same model and parameters as
    :func:`run_lif_network`.

    Args:
        state: this shard's :class:`LIFState` (``n_local`` neurons: global neurons
            ``[shard * n_local, (shard + 1) * n_local)``, the shard being the device's index on the axis).
        conn_exc: ``FixedNumPerPre`` of shape ``(n_exc, n_local)``: for every excitatory neuron of the
            whole network, its targets among this shard's neurons (local indices; others are dropped)
            and weights (one shared, or one per synapse).
        conn_inh: ``FixedNumPerPre`` of shape ``(n_inh, n_local)``, likewise.
        params: :class:`LIFParams` (static).
        steps: number of steps (static).
        axis_name: the mesh axis the neurons are split over; ``None``: no split.
        block, exc_per_block: the network is blocks of ``block`` neurons whose first ``exc_per_block``
            are excitatory (default: one block, ``n_exc = conn_exc.shape[0]``). A network whose blocks
            do not depend on the device count is the same network on any number of devices.
        backend: ``"cpp"``/``"cuda"`` (default) or ``"jnp"``.

    Returns this shard's state after ``steps`` steps (of the kind of ``state``) and each of its
    neurons' spike counts. The last step's spikes are in ``state.spk`` and are delivered by the
    next call, so ``k`` calls of ``m`` steps equal one of ``k * m``. With one shared weight per
    population, the spike trains do not depend on the number of devices. Not differentiable
    (``jax.grad`` raises ``UnsupportedOperationError``).

    Example (two GPUs; ``make_conns(shard)`` builds a shard's connectivity, see ``examples/coba_spmd.py``)::

        mesh = jax.sharding.Mesh(jax.devices()[:2], ("neurons",))
        @partial(jax.shard_map, mesh=mesh, in_specs=P("neurons"), out_specs=(P("neurons"), P("neurons")))
        def simulate(v0):
            ce, ci = make_conns(jax.lax.axis_index("neurons"))
            state, counts = run_lif_network_sharded(LIFState.initial(v0), ce, ci, LIFParams(), 10_000,
                                                    axis_name="neurons", block=640, exc_per_block=512)
            return state.v, counts
    """
    kind, arrays = _checked_call(state, params, steps, "run_lif_network_sharded")
    n = arrays[0].shape[0]
    if n == 0:
        raise EventShapeError("run_lif_network_sharded: state.v is empty; every shard needs at least one neuron")
    idx_e, w_e = _population("conn_exc", conn_exc, n)
    idx_i, w_i = _population("conn_inh", conn_inh, n)
    shards = _axis_size(axis_name)
    n_global = shards * n
    if block is None:
        block = n_global
    if not isinstance(block, (int, np.integer)) or block <= 0 or n_global % block:
        raise EventShapeError(f"run_lif_network_sharded: block={block!r} must be a positive divisor of the network's "
                              f"{n_global} neurons ({shards} shards x {n})")
    blocks = n_global // block
    if exc_per_block is None:
        if idx_e.shape[0] % blocks:
            raise EventShapeError(f"run_lif_network_sharded: conn_exc has {idx_e.shape[0]} rows, not a multiple of "
                                  f"the {blocks} blocks; pass exc_per_block")
        exc_per_block = idx_e.shape[0] // blocks
    if not isinstance(exc_per_block, (int, np.integer)) or not 0 <= exc_per_block <= block:
        raise EventShapeError(f"run_lif_network_sharded: exc_per_block={exc_per_block!r}; expected an int in "
                              f"[0, {block}]")
    want_e, want_i = blocks * exc_per_block, blocks * (block - exc_per_block)
    if idx_e.shape[0] != want_e or idx_i.shape[0] != want_i:
        raise EventShapeError(f"run_lif_network_sharded: conn_exc has {idx_e.shape[0]} rows and conn_inh "
                              f"{idx_i.shape[0]}; the network of {n_global} neurons ({blocks} blocks of {block}, "
                              f"{exc_per_block} excitatory each) needs {want_e} and {want_i}")
    pvec = params.vector()
    if min(pvec[0], pvec[1]) <= 0.0:
        raise EventShapeError("run_lif_network_sharded: exp(-dt/tau_e) or exp(-dt/tau_i) underflows to 0 in float32; "
                              "use a smaller dt")
    v, ge, gi, ref, spk = arrays
    count = jnp.zeros_like(v, dtype=jnp.int32)
    if steps == 0:
        out = (v, ge, gi, ref, spk)
        return (dict(zip(LIFState._fields, out)) if kind is dict else LIFState(*out)), count
    pj = jnp.asarray(pvec)
    static = dict(block=int(block), exc_per_block=int(exc_per_block), conductance=params.synapse == "coba",
                  exp_euler=params.integrator == "exp_euler")
    words_local = (n + 31) // 32
    f32 = SDS((n,), jnp.float32)
    outs = [f32, f32, f32, f32, SDS((n,), jnp.int32), SDS((words_local,), jnp.uint32)]

    def gather(words):
        return words if axis_name is None else jax.lax.all_gather(words, axis_name, tiled=True)

    def step(carry, decay):
        v, ge, gi, ref, count, words = carry
        return _varying(lif_shard_step_p(v, ge, gi, ref, count, gather(words), idx_e, w_e, idx_i, w_i, pj, outs=outs,
                                         backend=backend, decay=decay, **static), axis_name)

    # the last step's spikes are delivered into conductances decayed for this step (behind a
    # barrier, so that the jnp backend's scatter cannot fuse the product into a multiply-add)
    carry = jax.lax.optimization_barrier((v, ge * pj[0], gi * pj[1], ref, count, bitpack(spk)))
    carry = jax.lax.fori_loop(0, steps - 1, lambda _, c: step(c, True), carry)
    v, ge, gi, ref, count, words = step(carry, False)  # a call's last step leaves them undecayed
    out = (v, ge, gi, ref, unpack_spikes(words, n))
    return (dict(zip(LIFState._fields, out)) if kind is dict else LIFState(*out)), count
