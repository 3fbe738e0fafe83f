// dtype_size / dtype_name / dtype_of for the 15 JAX element types.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <type_traits>

#include "test_util.h"
#include "xlakern/dtype.h"

namespace {

using xk::DType;
using xk_test::for_each_type_case;

// Everything below is constexpr: the same facts must hold at compile time,
// where kernels use them (e.g. in static_asserts and template arguments).
static_assert(xk::kNumDTypes == 15);
static_assert(xk::dtype_size(DType::Bool) == 1);
static_assert(xk::dtype_size(DType::BFloat16) == 2);
static_assert(xk::dtype_size(DType::Complex64) == 8);
static_assert(xk::dtype_size(DType::Complex128) == 16);
static_assert(xk::dtype_size(DType::Invalid) == 0);
static_assert(xk::dtype_of<float>() == DType::Float32);
static_assert(xk::dtype_of<const volatile double>() == DType::Float64);
static_assert(xk::dtype_of<std::string>() == DType::Invalid);
static_assert(std::is_same_v<std::underlying_type_t<DType>, uint8_t>);
static_assert(xk::dtype_name(DType::Float32)[0] == 'f');

TEST(DType, SizeMatchesCppTypeForAll15) {
  int count = 0;
  for_each_type_case([&](auto c) {
    using C = decltype(c);
    using T = typename C::type;
    static_assert(xk::dtype_size(C::dtype) == sizeof(T));
    EXPECT_EQ(xk::dtype_size(C::dtype), sizeof(T)) << C::name;
    ++count;
  });
  EXPECT_EQ(count, xk::kNumDTypes);
}

TEST(DType, ExpectedByteSizes) {
  const std::pair<DType, size_t> expected[] = {
      {DType::Bool, 1},     {DType::Int8, 1},      {DType::Int16, 2},
      {DType::Int32, 4},    {DType::Int64, 8},     {DType::UInt8, 1},
      {DType::UInt16, 2},   {DType::UInt32, 4},    {DType::UInt64, 8},
      {DType::Float16, 2},  {DType::BFloat16, 2},  {DType::Float32, 4},
      {DType::Float64, 8},  {DType::Complex64, 8}, {DType::Complex128, 16},
  };
  for (auto [dt, size] : expected) {
    EXPECT_EQ(xk::dtype_size(dt), size) << xk::dtype_name(dt);
  }
}

TEST(DType, NamesForAll15AreTheJaxNames) {
  std::set<std::string> seen;
  for_each_type_case([&](auto c) {
    using C = decltype(c);
    EXPECT_STREQ(xk::dtype_name(C::dtype), C::name);
    seen.insert(xk::dtype_name(C::dtype));
  });
  EXPECT_EQ(seen.size(), 15u) << "dtype names must be distinct";
  EXPECT_EQ(seen.count("invalid"), 0u);
}

TEST(DType, InvalidAndOutOfRangeValues) {
  EXPECT_STREQ(xk::dtype_name(DType::Invalid), "invalid");
  EXPECT_EQ(xk::dtype_size(DType::Invalid), 0u);
  // A value no enumerator names (e.g. a corrupted or future type id).
  for (int raw : {15, 16, 42, 200, 254}) {
    const auto dt = static_cast<DType>(raw);
    EXPECT_STREQ(xk::dtype_name(dt), "invalid") << raw;
    EXPECT_EQ(xk::dtype_size(dt), 0u) << raw;
  }
}

TEST(DType, EnumeratorsAreNumberedInDeclarationOrder) {
  // Bool=0 ... Complex128=14, the order BrainEvent uses.
  int expected = 0;
  for (DType dt : xk_test::all_dtypes()) {
    EXPECT_EQ(static_cast<int>(dt), expected) << xk::dtype_name(dt);
    ++expected;
  }
  EXPECT_EQ(expected, xk::kNumDTypes);
  EXPECT_EQ(static_cast<int>(DType::Invalid), 255);
}

TEST(DType, DTypeOfMapsEachOfThe15Types) {
  for_each_type_case([&](auto c) {
    using C = decltype(c);
    using T = typename C::type;
    static_assert(xk::dtype_of<T>() == C::dtype);
    EXPECT_EQ(xk::dtype_of<T>(), C::dtype) << C::name;
    // cv-qualifiers are ignored.
    EXPECT_EQ(xk::dtype_of<const T>(), C::dtype) << C::name;
    EXPECT_EQ(xk::dtype_of<volatile T>(), C::dtype) << C::name;
    EXPECT_EQ(xk::dtype_of<const volatile T>(), C::dtype) << C::name;
  });
}

TEST(DType, DTypeOfIsInjective) {
  // No two of the 15 C++ types map to the same DType.
  std::set<int> seen;
  for_each_type_case([&](auto c) {
    seen.insert(static_cast<int>(xk::dtype_of<typename decltype(c)::type>()));
  });
  EXPECT_EQ(seen.size(), 15u);
}

TEST(DType, DTypeOfOtherTypesIsInvalid) {
  EXPECT_EQ(xk::dtype_of<long double>(), DType::Invalid);
  EXPECT_EQ(xk::dtype_of<std::string>(), DType::Invalid);
  EXPECT_EQ(xk::dtype_of<float*>(), DType::Invalid);
  EXPECT_EQ(xk::dtype_of<const float*>(), DType::Invalid);
  EXPECT_EQ(xk::dtype_of<float&>(), DType::Invalid);
  EXPECT_EQ(xk::dtype_of<void>(), DType::Invalid);
  struct NotAnElement {
    float x;
  };
  EXPECT_EQ(xk::dtype_of<NotAnElement>(), DType::Invalid);
}

TEST(DType, HostHalfAndComplexLayouts) {
  // On the host the 16-bit floats are opaque 2-byte storage, and the complex
  // types are {real, imag} pairs laid out as in numpy / XLA.
  static_assert(std::is_trivially_copyable_v<xk::float16_t>);
  static_assert(std::is_trivially_copyable_v<xk::bfloat16_t>);
  static_assert(sizeof(xk::complex64_t) == 2 * sizeof(float));
  static_assert(sizeof(xk::complex128_t) == 2 * sizeof(double));
  static_assert(offsetof(xk::complex64_t, imag) == sizeof(float));
  static_assert(offsetof(xk::complex128_t, imag) == sizeof(double));

  const float pair[2] = {1.5f, -2.25f};
  xk::complex64_t c;
  std::memcpy(&c, pair, sizeof c);
  EXPECT_EQ(c.real, 1.5f);
  EXPECT_EQ(c.imag, -2.25f);

  const uint16_t one_bits = 0x3C00;  // 1.0 in IEEE half precision
  xk::float16_t h;
  std::memcpy(&h, &one_bits, sizeof h);
  EXPECT_EQ(h.bits, one_bits);
}

}  // namespace
