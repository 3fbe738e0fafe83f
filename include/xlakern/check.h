// xlakern/check.h -- checks that throw instead of aborting.
//
//   XK_CHECK(x.ndim() == 1) << "expected a vector, got " << x.ndim() << " dims";
//   XK_CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream));
//   kernel<<<grid, block, 0, stream>>>(...); XK_CHECK_LAUNCH();
//
// A failed check throws xk::Error. The generated FFI handler catches it and
// returns an XLA FFI error naming the kernel, so Python sees an exception and
// the process goes on. These macros are host-only; nothing here aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace xk {

// The exception every xlakern check throws. User code may throw it (or any
// std::exception) too; the handler turns both into a Python error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {

// Collects the streamed message of a failing check.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* what) {
    stream_ << what << " (at " << file << ":" << line << ")";
    prefix_len_ = stream_.tellp();
  }
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    if (stream_.tellp() == prefix_len_) stream_ << ": ";
    stream_ << value;
    return *this;
  }
  std::string str() const { return stream_.str(); }

 private:
  std::ostringstream stream_;
  std::streampos prefix_len_;
};

// `Thrower() & message` throws; `&` binds looser than `<<`, so the whole
// streamed message is built first.
struct CheckThrower {
  [[noreturn]] void operator&(const CheckMessage& message) const {
    throw Error(message.str());
  }
};

}  // namespace detail
}  // namespace xk

#define XK_CHECK(cond)  \
  if (cond) {           \
  } else                \
    ::xk::detail::CheckThrower() & \
        ::xk::detail::CheckMessage(__FILE__, __LINE__, "check failed: " #cond)

#if defined(__CUDACC__) || defined(CUDART_VERSION)
#define XK_CUDA_CHECK(expr)                                                  \
  do {                                                                       \
    cudaError_t xk_cuda_status_ = (expr);                                    \
    if (xk_cuda_status_ != cudaSuccess) {                                    \
      ::xk::detail::CheckThrower() &                                         \
          ::xk::detail::CheckMessage(__FILE__, __LINE__,                     \
                                     "CUDA call failed: " #expr)             \
              << cudaGetErrorName(xk_cuda_status_) << " ("                   \
              << cudaGetErrorString(xk_cuda_status_) << ")";                 \
    }                                                                        \
  } while (0)

// Catches launch-configuration errors (too many threads, too much shared
// memory, ...) of the kernel launched just before. It does not synchronise,
// so it is safe inside CUDA-graph capture.
#define XK_CHECK_LAUNCH() XK_CUDA_CHECK(cudaGetLastError())
#endif
