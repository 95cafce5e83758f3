// A fixed pool of worker threads for data-parallel loops (no OpenMP). ParallelFor blocks until
// every task ran; the calling thread takes part. Not reentrant: do not call ParallelFor from
// inside a task. Thread-compatible: one owner thread submits work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsinfer {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) for task in [0, n_tasks), distributing tasks dynamically.
  void ParallelFor(int64_t n_tasks, const std::function<void(int64_t)>& fn);

  // Splits [0, n) into about size()*4 contiguous ranges: fn(begin, end).
  void ParallelForRange(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                        int64_t min_chunk = 1);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Guarded by mu_. The atomics are written under mu_ too; they are atomic so that waiting
  // threads can poll them without the lock before blocking (see kPollFor in thread_pool.cc).
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_tasks_ = 0;
  int64_t next_task_ = 0;
  std::atomic<int64_t> n_done_ = 0;
  std::atomic<uint64_t> generation_ = 0;
  std::atomic<bool> stop_ = false;
  int blocked_workers_ = 0;      // workers waiting on work_cv_
  bool caller_blocked_ = false;  // the ParallelFor caller waiting on done_cv_
};

}  // namespace dsinfer
