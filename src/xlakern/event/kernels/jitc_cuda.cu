// CUDA kernels of just-in-time connectivity (see jitc_common.h for the generator; jitc_cpu.cc
// for the entry points' contract, which is the same here plus the stream).
//   A row is walked by a group of G lanes (walk_row): in each round lane l takes draw k0 + l, an
//   inclusive scan of the group's skips gives each lane its column, and the round that passes gcols
//   is the last. The draws, the integers and the float arithmetic are for_each_synapse's, so the
//   synapses and weights are the same bits; only the order of the adds differs.
//   gather   G lanes per generated row (and chunk of up to kChunk batch columns), G = 1, 8 or 32
//            from the expected row length and the row count (gather_lanes): each lane sums
//            w * f(v[col]) over its synapses in registers, then the group adds its lanes' sums.
//            (G = 1 adds in the CPU's order.) The environment variable XLAKERN_JITC_GATHER_LANES
//            = 1, 8 or 32 forces G, to time the paths against each other. One spike column (mv)
//            takes gather_mv_kernel: resident blocks with the table's short end and binary spikes
//            as bits in shared memory.
//   scatter  one warp per 32 generated rows: a ballot names the rows with an active spike in the
//            chunk and the whole warp walks each of them in turn (4 rounds at once on long rows),
//            each lane atomicAdd-ing its synapse into the output (zeroed first here). Rows with no
//            active spike cost one read.
//   dense    one thread per generated row writes its row of G (the row is zeroed first).

#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "event_common.h"
#include "jitc_common.h"

namespace {

using namespace xk_event;
using namespace xk_jitc;

constexpr int kThreads = 128;
constexpr int kChunk = 8;  // batch columns one thread carries in registers
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

// The skip table as the GPU kernels read it: entries [lo, n) (the short skips, where most draws
// land) from a copy in shared memory, the rest from global memory. A warp's 32 look-ups at scattered
// entries cost a few bank conflicts in shared memory, against one L1 wavefront per cache line in global.
struct TableView {
  const uint32_t* global;
  const uint32_t* shared;
  int64_t lo;
  __device__ uint32_t operator[](int64_t i) const { return i >= lo ? shared[i - lo] : global[i]; }
};

// Copies the table's last `cached` entries into shared memory (the whole block must call this).
__device__ inline TableView cache_table(const Gen& g, uint32_t* shared, int64_t cached) {
  const int64_t lo = g.ntable - cached;
  for (int64_t i = threadIdx.x; i < cached; i += blockDim.x) shared[i] = g.table[lo + i];
  return TableView{g.table, shared, lo};
}

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

// for_each_synapse, walked by G lanes: round t covers draws k = t G + sub. A lane's column is the
// previous round's last column plus the inclusive scan of the round's skips, the same int64 sums
// the one-thread walk makes. Columns grow with the lane, so the lanes at gcols or past it are the
// round's last ones; they are dropped and the walk ends after that round. f(col, w) is called by
// the lane that holds the synapse, in the order of its draws. U rounds are drawn and scanned
// together: their hashes, table look-ups and shuffles are independent, so a row with few warps on
// it costs one memory latency per U rounds (at the price of up to U G - 1 draws past the row's end).
// Every lane of `lanes` must call this (it synchronises them).
template <int G, int U, typename Table, typename Wt, typename F>
__device__ inline void walk_row(Lanes<G> lanes, uint32_t seed, int64_t r, int64_t gcols, const Table& table,
                                int64_t ntable, float inv_log_keep, const Wt& wt, F&& f) {
  const uint32_t key = row_key(seed, uint32_t(r));
  int64_t base = -1;  // the column of the previous round's last draw (-1 before the first)
  for (uint32_t k0 = 0;; k0 += uint32_t(U * G)) {
    // at most 32 (kMaxSkipTable + 1) < 2^31: the scan cannot overflow
    int32_t prefix[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      prefix[u] = int32_t(skip_of(draw(key, 2u * (k0 + uint32_t(u * G + lanes.sub))), table, ntable, inv_log_keep));
#pragma unroll
    for (int d = 1; d < G; d <<= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int32_t below = __shfl_up_sync(lanes.mask, prefix[u], unsigned(d), G);
        if (lanes.sub >= d) prefix[u] += below;
      }
    }
    bool inside = true;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t col = base + prefix[u];
      inside = col < gcols;  // false from the round that passes gcols on (columns only grow)
      if (inside) f(col, wt.of(key, k0 + uint32_t(u * G + lanes.sub)));
      base += __shfl_sync(lanes.mask, prefix[u], G - 1, G);
    }
    if (!__all_sync(lanes.mask, inside)) return;
  }
}

// G lanes per generated row; block b, thread t: row (b kThreads + t) / G, batch chunk blockIdx.y.
template <int G, typename A, typename S, bool Binary>
__global__ void gather_kernel(Gen g, const A* params, const A* q, const S* spk, A* out, int64_t batch,
                              SpikeRule<S, Binary> rule) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  const int64_t j0 = int64_t(blockIdx.y) * kChunk;
  if (r >= g.grows) return;  // the whole group: its lanes share r
  const int nb = int(batch - j0 < kChunk ? batch - j0 : kChunk);
  const Lanes<G> lanes = Lanes<G>::of_thread();
  A acc[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) acc[j] = A(0);
  walk_row<G, 1>(lanes, *g.seed, r, g.gcols, g.table, g.ntable, inv_log_keep_of(g.table, g.ntable),
                 Weights<A>(params, g.kind, q), [&](int64_t c, A w) {
                   const S* s = spk + c * batch + j0;
#pragma unroll
                   for (int j = 0; j < kChunk; ++j)
                     if (j < nb && rule.active(s[j])) acc[j] += w * rule.template value<A>(s[j]);
                 });
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (j < nb) {
#pragma unroll
      for (int d = G / 2; d > 0; d >>= 1) acc[j] += __shfl_down_sync(lanes.mask, acc[j], unsigned(d), G);
      if (lanes.sub == 0) out[r * batch + j0 + j] = acc[j];
    }
  }
}

// The gather of one spike column (mv). Blocks stay resident and stride over the rows, so what they
// put in shared memory once serves many rows: the table's short end and, for binary spikes that fit,
// the spikes as a bitmask (a warp's 32 tests at scattered columns then cost a few bank conflicts
// instead of a global load each). `bits` words of bitmask follow `cached` table entries.
constexpr int kMvThreads = 512;

template <int G, typename A, typename S, bool Binary>
__global__ void __launch_bounds__(kMvThreads) gather_mv_kernel(Gen g, const A* params, const A* q, const S* spk,
                                                               A* out, SpikeRule<S, Binary> rule, int64_t cached,
                                                               int64_t bits) {
  extern __shared__ uint32_t smem[];
  const TableView table = cache_table(g, smem, cached);
  uint32_t* mask = smem + cached;
  if constexpr (Binary)
    for (int64_t w = threadIdx.x; w < bits; w += blockDim.x) mask[w] = spike_word(spk, w * 32, g.gcols, rule);
  __syncthreads();
  const Lanes<G> lanes = Lanes<G>::of_thread();
  const Weights<A> wt(params, g.kind, q);
  const uint32_t seed = *g.seed;
  const float inv_log_keep = inv_log_keep_of(g.table, g.ntable);
  const int64_t groups = int64_t(gridDim.x) * (kMvThreads / G);
  for (int64_t r = (int64_t(blockIdx.x) * kMvThreads + threadIdx.x) / G; r < g.grows; r += groups) {
    A acc = A(0);
    walk_row<G, 1>(lanes, seed, r, g.gcols, table, g.ntable, inv_log_keep, wt, [&](int64_t c, A w) {
      if (Binary && bits > 0) {
        if ((mask[c >> 5] >> (c & 31)) & 1u) acc += w;
      } else {
        const S v = spk[c];
        if (rule.active(v)) acc += w * rule.template value<A>(v);
      }
    });
#pragma unroll
    for (int d = G / 2; d > 0; d >>= 1) acc += __shfl_down_sync(lanes.mask, acc, unsigned(d), G);
    if (lanes.sub == 0) out[r] = acc;
  }
}

// One warp per 32 generated rows (thread t of block b reads row b kThreads + t's spikes).
template <int U, typename A, typename S, bool Binary>
__global__ void scatter_kernel(Gen g, const A* params, const A* q, const S* spk, A* out, int64_t batch,
                               SpikeRule<S, Binary> rule) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t r0 = int64_t(blockIdx.x) * blockDim.x + (threadIdx.x - unsigned(lane));  // the warp's first row
  if (r0 >= g.grows) return;  // the whole warp
  const int64_t j0 = int64_t(blockIdx.y) * kChunk;
  const int nb = int(batch - j0 < kChunk ? batch - j0 : kChunk);
  bool any = false;
  if (r0 + lane < g.grows) {
    const S* s = spk + (r0 + lane) * batch + j0;
    for (int j = 0; j < nb; ++j) any = any || rule.active(s[j]);
  }
  unsigned todo = __ballot_sync(kFullWarp, any);  // only the rows of active spikes are generated
  if (todo == 0u) return;
  const Lanes<32> lanes = Lanes<32>::of_thread();
  const uint32_t seed = *g.seed;
  const float inv_log_keep = inv_log_keep_of(g.table, g.ntable);
  const Weights<A> wt(params, g.kind, q);
  while (todo != 0u) {
    const int64_t r = r0 + (__ffs(int(todo)) - 1);
    todo &= todo - 1u;
    const S* s = spk + r * batch + j0;  // the same addresses in every lane: one broadcast load each
    S sv[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) sv[j] = j < nb ? s[j] : S(0);
    walk_row<32, U>(lanes, seed, r, g.gcols, g.table, g.ntable, inv_log_keep, wt, [&](int64_t c, A w) {
      A* o = out + c * batch + j0;
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (j < nb && rule.active(sv[j])) atomicAdd(o + j, w * rule.template value<A>(sv[j]));
    });
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

// Lanes per row of the gather. The table lives on the device, so p comes from its length: it holds
// floor(2^32 (1-p)^i) >= 1 for i = 1..n, so n is about 32 ln 2 / -ln(1-p) (an empty table: p = 1).
// A group of G lanes wastes about G/2 draws on the round that passes the row's end (and adds its
// lanes' sums at the end), so G is the widest that keeps that waste under a quarter of the expected
// row, gcols p: 1 lane (the CPU's walk) below 16 synapses, 8 below 64, else 32. Fewer threads than
// kBusyThreads leave the GPU idle (an H100 holds about 270k), so there the rows get wider groups: the
// rounds they save cost nothing.
constexpr int64_t kBusyThreads = int64_t(1) << 17;
int gather_lanes(int64_t ntable, int64_t grows, int64_t gcols) {
  if (const char* forced = std::getenv("XLAKERN_JITC_GATHER_LANES")) {
    const int lanes = std::atoi(forced);
    if (lanes == 1 || lanes == 8 || lanes == 32) return lanes;
  }
  const double p = ntable == 0 ? 1.0 : -std::expm1(-32.0 * std::log(2.0) / double(ntable));
  const double per_row = double(gcols) * p;
  int lanes = per_row < 16.0 ? 1 : (per_row < 64.0 ? 8 : 32);
  while (lanes < 32 && grows * lanes < kBusyThreads) lanes = lanes == 1 ? 8 : 32;
  return lanes;
}

// Rounds a scatter warp draws together (walk_row's U): 4 when rows are long enough that the up to
// 127 draws past a row's end cost little (expected row >= 256), else 1.
int scatter_rounds(int64_t ntable, int64_t gcols) {
  const double p = ntable == 0 ? 1.0 : -std::expm1(-32.0 * std::log(2.0) / double(ntable));
  return double(gcols) * p >= 256.0 ? 4 : 1;
}

// Shared memory an mv gather block asks for at most: two such blocks fit an H100 or H200 SM.
constexpr int64_t kMvSharedBudget = 96 * 1024;

// Launches gather_mv_kernel<G>: `cached` table entries and, for binary spikes that fit beside them,
// the bitmask in shared memory; as many resident blocks as fit the GPU (no more than the rows need).
template <int G, typename A, typename S, bool Binary>
void launch_gather_mv(const Gen& g, const A* p, const A* q, const S* v, A* o, SpikeRule<S, Binary> rule,
                      cudaStream_t st) {
  int dev = 0, sms = 0, optin = 0;
  XK_CUDA_CHECK(cudaGetDevice(&dev));  // (cudaStreamGetDevice is refused while XLA captures a graph)
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  auto* kernel = gather_mv_kernel<G, A, S, Binary>;
  int64_t budget = std::min<int64_t>(optin, kMvSharedBudget);
  if (budget > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget)) != cudaSuccess) {
    (void)cudaGetLastError();  // not allowed here: clear it and stay within the default 48 KiB
    budget = 48 * 1024;
  }
  int64_t bits = Binary ? (g.gcols + 31) / 32 : 0;
  if (bits * 4 > budget / 2) bits = 0;  // the spikes are read from global memory then
  const int64_t cached = std::min<int64_t>(g.ntable, (budget - bits * 4) / 4);
  const size_t smem = size_t(cached + bits) * 4;
  int per_sm = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kMvThreads, smem) != cudaSuccess || per_sm < 1) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  const int64_t want = (g.grows * G + kMvThreads - 1) / kMvThreads;
  const int blocks = int(std::min<int64_t>(want, int64_t(sms) * per_sm));
  kernel<<<blocks, kMvThreads, smem, st>>>(g, p, q, v, o, rule, cached, bits);
}

void check_common(const xk::Tensor& params, const xk::Tensor& seed, const xk::Tensor& table,
                  const xk::Tensor& qtable, int64_t kind) {
  const DType acc = params.dtype();
  XK_CHECK(acc == DType::Float32 || acc == DType::Float64) << "params must be float32 or float64";
  XK_CHECK(params.numel() == 2) << "params must hold (a, b)";
  XK_CHECK(seed.numel() == 1 && seed.dtype() == DType::UInt32) << "seed must be one uint32";
  XK_CHECK(table.dtype() == DType::UInt32) << "skip table must be uint32";
  XK_CHECK(table.numel() <= kMaxSkipTable)
      << "skip table longer than " << kMaxSkipTable << " entries (prob too small)";
  XK_CHECK(kind != kNormal || qtable.numel() == 65537) << "normal quantile table must have 65537 entries";
  XK_CHECK(qtable.dtype() == acc) << "quantile table dtype must match params";
}

}  // namespace

// @xk jitc_mv arg arg arg arg arg ret attr.grows:int64 attr.gcols:int64 attr.kind:int64 attr.transpose:bool attr.binary:bool stream
void jitc_mv(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
             const xk::Tensor spikes, xk::Tensor out, int64_t grows, int64_t gcols, int64_t kind, bool transpose,
             bool binary, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_common(params, seed, table, qtable, kind);
  const DType acc = params.dtype();
  XK_CHECK(out.dtype() == acc) << "output dtype must match params";
  const int64_t batch = batch_of(spikes);
  XK_CHECK(spikes.numel() == (transpose ? grows : gcols) * batch) << "spike count does not match the matrix";
  XK_CHECK(out.numel() == (transpose ? gcols : grows) * batch) << "output size does not match the matrix";
  if (out.numel() == 0) return;
  if (transpose) XK_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), st));
  if (grows == 0) return;
  const Gen g{seed.data_ptr<uint32_t>(), table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  const unsigned chunks = unsigned((batch + kChunk - 1) / kChunk);
  // threads per generated row: the scatter's thread reads one row's spikes (its warp walks the
  // active rows); the gather's are the row's lanes
  const int lanes = transpose ? 1 : gather_lanes(g.ntable, grows, gcols);
  const int rounds = transpose ? scatter_rounds(g.ntable, gcols) : 1;
  const dim3 grid(blocks_for(grows * lanes), chunks);
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_spikes(spikes, binary, acc, [&](auto stag, auto rule) {
      using S = typename decltype(stag)::type;
      const A* p = params.data_ptr<A>();
      const A* q = qtable.data_ptr<A>();
      const S* v = spikes.data_ptr<S>();
      A* o = out.data_ptr<A>();
      if (transpose) {
        if (rounds == 4) scatter_kernel<4><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
        else scatter_kernel<1><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      } else if (batch == 1) {
        if (lanes == 32) launch_gather_mv<32>(g, p, q, v, o, rule, st);
        else if (lanes == 8) launch_gather_mv<8>(g, p, q, v, o, rule, st);
        else launch_gather_mv<1>(g, p, q, v, o, rule, st);
      } else if (lanes == 32) {
        gather_kernel<32><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      } else if (lanes == 8) {
        gather_kernel<8><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      } else {
        gather_kernel<1><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      }
    });
  };
  if (acc == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
  XK_CHECK_LAUNCH();
}

// @xk jitc_dense arg arg arg arg ret attr.kind:int64 stream
void jitc_dense(const xk::Tensor params, const xk::Tensor seed, const xk::Tensor table, const xk::Tensor qtable,
                xk::Tensor out, int64_t kind, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_common(params, seed, table, qtable, kind);
  XK_CHECK(out.dtype() == params.dtype() && out.ndim() == 2) << "output must be a matrix of the params' dtype";
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
