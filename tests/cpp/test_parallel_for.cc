// xk::parallel_for on a test thread pool installed the way the generated FFI
// glue installs XLA's intra-op pool (ThreadPoolRef + ThreadPoolScope).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_util.h"
#include "xlakern/parallel.h"

namespace {

using namespace std::chrono_literals;
using xk_test::TestPoolRef;
using xk_test::TestThreadPool;
using Range = std::pair<int64_t, int64_t>;

// Records every (begin, end) fn was called with, and on which thread.
class RangeLog {
 public:
  void add(int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.emplace_back(begin, end);
    threads_.push_back(std::this_thread::get_id());
  }
  std::vector<Range> ranges() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ranges_;
  }
  std::vector<std::thread::id> threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ranges_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Range> ranges_;
  std::vector<std::thread::id> threads_;
};

// The contract: non-empty ranges, disjoint, covering [0, n) exactly once,
// each at least `grain` long except the one that ends at n.
::testing::AssertionResult IsPartition(std::vector<Range> ranges, int64_t n, int64_t grain) {
  grain = std::max<int64_t>(grain, 1);
  std::sort(ranges.begin(), ranges.end());
  int64_t expect_begin = 0;
  for (const auto& [b, e] : ranges) {
    if (b != expect_begin)
      return ::testing::AssertionFailure()
             << "range [" << b << ", " << e << ") starts at " << b << ", expected "
             << expect_begin << " (gap or overlap)";
    if (e <= b)
      return ::testing::AssertionFailure() << "empty or reversed range [" << b << ", " << e << ")";
    if (e != n && e - b < grain)
      return ::testing::AssertionFailure()
             << "range [" << b << ", " << e << ") is shorter than grain " << grain;
    expect_begin = e;
  }
  if (expect_begin != n)
    return ::testing::AssertionFailure() << "ranges end at " << expect_begin << ", not " << n;
  return ::testing::AssertionSuccess();
}

// Waits for `pred` up to `timeout`; used so that a test that would otherwise
// hang fails instead.
template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = 20000ms) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

// ---------------------------------------------------------------------------
// Without a pool: serial on the calling thread.

TEST(ParallelForSerial, NoPoolMeansOneThread) {
  ASSERT_EQ(xk::detail::current_thread_pool(), nullptr);
  EXPECT_EQ(xk::num_threads(), 1);
}

TEST(ParallelForSerial, NoPoolCallsFnOnceWithTheWholeRange) {
  for (int64_t n : {1, 2, 1000, 1 << 20}) {
    for (int64_t grain : {-5, 0, 1, 7, 1 << 30}) {
      RangeLog log;
      xk::parallel_for(n, grain, [&](int64_t b, int64_t e) { log.add(b, e); });
      ASSERT_EQ(log.ranges(), (std::vector<Range>{{0, n}})) << "n=" << n << " grain=" << grain;
      EXPECT_EQ(log.threads()[0], std::this_thread::get_id());
    }
  }
}

TEST(ParallelForSerial, EmptyOrNegativeRangeCallsNothing) {
  int calls = 0;
  for (int64_t n : {0, -1, -1000}) {
    xk::parallel_for(n, 1, [&](int64_t, int64_t) { ++calls; });
  }
  EXPECT_EQ(calls, 0);
}

TEST(ParallelForSerial, ExceptionPropagates) {
  EXPECT_THROW(xk::parallel_for(10, 1, [](int64_t, int64_t) { throw std::logic_error("serial"); }),
               std::logic_error);
}

TEST(ParallelForSerial, RangeArgumentsAreInt64) {
  xk::parallel_for(3, 1, [](auto b, auto e) {
    static_assert(std::is_same_v<decltype(b), int64_t>);
    static_assert(std::is_same_v<decltype(e), int64_t>);
  });
  TestThreadPool pool(2);
  TestPoolRef ref(&pool);
  xk::detail::ThreadPoolScope scope(ref.ref());
  xk::parallel_for(100, 1, [](auto b, auto e) {
    static_assert(std::is_same_v<decltype(b), int64_t>);
    static_assert(std::is_same_v<decltype(e), int64_t>);
  });
}

// ---------------------------------------------------------------------------
// Installing a pool.

TEST(ThreadPoolScope, InstallsAndRestoresPerThread) {
  TestThreadPool pool4(4), pool16(16);
  TestPoolRef ref4(&pool4), ref16(&pool16);
  EXPECT_EQ(xk::num_threads(), 1);
  {
    xk::detail::ThreadPoolScope outer(ref4.ref());
    EXPECT_EQ(xk::detail::current_thread_pool(), ref4.ref());
    EXPECT_EQ(xk::num_threads(), 4);
    {
      xk::detail::ThreadPoolScope inner(ref16.ref());
      EXPECT_EQ(xk::num_threads(), 16);
      {
        xk::detail::ThreadPoolScope none(nullptr);
        EXPECT_EQ(xk::num_threads(), 1);
      }
      EXPECT_EQ(xk::num_threads(), 16);
    }
    EXPECT_EQ(xk::num_threads(), 4);
    // The installed pool belongs to this thread only.
    int64_t other = -1;
    std::thread([&] { other = xk::num_threads(); }).join();
    EXPECT_EQ(other, 1);
  }
  EXPECT_EQ(xk::detail::current_thread_pool(), nullptr);
  EXPECT_EQ(xk::num_threads(), 1);
}

TEST(ThreadPoolScope, SingleThreadOrUnschedulablePoolRunsSerially) {
  TestThreadPool pool(4);
  // A pool that reports one thread (XLA's when intra-op parallelism is off).
  TestPoolRef one(&pool, /*claimed_threads=*/1);
  // A handle without a schedule function.
  xk::detail::ThreadPoolRef no_schedule;
  no_schedule.pool = &pool;
  no_schedule.num_threads = 8;
  // A handle that can schedule but cannot tell its size.
  xk::detail::ThreadPoolRef no_count = *one.ref();
  no_count.count_threads = nullptr;
  for (xk::detail::ThreadPoolRef* ref : {one.ref(), &no_schedule, &no_count}) {
    xk::detail::ThreadPoolScope scope(ref);
    EXPECT_EQ(xk::num_threads(), 1);
    RangeLog log;
    xk::parallel_for(5000, 1, [&](int64_t b, int64_t e) { log.add(b, e); });
    EXPECT_EQ(log.ranges(), (std::vector<Range>{{0, 5000}}));
  }
  EXPECT_EQ(pool.scheduled(), 0);
}

TEST(ThreadPoolScope, PoolSizeIsCountedLazilyAndOnce) {
  TestThreadPool pool(4);
  TestPoolRef ref(&pool);
  ASSERT_LT(ref.ref()->num_threads, 0) << "not counted before first use";
  xk::detail::ThreadPoolScope scope(ref.ref());
  // A kernel that never splits work never asks for the pool size.
  xk::parallel_for(0, 1, [](int64_t, int64_t) {});
  xk::parallel_for(-3, 1, [](int64_t, int64_t) {});
  EXPECT_EQ(ref.count_calls(), 0);
  // The first query counts; later ones reuse the answer.
  EXPECT_EQ(xk::num_threads(), 4);
  EXPECT_EQ(ref.count_calls(), 1);
  EXPECT_EQ(ref.ref()->num_threads, 4);
  for (int i = 0; i < 5; ++i) {
    RangeLog log;
    xk::parallel_for(10000, 10, [&](int64_t b, int64_t e) { log.add(b, e); });
    EXPECT_TRUE(IsPartition(log.ranges(), 10000, 10));
  }
  EXPECT_EQ(xk::num_threads(), 4);
  EXPECT_EQ(ref.count_calls(), 1);
}

TEST(ThreadPoolScope, PresetSizeIsUsedWithoutCounting) {
  TestThreadPool pool(4);
  TestPoolRef ref(&pool);
  ref.ref()->num_threads = 3;
  xk::detail::ThreadPoolScope scope(ref.ref());
  EXPECT_EQ(xk::num_threads(), 3);
  RangeLog log;
  xk::parallel_for(999, 1, [&](int64_t b, int64_t e) { log.add(b, e); });
  EXPECT_TRUE(IsPartition(log.ranges(), 999, 1));
  EXPECT_EQ(ref.count_calls(), 0);
}

// ---------------------------------------------------------------------------
// With a pool of 2, 4 or 16 threads.

class ParallelForPool : public ::testing::TestWithParam<int> {
 protected:
  ParallelForPool() : pool_(GetParam()), ref_(&pool_), scope_(ref_.ref()) {}
  TestThreadPool pool_;
  TestPoolRef ref_;
  xk::detail::ThreadPoolScope scope_;
};

std::string PoolName(const ::testing::TestParamInfo<int>& param_info) {
  return std::to_string(param_info.param) + "threads";
}

INSTANTIATE_TEST_SUITE_P(Threads, ParallelForPool, ::testing::Values(2, 4, 16), PoolName);

TEST_P(ParallelForPool, NumThreadsIsThePoolSize) { EXPECT_EQ(xk::num_threads(), GetParam()); }

TEST_P(ParallelForPool, RangesAreADisjointCoverRespectingGrain) {
  const int64_t ns[] = {1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 100, 127, 1000, 4097, 100003};
  const int64_t grains[] = {-3, 0, 1, 2, 3, 10, 64, 1000, 1 << 20};
  for (int64_t n : ns) {
    for (int64_t grain : grains) {
      SCOPED_TRACE("n=" + std::to_string(n) + " grain=" + std::to_string(grain));
      RangeLog log;
      xk::parallel_for(n, grain, [&](int64_t b, int64_t e) { log.add(b, e); });
      const std::vector<Range> ranges = log.ranges();
      ASSERT_TRUE(IsPartition(ranges, n, grain));
      if (n <= std::max<int64_t>(grain, 1)) {
        // Not worth splitting: one call, on the calling thread.
        ASSERT_EQ(ranges.size(), 1u);
        EXPECT_EQ(log.threads()[0], std::this_thread::get_id());
      } else {
        // Worth splitting with a pool: more than one range.
        EXPECT_GE(ranges.size(), 2u);
      }
    }
  }
  // Once parallel_for has returned, no range of it may start any more (fn
  // lives on the caller's stack): late pool tasks must find nothing to do.
  RangeLog log;
  xk::parallel_for(5000, 1, [&](int64_t b, int64_t e) { log.add(b, e); });
  const size_t count = log.count();
  pool_.drain();
  EXPECT_EQ(log.count(), count);
}

TEST_P(ParallelForPool, NothingScheduledWhenNotSplit) {
  int calls = 0;
  xk::parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
  xk::parallel_for(-7, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  xk::parallel_for(100, 100, [&](int64_t b, int64_t e) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 100);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(pool_.scheduled(), 0);
}

TEST_P(ParallelForPool, HugeRangeWithoutOverflow) {
  // Only the partition is checked; fn does no per-element work.
  const int64_t n = int64_t{1} << 40;
  for (int64_t grain : {int64_t{1}, int64_t{1} << 20, int64_t{1} << 38, n - 1}) {
    RangeLog log;
    xk::parallel_for(n, grain, [&](int64_t b, int64_t e) { log.add(b, e); });
    EXPECT_TRUE(IsPartition(log.ranges(), n, grain)) << "grain=" << grain;
    EXPECT_GE(log.count(), 2u);
  }
}

TEST_P(ParallelForPool, RangesRunOnPoolThreads) {
  // Every range run by the caller waits until some range has started on a
  // pool thread, so the pool must take part for this to finish.
  RangeLog log;
  std::atomic<bool> worker_started{false};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> timed_out{false};
  xk::parallel_for(1000, 1, [&](int64_t b, int64_t e) {
    if (std::this_thread::get_id() != caller) {
      worker_started = true;
    } else if (!timed_out && !wait_until([&] { return worker_started.load(); })) {
      timed_out = true;  // wait once only, so that a failure fails fast
    }
    log.add(b, e);
  });
  EXPECT_FALSE(timed_out) << "no range ran on a pool thread";
  EXPECT_TRUE(IsPartition(log.ranges(), 1000, 1));
  int on_pool = 0;
  for (auto id : log.threads()) on_pool += pool_.is_worker(id);
  EXPECT_GT(on_pool, 0);
  // Never more helper tasks than the pool has threads besides the caller.
  EXPECT_LE(pool_.scheduled(), GetParam() - 1);
}

class ParallelForPoolRandom : public ParallelForPool {
 protected:
  ParallelForPoolRandom() : seed_(xk_test::test_seed()), rng_(seed_) {}
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "[ seed ] rerun with XLAKERN_TEST_SEED=%llu\n",
                                   static_cast<unsigned long long>(seed_));
  }
  uint64_t seed_;
  std::mt19937_64 rng_;
};

INSTANTIATE_TEST_SUITE_P(Threads, ParallelForPoolRandom, ::testing::Values(2, 4, 16), PoolName);

float elementwise(float x, float a) { return std::sin(x) * a + x * x - 0.5f * x; }

TEST_P(ParallelForPoolRandom, ElementwiseMatchesSerial) {
  std::uniform_int_distribution<int64_t> n_dist(1, 300000);
  std::uniform_int_distribution<int64_t> grain_dist(1, 5000);
  std::normal_distribution<float> val(0.f, 3.f);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t n = n_dist(rng_);
    const int64_t grain = trial % 2 ? grain_dist(rng_) : 1;
    const float a = val(rng_);
    std::vector<float> x(n);
    for (auto& v : x) v = val(rng_);
    std::vector<float> serial(n), parallel(n, std::nanf(""));
    for (int64_t i = 0; i < n; ++i) serial[i] = elementwise(x[i], a);
    std::vector<std::atomic<int>> visits(n);
    xk::parallel_for(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        parallel[i] = elementwise(x[i], a);
        visits[i].fetch_add(1, std::memory_order_relaxed);
      }
    });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(visits[i].load(), 1) << "i=" << i << " n=" << n << " grain=" << grain;
      ASSERT_EQ(parallel[i], serial[i]) << "i=" << i << " n=" << n;
    }
  }
}

TEST_P(ParallelForPoolRandom, ReductionOfPartialSumsMatchesSerial) {
  std::uniform_int_distribution<int64_t> n_dist(1000, 1000000);
  std::uniform_int_distribution<int64_t> v_dist(-1000000, 1000000);
  const int64_t n = n_dist(rng_);
  std::vector<int64_t> x(n);
  for (auto& v : x) v = v_dist(rng_);
  int64_t serial = 0;
  for (int64_t v : x) serial += v;
  std::mutex m;
  int64_t total = 0;
  xk::parallel_for(n, 512, [&](int64_t b, int64_t e) {
    int64_t s = 0;
    for (int64_t i = b; i < e; ++i) s += x[i];
    std::lock_guard<std::mutex> lock(m);
    total += s;
  });
  EXPECT_EQ(total, serial) << "n=" << n;
}

// ---------------------------------------------------------------------------
// Exceptions.

struct KernelFailure : std::runtime_error {
  KernelFailure(const std::string& what, int64_t at) : std::runtime_error(what), index(at) {}
  int64_t index;
};

TEST_P(ParallelForPoolRandom, ExceptionInOneRangeIsRethrownOnTheCaller) {
  std::uniform_int_distribution<int64_t> n_dist(100, 20000);
  for (int trial = 0; trial < 10; ++trial) {
    const int64_t n = n_dist(rng_);
    const int64_t bad = std::uniform_int_distribution<int64_t>(0, n - 1)(rng_);
    std::atomic<int> in_flight{0};
    std::atomic<int> started{0};
    try {
      xk::parallel_for(n, 7, [&](int64_t b, int64_t e) {
        ++started;
        ++in_flight;
        struct Leave {
          std::atomic<int>& c;
          ~Leave() { --c; }
        } leave{in_flight};
        std::this_thread::sleep_for(50us);  // let ranges overlap
        if (b <= bad && bad < e) throw KernelFailure("bad element " + std::to_string(bad), bad);
      });
      ADD_FAILURE() << "no exception; n=" << n << " bad=" << bad << " seed=" << seed_;
    } catch (const KernelFailure& err) {
      // Rethrown with its type and contents, after every started range ended.
      EXPECT_EQ(err.index, bad);
      EXPECT_EQ(std::string(err.what()), "bad element " + std::to_string(bad));
      EXPECT_EQ(in_flight.load(), 0) << "a range was still running when the error arrived";
    }
    const int started_at_return = started.load();
    pool_.drain();
    EXPECT_EQ(started.load(), started_at_return) << "a range started after parallel_for returned";
  }
}

TEST_P(ParallelForPool, ExceptionThrownOnAPoolThreadReachesTheCaller) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> worker_threw{false};
  std::atomic<bool> timed_out{false};
  try {
    xk::parallel_for(1000, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != caller) {
        worker_threw = true;
        throw xk::Error("thrown on a pool thread");
      }
      // The caller keeps claiming ranges only until a pool thread has thrown.
      if (!timed_out && !wait_until([&] { return worker_threw.load(); })) timed_out = true;
    });
    ADD_FAILURE() << "no exception";
  } catch (const xk::Error& e) {
    EXPECT_STREQ(e.what(), "thrown on a pool thread");
  }
  EXPECT_FALSE(timed_out);
}

TEST_P(ParallelForPool, CheckFailureInsideRangeBecomesXkError) {
  try {
    xk::parallel_for(4096, 16, [&](int64_t b, int64_t e) {
      XK_CHECK(!(b <= 2000 && 2000 < e)) << "range [" << b << ", " << e << ") holds 2000";
    });
    ADD_FAILURE() << "no exception";
  } catch (const xk::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("check failed: !(b <= 2000 && 2000 < e)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 2000"), std::string::npos) << msg;
  }
}

TEST_P(ParallelForPool, SeveralFailingRangesRethrowOneOfThem) {
  std::set<std::string> thrown;
  std::mutex m;
  try {
    xk::parallel_for(2000, 10, [&](int64_t b, int64_t) {
      if ((b / 10) % 3 == 0) {
        const std::string what = "range at " + std::to_string(b);
        {
          std::lock_guard<std::mutex> lock(m);
          thrown.insert(what);
        }
        throw std::runtime_error(what);
      }
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    std::lock_guard<std::mutex> lock(m);
    EXPECT_EQ(thrown.count(e.what()), 1u) << e.what();
  }
  // The pool is still usable afterwards.
  RangeLog log;
  xk::parallel_for(3000, 1, [&](int64_t b, int64_t e) { log.add(b, e); });
  EXPECT_TRUE(IsPartition(log.ranges(), 3000, 1));
}

// ---------------------------------------------------------------------------
// Busy pools and concurrent callers.

// Every pool thread is blocked until the parallel_for has returned: the caller
// must run every range itself rather than wait for a helper task.
void run_with_blocked_pool(int workers, int64_t claimed_threads) {
  // Declared before the pool, so they outlive the tasks that use them.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> blocked{0};
  TestThreadPool pool(workers);
  bool is_released = false;
  auto unblock = [&] {
    if (!is_released) release.set_value();
    is_released = true;
  };
  struct Unblock {  // on every way out, before the pool joins its threads
    std::function<void()> f;
    ~Unblock() { f(); }
  } unblock_at_exit{unblock};
  for (int i = 0; i < workers; ++i) {
    pool.Schedule([&blocked, released] {
      ++blocked;
      released.wait();
    });
  }
  ASSERT_TRUE(wait_until([&] { return blocked.load() == workers; }));

  TestPoolRef ref(&pool, claimed_threads);
  RangeLog log;
  std::thread::id caller;
  auto done = std::async(std::launch::async, [&] {
    xk::detail::ThreadPoolScope scope(ref.ref());
    caller = std::this_thread::get_id();
    xk::parallel_for(100000, 100, [&](int64_t b, int64_t e) { log.add(b, e); });
  });
  const bool finished = done.wait_for(30s) == std::future_status::ready;
  unblock();  // in every case, so that a deadlocked call can still end
  done.get();
  ASSERT_TRUE(finished) << "parallel_for deadlocked on a busy pool";
  EXPECT_TRUE(IsPartition(log.ranges(), 100000, 100));
  EXPECT_GE(log.count(), 2u);
  for (auto id : log.threads()) EXPECT_EQ(id, caller);
  EXPECT_GT(pool.scheduled(), workers) << "parallel_for did hand tasks to the pool";
  // The late helper tasks run now and must find nothing left to do.
  const size_t count = log.count();
  pool.drain();
  EXPECT_EQ(log.count(), count);
  EXPECT_EQ(pool.executed(), pool.scheduled());
}

TEST(ParallelForBusyPool, OneBlockedWorkerDoesNotDeadlock) { run_with_blocked_pool(1, 4); }
TEST(ParallelForBusyPool, AllFourWorkersBlockedDoesNotDeadlock) { run_with_blocked_pool(4, 4); }
TEST(ParallelForBusyPool, SixteenClaimedThreadsTwoBlockedWorkers) { run_with_blocked_pool(2, 16); }

TEST(ParallelForConcurrent, CallersOnSeveralThreadsShareOnePool) {
  const uint64_t seed = xk_test::test_seed();
  TestThreadPool pool(4);
  constexpr int kCallers = 8;
  constexpr int kIterations = 25;
  std::atomic<int> ready{0};
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kCallers);
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      // One handle per caller over the shared pool, as every FFI call builds
      // its own FfiThreadPool around XLA's one pool.
      TestPoolRef ref(&pool);
      xk::detail::ThreadPoolScope scope(ref.ref());
      std::mt19937_64 rng(seed + t);
      ++ready;
      while (ready.load() < kCallers) std::this_thread::yield();  // start together
      for (int it = 0; it < kIterations; ++it) {
        const int64_t n = std::uniform_int_distribution<int64_t>(1, 50000)(rng);
        const int64_t grain = std::uniform_int_distribution<int64_t>(1, 300)(rng);
        std::vector<double> x(n), y(n, -1.0);
        for (auto& v : x) v = std::uniform_real_distribution<double>(-1, 1)(rng);
        const double scale = t + 1.5;
        std::vector<Range> ranges;
        std::mutex m;
        xk::parallel_for(n, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) y[i] = x[i] * scale + t;
          std::lock_guard<std::mutex> lock(m);
          ranges.emplace_back(b, e);
        });
        auto part = IsPartition(ranges, n, grain);
        if (!part) {
          errors[t] = part.message();
          ++failures;
          return;
        }
        for (int64_t i = 0; i < n; ++i) {
          if (y[i] != x[i] * scale + t) {
            errors[t] = "wrong value at " + std::to_string(i);
            ++failures;
            return;
          }
        }
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0) << "seed=" << seed;
  for (int t = 0; t < kCallers; ++t) EXPECT_EQ(errors[t], "") << "caller " << t;
}

TEST(ParallelForConcurrent, NestedParallelForCompletes) {
  TestThreadPool pool(4);
  TestPoolRef ref(&pool);
  xk::detail::ThreadPoolScope scope(ref.ref());
  constexpr int64_t kRows = 64, kCols = 333;
  std::vector<std::atomic<int>> visits(kRows * kCols);
  xk::parallel_for(kRows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // On the caller this uses the pool again; on pool threads (no pool
      // installed there) it runs serially.
      xk::parallel_for(kCols, 8, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) visits[r * kCols + c].fetch_add(1);
      });
    }
  });
  for (int64_t i = 0; i < kRows * kCols; ++i) ASSERT_EQ(visits[i].load(), 1) << i;
}

// ---------------------------------------------------------------------------
// Kinds of callables.

struct AddOne {
  std::vector<int>* out;
  void operator()(int64_t b, int64_t e) const {
    for (int64_t i = b; i < e; ++i) (*out)[i] += 1;
  }
};

TEST(ParallelForCallables, FunctorsLvaluesRvaluesAndStdFunction) {
  TestThreadPool pool(4);
  TestPoolRef ref(&pool);
  xk::detail::ThreadPoolScope scope(ref.ref());
  const int64_t n = 10007;
  std::vector<int> out(n, 0);
  const AddOne const_functor{&out};
  xk::parallel_for(n, 10, const_functor);  // const lvalue
  AddOne functor{&out};
  xk::parallel_for(n, 10, functor);  // lvalue
  xk::parallel_for(n, 10, AddOne{&out});  // rvalue
  std::function<void(int64_t, int64_t)> fn = AddOne{&out};
  xk::parallel_for(n, 10, fn);
  int64_t mutable_calls = 0;
  std::mutex m;
  // A mutable lambda (non-const call operator); it has no state of its own,
  // as the same object is called from several threads at once.
  xk::parallel_for(n, 10, [&](int64_t b, int64_t e) mutable {
    std::lock_guard<std::mutex> lock(m);
    mutable_calls += e - b;
    for (int64_t i = b; i < e; ++i) out[i] += 1;
  });
  EXPECT_EQ(mutable_calls, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 5) << i;
}

}  // namespace

// A pool whose schedule() throws on its second call, like an allocation
// failure inside XLA's pool. parallel_for must still finish every chunk
// before rethrowing, so no range can run after it has returned.
TEST(ParallelForScheduleFailure, FinishesAllChunksThenRethrows) {
  TestThreadPool workers(4);
  struct Throwing {
    TestThreadPool* pool;
    std::atomic<int> calls{0};
  } state{&workers};
  xk::detail::ThreadPoolRef ref;
  ref.pool = &state;
  ref.num_threads = 4;
  ref.schedule = [](void* p, void (*task)(void*), void* arg) {
    auto* s = static_cast<Throwing*>(p);
    if (s->calls.fetch_add(1) == 1) throw std::bad_alloc();
    s->pool->Schedule([task, arg] { task(arg); });
  };
  xk::detail::ThreadPoolScope scope(&ref);
  const int64_t n = 1 << 16;
  std::vector<std::atomic<int>> hits(n);
  std::atomic<bool> returned{false};
  std::atomic<int64_t> late{0};
  EXPECT_THROW(xk::parallel_for(n, 64, [&](int64_t b, int64_t e) {
                 if (returned.load()) late.fetch_add(1);
                 for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
               }),
               std::bad_alloc);
  returned = true;
  workers.drain();
  EXPECT_EQ(late.load(), 0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "element " << i;
}

// Sizes near INT64_MAX used to overflow the chunk arithmetic and hang.
TEST(ParallelForOverflow, RangeNearInt64MaxIsCoveredOnce) {
  TestThreadPool workers(4);
  TestPoolRef pool(&workers);
  xk::detail::ThreadPoolScope scope(pool.ref());
  const int64_t n = (int64_t{1} << 62) + (int64_t{1} << 61);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  xk::parallel_for(n, int64_t{1} << 62, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().first, 0);
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
  EXPECT_EQ(ranges.back().second, n);
}
