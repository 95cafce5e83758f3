// Speculative decoding with V4.1's dSpark stages (spec §14.6) in the engine: greedy output and
// logprobs bit-identical to decoding without it on every tiny V4.1 preset and the demo-v4.1
// preset (three stages, blocks of 5), alone and batched, after preemption and after a
// prefix-cache hit; the confidence threshold decides how many drafts are verified; seeded
// sampling reproducible; refusals.
#include <gtest/gtest.h>

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
using dsinfer::testing::MakeTestEngine;
using dsinfer::testing::Mixed;
using dsinfer::testing::Outcome;
using dsinfer::testing::RunAll;


// Every draft proposed (threshold 0): the verify rows, rollbacks and ring catch-up all run.
TEST(DsparkEngine, GreedyIsBitIdenticalOnEveryTinyV41PresetAloneAndBatched) {
  for (const std::string preset : {"tiny-v41-a", "tiny-v41-b", "tiny-v41-c"}) {
    const std::vector<RequestParams> reqs = Mixed(8, 14, 40, 512);
    auto base = MakeTestEngine(preset, {});
    const std::vector<Outcome> want = RunAll(*base, reqs);
    for (int k = 1; k <= 3; ++k) {  // the tiny presets' block is 3
      auto spec = MakeTestEngine(preset, {.speculative_tokens = k, .draft_min_confidence = 0});
      const std::string what = preset + ", k=" + std::to_string(k);
      ExpectSame({want[1]}, RunAll(*spec, {reqs[1]}), what + " alone");
      ExpectSame(want, RunAll(*spec, reqs), what + " batch of 8");
      const SpecDecodeStats st = spec->Stats().spec_decode;
      EXPECT_GT(st.num_drafts, 0) << what;
      // Threshold 0: every draft step proposes k, unless max_tokens leaves room for fewer.
      EXPECT_GT(st.num_draft_tokens, (k - 1) * st.num_drafts) << what;
      EXPECT_LE(st.num_accepted_tokens, st.num_draft_tokens) << what;
    }
  }
}

TEST(DsparkEngine, GreedyIsBitIdenticalInABatchOf32) {
  const std::vector<RequestParams> reqs = Mixed(32, 12, 700, 512);
  auto base = MakeTestEngine("tiny-v41-a", {});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  auto spec = MakeTestEngine("tiny-v41-a", {.speculative_tokens = 3, .draft_min_confidence = 0});
  ExpectSame(want, RunAll(*spec, reqs), "batch of 32");
}

// Three stages, blocks of 5, the real vocabulary: the ring windows wrap (window 64).
TEST(DsparkEngine, DemoV41PresetGreedyIsBitIdentical) {
  const std::vector<RequestParams> reqs = {Greedy(Ids(70, 5, 129280), 10),
                                           Greedy(Ids(9, 6, 129280), 8)};
  auto base = MakeTestEngine("demo-v4.1", {});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  auto spec = MakeTestEngine("demo-v4.1", {.speculative_tokens = 4, .draft_min_confidence = 0});
  ExpectSame(want, RunAll(*spec, reqs), "demo-v4.1, k=4");
  EXPECT_GT(spec->Stats().spec_decode.num_draft_tokens, 0);
}

TEST(DsparkEngine, GreedyIsBitIdenticalAfterPreemptionAndAfterAPrefixHit) {
  // 250 + 24 tokens: the generation crosses the state's page boundary at 256.
  const RequestParams target = Greedy(Ids(250, 1, 512), 24);
  std::vector<RequestParams> reqs = {target};
  for (int i = 0; i < 3; ++i) reqs.push_back(Greedy(Ids(250, 200 + i, 512), 24));
  auto base = MakeTestEngine("tiny-v41-a", {.enable_prefix_cache = false});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  const auto& w = dsinfer::testing::PresetWeights("tiny-v41-a");
  ThreadPool pool1(1);
  auto cpu = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool1);
  ASSERT_TRUE(cpu.ok());
  // A budget that admits 3 of the 4 and not their growth: they preempt each other.
  const int64_t budget = 3 * (*cpu)->StateBytesAt(250) + (*cpu)->layout().page_bytes / 2;
  auto preempted = MakeTestEngine("tiny-v41-a", {.kv_cache_bytes = budget,
                                             .enable_prefix_cache = false,
                                             .speculative_tokens = 2,
                                             .draft_min_confidence = 0});
  ExpectSame(want, RunAll(*preempted, reqs), "preempted");
  EXPECT_GT(preempted->Stats().preemptions_total, 0);
  auto spec = MakeTestEngine("tiny-v41-a", {.speculative_tokens = 3, .draft_min_confidence = 0});
  const Outcome first = RunAll(*spec, {target})[0];
  const Outcome second = RunAll(*spec, {target})[0];
  ExpectSame({want[0], want[0]}, {first, second}, "prefix hit");
  EXPECT_GE(second.usage.cached_prompt_tokens, 200);
}

// The confidence head decides how many of the block's rows are verified: none when no
// probability reaches 1, all k when the threshold is 0, and in between by default.
TEST(DsparkEngine, TheConfidenceThresholdChoosesHowManyDraftsAreVerified) {
  const std::vector<RequestParams> reqs = Mixed(8, 16, 90, 512);
  auto base = MakeTestEngine("tiny-v41-c", {});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  int64_t proposed[3] = {};
  const double thresholds[3] = {0.0, 0.5, 1.0};
  for (int i = 0; i < 3; ++i) {
    auto spec = MakeTestEngine("tiny-v41-c",
                           {.speculative_tokens = 3, .draft_min_confidence = thresholds[i]});
    ExpectSame(want, RunAll(*spec, reqs), "threshold " + std::to_string(thresholds[i]));
    proposed[i] = spec->Stats().spec_decode.num_draft_tokens;
  }
  EXPECT_GT(proposed[0], proposed[1]);
  EXPECT_GT(proposed[1], 0);
  EXPECT_EQ(proposed[2], 0);
}

TEST(DsparkEngine, SeededSamplingIsReproducibleAloneAndBatched) {
  RequestParams p = Greedy(Ids(40, 7, 512), 20);
  p.sampling.temperature = 0.9;
  p.sampling.top_p = 0.95;
  p.sampling.seed = 1234;
  const EngineOptions o{.speculative_tokens = 2, .draft_min_confidence = 0};
  auto a = MakeTestEngine("tiny-v41-a", o);
  const Outcome alone = RunAll(*a, {p})[0];
  auto b = MakeTestEngine("tiny-v41-a", o);
  std::vector<RequestParams> reqs = Mixed(6, 20, 900, 512);
  reqs.push_back(p);
  EXPECT_EQ(RunAll(*b, reqs).back().tokens, alone.tokens);
  EXPECT_GT(b->Stats().spec_decode.num_draft_tokens, 0);
}

TEST(DsparkEngine, MoreDraftsThanTheBlockAndBadThresholdsAreRefused) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-v41-a");
  auto too_many = Engine::Create(w, {.n_threads = 1, .speculative_tokens = 4});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().ToString().find("dSpark block"), std::string::npos)
      << too_many.status().ToString();
  auto bad = Engine::Create(w, {.n_threads = 1, .speculative_tokens = 2,
                                .draft_min_confidence = 1.5});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("draft_min_confidence"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::runtime
