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
    auto engine = MakeEngine({.kv_cache_bytes = PreemptingBudget(3, 250), .enable_prefix_cache = false});
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
    auto engine = MakeEngine({.kv_cache_bytes = PreemptingBudget(3, 250), .enable_prefix_cache = false});
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
