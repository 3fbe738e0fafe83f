// xlakern/parallel_run.h -- the pooled half of xk::parallel_for (parallel.h): the
// definition of xk::detail::parallel_run.
//
// Include it in exactly one translation unit of a library. For every C++ module, xlakern's
// loaders compile a unit that does (_codegen.POOL_UNIT, one object for all modules), and link
// it; so do the runtime extension and the C++ tests.
// Kernels never include it: they see parallel_for's declarations only, and pay neither
// for these headers nor for this code in each parallel_for body.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "xlakern/parallel.h"

namespace xk {
namespace detail {
namespace {

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

}  // namespace

void parallel_run(int64_t n, int64_t chunk, int64_t threads, void (*run_range)(void* fn, int64_t begin, int64_t end),
                  void* fn) {
  auto state = std::make_shared<ParallelForState>();
  state->n = n;
  state->chunk = chunk;
  state->num_chunks = n / chunk + (n % chunk != 0);
  state->run_range = run_range;
  state->fn = fn;
  ThreadPoolRef* pool = current_thread_pool();
  const int64_t helpers = pool && pool->schedule ? std::min(threads, state->num_chunks) - 1 : 0;
  std::exception_ptr schedule_error;
  try {
    for (int64_t i = 0; i < helpers; ++i) {
      auto task = std::make_unique<ParallelForTask>(ParallelForTask{state});
      pool->schedule(pool->pool, &ParallelForTask::run, task.get());
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
    state->all_done.wait(lock, [&] { return state->done.load(std::memory_order_acquire) == state->num_chunks; });
  }
  if (state->error) std::rethrow_exception(state->error);
  if (schedule_error) std::rethrow_exception(schedule_error);
}

}  // namespace detail
}  // namespace xk
