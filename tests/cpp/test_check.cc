// XK_CHECK: throws xk::Error carrying the condition, file:line and message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
#include <string_view>
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

enum Colour { kRed = 3, kBlue = -9 };
enum class Mode : uint8_t { kFast = 7 };

// The message XK_CHECK builds from the values `stream` streams, after its prefix.
template <typename Stream>
std::string streamed(Stream&& stream) {
  xk::detail::CheckMessage message("file.cc", 1, "check failed: c");
  stream(message);
  const std::string msg = message.str();
  const std::string prefix = "check failed: c (at file.cc:1): ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : "<prefix lost: " + msg + ">";
}

// check.h writes numbers without <sstream>; the reference is std::ostringstream itself.
TEST_F(CheckRandom, ValuesReadAsOstreamWritesThem) {
  std::uniform_int_distribution<int64_t> ints(INT64_MIN, INT64_MAX);
  std::uniform_real_distribution<double> mantissa(-10.0, 10.0);
  std::uniform_int_distribution<int> exponent(-40, 40);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t i64 = ints(rng_);
    const int32_t i32 = static_cast<int32_t>(i64);
    const uint64_t u64 = static_cast<uint64_t>(i64);
    const uint16_t u16 = static_cast<uint16_t>(i64);
    const short s16 = static_cast<short>(i64 >> 7);
    const double d = mantissa(rng_) * std::pow(10.0, exponent(rng_));
    const float f = static_cast<float>(mantissa(rng_) * std::pow(10.0, exponent(rng_) / 4));
    const long double ld = static_cast<long double>(d) / 3;
    const bool b = (i64 & 1) != 0;
    const std::string text = "w" + std::to_string(i32 & 0xFFFF);
    const std::string_view view(text);
    std::ostringstream want;
    want << i64 << ' ' << i32 << ' ' << u64 << ' ' << u16 << ' ' << s16 << ' ' << d << ' ' << f << ' ' << ld
         << ' ' << b << ' ' << text << ' ' << view << ' ' << text.c_str() << ' ' << kRed << ' ' << kBlue;
    const std::string got = streamed([&](auto&& check) {
      check << i64 << ' ' << i32 << ' ' << u64 << ' ' << u16 << ' ' << s16 << ' ' << d << ' ' << f << ' ' << ld
            << ' ' << b << ' ' << text << ' ' << view << ' ' << text.c_str() << ' ' << kRed << ' ' << kBlue;
    });
    EXPECT_EQ(got, want.str()) << seed_msg();
  }
}

TEST(Check, SpecialValuesScopedEnumsAndPointers) {
  const double inf = std::numeric_limits<double>::infinity();
  std::ostringstream want;
  want << inf << ' ' << -inf << ' ' << 0.0 << ' ' << -0.0 << ' ' << 1e-320 << ' ' << 123456789.0;
  EXPECT_EQ(streamed([&](auto&& c) { c << inf << ' ' << -inf << ' ' << 0.0 << ' ' << -0.0 << ' ' << 1e-320 << ' '
                                       << 123456789.0; }),
            want.str());
  // A scoped enum has no operator<<; the check writes its value.
  EXPECT_EQ(streamed([](auto&& c) { c << Mode::kFast; }), "7");
  int x = 0;
  std::ostringstream ptr;
  ptr << static_cast<const void*>(&x);
  const std::string got = streamed([&](auto&& c) { c << &x; });
  EXPECT_EQ(std::stoull(got, nullptr, 16), std::stoull(ptr.str(), nullptr, 16)) << got << " vs " << ptr.str();
  const char* none = nullptr;
  EXPECT_EQ(streamed([&](auto&& c) { c << "a" << none << "b"; }), "ab");
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
