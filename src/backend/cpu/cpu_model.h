// The DeepSeek-V4 forward pass on the CPU: the shared layer program (backend/v4_forward.h) over
// CpuOps, with each sequence's state in host pages (sequence_state.h). Activations are fp32
// buffers; in the official numerics mode they are rounded to bf16 exactly where the reference
// rounds. One CpuModel serves many sequences. Engine-thread only (the ThreadPool parallelises
// inside each op).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/sequence_state.h"
#include "backend/forward_types.h"
#include "backend/numerics.h"
#include "backend/op_profile.h"
#include "backend/page_allocator.h"
#include "backend/v4_forward.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/state_layout.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu {

// The backend-neutral forward types, under the names the CPU backend's callers know them by.
using ForwardOptions = backend::ForwardOptions;
using ForwardOutput = backend::ForwardOutput;
using StepStats = backend::StepStats;

// One sequence's slice of a batched step: its state, its new tokens, what it wants back.
struct SequenceChunk {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
  ForwardOptions options;
  ForwardOutput* out = nullptr;
};

// One sequence's part of a batched MTP call (CpuModel::ForwardMtpBatch).
struct MtpChunk {
  SequenceState* state = nullptr;
  std::span<const float> hidden;            // [n, hc, hidden] f32 streams at the MTP positions
  std::span<const int32_t> next;            // [n] the tokens one position later
  std::vector<float>* logits = nullptr;     // out: [vocab] f32 of the last row (null: no head)
  std::vector<float>* last_hidden = nullptr;  // out: [hc, hidden] f32 of the last row, or null
};

// The storage formats of sequence-state rows under `numerics`: packed FP8 / FP4 where the
// numerics put the values on those grids, else bf16 or f32 (model/state_layout.h).
model::RowFormat KvRowFormat(const model::ModelConfig& c, const Numerics& numerics);
model::RowFormat IndexKeyFormat(const model::ModelConfig& c, const Numerics& numerics);
model::RowFormat CompressedRowFormat(const model::ModelConfig& c, const Numerics& numerics);

class CpuModel {
 public:
  struct Options {
    model::StateLayoutOptions layout;
    std::shared_ptr<PageAllocator> pages;  // null: a HeapPageAllocator
  };
  static Result<std::unique_ptr<CpuModel>> Create(const model::ModelWeights& weights,
                                                  Numerics numerics, ThreadPool& pool,
                                                  Options options = {});

  const model::ModelConfig& config() const { return weights_.config(); }
  const Numerics& numerics() const { return numerics_; }
  const model::StateLayout& layout() const { return layout_; }
  // The checkpoint's identity in state blobs (model/fingerprint.h), computed on first use: it
  // reads samples of every tensor, which start-up should not pay for.
  const Sha256Digest& fingerprint() const;
  const PageAllocator& pages() const { return *pages_; }
  // Pages of states made from now on come from `pages`.
  void UsePages(std::shared_ptr<PageAllocator> pages) { pages_ = std::move(pages); }
  const StepStats& last_step_stats() const { return ops_.stats(); }
  // From now on every op of every step and MTP call is timed into `profile` (null: none, the
  // default). Results are unchanged (backend/op_profile.h); for benchmarks.
  void set_op_profile(OpProfile* profile) {
    profiled_ = profile ? std::make_unique<ProfiledOps>(ops_, *profile) : nullptr;
  }

  std::unique_ptr<SequenceState> NewSequence() const;
  void Reset(SequenceState& state) const;
  // Bytes a sequence occupies now counting its pages as its own, and at most after n_tokens
  // positions (admission control).
  int64_t StateBytes(const SequenceState& state) const;
  int64_t StateBytesAt(int64_t n_tokens) const { return layout_.BytesAt(n_tokens); }

  // Runs tokens at positions [state.n_tokens(), + tokens.size()) and advances the state. Any
  // chunking of a sequence gives the same results as one call.
  Status Forward(SequenceState& state, std::span<const int32_t> tokens,
                 const ForwardOptions& options, ForwardOutput* out);
  // One batched step over several sequences (continuous batching): every linear layer and each
  // expert runs once over all sequences' tokens; attention runs per sequence. Results are
  // identical to running each chunk alone. Everything is validated before any state changes.
  Status ForwardBatch(std::span<SequenceChunk> chunks);

  // MTP block 0 (spec §8): hidden [n, hc_mult, hidden] = the main model's final streams at
  // positions p..p+n-1 of the MTP sequence, next_tokens [n] = the tokens at p+1..p+n.
  // Returns logits [n, vocab] predicting the tokens at p+2..p+n+1. Advances the MTP stream.
  Status ForwardMtp(SequenceState& state, std::span<const float> hidden,
                    std::span<const int32_t> next_tokens, std::vector<float>* logits);
  // The same for speculative drafting: logits of the last row only [1, vocab] (none when null)
  // and the block's final streams of the last row [hc, hidden] (the chained draft's input).
  Status ForwardMtpLast(SequenceState& state, std::span<const float> hidden,
                        std::span<const int32_t> next_tokens, std::vector<float>* logits,
                        std::vector<float>* last_hidden);
  // Ok when the checkpoint's MTP block is one ForwardMtp runs (V4's; not V4.1's dSpark).
  Status CheckMtpBlock() const { return program_.CheckMtpBlock(); }
  // ForwardMtpLast for several sequences in one pass over the MTP block's weights, with the
  // results each would get alone. Everything is validated before any state changes.
  Status ForwardMtpBatch(std::span<const MtpChunk> chunks);

  // V4.1 dSpark (spec §14.6; V4Forward::DsparkSeed / DsparkDraft / DsparkMarkov). Forward's
  // want_hidden rows are then the drafter's input [n, HiddenWidth()].
  Status CheckDspark() const { return program_.CheckDspark(); }
  int64_t HiddenWidth() const { return program_.HiddenWidth(); }
  // Feeds hidden[i] [n_i, targets * hidden] (the backbone's captures at MTP positions
  // [mtp_n_tokens, + n_i) of states[i]) into every stage's ring and advances the MTP streams;
  // main_x (optional) receives the projected rows [sum n_i, hidden].
  Status DsparkSeedBatch(std::span<SequenceState* const> states,
                         std::span<const std::span<const float>> hidden,
                         std::vector<float>* main_x = nullptr);
  // The draft block of each state (whose stage rings hold all its positions) after its pending
  // token tokens[i]: x[i] [block, hidden], logits[i] [n_logits[i], vocab] before the Markov bias
  // of the block's first n_logits[i] rows (empty n_logits: all).
  Status DsparkDraftBatch(std::span<SequenceState* const> states, std::span<const int32_t> tokens,
                          std::span<std::vector<float>* const> logits,
                          std::span<std::vector<float>* const> x,
                          std::span<const int> n_logits = {});
  Status DsparkMarkov(std::span<const int32_t> prev, std::span<const float> x,
                      std::vector<float>* bias, std::vector<float>* confidence) {
    return program_.DsparkMarkov(ops(), prev, x, bias, confidence);
  }

  // The drafters' heads from now on over `ids` only (ModelRunner::UseDraftVocabulary).
  Status UseDraftVocabulary(std::vector<int32_t> ids);
  // State operations (sequence_state.h).
  Status Truncate(SequenceState& state, int64_t n_tokens) const { return state.Truncate(n_tokens); }
  Status TruncateMtp(SequenceState& state, int64_t n_tokens) const {
    return state.TruncateMtp(n_tokens);
  }
  Result<std::vector<uint8_t>> Export(const SequenceState& state, std::span<const int32_t> tokens,
                                      int64_t first_page = 0) const;
  Result<std::unique_ptr<SequenceState>> Import(std::span<const uint8_t> blob,
                                                std::span<const int32_t> tokens,
                                                const SequenceState* base = nullptr) const;

 private:
  CpuModel(const model::ModelWeights& weights, Numerics numerics, ThreadPool& pool,
           model::StateLayout layout, std::shared_ptr<PageAllocator> pages);
  // Every state is this model's and appears once (a batched call's precondition).
  Status CheckBatchStates(std::span<SequenceState* const> states) const;
  Status RunMtp(SequenceState& state, std::span<const float> hidden,
                std::span<const int32_t> next_tokens, std::vector<float>* logits,
                bool last_row_logits, std::vector<float>* last_hidden);

  const model::ModelWeights& weights_;
  Numerics numerics_;
  V4Forward program_;
  // The ops the program runs: ops_, or ops_ behind the profiler.
  V4Ops& ops() { return profiled_ ? static_cast<V4Ops&>(*profiled_) : ops_; }

  CpuOps ops_;
  std::unique_ptr<ProfiledOps> profiled_;  // set_op_profile's wrapper of ops_; null: none
  std::unique_ptr<model::DraftVocabulary> draft_vocabulary_;  // ops_ reads it; null: none
  model::StateLayout layout_;
  std::shared_ptr<PageAllocator> pages_;
  mutable std::optional<Sha256Digest> fingerprint_;
};

}  // namespace dsinfer::backend::cpu
