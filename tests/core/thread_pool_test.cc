// ThreadPool: every task runs exactly once whether the workers are polling for work (calls back
// to back) or blocked on the condition variable (calls after a pause longer than the poll), and
// a worker takes tasks while the caller runs one.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace dsinfer {
namespace {

TEST(ThreadPool, EveryTaskRunsOnceWhetherWorkersPollOrBlock) {
  for (int threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    for (int call = 0; call < 120; ++call) {
      const int64_t n = call % 37;  // 0 and 1 run on the caller alone
      std::vector<std::atomic<int>> runs(n);
      pool.ParallelFor(n, [&](int64_t i) { runs[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(runs[i].load(), 1) << threads << " threads, call " << call << ", task " << i;
      // Every tenth call waits past the workers' poll (200 us), so they block before the next.
      if (call % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    int64_t ranges = 0;
    std::vector<std::atomic<int>> covered(1000);
    pool.ParallelForRange(1000, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) covered[i].fetch_add(1);
      std::atomic_ref<int64_t>(ranges).fetch_add(1);
    });
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(covered[i].load(), 1) << i;
    EXPECT_EQ(ranges, std::min<int64_t>(1000, 4 * threads));
  }
}

// Task 0 waits for task 1 to start, which only another thread can do while the caller is inside
// task 0. Both freshly polling workers and blocked ones must pick it up.
TEST(ThreadPool, AWorkerTakesTasksWhileTheCallerRunsOne) {
  ThreadPool pool(2);
  for (int pause_ms : {0, 5}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    std::atomic<bool> second_started = false, saw_second = false;
    pool.ParallelFor(2, [&](int64_t i) {
      if (i == 1) {
        second_started = true;
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!second_started && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      saw_second = second_started.load();
    });
    EXPECT_TRUE(saw_second) << "after a pause of " << pause_ms << " ms";
  }
}

}  // namespace
}  // namespace dsinfer
