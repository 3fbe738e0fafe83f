// The mv gather with kTableWide: one 1,024-thread block an SM, the table's short end in all the shared
// memory a block may take, the rest in global memory behind a branch (jitc_cuda_gather_mv.cuh; a
// translation unit of its own so that it compiles beside the others).

#include "jitc_cuda_gather_mv.cuh"

namespace xk_jitc_cuda {
template void launch_gather_mv_planned<kTableWide>(const Product&, int, int, const MvPlan&, int64_t, double);
}  // namespace xk_jitc_cuda
