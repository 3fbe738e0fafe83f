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
//            = 1, 8 or 32 forces G, to time the paths against each other.
//   scatter  one warp per 32 generated rows: a ballot names the rows with an active spike in the
//            chunk and the whole warp walks each of them in turn, each lane atomicAdd-ing its
//            synapse into the output (zeroed first here). Rows with no active spike cost one read.
//   dense    one thread per generated row writes its row of G (the row is zeroed first).

#include <cuda_runtime.h>
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
// Longest skip table the kernels take: a group's scan of 32 skips (each at most ntable + 1) must
// fit an int32. Python's tables stop at 2^25 entries (MAX_SKIP_TABLE in _jitc_kernels.py).
constexpr int64_t kMaxSkipTable = int64_t(1) << 25;

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

// for_each_synapse, walked by G lanes: round t covers draws k = t G + sub. A lane's column is the
// previous round's last column plus the inclusive scan of the round's skips, the same int64 sums
// the one-thread walk makes. Columns grow with the lane, so the lanes at gcols or past it are the
// round's last ones; they are dropped and the walk ends after that round. f(col, w) is called by
// the lane that holds the synapse. Every lane of `lanes` must call this (it synchronises them).
template <int G, typename A, typename F>
__device__ inline void walk_row(Lanes<G> lanes, uint32_t seed, int64_t r, int64_t gcols, const uint32_t* table,
                                int64_t ntable, float inv_log_keep, int64_t kind, A a, A b, const A* q, F&& f) {
  const uint32_t key = row_key(seed, uint32_t(r));
  int64_t base = -1;  // the column of the previous round's last draw (-1 before the first)
  for (uint32_t k0 = 0;; k0 += uint32_t(G)) {
    const uint32_t k = k0 + uint32_t(lanes.sub);
    // at most 32 (kMaxSkipTable + 1) < 2^31: the scan cannot overflow
    int32_t prefix = int32_t(skip_of(draw(key, 2u * k), table, ntable, inv_log_keep));
#pragma unroll
    for (int d = 1; d < G; d <<= 1) {
      const int32_t below = __shfl_up_sync(lanes.mask, prefix, unsigned(d), G);
      if (lanes.sub >= d) prefix += below;
    }
    const int64_t col = base + prefix;
    const bool inside = col < gcols;
    if (inside) f(col, weight_of(a, b, kind, draw(key, 2u * k + 1u), q));
    if (!__all_sync(lanes.mask, inside)) return;
    base += __shfl_sync(lanes.mask, prefix, G - 1, G);
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
  walk_row(lanes, *g.seed, r, g.gcols, g.table, g.ntable, inv_log_keep_of(g.table, g.ntable), g.kind, params[0],
           params[1], q, [&](int64_t c, A w) {
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

// One warp per 32 generated rows (thread t of block b reads row b kThreads + t's spikes).
template <typename A, typename S, bool Binary>
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
  const A a = params[0], b = params[1];
  while (todo != 0u) {
    const int64_t r = r0 + (__ffs(int(todo)) - 1);
    todo &= todo - 1u;
    const S* s = spk + r * batch + j0;  // the same addresses in every lane: one broadcast load each
    S sv[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) sv[j] = j < nb ? s[j] : S(0);
    walk_row(lanes, seed, r, g.gcols, g.table, g.ntable, inv_log_keep, g.kind, a, b, q, [&](int64_t c, A w) {
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

void check_common(const xk::Tensor& params, const xk::Tensor& seed, const xk::Tensor& table,
                  const xk::Tensor& qtable, int64_t kind) {
  const DType acc = params.dtype();
  XK_CHECK(acc == DType::Float32 || acc == DType::Float64) << "params must be float32 or float64";
  XK_CHECK(params.numel() == 2) << "params must hold (a, b)";
  XK_CHECK(seed.numel() == 1 && seed.dtype() == DType::UInt32) << "seed must be one uint32";
  XK_CHECK(table.dtype() == DType::UInt32) << "skip table must be uint32";
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
  XK_CHECK(table.numel() <= kMaxSkipTable) << "skip table longer than " << kMaxSkipTable
                                            << " entries (prob too small)";
  const Gen g{seed.data_ptr<uint32_t>(), table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  const unsigned chunks = unsigned((batch + kChunk - 1) / kChunk);
  // threads per generated row: the scatter's thread reads one row's spikes (its warp walks the
  // active rows); the gather's are the row's lanes
  const int lanes = transpose ? 1 : gather_lanes(g.ntable, grows, gcols);
  const dim3 grid(blocks_for(grows * lanes), chunks);
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_spikes(spikes, binary, acc, [&](auto stag, auto rule) {
      using S = typename decltype(stag)::type;
      const A* p = params.data_ptr<A>();
      const A* q = qtable.data_ptr<A>();
      const S* v = spikes.data_ptr<S>();
      A* o = out.data_ptr<A>();
      if (transpose) scatter_kernel<<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      else if (lanes == 32) gather_kernel<32><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      else if (lanes == 8) gather_kernel<8><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
      else gather_kernel<1><<<grid, kThreads, 0, st>>>(g, p, q, v, o, batch, rule);
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
