// Shared by the standalone CUDA benches (bench_atomic_floor.cu, bench_binned_scatter.cu): an error check
// that stops the bench, and the time of one launch sequence taken from CUDA graphs of many of it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// µs a launch of `launch(stream)`: run `warmup` times, then `launches` of it captured in a graph, whose
// `repeats` launches are timed with events; the median. A graph of many launches leaves out the host's
// launch cost, as XLA's graph loops do.
template <typename Launch>
float time_in_graph(Launch&& launch, int launches, int repeats, int warmup) {
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  for (int i = 0; i < warmup; ++i) launch(s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
  for (int i = 0; i < launches; ++i) launch(s);
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  std::vector<float> us;
  for (int r = 0; r < repeats; ++r) {
    check(cudaEventRecord(a, s), "record");
    check(cudaGraphLaunch(exec, s), "graph launch");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "run");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    us.push_back(ms * 1000.f / float(launches));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}
