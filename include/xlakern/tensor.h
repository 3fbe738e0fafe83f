// xlakern/tensor.h -- xk::Tensor, a non-owning view of one XLA buffer.
//
// A Tensor is trivially copyable and small (fixed-size shape/stride arrays),
// so it can be passed by value into a __global__ function and queried there.
#pragma once

#include <cstdint>

#include "xlakern/check.h"
#include "xlakern/config.h"
#include "xlakern/dtype.h"

namespace xk {

inline constexpr int kMaxDims = XK_MAX_DIMS;

class Tensor {
 public:
  XK_HOST_DEVICE Tensor() : data_(nullptr), ndim_(0), dtype_(DType::Invalid) {
    for (int i = 0; i < kMaxDims; ++i) shape_[i] = strides_[i] = 0;
  }

  // A dense row-major view (XLA's default layout, the one FFI buffers have).
  Tensor(void* data, DType dtype, const int64_t* shape, int ndim)
      : data_(data), ndim_(ndim), dtype_(dtype) {
    XK_CHECK(ndim >= 0 && ndim <= kMaxDims)
        << "xk::Tensor supports 0 to " << kMaxDims << " dimensions, got " << ndim;
    int64_t stride = 1;
    for (int i = kMaxDims - 1; i >= 0; --i) {
      shape_[i] = i < ndim ? shape[i] : 0;
      strides_[i] = i < ndim ? stride : 0;
      if (i < ndim) stride *= shape[i];
    }
  }

  // -- data ----------------------------------------------------------------
  XK_HOST_DEVICE void* data_ptr() const { return data_; }
  // Unchecked typed pointer (BrainEvent's spelling).
  template <typename T>
  XK_HOST_DEVICE T* data_ptr() const {
    return static_cast<T*>(data_);
  }
  // Typed pointer; on the host it checks that T matches the element type.
  // A const Tensor (how entry points take their inputs) gives read-only
  // elements; a non-const one (an output) gives writable ones.
  template <typename T>
  XK_HOST_DEVICE T* data() {
    check_element_type<T>();
    return static_cast<T*>(data_);
  }
  template <typename T>
  XK_HOST_DEVICE const T* data() const {
    check_element_type<T>();
    return static_cast<const T*>(data_);
  }

  // -- shape ---------------------------------------------------------------
  XK_HOST_DEVICE int ndim() const { return ndim_; }
  // Size of dimension i; negative i counts from the end as in Python.
  XK_HOST_DEVICE int64_t shape(int i) const { return shape_[axis(i)]; }
  XK_HOST_DEVICE int64_t size(int i) const { return shape_[axis(i)]; }
  // Stride of dimension i in elements.
  XK_HOST_DEVICE int64_t stride(int i) const { return strides_[axis(i)]; }
  XK_HOST_DEVICE const int64_t* shape_ptr() const { return shape_; }
  XK_HOST_DEVICE const int64_t* strides_ptr() const { return strides_; }
  // Number of elements; 1 for a 0-d tensor, 0 when any dimension is 0.
  XK_HOST_DEVICE int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  XK_HOST_DEVICE bool is_contiguous() const { return true; }

  // -- element type ----------------------------------------------------------
  XK_HOST_DEVICE DType dtype() const { return dtype_; }
  XK_HOST_DEVICE size_t element_size() const { return dtype_size(dtype_); }
  XK_HOST_DEVICE size_t nbytes() const {
    return static_cast<size_t>(numel()) * element_size();
  }

 private:
  template <typename T>
  XK_HOST_DEVICE void check_element_type() const {
#if !XK_DEVICE_PASS
    XK_CHECK(dtype_of<T>() != DType::Invalid && dtype_of<T>() == dtype_)
        << "Tensor::data<" << dtype_name(dtype_of<T>()) << ">() called on a "
        << dtype_name(dtype_) << " tensor; use the matching C++ type, dispatch on dtype(), "
        << "or data_ptr<T>() for an unchecked cast";
#endif
  }

  XK_HOST_DEVICE int axis(int i) const {
    int a = i < 0 ? i + ndim_ : i;
#if !XK_DEVICE_PASS
    XK_CHECK(a >= 0 && a < ndim_)
        << "dimension index " << i << " is out of range for a " << ndim_ << "-d tensor";
#endif
    return a;
  }

  void* data_;
  int64_t shape_[kMaxDims];
  int64_t strides_[kMaxDims];
  int ndim_;
  DType dtype_;
};

}  // namespace xk
