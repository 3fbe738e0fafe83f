// CUDA kernel of csr_slice_rows (see csr_slice_cpu.cc): the output is cleared on XLA's stream, then one
// warp per selected row adds that row's synapses into its dense output row; lanes of a warp may hit
// one column (a repeated column), so the adds are atomic. Only the selected rows' synapses are read.

#include <cuda_runtime.h>
#include <cstdint>

#include "event_common.h"
#include "csr_tools_common.h"
#include "event_sparse_cuda.cuh"

namespace {

using namespace xk_event;

template <typename W, typename I>
__global__ void __launch_bounds__(kThreads) slice_rows_kernel(const W* __restrict__ data, const I* __restrict__ idx,
                                                              const I* __restrict__ indptr,
                                                              const I* __restrict__ selected,
                                                              typename AccOf<W>::type* __restrict__ out, int64_t nsel,
                                                              int64_t nrows, int64_t ncols, int64_t nse, bool homo) {
  using A = typename AccOf<W>::type;
  const int64_t i = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (i >= nsel) return;
  const int64_t r = int64_t(selected[i]);
  if (uint64_t(r) >= uint64_t(nrows)) return;  // a row outside the matrix stays zero
  int64_t begin, end;
  row_range(indptr, -1, nse, r, begin, end);
  const A w0 = homo ? A(widen(data[0])) : A(0);
  A* dst = out + i * ncols;
  for (int64_t p = begin + lane; p < end; p += 32) {
    const int64_t j = int64_t(idx[p]);
    if (uint64_t(j) < uint64_t(ncols)) atomicAdd(dst + j, homo ? w0 : A(widen(data[p])));  // else dropped
  }
}

}  // namespace

// @xk csr_slice_rows arg arg arg arg ret attr.ncols:int64 stream
void csr_slice_rows(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr,
                    const xk::Tensor selected, xk::Tensor out, int64_t ncols, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t nrows = indptr.numel() - 1, nse = indices.numel(), nsel = selected.numel();
  check_slice_rows(data, indices, indptr, selected, out, ncols);
  if (out.numel() == 0) return;
  XK_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), st));
  if (nse == 0) return;
  dispatch_weights(data.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      slice_rows_kernel<<<grid_for_warps(nsel), kThreads, 0, st>>>(
          data.data_ptr<W>(), indices.data_ptr<I>(), indptr.data_ptr<I>(), selected.data_ptr<I>(), out.data_ptr<A>(),
          nsel, nrows, ncols, nse, data.numel() == 1);
    });
  });
  XK_CHECK_LAUNCH();
}
