// cuda_image.h -- compiled GPU kernels (Numba CUDA's cubin or PTX) launched
// by the runtime with the CUDA driver API, from one generic FFI handler.
//
// Arrays are passed in Numba's kernel-argument layout: for each array,
// meminfo, parent, nitems, itemsize, data, shape[ndim], strides[ndim] (bytes),
// every field 8 bytes. The handler carries the command-buffer trait, so XLA
// may capture its launches into a CUDA graph.
#pragma once

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bridge_target.h"
#include "cuda_driver.h"
#include "kernel_args.h"
#include "registry.h"

namespace xlakern {

struct CudaImageKernel : Kernel {
  static constexpr const char* kWhat = "Numba CUDA kernel";
  static constexpr const char* kWrapper = "numba_cuda_kernel";
  CudaImageKernel(std::string key, std::string name, std::string image,
                  std::string function_name, std::vector<ArgSpec> specs, size_t n_inputs,
                  std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                  unsigned shared_mem)
      : Kernel(std::move(key), std::move(name)), image(std::move(image)),
        function_name(std::move(function_name)), specs(std::move(specs)), n_inputs(n_inputs),
        grid(grid), block(block), shared_mem(shared_mem) {}
  const char* kind() const override { return "cuda_image"; }

  // The kernel's function in `ctx`, loading the image into that context the
  // first time (one module per device context). Throws std::runtime_error.
  CUfunction function_for(CUcontext ctx) const;

  const std::string image;  // cubin, or PTX text (NUL-terminated) that the driver JITs
  const std::string function_name;  // the kernel's mangled name in the image
  const std::vector<ArgSpec> specs;
  const size_t n_inputs;
  const std::array<unsigned, 3> grid, block;
  const unsigned shared_mem;

 private:
  // The first context's function is also published lock-free: launches on one
  // GPU, the common case, take no lock.
  mutable std::atomic<CUcontext> first_ctx_{nullptr};
  mutable CUfunction first_function_ = nullptr;
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<CUcontext, CUfunction>> loaded_;
};

// Clears output o (views[n_inputs + o], the whole batched buffer) for each
// bit o set in `mask`, with cuMemsetD8Async on `stream` (so XLA may capture
// it into a CUDA graph). Returns an empty string or what failed. The Python
// callable bridge clears its outputs with it too.
std::string zero_outputs_on_stream(const std::vector<ArgView>& views, size_t n_inputs,
                                   int64_t mask, CUstream stream);

// A diagnostic for tests: when enabled, execute counts its calls and how many
// of them ran while XLA was capturing the stream into a CUDA graph (a graph
// replay launches the kernel without calling the handler at all).
struct LaunchProbe {
  int64_t executions;
  int64_t captured;
};
void enable_launch_probe(bool on);
LaunchProbe launch_probe();

// The "xlakern.cuda_image" target.
const BridgeTarget& cuda_image_target();

}  // namespace xlakern
