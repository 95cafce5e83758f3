// A fixed pool of worker threads for data-parallel loops (no OpenMP). ParallelFor blocks until
// every task ran; the calling thread takes part. Not reentrant: do not call ParallelFor from
// inside a task. Thread-compatible: one owner thread submits work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace dsinfer {

class ThreadPool {
 public:
  // n_threads <= 0: one per CPU this process may run on (AllowedCpus: taskset, numactl and a
  // container's cpuset count, not every CPU of the machine).
  explicit ThreadPool(int n_threads = 0);
  // n_threads = cpus.size() threads, thread i pinned to CPU cpus[i] (CpuPlacement::cpus). Thread
  // 0 is whichever thread calls ParallelFor: it pins itself on its first call (the pool's owner
  // thread is often started after the pool). Empty cpus: as above, not pinned. A worker that
  // cannot be pinned runs unpinned; placement_status() says so.
  ThreadPool(int n_threads, std::vector<int> cpus);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // The CPUs the threads are pinned to (empty: none), and whether every pin so far took effect
  // (the workers' from construction on, the caller's from its first ParallelFor).
  const std::vector<int>& cpus() const { return cpus_; }
  Status placement_status() const;

  // Runs fn(task) for task in [0, n_tasks), distributing tasks dynamically.
  void ParallelFor(int64_t n_tasks, const std::function<void(int64_t)>& fn);

  // Splits [0, n) into about size()*4 contiguous ranges: fn(begin, end).
  void ParallelForRange(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                        int64_t min_chunk = 1);

 private:
  void WorkerLoop();
  void RunTasks();

  void PinCaller();

  std::vector<std::thread> workers_;
  std::vector<int> cpus_;
  // The thread last pinned to cpus_[0] (ParallelFor's caller). Owner-thread state, like the
  // pool's submissions.
  std::thread::id pinned_caller_;
  std::string caller_pin_error_;
  // Written by the workers as they start (guarded by mu_); the constructor waits for all.
  std::string worker_pin_error_;
  int workers_started_ = 0;
  mutable std::mutex mu_;
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
