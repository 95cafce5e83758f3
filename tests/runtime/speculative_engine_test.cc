// Speculative decoding in the engine (EngineOptions::speculative_tokens): greedy output and
// logprobs bit-identical to decoding without it, alone, batched, after preemption and after a
// prefix-cache hit, with the checkpoint's own MTP drafts and with drafts of a controlled
// acceptance rate; seeded sampling reproducible; the counters; refusals.
#include <gtest/gtest.h>

#include <map>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "backend/cpu/cpu_model.h"
#include "runtime/engine.h"
#include "speculative_test_util.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::Collect;
using dsinfer::testing::ExpectSame;
using dsinfer::testing::Greedy;
using dsinfer::testing::Ids;
using dsinfer::testing::Mixed;
using dsinfer::testing::Outcome;
using dsinfer::testing::ReferenceDrafts;
using dsinfer::testing::RunAll;
using dsinfer::testing::ScriptedDraftRunner;

// With `drafts`, the CPU runner behind a ScriptedDraftRunner.
std::unique_ptr<Engine> MakeEngine(const std::string& preset, EngineOptions o,
                                   ScriptedDraftRunner::DraftFn drafts = {}) {
  std::unique_ptr<backend::ModelRunner> runner;
  if (drafts) {
    auto cpu = backend::MakeCpuRunner(dsinfer::testing::PresetWeights(preset), o.numerics,
                                      {.n_threads = 2});
    DSINFER_CHECK(cpu.ok());
    runner = std::make_unique<ScriptedDraftRunner>(std::move(cpu).value(), std::move(drafts));
  }
  return dsinfer::testing::MakeTestEngine(preset, std::move(o), std::move(runner));
}

// The checkpoint's own MTP block drafting (random weights: mostly rejected), every tiny preset,
// k = 1..4, batches of 1 and 8.
TEST(SpeculativeEngine, GreedyWithMtpDraftsIsBitIdenticalOnEveryTinyPreset) {
  for (const std::string preset : {"tiny-a", "tiny-b", "tiny-c"}) {
    const std::vector<RequestParams> reqs = Mixed(8, 12, 10);
    auto base = MakeEngine(preset, {});
    const std::vector<Outcome> want = RunAll(*base, reqs);
    const std::vector<Outcome> want_one = RunAll(*base, {reqs[1]});
    for (int k = 1; k <= kMaxSpeculativeTokens; ++k) {
      auto spec = MakeEngine(preset, {.speculative_tokens = k});
      ExpectSame(want_one, RunAll(*spec, {reqs[1]}), preset + " alone, k=" + std::to_string(k));
      ExpectSame(want, RunAll(*spec, reqs), preset + " batch of 8, k=" + std::to_string(k));
      const SpecDecodeStats st = spec->Stats().spec_decode;
      EXPECT_GT(st.num_drafts, 0) << preset;
      EXPECT_EQ(st.num_accepted_tokens_per_pos.size(), static_cast<size_t>(k));
      EXPECT_LE(st.num_accepted_tokens, st.num_draft_tokens);
    }
  }
}

// Drafts that are the reference continuation except at scripted misses: every accept length
// occurs, so the verify rows, the rollbacks and the MTP catch-up all run.
TEST(SpeculativeEngine, GreedyWithScriptedDraftsIsBitIdenticalInBatchesOf1_8_32) {
  const std::vector<RequestParams> reqs = Mixed(32, 20, 300);
  auto base = MakeEngine("tiny-a", {});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  const ReferenceDrafts ref(reqs, want, /*miss_rate=*/0.3);
  for (int k = 1; k <= kMaxSpeculativeTokens; ++k) {
    auto spec = MakeEngine("tiny-a", {.speculative_tokens = k}, ref.Fn());
    const std::string what = "k=" + std::to_string(k);
    ExpectSame({want[0]}, RunAll(*spec, {reqs[0]}), what + " alone");
    ExpectSame(std::vector<Outcome>(want.begin(), want.begin() + 8),
               RunAll(*spec, std::vector<RequestParams>(reqs.begin(), reqs.begin() + 8)),
               what + " batch of 8");
    ExpectSame(want, RunAll(*spec, reqs), what + " batch of 32");
    const SpecDecodeStats st = spec->Stats().spec_decode;
    // 70 % of scripted drafts are right: most are accepted, not all.
    EXPECT_GT(st.num_accepted_tokens, st.num_draft_tokens / 3) << what;
    EXPECT_LT(st.num_accepted_tokens, st.num_draft_tokens) << what;
    if (k > 1) {
      EXPECT_GT(st.num_accepted_tokens_per_pos[k - 1], 0) << what;
    }
    // Accepting at position i requires accepting at every position before it.
    for (int i = 1; i < k; ++i)
      EXPECT_LE(st.num_accepted_tokens_per_pos[i], st.num_accepted_tokens_per_pos[i - 1]);
  }
}

TEST(SpeculativeEngine, GreedyIsBitIdenticalAfterPreemptionAndAfterAPrefixHit) {
  // 250 + 24 tokens: the generation crosses the state's page boundary at 256.
  const RequestParams target = Greedy(Ids(250, 1), 24);
  std::vector<RequestParams> reqs = {target};
  for (int i = 0; i < 3; ++i) reqs.push_back(Greedy(Ids(250, 200 + i), 24));
  auto base = MakeEngine("tiny-a", {.enable_prefix_cache = false});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  const ReferenceDrafts ref(reqs, want, 0.3);
  // A budget that admits 3 of the 4 and not their growth: they preempt each other.
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool1(1);
  auto cpu = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool1);
  ASSERT_TRUE(cpu.ok());
  const int64_t budget = 3 * (*cpu)->StateBytesAt(250) + (*cpu)->layout().page_bytes / 2;
  for (int k : {1, 3}) {
    auto spec = MakeEngine(
        "tiny-a", {.kv_cache_bytes = budget, .enable_prefix_cache = false, .speculative_tokens = k},
        ref.Fn());
    ExpectSame(want, RunAll(*spec, reqs), "preempted, k=" + std::to_string(k));
    EXPECT_GT(spec->Stats().preemptions_total, 0);
    EXPECT_GT(spec->Stats().spec_decode.num_accepted_tokens, 0);
  }
  for (int k : {2, 4}) {
    auto spec = MakeEngine("tiny-a", {.speculative_tokens = k}, ref.Fn());
    const Outcome first = RunAll(*spec, {target})[0];
    const Outcome second = RunAll(*spec, {target})[0];
    ExpectSame({want[0], want[0]}, {first, second}, "prefix hit, k=" + std::to_string(k));
    EXPECT_GE(second.usage.cached_prompt_tokens, 200);
    // The real MTP block drafting from a restored state.
    auto mtp = MakeEngine("tiny-a", {.speculative_tokens = k});
    (void)RunAll(*mtp, {target});
    ExpectSame({want[0]}, RunAll(*mtp, {target}), "prefix hit, MTP drafts");
  }
}

TEST(SpeculativeEngine, DemoPresetGreedyIsBitIdentical) {
  const std::vector<RequestParams> reqs = {Greedy(Ids(30, 5, 129280), 10),
                                           Greedy(Ids(9, 6, 129280), 8)};
  auto base = MakeEngine("demo", {});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  auto mtp = MakeEngine("demo", {.speculative_tokens = 2});
  ExpectSame(want, RunAll(*mtp, reqs), "demo, MTP drafts");
  const ReferenceDrafts ref(reqs, want, 0.3);
  auto scripted = MakeEngine("demo", {.speculative_tokens = 3}, ref.Fn());
  ExpectSame(want, RunAll(*scripted, reqs), "demo, scripted drafts");
  EXPECT_GT(scripted->Stats().spec_decode.num_accepted_tokens, 0);
}

TEST(SpeculativeEngine, StopTokensMaxTokensAndNSamplesSeeTheSameTokens) {
  // A stop token inside an accepted run of drafts ends the output exactly there.
  RequestParams p = Greedy(Ids(20, 77), 30);
  auto base = MakeEngine("tiny-a", {});
  const Outcome full = RunAll(*base, {p})[0];
  ASSERT_EQ(full.tokens.size(), 30u);
  RequestParams stopping = p;
  stopping.stop_token_ids = {full.tokens[13]};
  const Outcome want_stop = RunAll(*base, {stopping})[0];
  ASSERT_LT(want_stop.tokens.size(), 14u);
  RequestParams n3 = p;
  n3.n = 3;
  n3.sampling.temperature = 0.8;
  n3.sampling.top_k = 5;
  n3.sampling.seed = 5;
  auto base_n = base->Submit(n3);
  ASSERT_TRUE(base_n.ok());
  const std::vector<Outcome> want_n = Collect(**base_n, 3);
  const ReferenceDrafts ref({p}, {full}, 0.0);
  auto spec = MakeEngine("tiny-a", {.speculative_tokens = 4}, ref.Fn());
  const Outcome got = RunAll(*spec, {stopping})[0];
  EXPECT_EQ(got.tokens, want_stop.tokens);
  EXPECT_EQ(got.reason, FinishReason::kStop);
  EXPECT_EQ(got.usage.completion_tokens, want_stop.usage.completion_tokens);
  // n > 1 forks at the first token; each sample then drafts on its own (first tokens identical:
  // drawn without drafts, by the sampler's own numbers).
  auto spec_n = spec->Submit(n3);
  ASSERT_TRUE(spec_n.ok());
  const std::vector<Outcome> got_n = Collect(**spec_n, 3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(got_n[i].tokens.size(), 30u);
    EXPECT_EQ(got_n[i].tokens[0], want_n[i].tokens[0]);
  }
}

TEST(SpeculativeEngine, SeededSamplingIsReproducibleAloneBatchedAndPreempted) {
  RequestParams p = Greedy(Ids(40, 7), 20);
  p.sampling.temperature = 0.9;
  p.sampling.top_p = 0.95;
  p.sampling.seed = 1234;
  auto a = MakeEngine("tiny-a", {.speculative_tokens = 2});
  const Outcome alone = RunAll(*a, {p})[0];
  auto b = MakeEngine("tiny-a", {.speculative_tokens = 2});
  std::vector<RequestParams> reqs = Mixed(6, 20, 900);
  reqs.push_back(p);
  EXPECT_EQ(RunAll(*b, reqs).back().tokens, alone.tokens);
  RequestParams reseeded = p;
  reseeded.sampling.seed = 99;
  EXPECT_NE(RunAll(*a, {reseeded})[0].tokens, alone.tokens);
}

TEST(SpeculativeEngine, BadSettingsAreRefusedAtStartup) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  auto too_many = Engine::Create(w, {.n_threads = 1, .speculative_tokens = 5});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().ToString().find("speculative_tokens"), std::string::npos);
  // A runner without MTP drafting (the ModelRunner default, as the CUDA runner today).
  auto cpu = backend::MakeCpuRunner(w, backend::Numerics::Official(), {.n_threads = 1});
  ASSERT_TRUE(cpu.ok());
  auto plain = std::make_unique<dsinfer::testing::NoSpeculationRunner>(std::move(cpu).value());
  auto refused = Engine::Create(w, {.n_threads = 1, .speculative_tokens = 2}, std::move(plain));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().ToString().find("speculative decoding"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::runtime
