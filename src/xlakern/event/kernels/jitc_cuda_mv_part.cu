// The mv gather with kTablePart: the table's short end in shared memory, the rest in global memory
// (jitc_cuda_gather_mv.cuh; a translation unit of its own so that it compiles beside the others).

#include "jitc_cuda_gather_mv.cuh"

namespace xk_jitc_cuda {
template void launch_gather_mv_planned<kTablePart>(const Product&, int, int, const MvPlan&, int64_t, double);
}  // namespace xk_jitc_cuda
