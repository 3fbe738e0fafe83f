// Shared helpers of the xlakern C++ tests: a seeded RNG, the list of the 15
// element types, and a small thread pool installed for xk::parallel_for the
// way the generated FFI glue installs XLA's intra-op pool.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "xlakern/xlakern.h"

namespace xk_test {

// A fresh seed per test, printed so that a failure can be reproduced with
// XLAKERN_TEST_SEED=<seed>.
inline uint64_t test_seed() {
  if (const char* env = std::getenv("XLAKERN_TEST_SEED")) return std::stoull(env);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

class SeededTest : public ::testing::Test {
 protected:
  SeededTest() : seed_(test_seed()), rng_(seed_) {
    ::testing::Test::RecordProperty("seed", std::to_string(seed_));
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "[ seed ] rerun with %s\n", seed_msg().c_str());
  }
  std::string seed_msg() const { return "XLAKERN_TEST_SEED=" + std::to_string(seed_); }

  uint64_t seed_;
  std::mt19937_64 rng_;
};

// The 15 element types, in DType order, paired with their C++ types.
template <typename T, xk::DType D, const char* Name>
struct TypeCase {
  using type = T;
  static constexpr xk::DType dtype = D;
  static constexpr const char* name = Name;
};

inline constexpr char kBool[] = "bool";
inline constexpr char kInt8[] = "int8";
inline constexpr char kInt16[] = "int16";
inline constexpr char kInt32[] = "int32";
inline constexpr char kInt64[] = "int64";
inline constexpr char kUInt8[] = "uint8";
inline constexpr char kUInt16[] = "uint16";
inline constexpr char kUInt32[] = "uint32";
inline constexpr char kUInt64[] = "uint64";
inline constexpr char kFloat16[] = "float16";
inline constexpr char kBFloat16[] = "bfloat16";
inline constexpr char kFloat32[] = "float32";
inline constexpr char kFloat64[] = "float64";
inline constexpr char kComplex64[] = "complex64";
inline constexpr char kComplex128[] = "complex128";

using AllTypeCases = std::tuple<
    TypeCase<bool, xk::DType::Bool, kBool>,
    TypeCase<int8_t, xk::DType::Int8, kInt8>,
    TypeCase<int16_t, xk::DType::Int16, kInt16>,
    TypeCase<int32_t, xk::DType::Int32, kInt32>,
    TypeCase<int64_t, xk::DType::Int64, kInt64>,
    TypeCase<uint8_t, xk::DType::UInt8, kUInt8>,
    TypeCase<uint16_t, xk::DType::UInt16, kUInt16>,
    TypeCase<uint32_t, xk::DType::UInt32, kUInt32>,
    TypeCase<uint64_t, xk::DType::UInt64, kUInt64>,
    TypeCase<xk::float16_t, xk::DType::Float16, kFloat16>,
    TypeCase<xk::bfloat16_t, xk::DType::BFloat16, kBFloat16>,
    TypeCase<float, xk::DType::Float32, kFloat32>,
    TypeCase<double, xk::DType::Float64, kFloat64>,
    TypeCase<xk::complex64_t, xk::DType::Complex64, kComplex64>,
    TypeCase<xk::complex128_t, xk::DType::Complex128, kComplex128>>;

// Calls f(TypeCase{}) for each of the 15 cases.
template <typename F>
void for_each_type_case(F&& f) {
  std::apply([&](auto... cases) { (f(cases), ...); }, AllTypeCases{});
}

inline std::vector<xk::DType> all_dtypes() {
  std::vector<xk::DType> out;
  for_each_type_case([&](auto c) { out.push_back(decltype(c)::dtype); });
  return out;
}

// A plain thread pool: N std::thread workers and one FIFO queue. On
// destruction it runs every task still queued before joining, so tasks that
// xk::parallel_for scheduled but that started late still release their state.
class TestThreadPool {
 public:
  explicit TestThreadPool(int num_workers) {
    for (int i = 0; i < num_workers; ++i) {
      workers_.emplace_back([this] { worker_loop(); });
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& t : workers_) worker_ids_.insert(t.get_id());
  }
  ~TestThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  TestThreadPool(const TestThreadPool&) = delete;
  TestThreadPool& operator=(const TestThreadPool&) = delete;

  void Schedule(std::function<void()> task) {
    scheduled_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  int num_workers() const { return static_cast<int>(workers_.size()); }
  int64_t scheduled() const { return scheduled_.load(); }
  int64_t executed() const { return executed_.load(); }
  bool is_worker(std::thread::id id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return worker_ids_.count(id) != 0;
  }

  // Blocks until every task scheduled so far has finished.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
  }

 private:
  void worker_loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and nothing left to run
        task = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
      }
      task();
      executed_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --running_;
        if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
      }
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  std::set<std::thread::id> worker_ids_;
  std::vector<std::thread> workers_;
  int running_ = 0;
  bool stopping_ = false;
  std::atomic<int64_t> scheduled_{0};
  std::atomic<int64_t> executed_{0};
};

// The type-erased handle, built the way xk::detail::FfiThreadPool in
// ffi_thread_pool.h builds it from XLA's ffi::ThreadPool: a pool pointer plus
// count_threads and schedule callbacks, num_threads left to be counted on
// first use. Like FfiThreadPool (one per FFI call), one TestPoolRef belongs to
// one calling thread; several may wrap the same TestThreadPool.
// `claimed_threads` is what count_threads reports (XLA reports its pool size
// whether or not those threads are free); it defaults to the worker count.
class TestPoolRef {
 public:
  explicit TestPoolRef(TestThreadPool* pool, int64_t claimed_threads = -1)
      : pool_(pool), claimed_(claimed_threads >= 0 ? claimed_threads : pool->num_workers()) {
    ref_.pool = this;
    ref_.count_threads = &TestPoolRef::count_threads;
    ref_.schedule = &TestPoolRef::schedule;
  }
  TestPoolRef(const TestPoolRef&) = delete;
  TestPoolRef& operator=(const TestPoolRef&) = delete;

  xk::detail::ThreadPoolRef* ref() { return &ref_; }
  // How often parallel_for asked for the pool size.
  int count_calls() const { return count_calls_.load(); }

 private:
  static int64_t count_threads(void* self) {
    auto* r = static_cast<TestPoolRef*>(self);
    r->count_calls_.fetch_add(1);
    return r->claimed_;
  }
  static void schedule(void* self, void (*task)(void*), void* arg) {
    static_cast<TestPoolRef*>(self)->pool_->Schedule([task, arg] { task(arg); });
  }
  TestThreadPool* pool_;
  int64_t claimed_;
  std::atomic<int> count_calls_{0};
  xk::detail::ThreadPoolRef ref_;
};

}  // namespace xk_test
