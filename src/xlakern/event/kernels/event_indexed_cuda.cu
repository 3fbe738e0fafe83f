// CUDA kernels of binary_csrmv_indexed / binary_csrmm_indexed: xlakern.event's CSR products whose slot
// p weighs data[perm[p]] (weights kept in another order, e.g. CSC order read through the CSR arrays of
// the transpose). The permutation is read inside the plain gather and scatter of event_sparse_cuda.cuh,
// so a scatter reads the weights of active rows only, never a gathered copy of all of them. The gather
// is the plain one (not the bitmask gather of event_cuda.cu): its weight reads are random anyway.
// Same attributes, orientation, output dtype and out-of-range policy as event_sparse; a perm entry
// outside [0, nse) reads weight 0. With `deterministic` the scatter sums in fixed point, the same bits on
// every run (event_exact_scatter_cuda.cuh), in `scratch` of exact_scatter_words(outputs) words; otherwise
// `scratch` is unused.

#include <cuda_runtime.h>
#include <cstdint>

#include "event_common.h"
#include "event_exact_scatter_cuda.cuh"
#include "event_sparse_cuda.cuh"

// @xk event_sparse_indexed arg arg arg arg arg ret ret attr.nrows:int64 attr.ncols:int64 attr.transpose:bool attr.binary:bool attr.deterministic:bool stream
void event_sparse_indexed(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr,
                          const xk::Tensor perm, const xk::Tensor spikes, xk::Tensor out, xk::Tensor scratch,
                          int64_t nrows, int64_t ncols, bool transpose, bool binary, bool deterministic,
                          int64_t stream) {
  using namespace xk_event;
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t batch = batch_of(spikes), nse = indices.numel();
  const bool homo = data.numel() == 1;
  check_sparse(data, indices, indptr, spikes, out, nrows, ncols, -1, transpose);
  XK_CHECK(homo || perm.numel() == nse) << "perm must hold one weight index per synapse";
  XK_CHECK(homo || perm.dtype() == indices.dtype()) << "perm must have the dtype of indices";
  if (transpose && deterministic) {
    const ExactSums sums = exact_sums(scratch, out.numel());
    dispatch_sparse(data, indices, spikes, binary, [&](auto wt, auto it, auto stag, auto rule) {
      using W = typename decltype(wt)::type;
      using A = typename AccOf<W>::type;
      using I = typename decltype(it)::type;
      using S = typename decltype(stag)::type;
      launch_exact_scatter<true>(data.data_ptr<W>(), homo ? nullptr : perm.data_ptr<I>(), indices.data_ptr<I>(),
                                 indptr.data_ptr<I>(), spikes.data_ptr<S>(), out.data_ptr<A>(), sums, nrows, ncols,
                                 batch, nse, int64_t(-1), homo, rule, st);
    });
    XK_CHECK_LAUNCH();
    return;
  }
  PlainLaunch launch;
  if (!plain_launch(out, nrows, batch, transpose, st, launch)) return;
  const dim3 grid = launch.grid;
  const int rows_per_warp = launch.rows_per_warp;
  dispatch_sparse(data, indices, spikes, binary, [&](auto wt, auto it, auto stag, auto rule) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    using I = typename decltype(it)::type;
    using S = typename decltype(stag)::type;
    const I* p = homo ? nullptr : perm.data_ptr<I>();
    if (transpose)
      launch_after_clear(launch.after_clear, sparse_scatter_kernel<true, W, I, S, decltype(rule)::kBinary>, grid,
                         dim3(kThreads), 0, st, data.data_ptr<W>(), p, indices.data_ptr<I>(), indptr.data_ptr<I>(),
                         spikes.data_ptr<S>(), out.data_ptr<A>(), nrows, ncols, batch, nse, int64_t(-1), homo, rule,
                         rows_per_warp, range_read());
    else
      launch_sparse_gather<true>(data.data_ptr<W>(), p, indices.data_ptr<I>(), indptr.data_ptr<I>(),
                                 spikes.data_ptr<S>(), out.data_ptr<A>(), nrows, ncols, batch, nse, int64_t(-1), homo,
                                 rule, st);
  });
  XK_CHECK_LAUNCH();
}
