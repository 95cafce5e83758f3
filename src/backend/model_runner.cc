#include "backend/model_runner.h"

#include <optional>
#include <vector>

#include "core/system_memory.h"
#include "core/thread_pool.h"

namespace dsinfer::backend {

namespace {

struct CpuState final : RunnerState {
  explicit CpuState(std::unique_ptr<cpu::SequenceState> s) : state(std::move(s)) {}
  int64_t n_tokens() const override { return state->n_tokens; }
  std::unique_ptr<cpu::SequenceState> state;
};

const cpu::SequenceState& Cpu(const RunnerState& s) {
  return *static_cast<const CpuState&>(s).state;
}

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(int n_threads) : pool_(n_threads) {}
  Status Init(const model::ModelWeights& weights, Numerics numerics) {
    DSINFER_ASSIGN_OR_RETURN(model_, cpu::CpuModel::Create(weights, numerics, pool_));
    return Status::Ok();
  }

  std::string device() const override { return "cpu"; }
  Result<std::unique_ptr<RunnerState>> NewState() override {
    return std::unique_ptr<RunnerState>(std::make_unique<CpuState>(model_->NewSequence()));
  }
  Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) override {
    return std::unique_ptr<RunnerState>(
        std::make_unique<CpuState>(std::make_unique<cpu::SequenceState>(Cpu(from))));
  }
  int64_t StateBytes(const RunnerState& state) const override {
    return model_->StateBytes(Cpu(state));
  }
  int64_t StateBytesAt(int64_t n_tokens) const override { return model_->StateBytesAt(n_tokens); }
  int64_t DefaultStateBudget() const override { return DefaultCpuStateBudget(); }
  Status ForwardBatch(std::span<RunnerChunk> chunks) override {
    std::vector<cpu::SequenceChunk> cpu_chunks(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].state == nullptr) return InvalidArgument("ForwardBatch: a chunk has no state");
      cpu_chunks[i].state = static_cast<CpuState*>(chunks[i].state)->state.get();
      cpu_chunks[i].tokens = chunks[i].tokens;
      cpu_chunks[i].options = chunks[i].options;
      cpu_chunks[i].out = chunks[i].out;
    }
    return model_->ForwardBatch(cpu_chunks);
  }
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) override {
    pool_.ParallelFor(n, fn);
  }

 private:
  ThreadPool pool_;  // outlives model_ (declared first)
  std::unique_ptr<cpu::CpuModel> model_;
};

}  // namespace

int64_t DefaultCpuStateBudget() {
  const std::optional<int64_t> total = TotalMemoryBytes();
  return total ? *total / 4 : int64_t{4} << 30;
}

Result<std::unique_ptr<ModelRunner>> MakeCpuRunner(const model::ModelWeights& weights,
                                                   Numerics numerics, int n_threads) {
  auto runner = std::make_unique<CpuRunner>(n_threads);
  DSINFER_RETURN_IF_ERROR(runner->Init(weights, numerics));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace dsinfer::backend
