// Reproducible GPU sums (xlakern.config.set_deterministic): outputs summed as 64-bit fixed-point integers,
// whose atomic adds give the same bits in any order, where float atomicAdds would round each partial sum
// in whatever order the GPU runs them. A scatter that uses them
//   - finds a scale E with |addend| 2^E < 2^(62 - ceil(log2 count)), count bounding the addends of any
//     one output: exact_scale reads the largest |addend| (or a bound on it) and count from `header`;
//   - adds each finite addend x as llrint(x 2^E) into its output's int64 (exact_add), and flags the
//     non-finite ones instead;
//   - ends with exact_finish: out = sum 2^-E, or inf / NaN where the flags say (NaN for a NaN or for both
//     infinities, as float sums give in any order).
// Integer adds wrap modulo 2^64, so only each final sum must fit: it does, as no output has more than
// `count` addends. Each addend is rounded to 2^-62 of count x the largest: for float32 outputs far below
// float32's own rounding, for float64 ones coarser than float64 (about 2^-40 of the largest addend at
// count ~ 2^21). Used by the stored-layout scatters (event_exact_scatter_cuda.cuh) and the JITC scatter
// (jitc_cuda_scatter.cu).
#pragma once

#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>

namespace xk_event {

// The scratch for n outputs, in 32-bit words: a header of two uint64 (the largest finite |addend| as the
// bits of a non-negative double, whose unsigned order is its numeric order; the count), n int64 sums and
// n words of flags. (exact_scratch in _kernels.py sizes the same.)
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

// Zeroes the header, the sums and the flags (on the stream: capturable in a CUDA graph).
inline void clear_exact_sums(const ExactSums& sums, int64_t n, cudaStream_t st) {
  XK_CUDA_CHECK(cudaMemsetAsync(sums.header, 0, size_t(exact_scatter_words(n)) * 4, st));
}

constexpr unsigned kPosInf = 1u, kNegInf = 2u, kNaN = 4u;

// The scale E from the header; 0 when nothing is added.
__device__ __forceinline__ int exact_scale(const unsigned long long* header) {
  const double largest = __longlong_as_double((long long)header[0]);
  const unsigned long long count = header[1];
  if (largest == 0.0 || count == 0) return 0;
  int e_max;
  (void)frexp(largest, &e_max);  // largest < 2^e_max
  const int e_count = 64 - __clzll((long long)(count - 1));  // ceil(log2(count)); 0 for one addend
  return 62 - e_max - e_count;
}

// Adds x into output o at scale E, or flags it there when it is not finite.
__device__ __forceinline__ void exact_add(const ExactSums& sums, int scale, int64_t o, double x) {
  if (isfinite(x)) atomicAdd(sums.sums + o, (unsigned long long)llrint(ldexp(x, scale)));  // two's complement
  else atomicOr(sums.flags + o, isnan(x) ? kNaN : (x > 0 ? kPosInf : kNegInf));
}

constexpr int kExactThreads = 256;

template <typename A>
__global__ void __launch_bounds__(kExactThreads) exact_finish_kernel(ExactSums sums, A* __restrict__ out, int64_t n) {
  const int scale = exact_scale(sums.header);
  for (int64_t i = int64_t(blockIdx.x) * kExactThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kExactThreads) {
    const unsigned f = sums.flags[i];
    A y;
    if ((f & kNaN) || (f & (kPosInf | kNegInf)) == (kPosInf | kNegInf)) y = A(NAN);
    else if (f & kPosInf) y = A(INFINITY);
    else if (f & kNegInf) y = A(-INFINITY);
    else y = A(ldexp(double((long long)sums.sums[i]), -scale));
    out[i] = y;
  }
}

// Writes every one of the n outputs from its sum or its flags.
template <typename A>
void exact_finish(const ExactSums& sums, A* out, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kExactThreads - 1) / kExactThreads, int64_t(65535) * 8);
  exact_finish_kernel<<<unsigned(blocks), kExactThreads, 0, st>>>(sums, out, n);
}

}  // namespace xk_event
