// CPU kernel of xlakern.event's fused LIF network: many simulation steps in one call.
//
// Neurons [0, n_exc) are excitatory, [n_exc, n) inhibitory; each projects through a fixed number
// of synapses (idx_e / idx_i rows). Each step: every neuron takes what last step's spikes
// delivered, advances one step (lif_common.h) and may fire; then the spikes of this step are
// delivered for the next. Targets outside [0, n) are dropped, as in the event operators.
// Outputs: the state after `steps` steps and each neuron's spike count over them.

#include <cstdint>
#include <cstring>
#include <vector>

#include "lif_common.h"

namespace {

using namespace xk_lif;

void copy_if_distinct(const xk::Tensor& from, xk::Tensor& to) {
  if (from.data_ptr() != to.data_ptr()) std::memcpy(to.data_ptr(), from.data_ptr(), from.nbytes());
}

// Adds neuron `pre`'s outgoing weights into acc (excitatory targets at [0, n), inhibitory at [n, 2n)).
inline void deliver(int64_t pre, int64_t n, int64_t n_exc, const Conn& ce, const Conn& ci, float* acc) {
  const bool exc = pre < n_exc;
  const Conn& c = exc ? ce : ci;
  const int64_t row = exc ? pre : pre - n_exc;
  float* dst = exc ? acc : acc + n;
  const int32_t* idx = c.idx + row * c.k;
  for (int64_t k = 0; k < c.k; ++k) {
    const int64_t j = idx[k];
    if (uint64_t(j) < uint64_t(n)) dst[j] += c.homo ? c.w[0] : c.w[row * c.k + k];
  }
}

template <bool Conductance, bool ExpEuler>
void run(float* v, float* ge, float* gi, float* ref, bool* spk, int32_t* count, const Conn& ce, const Conn& ci,
         const Params& p, int64_t n, int64_t n_exc, int64_t steps) {
  std::vector<float> acc(size_t(2 * n), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    if (spk[i]) deliver(i, n, n_exc, ce, ci, acc.data());
  for (int64_t t = 0; t < steps; ++t) {
    float* a = acc.data();
    xk::parallel_for(n, 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float in_e = a[i], in_i = a[n + i];
        a[i] = 0.0f;
        a[n + i] = 0.0f;
        const bool fired = lif_step<Conductance, ExpEuler>(p, in_e, in_i, v[i], ge[i], gi[i], ref[i]);
        spk[i] = fired;
        count[i] += fired ? 1 : 0;
      }
    });
    for (int64_t i = 0; i < n; ++i)
      if (spk[i]) deliver(i, n, n_exc, ce, ci, a);
  }
}

}  // namespace

// @xk lif_run arg arg arg arg arg arg arg arg arg arg ret ret ret ret ret ret attr.n_exc:int64 attr.steps:int64 attr.conductance:bool attr.exp_euler:bool
void lif_run(const xk::Tensor v0, const xk::Tensor ge0, const xk::Tensor gi0, const xk::Tensor ref0,
             const xk::Tensor spk0, const xk::Tensor idx_e, const xk::Tensor w_e, const xk::Tensor idx_i,
             const xk::Tensor w_i, const xk::Tensor params, xk::Tensor v, xk::Tensor ge, xk::Tensor gi,
             xk::Tensor ref, xk::Tensor spk, xk::Tensor count, int64_t n_exc, int64_t steps, bool conductance,
             bool exp_euler) {
  check_args(v0, ge0, gi0, ref0, spk0, idx_e, w_e, idx_i, w_i, params, n_exc);
  XK_CHECK(steps >= 0) << "steps must be >= 0";
  copy_if_distinct(v0, v);
  copy_if_distinct(ge0, ge);
  copy_if_distinct(gi0, gi);
  copy_if_distinct(ref0, ref);
  copy_if_distinct(spk0, spk);
  std::memset(count.data_ptr(), 0, count.nbytes());
  const int64_t n = v.numel();
  if (n == 0 || steps == 0) return;
  const Params p = params_from(params.data_ptr<float>());
  const Conn ce = conn_of(idx_e, w_e), ci = conn_of(idx_i, w_i);
  auto go = [&](auto fn) {
    fn(v.data_ptr<float>(), ge.data_ptr<float>(), gi.data_ptr<float>(), ref.data_ptr<float>(), spk.data_ptr<bool>(),
       count.data_ptr<int32_t>(), ce, ci, p, n, n_exc, steps);
  };
  if (conductance) {
    if (exp_euler) go(run<true, true>);
    else go(run<true, false>);
  } else {
    if (exp_euler) go(run<false, true>);
    else go(run<false, false>);
  }
}

// One step of one shard of a network split over devices (run_lif_network_sharded; layout in
// lif_common.h's Blocks). ge and gi hold the decayed conductances: every spike of the whole network
// (bit-packed words, gathered by XLA) adds its row into them, in ascending neuron order; then
// every local neuron advances (lif_membrane), is counted and packed if it fires, and, with `decay`,
// leaves ge, gi decayed for the next step's delivery.
// @xk lif_shard_step arg arg arg arg arg arg arg arg arg arg arg ret ret ret ret ret ret attr.block:int64 attr.exc_per_block:int64 attr.conductance:bool attr.exp_euler:bool attr.decay:bool
void lif_shard_step(const xk::Tensor v0, const xk::Tensor ge0, const xk::Tensor gi0, const xk::Tensor ref0,
                    const xk::Tensor count0, const xk::Tensor spikes, const xk::Tensor idx_e, const xk::Tensor w_e,
                    const xk::Tensor idx_i, const xk::Tensor w_i, const xk::Tensor params, xk::Tensor v,
                    xk::Tensor ge, xk::Tensor gi, xk::Tensor ref, xk::Tensor count, xk::Tensor spikes_out,
                    int64_t block, int64_t exc_per_block, bool conductance, bool exp_euler, bool decay) {
  const Blocks bl{block, exc_per_block};
  check_shard_args(v0, ge0, gi0, ref0, count0, spikes, idx_e, w_e, idx_i, w_i, params, spikes_out, bl);
  copy_if_distinct(v0, v);
  copy_if_distinct(ge0, ge);
  copy_if_distinct(gi0, gi);
  copy_if_distinct(ref0, ref);
  copy_if_distinct(count0, count);
  const int64_t n = v.numel(), words_local = spikes_out.numel();
  const uint32_t* sp = spikes.data_ptr<uint32_t>();
  float *pv = v.data_ptr<float>(), *pge = ge.data_ptr<float>(), *pgi = gi.data_ptr<float>(),
        *pref = ref.data_ptr<float>();
  int32_t* pcount = count.data_ptr<int32_t>();
  uint32_t* out = spikes_out.data_ptr<uint32_t>();
  const Conn ce = conn_of(idx_e, w_e), ci = conn_of(idx_i, w_i);
  for (int64_t w = 0; w < spikes.numel(); ++w) {
    const int64_t shard = w / words_local, j0 = (w - shard * words_local) * 32;
    for (uint32_t bits = sp[w]; bits; bits &= bits - 1) {
      const int64_t j = j0 + __builtin_ctz(bits);
      if (j >= n) break;  // padding bits of a shard's last word
      bool exc;
      const int64_t r = blocked_row(shard * n + j, bl, exc);
      const Conn& c = exc ? ce : ci;
      float* dst = exc ? pge : pgi;
      for (int64_t k = 0; k < c.k; ++k) {
        const int64_t t = c.idx[r * c.k + k];
        if (uint64_t(t) < uint64_t(n)) dst[t] += c.homo ? c.w[0] : c.w[r * c.k + k];
      }
    }
  }
  const Params p = params_from(params.data_ptr<float>());
  auto update = [&](auto membrane) {
    xk::parallel_for(words_local, 512, [&](int64_t lo, int64_t hi) {
      for (int64_t w = lo; w < hi; ++w) {
        uint32_t word = 0u;
        const int64_t end = (w + 1) * 32 < n ? (w + 1) * 32 : n;
        for (int64_t i = w * 32; i < end; ++i) {
          const bool fired = membrane(p, pge[i], pgi[i], pv[i], pref[i]);
          pcount[i] += fired ? 1 : 0;
          word |= uint32_t(fired) << (i - w * 32);
          if (decay) pge[i] *= p.de, pgi[i] *= p.di;
        }
        out[w] = word;
      }
    });
  };
  if (conductance) {
    if (exp_euler) update(lif_membrane<true, true>);
    else update(lif_membrane<true, false>);
  } else {
    if (exp_euler) update(lif_membrane<false, true>);
    else update(lif_membrane<false, false>);
  }
}
