// CPU kernel of csr_slice_rows: the dense rows `selected` of a CSR matrix, one output row per entry
// of `selected` (in the accumulation dtype; Python casts back). Only the selected rows' synapses are
// read: each output row is cleared, then its row's weights are added at their columns, so repeated
// columns are summed. A selected row outside [0, rows) gives zeros; columns outside [0, cols) are
// dropped; indptr is clamped as in the event products. Parallel over selected rows (each owns its
// output row, so no writes collide).

#include <algorithm>
#include <cstdint>

#include "event_common.h"
#include "csr_tools_common.h"
#include "event_sparse_cpu.h"

// @xk csr_slice_rows arg arg arg arg ret attr.ncols:int64
void csr_slice_rows(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr,
                    const xk::Tensor selected, xk::Tensor out, int64_t ncols) {
  using namespace xk_event;
  const int64_t nrows = indptr.numel() - 1, nse = indices.numel(), nsel = selected.numel();
  check_slice_rows(data, indices, indptr, selected, out, ncols);
  if (out.numel() == 0) return;
  dispatch_weights(data.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      const W* w = data.data_ptr<W>();
      const I *idx = indices.data_ptr<I>(), *ptr = indptr.data_ptr<I>(), *sel = selected.data_ptr<I>();
      const bool homo = data.numel() == 1;
      const A w0 = homo ? A(widen(w[0])) : A(0);
      A* o = out.data_ptr<A>();
      xk::parallel_for(nsel, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(ncols, 1)),
                       [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          A* dst = o + i * ncols;
          std::fill(dst, dst + ncols, A(0));
          const int64_t r = int64_t(sel[i]);
          if (uint64_t(r) >= uint64_t(nrows)) continue;
          int64_t begin, end;
          row_range(ptr, -1, nse, r, begin, end);
          for (int64_t p = begin; p < end; ++p) {
            const int64_t j = int64_t(idx[p]);
            if (uint64_t(j) < uint64_t(ncols)) dst[j] += homo ? w0 : A(widen(w[p]));
          }
        }
      });
    });
  });
}
