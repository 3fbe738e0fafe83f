// The stored-layout scatters with reproducible sums (xlakern.config.set_deterministic): the same
// products as sparse_scatter_kernel, whose float atomicAdds sum each output in whatever order the
// GPU runs them, so that a step's output can differ in its last bits from run to run (and a chaotic
// network's spike trains then part after a while). They sum in fixed point (exact_sums_cuda.cuh), in
// three passes:
//   1. measure  the largest finite |addend| and the number of addends (a warp's reduction, one atomic
//               max and one add a warp); non-finite addends set flags on their output instead;
//   2. add      each finite addend into its output's int64 (exact_add);
//   3. finish   every output from its sum or its flags (exact_finish).
// The three passes and the second walk cost about twice the atomic scatter's time.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "event_sparse_cuda.cuh"
#include "exact_sums_cuda.cuh"

namespace xk_event {

// Passes 1 (Measure) and 2 of the header: sparse_scatter_kernel's walk (walk_scatter_rows), its adds replaced;
// Permuted: slot p weighs data[perm[p]] (binary_csr*_indexed).
template <bool Measure, bool Permuted, typename W, typename I, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) exact_scatter_kernel(
    const W* __restrict__ data, const I* __restrict__ perm, const I* __restrict__ idx, const I* __restrict__ indptr,
    const S* __restrict__ spk,
    ExactSums sums, int64_t nrows, int64_t ncols, int64_t batch, int64_t nse, int64_t nconn, bool homo,
    SpikeRule<S, Binary> rule, int rows_per_warp, RangeRead ranges) {
  using A = typename AccOf<W>::type;
  constexpr int U = 4;  // synapses a lane loads a round, as in sparse_scatter_kernel
  const int64_t first_row = warp_first_row<int64_t>(rows_per_warp);
  if (first_row >= nrows) return;
  const int scale = Measure ? 0 : exact_scale(sums.header);
  double largest = 0.0;         // Measure: this lane's largest finite |addend|
  unsigned long long count = 0;  // and its number of addends
  walk_scatter_rows<Permuted, U, A>(data, perm, idx, indptr, spk, first_row, nrows, batch, nse, nconn, homo, rule,
                                    rows_per_warp, ranges,
                                 [&](const int64_t* j, const A* wv, A v, int64_t b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (uint64_t(j[u]) >= uint64_t(ncols)) continue;  // dropped, as in every product
      const double x = double(wv[u] * v);  // the atomic scatter's addend, exactly
      const int64_t o = j[u] * batch + b;
      if constexpr (Measure) {
        if (isfinite(x)) {
          largest = fmax(largest, fabs(x));
          ++count;
        } else {
          atomicOr(sums.flags + o, isnan(x) ? kNaN : (x > 0 ? kPosInf : kNegInf));
        }
      } else if (isfinite(x)) {
        exact_add(sums, scale, o, x);
      }
    }
  });
  if constexpr (Measure) {
    for (int o = 16; o > 0; o >>= 1) {
      largest = fmax(largest, __shfl_down_sync(0xffffffffu, largest, o));
      count += __shfl_down_sync(0xffffffffu, count, o);
    }
    if ((threadIdx.x & 31) == 0 && count > 0) {
      atomicMax(sums.header, (unsigned long long)__double_as_longlong(largest));
      atomicAdd(sums.header + 1, count);
    }
  }
}

// The reproducible scatter of a stored layout (the attribute `deterministic` of event_sparse and
// event_sparse_indexed, whose `perm` is not null): clears the scratch, then the three passes, all on the
// stream (capturable in a CUDA graph).
template <bool Permuted, typename W, typename I, typename S, bool Binary>
void launch_exact_scatter(const W* data, const I* perm, const I* idx, const I* ptr, const S* spk,
                          typename AccOf<W>::type* out,
                          ExactSums sums, int64_t nrows, int64_t ncols, int64_t batch, int64_t nse, int64_t nconn,
                          bool homo, SpikeRule<S, Binary> rule, cudaStream_t st) {
  const int64_t n = ncols * batch;
  if (n == 0) return;
  clear_exact_sums(sums, n, st);
  if (nrows > 0) {
    const int rows_per_warp = scatter_rows_per_warp(nrows, batch, gpu_limits());
    const dim3 grid(grid_for_warps((nrows + rows_per_warp - 1) / rows_per_warp), grid_y(batch));
    const RangeRead ranges = range_read();
    exact_scatter_kernel<true, Permuted, W, I, S, Binary><<<grid, kThreads, 0, st>>>(
        data, perm, idx, ptr, spk, sums, nrows, ncols, batch, nse, nconn, homo, rule, rows_per_warp, ranges);
    exact_scatter_kernel<false, Permuted, W, I, S, Binary><<<grid, kThreads, 0, st>>>(
        data, perm, idx, ptr, spk, sums, nrows, ncols, batch, nse, nconn, homo, rule, rows_per_warp, ranges);
  }
  exact_finish(sums, out, n, st);
}

}  // namespace xk_event
