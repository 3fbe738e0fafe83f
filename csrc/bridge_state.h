// bridge_state.h -- the per-instruction state of the runtime's generic targets.
//
// At XLA's instantiate stage each custom call looks its kernel up by the
// content key in its `kernel` attribute, once; the state keeps the kernel
// alive for as long as XLA keeps the instruction. One template serves the
// Numba CPU, CUDA image and Python-callable targets.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "registry.h"
#include "xla/ffi/api/ffi.h"

namespace xlakern {

template <typename K>
struct BridgeState {
  static xla::ffi::TypeId id;  // filled in when jax registers the type with XLA
  static const XLA_FFI_TypeInfo info;
  std::shared_ptr<const K> kernel;
};

template <typename K>
xla::ffi::TypeId BridgeState<K>::id = XLA_FFI_UNKNOWN_TYPE_ID;
template <typename K>
const XLA_FFI_TypeInfo BridgeState<K>::info = xla::ffi::MakeTypeInfo<BridgeState<K>>();

// The instantiate stage: finds the kernel of type K registered under `key`.
// `what` names the kind for the message ("Numba CPU kernel"), `wrapper` the
// Python call that registers one ("numba_kernel").
template <typename K>
xla::ffi::ErrorOr<std::unique_ptr<BridgeState<K>>> instantiate_bridge_state(std::string_view key,
                                                                             const char* what,
                                                                             const char* wrapper) {
  auto kernel = std::dynamic_pointer_cast<const K>(Registry::instance().find_kernel(std::string(key)));
  if (!kernel) {
    return xla::ffi::Unexpected(xla::ffi::Error(
        xla::ffi::ErrorCode::kNotFound,
        std::string("xlakern: this program runs ") + what + " " + std::string(key.substr(0, 16)) +
            "..., which this process has not compiled. The program was probably compiled by "
            "another process (JAX's persistent compilation cache, or jax.export); call the " + wrapper +
            " wrapper in this process before running it."));
  }
  return std::make_unique<BridgeState<K>>(BridgeState<K>{std::move(kernel)});
}

}  // namespace xlakern
