// CUDA kernels of xlakern.event's fused LIF network: the whole simulation loop in one launch.
// Same contract and arithmetic as lif_cpu.cc (see its header).
//
// Why one launch: at a few thousand neurons a step is a handful of microseconds of launches and
// almost no work; at millions it is memory-bound. Three ways to run the loop inside a kernel, by
// network size (mode 0 picks; the caller may force one):
//   block  (n <= 4096)  one thread block. Each thread keeps 4 neurons' state in registers for
//                       the whole run; the synaptic input accumulates in shared memory (as integer
//                       counts when both populations share one weight: integer shared atomics are
//                       native, float ones are compare-and-swap loops). Two block barriers a step.
//   grid   (mid-size)   a cooperative launch over the GPU, one grid barrier a step. Each block sweeps
//                       its neurons in chunks (one chunk, the state in registers, while the blocks
//                       that fit on the GPU cover the network: ~540k neurons on an H100); a chunk's
//                       spikes are compacted in shared memory and delivered into input buffers in
//                       global memory, double-buffered by step parity so that delivering never races
//                       with another block still reading.
//   stream (large)      a cooperative launch, two grid barriers a step. Phase 1 streams every
//                       neuron's state once and appends spikes to one global list (warp-aggregated
//                       atomics); phase 2 delivers the list straight into the conductances, which
//                       phase 1 left decayed for the next step. No input buffers: at millions of
//                       neurons the state traffic is the cost, and this is the least of it.
// In every mode a warp delivers one spike's row at a time: lanes over the synapses, all index
// (and weight) loads issued before the atomic adds.

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "lif_common.h"

namespace {

using namespace xk_lif;
namespace cg = cooperative_groups;

constexpr int kBlockThreads = 1024;  // block mode
constexpr int kGridThreads = 512;    // grid and stream modes
constexpr int kPerThread = 4;        // contiguous neurons per thread: one 16-byte access per array
constexpr unsigned kFullMask = 0xffffffffu;

struct State {
  float *v, *ge, *gi, *ref;
  bool* spk;
  int32_t* count;
};

// How an access uses the caches. L2: bypass this SM's L1, for values other SMs changed with
// atomics. Evict: evict-first in L2, for data streamed once a step, so that what is reused (the
// conductances the spikes add into) stays in L2.
enum class Cache { kDefault, kL2, kEvict };

template <Cache C, typename T>
__device__ __forceinline__ T ld(const T* p) {
  if (C == Cache::kL2) return __ldcg(p);
  if (C == Cache::kEvict) return __ldcs(p);
  return *p;
}

template <Cache C, typename T>
__device__ __forceinline__ void st(T* p, T x) {
  if (C == Cache::kEvict) __stcs(p, x);
  else *p = x;
}

// Four neurons' values from p[i0..i0+4): one vector load when they are all there and the address is
// 16-byte aligned (`vec`), else one by one (zeros past n).
template <Cache C = Cache::kDefault>
__device__ __forceinline__ void load4(const float* p, int64_t i0, int64_t n, bool vec, float (&x)[4]) {
  if (vec && i0 + 3 < n) {
    const float4 t = ld<C>(reinterpret_cast<const float4*>(p + i0));
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) x[q] = i0 + q < n ? ld<C>(p + i0 + q) : 0.0f;
}

template <Cache C = Cache::kDefault>
__device__ __forceinline__ void store4(float* p, int64_t i0, int64_t n, bool vec, const float (&x)[4]) {
  if (vec && i0 + 3 < n) {
    st<C>(reinterpret_cast<float4*>(p + i0), make_float4(x[0], x[1], x[2], x[3]));
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
    if (i0 + q < n) st<C>(p + i0 + q, x[q]);
}

// Appends this warp's spikes (up to 4 a lane, neurons i0 + q) to `list` at slots taken from
// *counter with one atomic per warp. Every lane of the warp must call it.
__device__ __forceinline__ void append_spikes(const bool (&fired)[4], int64_t i0, int* counter, int* list) {
  const int c = int(fired[0]) + int(fired[1]) + int(fired[2]) + int(fired[3]);
  // c <= 4 takes 3 bits: three ballots give every lane the sum of the counts below it
  const unsigned b0 = __ballot_sync(kFullMask, c & 1), b1 = __ballot_sync(kFullMask, c & 2),
                 b2 = __ballot_sync(kFullMask, c & 4);
  if ((b0 | b1 | b2) == 0u) return;
  const int lane = threadIdx.x & 31;
  const unsigned below = (1u << lane) - 1u;
  const int total = __popc(b0) + 2 * __popc(b1) + 4 * __popc(b2);
  int base = 0;
  if (lane == 0) base = atomicAdd(counter, total);
  int at = __shfl_sync(kFullMask, base, 0) + __popc(b0 & below) + 2 * __popc(b1 & below) + 4 * __popc(b2 & below);
#pragma unroll
  for (int q = 0; q < 4; ++q)
    if (fired[q]) list[at++] = int(i0 + q);
}

// Where a warp's adds go. CountAdds: a count of 1 a synapse (shared weights, which the reader
// multiplies in; integer shared atomics are native). FloatAdds: the weight, with float atomics.
// FixedAdds: the weight in 64-bit fixed point (see "Reproducible input" below).
struct CountAdds {
  int* dst;
  static constexpr bool kWeights = false;
  __device__ __forceinline__ void operator()(int32_t t, float) const { atomicAdd(dst + t, 1); }
};

struct FloatAdds {
  float* dst;
  static constexpr bool kWeights = true;
  __device__ __forceinline__ void operator()(int32_t t, float w) const { atomicAdd(dst + t, w); }
};

// ------------------------------------------------------------------------- reproducible input
// Under xlakern.config.set_deterministic, with weights per synapse (float atomics of equal weights
// give the same bits in any order already), a population's input sums as int64 fixed point, whose
// atomic adds commute: each finite weight w adds llrint(w 2^E), E = 62 - ceil(log2 largest finite
// |w|) - ceil(log2 synapses), so no neuron's sum can leave int64 (the adds wrap, so only the sum must
// fit). Non-finite weights add into a float side sum instead: sums of infinities and NaNs come out the
// same in any order. The reader takes sum 2^-E + side, i.e. the exact sum rounded once to float32
// (kernels/exact_sums_cuda.cuh does the same for the event scatters).

struct FixedAdds {
  unsigned long long* sum;
  float* odd;
  double to_fixed;
  static constexpr bool kWeights = true;
  __device__ __forceinline__ void operator()(int32_t t, float w) const {
    if (isfinite(w)) atomicAdd(sum + t, (unsigned long long)llrint(double(w) * to_fixed));  // two's complement
    else atomicAdd(odd + t, w);
  }
};

// The fixed-point scale 2^E of a population (and its inverse) from its largest finite |weight| (as
// float bits: fixed_bound_kernel) and its synapse count.
struct FixedScale {
  double to_fixed, to_float;
};

__device__ __forceinline__ FixedScale fixed_scale(unsigned largest_bits, int64_t synapses) {
  const float largest = __uint_as_float(largest_bits);
  if (largest == 0.0f || synapses <= 0) return FixedScale{1.0, 1.0};
  int e_max;
  (void)frexpf(largest, &e_max);  // largest < 2^e_max
  const int e_count = 64 - __clzll((long long)(synapses - 1));  // ceil(log2(synapses))
  const int e = 62 - e_max - e_count;
  return FixedScale{ldexp(1.0, e), ldexp(1.0, -e)};
}

// The largest finite |w[i]| of w[0, count) into *largest (float bits of a non-negative float order
// as unsigned integers), and 1 into *any_odd if some w[i] is not finite; both start at 0.
__global__ void __launch_bounds__(256) fixed_bound_kernel(const float* __restrict__ w, int64_t count,
                                                          unsigned* largest, unsigned* any_odd) {
  unsigned m = 0u;
  bool odd = false;
  for (int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x; i < count; i += int64_t(gridDim.x) * 256) {
    const float a = fabsf(__ldg(w + i));
    if (a <= 3.402823466e38f) m = max(m, __float_as_uint(a));  // false for inf and NaN
    else odd = true;
  }
  m = __reduce_max_sync(kFullMask, m);
  odd = __any_sync(kFullMask, odd);
  if ((threadIdx.x & 31) == 0 && m != 0u) atomicMax(largest, m);
  if ((threadIdx.x & 31) == 0 && odd) atomicOr(any_odd, 1u);
}

__device__ __forceinline__ float fixed_value(unsigned long long sum, float odd, double to_float) {
  return float(double((long long)sum) * to_float) + odd;
}

// Takes (reads and clears) four neurons' fixed-point input: sum and side sum at [i0, i0 + 4); the
// side sums only where some weight is not finite (`odd`: else they stay 0, and the traffic is saved).
// Global: other SMs added into them through L2, so bypass this SM's L1.
template <bool Global>
__device__ __forceinline__ void take_fixed4(unsigned long long* sum, float* odd, bool with_odd, double to_float,
                                            float (&x)[4]) {
  ulonglong2* ps = reinterpret_cast<ulonglong2*>(sum);
  float4* po = reinterpret_cast<float4*>(odd);
  const ulonglong2 a = Global ? __ldcg(ps) : ps[0], b = Global ? __ldcg(ps + 1) : ps[1];
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (with_odd) o = Global ? __ldcg(po) : *po;
  const ulonglong2 zero = make_ulonglong2(0ull, 0ull);
  if (Global) {
    __stcg(ps, zero), __stcg(ps + 1, zero);
    if (with_odd) __stcg(po, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  } else {
    ps[0] = zero, ps[1] = zero;
    if (with_odd) *po = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  x[0] = fixed_value(a.x, o.x, to_float), x[1] = fixed_value(a.y, o.y, to_float);
  x[2] = fixed_value(b.x, o.z, to_float), x[3] = fixed_value(b.y, o.w, to_float);
}

// The fixed-point header, written by fixed_bound_kernel: words [0] and [1] the excitatory and inhibitory
// populations' largest finite |weight| (float bits), word kAnyOddWord 1 if some weight is not finite.
// kFixedHeader words keep the int64 sums after it 16-byte aligned.
constexpr int kAnyOddWord = 2;
constexpr int64_t kFixedHeader = 4;

// What a fixed-point kernel reads besides its state: the header and, in the grid and stream modes, the
// sums and side sums in global memory.
struct FixedInput {
  const unsigned* header;
  unsigned long long* sum;
  float* odd;
};

// What the header gives a fixed-point kernel: each population's scale, and whether the side sums are in
// use. The defaults are the float-sum kernels' (scales unused).
struct FixedHeader {
  FixedScale e{1.0, 1.0}, i{1.0, 1.0};
  bool with_odd = false;
};

__device__ __forceinline__ FixedHeader read_fixed_header(const unsigned* header, int64_t synapses_e,
                                                         int64_t synapses_i) {
  return FixedHeader{fixed_scale(header[0], synapses_e), fixed_scale(header[1], synapses_i),
                     header[kAnyOddWord] != 0u};
}

// One warp adds one presynaptic neuron's row (k targets from idx, weights w or the shared w0) through
// `add`. 32 x U synapses a round: the lanes issue all their loads, then the adds. Targets outside
// [0, n) are dropped. Evict: the connectivity is streamed (evict-first in L2).
template <int U = 4, bool Evict = false, typename Adds>
__device__ __forceinline__ void deliver_row(const int32_t* idx, const float* w, int64_t k, bool homo, float w0,
                                            int64_t n, const Adds& add, int lane) {
  for (int64_t k0 = 0; k0 < k; k0 += U * 32) {
    int32_t target[U];
    float wk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = k0 + u * 32 + lane;
      target[u] = j < k ? (Evict ? __ldcs(idx + j) : __ldg(idx + j)) : -1;
      if (Adds::kWeights) wk[u] = homo ? w0 : (j < k ? (Evict ? __ldcs(w + j) : __ldg(w + j)) : 0.0f);
      else wk[u] = 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (uint32_t(target[u]) >= uint64_t(n)) continue;
      add(target[u], wk[u]);
    }
  }
}

// Neuron `pre`'s outgoing row. Fields are picked one by one: a reference to either Conn would put
// both kernel parameters on the stack.
struct Row {
  const int32_t* idx;
  const float* w;
  int64_t k;
  bool homo, exc;
};

__device__ __forceinline__ Row row_of(int64_t pre, int64_t n_exc, const Conn ce, const Conn ci) {
  const bool exc = pre < n_exc;
  const int64_t r = exc ? pre : pre - n_exc, k = exc ? ce.k : ci.k;
  return Row{(exc ? ce.idx : ci.idx) + r * k, (exc ? ce.w : ci.w) + r * k, k, exc ? ce.homo : ci.homo, exc};
}

// ------------------------------------------------------------------------------------ block mode

// How a kernel sums a step's synaptic input: float atomics; counts of arrivals (both populations
// share one weight; block mode); fixed point (set_deterministic with weights per synapse).
enum class Sum { kFloat, kCount, kFixed };

// P neurons a thread (P / 4 groups of 4 contiguous ones), their state in registers all run. (P = 8
// would spill them: at 1,024 threads a block a thread has 64 registers.)
template <bool Conductance, bool ExpEuler, Sum S, int P>
__global__ void __launch_bounds__(kBlockThreads, 1)
    lif_block_kernel(State s, Conn ce, Conn ci, const float* params, int n, int n_exc, int64_t steps, bool vec,
                     FixedInput fx) {
  constexpr int G = P / kPerThread;
  constexpr bool Count = S == Sum::kCount;
  extern __shared__ float4 smem4[];
  __shared__ int n_spikes[2];  // by step parity: one is counted into while the other is reset
  const int stride = (n + 3) / 4 * 4;
  // input, exc [0, stride) and inh [stride, 2 stride): a word a neuron, or (kFixed) an int64 sum and
  // a float side sum; then the spike list
  uint32_t* in = reinterpret_cast<uint32_t*>(smem4);
  unsigned long long* sum = reinterpret_cast<unsigned long long*>(smem4);
  float* odd = reinterpret_cast<float*>(sum + 2 * stride);
  int* spikes = S == Sum::kFixed ? reinterpret_cast<int*>(odd + 2 * stride) : reinterpret_cast<int*>(in + 2 * stride);
  if (S == Sum::kFixed) {
    for (int i = threadIdx.x; i < 2 * stride; i += blockDim.x) sum[i] = 0ull, odd[i] = 0.0f;
  } else {
    for (int i = threadIdx.x; i < 2 * stride; i += blockDim.x) in[i] = 0u;
  }
  if (threadIdx.x < 2) n_spikes[threadIdx.x] = 0;
  const Params p = params_from(params);
  const float w0_e = ce.homo ? __ldg(ce.w) : 0.0f, w0_i = ci.homo ? __ldg(ci.w) : 0.0f;
  const FixedHeader fh = S == Sum::kFixed ? read_fixed_header(fx.header, ce.rows * ce.k, ci.rows * ci.k) : FixedHeader{};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float v[G][4], ge[G][4], gi[G][4], ref[G][4];
  bool fired[G][4];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int i0 = (g * kBlockThreads + int(threadIdx.x)) * kPerThread;
    load4(s.v, i0, n, vec, v[g]);
    load4(s.ge, i0, n, vec, ge[g]);
    load4(s.gi, i0, n, vec, gi[g]);
    load4(s.ref, i0, n, vec, ref[g]);
#pragma unroll
    for (int q = 0; q < 4; ++q) fired[g][q] = i0 + q < n && s.spk[i0 + q];
  }
  __syncthreads();
  int parity = 0;
  // t = -1 delivers the initial spikes; t >= 0 are the steps.
  for (int64_t t = -1; t < steps; ++t) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i0 = (g * kBlockThreads + int(threadIdx.x)) * kPerThread;
      if (t >= 0 && i0 < n) {  // (threads past n hold no neurons; their slots would be another buffer's)
        // take (read and clear) the four neurons' input: 16-byte shared accesses each way
        float in_e[4], in_i[4];
        if (S == Sum::kFixed) {
          take_fixed4<false>(sum + i0, odd + i0, fh.with_odd, fh.e.to_float, in_e);
          take_fixed4<false>(sum + stride + i0, odd + stride + i0, fh.with_odd, fh.i.to_float, in_i);
        } else {
          uint4* pe = reinterpret_cast<uint4*>(in + i0);
          uint4* pi = reinterpret_cast<uint4*>(in + stride + i0);
          const uint4 a = *pe, b = *pi;
          *pe = make_uint4(0u, 0u, 0u, 0u);
          *pi = make_uint4(0u, 0u, 0u, 0u);
          const uint32_t ae[4] = {a.x, a.y, a.z, a.w}, ai[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            in_e[q] = Count ? w0_e * float(int(ae[q])) : __uint_as_float(ae[q]);
            in_i[q] = Count ? w0_i * float(int(ai[q])) : __uint_as_float(ai[q]);
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          fired[g][q] = lif_step<Conductance, ExpEuler>(p, in_e[q], in_i[q], v[g][q], ge[g][q], gi[g][q],
                                                        ref[g][q]) && i0 + q < n;
          if (fired[g][q]) atomicAdd(s.count + i0 + q, 1);  // no return value: a fire-and-forget add
        }
      }
      append_spikes(fired[g], i0, &n_spikes[parity], spikes);
    }
    __syncthreads();
    const int m = n_spikes[parity];
    if (threadIdx.x == 0) n_spikes[parity ^ 1] = 0;  // published by the barrier below
    for (int j = warp; j < m; j += warps) {
      const Row r = row_of(spikes[j], n_exc, ce, ci);
      const int at = r.exc ? 0 : stride;
      const float w0 = r.exc ? w0_e : w0_i;
      if (S == Sum::kCount)
        deliver_row<4>(r.idx, r.w, r.k, r.homo, w0, n, CountAdds{reinterpret_cast<int*>(in + at)}, lane);
      else if (S == Sum::kFloat)
        deliver_row<2>(r.idx, r.w, r.k, r.homo, w0, n, FloatAdds{reinterpret_cast<float*>(in + at)}, lane);
      else
        deliver_row<2>(r.idx, r.w, r.k, r.homo, w0, n,
                       FixedAdds{sum + at, odd + at, r.exc ? fh.e.to_fixed : fh.i.to_fixed}, lane);
    }
    parity ^= 1;
    __syncthreads();  // the input is taken and the spike list rewritten by the next step
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int i0 = (g * kBlockThreads + int(threadIdx.x)) * kPerThread;
    store4(s.v, i0, n, vec, v[g]);
    store4(s.ge, i0, n, vec, ge[g]);
    store4(s.gi, i0, n, vec, gi[g]);
    store4(s.ref, i0, n, vec, ref[g]);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (i0 + q < n) s.spk[i0 + q] = fired[g][q];
  }
}

// ------------------------------------------------------------------------------------- grid mode

// Takes (reads and clears) four neurons' accumulated input from padded buffers: one aligned vector
// access. Other blocks added into them through L2: bypass this SM's L1.
__device__ __forceinline__ void take4(float* a, float (&x)[4]) {
  const float4 t = __ldcg(reinterpret_cast<const float4*>(a));
  __stcg(reinterpret_cast<float4*>(a), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
}

// Synaptic input buffers: 2 (step parity) x 2 (exc, inh) x stride floats, stride = n rounded up to 4.
__host__ __device__ inline int64_t acc_stride(int64_t n) { return (n + 3) / 4 * 4; }

// Two blocks an SM (64 registers a thread): with one, a 400k network needs two chunks a block and
// a step takes twice as long. Resident: every block holds one chunk (n <= blocks x 2,048), and each
// thread keeps its 4 neurons' state in registers for the whole run, as in block mode: per step only
// the input goes through L2.
// Fixed: the input sums in fixed point, fx.sum and fx.odd laid out as acc (acc unused).
template <bool Conductance, bool ExpEuler, bool Resident, bool Fixed = false>
__global__ void __launch_bounds__(kGridThreads, 2)
    lif_grid_kernel(State s, Conn ce, Conn ci, const float* params, float* acc, int64_t n, int64_t n_exc,
                    int64_t steps, bool vec, FixedInput fx) {
  __shared__ int chunk_spikes[kGridThreads * kPerThread];
  __shared__ int chunk_count[2];  // by chunk parity: one is counted into while the other is reset
  const int64_t stride = acc_stride(n);
  const Params p = params_from(params);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t span = int64_t(blockDim.x) * kPerThread;
  if (threadIdx.x < 2) chunk_count[threadIdx.x] = 0;
  int parity = 0;
  const float w0_e = ce.homo ? __ldg(ce.w) : 0.0f, w0_i = ci.homo ? __ldg(ci.w) : 0.0f;
  const FixedHeader fh = Fixed ? read_fixed_header(fx.header, ce.rows * ce.k, ci.rows * ci.k) : FixedHeader{};
  bool fired[kPerThread];
  float v[4], ge[4], gi[4], ref[4];  // Resident: this thread's neurons all run; else the chunk's
  const int64_t home = int64_t(blockIdx.x) * span + int64_t(threadIdx.x) * kPerThread;
  if (Resident) {
    load4(s.v, home, n, vec, v);
    load4(s.ge, home, n, vec, ge);
    load4(s.gi, home, n, vec, gi);
    load4(s.ref, home, n, vec, ref);
  }
  __syncthreads();
  for (int64_t t = -1; t < steps; ++t) {
    // this step's input and the next one's, by step parity: in acc, or in fx.sum and fx.odd (Fixed)
    const int64_t cur_at = (t & 1) * 2 * stride, nxt_at = ((t + 1) & 1) * 2 * stride;
    float *cur = acc + cur_at, *nxt = acc + nxt_at;
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
          float in_e[4], in_i[4];
          if (!Resident) {
            load4(s.v, i0, n, vec, v);
            load4(s.ge, i0, n, vec, ge);
            load4(s.gi, i0, n, vec, gi);
            load4(s.ref, i0, n, vec, ref);
          }
          if (Fixed) {
            take_fixed4<true>(fx.sum + cur_at + i0, fx.odd + cur_at + i0, fh.with_odd, fh.e.to_float, in_e);
            take_fixed4<true>(fx.sum + cur_at + stride + i0, fx.odd + cur_at + stride + i0, fh.with_odd, fh.i.to_float,
                              in_i);
          } else {
            take4(cur + i0, in_e);
            take4(cur + stride + i0, in_i);
          }
#pragma unroll
          for (int q = 0; q < kPerThread; ++q)
            fired[q] = lif_step<Conductance, ExpEuler>(p, in_e[q], in_i[q], v[q], ge[q], gi[q], ref[q]) &&
                       i0 + q < n;
          if (!Resident) {
            store4(s.v, i0, n, vec, v);
            store4(s.ge, i0, n, vec, ge);
            store4(s.gi, i0, n, vec, gi);
            store4(s.ref, i0, n, vec, ref);
          }
#pragma unroll
          for (int q = 0; q < kPerThread; ++q) {
            if (!Resident && i0 + q < n) s.spk[i0 + q] = fired[q];
            if (fired[q]) atomicAdd(s.count + i0 + q, 1);
          }
        }
      }
      append_spikes(fired, int64_t(threadIdx.x) * kPerThread, &chunk_count[parity], chunk_spikes);
      __syncthreads();
      const int m = chunk_count[parity];
      if (threadIdx.x == 0) chunk_count[parity ^ 1] = 0;  // published by the barrier below
      for (int j = warp; j < m; j += warps) {
        const Row r = row_of(base + chunk_spikes[j], n_exc, ce, ci);
        const int64_t at = r.exc ? 0 : stride;
        if (Fixed)
          deliver_row(r.idx, r.w, r.k, r.homo, r.exc ? w0_e : w0_i, n,
                      FixedAdds{fx.sum + nxt_at + at, fx.odd + nxt_at + at, r.exc ? fh.e.to_fixed : fh.i.to_fixed}, lane);
        else
          deliver_row(r.idx, r.w, r.k, r.homo, r.exc ? w0_e : w0_i, n, FloatAdds{nxt + at}, lane);
      }
      parity ^= 1;
      __syncthreads();  // chunk_spikes is rewritten by the next chunk
    }
    cg::this_grid().sync();
  }
  if (Resident) {
    store4(s.v, home, n, vec, v);
    store4(s.ge, home, n, vec, ge);
    store4(s.gi, home, n, vec, gi);
    store4(s.ref, home, n, vec, ref);
#pragma unroll
    for (int q = 0; q < kPerThread; ++q)
      if (home + q < n) s.spk[home + q] = fired[q];
  }
}

// ----------------------------------------------------------------------------------- stream mode

// Between steps the conductances hold ge * decay_e (gi * decay_i): the next step's value before
// its input, which phase 2 adds straight into them. On return they hold the last step's values.
// list: [0, 2) spike counts by step parity, [4, 4 + n) the step's spiking neurons. Fixed: phase 2
// adds into fixed-point sums instead (fx.sum, fx.odd: exc [0, stride), inh [stride, 2 stride)), which
// the next step's phase 1 takes into the conductances.
template <bool Conductance, bool ExpEuler, bool Fixed = false>
__global__ void __launch_bounds__(kGridThreads, 2)
    lif_stream_kernel(State s, Conn ce, Conn ci, const float* params, int* list, int64_t n, int64_t n_exc,
                      int64_t steps, bool vec, FixedInput fx) {
  cg::grid_group grid = cg::this_grid();
  const Params p = params_from(params);
  const float w0_e = ce.homo ? __ldg(ce.w) : 0.0f, w0_i = ci.homo ? __ldg(ci.w) : 0.0f;
  int* spikes = list + 4;
  const int lane = threadIdx.x & 31;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t warp = thread >> 5, warps = threads >> 5;
  const int64_t groups = (n + 3) / 4, stride = acc_stride(n);
  const FixedHeader fh = Fixed ? read_fixed_header(fx.header, ce.rows * ce.k, ci.rows * ci.k) : FixedHeader{};
  for (int64_t t = -1; t < steps; ++t) {
    const int parity = int(t & 1);
    const bool last = t == steps - 1;
    if (thread == 0) list[parity ^ 1] = 0;  // the other step's count: nobody reads it this step
    // phase 1: advance every neuron (t = -1: only decay the conductances) and list the spikes
    for (int64_t g = thread; g - lane < groups; g += threads) {  // whole warps: append_spikes needs them
      const int64_t i0 = g * 4;
      bool fired[4] = {false, false, false, false};
      if (g < groups) {
        float ge[4], gi[4];
        load4<Cache::kL2>(s.ge, i0, n, vec, ge);
        load4<Cache::kL2>(s.gi, i0, n, vec, gi);
        if (t < 0) {
#pragma unroll
          for (int q = 0; q < 4; ++q) fired[q] = i0 + q < n && s.spk[i0 + q];
        } else {
          float v[4], ref[4];
          load4<Cache::kEvict>(s.v, i0, n, vec, v);
          load4<Cache::kEvict>(s.ref, i0, n, vec, ref);
          if (Fixed) {  // last phase 2's input, into the decayed conductances (lif_step's order)
            float in_e[4], in_i[4];
            take_fixed4<true>(fx.sum + i0, fx.odd + i0, fh.with_odd, fh.e.to_float, in_e);
            take_fixed4<true>(fx.sum + stride + i0, fx.odd + stride + i0, fh.with_odd, fh.i.to_float, in_i);
#pragma unroll
            for (int q = 0; q < 4; ++q) ge[q] += in_e[q], gi[q] += in_i[q];
          }
#pragma unroll
          for (int q = 0; q < 4; ++q)
            fired[q] = lif_membrane<Conductance, ExpEuler>(p, ge[q], gi[q], v[q], ref[q]) && i0 + q < n;
          store4<Cache::kEvict>(s.v, i0, n, vec, v);
          store4<Cache::kEvict>(s.ref, i0, n, vec, ref);
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (fired[q]) atomicAdd(s.count + i0 + q, 1);
        }
        if (last) {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (i0 + q < n) s.spk[i0 + q] = fired[q];
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) ge[q] *= p.de, gi[q] *= p.di;
        }
        store4(s.ge, i0, n, vec, ge);
        store4(s.gi, i0, n, vec, gi);
      }
      if (!last) append_spikes(fired, i0, &list[parity], spikes);
    }
    if (last) break;  // its spikes are delivered at the start of the next call
    grid.sync();
    // phase 2: warp w delivers spikes w, w + warps, ...; lane l fetches the list entry of round l
    const int64_t m = __ldcg(&list[parity]);
    for (int64_t j0 = warp; j0 < m; j0 += 32 * warps) {
      const int64_t mine = j0 + lane * warps;
      const int pre_l = mine < m ? __ldcg(spikes + mine) : -1;
      for (int r = 0; r < 32; ++r) {
        const int pre = __shfl_sync(kFullMask, pre_l, r);
        if (pre < 0) break;
        const Row row = row_of(pre, n_exc, ce, ci);
        const float w0 = row.exc ? w0_e : w0_i;
        if (Fixed) {
          const int64_t at = row.exc ? 0 : stride;
          deliver_row<4, true>(row.idx, row.w, row.k, row.homo, w0, n,
                               FixedAdds{fx.sum + at, fx.odd + at, row.exc ? fh.e.to_fixed : fh.i.to_fixed}, lane);
        } else {
          deliver_row<4, true>(row.idx, row.w, row.k, row.homo, w0, n, FloatAdds{row.exc ? s.ge : s.gi}, lane);
        }
      }
    }
    grid.sync();
  }
}

// ------------------------------------------------------------------------ one step of a shard
// run_lif_network_sharded runs the stream mode's step across devices: XLA's all_gather brings
// every shard's bit-packed spikes between steps, so a step is two plain launches (graph-capturable,
// no grid barrier): deliver the whole network's spikes into this shard's conductances (which the
// last update left decayed), then update this shard's neurons and pack their spikes.

// One warp per 32 spike words a round; each set bit's row is delivered by the whole warp.
template <int U>
__global__ void __launch_bounds__(256)
    shard_deliver_kernel(const uint32_t* spikes, int64_t words, int64_t words_local, int64_t n_local, Blocks bl,
                         Conn ce, Conn ci, float* ge, float* gi) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  const float w0_e = ce.homo ? __ldg(ce.w) : 0.0f, w0_i = ci.homo ? __ldg(ci.w) : 0.0f;
  for (int64_t base = warp * 32; base < words; base += warps * 32) {
    const uint32_t mine = base + lane < words ? __ldg(spikes + base + lane) : 0u;
    for (unsigned busy = __ballot_sync(kFullMask, mine != 0u); busy; busy &= busy - 1) {
      const int src = __ffs(busy) - 1;
      uint32_t bits = __shfl_sync(kFullMask, mine, src);
      const int64_t w = base + src, shard = w / words_local, j0 = (w - shard * words_local) * 32;
      for (; bits; bits &= bits - 1) {
        const int64_t j = j0 + __ffs(bits) - 1;
        if (j >= n_local) break;  // padding bits of a shard's last word
        bool exc;
        const int64_t r = blocked_row(shard * n_local + j, bl, exc);
        const int64_t k = exc ? ce.k : ci.k;  // fields one by one, as in row_of
        deliver_row<U, true>((exc ? ce.idx : ci.idx) + r * k, (exc ? ce.w : ci.w) + r * k, k,
                             exc ? ce.homo : ci.homo, exc ? w0_e : w0_i, n_local, FloatAdds{exc ? ge : gi}, lane);
      }
    }
  }
}

// Each thread advances 4 consecutive neurons (phase 1 of the stream mode) and eight lanes OR their
// 4-bit nibbles into one spike word. `decay`: leave ge, gi decayed for the next step's delivery
// (every step but a call's last).
template <bool Conductance, bool ExpEuler>
__global__ void __launch_bounds__(kGridThreads)
    shard_update_kernel(float* v_, float* ge_, float* gi_, float* ref_, int32_t* count, uint32_t* words_out,
                        const float* params, int64_t n, bool decay, bool vec) {
  const Params p = params_from(params);
  const int lane = threadIdx.x & 31;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t groups = (n + 3) / 4, words = (n + 31) / 32;
  for (int64_t g = thread; g - lane < groups; g += threads) {  // whole warps: the shuffles need them
    const int64_t i0 = g * 4;
    uint32_t nibble = 0u;
    if (g < groups) {
      float v[4], ge[4], gi[4], ref[4];
      load4<Cache::kEvict>(v_, i0, n, vec, v);
      load4<Cache::kEvict>(ref_, i0, n, vec, ref);
      load4(ge_, i0, n, vec, ge);
      load4(gi_, i0, n, vec, gi);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const bool fired = lif_membrane<Conductance, ExpEuler>(p, ge[q], gi[q], v[q], ref[q]) && i0 + q < n;
        if (fired) count[i0 + q] += 1;
        nibble |= uint32_t(fired) << q;
        if (decay) ge[q] *= p.de, gi[q] *= p.di;
      }
      store4<Cache::kEvict>(v_, i0, n, vec, v);
      store4<Cache::kEvict>(ref_, i0, n, vec, ref);
      store4(ge_, i0, n, vec, ge);
      store4(gi_, i0, n, vec, gi);
    }
    uint32_t word = nibble << (4 * (lane & 7));
    word |= __shfl_xor_sync(kFullMask, word, 1);
    word |= __shfl_xor_sync(kFullMask, word, 2);
    word |= __shfl_xor_sync(kFullMask, word, 4);
    if ((lane & 7) == 0 && g / 8 < words) words_out[g / 8] = word;
  }
}

template <bool Conductance, bool ExpEuler>
void launch_shard_update(float* v, float* ge, float* gi, float* ref, int32_t* count, uint32_t* words_out,
                         const float* params, int64_t n, bool decay, bool vec, int sms, cudaStream_t st) {
  const int64_t groups = (n + 3) / 4, want = (groups + kGridThreads - 1) / kGridThreads;
  const int blocks = int(want < 8 * int64_t(sms) ? want : 8 * int64_t(sms));
  shard_update_kernel<Conductance, ExpEuler><<<blocks, kGridThreads, 0, st>>>(v, ge, gi, ref, count, words_out,
                                                                              params, n, decay, vec);
  XK_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------- launch

void copy_if_distinct(const xk::Tensor& from, xk::Tensor& to, cudaStream_t st) {
  if (from.data_ptr() != to.data_ptr())
    XK_CUDA_CHECK(cudaMemcpyAsync(to.data_ptr(), from.data_ptr(), from.nbytes(), cudaMemcpyDeviceToDevice, st));
}

enum Mode : int64_t { kAuto = 0, kBlock = 1, kGrid = 2, kStream = 3 };

// auto: up to kBlockMaxNeurons in one block (a block barrier is far cheaper than a grid barrier),
// then the one-barrier grid while its state fits in registers (about 540k neurons on an H100), then
// stream, where a step is memory-bound.
constexpr int64_t kBlockMaxNeurons = kBlockThreads * kPerThread;

// Blocks a cooperative launch of k may have resident at once.
template <typename Kernel>
int64_t resident_blocks(Kernel* k, int sms) {
  int per_sm = 0;
  XK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kGridThreads, 0));
  XK_CHECK(per_sm > 0) << "the LIF kernel cannot be resident on this GPU";
  return int64_t(per_sm) * sms;
}

constexpr int64_t kChunk = int64_t(kGridThreads) * kPerThread;  // neurons a grid block sweeps at once

template <typename Kernel>
void cooperative_launch(Kernel* k, int64_t n, void** args, cudaStream_t st, int sms) {
  const int64_t most = resident_blocks(k, sms), want = (n + kChunk - 1) / kChunk;
  const int blocks = int(want < most ? want : most);
  XK_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), dim3(blocks), dim3(kGridThreads), args, 0, st));
}

template <bool Conductance, bool ExpEuler, Sum S, int P>
void launch_block(const State& s, const Conn& ce, const Conn& ci, const float* params, int64_t n, int64_t n_exc,
                  int64_t steps, bool vec, size_t smem, const FixedInput& fx, cudaStream_t st) {
  auto* k = lif_block_kernel<Conductance, ExpEuler, S, P>;
  XK_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  k<<<1, kBlockThreads, smem, st>>>(s, ce, ci, params, int(n), int(n_exc), steps, vec, fx);
  XK_CHECK_LAUNCH();
}

// The workspace, in 32-bit words. Float sums: the grid mode's input buffers (2 parities x 2
// populations x stride) or the stream mode's spike list (4 + n). Fixed-point sums: the header
// (kFixedHeader words), then the int64 sums and the float side sums (grid: 2 x 2 x stride
// each; stream: 2 x stride each, then its spike list). lif_workspace_words in _network.py sizes the same.
int64_t workspace_words(int64_t n, bool fixed) { return fixed ? 8 + 12 * acc_stride(n) : 4 * acc_stride(n); }

// Writes each population's largest finite |weight| into the workspace's header (zeroed first), and
// whether some weight is not finite.
void find_fixed_bounds(const Conn& ce, const Conn& ci, unsigned* header, int sms, cudaStream_t st) {
  XK_CUDA_CHECK(cudaMemsetAsync(header, 0, kFixedHeader * 4, st));
  const Conn* pops[2] = {&ce, &ci};
  for (int i = 0; i < 2; ++i) {
    const int64_t count = pops[i]->homo ? 1 : pops[i]->rows * pops[i]->k;
    if (count == 0) continue;
    const int64_t want = (count + 255) / 256;
    const int blocks = int(want < 4 * int64_t(sms) ? want : 4 * int64_t(sms));
    fixed_bound_kernel<<<blocks, 256, 0, st>>>(pops[i]->w, count, header + i, header + kAnyOddWord);
    XK_CHECK_LAUNCH();
  }
}

// fixed: sum the input in fixed point (set_deterministic, weights per synapse).
template <bool Conductance, bool ExpEuler>
void launch(const State& s, const Conn& ce, const Conn& ci, const float* params, float* workspace, int64_t n,
            int64_t n_exc, int64_t steps, int64_t mode, bool fixed, cudaStream_t st) {
  // Vector accesses need 16-byte aligned state arrays (XLA's buffers are; a sliced one might not be).
  bool vec = true;
  for (const void* ptr : {static_cast<const void*>(s.v), static_cast<const void*>(s.ge),
                          static_cast<const void*>(s.gi), static_cast<const void*>(s.ref)})
    vec = vec && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  XK_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0) << "the workspace must be 16-byte aligned";
  int dev = 0, optin = 0, sms = 0;
  XK_CUDA_CHECK(cudaStreamGetDevice(st, &dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t stride = acc_stride(n);
  // block mode's shared memory: input (exc, inh) and the spike list, one word each per neuron
  // (fixed point: an int64 and a float side sum a neuron and population, and the list)
  const int64_t block_smem = (fixed ? 7 : 3) * 4 * stride;
  const bool block_fits = n <= kBlockMaxNeurons && block_smem + 64 <= optin;
  XK_CHECK(n <= kBlockMaxNeurons || mode != kBlock)
      << "gpu_mode='block' runs up to " << kBlockMaxNeurons << " neurons in one block; this network has " << n
      << ": use 'grid', 'stream' or 'auto'";
  XK_CHECK(block_fits || mode != kBlock)  // a GPU with less shared memory a block than an H100's 227 KiB
      << "gpu_mode='block' needs " << block_smem + 64 << " bytes of shared memory for " << n << " neurons"
      << (fixed ? " with fixed-point sums" : "") << "; this GPU gives a block " << optin
      << ": use 'grid', 'stream' or 'auto'";
  // grid keeps the state in registers while every block holds one chunk; past that, stream
  auto* resident_grid = fixed ? lif_grid_kernel<Conductance, ExpEuler, true, true>
                              : lif_grid_kernel<Conductance, ExpEuler, true, false>;
  const bool grid_resident = (n + kChunk - 1) / kChunk <= resident_blocks(resident_grid, sms);
  if (mode == kAuto) mode = block_fits ? kBlock : grid_resident ? kGrid : kStream;
  unsigned* words = reinterpret_cast<unsigned*>(workspace);
  FixedInput fx{words, nullptr, nullptr};
  if (fixed) {
    find_fixed_bounds(ce, ci, words, sms, st);
    fx.sum = reinterpret_cast<unsigned long long*>(words + kFixedHeader);
    fx.odd = reinterpret_cast<float*>(words + kFixedHeader + (mode == kGrid ? 8 : 4) * stride);
  }
  if (mode == kBlock) {
    const size_t smem = size_t(block_smem);
    if (fixed)
      launch_block<Conductance, ExpEuler, Sum::kFixed, 4>(s, ce, ci, params, n, n_exc, steps, vec, smem, fx, st);
    else if (ce.homo && ci.homo)
      launch_block<Conductance, ExpEuler, Sum::kCount, 4>(s, ce, ci, params, n, n_exc, steps, vec, smem, fx, st);
    else
      launch_block<Conductance, ExpEuler, Sum::kFloat, 4>(s, ce, ci, params, n, n_exc, steps, vec, smem, fx, st);
    return;
  }
  State s_arg = s;
  Conn ce_arg = ce, ci_arg = ci;
  const float* p_arg = params;
  int64_t n_arg = n, n_exc_arg = n_exc, steps_arg = steps;
  bool vec_arg = vec;
  FixedInput fx_arg = fx;
  if (mode == kGrid) {
    float* acc_arg = workspace;
    if (fixed) XK_CUDA_CHECK(cudaMemsetAsync(fx.sum, 0, size_t(48 * stride), st));  // sums and side sums
    else XK_CUDA_CHECK(cudaMemsetAsync(workspace, 0, size_t(16 * stride), st));
    void* args[] = {&s_arg, &ce_arg, &ci_arg, &p_arg, &acc_arg, &n_arg, &n_exc_arg, &steps_arg, &vec_arg, &fx_arg};
    if (fixed && grid_resident) cooperative_launch(lif_grid_kernel<Conductance, ExpEuler, true, true>, n, args, st, sms);
    else if (fixed) cooperative_launch(lif_grid_kernel<Conductance, ExpEuler, false, true>, n, args, st, sms);
    else if (grid_resident) cooperative_launch(lif_grid_kernel<Conductance, ExpEuler, true>, n, args, st, sms);
    else cooperative_launch(lif_grid_kernel<Conductance, ExpEuler, false>, n, args, st, sms);
    return;
  }
  int* list_arg = reinterpret_cast<int*>(fixed ? words + kFixedHeader + 6 * stride : words);
  // the two spike counts (and the fixed-point sums and side sums before them)
  if (fixed) XK_CUDA_CHECK(cudaMemsetAsync(fx.sum, 0, size_t(24 * stride + 16), st));
  else XK_CUDA_CHECK(cudaMemsetAsync(workspace, 0, 16, st));
  void* args[] = {&s_arg, &ce_arg, &ci_arg, &p_arg, &list_arg, &n_arg, &n_exc_arg, &steps_arg, &vec_arg, &fx_arg};
  if (fixed) cooperative_launch(lif_stream_kernel<Conductance, ExpEuler, true>, n, args, st, sms);
  else cooperative_launch(lif_stream_kernel<Conductance, ExpEuler>, n, args, st, sms);
}

}  // namespace

// @xk lif_run arg arg arg arg arg arg arg arg arg arg ret ret ret ret ret ret ret attr.n_exc:int64 attr.steps:int64 attr.conductance:bool attr.exp_euler:bool attr.mode:int64 attr.deterministic:bool stream
void lif_run(const xk::Tensor v0, const xk::Tensor ge0, const xk::Tensor gi0, const xk::Tensor ref0,
             const xk::Tensor spk0, const xk::Tensor idx_e, const xk::Tensor w_e, const xk::Tensor idx_i,
             const xk::Tensor w_i, const xk::Tensor params, xk::Tensor v, xk::Tensor ge, xk::Tensor gi,
             xk::Tensor ref, xk::Tensor spk, xk::Tensor count, xk::Tensor workspace, int64_t n_exc, int64_t steps,
             bool conductance, bool exp_euler, int64_t mode, bool deterministic, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_args(v0, ge0, gi0, ref0, spk0, idx_e, w_e, idx_i, w_i, params, n_exc);
  XK_CHECK(steps >= 0) << "steps must be >= 0";
  XK_CHECK(mode >= kAuto && mode <= kStream) << "mode must be 0 (auto), 1 (block), 2 (grid) or 3 (stream)";
  const int64_t n = v.numel();
  XK_CHECK(n < (int64_t(1) << 31) - 8) << "the GPU kernels index neurons with int32: at most 2^31 - 9 of them";
  const Conn ce = conn_of(idx_e, w_e), ci = conn_of(idx_i, w_i);
  // equal weights sum to the same bits in any order: fixed point only where a population's differ
  const bool fixed = deterministic && !(ce.homo && ci.homo);
  XK_CHECK(workspace.dtype() == xk::DType::Float32 && workspace.numel() >= workspace_words(n, fixed))
      << "workspace must hold " << workspace_words(n, fixed) << " float32 words for " << n << " neurons"
      << (fixed ? " (fixed-point sums)" : "");
  copy_if_distinct(v0, v, st);
  copy_if_distinct(ge0, ge, st);
  copy_if_distinct(gi0, gi, st);
  copy_if_distinct(ref0, ref, st);
  copy_if_distinct(spk0, spk, st);
  XK_CUDA_CHECK(cudaMemsetAsync(count.data_ptr(), 0, count.nbytes(), st));
  if (n == 0 || steps == 0) return;
  const State s{v.data_ptr<float>(), ge.data_ptr<float>(), gi.data_ptr<float>(), ref.data_ptr<float>(),
                spk.data_ptr<bool>(), count.data_ptr<int32_t>()};
  const float* p = params.data_ptr<float>();
  float* ws = workspace.data_ptr<float>();
  if (conductance) {
    if (exp_euler) launch<true, true>(s, ce, ci, p, ws, n, n_exc, steps, mode, fixed, st);
    else launch<true, false>(s, ce, ci, p, ws, n, n_exc, steps, mode, fixed, st);
  } else {
    if (exp_euler) launch<false, true>(s, ce, ci, p, ws, n, n_exc, steps, mode, fixed, st);
    else launch<false, false>(s, ce, ci, p, ws, n, n_exc, steps, mode, fixed, st);
  }
}

// @xk lif_shard_step arg arg arg arg arg arg arg arg arg arg arg ret ret ret ret ret ret attr.block:int64 attr.exc_per_block:int64 attr.conductance:bool attr.exp_euler:bool attr.decay:bool stream
void lif_shard_step(const xk::Tensor v0, const xk::Tensor ge0, const xk::Tensor gi0, const xk::Tensor ref0,
                    const xk::Tensor count0, const xk::Tensor spikes, const xk::Tensor idx_e, const xk::Tensor w_e,
                    const xk::Tensor idx_i, const xk::Tensor w_i, const xk::Tensor params, xk::Tensor v,
                    xk::Tensor ge, xk::Tensor gi, xk::Tensor ref, xk::Tensor count, xk::Tensor spikes_out,
                    int64_t block, int64_t exc_per_block, bool conductance, bool exp_euler, bool decay,
                    int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const Blocks bl{block, exc_per_block};
  check_shard_args(v0, ge0, gi0, ref0, count0, spikes, idx_e, w_e, idx_i, w_i, params, spikes_out, bl);
  const int64_t n = v.numel();
  XK_CHECK(n < (int64_t(1) << 31) - 8) << "the GPU kernels index a shard's neurons with int32: at most 2^31 - 9";
  copy_if_distinct(v0, v, st);
  copy_if_distinct(ge0, ge, st);
  copy_if_distinct(gi0, gi, st);
  copy_if_distinct(ref0, ref, st);
  copy_if_distinct(count0, count, st);
  if (n == 0) return;
  int dev = 0, sms = 0;
  XK_CUDA_CHECK(cudaStreamGetDevice(st, &dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const Conn ce = conn_of(idx_e, w_e), ci = conn_of(idx_i, w_i);
  const int64_t words = spikes.numel(), words_local = spikes_out.numel();
  const int64_t want = (words + 255) / 256;  // a warp per 32 words, 8 warps a block
  const int blocks = int(want < 16 * int64_t(sms) ? (want > 0 ? want : 1) : 16 * int64_t(sms));
  const uint32_t* sp = spikes.data_ptr<uint32_t>();
  float *pge = ge.data_ptr<float>(), *pgi = gi.data_ptr<float>();
  if ((ce.k > ci.k ? ce.k : ci.k) <= 64)
    shard_deliver_kernel<2><<<blocks, 256, 0, st>>>(sp, words, words_local, n, bl, ce, ci, pge, pgi);
  else
    shard_deliver_kernel<4><<<blocks, 256, 0, st>>>(sp, words, words_local, n, bl, ce, ci, pge, pgi);
  XK_CHECK_LAUNCH();
  bool vec = true;
  for (const void* ptr : {v.data_ptr(), ge.data_ptr(), gi.data_ptr(), ref.data_ptr()})
    vec = vec && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  auto go = [&](auto fn) {
    fn(v.data_ptr<float>(), pge, pgi, ref.data_ptr<float>(), count.data_ptr<int32_t>(),
       spikes_out.data_ptr<uint32_t>(), params.data_ptr<float>(), n, decay, vec, sms, st);
  };
  if (conductance) {
    if (exp_euler) go(launch_shard_update<true, true>);
    else go(launch_shard_update<true, false>);
  } else {
    if (exp_euler) go(launch_shard_update<false, true>);
    else go(launch_shard_update<false, false>);
  }
}
