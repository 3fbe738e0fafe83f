// numba_cpu.h -- Numba CPU kernels, called from one generic FFI handler.
//
// Python compiles, per (kernel, dtypes, ranks), a Numba @cfunc with the
// signature `int32 cfunc(void** data, const int64_t* dims)`: `data` holds one
// pointer per array (inputs, then outputs), `dims` the arrays' dimensions
// back to back. It returns 0, or nonzero when the kernel raised. The handler
// calls it directly: no Python, no GIL.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bridge_target.h"
#include "kernel_args.h"
#include "registry.h"

namespace xlakern {

struct NumbaCpuKernel : Kernel {
  // The compiled @cfunc: returns nonzero when the kernel raised.
  using Cfunc = int32_t (*)(void** data, const int64_t* dims);
  static constexpr const char* kWhat = "Numba CPU kernel";
  static constexpr const char* kWrapper = "numba_kernel";
  NumbaCpuKernel(std::string key, std::string name, Cfunc cfunc, std::vector<ArgSpec> specs,
                 size_t n_inputs, bool serialize)
      : Kernel(std::move(key), std::move(name)),
        cfunc(cfunc), specs(std::move(specs)), n_inputs(n_inputs), serialize(serialize) {}
  const char* kind() const override { return "numba_cpu"; }

  const Cfunc cfunc;
  const std::vector<ArgSpec> specs;  // inputs, then outputs
  const size_t n_inputs;
  // Numba's "workqueue" threading layer aborts the process when two threads
  // enter parallel code at once; kernels that would run on it take a lock.
  const bool serialize;
};

// The "xlakern.numba_cpu" target.
const BridgeTarget& numba_cpu_target();

}  // namespace xlakern
