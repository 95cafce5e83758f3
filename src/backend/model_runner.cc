#include "backend/model_runner.h"

#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "core/system_memory.h"
#include "core/thread_pool.h"

namespace dsinfer::backend {

namespace {

const cpu::SequenceState& Cpu(const RunnerState& s) {
  return static_cast<const cpu::SequenceState&>(s);
}
cpu::SequenceState& Cpu(RunnerState& s) { return static_cast<cpu::SequenceState&>(s); }

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(const model::ModelWeights& weights, Numerics numerics, CpuRunnerOptions options)
      : weights_(weights),
        numerics_(numerics),
        options_(options),
        pool_(options.n_threads, options.cpus) {}
  Status Init(std::shared_ptr<PageAllocator> pages) {
    cpu::CpuModel::Options o;
    o.layout = options_.layout;
    o.pages = std::move(pages);
    DSINFER_ASSIGN_OR_RETURN(model_, cpu::CpuModel::Create(weights_, numerics_, pool_, o));
    return Status::Ok();
  }

  // Whether the pool's workers got the CPUs options.cpus asked for.
  Status PlacementStatus() const { return pool_.placement_status(); }

  std::string device() const override { return "cpu"; }
  Result<std::unique_ptr<RunnerState>> NewState() override {
    made_state_ = true;
    return std::unique_ptr<RunnerState>(model_->NewSequence());
  }
  Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) override {
    return std::unique_ptr<RunnerState>(Cpu(from).Copy());
  }
  Result<std::unique_ptr<RunnerState>> Snapshot(const RunnerState& from) override {
    return std::unique_ptr<RunnerState>(Cpu(from).Snapshot());
  }
  int64_t StateBytes(const RunnerState& state) const override {
    return Cpu(state).BoundaryBytes();
  }
  int64_t StateBytesAt(int64_t n_tokens) const override { return model_->StateBytesAt(n_tokens); }
  int64_t PageBytesInUse() const override { return model_->pages().bytes_in_use(); }
  Status UsePageAllocator(std::shared_ptr<PageAllocator> pages) override {
    if (made_state_)
      return FailedPrecondition("UsePageAllocator: states already exist on this runner");
    model_->UsePages(std::move(pages));
    return Status::Ok();
  }
  const model::StateLayout* layout() const override { return &model_->layout(); }
  int64_t DefaultStateBudget() const override { return DefaultCpuStateBudget(); }
  Status ForwardBatch(std::span<RunnerChunk> chunks) override {
    std::vector<cpu::SequenceChunk> cpu_chunks(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].state == nullptr) return InvalidArgument("ForwardBatch: a chunk has no state");
      cpu_chunks[i] = {&Cpu(*chunks[i].state), chunks[i].tokens, chunks[i].options, chunks[i].out};
    }
    return model_->ForwardBatch(cpu_chunks);
  }
  Status Truncate(RunnerState& state, int64_t n_tokens) override {
    return model_->Truncate(Cpu(state), n_tokens);
  }
  Status CheckSpeculation(int n_draft) const override {
    if (model_->CheckDspark().ok()) {
      // dSpark drafts one block of block_size rows: at most that many drafts per step.
      const int block = model_->config().dspark.block_size;
      if (n_draft > block)
        return InvalidArgument("speculative decoding: " + std::to_string(n_draft) +
                               " draft tokens, more than the dSpark block proposes (" +
                               std::to_string(block) + ")");
    } else {
      DSINFER_RETURN_IF_ERROR(model_->CheckMtpBlock().WithContext("speculative decoding"));
    }
    // A verify step writes n_draft + 1 positions, of which up to n_draft are rolled back; the
    // MTP stream chains n_draft - 1 positions past the backbone.
    if (n_draft < 0 || n_draft > model_->layout().rollback_tokens)
      return InvalidArgument("speculative decoding: " + std::to_string(n_draft) +
                             " draft tokens, more than the state can roll back (" +
                             std::to_string(model_->layout().rollback_tokens) + ")");
    return Status::Ok();
  }
  int64_t MtpTokens(const RunnerState& state) const override { return Cpu(state).mtp_n_tokens(); }
  Status ForwardMtp(RunnerState& state, std::span<const float> hidden,
                    std::span<const int32_t> next, std::vector<float>* logits,
                    std::vector<float>* last_hidden) override {
    return model_->ForwardMtpLast(Cpu(state), hidden, next, logits, last_hidden);
  }
  Status ForwardMtpBatch(std::span<const MtpRun> runs) override {
    std::vector<cpu::MtpChunk> chunks(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].state == nullptr) return InvalidArgument("ForwardMtpBatch: a run has no state");
      chunks[i] = {&Cpu(*runs[i].state), runs[i].hidden, runs[i].next, runs[i].logits,
                   runs[i].last_hidden};
    }
    return model_->ForwardMtpBatch(chunks);
  }
  Status CheckDspark() const override { return model_->CheckDspark(); }
  int64_t HiddenWidth() const override { return model_->HiddenWidth(); }
  Status DsparkSeed(std::span<const DsparkSeedRun> runs) override {
    std::vector<cpu::SequenceState*> states(runs.size());
    std::vector<std::span<const float>> hidden(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].state == nullptr) return InvalidArgument("DsparkSeed: a run has no state");
      states[i] = &Cpu(*runs[i].state);
      hidden[i] = runs[i].hidden;
    }
    return model_->DsparkSeedBatch(states, hidden);
  }
  Status DsparkDraft(std::span<const DsparkDraftRun> runs) override {
    std::vector<cpu::SequenceState*> states(runs.size());
    std::vector<int32_t> tokens(runs.size());
    std::vector<std::vector<float>*> logits(runs.size()), x(runs.size());
    std::vector<int> n_logits(runs.size());
    const int block = model_->config().dspark.block_size;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].state == nullptr) return InvalidArgument("DsparkDraft: a run has no state");
      states[i] = &Cpu(*runs[i].state);
      tokens[i] = runs[i].token;
      logits[i] = runs[i].logits;
      x[i] = runs[i].x;
      n_logits[i] = runs[i].n_logits < 0 ? block : runs[i].n_logits;
    }
    return model_->DsparkDraftBatch(states, tokens, logits, x, n_logits);
  }
  Status DsparkMarkov(std::span<const int32_t> prev, std::span<const float> x,
                      std::vector<float>* bias, std::vector<float>* confidence) override {
    return model_->DsparkMarkov(prev, x, bias, confidence);
  }
  Status TruncateMtp(RunnerState& state, int64_t n) override {
    return model_->TruncateMtp(Cpu(state), n);
  }
  Status UseDraftVocabulary(std::vector<int32_t> ids) override {
    return model_->UseDraftVocabulary(std::move(ids));
  }
  Result<std::vector<uint8_t>> Export(const RunnerState& state, std::span<const int32_t> tokens,
                                      int64_t first_page) override {
    return model_->Export(Cpu(state), tokens, first_page);
  }
  Result<std::unique_ptr<RunnerState>> Import(std::span<const uint8_t> blob,
                                              std::span<const int32_t> tokens,
                                              const RunnerState* base) override {
    made_state_ = true;
    DSINFER_ASSIGN_OR_RETURN(auto s,
                             model_->Import(blob, tokens, base ? &Cpu(*base) : nullptr));
    return std::unique_ptr<RunnerState>(std::move(s));
  }
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) override {
    pool_.ParallelFor(n, fn);
  }

 private:
  const model::ModelWeights& weights_;
  Numerics numerics_;
  CpuRunnerOptions options_;
  ThreadPool pool_;  // outlives model_ (declared first)
  std::unique_ptr<cpu::CpuModel> model_;
  bool made_state_ = false;
};

}  // namespace

int64_t DefaultCpuStateBudget() {
  const std::optional<int64_t> total = TotalMemoryBytes();
  return total ? *total / 4 : int64_t{4} << 30;
}

Result<std::unique_ptr<ModelRunner>> MakeCpuRunner(const model::ModelWeights& weights,
                                                   Numerics numerics,
                                                   const CpuRunnerOptions& options) {
  auto runner = std::make_unique<CpuRunner>(weights, numerics, options);
  DSINFER_RETURN_IF_ERROR(runner->PlacementStatus());
  DSINFER_RETURN_IF_ERROR(runner->Init(nullptr));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace dsinfer::backend
