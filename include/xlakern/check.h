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

#include <cstdio>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "xlakern/config.h"

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

// The text std::ostream writes for `value` with its default flags, appended to
// `out` without <sstream>: that header costs nvcc about 0.35 s a translation
// unit, and every CUDA source includes this one. Any other type (a class with
// its own operator<<) goes through std::ostringstream, so code that streams one
// includes <sstream> itself (a static_assert says so).
template <typename T, typename = void>
struct IsComplete : std::false_type {};
template <typename T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

template <typename T>
struct DependentStream {
  using type = std::ostringstream;
};

template <typename T>
void append_streamed(std::string& out, const T& value) {
  using U = std::decay_t<T>;
  char buf[64];
  if constexpr (std::is_same_v<U, bool>) {
    out += value ? '1' : '0';
  } else if constexpr (std::is_same_v<U, char> || std::is_same_v<U, signed char> ||
                       std::is_same_v<U, unsigned char>) {
    out += static_cast<char>(value);  // a byte, as ostream writes it (utf8_safe escapes it)
  } else if constexpr (std::is_integral_v<U>) {
    out += std::to_string(value);
  } else if constexpr (std::is_floating_point_v<U>) {
    // ostream's default: %g with 6 significant digits
    std::snprintf(buf, sizeof buf, "%Lg", static_cast<long double>(value));
    out += buf;
  } else if constexpr (std::is_enum_v<U>) {
    out += std::to_string(static_cast<std::underlying_type_t<U>>(value));
  } else if constexpr (std::is_convertible_v<const U&, const char*>) {
    const char* text = value;
    if (text != nullptr) out += text;
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    out += std::string_view(value);
  } else if constexpr ((std::is_pointer_v<U> && !std::is_function_v<std::remove_pointer_t<U>>) ||
                       std::is_null_pointer_v<U>) {
    std::snprintf(buf, sizeof buf, "%p", static_cast<const void*>(value));
    out += buf;
  } else if constexpr (std::is_class_v<U> && std::is_convertible_v<const U&, float>) {
    // __half, __nv_bfloat16: ostream would pick operator<<(float) through the conversion
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(static_cast<float>(value)));
    out += buf;
  } else {
    using Stream = typename DependentStream<T>::type;
    static_assert(IsComplete<Stream>::value,
                  "XK_CHECK(...) << value: streaming this type uses its operator<<, which needs "
                  "std::ostringstream; #include <sstream> in this source (numbers, strings, "
                  "pointers and enums need nothing)");
    Stream stream;
    stream << value;
    out += stream.str();
  }
}

// Collects the streamed message of a failing check. Its members are out of line (XK_COLD):
// each check then costs a call, not the message's string building inlined at the check.
class CheckMessage {
 public:
  XK_COLD CheckMessage(const char* file, int line, const char* what) {
    text_ = what;
    text_ += " (at ";
    text_ += file;
    text_ += ':';
    text_ += std::to_string(line);
    text_ += ')';
    prefix_len_ = text_.size();
  }
  template <typename T>
  XK_COLD CheckMessage& operator<<(const T& value) {
    if (text_.size() == prefix_len_) text_ += ": ";
    append_streamed(text_, value);
    return *this;
  }
  std::string str() const { return text_; }

 private:
  std::string text_;
  size_t prefix_len_ = 0;
};

// `Thrower() & message` throws; `&` binds looser than `<<`, so the whole
// streamed message is built first.
struct CheckThrower {
  [[noreturn]] XK_COLD void operator&(const CheckMessage& message) const {
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
