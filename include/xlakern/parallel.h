// xlakern/parallel.h -- xk::parallel_for on XLA's intra-op thread pool.
//
//   xk::parallel_for(x.numel(), 4096, [&](int64_t begin, int64_t end) {
//     for (int64_t i = begin; i < end; ++i) out[i] = in[i] + 1;
//   });
//
// `fn(begin, end)` is called on disjoint ranges covering [0, n), each at least
// `grain` long (except the last). Inside a CPU kernel called by XLA, the ranges
// run on XLA's intra-op thread pool; elsewhere (no pool, one thread, or n <=
// grain) the loop runs serially on the calling thread. An exception thrown by
// `fn` is rethrown on the calling thread after every started range finished.
//
// The pooled half (detail::parallel_run) is defined once per library, in
// xlakern/parallel_run.h: every C++ module that xlakern's loaders build links a
// unit they generate for it. A library of your own built against these headers
// (xlakern.include_dir()) includes xlakern/parallel_run.h in one of its units.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "xlakern/config.h"

#if defined(__CUDACC__)

// Sources that nvcc compiles belong to CUDA modules, whose handlers run on a GPU
// stream with no thread pool installed, so parallel_for there is always the serial
// loop. Spelling it out leaves <mutex>, <condition_variable>, <atomic> and
// <memory> out of every CUDA translation unit (about 0.75 s of nvcc's time each).
// Its own inline namespace keeps these definitions apart from the pooled ones that
// the host-compiled units of the same library (the generated handlers) define.
namespace xk {
inline namespace serial_in_cuda_units {

inline int64_t num_threads() { return 1; }

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  (void)grain;
  if (n > 0) fn(int64_t{0}, n);
}

}  // namespace serial_in_cuda_units
}  // namespace xk

#else

namespace xk {
namespace detail {

// A type-erased handle on the thread pool of the current FFI call. The
// generated handler installs one (ThreadPoolScope) around the user function;
// it is per call and only the calling thread reads it (pool threads see none,
// so a parallel_for nested inside a range runs serially).
struct ThreadPoolRef {
  void* pool = nullptr;
  // Pool size; -1 until first asked, so kernels that never call parallel_for
  // never pay for the query.
  int64_t num_threads = -1;
  int64_t (*count_threads)(void* pool) = nullptr;
  // Runs task(arg) on some pool thread, eventually.
  void (*schedule)(void* pool, void (*task)(void*), void* arg) = nullptr;
};

inline ThreadPoolRef*& current_thread_pool() {
  static thread_local ThreadPoolRef* current = nullptr;
  return current;
}

class ThreadPoolScope {
 public:
  explicit ThreadPoolScope(ThreadPoolRef* pool)
      : saved_(current_thread_pool()) {
    current_thread_pool() = pool;
  }
  ~ThreadPoolScope() { current_thread_pool() = saved_; }
  ThreadPoolScope(const ThreadPoolScope&) = delete;
  ThreadPoolScope& operator=(const ThreadPoolScope&) = delete;

 private:
  ThreadPoolRef* saved_;
};

// Runs run_range(fn, begin, end) over [0, n) in chunks of `chunk` on the current
// pool, with the calling thread taking chunks too; returns once every chunk has
// run, rethrowing the first exception. Defined once per library, out of line, in
// xlakern/parallel_run.h: the pool's bookkeeping needs <mutex>, <condition_variable>,
// <memory> and <atomic>, which cost each translation unit that included them about
// 0.3 s of g++'s time, and its code was compiled again for every parallel_for body.
XK_HIDDEN void parallel_run(int64_t n, int64_t chunk, int64_t threads, void (*run_range)(void* fn, int64_t begin, int64_t end),
                  void* fn);

}  // namespace detail

// Number of threads parallel_for may use in the current context (>= 1).
inline int64_t num_threads() {
  detail::ThreadPoolRef* pool = detail::current_thread_pool();
  if (pool == nullptr || pool->schedule == nullptr) return 1;
  if (pool->num_threads < 0) {
    pool->num_threads = pool->count_threads ? pool->count_threads(pool->pool) : 1;
  }
  return pool->num_threads > 1 ? pool->num_threads : 1;
}

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t threads = num_threads();
  if (threads <= 1 || n <= grain) {
    fn(int64_t{0}, n);
    return;
  }
  // About four chunks per thread balances uneven work without tiny chunks.
  // (Divisions are written so that n near INT64_MAX cannot overflow.)
  const int64_t parts = threads * 4;
  const int64_t chunk = std::max(grain, n / parts + (n % parts != 0));
  using Fn = std::remove_reference_t<F>;
  detail::parallel_run(n, chunk, threads,
                       [](void* f, int64_t begin, int64_t end) { (*static_cast<Fn*>(f))(begin, end); },
                       const_cast<void*>(static_cast<const void*>(&fn)));
}

namespace detail {

// Clears `bytes` bytes at `p` (zeroed_outputs on the CPU). Large buffers are split over the
// pool: one thread clearing a 16 MB output costs about as much as XLA's own (parallel) fill.
inline void parallel_zero(void* p, size_t bytes) {
  constexpr int64_t kChunk = int64_t(1) << 18;  // 256 KiB: small buffers stay one memset
  const int64_t chunks = (int64_t(bytes) + kChunk - 1) / kChunk;
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    const size_t lo = size_t(begin) * kChunk, hi = std::min(bytes, size_t(end) * kChunk);
    std::memset(static_cast<char*>(p) + lo, 0, hi - lo);
  });
}

}  // namespace detail

}  // namespace xk

#endif  // defined(__CUDACC__)
