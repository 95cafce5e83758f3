// What a step gives each sequence: the token draws (sampling, logprobs) and prompt logprobs,
// computed on the runner's idle threads as pure functions of their sequence, then applied on the
// engine thread in batch order: n > 1 forks, stop and length checks, usage, stream events.
#include <algorithm>
#include <cmath>
#include <future>
#include <system_error>

#include "runtime/engine_impl.h"

namespace dsinfer::runtime {

namespace {

uint64_t SampleSeed(uint64_t seed, int index) {
  return seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index);
}

}  // namespace

StreamEvent Engine::Impl::NewEvent(Sequence& s) {
  StreamEvent ev;
  ev.index = s.index;
  ev.queued_at = s.req->queued_at;
  ev.scheduled_at = s.req->scheduled_at;
  if (!s.req->any_event) {
    ev.prompt_logprobs = std::move(s.req->prompt_logprobs);
    ev.exported_state = s.req->exported_state;
    ev.export_status = s.req->export_status;
  }
  s.req->any_event = true;
  return ev;
}

void Engine::Impl::Finish(Sequence& s, FinishReason reason, Status error) {
  StreamEvent ev = NewEvent(s);
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = std::move(error);
  ev.usage = s.req->usage;
  s.req->n_live--;
  ++finished_by_reason[FinishReasonName(reason)];
  s.req->stream->Push(std::move(ev));
  s.state.reset();
  s.finished = true;
}

void Engine::Impl::Sample(Sequence& s, std::span<const float> raw) {
  const RequestParams& p = s.req->params;
  // n > 1: the prompt was computed once; fork the other samples from its state now.
  if (Forks(s)) {
    s.forked = true;
    for (int i = 1; i < p.n; ++i) {
      auto copy = std::make_unique<Sequence>();
      copy->id = next_id++;
      copy->req = s.req;
      copy->index = i;
      auto state = model->Copy(*s.state);
      if (!state.ok()) {  // no device memory for this sample's copy: it fails, the others go on
        Finish(*copy, FinishReason::kError, state.status());
        continue;
      }
      copy->state = std::move(state).value();
      copy->tokens = s.tokens;
      copy->n_prompt = s.n_prompt;
      copy->forked = true;
      TakeMatcher(*copy, i);
      Sequence& c = *copy;
      seqs.emplace(c.id, std::move(copy));
      forks.emplace_back(c.id, s.id);
      Sample(c, raw);
    }
  }
  Emit(s, DrawToken(s, raw));
}

std::vector<float> Engine::Impl::AdjustedLogits(const Sequence& s, std::span<const float> raw,
                                                std::span<const int32_t> generated) const {
  const RequestParams& p = s.req->params;
  std::vector<float> logits(raw.begin(), raw.end());
  std::vector<int32_t> banned;
  const int eos = weights.config().eos_token_id;
  if (static_cast<int>(generated.size()) < p.min_tokens) {
    banned = p.stop_token_ids;
    if (!p.ignore_eos) banned.push_back(eos);
  }
  LogitsAdjustments adj{p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
                        &p.logit_bias, &banned};
  AdjustLogits(logits, adj, std::span<const int32_t>(s.tokens.data(), s.n_prompt), generated);
  return logits;
}

SamplingParams Engine::Impl::SamplerOf(const Sequence& s) const {
  SamplingParams sp = s.req->params.sampling;
  sp.seed = SampleSeed(s.req->seed, s.index);
  return sp;
}

void Engine::Impl::TakeMatcher(Sequence& s, int index) {
  auto& matchers = s.req->matchers;
  if (index >= static_cast<int>(matchers.size()) || matchers[index] == nullptr) return;
  s.matcher = std::move(matchers[index]);
  s.grammar_active = s.req->params.grammar_after_token < 0;
}

std::future<void> Engine::Impl::StartMaskFill(std::vector<ChunkRun>& batch) const {
  std::vector<ChunkRun*> runs;
  for (ChunkRun& r : batch)
    if (r.plan->samples && r.plan->n_draft == 0 && r.seq->constrained() && !Forks(*r.seq))
      runs.push_back(&r);
  if (runs.empty()) return {};
  const int32_t words = grammar::BitmaskWords(weights.config().vocab_size);
  try {
    return std::async(std::launch::async, [runs = std::move(runs), words] {
      for (ChunkRun* r : runs) {
        r->mask.bits.assign(static_cast<size_t>(words), 0u);
        r->mask.status = r->seq->matcher->FillNextTokenBitmask(r->mask.bits);
        r->mask.filled = true;
      }
    });
  } catch (const std::system_error&) {
    return {};  // no thread to spare: the draws fill their masks themselves
  }
}

engine_detail::Draw Engine::Impl::DrawToken(const Sequence& s, std::span<const float> raw,
                                            const GrammarMask* mask) const {
  std::vector<float> logits = AdjustedLogits(s, raw, s.generated);
  if (s.constrained()) {
    // bitmask: [BitmaskWords(vocab)] u32, the tokens the grammar allows next.
    std::vector<uint32_t> filled;
    if (mask == nullptr || !mask->filled) {
      filled.resize(grammar::BitmaskWords(static_cast<int32_t>(raw.size())));
      if (Status st = s.matcher->FillNextTokenBitmask(filled); !st.ok()) return {.error = st};
    } else if (!mask->status.ok()) {
      return {.error = mask->status};
    }
    const std::vector<uint32_t>& bitmask = filled.empty() ? mask->bits : filled;
    std::vector<float> masked = logits;
    grammar::ApplyBitmask(masked, bitmask);
    // The grammar wins over min_tokens bans and -inf logit biases: when they leave no token it
    // allows, its tokens are drawn from the unadjusted logits (the output must stay valid).
    const auto finite = [](const std::vector<float>& v) {
      return std::any_of(v.begin(), v.end(), [](float x) { return x > -HUGE_VALF; });
    };
    if (!finite(masked)) {
      masked.assign(raw.begin(), raw.end());
      grammar::ApplyBitmask(masked, bitmask);
      if (!finite(masked)) return {.error = Internal("the grammar allows no token")};
    }
    logits = std::move(masked);
  }
  return DrawOf(s, raw, runtime::Sample(logits, SamplerOf(s), s.generated.size()));
}

engine_detail::Draw Engine::Impl::DrawOf(const Sequence& s, std::span<const float> raw,
                                         int32_t token) const {
  const RequestParams& p = s.req->params;
  Draw draw;
  draw.token = token;
  if (p.top_logprobs >= 0) {
    draw.has_logprob = true;
    draw.logprob.token = draw.token;
    double log_normalizer = 0.0;
    draw.logprob.logprob = LogprobOf(raw, draw.token, &log_normalizer);
    draw.logprob.top = TopLogprobs(raw, p.top_logprobs, &log_normalizer);
  }
  return draw;
}

TokenLogprob Engine::Impl::PromptLogprob(const Sequence& s, int64_t position,
                                         std::span<const float> raw) const {
  TokenLogprob lp;
  lp.token = s.tokens[position + 1];
  double log_normalizer = 0.0;
  lp.logprob = LogprobOf(raw, lp.token, &log_normalizer);
  lp.top = TopLogprobs(raw, s.req->params.prompt_logprobs, &log_normalizer);
  return lp;
}

void Engine::Impl::Emit(Sequence& s, Draw draw) {
  const RequestParams& p = s.req->params;
  const int eos = weights.config().eos_token_id;
  const int32_t tok = draw.token;
  if (!draw.error.ok()) return Finish(s, FinishReason::kError, std::move(draw.error));
  bool grammar_done = false;
  if (s.constrained()) {
    // The token came from the grammar's mask, so the matcher takes it; if it does not, the
    // output would leave the grammar: the sample fails instead of emitting it.
    if (!s.matcher->AcceptToken(tok))
      return Finish(s, FinishReason::kError,
                    Internal("token " + std::to_string(tok) + " is outside the grammar"));
    grammar_done = s.matcher->IsTerminated();  // its stop token (EOS) after a complete output
  } else if (s.matcher != nullptr && tok == p.grammar_after_token) {
    s.grammar_active = true;  // the reasoning ended: the grammar applies from the next token
  }

  StreamEvent ev = NewEvent(s);
  bool is_stop =
      grammar_done || (!p.ignore_eos && tok == eos) ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
  s.req->usage.completion_tokens++;
  ++generation_tokens;
  s.generated.push_back(tok);
  if (!is_stop) {
    ev.tokens.push_back(tok);
    if (draw.has_logprob) ev.logprobs.push_back(std::move(draw.logprob));
  }
  int64_t total_len = static_cast<int64_t>(s.tokens.size()) + 1;
  bool length = static_cast<int>(s.generated.size()) >= p.max_tokens ||
                (options.max_model_len > 0 && total_len >= options.max_model_len);
  ev.usage = s.req->usage;
  if (is_stop || length) {
    ev.finished = true;
    ev.finish_reason = is_stop ? FinishReason::kStop : FinishReason::kLength;
    s.req->n_live--;
    ++finished_by_reason[FinishReasonName(ev.finish_reason)];
    s.state.reset();
    s.finished = true;
  } else {
    s.tokens.push_back(tok);
  }
  s.req->stream->Push(std::move(ev));
}

void Engine::Impl::DrawAndEmit(std::vector<ChunkRun>& batch) {
  const int64_t vocab = weights.config().vocab_size;
  // One job per prompt-logprob row and per sampling row, but for forking sequences (their draws
  // stay on this thread). slot: the row's place in run->prompt_logprobs, -1 for the draw.
  struct Job {
    ChunkRun* run;
    int32_t row;
    int64_t slot;
  };
  std::vector<Job> jobs;
  for (ChunkRun& r : batch) {
    const ScheduledChunk& c = *r.plan;
    for (int32_t row : c.logit_rows) {
      if (c.start + row < r.seq->n_prompt - 1) {
        jobs.push_back({&r, row, static_cast<int64_t>(r.prompt_logprobs.size())});
        r.prompt_logprobs.emplace_back();
      } else if (c.samples && row == c.n_tokens - 1 && !Forks(*r.seq)) {
        jobs.push_back({&r, row, -1});
      }
    }
  }
  model->ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t k) {
    ChunkRun& r = *jobs[k].run;
    const std::span<const float> logits = r.Row(jobs[k].row, vocab);
    if (jobs[k].slot >= 0)
      r.prompt_logprobs[jobs[k].slot] = PromptLogprob(*r.seq, r.plan->start + jobs[k].row, logits);
    else if (r.n_draft > 0)
      r.draws = VerifyDrafts(*r.seq, r);
    else
      r.draws = {DrawToken(*r.seq, logits, &r.mask)};
  });
  std::vector<DraftJob> drafting;  // every sampled sequence (and fork) drafts after its tokens
  for (ChunkRun& r : batch) {
    auto& prompt_logprobs = r.seq->req->prompt_logprobs;
    for (TokenLogprob& lp : r.prompt_logprobs) prompt_logprobs.push_back(std::move(lp));
    if (!r.plan->samples) continue;
    if (!r.draws.empty()) {
      // Accepted tokens one by one, as without speculation: each is checked for stop and length,
      // and none is emitted after the sequence finished.
      CountSpeculation(r);
      for (Draw& d : r.draws) {
        if (r.seq->finished) break;
        Emit(*r.seq, std::move(d));
      }
    } else {
      const size_t first_fork = forks.size();
      Sample(*r.seq, r.Row(static_cast<int32_t>(r.plan->n_tokens - 1), vocab));
      if (speculative())
        for (size_t f = first_fork; f < forks.size(); ++f)
          drafting.push_back({seqs.at(forks[f].first).get(), &r});
    }
    if (speculative()) drafting.push_back({r.seq, &r});
  }
  if (!drafting.empty()) AdvanceDrafts(drafting);
}

}  // namespace dsinfer::runtime
