// Shared by lif_cpu.cc and lif_cuda.cu: one leaky integrate-and-fire neuron with exponential
// excitatory/inhibitory synapses, advanced one step, in the same float32 arithmetic on both
// platforms (and in the same order as the jnp reference in _network.py), plus the layout of the
// parameter vector Python passes.
#pragma once

#include <cstdint>

namespace xk_lif {

// Positions in the float32 parameter vector (``LIFParams.vector()`` in Python).
enum Param : int {
  kDecayE,    // exp(-dt / tau_e)
  kDecayI,    // exp(-dt / tau_i)
  kDecayM,    // exp(-dt / tau_m), exponential Euler only
  kDt,
  kTauM,
  kVRest,
  kVTh,
  kVReset,
  kTRef,
  kEExc,
  kEInh,
  kDrive,
  kSynScale,
  kNumParams
};

struct Params {
  float de, di, dm, dt, tau_m, v_rest, v_th, v_reset, t_ref, e_exc, e_inh, drive, syn_scale;
};

XK_HOST_DEVICE inline Params params_from(const float* p) {
  return Params{p[kDecayE], p[kDecayI], p[kDecayM], p[kDt],    p[kTauM],  p[kVRest],   p[kVTh],
                p[kVReset], p[kTRef],  p[kEExc],  p[kEInh], p[kDrive], p[kSynScale]};
}

// The membrane part of one step of one neuron, given its conductances (or currents) ge, gi
// already updated for this step. Returns whether it fires. Conductance-based (COBA) or
// current-based (CUBA) input; forward Euler or exponential Euler (v relaxes exactly towards
// v_rest + current over dt).
template <bool Conductance, bool ExpEuler>
XK_HOST_DEVICE inline bool lif_membrane(const Params& p, float ge, float gi, float& v, float& ref) {
  float current;
  if (Conductance)
    current = p.syn_scale * (ge * (p.e_exc - v) + gi * (p.e_inh - v)) + p.drive;
  else
    current = ge + gi + p.drive;
  float v_new;
  if (ExpEuler) {
    const float target = p.v_rest + current;
    v_new = target + (v - target) * p.dm;
  } else {
    v_new = v + p.dt * (p.v_rest - v + current) / p.tau_m;
  }
  if (ref > 0.0f) v_new = p.v_reset;  // refractory: held at reset
  const bool fired = v_new >= p.v_th;
  v = fired ? p.v_reset : v_new;
  const float left = ref - p.dt;
  ref = fired ? p.t_ref : (left > 0.0f ? left : 0.0f);
  return fired;
}

// One whole step of one neuron. in_e / in_i are the weights its synapses received from last
// step's spikes. Returns whether it fires.
template <bool Conductance, bool ExpEuler>
XK_HOST_DEVICE inline bool lif_step(const Params& p, float in_e, float in_i, float& v, float& ge, float& gi,
                                    float& ref) {
  ge = ge * p.de + in_e;
  gi = gi * p.di + in_i;
  return lif_membrane<Conductance, ExpEuler>(p, ge, gi, v, ref);
}

// The outgoing synapses of one population: row r holds k targets (fixed count per presynaptic
// neuron); one shared weight (homo) or one per synapse.
struct Conn {
  const int32_t* idx;
  const float* w;
  int64_t rows, k;
  bool homo;
};

// Argument checks shared by both entry points (they throw; the FFI layer turns that into an error).
inline void check_args(const xk::Tensor& v, const xk::Tensor& ge, const xk::Tensor& gi, const xk::Tensor& ref,
                       const xk::Tensor& spk, const xk::Tensor& idx_e, const xk::Tensor& w_e,
                       const xk::Tensor& idx_i, const xk::Tensor& w_i, const xk::Tensor& params, int64_t n_exc) {
  const int64_t n = v.numel();
  for (const xk::Tensor* t : {&v, &ge, &gi, &ref}) {
    XK_CHECK(t->dtype() == xk::DType::Float32) << "neuron state must be float32";
    XK_CHECK(t->numel() == n) << "every state array must hold one value per neuron (" << n << ")";
  }
  XK_CHECK(spk.dtype() == xk::DType::Bool && spk.numel() == n) << "spikes must be bool, one per neuron";
  XK_CHECK(params.dtype() == xk::DType::Float32 && params.numel() == kNumParams)
      << "params must be float32[" << int(kNumParams) << "]";
  XK_CHECK(n_exc >= 0 && n_exc <= n) << "n_exc must lie in [0, n]";
  for (const xk::Tensor* t : {&idx_e, &idx_i}) {
    XK_CHECK(t->dtype() == xk::DType::Int32 && t->ndim() == 2) << "indices must be int32 of shape (rows, k)";
  }
  XK_CHECK(idx_e.shape(0) == n_exc && idx_i.shape(0) == n - n_exc)
      << "one row of excitatory indices per excitatory neuron, one of inhibitory per inhibitory";
  XK_CHECK(w_e.dtype() == xk::DType::Float32 && (w_e.numel() == 1 || w_e.numel() == idx_e.numel()))
      << "excitatory weights must be float32, one shared or one per synapse";
  XK_CHECK(w_i.dtype() == xk::DType::Float32 && (w_i.numel() == 1 || w_i.numel() == idx_i.numel()))
      << "inhibitory weights must be float32, one shared or one per synapse";
}

// A network split over shards (devices) for run_lif_network_sharded: `block`-neuron blocks, the
// first `exc` neurons of each excitatory; each shard holds n_local consecutive neurons and its
// spikes as ceil(n_local / 32) uint32 words (bit b of word w: local neuron 32 w + b). Rows of idx_e
// are the network's excitatory neurons in order (block-major), rows of idx_i its inhibitory ones;
// targets are the shard's local neurons. One shard and one block is run_lif_network's layout.
struct Blocks {
  int64_t block, exc;
};

// Row of global neuron `pre` in its population's connectivity, and whether it is excitatory.
XK_HOST_DEVICE inline int64_t blocked_row(int64_t pre, const Blocks& bl, bool& exc) {
  const int64_t b = pre / bl.block, l = pre - b * bl.block;
  exc = l < bl.exc;
  return exc ? b * bl.exc + l : b * (bl.block - bl.exc) + (l - bl.exc);
}

// Argument checks of one sharded step (both platforms). Returns the number of shards.
inline int64_t check_shard_args(const xk::Tensor& v, const xk::Tensor& ge, const xk::Tensor& gi,
                                const xk::Tensor& ref, const xk::Tensor& count, const xk::Tensor& spikes,
                                const xk::Tensor& idx_e, const xk::Tensor& w_e, const xk::Tensor& idx_i,
                                const xk::Tensor& w_i, const xk::Tensor& params, const xk::Tensor& spikes_out,
                                const Blocks& bl) {
  const int64_t n = v.numel();
  for (const xk::Tensor* t : {&v, &ge, &gi, &ref}) {
    XK_CHECK(t->dtype() == xk::DType::Float32) << "neuron state must be float32";
    XK_CHECK(t->numel() == n) << "every state array must hold one value per local neuron (" << n << ")";
  }
  XK_CHECK(count.dtype() == xk::DType::Int32 && count.numel() == n) << "count must be int32, one per local neuron";
  const int64_t words_local = (n + 31) / 32;
  XK_CHECK(spikes_out.dtype() == xk::DType::UInt32 && spikes_out.numel() == words_local)
      << "the shard's spike words must be uint32[" << words_local << "]";
  XK_CHECK(spikes.dtype() == xk::DType::UInt32 && words_local > 0 && spikes.numel() % words_local == 0)
      << "the network's spikes must be uint32 words, " << words_local << " per shard";
  const int64_t shards = spikes.numel() / words_local, n_global = shards * n;
  XK_CHECK(bl.block > 0 && n_global % bl.block == 0 && bl.exc >= 0 && bl.exc <= bl.block)
      << "block must divide the network's " << n_global << " neurons and exc_per_block lie in [0, block]";
  const int64_t blocks = n_global / bl.block;
  for (const xk::Tensor* t : {&idx_e, &idx_i})
    XK_CHECK(t->dtype() == xk::DType::Int32 && t->ndim() == 2) << "indices must be int32 of shape (rows, k)";
  XK_CHECK(idx_e.shape(0) == blocks * bl.exc && idx_i.shape(0) == blocks * (bl.block - bl.exc))
      << "one row of indices per excitatory (inhibitory) neuron of the whole network";
  XK_CHECK(w_e.dtype() == xk::DType::Float32 && (w_e.numel() == 1 || w_e.numel() == idx_e.numel()))
      << "excitatory weights must be float32, one shared or one per synapse";
  XK_CHECK(w_i.dtype() == xk::DType::Float32 && (w_i.numel() == 1 || w_i.numel() == idx_i.numel()))
      << "inhibitory weights must be float32, one shared or one per synapse";
  XK_CHECK(params.dtype() == xk::DType::Float32 && params.numel() == kNumParams)
      << "params must be float32[" << int(kNumParams) << "]";
  return shards;
}

inline Conn conn_of(const xk::Tensor& idx, const xk::Tensor& w) {
  return Conn{idx.data_ptr<int32_t>(), w.data_ptr<float>(), idx.shape(0), idx.shape(1),
              w.numel() == 1};
}

}  // namespace xk_lif
