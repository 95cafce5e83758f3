// What the engine steps: a model whose per-sequence decode state lives on one device — the CPU
// backend (MakeCpuRunner) or a GPU (backend/cuda/cuda_runner.h). The engine (runtime/engine.h)
// schedules, budgets and caches states through this interface only, so continuous batching,
// preemption, the prefix cache and n > 1 forks work the same on every device.
// Thread-compatible: one owner thread (the engine's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/cpu/cpu_model.h"
#include "backend/numerics.h"
#include "core/status.h"
#include "model/weights.h"

namespace dsinfer::backend {

// One sequence's complete decode state on the runner's device (window ring, compressed rows,
// indexer keys, compressor partial groups). Created, copied and stepped by its runner only.
class RunnerState {
 public:
  virtual ~RunnerState() = default;
  virtual int64_t n_tokens() const = 0;
};

// One sequence's slice of a batched step (cpu::SequenceChunk with a runner state).
struct RunnerChunk {
  RunnerState* state = nullptr;
  std::span<const int32_t> tokens;
  cpu::ForwardOptions options;
  cpu::ForwardOutput* out = nullptr;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // "cpu", "cuda:0 (NVIDIA H200)", ...: for logs and /metrics.
  virtual std::string device() const = 0;
  virtual Result<std::unique_ptr<RunnerState>> NewState() = 0;
  // An exact copy (prefix-cache snapshots and restores, n > 1 forks): stepping the copy gives
  // bit-identical results to stepping the original.
  virtual Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) = 0;
  // Bytes a state holds now, and an upper bound of what one holds after n_tokens tokens
  // (non-decreasing in n_tokens): the engine's KV budget accounting.
  virtual int64_t StateBytes(const RunnerState& state) const = 0;
  virtual int64_t StateBytesAt(int64_t n_tokens) const = 0;
  // The KV budget when the user sets none: 25 % of RAM on the CPU, most of the free device
  // memory on a GPU.
  virtual int64_t DefaultStateBudget() const = 0;
  // Runs every chunk in one batched step (cpu::CpuModel::ForwardBatch's contract); a bad
  // argument fails before any state changes.
  virtual Status ForwardBatch(std::span<RunnerChunk> chunks) = 0;
  // fn(0) .. fn(n - 1), on the runner's host threads where it has them, idle between steps (the
  // engine's per-sequence sampling); fn must be safe to run concurrently for different indices.
  // Without host threads of its own, one after another on the caller's.
  virtual void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
};

// The CPU backend: a CpuModel over its own thread pool of n_threads (0: every core).
Result<std::unique_ptr<ModelRunner>> MakeCpuRunner(const model::ModelWeights& weights,
                                                   Numerics numerics, int n_threads);

// 25 % of physical RAM (4 GiB when the system does not say): the CPU's default KV budget.
int64_t DefaultCpuStateBudget();

}  // namespace dsinfer::backend
