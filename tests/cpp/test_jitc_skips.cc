// The skips of xlakern.event's JITC generator on the host (src/xlakern/event/kernels/jitc_common.h):
// log2_of_draw, the CPU's straight-line logarithm, stays within 1e-6 of log2; and skip_of, an estimate
// corrected on the table, returns exactly 1 + the number of table entries above the draw (what the jnp
// mirror searches for), for tables from 2 to ~2^22 entries and for estimates forced far off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <xlakern/xlakern.h>

#include "../../src/xlakern/event/kernels/jitc_common.h"

namespace {

// floor(2^32 (1-p)^i) for i >= 1 while >= 1, ascending (the rule of _jitc_kernels.skip_table)
std::vector<uint32_t> skip_table(double p) {
  const double log_keep = std::log1p(-p);
  const int64_t n = int64_t(std::ceil(32 * std::log(2.0) / -log_keep)) + 2;
  std::vector<uint32_t> t;
  for (int64_t i = n; i >= 1; --i) {
    const double v = std::floor(std::exp(double(i) * log_keep) * 4294967296.0);
    if (v >= 1.0) t.push_back(uint32_t(std::min(v, 4294967295.0)));
  }
  return t;
}

int64_t counted_skip(const std::vector<uint32_t>& t, uint32_t h) {
  return 1 + int64_t(t.end() - std::upper_bound(t.begin(), t.end(), h));  // entries > h
}

TEST(JitcSkips, LogOfADrawIsCloseToLog2) {
  std::mt19937 gen(3);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t h = i < 64 ? uint32_t(i) : (i < 128 ? ~uint32_t(i - 64) : uint32_t(gen()));
    const double u = double(float(h) * 2.3283064365386963e-10f + 1.1641532182693481e-10f);
    ASSERT_NEAR(xk_jitc::log2_of_draw(h), std::log2(u), 1e-6 * std::max(1.0, std::fabs(std::log2(u)))) << h;
  }
}

TEST(JitcSkips, EstimatedSkipsAreExact) {
  std::mt19937 gen(5);
  for (double p : {0.999, 0.5, 0.1, 1e-2, 1e-3, 1e-4, 5e-6}) {
    const std::vector<uint32_t> t = skip_table(p);
    const int64_t n = int64_t(t.size());
    const float inv_log_keep = xk_jitc::inv_log_keep_of(t.data(), n);
    for (int i = 0; i < 200000; ++i) {
      // random draws, the table's own entries and their neighbours (where a rounded estimate errs)
      uint32_t h = uint32_t(gen());
      if (i % 3 == 1) h = t[size_t(gen() % uint32_t(n))] + uint32_t(int(gen() % 3) - 1);
      const int64_t expect = counted_skip(t, h);
      ASSERT_EQ(xk_jitc::skip_of(h, t.data(), n, inv_log_keep), expect) << "p=" << p << " h=" << h;
      // an estimate off by a few entries still lands exactly
      const float est = float(expect - 1) + float(int(gen() % 7) - 3);
      ASSERT_EQ(xk_jitc::skip_from_estimate(h, t.data(), n, est), expect) << "p=" << p << " h=" << h;
    }
  }
}

}  // namespace
