// numba_cpu.h -- Numba CPU kernels, called from one generic FFI handler.
//
// Python compiles, per (kernel, dtypes, ranks), a Numba @cfunc with the
// signature `int32 entry(void** data, const int64_t* dims)`: `data` holds one
// pointer per array (inputs, then outputs), `dims` the arrays' dimensions
// back to back. It returns 0, or nonzero when the kernel raised. The handler
// calls it directly: no Python, no GIL.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernel_args.h"
#include "registry.h"

namespace xlakern {

struct NumbaCpuKernel : Kernel {
  using Entry = int32_t (*)(void** data, const int64_t* dims);
  NumbaCpuKernel(std::string key, std::string name, Entry entry, std::vector<ArgSpec> specs,
                 size_t n_inputs, bool serialize)
      : Kernel(std::move(key), std::move(name)),
        entry(entry), specs(std::move(specs)), n_inputs(n_inputs), serialize(serialize) {}
  const char* kind() const override { return "numba_cpu"; }

  const Entry entry;
  const std::vector<ArgSpec> specs;  // inputs, then outputs
  const size_t n_inputs;
  // Numba's "workqueue" threading layer aborts the process when two threads
  // enter parallel code at once; kernels that would run on it take a lock.
  const bool serialize;
};

// Handlers of the "xlakern.numba_cpu" target, by XLA execution stage.
XLA_FFI_Handler* numba_cpu_instantiate();
XLA_FFI_Handler* numba_cpu_execute();
// Type id and info of the per-instruction state, for jax.ffi.register_ffi_type.
XLA_FFI_TypeId* numba_cpu_state_type_id();
const XLA_FFI_TypeInfo* numba_cpu_state_type_info();

}  // namespace xlakern
