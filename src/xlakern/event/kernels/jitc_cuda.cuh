// CUDA kernels of just-in-time connectivity (see jitc_common.h for the generator; jitc_cpu.cc
// for the entry points' contract, which is the same here plus the stream).
//   A row is walked by a group of G lanes (walk_row): in each round lane l takes draw k0 + l, an
//   inclusive scan of the group's skips gives each lane its column, and the round that passes gcols
//   is the last. The draws, the integers and the float arithmetic are for_each_synapse's, so the
//   synapses and weights are the same bits; only the order of the adds differs.
//   gather   G lanes per generated row (and chunk of up to 16 batch columns), G = 1, 8 or 32
//            from the expected row length and the row count (gather_lanes): each lane sums
//            w * f(v[col]) over its synapses in registers, then the group adds its lanes' sums.
//            (G = 1 adds in the CPU's order.) One spike column (mv) takes gather_mv_kernel:
//            resident blocks with the table's short end and binary spikes as bits in shared memory
//            (in the call's scratch output where too wide, behind their summary in shared memory),
//            runs of 4 draws a lane on long rows, and a weight drawn only for an active spike. A skip
//            is one look-up of the table (NearSkip; two where ln(1 - p) is not known). A table
//            too long for a 512-thread block's share takes the wide gather: one 1,024-thread block an
//            SM with all the shared memory a block may opt in to, twice the short end, and the longer
//            skips found in global memory behind a branch. Where even that short end would miss many
//            draws (tables of ~100k entries and more), skips are decided in double precision instead
//            (ExactSkip: the same skips, table-free).
//   scatter  a block per few generated rows lists those with an active spike in the chunk; teams
//            of 1, 4 or 8 warps walk them (walk_row_team: a team round is about one expected row),
//            each lane atomicAdd-ing its synapse into the output (zeroed first here). Rows with no
//            active spike cost one read.
//   Environment knobs force each launch choice (XLAKERN_JITC_GATHER_LANES, _GATHER_ROUNDS,
//   _GATHER_SKIPS, _SCATTER_DRAWS, _SCATTER_ROWS, and XLAKERN_SPIKE_SUMMARY), to time the paths
//   against each other and to test every one.
//   dense    one thread per generated row writes its row of G (the row is zeroed first).
// The module is six translation units, which xlakern's builder compiles side by side (one file of every
// kernel took 12 s of nvcc on 2 cores, most of it the mv gather's 12 instances): jitc_cuda.cu (the entry
// points, the mv gather's plan, the mm gather, dense), jitc_cuda_scatter.cu, and the mv gather by its
// way of finding skips, jitc_cuda_mv_{shared,part,exact,wide}.cu (its kernel: jitc_cuda_gather_mv.cuh). This
// header holds what they share: the walks over a row, the skips, and the launch interfaces between them.

#pragma once

#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "event_common.h"
#include "exact_sums_cuda.cuh"
#include "jitc_common.h"

namespace xk_jitc_cuda {

using namespace xk_event;
using namespace xk_jitc;

constexpr int kThreads = 128;
constexpr int kChunk = 8;  // batch columns a scatter thread carries in registers
constexpr unsigned kFullWarp = 0xffffffffu;

// The seed may be traced, so it lives on the device: each thread reads it (one cached load)
// rather than the host copying it back, which would synchronise the stream.
struct Gen {
  const uint32_t* seed;
  const uint32_t* table;
  int64_t ntable, grows, gcols, kind;
};

// The G lanes (a power of two dividing 32) of a warp that walk one row together: their mask
// and this lane's place among them.
template <int G>
struct Lanes {
  unsigned mask;
  int sub;
  __device__ static Lanes of_thread() {
    const int lane = int(threadIdx.x) & 31;
    const unsigned bits = G == 32 ? kFullWarp : ((1u << G) - 1u);
    return Lanes{bits << (lane & ~(G - 1)), lane & (G - 1)};
  }
};

// The skip table as the mv gather reads it: ext(j) = table[j - 1] for j in [1, m] (m = ntable), with a
// sentinel at each end, ext(0) = 0 and ext(m + 1) = 2^32 - 1. Count c (skip 1 + c) is right for hash h
// when ext(m - c) <= h < ext(m - c + 1), that is T_{c+1} <= h < T_c: two look-ups and no bounds tests.
// Entries [lo, m + 2) live in shared memory (the short skips, where most draws land), the rest in the
// table in global memory. AllShared (lo == 0, the whole table fits) drops the test of which.
template <bool AllShared>
struct ExtTable {
  const uint32_t* global;
  const uint32_t* shared;
  int32_t lo, m;  // (tables hold at most kMaxSkipTable entries: int32 indices, cheaper than int64 on a GPU)
  __device__ __forceinline__ uint32_t operator()(int32_t j) const {
    if (AllShared || j >= lo) return shared[j - (AllShared ? 0 : lo)];
    return j == 0 ? 0u : __ldg(global + j - 1);
  }
  // ext(j) and ext(j + 1), j in [0, m], with the two loads issued together wherever they come from
  // (below lo both are in the table in global memory: lo <= m, so j + 1 <= m there)
  __device__ __forceinline__ void pair(int32_t j, uint32_t& first, uint32_t& second) const {
    if (AllShared || j >= lo) {
      const uint32_t* at = shared + (j - (AllShared ? 0 : lo));
      first = at[0];
      second = at[1];
    } else {
      const uint32_t a = __ldg(global + (j > 0 ? j - 1 : 0)), b = __ldg(global + j);
      first = j > 0 ? a : 0u;
      second = b;
    }
  }
};

// Copies ext's last `cached` entries into shared memory (the whole block must call this).
template <bool AllShared>
__device__ inline ExtTable<AllShared> cache_ext_table(const Gen& g, uint32_t* shared, int32_t cached) {
  const int32_t m = int32_t(g.ntable), lo = m + 2 - cached;
  for (int32_t i = threadIdx.x; i < cached; i += blockDim.x) {
    const int32_t j = lo + i;
    shared[i] = j == 0 ? 0u : (j == m + 1 ? 0xffffffffu : g.table[j - 1]);
  }
  return ExtTable<AllShared>{g.table, shared, lo, m};
}

template <bool AllShared>
__device__ inline int32_t table_skip(const ExtTable<AllShared>& ext, uint32_t h, int32_t guess);

// skip_of (jitc_common.h) through an ExtTable, in three steps: the same estimate (guess), the same two
// comparisons (right; made unconditional by the sentinels), and the same correction where the estimate
// was off (correct; rare). The mv gather's table in part (kTablePart) and any table whose ln(1 - p) is not
// known take it; NearSkip takes the others in one look-up.
struct ExtSkip {
  ExtTable<false> ext;
  float scale;  // ln 2 / ln(1 - p): the estimate's factor on the base-2 log
  __device__ __forceinline__ int32_t guess(uint32_t h) const {
    float log2_x;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(log2_x) : "f"(fmaf(float(h), 2.3283064365386963e-10f, 1.1641532182693481e-10f)));
    // no clamp at 0: the draw is below 1, so log2_x is at most the approximation's error (~2^-22) above
    // 0, and times scale (> -2^21 for any prob the tables take) above -1, which the conversion truncates to 0
    return 1 + int32_t(fminf(log2_x * scale, float(ext.m)));
  }
  __device__ __forceinline__ bool right(uint32_t h, int32_t skip) const {
    uint32_t below, above;  // ext(j) = T_{c+1} and ext(j + 1) = T_c, c = skip - 1
    ext.pair(ext.m - skip + 1, below, above);
    return (below <= h) & (h < above);
  }
  __device__ __forceinline__ int32_t correct(uint32_t h, int32_t skip) const { return table_skip(ext, h, skip); }
};

// The table's skip in one look-up, for tables of at most kNearSkipMax entries built from a known
// L = ln(1 - p) (skip_table's float64). The count c = skip - 1 is max{i <= m : T_i > h}, and
// T_i = floor(2^32 e^{iL}) > h exactly when i <= x* = log2((h + 1) 2^-32) ln 2 / L (to the 3e-15 of
// skip_table's exp). The float x below is within d of x*, d < 3.7e-7 m: float(h) and the fma put 1.7e-7
// in the log, lg2.approx at most 2 ulp of a result of at most 32 (2^-17), and times ln 2 / L (about m / 32)
// those two are under 2.5e-7 m; the product's and the scale's roundings add 1.2e-7 m (|x| <= about m).
// So d < 0.1 for m <= 2^18.
// With r the integer nearest x, clamped to [1, m], c is r or r - 1 (r itself where r was clamped down
// from above m; r - 1 = 0 where clamped up from 0), and T_r > h says which: skip = r + (T_r > h), with no
// second look-up and no correction. (m = 0: r = 1 reads ext(0) = 0, so skip 1.) Every one of the 2^32
// hashes is checked against the table for several p by tests/test_event_gpu.py (jitc_near_skips).
// MissBranches (the wide gather, whose short end serves all but a few draws in most cases: 2.5e-5 of them at
// 4M columns, K = 1,000): guess reads shared memory only and returns -r for a draw past the short end,
// whose T_r `correct` then reads in global memory behind a branch, instead of a global load predicated
// into every draw. Without it, the whole table is in shared memory.
constexpr int64_t kNearSkipMax = int64_t(1) << 18;

template <bool MissBranches>
struct NearSkip {
  ExtTable<!MissBranches> ext;
  float scale;  // ln 2 / L, rounded once
  __device__ static NearSkip of(ExtTable<!MissBranches> ext, double log_keep) {
    return NearSkip{ext, float(0.6931471805599453 / log_keep)};
  }
  __device__ __forceinline__ int32_t guess(uint32_t h) const {
    float log2_x;  // of (h + 1) 2^-32, in (2^-32, 1]
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(log2_x) : "f"(fmaf(float(h), 2.3283064365386963e-10f, 2.3283064365386963e-10f)));
    const int32_t r = max(min(__float2int_rn(log2_x * scale), ext.m), 1);
    const int32_t j = ext.m - r + 1;  // ext(j) = T_r
    if constexpr (MissBranches) {
      const uint32_t t = ext.shared[max(j - ext.lo, 0)];  // (below the short end: its first entry, unused)
      return j >= ext.lo ? r + int32_t(t > h) : -r;
    } else {
      return r + int32_t(ext.shared[j] > h);
    }
  }
  __device__ __forceinline__ bool right(uint32_t, int32_t skip) const { return !MissBranches || skip > 0; }
  // a draw past the short end (skip = -r): the same one look-up, in global memory (ext(j) with j >= 1)
  __device__ __forceinline__ int32_t correct(uint32_t h, int32_t skip) const {
    return skip > 0 ? skip : -skip + int32_t(ext(ext.m + skip + 1) > h);
  }
};

// The table's skip for hash h, stepped to from a guess (a few steps when the guess is close).
template <bool AllShared>
__device__ inline int32_t table_skip(const ExtTable<AllShared>& ext, uint32_t h, int32_t guess) {
  const int32_t m = ext.m;
  int32_t c = guess - 1;
  while (c < m && ext(m - c) > h) ++c;
  while (c > 0 && ext(m - c + 1) <= h) --c;
  return 1 + c;
}

// skip_of without the table, for tables so long that only their short end fits shared memory (4M
// columns at K = 80: 1.1M entries, 58% of the look-ups in L2). The table holds T_i = floor(y_i) as
// skip_table computed them in float64, y_i = 2^32 e^{iL}, L = ln(1 - p); T_i > h exactly when
// y_i >= h + 1. So count c is right when y_c >= h + 1 > y_{c+1} (y_0 = 2^32 always passes, and past the
// table's end nothing does). Here y_c = P2[c >> 20] P1[(c >> 10) % 1024] P0[c % 1024], products of exp()
// in double kept in shared memory (fill_powers): it is within 1e-14 of the exact value, as numpy's y_i
// are within 3e-15, so each comparison that holds with a relative margin of kExactMargin holds for the
// table too. The float estimate gives c (off by one for a few percent of draws, which a step of the
// powers fixes); draws within the margin (about 2e-12 / p of them: none in practice) take the table.
// A draw costs three shared loads and a few double-precision products, and no L2 access.
// guess returns the skip, negated where the table must decide (right says which).
constexpr int kPowLow = 1024, kPowHigh = 34;  // c < 2^25 (kMaxSkipTable): (c + 1) >> 20 <= 32
constexpr int kPowDoubles = 2 * kPowLow + kPowHigh;
constexpr double kExactMargin = 1e-12;

// Each block's powers in shared memory: e^{dL}, e^{b 2^10 L}, 2^32 e^{a 2^20 L}.
__device__ inline const double* fill_powers(double* pw, double log_keep) {
  for (int i = threadIdx.x; i < kPowDoubles; i += blockDim.x) {
    const int part = i < kPowLow ? 0 : (i < 2 * kPowLow ? 1 : 2);
    const int64_t step = int64_t(i - part * kPowLow) << (10 * part);
    pw[i] = (part == 2 ? 4294967296.0 : 1.0) * exp(double(step) * log_keep);
  }
  return pw;
}

struct ExactSkip {
  ExtTable<false> ext;  // for the draws too close to call
  const double* pw;     // fill_powers'
  double keep;          // e^L = 1 - p
  float scale;          // ln 2 / L: the float estimate's factor on the base-2 log
  // keep and scale derived from L = log_keep, in one place for every caller
  __device__ static ExactSkip of(ExtTable<false> ext, const double* pw, double log_keep) {
    return ExactSkip{ext, pw, exp(log_keep), float(0.6931471805599453 / log_keep)};
  }
  __device__ __forceinline__ double y(int32_t c) const {
    return pw[2 * kPowLow + (c >> 20)] * pw[kPowLow + ((c >> 10) & (kPowLow - 1))] * pw[c & (kPowLow - 1)];
  }
  __device__ __forceinline__ int32_t guess(uint32_t h) const {
    float log2_x;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(log2_x) : "f"(fmaf(float(h), 2.3283064365386963e-10f, 1.1641532182693481e-10f)));
    const int32_t m = ext.m;
    int32_t c = int32_t(fminf(fmaxf(log2_x * scale, 0.f), float(m)));
    const double n1 = double(h) + 1.0, lo = n1 * (1.0 - kExactMargin), hi = n1 * (1.0 + kExactMargin);
    double yc = y(c), yn = yc * keep;
    while (c > 0 && yc < lo) {
      --c;
      yn = yc;
      yc = y(c);
    }
    while (c < m && yn >= hi) {
      ++c;
      yc = yn;
      yn = y(c + 1);
    }
    const bool sure = (c == 0 || yc >= hi) && (c == m || yn < lo);
    return sure ? 1 + c : -(1 + c);
  }
  __device__ __forceinline__ bool right(uint32_t, int32_t skip) const { return skip > 0; }
  __device__ __forceinline__ int32_t correct(uint32_t h, int32_t skip) const {
    return skip > 0 ? skip : table_skip(ext, h, -skip);
  }
};

// A synapse's weight: the scalar kind's is one value for every synapse, computed once and with no
// weight draw (a branch the whole warp takes the same way); the others draw h2 = draw(key, 2k + 1).
template <typename A>
struct Weights {
  A a, b, w_scalar;
  int64_t kind;
  const A* q;
  __device__ Weights(const A* params, int64_t kind_, const A* q_)
      : a(params[0]), b(params[1]), w_scalar(weight_of(a, b, kScalar, 0u, q_)), kind(kind_), q(q_) {}
  __device__ A of(uint32_t key, uint32_t k) const {
    return kind == kScalar ? w_scalar : weight_of(a, b, kind, draw(key, 2u * k + 1u), q);
  }
};

// One step of an inclusive scan over a group of G lanes: x plus the x of the lane d below, where that
// lane is in the group. The shuffle's own predicate says so, which saves a compare and a select a step.
template <int G>
__device__ __forceinline__ int32_t scan_step(int32_t x, unsigned d, unsigned mask) {
  int32_t sum = x;
  asm("{\n\t.reg .s32 t;\n\t.reg .pred p;\n\tshfl.sync.up.b32 t|p, %1, %2, %3, %4;\n\t@p add.s32 %0, t, %0;\n\t}"
      : "+r"(sum)
      : "r"(x), "r"(d), "r"((32 - G) << 8), "r"(mask));
  return sum;
}

// The skips of U draws (draw k_of(u) for u < U): their fast paths first, with no branch between them (so
// their hashes and loads overlap), then the rare corrections.
template <int U, typename Skip, typename K>
__device__ __forceinline__ void draw_skips(uint32_t key, const Skip& skip, K&& k_of, int32_t (&skips)[U]) {
  uint32_t h[U];
  bool ok = true;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    h[u] = draw(key, 2u * k_of(u));
    skips[u] = skip.guess(h[u]);
    ok &= skip.right(h[u], skips[u]);  // (& : no branch)
  }
  if (!ok) {
#pragma unroll
    for (int u = 0; u < U; ++u) skips[u] = skip.correct(h[u], skips[u]);
  }
}

// for_each_synapse, walked by G lanes: round t covers draws k = t G + sub. A lane's column is the
// previous round's last column plus the inclusive scan of the round's skips, the same sums the
// one-thread walk makes. Columns grow with the lane, so the lanes at gcols or past it are the
// round's last ones; they are dropped and the walk ends after that round. skip(h) is skip_of for the
// draw's hash, as skip.guess, then skip.right, and skip.correct where that failed (the caller picks how
// it reads the table). f(col, k) is called by the lane that holds
// synapse k (the draw's index: its weight is wt.of(key, k), drawn only where the caller needs it), in
// the order of its draws. U rounds are drawn and scanned together: their hashes, table look-ups and
// shuffles are independent, so a row costs one latency chain per U rounds (at the price of up to
// U G - 1 draws past the row's end). Col is int64_t, or int32_t where the caller made sure that
// gcols + U G (ntable + 1) fits it (cheaper sums and compares). Every lane of `lanes` must call this.
template <int G, int U, typename Col, typename Skip, typename F>
__device__ inline void walk_row(Lanes<G> lanes, uint32_t key, Col gcols, Skip&& skip, F&& f) {
  Col base = -1;  // the column of the previous round's last draw (-1 before the first)
  for (uint32_t k0 = 0;; k0 += uint32_t(U * G)) {
    // at most 32 (kMaxSkipTable + 1) < 2^31: the scan cannot overflow
    int32_t prefix[U];
    draw_skips<U>(key, skip, [&](int u) { return k0 + uint32_t(u * G + lanes.sub); }, prefix);
#pragma unroll
    for (int d = 1; d < G; d <<= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u) prefix[u] = scan_step<G>(prefix[u], unsigned(d), lanes.mask);
    }
    bool inside = true;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const Col col = base + Col(prefix[u]);
      inside = col < gcols;  // false from the round that passes gcols on (columns only grow)
      if (inside) f(col, k0 + uint32_t(u * G + lanes.sub));
      base += Col(__shfl_sync(lanes.mask, prefix[u], G - 1, G));
    }
    if (!__all_sync(lanes.mask, inside)) return;
  }
}

// walk_row for a whole warp with each lane taking R consecutive draws a round (lane l: draws k0 + R l to
// k0 + R l + R - 1): a lane sums its R skips in order, and one scan of the lanes' sums places them all,
// where walk_row<32, R> would scan each of its R rounds (about 13 instructions a draw against 5 here;
// the mv gather at K = 1,000 ran 12-17% faster for it on an H100, bench/RESULTS.md session 31). The
// same draws and the same sums, so the same columns; only the lane that holds a synapse changes (and
// with it the order of a gather's adds). Col int32_t needs gcols + 32 R (ntable + 1) to fit it, as
// walk_row<32, R> does; a round's sum (at most 32 R (ntable + 1)) then fits an int32 too.
template <int R, typename Col, typename Skip, typename F>
__device__ inline void walk_row_runs(uint32_t key, Col gcols, Skip&& skip, F&& f) {
  const uint32_t first = uint32_t(int(threadIdx.x) & 31) * uint32_t(R);
  Col base = -1;  // the column of the previous round's last draw (-1 before the first)
  for (uint32_t k0 = first;; k0 += uint32_t(32 * R)) {
    int32_t run[R];
    draw_skips<R>(key, skip, [&](int u) { return k0 + uint32_t(u); }, run);
#pragma unroll
    for (int u = 1; u < R; ++u) run[u] += run[u - 1];
    int32_t upto = run[R - 1];  // becomes the sum of the skips of every lane up to this one
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) upto = scan_step<32>(upto, unsigned(d), kFullWarp);
    const Col start = base + Col(upto - run[R - 1]);
    base += Col(__shfl_sync(kFullWarp, upto, 31));  // the round's last column, in every lane
    if (base < gcols) {  // every round but a row's last: no draw passes the row's end, so no test a draw
#pragma unroll
      for (int u = 0; u < R; ++u) f(start + Col(run[u]), k0 + uint32_t(u));
    } else {
#pragma unroll
      for (int u = 0; u < R; ++u) {
        const Col col = start + Col(run[u]);
        if (col < gcols) f(col, k0 + uint32_t(u));
      }
      return;
    }
  }
}

// skip_of through a table in global memory (the walks of the mm gather and of the scatter): its guess is
// the answer.
struct GlobalSkip {
  const uint32_t* table;
  int64_t ntable;
  float inv_log_keep;
  __device__ int32_t guess(uint32_t h) const { return int32_t(skip_of(h, table, ntable, inv_log_keep)); }
  __device__ bool right(uint32_t, int32_t) const { return true; }
  __device__ int32_t correct(uint32_t, int32_t skip) const { return skip; }
};

// Waits for the T warps of a team (a named barrier: id 0 is __syncthreads's).
__device__ inline void team_sync(int id, int threads) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory"); }

// walk_row for a team of T warps (T > 1), which walks one row together: a team round covers U T 32
// draws, u-th block of T 32 first, and inside it warp w's 32. Each warp scans its own 32 skips per u,
// publishes the 32-draw totals in `totals` (two halves alternate between rounds, so a round's writes
// never meet the previous round's reads: one barrier a round), and adds the totals before its own.
// `half` carries the alternation from one row to the team's next, which a fast warp may start while
// a slow one still reads the last round's totals.
// The same skips summed in the same draw order as walk_row, in int64: the same columns, so the same
// synapses; a long row then costs U T 32 draws per dependent round, spread over T warps.
template <int T, int U, typename Table, typename F>
__device__ inline void walk_row_team(int64_t (*totals)[U * T], uint32_t& half, int barrier, int warp_in_team,
                                     uint32_t key, int64_t gcols, const Table& table, int64_t ntable,
                                     float inv_log_keep, F&& f) {
  static_assert(U * T <= 32, "a team round's totals are scanned by one warp");
  const int lane = int(threadIdx.x) & 31;
  int64_t base = -1;
  for (uint32_t k0 = 0;; k0 += uint32_t(U * T * 32)) {
    half ^= 1u;
    int32_t prefix[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      prefix[u] = int32_t(skip_of(draw(key, 2u * (k0 + uint32_t((u * T + warp_in_team) * 32 + lane))), table, ntable,
                                  inv_log_keep));
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u) prefix[u] = scan_step<32>(prefix[u], unsigned(d), kFullWarp);
    }
    if (lane == 31) {
#pragma unroll
      for (int u = 0; u < U; ++u) totals[half][u * T + warp_in_team] = prefix[u];
    }
    team_sync(barrier, T * 32);
    // lane i holds block i's total; an inclusive int64 scan gives each block's end
    int64_t end = lane < U * T ? totals[half][lane] : 0;
#pragma unroll
    for (int d = 1; d < U * T; d <<= 1) {
      const int64_t below = __shfl_up_sync(kFullWarp, end, unsigned(d));
      if (lane >= d) end += below;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = u * T + warp_in_team;
      const int64_t before = b == 0 ? 0 : __shfl_sync(kFullWarp, end, b - 1);
      const int64_t col = base + before + prefix[u];
      if (col < gcols) f(col, k0 + uint32_t((u * T + warp_in_team) * 32 + lane));
    }
    base += __shfl_sync(kFullWarp, end, U * T - 1);  // the round's last column: the same in every warp
    if (base >= gcols) return;
  }
}

// Expected synapses of a generated row, gcols p. The table lives on the device, so p comes from its
// length: it holds floor(2^32 (1-p)^i) >= 1 for i = 1..n, so n is about 32 ln 2 / -ln(1-p) (an empty
// table: p = 1).
inline double expected_row(int64_t ntable, int64_t gcols) {
  const double p = ntable == 0 ? 1.0 : -std::expm1(-32.0 * std::log(2.0) / double(ntable));
  return double(gcols) * p;
}

constexpr int kMvThreads = 512;  // the mv gather's block (two an SM)
constexpr int kMvWideThreads = 1024;  // the wide mv gather's (one an SM, with all its shared memory)

// How the mv gather finds a skip: the table wholly in shared memory, its short end there (the rest in
// global memory), ExactSkip (the table only for draws too close to call), or the short end of the
// wide gather, which holds twice the entries in a block of twice the threads and finds the rest behind
// a branch (NearSkip's MissBranches).
enum MvSkips : int { kTableShared = 0, kTablePart = 1, kExact = 2, kTableWide = 3 };

// A block's threads in the mv gather that finds skips the `Skips` way.
__host__ __device__ constexpr int mv_threads(int skips) { return skips == kTableWide ? kMvWideThreads : kMvThreads; }

// What launch_gather_mv decided to put in a block's shared memory, and how the walk finds skips.
struct MvPlan {
  int skips = kTableShared;          // MvSkips
  int32_t cached = 0;                // entries of the extended table
  int64_t bits = 0;                  // words of bitmask (binary spikes that fit)
  int32_t summary_words = 0;         // words of summary of the bits in global memory
  uint32_t* global_bits = nullptr;   // in the call's scratch: pack_bits writes them, the gather reads them
  uint32_t* global_summary = nullptr;
};

// One product's operands, as jitc_mv checked them, for the launchers in the other translation units.
struct Product {
  Gen g;
  xk::Tensor params, qtable, spikes, out;
  int64_t batch;
  bool binary;
  cudaStream_t st;
};

// Calls f(params, qtable, spikes, out, rule) with the product's typed pointers (A the accumulator, S the
// spikes' storage): each unit instantiates its kernels for the types its module was built with.
template <typename F>
void with_typed_operands(const Product& p, F&& f) {
  dispatch_accumulator(p.params.dtype(), [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_spikes(p.spikes, p.binary, p.params.dtype(), [&](auto stag, auto rule) {
      using S = typename decltype(stag)::type;
      f(p.params.data_ptr<A>(), p.qtable.data_ptr<A>(), p.spikes.data_ptr<S>(), p.out.data_ptr<A>(), rule);
    });
  });
}

// The scatter (jitc_cuda_scatter.cu): the output was cleared (after_clear: by a launch it must wait for).
void launch_scatter_product(const Product& p, bool after_clear, const GpuLimits& gpu);
// The scatter with reproducible sums in `sums` (exact_sums_cuda.cuh): writes every output, cleared or not.
void launch_exact_scatter_product(const Product& p, ExactSums sums, const GpuLimits& gpu);

// The mv gather as planned (jitc_cuda_mv_*.cu, one file per MvSkips): `lanes` a row and `rounds` of
// draws a lane, with `budget` bytes of shared memory a block may opt in to.
template <int Skips>
void launch_gather_mv_planned(const Product& p, int lanes, int rounds, const MvPlan& plan, int64_t budget,
                              double log_keep);

}  // namespace xk_jitc_cuda
