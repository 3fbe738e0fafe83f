// xlakern/dtype.h -- the 15 JAX element types and their C++ counterparts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "xlakern/config.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace xk {

// Enumerator names follow BrainEvent's so that seed sources using
// `BE::DType::Float32` compile unchanged.
enum class DType : uint8_t {
  Bool = 0,
  Int8,
  Int16,
  Int32,
  Int64,
  UInt8,
  UInt16,
  UInt32,
  UInt64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Complex64,
  Complex128,
  Invalid = 255,
};

inline constexpr int kNumDTypes = 15;

// 16-bit floats: CUDA's own types in CUDA code, opaque storage on the host
// (host code reads them through float16_bits/bfloat16_bits helpers).
#if defined(__CUDACC__)
using float16_t = __half;
using bfloat16_t = __nv_bfloat16;
#else
struct float16_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};
#endif

struct complex64_t {
  float real;
  float imag;
};
struct complex128_t {
  double real;
  double imag;
};

XK_INLINE constexpr size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::Bool:
    case DType::Int8:
    case DType::UInt8:
      return 1;
    case DType::Int16:
    case DType::UInt16:
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::Int32:
    case DType::UInt32:
    case DType::Float32:
      return 4;
    case DType::Int64:
    case DType::UInt64:
    case DType::Float64:
    case DType::Complex64:
      return 8;
    case DType::Complex128:
      return 16;
    default:
      return 0;
  }
}

XK_INLINE constexpr const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::Bool: return "bool";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
    case DType::UInt16: return "uint16";
    case DType::UInt32: return "uint32";
    case DType::UInt64: return "uint64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
    default: return "invalid";
  }
}

// dtype_of<T>(): the DType whose elements have C++ type T (cv-qualifiers
// ignored); DType::Invalid for any other type.
namespace detail {
template <typename T> struct DTypeOf { static constexpr DType value = DType::Invalid; };
#define XK_DTYPE_OF_(T, D) \
  template <> struct DTypeOf<T> { static constexpr DType value = DType::D; }
XK_DTYPE_OF_(bool, Bool);
XK_DTYPE_OF_(int8_t, Int8);
XK_DTYPE_OF_(int16_t, Int16);
XK_DTYPE_OF_(int32_t, Int32);
XK_DTYPE_OF_(int64_t, Int64);
XK_DTYPE_OF_(uint8_t, UInt8);
XK_DTYPE_OF_(uint16_t, UInt16);
XK_DTYPE_OF_(uint32_t, UInt32);
XK_DTYPE_OF_(uint64_t, UInt64);
XK_DTYPE_OF_(float16_t, Float16);
XK_DTYPE_OF_(bfloat16_t, BFloat16);
XK_DTYPE_OF_(float, Float32);
XK_DTYPE_OF_(double, Float64);
XK_DTYPE_OF_(complex64_t, Complex64);
XK_DTYPE_OF_(complex128_t, Complex128);
#undef XK_DTYPE_OF_
}  // namespace detail

template <typename T>
XK_INLINE constexpr DType dtype_of() {
  return detail::DTypeOf<std::remove_cv_t<T>>::value;
}

}  // namespace xk
