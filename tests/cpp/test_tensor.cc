// xk::Tensor: shape queries, row-major strides, sizes, typed data access.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_util.h"
#include "xlakern/tensor.h"

namespace {

using xk::DType;
using xk::Tensor;

static_assert(std::is_trivially_copyable_v<Tensor>,
              "Tensor is passed by value into __global__ functions");
static_assert(std::is_trivially_destructible_v<Tensor>);
static_assert(std::is_standard_layout_v<Tensor>);
static_assert(xk::kMaxDims == 8 && XK_MAX_DIMS == 8);

Tensor make(void* data, DType dt, const std::vector<int64_t>& shape) {
  return Tensor(data, dt, shape.data(), static_cast<int>(shape.size()));
}

// Runs f and returns what() of the xk::Error it throws ("" plus a failure if
// it throws nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const xk::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a std::exception that is not xk::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an xk::Error, nothing was thrown";
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Tensor, ThreeDimensionalFloat32) {
  std::vector<float> buf(2 * 3 * 4);
  const Tensor t = make(buf.data(), DType::Float32, {2, 3, 4});

  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.dtype(), DType::Float32);
  EXPECT_EQ(t.shape(0), 2);
  EXPECT_EQ(t.shape(1), 3);
  EXPECT_EQ(t.shape(2), 4);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.size(2), 4);
  // Negative indices count from the end.
  EXPECT_EQ(t.shape(-1), 4);
  EXPECT_EQ(t.shape(-2), 3);
  EXPECT_EQ(t.shape(-3), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  // Row-major strides, in elements (not bytes).
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.element_size(), 4u);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.data_ptr(), buf.data());
  EXPECT_EQ(t.data<float>(), buf.data());
  EXPECT_EQ(t.data<const float>(), buf.data());
  EXPECT_EQ(t.data_ptr<float>(), buf.data());
}

TEST(Tensor, StridesAddressTheRowMajorElement) {
  // Writing through the strides must hit the element numpy's C order puts
  // there: flat index ((i*3)+j)*4+k for shape (2,3,4).
  std::vector<int32_t> buf(24, -1);
  Tensor t = make(buf.data(), DType::Int32, {2, 3, 4});
  int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.shape(0); ++i)
    for (int64_t j = 0; j < t.shape(1); ++j)
      for (int64_t k = 0; k < t.shape(2); ++k)
        p[i * t.stride(0) + j * t.stride(1) + k * t.stride(2)] =
            static_cast<int32_t>((i * 3 + j) * 4 + k);
  for (int32_t f = 0; f < 24; ++f) EXPECT_EQ(buf[f], f);
}

TEST(Tensor, ZeroDimensionalIsAScalar) {
  double x = 3.5;
  const Tensor t(&x, DType::Float64, nullptr, 0);
  EXPECT_EQ(t.ndim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.nbytes(), sizeof(double));
  EXPECT_EQ(*t.data<double>(), 3.5);
  // There is no dimension to ask about.
  EXPECT_THROW(t.shape(0), xk::Error);
  EXPECT_THROW(t.shape(-1), xk::Error);
  EXPECT_THROW(t.stride(0), xk::Error);
  EXPECT_THROW(t.size(-1), xk::Error);
}

TEST(Tensor, ZeroSizedDimensionMeansNoElements) {
  const std::vector<std::vector<int64_t>> shapes = {
      {0}, {3, 0}, {0, 5}, {3, 0, 5}, {2, 3, 4, 5, 6, 7, 8, 0}};
  for (const auto& shape : shapes) {
    const Tensor t = make(nullptr, DType::Float32, shape);
    EXPECT_EQ(t.ndim(), static_cast<int>(shape.size()));
    EXPECT_EQ(t.numel(), 0) << "ndim " << shape.size();
    EXPECT_EQ(t.nbytes(), 0u) << "ndim " << shape.size();
    for (int i = 0; i < t.ndim(); ++i) EXPECT_EQ(t.shape(i), shape[i]);
    EXPECT_EQ(t.stride(-1), 1);
  }
}

TEST(Tensor, OneDimensional) {
  std::vector<uint8_t> buf(17);
  const Tensor t = make(buf.data(), DType::UInt8, {17});
  EXPECT_EQ(t.ndim(), 1);
  EXPECT_EQ(t.shape(0), 17);
  EXPECT_EQ(t.shape(-1), 17);
  EXPECT_EQ(t.stride(0), 1);
  EXPECT_EQ(t.numel(), 17);
  EXPECT_EQ(t.nbytes(), 17u);
}

class TensorRandom : public xk_test::SeededTest {};

TEST_F(TensorRandom, ShapeStrideNumelMatchReference) {
  std::uniform_int_distribution<int> ndim_dist(0, xk::kMaxDims);
  std::uniform_int_distribution<int64_t> dim_dist(1, 6);
  const std::vector<DType> dtypes = xk_test::all_dtypes();
  std::uniform_int_distribution<size_t> dt_dist(0, dtypes.size() - 1);
  for (int trial = 0; trial < 500; ++trial) {
    const int ndim = ndim_dist(rng_);
    std::vector<int64_t> shape(ndim);
    for (auto& d : shape) d = dim_dist(rng_);
    const DType dt = dtypes[dt_dist(rng_)];
    std::vector<int64_t> shape_copy = shape;
    const Tensor t = make(reinterpret_cast<void*>(0x1000), dt, shape_copy);
    // The tensor keeps its own copy of the shape.
    std::fill(shape_copy.begin(), shape_copy.end(), 99);

    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    ASSERT_EQ(t.ndim(), ndim) << seed_msg();
    ASSERT_EQ(t.numel(), numel) << seed_msg();
    ASSERT_EQ(t.nbytes(), static_cast<size_t>(numel) * xk::dtype_size(dt)) << seed_msg();
    ASSERT_EQ(t.element_size(), xk::dtype_size(dt)) << seed_msg();
    ASSERT_EQ(t.dtype(), dt) << seed_msg();
    for (int i = 0; i < ndim; ++i) {
      int64_t stride = 1;
      for (int j = i + 1; j < ndim; ++j) stride *= shape[j];
      ASSERT_EQ(t.shape(i), shape[i]) << seed_msg();
      ASSERT_EQ(t.size(i), shape[i]) << seed_msg();
      ASSERT_EQ(t.shape(i - ndim), shape[i]) << seed_msg();
      ASSERT_EQ(t.stride(i), stride) << seed_msg();
      ASSERT_EQ(t.stride(i - ndim), stride) << seed_msg();
      ASSERT_EQ(t.shape_ptr()[i], shape[i]) << seed_msg();
      ASSERT_EQ(t.strides_ptr()[i], stride) << seed_msg();
    }
    // Outermost stride times outermost size covers the buffer exactly.
    if (ndim > 0) {
      ASSERT_EQ(t.stride(0) * t.shape(0), numel) << seed_msg();
    }
    ASSERT_THROW(t.shape(ndim), xk::Error) << seed_msg();
    ASSERT_THROW(t.shape(-ndim - 1), xk::Error) << seed_msg();
  }
}

TEST_F(TensorRandom, CopiesAndByteCopiesBehaveLikeTheOriginal) {
  std::uniform_int_distribution<int64_t> dim_dist(1, 9);
  std::vector<int64_t> shape = {dim_dist(rng_), dim_dist(rng_), dim_dist(rng_)};
  std::vector<float> buf(shape[0] * shape[1] * shape[2]);
  std::normal_distribution<float> val(0.f, 1.f);
  for (auto& v : buf) v = val(rng_);

  const Tensor t = make(buf.data(), DType::Float32, shape);
  const Tensor copy = t;
  // What a kernel launch does with a by-value argument: copy the bytes.
  alignas(Tensor) unsigned char bytes[sizeof(Tensor)];
  std::memcpy(bytes, &t, sizeof(Tensor));
  Tensor raw_storage;
  std::memcpy(&raw_storage, bytes, sizeof(Tensor));
  const Tensor& raw = raw_storage;

  for (const Tensor* c : {&copy, &raw}) {
    EXPECT_EQ(c->ndim(), 3);
    EXPECT_EQ(c->dtype(), DType::Float32);
    EXPECT_EQ(c->numel(), t.numel());
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(c->shape(i), shape[i]);
      EXPECT_EQ(c->stride(i), t.stride(i));
    }
    const float* p = c->data<float>();
    ASSERT_EQ(p, buf.data());
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(p[i], buf[i]) << seed_msg();
  }
}

TEST(Tensor, EightDimensionsIsTheMaximum) {
  const std::vector<int64_t> shape = {2, 1, 3, 1, 2, 1, 2, 2};
  const Tensor t = make(nullptr, DType::Int16, shape);
  EXPECT_EQ(t.ndim(), 8);
  EXPECT_EQ(t.numel(), 48);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.stride(0), 24);
  EXPECT_EQ(t.stride(7), 1);
  EXPECT_EQ(t.shape(-8), 2);
  EXPECT_THROW(t.shape(8), xk::Error);
  EXPECT_THROW(t.shape(-9), xk::Error);
}

TEST(Tensor, MoreThanEightDimensionsThrows) {
  for (int ndim : {9, 10, 32}) {
    const std::vector<int64_t> shape(ndim, 1);
    const std::string msg = error_of([&] { make(nullptr, DType::Float32, shape); });
    EXPECT_TRUE(contains(msg, "0 to 8 dimensions")) << msg;
    EXPECT_TRUE(contains(msg, "got " + std::to_string(ndim))) << msg;
  }
}

TEST(Tensor, NegativeDimensionCountThrows) {
  const int64_t shape[1] = {4};
  const std::string msg = error_of([&] { Tensor(nullptr, DType::Float32, shape, -1); });
  EXPECT_TRUE(contains(msg, "got -1")) << msg;
}

TEST(Tensor, OutOfRangeDimensionIndexThrowsWithIndexAndRank) {
  const Tensor t = make(nullptr, DType::Float32, {5, 6});
  for (int i : {2, 3, 100, -3, -100}) {
    const std::string expected =
        "dimension index " + std::to_string(i) + " is out of range for a 2-d tensor";
    std::string msg = error_of([&] { t.shape(i); });
    EXPECT_TRUE(contains(msg, expected)) << msg;
    msg = error_of([&] { t.size(i); });
    EXPECT_TRUE(contains(msg, expected)) << msg;
    msg = error_of([&] { t.stride(i); });
    EXPECT_TRUE(contains(msg, expected)) << msg;
  }
}

TEST(Tensor, ElementSizeAndNbytesForAll15DTypes) {
  xk_test::for_each_type_case([&](auto c) {
    using C = decltype(c);
    using T = typename C::type;
    alignas(16) unsigned char buf[3 * 7 * sizeof(T)];
    const Tensor t = make(buf, C::dtype, {3, 7});
    EXPECT_EQ(t.element_size(), sizeof(T)) << C::name;
    EXPECT_EQ(t.nbytes(), 21 * sizeof(T)) << C::name;
    EXPECT_EQ(t.dtype(), C::dtype) << C::name;
  });
}

TEST(Tensor, DataReturnsThePointerOnlyForTheMatchingType) {
  // A 15 x 15 matrix: tensor dtype x requested C++ type.
  alignas(16) unsigned char storage[64];
  int checked = 0;
  xk_test::for_each_type_case([&](auto tensor_case) {
    using TC = decltype(tensor_case);
    const Tensor t = make(storage, TC::dtype, {4});
    xk_test::for_each_type_case([&](auto request_case) {
      using RC = decltype(request_case);
      using T = typename RC::type;
      if constexpr (std::is_same_v<typename TC::type, T>) {
        EXPECT_EQ(static_cast<const void*>(t.data<T>()), storage) << TC::name;
        EXPECT_EQ(static_cast<const void*>(t.data<const T>()), storage) << TC::name;
      } else {
        const std::string msg = error_of([&] { t.data<T>(); });
        const std::string want = std::string("Tensor::data<") + RC::name +
                                 ">() called on a " + TC::name + " tensor";
        EXPECT_TRUE(contains(msg, want)) << "got: " << msg << "\nwant: " << want;
        // The unchecked accessor is BrainEvent's escape hatch; it never throws.
        EXPECT_EQ(static_cast<void*>(t.data_ptr<T>()), storage);
      }
      ++checked;
    });
  });
  EXPECT_EQ(checked, 15 * 15);
}

TEST(Tensor, ConstTensorGivesReadOnlyElements) {
  // Entry points take inputs as `const xk::Tensor`: their elements must not be
  // writable through data<T>(), while outputs (non-const) stay writable.
  float x[2] = {1.0f, 2.0f};
  const int64_t shape[1] = {2};
  const Tensor in(x, DType::Float32, shape, 1);
  Tensor out(x, DType::Float32, shape, 1);
  static_assert(std::is_same_v<decltype(in.data<float>()), const float*>);
  static_assert(std::is_same_v<decltype(out.data<float>()), float*>);
  static_assert(std::is_same_v<decltype(std::as_const(out).data<float>()), const float*>);
  out.data<float>()[1] = 5.0f;
  EXPECT_EQ(in.data<float>()[1], 5.0f);
  EXPECT_EQ(in.data<float>(), x);
  EXPECT_THROW(in.data<int32_t>(), xk::Error);
}

TEST(Tensor, DataWithANonElementTypeThrows) {
  float x = 0;
  const Tensor t(&x, DType::Float32, nullptr, 0);
  const std::string msg = error_of([&] { t.data<long double>(); });
  EXPECT_TRUE(contains(msg, "Tensor::data<invalid>() called on a float32 tensor")) << msg;
  // Signedness matters: int32 data is not uint32 data.
  int32_t i = 0;
  const Tensor ti(&i, DType::Int32, nullptr, 0);
  EXPECT_THROW(ti.data<uint32_t>(), xk::Error);
  EXPECT_EQ(ti.data<int32_t>(), &i);
}

TEST(Tensor, DefaultConstructedIsEmpty) {
  const Tensor t;
  EXPECT_EQ(t.ndim(), 0);
  EXPECT_EQ(t.data_ptr(), nullptr);
  EXPECT_EQ(t.dtype(), DType::Invalid);
  EXPECT_EQ(t.element_size(), 0u);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_THROW(t.data<float>(), xk::Error);
  EXPECT_THROW(t.shape(0), xk::Error);
}

}  // namespace

TEST(TensorDataRegression, NonElementTypeThrowsEvenOnInvalidDType) {
  struct NotAnElement {
    int a;
  };
  xk::Tensor empty;
  EXPECT_THROW(empty.data<NotAnElement>(), xk::Error);
  float storage[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  xk::Tensor t(storage, xk::DType::Float32, shape, 1);
  EXPECT_THROW(t.data<NotAnElement>(), xk::Error);
  EXPECT_EQ(t.data_ptr<NotAnElement>(), reinterpret_cast<NotAnElement*>(storage));  // unchecked cast
}
