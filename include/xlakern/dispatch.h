// xlakern/dispatch.h -- run code for the C++ type behind a runtime DType.
//
//   XK_DISPATCH_FLOATING(x.dtype(), scalar_t, {
//     scale<scalar_t>(x.data<scalar_t>(), out.data<scalar_t>(), x.numel());
//   });
//
// The body runs inside a lambda with `scalar_t` (the name you choose) bound to
// the element type. A dtype outside the family throws xk::Error naming it and
// the family, which the FFI handler turns into a Python exception.
#pragma once

#include <string>

#include "xlakern/check.h"
#include "xlakern/dtype.h"

namespace xk {
namespace detail {

template <typename T>
struct TypeTag {
  using type = T;
};

[[noreturn]] inline void unsupported_dtype(const char* family, DType dt,
                                           const char* supported) {
  throw Error(std::string(family) + ": unsupported dtype " + dtype_name(dt) +
              " (supported: " + supported + ")");
}

template <typename F>
decltype(auto) dispatch_floating(DType dt, const char* family, F&& f) {
  switch (dt) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: unsupported_dtype(family, dt, "float32, float64");
  }
}

template <typename F>
decltype(auto) dispatch_floating_and_half(DType dt, const char* family, F&& f) {
  switch (dt) {
    case DType::Float16: return f(TypeTag<float16_t>{});
    case DType::BFloat16: return f(TypeTag<bfloat16_t>{});
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: unsupported_dtype(family, dt, "float16, bfloat16, float32, float64");
  }
}

// BrainEvent counts bool as integral; so do we, for source compatibility.
template <typename F>
decltype(auto) dispatch_integral(DType dt, const char* family, F&& f) {
  switch (dt) {
    case DType::Bool: return f(TypeTag<bool>{});
    case DType::Int8: return f(TypeTag<int8_t>{});
    case DType::Int16: return f(TypeTag<int16_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::UInt8: return f(TypeTag<uint8_t>{});
    case DType::UInt16: return f(TypeTag<uint16_t>{});
    case DType::UInt32: return f(TypeTag<uint32_t>{});
    case DType::UInt64: return f(TypeTag<uint64_t>{});
    default:
      unsupported_dtype(family, dt,
                        "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64");
  }
}

template <typename F>
decltype(auto) dispatch_all(DType dt, const char* family, F&& f) {
  switch (dt) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Bool: case DType::Int8: case DType::Int16: case DType::Int32:
    case DType::Int64: case DType::UInt8: case DType::UInt16: case DType::UInt32:
    case DType::UInt64:
      return dispatch_integral(dt, family, static_cast<F&&>(f));
    default:
      unsupported_dtype(family, dt,
                        "bool, int8-int64, uint8-uint64, float32, float64");
  }
}

}  // namespace detail
}  // namespace xk

// The tag parameter gets a unique name so nested dispatches do not shadow each
// other, and the alias is [[maybe_unused]] for bodies that only need the dtype.
#define XK_CONCAT_INNER_(a, b) a##b
#define XK_CONCAT_(a, b) XK_CONCAT_INNER_(a, b)
#define XK_DISPATCH_IMPL_(FN, FAMILY, DTYPE, SCALAR, ...) \
  XK_DISPATCH_TAGGED_(FN, FAMILY, DTYPE, SCALAR, XK_CONCAT_(xk_type_tag_, __COUNTER__), __VA_ARGS__)
#define XK_DISPATCH_TAGGED_(FN, FAMILY, DTYPE, SCALAR, TAG, ...)  \
  ::xk::detail::FN((DTYPE), FAMILY, [&](auto TAG) {               \
    using SCALAR [[maybe_unused]] = typename decltype(TAG)::type; \
    __VA_ARGS__                                                   \
  })

#define XK_DISPATCH_FLOATING(DTYPE, SCALAR, ...) \
  XK_DISPATCH_IMPL_(dispatch_floating, "XK_DISPATCH_FLOATING", DTYPE, SCALAR, __VA_ARGS__)
#define XK_DISPATCH_FLOATING_AND_HALF(DTYPE, SCALAR, ...)                      \
  XK_DISPATCH_IMPL_(dispatch_floating_and_half, "XK_DISPATCH_FLOATING_AND_HALF", \
                    DTYPE, SCALAR, __VA_ARGS__)
#define XK_DISPATCH_INTEGRAL(DTYPE, SCALAR, ...) \
  XK_DISPATCH_IMPL_(dispatch_integral, "XK_DISPATCH_INTEGRAL", DTYPE, SCALAR, __VA_ARGS__)
#define XK_DISPATCH_ALL_TYPES(DTYPE, SCALAR, ...) \
  XK_DISPATCH_IMPL_(dispatch_all, "XK_DISPATCH_ALL_TYPES", DTYPE, SCALAR, __VA_ARGS__)
