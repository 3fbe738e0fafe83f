// The JITC scatter (Aᵀ s: each active row's synapses atomicAdd-ed into the output), in a translation unit
// of its own so that it compiles beside the others (jitc_cuda.cuh); with xlakern.config.set_deterministic,
// the same walk adds in fixed point instead (exact_sums_cuda.cuh).

#include <cfloat>
#include <type_traits>

#include "jitc_cuda.cuh"
#include "exact_sums_cuda.cuh"

namespace xk_jitc_cuda {

namespace {

// The scatter: a block of kScatterWarps warps per `rows` generated rows (and chunk of batch columns).
// Thread t reads row t's spikes; the rows with an active one are listed in shared memory, and teams
// of T warps take them in turn: a team walks one row (walk_row for one warp, walk_row_team for more),
// each lane atomicAdd-ing its synapses into the output (zeroed first). Long rows get wide teams, so a
// row of a thousand synapses is one or two dependent rounds, not thirty; the host picks `rows` so that
// the GPU has blocks enough to spread the active rows over its SMs.
constexpr int kScatterWarps = 8;
constexpr int kScatterThreads = kScatterWarps * 32;

// Where the scatter's adds go (`start` is called once a block has an active row, before any add):
// float atomicAdds into the output, cleared first,
template <typename A>
struct FloatAdds {
  A* out;
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void operator()(int64_t o, A x) const { atomicAdd(out + o, x); }
};
// or the reproducible sums, at the scale of the bound exact_bound_kernel wrote.
struct FixedAdds {
  ExactSums sums;
  int scale;
  __device__ __forceinline__ void start() { scale = exact_scale(sums.header); }
  template <typename A>
  __device__ __forceinline__ void operator()(int64_t o, A x) const { exact_add(sums, scale, o, double(x)); }
};

template <int T, int U, typename A, typename S, bool Binary, typename Adds>
__global__ void __launch_bounds__(kScatterThreads, 3) scatter_kernel(Gen g, const A* params, const A* q, const S* spk,
                                                                  Adds adds, int64_t batch, SpikeRule<S, Binary> rule,
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
  adds.start();
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
      const int64_t o = c * batch + j0;
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (j < nb && rule.active(sv[j])) adds(o + j, w * rule.template value<A>(sv[j]));
    };
    if constexpr (T == 1)
      walk_row<32, U>(Lanes<32>::of_thread(), key, g.gcols, GlobalSkip{g.table, g.ntable, inv_log_keep}, add);
    else
      walk_row_team<T, U>(totals[team], half, 1 + team, warp % T, key, g.gcols, g.table, g.ntable, inv_log_keep,
                          add);
  }
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

template <int T, int U, typename A, typename S, bool Binary, typename Adds>
void launch_scatter(const Gen& g, const A* p, const A* q, const S* v, Adds adds, int64_t batch,
                    SpikeRule<S, Binary> rule, unsigned chunks, bool after_clear, const GpuLimits& gpu,
                    cudaStream_t st) {
  const int rows = scatter_rows(g.grows, chunks, T, gpu.sms);
  const dim3 grid(unsigned((g.grows + rows - 1) / rows), chunks);
  launch_after_clear(after_clear, scatter_kernel<T, U, A, S, Binary, Adds>, grid, dim3(kScatterThreads), 0, st, g,
                     p, q, v, adds, batch, rule, rows);
}

// The scatter of every team size, by scatter_draws.
template <typename A, typename S, bool Binary, typename Adds>
void launch_scatter_for_rows(const Product& p, const A* params, const A* q, const S* v, Adds adds,
                             SpikeRule<S, Binary> rule, bool after_clear, const GpuLimits& gpu) {
  const unsigned chunks = unsigned((p.batch + kChunk - 1) / kChunk);
  switch (scatter_draws(p.g.ntable, p.g.gcols)) {
    case 1024: launch_scatter<8, 4>(p.g, params, q, v, adds, p.batch, rule, chunks, after_clear, gpu, p.st); break;
    case 512: launch_scatter<4, 4>(p.g, params, q, v, adds, p.batch, rule, chunks, after_clear, gpu, p.st); break;
    case 128: launch_scatter<1, 4>(p.g, params, q, v, adds, p.batch, rule, chunks, after_clear, gpu, p.st); break;
    default: launch_scatter<1, 1>(p.g, params, q, v, adds, p.batch, rule, chunks, after_clear, gpu, p.st); break;
  }
}

// The header of a reproducible scatter, from the operands alone (no walk of the matrix): a bound on
// |addend|, the law's largest |weight| (|a| + |b| max|r|: r in (0, 1] uniform, within the ascending
// quantile table's ends normal, 0 scalar) times the largest finite active |spike| (1 for binary spikes),
// with a margin of 2^-10 for the weight's and the product's roundings; and count = grows, as a generated
// row reaches a column at most once (its skips are >= 1). A bound that is not finite (non-finite
// parameters, whose addends are all flagged) is clamped, so the scale stays defined.
template <typename A, typename S, bool Binary>
__global__ void __launch_bounds__(256) exact_bound_kernel(Gen g, const A* params, const A* q, const S* spk, int64_t n,
                                                          SpikeRule<S, Binary> rule, ExactSums sums) {
  const double r_max = g.kind == kUniform ? 1.0
                       : g.kind == kNormal ? fmax(fabs(double(q[0])), fabs(double(q[65536])))
                                           : 0.0;
  const double w_max = fabs(double(params[0])) + fabs(double(params[1])) * r_max;
  double s_max = Binary ? 1.0 : 0.0;
  if constexpr (!Binary) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
      const double x = fabs(double(rule.template value<A>(spk[i])));
      if (rule.active(spk[i]) && x <= DBL_MAX) s_max = fmax(s_max, x);
    }
    for (int o = 16; o > 0; o >>= 1) s_max = fmax(s_max, __shfl_down_sync(kFullWarp, s_max, o));
  }
  if ((threadIdx.x & 31) != 0 || (Binary && (blockIdx.x | threadIdx.x) != 0)) return;
  double bound = w_max * s_max * (1.0 + 0x1p-10);
  if (!(bound <= DBL_MAX)) bound = DBL_MAX;
  atomicMax(sums.header, (unsigned long long)__double_as_longlong(bound));
  if ((blockIdx.x | threadIdx.x) == 0) sums.header[1] = (unsigned long long)g.grows;
}
}  // namespace

void launch_scatter_product(const Product& p, bool after_clear, const GpuLimits& gpu) {
  with_typed_operands(p, [&](const auto* params, const auto* q, const auto* v, auto* o, auto rule) {
    launch_scatter_for_rows(p, params, q, v, FloatAdds<std::remove_cv_t<std::remove_pointer_t<decltype(o)>>>{o},
                            rule, after_clear, gpu);
  });
}

void launch_exact_scatter_product(const Product& p, ExactSums sums, const GpuLimits& gpu) {
  const int64_t n = p.out.numel();
  clear_exact_sums(sums, n, p.st);
  with_typed_operands(p, [&](const auto* params, const auto* q, const auto* v, auto* o, auto rule) {
    using A = std::remove_cv_t<std::remove_pointer_t<decltype(o)>>;
    using S = std::remove_cv_t<std::remove_pointer_t<decltype(v)>>;
    constexpr bool kBinary = decltype(rule)::kBinary;
    if (p.g.grows > 0) {
      const int64_t spikes = p.g.grows * p.batch;
      const int64_t blocks = kBinary ? 1 : std::max<int64_t>(std::min<int64_t>((spikes + 255) / 256, gpu.sms * 4), 1);
      exact_bound_kernel<A, S, kBinary><<<unsigned(blocks), kBinary ? 32 : 256, 0, p.st>>>(p.g, params, q, v, spikes,
                                                                                          rule, sums);
      launch_scatter_for_rows(p, params, q, v, FixedAdds{sums, 0}, rule, false, gpu);
    }
    exact_finish(sums, o, n, p.st);
  });
}

}  // namespace xk_jitc_cuda
