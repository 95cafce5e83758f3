#include "model/draft_vocabulary.h"

#include <algorithm>
#include <cstring>

#include "io/json_file.h"
#include "io/text_file.h"

namespace dsinfer::model {

namespace {

// The rows `ids` of `m` (rows stored whole: f32 or bf16) into `bytes`, and `out` viewing them.
Status GatherRows(const WeightMatrix& m, std::span<const int32_t> ids, std::vector<uint8_t>& bytes,
                  WeightMatrix& out) {
  if (m.format != WeightFormat::kF32 && m.format != WeightFormat::kBF16)
    return FailedPrecondition("draft vocabulary: " + m.name +
                              " is quantized; only f32 / bf16 rows can be gathered");
  const int64_t row_bytes = m.RowBytes();
  bytes.resize(static_cast<size_t>(static_cast<int64_t>(ids.size()) * row_bytes));
  for (size_t i = 0; i < ids.size(); ++i)
    std::memcpy(bytes.data() + static_cast<int64_t>(i) * row_bytes,
                m.data + static_cast<int64_t>(ids[i]) * row_bytes, static_cast<size_t>(row_bytes));
  out = m;
  out.data = bytes.data();
  out.rows = static_cast<int64_t>(ids.size());
  out.name = m.name + " (draft vocabulary rows)";
  return Status::Ok();
}

}  // namespace

Result<std::vector<int32_t>> ParseDraftVocabulary(std::string_view text, int64_t vocab_size,
                                                  const std::string& source) {
  DSINFER_ASSIGN_OR_RETURN(nlohmann::json doc, io::ParseJsonText(text, source));
  if (!doc.is_array() || doc.empty())
    return InvalidArgument(source + ": a draft vocabulary is a non-empty JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& v = doc[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
      return InvalidArgument(source + ": entry " + std::to_string(i) + " (" + v.dump() +
                             ") is not a token id in [0, " + std::to_string(vocab_size) + ")");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  std::sort(ids.begin(), ids.end());
  if (const auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end())
    return InvalidArgument(source + ": token id " + std::to_string(*dup) + " appears twice");
  return ids;
}

Result<std::vector<int32_t>> ReadDraftVocabulary(const std::string& path, int64_t vocab_size) {
  DSINFER_ASSIGN_OR_RETURN(std::string text, io::ReadTextFile(path));
  return ParseDraftVocabulary(text, vocab_size, path);
}

Result<std::unique_ptr<DraftVocabulary>> DraftVocabulary::Build(const ModelWeights& weights,
                                                                std::vector<int32_t> ids) {
  const ModelConfig& c = weights.config();
  if (ids.empty()) return InvalidArgument("draft vocabulary: no token ids");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size || (i > 0 && ids[i] <= ids[i - 1]))
      return InvalidArgument("draft vocabulary: the ids must be ascending, distinct and in [0, " +
                             std::to_string(c.vocab_size) + ")");
  std::unique_ptr<DraftVocabulary> v(new DraftVocabulary());
  v->ids_ = std::move(ids);
  DSINFER_RETURN_IF_ERROR(GatherRows(weights.head, v->ids_, v->head_bytes_, v->head_));
  // V4.1's dSpark: the last stage's Markov bias is a vocabulary projection too.
  if (c.V41() && c.n_mtp_layers > 0 && c.dspark.block_size > 0) {
    const WeightMatrix& markov = weights.layers[c.n_layers + c.n_mtp_layers - 1].dspark.markov_head;
    DSINFER_RETURN_IF_ERROR(GatherRows(markov, v->ids_, v->markov_head_bytes_, v->markov_head_));
  }
  return v;
}

}  // namespace dsinfer::model
