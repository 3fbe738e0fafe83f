// xlakern/xlakern.h -- the whole public C++ API of xlakern kernels.
//
//   #include <xlakern/xlakern.h>
//
//   // @xk add_one arg ret
//   void add_one(const xk::Tensor x, xk::Tensor out) {
//     const float* in = x.data<float>();
//     float* o = out.data<float>();
//     xk::parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
//       for (int64_t i = b; i < e; ++i) o[i] = in[i] + 1.0f;
//     });
//   }
#pragma once

#include "xlakern/config.h"
#include "xlakern/check.h"
#include "xlakern/dtype.h"
#include "xlakern/tensor.h"
#include "xlakern/dispatch.h"
#include "xlakern/parallel.h"
