// Lossless sampling under speculative decoding: the rejection rule emits the target's
// distribution on synthetic p / q pairs; SamplingDistribution is the distribution Sample draws
// from; and end to end, the first three generated tokens have the same distribution with and
// without speculation for six sampler settings (chi-square homogeneity at alpha = 1e-3;
// DSINFER_SPEC_CHI2_DRAWS sets the draws per side, the `soak` ctest entry runs 200k).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "backend/cpu/cpu_model.h"
#include "chi_square.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"
#include "speculative_test_util.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::ChiSquare;

constexpr double kZ1e4 = 3.719, kZ1e3 = 3.090;  // normal quantiles at 1 - alpha

TokenDistribution Dense(const std::vector<double>& probs) {
  TokenDistribution d;
  for (size_t i = 0; i < probs.size(); ++i)
    if (probs[i] > 0) d.tokens.push_back(static_cast<int32_t>(i)), d.probs.push_back(probs[i]);
  return d;
}

TEST(RejectionRule, EmitsTheTargetDistributionWhateverTheDraft) {
  const std::vector<double> spread = {0.5, 0.2, 0.1, 0.1, 0.1, 0.0};
  const std::vector<std::pair<std::vector<double>, std::vector<double>>> pairs = {
      {spread, {0.1, 0.1, 0.1, 0.1, 0.1, 0.5}},              // q puts mass where p has none
      {spread, spread},                                      // q == p: everything accepted
      {{0, 0, 0, 0.3, 0.7, 0}, {0.6, 0.4, 0, 0, 0, 0}},      // disjoint: nothing accepted
      {{0, 0, 1, 0, 0, 0}, {0.2, 0.2, 0.2, 0.2, 0.1, 0.1}},  // greedy target
      {spread, {0, 1, 0, 0, 0, 0}},                          // greedy draft
      {{0.05, 0.05, 0.3, 0.3, 0.2, 0.1}, {0.3, 0.3, 0.05, 0.05, 0.1, 0.2}}};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int draws = 200000;
  for (const auto& [pv, qv] : pairs) {
    const TokenDistribution p = Dense(pv), q = Dense(qv);
    std::vector<int64_t> counts(pv.size(), 0);
    int64_t accepted = 0;
    for (int i = 0; i < draws; ++i) {
      const int32_t draft = SampleFrom(q, u(rng));
      const DraftVerdict v = VerifyDraft(p, q, draft, u(rng), u(rng));
      ++counts[v.token];
      accepted += v.accepted ? 1 : 0;
    }
    const ChiSquare fit = dsinfer::testing::GoodnessOfFit(counts, pv, kZ1e4);
    EXPECT_FALSE(fit.Rejects()) << "chi2 " << fit.statistic << " > " << fit.critical;
    for (size_t t = 0; t < pv.size(); ++t) {
      if (pv[t] == 0) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " has no target mass";
      }
    }
    // The acceptance rate is sum min(p, q) (within 5 binomial sigmas).
    double overlap = 0;
    for (size_t t = 0; t < pv.size(); ++t) overlap += std::min(pv[t], qv[t]);
    EXPECT_NEAR(static_cast<double>(accepted) / draws, overlap,
                5 * std::sqrt(overlap * (1 - overlap) / draws) + 1e-9);
  }
}

TEST(RejectionRule, SamplingDistributionIsWhatSampleDraws) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(64);
  for (float& v : logits) v = normal(rng);
  std::vector<SamplingParams> settings(6);
  settings[1].temperature = 0.7, settings[1].top_k = 5;
  settings[2].top_p = 0.8;
  settings[3].min_p = 0.1, settings[3].temperature = 1.5;
  settings[4].temperature = 1.3, settings[4].top_k = 10, settings[4].top_p = 0.9,
  settings[4].min_p = 0.05;
  settings[5].temperature = 0.0;
  for (SamplingParams sp : settings) {
    sp.seed = 11;
    const TokenDistribution d = SamplingDistribution(logits, sp);
    std::vector<double> probs(logits.size(), 0.0);
    for (size_t i = 0; i < d.tokens.size(); ++i) probs[d.tokens[i]] = d.probs[i];
    std::vector<int64_t> counts(logits.size(), 0);
    for (uint64_t step = 0; step < 100000; ++step) ++counts[Sample(logits, sp, step)];
    for (size_t t = 0; t < logits.size(); ++t) {
      if (probs[t] == 0) {
        EXPECT_EQ(counts[t], 0) << "Sample drew token " << t << " outside";
      }
    }
    const ChiSquare fit = dsinfer::testing::GoodnessOfFit(counts, probs, kZ1e4);
    EXPECT_FALSE(fit.Rejects()) << "T " << sp.temperature << " top_k " << sp.top_k << " top_p "
                                << sp.top_p << " min_p " << sp.min_p << ": chi2 " << fit.statistic
                                << " > " << fit.critical;
  }
}

// Draft logits near the target's (0.7 x the target's logits plus a per-token offset), from a
// model of their own: a distribution q that overlaps p without being p.
dsinfer::testing::ScriptedDraftRunner::DraftFn PerturbedTargetDrafts() {
  struct Target {
    ThreadPool pool{1};
    std::unique_ptr<backend::cpu::CpuModel> model;
    std::map<std::vector<int32_t>, std::vector<float>> cache;  // context -> next logits
  };
  auto t = std::make_shared<Target>();
  auto m = backend::cpu::CpuModel::Create(dsinfer::testing::PresetWeights("tiny-a"),
                                          backend::Numerics::Official(), t->pool);
  DSINFER_CHECK(m.ok());
  t->model = std::move(m).value();
  return [t](std::span<const int32_t> ctx, int64_t vocab) -> std::optional<std::vector<float>> {
    std::vector<int32_t> key(ctx.begin(), ctx.end());
    auto it = t->cache.find(key);
    if (it == t->cache.end()) {
      auto s = t->model->NewSequence();
      backend::ForwardOutput out;
      DSINFER_CHECK(t->model->Forward(*s, key, {}, &out).ok());
      for (int64_t i = 0; i < vocab; ++i)
        out.logits[i] = 0.7f * out.logits[i] + 0.5f * static_cast<float>((i * 2654435761u) % 7) / 7;
      it = t->cache.emplace(std::move(key), std::move(out.logits)).first;
    }
    return it->second;
  };
}

int DrawsPerSide() {
  const char* env = std::getenv("DSINFER_SPEC_CHI2_DRAWS");
  return env != nullptr ? std::atoi(env) : 800;
}

// The first three tokens of `draws` seeded samples (16 per request, n = 16).
std::map<std::vector<int32_t>, int64_t> FirstThree(Engine& engine, RequestParams p, int draws) {
  std::map<std::vector<int32_t>, int64_t> counts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  p.n = 16;
  p.max_tokens = 3;
  for (int r = 0; r < draws / 16; ++r) {
    p.sampling.seed = 1000003ull * static_cast<uint64_t>(r) + 17;
    auto s = engine.Submit(p);
    DSINFER_CHECK_MSG(s.ok(), s.status().ToString());
    streams.push_back(*s);
    if (streams.size() == 64 || r + 1 == draws / 16) {
      for (auto& st : streams)
        for (const auto& o : dsinfer::testing::Collect(*st, 16)) ++counts[o.tokens];
      streams.clear();
    }
  }
  return counts;
}

// The six sampler settings of the end-to-end checks.
std::vector<RequestParams> SamplerSettings() {
  // A tiny effective vocabulary: a bias of +6 on four tokens (or top-k) puts nearly all the
  // mass on a few tokens, so that the 3-token sequences fall into a few hundred cells.
  const std::vector<std::pair<int32_t, float>> bias = {{7, 6.f}, {8, 6.f}, {9, 5.f}, {10, 5.f}};
  std::vector<RequestParams> settings(6);
  settings[0].sampling.temperature = 1.0, settings[0].sampling.top_k = 3;
  settings[1].sampling.temperature = 1.0, settings[1].sampling.top_k = 6,
  settings[1].sampling.min_p = 0.05;
  settings[2].sampling.temperature = 1.2, settings[2].sampling.top_k = 3,
  settings[2].presence_penalty = 1.5;
  settings[3].sampling.temperature = 1.0, settings[3].sampling.top_p = 0.95,
  settings[3].logit_bias = bias;
  settings[4].sampling.temperature = 0.8, settings[4].sampling.min_p = 0.05,
  settings[4].logit_bias = bias, settings[4].repetition_penalty = 1.3,
  settings[4].frequency_penalty = 0.5;
  settings[5].sampling.temperature = 1.0, settings[5].sampling.top_k = 5,
  settings[5].sampling.top_p = 0.8;
  return settings;
}

// The first three tokens from `spec` against `plain` for every setting: chi-square homogeneity
// at alpha = 1e-3; and the rule both accepts (more than min_accepted of the drafts) and rejects.
void ExpectSameFirstThree(Engine& plain, Engine& spec, int vocab, double min_accepted = 0.1) {
  const int draws = DrawsPerSide();
  const std::vector<RequestParams> settings = SamplerSettings();
  for (size_t i = 0; i < settings.size(); ++i) {
    RequestParams p = settings[i];
    p.prompt = dsinfer::testing::Ids(6, 40 + static_cast<uint32_t>(i), vocab);
    p.ignore_eos = true;
    p.sampling.has_seed = true;
    const auto a = FirstThree(plain, p, draws), b = FirstThree(spec, p, draws);
    const ChiSquare h = dsinfer::testing::Homogeneity(a, b, kZ1e3);
    std::printf("setting %zu: chi2 %.1f, df %d, critical %.1f (alpha 1e-3), %zu distinct\n", i,
                h.statistic, h.df, h.critical, a.size());
    EXPECT_FALSE(h.Rejects()) << "setting " << i << ": chi2 " << h.statistic << " > " << h.critical
                              << " (df " << h.df << ")";
    EXPECT_GE(h.df, 3) << "setting " << i << ": too few cells to test anything";
  }
  const SpecDecodeStats st = spec.Stats().spec_decode;
  std::printf("drafts: %lld of %lld accepted\n", static_cast<long long>(st.num_accepted_tokens),
              static_cast<long long>(st.num_draft_tokens));
  EXPECT_GT(static_cast<double>(st.num_accepted_tokens),
            min_accepted * static_cast<double>(st.num_draft_tokens));  // the rule really accepts
  EXPECT_LT(st.num_accepted_tokens, st.num_draft_tokens);       // and really rejects
}

TEST(SpeculativeSampling, FirstThreeTokensHaveTheDistributionOfPlainSampling) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  auto plain = Engine::Create(w, {.n_threads = 2});
  ASSERT_TRUE(plain.ok());
  auto cpu = backend::MakeCpuRunner(w, backend::Numerics::Official(), {.n_threads = 2});
  ASSERT_TRUE(cpu.ok());
  auto spec = Engine::Create(w, {.n_threads = 2, .speculative_tokens = 3},
                             std::make_unique<dsinfer::testing::ScriptedDraftRunner>(
                                 std::move(cpu).value(), PerturbedTargetDrafts()));
  ASSERT_TRUE(spec.ok());
  ExpectSameFirstThree(**plain, **spec, 1024);
}

// V4.1's own dSpark drafts (q: the draft block's logits plus the Markov bias, through the same
// sampler transform), every row proposed (threshold 0).
TEST(SpeculativeSampling, DsparkDraftsKeepTheDistributionOfPlainSampling) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-v41-a");
  auto plain = Engine::Create(w, {.n_threads = 2});
  ASSERT_TRUE(plain.ok());
  auto spec = Engine::Create(
      w, {.n_threads = 2, .speculative_tokens = 3, .draft_min_confidence = 0});
  ASSERT_TRUE(spec.ok());
  ExpectSameFirstThree(**plain, **spec, w.config().vocab_size);
}

// dSpark drafts from a draft vocabulary of the even ids: q is 0 on every odd token, among them
// two of the four biased ones (7, 9), so the residual alone must give them their mass.
TEST(SpeculativeSampling, DraftsFromADraftVocabularyKeepTheDistributionOfPlainSampling) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-v41-a");
  auto plain = Engine::Create(w, {.n_threads = 2});
  ASSERT_TRUE(plain.ok());
  std::vector<int32_t> even;
  for (int32_t i = 0; i < w.config().vocab_size; i += 2) even.push_back(i);
  auto spec = Engine::Create(w, {.n_threads = 2,
                                 .speculative_tokens = 3,
                                 .draft_min_confidence = 0,
                                 .draft_vocabulary = even});
  ASSERT_TRUE(spec.ok());
  // Half the vocabulary cannot be proposed: about half the acceptance of the whole vocabulary's
  // drafts (500 against 1050 of 4800 at 800 draws per side).
  ExpectSameFirstThree(**plain, **spec, w.config().vocab_size, /*min_accepted=*/0.05);
}

}  // namespace
}  // namespace dsinfer::runtime
