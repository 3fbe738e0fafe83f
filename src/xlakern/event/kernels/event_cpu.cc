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

namespace {

using namespace xk_event;

inline float widen(float x) { return x; }
inline double widen(double x) { return x; }
inline float widen(xk::bfloat16_t x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float widen(xk::float16_t x) {
  uint32_t h = x.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise the mantissa
      uint32_t shift = 0;
      while (!(man & 0x400u)) { man <<= 1; ++shift; }
      u = sign | (113u - shift) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112u) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Geometry {
  int64_t nrows, ncols, batch, nse;
  bool homo;
};

template <typename W, typename I, typename S, bool Binary>
void sparse_gather(const W* data, const I* idx, const I* indptr, const S* spk, typename AccOf<W>::type* out,
                   const Geometry& g, int64_t nconn, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  const A w0 = g.homo ? A(widen(data[0])) : A(0);
  xk::parallel_for(g.nrows, 256, [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(g.batch);
    for (int64_t r = lo; r < hi; ++r) {
      std::fill(acc.begin(), acc.end(), A(0));
      int64_t begin, end;
      row_range(indptr, nconn, g.nse, r, begin, end);
      for (int64_t p = begin; p < end; ++p) {
        const int64_t j = int64_t(idx[p]);
        if (uint64_t(j) >= uint64_t(g.ncols)) continue;  // out of range: dropped
        const S* s = spk + j * g.batch;
        for (int64_t b = 0; b < g.batch; ++b) {
          if (rule.active(s[b])) acc[b] += (g.homo ? w0 : A(widen(data[p]))) * rule.template value<A>(s[b]);
        }
      }
      std::memcpy(out + r * g.batch, acc.data(), sizeof(A) * g.batch);
    }
  });
}

template <typename W, typename I, typename S, bool Binary>
void sparse_scatter(const W* data, const I* idx, const I* indptr, const S* spk, typename AccOf<W>::type* out,
                    const Geometry& g, int64_t nconn, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  const int64_t out_size = g.ncols * g.batch;
  std::memset(out, 0, sizeof(A) * out_size);
  std::vector<int64_t> active;  // rows with at least one active spike: the only rows touched
  for (int64_t r = 0; r < g.nrows; ++r) {
    for (int64_t b = 0; b < g.batch; ++b) {
      if (rule.active(spk[r * g.batch + b])) { active.push_back(r); break; }
    }
  }
  const A w0 = g.homo ? A(widen(data[0])) : A(0);
  auto scatter_rows = [&](int64_t lo, int64_t hi, A* dst) {
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t r = active[k];
      int64_t begin, end;
      row_range(indptr, nconn, g.nse, r, begin, end);
      const S* s = spk + r * g.batch;
      for (int64_t b = 0; b < g.batch; ++b) {
        if (!rule.active(s[b])) continue;
        const A v = rule.template value<A>(s[b]);
        for (int64_t p = begin; p < end; ++p) {
          const int64_t j = int64_t(idx[p]);
          if (uint64_t(j) >= uint64_t(g.ncols)) continue;
          dst[j * g.batch + b] += (g.homo ? w0 : A(widen(data[p]))) * v;
        }
      }
    }
  };
  const int64_t n = int64_t(active.size());
  // Threads scatter into private buffers (thread 0 into out), summed afterwards; worth it only
  // when the active rows carry much more work than the buffers and two trips through the
  // thread pool cost (below ~128k synapse adds, a few hundred µs, serial was faster: 40k
  // neurons, 1% active, 80 synapses: 403 µs with two threads, ~280 µs serial on 2 cores).
  const int64_t work = n * std::max<int64_t>(1, (nconn >= 0 ? nconn : g.nse / std::max<int64_t>(1, g.nrows)));
  int64_t parts = std::min<int64_t>(xk::num_threads(), n / 64);
  if (parts > 1 && (work < (int64_t(1) << 17) || out_size * parts > 64 * work)) parts = 1;
  if (parts <= 1) {
    scatter_rows(0, n, out);
    return;
  }
  std::vector<std::vector<A>> partial(parts - 1);
  xk::parallel_for(parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      A* dst = out;
      if (t > 0) {
        partial[t - 1].assign(out_size, A(0));
        dst = partial[t - 1].data();
      }
      scatter_rows(n * t / parts, n * (t + 1) / parts, dst);
    }
  });
  xk::parallel_for(out_size, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (const auto& part : partial)
      for (int64_t i = lo; i < hi; ++i) out[i] += part[i];
  });
}

template <typename W, typename S, bool Binary>
void dense_gather(const W* w, const S* spk, typename AccOf<W>::type* out, const Geometry& g,
                  SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  std::vector<int64_t> cols;  // columns with an active spike in any batch element
  for (int64_t c = 0; c < g.ncols; ++c) {
    for (int64_t b = 0; b < g.batch; ++b) {
      if (rule.active(spk[c * g.batch + b])) { cols.push_back(c); break; }
    }
  }
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
  for (int64_t r = 0; r < g.nrows; ++r) {
    for (int64_t b = 0; b < g.batch; ++b) {
      if (rule.active(spk[r * g.batch + b])) { rows.push_back(r); break; }
    }
  }
  // Parallel over output columns: each thread owns a slice of out, so no races.
  xk::parallel_for(g.ncols, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t r : rows) {
      const W* row = w + r * g.ncols;
      const S* s = spk + r * g.batch;
      for (int64_t b = 0; b < g.batch; ++b) {
        if (!rule.active(s[b])) continue;
        const A v = rule.template value<A>(s[b]);
        for (int64_t c = lo; c < hi; ++c) out[c * g.batch + b] += A(widen(row[c])) * v;
      }
    }
  });
}


}  // namespace

// @xk event_sparse arg arg arg arg ret attr.nrows:int64 attr.ncols:int64 attr.nconn:int64 attr.transpose:bool attr.binary:bool
void event_sparse(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor spikes,
                  xk::Tensor out, int64_t nrows, int64_t ncols, int64_t nconn, bool transpose, bool binary) {
  const Geometry g{nrows, ncols, batch_of(spikes), indices.numel(), data.numel() == 1};
  check_sparse(data, indices, indptr, spikes, out, nrows, ncols, nconn, transpose);
  if (out.numel() == 0) return;
  dispatch_weights(data.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(spikes, binary, acc_dtype(data.dtype()), [&](auto st, auto rule) {
        using S = typename decltype(st)::type;
        const I* ptr = nconn >= 0 ? nullptr : indptr.data_ptr<I>();
        if (transpose)
          sparse_scatter(data.data_ptr<W>(), indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(), out.data_ptr<A>(), g, nconn, rule);
        else
          sparse_gather(data.data_ptr<W>(), indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(), out.data_ptr<A>(), g, nconn, rule);
      });
    });
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
