// CPU kernels of binary_csrmv_indexed / binary_csrmm_indexed: xlakern.event's CSR products whose slot
// p weighs data[perm[p]] (weights kept in another order, e.g. CSC order read through the CSR arrays of
// the transpose). The permutation is read inside event_sparse_cpu.h's gather and scatter, so a scatter
// reads the weights of active rows only. Same attributes, orientation, output dtype and out-of-range
// policy as event_sparse (event_cpu.cc); a perm entry outside [0, nse) reads weight 0.

#include <cstdint>

#include "event_common.h"
#include "event_sparse_cpu.h"

// @xk event_sparse_indexed arg arg arg arg arg ret attr.nrows:int64 attr.ncols:int64 attr.transpose:bool attr.binary:bool
void event_sparse_indexed(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr,
                          const xk::Tensor perm, const xk::Tensor spikes, xk::Tensor out, int64_t nrows, int64_t ncols,
                          bool transpose, bool binary) {
  using namespace xk_event;
  const Geometry g{nrows, ncols, batch_of(spikes), indices.numel(), data.numel() == 1};
  check_sparse(data, indices, indptr, spikes, out, nrows, ncols, -1, transpose);
  XK_CHECK(g.homo || perm.numel() == g.nse) << "perm must hold one weight index per synapse";
  XK_CHECK(g.homo || perm.dtype() == indices.dtype()) << "perm must have the dtype of indices";
  if (out.numel() == 0) return;
  dispatch_sparse(data, indices, spikes, binary, [&](auto wt, auto it, auto st, auto rule) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    using I = typename decltype(it)::type;
    using S = typename decltype(st)::type;
    const I* p = g.homo ? nullptr : perm.data_ptr<I>();
    if (transpose)
      sparse_scatter<true>(data.data_ptr<W>(), p, indices.data_ptr<I>(), indptr.data_ptr<I>(),
                           spikes.data_ptr<S>(), out.data_ptr<A>(), g, -1, rule);
    else
      sparse_gather<true>(data.data_ptr<W>(), p, indices.data_ptr<I>(), indptr.data_ptr<I>(),
                          spikes.data_ptr<S>(), out.data_ptr<A>(), g, -1, rule);
  });
}
