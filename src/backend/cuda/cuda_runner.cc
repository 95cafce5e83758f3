#include "backend/cuda/cuda_runner.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace dsinfer::backend::cuda {

namespace {

const CudaSequence& Seq(const RunnerState& s) { return static_cast<const CudaSequence&>(s); }

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(std::unique_ptr<CudaDevice> dev, std::unique_ptr<CudaModel> model, int64_t budget)
      : dev_(std::move(dev)),
        model_(std::move(model)),
        budget_(budget),
        host_(static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())))) {
    device_ = "cuda:" + std::to_string(dev_->info().ordinal) + " (" + dev_->info().name + ")";
  }
  ~CudaRunner() override { model_.reset(); }  // the model's buffers before the device

  std::string device() const override { return device_; }
  Result<std::unique_ptr<RunnerState>> NewState() override {
    DSINFER_ASSIGN_OR_RETURN(auto seq, model_->NewSequence());
    return std::unique_ptr<RunnerState>(std::move(seq));
  }
  Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) override {
    DSINFER_ASSIGN_OR_RETURN(auto seq, model_->CopySequence(Seq(from)));
    return std::unique_ptr<RunnerState>(std::move(seq));
  }
  int64_t StateBytes(const RunnerState& state) const override {
    return CudaModel::SequenceBytes(Seq(state));
  }
  int64_t StateBytesAt(int64_t n_tokens) const override {
    return model_->SequenceBytesAt(n_tokens);
  }
  int64_t DefaultStateBudget() const override { return budget_; }
  Status ForwardBatch(std::span<RunnerChunk> chunks) override {
    std::vector<CudaChunk> gpu(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].state == nullptr) return InvalidArgument("ForwardBatch: a chunk has no state");
      gpu[i].seq = static_cast<CudaSequence*>(chunks[i].state);
      gpu[i].tokens = chunks[i].tokens;
      gpu[i].options = chunks[i].options;
      gpu[i].out = chunks[i].out;
    }
    return model_->ForwardBatch(gpu);
  }
  // The engine's token draws between steps, on host threads of the runner's own: at batch 64 a
  // draw each (~0.6 ms over the V4 vocabulary, runtime/sampler.cc) on the engine thread alone
  // would be ~40 ms per step, of the order of the GPU step itself. Not yet measured on a GPU.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) override {
    host_.ParallelFor(n, fn);
  }

 private:
  std::unique_ptr<CudaDevice> dev_;
  std::unique_ptr<CudaModel> model_;
  int64_t budget_ = 0;
  std::string device_;
  ThreadPool host_;  // at most 8 threads: draws only
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> MakeCudaRunner(int ordinal, const model::ModelWeights& weights,
                                                    Numerics numerics) {
  DSINFER_RETURN_IF_ERROR(CudaModel::Supports(weights.config()));
  DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> dev, CudaDevice::Open(ordinal));
  DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model,
                           CudaModel::Create(*dev, weights, numerics));
  // The KV budget: 80 % of what the weights left free, less 1 GiB for the step's workspace
  // (activations of up to kMaxStepTokens tokens per round) and the staging of index lists.
  size_t free_bytes = 0, total_bytes = 0;
  DSINFER_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const int64_t headroom = int64_t{1} << 30;
  const int64_t budget =
      std::max<int64_t>(0, static_cast<int64_t>(0.8 * static_cast<double>(free_bytes)) - headroom);
  return std::unique_ptr<ModelRunner>(
      std::make_unique<CudaRunner>(std::move(dev), std::move(model), budget));
}

}  // namespace dsinfer::backend::cuda
