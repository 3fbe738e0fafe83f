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

// `text` with every byte that does not belong to a well-formed UTF-8 sequence
// written as \xNN. Messages travel to Python as str, which must be valid
// UTF-8: a raw byte streamed into a check (`<< (uint8_t)200`) would otherwise
// replace the whole message, kernel name included, by a decoding error.
inline std::string utf8_safe(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b < 0x80) {
      len = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // beyond U+10FFFF
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char c = static_cast<unsigned char>(text[i + k]);
      ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 0xF];
      i += 1;
    }
  }
  return out;
}

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
