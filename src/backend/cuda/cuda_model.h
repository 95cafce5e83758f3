// The DeepSeek-V4 forward pass on one GPU: the shared layer program (backend/v4_forward.h) over
// this backend's ops (the V4Ops implementation below: argument-checked kernels of ops.h and
// model_kernels.h). Weights are uploaded once from the mapped checkpoint in their stored formats
// (FP8 / FP4 / bf16, decoded in the kernels); every sequence's decode state (window ring,
// compressed rows, indexer keys, compressor partial groups) lives in device memory owned by a
// CudaSequence. Both numerics modes run: fp32-reference (transformers' fp32 forward) and
// official (bf16 rounding points, FP8 activation and KV round trips, Hadamard + FP4 indexer).
//
// What the host still does per layer and step (correctness first; docs/SUPPORT.md): the
// routed-token grouping, the sparse-attention row lists and the indexer's top-k selection are
// rebuilt on the host (the router's choices and, past the top-k size, the indexer's selection
// come back once per layer); the index lists go up through pinned staging without draining the
// stream (CudaDevice::UploadStaged).
//
// The GPU state is not paged yet: it cannot Truncate, Export or Import (model_runner.h says so
// with Unimplemented) until a GPU session builds and measures that.
//
// Thread-compatible: one owner thread (the engine's). The engine steps it through
// backend/cuda/cuda_runner.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "backend/forward_types.h"
#include "backend/numerics.h"
#include "backend/v4_forward.h"
#include "backend/v4_ops.h"
#include "core/status.h"
#include "model/weights.h"

namespace dsinfer::backend::cuda {

// Partial groups of one compressor, on the device, split so the pooling kernel reads them in
// place. pending_*: the raw projections a and gate logits g of the current incomplete group
// (n_tokens % ratio rows); prev_*: the last complete group's a and g + ape (overlap compressors
// only; valid once n_tokens >= ratio).
struct CudaCompressorState {
  int ratio = 0;
  int width = 0;  // projection width (coff * d)
  bool overlap = false;
  DeviceBuffer pending_a, pending_g;  // [ratio, width] f32
  DeviceBuffer prev_a, prev_score;    // [ratio, width] f32 (overlap)
};

struct CudaLayerState {
  DeviceBuffer ring;  // [window, head_dim] f32: slot p % window holds position p's KV row
  // The attention pool: [window_region rows (the step's window, contiguous) | compressed rows
  // (capacity compressed_capacity)] x head_dim f32. Sparse attention reads one pool.
  DeviceBuffer pool;
  int64_t compressed_capacity = 0;
  DeviceBuffer index_keys;  // [index_capacity, index_head_dim] f32 (layers with an indexer)
  int64_t index_capacity = 0;
  CudaCompressorState compressor, index_compressor;
};

// One sequence's device state; created by CudaModel::NewSequence.
struct CudaSequence final : RunnerState {
  int64_t n_tokens() const override { return length; }
  int64_t rollback_floor() const override { return length; }  // no rollback on the GPU yet
  int64_t length = 0;                  // backbone positions processed
  int64_t mtp_length = 0;              // MTP positions processed
  std::vector<CudaLayerState> layers;  // backbone layers, then MTP layers
  const void* owner = nullptr;         // the CudaModel that made it
};

// One sequence's slice of a batched GPU step.
struct CudaChunk {
  CudaSequence* seq = nullptr;
  std::span<const int32_t> tokens;
  ForwardOptions options;
  ForwardOutput* out = nullptr;
};

// Which kernels run the official numerics' FP8 linears of kTcMinTokens or more tokens (fewer
// always run the decode GEMV; the fp32-reference numerics always run the generic kernels).
enum class Fp8GemmPath : uint8_t {
  kAuto,       // tensor cores with the device's default MMA (ops.h DefaultTcMma)
  kGeneric,    // the generic fp32 kernels (weights decoded to fp32)
  kTensorF16,  // tensor cores, codes widened to fp16
  kTensorFp8,  // tensor cores, e4m3 MMA (sm_89+)
};

// Which kernels run the routed experts' grouped GEMMs of the official numerics.
enum class ExpertGemmPath : uint8_t {
  kAuto,       // CUDA cores until the tensor-core path is measured on a GPU (docs/SUPPORT.md)
  kCudaCores,  // the grouped GEMV / GEMM on fp32 FMAs (kernels.h LaunchGroupedMatMul)
  kTensor,     // FP4 experts on tensor cores whenever they apply (LaunchTcGroupedMatMul), with
               // the FP8 GEMM's MMA (or the device's default one when that is generic)
};

class CudaModel final : private V4Ops {
 public:
  // Whether the GPU forward runs this model family: DeepSeek-V4 only. Callers check it before
  // opening a device, so a V4.1 checkpoint gets this error on any machine, GPU or not.
  static Status Supports(const model::ModelConfig& config);
  // Uploads every weight (backbone and MTP) to `dev`, which must outlive the model.
  static Result<std::unique_ptr<CudaModel>> Create(CudaDevice& dev,
                                                   const model::ModelWeights& weights,
                                                   Numerics numerics,
                                                   Fp8GemmPath fp8_gemm = Fp8GemmPath::kAuto,
                                                   ExpertGemmPath experts = ExpertGemmPath::kAuto);
  ~CudaModel() override;

  const model::ModelConfig& config() const { return weights_.config(); }
  const Numerics& numerics() const { return numerics_; }
  // Device memory the weight upload took (the drop in free memory, pool granularity included).
  int64_t weight_bytes() const { return weight_bytes_; }
  // What the last step read (routed experts that received a token, KV rows), for benchmarks.
  const StepStats& last_step_stats() const { return step_stats_; }

  Result<std::unique_ptr<CudaSequence>> NewSequence();
  // An exact copy of `from` (device-to-device, queued on the stream): prefix-cache snapshots
  // and restores, n > 1 forks.
  Result<std::unique_ptr<CudaSequence>> CopySequence(const CudaSequence& from);
  // Device bytes a sequence holds now, and an upper bound of what it holds after n_tokens
  // tokens (its compressed rows grow by doubling: at most twice what they need).
  static int64_t SequenceBytes(const CudaSequence& seq);
  int64_t SequenceBytesAt(int64_t n_tokens) const;

  // Wall time per phase of the steps run since the last reset, when enabled (benchmarks only:
  // each phase then ends with a device synchronisation, which itself costs a little).
  struct PhaseTimes {
    double attention_dense = 0;         // mHC pre, projections, norms, RoPE of every row
    double attention_per_sequence = 0;  // pools, compressors, indexer, sparse attention
    double moe = 0;                     // mHC post / pre, router, routed and shared experts
    double head = 0;                    // last mHC post, head mHC, norm, vocabulary projection
  };
  void EnablePhaseTiming(bool on) { time_phases_ = on; }
  const PhaseTimes& phase_times() const { return phase_times_; }
  void ResetPhaseTimes() { phase_times_ = {}; }

  // Runs tokens at positions [seq.n_tokens(), + tokens.size()) and advances the sequence. Long
  // inputs run in steps of at most kMaxStepTokens tokens; any chunking gives the same results.
  // A bad argument fails before any state changes.
  Status Forward(CudaSequence& seq, std::span<const int32_t> tokens, const ForwardOptions& options,
                 ForwardOutput* out);

  // Several sequences in one step (continuous batching): every projection, the router and each
  // routed expert run once over all sequences' tokens; window, compressors, indexer selection
  // and sparse attention run per sequence. Chunks longer than kMaxStepTokens run in rounds.
  // Results equal running each chunk alone up to fp32 summation order (the kernels depend on the
  // token count). Everything is validated before any state changes.
  Status ForwardBatch(std::span<CudaChunk> chunks);

  // MTP block 0 (spec §8), as cpu::CpuModel::ForwardMtp: hidden [n, hc, hidden] (host), the
  // next tokens [n]; logits [n, vocab]. Advances the sequence's MTP stream.
  Status ForwardMtp(CudaSequence& seq, std::span<const float> hidden,
                    std::span<const int32_t> next_tokens, std::vector<float>* logits);

  static constexpr int64_t kMaxStepTokens = 256;

 private:
  struct DeviceLayer;
  struct Workspace;
  CudaModel(CudaDevice& dev, const model::ModelWeights& weights, Numerics numerics);
  // One layer's weights on the device, as its plan says it has them.
  static Result<std::unique_ptr<DeviceLayer>> UploadLayer(CudaDevice& dev,
                                                          const model::ModelConfig& c,
                                                          const model::LayerPlan& plan,
                                                          const model::LayerWeights& lw);

  // ---- V4Ops (v4_ops.h) ----------------------------------------------------------------------
  Status BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) override;
  Result<float*> Get(Buf buf, int64_t n_floats) override;
  Status Embed(int copies, float* out) override;
  Status HcPre(int layer, HcSite site, const float* H, float* x, float* mix) override;
  Status HcPost(const float* mix, const float* y, float* H) override;
  Status HcHead(int layer, const float* H, int64_t rows, float* y) override;
  Status RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) override;
  Status HeadRmsNorm(float* x, int64_t rows, int64_t dim) override;
  // The GPU runner does not draft (ModelRunner::CheckSpeculation refuses): no draft vocabulary.
  std::span<const int32_t> DraftVocabulary() const override { return {}; }
  Status Linear(int layer, Weight weight, LinearMode mode, const float* x, int64_t rows,
                float* y) override;
  Status OutputProjectionA(int layer, const float* o, float* z) override;
  Status Rope(int layer, float* x, RopeRows rows, int64_t stride, int64_t offset,
              bool inverse) override;
  Status RopeAt(int layer, float* x, std::span<const int64_t> positions, int64_t stride,
                int64_t offset) override;
  Status ScaleRound(float* x, int64_t n, float scale) override;
  Status Fp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status Fp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status Hadamard(float* x, int64_t rows, int64_t n) override;
  Status AddToStreams(const float* e, float* X) override;
  Result<CompressedRows> CompressorPool(int layer, Compressor which, const float* a,
                                        const float* g, float* rows_out) override;
  Status StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                         const float* data) override;
  Result<Selection> IndexerSelect(const IndexerQuery& query) override;
  // DeepSeek-V4.1's ops (single-pass mHC, its KV formats, Engram): not on the GPU yet; Create
  // refuses V4.1 checkpoints before any of these could be reached.
  Status HcPreCarried(int layer, HcSite site, const float* H, const float* carry,
                      int64_t carry_stride, float* x, float* mix) override;
  Status HcCollapse(const float* H, int64_t rows, const float* pre, int64_t pre_stride,
                    float* y) override;
  Status Fp4E4m3RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status EngramBegin() override;
  Status EngramGather(int layer, float* rows) override;
  Status EngramGate(int layer, const float* kv, float* H) override;
  Status DraftAttention(int layer, const float* q, const float* kv, float* o) override;
  Status MarkovEmbed(int layer, std::span<const int32_t> ids, float* out) override;
  Status SparseAttention(int layer, int kv_layer, int ratio, const float* q, const float* kv,
                         const Selection* selected, float* o) override;
  Status StoreWindow(int layer, const float* kv) override;
  Status Route(int layer, bool hash, const float* x) override;
  Status Experts(int layer, const float* x, float* out) override;
  Status GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                    float* dst) override;
  Status Download(const float* src, int64_t n, float* host) override;
  Status Upload(const float* host, int64_t n, float* dst) override;
  Status Mark(Phase phase) override;

  // y [m, w.rows] = w x with the reference's numerics (LinearMode::kQuantized).
  Status QuantLinear(const DeviceWeight& w, const float* x, int64_t m, float* y);
  // y = w x for x already on the FP8 grid of the act quant (blocks of act_block).
  Status MatMulQuantized(const DeviceWeight& w, const float* x, int64_t m, float* y);
  // Whether the tensor-core GEMM runs w over m tokens (quantized activations only).
  bool UseTensorCores(const DeviceWeight& w, int64_t m) const;
  // Whether the tensor-core grouped GEMM runs this expert set (quantized activations only).
  bool UseTensorCores(const struct DeviceExpertSet& set) const;
  Status EnsureCapacity(int li, CudaLayerState& ls, int64_t n_tokens_after);
  CudaSequence& Seq(size_t segment) const {
    return *static_cast<CudaSequence*>(segments_[segment].state);
  }

  CudaDevice& dev_;
  const model::ModelWeights& weights_;
  Numerics numerics_;
  V4Forward program_;
  std::optional<TcMma> tc_mma_;      // the tensor-core GEMM's MMA; none: generic kernels only
  std::optional<TcMma> expert_mma_;  // the routed experts' MMA; none: CUDA cores only
  std::vector<std::unique_ptr<DeviceLayer>> layers_;  // backbone, then MTP
  DeviceBuffer embed_;                                      // [vocab, hidden] bf16
  DeviceWeight head_;                                       // [vocab, hidden] bf16
  DeviceBuffer norm_;                                       // [hidden] f32
  DeviceBuffer hc_head_fn_, hc_head_base_, hc_head_scale_;  // f32 [hc, hc*hidden], [hc], [1]
  HcShape hc_shape_;                                        // the mHC ops' shape, from the config
  std::unique_ptr<Workspace> ws_;
  // The step in flight: its segments, and its device inputs uploaded once (every layer reads
  // them).
  std::vector<Segment> segments_;
  int64_t step_rows_ = 0;
  DeviceBuffer step_tokens_buf_, step_pos_buf_;
  struct StepInputs {
    const int32_t* tokens = nullptr;           // [T] int32 (embedding, hash routing)
    const int64_t* pos = nullptr;              // [T] absolute positions
    const int64_t* pos_heads = nullptr;        // [T * n_heads] each token's position per head
    const int64_t* pos_index_heads = nullptr;  // [T * index_n_heads]
  };
  StepInputs step_;
  // The last Route's choices (host) and the index lists built from them, for Experts.
  struct Routing;
  std::unique_ptr<Routing> routing_;
  int64_t weight_bytes_ = 0;
  StepStats step_stats_;
  bool time_phases_ = false;
  PhaseTimes phase_times_;
  std::chrono::steady_clock::time_point phase_mark_;
};

}  // namespace dsinfer::backend::cuda
