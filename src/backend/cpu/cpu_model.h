// The DeepSeek-V4 forward pass on the CPU (spec §3-§9), written in the order of the reference.
// Activations are fp32 buffers; in the official numerics mode they are rounded to bf16 exactly
// where the reference rounds. One CpuModel serves many sequences; each sequence keeps its own
// SequenceState. Engine-thread only (the ThreadPool parallelises inside each op).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/sequence_state.h"
#include "backend/numerics.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu {

struct RopeTable;

struct ForwardOptions {
  bool all_logits = false;   // logits for every position of the chunk (else the last only)
  bool want_hidden = false;  // also return the final stream state of every position (MTP input)
  bool want_logits = true;   // false: skip the head (prefill chunks that end mid-prompt)
};

struct ForwardOutput {
  std::vector<float> logits;  // [n_positions, vocab] f32
  std::vector<float> hidden;  // [n_tokens, hc_mult, hidden] f32 when want_hidden
};

// One sequence's slice of a batched step: its state, its new tokens, what it wants back.
struct SequenceChunk {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
  ForwardOptions options;
  ForwardOutput* out = nullptr;
};

// Where a sequence's tokens sit in a batched step's flattened token rows.
struct Segment {
  int64_t row = 0;        // first row in the flattened batch
  int64_t n = 0;          // tokens of this sequence in the step
  int64_t start_pos = 0;  // absolute position of its first token
  LayerState* layer = nullptr;
};

// What the last ForwardBatch had to read, for roofline accounting in benchmarks.
struct StepStats {
  int64_t routed_expert_bytes = 0;  // weights of every routed expert that received >= 1 token
  int64_t n_routed_experts_used = 0;
  int64_t kv_bytes = 0;  // sequence state read by attention (windows, rows, keys)
  // Multiply-adds of the step: every linear layer (each token times the weights it goes through:
  // a routed expert only for its tokens, the head only for the rows asked for), attention scores
  // and values over the visible rows, indexer scores. Left out, under 0.5 % of a token's: the mHC
  // mixes, norms, RoPE and the router's top-k.
  int64_t macs = 0;
};

class CpuModel {
 public:
  static Result<std::unique_ptr<CpuModel>> Create(const model::ModelWeights& weights,
                                                  Numerics numerics, ThreadPool& pool);
  ~CpuModel();

  const model::ModelConfig& config() const { return weights_.config(); }
  const Numerics& numerics() const { return numerics_; }
  std::unique_ptr<SequenceState> NewSequence() const;
  const StepStats& last_step_stats() const { return step_stats_; }
  // Bytes a sequence state holds now, and would hold after n_tokens positions (for admission
  // control: fixed windows and compressor states plus compressed rows growing with context).
  int64_t StateBytes(const SequenceState& state) const;
  int64_t StateBytesAt(int64_t n_tokens) const;
  void Reset(SequenceState& state) const;

  // Runs tokens at positions [state.n_tokens, state.n_tokens + tokens.size()) and advances the
  // state. Any chunking of a sequence gives the same results as one call.
  Status Forward(SequenceState& state, std::span<const int32_t> tokens,
                 const ForwardOptions& options, ForwardOutput* out);

  // One batched step over several sequences (continuous batching): every linear layer and each
  // expert runs once over all sequences' tokens; attention runs per sequence. Results are
  // identical to running each chunk alone.
  Status ForwardBatch(std::span<SequenceChunk> chunks);

  // MTP block 0 (spec §8): hidden [n, hc_mult, hidden] = the main model's final streams at
  // positions p..p+n-1 of the MTP sequence, next_tokens [n] = the tokens at p+1..p+n.
  // Returns logits [n, vocab] predicting the tokens at p+2..p+n+1. Advances state.mtp.
  Status ForwardMtp(SequenceState& state, std::span<const float> hidden,
                    std::span<const int32_t> next_tokens, std::vector<float>* logits);

 private:
  CpuModel(const model::ModelWeights& weights, Numerics numerics, ThreadPool& pool);

  // One decoder block (attention + MoE with their mHC) over T tokens; H [T, hc, hidden].
  void Block(const model::LayerWeights& lw, std::span<Segment> segments,
             std::span<const int32_t> tokens, std::vector<float>& H);
  void Attention(const model::LayerWeights& lw, std::span<Segment> segments, int64_t T,
                 const float* x, float* out);
  void Moe(const model::LayerWeights& lw, std::span<const int32_t> tokens, const float* x,
           float* out);
  void Logits(const float* H, int64_t T, const model::HcParams& hc_head,
              const model::TensorView& norm, float* logits);

  const model::ModelWeights& weights_;
  Numerics numerics_;
  ThreadPool& pool_;
  std::vector<std::unique_ptr<RopeTable>> rope_;  // per layer (backbone then MTP)
  StepStats step_stats_;
};

}  // namespace dsinfer::backend::cpu
