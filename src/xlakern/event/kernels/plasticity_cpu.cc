// CPU kernel of the plasticity updates (see plasticity_common.h for the rule and the layouts).
// plastic_update(weight, indices, indptr, perm, spikes, trace, bounds) -> weight (aliased):
// rows of active spikes only, in parallel over rows (every synapse belongs to one row, so
// writes never collide). Out-of-range columns and positions are skipped.

#include <cstdint>
#include <cstring>

#include "event_common.h"
#include "plasticity_common.h"

namespace {

using namespace xk_event;
using namespace xk_plastic;

// Active rows in order, each stored row's slots requested four active rows ahead (walk_active_rows); a
// dense row is one stream the hardware prefetcher follows on its own.
template <typename W, typename I, typename S, bool B>
void update(W* w, const I* idx, const I* indptr, const I* perm, const S* spk, const W* trace, W lo, W hi,
            const Rows& g, SpikeRule<S, B> rule) {
  auto request = [&](int64_t r) {
    if (g.mode == kDense) return;
    int64_t begin, end;
    row_slots(indptr, g, r, begin, end);
    prefetch_values(idx + begin, end - begin);
    if (g.permuted) prefetch_values(perm + begin, end - begin);  // the weights themselves lie anywhere
    else prefetch_values(w + begin, end - begin);
  };
  auto visit = [&](int64_t r) { update_row(w, idx, indptr, perm, trace, lo, hi, g, r); };
  xk::parallel_for(g.nrows, 64, [&](int64_t a, int64_t b) { walk_active_rows<4>(spk, a, b, rule, request, visit); });
}

}  // namespace

// @xk plastic_update arg arg arg arg arg arg arg ret attr.ncols:int64 attr.nconn:int64 attr.mode:int64 attr.row_stride:int64 attr.col_stride:int64 attr.permuted:bool
void plastic_update(const xk::Tensor weight, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor perm,
                    const xk::Tensor spikes, const xk::Tensor trace, const xk::Tensor bounds, xk::Tensor out,
                    int64_t ncols, int64_t nconn, int64_t mode, int64_t row_stride, int64_t col_stride,
                    bool permuted) {
  const DType dt = weight.dtype();
  const Rows g = checked_rows(weight, indices, indptr, perm, spikes, trace, bounds, out, ncols, nconn, mode,
                              row_stride, col_stride, permuted);
  if (out.data_ptr() != weight.data_ptr()) std::memcpy(out.data_ptr(), weight.data_ptr(), weight.nbytes());
  auto run = [&](auto wt) {
    using W = typename decltype(wt)::type;
    const W* bd = bounds.data_ptr<W>();
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(spikes, true, dt, [&](auto st, auto rule) {
        using S = typename decltype(st)::type;
        const I* ptr = (mode == kDense || nconn >= 0) ? nullptr : indptr.data_ptr<I>();
        update(out.data_ptr<W>(), indices.data_ptr<I>(), ptr, permuted ? perm.data_ptr<I>() : nullptr,
               spikes.data_ptr<S>(), trace.data_ptr<W>(), bd[0], bd[1], g, rule);
      });
    });
  };
  if (dt == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
}
