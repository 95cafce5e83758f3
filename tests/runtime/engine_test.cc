// Engine invariance, prefix-cache, memory-budget and lifecycle tests on a tiny checkpoint.
#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <thread>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "backend/cpu/cpu_model.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::Collect;
using dsinfer::testing::Greedy;
using dsinfer::testing::Ids;
using dsinfer::testing::Outcome;

std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  o.n_threads = 2;
  if (o.kv_cache_bytes == 0) o.kv_cache_bytes = int64_t{256} << 20;
  auto e = Engine::Create(w, o);
  DSINFER_CHECK_MSG(e.ok(), e.status().ToString());
  return std::move(e).value();
}

// A KV budget that admits n sequences of `prompt` tokens but not their growth past the next page
// (model/state_layout.h: state grows a page at a time), so that they preempt each other.
int64_t PreemptingBudget(int n, int64_t prompt) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool1(1);
  auto cpu = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool1);
  DSINFER_CHECK(cpu.ok());
  return n * (*cpu)->StateBytesAt(prompt) + (*cpu)->layout().page_bytes / 2;
}

Outcome RunAlone(const RequestParams& p, EngineOptions o = {}) {
  auto engine = MakeEngine(o);
  auto s = engine->Submit(p);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return Collect(**s)[0];
}

TEST(Engine, GreedyIsIdenticalAloneInABatchAfterPreemptionAndAfterAPrefixHit) {
  // 250 + 24 tokens: the generation crosses the state's page boundary at 256.
  RequestParams target = Greedy(Ids(250, 1), 24);
  Outcome alone = RunAlone(target, {.enable_prefix_cache = false});
  ASSERT_EQ(alone.tokens.size(), 24u);

  // In a batch of 8 with mixed prompt lengths, submitted together.
  {
    auto engine = MakeEngine({.enable_prefix_cache = false});
    std::vector<std::shared_ptr<RequestStream>> streams;
    const int lens[] = {5, 300, 1, 64, 129, 17, 250};
    for (int i = 0; i < 7; ++i)
      streams.push_back(*engine->Submit(Greedy(Ids(lens[i], 100 + i), 10 + i)));
    auto mine = engine->Submit(target);
    ASSERT_TRUE(mine.ok());
    Outcome batched = Collect(**mine)[0];
    for (auto& s : streams) Collect(*s);
    EXPECT_EQ(batched.tokens, alone.tokens);
    EXPECT_EQ(batched.logprobs, alone.logprobs);
  }
  // Under a KV budget that forces preemption by recompute: 3 of the 4 concurrent requests fit
  // until they grow.
  {
    auto engine =
        MakeEngine({.kv_cache_bytes = PreemptingBudget(3, 250), .enable_prefix_cache = false});
    std::vector<std::shared_ptr<RequestStream>> others;
    for (int i = 0; i < 3; ++i) others.push_back(*engine->Submit(Greedy(Ids(250, 200 + i), 24)));
    auto mine = engine->Submit(target);
    ASSERT_TRUE(mine.ok());
    Outcome preempted = Collect(**mine)[0];
    for (auto& s : others) Collect(*s);
    EXPECT_GT(engine->Stats().preemptions_total, 0);
    EXPECT_EQ(preempted.tokens, alone.tokens);
    EXPECT_EQ(preempted.logprobs, alone.logprobs);
  }
  // After a prefix-cache hit: the second identical prompt is served from the cache.
  {
    auto engine = MakeEngine();
    Outcome first = Collect(**engine->Submit(target))[0];
    Outcome second = Collect(**engine->Submit(target))[0];
    EXPECT_EQ(first.tokens, alone.tokens);
    EXPECT_EQ(second.tokens, alone.tokens);
    EXPECT_EQ(second.logprobs, alone.logprobs);  // bit-identical logits -> identical logprobs
    EXPECT_EQ(first.usage.cached_prompt_tokens, 0);
    EXPECT_GE(second.usage.cached_prompt_tokens, static_cast<int64_t>(0.9 * target.prompt.size()));
    EXPECT_GT(engine->Stats().prefix_cache_hits, 0);
  }
}

TEST(Engine, SeededSamplingIsIdenticalAloneAndBatched) {
  RequestParams p = Greedy(Ids(40, 7), 20);
  p.sampling.temperature = 0.9;
  p.sampling.top_p = 0.95;
  p.sampling.seed = 1234;
  Outcome alone = RunAlone(p);
  auto engine = MakeEngine();
  std::vector<std::shared_ptr<RequestStream>> others;
  for (int i = 0; i < 5; ++i) {
    RequestParams q = p;
    q.prompt = Ids(10 + 30 * i, 50 + i);
    q.sampling.seed = 99 + i;
    others.push_back(*engine->Submit(q));
  }
  Outcome batched = Collect(**engine->Submit(p))[0];
  for (auto& s : others) Collect(*s);
  EXPECT_EQ(batched.tokens, alone.tokens);
  // A different seed gives a different continuation (the sampler really samples).
  RequestParams q = p;
  q.sampling.seed = 4321;
  EXPECT_NE(RunAlone(q).tokens, alone.tokens);
}

// The seeded half of the invariance acceptance: the same sampled tokens after preemption by
// recompute and when the prompt comes from the prefix cache.
TEST(Engine, SeededSamplingIsIdenticalAfterPreemptionAndAfterAPrefixHit) {
  RequestParams p = Greedy(Ids(250, 11), 24);  // crosses the page boundary at 256
  p.sampling.temperature = 1.0;
  p.sampling.top_p = 0.9;
  p.sampling.seed = 2024;
  Outcome alone = RunAlone(p, {.enable_prefix_cache = false});
  ASSERT_EQ(alone.tokens.size(), 24u);
  RequestParams reseeded = p;  // the tokens depend on the seed: this samples, it is not greedy
  reseeded.sampling.seed = 2025;
  EXPECT_NE(RunAlone(reseeded, {.enable_prefix_cache = false}).tokens, alone.tokens);
  {
    auto engine =
        MakeEngine({.kv_cache_bytes = PreemptingBudget(3, 250), .enable_prefix_cache = false});
    std::vector<std::shared_ptr<RequestStream>> others;
    for (int i = 0; i < 3; ++i) {
      RequestParams q = p;
      q.prompt = Ids(250, 400 + i);
      q.sampling.seed = 7 + i;
      others.push_back(*engine->Submit(q));
    }
    Outcome preempted = Collect(**engine->Submit(p))[0];
    for (auto& s : others) Collect(*s);
    EXPECT_GT(engine->Stats().preemptions_total, 0);
    EXPECT_EQ(preempted.tokens, alone.tokens);
  }
  {
    auto engine = MakeEngine();
    Outcome first = Collect(**engine->Submit(p))[0];
    Outcome second = Collect(**engine->Submit(p))[0];
    EXPECT_GE(second.usage.cached_prompt_tokens, static_cast<int64_t>(0.9 * p.prompt.size()));
    EXPECT_EQ(first.tokens, alone.tokens);
    EXPECT_EQ(second.tokens, alone.tokens);
  }
}

// A request's prompt logprobs (from its first event) and its outcome.
struct WithPrompt {
  std::vector<TokenLogprob> prompt;
  Outcome out;
};
WithPrompt CollectWithPrompt(RequestStream& stream) {
  WithPrompt r;
  bool first = true;
  while (auto ev = stream.Next(std::chrono::milliseconds(120000))) {
    if (first)
      r.prompt = ev->prompt_logprobs;
    else
      EXPECT_TRUE(ev->prompt_logprobs.empty()) << "prompt logprobs on a later event";
    first = false;
    r.out.tokens.insert(r.out.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    for (const auto& lp : ev->logprobs) r.out.logprobs.push_back(lp.logprob);
    r.out.usage = ev->usage;
    if (ev->finished) {
      EXPECT_NE(ev->finish_reason, FinishReason::kError) << ev->error.ToString();
      r.out.reason = ev->finish_reason;
      break;
    }
  }
  return r;
}

// Multi-row logits end to end: prompt logprobs equal those of one forward over the whole prompt
// with every row's logits, however the engine chunks, batches, preempts or caches, and asking for
// them leaves the generated tokens and their logprobs bit-identical.
TEST(Engine, PromptLogprobsMatchOneFullForwardAndLeaveTheOutputUnchanged) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  const int64_t vocab = w.config().vocab_size;
  RequestParams p = Greedy(Ids(600, 21), 8);  // 599 rows: more than two steps' 256
  std::vector<TokenLogprob> want;
  {
    ThreadPool pool(2);
    auto cpu = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool);
    ASSERT_TRUE(cpu.ok());
    auto state = (*cpu)->NewSequence();
    backend::cpu::ForwardOutput out;
    ASSERT_TRUE((*cpu)->Forward(*state, p.prompt, {.all_logits = true}, &out).ok());
    for (size_t t = 0; t + 1 < p.prompt.size(); ++t) {
      std::span<const float> row(out.logits.data() + t * vocab, vocab);
      want.push_back({p.prompt[t + 1], LogprobOf(row, p.prompt[t + 1]), TopLogprobs(row, 3)});
    }
  }
  auto expect_prompt = [&](const std::vector<TokenLogprob>& got, const char* where) {
    ASSERT_EQ(got.size(), want.size()) << where;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].token, want[i].token) << where << " position " << i + 1;
      ASSERT_EQ(got[i].logprob, want[i].logprob) << where << " position " << i + 1;
      ASSERT_EQ(got[i].top, want[i].top) << where << " position " << i + 1;
    }
  };
  const Outcome plain = RunAlone(p, {.enable_prefix_cache = false});
  p.prompt_logprobs = 3;
  for (const bool cache : {false, true}) {  // 256-row chunks / 128-token chunks
    auto engine = MakeEngine({.enable_prefix_cache = cache});
    WithPrompt r = CollectWithPrompt(**engine->Submit(p));
    expect_prompt(r.prompt, cache ? "128-token chunks" : "alone");
    EXPECT_EQ(r.out.tokens, plain.tokens);
    EXPECT_EQ(r.out.logprobs, plain.logprobs);
  }
  {  // Small chunks in a batch; then the same prompt again, cached but recomputed for its rows.
    auto engine = MakeEngine({.max_num_batched_tokens = 48});
    std::vector<std::shared_ptr<RequestStream>> others;
    for (int i = 0; i < 3; ++i) others.push_back(*engine->Submit(Greedy(Ids(90, 600 + i), 12)));
    WithPrompt batched = CollectWithPrompt(**engine->Submit(p));
    for (auto& s : others) Collect(*s);
    expect_prompt(batched.prompt, "batched");
    EXPECT_EQ(batched.out.tokens, plain.tokens);
    WithPrompt again = CollectWithPrompt(**engine->Submit(p));
    expect_prompt(again.prompt, "after the prompt was cached");
    EXPECT_EQ(again.out.usage.cached_prompt_tokens, 0);
    EXPECT_EQ(again.out.tokens, plain.tokens);
  }
  {  // Preempted by recompute in the middle of its prompt: every row once, none twice. An older
     // 2000-token prompt prefills a page (128 tokens) a step beside it (64 for p); the budget
     // holds both states' fixed parts and 7.5 pages, so p, the newest, goes when they have grown.
    ThreadPool pool1(1);
    auto cpu = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool1);
    const model::StateLayout& layout = (*cpu)->layout();
    ASSERT_EQ(layout.page_tokens, 128);
    const int64_t budget = 2 * layout.FixedBytes() + 7 * layout.page_bytes + layout.page_bytes / 2;
    auto engine = MakeEngine({.max_num_batched_tokens = 192, .kv_cache_bytes = budget});
    auto older = engine->Submit(Greedy(Ids(2000, 700), 1));
    WithPrompt preempted = CollectWithPrompt(**engine->Submit(p));
    Collect(**older);
    EXPECT_GT(engine->Stats().preemptions_total, 0);
    expect_prompt(preempted.prompt, "preempted");
    EXPECT_EQ(preempted.out.tokens, plain.tokens);
  }
  RequestParams bad = p;
  bad.prompt_logprobs = 21;
  EXPECT_EQ(MakeEngine()->Submit(bad).status().code(), StatusCode::kInvalidArgument);
}

// The CPU runner, except that the next `fail_new_states` NewState calls fail as a device out of
// memory would.
class FlakyRunner final : public backend::ModelRunner {
 public:
  explicit FlakyRunner(std::unique_ptr<backend::ModelRunner> inner) : inner_(std::move(inner)) {}
  std::atomic<int> fail_new_states{0};

  std::string device() const override { return inner_->device(); }
  Result<std::unique_ptr<backend::RunnerState>> NewState() override {
    if (fail_new_states.load() > 0) {
      --fail_new_states;
      return ResourceExhausted("test: no device memory for a state");
    }
    return inner_->NewState();
  }
  Result<std::unique_ptr<backend::RunnerState>> Copy(const backend::RunnerState& from) override {
    return inner_->Copy(from);
  }
  int64_t StateBytes(const backend::RunnerState& s) const override { return inner_->StateBytes(s); }
  int64_t StateBytesAt(int64_t n) const override { return inner_->StateBytesAt(n); }
  int64_t PageBytesInUse() const override { return inner_->PageBytesInUse(); }
  Result<std::unique_ptr<backend::RunnerState>> Snapshot(
      const backend::RunnerState& from) override {
    return inner_->Snapshot(from);
  }
  int64_t DefaultStateBudget() const override { return inner_->DefaultStateBudget(); }
  Status ForwardBatch(std::span<backend::RunnerChunk> chunks) override {
    return inner_->ForwardBatch(chunks);
  }

 private:
  std::unique_ptr<backend::ModelRunner> inner_;
};

// An admission whose state the device cannot create waits while something else runs (and then
// runs, losing nothing), and fails with the device's error when nothing does.
TEST(Engine, AStateTheDeviceCannotCreateWaitsOrFailsClearly) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  auto cpu = backend::MakeCpuRunner(w, backend::Numerics::Official(), {.n_threads = 2});
  ASSERT_TRUE(cpu.ok());
  auto flaky = std::make_unique<FlakyRunner>(std::move(cpu).value());
  FlakyRunner* runner = flaky.get();
  auto created = Engine::Create(
      w, {.kv_cache_bytes = int64_t{256} << 20, .enable_prefix_cache = false}, std::move(flaky));
  ASSERT_TRUE(created.ok());
  Engine& engine = **created;
  while (!engine.ready()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const RequestParams q = Greedy(Ids(30, 31), 6);
  const Outcome alone = RunAlone(q, {.enable_prefix_cache = false});

  runner->fail_new_states = 1;
  auto lone = engine.Submit(q);
  ASSERT_TRUE(lone.ok());
  std::optional<StreamEvent> ev;
  while ((ev = (*lone)->Next()) && !ev->finished) {
  }
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish_reason, FinishReason::kError);
  EXPECT_EQ(ev->error.code(), StatusCode::kResourceExhausted);

  auto running = engine.Submit(Greedy(Ids(20, 32), 40));
  ASSERT_TRUE(running.ok() && (*running)->Next().has_value());  // it holds a state now
  runner->fail_new_states = 1;
  auto deferred = engine.Submit(q);
  ASSERT_TRUE(deferred.ok());
  const Outcome later = Collect(**deferred)[0];
  EXPECT_EQ(later.tokens, alone.tokens);
  EXPECT_EQ(later.logprobs, alone.logprobs);
  EXPECT_EQ(runner->fail_new_states.load(), 0);
  EXPECT_EQ(engine.Stats().preemptions_total, 0);
  Collect(**running);
}

TEST(Engine, NSamplesShareThePromptAndSampleZeroMatchesNOne) {
  RequestParams p = Greedy(Ids(30, 9), 12);
  p.sampling.temperature = 1.0;
  p.sampling.seed = 77;
  Outcome single = RunAlone(p);
  p.n = 3;
  auto engine = MakeEngine();
  auto outs = Collect(**engine->Submit(p), 3);
  EXPECT_EQ(outs[0].tokens, single.tokens);
  EXPECT_NE(outs[1].tokens, outs[0].tokens);
  EXPECT_EQ(outs[2].usage.completion_tokens, 36);
  EXPECT_EQ(engine->Stats().prompt_tokens_total, 30);  // the prompt ran once
}

TEST(Engine, FloodWithinBudgetCompletesEverythingAndRejectsTheImpossible) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool1(1);
  auto cpu = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool1);
  int64_t budget = (*cpu)->StateBytesAt(400) * 3;
  auto engine = MakeEngine({.kv_cache_bytes = budget});
  // Impossible: one request whose state alone exceeds the whole budget.
  auto impossible = engine->Submit(Greedy(Ids(50, 3), 20000));
  ASSERT_FALSE(impossible.ok());
  EXPECT_EQ(impossible.status().code(), StatusCode::kResourceExhausted);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 16; ++i) {
    auto s = engine->Submit(Greedy(Ids(20 + 23 * i, 300 + i), 8 + i % 5));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    streams.push_back(*s);
  }
  int64_t peak = 0;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      peak = std::max(peak, engine->Stats().kv_bytes_used);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (size_t i = 0; i < streams.size(); ++i) {
    Outcome o = Collect(*streams[i])[0];
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(static_cast<int>(o.tokens.size()), 8 + static_cast<int>(i) % 5);
  }
  done = true;
  watcher.join();
  EXPECT_LE(peak, budget);
  std::printf("KV budget %lld bytes, peak use %lld bytes, preemptions %lld\n",
              static_cast<long long>(budget), static_cast<long long>(peak),
              static_cast<long long>(engine->Stats().preemptions_total));
}

// The queue bound holds at every moment, including while the engine thread has just moved
// arrivals to its own waiting list and is busy with a step.
TEST(Engine, FullQueueRefusesAndTheQueuedRequestsStillFinish) {
  auto engine = MakeEngine({.max_num_seqs = 1, .max_queue = 2});
  auto running = engine->Submit(Greedy(Ids(10, 8), 400));
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE((*running)->Next().has_value());  // a token came: it holds the only slot
  auto b = engine->Submit(Greedy(Ids(6, 9), 2));
  auto c = engine->Submit(Greedy(Ids(6, 10), 2));
  ASSERT_TRUE(b.ok() && c.ok());
  for (int i = 0; i < 20; ++i) {  // across several steps of the running request
    auto refused = engine->Submit(Greedy(Ids(6, 11), 2));
    ASSERT_FALSE(refused.ok()) << "attempt " << i;
    EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  (*running)->Cancel();
  EXPECT_EQ(Collect(**b)[0].tokens.size(), 2u);
  EXPECT_EQ(Collect(**c)[0].tokens.size(), 2u);
  EXPECT_TRUE(engine->Submit(Greedy(Ids(6, 12), 1)).ok());
}

TEST(Engine, CancelStopsARequestAtTheNextStep) {
  auto engine = MakeEngine();
  auto s = engine->Submit(Greedy(Ids(10, 4), 100000 / 100));
  ASSERT_TRUE(s.ok());
  auto first = (*s)->Next();
  ASSERT_TRUE(first.has_value());
  (*s)->Cancel();
  FinishReason reason = FinishReason::kNone;
  while (auto ev = (*s)->Next(std::chrono::milliseconds(10000))) {
    if (ev->finished) {
      reason = ev->finish_reason;
      break;
    }
  }
  EXPECT_EQ(reason, FinishReason::kCancelled);
  for (int i = 0; i < 100 && engine->Stats().n_running > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine->Stats().n_running, 0);
}

TEST(Engine, StopTokensMinTokensAndValidation) {
  auto engine = MakeEngine();
  RequestParams p = Greedy(Ids(20, 5), 30);
  Outcome free_run = Collect(**engine->Submit(p))[0];
  ASSERT_GE(free_run.tokens.size(), 5u);
  RequestParams stop = p;
  stop.stop_token_ids = {free_run.tokens[3]};
  Outcome stopped = Collect(**engine->Submit(stop))[0];
  EXPECT_EQ(stopped.reason, FinishReason::kStop);
  auto first_hit = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]) -
                   free_run.tokens.begin();
  EXPECT_EQ(static_cast<long>(stopped.tokens.size()),
            first_hit);  // the stop token itself is not emitted
  RequestParams min = stop;
  min.min_tokens = 10;
  Outcome longer = Collect(**engine->Submit(min))[0];
  EXPECT_GE(longer.tokens.size(), 10u);
  RequestParams bad = p;
  bad.prompt = {};
  EXPECT_EQ(engine->Submit(bad).status().code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.prompt.push_back(1 << 20);
  EXPECT_EQ(engine->Submit(bad).status().code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.top_logprobs = 21;
  EXPECT_FALSE(engine->Submit(bad).ok());
}

}  // namespace
}  // namespace dsinfer::runtime
