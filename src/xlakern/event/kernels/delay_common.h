// Shared by delay_cpu.cc and delay_cuda.cu: delivery of spikes through CSR synapses with
// per-synapse delays into an arrival ring of shape (L, n_post):
//   ring[(t + delays[e]) mod L, indices[e]] += w_e * f(events[row(e)])
// for the synapses e of active rows only (f: 1 for binary delivery, the event's value for
// weighted delivery). The ring is the output's own buffer (aliased). Slots use floor modulo, so
// every write stays inside the ring; out-of-range columns are skipped.
#pragma once

#include <cstdint>

namespace xk_delay {

struct Ring {
  int64_t nrows, ncols, nslots, nse;
  bool homo;
};

XK_HOST_DEVICE inline int64_t floor_mod(int64_t x, int64_t m) {
  const int64_t r = x % m;
  return r < 0 ? r + m : r;
}

inline Ring checked_ring(const xk::Tensor& ring, const xk::Tensor& events, const xk::Tensor& data,
                         const xk::Tensor& indices, const xk::Tensor& indptr, const xk::Tensor& delays,
                         const xk::Tensor& t, const xk::Tensor& out) {
  using xk::DType;
  XK_CHECK(ring.ndim() == 2) << "ring must be (L, n_post)";
  XK_CHECK(ring.dtype() == DType::Float32 || ring.dtype() == DType::Float64) << "ring must be float32 or float64";
  XK_CHECK(out.dtype() == ring.dtype() && out.numel() == ring.numel()) << "output must match the ring";
  XK_CHECK(data.dtype() == ring.dtype()) << "weights must have the ring's dtype";
  const Ring g{events.numel(), ring.shape(1), ring.shape(0), indices.numel(), data.numel() == 1};
  XK_CHECK(g.nslots < (int64_t(1) << 31)) << "the ring may hold at most 2^31 - 1 slots";
  XK_CHECK(indptr.numel() == g.nrows + 1) << "indptr must have n_pre + 1 entries";
  XK_CHECK(data.numel() == 1 || data.numel() == g.nse) << "data must hold one weight or one per synapse";
  XK_CHECK(delays.numel() == g.nse && delays.dtype() == DType::Int32) << "delays must be int32, one per synapse";
  XK_CHECK(t.numel() == 1 && t.dtype() == DType::Int32) << "t must be one int32";
  XK_CHECK(indptr.dtype() == indices.dtype()) << "indptr and indices dtypes differ";
  return g;
}

}  // namespace xk_delay
