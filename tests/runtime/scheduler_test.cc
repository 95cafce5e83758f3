// The scheduler's policy against a fake KV budget and a fake runner: no model, no engine.
// Each test drives whole steps (Schedule, apply the plan the way the engine does, Update) and
// checks one rule: admission under the byte budget, preemption of the newest, chunked prefill,
// decode-first, FCFS fairness, max_num_seqs, multi-row logits, draft reservations, refusals.
#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace dsinfer::runtime {
namespace {

// State bytes grow linearly: fixed + n_tokens * per_token. `held` is what the fake runner's
// states hold, `cache` the evictable prefix cache, `prefix` what a cached prefix would restore;
// the next `fail_starts` starts fail as a full device would.
class FakeKv final : public KvBudget {
 public:
  int64_t cap = 1000, fixed = 10, per_token = 1, cache = 0;
  int fail_starts = 0;
  std::map<SeqId, int64_t> held, prefix;
  std::vector<std::pair<SeqId, int64_t>> lookups;  // (id, max_reuse) of every Start

  int64_t capacity() const override { return cap; }
  int64_t BytesAt(int64_t n) const override { return fixed + n * per_token; }
  int64_t UsedBytes() const override {
    int64_t b = cache;
    for (const auto& [id, bytes] : held) b += bytes;
    return b;
  }
  int64_t CacheBytes() const override { return cache; }
  void EvictCacheTo(int64_t bytes) override {
    cache = std::min(cache, std::max<int64_t>(bytes, 0));
  }
  Result<int64_t> Start(SeqId id, int64_t max_reuse) override {
    lookups.emplace_back(id, max_reuse);
    EXPECT_FALSE(held.count(id)) << "started a sequence that has a state";
    if (fail_starts > 0) {
      --fail_starts;
      return ResourceExhausted("fake: no room for a state");
    }
    const int64_t start = prefix.count(id) ? std::min(prefix.at(id), max_reuse) : 0;
    held[id] = BytesAt(start);
    return start;
  }
  void Release(SeqId id) override {
    EXPECT_TRUE(held.count(id)) << "released a sequence without a state";
    held.erase(id);
  }
};

// What the fake runner knows of a sequence.
struct Track {
  int64_t n_prompt = 0, max_new = 0, n_tokens = 0, n_computed = 0, generated = 0;
  bool done = false;
};

// Drives the scheduler the way the engine does: apply each plan to the fake KV, run the chunks
// (every sampling chunk draws one token and accepts every draft), report the outcomes.
class Harness {
 public:
  FakeKv kv;
  Scheduler sched;
  std::map<SeqId, Track> tracks;
  std::vector<StepPlan> plans;
  std::vector<SeqId> preempted;  // in order

  explicit Harness(SchedulerOptions o, int64_t cap = 1000) : sched(o, &kv) { kv.cap = cap; }

  SeqId Add(int64_t n_prompt, int64_t max_new, bool prompt_logits = false, int n_draft = 0) {
    const SeqId id = next_id_++;
    EXPECT_TRUE(sched
                    .Add({.id = id,
                          .n_prompt = n_prompt,
                          .max_context = n_prompt + max_new,
                          .prompt_logits = prompt_logits,
                          .n_draft = n_draft})
                    .ok());
    tracks[id] = {.n_prompt = n_prompt, .max_new = max_new, .n_tokens = n_prompt};
    return id;
  }

  const StepPlan& Step() {
    plans.push_back(sched.Schedule());
    const StepPlan& plan = plans.back();
    for (SeqId id : plan.preempted) {
      EXPECT_FALSE(kv.held.count(id)) << "a preempted sequence kept its state";
      tracks[id].n_computed = 0;
      preempted.push_back(id);
    }
    for (const Admission& a : plan.admitted) {
      EXPECT_EQ(kv.held[a.id], kv.BytesAt(a.start)) << "admitted without its state";
      tracks[a.id].n_computed = a.start;
    }
    for (const FailedStart& f : plan.failed) tracks[f.id].done = true;
    StepResult result;
    for (const ScheduledChunk& c : plan.chunks) result.sequences.push_back(Run(c));
    const Status st = sched.Update(result);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (sched.num_running() > 1) {
      EXPECT_LE(kv.UsedBytes(), kv.cap);
    }
    return plan;
  }

  // Steps until every sequence finished; the number of steps.
  int RunToEnd(int max_steps = 1000) {
    int n = 0;
    while (!sched.empty() && n < max_steps) {
      Step();
      ++n;
    }
    EXPECT_TRUE(sched.empty()) << "not done after " << max_steps << " steps";
    return n;
  }

  // The chunk of `id` in `plan`, or null.
  static const ScheduledChunk* ChunkOf(const StepPlan& plan, SeqId id) {
    for (const ScheduledChunk& c : plan.chunks)
      if (c.id == id) return &c;
    return nullptr;
  }
  // The chunk of `id` in `plan`; a test failure (and an empty chunk) when there is none.
  static const ScheduledChunk& MustChunk(const StepPlan& plan, SeqId id) {
    static const ScheduledChunk kNone{};
    const ScheduledChunk* c = ChunkOf(plan, id);
    if (c == nullptr) ADD_FAILURE() << "no chunk for sequence " << id;
    return c != nullptr ? *c : kNone;
  }
  static bool Admits(const StepPlan& plan, SeqId id) {
    return std::any_of(plan.admitted.begin(), plan.admitted.end(),
                       [id](const Admission& a) { return a.id == id; });
  }

 private:
  SequenceOutcome Run(const ScheduledChunk& c) {
    Track& t = tracks[c.id];
    EXPECT_EQ(c.start, t.n_computed) << "a chunk must start where the state is";
    EXPECT_LE(c.start + c.n_tokens, t.n_tokens) << "a chunk runs known context tokens only";
    EXPECT_EQ(c.samples, c.start + c.n_tokens == t.n_tokens);
    t.n_computed = c.start + c.n_tokens;
    if (c.samples) {
      t.n_computed += c.n_draft;  // every draft accepted, plus the token drawn after them
      t.generated += 1 + c.n_draft;
      t.n_tokens += 1 + c.n_draft;
      t.done = t.generated >= t.max_new;
    }
    kv.held[c.id] = kv.BytesAt(t.n_computed);
    if (t.done) kv.held.erase(c.id);
    return {.id = c.id, .n_computed = t.n_computed, .n_tokens = t.n_tokens, .finished = t.done};
  }
  SeqId next_id_ = 1;
};

std::vector<std::pair<int64_t, int64_t>> Spans(const std::vector<StepPlan>& plans, SeqId id) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const StepPlan& p : plans)
    if (const ScheduledChunk* c = Harness::ChunkOf(p, id)) out.emplace_back(c->start, c->n_tokens);
  return out;
}

using Spanv = std::vector<std::pair<int64_t, int64_t>>;

TEST(Scheduler, ARequestThatCanNeverFitIsRefusedAtAdd) {
  FakeKv kv;
  kv.cap = 100;  // fixed 10 + 1 per token: contexts up to 90 tokens fit
  Scheduler sched({}, &kv);
  EXPECT_TRUE(sched.Add({.id = 1, .n_prompt = 10, .max_context = 90}).ok());
  const Status too_long = sched.Add({.id = 2, .n_prompt = 10, .max_context = 91});
  EXPECT_EQ(too_long.code(), StatusCode::kResourceExhausted);
  // Draft positions are state too.
  EXPECT_EQ(sched.Add({.id = 3, .n_prompt = 10, .max_context = 88, .n_draft = 3}).code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckFitsBudget(kv, 90).ok());
  EXPECT_FALSE(CheckFitsBudget(kv, 91).ok());
  EXPECT_EQ(sched.Add({.id = 1, .n_prompt = 5, .max_context = 6}).code(),
            StatusCode::kInvalidArgument);  // a known id
  EXPECT_EQ(sched.Add({.id = 4, .n_prompt = 0, .max_context = 6}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.num_waiting(), 1);  // only the first one is queued
}

TEST(Scheduler, AdmissionWaitsWhileTheBudgetIsFull) {
  // c's whole context (70 bytes) does not fit next to a and b (~65), though its first chunk would.
  Harness h({.max_num_batched_tokens = 16}, /*cap=*/125);
  const SeqId a = h.Add(20, 10), b = h.Add(20, 20);
  for (int i = 0; i < 4; ++i) h.Step();
  const SeqId c = h.Add(60, 5);
  int step_a_finished = -1, step_c_admitted = -1;
  for (int i = 0; i < 40 && step_c_admitted < 0; ++i) {
    const StepPlan& plan = h.Step();
    if (Harness::Admits(plan, c)) step_c_admitted = static_cast<int>(h.plans.size());
    if (h.tracks[a].done && step_a_finished < 0) step_a_finished = static_cast<int>(h.plans.size());
  }
  ASSERT_GT(step_a_finished, 0);
  EXPECT_EQ(step_c_admitted, step_a_finished + 1);  // at once when room appears, not before
  EXPECT_FALSE(h.tracks[b].done);
  h.RunToEnd();
  EXPECT_TRUE(h.preempted.empty());
  EXPECT_EQ(h.sched.preemptions(), 0);
}

TEST(Scheduler, PreemptionTakesTheNewestAndReadmitsFcfsWithTokensKept) {
  // Three sequences growing one token a step in 80 bytes: C goes first, then B.
  Harness h({}, /*cap=*/80);
  const SeqId a = h.Add(10, 40), b = h.Add(10, 40), c = h.Add(10, 40);
  std::map<SeqId, int64_t> context_at_preemption;
  std::map<SeqId, std::pair<int, size_t>> readmitted_at;  // (step, place among the admissions)
  for (int step = 0; step < 400 && !h.sched.empty(); ++step) {
    std::map<SeqId, int64_t> before;
    for (const auto& [id, t] : h.tracks) before[id] = t.n_tokens;
    const size_t n_preempted = h.preempted.size();
    const StepPlan& plan = h.Step();
    for (size_t i = n_preempted; i < h.preempted.size(); ++i)
      context_at_preemption.emplace(h.preempted[i], before[h.preempted[i]]);
    for (size_t i = 0; i < plan.admitted.size(); ++i) {
      const SeqId id = plan.admitted[i].id;
      if (!context_at_preemption.count(id) || readmitted_at.count(id)) continue;
      readmitted_at[id] = {step, i};
      // Recomputed from scratch: everything it had, prompt and generated tokens.
      const ScheduledChunk* chunk = Harness::ChunkOf(plan, id);
      ASSERT_NE(chunk, nullptr);
      EXPECT_EQ(chunk->start, 0);
      EXPECT_EQ(chunk->n_tokens, context_at_preemption[id]);
      EXPECT_TRUE(chunk->samples);
    }
  }
  ASSERT_GE(h.preempted.size(), 2u);
  EXPECT_EQ(h.preempted[0], c);
  EXPECT_EQ(h.preempted[1], b);
  EXPECT_TRUE(std::find(h.preempted.begin(), h.preempted.end(), a) == h.preempted.end());
  ASSERT_TRUE(readmitted_at.count(b) && readmitted_at.count(c));
  EXPECT_LT(readmitted_at[b], readmitted_at[c]);                          // FCFS
  for (const auto& [id, t] : h.tracks) EXPECT_EQ(t.generated, 40) << id;  // nothing lost
  EXPECT_EQ(h.sched.preemptions(), static_cast<int64_t>(h.preempted.size()));
}

TEST(Scheduler, ThePrefixCacheIsEvictedBeforeAnyoneIsPreempted) {
  // Two sequences end at 2 x 69 bytes: 170 holds them once the cache gives back 28 of its 60.
  Harness h({}, /*cap=*/170);
  h.Add(10, 50);
  h.Add(10, 50);
  h.kv.cache = 60;
  h.RunToEnd();
  EXPECT_TRUE(h.preempted.empty());
  EXPECT_EQ(h.sched.preemptions(), 0);
  EXPECT_EQ(h.kv.cache, 170 - 2 * 69);  // evicted as much as needed and no more
}

TEST(Scheduler, ChunkedPrefillRespectsTheTokenBudgetAndTheCheckpoints) {
  {
    Harness h({.max_num_batched_tokens = 100, .checkpoint_tokens = 64});
    const SeqId p = h.Add(300, 1);
    h.RunToEnd();
    EXPECT_EQ(Spans(h.plans, p),
              (Spanv{{0, 64}, {64, 64}, {128, 64}, {192, 64}, {256, 43}, {299, 1}}));
    ASSERT_EQ(h.plans.size(), 6u);
    for (size_t i = 0; i < 5; ++i) {
      const ScheduledChunk& c = Harness::MustChunk(h.plans[i], p);
      EXPECT_TRUE(c.snapshot_after) << i;  // each ends at a checkpoint, the last one before 299
      EXPECT_TRUE(c.logit_rows.empty()) << i;
    }
    const ScheduledChunk& last = Harness::MustChunk(h.plans[5], p);
    EXPECT_FALSE(last.snapshot_after);
    EXPECT_EQ(last.logit_rows, std::vector<int32_t>{0});
  }
  {  // No prefix cache: chunks as large as the budget, minus the decode that goes first.
    Harness h({.max_num_batched_tokens = 100});
    const SeqId d = h.Add(1, 10);
    h.Step();
    const SeqId p = h.Add(250, 1);
    h.RunToEnd();
    EXPECT_EQ(Spans(h.plans, p), (Spanv{{0, 99}, {99, 99}, {198, 52}}));
    EXPECT_EQ(Spans(h.plans, d).size(), 10u);
    for (const StepPlan& plan : h.plans) {
      int64_t tokens = 0;
      for (const ScheduledChunk& c : plan.chunks) tokens += c.n_tokens + c.n_draft;
      EXPECT_LE(tokens, 100);
    }
  }
}

TEST(Scheduler, DecodesGoBeforePrefillChunks) {
  // L (older) prefills in checkpoint-sized chunks; S (newer) reaches its decodes meanwhile.
  Harness h({.max_num_batched_tokens = 5, .checkpoint_tokens = 4});
  const SeqId l = h.Add(200, 1), s = h.Add(3, 20);
  int checked = 0;
  for (int i = 0; i < 30; ++i) {
    const StepPlan& plan = h.Step();
    const ScheduledChunk* sc = Harness::ChunkOf(plan, s);
    const ScheduledChunk* lc = Harness::ChunkOf(plan, l);
    if (sc == nullptr || lc == nullptr || sc->n_tokens != 1 || !sc->samples) continue;
    EXPECT_EQ(plan.chunks.front().id, s) << "step " << i;
    EXPECT_EQ(lc->n_tokens, 4);
    ++checked;
  }
  EXPECT_GT(checked, 10);
  // Decodes come first even when they use the whole budget: the prefill waits.
  Harness full({.max_num_batched_tokens = 2});
  const SeqId d1 = full.Add(1, 30), d2 = full.Add(1, 30);
  full.Step();
  const SeqId p = full.Add(50, 1);
  for (int i = 0; i < 5; ++i) {
    const StepPlan& plan = full.Step();
    ASSERT_EQ(plan.chunks.size(), 2u);
    EXPECT_EQ(plan.chunks[0].id, d1);
    EXPECT_EQ(plan.chunks[1].id, d2);
  }
  EXPECT_EQ(full.tracks[p].n_computed, 0);
}

TEST(Scheduler, AnOldLongPromptIsNotStarvedByAStreamOfShortOnes) {
  // Token budget: four new short prompts a step would fill it; the old long one still gets it.
  {
    Harness h({.max_num_batched_tokens = 16});
    const SeqId l = h.Add(200, 1);
    int steps = 0;
    while (h.tracks[l].generated == 0 && steps < 100) {
      for (int k = 0; k < 4; ++k) h.Add(4, 1);
      h.Step();
      ++steps;
    }
    EXPECT_LE(steps, 13);  // ceil(200 / 16): every step's whole budget
  }
  // KV budget: the head of the queue waits for room and nobody behind it jumps ahead.
  {
    Harness h({}, /*cap=*/150);
    const SeqId r = h.Add(60, 20);  // holds ~70-90 bytes while it runs
    h.Step();
    const SeqId l = h.Add(100, 1);  // needs 110 bytes: waits for r
    bool l_admitted = false;
    for (int i = 0; i < 30 && !h.tracks[l].done; ++i) {
      h.Add(2, 1);  // 12 bytes: would fit next to r
      const StepPlan& plan = h.Step();
      if (!h.tracks[r].done) {
        EXPECT_TRUE(plan.admitted.empty()) << "step " << i;
      }
      if (!l_admitted && !plan.admitted.empty()) {
        EXPECT_EQ(plan.admitted.front().id, l) << "admitted ahead of the head of the queue";
        l_admitted = true;
      }
    }
    EXPECT_TRUE(h.tracks[l].done);
    h.RunToEnd();
  }
}

TEST(Scheduler, MaxNumSeqsBoundsTheBatchAndTheRunningSet) {
  Harness h({.max_num_seqs = 2});
  for (int i = 0; i < 5; ++i) h.Add(5 + i, 4);
  int steps = 0;
  while (!h.sched.empty() && steps < 100) {
    const StepPlan& plan = h.Step();
    EXPECT_LE(plan.chunks.size(), 2u);
    EXPECT_LE(h.sched.num_running(), 2);
    ++steps;
  }
  EXPECT_TRUE(h.sched.empty());
  for (const auto& [id, t] : h.tracks) EXPECT_EQ(t.generated, 4);
  // Forks (n > 1 samples) may run more sequences than that; a step still takes at most 2.
  const SeqId a = h.Add(3, 9);
  h.sched.Schedule();
  ASSERT_TRUE(h.sched
                  .Update({{{.id = a, .n_computed = 3, .n_tokens = 4},
                            {.id = 100, .n_computed = 3, .n_tokens = 4, .forked_from = a},
                            {.id = 101, .n_computed = 3, .n_tokens = 4, .forked_from = a}}})
                  .ok());
  EXPECT_EQ(h.sched.num_running(), 3);
  const StepPlan plan = h.sched.Schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, a);
  EXPECT_EQ(plan.chunks[1].id, 100u);
}

TEST(Scheduler, PromptLogitsAskForEveryPromptRowOnceWithinTheRowBudget) {
  Harness h({.checkpoint_tokens = 4});
  const SeqId p = h.Add(10, 2, /*prompt_logits=*/true), q = h.Add(10, 2);
  h.kv.prefix[p] = 8;  // a cached prefix that must not replace rows still owed
  h.RunToEnd();
  std::vector<std::vector<int32_t>> rows_p, rows_q;
  for (const StepPlan& plan : h.plans) {
    if (const ScheduledChunk* c = Harness::ChunkOf(plan, p)) rows_p.push_back(c->logit_rows);
    if (const ScheduledChunk* c = Harness::ChunkOf(plan, q)) rows_q.push_back(c->logit_rows);
  }
  // Chunks [0,4) [4,8) [8,9) [9,10) and one decode: positions 0..8 are prompt rows, 9 samples.
  EXPECT_EQ(Spans(h.plans, p), (Spanv{{0, 4}, {4, 4}, {8, 1}, {9, 1}, {10, 1}}));
  using Rows = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(rows_p, (Rows{{0, 1, 2, 3}, {0, 1, 2, 3}, {0}, {0}, {0}}));
  EXPECT_EQ(rows_q, (Rows{{}, {}, {}, {0}, {0}}));
  ASSERT_FALSE(h.kv.lookups.empty());
  EXPECT_EQ(h.kv.lookups[0], (std::pair<SeqId, int64_t>{p, 0}));  // nothing may be restored

  // At most max_prompt_logit_rows prompt rows a step, shared in FCFS order.
  Harness capped({.max_prompt_logit_rows = 3});
  const SeqId p1 = capped.Add(10, 1, true), p2 = capped.Add(10, 1, true);
  const StepPlan& first = capped.Step();
  EXPECT_EQ(Harness::MustChunk(first, p1).logit_rows, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Harness::ChunkOf(first, p2), nullptr);  // no rows left this step: it waits
  capped.RunToEnd();
  EXPECT_EQ(Spans(capped.plans, p1), (Spanv{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  for (const StepPlan& plan : capped.plans) {
    int64_t prompt_rows = 0;
    for (const ScheduledChunk& c : plan.chunks)
      prompt_rows += static_cast<int64_t>(c.logit_rows.size()) - (c.samples ? 1 : 0);
    EXPECT_LE(prompt_rows, 3);
  }
}

TEST(Scheduler, RowsAlreadyReturnedAreNotAskedForAgainAfterPreemption) {
  Harness h({.max_prompt_logit_rows = 3});
  const SeqId a = h.Add(2, 60);
  const SeqId p = h.Add(12, 1, /*prompt_logits=*/true);
  h.kv.prefix[p] = 11;
  h.Step();
  h.Step();  // p: rows of positions 0..5 returned
  ASSERT_EQ(h.tracks[p].n_computed, 6);
  h.kv.cap = h.kv.UsedBytes() + 3;  // the next step's growth does not fit: p, the newest, goes
  h.Step();
  ASSERT_EQ(h.preempted, std::vector<SeqId>{p});
  h.kv.cap = 1000;
  h.RunToEnd();
  EXPECT_EQ(h.kv.lookups.back(), (std::pair<SeqId, int64_t>{p, 6}));  // restorable: 0..5 only
  // Restored to 6; then rows of positions 6..8, and 9, 10 with 11 sampling.
  EXPECT_EQ(Spans(h.plans, p), (Spanv{{0, 3}, {3, 3}, {6, 3}, {9, 3}}));
  std::vector<int32_t> rows;
  for (size_t i = 2; i < h.plans.size(); ++i)
    if (const ScheduledChunk* c = Harness::ChunkOf(h.plans[i], p))
      rows.insert(rows.end(), c->logit_rows.begin(), c->logit_rows.end());
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(h.tracks[a].done);
}

TEST(Scheduler, DraftTokensReserveTokenAndKvBudget) {
  {  // Token budget: a decode with 3 drafts takes 4 tokens; drafts shrink to what is left.
    Harness h({.max_num_batched_tokens = 10});
    const SeqId d = h.Add(1, 30, false, /*n_draft=*/3);
    const ScheduledChunk first = Harness::MustChunk(h.Step(), d);
    EXPECT_EQ(first.n_draft, 0);  // nothing sampled yet: nothing to draft from
    const SeqId p = h.Add(40, 1);
    const StepPlan& plan = h.Step();
    const ScheduledChunk& dc = Harness::MustChunk(plan, d);
    EXPECT_EQ(dc.n_draft, 3);
    EXPECT_EQ(dc.logit_rows, (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(Harness::MustChunk(plan, p).n_tokens, 6);
    Harness tight({.max_num_batched_tokens = 2});
    const SeqId t = tight.Add(1, 30, false, 3);
    tight.Step();
    EXPECT_EQ(Harness::MustChunk(tight.Step(), t).n_draft, 1);
  }
  for (const int n_draft : {0, 3}) {  // KV budget: room for 1 more token, not for 4
    Harness h({});
    const SeqId d = h.Add(5, 30, false, n_draft);
    h.Step();
    h.Step();
    h.kv.cache = 5;
    h.kv.cap = h.kv.UsedBytes() + 2;
    const ScheduledChunk c = Harness::MustChunk(h.Step(), d);
    EXPECT_EQ(c.n_draft, n_draft);
    EXPECT_EQ(h.kv.cache, n_draft == 0 ? 5 : 3) << "drafts " << n_draft;
  }
}

TEST(Scheduler, AStartTheDeviceRefusesWaitsBehindRunningSequencesOrFailsAlone) {
  Harness h({});
  h.kv.fail_starts = 1;
  const SeqId lone = h.Add(4, 5);
  const StepPlan first = h.Step();
  ASSERT_EQ(first.failed.size(), 1u);  // nothing else runs: it would wait forever
  EXPECT_EQ(first.failed[0].id, lone);
  EXPECT_EQ(first.failed[0].error.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(h.sched.empty());
  const SeqId a = h.Add(4, 20);
  h.Step();
  h.kv.fail_starts = 1;
  const SeqId b = h.Add(4, 5), c = h.Add(4, 5);
  const StepPlan refused = h.Step();
  EXPECT_TRUE(refused.failed.empty());
  EXPECT_TRUE(refused.admitted.empty());  // b waits for room, and c behind it
  EXPECT_EQ(h.sched.num_waiting(), 2);
  const StepPlan next = h.Step();
  ASSERT_EQ(next.admitted.size(), 2u);
  EXPECT_EQ(next.admitted[0].id, b);
  EXPECT_EQ(next.admitted[1].id, c);
  EXPECT_EQ(h.sched.preemptions(), 0);
  h.RunToEnd();
  EXPECT_EQ(h.tracks[a].generated, 20);
}

TEST(Scheduler, ForksJoinAfterTheirParent) {
  Harness h({});
  const SeqId a = h.Add(4, 5);
  StepPlan plan = h.sched.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  // The first token forks a sibling with the same state.
  ASSERT_TRUE(h.sched
                  .Update({{{.id = a, .n_computed = 4, .n_tokens = 5},
                            {.id = 99, .n_computed = 4, .n_tokens = 5, .forked_from = a}}})
                  .ok());
  EXPECT_EQ(h.sched.num_running(), 2);
  plan = h.sched.Schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, a);
  EXPECT_EQ(plan.chunks[1].id, 99u);
  EXPECT_EQ(plan.chunks[1].start, 4);
  EXPECT_TRUE(plan.admitted.empty());
}

TEST(Scheduler, UpdateRefusesOutcomesThatContradictThePlan) {
  Harness h({});
  const SeqId a = h.Add(4, 5), b = h.Add(4, 5);
  h.sched.Schedule();  // a and b run [0, 4)
  auto ok = [&](SeqId id) { return SequenceOutcome{.id = id, .n_computed = 4, .n_tokens = 5}; };
  SequenceOutcome beyond = ok(a);
  beyond.n_computed = 6;
  SequenceOutcome unknown = ok(a);
  unknown.id = 42;
  SequenceOutcome orphan_fork = ok(7);
  orphan_fork.forked_from = 77;
  for (const StepResult& bad :
       {StepResult{{ok(a)}},  // b missing
        StepResult{{beyond, ok(b)}}, StepResult{{ok(a), ok(a), ok(b)}},
        StepResult{{ok(a), ok(b), unknown}}, StepResult{{ok(a), ok(b), orphan_fork}}}) {
    EXPECT_EQ(h.sched.Update(bad).code(), StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(h.sched.Update({{ok(a), ok(b)}}).ok());  // nothing was half-applied
  const StepPlan plan = h.sched.Schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].start, 4);
  EXPECT_TRUE(plan.chunks[0].samples);
  EXPECT_EQ(h.sched.Update({}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsinfer::runtime
