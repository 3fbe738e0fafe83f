// bridge_target.h -- one bridge's FFI target, as the runtime describes it to
// Python for registration with XLA.
//
// A bridge is the path from one kind of Python kernel (a Numba CPU kernel, a
// Numba CUDA kernel image, a Python callable) to one generic FFI target of the
// runtime. Each bridge's .cc file defines its execute (and, where needed,
// initialize) handler and one BridgeTarget; the instantiate stage is the same
// for all of them: it finds the kernel named by the call's `kernel` attribute.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "bridge_state.h"
#include "xla/ffi/api/ffi.h"

namespace xlakern {

struct BridgeTarget {
  const char* name;             // the FFI target, e.g. "xlakern.numba_cpu"
  const char* platform;         // jax's platform name for it: "cpu" or "CUDA"
  const char* state_type_name;  // the FFI type of its per-instruction state
  XLA_FFI_TypeId* state_type_id;
  const XLA_FFI_TypeInfo* state_type_info;
  XLA_FFI_Handler* instantiate;
  XLA_FFI_Handler* initialize;  // nullptr: the target has no initialize stage
  XLA_FFI_Handler* execute;
  // XLA may capture its executions into a CUDA graph. Passed with the
  // registration: a bundle of stage handlers does not report its traits.
  bool command_buffer_compatible;
};

// The instantiate stage of kernel type K's target. K names itself in
// messages with K::kWhat ("Numba CPU kernel") and the Python call that
// registers one with K::kWrapper ("numba_kernel").
template <typename K>
XLA_FFI_Error* instantiate_bridge_kernel(XLA_FFI_CallFrame* call_frame) {
  static auto* handler =
      xla::ffi::Ffi::BindInstantiate()
          .Attr<std::string_view>("kernel")
          .Attr<int64_t>("zero")
          .To([](std::string_view key, int64_t) {
            return instantiate_bridge_state<K>(key, K::kWhat, K::kWrapper);
          })
          .release();
  return handler->Call(call_frame);
}

// The execute stage's binding, after the contexts `binding` already has (XLA's
// stream, for the GPU bridges): the state, the call's attributes, the buffers.
template <typename K, typename Binding>
auto bind_bridge_execute(Binding binding) {
  return std::move(binding)
      .template Ctx<xla::ffi::State<BridgeState<K>>>()
      .template Attr<std::string_view>("kernel")
      .template Attr<int64_t>("zero")
      .RemainingArgs()
      .RemainingRets();
}

// The descriptor of kernel type K's target, its state being BridgeState<K>.
template <typename K>
BridgeTarget describe_bridge_target(const char* name, const char* platform,
                                    const char* state_type_name, XLA_FFI_Handler* initialize,
                                    XLA_FFI_Handler* execute, bool command_buffer_compatible) {
  return BridgeTarget{name,
                      platform,
                      state_type_name,
                      &BridgeState<K>::id,
                      &BridgeState<K>::info,
                      &instantiate_bridge_kernel<K>,
                      initialize,
                      execute,
                      command_buffer_compatible};
}

}  // namespace xlakern
