// CPU kernels of xlakern.event's per-synapse CSR products: one value per stored slot, from the slot's
// row (csr_rows.h finds it) and column.
//   csr_dt2t_rows        out[b, p] = w[b, p] * y[b, row of p]   (the dt2t products read at the row;
//                        the column form, w * y[column], is one fused gather that XLA does as well)
//   csr_row_col_product  out[p] = sum over batch of a[row of p, b] * bb[column of p, b]   (the weight
//                        gradient of a CSR product; a row whose a is all zero, e.g. a silent neuron's,
//                        gives 0 without reading the slot's column)
// A slot outside every row, or with a column outside [0, cols), gives 0. Parallel over chunks of
// slots: each chunk searches the row of its first slot and steps forward from there.

#include <cstdint>

#include "event_common.h"
#include "event_sparse_cpu.h"
#include "csr_rows.h"
#include "csr_tools_common.h"

// y: (rows,) or (batch, rows); w and out: (nse,) or (batch, nse); out in the accumulation dtype.
// @xk csr_dt2t_rows arg arg arg ret
void csr_dt2t_rows(const xk::Tensor y, const xk::Tensor w, const xk::Tensor indptr, xk::Tensor out) {
  using namespace xk_event;
  const SynapseGeometry g = checked_dt2t_rows(y, w, indptr, out);
  if (out.numel() == 0) return;
  dispatch_weights(w.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_index(indptr.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      const W *yv = y.data_ptr<W>(), *wv = w.data_ptr<W>();
      const I* ptr = indptr.data_ptr<I>();
      A* o = out.data_ptr<A>();
      xk::parallel_for(g.nse, 1 << 14, [&](int64_t lo, int64_t hi) {
        for (int64_t b = 0; b < g.batch; ++b) {  // batch rows outside, so reads and writes run along a row
          const W *wb = wv + b * g.nse, *yb = yv + b * g.nrows;
          A* ob = o + b * g.nse;
          int64_t r = find_row(ptr, g.nrows, g.nse, lo);
          for (int64_t p = lo; p < hi; ++p) {
            r = next_row(ptr, g.nrows, g.nse, r, p);
            ob[p] = r >= 0 && r < g.nrows ? A(widen(wb[p])) * A(widen(yb[r])) : A(0);
          }
        }
      });
    });
  });
}

// a: (rows,) or (rows, batch); bb: (cols,) or (cols, batch); out: (nse,); all float32 or all float64.
// nconn >= 0: fixed-count rows of nconn slots (indptr unread); else CSR rows.
// @xk csr_row_col_product arg arg arg arg ret attr.nconn:int64
void csr_row_col_product(const xk::Tensor a, const xk::Tensor bb, const xk::Tensor indices, const xk::Tensor indptr,
                         xk::Tensor out, int64_t nconn) {
  using namespace xk_event;
  const SynapseGeometry g = checked_row_col(a, bb, indices, indptr, out, nconn);
  if (g.nse == 0) return;
  auto run = [&](auto at) {
    using A = typename decltype(at)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      const A *av = a.data_ptr<A>(), *bv = bb.data_ptr<A>();
      const I *idx = indices.data_ptr<I>(), *ptr = indptr.data_ptr<I>();
      A* o = out.data_ptr<A>();
      xk::parallel_for(g.nse, 1 << 14, [&](int64_t lo, int64_t hi) {
        int64_t r = nconn > 0 ? lo / nconn : find_row(ptr, g.nrows, g.nse, lo);
        for (int64_t p = lo; p < hi; ++p) {
          r = nconn > 0 ? p / nconn : next_row(ptr, g.nrows, g.nse, r, p);
          A v = A(0);
          if (r >= 0 && r < g.nrows) {
            const A* ar = av + r * g.batch;
            bool any = false;
            for (int64_t b = 0; b < g.batch; ++b) any |= ar[b] != A(0);
            const int64_t j = any ? int64_t(idx[p]) : -1;
            if (uint64_t(j) < uint64_t(g.ncols))
              for (int64_t b = 0; b < g.batch; ++b) v += ar[b] * bv[j * g.batch + b];
          }
          o[p] = v;
        }
      });
    });
  };
  if (a.dtype() == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
}
