#include "runtime/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>

namespace dsinfer::runtime {

double UniformFromCounter(uint64_t seed, uint64_t counter) {
  uint64_t z =
      seed * 0x9e3779b97f4a7c15ull + counter * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
}

float ExpNonPositive(float x) {
  // exp(x) = 2^n exp(r), n = x / ln 2 rounded to nearest (by adding and taking away 1.5 * 2^23,
  // which needs no rounding call), |r| <= ln(2) / 2, r from a two-part ln 2 (Cody and Waite:
  // n * kLn2High is exact for |n| < 2^8), exp(r) by its Taylor series to r^7 (the remainder
  // below 1.3e-8 relative), 2^n as 2^(n + 64) 2^-64 so that results down to 2^-149 round once
  // as subnormals.
  constexpr float kLog2E = 1.44269504f, kLn2High = 0.693145752f, kLn2Low = 1.42860677e-6f;
  constexpr float kRound = 12582912.0f;             // 1.5 * 2^23
  const float clamped = x > -104.0f ? x : -104.0f;  // NaN too: n stays a small integer
  const float n = (clamped * kLog2E + kRound) - kRound;
  const float r = (clamped - n * kLn2High) - n * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 64 + 127)
                                           << 23);  // 2^(n + 64), n in [-150, 0]
  const float value = p * scale * 0x1p-64f;
  return x > -104.0f ? value : 0.0f;
}

namespace {

// The sampler's token order: larger logit first, lower id on ties.
struct ByLogit {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// weight[i] = ExpNonPositive((logits[i] - mx) * inv_t) (0 for NaN) for i < logits.size(); returns
// their sum, in eight interleaved partial sums added in lane order (one running sum was a chain
// of dependent adds as long as the vocabulary). weight may be null: the sum alone. In blocks, so
// that the exponentials (no sum, no branch) vectorize apart from the adds.
double Weights(std::span<const float> logits, float mx, float inv_t, float* weight) {
  constexpr size_t kBlock = 256, kWays = 8;
  float block[kBlock];
  double partial[kWays] = {};
  for (size_t b = 0; b < logits.size(); b += kBlock) {
    const size_t len = std::min(kBlock, logits.size() - b);
    float* out = weight != nullptr ? weight + b : block;
    for (size_t i = 0; i < len; ++i) out[i] = ExpNonPositive((logits[b + i] - mx) * inv_t);
    for (size_t i = 0; i < len; ++i) partial[(b + i) % kWays] += out[i];
  }
  double sum = 0.0;
  for (double v : partial) sum += v;
  return sum;
}

// The largest logit, NaN ignored unless logits[0] is NaN. Eight running maxima instead of one:
// a single chain of dependent compares was ~0.4 ms over a 129,280-token vocabulary, per token.
float MaxLogit(std::span<const float> logits) {
  constexpr size_t kWays = 8;
  float m[kWays];
  for (float& v : m) v = logits[0];
  size_t i = 0;
  for (; i + kWays <= logits.size(); i += kWays)
    for (size_t j = 0; j < kWays; ++j) m[j] = std::max(m[j], logits[i + j]);
  for (; i < logits.size(); ++i) m[0] = std::max(m[0], logits[i]);
  float best = m[0];
  for (float v : m) best = std::max(best, v);
  return best;
}

// Bucket of a weight e in [0, 1] (its binary exponent below 1, clamped to [0, kBuckets - 1]):
// a larger e never has a larger bucket and equal weights share one, so the tokens of buckets
// 0 .. b are a prefix of the sampler's order (weights fall with the logit).
constexpr int kBuckets = 64;
int WeightBucket(float e) {
  const int exponent = static_cast<int>(std::bit_cast<uint32_t>(e) >> 23);  // e >= 0
  return std::clamp(127 - exponent, 0, kBuckets - 1);
}

// Candidates with top_k: the k best tokens, in order; the original algorithm on them.
int32_t SampleTopK(std::span<const float> logits, const SamplingParams& p, float max_logit,
                   double u) {
  const size_t n = logits.size(), keep0 = std::min<size_t>(n, static_cast<size_t>(p.top_k));
  // Candidates: the tokens within `margin` of the largest logit, the margin doubled until they
  // are at least k (a counting pass each); every token when the margin runs out. Selecting among
  // them gives the k best of all, since any token outside is below every candidate.
  std::vector<int32_t> order;
  for (float margin = 1.0f; std::isfinite(margin) && order.empty(); margin *= 2.0f) {
    const float floor = max_logit - margin;
    size_t count = 0;
    for (float v : logits) count += v >= floor ? 1 : 0;
    if (count < keep0) continue;
    order.reserve(count);
    for (size_t i = 0; i < n; ++i)
      if (logits[i] >= floor) order.push_back(static_cast<int32_t>(i));
  }
  if (order.empty()) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
  }
  std::nth_element(order.begin(), order.begin() + (keep0 - 1), order.end(), ByLogit{logits});
  std::sort(order.begin(), order.begin() + keep0, ByLogit{logits});
  const double inv_t = 1.0 / p.temperature;
  const double mx = logits[order[0]];
  std::vector<double> prob(keep0);
  double sum = 0.0;
  for (size_t i = 0; i < keep0; ++i) sum += (prob[i] = std::exp((logits[order[i]] - mx) * inv_t));
  for (auto& v : prob) v /= sum;
  const size_t keep = KeptByMinPTopP(prob, p.min_p, p.top_p);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += prob[i];
  double target = u * total;
  for (size_t i = 0; i < keep; ++i) {
    target -= prob[i];
    if (target < 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace

size_t KeptByMinPTopP(std::span<const double> prob, double min_p, double top_p) {
  size_t keep = prob.size();
  if (min_p > 0.0) {
    const double floor = min_p * prob[0];
    size_t k = 1;
    while (k < keep && prob[k] >= floor) ++k;
    keep = k;
  }
  if (top_p < 1.0) {
    double cum = 0.0;
    size_t k = 0;
    while (k < keep) {
      cum += prob[k++];
      if (cum >= top_p) break;
    }
    keep = std::max<size_t>(1, k);
  }
  return keep;
}

int32_t ArgMax(std::span<const float> logits) {
  if (logits.empty()) return 0;
  const float best = MaxLogit(logits);
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] == best) return static_cast<int32_t>(i);
  return 0;  // NaN at index 0
}

// Without top_k, every token is a candidate, and ordering all of them (a 129,280-token sort,
// ~29 ms per sampled token, which at batch 16 cost twice the forward step) is not needed: the
// kept set and the sampled token lie in the prefix of the order whose weight reaches a target
// (top_p of the total, or the sample's share of the kept weight). Weights are bucketed by
// binary exponent in one pass; only the buckets that reach the target are sorted, and the walk
// falls back to the whole kept set in the rare case that rounding leaves the target short.
int32_t Sample(std::span<const float> logits, const SamplingParams& p, uint64_t step) {
  if (logits.empty()) return -1;
  if (p.temperature <= 0.0 || p.top_k == 1) return ArgMax(logits);
  const double u = UniformFromCounter(p.seed, step);
  const float mx = MaxLogit(logits);
  if (!std::isfinite(mx)) return ArgMax(logits);  // +inf wins outright; all -inf: nothing better
  if (p.top_k > 0) return SampleTopK(logits, p, mx, u);
  const size_t n = logits.size();
  // weight [n]: exp((logit - max) / T) in [0, 1] (NaN logits weigh 0), the top token's 1; a
  // token is kept by min_p when its weight is at least min_p.
  const float inv_t = static_cast<float>(1.0 / p.temperature);
  if (!std::isfinite(inv_t)) return ArgMax(logits);  // T below float range: greedy
  // At most 1: the top token (weight exactly 1) is always kept.
  const float min_weight = static_cast<float>(std::clamp(p.min_p, 0.0, 1.0));
  auto kept = [min_weight](float e) { return e >= min_weight && e > 0.0f; };
  std::vector<float> weight(n);
  const double total = Weights(logits, mx, inv_t, weight.data());
  // The kept tokens' weight, in all (the same eight partial sums) and per bucket (four sets of
  // buckets, by id, so that a bucket's adds are four chains instead of one).
  constexpr int kWays = 8, kBucketSets = 4;
  double kept_partial[kWays] = {};
  double bucket_sets[kBucketSets][kBuckets] = {};
  for (size_t i = 0; i < n; ++i) {
    const float e = weight[i];
    if (kept(e)) {
      kept_partial[i % kWays] += e;
      bucket_sets[i % kBucketSets][WeightBucket(e)] += e;
    }
  }
  double kept_total = 0.0;
  for (double v : kept_partial) kept_total += v;
  std::array<double, kBuckets> bucket_weight{};
  for (int b = 0; b < kBuckets; ++b)
    for (const auto& set : bucket_sets) bucket_weight[b] += set[b];
  const bool nucleus = p.top_p < 1.0;
  // The prefix weight to reach: top_p of all tokens' weight, or the sample's point in the kept.
  const double target = nucleus ? p.top_p * total : u * kept_total;
  int last_bucket = 0;
  for (double reached = 0.0; last_bucket < kBuckets - 1; ++last_bucket) {
    reached += bucket_weight[last_bucket];
    if (reached > target * (1.0 + 1e-9)) break;  // margin: bucket sums are in another order
  }
  auto collect = [&](int up_to_bucket) {
    std::vector<int32_t> order;
    for (size_t i = 0; i < n; ++i)
      if (kept(weight[i]) && WeightBucket(weight[i]) <= up_to_bucket)
        order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(), ByLogit{logits});
    return order;
  };
  std::vector<int32_t> order = collect(last_bucket);
  // The first prefix of `order` whose weight reaches `goal` (strictly past it when `past`): its
  // length, or 0 when order falls short.
  auto prefix_reaching = [&](double goal, bool past) -> size_t {
    double cum = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += weight[order[i]];
      if (past ? cum > goal : cum >= goal) return i + 1;
    }
    return 0;
  };
  // prefix_reaching on the bucketed candidates, widened to every kept token when they fall short.
  auto reaching_target = [&](bool past) {
    size_t k = prefix_reaching(target, past);
    if (k == 0 && last_bucket < kBuckets - 1) {
      last_bucket = kBuckets - 1;
      order = collect(last_bucket);
      k = prefix_reaching(target, past);
    }
    return k;
  };
  if (nucleus) {
    const size_t k = reaching_target(false);
    if (k > 0) order.resize(k);  // else short of top_p even with every kept token: all of them
    double nucleus_total = 0.0;
    for (int32_t t : order) nucleus_total += weight[t];
    const size_t pick = prefix_reaching(u * nucleus_total, true);
    return order[pick == 0 ? order.size() - 1 : pick - 1];
  }
  const size_t pick = reaching_target(true);
  return order[pick == 0 ? order.size() - 1 : pick - 1];
}

void AdjustLogits(std::span<float> logits, const LogitsAdjustments& adj,
                  std::span<const int32_t> prompt, std::span<const int32_t> generated) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (adj.repetition_penalty != 1.0) {
    std::vector<bool> seen(vocab, false);
    for (int32_t t : prompt)
      if (t >= 0 && t < vocab) seen[t] = true;
    for (int32_t t : generated)
      if (t >= 0 && t < vocab) seen[t] = true;
    const float p = static_cast<float>(adj.repetition_penalty);
    for (int32_t t = 0; t < vocab; ++t)
      if (seen[t]) logits[t] = logits[t] > 0 ? logits[t] / p : logits[t] * p;
  }
  if (adj.presence_penalty != 0.0 || adj.frequency_penalty != 0.0) {
    std::vector<int32_t> counts(vocab, 0);
    for (int32_t t : generated)
      if (t >= 0 && t < vocab) ++counts[t];
    for (int32_t t = 0; t < vocab; ++t)
      if (counts[t] > 0)
        logits[t] -= static_cast<float>(adj.presence_penalty + adj.frequency_penalty * counts[t]);
  }
  if (adj.logit_bias)
    for (const auto& [t, b] : *adj.logit_bias)
      if (t >= 0 && t < vocab) logits[t] += b;
  if (adj.banned)
    for (int32_t t : *adj.banned)
      if (t >= 0 && t < vocab) logits[t] = -INFINITY;
}

// log(sum(exp(logits))): the exponentials in float (relative error ~1e-7, below what a float
// logprob carries), summed in double; a pass in double exponentials took 0.63 ms over 129,280
// logits, and the engine paid it twice per token (the token's logprob and the top ones).
double LogSumExp(std::span<const float> logits) {
  const float mx = MaxLogit(logits);
  if (!std::isfinite(mx)) return mx;
  return mx + std::log(Weights(logits, mx, 1.0f, nullptr));
}

float LogprobOf(std::span<const float> logits, int32_t token, double* log_normalizer) {
  const double lz = LogSumExp(logits);
  if (log_normalizer) *log_normalizer = lz;
  return static_cast<float>(logits[token] - lz);
}

std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logits, int k,
                                                   const double* log_normalizer) {
  const double lz = log_normalizer != nullptr ? *log_normalizer : LogSumExp(logits);
  k = std::min<int>(k, static_cast<int>(logits.size()));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), ByLogit{logits});
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < k; ++i) out.push_back({idx[i], static_cast<float>(logits[idx[i]] - lz)});
  return out;
}

}  // namespace dsinfer::runtime
