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
//            runs of 4 draws a lane on long rows, and a weight drawn only for an active spike. Where
//            the table's short end would miss many draws (tables of ~100k entries and more), skips
//            are decided in double precision instead (ExactSkip: the same skips, table-free).
//   scatter  a block per few generated rows lists those with an active spike in the chunk; teams
//            of 1, 4 or 8 warps walk them (walk_row_team: a team round is about one expected row),
//            each lane atomicAdd-ing its synapse into the output (zeroed first here). Rows with no
//            active spike cost one read.
//   Environment knobs force each launch choice (XLAKERN_JITC_GATHER_LANES, _GATHER_ROUNDS,
//   _GATHER_SKIPS, _SCATTER_DRAWS, _SCATTER_ROWS, and XLAKERN_SPIKE_SUMMARY), to time the paths
//   against each other and to test every one.
//   dense    one thread per generated row writes its row of G (the row is zeroed first).

#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "event_common.h"
#include "jitc_common.h"

namespace {

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
// was off (correct; rare).
template <bool AllShared>
struct ExtSkip {
  ExtTable<AllShared> ext;
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

// G lanes per generated row; block b, thread t: row (b kThreads + t) / G, batch chunk blockIdx.y of
// kGatherChunk columns. A row is walked once per chunk, so the chunk is wide (16 columns: a batch of 16
// walks each row once); a synapse's weight is drawn only when one of its chunk's spikes is active.
constexpr int kGatherChunk = 16;

// A chunk's kGatherChunk spikes of column c, as 16-byte loads where the launcher found every chunk whole
// and aligned (`vec`, the same in every thread: a uniform branch), else one load a spike.
template <typename S>
__device__ __forceinline__ void load_chunk(const S* s, int nb, bool vec, S (&sv)[kGatherChunk]) {
  static_assert(kGatherChunk * sizeof(S) % 16 == 0, "a chunk is whole 16-byte words");
  if (vec) {
    constexpr int kWords = kGatherChunk * sizeof(S) / 16;
    uint4 raw[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = __ldg(reinterpret_cast<const uint4*>(s) + i);
    memcpy(sv, raw, sizeof(raw));
  } else {
#pragma unroll
    for (int j = 0; j < kGatherChunk; ++j) sv[j] = j < nb ? s[j] : S(0);  // a zero spike is inactive under both rules
  }
}

template <int G, typename A, typename S, bool Binary>
__global__ void gather_kernel(Gen g, const A* params, const A* q, const S* spk, A* out, int64_t batch,
                              SpikeRule<S, Binary> rule, bool vec) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  const int64_t j0 = int64_t(blockIdx.y) * kGatherChunk;
  if (r >= g.grows) return;  // the whole group: its lanes share r
  const int nb = int(batch - j0 < kGatherChunk ? batch - j0 : kGatherChunk);
  const Lanes<G> lanes = Lanes<G>::of_thread();
  A acc[kGatherChunk];
#pragma unroll
  for (int j = 0; j < kGatherChunk; ++j) acc[j] = A(0);
  const Weights<A> wt(params, g.kind, q);
  const uint32_t key = row_key(*g.seed, uint32_t(r));
  const GlobalSkip skip{g.table, g.ntable, inv_log_keep_of(g.table, g.ntable)};
  walk_row<G, 1>(lanes, key, g.gcols, skip, [&](int64_t c, uint32_t k) {
    S sv[kGatherChunk];
    load_chunk(spk + c * batch + j0, nb, vec, sv);
    bool any = false;
#pragma unroll
    for (int j = 0; j < kGatherChunk; ++j) any = any || rule.active(sv[j]);
    if (!any) return;
    const A w = wt.of(key, k);
#pragma unroll
    for (int j = 0; j < kGatherChunk; ++j)
      if (rule.active(sv[j])) acc[j] += w * rule.template value<A>(sv[j]);
  });
#pragma unroll
  for (int j = 0; j < kGatherChunk; ++j) {
    if (j < nb) {
#pragma unroll
      for (int d = G / 2; d > 0; d >>= 1) acc[j] += __shfl_down_sync(lanes.mask, acc[j], unsigned(d), G);
      if (lanes.sub == 0) out[r * batch + j0 + j] = acc[j];
    }
  }
}

constexpr int kMvThreads = 512;  // the mv gather's block

// How the mv gather finds a skip: the table wholly in shared memory, its short end there (the rest in
// global memory), or ExactSkip (the table only for draws too close to call).
enum MvSkips : int { kTableShared = 0, kTablePart = 1, kExact = 2 };

// gather_mv_kernel's rows, once shared memory is filled: each group of G lanes walks its rows with `skip`.
template <int G, int U, typename Skip, typename A, typename S, bool Binary>
__device__ inline void gather_mv_rows(const Gen& g, const Skip& skip, const A* params, const A* q, const S* spk, A* out,
                                      SpikeRule<S, Binary> rule, const uint32_t* mask, int64_t bits,
                                      const uint32_t* __restrict__ global_bits, int32_t summary_words) {
  const Lanes<G> lanes = Lanes<G>::of_thread();
  const Weights<A> wt(params, g.kind, q);
  const uint32_t seed = *g.seed;
  const int32_t gcols = int32_t(g.gcols);
  const int32_t groups = int32_t(gridDim.x) * (kMvThreads / G);
  for (int32_t r = int32_t((blockIdx.x * kMvThreads + threadIdx.x) / G); r < int32_t(g.grows); r += groups) {
    const uint32_t key = row_key(seed, uint32_t(r));
    A acc = A(0);
    // U draws at once: runs of U a lane (G = 32), which place a round's 32 U draws with one scan
    auto walk = [&](auto&& f) {
      if constexpr (U > 1) walk_row_runs<U>(key, gcols, skip, f);
      else walk_row<G, 1>(lanes, key, gcols, skip, f);
    };
    // a synapse's weight is drawn only when its spike is active; the test is chosen once a row
    // (a branch outside the walk, not one per synapse)
    if (Binary && bits > 0 && g.kind == kScalar) {
      // one weight for every synapse: a set bit adds it, with no weight draw and no branch a synapse
      const A w = wt.w_scalar;
      walk([&](int32_t c, uint32_t) {
        if ((mask[c >> 5] >> (c & 31)) & 1u) acc += w;  // (a predicated add)
      });
    } else if (Binary && bits > 0) {
      walk([&](int32_t c, uint32_t k) {
        if ((mask[c >> 5] >> (c & 31)) & 1u) acc += wt.of(key, k);
      });
    } else if (Binary && global_bits != nullptr) {
      walk([&](int32_t c, uint32_t k) {
        if ((summary_words == 0 || summary_has(mask, c)) && ((__ldg(global_bits + (c >> 5)) >> (c & 31)) & 1u))
          acc += wt.of(key, k);
      });
    } else {
      walk([&](int32_t c, uint32_t k) {
        const S v = spk[c];
        if (rule.active(v)) acc += wt.of(key, k) * rule.template value<A>(v);
      });
    }
#pragma unroll
    for (int d = G / 2; d > 0; d >>= 1) acc += __shfl_down_sync(lanes.mask, acc, unsigned(d), G);
    if (lanes.sub == 0) out[r] = acc;
  }
}

// The gather of one spike column (mv). Blocks stay resident and stride over the rows, so what they
// put in shared memory once serves many rows: the skip table (whole, or its short end) and, for binary
// spikes that fit, the spikes as a bitmask (a warp's 32 tests at scattered columns then cost a few bank
// conflicts instead of a global load each). Wider spikes are tested as bits in global memory, behind
// their summary in shared memory (event_common.h) where it fits. Shared memory holds `cached` entries
// of the extended table, then `bits` words of bitmask or `summary_words` of summary. Columns are int32
// (the launcher checks they fit), and every draw's cost is counted: this walk is the whole kernel, and
// at K = 1,000 it is bound by instructions issued.
template <int G, int U, int Skips, typename A, typename S, bool Binary>
__global__ void __launch_bounds__(kMvThreads) gather_mv_kernel(Gen g, const A* params, const A* q, const S* spk,
                                                               A* out, SpikeRule<S, Binary> rule, int32_t cached,
                                                               int64_t bits, const uint32_t* __restrict__ global_bits,
                                                               const uint32_t* __restrict__ global_summary,
                                                               int32_t summary_words, double log_keep) {
  extern __shared__ __align__(16) uint32_t smem[];
  constexpr int pow_words = Skips == kExact ? 2 * kPowDoubles : 0;  // ExactSkip's powers come first
  const auto ext = cache_ext_table<Skips == kTableShared>(g, smem + pow_words, cached);
  uint32_t* mask = smem + pow_words + cached;  // the bitmask, or the summary of the bits in global memory
  const double* pw = Skips == kExact ? fill_powers(reinterpret_cast<double*>(smem), log_keep) : nullptr;
  if constexpr (Binary) {
    for (int64_t w = threadIdx.x; w < bits; w += blockDim.x) mask[w] = spike_word(spk, w * 32, g.gcols, rule);
    for (int32_t w = threadIdx.x; w < summary_words; w += blockDim.x) mask[w] = global_summary[w];
  }
  __syncthreads();
  if constexpr (Skips == kExact)
    gather_mv_rows<G, U>(g, ExactSkip::of(ext, pw, log_keep), params, q, spk, out, rule, mask, bits, global_bits,
                         summary_words);
  else
    gather_mv_rows<G, U>(g, ExtSkip<Skips == kTableShared>{ext, 0.69314718f * inv_log_keep_of(g.table, g.ntable)},
                         params, q, spk, out, rule, mask, bits, global_bits, summary_words);
}

// The scatter: a block of kScatterWarps warps per `rows` generated rows (and chunk of batch columns).
// Thread t reads row t's spikes; the rows with an active one are listed in shared memory, and teams
// of T warps take them in turn: a team walks one row (walk_row for one warp, walk_row_team for more),
// each lane atomicAdd-ing its synapses into the output (zeroed first). Long rows get wide teams, so a
// row of a thousand synapses is one or two dependent rounds, not thirty; the host picks `rows` so that
// the GPU has blocks enough to spread the active rows over its SMs.
constexpr int kScatterWarps = 8;
constexpr int kScatterThreads = kScatterWarps * 32;

template <int T, int U, typename A, typename S, bool Binary>
__global__ void __launch_bounds__(kScatterThreads, 3) scatter_kernel(Gen g, const A* params, const A* q, const S* spk,
                                                                  A* out, int64_t batch, SpikeRule<S, Binary> rule,
                                                                  int rows) {
  constexpr int kTeams = kScatterWarps / T;
  __shared__ int32_t listed[kScatterThreads];  // the block's rows with an active spike (offsets)
  __shared__ int32_t per_warp[kScatterWarps];
  __shared__ int64_t totals[kTeams][2][U * T];
  pdl_hold_grid();
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t r0 = int64_t(blockIdx.x) * rows;
  const int64_t j0 = int64_t(blockIdx.y) * kChunk;
  const int nb = int(batch - j0 < kChunk ? batch - j0 : kChunk);
  bool any = false;
  if (tid < rows && r0 + tid < g.grows) {
    const S* s = spk + (r0 + tid) * batch + j0;
    for (int j = 0; j < nb; ++j) any = any || rule.active(s[j]);
  }
  const unsigned ballot = __ballot_sync(kFullWarp, any);  // only the rows of active spikes are generated
  if (lane == 0) per_warp[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, listed_n = 0;
#pragma unroll
  for (int w = 0; w < kScatterWarps; ++w) {
    before += w < warp ? per_warp[w] : 0;
    listed_n += per_warp[w];
  }
  if (any) listed[before + __popc(ballot & ((1u << lane) - 1u))] = tid;
  __syncthreads();
  if (listed_n == 0) return;  // the whole block
  const uint32_t seed = *g.seed;
  const float inv_log_keep = inv_log_keep_of(g.table, g.ntable);
  const Weights<A> wt(params, g.kind, q);
  const int team = warp / T;
  uint32_t half = 0;  // walk_row_team's alternation of its totals' halves, kept across the team's rows
  bool cleared = false;
  for (int i = team; i < listed_n; i += kTeams) {
    const int64_t r = r0 + listed[i];
    const uint32_t key = row_key(seed, uint32_t(r));
    const S* s = spk + r * batch + j0;  // the same addresses in every lane: one broadcast load each
    S sv[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) sv[j] = j < nb ? s[j] : S(0);
    auto add = [&](int64_t c, uint32_t k) {
      const A w = wt.of(key, k);
      if (!cleared) {  // the output's clear has finished (clear_before_adds)
        pdl_wait();
        cleared = true;
      }
      A* o = out + c * batch + j0;
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (j < nb && rule.active(sv[j])) atomicAdd(o + j, w * rule.template value<A>(sv[j]));
    };
    if constexpr (T == 1)
      walk_row<32, U>(Lanes<32>::of_thread(), key, g.gcols, GlobalSkip{g.table, g.ntable, inv_log_keep}, add);
    else
      walk_row_team<T, U>(totals[team], half, 1 + team, warp % T, key, g.gcols, g.table, g.ntable, inv_log_keep,
                          add);
  }
}

template <typename A>
__global__ void dense_kernel(Gen g, const A* params, const A* q, A* out) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= g.grows) return;
  A* row = out + r * g.gcols;
  for_each_synapse(*g.seed, r, g.gcols, g.table, g.ntable, g.kind, params[0], params[1], q,
                   [&](int64_t c, A w) { row[c] = w; });
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// Expected synapses of a generated row, gcols p. The table lives on the device, so p comes from its
// length: it holds floor(2^32 (1-p)^i) >= 1 for i = 1..n, so n is about 32 ln 2 / -ln(1-p) (an empty
// table: p = 1).
double expected_row(int64_t ntable, int64_t gcols) {
  const double p = ntable == 0 ? 1.0 : -std::expm1(-32.0 * std::log(2.0) / double(ntable));
  return double(gcols) * p;
}

// Lanes per row of the gather. A group of G lanes wastes about G/2 draws on the round that passes the
// row's end (and adds its lanes' sums at the end), so G is the widest that keeps that waste under a
// quarter of the expected row: 1 lane (the CPU's walk) below 16 synapses, 8 below 64, else 32. Fewer
// threads than kBusyThreads leave the GPU idle (an H100 holds about 270k), so there the rows get wider
// groups: the rounds they save cost nothing. XLAKERN_JITC_GATHER_LANES = 1, 8 or 32 forces G.
constexpr int64_t kBusyThreads = int64_t(1) << 17;
int gather_lanes(int64_t ntable, int64_t grows, int64_t gcols) {
  if (const int lanes = forced_choice("XLAKERN_JITC_GATHER_LANES", {1, 8, 32})) return lanes;
  const double per_row = expected_row(ntable, gcols);
  int lanes = per_row < 16.0 ? 1 : (per_row < 64.0 ? 8 : 32);
  while (lanes < 32 && grows * lanes < kBusyThreads) lanes = lanes == 1 ? 8 : 32;
  return lanes;
}

// Draws a lane of a 32-lane mv gather takes a round (walk_row_runs' R; 1 is walk_row): 4 when rows are
// long enough that the up to 127 draws past a row's end cost little (expected row >= 256), else 1.
// XLAKERN_JITC_GATHER_ROUNDS = 1 or 4 forces it.
int gather_rounds(int64_t ntable, int64_t gcols) {
  if (const int rounds = forced_choice("XLAKERN_JITC_GATHER_ROUNDS", {1, 4})) return rounds;
  return expected_row(ntable, gcols) >= 256.0 ? 4 : 1;
}

// Draws a scatter team takes a round (T warps x U rounds x 32 lanes): near the expected row, so most
// rows are one dependent round, without many draws past their end: 32 (one warp, one round) below 48
// synapses, 128 (one warp, 4 rounds) below 192, 512 (4 warps) below 768, else 1024 (8 warps).
// XLAKERN_JITC_SCATTER_DRAWS = 32, 128, 512 or 1024 forces it.
int scatter_draws(int64_t ntable, int64_t gcols) {
  if (const int draws = forced_choice("XLAKERN_JITC_SCATTER_DRAWS", {32, 128, 512, 1024})) return draws;
  const double per_row = expected_row(ntable, gcols);
  return per_row < 48.0 ? 32 : (per_row < 192.0 ? 128 : (per_row < 768.0 ? 512 : 1024));
}

// Rows a scatter block reads (a power of two, up to one a thread).
// One-warp teams (8 a block; rows under 192 synapses): the fewest rows that keep the grid to 3 blocks an
// SM, one wave of resident blocks. Most blocks find no active row, but each costs its launch, its spike
// reads and two barriers. H200, graph loops, K = 80, medians of 2-3 processes a setting: 40k rows from 32
// a block (1,250 blocks) to 128, 11.3 to 9.0 µs a step at 1% active and 13.5 to 12.1 at 5%; 4k rows from 2
// to 16, 10.5 to 8.0 at 1% and 9.8 to 8.1 at 5%. Fewer blocks still (256 rows a block) were slower at 5%:
// a block's 8 warps then walk several active rows each (bench/RESULTS.md, session 51).
// Four-warp teams (2 a block): the most rows that still leave about 8 blocks an SM, so that a block
// rarely draws more than one or two of the active rows while the other sits idle (at 40k rows of 300,
// 1%, fewer blocks were no faster).
// One team a block (8 warps, rows of ~768 synapses and more), which walks its active rows one after
// another: 16 rows, doubled while that leaves more than 48 blocks an SM (blocks that find no active row
// still cost their launch). H100, K = 1,000, graph loops: at 1% of rows active, 40k rows (16) 25 µs a step
// against 25-29 at the former 32, 400k rows (64) 68-72 against 75-78 at the former 256; at 5%, 49-54
// against 75-77 and 256-260 against 277 (bench/RESULTS.md, session 31).
// XLAKERN_JITC_SCATTER_ROWS forces it.
int scatter_rows(int64_t grows, int64_t batch_chunks, int team_warps, int64_t sms) {
  if (const int rows = forced_choice("XLAKERN_JITC_SCATTER_ROWS", {1, 2, 4, 8, 16, 32, 64, 128, 256})) return rows;
  auto blocks = [&](int64_t rows) { return (grows + rows - 1) / rows * batch_chunks; };
  int rows = 1;
  if (team_warps == kScatterWarps) {
    rows = 16;
    while (rows < kScatterThreads && blocks(rows) > sms * 48) rows *= 2;
  } else if (team_warps == 1) {
    while (rows < kScatterThreads && blocks(rows) > sms * 3) rows *= 2;
  } else {
    while (rows < kScatterThreads && blocks(2 * rows) >= sms * 8) rows *= 2;
  }
  return rows;
}

template <int T, int U, typename A, typename S, bool Binary>
void launch_scatter(const Gen& g, const A* p, const A* q, const S* v, A* o, int64_t batch, SpikeRule<S, Binary> rule,
                    unsigned chunks, bool after_clear, const GpuLimits& gpu, cudaStream_t st) {
  const int rows = scatter_rows(g.grows, chunks, T, gpu.sms);
  const dim3 grid(unsigned((g.grows + rows - 1) / rows), chunks);
  launch_after_clear(after_clear, scatter_kernel<T, U, A, S, Binary>, grid, dim3(kScatterThreads), 0, st, g, p, q,
                     v, o, batch, rule, rows);
}

// Shared memory an mv gather block asks for at most: two such blocks fit an H100 or H200 SM (228 KiB,
// 1 KiB of it reserved a block). The bitmask takes what it needs (every draw tests a spike) and leaves
// at least kMvMinTable entries of the table's short end (where nearly all look-ups land).
constexpr int64_t kMvSharedBudget = 110 * 1024;
constexpr int64_t kMvMinTable = 2048;

// Whether gather_mv_kernel's int32 columns and rows hold this walk: its sums reach gcols plus a round
// of U G skips of at most ntable + 1 each, and its rows grow by at most the grid's threads past grows.
bool mv_fits_int32(const Gen& g, int U, int G) {
  const int64_t limit = int64_t(INT32_MAX);
  return g.gcols + int64_t(U) * G * (g.ntable + 1) < limit && g.grows + (int64_t(1) << 24) < limit;
}

// What launch_gather_mv decided to put in a block's shared memory, and how the walk finds skips.
struct MvPlan {
  int skips = kTableShared;          // MvSkips
  int32_t cached = 0;                // entries of the extended table
  int64_t bits = 0;                  // words of bitmask (binary spikes that fit)
  int32_t summary_words = 0;         // words of summary of the bits in global memory
  uint32_t* global_bits = nullptr;   // in the call's scratch: pack_bits writes them, the gather reads them
  uint32_t* global_summary = nullptr;
};

// Launches gather_mv_kernel<G, U> as planned, with as many resident blocks as fit the GPU (no more than
// the rows need), packing the spikes first where the plan reads them as bits in global memory. ExactSkip
// leaves shared memory nearly empty, and there the summary is dropped where it would cost resident
// blocks (XLAKERN_SPIKE_SUMMARY = 2 keeps it): at 4M columns (K = 80) a gather with exact skips was
// 12% faster without it (H100, 2.72 against 3.04 ms; a first, log-based ExactSkip).
template <int G, int U, int Skips, typename A, typename S, bool Binary>
void launch_gather_mv_as(const Gen& g, const A* p, const A* q, const S* v, A* o, SpikeRule<S, Binary> rule,
                         MvPlan plan, int64_t budget, double log_keep, cudaStream_t st) {
  auto* kernel = gather_mv_kernel<G, U, Skips, A, S, Binary>;
  if (budget > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget)) != cudaSuccess) {
    (void)cudaGetLastError();  // mv_shared_budget asked already; a refusal shows as the launch error
  }
  const int64_t pow_words = Skips == kExact ? 2 * kPowDoubles : 0;
  size_t smem = size_t(pow_words + plan.cached + plan.bits + plan.summary_words) * 4;
  int per_sm = resident_blocks_per_sm(kernel, kMvThreads, smem);
  if (Skips == kExact && plan.summary_words > 0 && forced_choice("XLAKERN_SPIKE_SUMMARY", {2}) == 0) {
    const size_t bare = size_t(pow_words + plan.cached + plan.bits) * 4;
    const int bare_per_sm = resident_blocks_per_sm(kernel, kMvThreads, bare);
    if (bare_per_sm > per_sm) {
      plan.summary_words = 0;
      plan.global_summary = nullptr;
      smem = bare;
      per_sm = bare_per_sm;
    }
  }
  const int64_t want = (g.grows * G + kMvThreads - 1) / kMvThreads;
  const int blocks = int(std::min<int64_t>(want, int64_t(gpu_limits().sms) * per_sm));
  if constexpr (Binary) {
    if (plan.global_bits != nullptr)
      pack_bits(v, g.gcols, rule, plan.global_bits, plan.global_summary, st);
  }
  kernel<<<blocks, kMvThreads, smem, st>>>(g, p, q, v, o, rule, plan.cached, plan.bits, plan.global_bits,
                                           plan.global_summary, plan.summary_words, log_keep);
}

// Shared memory the mv gather may ask for: kMvSharedBudget where the GPU lets a kernel opt in to it, else
// the default 48 KiB. (Asked of one instance; they all take the same.)
int64_t mv_shared_budget() {
  static const int64_t budget = [] {
    const int64_t want = std::min<int64_t>(gpu_limits().smem_optin, kMvSharedBudget);
    if (want <= 48 * 1024) return int64_t(48 * 1024);
    auto* kernel = gather_mv_kernel<32, 1, kTableShared, float, uint8_t, true>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(want)) != cudaSuccess) {
      (void)cudaGetLastError();
      return int64_t(48 * 1024);
    }
    return want;
  }();
  return budget;
}

// Entries of the table ExactSkip keeps in shared memory (its sentinels; the table is rarely read).
constexpr int32_t kExactCached = 64;
// The share of draws whose skip the table's cached short end misses, above which the walk takes
// ExactSkip. A draw of ExactSkip costs more instructions than one in shared memory, so it pays only
// where many rounds wait on L2 (H100, graph loops: at 400k columns, K = 80, 5% missed, the table was
// 4-8% faster; at 4M, 58-79% missed, ExactSkip 2.6x).
constexpr double kExactMiss = 0.25;

// What the mv gather keeps in shared memory: binary spikes as a bitmask where it fits beside
// kMvMinTable entries of the table, else as bits in `scratch` with their summary in shared memory
// where that fits; the rest holds the table's short end. Where that short end would miss more than
// kExactMiss of the draws, the walk takes ExactSkip (it needs log_keep = ln(1 - p) < 0; 0 means not
// known). XLAKERN_JITC_GATHER_SKIPS = 1 forces the table, 2 ExactSkip.
template <bool Binary>
MvPlan plan_gather_mv(const Gen& g, int64_t budget, SpikeScratch scratch, double log_keep) {
  MvPlan plan;
  const int64_t ext = g.ntable + 2, min_table = std::min<int64_t>(ext, kMvMinTable);
  // binary spikes as bits in global memory, with their summary in shared memory where `room` words hold it
  auto bits_to_global = [&](int64_t room) {
    plan.bits = 0;
    plan.global_bits = scratch.bits;
    const int64_t summary = spike_summary_words(g.gcols);
    const bool fits = scratch.bits != nullptr && scratch.summary != nullptr && summary <= room;
    plan.summary_words = fits && use_spike_summary() ? int32_t(summary) : 0;
    plan.global_summary = plan.summary_words > 0 ? scratch.summary : nullptr;
  };
  if (Binary) {
    plan.bits = (g.gcols + 31) / 32;
    if ((plan.bits + min_table) * 4 > budget) bits_to_global(budget / 4 - min_table);
  }
  plan.cached = int32_t(std::min<int64_t>(ext, budget / 4 - plan.bits - plan.summary_words));
  plan.skips = plan.cached == ext ? kTableShared : kTablePart;
  const int choice = forced_choice("XLAKERN_JITC_GATHER_SKIPS", {1, 2});
  const bool misses = plan.cached < ext && std::exp(log_keep * double(plan.cached - 1)) > kExactMiss;
  if (log_keep < 0.0 && (choice == 2 || (choice == 0 && misses))) {
    plan.skips = kExact;
    plan.cached = int32_t(std::min<int64_t>(ext, kExactCached));
    // the powers take room the table had: a bitmask that no longer fits beside them goes to global memory
    const int64_t room = budget / 4 - 2 * kPowDoubles - plan.cached;
    if (Binary && plan.bits > room) bits_to_global(room);
    if (plan.summary_words > room) bits_to_global(0);
  }
  return plan;
}

template <int G, int U, typename A, typename S, bool Binary>
void launch_gather_mv(const Gen& g, const A* p, const A* q, const S* v, A* o, SpikeRule<S, Binary> rule,
                      SpikeScratch scratch, double log_keep, cudaStream_t st) {
  const int64_t budget = mv_shared_budget();
  const MvPlan plan = plan_gather_mv<Binary>(g, budget, scratch, log_keep);
  switch (plan.skips) {
    case kTableShared: launch_gather_mv_as<G, U, kTableShared>(g, p, q, v, o, rule, plan, budget, log_keep, st); break;
    case kTablePart: launch_gather_mv_as<G, U, kTablePart>(g, p, q, v, o, rule, plan, budget, log_keep, st); break;
    default: launch_gather_mv_as<G, U, kExact>(g, p, q, v, o, rule, plan, budget, log_keep, st); break;
  }
}

}  // namespace

// `scratch` (uint32, no contents expected: spike_scratch says what it holds) is where a binary mv gather
// too wide for shared memory packs its spikes; any smaller array leaves it to read the spikes instead.
// `log_keep` is ln(1 - p), the float64 the skip table was built from (skip_table in _jitc_kernels.py),
// which lets the mv gather decide skips without the table (ExactSkip); 0 where not known.
// @xk jitc_mv arg arg arg arg arg ret ret attr.grows:int64 attr.gcols:int64 attr.kind:int64 attr.transpose:bool attr.binary:bool attr.log_keep:float64 stream
void jitc_mv(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
             const xk::Tensor spikes, xk::Tensor out, xk::Tensor scratch, int64_t grows, int64_t gcols, int64_t kind,
             bool transpose, bool binary, double log_keep, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_args(params, seed, table, qtable, out, kind);
  const DType acc = params.dtype();
  const int64_t batch = batch_of(spikes);
  XK_CHECK(spikes.numel() == (transpose ? grows : gcols) * batch) << "spike count does not match the matrix";
  XK_CHECK(out.numel() == (transpose ? gcols : grows) * batch) << "output size does not match the matrix";
  if (out.numel() == 0) return;
  const GpuLimits gpu = transpose ? gpu_limits() : GpuLimits{};  // the scatter's (the gathers ask their own)
  const bool after_clear = transpose && clear_before_adds(out.data_ptr(), int64_t(out.nbytes()), st, gpu);
  if (grows == 0) return;
  const Gen g{seed.data_ptr<uint32_t>(), table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  const unsigned chunks = unsigned((batch + kChunk - 1) / kChunk);  // the scatter's
  const int lanes = transpose ? 1 : gather_lanes(g.ntable, grows, gcols);
  const int rounds = lanes == 32 ? gather_rounds(g.ntable, gcols) : 1;  // the mv gather's
  const dim3 grid(blocks_for(grows * lanes), unsigned((batch + kGatherChunk - 1) / kGatherChunk));  // the mm gather's
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_spikes(spikes, binary, acc, [&](auto stag, auto rule) {
      using S = typename decltype(stag)::type;
      const A* p = params.data_ptr<A>();
      const A* q = qtable.data_ptr<A>();
      const S* v = spikes.data_ptr<S>();
      A* o = out.data_ptr<A>();
      const SpikeScratch bits = spike_scratch(scratch, gcols);
      // the mm gather's chunks are whole and 16-byte aligned: one vector load per chunk of spikes
      const bool vec = batch % kGatherChunk == 0 && reinterpret_cast<uintptr_t>(v) % 16 == 0;
      if (transpose) {
        switch (scatter_draws(g.ntable, gcols)) {
          case 1024: launch_scatter<8, 4>(g, p, q, v, o, batch, rule, chunks, after_clear, gpu, st); break;
          case 512: launch_scatter<4, 4>(g, p, q, v, o, batch, rule, chunks, after_clear, gpu, st); break;
          case 128: launch_scatter<1, 4>(g, p, q, v, o, batch, rule, chunks, after_clear, gpu, st); break;
          default: launch_scatter<1, 1>(g, p, q, v, o, batch, rule, chunks, after_clear, gpu, st); break;
        }
      } else if (batch == 1 && mv_fits_int32(g, rounds, lanes)) {
        if (lanes == 32 && rounds == 4) launch_gather_mv<32, 4>(g, p, q, v, o, rule, bits, log_keep, st);
        else if (lanes == 32) launch_gather_mv<32, 1>(g, p, q, v, o, rule, bits, log_keep, st);
        else if (lanes == 8) launch_gather_mv<8, 1>(g, p, q, v, o, rule, bits, log_keep, st);
        else launch_gather_mv<1, 1>(g, p, q, v, o, rule, bits, log_keep, st);
      } else if (lanes == 32) {
        gather_kernel<32><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule, vec);
      } else if (lanes == 8) {
        gather_kernel<8><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule, vec);
      } else {
        gather_kernel<1><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule, vec);
      }
    });
  };
  dispatch_accumulator(acc, run);
  XK_CHECK_LAUNCH();
}

// @xk jitc_dense arg arg arg arg ret attr.kind:int64 stream
void jitc_dense(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
                xk::Tensor out, int64_t kind, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_args(params, seed, table, qtable, out, kind);
  XK_CHECK(out.ndim() == 2) << "output must be a matrix";
  if (out.numel() == 0) return;
  XK_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), st));
  const Gen g{seed.data_ptr<uint32_t>(), table.data_ptr<uint32_t>(), table.numel(), out.shape(0), out.shape(1), kind};
  if (params.dtype() == DType::Float64)
    dense_kernel<<<blocks_for(g.grows), kThreads, 0, st>>>(g, params.data_ptr<double>(), qtable.data_ptr<double>(),
                                                           out.data_ptr<double>());
  else
    dense_kernel<<<blocks_for(g.grows), kThreads, 0, st>>>(g, params.data_ptr<float>(), qtable.data_ptr<float>(),
                                                           out.data_ptr<float>());
  XK_CHECK_LAUNCH();
}

namespace {

__global__ void exact_skips_kernel(Gen g, const uint32_t* hashes, int32_t* out, int64_t n, double log_keep,
                                   bool table) {
  __shared__ uint32_t shared[kExactCached];
  __shared__ double pw[kPowDoubles];
  const auto ext = cache_ext_table<false>(g, shared, g.ntable + 2 < kExactCached ? int32_t(g.ntable + 2) : kExactCached);
  fill_powers(pw, log_keep);
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const ExactSkip skip = ExactSkip::of(ext, pw, log_keep);
  const int32_t s = skip.guess(hashes[i]);
  out[i] = table ? table_skip(ext, hashes[i], s > 0 ? s : -s) : skip.correct(hashes[i], s);
}

}  // namespace

// The skips ExactSkip finds for `hashes` (out: int32, one each), or with `fallback` the skips its fallback
// finds from the same guesses, as if every draw were too close to call. For tests, which compare both
// with the table's own at and around every threshold.
// @xk jitc_skips arg arg ret attr.log_keep:float64 attr.fallback:bool stream
void jitc_skips(const xk::Tensor table, const xk::Tensor hashes, xk::Tensor out, double log_keep, bool fallback,
                int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  XK_CHECK(table.dtype() == DType::UInt32 && hashes.dtype() == DType::UInt32) << "table and hashes must be uint32";
  XK_CHECK(out.dtype() == DType::Int32 && out.numel() == hashes.numel()) << "out must be int32, one per hash";
  XK_CHECK(table.numel() <= kMaxSkipTable) << "skip table longer than " << kMaxSkipTable << " entries";
  XK_CHECK(log_keep < 0.0) << "log_keep must be ln(1 - p) < 0, got " << log_keep;
  const int64_t n = hashes.numel();
  if (n == 0) return;
  const Gen g{nullptr, table.data_ptr<uint32_t>(), table.numel(), 0, 0, kScalar};
  exact_skips_kernel<<<blocks_for(n), kThreads, 0, st>>>(g, hashes.data_ptr<uint32_t>(), out.data_ptr<int32_t>(), n,
                                                         log_keep, fallback);
  XK_CHECK_LAUNCH();
}
