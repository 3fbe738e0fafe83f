// python_callable.h -- GPU calls that run a Python function (numba_cuda_callable).
//
// The one path that necessarily takes the GIL per call: the handler passes
// XLA's buffers and stream to the Python hook, which wraps them as Numba
// device arrays and calls the user's function. It is not graph-compatible
// (Python launches cannot be captured reliably), so its handler carries no
// command-buffer trait.
#pragma once

#include <string>

#include "registry.h"
#include "xla/ffi/api/ffi.h"

namespace xlakern {

struct PythonCallable : Kernel {
  PythonCallable(std::string key, std::string name, size_t n_inputs)
      : Kernel(std::move(key), std::move(name)), n_inputs(n_inputs) {}
  const char* kind() const override { return "python_callable"; }
  const size_t n_inputs;
};

XLA_FFI_Handler* python_callable_instantiate();
XLA_FFI_Handler* python_callable_execute();
XLA_FFI_TypeId* python_callable_state_type_id();
const XLA_FFI_TypeInfo* python_callable_state_type_info();

}  // namespace xlakern
