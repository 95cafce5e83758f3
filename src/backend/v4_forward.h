// The DeepSeek-V4-family forward pass, written once: embedding, the block loop (mHC around
// attention by role and MoE), the head, and the MTP block, as a sequence of V4Ops calls. Layer
// behaviour comes from model::LayerPlan; rounding and quantization points from Numerics. Each
// backend supplies the ops (v4_ops.h) and runs this program, so the CPU and the GPU cannot drift
// apart step by step, and a model variant changes this file and the plans, not every backend.
// Stateless apart from its configuration: thread-safe to share, each call on its own V4Ops.
#pragma once

#include <span>
#include <vector>

#include "backend/numerics.h"
#include "backend/v4_ops.h"
#include "model/config.h"
#include "model/layer_plan.h"

namespace dsinfer::backend {

class V4Forward {
 public:
  V4Forward(const model::ModelConfig& config, const Numerics& numerics);

  const model::ModelConfig& config() const { return config_; }
  const Numerics& numerics() const { return numerics_; }
  const std::vector<model::LayerPlan>& plans() const { return plans_; }

  struct StepRequest {
    std::span<const Segment> segments;    // backbone positions; validated by the caller
    std::span<const int32_t> tokens;      // [T] the segments' tokens, in segment order
    std::span<const int64_t> logit_rows;  // rows of the step whose logits come back
    std::span<const int64_t> hidden_rows;  // rows whose drafting input comes back
  };
  struct StepResult {
    std::vector<float> logits;  // [logit_rows, vocab] f32
    std::vector<float> hidden;  // [hidden_rows, HiddenWidth()] f32
  };
  // Floats per row of StepResult::hidden, the drafter's input: V4 the final streams [hc,
  // hidden] (the MTP block's); V4.1 with dSpark stages the mean of the streams entering each
  // target layer [targets, hidden] (spec §14.6).
  int64_t HiddenWidth() const;
  // One batched step of the backbone over every segment.
  Status Step(V4Ops& ops, const StepRequest& request, StepResult* result) const;

  // The drafters' vocabulary projections (Mtp / MtpRows logits, DsparkDraft logits, DsparkMarkov
  // bias) are computed over the ops' draft vocabulary when one is set (V4Ops::DraftVocabulary):
  // -inf logits (0 bias) outside it, so no draft is ever proposed there. The backbone's logits
  // (Step) are always the whole vocabulary's.

  // MTP block `mtp_index` (spec §8) for one sequence: segment.start_pos is the MTP stream's
  // position, hidden [n, hc, hidden] the main model's final streams at those positions, next [n]
  // the tokens one position later. logits [n, vocab] predict the tokens two positions later;
  // with last_row_logits only the last row's [1, vocab] (speculative drafting, which also skips
  // the head on catch-up rows), and no head at all when logits is null. last_hidden, when given,
  // receives the block's final streams of the last row [hc, hidden]: the next draft's input.
  Status Mtp(V4Ops& ops, int mtp_index, const Segment& segment, std::span<const int32_t> next,
             std::span<const float> hidden, std::vector<float>* logits,
             bool last_row_logits = false, std::vector<float>* last_hidden = nullptr) const;
  // The same block for several sequences in one pass over its weights (speculative drafting
  // across a batch): segments[i] as above with its rows in the step's flattened order, next [T]
  // and hidden [T, hc, hidden] flattened likewise. logits receives [logit_rows.size(), vocab]
  // for those flattened rows (the head runs on them only; none when empty), streams the block's
  // final streams of stream_rows [stream_rows.size(), hc, hidden]. Each row's results are those
  // the sequence would get alone (the ops are batch-invariant).
  Status MtpRows(V4Ops& ops, int mtp_index, std::span<const Segment> segments,
                 std::span<const int32_t> next, std::span<const float> hidden,
                 std::span<const int64_t> logit_rows, std::vector<float>* logits,
                 std::span<const int64_t> stream_rows, std::vector<float>* streams) const;

  // ---- V4.1 dSpark (spec §14.6) ----------------------------------------------------------------
  // Feeds positions into every stage's ring: segments on the MTP stream (start_pos = its length
  // before the call), hidden [T, targets * hidden] the backbone's captures at those positions
  // (Step's hidden rows). main_x, when given, receives main_norm(main_proj(hidden)) [T, hidden].
  Status DsparkSeed(V4Ops& ops, std::span<const Segment> segments, std::span<const float> hidden,
                    std::vector<float>* main_x = nullptr) const;
  // The draft block of every segment: n = block_size rows at start_pos = the stage rings'
  // length (= the backbone's), tokens [T] = per segment [pending token, noise x (B - 1)]. Row i
  // predicts the token at start_pos + i + 1. x [T, hidden] the collapsed streams (the head's
  // and the confidence head's input); logits [sum n_logits, vocab] before the Markov bias, of
  // each segment's first n_logits[i] rows (the drafts wanted: the head is most of a block's
  // cost; empty n_logits: every row).
  Status DsparkDraft(V4Ops& ops, std::span<const Segment> segments,
                     std::span<const int32_t> tokens, std::span<const int> n_logits,
                     std::vector<float>* logits, std::vector<float>* x) const;
  // The last stage's Markov bias and confidence for R draft rows: prev [R] the token before
  // each row's prediction (the pending token for row 0, else the previous draft), x [R, hidden]
  // the row's collapsed streams. bias [R, vocab] is added to the row's logits; confidence [R]
  // is the confidence head's logit.
  Status DsparkMarkov(V4Ops& ops, std::span<const int32_t> prev, std::span<const float> x,
                      std::vector<float>* bias, std::vector<float>* confidence) const;
  // The checkpoint has dSpark stages this program runs.
  Status CheckDspark() const;

  // A step's or an MTP call's token ids are in the vocabulary (the backends check before any
  // state changes); MTP's hidden streams are [next.size(), hc, hidden].
  Status CheckTokens(std::span<const int32_t> tokens) const;
  Status CheckMtpInputs(std::span<const int32_t> next, std::span<const float> hidden) const;
  // The checkpoint has a V4 MTP block this program runs (V4.1's mtp.* are dSpark stages).
  Status CheckMtpBlock() const;

  // Floats per token of the mHC mix buffer: pre [hc], post [hc], comb [hc, hc].
  int MixFloats() const { return 2 * config_.hc_mult + config_.hc_mult * config_.hc_mult; }

 private:
  // What a step carries from layer to layer (V4.1): the pre the next sublayer collapses with
  // (single-pass mHC), the last published top-k and the candidate blocks.
  struct StepContext {
    const float* carry = nullptr;  // [T, carry_stride], the pre first
    int64_t carry_stride = 0;
    Selection published;   // the latest index source's selection (reused by the others)
    Selection candidates;  // the candidate source's blocks, per query
  };

  Status Block(V4Ops& ops, const model::LayerPlan& plan, int64_t T, int n_segments, float* H,
               StepContext& ctx) const;
  Status Attention(V4Ops& ops, const model::LayerPlan& plan, int64_t T, int n_segments,
                   const float* x, float* out, StepContext& ctx) const;
  // kv [T, head_dim] = the window KV rows of x [T, hidden] at the step's positions (spec §5.2,
  // §14.2): kv_norm(wkv x), RoPE on the tail, the numerics' round trip.
  Status WindowKv(V4Ops& ops, const model::LayerPlan& plan, int64_t T, const float* x,
                  float* kv) const;
  // The attention output o [T, heads, head_dim] (de-rotated) to out [T, hidden] (spec §5.7).
  Status OutputProjection(V4Ops& ops, const model::LayerPlan& plan, int64_t T, const float* o,
                          float* out) const;
  // V4.1's single-pass mHC starts from the one-hot pre [T, hc] (spec §14.4).
  Status OneHotCarry(V4Ops& ops, int64_t T, StepContext& ctx) const;
  // Projects x into `which` compressor of the layer, pools completed groups, finishes them
  // (bf16, norm, RoPE at each group's first position, the numerics' round trip) and stores them.
  // A V4.1 kv source that is an index source also derives and stores the index keys.
  Status Compress(V4Ops& ops, const model::LayerPlan& plan, Compressor which, int64_t T,
                  int n_segments, const float* x) const;
  // The lightning indexer's queries, weights and selection (spec §5.4, §14.3).
  Result<Selection> Indexer(V4Ops& ops, const model::LayerPlan& plan, int64_t T, int n_segments,
                            const float* x, const float* qr, StepContext& ctx) const;
  // V4.1 Engram before the block (spec §14.5): H [T, hc, hidden] updated in place.
  Status Engram(V4Ops& ops, const model::LayerPlan& plan, int64_t T, float* H) const;
  // logits [rows, vocab] (host) of the streams H [rows, hc, hidden]: hc_head of `layer` (-1:
  // the main head) or, V4.1, the collapse with the carried pre [rows, pre_stride]; the norm; the
  // vocabulary projection (a drafter's, `draft`: over the ops' draft vocabulary if any).
  Status Head(V4Ops& ops, int layer, float* H, int64_t rows, std::vector<float>* logits,
              const float* pre = nullptr, int64_t pre_stride = 0, bool draft = false) const;
  // out [rows, vocab] (host) = y [rows, in] (device) through `weight` (kHead or kMarkovHead:
  // vocabulary projections) in fp32 (into `buf`). With draft vocabulary ids (ascending; the ops'
  // DraftVocabulary()) only those S rows are computed (kDraftHead / kDraftMarkovHead, [rows, S])
  // and scattered to their token ids, `fill` everywhere else; empty ids: the whole vocabulary.
  Status VocabularyProjection(V4Ops& ops, int layer, Weight weight, const float* y, int64_t rows,
                              std::span<const int32_t> ids, float fill, Buf buf,
                              std::vector<float>* out) const;

  model::ModelConfig config_;
  Numerics numerics_;
  std::vector<model::LayerPlan> plans_;
};

}  // namespace dsinfer::backend
