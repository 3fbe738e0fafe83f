// XK_DISPATCH_* macros: the bound scalar type, return values, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "test_util.h"
#include "xlakern/dispatch.h"
#include "xlakern/tensor.h"

namespace {

using xk::DType;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// What each family accepts (BrainEvent counts bool as integral).
const std::set<DType> kFloating = {DType::Float32, DType::Float64};
const std::set<DType> kFloatingAndHalf = {DType::Float16, DType::BFloat16, DType::Float32,
                                          DType::Float64};
const std::set<DType> kIntegral = {DType::Bool,  DType::Int8,   DType::Int16,
                                   DType::Int32, DType::Int64,  DType::UInt8,
                                   DType::UInt16, DType::UInt32, DType::UInt64};
std::set<DType> all_types_family() {
  std::set<DType> s = kIntegral;
  s.insert(kFloating.begin(), kFloating.end());
  return s;
}

// What the dispatched body saw.
struct Seen {
  DType dtype;
  size_t size;
  bool operator==(const Seen& o) const { return dtype == o.dtype && size == o.size; }
};

// For one family: every accepted dtype binds the matching C++ type, and every
// other dtype (all 15 plus Invalid) throws an xk::Error naming the dtype and
// the macro.
template <typename Dispatch>
void check_family(const char* macro, const std::set<DType>& accepted, Dispatch dispatch) {
  std::vector<DType> dtypes = xk_test::all_dtypes();
  dtypes.push_back(DType::Invalid);
  int ran = 0;
  for (DType dt : dtypes) {
    SCOPED_TRACE(std::string(macro) + " on " + xk::dtype_name(dt));
    if (accepted.count(dt)) {
      const Seen seen = dispatch(dt);
      EXPECT_EQ(seen.dtype, dt);
      EXPECT_EQ(seen.size, xk::dtype_size(dt));
      ++ran;
    } else {
      try {
        dispatch(dt);
        ADD_FAILURE() << "no error for an unsupported dtype";
      } catch (const xk::Error& e) {
        const std::string msg = e.what();
        EXPECT_TRUE(contains(msg, macro)) << msg;
        EXPECT_TRUE(contains(msg, std::string("unsupported dtype ") + xk::dtype_name(dt)))
            << msg;
      }
    }
  }
  EXPECT_EQ(ran, static_cast<int>(accepted.size()));
}

TEST(Dispatch, FloatingBindsFloatAndDouble) {
  check_family("XK_DISPATCH_FLOATING", kFloating, [](DType dt) {
    return XK_DISPATCH_FLOATING(dt, scalar_t, {
      static_assert(std::is_floating_point_v<scalar_t>);
      return Seen{xk::dtype_of<scalar_t>(), sizeof(scalar_t)};
    });
  });
}

TEST(Dispatch, FloatingAndHalfBindsTheFourFloatTypes) {
  check_family("XK_DISPATCH_FLOATING_AND_HALF", kFloatingAndHalf, [](DType dt) {
    return XK_DISPATCH_FLOATING_AND_HALF(dt, scalar_t, {
      return Seen{xk::dtype_of<scalar_t>(), sizeof(scalar_t)};
    });
  });
}

TEST(Dispatch, IntegralBindsBoolAndTheEightIntegerTypes) {
  check_family("XK_DISPATCH_INTEGRAL", kIntegral, [](DType dt) {
    return XK_DISPATCH_INTEGRAL(dt, scalar_t, {
      static_assert(std::is_integral_v<scalar_t>);
      return Seen{xk::dtype_of<scalar_t>(), sizeof(scalar_t)};
    });
  });
}

TEST(Dispatch, AllTypesBindsIntegralAndFloating) {
  check_family("XK_DISPATCH_ALL_TYPES", all_types_family(), [](DType dt) {
    return XK_DISPATCH_ALL_TYPES(dt, scalar_t, {
      static_assert(std::is_arithmetic_v<scalar_t>);
      return Seen{xk::dtype_of<scalar_t>(), sizeof(scalar_t)};
    });
  });
}

TEST(Dispatch, ExactTypeIdentity) {
  // std::is_same on the bound type, not only its size.
  EXPECT_TRUE(XK_DISPATCH_FLOATING(DType::Float32, T, { return std::is_same_v<T, float>; }));
  EXPECT_TRUE(XK_DISPATCH_FLOATING(DType::Float64, T, { return std::is_same_v<T, double>; }));
  EXPECT_TRUE(XK_DISPATCH_FLOATING_AND_HALF(DType::Float16, T,
                                            { return std::is_same_v<T, xk::float16_t>; }));
  EXPECT_TRUE(XK_DISPATCH_FLOATING_AND_HALF(DType::BFloat16, T,
                                            { return std::is_same_v<T, xk::bfloat16_t>; }));
  EXPECT_TRUE(XK_DISPATCH_INTEGRAL(DType::Bool, T, { return std::is_same_v<T, bool>; }));
  EXPECT_TRUE(XK_DISPATCH_INTEGRAL(DType::Int8, T, { return std::is_same_v<T, int8_t>; }));
  EXPECT_TRUE(XK_DISPATCH_INTEGRAL(DType::UInt8, T, { return std::is_same_v<T, uint8_t>; }));
  EXPECT_TRUE(XK_DISPATCH_INTEGRAL(DType::Int64, T, { return std::is_same_v<T, int64_t>; }));
  EXPECT_TRUE(XK_DISPATCH_INTEGRAL(DType::UInt64, T, { return std::is_same_v<T, uint64_t>; }));
  EXPECT_TRUE(XK_DISPATCH_ALL_TYPES(DType::UInt16, T, { return std::is_same_v<T, uint16_t>; }));
  EXPECT_TRUE(XK_DISPATCH_ALL_TYPES(DType::Int32, T, { return std::is_same_v<T, int32_t>; }));
  EXPECT_TRUE(XK_DISPATCH_ALL_TYPES(DType::Float64, T, { return std::is_same_v<T, double>; }));
}

TEST(Dispatch, ReturnsTheBodysValue) {
  const std::string name =
      XK_DISPATCH_ALL_TYPES(DType::UInt32, T, { return std::string(xk::dtype_name(xk::dtype_of<T>())); });
  EXPECT_EQ(name, "uint32");
  const double half_max = XK_DISPATCH_FLOATING(DType::Float32, T, {
    return static_cast<double>(std::numeric_limits<T>::max()) / 2;
  });
  EXPECT_EQ(half_max, static_cast<double>(std::numeric_limits<float>::max()) / 2);
  const long long lowest = XK_DISPATCH_INTEGRAL(DType::Int16, T, {
    return static_cast<long long>(std::numeric_limits<T>::lowest());
  });
  EXPECT_EQ(lowest, -32768);
}

// Used as a statement whose body returns nothing and writes captured locals.
TEST(Dispatch, VoidBodyCapturesByReference) {
  int calls = 0;
  size_t size = 0;
  XK_DISPATCH_INTEGRAL(DType::Int16, T, {
    ++calls;
    size = sizeof(T);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(size, 2u);
  EXPECT_THROW(XK_DISPATCH_INTEGRAL(DType::Float32, T, { calls += sizeof(T) > 0; }), xk::Error);
  EXPECT_EQ(calls, 1) << "the body must not run for an unsupported dtype";
}

TEST(Dispatch, BodyWithCommasAndMultipleStatements) {
  // Commas at the top level of the body go through __VA_ARGS__.
  const auto pair_sum = XK_DISPATCH_FLOATING(DType::Float64, T, {
    T a = 1, b = 2;
    std::pair<T, T> p(a, b);
    return static_cast<double>(p.first + p.second) + (sizeof(T) == 8 ? 0.5 : 0.25);
  });
  static_assert(std::is_same_v<std::remove_const_t<decltype(pair_sum)>, double>);
  EXPECT_EQ(pair_sum, 3.5);
}

TEST(Dispatch, NestedDispatchBindsBothTypes) {
  std::set<std::pair<int, int>> seen;
  for (DType a : kIntegral) {
    for (DType b : kFloating) {
      XK_DISPATCH_INTEGRAL(a, index_t, {
        XK_DISPATCH_FLOATING(b, value_t, {
          seen.insert({static_cast<int>(xk::dtype_of<index_t>()),
                       static_cast<int>(xk::dtype_of<value_t>())});
        });
      });
    }
  }
  std::set<std::pair<int, int>> expected;
  for (DType a : kIntegral)
    for (DType b : kFloating) expected.insert({static_cast<int>(a), static_cast<int>(b)});
  EXPECT_EQ(seen, expected);
}

TEST(Dispatch, ErrorListsWhatIsSupported) {
  try {
    XK_DISPATCH_FLOATING(DType::Int32, T, { (void)sizeof(T); });
    FAIL() << "did not throw";
  } catch (const xk::Error& e) {
    EXPECT_STREQ(e.what(),
                 "XK_DISPATCH_FLOATING: unsupported dtype int32 (supported: float32, float64)");
  }
  try {
    XK_DISPATCH_ALL_TYPES(DType::Complex64, T, { (void)sizeof(T); });
    FAIL() << "did not throw";
  } catch (const xk::Error& e) {
    EXPECT_TRUE(contains(e.what(), "XK_DISPATCH_ALL_TYPES: unsupported dtype complex64"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "float32")) << e.what();
  }
}

// Dispatching on a real tensor with random contents: the typed pointer the
// body gets reads the values a statically typed loop reads.
class DispatchRandom : public xk_test::SeededTest {
 protected:
  // A plain array, not std::vector (std::vector<bool> has no data()).
  template <typename T>
  std::unique_ptr<T[]> random_values(size_t n) {
    std::unique_ptr<T[]> v(new T[n]);
    if constexpr (std::is_same_v<T, bool>) {
      std::bernoulli_distribution d(0.5);
      for (size_t i = 0; i < n; ++i) v[i] = d(rng_);
    } else if constexpr (std::is_integral_v<T>) {
      std::uniform_int_distribution<int64_t> d(std::is_signed_v<T> ? -100 : 0, 100);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(d(rng_));
    } else {
      std::uniform_real_distribution<T> d(-10, 10);
      for (size_t i = 0; i < n; ++i) v[i] = d(rng_);
    }
    return v;
  }

  template <typename T>
  void check_sum() {
    std::uniform_int_distribution<int64_t> dim(1, 40);
    const int64_t shape[2] = {dim(rng_), dim(rng_)};
    const size_t n = static_cast<size_t>(shape[0] * shape[1]);
    std::unique_ptr<T[]> data = random_values<T>(n);
    double expected = 0;
    for (size_t i = 0; i < n; ++i) expected += static_cast<double>(data[i]);

    const xk::Tensor t(data.get(), xk::dtype_of<T>(), shape, 2);
    const double got = XK_DISPATCH_ALL_TYPES(t.dtype(), scalar_t, {
      const scalar_t* p = t.data<scalar_t>();
      double s = 0;
      for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(p[i]);
      return s;
    });
    EXPECT_EQ(got, expected) << xk::dtype_name(t.dtype()) << "; " << seed_msg();
  }
};

TEST_F(DispatchRandom, SumOverTensorOfEveryAllTypesDType) {
  check_sum<bool>();
  check_sum<int8_t>();
  check_sum<int16_t>();
  check_sum<int32_t>();
  check_sum<int64_t>();
  check_sum<uint8_t>();
  check_sum<uint16_t>();
  check_sum<uint32_t>();
  check_sum<uint64_t>();
  check_sum<float>();
  check_sum<double>();
}

TEST_F(DispatchRandom, ScaleInPlaceFloating) {
  for (DType dt : kFloating) {
    const double factor = std::uniform_real_distribution<double>(-3, 3)(rng_);
    const int64_t n = 257;
    std::unique_ptr<float[]> f = random_values<float>(n);
    std::unique_ptr<double[]> d = random_values<double>(n);
    void* ptr = dt == DType::Float32 ? static_cast<void*>(f.get()) : d.get();
    const std::vector<float> f0(f.get(), f.get() + n);
    const std::vector<double> d0(d.get(), d.get() + n);
    xk::Tensor t(ptr, dt, &n, 1);  // written through: an output
    XK_DISPATCH_FLOATING(t.dtype(), scalar_t, {
      scalar_t* p = t.data<scalar_t>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<scalar_t>(p[i] * factor);
    });
    for (int64_t i = 0; i < n; ++i) {
      if (dt == DType::Float32) {
        ASSERT_EQ(f[i], static_cast<float>(f0[i] * factor)) << seed_msg();
        ASSERT_EQ(d[i], d0[i]);
      } else {
        ASSERT_EQ(d[i], d0[i] * factor) << seed_msg();
        ASSERT_EQ(f[i], f0[i]);
      }
    }
  }
}

}  // namespace
