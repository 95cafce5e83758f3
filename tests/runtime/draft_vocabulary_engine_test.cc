// Speculative decoding over a draft vocabulary (EngineOptions::draft_vocabulary): greedy output and
// logprobs bit-identical to decoding without speculation, with V4's MTP drafts and V4.1's dSpark
// drafts, alone and batched; the whole vocabulary as the draft vocabulary drafts exactly as none;
// a vocabulary without any token the target emits gets no draft accepted (so drafts really come
// from the subset); refusals.
#include <gtest/gtest.h>

#include <set>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "backend/model_runner.h"
#include "runtime/engine.h"
#include "speculative_test_util.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::ExpectSame;
using dsinfer::testing::MakeTestEngine;
using dsinfer::testing::Mixed;
using dsinfer::testing::Outcome;
using dsinfer::testing::RunAll;


std::vector<int32_t> EveryThirdId(int64_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t i = 1; i < vocab; i += 3) ids.push_back(i);
  return ids;
}

TEST(DraftVocabularyEngine, GreedyWithMtpDraftsIsBitIdentical) {
  for (const std::string preset : {"tiny-a", "tiny-b"}) {
    const std::vector<RequestParams> reqs = Mixed(8, 12, 10);
    auto base = MakeTestEngine(preset, {});
    const std::vector<Outcome> want = RunAll(*base, reqs);
    const int64_t V = dsinfer::testing::PresetWeights(preset).config().vocab_size;
    for (int k : {1, 3}) {
      auto spec =
          MakeTestEngine(preset, {.speculative_tokens = k, .draft_vocabulary = EveryThirdId(V)});
      const std::string what = preset + ", k=" + std::to_string(k);
      ExpectSame({want[1]}, RunAll(*spec, {reqs[1]}), what + " alone");
      ExpectSame(want, RunAll(*spec, reqs), what + " batch of 8");
      EXPECT_GT(spec->Stats().spec_decode.num_draft_tokens, 0) << what;
    }
  }
}

// dSpark on tiny-v41-a (every row proposed): bit-identical output whatever the vocabulary; the
// whole vocabulary drafts exactly as no vocabulary (the same q, so the same counters); one
// without the emitted tokens never has a draft accepted, though the plain drafter has some.
TEST(DraftVocabularyEngine, DsparkDraftsComeFromTheVocabularyAndChangeNoOutput) {
  const std::string preset = "tiny-v41-a";
  const int64_t V = dsinfer::testing::PresetWeights(preset).config().vocab_size;
  const std::vector<RequestParams> reqs = Mixed(8, 16, 40, 512);
  auto base = MakeTestEngine(preset, {});
  const std::vector<Outcome> want = RunAll(*base, reqs);
  const EngineOptions spec{.speculative_tokens = 3, .draft_min_confidence = 0};

  auto none = MakeTestEngine(preset, spec);
  ExpectSame(want, RunAll(*none, reqs), "no draft vocabulary");
  const SpecDecodeStats plain = none->Stats().spec_decode;
  ASSERT_GT(plain.num_accepted_tokens, 0) << "the test needs accepted drafts to take away";

  EngineOptions all_ids = spec;
  for (int32_t i = 0; i < V; ++i) all_ids.draft_vocabulary.push_back(i);
  auto whole = MakeTestEngine(preset, all_ids);
  ExpectSame(want, RunAll(*whole, reqs), "the whole vocabulary");
  const SpecDecodeStats w = whole->Stats().spec_decode;
  EXPECT_EQ(w.num_draft_tokens, plain.num_draft_tokens);
  EXPECT_EQ(w.num_accepted_tokens, plain.num_accepted_tokens);

  std::set<int32_t> emitted;
  for (const Outcome& o : want) emitted.insert(o.tokens.begin(), o.tokens.end());
  EngineOptions without = spec;
  for (int32_t i = 0; i < V; ++i)
    if (!emitted.contains(i)) without.draft_vocabulary.push_back(i);
  auto excluded = MakeTestEngine(preset, without);
  ExpectSame(want, RunAll(*excluded, reqs), "a vocabulary without the emitted tokens");
  const SpecDecodeStats x = excluded->Stats().spec_decode;
  EXPECT_GT(x.num_draft_tokens, 0);
  EXPECT_EQ(x.num_accepted_tokens, 0);

  auto third = MakeTestEngine(preset, [&] {
    EngineOptions o = spec;
    o.draft_vocabulary = EveryThirdId(V);
    return o;
  }());
  ExpectSame(want, RunAll(*third, reqs), "every third id");
}

TEST(DraftVocabularyEngine, BadSettingsAreRefusedAtStartup) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  auto no_speculation = Engine::Create(w, {.n_threads = 1, .draft_vocabulary = {1, 2, 3}});
  ASSERT_FALSE(no_speculation.ok());
  EXPECT_NE(no_speculation.status().ToString().find("speculative_tokens"), std::string::npos);
  auto unsorted =
      Engine::Create(w, {.n_threads = 1, .speculative_tokens = 2, .draft_vocabulary = {3, 1}});
  ASSERT_FALSE(unsorted.ok());
  EXPECT_NE(unsorted.status().ToString().find("ascending"), std::string::npos);
  // A runner that does not draft (the ModelRunner default, as the CUDA runner today) has no
  // draft vocabulary either.
  auto cpu = backend::MakeCpuRunner(w, backend::Numerics::Official(), {.n_threads = 1});
  ASSERT_TRUE(cpu.ok());
  struct Drafting final : dsinfer::testing::ForwardingRunner {
    using ForwardingRunner::ForwardingRunner;
    Status CheckSpeculation(int k) const override { return inner_->CheckSpeculation(k); }
  };
  auto refused = Engine::Create(
      w, {.n_threads = 1, .speculative_tokens = 2, .draft_vocabulary = {1, 2}},
      std::make_unique<Drafting>(std::move(cpu).value()));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().ToString().find("draft vocabulary"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::runtime
