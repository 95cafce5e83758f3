// The CPU backend's V4Ops (backend/v4_ops.h): fp32 host buffers, the weights as mapped views
// dequantized row by row in the matmul kernels (linear.h), sequence state in host pages
// (sequence_state.h). Activations are rounded to bf16 exactly where the program asks, so the
// official numerics reproduce the reference's (docs/NUMERICS.md).
// The attention kernels the GPU conformance checks compare against are public (attention
// kernels below), so those checks call them instead of restating them.
// Engine-thread only; the ThreadPool parallelises inside each op.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/sequence_state.h"
#include "backend/forward_types.h"
#include "backend/numerics.h"
#include "backend/v4_ops.h"
#include "core/aligned.h"
#include "core/thread_pool.h"
#include "model/draft_vocabulary.h"
#include "model/engram.h"
#include "model/layer_plan.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu {

// ---- attention kernels (spec §5.3-5.6) ------------------------------------------------------

// One compressed row of a completed group: per channel c of d = overlap ? width / 2 : width,
// softmax over the candidates' gate logits of their projections. rows [n_cand] are projection
// rows [2, width] (a, then g + ape); nullptr is a candidate before position 0 (score -inf,
// value 0). Overlapping: candidates [0, ratio) are the previous group's (dims [0, d)), then the
// group's own (dims [d, 2d)); otherwise the group's own (ratio candidates).
void PoolGroup(std::span<const float* const> rows, int ratio, int width, bool overlap,
               float* out);
// Indexer scores of one query over keys (spec §5.4): scores[j] = sum_h w[h] relu(q_h . key_j),
// with the dots and the sum rounded to bf16 when round_bf16. q [heads, head_dim], w [heads].
// round_terms (V4.1, docs/NUMERICS.md V4.1 assumption 9): each head's weighted term
// bf16(relu(bf16(q_h . key)) * w_h) is rounded too before the fp32 sum.
void IndexerScores(const float* q, const float* w, std::span<const float* const> keys, int heads,
                   int head_dim, bool round_bf16, float* scores, bool round_terms = false);
// The indices of the k highest scores (ties: lower index first), ascending; all of them when
// k >= scores.size(), none when k <= 0.
std::vector<int32_t> TopK(std::span<const float> scores, int k);
// Sparse attention with sink (spec §5.6) of heads [0, n_heads) (n_heads <= kSharedRowsMax) of
// one query q [n_heads, head_dim] over rows (K = V): o [n_heads, head_dim], before the inverse
// RoPE. P is rounded to bf16 before P.V and o after, when round_bf16. The softmax's shift m is
// the largest logit among the rows and the sink (V4), or among the rows only (V4.1, spec §5.6's
// m = max_s l_s): equal results without rounding, different bf16 P where the sink is largest.
void AttendHeads(const float* q, int n_heads, std::span<const float* const> rows, int head_dim,
                 const float* sink, float scale, bool round_bf16, float* o,
                 bool max_over_rows_only = false);

class CpuOps final : public V4Ops {
 public:
  CpuOps(const model::ModelWeights& weights, const Numerics& numerics,
         const std::vector<model::LayerPlan>& plans, ThreadPool& pool);

  const StepStats& stats() const { return stats_; }
  // Drafts from now on use `vocabulary`'s rows (null: the whole vocabulary); it must outlive
  // its use here.
  void set_draft_vocabulary(const model::DraftVocabulary* vocabulary) {
    draft_vocabulary_ = vocabulary;
  }

  Status BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) override;
  Result<float*> Get(Buf buf, int64_t n_floats) override;

  Status Embed(int copies, float* out) override;
  Status HcPre(int layer, HcSite site, const float* H, float* x, float* mix) override;
  Status HcPreCarried(int layer, HcSite site, const float* H, const float* carry,
                      int64_t carry_stride, float* x, float* mix) override;
  Status HcCollapse(const float* H, int64_t rows, const float* pre, int64_t pre_stride,
                    float* y) override;
  Status HcPost(const float* mix, const float* y, float* H) override;
  Status HcHead(int layer, const float* H, int64_t rows, float* y) override;
  Status RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) override;
  Status HeadRmsNorm(float* x, int64_t rows, int64_t dim) override;
  std::span<const int32_t> DraftVocabulary() const override {
    return draft_vocabulary_ != nullptr ? draft_vocabulary_->ids() : std::span<const int32_t>();
  }
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
  Status Fp4E4m3RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status Hadamard(float* x, int64_t rows, int64_t n) override;
  Status AddToStreams(const float* e, float* X) override;

  Result<CompressedRows> CompressorPool(int layer, Compressor which, const float* a,
                                        const float* g, float* rows_out) override;
  Status StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                         const float* data) override;
  Result<Selection> IndexerSelect(const IndexerQuery& query) override;
  Status SparseAttention(int layer, int kv_layer, int ratio, const float* q, const float* kv,
                         const Selection* selected, float* o) override;
  Status StoreWindow(int layer, const float* kv) override;

  Status DraftAttention(int layer, const float* q, const float* kv, float* o) override;
  Status MarkovEmbed(int layer, std::span<const int32_t> ids, float* out) override;
  Status EngramBegin() override;
  Status EngramGather(int layer, float* rows) override;
  Status EngramGate(int layer, const float* kv, float* H) override;

  Status Route(int layer, bool hash, const float* x) override;
  Status Experts(int layer, const float* x, float* out) override;

  Status GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                    float* dst) override;
  Status Download(const float* src, int64_t n, float* host) override;
  Status Upload(const float* host, int64_t n, float* dst) override;

 private:
  const model::LayerWeights& Layer(int layer) const { return weights_.layers[layer]; }
  SequenceState& State(size_t segment) const {
    return *static_cast<SequenceState*>(segments_[segment].state);
  }
  // The state layer index of a weights layer (the same: backbone, then MTP).
  const model::ModelConfig& config() const { return weights_.config(); }

  const model::ModelWeights& weights_;
  const model::DraftVocabulary* draft_vocabulary_ = nullptr;  // CpuModel's; null: none
  Numerics numerics_;
  const std::vector<model::LayerPlan>& plans_;
  ThreadPool& pool_;
  std::vector<RopeTable> rope_;  // per layer (backbone, then MTP)

  // The step in flight.
  std::vector<Segment> segments_;
  std::vector<int32_t> tokens_;   // [T]
  std::vector<int64_t> pos_of_;   // [T] absolute position of each row
  std::vector<int32_t> seg_of_;   // [T] segment of each row
  std::array<AlignedVector<float>, static_cast<size_t>(Buf::kCount)> buffers_;
  // The last Route's choices, for Experts.
  std::vector<int32_t> chosen_;  // [T, K] expert ids
  std::vector<float> weight_;    // [T, K] routing weights
  // V4.1 Engram: the hashing (null without Engram) and the step's row ids per Engram layer.
  std::optional<model::EngramHasher> engram_hasher_;
  std::vector<std::vector<int64_t>> engram_ids_;  // [engram layers][T, rows_per_token]
  StepStats stats_;
};

}  // namespace dsinfer::backend::cpu
