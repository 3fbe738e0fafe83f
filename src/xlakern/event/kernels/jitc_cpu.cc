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
#include "event_sparse_cpu.h"
#include "jitc_common.h"

namespace {

using namespace xk_event;
using namespace xk_jitc;

// The generator of one call: its seed and skip table, the generated shape, and the log estimate's
// scale ln 2 / ln(1 - p), found once a call rather than once a row.
struct Gen {
  uint32_t seed;
  const uint32_t* table;
  int64_t ntable, grows, gcols;
  float scale;
};

Gen generator_of(const xk::Tensor& seed, const xk::Tensor& table, int64_t grows, int64_t gcols) {
  const uint32_t* t = table.data_ptr<uint32_t>();
  const float scale = 0.69314718f * inv_log_keep_of(t, table.numel());
  return {seed.data_ptr<uint32_t>()[0], t, table.numel(), grows, gcols, scale};
}

// The columns of the generated row whose key (row_key) is `key`, in order, f(col, k) for each, k its
// draw index (its weight's hash is draw(key, 2k + 1)): the draws and skips of for_each_synapse
// (jitc_common.h), eight at a time. Eight hashes and eight log estimates are straight-line
// arithmetic that the compiler vectorises; the table then decides each skip exactly, so the columns
// are the GPU's and the jnp mirror's to the bit.
template <typename F>
inline __attribute__((always_inline)) void for_each_column(const Gen& g, uint32_t key, F&& f) {
  if (g.ntable == 0) {  // prob >= 1: every skip is 1, so column k is draw k
    for (int64_t c = 0; c < g.gcols; ++c) f(c, uint32_t(c));
    return;
  }
  int64_t col = -1;
  for (uint32_t k0 = 0;; k0 += 8) {
    uint32_t h[8];
    float est[8];
    for (int i = 0; i < 8; ++i) h[i] = draw(key, 2u * (k0 + uint32_t(i)));
    for (int i = 0; i < 8; ++i) est[i] = log2_of_draw(h[i]) * g.scale;
    for (int i = 0; i < 8; ++i) {
      col += skip_from_estimate(h[i], g.table, g.ntable, est[i]);
      if (col >= g.gcols) return;
      f(col, k0 + uint32_t(i));
    }
  }
}

template <typename A>
struct Weights {  // a synapse's weight, drawn only when a product needs it
  A a, b;
  int64_t kind;
  const A* q;
  A of(uint32_t key, uint32_t k) const { return weight_of(a, b, kind, draw(key, 2u * k + 1u), q); }
};

template <typename A, typename S, bool Binary>
void gather(const Gen& g, Weights<A> wt, const S* spk, A* out, int64_t batch, SpikeRule<S, Binary> rule) {
  xk::parallel_for(g.grows, 16, [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(batch);
    for (int64_t r = lo; r < hi; ++r) {
      const uint32_t key = row_key(g.seed, uint32_t(r));
      if (batch == 1) {
        A sum = A(0);
        for_each_column(g, key, [&](int64_t c, uint32_t k) {
          if (rule.active(spk[c])) sum += wt.of(key, k) * rule.template value<A>(spk[c]);
        });
        out[r] = sum;
        continue;
      }
      std::fill(acc.begin(), acc.end(), A(0));
      for_each_column(g, key, [&](int64_t c, uint32_t k) {
        const S* s = spk + c * batch;
        bool any = false;
        for (int64_t j = 0; j < batch; ++j) any |= rule.active(s[j]);
        if (!any) return;
        const A w = wt.of(key, k);
        for (int64_t j = 0; j < batch; ++j)
          if (rule.active(s[j])) acc[j] += w * rule.template value<A>(s[j]);
      });
      std::memcpy(out + r * batch, acc.data(), sizeof(A) * batch);
    }
  });
}

template <typename A, typename S, bool Binary>
void scatter(const Gen& g, Weights<A> wt, const S* spk, A* out, int64_t batch, SpikeRule<S, Binary> rule) {
  const int64_t out_size = g.gcols * batch;
  std::memset(out, 0, sizeof(A) * out_size);
  std::vector<int64_t> active;  // only the active rows are generated
  find_active_rows(spk, g.grows, batch, rule, active);
  auto scatter_rows = [&](int64_t lo, int64_t hi, A* dst) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = active[i];
      const uint32_t key = row_key(g.seed, uint32_t(r));
      const S* s = spk + r * batch;
      for_each_column(g, key, [&](int64_t c, uint32_t k) {
        const A w = wt.of(key, k);
        A* o = dst + c * batch;
        for (int64_t j = 0; j < batch; ++j)
          if (rule.active(s[j])) o[j] += w * rule.template value<A>(s[j]);
      });
    }
  };
  // A generated synapse (hash, skip, weight) costs several stored ones' adds: weigh it as 8.
  const double keep = g.ntable == 0 ? 0.0 : double(g.table[g.ntable - 1]) * 2.3283064365386963e-10;
  const int64_t per_row = std::max<int64_t>(1, int64_t(double(g.gcols) * (1.0 - keep)));
  scatter_in_parts(int64_t(active.size()), int64_t(active.size()) * per_row * 8, out, out_size, scatter_rows);
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
  const Gen g = generator_of(seed, table, grows, gcols);
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* p = params.data_ptr<A>();
    dispatch_spikes(spikes, binary, acc, [&](auto st, auto rule) {
      using S = typename decltype(st)::type;
      const Weights<A> wt{p[0], p[1], kind, qtable.data_ptr<A>()};
      if (transpose) scatter(g, wt, spikes.data_ptr<S>(), out.data_ptr<A>(), batch, rule);
      else gather(g, wt, spikes.data_ptr<S>(), out.data_ptr<A>(), batch, rule);
    });
  };
  dispatch_accumulator(acc, run);
}

// @xk jitc_dense arg arg arg arg ret attr.kind:int64
void jitc_dense(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
                xk::Tensor out, int64_t kind) {
  check_args(params, seed, table, qtable, out, kind);
  const DType acc = params.dtype();
  XK_CHECK(out.ndim() == 2) << "output must be a matrix";
  const int64_t grows = out.shape(0), gcols = out.shape(1);
  if (out.numel() == 0) return;
  const Gen g = generator_of(seed, table, grows, gcols);
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* p = params.data_ptr<A>();
    A* o = out.data_ptr<A>();
    const Weights<A> wt{p[0], p[1], kind, qtable.data_ptr<A>()};
    xk::parallel_for(grows, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        A* row = o + r * gcols;
        const uint32_t key = row_key(g.seed, uint32_t(r));
        std::fill(row, row + gcols, A(0));
        for_each_column(g, key, [&](int64_t c, uint32_t k) { row[c] = wt.of(key, k); });
      }
    });
  };
  dispatch_accumulator(acc, run);
}
