// Can a scatter's random atomicAdds be beaten by sorting its adds first? M random float adds into N
// outputs, timed two ways in CUDA graphs of 50 launches (µs a launch, median of 7 graph launches):
//   atomics   clear the output, then one global atomicAdd an add (what xlakern's and BrainEvent's
//             scatters do, less their row walks)
//   binned    two kernels, no global atomic an add. Phase A: a block takes a chunk of C adds, counts
//             them by bin (bin = target >> shift, about 200 bins), stages them in shared memory in bin
//             order and copies the chunk out whole, with each bin's start. Phase B: a block a bin sums
//             that bin's adds from every chunk in shared memory (a warp a chunk's run, four runs' loads
//             in flight) and writes the bin's outputs, so no clear is needed.
// The adds are read from two arrays (target, value), as a scatter reads its indices and weights. Every
// result is checked against a float64 sum on the host.
//
// Build and run (any sm_90 GPU; nothing of xlakern is needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/bench_binned_scatter bench/bench_binned_scatter.cu && /tmp/bench_binned_scatter
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "graph_timing.cuh"

namespace {

constexpr int kMaxBins = 256, kPerThread = 8, kLaunches = 50, kRepeats = 7, kRunsInFlight = 4;

__global__ void atomic_kernel(const int* __restrict__ target, const float* __restrict__ value, int m, float* out) {
  const int stride = int(gridDim.x * blockDim.x);
#pragma unroll 4
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < m; i += stride) atomicAdd(out + target[i], value[i]);
}

// Phase A: chunk blockIdx.x of C = blockDim.x * kPerThread adds, in bin order at pair_*[chunk * C, ...);
// starts[b * nchunks + chunk] is bin b's first slot in the chunk (b = nbins: the chunk's count).
__global__ void bin_kernel(const int* __restrict__ target, const float* __restrict__ value, int m, int shift,
                           int nbins, int* __restrict__ pair_target, float* __restrict__ pair_value,
                           int* __restrict__ starts, int nchunks) {
  extern __shared__ unsigned char smem[];
  const int chunk_size = int(blockDim.x) * kPerThread;
  int* count = reinterpret_cast<int*>(smem);  // kMaxBins + 1, then exclusive starts
  int* staged_target = count + kMaxBins + 1;
  float* staged_value = reinterpret_cast<float*>(staged_target + chunk_size);
  const int base = int(blockIdx.x) * chunk_size;
  for (int b = int(threadIdx.x); b <= kMaxBins; b += int(blockDim.x)) count[b] = 0;
  __syncthreads();
  int t[kPerThread], rank[kPerThread];
  float v[kPerThread];
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const int i = base + u * int(blockDim.x) + int(threadIdx.x);
    t[u] = i < m ? target[i] : -1;
    v[u] = i < m ? value[i] : 0.f;
  }
#pragma unroll
  for (int u = 0; u < kPerThread; ++u)
    if (t[u] >= 0) rank[u] = atomicAdd(&count[t[u] >> shift], 1);
  __syncthreads();
  if (threadIdx.x < 32) {  // exclusive scan of the bins' counts by one warp
    const int lane = int(threadIdx.x);
    int carry = 0;
    for (int b0 = 0; b0 < nbins; b0 += 32) {
      const int b = b0 + lane;
      const int x = b < nbins ? count[b] : 0;
      int sum = x;
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, sum, o);
        if (lane >= o) sum += y;
      }
      if (b < nbins) count[b] = carry + sum - x;
      carry += __shfl_sync(0xffffffffu, sum, 31);
    }
    if (lane == 0) count[nbins] = carry;
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kPerThread; ++u)
    if (t[u] >= 0) {
      const int at = count[t[u] >> shift] + rank[u];
      staged_target[at] = t[u];
      staged_value[at] = v[u];
    }
  for (int b = int(threadIdx.x); b <= nbins; b += int(blockDim.x)) starts[b * nchunks + int(blockIdx.x)] = count[b];
  __syncthreads();
  for (int k = int(threadIdx.x); k < count[nbins]; k += int(blockDim.x)) {
    pair_target[base + k] = staged_target[k];
    pair_value[base + k] = staged_value[k];
  }
}

// Phase B: bin blockIdx.x's adds from every chunk, summed in shared memory, then its outputs written.
__global__ void reduce_kernel(const int* __restrict__ pair_target, const float* __restrict__ pair_value,
                              const int* __restrict__ starts, int nchunks, int chunk_size, int shift, int n,
                              float* __restrict__ out) {
  extern __shared__ unsigned char smem[];
  const int bin_size = 1 << shift, mask = bin_size - 1, b = int(blockIdx.x);
  float* acc = reinterpret_cast<float*>(smem);
  int* run_start = reinterpret_cast<int*>(acc + bin_size);
  int* run_length = run_start + nchunks;
  for (int k = int(threadIdx.x); k < bin_size; k += int(blockDim.x)) acc[k] = 0.f;
  for (int c = int(threadIdx.x); c < nchunks; c += int(blockDim.x)) {
    const int s0 = starts[b * nchunks + c], s1 = starts[(b + 1) * nchunks + c];
    run_start[c] = c * chunk_size + s0;
    run_length[c] = s1 - s0;
  }
  __syncthreads();
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, warps = int(blockDim.x) >> 5;
  for (int c0 = warp * kRunsInFlight; c0 < nchunks; c0 += warps * kRunsInFlight) {
    int t[kRunsInFlight][2];
    float v[kRunsInFlight][2];
#pragma unroll
    for (int u = 0; u < kRunsInFlight; ++u) {
      const int c = c0 + u;
      const int len = c < nchunks ? run_length[c] : 0, at = c < nchunks ? run_start[c] : 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = lane + 32 * h;
        t[u][h] = k < len ? pair_target[at + k] : -1;
        v[u][h] = k < len ? pair_value[at + k] : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kRunsInFlight; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (t[u][h] >= 0) atomicAdd(&acc[t[u][h] & mask], v[u][h]);
    for (int u = 0; u < kRunsInFlight && c0 + u < nchunks; ++u) {  // runs longer than 64
      const int len = run_length[c0 + u], at = run_start[c0 + u];
      for (int k = lane + 64; k < len; k += 32) atomicAdd(&acc[pair_target[at + k] & mask], pair_value[at + k]);
    }
  }
  __syncthreads();
  for (int k = int(threadIdx.x); k < bin_size; k += int(blockDim.x))
    if (b * bin_size + k < n) out[b * bin_size + k] = acc[k];
}

// µs a launch of `launch(stream)` (graph_timing.cuh): 5 warm-up launches, then graphs of kLaunches.
template <typename Launch>
float time_launch(Launch&& launch) {
  return time_in_graph(launch, kLaunches, kRepeats, 5);
}

}  // namespace

int main() {
  struct Case {
    int n, m;
    const char* what;
  };
  const Case cases[] = {{40000, 400000, "JITC 40k, K = 1,000, 1%"},
                        {400000, 320000, "400k, K = 80, 1%"},
                        {400000, 1600000, "400k, K = 80, 5%"},
                        {4000000, 3200000, "4M, K = 80, 1%"},
                        {4000000, 16000000, "4M, K = 80, 5%"}};
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("%s: M random float adds into N outputs, us a launch (median of %d graphs of %d)\n\n", prop.name,
              kRepeats, kLaunches);
  std::printf("| adds of | N | M | bins | atomics | binned, C = 2,048 (phase A) | binned, C = 8,192 (phase A) | max error |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(7);
  for (const Case& cs : cases) {
    const int n = cs.n, m = cs.m;
    std::vector<int> host_target(m);
    std::vector<float> host_value(m);
    std::uniform_int_distribution<int> pick(0, n - 1);
    std::uniform_real_distribution<float> weight(-1.f, 1.f);
    for (int i = 0; i < m; ++i) {
      host_target[i] = pick(rng);
      host_value[i] = weight(rng);
    }
    std::vector<double> expected(n, 0.0);
    for (int i = 0; i < m; ++i) expected[host_target[i]] += host_value[i];
    int* target;
    float *value, *out;
    check(cudaMalloc(&target, size_t(m) * 4), "malloc");
    check(cudaMalloc(&value, size_t(m) * 4), "malloc");
    check(cudaMalloc(&out, size_t(n) * 4), "malloc");
    check(cudaMemcpy(target, host_target.data(), size_t(m) * 4, cudaMemcpyHostToDevice), "copy");
    check(cudaMemcpy(value, host_value.data(), size_t(m) * 4, cudaMemcpyHostToDevice), "copy");
    int shift = 8;
    while (((n + (1 << shift) - 1) >> shift) > kMaxBins) ++shift;
    const int nbins = (n + (1 << shift) - 1) >> shift;
    double worst = 0.0;
    auto check_out = [&] {
      std::vector<float> got(n);
      check(cudaMemcpy(got.data(), out, size_t(n) * 4, cudaMemcpyDeviceToHost), "copy back");
      for (int i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(got[i]) - expected[i]));
    };
    const float atomics = time_launch([&](cudaStream_t s) {
      check(cudaMemsetAsync(out, 0, size_t(n) * 4, s), "clear");
      atomic_kernel<<<prop.multiProcessorCount * 16, 256, 0, s>>>(target, value, m, out);
    });
    check_out();
    float binned[2], phase_a[2];
    const int threads[2] = {256, 1024};
    for (int k = 0; k < 2; ++k) {
      const int chunk_size = threads[k] * kPerThread, nchunks = (m + chunk_size - 1) / chunk_size;
      int *pair_target, *starts;
      float* pair_value;
      check(cudaMalloc(&pair_target, size_t(nchunks) * chunk_size * 4), "malloc");
      check(cudaMalloc(&pair_value, size_t(nchunks) * chunk_size * 4), "malloc");
      check(cudaMalloc(&starts, size_t(nbins + 1) * nchunks * 4), "malloc");
      const size_t smem_a = (kMaxBins + 1) * 4 + size_t(chunk_size) * 8;
      const size_t smem_b = (size_t(1) << shift) * 4 + size_t(2) * nchunks * 4;
      check(cudaFuncSetAttribute(bin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_a)), "smem A");
      check(cudaFuncSetAttribute(reduce_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_b)), "smem B");
      auto phase_a_launch = [&](cudaStream_t s) {
        bin_kernel<<<nchunks, threads[k], smem_a, s>>>(target, value, m, shift, nbins, pair_target, pair_value, starts,
                                                      nchunks);
      };
      check(cudaMemset(out, 0x7f, size_t(n) * 4), "poison");  // phase B must write every output
      binned[k] = time_launch([&](cudaStream_t s) {
        phase_a_launch(s);
        reduce_kernel<<<nbins, 1024, smem_b, s>>>(pair_target, pair_value, starts, nchunks, chunk_size, shift, n, out);
      });
      check_out();
      phase_a[k] = time_launch(phase_a_launch);
      cudaFree(pair_target);
      cudaFree(pair_value);
      cudaFree(starts);
    }
    std::printf("| %s | %d | %d | %d | %.2f | %.2f (%.2f) | %.2f (%.2f) | %.1e |\n", cs.what, n, m, nbins, atomics,
                binned[0], phase_a[0], binned[1], phase_a[1], worst);
    cudaFree(target);
    cudaFree(value);
    cudaFree(out);
  }
  return 0;
}
