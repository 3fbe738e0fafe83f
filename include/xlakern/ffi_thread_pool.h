// xlakern/ffi_thread_pool.h -- an FFI call's thread pool (XLA's intra-op pool) as the handle
// xk::parallel_for runs on. Needs XLA's FFI API, so only the generated handlers and the runtime
// include it; kernels see the pool through xk::parallel_for alone.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xlakern/parallel.h"

namespace xk {
namespace detail {

class FfiThreadPool {
 public:
  explicit FfiThreadPool(::xla::ffi::ThreadPool pool) : pool_(pool) {
    ref_.pool = &pool_;
    ref_.count_threads = &FfiThreadPool::count_threads;
    ref_.schedule = &FfiThreadPool::schedule;
  }
  FfiThreadPool(const FfiThreadPool&) = delete;  // ref_ points into this object
  FfiThreadPool& operator=(const FfiThreadPool&) = delete;
  ThreadPoolRef* ref() { return &ref_; }

 private:
  static int64_t count_threads(void* pool) {
    return static_cast<::xla::ffi::ThreadPool*>(pool)->num_threads();
  }
  static void schedule(void* pool, void (*task)(void*), void* arg) {
    static_cast<::xla::ffi::ThreadPool*>(pool)->Schedule([task, arg] { task(arg); });
  }
  ::xla::ffi::ThreadPool pool_;
  ThreadPoolRef ref_;
};

}  // namespace detail
}  // namespace xk
