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
#include <cmath>
#include <optional>

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

namespace {

// One sequence's drafting in a batched AdvanceDrafts.
struct Drafting {
  engine_detail::Sequence* seq = nullptr;
  int64_t n = 0;     // backbone positions (the MTP stream is rolled back to them at the end)
  int64_t want = 0;  // drafts to propose
  std::vector<float> logits, streams;  // [vocab], [hc, hidden] of the MTP block's last row
  std::vector<int32_t> generated;      // as if the drafts so far were emitted
};

}  // namespace

std::optional<Engine::Impl::DraftStart> Engine::Impl::StartDrafting(const DraftJob& job) {
  Sequence& s = *job.seq;
  s.drafts.clear();
  s.draft_dists.clear();
  if (s.finished || s.state == nullptr) return std::nullopt;
  const ScheduledChunk& c = *job.run->plan;
  // Rejected draft positions go; the accepted ones stay computed.
  const int64_t keep = c.start + c.n_tokens + job.run->n_accepted;
  if (s.state->n_tokens() > keep) {
    const Status st = model->Truncate(*s.state, keep);
    if (!st.ok()) {
      Finish(s, FinishReason::kError, st.WithContext("speculative decoding"));
      return std::nullopt;
    }
  }
  const int64_t m = model->MtpTokens(*s.state), n = s.state->n_tokens();
  const auto n_context = static_cast<int64_t>(s.tokens.size());
  if (m < c.start || m > n || n >= n_context) {
    Finish(s, FinishReason::kError,
           Internal("speculative decoding: the drafter's stream (" + std::to_string(m) +
                    " positions) does not follow the step (" + std::to_string(c.start) + " .. " +
                    std::to_string(n) + ")"));
    return std::nullopt;
  }
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
  return DraftStart{.m = m, .n = n, .want = std::max<int64_t>(want, 0)};
}

void Engine::Impl::AdvanceDrafts(std::span<const DraftJob> jobs) {
  if (dspark) return AdvanceDsparkDrafts(jobs);
  const int64_t HD = int64_t{weights.config().hc_mult} * weights.config().hidden;
  std::vector<Drafting> active;
  std::vector<backend::MtpRun> runs;
  active.reserve(jobs.size());
  for (const DraftJob& job : jobs) {
    const std::optional<DraftStart> start = StartDrafting(job);
    if (!start) continue;
    const auto [m, n, want] = *start;
    if (m == n) continue;  // nothing new: no logits to draft from
    Sequence& s = *job.seq;
    const ScheduledChunk& c = *job.run->plan;
    active.push_back({.seq = &s, .n = n, .want = want});
    runs.push_back({.state = s.state.get(),
                    .hidden = std::span<const float>(job.run->out.hidden)
                                  .subspan((m - c.start) * HD, (n - m) * HD),
                    .next = std::span<const int32_t>(s.tokens).subspan(m + 1, n - m)});
  }
  // Output pointers once `active` no longer grows.
  for (size_t i = 0; i < active.size(); ++i) {
    runs[i].logits = active[i].want > 0 ? &active[i].logits : nullptr;
    runs[i].last_hidden = active[i].want > 1 ? &active[i].streams : nullptr;
  }
  const auto fail_all = [&](const Status& st) {
    for (Drafting& d : active) {
      d.seq->drafts.clear();
      d.seq->draft_dists.clear();
      Finish(*d.seq, FinishReason::kError, st.WithContext("speculative decoding"));
    }
  };
  if (const Status st = model->ForwardMtpBatch(runs); !st.ok()) return fail_all(st);
  // Draft position j for every sequence that wants more than j drafts: sample from the last
  // logits, then (if another follows) one chained MTP position for all of them at once.
  int64_t most = 0;
  for (Drafting& d : active) {
    most = std::max(most, d.want);
    d.generated = d.seq->generated;
  }
  std::vector<int32_t> prev(active.size());  // [active] each chained run's input token
  std::vector<std::vector<float>> inputs(active.size());  // [active][hc, hidden]
  for (int64_t j = 0; j < most; ++j) {
    runs.clear();
    for (size_t i = 0; i < active.size(); ++i) {
      Drafting& d = active[i];
      if (d.want <= j) continue;
      Sequence& s = *d.seq;
      const SamplingParams sp = SamplerOf(s);
      TokenDistribution q = SamplingDistribution(AdjustedLogits(s, d.logits, d.generated), sp);
      const int32_t draft = SampleFrom(q, UniformFromCounter(DraftSeed(sp), 3 * d.generated.size()));
      s.drafts.push_back(draft);
      s.draft_dists.push_back(std::move(q));
      d.generated.push_back(draft);
      if (j + 1 < d.want) {
        prev[i] = draft;
        inputs[i] = d.streams;
        runs.push_back({.state = s.state.get(),
                        .hidden = inputs[i],
                        .next = std::span<const int32_t>(&prev[i], 1),
                        .logits = &d.logits,
                        .last_hidden = j + 2 < d.want ? &d.streams : nullptr});
      }
    }
    if (runs.empty()) break;
    if (const Status st = model->ForwardMtpBatch(runs); !st.ok()) return fail_all(st);
  }
  // The chained positions read the MTP block's own streams, not the target's: gone again.
  for (Drafting& d : active) {
    if (model->MtpTokens(*d.seq->state) <= d.n) continue;
    if (const Status st = model->TruncateMtp(*d.seq->state, d.n); !st.ok()) {
      d.seq->drafts.clear();
      d.seq->draft_dists.clear();
      Finish(*d.seq, FinishReason::kError, st.WithContext("speculative decoding"));
    }
  }
}

void Engine::Impl::AdvanceDsparkDrafts(std::span<const DraftJob> jobs) {
  const model::ModelConfig& c = weights.config();
  const int64_t K = model->HiddenWidth(), D = c.hidden, V = c.vocab_size;
  struct Dspark {
    Sequence* seq = nullptr;
    int64_t want = 0;
    std::vector<float> logits, x;    // [want, vocab] before the Markov bias, [block, hidden]
    std::vector<int32_t> generated;  // as if the drafts so far were emitted
  };
  std::vector<Dspark> active;
  std::vector<backend::DsparkSeedRun> seeds;
  std::vector<Sequence*> seeding;  // the sequences of `seeds`
  active.reserve(jobs.size());
  for (const DraftJob& job : jobs) {
    const std::optional<DraftStart> start = StartDrafting(job);
    if (!start) continue;
    const auto [m, n, want] = *start;
    Sequence& s = *job.seq;
    // The stages' rings take the positions the backbone computed since they last did.
    if (m < n) {
      seeds.push_back({.state = s.state.get(),
                       .hidden = std::span<const float>(job.run->out.hidden)
                                     .subspan((m - job.run->plan->start) * K, (n - m) * K)});
      seeding.push_back(&s);
    }
    if (want > 0) active.push_back({.seq = &s, .want = want});
  }
  const auto fail = [&](std::span<Sequence* const> failed, const Status& st) {
    for (Sequence* s : failed) {
      s->drafts.clear();
      s->draft_dists.clear();
      if (!s->finished) Finish(*s, FinishReason::kError, st.WithContext("speculative decoding"));
    }
  };
  if (const Status st = model->DsparkSeed(seeds); !st.ok()) return fail(seeding, st);
  if (active.empty()) return;
  // One draft block per sequence, all in one pass over the stages' weights.
  std::vector<backend::DsparkDraftRun> blocks;
  std::vector<Sequence*> drafting;
  for (Dspark& d : active) {
    Sequence& s = *d.seq;
    blocks.push_back({.state = s.state.get(),
                      .token = s.tokens[s.state->n_tokens()],
                      .n_logits = static_cast<int>(d.want),  // the rows after stay unread
                      .logits = &d.logits,
                      .x = &d.x});
    drafting.push_back(&s);
    d.generated = s.generated;
  }
  if (const Status st = model->DsparkDraft(blocks); !st.ok()) return fail(drafting, st);
  // Row j's Markov bias needs the token before it (the pending token, then each draft): one
  // batched call per position over the sequences still drafting. A sequence stops at the first
  // row whose confidence is under the threshold: drafts it would likely lose cost verify rows.
  int64_t most = 0;
  for (const Dspark& d : active) most = std::max(most, d.want);
  std::vector<float> bias, confidence;
  for (int64_t j = 0; j < most; ++j) {
    std::vector<Dspark*> rows;
    std::vector<int32_t> prev;
    std::vector<float> x;  // [rows, hidden]
    for (Dspark& d : active) {
      if (d.want <= j || static_cast<int64_t>(d.seq->drafts.size()) < j) continue;
      rows.push_back(&d);
      prev.push_back(j == 0 ? d.seq->tokens[d.seq->state->n_tokens()] : d.seq->drafts.back());
      x.insert(x.end(), d.x.begin() + j * D, d.x.begin() + (j + 1) * D);
    }
    if (rows.empty()) break;
    if (const Status st = model->DsparkMarkov(prev, x, &bias, &confidence); !st.ok())
      return fail(drafting, st);
    for (size_t i = 0; i < rows.size(); ++i) {
      Dspark& d = *rows[i];
      const double p = 1.0 / (1.0 + std::exp(-static_cast<double>(confidence[i])));
      if (p < options.draft_min_confidence) continue;  // no draft here, nor after
      Sequence& s = *d.seq;
      std::vector<float> logits(d.logits.begin() + j * V, d.logits.begin() + (j + 1) * V);
      for (int64_t v = 0; v < V; ++v) logits[v] += bias[i * V + v];
      const SamplingParams sp = SamplerOf(s);
      TokenDistribution q = SamplingDistribution(AdjustedLogits(s, logits, d.generated), sp);
      const int32_t draft =
          SampleFrom(q, UniformFromCounter(DraftSeed(sp), 3 * d.generated.size()));
      s.drafts.push_back(draft);
      s.draft_dists.push_back(std::move(q));
      d.generated.push_back(draft);
    }
  }
}

}  // namespace dsinfer::runtime
