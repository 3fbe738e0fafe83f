// The mv gather with kExact: skips decided in double precision (ExactSkip), the table only for draws too close to call
// (jitc_cuda_gather_mv.cuh; a translation unit of its own so that it compiles beside the others).

#include "jitc_cuda_gather_mv.cuh"

namespace xk_jitc_cuda {
template void launch_gather_mv_planned<kExact>(const Product&, int, int, const MvPlan&, int64_t, double);
}  // namespace xk_jitc_cuda
