// CUDA kernel of synaptic delays (see delay_common.h). A warp covers a few presynaptic rows
// (rows_per_warp, the scatter's rule): one coalesced load reads their events, and the warp walks the
// active rows in turn, 128 synapses a round with the round's loads issued before its atomic adds (rows
// share ring entries). Inactive rows cost a fraction of a warp, not a warp each. t is read on the
// device, so a traced step counter costs no copy.

#include <cuda_runtime.h>
#include <cstdint>
#include <type_traits>

#include "event_common.h"
#include "event_sparse_cuda.cuh"
#include "delay_common.h"

namespace {

using namespace xk_event;
using namespace xk_delay;

constexpr int kRound = 4;  // synapses a lane loads before its adds: 128 a warp a round

// (t0 + d) mod L for t0 in [0, L): delays in [1, L) (what the Python API checks) take an add and a
// compare; others (traced delays wrap) the floor modulo.
__device__ __forceinline__ int32_t arrival_slot(int32_t t0, int32_t d, int32_t nslots) {
  int32_t s = uint32_t(d) < uint32_t(nslots) ? d : int32_t(floor_mod(d, nslots));
  s += t0;
  return s >= nslots ? s - nslots : s;
}

// P is the positions' type: int32_t where rows, columns, synapses and ring entries fit (walk32_fits),
// which takes an active row in fewer instructions, else int64_t. (kThreads, a block's, is the sparse
// kernels' 256: event_sparse_cuda.cuh)
template <typename P, typename W, typename I, typename S, bool B>
__global__ void __launch_bounds__(kThreads) deliver_kernel(W* ring, const S* ev, const W* data, const I* idx,
                                                           const I* indptr, const int32_t* delays, const int32_t* t,
                                                           P nrows, P ncols, P nse, int32_t nslots, bool homo,
                                                           SpikeRule<S, B> rule, int rows_per_warp, RangeRead ranges) {
  using U = std::make_unsigned_t<P>;
  const P first_row = warp_first_row<P>(rows_per_warp);
  const int lane = int(threadIdx.x) & 31;
  if (first_row >= nrows) return;  // (the whole warp)
  const int32_t step = *t;  // (issued beside the events' load)
  const S x = lane_spike(ev, first_row, nrows, rows_per_warp);
  P lane_begin, lane_end;
  lane_row_range(ranges, indptr, P(-1), nse, first_row, nrows, rows_per_warp, lane_begin, lane_end);
  unsigned pending = __ballot_sync(0xffffffffu, rule.active(x));
  if (pending == 0) return;
  const int32_t t0 = int32_t(floor_mod(int64_t(step), int64_t(nslots)));
  for_each_active_row(pending, first_row, [&](P r, int src) {
    const W f = __shfl_sync(0xffffffffu, rule.template value<W>(x), src);
    P begin, end;
    walk_row_range(ranges, indptr, P(-1), nse, r, src, lane_begin, lane_end, begin, end);
    for (P e0 = begin + lane; e0 < end; e0 += kRound * 32) {
      // every load of the round first: a slot branches on its delay (the modulo of a delay outside
      // [1, L)), and a branch between loads would wait for that delay before the next slot's loads went
      // out, one memory latency a slot (H200, 400k rows of 80, 1% active: 19.8-20.8 to 15.3-15.6 us a
      // step, bench/RESULTS.md session 55)
      P c[kRound];
      int32_t d[kRound];
      W w[kRound];
#pragma unroll
      for (int u = 0; u < kRound; ++u) {
        const P e = e0 + u * 32;
        c[u] = e < end ? P(idx[e]) : P(-1);
        d[u] = e < end ? delays[e] : 0;
        w[u] = e < end ? (homo ? data[0] : data[e]) : W(0);
      }
#pragma unroll
      for (int u = 0; u < kRound; ++u)
        if (U(c[u]) < U(ncols))  // (else skipped)
          atomicAdd(ring + P(arrival_slot(t0, d[u], nslots)) * ncols + c[u], w[u] * f);
    }
  });
}

}  // namespace

// @xk delay_deliver arg arg arg arg arg arg arg ret attr.weighted:bool stream
void delay_deliver(const xk::Tensor ring, const xk::Tensor events, const xk::Tensor data, const xk::Tensor indices,
                   const xk::Tensor indptr, const xk::Tensor delays, const xk::Tensor t, xk::Tensor out,
                   bool weighted, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const Ring g = checked_ring(ring, events, data, indices, indptr, delays, t, out);
  if (out.data_ptr() != ring.data_ptr())
    XK_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), ring.data_ptr(), ring.nbytes(), cudaMemcpyDeviceToDevice, st));
  if (out.numel() == 0 || g.nrows == 0) return;
  const int rows_per_warp = scatter_rows_per_warp(g.nrows, 1, gpu_limits());
  const unsigned blocks = grid_for_warps((g.nrows + rows_per_warp - 1) / rows_per_warp);
  auto run = [&](auto wt) {
    using W = typename decltype(wt)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(events, !weighted, ring.dtype(), [&](auto stag, auto rule) {
        using S = typename decltype(stag)::type;
        auto launch = [&](auto pt) {
          using P = typename decltype(pt)::type;
          deliver_kernel<<<blocks, kThreads, 0, st>>>(out.data_ptr<W>(), events.data_ptr<S>(), data.data_ptr<W>(),
                                                      indices.data_ptr<I>(), indptr.data_ptr<I>(),
                                                      delays.data_ptr<int32_t>(), t.data_ptr<int32_t>(), P(g.nrows),
                                                      P(g.ncols), P(g.nse), int32_t(g.nslots), g.homo, rule,
                                                      rows_per_warp, range_read());
        };
        if constexpr (std::is_same_v<I, int32_t>) {
          if (walk32_fits({g.nrows, g.ncols, g.nse, g.nslots * g.ncols})) return launch(Tag<int32_t>{});
        }
        launch(Tag<int64_t>{});
      });
    });
  };
  if (ring.dtype() == xk::DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
  XK_CHECK_LAUNCH();
}
