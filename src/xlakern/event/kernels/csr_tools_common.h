// Argument checks shared by the CPU and CUDA kernels of xlakern.event's CSR helpers (csr_slice_*,
// csr_synapse_*), run before any memory is touched so that a direct FFI call cannot read out of bounds.
#pragma once

#include <cstdint>

#include "event_common.h"

namespace xk_event {

inline void check_slice_rows(const xk::Tensor& data, const xk::Tensor& indices, const xk::Tensor& indptr,
                             const xk::Tensor& selected, const xk::Tensor& out, int64_t ncols) {
  XK_CHECK(indptr.numel() >= 1) << "indptr must hold rows + 1 offsets";
  XK_CHECK(data.numel() == 1 || data.numel() == indices.numel()) << "data must hold one weight or one per synapse";
  XK_CHECK(indptr.dtype() == indices.dtype() && selected.dtype() == indices.dtype())
      << "indptr and the selected rows must have the dtype of indices";
  XK_CHECK(out.dtype() == acc_dtype(data.dtype()) && out.numel() == selected.numel() * ncols)
      << "the output must be (selected rows, cols) in the accumulation dtype";
}

// A per-synapse product's sizes: `batch` rows of `nse` slots, per-neuron vectors of `nrows` (rows) and
// `ncols` (columns) entries a batch row.
struct SynapseGeometry {
  int64_t batch, nse, nrows, ncols;
};

// csr_dt2t_rows: y (batch, rows) and w (batch, nse) of one float dtype; out like w, accumulation dtype.
inline SynapseGeometry checked_dt2t_rows(const xk::Tensor& y, const xk::Tensor& w, const xk::Tensor& indptr,
                                         const xk::Tensor& out) {
  const int64_t batch = w.ndim() == 2 ? w.shape(0) : 1, nse = w.ndim() == 2 ? w.shape(1) : w.numel();
  const int64_t nrows = indptr.numel() - 1;
  XK_CHECK(nrows >= 0 && y.numel() == batch * nrows) << "y must hold one value per row (per batch row)";
  XK_CHECK(y.dtype() == w.dtype()) << "y and w must share a dtype";
  XK_CHECK(out.dtype() == acc_dtype(w.dtype()) && out.numel() == w.numel())
      << "the output must have w's size in the accumulation dtype";
  return {batch, nse, nrows, 0};
}

// csr_row_col_product: a (rows, batch) and b (cols, batch) in one accumulation dtype (float32 or
// float64); out (nse,) in that dtype; CSR rows from indptr, or fixed-count rows of nconn >= 0 slots
// (then a gives the row count, and indptr is not read).
inline SynapseGeometry checked_row_col(const xk::Tensor& a, const xk::Tensor& b, const xk::Tensor& indices,
                                       const xk::Tensor& indptr, const xk::Tensor& out, int64_t nconn) {
  const int64_t nse = indices.numel();
  const int64_t nrows = nconn >= 0 ? (a.ndim() >= 1 ? a.shape(0) : 1) : indptr.numel() - 1;
  XK_CHECK(nconn < 0 || nse == nrows * nconn) << "a fixed-count structure holds rows * nconn synapses";
  const int64_t batch = a.ndim() == 2 ? a.shape(1) : 1;
  XK_CHECK(nrows >= 0 && a.numel() == nrows * batch) << "a must hold one value per row (per batch column)";
  XK_CHECK(batch > 0 && b.numel() % batch == 0 && (b.ndim() == 2 ? b.shape(1) : 1) == batch)
      << "b must have a's batch columns";
  XK_CHECK(a.dtype() == b.dtype() && out.dtype() == a.dtype() &&
           (a.dtype() == DType::Float32 || a.dtype() == DType::Float64))
      << "a, b and the output must share a float32 or float64 dtype";
  XK_CHECK(indptr.dtype() == indices.dtype()) << "indptr must have the dtype of indices";
  XK_CHECK(out.numel() == nse) << "the output must hold one value per synapse";
  return {batch, nse, nrows, b.numel() / batch};
}

// csr_slot_rows: indptr (rows + 1,); out (nse,) int32, or int64 (needed from 2^31 - 1 rows on).
inline SynapseGeometry checked_slot_rows(const xk::Tensor& indptr, const xk::Tensor& out) {
  const int64_t nrows = indptr.numel() - 1;
  XK_CHECK(indptr.ndim() == 1 && nrows >= 0) << "indptr must be a vector of rows + 1 offsets";
  XK_CHECK(out.ndim() == 1 && (out.dtype() == DType::Int64 ||
                               (out.dtype() == DType::Int32 && nrows < (int64_t(1) << 31) - 1)))
      << "the output must hold one int32 row a slot (int64 from 2^31 - 1 rows on)";
  return {1, out.numel(), nrows, 0};
}

}  // namespace xk_event
