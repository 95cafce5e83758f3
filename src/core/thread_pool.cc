#include "core/thread_pool.h"

#include <algorithm>

namespace dsinfer {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  // Called with mu_ unlocked. Claims tasks one by one under the lock; tasks are coarse.
  while (true) {
    int64_t task;
    const std::function<void(int64_t)>* job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (job_ == nullptr || next_task_ >= n_tasks_) return;
      task = next_task_++;
      job = job_;
    }
    (*job)(task);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++n_done_ == n_tasks_) done_cv_.notify_all();
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
  }
}

void ThreadPool::ParallelFor(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_tasks_ = n_tasks;
    next_task_ = 0;
    n_done_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  RunTasks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return n_done_ == n_tasks_; });
  job_ = nullptr;
}

void ThreadPool::ParallelForRange(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                                  int64_t min_chunk) {
  if (n <= 0) return;
  int64_t n_chunks =
      std::max<int64_t>(1, std::min<int64_t>(size() * 4, n / std::max<int64_t>(1, min_chunk)));
  int64_t chunk = (n + n_chunks - 1) / n_chunks;
  n_chunks = (n + chunk - 1) / chunk;
  ParallelFor(n_chunks, [&](int64_t c) { fn(c * chunk, std::min(n, (c + 1) * chunk)); });
}

}  // namespace dsinfer
