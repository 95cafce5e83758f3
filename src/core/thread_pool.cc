#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/cpu_topology.h"

namespace dsinfer {

namespace {

// How long a thread waiting for work (a worker) or for the last task (the caller) polls before
// it blocks on the condition variable. A blocked thread takes ~50 us to wake on the 2-core VM
// this was measured on (two 50 us tasks took 100 us: the worker never got one), and an engine
// step issues hundreds of ParallelFor calls with short serial gaps between them; polling bridges
// those gaps. Bounded so that an idle pool stops using its cores within a fraction of a
// millisecond.
constexpr auto kPollFor = std::chrono::microseconds(200);

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `ready` until it holds or kPollFor passes; true if it held.
template <typename Ready>
bool PollFor(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kPollFor;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : ThreadPool(n_threads, {}) {}

ThreadPool::ThreadPool(int n_threads, std::vector<int> cpus) : cpus_(std::move(cpus)) {
  if (cpus_.empty()) {
    if (n_threads <= 0) n_threads = static_cast<int>(AllowedCpus().size());
  } else {
    n_threads = static_cast<int>(cpus_.size());
  }
  for (int i = 1; i < n_threads; ++i)
    workers_.emplace_back([this, i] {
      // Pinned by the worker itself before it takes any task, so its stack and its first
      // touches of scratch memory land on its own node.
      const Status pinned = cpus_.empty() ? Status::Ok() : PinCurrentThread(cpus_[i]);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!pinned.ok() && worker_pin_error_.empty()) worker_pin_error_ = pinned.message();
        ++workers_started_;
      }
      done_cv_.notify_all();
      WorkerLoop();
    });
  // Every worker has tried its pin before the pool is used, so placement_status() is final.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return workers_started_ == static_cast<int>(workers_.size()); });
}

Status ThreadPool::placement_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!worker_pin_error_.empty()) return FailedPrecondition(worker_pin_error_);
  if (!caller_pin_error_.empty()) return FailedPrecondition(caller_pin_error_);
  return Status::Ok();
}

void ThreadPool::PinCaller() {
  if (cpus_.empty() || std::this_thread::get_id() == pinned_caller_) return;
  pinned_caller_ = std::this_thread::get_id();
  const Status pinned = PinCurrentThread(cpus_[0]);
  if (!pinned.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    caller_pin_error_ = pinned.message();
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
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
      const int64_t done = n_done_.load(std::memory_order_relaxed) + 1;
      n_done_.store(done, std::memory_order_release);
      if (done == n_tasks_ && caller_blocked_) done_cv_.notify_all();
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    const bool woke = PollFor([&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    });
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!woke) {
        // ParallelFor reads blocked_workers_ under mu_ after publishing a generation, so a
        // worker that checks the predicate here and then waits cannot miss the notification.
        ++blocked_workers_;
        work_cv_.wait(lock, [&] {
          return stop_.load(std::memory_order_relaxed) ||
                 generation_.load(std::memory_order_relaxed) != seen;
        });
        --blocked_workers_;
      }
      if (stop_.load(std::memory_order_relaxed)) return;
      seen = generation_.load(std::memory_order_relaxed);
    }
    RunTasks();
  }
}

void ThreadPool::ParallelFor(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  PinCaller();
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_tasks_ = n_tasks;
    next_task_ = 0;
    n_done_.store(0, std::memory_order_relaxed);
    generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    wake = blocked_workers_ > 0;
  }
  if (wake) work_cv_.notify_all();
  RunTasks();
  PollFor([&] { return n_done_.load(std::memory_order_acquire) == n_tasks; });
  std::unique_lock<std::mutex> lock(mu_);
  caller_blocked_ = true;
  done_cv_.wait(lock, [&] { return n_done_.load(std::memory_order_relaxed) == n_tasks_; });
  caller_blocked_ = false;
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
