// CUDA kernels of just-in-time connectivity (see jitc_common.h for the generator; jitc_cpu.cc
// for the entry points' contract, which is the same here plus the stream).
//   gather   one thread per generated row (and chunk of up to kChunk batch columns): it walks its
//            row once and sums w * f(v[col]) in registers.
//   scatter  one thread per generated row; rows without an active spike in the chunk return at
//            once, active ones walk the row and atomicAdd into the output (zeroed first here).
//   dense    one thread per generated row writes its row of G (the row is zeroed first).

#include <cuda_runtime.h>
#include <cstdint>

#include "event_common.h"
#include "jitc_common.h"

namespace {

using namespace xk_event;
using namespace xk_jitc;

constexpr int kThreads = 128;
constexpr int kChunk = 8;  // batch columns one thread carries in registers

// The seed may be traced, so it lives on the device: each thread reads it (one cached load)
// rather than the host copying it back, which would synchronise the stream.
struct Gen {
  const uint32_t* seed;
  const uint32_t* table;
  int64_t ntable, grows, gcols, kind;
};

template <typename A, typename S, bool Binary>
__global__ void gather_kernel(Gen g, const A* params, const A* q, const S* spk, A* out, int64_t batch,
                              SpikeRule<S, Binary> rule) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t j0 = int64_t(blockIdx.y) * kChunk;
  if (r >= g.grows) return;
  const int64_t nb = batch - j0 < kChunk ? batch - j0 : kChunk;
  A acc[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) acc[j] = A(0);
  for_each_synapse(*g.seed, r, g.gcols, g.table, g.ntable, g.kind, params[0], params[1], q, [&](int64_t c, A w) {
    const S* s = spk + c * batch + j0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j)
      if (j < nb && rule.active(s[j])) acc[j] += w * rule.template value<A>(s[j]);
  });
  for (int j = 0; j < nb; ++j) out[r * batch + j0 + j] = acc[j];
}

template <typename A, typename S, bool Binary>
__global__ void scatter_kernel(Gen g, const A* params, const A* q, const S* spk, A* out, int64_t batch,
                               SpikeRule<S, Binary> rule) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t j0 = int64_t(blockIdx.y) * kChunk;
  if (r >= g.grows) return;
  const int64_t nb = batch - j0 < kChunk ? batch - j0 : kChunk;
  const S* s = spk + r * batch + j0;
  bool any = false;
  for (int j = 0; j < nb; ++j) any = any || rule.active(s[j]);
  if (!any) return;  // only the rows of active spikes are generated
  for_each_synapse(*g.seed, r, g.gcols, g.table, g.ntable, g.kind, params[0], params[1], q, [&](int64_t c, A w) {
    A* o = out + c * batch + j0;
    for (int j = 0; j < nb; ++j)
      if (rule.active(s[j])) atomicAdd(o + j, w * rule.template value<A>(s[j]));
  });
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
  const Gen g{seed.data_ptr<uint32_t>(), table.data_ptr<uint32_t>(), table.numel(), grows, gcols, kind};
  const dim3 grid(blocks_for(grows), unsigned((batch + kChunk - 1) / kChunk));
  auto run = [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_spikes(spikes, binary, acc, [&](auto stag, auto rule) {
      using S = typename decltype(stag)::type;
      if (transpose)
        scatter_kernel<<<grid, kThreads, 0, st>>>(g, params.data_ptr<A>(), qtable.data_ptr<A>(),
                                                  spikes.data_ptr<S>(), out.data_ptr<A>(), batch, rule);
      else
        gather_kernel<<<grid, kThreads, 0, st>>>(g, params.data_ptr<A>(), qtable.data_ptr<A>(),
                                                 spikes.data_ptr<S>(), out.data_ptr<A>(), batch, rule);
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
