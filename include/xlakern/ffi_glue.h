// xlakern/ffi_glue.h -- helpers for the FFI handlers xlakern generates.
//
// Only generated code includes this header (it pulls in XLA's FFI API from the
// installed jaxlib). Each generated handler decodes its call frame with the
// typed FFI API, builds xk::Tensor views, calls the user's entry point inside
// guarded_call, and turns any C++ exception into an ffi::Error.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xlakern/xlakern.h"

// The CUDA runtime's stream handle, declared the way driver_types.h declares
// it, so host-compiled handlers can receive XLA's stream without CUDA headers.
typedef struct CUstream_st* cudaStream_t;

#if defined(__GNUC__)
#define XK_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define XK_EXPORT extern "C"
#endif

namespace xk {
namespace detail {

namespace ffi = ::xla::ffi;

inline DType dtype_from_ffi(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return DType::Bool;
    case ffi::DataType::S8: return DType::Int8;
    case ffi::DataType::S16: return DType::Int16;
    case ffi::DataType::S32: return DType::Int32;
    case ffi::DataType::S64: return DType::Int64;
    case ffi::DataType::U8: return DType::UInt8;
    case ffi::DataType::U16: return DType::UInt16;
    case ffi::DataType::U32: return DType::UInt32;
    case ffi::DataType::U64: return DType::UInt64;
    case ffi::DataType::F16: return DType::Float16;
    case ffi::DataType::BF16: return DType::BFloat16;
    case ffi::DataType::F32: return DType::Float32;
    case ffi::DataType::F64: return DType::Float64;
    case ffi::DataType::C64: return DType::Complex64;
    case ffi::DataType::C128: return DType::Complex128;
    default: return DType::Invalid;
  }
}

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

// Adapts the FFI call's thread pool to the type-erased handle parallel_for uses.
class FfiThreadPool {
 public:
  explicit FfiThreadPool(ffi::ThreadPool pool) : pool_(pool) {
    ref_.pool = &pool_;
    ref_.count_threads = &FfiThreadPool::count_threads;
    ref_.schedule = &FfiThreadPool::schedule;
  }
  ThreadPoolRef* ref() { return &ref_; }

 private:
  static int64_t count_threads(void* pool) {
    return static_cast<ffi::ThreadPool*>(pool)->num_threads();
  }
  static void schedule(void* pool, void (*task)(void*), void* arg) {
    static_cast<ffi::ThreadPool*>(pool)->Schedule([task, arg] { task(arg); });
  }
  ffi::ThreadPool pool_;
  ThreadPoolRef ref_;
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
