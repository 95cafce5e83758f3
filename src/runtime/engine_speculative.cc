// Speculative decoding in the engine (runtime/engine.h, EngineOptions::speculative_tokens): the
// checkpoint's MTP block proposes up to k tokens per sequence, chained on its own final streams;
// the next step runs them after the sequence's pending token in the same batched forward as
// every other chunk; the rejection rule (runtime/speculative.h) accepts a prefix and draws the
// token after it; the rejected positions are rolled back (ModelRunner::Truncate) and the MTP
// block catches up on the positions the target computed.
//
// The MTP stream: position p reads the target's final streams at p and the token at p + 1, and
// predicts the token at p + 2. After each step it holds exactly the positions the backbone holds
// (the last one reads the newest token, and its logits give the first draft); draft positions
// chained past it are rolled back at once (ModelRunner::TruncateMtp).
//
// Random numbers: the token at generated index g, when drawn without a draft, uses the sampler's
// own number (seed, g) as without speculation; a draft at g uses (seed', 3g), its acceptance
// (seed', 3g + 1) and the residual draw (seed', 3g + 2). Each position is decided once, by numbers
// no earlier decision used, so the output has the target's distribution and is reproducible.
#include <algorithm>

#include "runtime/engine_impl.h"

namespace dsinfer::runtime {

namespace {

// The seed of the speculative draws, apart from the sampler's own.
uint64_t DraftSeed(const SamplingParams& sp) { return sp.seed ^ 0x5bd1e9955bd1e995ull; }

}  // namespace

std::vector<engine_detail::Draw> Engine::Impl::VerifyDrafts(const Sequence& s, ChunkRun& r) const {
  const int64_t vocab = weights.config().vocab_size;
  const auto first_row = static_cast<int32_t>(r.plan->n_tokens - 1);
  const SamplingParams sp = SamplerOf(s);
  const uint64_t seed = DraftSeed(sp);
  std::vector<int32_t> generated = s.generated;  // as if the drafts accepted so far were emitted
  std::vector<Draw> draws;
  r.n_accepted = 0;
  for (int j = 0; j <= r.n_draft; ++j) {
    const std::span<const float> raw = r.Row(first_row + j, vocab);
    const std::vector<float> logits = AdjustedLogits(s, raw, generated);
    const uint64_t g = generated.size();
    int32_t token = 0;
    bool accepted = false;
    if (j < r.n_draft) {
      const DraftVerdict v =
          VerifyDraft(SamplingDistribution(logits, sp), s.draft_dists[j], s.drafts[j],
                      UniformFromCounter(seed, 3 * g + 1), UniformFromCounter(seed, 3 * g + 2));
      token = v.token;
      accepted = v.accepted;
    } else {
      token = runtime::Sample(logits, sp, g);  // after every draft: as without speculation
    }
    draws.push_back(DrawOf(s, raw, token));
    generated.push_back(token);
    if (!accepted) break;
    ++r.n_accepted;
  }
  return draws;
}

void Engine::Impl::CountSpeculation(const ChunkRun& r) {
  if (r.n_draft == 0) return;
  ++spec_stats.num_drafts;
  spec_stats.num_draft_tokens += r.n_draft;
  spec_stats.num_accepted_tokens += r.n_accepted;
  for (int i = 0; i < r.n_accepted; ++i) ++spec_stats.num_accepted_tokens_per_pos[i];
}

void Engine::Impl::AdvanceDrafts(Sequence& s, const ChunkRun& run) {
  s.drafts.clear();
  s.draft_dists.clear();
  if (s.finished || s.state == nullptr) return;
  const Status st = ProposeDrafts(s, run);
  if (!st.ok()) Finish(s, FinishReason::kError, st.WithContext("speculative decoding"));
}

Status Engine::Impl::ProposeDrafts(Sequence& s, const ChunkRun& run) {
  const ScheduledChunk& c = *run.plan;
  // Rejected draft positions go; the accepted ones stay computed.
  const int64_t keep = c.start + c.n_tokens + run.n_accepted;
  if (s.state->n_tokens() > keep) DSINFER_RETURN_IF_ERROR(model->Truncate(*s.state, keep));
  const int64_t m = model->MtpTokens(*s.state), n = s.state->n_tokens();
  const auto n_context = static_cast<int64_t>(s.tokens.size());
  if (m < c.start || m > n || n >= n_context)
    return Internal("the MTP stream (" + std::to_string(m) +
                    " positions) does not follow the step (" + std::to_string(c.start) + " .. " +
                    std::to_string(n) + ")");
  // Drafts only while waiting for the next token, and no more than can still be emitted.
  const RequestParams& p = s.req->params;
  int64_t want = 0;
  // A sample with a grammar is not drafted for: its drafts would need the grammar's mask at
  // every draft position (and a rollback of the matcher on rejection).
  if (n_context == n + 1 && s.matcher == nullptr) {
    want = std::min<int64_t>(options.speculative_tokens,
                             p.max_tokens - static_cast<int64_t>(s.generated.size()) - 1);
    if (options.max_model_len > 0) want = std::min(want, options.max_model_len - n_context - 1);
  }
  if (m == n) return Status::Ok();  // nothing new: no logits to draft from
  const int64_t HD = int64_t{weights.config().hc_mult} * weights.config().hidden;
  const std::span<const float> hidden =
      std::span<const float>(run.out.hidden).subspan((m - c.start) * HD, (n - m) * HD);
  const std::span<const int32_t> next = std::span<const int32_t>(s.tokens).subspan(m + 1, n - m);
  std::vector<float> logits, streams;  // [vocab], [hc, hidden]
  DSINFER_RETURN_IF_ERROR(model->ForwardMtp(*s.state, hidden, next, want > 0 ? &logits : nullptr,
                                            want > 1 ? &streams : nullptr));
  if (want <= 0) return Status::Ok();
  const SamplingParams sp = SamplerOf(s);
  const uint64_t seed = DraftSeed(sp);
  std::vector<int32_t> generated = s.generated;
  for (int64_t j = 0; j < want; ++j) {
    if (j > 0) {
      const std::vector<float> in = streams;
      const int32_t prev = s.drafts.back();
      DSINFER_RETURN_IF_ERROR(model->ForwardMtp(*s.state, in, std::span<const int32_t>(&prev, 1),
                                                &logits, j + 1 < want ? &streams : nullptr));
    }
    TokenDistribution q = SamplingDistribution(AdjustedLogits(s, logits, generated), sp);
    const int32_t draft = SampleFrom(q, UniformFromCounter(seed, 3 * generated.size()));
    s.drafts.push_back(draft);
    s.draft_dists.push_back(std::move(q));
    generated.push_back(draft);
  }
  // The chained positions read the MTP block's own streams, not the target's: gone again.
  if (model->MtpTokens(*s.state) > n) DSINFER_RETURN_IF_ERROR(model->TruncateMtp(*s.state, n));
  return Status::Ok();
}

}  // namespace dsinfer::runtime
