// Shared by jitc_cpu.cc and jitc_cuda.cu: the counter-based generator of just-in-time
// connectivity. Everything that decides the matrix is integer arithmetic or correctly rounded
// IEEE operations on exact products (no log; see split_mul), so a seed gives bit-identical matrices in C++,
// CUDA and the jnp reference (_jitc_kernels.py mirrors every line below).
//
// Generated row r of a (grows, gcols) matrix: draw k = 0, 1, ... gives the hash h = draw(seed, r,
// 2k) for the skip and h2 = draw(seed, r, 2k+1) for the weight. Columns advance by geometric
// skips: skip = 1 + #{t in table : t > h}, where `table` (ascending) holds floor(2^32 (1-p)^i)
// for i >= 1, so P(skip > i) = (1-p)^i up to 2^-32. The first column is skip - 1.
// Weight = a + b * r(h2): r = 0 (scalar), U(0,1] from 24 bits (uniform), or a standard normal
// from linear interpolation in a 65537-entry quantile table (normal).
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

// The per-draw helpers are forced inline on the host: in a unit with many instantiations g++ -O3
// otherwise leaves them as calls, a third of a CPU draw's time. (nvcc inlines them anyway.)
#if defined(__CUDACC__)
#define XK_JITC_HOT XK_HOST_DEVICE inline
#else
#define XK_JITC_HOT inline __attribute__((always_inline))
#endif

namespace xk_jitc {

enum Kind : int64_t { kScalar = 0, kUniform = 1, kNormal = 2 };

// Longest skip table the kernels take (Python's tables stop there too: MAX_SKIP_TABLE in
// _jitc_kernels.py). Counts along the table fit an int32, and so does a GPU warp's scan of 32 skips.
constexpr int64_t kMaxSkipTable = int64_t(1) << 25;

XK_JITC_HOT uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

XK_JITC_HOT uint32_t row_key(uint32_t seed, uint32_t row) {
  return mix32(mix32(seed ^ 0x9e3779b9u) ^ (row * 0x85ebca6bu));
}

XK_JITC_HOT uint32_t draw(uint32_t key, uint32_t k) {
  return mix32(mix32(key ^ (k * 0x9e3779b9u + 0x632be5abu)));
}

// log2 of u = (h + 1/2) 2^-32, to ~1e-8, in straight-line float arithmetic (no call, no branch), so
// that a loop over several draws vectorises on a CPU. It only feeds skip estimates (skip_from_estimate
// makes them exact), so its last bits need not match any platform's log. (Host code: the GPU has a
// one-instruction log2.)
inline __attribute__((always_inline)) float log2_of_draw(uint32_t h) {
  const float u = fmaf(float(h), 2.3283064365386963e-10f, 1.1641532182693481e-10f);  // in [2^-33, 1]
  uint32_t bits;
  std::memcpy(&bits, &u, 4);
  // u = 2^e * m with m in [sqrt(1/2), sqrt(2)): log2 m = (2 / ln 2) atanh(s), s = (m - 1) / (m + 1), |s| < 0.172
  const uint32_t shifted = bits + (0x3f800000u - 0x3f3504f3u);  // carries into the exponent when m >= sqrt(2)
  const int32_t e = int32_t(shifted >> 23) - 127;
  const uint32_t mbits = (shifted & 0x007fffffu) + 0x3f3504f3u;
  float m;
  std::memcpy(&m, &mbits, 4);
  const float s = (m - 1.f) / (m + 1.f), s2 = s * s;
  const float atanh = s * (1.f + s2 * (0.33333333f + s2 * (0.2f + s2 * (0.14285715f + s2 * 0.11111111f))));
  return float(e) + 2.8853900817779268f * atanh;
}

// 1 + the number of table entries above h (table ascending, length n), found from an estimate of
// that count corrected by stepping along the table: the table alone decides the result (so it is
// exact whatever log made the estimate), and a good estimate makes it two loads, issued together,
// instead of a binary search. `table` is a pointer, or anything indexable like one (the GPU's view
// with a part in shared memory).
template <typename Table>
XK_JITC_HOT int64_t skip_from_estimate(uint32_t h, const Table& table, int64_t n, float est) {
  if (n == 0) return 1;
  // T_k = floor(2^32 (1-p)^k) = table[n - k], non-increasing in k; count = max k with T_k > h,
  // the one c with T_c > h (or c = 0) and T_{c+1} <= h (or c = n)
  // (n <= 2^25, MAX_SKIP_TABLE, so the counts fit an int)
  const int32_t m = int32_t(n);
#ifdef __CUDA_ARCH__
  int32_t c = int32_t(fminf(fmaxf(est, 0.f), float(m)));  // est in [0, m] (m <= 2^25 is exact in a float)
  const bool next_low = c == m || table[m - c - 1] <= h;
  const bool this_high = c == 0 || table[m - c] > h;
#else
  // The same test without a branch on c: at a high prob c is 0, 1, 2, ... at random, and a CPU
  // mispredicted those branches about once a draw. Both loads stay inside the table (m >= 1); the
  // one that moved (c == m, c == 0) is not needed.
  float e = est > 0.f ? est : 0.f;
  e = e < float(m) ? e : float(m);
  int32_t c = int32_t(e);
  const uint32_t below = table[m - c - 1 + int32_t(c == m)], at = table[m - c - int32_t(c == 0)];
  const bool next_low = (c == m) | (below <= h);
  const bool this_high = (c == 0) | (at > h);
#endif
  if (next_low && this_high) return 1 + c;  // the estimate was right (almost always)
  while (c < m && table[m - c - 1] > h) ++c;
  while (c > 0 && table[m - c] <= h) --c;
  return 1 + c;
}

// skip_from_estimate with the estimate log(u) / ln(1 - p); inv_log_keep = 1 / ln(1 - p) (see
// for_each_synapse).
template <typename Table>
XK_HOST_DEVICE inline int64_t skip_of(uint32_t h, const Table& table, int64_t n, float inv_log_keep) {
  if (n == 0) return 1;
#ifdef __CUDA_ARCH__
  // the GPU's base-2 log with no care for subnormals (x >= 2^-33 here), one instruction
  float log2_x;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(log2_x) : "f"(fmaf(float(h), 2.3283064365386963e-10f, 1.1641532182693481e-10f)));
#else
  const float log2_x = log2_of_draw(h);
#endif
  return skip_from_estimate(h, table, n, log2_x * (0.69314718f * inv_log_keep));
}

// 1 / ln(1 - p), from the table's first threshold T_1 = floor(2^32 (1 - p)).
XK_HOST_DEVICE inline float inv_log_keep_of(const uint32_t* table, int64_t n) {
  if (n == 0) return 0.f;
  const float lost = float(4294967296.0 - double(table[n - 1])) * 2.3283064365386963e-10f;  // ~p
  return 1.f / log1pf(-lost);
}

// Products whose every partial product is exact: x and y are split into high and low halves
// of their significands (a bit mask), each partial product fits the format exactly, and the
// partials are added in a fixed order. An exact product gives the same sum whether or not a
// compiler fuses it with the add into an FMA (nvcc and XLA both do), so C++, CUDA and jnp agree
// to the bit. (float64 drops the low x low partial, below 2^-52 relative, which would not be exact.)
XK_HOST_DEVICE inline float hi_part(float x) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(__float_as_uint(x) & 0xfffff000u);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xfffff000u;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
XK_HOST_DEVICE inline double hi_part(double x) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(__double_as_longlong(x) & (long long)0xfffffffff8000000ull);
#else
  uint64_t u;
  std::memcpy(&u, &x, 8);
  u &= 0xfffffffff8000000ull;
  std::memcpy(&x, &u, 8);
  return x;
#endif
}
XK_HOST_DEVICE inline float split_mul(float x, float y) {
  const float xh = hi_part(x), xl = x - xh, yh = hi_part(y), yl = y - yh;
  float s = xh * yh;
  s = s + xh * yl;
  s = s + xl * yh;
  return s + xl * yl;
}
XK_HOST_DEVICE inline double split_mul(double x, double y) {
  const double xh = hi_part(x), xl = x - xh, yh = hi_part(y), yl = y - yh;
  double s = xh * yh;
  s = s + xh * yl;
  return s + xl * yh;
}

// The random factor r of a synapse's weight (A: float or double).
template <typename A>
XK_HOST_DEVICE inline A weight_factor(int64_t kind, uint32_t h2, const A* qtable) {
  if (kind == kUniform) return A(int64_t(h2 >> 8) + 1) * A(1.0 / 16777216.0);  // exact: (0, 1]
  if (kind == kNormal) {
    const uint32_t i = h2 >> 16;
    const A frac = A(int64_t(h2 & 0xffffu)) * A(1.0 / 65536.0);
    return qtable[i] + split_mul(qtable[i + 1] - qtable[i], frac);
  }
  return A(0);
}

template <typename A>
XK_HOST_DEVICE inline A weight_of(A a, A b, int64_t kind, uint32_t h2, const A* qtable) {
  return a + split_mul(b, weight_factor(kind, h2, qtable));
}

// Walks generated row r, calling f(col, weight) for each synapse.
template <typename A, typename F>
XK_HOST_DEVICE inline void for_each_synapse(uint32_t seed, int64_t r, int64_t gcols, const uint32_t* table,
                                            int64_t ntable, int64_t kind, A a, A b, const A* qtable, F&& f) {
  const uint32_t key = row_key(seed, uint32_t(r));
  const float inv_log_keep = inv_log_keep_of(table, ntable);
  int64_t col = -1;
  for (uint32_t k = 0;; ++k) {
    col += skip_of(draw(key, 2u * k), table, ntable, inv_log_keep);
    if (col >= gcols) break;
    f(col, weight_of(a, b, kind, draw(key, 2u * k + 1u), qtable));
  }
}

// The checks both platforms' entry points run before touching memory (Python validated already; these
// keep a direct FFI call from reading out of bounds). Not part of the generator: nothing to mirror.
inline void check_args(const xk::Tensor& params, const xk::Tensor& seed, const xk::Tensor& table,
                       const xk::Tensor& qtable, const xk::Tensor& out, int64_t kind) {
  const xk::DType acc = params.dtype();
  XK_CHECK(acc == xk::DType::Float32 || acc == xk::DType::Float64) << "params must be float32 or float64";
  XK_CHECK(out.dtype() == acc) << "output dtype must match params";
  XK_CHECK(params.numel() == 2) << "params must hold (a, b)";
  XK_CHECK(seed.numel() == 1 && seed.dtype() == xk::DType::UInt32) << "seed must be one uint32";
  XK_CHECK(table.dtype() == xk::DType::UInt32) << "skip table must be uint32";
  XK_CHECK(table.numel() <= kMaxSkipTable)
      << "skip table longer than " << kMaxSkipTable << " entries (prob too small)";
  XK_CHECK(kind != kNormal || qtable.numel() == 65537) << "normal quantile table must have 65537 entries";
  XK_CHECK(qtable.dtype() == acc) << "quantile table dtype must match params";
}

}  // namespace xk_jitc
