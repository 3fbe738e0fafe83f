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
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

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

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

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

// Shared by the caller and the helper tasks. Every participant claims chunks
// from `next` until none is left, so the caller never waits for a task that
// has not started: it only waits for chunks already being run. Tasks that
// start late find nothing to claim and only drop their reference, which is
// why the state is reference counted rather than living on the caller's stack.
struct ParallelForState {
  int64_t n = 0;
  int64_t chunk = 0;
  int64_t num_chunks = 0;
  void (*run_range)(void* fn, int64_t begin, int64_t end) = nullptr;
  void* fn = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mutex;
  std::condition_variable all_done;
  std::exception_ptr error;

  void work() {
    for (;;) {
      int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= num_chunks) return;
      int64_t begin = c * chunk;
      int64_t end = n - begin > chunk ? begin + chunk : n;  // no overflow near INT64_MAX
      try {
        run_range(fn, begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == num_chunks) {
        std::lock_guard<std::mutex> lock(mutex);
        all_done.notify_all();
      }
    }
  }
};

struct ParallelForTask {
  std::shared_ptr<ParallelForState> state;
  static void run(void* arg) {
    std::unique_ptr<ParallelForTask> self(static_cast<ParallelForTask*>(arg));
    self->state->work();
  }
};

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
  int64_t chunk = std::max(grain, n / parts + (n % parts != 0));
  auto state = std::make_shared<detail::ParallelForState>();
  state->n = n;
  state->chunk = chunk;
  state->num_chunks = n / chunk + (n % chunk != 0);
  using Fn = std::remove_reference_t<F>;
  state->fn = const_cast<void*>(static_cast<const void*>(&fn));
  state->run_range = [](void* f, int64_t begin, int64_t end) {
    (*static_cast<Fn*>(f))(begin, end);
  };
  detail::ThreadPoolRef* pool = detail::current_thread_pool();
  int64_t helpers = std::min(threads, state->num_chunks) - 1;
  std::exception_ptr schedule_error;
  try {
    for (int64_t i = 0; i < helpers; ++i) {
      auto task = std::make_unique<detail::ParallelForTask>(detail::ParallelForTask{state});
      pool->schedule(pool->pool, &detail::ParallelForTask::run, task.get());
      task.release();  // the pool owns it now
    }
  } catch (...) {
    // Tasks already handed out may be running `fn`: finish every chunk and
    // wait for them before reporting, so nothing touches `fn` after we return.
    schedule_error = std::current_exception();
  }
  state->work();
  {
    std::unique_lock<std::mutex> lock(state->mutex);
    state->all_done.wait(lock, [&] {
      return state->done.load(std::memory_order_acquire) == state->num_chunks;
    });
  }
  if (state->error) std::rethrow_exception(state->error);
  if (schedule_error) std::rethrow_exception(schedule_error);
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
