// The GPU's floor for a scatter's adds: 400 rows of 1,000 random float atomicAdds (1% of 40k neurons
// active, 1,000 synapses each), into outputs of 40k, 400k and 4M values, timed in a CUDA graph of 100
// launches (µs a launch, median of 9 graph launches). Nothing else runs in these kernels, so a scatter
// step of the same adds cannot be faster than this plus its spike reads, its row walks and its graph's
// other nodes. The issues' 2x-over-BrainEvent cells that are bound by adds are set against this.
//
// Build and run (any sm_90 GPU; nothing of xlakern is needed):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/bench_atomic_floor bench/bench_atomic_floor.cu && /tmp/bench_atomic_floor
//
// Kernels:
//   rows    a block walks one row of sorted random columns, thread t its slots t, t + blockDim, ...
//           (as xlakern's scatters do); "rotated" starts each row at a random slot, so that the rows do
//           not sweep the output upward together
//   flat    every add independent: thread i adds to hash(i) mod n
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "graph_timing.cuh"

namespace {

constexpr int kRows = 400, kPerRow = 1000, kLaunches = 100, kRepeats = 9;

__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

__global__ void rows_kernel(const int* cols, int per_row, float* out, bool rotated) {
  const int* row = cols + int64_t(blockIdx.x) * per_row;
  const int start = rotated ? int(mix(blockIdx.x) % uint32_t(per_row)) : 0;
  for (int i = int(threadIdx.x); i < per_row; i += int(blockDim.x)) {
    const int j = i + start < per_row ? i + start : i + start - per_row;
    atomicAdd(out + row[j], 1.0f);
  }
}

__global__ void flat_kernel(int total, int n, float* out, int per_thread) {
  const int first = (int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x)) * per_thread;
  for (int q = first; q < first + per_thread && q < total; ++q) atomicAdd(out + mix(uint32_t(q)) % uint32_t(n), 1.0f);
}

// µs a launch of `launch(stream)` (graph_timing.cuh): 10 warm-up launches, then graphs of kLaunches.
template <typename Launch>
float time_launch(Launch&& launch) {
  return time_in_graph(launch, kLaunches, kRepeats, 10);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("%s: %d rows x %d random atomicAdds (float) a launch, us a launch (median of %d graphs of %d)\n\n",
              prop.name, kRows, kPerRow, kRepeats, kLaunches);
  std::printf("| kernel | threads a block | 40k values | 400k values | 4M values |\n|---|---|---|---|---|\n");
  const int sizes[] = {40000, 400000, 4000000};
  struct Row {
    const char* name;
    int threads;
    int kind;  // 0 rows in order, 1 rows rotated, 2 flat, 3 empty launch
    int adds_a_thread;  // flat only
  };
  const Row table[] = {{"rows in order", 256, 0, 0},  {"rows in order", 1024, 0, 0},
                       {"rows rotated", 256, 1, 0},   {"rows rotated", 1024, 1, 0},
                       {"flat, 1 add a thread", 256, 2, 1}, {"flat, 4 adds a thread", 256, 2, 4},
                       {"empty launch", 32, 3, 0}};
  constexpr int kTable = int(sizeof(table) / sizeof(table[0]));
  float results[kTable][3];
  for (int k = 0; k < 3; ++k) {
    const int n = sizes[k];
    std::mt19937 rng(1);
    std::vector<int> cols(size_t(kRows) * kPerRow);
    for (int r = 0; r < kRows; ++r) {
      auto first = cols.begin() + size_t(r) * kPerRow;
      for (auto it = first; it != first + kPerRow; ++it) *it = int(rng() % uint32_t(n));
      std::sort(first, first + kPerRow);
    }
    int* dcols = nullptr;
    float* out = nullptr;
    check(cudaMalloc(&dcols, cols.size() * sizeof(int)), "malloc");
    check(cudaMalloc(&out, size_t(n) * sizeof(float)), "malloc");
    check(cudaMemcpy(dcols, cols.data(), cols.size() * sizeof(int), cudaMemcpyHostToDevice), "copy");
    for (int i = 0; i < kTable; ++i) {
      const Row& row = table[i];
      const int per_thread = row.adds_a_thread, total = kRows * kPerRow;
      results[i][k] = time_launch([&](cudaStream_t s) {
        if (row.kind <= 1) rows_kernel<<<kRows, row.threads, 0, s>>>(dcols, kPerRow, out, row.kind == 1);
        else if (row.kind == 2)
          flat_kernel<<<(total / per_thread + row.threads - 1) / row.threads, row.threads, 0, s>>>(total, n, out,
                                                                                                  per_thread);
        else rows_kernel<<<1, 32, 0, s>>>(dcols, 0, out, false);
      });
    }
    cudaFree(dcols);
    cudaFree(out);
  }
  for (int i = 0; i < kTable; ++i)
    std::printf("| %s | %d | %.2f | %.2f | %.2f |\n", table[i].name, table[i].threads, results[i][0], results[i][1],
                results[i][2]);
  check(cudaGetLastError(), "kernels");
  return 0;
}
