// xlakern/ffi_glue.h -- helpers for the FFI handlers xlakern generates for CUDA modules.
//
// Only generated code includes this header (it pulls in XLA's typed FFI API from the
// installed jaxlib). Each generated handler decodes its call frame with the typed FFI API,
// builds xk::Tensor views, calls the user's entry point inside guarded_call, and turns any
// C++ exception into an ffi::Error. C++ modules get the frame glue (ffi_frame.h), which
// reads the call frame through XLA's C API and compiles several times faster; CUDA modules
// move to it once a GPU run of the whole suite has passed on it, and this header goes then.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xlakern/ffi_frame.h"  // dtype_from_xla, cudaStream_t, XK_EXPORT
#include "xlakern/ffi_thread_pool.h"
#include "xlakern/xlakern.h"

namespace xk {
namespace detail {

namespace ffi = ::xla::ffi;

// ffi::DataType's values are XLA_FFI_DataType's.
inline DType dtype_from_ffi(ffi::DataType t) { return frame::dtype_from_xla(static_cast<XLA_FFI_DataType>(t)); }

inline Tensor to_tensor(const ffi::AnyBuffer& buffer, const char* role, int index) {
  DType dt = dtype_from_ffi(buffer.element_type());
  auto dims = buffer.dimensions();
  if (dt == DType::Invalid) {
    throw Error(std::string(role) + " " + std::to_string(index) +
                " has an element type xlakern kernels do not take (XLA type id " +
                std::to_string(static_cast<int>(buffer.element_type())) +
                "); use one of the 15 JAX dtypes bool..complex128");
  }
  if (dims.size() > static_cast<size_t>(kMaxDims)) {
    throw Error(std::string(role) + " " + std::to_string(index) + " has " +
                std::to_string(dims.size()) + " dimensions; xk::Tensor holds at most " +
                std::to_string(kMaxDims) + ", reshape before the call");
  }
  return Tensor(buffer.untyped_data(), dt, dims.begin(), static_cast<int>(dims.size()));
}

// The handlers that mod.fn(...) calls (target "<module>.<fn>.xk") take one
// control attribute, xlakern_ctl = [zero mask, unbatched rank of each buffer
// (inputs, then outputs)]. With jax.vmap's "broadcast_all"/"expand_dims" the
// buffers carry leading batch dimensions beyond those ranks: the entry point
// is then called once per batch element on views at offset pointers, as the
// Numba bridges do. Inputs broadcast against the outputs' batch shape (fewer
// or size-1 batch dims). Everything lives on the stack: no allocation per call.
template <size_t N>
class ElementLoop {
 public:
  ElementLoop(ffi::Span<const int64_t> ctl, const std::array<const ffi::AnyBuffer*, N>& bufs,
              size_t n_inputs)
      : bufs_(bufs) {
    if (ctl.size() != N + 1) {
      throw Error("the xlakern_ctl attribute has " + std::to_string(ctl.size()) +
                  " entries, the function has " + std::to_string(N) +
                  " buffers; call it as mod.fn(...) or through jax.ffi.ffi_call(\"<module>.<fn>\")");
    }
    zero_mask_ = ctl[0];
    for (size_t a = 0; a < N; ++a) {
      ranks_[a] = static_cast<int>(ctl[a + 1]);
      const int rank = static_cast<int>(bufs_[a]->dimensions().size());
      if (ranks_[a] < 0 || ranks_[a] > rank || ranks_[a] > kMaxDims) {
        throw Error(label(a, n_inputs) + " has rank " + std::to_string(rank) +
                    ", fewer than the " + std::to_string(ranks_[a]) + " it was traced with");
      }
    }
    if (n_inputs < N) {  // a function without outputs runs once
      const auto out_dims = bufs_[n_inputs]->dimensions();
      batch_rank_ = static_cast<int>(out_dims.size()) - ranks_[n_inputs];
      if (batch_rank_ > kMaxDims) {
        throw Error("more than " + std::to_string(kMaxDims) + " vmap batch dimensions");
      }
      for (int j = 0; j < batch_rank_; ++j) count_ *= (batch_[j] = out_dims[j]);
    }
    for (size_t a = 0; a < N; ++a) {
      const auto dims = bufs_[a]->dimensions();
      const int extra = static_cast<int>(dims.size()) - ranks_[a];
      if (extra > batch_rank_ || (a >= n_inputs && extra != batch_rank_)) {
        throw Error(label(a, n_inputs) + " has " + std::to_string(extra) +
                    " batch dimension(s), the outputs " + std::to_string(batch_rank_));
      }
      int64_t block = static_cast<int64_t>(ffi::ByteWidth(bufs_[a]->element_type()));
      for (int j = static_cast<int>(dims.size()) - 1; j >= extra; --j) block *= dims[j];
      for (int j = batch_rank_ - 1; j >= 0; --j) {
        const int own = j - (batch_rank_ - extra);  // this buffer's dim for batch dim j
        const int64_t d = own >= 0 ? dims[own] : 1;
        if (d != 1 && d != batch_[j]) {
          throw Error(label(a, n_inputs) + "'s batch dimension " + std::to_string(own) + " is " +
                      std::to_string(d) + ", the outputs' is " + std::to_string(batch_[j]));
        }
        byte_strides_[a][j] = d == 1 ? 0 : block;
        block *= d;
      }
    }
  }

  int64_t count() const { return count_; }
  int64_t zero_mask() const { return zero_mask_; }

  // The view of buffer `a` (inputs, then outputs) for batch element `b`.
  Tensor tensor(size_t a, int64_t b) const {
    const ffi::AnyBuffer& buf = *bufs_[a];
    DType dt = dtype_from_ffi(buf.element_type());
    if (dt == DType::Invalid) to_tensor(buf, "buffer", static_cast<int>(a));  // throws: names the type
    int64_t offset = 0;
    for (int j = batch_rank_ - 1; j >= 0; --j) {
      offset += (b % batch_[j]) * byte_strides_[a][j];
      b /= batch_[j];
    }
    const auto dims = buf.dimensions();
    return Tensor(static_cast<char*>(buf.untyped_data()) + offset, dt,
                  dims.begin() + (dims.size() - ranks_[a]), ranks_[a]);
  }

  // Clears each output whose bit is set in the mask, the whole batched buffer
  // at once, with set(pointer, bytes).
  template <typename Set>
  void zero_outputs(size_t n_inputs, Set&& set) const {
    for (size_t o = 0; zero_mask_ != 0 && o < 63 && n_inputs + o < N; ++o) {
      const size_t bytes = bufs_[n_inputs + o]->size_bytes();
      if (((zero_mask_ >> o) & 1) && bytes > 0) set(bufs_[n_inputs + o]->untyped_data(), bytes);
    }
  }

 private:
  static std::string label(size_t a, size_t n_inputs) {
    return a < n_inputs ? "input " + std::to_string(a) : "output " + std::to_string(a - n_inputs);
  }

  const std::array<const ffi::AnyBuffer*, N>& bufs_;
  int ranks_[N > 0 ? N : 1] = {};
  int64_t byte_strides_[N > 0 ? N : 1][kMaxDims] = {};
  int64_t batch_[kMaxDims] = {};
  int batch_rank_ = 0;
  int64_t count_ = 1;
  int64_t zero_mask_ = 0;
};

// Runs a user entry point; every C++ exception becomes an FFI error whose
// message names the kernel, because nothing may escape into XLA.
template <typename F>
ffi::Error guarded_call(const char* kernel, F&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      utf8_safe(std::string("xlakern kernel '") + kernel + "' failed: " + e.what()));
  } catch (...) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("xlakern kernel '") + kernel +
                          "' failed: a C++ exception of unknown type was thrown");
  }
}

}  // namespace detail
}  // namespace xk
