// XK_CHECK: throws xk::Error carrying the condition, file:line and message.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "test_util.h"
#include "xlakern/check.h"

namespace {

static_assert(std::is_base_of_v<std::runtime_error, xk::Error>);

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string here(int line) { return std::string(__FILE__) + ":" + std::to_string(line); }

struct Point {
  int x, y;
};
std::ostream& operator<<(std::ostream& os, const Point& p) {
  return os << "Point(" << p.x << ", " << p.y << ")";
}

TEST(Check, PassesSilentlyWhenTrue) {
  EXPECT_NO_THROW(XK_CHECK(1 + 1 == 2));
  EXPECT_NO_THROW(XK_CHECK(true) << "never shown " << 42);
  int x = 5;
  XK_CHECK(x == 5) << "x is " << x;
  XK_CHECK(x > 0);
  SUCCEED();
}

TEST(Check, MessageIsNotBuiltWhenTheCheckPasses) {
  int formatted = 0;
  auto expensive = [&] {
    ++formatted;
    return std::string("expensive");
  };
  for (int i = 0; i < 100; ++i) XK_CHECK(i >= 0) << expensive();
  EXPECT_EQ(formatted, 0);
  EXPECT_THROW(XK_CHECK(false) << expensive(), xk::Error);
  EXPECT_EQ(formatted, 1);
}

TEST(Check, ConditionIsEvaluatedExactlyOnce) {
  int calls = 0;
  auto cond = [&](bool v) {
    ++calls;
    return v;
  };
  XK_CHECK(cond(true));
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(XK_CHECK(cond(false)), xk::Error);
  EXPECT_EQ(calls, 2);
}

TEST(Check, FailureThrowsErrorWithConditionAndLocation) {
  int line = 0;
  try {
    line = __LINE__; XK_CHECK(2 + 2 == 5);
    FAIL() << "XK_CHECK(false condition) did not throw";
  } catch (const xk::Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "check failed: 2 + 2 == 5")) << msg;
    EXPECT_TRUE(contains(msg, here(line))) << msg << "\nexpected location " << here(line);
    // No streamed message: nothing after the location.
    EXPECT_EQ(msg, "check failed: 2 + 2 == 5 (at " + here(line) + ")");
  }
}

TEST(Check, StreamedMessageIsAppended) {
  const int64_t got = 3;
  const double tol = 0.25;
  int line = 0;
  try {
    line = __LINE__; XK_CHECK(got == 4) << "expected 4 dims, got " << got << " (tol " << tol << ")";
    FAIL() << "did not throw";
  } catch (const xk::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg, "check failed: got == 4 (at " + here(line) +
                       "): expected 4 dims, got 3 (tol 0.25)");
  }
}

TEST(Check, StreamsStringsCustomTypesAndNumbers) {
  const std::string name = "weights";
  const Point p{-7, 11};
  const uint64_t big = 18446744073709551615ull;
  try {
    XK_CHECK(name.empty()) << name << ' ' << p << ' ' << big << ' ' << -1;
    FAIL() << "did not throw";
  } catch (const xk::Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "check failed: name.empty()")) << msg;
    EXPECT_TRUE(contains(msg, "): weights Point(-7, 11) 18446744073709551615 -1")) << msg;
  }
}

class CheckRandom : public xk_test::SeededTest {};

TEST_F(CheckRandom, NumbersStreamedIntoTheMessage) {
  std::uniform_int_distribution<int64_t> dist(-1000000000000LL, 1000000000000LL);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t a = dist(rng_), b = dist(rng_);
    const bool ok = a < b;
    try {
      XK_CHECK(a < b) << "a=" << a << " b=" << b;
      EXPECT_TRUE(ok) << "passed although a >= b; " << seed_msg();
    } catch (const xk::Error& e) {
      EXPECT_FALSE(ok) << "threw although a < b; " << seed_msg();
      const std::string want = "a=" + std::to_string(a) + " b=" + std::to_string(b);
      EXPECT_TRUE(contains(e.what(), "check failed: a < b")) << e.what();
      EXPECT_TRUE(contains(e.what(), want)) << e.what() << "\nwant " << want;
    }
  }
}

TEST(Check, IsCatchableAsStdException) {
  try {
    XK_CHECK(false) << "as std::exception";
    FAIL() << "did not throw";
  } catch (const std::exception& e) {
    EXPECT_TRUE(contains(e.what(), "as std::exception"));
  }
}

// The macro expands to an if/else; used as the body of an unbraced if it
// must not capture the user's else.
int dangling_else(bool outer, bool cond) {
  int branch = 0;
  if (outer)
    XK_CHECK(cond) << "inner check";
  else
    branch = 2;
  if (branch == 0 && outer) branch = 1;
  return branch;
}

TEST(Check, WorksAsUnbracedIfBodyWithElse) {
  EXPECT_EQ(dangling_else(false, false), 2);
  EXPECT_EQ(dangling_else(false, true), 2);
  EXPECT_EQ(dangling_else(true, true), 1);
  EXPECT_THROW(dangling_else(true, false), xk::Error);
}

TEST(Check, WorksInUnbracedLoopAndElseBranch) {
  int passed = 0;
  for (int i = 0; i < 10; ++i)
    if (i % 2 == 0)
      ++passed;
    else
      XK_CHECK(i % 2 == 1) << "odd " << i;
  EXPECT_EQ(passed, 5);

  auto check_in_else = [](bool first, int v) {
    if (first)
      return 1;
    else
      XK_CHECK(v > 0) << "v=" << v;
    return 2;
  };
  EXPECT_EQ(check_in_else(true, -1), 1);
  EXPECT_EQ(check_in_else(false, 1), 2);
  EXPECT_THROW(check_in_else(false, -1), xk::Error);
}

TEST(Check, ConditionWithCommaInsideParentheses) {
  auto max2 = [](int a, int b) { return a > b ? a : b; };
  EXPECT_NO_THROW(XK_CHECK(max2(1, 2) == 2));
  try {
    XK_CHECK((max2(3, 4) == 3)) << "max";
    FAIL();
  } catch (const xk::Error& e) {
    EXPECT_TRUE(contains(e.what(), "max2(3, 4) == 3")) << e.what();
  }
}

TEST(Check, ErrorCanBeThrownDirectly) {
  try {
    throw xk::Error("custom failure 17");
  } catch (const xk::Error& e) {
    EXPECT_STREQ(e.what(), "custom failure 17");
  }
}

}  // namespace

TEST(Check, MessagesAreMadeValidUtf8) {
  // Bytes that are not UTF-8 become \xNN; valid multi-byte characters stay.
  EXPECT_EQ(xk::detail::utf8_safe("v = \xC8 (limit 128)"), "v = \\xC8 (limit 128)");
  EXPECT_EQ(xk::detail::utf8_safe("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  // A truncated sequence, an overlong form, a surrogate, a lone continuation.
  EXPECT_EQ(xk::detail::utf8_safe("a\xE2\x82"), "a\\xE2\\x82");
  EXPECT_EQ(xk::detail::utf8_safe("\xC0\xAF"), "\\xC0\\xAF");
  EXPECT_EQ(xk::detail::utf8_safe("\xED\xA0\x80"), "\\xED\\xA0\\x80");
  EXPECT_EQ(xk::detail::utf8_safe("\x80z"), "\\x80z");
  try {
    XK_CHECK(false) << static_cast<char>(200);
  } catch (const xk::Error& e) {
    const std::string safe = xk::detail::utf8_safe(e.what());
    EXPECT_NE(safe.find("check failed: false"), std::string::npos) << safe;
    EXPECT_NE(safe.find("\\xC8"), std::string::npos) << safe;
  }
}
