// CUDA kernel of xlakern.event's fused LIF network: the whole simulation loop in one launch.
// Same contract and arithmetic as lif_cpu.cc (see its header).
//
// Why one launch: at a few thousand neurons a step is a handful of microseconds of launches and
// almost no work; at millions it is memory-bound. Here the loop over steps runs inside the kernel:
//   one block   (small networks) the synaptic input accumulates in shared memory (and the neuron
//               state lives there too when it fits) and a step ends with __syncthreads;
//   whole grid  (large networks) a cooperative launch with every block resident; input
//               accumulates in global memory and a step ends with a grid-wide barrier.
// Per step each block sweeps its neurons in chunks of kPerThread x blockDim: every thread advances
// kPerThread neurons, the chunk's spikes are compacted into shared memory, and each warp delivers one
// spike's row at a time (lanes over the synapses, atomicAdd into the targets). Input is
// double-buffered by step parity, so delivering this step's spikes never races with another
// block still reading this step's input: one barrier per step suffices.

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "lif_common.h"

namespace {

using namespace xk_lif;
namespace cg = cooperative_groups;

constexpr int kBlockThreads = 1024;  // one-block mode
constexpr int kGridThreads = 512;    // grid mode

struct State {
  float *v, *ge, *gi, *ref;
  bool* spk;
  int32_t* count;
};

constexpr int kPerThread = 4;  // contiguous neurons per thread: one 16-byte load per state array

// Four neurons' values from p[i0..i0+4): one vector load when they are all there and the address is
// 16-byte aligned (`vec`), else one by one (zeros past n).
__device__ __forceinline__ void load4(const float* p, int64_t i0, int64_t n, bool vec, float (&x)[4]) {
  if (vec && i0 + 3 < n) {
    const float4 t = *reinterpret_cast<const float4*>(p + i0);
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) x[q] = i0 + q < n ? p[i0 + q] : 0.0f;
}

__device__ __forceinline__ void store4(float* p, int64_t i0, int64_t n, bool vec, const float (&x)[4]) {
  if (vec && i0 + 3 < n) {
    *reinterpret_cast<float4*>(p + i0) = make_float4(x[0], x[1], x[2], x[3]);
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
    if (i0 + q < n) p[i0 + q] = x[q];
}

// Takes (reads and clears) four neurons' accumulated input. The buffers are padded to a multiple
// of 4 floats, so this is always one aligned vector access. On a grid, other blocks added into
// them through L2: bypass this SM's L1.
template <bool OneBlock>
__device__ __forceinline__ void take4(float* a, float (&x)[4]) {
  float4 t;
  if (OneBlock) {
    t = *reinterpret_cast<float4*>(a);
    *reinterpret_cast<float4*>(a) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  } else {
    t = __ldcg(reinterpret_cast<const float4*>(a));
    __stcg(reinterpret_cast<float4*>(a), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  }
  x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
}

// Synaptic input buffers: 2 (step parity) x 2 (exc, inh) x stride floats, stride = n rounded up to 4.
__host__ __device__ inline int64_t acc_stride(int64_t n) { return (n + 3) / 4 * 4; }

template <bool Conductance, bool ExpEuler, bool OneBlock>
__global__ void __launch_bounds__(1024) lif_kernel(State s, Conn ce, Conn ci, const float* params, float* gacc,
                                                   int64_t n, int64_t n_exc, int64_t steps, bool vec,
                                                   bool resident) {
  extern __shared__ float4 smem4[];
  __shared__ int chunk_spikes[1024 * kPerThread];
  __shared__ int chunk_count[2];  // by chunk parity: one is counted into while the other is reset
  const int64_t stride = acc_stride(n);
  float* acc = OneBlock ? reinterpret_cast<float*>(smem4) : gacc;
  const Params p = params_from(params);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t span = int64_t(blockDim.x) * kPerThread;
  if (OneBlock)
    for (int64_t i = threadIdx.x; i < 4 * stride; i += blockDim.x) acc[i] = 0.0f;
  if (threadIdx.x < 2) chunk_count[threadIdx.x] = 0;
  __syncthreads();
  int parity = 0;
  // Resident (one block, small networks): the neuron state lives in shared memory for the whole
  // run, after the input buffers, and is copied in once and out once.
  State st = s;
  const bool vec_st = resident || vec;
  if (resident) {
    float* f = acc + 4 * stride;
    st.v = f, st.ge = f + stride, st.gi = f + 2 * stride, st.ref = f + 3 * stride;
    st.count = reinterpret_cast<int32_t*>(f + 4 * stride);
    st.spk = reinterpret_cast<bool*>(st.count + stride);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      st.v[i] = s.v[i], st.ge[i] = s.ge[i], st.gi[i] = s.gi[i], st.ref[i] = s.ref[i];
      st.count[i] = 0, st.spk[i] = s.spk[i];
    }
    __syncthreads();
  }
  // Shared weights, read once (a load after an atomicAdd could not be hoisted out of the loop).
  const float w0_e = ce.homo ? __ldg(ce.w) : 0.0f, w0_i = ci.homo ? __ldg(ci.w) : 0.0f;
  bool fired[kPerThread];
  // t = -1 delivers the initial spikes; t >= 0 are the steps.
  for (int64_t t = -1; t < steps; ++t) {
    float* cur = acc + (t & 1) * 2 * stride;
    float* nxt = acc + ((t + 1) & 1) * 2 * stride;
    for (int64_t base = int64_t(blockIdx.x) * span; base < n; base += int64_t(gridDim.x) * span) {
      const int64_t i0 = base + int64_t(threadIdx.x) * kPerThread;
#pragma unroll
      for (int q = 0; q < kPerThread; ++q) fired[q] = false;
      if (i0 < n) {
        if (t < 0) {
#pragma unroll
          for (int q = 0; q < kPerThread; ++q) fired[q] = i0 + q < n && s.spk[i0 + q];
        } else {
          // every load first, so the thread has them all in flight at once
          float v[4], ge[4], gi[4], ref[4], in_e[4], in_i[4];
          load4(st.v, i0, n, vec_st, v);
          load4(st.ge, i0, n, vec_st, ge);
          load4(st.gi, i0, n, vec_st, gi);
          load4(st.ref, i0, n, vec_st, ref);
          take4<OneBlock>(cur + i0, in_e);
          take4<OneBlock>(cur + stride + i0, in_i);
#pragma unroll
          for (int q = 0; q < kPerThread; ++q)
            fired[q] = lif_step<Conductance, ExpEuler>(p, in_e[q], in_i[q], v[q], ge[q], gi[q], ref[q]) &&
                       i0 + q < n;
          store4(st.v, i0, n, vec_st, v);
          store4(st.ge, i0, n, vec_st, ge);
          store4(st.gi, i0, n, vec_st, gi);
          store4(st.ref, i0, n, vec_st, ref);
#pragma unroll
          for (int q = 0; q < kPerThread; ++q) {
            if (i0 + q < n) st.spk[i0 + q] = fired[q];
            if (fired[q]) st.count[i0 + q] += 1;
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kPerThread; ++q)
        if (fired[q]) chunk_spikes[atomicAdd(&chunk_count[parity], 1)] = int(threadIdx.x) * kPerThread + q;
      __syncthreads();
      const int m = chunk_count[parity];
      if (threadIdx.x == 0) chunk_count[parity ^ 1] = 0;  // published by the barrier below
      for (int j = warp; j < m; j += warps) {
        const int64_t pre = base + chunk_spikes[j];
        const bool exc = pre < n_exc;
        // fields picked one by one: a reference to either parameter struct would copy both to the stack
        const int64_t row = exc ? pre : pre - n_exc, kk = exc ? ce.k : ci.k;
        const int32_t* idx = (exc ? ce.idx : ci.idx) + row * kk;
        const float* w = (exc ? ce.w : ci.w) + row * kk;
        const bool homo = exc ? ce.homo : ci.homo;
        const float w0 = exc ? w0_e : w0_i;
        float* dst = exc ? nxt : nxt + stride;
        // 128 synapses a round: the lanes issue all their index (and weight) loads, then the adds
        for (int64_t k0 = 0; k0 < kk; k0 += 4 * 32) {
          int32_t target[4];
          float wk[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int64_t k = k0 + u * 32 + lane;
            target[u] = k < kk ? __ldg(idx + k) : -1;
            wk[u] = homo ? w0 : (k < kk ? __ldg(w + k) : 0.0f);
          }
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (uint32_t(target[u]) < uint64_t(n)) atomicAdd(dst + target[u], wk[u]);
        }
      }
      parity ^= 1;
      __syncthreads();  // chunk_spikes is rewritten by the next chunk
    }
    // One block: the chunk barrier above already ends the step. A grid needs every block.
    if (!OneBlock) cg::this_grid().sync();
  }
  if (resident) {  // the last chunk barrier has ordered every step's writes
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      s.v[i] = st.v[i], s.ge[i] = st.ge[i], s.gi[i] = st.gi[i], s.ref[i] = st.ref[i];
      s.count[i] = st.count[i], s.spk[i] = st.spk[i];
    }
  }
}

void copy_if_distinct(const xk::Tensor& from, xk::Tensor& to, cudaStream_t st) {
  if (from.data_ptr() != to.data_ptr())
    XK_CUDA_CHECK(cudaMemcpyAsync(to.data_ptr(), from.data_ptr(), from.nbytes(), cudaMemcpyDeviceToDevice, st));
}

// Networks up to this size run in one block (their input fits in shared memory and a block
// barrier is far cheaper than a grid barrier); larger ones over the whole GPU.
constexpr int64_t kOneBlockMaxNeurons = 8192;

template <bool Conductance, bool ExpEuler>
void launch(const State& s, const Conn& ce, const Conn& ci, const float* params, float* gacc, int64_t n,
            int64_t n_exc, int64_t steps, int64_t mode, cudaStream_t st) {
  // Vector loads need 16-byte aligned state arrays (XLA's buffers are; a sliced one might not be).
  bool vec = true;
  for (const void* ptr : {static_cast<const void*>(s.v), static_cast<const void*>(s.ge),
                          static_cast<const void*>(s.gi), static_cast<const void*>(s.ref)})
    vec = vec && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  XK_CHECK(reinterpret_cast<uintptr_t>(gacc) % 16 == 0) << "the workspace must be 16-byte aligned";
  int dev = 0, optin = 0, sms = 0;
  XK_CUDA_CHECK(cudaStreamGetDevice(st, &dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t dyn_bytes = 16 * acc_stride(n);
  const int64_t smem = dyn_bytes + 4 * 1024 * kPerThread + 64;  // dynamic + the static chunk list
  const bool fits = smem <= optin;
  XK_CHECK(!(mode == 1 && !fits)) << "gpu_mode='block' needs " << smem << " bytes of shared memory for " << n
                                  << " neurons; this GPU gives a block " << optin << ": use 'grid' or 'auto'";
  const bool one_block = mode == 1 || (mode == 0 && fits && n <= kOneBlockMaxNeurons);
  if (one_block) {
    auto* k = lif_kernel<Conductance, ExpEuler, true>;
    // the state too, when it fits beside the input: 4 floats, a count and a spike per neuron
    const int64_t resident_bytes = dyn_bytes + 21 * acc_stride(n);
    const bool resident = resident_bytes + 4 * 1024 * kPerThread + 64 <= optin;
    const size_t dyn = size_t(resident ? resident_bytes : dyn_bytes);
    XK_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dyn)));
    k<<<1, kBlockThreads, dyn, st>>>(s, ce, ci, params, gacc, n, n_exc, steps, vec, resident);
    XK_CHECK_LAUNCH();
    return;
  }
  auto* k = lif_kernel<Conductance, ExpEuler, false>;
  int per_sm = 0;
  XK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kGridThreads, 0));
  XK_CHECK(per_sm > 0) << "the LIF kernel cannot be resident on this GPU";
  const int64_t want = (n + int64_t(kGridThreads) * kPerThread - 1) / (int64_t(kGridThreads) * kPerThread);
  const int blocks = int(want < int64_t(per_sm) * sms ? want : int64_t(per_sm) * sms);
  XK_CUDA_CHECK(cudaMemsetAsync(gacc, 0, size_t(dyn_bytes), st));
  State s_arg = s;
  Conn ce_arg = ce, ci_arg = ci;
  const float* p_arg = params;
  float* acc_arg = gacc;
  int64_t n_arg = n, n_exc_arg = n_exc, steps_arg = steps;
  bool vec_arg = vec, resident_arg = false;
  void* args[] = {&s_arg, &ce_arg, &ci_arg, &p_arg, &acc_arg, &n_arg, &n_exc_arg, &steps_arg, &vec_arg, &resident_arg};
  XK_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), dim3(blocks), dim3(kGridThreads), args, 0, st));
}

}  // namespace

// @xk lif_run arg arg arg arg arg arg arg arg arg arg ret ret ret ret ret ret ret attr.n_exc:int64 attr.steps:int64 attr.conductance:bool attr.exp_euler:bool attr.mode:int64 stream
void lif_run(const xk::Tensor v0, const xk::Tensor ge0, const xk::Tensor gi0, const xk::Tensor ref0,
             const xk::Tensor spk0, const xk::Tensor idx_e, const xk::Tensor w_e, const xk::Tensor idx_i,
             const xk::Tensor w_i, const xk::Tensor params, xk::Tensor v, xk::Tensor ge, xk::Tensor gi,
             xk::Tensor ref, xk::Tensor spk, xk::Tensor count, xk::Tensor workspace, int64_t n_exc, int64_t steps,
             bool conductance, bool exp_euler, int64_t mode, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_args(v0, ge0, gi0, ref0, spk0, idx_e, w_e, idx_i, w_i, params, n_exc);
  XK_CHECK(steps >= 0) << "steps must be >= 0";
  XK_CHECK(mode >= 0 && mode <= 2) << "mode must be 0 (auto), 1 (one block) or 2 (grid)";
  const int64_t n = v.numel();
  XK_CHECK(workspace.dtype() == xk::DType::Float32 && workspace.numel() >= 4 * acc_stride(n))
      << "workspace must hold 4 float32 per neuron (n rounded up to a multiple of 4)";
  copy_if_distinct(v0, v, st);
  copy_if_distinct(ge0, ge, st);
  copy_if_distinct(gi0, gi, st);
  copy_if_distinct(ref0, ref, st);
  copy_if_distinct(spk0, spk, st);
  XK_CUDA_CHECK(cudaMemsetAsync(count.data_ptr(), 0, count.nbytes(), st));
  if (n == 0 || steps == 0) return;
  const State s{v.data_ptr<float>(), ge.data_ptr<float>(), gi.data_ptr<float>(), ref.data_ptr<float>(),
                spk.data_ptr<bool>(), count.data_ptr<int32_t>()};
  const Conn ce = conn_of(idx_e, w_e), ci = conn_of(idx_i, w_i);
  const float* p = params.data_ptr<float>();
  float* gacc = workspace.data_ptr<float>();
  if (conductance) {
    if (exp_euler) launch<true, true>(s, ce, ci, p, gacc, n, n_exc, steps, mode, st);
    else launch<true, false>(s, ce, ci, p, gacc, n, n_exc, steps, mode, st);
  } else {
    if (exp_euler) launch<false, true>(s, ce, ci, p, gacc, n, n_exc, steps, mode, st);
    else launch<false, false>(s, ce, ci, p, gacc, n, n_exc, steps, mode, st);
  }
}
