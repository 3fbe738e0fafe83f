// brainevent/common.h: BrainEvent's spelling of the xlakern API.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "brainevent/common.h"
#include "test_util.h"

namespace {

static_assert(std::is_same_v<BE::Tensor, xk::Tensor>);
static_assert(std::is_same_v<BE::DType, xk::DType>);
static_assert(std::is_same_v<BE::float16_t, xk::float16_t>);
static_assert(std::is_same_v<BE::bfloat16_t, xk::bfloat16_t>);
static_assert(std::is_same_v<BE::complex64_t, xk::complex64_t>);
static_assert(std::is_same_v<BE::complex128_t, xk::complex128_t>);
static_assert(BE::kMaxDim == xk::kMaxDims);
static_assert(BE::dtype_size(BE::DType::Float64) == 8);

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The shape of a typical BrainEvent host kernel, written with BE:: names.
void be_scale(const BE::Tensor& in, BE::Tensor& out, double factor) {
  BE_CHECK(in.numel() == out.numel()) << "size mismatch: " << in.numel() << " vs " << out.numel();
  BE_CHECK(in.dtype() == out.dtype());
  BE_DISPATCH_FLOATING(in.dtype(), scalar_t, {
    const scalar_t* x = in.data_ptr<scalar_t>();
    scalar_t* y = out.data_ptr<scalar_t>();
    BE::parallel_for(in.numel(), 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = static_cast<scalar_t>(x[i] * factor);
    });
  });
}

TEST(BrainEventCompat, DTypeEnumeratorsAndNames) {
  EXPECT_EQ(BE::DType::Float32, xk::DType::Float32);
  EXPECT_STREQ(BE::dtype_name(BE::DType::Float32), "float32");
  EXPECT_STREQ(BE::dtype_name(BE::DType::BFloat16), "bfloat16");
  EXPECT_EQ(BE::dtype_size(BE::DType::Complex128), 16u);
  EXPECT_EQ(BE::dtype_size(BE::DType::Bool), 1u);
}

TEST(BrainEventCompat, TensorIsTheXlakernTensor) {
  std::vector<int16_t> buf(6);
  const int64_t shape[2] = {2, 3};
  const BE::Tensor t(buf.data(), BE::DType::Int16, shape, 2);
  const xk::Tensor& same = t;
  EXPECT_EQ(same.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.data_ptr<int16_t>(), buf.data());
  EXPECT_THROW(t.data<int32_t>(), xk::Error);
}

TEST(BrainEventCompat, CheckThrowsXkError) {
  EXPECT_NO_THROW(BE_CHECK(2 > 1) << "fine");
  int line = 0;
  try {
    line = __LINE__; BE_CHECK(1 > 2) << "value " << 7;
    FAIL() << "BE_CHECK did not throw";
  } catch (const xk::Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "check failed: 1 > 2")) << msg;
    EXPECT_TRUE(contains(msg, std::string(__FILE__) + ":" + std::to_string(line))) << msg;
    EXPECT_TRUE(contains(msg, "value 7")) << msg;
  }
}

TEST(BrainEventCompat, DispatchMacrosBindTheRightTypes) {
  EXPECT_EQ(BE_DISPATCH_FLOATING(BE::DType::Float64, T, { return xk::dtype_of<T>(); }),
            BE::DType::Float64);
  EXPECT_EQ(BE_DISPATCH_FLOATING_AND_HALF(BE::DType::BFloat16, T, { return xk::dtype_of<T>(); }),
            BE::DType::BFloat16);
  EXPECT_EQ(BE_DISPATCH_INTEGRAL(BE::DType::UInt16, T, { return xk::dtype_of<T>(); }),
            BE::DType::UInt16);
  EXPECT_EQ(BE_DISPATCH_ALL_TYPES(BE::DType::Int8, T, { return xk::dtype_of<T>(); }),
            BE::DType::Int8);
  EXPECT_EQ(BE_DISPATCH_ALL_TYPES(BE::DType::Float32, T, { return sizeof(T); }), 4u);

  // Unsupported dtypes throw; the message names the xlakern macro behind it.
  try {
    BE_DISPATCH_INTEGRAL(BE::DType::Float32, T, { (void)sizeof(T); });
    FAIL() << "no error";
  } catch (const xk::Error& e) {
    EXPECT_TRUE(contains(e.what(), "unsupported dtype float32")) << e.what();
    EXPECT_TRUE(contains(e.what(), "XK_DISPATCH_INTEGRAL")) << e.what();
  }
  EXPECT_THROW(BE_DISPATCH_FLOATING(BE::DType::Float16, T, { (void)sizeof(T); }), xk::Error);
  EXPECT_THROW(BE_DISPATCH_FLOATING_AND_HALF(BE::DType::Int32, T, { (void)sizeof(T); }),
               xk::Error);
  EXPECT_THROW(BE_DISPATCH_ALL_TYPES(BE::DType::Complex64, T, { (void)sizeof(T); }), xk::Error);
}

class BrainEventRandom : public xk_test::SeededTest {};

TEST_F(BrainEventRandom, KernelWrittenWithBENamesComputesTheRightValues) {
  xk_test::TestThreadPool pool(4);
  xk_test::TestPoolRef ref(&pool);
  xk::detail::ThreadPoolScope scope(ref.ref());
  const int64_t n = std::uniform_int_distribution<int64_t>(1, 50000)(rng_);
  const double factor = std::uniform_real_distribution<double>(-4, 4)(rng_);
  std::normal_distribution<double> val(0, 10);

  std::vector<float> xf(n), yf(n);
  std::vector<double> xd(n), yd(n);
  for (int64_t i = 0; i < n; ++i) {
    xf[i] = static_cast<float>(val(rng_));
    xd[i] = val(rng_);
  }
  BE::Tensor inf(xf.data(), BE::DType::Float32, &n, 1), outf(yf.data(), BE::DType::Float32, &n, 1);
  BE::Tensor ind(xd.data(), BE::DType::Float64, &n, 1), outd(yd.data(), BE::DType::Float64, &n, 1);
  be_scale(inf, outf, factor);
  be_scale(ind, outd, factor);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(yf[i], static_cast<float>(xf[i] * factor)) << seed_msg();
    ASSERT_EQ(yd[i], xd[i] * factor) << seed_msg();
  }

  // A failing BE_CHECK inside the kernel surfaces as xk::Error.
  const int64_t m = n + 1;
  std::vector<float> bigger(m);
  BE::Tensor wrong(bigger.data(), BE::DType::Float32, &m, 1);
  try {
    be_scale(inf, wrong, factor);
    FAIL() << "no error";
  } catch (const xk::Error& e) {
    EXPECT_TRUE(contains(e.what(), "size mismatch: " + std::to_string(n) + " vs " +
                                       std::to_string(m)))
        << e.what();
  }
  // So does an unsupported dtype.
  std::vector<int32_t> ints(n);
  BE::Tensor in_i(ints.data(), BE::DType::Int32, &n, 1), out_i(ints.data(), BE::DType::Int32, &n, 1);
  EXPECT_THROW(be_scale(in_i, out_i, factor), xk::Error);
}

}  // namespace
