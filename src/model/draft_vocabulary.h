// A draft vocabulary: the subset of token ids a speculative drafter proposes from (the idea of
// FR-Spec, Zhao et al. 2025; SGLang's --speculative-token-map). The drafter's vocabulary
// projections are gathered to those rows, so a draft's head reads S / V of the full head's bytes:
// on V4-Flash the head (bf16, 1.06 GB) is two thirds of an MTP call. Outputs stay exact whatever
// the subset: a draft is only a proposal the target model verifies, and the rejection rule is
// exact for any draft distribution (runtime/speculative.h). The subset changes acceptance only:
// a token outside it is never proposed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/weights.h"

namespace dsinfer::model {

// Parses a draft-vocabulary file: a JSON array of distinct token ids in [0, vocab_size), at least
// one. Returns them ascending. `source` names the file in errors.
Result<std::vector<int32_t>> ParseDraftVocabulary(std::string_view text, int64_t vocab_size,
                                                  const std::string& source);
// Reads and parses the file at `path` (ParseDraftVocabulary's checks).
Result<std::vector<int32_t>> ReadDraftVocabulary(const std::string& path, int64_t vocab_size);

class DraftVocabulary {
 public:
  // Gathers the rows `ids` (ascending, distinct, in range: ParseDraftVocabulary's output) of the
  // main head and, for a V4.1 checkpoint with dSpark, of the last stage's Markov head. The
  // heads must be stored unquantized (f32 / bf16, as every official checkpoint stores them).
  static Result<std::unique_ptr<DraftVocabulary>> Build(const ModelWeights& weights,
                                                        std::vector<int32_t> ids);

  std::span<const int32_t> ids() const { return ids_; }  // [S] ascending
  const WeightMatrix& head() const { return head_; }      // [S, hidden] the head's rows
  // [S, markov_rank] the Markov head's rows (dSpark checkpoints; invalid otherwise)
  const WeightMatrix& markov_head() const { return markov_head_; }
  // Bytes the gathered copies occupy.
  int64_t Bytes() const {
    return static_cast<int64_t>(head_bytes_.size() + markov_head_bytes_.size());
  }

 private:
  DraftVocabulary() = default;

  std::vector<int32_t> ids_;
  std::vector<uint8_t> head_bytes_, markov_head_bytes_;  // the gathered rows
  WeightMatrix head_, markov_head_;                      // views of them
};

}  // namespace dsinfer::model
