// CPU kernels of xlakern.event: spikes times stored connectivity, touching active spikes only.
//
// One entry point per storage family, for every orientation, dtype and batch size:
//   event_sparse  rows of a CSR structure (indptr) or of a fixed-count structure (nconn >= 0)
//   event_dense   a row-major dense matrix
// The stored structure has shape (nrows, ncols). transpose=false gathers (out[r] = sum over
// the row of w * f(s[col])), transpose=true scatters (out[col] += w * f(s[r]) for active r).
// Spikes are (n,) or (n, batch); f(s) is 1 for an active (non-zero) spike when `binary`, else s.
// Outputs are float32 (float64 for float64 weights); Python casts them back to the weight dtype.
// Out-of-range column indices are dropped; indptr values are clamped into [0, nse].

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "event_common.h"
#include "event_sparse_cpu.h"

namespace {

using namespace xk_event;

template <typename W, typename S, bool Binary>
void dense_gather(const W* w, const S* spk, typename AccOf<W>::type* out, const Geometry& g,
                  SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  std::vector<int64_t> cols;  // columns with an active spike in any batch element
  find_active_rows(spk, g.ncols, g.batch, rule, cols);
  xk::parallel_for(g.nrows, 64, [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(g.batch);
    for (int64_t r = lo; r < hi; ++r) {
      std::fill(acc.begin(), acc.end(), A(0));
      const W* row = w + r * g.ncols;
      for (int64_t c : cols) {
        const A wv = A(widen(row[c]));
        const S* s = spk + c * g.batch;
        for (int64_t b = 0; b < g.batch; ++b)
          if (rule.active(s[b])) acc[b] += wv * rule.template value<A>(s[b]);
      }
      std::memcpy(out + r * g.batch, acc.data(), sizeof(A) * g.batch);
    }
  });
}

template <typename W, typename S, bool Binary>
void dense_scatter(const W* w, const S* spk, typename AccOf<W>::type* out, const Geometry& g,
                   SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  std::memset(out, 0, sizeof(A) * g.ncols * g.batch);
  std::vector<int64_t> rows;
  find_active_rows(spk, g.nrows, g.batch, rule, rows);
  // Parallel over output columns: each thread owns a slice of out, so no races.
  xk::parallel_for(g.ncols, 1024, [&](int64_t lo, int64_t hi) {
    if (g.batch == 1) {  // unit stride: the column loop vectorises
      for (int64_t r : rows) {
        const W* row = w + r * g.ncols;
        const A v = rule.template value<A>(spk[r]);
        for (int64_t c = lo; c < hi; ++c) out[c] += A(widen(row[c])) * v;
      }
      return;
    }
    // A batch: the slice's sums are kept as (batch, columns), so each active spike's column loop is
    // unit stride and vectorises (out's stride is the batch), then written out transposed. Each sum
    // still adds its rows in ascending order.
    const int64_t width = hi - lo;
    std::vector<A> acc(size_t(g.batch * width), A(0));
    for (int64_t r : rows) {
      const W* row = w + r * g.ncols + lo;
      const S* s = spk + r * g.batch;
      for (int64_t b = 0; b < g.batch; ++b) {
        if (!rule.active(s[b])) continue;
        const A v = rule.template value<A>(s[b]);
        A* a = acc.data() + b * width;
        for (int64_t c = 0; c < width; ++c) a[c] += A(widen(row[c])) * v;
      }
    }
    for (int64_t c = 0; c < width; ++c)
      for (int64_t b = 0; b < g.batch; ++b) out[(lo + c) * g.batch + b] = acc[size_t(b * width + c)];
  });
}


}  // namespace

// @xk event_sparse arg arg arg arg ret attr.nrows:int64 attr.ncols:int64 attr.nconn:int64 attr.transpose:bool attr.binary:bool
void event_sparse(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor spikes,
                  xk::Tensor out, int64_t nrows, int64_t ncols, int64_t nconn, bool transpose, bool binary) {
  const Geometry g{nrows, ncols, batch_of(spikes), indices.numel(), data.numel() == 1};
  check_sparse(data, indices, indptr, spikes, out, nrows, ncols, nconn, transpose);
  if (out.numel() == 0) return;
  dispatch_sparse(data, indices, spikes, binary, [&](auto wt, auto it, auto st, auto rule) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    using I = typename decltype(it)::type;
    using S = typename decltype(st)::type;
    const I* ptr = nconn >= 0 ? nullptr : indptr.data_ptr<I>();
    const I* no_perm = nullptr;
    if (transpose)
      sparse_scatter<false>(data.data_ptr<W>(), no_perm, indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(),
                            out.data_ptr<A>(), g, nconn, rule);
    else
      sparse_gather<false>(data.data_ptr<W>(), no_perm, indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(),
                           out.data_ptr<A>(), g, nconn, rule);
  });
}

// @xk event_dense arg arg ret attr.transpose:bool attr.binary:bool
void event_dense(const xk::Tensor weights, const xk::Tensor spikes, xk::Tensor out, bool transpose, bool binary) {
  check_dense(weights, spikes, out, transpose);
  const Geometry g{weights.shape(0), weights.shape(1), batch_of(spikes), weights.numel(), false};
  if (out.numel() == 0) return;
  dispatch_weights(weights.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_spikes(spikes, binary, acc_dtype(weights.dtype()), [&](auto st, auto rule) {
      using S = typename decltype(st)::type;
      if (transpose)
        dense_scatter(weights.data_ptr<W>(), spikes.data_ptr<S>(), out.data_ptr<A>(), g, rule);
      else
        dense_gather(weights.data_ptr<W>(), spikes.data_ptr<S>(), out.data_ptr<A>(), g, rule);
    });
  });
}
