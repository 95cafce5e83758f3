#include "backend/cpu/cpu_model.h"

#include <algorithm>

#include "model/fingerprint.h"

namespace dsinfer::backend::cpu {

model::RowFormat KvRowFormat(const model::ModelConfig& c, const Numerics& nm) {
  // V4.1: the round trip puts every dim on the FP8 grid (blocks of 32, power-of-two scales).
  if (c.V41() && nm.kv_fp8_round_trip) return model::Fp8NopeRow(c.head_dim, c.head_dim, 32);
  // Official: RMSNorm and RoPE write bf16, the QAT round trip puts the nope dims on the FP8
  // grid (blocks of 64, power-of-two scales).
  if (nm.round_bf16 && nm.kv_fp8_round_trip) return model::Fp8NopeRow(c.head_dim, c.NopeDim(), 64);
  return nm.round_bf16 ? model::Bf16Row(c.head_dim) : model::F32Row(c.head_dim);
}

model::RowFormat CompressedRowFormat(const model::ModelConfig& c, const Numerics& nm) {
  // V4.1: FP4 e2m1 with an e4m3 scale per 16 (spec §14.2); V4: as the window rows.
  if (c.V41() && nm.kv_fp8_round_trip) return model::Fp4E4m3Row(c.head_dim, 16);
  if (c.V41()) return nm.round_bf16 ? model::Bf16Row(c.head_dim) : model::F32Row(c.head_dim);
  return KvRowFormat(c, nm);
}

model::RowFormat IndexKeyFormat(const model::ModelConfig& c, const Numerics& nm) {
  // Hadamard + FP4 round trip in blocks of 32 over the whole key.
  if (nm.indexer_fp4 && c.index_head_dim % 32 == 0) return model::Fp4Row(c.index_head_dim, 32);
  return nm.round_bf16 ? model::Bf16Row(c.index_head_dim) : model::F32Row(c.index_head_dim);
}

CpuModel::CpuModel(const model::ModelWeights& weights, Numerics numerics, ThreadPool& pool,
                   model::StateLayout layout, std::shared_ptr<PageAllocator> pages)
    : weights_(weights),
      numerics_(numerics),
      program_(weights.config(), numerics),
      ops_(weights, numerics, program_.plans(), pool),
      layout_(std::move(layout)),
      pages_(std::move(pages)) {}

const Sha256Digest& CpuModel::fingerprint() const {
  if (!fingerprint_) fingerprint_ = model::ModelFingerprint(weights_);
  return *fingerprint_;
}

Result<std::unique_ptr<CpuModel>> CpuModel::Create(const model::ModelWeights& weights,
                                                   Numerics numerics, ThreadPool& pool,
                                                   Options options) {
  const model::ModelConfig& c = weights.config();
  DSINFER_ASSIGN_OR_RETURN(model::StateLayout layout,
                           model::MakeStateLayout(c, model::PlanLayers(c), KvRowFormat(c, numerics),
                                                  IndexKeyFormat(c, numerics), options.layout,
                                                  CompressedRowFormat(c, numerics)));
  if (options.pages == nullptr) options.pages = MakeHeapPageAllocator();
  return std::unique_ptr<CpuModel>(
      new CpuModel(weights, numerics, pool, std::move(layout), std::move(options.pages)));
}

std::unique_ptr<SequenceState> CpuModel::NewSequence() const {
  return std::make_unique<SequenceState>(layout_, pages_);
}

void CpuModel::Reset(SequenceState& state) const { state.Reset(); }

int64_t CpuModel::StateBytes(const SequenceState& state) const {
  return state.BoundaryBytes() + state.n_pages() * layout_.page_bytes;
}

Status CpuModel::Forward(SequenceState& state, std::span<const int32_t> tokens,
                         const ForwardOptions& options, ForwardOutput* out) {
  SequenceChunk chunk{&state, tokens, options, out};
  return ForwardBatch(std::span<SequenceChunk>(&chunk, 1));
}

Status CpuModel::ForwardBatch(std::span<SequenceChunk> chunks) {
  const model::ModelConfig& c = config();
  // Validate everything before touching any state: a bad chunk fails the step and loses nothing.
  std::vector<Segment> segments;
  std::vector<int32_t> tokens;  // [T] flattened
  std::vector<int64_t> logit_rows, hidden_rows;
  for (const SequenceChunk& ch : chunks) {
    if (ch.state == nullptr || ch.out == nullptr)
      return InvalidArgument("ForwardBatch: chunk without state/output");
    DSINFER_RETURN_IF_ERROR(program_.CheckTokens(ch.tokens));
    if (&ch.state->layout() != &layout_)
      return InvalidArgument("Forward: the sequence state belongs to another model");
    for (const SequenceChunk& other : chunks)
      if (&other != &ch && other.state == ch.state)
        return InvalidArgument("ForwardBatch: a sequence appears twice");
    const auto row = static_cast<int64_t>(tokens.size());
    const auto n = static_cast<int64_t>(ch.tokens.size());
    segments.push_back({row, n, ch.state->n_tokens(), ch.state});
    tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());
    if (ch.options.want_logits)
      for (int64_t t = ch.options.all_logits ? 0 : n - 1; t < n; ++t) logit_rows.push_back(row + t);
    if (ch.options.want_hidden)
      for (int64_t t = 0; t < n; ++t) hidden_rows.push_back(row + t);
  }
  V4Forward::StepResult result;
  DSINFER_RETURN_IF_ERROR(
      program_.Step(ops(), {segments, tokens, logit_rows, hidden_rows}, &result));
  // Hand each chunk its rows of the results, in the order they were asked for.
  const int64_t V = c.vocab_size, HD = program_.HiddenWidth();  // floats per hidden row
  size_t li = 0, hi = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    SequenceChunk& ch = chunks[i];
    const int64_t n = segments[i].n;
    const int64_t n_logits = !ch.options.want_logits ? 0 : ch.options.all_logits ? n : 1;
    ch.out->logits.assign(result.logits.begin() + static_cast<int64_t>(li) * V,
                          result.logits.begin() + (static_cast<int64_t>(li) + n_logits) * V);
    li += static_cast<size_t>(n_logits);
    ch.out->hidden.clear();
    if (ch.options.want_hidden) {
      ch.out->hidden.assign(result.hidden.begin() + static_cast<int64_t>(hi) * HD,
                            result.hidden.begin() + (static_cast<int64_t>(hi) + n) * HD);
      hi += static_cast<size_t>(n);
    }
    ch.state->Advance(segments[i].start_pos + n);
  }
  return Status::Ok();
}

Status CpuModel::ForwardMtp(SequenceState& state, std::span<const float> hidden,
                            std::span<const int32_t> next_tokens, std::vector<float>* logits) {
  if (logits == nullptr) return InvalidArgument("ForwardMtp: no logits output");
  return RunMtp(state, hidden, next_tokens, logits, false, nullptr);
}

Status CpuModel::ForwardMtpLast(SequenceState& state, std::span<const float> hidden,
                                std::span<const int32_t> next_tokens, std::vector<float>* logits,
                                std::vector<float>* last_hidden) {
  return RunMtp(state, hidden, next_tokens, logits, true, last_hidden);
}

Status CpuModel::RunMtp(SequenceState& state, std::span<const float> hidden,
                        std::span<const int32_t> next_tokens, std::vector<float>* logits,
                        bool last_row_logits, std::vector<float>* last_hidden) {
  DSINFER_RETURN_IF_ERROR(program_.CheckMtpInputs(next_tokens, hidden));
  const int64_t n = static_cast<int64_t>(next_tokens.size());
  if (&state.layout() != &layout_)
    return InvalidArgument("ForwardMtp: the sequence state belongs to another model");
  const Segment seg{0, n, state.mtp_n_tokens(), &state};
  DSINFER_RETURN_IF_ERROR(
      program_.Mtp(ops(), 0, seg, next_tokens, hidden, logits, last_row_logits, last_hidden));
  state.AdvanceMtp(state.mtp_n_tokens() + n);
  return Status::Ok();
}

Status CpuModel::ForwardMtpBatch(std::span<const MtpChunk> chunks) {
  const int64_t HD = int64_t{config().hc_mult} * config().hidden;
  std::vector<Segment> segments;
  std::vector<int32_t> next;                  // [T] flattened
  std::vector<float> hidden;                  // [T, hc, hidden] flattened
  std::vector<int64_t> logit_rows, stream_rows;
  for (const MtpChunk& ch : chunks) {
    if (ch.state == nullptr) return InvalidArgument("ForwardMtpBatch: a chunk has no state");
    DSINFER_RETURN_IF_ERROR(program_.CheckMtpInputs(ch.next, ch.hidden));
    if (&ch.state->layout() != &layout_)
      return InvalidArgument("ForwardMtp: the sequence state belongs to another model");
    for (const MtpChunk& other : chunks)
      if (&other != &ch && other.state == ch.state)
        return InvalidArgument("ForwardMtpBatch: a sequence appears twice");
    const auto row = static_cast<int64_t>(next.size());
    const auto n = static_cast<int64_t>(ch.next.size());
    segments.push_back({row, n, ch.state->mtp_n_tokens(), ch.state});
    next.insert(next.end(), ch.next.begin(), ch.next.end());
    hidden.insert(hidden.end(), ch.hidden.begin(), ch.hidden.end());
    if (ch.logits != nullptr) logit_rows.push_back(row + n - 1);
    if (ch.last_hidden != nullptr) stream_rows.push_back(row + n - 1);
  }
  if (chunks.empty()) return Status::Ok();
  std::vector<float> logits, streams;  // [logit_rows, vocab], [stream_rows, hc, hidden]
  DSINFER_RETURN_IF_ERROR(program_.MtpRows(ops(), 0, segments, next, hidden, logit_rows, &logits,
                                           stream_rows, &streams));
  const int64_t V = config().vocab_size;
  size_t li = 0, hi = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const MtpChunk& ch = chunks[i];
    if (ch.logits != nullptr) {
      ch.logits->assign(logits.begin() + static_cast<int64_t>(li) * V,
                        logits.begin() + static_cast<int64_t>(li + 1) * V);
      ++li;
    }
    if (ch.last_hidden != nullptr) {
      ch.last_hidden->assign(streams.begin() + static_cast<int64_t>(hi) * HD,
                             streams.begin() + static_cast<int64_t>(hi + 1) * HD);
      ++hi;
    }
    ch.state->AdvanceMtp(segments[i].start_pos + segments[i].n);
  }
  return Status::Ok();
}

Status CpuModel::CheckBatchStates(std::span<SequenceState* const> states) const {
  for (size_t i = 0; i < states.size(); ++i) {
    if (states[i] == nullptr || &states[i]->layout() != &layout_)
      return InvalidArgument("a state of another model (or none)");
    for (size_t j = 0; j < i; ++j)
      if (states[j] == states[i]) return InvalidArgument("a sequence appears twice");
  }
  return Status::Ok();
}

Status CpuModel::UseDraftVocabulary(std::vector<int32_t> ids) {
  DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<model::DraftVocabulary> vocabulary,
                           model::DraftVocabulary::Build(weights_, std::move(ids)));
  ops_.set_draft_vocabulary(vocabulary.get());
  draft_vocabulary_ = std::move(vocabulary);  // the old one, if any, after ops_ stopped reading it
  return Status::Ok();
}

Status CpuModel::DsparkSeedBatch(std::span<SequenceState* const> states,
                                 std::span<const std::span<const float>> hidden,
                                 std::vector<float>* main_x) {
  DSINFER_RETURN_IF_ERROR(CheckDspark());
  DSINFER_RETURN_IF_ERROR(CheckBatchStates(states).WithContext("DsparkSeedBatch"));
  if (states.size() != hidden.size())
    return InvalidArgument("DsparkSeedBatch: one hidden block per state");
  const int64_t K = HiddenWidth();
  std::vector<Segment> segments;
  std::vector<float> all;  // [T, K] flattened
  int64_t row = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    SequenceState* st = states[i];
    const auto n = static_cast<int64_t>(hidden[i].size()) / K;
    if (n == 0 || n * K != static_cast<int64_t>(hidden[i].size()))
      return InvalidArgument("DsparkSeedBatch: hidden must be [n, targets * hidden], n >= 1");
    if (st->mtp_n_tokens() + n > st->n_tokens())
      return InvalidArgument("DsparkSeedBatch: the stages cannot run ahead of the backbone (" +
                             std::to_string(st->mtp_n_tokens() + n) + " > " +
                             std::to_string(st->n_tokens()) + " positions)");
    segments.push_back({row, n, st->mtp_n_tokens(), st});
    all.insert(all.end(), hidden[i].begin(), hidden[i].end());
    row += n;
  }
  if (segments.empty()) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(program_.DsparkSeed(ops(), segments, all, main_x));
  for (const Segment& sg : segments)
    static_cast<SequenceState*>(sg.state)->AdvanceMtp(sg.start_pos + sg.n);
  return Status::Ok();
}

Status CpuModel::DsparkDraftBatch(std::span<SequenceState* const> states,
                                  std::span<const int32_t> tokens,
                                  std::span<std::vector<float>* const> logits,
                                  std::span<std::vector<float>* const> x,
                                  std::span<const int> n_logits) {
  DSINFER_RETURN_IF_ERROR(CheckDspark());
  DSINFER_RETURN_IF_ERROR(CheckBatchStates(states).WithContext("DsparkDraftBatch"));
  const model::ModelConfig& c = config();
  if (tokens.size() != states.size() || logits.size() != states.size() ||
      x.size() != states.size() || (!n_logits.empty() && n_logits.size() != states.size()))
    return InvalidArgument(
        "DsparkDraftBatch: one token, two outputs (and a logits count) per state");
  const int B = c.dspark.block_size;
  std::vector<Segment> segments;
  std::vector<int32_t> ids;  // [T]: per state [token, noise x (B - 1)]
  for (size_t i = 0; i < states.size(); ++i) {
    SequenceState* st = states[i];
    if (st->mtp_n_tokens() != st->n_tokens())
      return InvalidArgument("DsparkDraftBatch: the stage rings hold " +
                             std::to_string(st->mtp_n_tokens()) + " of the backbone's " +
                             std::to_string(st->n_tokens()) + " positions");
    if (logits[i] == nullptr || x[i] == nullptr)
      return InvalidArgument("DsparkDraftBatch: missing output");
    segments.push_back({static_cast<int64_t>(ids.size()), B, st->n_tokens(), st});
    ids.push_back(tokens[i]);
    for (int j = 1; j < B; ++j) ids.push_back(c.dspark.noise_token_id);
  }
  if (segments.empty()) return Status::Ok();
  std::vector<float> all_logits, all_x;  // [sum n_logits, vocab], [T, hidden]
  DSINFER_RETURN_IF_ERROR(
      program_.DsparkDraft(ops(), segments, ids, n_logits, &all_logits, &all_x));
  const int64_t V = c.vocab_size, D = c.hidden;
  int64_t li = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    const int64_t r = segments[i].row, n = n_logits.empty() ? B : n_logits[i];
    logits[i]->assign(all_logits.begin() + li * V, all_logits.begin() + (li + n) * V);
    li += n;
    x[i]->assign(all_x.begin() + r * D, all_x.begin() + (r + B) * D);
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> CpuModel::Export(const SequenceState& state,
                                              std::span<const int32_t> tokens,
                                              int64_t first_page) const {
  if (&state.layout() != &layout_)
    return InvalidArgument("Export: the sequence state belongs to another model");
  return state.Export(tokens, first_page, fingerprint(), numerics_.Name());
}

Result<std::unique_ptr<SequenceState>> CpuModel::Import(std::span<const uint8_t> blob,
                                                        std::span<const int32_t> tokens,
                                                        const SequenceState* base) const {
  return SequenceState::Import(blob, tokens, layout_, pages_, fingerprint(), numerics_.Name(),
                               base);
}

}  // namespace dsinfer::backend::cpu
