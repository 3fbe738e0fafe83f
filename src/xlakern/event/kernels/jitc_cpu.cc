// CPU kernels of just-in-time connectivity (see jitc_common.h for the generator).
//   jitc_mv      out = G @ v (transpose=false, gather) or G.T @ v (transpose=true, scatter over
//                the generated rows whose spikes are active); v is (n,) or (n, batch).
//   jitc_dense   G itself, (grows, gcols), exactly the weights jitc_mv multiplies by.
// params = (a, b) in the accumulation dtype (float32 or float64); out has that dtype.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "event_common.h"
#include "jitc_common.h"

namespace {

using namespace xk_event;
using namespace xk_jitc;

struct Gen {
  uint32_t seed;
  const uint32_t* table;
  int64_t ntable, grows, gcols, kind;
};

template <typename A, typename S, bool Binary>
void gather(const Gen& g, A a, A b, const A* q, const S* spk, A* out, int64_t batch, SpikeRule<S, Binary> rule) {
  xk::parallel_for(g.grows, 16, [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(batch);
    for (int64_t r = lo; r < hi; ++r) {
      std::fill(acc.begin(), acc.end(), A(0));
      for_each_synapse(g.seed, r, g.gcols, g.table, g.ntable, g.kind, a, b, q, [&](int64_t c, A w) {
        const S* s = spk + c * batch;
        for (int64_t j = 0; j < batch; ++j)
          if (rule.active(s[j])) acc[j] += w * rule.template value<A>(s[j]);
      });
      std::memcpy(out + r * batch, acc.data(), sizeof(A) * batch);
    }
  });
}

template <typename A, typename S, bool Binary>
void scatter(const Gen& g, A a, A b, const A* q, const S* spk, A* out, int64_t batch, SpikeRule<S, Binary> rule) {
  std::memset(out, 0, sizeof(A) * g.gcols * batch);
  // Serial over the active rows: only they are generated, and the output slice they write is
  // shared. (Rows are few at realistic firing rates.)
  for (int64_t r = 0; r < g.grows; ++r) {
    const S* s = spk + r * batch;
    bool any = false;
    for (int64_t j = 0; j < batch && !any; ++j) any = rule.active(s[j]);
    if (!any) continue;
    for_each_synapse(g.seed, r, g.gcols, g.table, g.ntable, g.kind, a, b, q, [&](int64_t c, A w) {
      A* o = out + c * batch;
      for (int64_t j = 0; j < batch; ++j)
        if (rule.active(s[j])) o[j] += w * rule.template value<A>(s[j]);
    });
  }
}

}  // namespace

// @xk jitc_mv arg arg arg arg arg ret attr.grows:int64 attr.gcols:int64 attr.kind:int64 attr.transpose:bool attr.binary:bool
void jitc_mv(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
             const xk::Tensor spikes, xk::Tensor out, int64_t grows, int64_t gcols, int64_t kind, bool transpose,
             bool binary) {
  check_args(params, seed, table, qtable, out, kind);
  const DType acc = params.dtype();
  const int64_t batch = batch_of(spikes);
  XK_CHECK(spikes.numel() == (transpose ? grows : gcols) * batch) << "spike count does not match the matrix";
  XK_CHECK(out.numel() == (transpose ? gcols : grows) * batch) << "output size does not match the matrix";
  if (out.numel() == 0) return;
  const Gen g{seed.data_ptr<uint32_t>()[0], table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* p = params.data_ptr<A>();
    dispatch_spikes(spikes, binary, acc, [&](auto st, auto rule) {
      using S = typename decltype(st)::type;
      if (transpose) scatter(g, p[0], p[1], qtable.data_ptr<A>(), spikes.data_ptr<S>(), out.data_ptr<A>(), batch, rule);
      else gather(g, p[0], p[1], qtable.data_ptr<A>(), spikes.data_ptr<S>(), out.data_ptr<A>(), batch, rule);
    });
  };
  if (acc == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
}

// @xk jitc_dense arg arg arg arg ret attr.kind:int64
void jitc_dense(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
                xk::Tensor out, int64_t kind) {
  check_args(params, seed, table, qtable, out, kind);
  const DType acc = params.dtype();
  XK_CHECK(out.ndim() == 2) << "output must be a matrix";
  const int64_t grows = out.shape(0), gcols = out.shape(1);
  if (out.numel() == 0) return;
  const Gen g{seed.data_ptr<uint32_t>()[0], table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* p = params.data_ptr<A>();
    A* o = out.data_ptr<A>();
    const A* q = qtable.data_ptr<A>();
    xk::parallel_for(grows, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        A* row = o + r * gcols;
        std::fill(row, row + gcols, A(0));
        for_each_synapse(g.seed, r, gcols, g.table, g.ntable, kind, p[0], p[1], q, [&](int64_t c, A w) { row[c] = w; });
      }
    });
  };
  if (acc == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
}
