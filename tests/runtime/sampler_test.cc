// Sampler semantics: greedy, top_k / top_p / min_p truncation, the sampled distribution, the
// penalties and biases, logprobs, and that the bucketed candidate search of Sample picks exactly
// the token a sort of the whole vocabulary picks.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

namespace dsinfer::runtime {
namespace {

// The whole-vocabulary definition Sample implements without top_k: weights exp((l - max) / T)
// (float, as Sample computes them), min_p keeps weights >= min_p, top_p keeps the shortest
// prefix of the order (logit descending, id ascending) whose weight reaches top_p of the total,
// and the sample is the first token of the kept prefix whose running weight passes u times the
// kept weight. Totals over all tokens or all min_p-kept tokens are summed in eight partial sums
// by id, prefixes in order, as in Sample. Here every token is sorted.
int32_t SampleBySortingEverything(std::span<const float> logits, const SamplingParams& p,
                                  uint64_t step) {
  const double u = UniformFromCounter(p.seed, step);
  if (p.top_k > 0) {  // the k best in order, softmax over them in double, min_p, top_p, draw
    std::vector<int32_t> all(logits.size());
    std::iota(all.begin(), all.end(), 0);
    std::sort(all.begin(), all.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    all.resize(std::min<size_t>(all.size(), static_cast<size_t>(p.top_k)));
    std::vector<double> prob;
    double sum = 0.0;
    for (int32_t t : all) {
      prob.push_back(std::exp((logits[t] - logits[all[0]]) * (1.0 / p.temperature)));
      sum += prob.back();
    }
    for (double& v : prob) v /= sum;
    size_t keep = all.size();
    if (p.min_p > 0.0) {
      size_t k = 1;
      while (k < keep && prob[k] >= p.min_p * prob[0]) ++k;
      keep = k;
    }
    if (p.top_p < 1.0) {
      double cum = 0.0;
      size_t k = 0;
      while (k < keep) {
        cum += prob[k++];
        if (cum >= p.top_p) break;
      }
      keep = std::max<size_t>(1, k);
    }
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += prob[i];
    double target = u * total;
    for (size_t i = 0; i < keep; ++i) {
      target -= prob[i];
      if (target < 0.0) return all[i];
    }
    return all[keep - 1];
  }
  const float mx = *std::max_element(logits.begin(), logits.end());
  const float inv_t = static_cast<float>(1.0 / p.temperature);
  const float min_weight = static_cast<float>(std::clamp(p.min_p, 0.0, 1.0));
  const size_t n = logits.size();
  std::vector<float> weight(n);
  double total_lanes[8] = {}, kept_lanes[8] = {};  // Sample's eight partial sums, by id
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i) {
    weight[i] = ExpNonPositive((logits[i] - mx) * inv_t);
    total_lanes[i % 8] += weight[i];
    if (weight[i] >= min_weight && weight[i] > 0.0f) {
      kept_lanes[i % 8] += weight[i];
      order.push_back(static_cast<int32_t>(i));
    }
  }
  double total = 0.0, kept_total = 0.0;
  for (int lane = 0; lane < 8; ++lane) total += total_lanes[lane], kept_total += kept_lanes[lane];
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  double goal = u * kept_total;
  if (p.top_p < 1.0) {
    double cum = 0.0;
    size_t k = 0;
    while (k < order.size() && cum < p.top_p * total) cum += weight[order[k++]];
    if (cum >= p.top_p * total) order.resize(k);
    goal = 0.0;
    for (int32_t t : order) goal += weight[t];
    goal *= u;
  }
  double cum = 0.0;
  for (int32_t t : order) {
    cum += weight[t];
    if (cum > goal) return t;
  }
  return order.back();
}

std::vector<float> RandomLogits(std::mt19937& rng, size_t n, float spread) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> logits(n);
  for (float& v : logits) v = normal(rng);
  return logits;
}

TEST(Sampler, ExpNonPositiveIsWithinTwoTenMillionthsOfExp) {
  double worst = 0.0;
  for (float x = 0.0f; x > -87.0f; x = std::nextafter(x - 1e-3f * std::fabs(x) - 1e-6f, -100.0f)) {
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(ExpNonPositive(x) - exact) / exact);
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(ExpNonPositive(-0.0f), 1.0f);
  // Subnormal results: within one step of 2^-149.
  for (float x = -87.5f; x > -103.9f; x -= 0.37f)
    EXPECT_NEAR(ExpNonPositive(x), std::exp(static_cast<double>(x)), 0x1p-149) << x;
  EXPECT_EQ(ExpNonPositive(-104.0f), 0.0f);
  EXPECT_EQ(ExpNonPositive(-1e30f), 0.0f);
  EXPECT_EQ(ExpNonPositive(-INFINITY), 0.0f);
  EXPECT_EQ(ExpNonPositive(NAN), 0.0f);
}

TEST(Sampler, GreedyTakesTheFirstLargestLogit) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  SamplingParams greedy;
  greedy.temperature = 0.0;
  EXPECT_EQ(ArgMax(logits), 1);
  for (uint64_t step = 0; step < 20; ++step) EXPECT_EQ(Sample(logits, greedy, step), 1);
  SamplingParams top1;
  top1.top_k = 1;
  top1.seed = 9;
  for (uint64_t step = 0; step < 20; ++step) EXPECT_EQ(Sample(logits, top1, step), 1);
  // Every length around the eight-way maximum's blocks, the maximum at each position.
  for (size_t n = 1; n < 20; ++n)
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> v(n, -2.0f);
      v[at] = 1.0f;
      EXPECT_EQ(ArgMax(v), static_cast<int32_t>(at)) << n << " " << at;
    }
}

TEST(Sampler, SamplesFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.7;
  p.seed = 12345;
  constexpr int kDraws = 200000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++counts[Sample(logits, p, static_cast<uint64_t>(i))];
  double z = 0.0;
  for (float l : logits) z += std::exp(l / p.temperature);
  for (size_t t = 0; t < logits.size(); ++t) {
    const double prob = std::exp(logits[t] / p.temperature) / z;
    const double sigma = std::sqrt(kDraws * prob * (1.0 - prob));
    // Five binomial standard deviations: a correct sampler fails this about once in 10^6 runs.
    EXPECT_NEAR(counts[t], kDraws * prob, 5.0 * sigma) << "token " << t;
  }
}

TEST(Sampler, TruncationsKeepOnlyTheirTokens) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f, -4.0f, 0.0f, 2.0f};
  const auto drawn = [&](const SamplingParams& p) {
    std::set<int32_t> seen;
    for (uint64_t step = 0; step < 4000; ++step) seen.insert(Sample(logits, p, step));
    return seen;
  };
  SamplingParams top_k;
  top_k.top_k = 2;
  EXPECT_EQ(drawn(top_k), (std::set<int32_t>{1, 2}));
  // Softmax at T = 1: 0.463, 0.281, 0.170, 0.063, 0.023, 0.0004 in order 1, 2, 5, 0, 4, 3:
  // 0.7 needs the first two (0.744), 0.8 the first three.
  SamplingParams top_p;
  top_p.top_p = 0.7;
  EXPECT_EQ(drawn(top_p), (std::set<int32_t>{1, 2}));
  top_p.top_p = 0.8;
  EXPECT_EQ(drawn(top_p), (std::set<int32_t>{1, 2, 5}));
  top_p.top_p = 1e-9;
  EXPECT_EQ(drawn(top_p), (std::set<int32_t>{1}));
  // min_p 0.3: weights relative to the top are 1, 0.61, 0.37, 0.14, ...
  SamplingParams min_p;
  min_p.min_p = 0.3;
  EXPECT_EQ(drawn(min_p), (std::set<int32_t>{1, 2, 5}));
  min_p.min_p = 5.0;  // above 1: the top token alone
  EXPECT_EQ(drawn(min_p), (std::set<int32_t>{1}));
  SamplingParams tiny_t;  // 1 / T overflows a float: the top token, not a NaN weight
  tiny_t.temperature = 1e-300;
  EXPECT_EQ(drawn(tiny_t), (std::set<int32_t>{1}));
  // Banned tokens (-inf) are never drawn, whatever the truncation.
  std::vector<float> banned = logits;
  banned[1] = -INFINITY;
  SamplingParams plain;
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 4000; ++step) seen.insert(Sample(banned, plain, step));
  EXPECT_EQ(seen.count(1), 0u);
  EXPECT_EQ(seen.size(), 5u);
}

// The bucketed search against a sort of every token, on a real-size vocabulary with peaked and
// flat logits, every truncation, and the same seed over many steps: the same token every time.
TEST(Sampler, BucketedCandidatesPickWhatSortingEverythingPicks) {
  std::mt19937 rng(7);
  struct Case {
    double temperature, top_p, min_p;
    float spread;
    int top_k = 0;
  };
  const Case cases[] = {
      {1.0, 1.0, 0.0, 3.0f},       {0.8, 0.95, 0.0, 3.0f},   {1.0, 0.9, 0.05, 6.0f},
      {1.5, 1.0, 0.1, 1.0f},       {0.6, 0.5, 0.0, 10.0f},   {2.0, 0.999, 0.0, 0.3f},
      {1.0, 1.0, 0.0, 40.0f},      {0.7, 0.8, 0.0, 0.0f},    {0.8, 1.0, 0.0, 3.0f, 50},
      {1.0, 0.9, 0.02, 0.01f, 40}, {1.0, 1.0, 0.0, 0.0f, 7}, {1.2, 1.0, 0.0, 100.0f, 1000}};
  for (const Case& c : cases) {
    const std::vector<float> logits = RandomLogits(rng, 129280, c.spread);
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.top_k;
    p.seed = rng();
    for (uint64_t step = 0; step < 24; ++step)
      ASSERT_EQ(Sample(logits, p, step), SampleBySortingEverything(logits, p, step))
          << "T " << c.temperature << " top_p " << c.top_p << " min_p " << c.min_p << " top_k "
          << c.top_k << " spread " << c.spread << " step " << step;
  }
}

TEST(Sampler, SameSeedAndStepSameTokenOtherSeedsDiffer) {
  std::mt19937 rng(3);
  const std::vector<float> logits = RandomLogits(rng, 5000, 2.0f);
  SamplingParams a;
  a.seed = 42;
  SamplingParams b = a;
  b.seed = 43;
  std::vector<int32_t> first, again, other;
  for (uint64_t step = 0; step < 64; ++step) {
    first.push_back(Sample(logits, a, step));
    again.push_back(Sample(logits, a, step));
    other.push_back(Sample(logits, b, step));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  for (uint64_t c = 0; c < 1000; ++c) {
    const double v = UniformFromCounter(a.seed, c);
    EXPECT_GE(v, 0.0);
    EXPECT_LT(v, 1.0);
  }
}

TEST(Sampler, PenaltiesBiasesAndBans) {
  // vocab 6; prompt {0, 1}; generated {2, 2, 3}.
  const std::vector<int32_t> prompt = {0, 1}, generated = {2, 2, 3};
  const std::vector<float> base = {2.0f, -2.0f, 1.0f, -1.0f, 0.5f, 0.25f};
  {
    std::vector<float> l = base;
    AdjustLogits(l, {.presence_penalty = 0.5, .frequency_penalty = 0.25}, prompt, generated);
    // Presence and frequency count the generated tokens only.
    EXPECT_EQ(l, (std::vector<float>{2.0f, -2.0f, 1.0f - 0.5f - 0.5f, -1.0f - 0.5f - 0.25f, 0.5f,
                                     0.25f}));
  }
  {
    std::vector<float> l = base;
    AdjustLogits(l, {.repetition_penalty = 2.0}, prompt, generated);
    // Prompt and generated tokens: positive logits divided, negative multiplied.
    EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 0.5f, -2.0f, 0.5f, 0.25f}));
  }
  {
    std::vector<float> l = base;
    const std::vector<std::pair<int32_t, float>> bias = {{4, 10.0f}, {0, -100.0f}, {99, 1.0f}};
    const std::vector<int32_t> banned = {5, -3};
    AdjustLogits(l, {.logit_bias = &bias, .banned = &banned}, prompt, generated);
    EXPECT_EQ(l[4], 10.5f);
    EXPECT_EQ(l[0], -98.0f);
    EXPECT_EQ(l[5], -INFINITY);
    EXPECT_EQ(l[1], -2.0f);  // out-of-range ids are ignored
    EXPECT_EQ(ArgMax(l), 4);
  }
}

TEST(Sampler, LogprobsAreLogSoftmaxBestFirst) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -3.0f};
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  for (int32_t t = 0; t < 5; ++t)
    EXPECT_NEAR(LogprobOf(logits, t), logits[t] - std::log(z), 1e-6) << t;
  const auto top = TopLogprobs(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);  // ties: lower id first
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 2);
  for (const auto& [t, lp] : top) EXPECT_FLOAT_EQ(lp, LogprobOf(logits, t));
  EXPECT_EQ(TopLogprobs(logits, 20).size(), 5u);  // more than the vocabulary: all of it
  // Float exponentials summed in double, over a real vocabulary: within 1e-6 of a double pass.
  std::mt19937 rng(11);
  const std::vector<float> wide = RandomLogits(rng, 129280, 4.0f);
  const double mx = *std::max_element(wide.begin(), wide.end());
  double sum = 0.0;
  for (float l : wide) sum += std::exp(static_cast<double>(l) - mx);
  EXPECT_NEAR(LogSumExp(wide), mx + std::log(sum), 1e-6);
  double lz = 0.0;
  const float lp = LogprobOf(wide, 17, &lz);
  EXPECT_EQ(lz, LogSumExp(wide));
  EXPECT_EQ(TopLogprobs(wide, 4, &lz), TopLogprobs(wide, 4));
  EXPECT_FLOAT_EQ(lp, static_cast<float>(wide[17] - lz));
}

}  // namespace
}  // namespace dsinfer::runtime
