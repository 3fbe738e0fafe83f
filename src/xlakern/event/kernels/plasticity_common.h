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

// The synapses of row r are p in [begin, end): row_range's slots, or the columns [0, ncols) of a dense row.
template <typename I>
XK_HOST_DEVICE inline void row_slots(const I* indptr, const Rows& g, int64_t r, int64_t& begin, int64_t& end) {
  if (g.mode == kDense) {
    begin = 0;
    end = g.ncols;
  } else {
    xk_event::row_range(indptr, g.nconn, g.nse, r, begin, end);
  }
}

// Synapse p's column (an index load for stored layouts, p itself for a dense row).
template <typename I>
XK_HOST_DEVICE inline int64_t column(const I* idx, const Rows& g, int64_t p) {
  return g.mode == kDense ? p : int64_t(idx[p]);
}

// Where synapse p of row r keeps its weight (no load unless permuted); false if that is out of range.
template <typename I>
XK_HOST_DEVICE inline bool place(const I* perm, const Rows& g, int64_t r, int64_t p, int64_t& pos) {
  if (g.mode == kDense) {
    pos = r * g.row_stride + p * g.col_stride;
    return true;
  }
  pos = g.permuted ? int64_t(perm[p]) : p;
  return uint64_t(pos) < uint64_t(g.nse);
}

// Synapse p of row r: its column c and its weight's position pos. False where either is out of range:
// that synapse is skipped (the policy of every platform).
template <typename I>
XK_HOST_DEVICE inline bool locate(const I* idx, const I* perm, const Rows& g, int64_t r, int64_t p, int64_t& c,
                                  int64_t& pos) {
  c = column(idx, g, p);
  return place(perm, g, r, p, pos) && uint64_t(c) < uint64_t(g.ncols);
}

// Updates the synapses of (active) row r one after another (the CPU's walk; the GPU's warps issue a
// round's loads together instead, plasticity_cuda.cu).
template <typename W, typename I>
inline void update_row(W* w, const I* idx, const I* indptr, const I* perm, const W* trace, W lo, W hi, const Rows& g,
                       int64_t r) {
  int64_t begin, end, c, pos;
  row_slots(indptr, g, r, begin, end);
  for (int64_t p = begin; p < end; ++p) {
    if (locate(idx, perm, g, r, p, c, pos)) w[pos] = clip(W(w[pos] + trace[c]), lo, hi);
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
