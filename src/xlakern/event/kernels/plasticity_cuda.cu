// CUDA kernel of the plasticity updates (see plasticity_common.h and plasticity_cpu.cc). A warp
// covers a few rows (rows_per_warp, the scatter's rule): its lanes read those rows' spikes in one
// coalesced load, and it walks the active ones in turn, 128 synapses a round with every load of the
// round issued before the first store (a weight's load does not wait on its index's). Inactive rows
// then cost a fraction of a warp, not a warp each (a launch of one warp a row spent most of a small step
// scheduling warps that return at once), and an active row of up to 128 synapses costs one round of
// memory latency. Rows own disjoint synapses, so no atomics are needed.

#include <cuda_runtime.h>
#include <cstdint>
#include <type_traits>

#include "event_common.h"
#include "event_sparse_cuda.cuh"
#include "plasticity_common.h"

namespace {

using namespace xk_event;
using namespace xk_plastic;

constexpr int kRound = 4;  // synapses a lane loads before it stores: 128 a warp a round

template <typename W, typename I>
__device__ inline void update_row_warp(W* w, const I* idx, const I* perm, const W* trace, W lo, W hi, const Rows& g,
                                       int64_t r, int64_t begin, int64_t end, int lane) {
  for (int64_t p0 = begin; p0 < end; p0 += kRound * 32) {
    int64_t c[kRound], pos[kRound];
    bool in[kRound];
    W x[kRound], t[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int64_t p = p0 + u * 32 + lane;
      in[u] = p < end && place(perm, g, r, p, pos[u]);
      c[u] = p < end ? column(idx, g, p) : -1;
    }
    // a weight's position needs no index (unless permuted), so its load goes out beside the index's
#pragma unroll
    for (int u = 0; u < kRound; ++u)
      if (in[u]) x[u] = w[pos[u]];
#pragma unroll
    for (int u = 0; u < kRound; ++u)
      if (in[u] && uint64_t(c[u]) < uint64_t(g.ncols)) t[u] = trace[c[u]];
#pragma unroll
    for (int u = 0; u < kRound; ++u)
      if (in[u] && uint64_t(c[u]) < uint64_t(g.ncols)) w[pos[u]] = clip(W(x[u] + t[u]), lo, hi);
  }
}

template <typename W, typename I, typename S, bool B>
__global__ void __launch_bounds__(kThreads) update_kernel(W* w, const I* idx, const I* indptr, const I* perm,
                                                          const S* spk, const W* trace, const W* bounds, Rows g,
                                                          SpikeRule<S, B> rule, int rows_per_warp) {
  const int64_t first_row = warp_first_row<int64_t>(rows_per_warp);
  const unsigned pending = __ballot_sync(0xffffffffu, rule.active(lane_spike(spk, first_row, g.nrows, rows_per_warp)));
  if (pending == 0) return;
  const int lane = int(threadIdx.x) & 31;
  const W lo = bounds[0], hi = bounds[1];
  for_each_active_row(pending, first_row, [&](int64_t r, int) {
    int64_t begin, end;
    row_slots(indptr, g, r, begin, end);
    update_row_warp(w, idx, perm, trace, lo, hi, g, r, begin, end, lane);
  });
}

// update_kernel's stored-layout form (CSR, CSC view, fixed count) with int32 indices, for rows, columns and
// weights under 2^31 (walk32_fits): the same walk in 32-bit arithmetic, the layout's branches decided at
// compile time. The 64-bit walk spends most of an active row's chain on index arithmetic (the scatter's
// mv32 kernel, session 46).
template <typename W, typename S, bool B, bool Permuted>
__global__ void __launch_bounds__(kThreads) update_kernel32(W* w, const int32_t* idx, const int32_t* indptr,
                                                            const int32_t* perm, const S* spk, const W* trace,
                                                            const W* bounds, int32_t nrows, int32_t ncols, int32_t nse,
                                                            int32_t nconn, SpikeRule<S, B> rule, int rows_per_warp,
                                                            RangeRead ranges) {
  const int32_t first_row = warp_first_row<int32_t>(rows_per_warp);
  const bool active = rule.active(lane_spike(spk, first_row, nrows, rows_per_warp));
  int32_t lane_begin, lane_end;
  lane_row_range(ranges, indptr, nconn, nse, first_row, nrows, rows_per_warp, lane_begin, lane_end);
  const unsigned pending = __ballot_sync(0xffffffffu, active);
  if (pending == 0) return;
  const int lane = int(threadIdx.x) & 31;
  const W lo = bounds[0], hi = bounds[1];
  for_each_active_row(pending, first_row, [&](int32_t r, int src) {
    int32_t begin, end;
    walk_row_range(ranges, indptr, nconn, nse, r, src, lane_begin, lane_end, begin, end);
    for (int32_t p0 = begin + lane; p0 < end; p0 += kRound * 32) {
      int32_t c[kRound], pos[kRound];
      bool in[kRound];
      W x[kRound], t[kRound];
#pragma unroll
      for (int u = 0; u < kRound; ++u) {
        const int32_t p = p0 + u * 32;
        pos[u] = p < end ? (Permuted ? perm[p] : p) : -1;
        c[u] = p < end ? idx[p] : -1;
        in[u] = uint32_t(pos[u]) < uint32_t(nse);
      }
#pragma unroll
      for (int u = 0; u < kRound; ++u)
        if (in[u]) x[u] = w[pos[u]];
#pragma unroll
      for (int u = 0; u < kRound; ++u) {
        in[u] = in[u] && uint32_t(c[u]) < uint32_t(ncols);
        if (in[u]) t[u] = trace[c[u]];
      }
#pragma unroll
      for (int u = 0; u < kRound; ++u)
        if (in[u]) w[pos[u]] = clip(W(x[u] + t[u]), lo, hi);
    }
  });
}

}  // namespace

// @xk plastic_update arg arg arg arg arg arg arg ret attr.ncols:int64 attr.nconn:int64 attr.mode:int64 attr.row_stride:int64 attr.col_stride:int64 attr.permuted:bool stream
void plastic_update(const xk::Tensor weight, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor perm,
                    const xk::Tensor spikes, const xk::Tensor trace, const xk::Tensor bounds, xk::Tensor out,
                    int64_t ncols, int64_t nconn, int64_t mode, int64_t row_stride, int64_t col_stride,
                    bool permuted, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const DType dt = weight.dtype();
  const Rows g = checked_rows(weight, indices, indptr, perm, spikes, trace, bounds, out, ncols, nconn, mode,
                              row_stride, col_stride, permuted);
  if (out.data_ptr() != weight.data_ptr())
    XK_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), weight.data_ptr(), weight.nbytes(), cudaMemcpyDeviceToDevice, st));
  if (g.nrows == 0 || g.nse == 0) return;
  const int rows_per_warp = scatter_rows_per_warp(g.nrows, 1, gpu_limits());
  const unsigned blocks = grid_for_warps((g.nrows + rows_per_warp - 1) / rows_per_warp);
  auto run = [&](auto wt) {
    using W = typename decltype(wt)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(spikes, true, dt, [&](auto stag, auto rule) {
        using S = typename decltype(stag)::type;
        const I* ptr = (mode == kDense || nconn >= 0) ? nullptr : indptr.data_ptr<I>();
        if constexpr (std::is_same_v<I, int32_t>) {
          if (g.mode == kSparse && walk32_fits({g.nrows, g.ncols, g.nse})) {
            auto kernel = permuted ? update_kernel32<W, S, decltype(rule)::kBinary, true>
                                   : update_kernel32<W, S, decltype(rule)::kBinary, false>;
            kernel<<<blocks, kThreads, 0, st>>>(out.data_ptr<W>(), indices.data_ptr<I>(), ptr,
                                                permuted ? perm.data_ptr<I>() : nullptr, spikes.data_ptr<S>(),
                                                trace.data_ptr<W>(), bounds.data_ptr<W>(), int32_t(g.nrows),
                                                int32_t(g.ncols), int32_t(g.nse), int32_t(nconn), rule, rows_per_warp,
                                                range_read());
            return;
          }
        }
        update_kernel<<<blocks, kThreads, 0, st>>>(out.data_ptr<W>(), indices.data_ptr<I>(), ptr,
                                                   permuted ? perm.data_ptr<I>() : nullptr, spikes.data_ptr<S>(),
                                                   trace.data_ptr<W>(), bounds.data_ptr<W>(), g, rule,
                                                   rows_per_warp);
      });
    });
  };
  if (dt == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
  XK_CHECK_LAUNCH();
}
