// The step scheduler: decides WHAT the engine runs each step (which sequences, how many of their
// tokens, which rows come back as logits, how many draft positions) under the token, sequence and
// KV-byte budgets, and which sequences to preempt by recompute. It never sees runner states,
// token ids, sampling or streams: a sequence is a handful of counts, and memory is the KvBudget
// interface the engine implements (runner states, their pages and the prefix cache today; a KV
// manager can take its place without touching the policy). Engine-thread only.
//
// One engine step:
//   StepPlan plan = scheduler.Schedule();  // starts admitted states and releases preempted ones
//                                          // through the KvBudget as it decides
//   finish plan.failed; run plan.chunks in one batched forward; draw tokens; emit;
//   scheduler.Update(result);              // every chunk's outcome, and any forks
//
// Policy (unchanged from the engine's former inline loop):
// - Running sequences in arrival order (FCFS): decodes (one context token left) first, then
//   prefill chunks, then admissions from the waiting queue in arrival order, all under
//   max_num_batched_tokens and max_num_seqs. A prompt chunk ends at the next prefix-cache
//   checkpoint (every checkpoint_tokens prompt tokens and one token before the prompt's end) so
//   the state there can be cached.
// - Admission: the head of the queue is admitted when its whole context fits in the budget next
//   to what is in use (cached prefixes are evicted first); otherwise admission stops there, so a
//   large old request is never overtaken by small new ones. Its state is started at once (so
//   what is in use stays exact for the next decision), restored from a cached prefix if any.
// - Growth: when the step's state growth (every chunk, drafts included) would overflow the
//   budget, cached prefixes are evicted, then the newest running sequences are preempted (state
//   released, tokens kept, recomputed on readmission, which is FCFS again), an admission of the
//   same step included.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsinfer::runtime {

using SeqId = uint64_t;

// The memory the scheduler budgets: sequence states and the prefix cache. capacity() and
// BytesAt() are pure functions of the model and the options (callable from any thread: Submit
// checks with them); the rest is called from the engine thread during Schedule().
class KvBudget {
 public:
  virtual ~KvBudget() = default;
  // Bytes for every sequence state plus the prefix cache.
  virtual int64_t capacity() const = 0;
  // An upper bound of one sequence's state after n_tokens tokens; non-decreasing in n_tokens.
  virtual int64_t BytesAt(int64_t n_tokens) const = 0;
  // Bytes in use now: every live state (shared pages once) plus the cache.
  virtual int64_t UsedBytes() const = 0;
  // The evictable part of UsedBytes (cached prefixes), and evicting down to at most `bytes`.
  virtual int64_t CacheBytes() const = 0;
  virtual void EvictCacheTo(int64_t bytes) = 0;
  // Admission: creates id's state, restored from the longest cached prefix of its context of at
  // most max_reuse tokens when there is one; returns the tokens it holds (0: fresh). An error
  // (the device has no room for another state) creates nothing.
  virtual Result<int64_t> Start(SeqId id, int64_t max_reuse) = 0;
  // Preemption: drops id's state (its tokens stay with the engine).
  virtual void Release(SeqId id) = 0;
};

// ResourceExhausted when a sequence whose context can reach max_context_tokens could never fit in
// the budget, even alone. Thread-safe (pure KvBudget calls only).
Status CheckFitsBudget(const KvBudget& kv, int64_t max_context_tokens);

struct SchedulerOptions {
  int max_num_seqs = 64;                  // sequences per step (and running at once)
  int64_t max_num_batched_tokens = 2048;  // tokens per step: context tokens + draft positions
  int64_t checkpoint_tokens = 0;          // prefix-cache checkpoint spacing; 0: no prefix cache
  // Prompt-logprob rows per step: the logits buffer is rows x vocab floats (129,280 x 4 bytes a
  // row on V4), so a long prompt's rows come in chunks of at most this many.
  int64_t max_prompt_logit_rows = 256;
};

// A sequence as the scheduler sees it when it arrives.
struct SequenceSpec {
  SeqId id = 0;
  int64_t n_prompt = 0;     // prompt tokens (>= 1); the context starts as the prompt
  int64_t max_context = 0;  // prompt + most generated tokens: refused when it could never fit
  // Logits of every prompt position (prompt logprobs); otherwise only the row that samples.
  bool prompt_logits = false;
  // Draft positions to verify after each sampled token (speculative decoding): reserved in the
  // token and KV budgets of every decode step that runs them.
  int n_draft = 0;
};

// A sequence that entered the running set this step, its state started at `start` tokens (a
// cached prefix when start > 0).
struct Admission {
  SeqId id = 0;
  int64_t start = 0;
};

// A sequence whose state the device could not create while nothing else ran: the scheduler has
// forgotten it; the engine finishes it with the error.
struct FailedStart {
  SeqId id = 0;
  Status error;
};

// One sequence's part of a step. The forward runs context positions [start, start + n_tokens)
// followed by n_draft draft tokens; the state holds exactly `start` positions before it.
struct ScheduledChunk {
  SeqId id = 0;
  int64_t start = 0;
  int64_t n_tokens = 0;  // >= 1
  int n_draft = 0;
  // Rows of the chunk (0 .. n_tokens + n_draft - 1, ascending) whose logits come back: prompt
  // positions for prompt logprobs, the last context row when the chunk samples, every draft row.
  std::vector<int32_t> logit_rows;
  bool samples = false;         // the chunk completes the context: the next token is drawn
  bool snapshot_after = false;  // it ends at a prefix-cache checkpoint of an untouched prompt
};

struct StepPlan {
  std::vector<SeqId> preempted;        // released, in order; they wait again with their tokens
  std::vector<Admission> admitted;     // started, in order (those preempted again are not here)
  std::vector<FailedStart> failed;     // to finish with their error
  std::vector<ScheduledChunk> chunks;  // the batch, in order: decodes, prefill chunks, admissions
};

// What happened to one sequence in the step.
struct SequenceOutcome {
  SeqId id = 0;
  int64_t n_computed = 0;  // positions its state holds now (rejected drafts rolled back)
  int64_t n_tokens = 0;    // its context now: prompt + generated
  bool finished = false;   // it left the engine (stop, length, error): forget it
  // Set for a sequence created during the step as a copy of forked_from (n > 1 samples forked at
  // the first token); it runs from the next step with forked_from's spec and arrival.
  std::optional<SeqId> forked_from;
};

struct StepResult {
  std::vector<SequenceOutcome> sequences;
};

class Scheduler {
 public:
  // kv must outlive the scheduler.
  Scheduler(SchedulerOptions options, KvBudget* kv);

  // Queues a sequence (FCFS). InvalidArgument for a malformed spec or a known id;
  // ResourceExhausted when it could never fit (CheckFitsBudget).
  Status Add(const SequenceSpec& spec);
  // Forgets a sequence between steps (cancelled); the engine drops its state.
  void Remove(SeqId id);

  // The next step. Each plan must be answered by Update before the next Schedule.
  StepPlan Schedule();
  // Applies the step's outcomes; every planned chunk must have one. A result that contradicts the
  // plan is refused (InvalidArgument) and changes nothing.
  Status Update(const StepResult& result);

  bool empty() const { return seqs_.empty(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t preemptions() const { return preemptions_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  using Key = std::pair<uint64_t, SeqId>;  // (arrival, id): FCFS order, forks after their parent
  struct Seq {
    SequenceSpec spec;
    uint64_t arrival = 0;
    int64_t n_tokens = 0;     // context: prompt + generated
    int64_t n_computed = 0;   // positions its state holds (0 while waiting)
    int64_t logits_done = 0;  // prompt positions below this have had their logits returned
    Key key() const { return {arrival, spec.id}; }
  };
  // Budgets left while a plan is built.
  struct StepBudget {
    int64_t tokens = 0;
    int64_t prompt_logit_rows = 0;
  };

  // The chunk s runs from `start` within the budgets (false: none fits this step).
  bool PlanChunk(const Seq& s, int64_t start, StepBudget& budget, StepPlan& plan) const;
  int64_t ChunkLength(const Seq& s, int64_t start, const StepBudget& budget) const;
  int DraftsAt(const Seq& s, int64_t start, int64_t tokens_left) const;
  void PlanRunning(StepBudget& budget, StepPlan& plan);
  void Admit(StepBudget& budget, StepPlan& plan);
  void FitGrowth(StepPlan& plan);
  void Preempt(Seq& victim, StepPlan& plan);
  Status CheckOutcome(const SequenceOutcome& o) const;
  Status CheckResult(const StepResult& result) const;
  void Apply(const SequenceOutcome& o);  // one checked outcome of a planned sequence

  SchedulerOptions options_;
  KvBudget* kv_;
  std::map<SeqId, Seq> seqs_;
  std::set<Key> running_, waiting_;
  uint64_t next_arrival_ = 0;
  int64_t preemptions_ = 0;
  std::map<SeqId, ScheduledChunk> planned_;  // the chunks awaiting Update
  bool awaiting_update_ = false;
};

}  // namespace dsinfer::runtime
