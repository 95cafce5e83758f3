#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsinfer::runtime {

double UniformFromCounter(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + counter * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull;
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

}  // namespace dsinfer::runtime
