// Shared by plasticity_cpu.cc and plasticity_cuda.cu: which synapses a spiking neuron owns.
//
// A plasticity update visits "rows": one per neuron whose spike triggers it. Row r's synapses
// are positions p in [begin, end): CSR/CSC rows (indptr, mode kSparse), fixed-count rows of
// nconn (mode kSparse with nconn >= 0), or a dense row/column (mode kDense: the synapse of row r
// and column c sits at r * row_stride + c * col_stride). For each synapse of an active row,
//   w[pos] = clip(w[pos] + trace[c], w_min, w_max)
// where c is the synapse's column (indices[p], or p - begin for dense) and pos is p, or perm[p]
// when the rows are a permuted view of the weights (the CSC view of CSR weights). Only those
// weights are read or written; the rest of the (aliased) buffer is left as it is.
#pragma once

#include <cstdint>

namespace xk_plastic {

enum Mode : int64_t { kSparse = 0, kDense = 1 };

struct Rows {
  int64_t nrows, ncols, nse, nconn, mode, row_stride, col_stride;
  bool permuted;
};

template <typename A>
XK_HOST_DEVICE inline A clip(A x, A lo, A hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Updates the synapses of (active) row r: those at offsets first, first + step, ... of the row
// (CPU: 0 and 1; a CUDA warp: its lane and 32).
template <typename W, typename I>
XK_HOST_DEVICE inline void update_row(W* w, const I* idx, const I* indptr, const I* perm, const W* trace, W lo, W hi,
                                      const Rows& g, int64_t r, int64_t first, int64_t step) {
  if (g.mode == kDense) {
    for (int64_t c = first; c < g.ncols; c += step) {
      W& x = w[r * g.row_stride + c * g.col_stride];
      x = clip(W(x + trace[c]), lo, hi);
    }
    return;
  }
  int64_t begin, end;
  xk_event::row_range(indptr, g.nconn, g.nse, r, begin, end);
  for (int64_t p = begin + first; p < end; p += step) {
    const int64_t c = int64_t(idx[p]);
    const int64_t pos = g.permuted ? int64_t(perm[p]) : p;
    if (uint64_t(c) >= uint64_t(g.ncols) || uint64_t(pos) >= uint64_t(g.nse)) continue;  // out of range: skipped
    w[pos] = clip(W(w[pos] + trace[c]), lo, hi);
  }
}

// The entry points' checks (Python validated already; these keep a direct FFI call in bounds).
inline Rows checked_rows(const xk::Tensor& weight, const xk::Tensor& indices, const xk::Tensor& indptr,
                         const xk::Tensor& perm, const xk::Tensor& spikes, const xk::Tensor& trace,
                         const xk::Tensor& bounds, const xk::Tensor& out, int64_t ncols, int64_t nconn, int64_t mode,
                         int64_t row_stride, int64_t col_stride, bool permuted) {
  using xk::DType;
  const DType dt = weight.dtype();
  XK_CHECK(dt == DType::Float32 || dt == DType::Float64) << "weights must be float32 or float64";
  XK_CHECK(out.dtype() == dt && out.numel() == weight.numel()) << "output must match the weights";
  XK_CHECK(trace.dtype() == dt && trace.numel() == ncols) << "trace must have ncols entries of the weights' dtype";
  XK_CHECK(bounds.dtype() == dt && bounds.numel() == 2) << "bounds must be (w_min, w_max)";
  const Rows g{spikes.numel(), ncols, weight.numel(), nconn, mode, row_stride, col_stride, permuted};
  XK_CHECK(mode != kDense || g.nrows * ncols == g.nse) << "dense weights must be nrows x ncols";
  XK_CHECK(mode == kDense || nconn >= 0 || indptr.numel() == g.nrows + 1) << "indptr must have nrows + 1 entries";
  XK_CHECK(mode == kDense || nconn < 0 || g.nrows * nconn == g.nse) << "fixed-count weights must be nrows x nconn";
  XK_CHECK(mode == kDense || indices.numel() == g.nse) << "indices must have one entry per weight";
  XK_CHECK(!permuted || perm.numel() == g.nse) << "perm must have one entry per weight";
  return g;
}

}  // namespace xk_plastic
