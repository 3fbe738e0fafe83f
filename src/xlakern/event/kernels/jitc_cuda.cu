// CUDA entry points of just-in-time connectivity (jitc_cpu.cc gives their contract, the same here plus the
// stream; jitc_cuda.cuh the design of the kernels). This unit holds the entry points, the mv gather's plan,
// the mm gather and the dense materialisation; the scatter and the mv gather's kernels compile beside it
// in jitc_cuda_scatter.cu and jitc_cuda_mv_*.cu.

#include "jitc_cuda.cuh"

namespace {

using namespace xk_event;
using namespace xk_jitc;
using namespace xk_jitc_cuda;

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

template <typename A>
__global__ void dense_kernel(Gen g, const A* params, const A* q, A* out) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= g.grows) return;
  A* row = out + r * g.gcols;
  for_each_synapse(*g.seed, r, g.gcols, g.table, g.ntable, g.kind, params[0], params[1], q,
                   [&](int64_t c, A w) { row[c] = w; });
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

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

// An empty kernel: mv_shared_budget asks the runtime, through it, whether a kernel may opt in to more
// shared memory (the mv gather's kernels hold no static shared memory either, so they take the same).
__global__ void shared_memory_probe_kernel() {}

// Whether the runtime lets a kernel opt in to `bytes` of dynamic shared memory (the error of a refusal cleared).
bool may_opt_in(int64_t bytes) {
  if (cudaFuncSetAttribute(shared_memory_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) ==
      cudaSuccess)
    return true;
  (void)cudaGetLastError();
  return false;
}

// Shared memory the mv gather may ask for: kMvSharedBudget where the GPU lets a kernel opt in to it, else
// the default 48 KiB.
int64_t mv_shared_budget() {
  static const int64_t budget = [] {
    const int64_t want = std::min<int64_t>(gpu_limits().smem_optin, kMvSharedBudget);
    return want > 48 * 1024 && may_opt_in(want) ? want : int64_t(48 * 1024);
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

// Shared memory a wide mv gather block (one an SM) asks for: all that the GPU lets a block opt in to, 0
// where that is no more than mv_shared_budget's (no wide gather there).
int64_t mv_wide_budget() {
  static const int64_t budget = [] {
    const int64_t want = gpu_limits().smem_optin;
    return want > mv_shared_budget() && may_opt_in(want) ? want : int64_t(0);
  }();
  return budget;
}

// What the mv gather keeps in shared memory: binary spikes as a bitmask where it fits beside
// kMvMinTable entries of the table, else as bits in `scratch` with their summary in shared memory
// where that fits; the rest holds the table's short end. Where that short end would miss more than
// kExactMiss of the draws, the walk takes ExactSkip (it needs log_keep = ln(1 - p) < 0; 0 means not
// known). With `wide`, the plan is the wide gather's (kTableWide, whatever its short end misses).
// `choice` is XLAKERN_JITC_GATHER_SKIPS: 1 forces the table, 2 ExactSkip, 3 the wide gather (where the GPU
// has room and NearSkip serves the table; elsewhere as 0, the plan's own choice), 4 the table with ExtSkip's
// two look-ups a draw (launch_gather_mv).
template <bool Binary>
MvPlan plan_gather_mv(const Gen& g, int64_t budget, SpikeScratch scratch, double log_keep, bool wide, int choice) {
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
  if (wide) {
    plan.skips = kTableWide;
    return plan;
  }
  const bool misses = plan.cached < ext && std::exp(log_keep * double(plan.cached - 1)) > kExactMiss;
  if (log_keep < 0.0 && (choice == 2 || (choice != 1 && misses))) {
    plan.skips = kExact;
    plan.cached = int32_t(std::min<int64_t>(ext, kExactCached));
    // the powers take room the table had: a bitmask that no longer fits beside them goes to global memory
    const int64_t room = budget / 4 - 2 * kPowDoubles - plan.cached;
    if (Binary && plan.bits > room) bits_to_global(room);
    if (plan.summary_words > room) bits_to_global(0);
  }
  return plan;
}

// The mv gather: planned here, launched by the unit of the plan's MvSkips.
void launch_gather_mv(const Product& p, int lanes, int rounds, SpikeScratch scratch, double log_keep) {
  const int choice = forced_choice("XLAKERN_JITC_GATHER_SKIPS", {1, 2, 3, 4});
  auto plan_for = [&](int64_t bytes, bool wide) {
    return p.binary ? plan_gather_mv<true>(p.g, bytes, scratch, log_keep, wide, choice)
                    : plan_gather_mv<false>(p.g, bytes, scratch, log_keep, wide, choice);
  };
  int64_t budget = mv_shared_budget();
  MvPlan plan = plan_for(budget, false);
  // NearSkip (kTableShared and kTableWide) needs the float64 L the table was built from, and a table short
  // enough for its one look-up; a table in shared memory without L takes ExtSkip's two (kTablePart), as
  // every table does with choice 4
  const bool near = log_keep < 0.0 && p.g.ntable <= kNearSkipMax && choice != 4;
  if (!near && plan.skips == kTableShared) plan.skips = kTablePart;
  const int64_t wide_budget = mv_wide_budget();
  // where the table's short end is all a 512-thread block holds, the wide gather holds more of it (on an
  // H100 it was 18-31% faster wherever measured, from 2.5e-5 to 43% of its draws missed: bench/RESULTS.md,
  // session 82); ExactSkip stays where the table would miss most draws
  if ((choice == 3 || (choice == 0 && plan.skips == kTablePart)) && wide_budget > 0 && near) {
    budget = wide_budget;
    plan = plan_for(budget, true);
  }
  switch (plan.skips) {
    case kTableShared: launch_gather_mv_planned<kTableShared>(p, lanes, rounds, plan, budget, log_keep); break;
    case kTablePart: launch_gather_mv_planned<kTablePart>(p, lanes, rounds, plan, budget, log_keep); break;
    case kTableWide: launch_gather_mv_planned<kTableWide>(p, lanes, rounds, plan, budget, log_keep); break;
    default: launch_gather_mv_planned<kExact>(p, lanes, rounds, plan, budget, log_keep); break;
  }
}

}  // namespace

// `scratch` (uint32, no contents expected: spike_scratch says what it holds) is where a binary mv gather
// too wide for shared memory packs its spikes; any smaller array leaves it to read the spikes instead.
// `log_keep` is ln(1 - p), the float64 the skip table was built from (skip_table in _jitc_kernels.py),
// which lets the mv gather decide skips without the table (ExactSkip); 0 where not known.
// With `deterministic` the scatter (transpose) sums in fixed point, the same bits on every run
// (exact_sums_cuda.cuh); `scratch` then holds exact_scatter_words(outputs) words.
// @xk jitc_mv arg arg arg arg arg ret ret attr.grows:int64 attr.gcols:int64 attr.kind:int64 attr.transpose:bool attr.binary:bool attr.log_keep:float64 attr.deterministic:bool stream
void jitc_mv(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
             const xk::Tensor spikes, xk::Tensor out, xk::Tensor scratch, int64_t grows, int64_t gcols, int64_t kind,
             bool transpose, bool binary, double log_keep, bool deterministic, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_args(params, seed, table, qtable, out, kind);
  const int64_t batch = batch_of(spikes);
  XK_CHECK(spikes.numel() == (transpose ? grows : gcols) * batch) << "spike count does not match the matrix";
  XK_CHECK(out.numel() == (transpose ? gcols : grows) * batch) << "output size does not match the matrix";
  if (out.numel() == 0) return;
  const GpuLimits gpu = transpose ? gpu_limits() : GpuLimits{};  // the scatter's (the gathers ask their own)
  const Gen g{seed.data_ptr<uint32_t>(), table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  const Product product{g, params, qtable, spikes, out, batch, binary, st};
  if (transpose && deterministic) {
    launch_exact_scatter_product(product, exact_sums(scratch, out.numel()), gpu);
    XK_CHECK_LAUNCH();
    return;
  }
  const bool after_clear = transpose && clear_before_adds(out.data_ptr(), int64_t(out.nbytes()), st, gpu);
  if (grows == 0) return;
  const int lanes = transpose ? 1 : gather_lanes(g.ntable, grows, gcols);
  const int rounds = lanes == 32 ? gather_rounds(g.ntable, gcols) : 1;  // the mv gather's
  if (transpose) {
    launch_scatter_product(product, after_clear, gpu);
  } else if (batch == 1 && mv_fits_int32(g, rounds, lanes)) {
    launch_gather_mv(product, lanes, rounds, spike_scratch(scratch, gcols), log_keep);
  } else {
    const dim3 grid(blocks_for(grows * lanes), unsigned((batch + kGatherChunk - 1) / kGatherChunk));
    with_typed_operands(product, [&](const auto* p, const auto* q, const auto* v, auto* o, auto rule) {
      // the chunks are whole and 16-byte aligned: one vector load per chunk of spikes
      const bool vec = batch % kGatherChunk == 0 && reinterpret_cast<uintptr_t>(v) % 16 == 0;
      if (lanes == 32) gather_kernel<32><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule, vec);
      else if (lanes == 8) gather_kernel<8><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule, vec);
      else gather_kernel<1><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule, vec);
    });
  }
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

namespace {

// For each hash of [first, first + chunks * kNearChunk) (a chunk a thread, in order): the table's skip,
// stepped along the table from one binary search a chunk, against NearSkip's. out[0] counts the mismatches
// (wrapping past 2^32), out[1] keeps the least mismatching hash, out[2] is 1 if any mismatched.
constexpr int64_t kNearChunk = 4096;

__global__ void near_skip_misses_kernel(const uint32_t* ext, int32_t m, double log_keep, int64_t first, int64_t chunks,
                                        uint32_t* out) {
  const int64_t chunk = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  const NearSkip<false> near = NearSkip<false>::of(ExtTable<true>{nullptr, ext, 0, m}, log_keep);
  const int64_t h0 = first + chunk * kNearChunk;
  // c = #{i in [1, m] : T_i > h0}, T_i = ext(m + 1 - i) ascending in j: m + 1 - the first j in [1, m + 1]
  // with ext(j) > h0 (ext(m + 1) = 2^32 - 1 may not be, for h0 = 2^32 - 1: then c = 0)
  int32_t lo = 1, hi = m + 1;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (int64_t(ext[mid]) > h0) hi = mid;
    else lo = mid + 1;
  }
  int32_t c = m + 1 - lo;
  uint32_t misses = 0, least = 0xffffffffu;
  for (int64_t h = h0; h < h0 + kNearChunk && h <= int64_t(0xffffffffu); ++h) {
    while (c > 0 && int64_t(ext[m + 1 - c]) <= h) --c;  // T_c <= h: the count drops
    if (near.guess(uint32_t(h)) != 1 + c) {
      ++misses;
      least = min(least, uint32_t(h));
    }
  }
  if (misses > 0) {
    atomicAdd(out, misses);
    atomicMin(out + 1, least);
    atomicOr(out + 2, 1u);
  }
}

}  // namespace

// NearSkip against the table for `count` hashes from `first` (the whole 2^32 for a test), where a rounding
// bound that is wrong for some prob would show. `ext` is the extended table of at most
// kNearSkipMax + 2 entries (0, the table, 2^32 - 1); out (uint32[3]): the mismatches, the least hash that
// mismatched, and 1 if any did (else 0, 2^32 - 1, 0). For tests.
// @xk jitc_near_skip_misses arg ret attr.log_keep:float64 attr.first:int64 attr.count:int64 stream
void jitc_near_skip_misses(const xk::Tensor ext, xk::Tensor out, double log_keep, int64_t first, int64_t count,
                           int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  XK_CHECK(ext.dtype() == DType::UInt32) << "ext must be uint32";
  XK_CHECK(ext.numel() >= 2 && ext.numel() <= kNearSkipMax + 2) << "ext must hold 2 to " << kNearSkipMax + 2 << " entries";
  XK_CHECK(out.dtype() == DType::UInt32 && out.numel() == 3) << "out must be uint32[3]";
  XK_CHECK(log_keep < 0.0) << "log_keep must be ln(1 - p) < 0, got " << log_keep;
  XK_CHECK(first >= 0 && count >= 0 && first + count <= (int64_t(1) << 32) && count % kNearChunk == 0)
      << "the hashes must lie in [0, 2^32) in whole chunks of " << kNearChunk;
  uint32_t* counts = out.data_ptr<uint32_t>();
  XK_CUDA_CHECK(cudaMemsetAsync(counts, 0, 12, st));
  XK_CUDA_CHECK(cudaMemsetAsync(counts + 1, 0xff, 4, st));
  const int64_t chunks = count / kNearChunk;
  if (chunks == 0) return;
  near_skip_misses_kernel<<<blocks_for(chunks), kThreads, 0, st>>>(ext.data_ptr<uint32_t>(), int32_t(ext.numel() - 2),
                                                                   log_keep, first, chunks, counts);
  XK_CHECK_LAUNCH();
}
