// The row of a CSR slot, found without a per-row walk (csr_dt2t's kernels): the last row r in
// [0, rows] whose start indptr[r], clamped into [0, nse], is at or before the slot; -1 before every
// row and `rows` after the last one (both outside the matrix). For a non-decreasing indptr that is the
// row whose range holds the slot, the same answer as the jnp reference's count of row starts; for a
// malformed one it is some row in [-1, rows], so every read stays inside the arrays.
#pragma once

#include <cstdint>

namespace xk_event {

template <typename I>
XK_HOST_DEVICE inline int64_t clamped_start(const I* indptr, int64_t r, int64_t nse) {
  const int64_t v = int64_t(indptr[r]);
  return v < 0 ? 0 : (v > nse ? nse : v);
}

// Where the slot would sit were all rows of one length, then a gallop to a bracket and a bisection:
// a few loads for rows of similar lengths (a binary search over 400k rows was 19 dependent loads,
// which bound the GPU kernel), O(log distance) otherwise.
template <typename I>
XK_HOST_DEVICE inline int64_t find_row(const I* indptr, int64_t nrows, int64_t nse, int64_t p) {
  int64_t g = nse > 0 ? int64_t(double(p) / double(nse) * double(nrows)) : 0;
  g = g < 0 ? 0 : (g > nrows ? nrows : g);
  int64_t lo, hi;  // the answer is in [lo, hi): start(lo) <= p (lo == -1: before every row), start(hi) > p
  int64_t step = 1;
  if (clamped_start(indptr, g, nse) <= p) {
    lo = g;
    while (lo + step <= nrows && clamped_start(indptr, lo + step, nse) <= p) {
      lo += step;
      step *= 2;
    }
    hi = lo + step <= nrows ? lo + step : nrows + 1;
  } else {
    hi = g;
    while (hi - step >= 0 && clamped_start(indptr, hi - step, nse) > p) {
      hi -= step;
      step *= 2;
    }
    lo = hi - step >= 0 ? hi - step : -1;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (clamped_start(indptr, mid, nse) <= p) lo = mid;
    else hi = mid;
  }
  return lo;
}

// The row of slot p given r, the row of an earlier slot: a few steps forward, else a new search.
template <typename I>
XK_HOST_DEVICE inline int64_t next_row(const I* indptr, int64_t nrows, int64_t nse, int64_t r, int64_t p) {
  for (int k = 0; k < 8; ++k) {
    if (r >= nrows || clamped_start(indptr, r + 1, nse) > p) return r;
    ++r;
  }
  return find_row(indptr, nrows, nse, p);
}

// Host loops: calls f(r, p0, p1) for consecutive slot ranges that cover [lo, hi), every slot of a range
// in row r (the row next_row gives it, whatever the indptr; fixed-count rows of nconn slots when
// nconn > 0, indptr unread). A per-slot loop then needs neither a row search nor a division.
template <typename I, typename F>
inline void for_each_row_segment(const I* indptr, int64_t nrows, int64_t nse, int64_t nconn, int64_t lo,
                                 int64_t hi, F&& f) {
  if (nconn > 0) {
    for (int64_t r = lo / nconn, p = lo; p < hi; ++r) {
      const int64_t end = (r + 1) * nconn < hi ? (r + 1) * nconn : hi;
      f(r, p, end);
      p = end;
    }
    return;
  }
  int64_t r = find_row(indptr, nrows, nse, lo);
  for (int64_t p = lo; p < hi;) {
    int64_t end = r >= nrows ? hi : clamped_start(indptr, r + 1, nse);
    end = end > hi ? hi : (end <= p ? p + 1 : end);  // end <= p only for a malformed indptr
    f(r, p, end);
    p = end;
    if (p < hi) r = next_row(indptr, nrows, nse, r, p);
  }
}

}  // namespace xk_event
