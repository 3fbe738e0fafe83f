// The stored-layout scatters with reproducible sums (xlakern.config.set_deterministic): the same
// products as sparse_scatter_kernel, whose float atomicAdds sum each output in whatever order the
// GPU runs them, so that a step's output can differ in its last bits from run to run (and a chaotic
// network's spike trains then part after a while). Here every addend becomes a 64-bit fixed-point
// integer, and integer adds give the same sum in any order:
//   1. measure  the largest finite |addend| and the number of addends (a warp's reduction, one atomic
//               max and one add a warp); non-finite addends set flags on their output instead;
//   2. add      each finite addend x as llrint(x 2^E) into its output's int64 (an atomicAdd on integers);
//   3. finish   out = sum 2^-E, or inf / NaN where the flags say (NaN for a NaN or for both infinities,
//               as float sums give in any order).
// E = 62 - e_max - ceil(log2(count)), with |addend| < 2^e_max, so no partial sum can overflow. Each addend
// is rounded to 2^-E, i.e. to 2^-62 of count x max|addend|: for float32 outputs far below float32's own
// rounding (count = 1.6M addends: 2^-41 of the largest addend), for float64 ones coarser than float64
// (about 2^-40 of the largest addend instead of 2^-53 of each partial sum). The three passes and the
// second walk cost about twice the atomic scatter's time.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "event_sparse_cuda.cuh"

namespace xk_event {

// The scratch of a reproducible scatter of n outputs, in 32-bit words (exact_scatter_words): a header of
// two uint64 (the largest finite |addend| as the bits of a non-negative double, whose unsigned order is
// its numeric order; the number of addends), n int64 sums, n words of flags.
inline int64_t exact_scatter_words(int64_t n) { return 4 + 3 * n; }

struct ExactSums {
  unsigned long long* header;
  unsigned long long* sums;
  unsigned* flags;
};

inline ExactSums exact_sums(xk::Tensor& scratch, int64_t n) {
  XK_CHECK(scratch.dtype() == xk::DType::UInt32 && scratch.numel() >= exact_scatter_words(n))
      << "a reproducible scatter needs a uint32 scratch of " << exact_scatter_words(n) << " words (4 + 3 x "
      << n << " outputs); got " << scratch.numel();
  auto* words = scratch.data_ptr<uint32_t>();
  return {reinterpret_cast<unsigned long long*>(words), reinterpret_cast<unsigned long long*>(words + 4),
          words + 4 + 2 * n};
}

constexpr unsigned kPosInf = 1u, kNegInf = 2u, kNaN = 4u;

// The scale E of the fixed-point sums (see the header), from the measured header; 0 when nothing is added.
__device__ __forceinline__ int exact_scale(const unsigned long long* header) {
  const double largest = __longlong_as_double((long long)header[0]);
  const unsigned long long count = header[1];
  if (largest == 0.0 || count == 0) return 0;
  int e_max;
  (void)frexp(largest, &e_max);  // largest < 2^e_max
  const int e_count = 64 - __clzll((long long)(count - 1));  // ceil(log2(count)); 0 for one addend
  return 62 - e_max - e_count;
}

// Passes 1 (Measure) and 2 of the header: sparse_scatter_kernel's walk (walk_scatter_rows), its adds replaced.
template <bool Measure, typename W, typename I, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) exact_scatter_kernel(
    const W* __restrict__ data, const I* __restrict__ idx, const I* __restrict__ indptr, const S* __restrict__ spk,
    ExactSums sums, int64_t nrows, int64_t ncols, int64_t batch, int64_t nse, int64_t nconn, bool homo,
    SpikeRule<S, Binary> rule, int rows_per_warp, RangeRead ranges) {
  using A = typename AccOf<W>::type;
  constexpr int U = 4;  // synapses a lane loads a round, as in sparse_scatter_kernel
  const int64_t first_row = warp_first_row<int64_t>(rows_per_warp);
  if (first_row >= nrows) return;
  const int scale = Measure ? 0 : exact_scale(sums.header);
  double largest = 0.0;         // Measure: this lane's largest finite |addend|
  unsigned long long count = 0;  // and its number of addends
  walk_scatter_rows<false, U, A>(data, static_cast<const I*>(nullptr), idx, indptr, spk, first_row, nrows, batch, nse,
                                 nconn, homo, rule, rows_per_warp, ranges,
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
        atomicAdd(sums.sums + o, (unsigned long long)llrint(ldexp(x, scale)));  // two's complement
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

// Pass 3: each output from its fixed-point sum, or its non-finite flags.
template <typename A>
__global__ void __launch_bounds__(kThreads) exact_scatter_finish_kernel(ExactSums sums, A* __restrict__ out,
                                                                        int64_t n) {
  const int scale = exact_scale(sums.header);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const unsigned f = sums.flags[i];
    A y;
    if ((f & kNaN) || (f & (kPosInf | kNegInf)) == (kPosInf | kNegInf)) y = A(NAN);
    else if (f & kPosInf) y = A(INFINITY);
    else if (f & kNegInf) y = A(-INFINITY);
    else y = A(ldexp(double((long long)sums.sums[i]), -scale));
    out[i] = y;
  }
}

// The reproducible scatter of a stored layout (the attribute `deterministic` of event_sparse): clears the
// scratch, then the three passes, all on the stream (capturable in a CUDA graph).
template <typename W, typename I, typename S, bool Binary>
void launch_exact_scatter(const W* data, const I* idx, const I* ptr, const S* spk, typename AccOf<W>::type* out,
                          ExactSums sums, int64_t nrows, int64_t ncols, int64_t batch, int64_t nse, int64_t nconn,
                          bool homo, SpikeRule<S, Binary> rule, cudaStream_t st) {
  const int64_t n = ncols * batch;
  if (n == 0) return;
  XK_CUDA_CHECK(cudaMemsetAsync(sums.header, 0, size_t(exact_scatter_words(n)) * 4, st));
  if (nrows > 0) {
    const int rows_per_warp = scatter_rows_per_warp(nrows, batch, gpu_limits());
    const dim3 grid(grid_for_warps((nrows + rows_per_warp - 1) / rows_per_warp), grid_y(batch));
    const RangeRead ranges = range_read();
    exact_scatter_kernel<true, W, I, S, Binary><<<grid, kThreads, 0, st>>>(
        data, idx, ptr, spk, sums, nrows, ncols, batch, nse, nconn, homo, rule, rows_per_warp, ranges);
    exact_scatter_kernel<false, W, I, S, Binary><<<grid, kThreads, 0, st>>>(
        data, idx, ptr, spk, sums, nrows, ncols, batch, nse, nconn, homo, rule, rows_per_warp, ranges);
  }
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(65535) * 8);
  exact_scatter_finish_kernel<<<unsigned(blocks), kThreads, 0, st>>>(sums, out, n);
}

}  // namespace xk_event
