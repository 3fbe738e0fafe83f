// CPU kernels of xlakern.event's per-synapse CSR products: one value per stored slot, from the slot's
// row (csr_rows.h finds it) and column.
//   csr_dt2t_rows        out[b, p] = w[b, p] * y[b, row of p]   (the dt2t products read at the row;
//                        the column form, w * y[column], is one fused gather that XLA does as well)
//   csr_row_col_product  out[p] = sum over batch of a[row of p, b] * bb[column of p, b]   (the weight
//                        gradient of a CSR product; a row whose a is all zero, e.g. a silent neuron's,
//                        gives 0 without reading the slot's column)
//   csr_slot_rows        out[p] = the row of slot p (what csr_apply and the layouts' conversions
//                        gather the presynaptic side with; XLA's CPU scan took ~4 ns a slot)
// A slot outside every row, or with a column outside [0, cols), gives 0. Parallel over chunks of
// slots: each chunk searches the row of its first slot and walks row by row from there, so the
// per-slot loops hold no row search and no division (a division a slot made the fixed-count
// gradient ~10x slower than XLA's fused jnp).

#include <algorithm>
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
        for_each_row_segment(ptr, g.nrows, g.nse, -1, lo, hi, [&](int64_t r, int64_t p0, int64_t p1) {
          for (int64_t b = 0; b < g.batch; ++b) {  // a row's factor is one scalar: the loop vectorises
            const W* wb = wv + b * g.nse;
            A* ob = o + b * g.nse;
            if (r < 0 || r >= g.nrows) {
              std::fill(ob + p0, ob + p1, A(0));
              continue;
            }
            const A f = A(widen(yv[b * g.nrows + r]));
            for (int64_t p = p0; p < p1; ++p) ob[p] = A(widen(wb[p])) * f;
          }
        });
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
        for_each_row_segment(ptr, g.nrows, g.nse, nconn, lo, hi, [&](int64_t r, int64_t p0, int64_t p1) {
          const A* ar = r >= 0 && r < g.nrows ? av + r * g.batch : nullptr;
          bool any = false;
          for (int64_t b = 0; ar && b < g.batch; ++b) any |= ar[b] != A(0);
          if (!any) {  // a silent row (most rows of a scatter's gradient): its columns are not read
            std::fill(o + p0, o + p1, A(0));
          } else if (g.batch == 1) {
            const A f = ar[0];
            for (int64_t p = p0; p < p1; ++p) {
              const int64_t j = int64_t(idx[p]);
              o[p] = uint64_t(j) < uint64_t(g.ncols) ? f * bv[j] : A(0);
            }
          } else {
            for (int64_t p = p0; p < p1; ++p) {
              const int64_t j = int64_t(idx[p]);
              A v = A(0);
              if (uint64_t(j) < uint64_t(g.ncols))
                for (int64_t b = 0; b < g.batch; ++b) v += ar[b] * bv[j * g.batch + b];
              o[p] = v;
            }
          }
        });
      });
    });
  };
  if (a.dtype() == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
}

// indptr: (rows + 1,); out: (nse,) int32 or int64. The row of each slot as the jnp reference counts it:
// the number of row starts (clamped into [0, nse]) at or before the slot, less one, so -1 before the
// first row and `rows` after the last. A non-decreasing indptr (checked first, O(rows)) fills the
// rows' ranges in parallel; any other is counted and scanned in one pass, the same answer.
// @xk csr_slot_rows arg ret
void csr_slot_rows(const xk::Tensor indptr, xk::Tensor out) {
  using namespace xk_event;
  const SynapseGeometry g = checked_slot_rows(indptr, out);
  const int64_t nrows = g.nrows, nse = g.nse;
  dispatch_index(indptr.dtype(), [&](auto it) {
    dispatch_row_numbers(out.dtype(), [&](auto ot) {
      using I = typename decltype(it)::type;
      using O = typename decltype(ot)::type;
      const I* ptr = indptr.data_ptr<I>();
      O* o = out.data_ptr<O>();
      bool rising = true;
      for (int64_t r = 0; rising && r < nrows; ++r)
        rising = clamped_start(ptr, r, nse) <= clamped_start(ptr, r + 1, nse);
      if (rising) {
        xk::parallel_for(nse, 1 << 15, [&](int64_t lo, int64_t hi) {
          for_each_row_segment(ptr, nrows, nse, -1, lo, hi,
                               [&](int64_t r, int64_t p0, int64_t p1) { std::fill(o + p0, o + p1, O(r)); });
        });
        return;
      }
      std::fill(o, o + nse, O(0));
      for (int64_t r = 0; r <= nrows; ++r) {
        const int64_t p = clamped_start(ptr, r, nse);
        if (p < nse) ++o[p];
      }
      O count = 0;
      for (int64_t p = 0; p < nse; ++p) {
        count += o[p];
        o[p] = count - 1;
      }
    });
  });
}
