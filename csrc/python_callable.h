// python_callable.h -- GPU calls that run a Python function (numba_cuda_callable).
//
// The one path that necessarily takes the GIL per call: the handler passes
// XLA's buffers and stream to the Python hook, which wraps them as Numba
// device arrays and calls the user's function. It is not graph-compatible
// (Python launches cannot be captured reliably), so its handler carries no
// command-buffer trait.
#pragma once

#include <string>

#include "bridge_target.h"
#include "registry.h"

namespace xlakern {

struct PythonCallable : Kernel {
  static constexpr const char* kWhat = "Python function";
  static constexpr const char* kWrapper = "numba_cuda_callable";
  PythonCallable(std::string key, std::string name, size_t n_inputs)
      : Kernel(std::move(key), std::move(name)), n_inputs(n_inputs) {}
  const char* kind() const override { return "python_callable"; }
  const size_t n_inputs;
};

// The "xlakern.python_callable" target.
const BridgeTarget& python_callable_target();

}  // namespace xlakern
