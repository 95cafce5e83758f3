#include "runtime/scheduler.h"

#include <algorithm>
#include <string>

namespace dsinfer::runtime {

Status CheckFitsBudget(const KvBudget& kv, int64_t max_context_tokens) {
  const int64_t need = kv.BytesAt(max_context_tokens);
  if (need > kv.capacity())
    return ResourceExhausted("request needs " + std::to_string(need) +
                             " bytes of sequence state, more than the KV budget of " +
                             std::to_string(kv.capacity()) + " bytes");
  return Status::Ok();
}

Scheduler::Scheduler(SchedulerOptions options, KvBudget* kv) : options_(options), kv_(kv) {
  DSINFER_CHECK(kv_ != nullptr && options_.max_num_seqs >= 1 &&
                options_.max_num_batched_tokens >= 1 && options_.checkpoint_tokens >= 0 &&
                options_.max_prompt_logit_rows >= 1);
}

Status Scheduler::Add(const SequenceSpec& spec) {
  if (spec.n_prompt < 1 || spec.max_context < spec.n_prompt || spec.n_draft < 0)
    return InvalidArgument(
        "scheduler: a sequence needs a prompt, max_context >= n_prompt and "
        "n_draft >= 0");
  if (seqs_.count(spec.id) != 0)
    return InvalidArgument("scheduler: sequence " + std::to_string(spec.id) + " already queued");
  DSINFER_RETURN_IF_ERROR(CheckFitsBudget(*kv_, spec.max_context + spec.n_draft));
  Seq s;
  s.spec = spec;
  s.arrival = next_arrival_++;
  s.n_tokens = spec.n_prompt;
  waiting_.insert(s.key());
  seqs_.emplace(spec.id, s);
  return Status::Ok();
}

void Scheduler::Remove(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  running_.erase(it->second.key());
  waiting_.erase(it->second.key());
  planned_.erase(id);
  seqs_.erase(it);
}

// Tokens of s to run from `start`: what remains, within the token budget; while in the prompt,
// ending at the next checkpoint (so the state there can be cached); and with prompt logprobs, no
// more rows than the step has left for them.
int64_t Scheduler::ChunkLength(const Seq& s, int64_t start, const StepBudget& budget) const {
  const int64_t last_prompt = s.spec.n_prompt - 1;
  int64_t n = std::min(s.n_tokens - start, budget.tokens);
  if (options_.checkpoint_tokens > 0 && start < last_prompt) {
    const int64_t block = options_.checkpoint_tokens;
    n = std::min(n, std::min((start / block + 1) * block, last_prompt) - start);
  }
  if (s.spec.prompt_logits) {
    const int64_t first_row = std::max(start, s.logits_done);
    if (first_row < last_prompt) n = std::min(n, first_row + budget.prompt_logit_rows - start);
  }
  return n;
}

// Drafts run only after a sampled token (a decode with something generated), and only as many as
// the token budget has room for: they are an optional speed-up, never worth delaying a step.
int Scheduler::DraftsAt(const Seq& s, int64_t start, int64_t tokens_left) const {
  if (s.n_tokens - start != 1 || s.n_tokens <= s.spec.n_prompt) return 0;
  return static_cast<int>(std::clamp<int64_t>(tokens_left, 0, s.spec.n_draft));
}

bool Scheduler::PlanChunk(const Seq& s, int64_t start, StepBudget& budget, StepPlan& plan) const {
  const int64_t n = ChunkLength(s, start, budget);
  if (n <= 0) return false;
  ScheduledChunk c;
  c.id = s.spec.id;
  c.start = start;
  c.n_tokens = n;
  c.n_draft = DraftsAt(s, start, budget.tokens - n);
  const int64_t end = start + n, last_prompt = s.spec.n_prompt - 1;
  if (s.spec.prompt_logits) {
    for (int64_t p = std::max(start, s.logits_done); p < std::min(end, last_prompt); ++p) {
      c.logit_rows.push_back(static_cast<int32_t>(p - start));
      --budget.prompt_logit_rows;
    }
  }
  c.samples = end == s.n_tokens;
  if (c.samples) c.logit_rows.push_back(static_cast<int32_t>(n - 1));
  for (int d = 0; d < c.n_draft; ++d) c.logit_rows.push_back(static_cast<int32_t>(n + d));
  const int64_t block = options_.checkpoint_tokens;
  c.snapshot_after = block > 0 && s.n_tokens == s.spec.n_prompt && end <= last_prompt &&
                     (end % block == 0 || end == last_prompt);
  budget.tokens -= n + c.n_draft;
  plan.chunks.push_back(std::move(c));
  return true;
}

// Running sequences, FCFS: decodes first (each is one token and a waiting user), then the prefill
// chunks.
void Scheduler::PlanRunning(StepBudget& budget, StepPlan& plan) {
  for (const bool decodes : {true, false}) {
    for (const Key& key : running_) {
      const Seq& s = seqs_.at(key.second);
      if ((s.n_tokens - s.n_computed == 1) != decodes || budget.tokens <= 0) continue;
      if (static_cast<int>(plan.chunks.size()) >= options_.max_num_seqs) break;
      PlanChunk(s, s.n_computed, budget, plan);
    }
  }
}

void Scheduler::Admit(StepBudget& budget, StepPlan& plan) {
  const int64_t capacity = kv_->capacity();
  while (!waiting_.empty() && budget.tokens > 0 &&
         static_cast<int>(plan.chunks.size()) < options_.max_num_seqs &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Seq& s = seqs_.at(waiting_.begin()->second);
    // A (re)admitted sequence needs its whole context's state; it waits while that does not fit.
    const int64_t need = kv_->BytesAt(s.n_tokens);
    if (kv_->UsedBytes() + need > capacity) {
      const int64_t live = kv_->UsedBytes() - kv_->CacheBytes();
      kv_->EvictCacheTo(std::max<int64_t>(0, capacity - need - live));
      if (kv_->UsedBytes() + need > capacity) break;
    }
    const int64_t last_prompt = s.spec.n_prompt - 1;
    const bool needs_prompt_rows = s.spec.prompt_logits && s.logits_done < last_prompt;
    if (needs_prompt_rows && budget.prompt_logit_rows <= 0) break;
    // Positions whose logits are still owed must be computed, not restored.
    const int64_t max_reuse = needs_prompt_rows ? s.logits_done : last_prompt;
    const Result<int64_t> start = kv_->Start(s.spec.id, max_reuse);
    if (!start.ok()) {
      // The device cannot hold another state now (the budget exceeds what it has): wait for the
      // running sequences to finish, or fail this one if nothing runs.
      if (!running_.empty()) break;
      plan.failed.push_back({s.spec.id, start.status()});
      Remove(s.spec.id);
      continue;
    }
    DSINFER_CHECK_MSG(*start >= 0 && *start <= max_reuse, "KvBudget::Start restored too much");
    waiting_.erase(s.key());
    running_.insert(s.key());
    s.n_computed = *start;
    plan.admitted.push_back({s.spec.id, *start});
    DSINFER_CHECK(PlanChunk(s, *start, budget, plan));  // token and row budgets were checked
  }
}

void Scheduler::Preempt(Seq& victim, StepPlan& plan) {
  const SeqId id = victim.spec.id;
  std::erase_if(plan.chunks, [id](const ScheduledChunk& c) { return c.id == id; });
  std::erase_if(plan.admitted, [id](const Admission& a) { return a.id == id; });
  kv_->Release(id);
  plan.preempted.push_back(id);
  running_.erase(victim.key());
  waiting_.insert(victim.key());
  victim.n_computed = 0;
  ++preemptions_;
}

// The step's state growth must fit: evict cached prefixes, then preempt the newest running
// sequences (their tokens are kept and recomputed on readmission).
void Scheduler::FitGrowth(StepPlan& plan) {
  const int64_t capacity = kv_->capacity();
  auto growth = [&] {
    int64_t g = 0;
    for (const ScheduledChunk& c : plan.chunks)
      g += kv_->BytesAt(c.start + c.n_tokens + c.n_draft) - kv_->BytesAt(c.start);
    return g;
  };
  while (!plan.chunks.empty()) {
    const int64_t over = kv_->UsedBytes() + growth() - capacity;
    if (over <= 0) break;
    const int64_t cached = kv_->CacheBytes();
    if (cached > 0) {
      kv_->EvictCacheTo(std::max<int64_t>(0, cached - over));
      if (kv_->CacheBytes() < cached) continue;
    }
    if (running_.size() <= 1) break;  // admission guaranteed that a lone sequence fits
    Preempt(seqs_.at(running_.rbegin()->second), plan);
  }
}

StepPlan Scheduler::Schedule() {
  DSINFER_CHECK_MSG(!awaiting_update_, "Scheduler::Schedule before the last plan's Update");
  StepPlan plan;
  StepBudget budget{options_.max_num_batched_tokens, options_.max_prompt_logit_rows};
  PlanRunning(budget, plan);
  Admit(budget, plan);
  FitGrowth(plan);
  for (const ScheduledChunk& c : plan.chunks) planned_.emplace(c.id, c);
  awaiting_update_ = true;
  return plan;
}

Status Scheduler::CheckOutcome(const SequenceOutcome& o) const {
  const std::string who = "scheduler: outcome of sequence " + std::to_string(o.id);
  if (o.forked_from.has_value()) {
    if (seqs_.count(*o.forked_from) == 0 || seqs_.count(o.id) != 0)
      return InvalidArgument(who + ": a fork needs a known parent and a new id");
    if (o.finished || o.n_computed < 1 || o.n_computed > o.n_tokens ||
        o.n_tokens < seqs_.at(*o.forked_from).spec.n_prompt)
      return InvalidArgument(who + ": a fork is a live copy of its parent's state");
    return Status::Ok();
  }
  auto chunk = planned_.find(o.id);
  if (chunk == planned_.end()) return InvalidArgument(who + ": not in the plan");
  if (o.finished) return Status::Ok();
  const ScheduledChunk& c = chunk->second;
  if (o.n_computed < c.start || o.n_computed > c.start + c.n_tokens + c.n_draft ||
      o.n_tokens < seqs_.at(o.id).n_tokens || o.n_computed > o.n_tokens)
    return InvalidArgument(who + ": counts outside what its chunk allows");
  return Status::Ok();
}

Status Scheduler::CheckResult(const StepResult& result) const {
  std::set<SeqId> reported;
  for (const SequenceOutcome& o : result.sequences) {
    DSINFER_RETURN_IF_ERROR(CheckOutcome(o));
    if (!reported.insert(o.id).second)
      return InvalidArgument("scheduler: two outcomes for sequence " + std::to_string(o.id));
  }
  for (const auto& [id, chunk] : planned_)
    if (reported.count(id) == 0)
      return InvalidArgument("scheduler: no outcome for planned sequence " + std::to_string(id));
  return Status::Ok();
}

void Scheduler::Apply(const SequenceOutcome& o) {
  Seq& s = seqs_.at(o.id);
  if (o.finished) {
    Remove(o.id);
    return;
  }
  const ScheduledChunk& c = planned_.at(o.id);
  s.n_computed = o.n_computed;
  s.n_tokens = o.n_tokens;
  if (s.spec.prompt_logits)
    s.logits_done = std::max(s.logits_done, std::min(c.start + c.n_tokens, s.spec.n_prompt - 1));
}

Status Scheduler::Update(const StepResult& result) {
  if (!awaiting_update_) return FailedPrecondition("scheduler: Update without a plan");
  DSINFER_RETURN_IF_ERROR(CheckResult(result));
  // Forks first: they copy their parent's spec, which a finished parent takes with it.
  for (const SequenceOutcome& o : result.sequences) {
    if (!o.forked_from.has_value()) continue;
    Seq child = seqs_.at(*o.forked_from);
    child.spec.id = o.id;
    child.n_computed = o.n_computed;
    child.n_tokens = o.n_tokens;
    running_.insert(child.key());
    seqs_.emplace(o.id, child);
  }
  for (const SequenceOutcome& o : result.sequences)
    if (!o.forked_from.has_value()) Apply(o);
  planned_.clear();
  awaiting_update_ = false;
  return Status::Ok();
}

}  // namespace dsinfer::runtime
