// xlakern.event's CSR slot-to-row search (src/xlakern/event/kernels/csr_rows.h, used by the dt2t
// kernels) against the rule of the jnp reference: the row of slot p is the number of clamped row
// starts at or before p, less one. Random indptr of every shape: sorted (the search must agree),
// unsorted (it must stay in [-1, rows]), empty rows, runs of them, starts outside [0, nse]. And the
// CPU kernels' row-by-row walk (for_each_row_segment): it must give every slot the row next_row does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <xlakern/config.h>

#include "../../src/xlakern/event/kernels/csr_rows.h"

namespace {

int64_t counted_row(const std::vector<int32_t>& ptr, int64_t nse, int64_t p) {
  int64_t c = 0;
  for (size_t k = 0; k < ptr.size(); ++k) c += xk_event::clamped_start(ptr.data(), int64_t(k), nse) <= p;
  return c - 1;
}

TEST(CsrRows, SortedStartsGiveTheCountedRow) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t nrows = gen() % 60, nse = gen() % 300;
    std::vector<int32_t> ptr(size_t(nrows + 1));
    for (auto& v : ptr) v = int32_t(gen() % (nse + 30)) - 15;
    if (trial % 4 == 0) std::fill(ptr.begin(), ptr.begin() + ptr.size() / 2, 0);  // a run of empty rows
    std::sort(ptr.begin(), ptr.end());
    int64_t prev = -1;
    for (int64_t p = 0; p < nse; ++p) {
      const int64_t expect = counted_row(ptr, nse, p);
      ASSERT_EQ(xk_event::find_row(ptr.data(), nrows, nse, p), expect) << "trial " << trial << " slot " << p;
      prev = xk_event::next_row(ptr.data(), nrows, nse, prev, p);
      ASSERT_EQ(prev, expect) << "stepping forward, trial " << trial << " slot " << p;
    }
  }
}

TEST(CsrRows, UnsortedStartsStayInBounds) {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t nrows = gen() % 60, nse = 1 + gen() % 300;
    std::vector<int32_t> ptr(size_t(nrows + 1));
    for (auto& v : ptr) v = int32_t(gen() % (2 * nse)) - int32_t(nse / 2);
    int64_t prev = -1;
    for (int64_t p = 0; p < nse; ++p) {
      const int64_t r = xk_event::find_row(ptr.data(), nrows, nse, p);
      ASSERT_GE(r, -1);
      ASSERT_LE(r, nrows);
      prev = xk_event::next_row(ptr.data(), nrows, nse, prev, p);
      ASSERT_GE(prev, -1);
      ASSERT_LE(prev, nrows);
    }
  }
}

// Every slot of [lo, hi) once, in order, in segments whose row is the row stepping next_row slot by
// slot gives (fixed-count rows when nconn > 0).
void expect_segments_match_stepping(const std::vector<int32_t>& ptr, int64_t nrows, int64_t nse, int64_t nconn,
                                    int64_t lo, int64_t hi) {
  int64_t next = lo, prev = nconn > 0 ? 0 : xk_event::find_row(ptr.data(), nrows, nse, lo);
  xk_event::for_each_row_segment(ptr.data(), nrows, nse, nconn, lo, hi, [&](int64_t r, int64_t p0, int64_t p1) {
    ASSERT_EQ(p0, next);
    ASSERT_LT(p0, p1);
    for (int64_t p = p0; p < p1; ++p) {
      prev = nconn > 0 ? p / nconn : xk_event::next_row(ptr.data(), nrows, nse, prev, p);
      ASSERT_EQ(r, prev) << "slot " << p << " of [" << lo << ", " << hi << ")";
    }
    next = p1;
  });
  ASSERT_EQ(next, std::max(lo, hi));
}

TEST(CsrRows, RowSegmentsGiveEachSlotItsRow) {
  std::mt19937 gen(13);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t nrows = gen() % 60, nse = 1 + gen() % 300;
    std::vector<int32_t> ptr(size_t(nrows + 1));
    for (auto& v : ptr) v = int32_t(gen() % (nse + 30)) - 15;
    if (trial % 2 == 0) std::sort(ptr.begin(), ptr.end());  // half sorted, half malformed
    const int64_t lo = gen() % nse, hi = lo + int64_t(gen() % (nse - lo + 1));
    expect_segments_match_stepping(ptr, nrows, nse, -1, lo, hi);
    const int64_t nconn = 1 + gen() % 9;
    expect_segments_match_stepping(ptr, nrows, nrows * nconn, nconn, lo % std::max<int64_t>(1, nrows * nconn),
                                   std::min(hi, nrows * nconn));
  }
}

}  // namespace
