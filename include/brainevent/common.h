// brainevent/common.h -- BrainEvent's spelling of the xlakern C++ API, so
// sources written for BrainEvent compile unchanged. Unlike BrainEvent, failed
// checks throw (and surface as Python exceptions) instead of aborting.
#pragma once

#include "xlakern/xlakern.h"

namespace BE {
using ::xk::DType;
using ::xk::Tensor;
using ::xk::dtype_name;
using ::xk::dtype_size;
using ::xk::float16_t;
using ::xk::bfloat16_t;
using ::xk::complex64_t;
using ::xk::complex128_t;
using ::xk::parallel_for;
inline constexpr int kMaxDim = ::xk::kMaxDims;
}  // namespace BE

#define BE_CHECK(cond) XK_CHECK(cond)
#if defined(XK_CUDA_CHECK)
#define BE_CUDA_CHECK(expr) XK_CUDA_CHECK(expr)
#define BE_CHECK_KERNEL_LAUNCH() XK_CHECK_LAUNCH()
#endif
#define BE_DISPATCH_FLOATING(DTYPE, SCALAR, ...) XK_DISPATCH_FLOATING(DTYPE, SCALAR, __VA_ARGS__)
#define BE_DISPATCH_FLOATING_AND_HALF(DTYPE, SCALAR, ...) \
  XK_DISPATCH_FLOATING_AND_HALF(DTYPE, SCALAR, __VA_ARGS__)
#define BE_DISPATCH_INTEGRAL(DTYPE, SCALAR, ...) XK_DISPATCH_INTEGRAL(DTYPE, SCALAR, __VA_ARGS__)
#define BE_DISPATCH_ALL_TYPES(DTYPE, SCALAR, ...) XK_DISPATCH_ALL_TYPES(DTYPE, SCALAR, __VA_ARGS__)
