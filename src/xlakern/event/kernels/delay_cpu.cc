// CPU kernel of synaptic delays (see delay_common.h). Active rows are delivered one after the
// other: rows share ring entries, and at realistic firing rates they are few.

#include <cstdint>
#include <cstring>

#include "event_common.h"
#include "delay_common.h"

namespace {

using namespace xk_event;
using namespace xk_delay;

// Active rows in order, each row's indices, delays and weights requested four active rows ahead
// (walk_active_rows).
template <typename W, typename I, typename S, bool B>
void deliver(W* ring, const S* ev, const W* data, const I* idx, const I* indptr, const int32_t* delays, int64_t t,
             const Ring& g, SpikeRule<S, B> rule) {
  const int64_t t0 = floor_mod(t, g.nslots);
  auto request = [&](int64_t r) {
    int64_t begin, end;
    row_range(indptr, -1, g.nse, r, begin, end);
    prefetch_values(idx + begin, end - begin);
    prefetch_values(delays + begin, end - begin);
    if (!g.homo) prefetch_values(data + begin, end - begin);
  };
  auto visit = [&](int64_t r) {
    const W f = rule.template value<W>(ev[r]);
    int64_t begin, end;
    row_range(indptr, -1, g.nse, r, begin, end);
    for (int64_t e = begin; e < end; ++e) {
      const int64_t c = int64_t(idx[e]);
      if (uint64_t(c) >= uint64_t(g.ncols)) continue;
      const int64_t slot = floor_mod(t0 + floor_mod(delays[e], g.nslots), g.nslots);
      ring[slot * g.ncols + c] += (g.homo ? data[0] : data[e]) * f;
    }
  };
  walk_active_rows<4>(ev, 0, g.nrows, rule, request, visit);
}

}  // namespace

// @xk delay_deliver arg arg arg arg arg arg arg ret attr.weighted:bool
void delay_deliver(const xk::Tensor ring, const xk::Tensor events, const xk::Tensor data, const xk::Tensor indices,
                   const xk::Tensor indptr, const xk::Tensor delays, const xk::Tensor t, xk::Tensor out,
                   bool weighted) {
  const Ring g = checked_ring(ring, events, data, indices, indptr, delays, t, out);
  if (out.data_ptr() != ring.data_ptr()) std::memcpy(out.data_ptr(), ring.data_ptr(), ring.nbytes());
  if (out.numel() == 0) return;
  const int64_t now = t.data_ptr<int32_t>()[0];
  auto run = [&](auto wt) {
    using W = typename decltype(wt)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(events, !weighted, ring.dtype(), [&](auto st, auto rule) {
        using S = typename decltype(st)::type;
        deliver(out.data_ptr<W>(), events.data_ptr<S>(), data.data_ptr<W>(), indices.data_ptr<I>(),
                indptr.data_ptr<I>(), delays.data_ptr<int32_t>(), now, g, rule);
      });
    });
  };
  if (ring.dtype() == xk::DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
}
