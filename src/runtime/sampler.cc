#include "runtime/sampler.h"

#include <algorithm>
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

int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

int32_t Sample(std::span<const float> logits, const SamplingParams& p, uint64_t step) {
  if (logits.empty()) return -1;
  if (p.temperature <= 0.0 || p.top_k == 1) return ArgMax(logits);
  const size_t n = logits.size();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  size_t keep = n;
  if (p.top_k > 0) keep = std::min<size_t>(keep, static_cast<size_t>(p.top_k));
  // Softmax over the kept candidates at temperature T (double for a stable cumulative sum).
  const double inv_t = 1.0 / p.temperature;
  const double mx = logits[order[0]];
  std::vector<double> prob(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((logits[order[i]] - mx) * inv_t));
  for (auto& v : prob) v /= sum;
  if (p.min_p > 0.0) {
    double floor = p.min_p * prob[0];
    size_t k = 1;
    while (k < keep && prob[k] >= floor) ++k;
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
  double u = UniformFromCounter(p.seed, step) * total;
  for (size_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u < 0.0) return order[i];
  }
  return order[keep - 1];
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

float LogprobOf(std::span<const float> logits, int32_t token, double* log_normalizer) {
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  double lz = mx + std::log(sum);
  if (log_normalizer) *log_normalizer = lz;
  return static_cast<float>(logits[token] - lz);
}

std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logits, int k) {
  double lz;
  LogprobOf(logits, 0, &lz);
  k = std::min<int>(k, static_cast<int>(logits.size()));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < k; ++i) out.push_back({idx[i], static_cast<float>(logits[idx[i]] - lz)});
  return out;
}

}  // namespace dsinfer::runtime
