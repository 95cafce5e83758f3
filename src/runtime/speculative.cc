#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsinfer::runtime {

namespace {

// The sampler's token order: larger logit first, lower id on ties (sampler.cc's ByLogit).
struct ByLogit {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

TokenDistribution OneHot(int32_t token) { return {{token}, {1.0}}; }

// Normalises weights [tokens] into a distribution (the caller guarantees a positive sum).
TokenDistribution Normalised(std::vector<int32_t> tokens, std::vector<double> weights) {
  double sum = 0.0;
  for (double w : weights) sum += w;
  for (double& w : weights) w /= sum;
  return {std::move(tokens), std::move(weights)};
}

// Sample's top-k path (SampleTopK): the k best tokens, double-precision softmax at 1 / T, then
// min_p against the best, then the top_p prefix.
TokenDistribution TopKDistribution(std::span<const float> logits, const SamplingParams& p) {
  const size_t keep0 = std::min(logits.size(), static_cast<size_t>(p.top_k));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<int64_t>(keep0), order.end(),
                    ByLogit{logits});
  order.resize(keep0);
  const double inv_t = 1.0 / p.temperature, mx = logits[order[0]];
  std::vector<double> prob(keep0);
  double sum = 0.0;
  for (size_t i = 0; i < keep0; ++i) sum += (prob[i] = std::exp((logits[order[i]] - mx) * inv_t));
  for (double& v : prob) v /= sum;
  const size_t keep = KeptByMinPTopP(prob, p.min_p, p.top_p);
  order.resize(keep);
  prob.resize(keep);
  return Normalised(std::move(order), std::move(prob));
}

}  // namespace

double TokenDistribution::ProbOf(int32_t token) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == token) return probs[i];
  return 0.0;
}

TokenDistribution SamplingDistribution(std::span<const float> logits, const SamplingParams& p) {
  if (logits.empty()) return {};
  if (p.temperature <= 0.0 || p.top_k == 1) return OneHot(ArgMax(logits));
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);  // NaN never wins std::max's comparison
  if (!std::isfinite(mx)) return OneHot(ArgMax(logits));
  if (p.top_k > 0) return TopKDistribution(logits, p);
  const float inv_t = static_cast<float>(1.0 / p.temperature);
  if (!std::isfinite(inv_t)) return OneHot(ArgMax(logits));
  // Sample's weights: exp((logit - max) / T) in float, kept by min_p, top_p of ALL the weight.
  const float min_weight = static_cast<float>(std::clamp(p.min_p, 0.0, 1.0));
  std::vector<int32_t> kept;
  std::vector<float> weight(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    weight[i] = ExpNonPositive((logits[i] - mx) * inv_t);
    total += weight[i];
    if (weight[i] >= min_weight && weight[i] > 0.0f) kept.push_back(static_cast<int32_t>(i));
  }
  if (p.top_p < 1.0) {
    std::sort(kept.begin(), kept.end(), ByLogit{logits});
    double cum = 0.0;
    for (size_t i = 0; i < kept.size(); ++i) {
      cum += weight[kept[i]];
      if (cum >= p.top_p * total) {
        kept.resize(i + 1);
        break;
      }
    }
  }
  std::vector<double> w(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) w[i] = weight[kept[i]];
  return Normalised(std::move(kept), std::move(w));
}

int32_t SampleFrom(const TokenDistribution& dist, double u) {
  double cum = 0.0;
  for (size_t i = 0; i < dist.tokens.size(); ++i) {
    cum += dist.probs[i];
    if (u < cum) return dist.tokens[i];
  }
  return dist.tokens.empty() ? -1 : dist.tokens.back();  // rounding left u past the sum
}

DraftVerdict VerifyDraft(const TokenDistribution& p, const TokenDistribution& q, int32_t draft,
                         double u_accept, double u_resample) {
  const double pd = p.ProbOf(draft), qd = q.ProbOf(draft);
  if (qd > 0.0 && u_accept * qd < pd) return {true, draft};
  // q by token id, dense: a full-vocabulary q (sampling without top-k) has 129,280 entries.
  int32_t max_id = 0;
  for (int32_t t : p.tokens) max_id = std::max(max_id, t);
  std::vector<double> q_of(static_cast<size_t>(max_id) + 1, 0.0);  // [max_id + 1]
  for (size_t i = 0; i < q.tokens.size(); ++i)
    if (q.tokens[i] <= max_id) q_of[q.tokens[i]] = q.probs[i];
  std::vector<int32_t> tokens;
  std::vector<double> residual;
  for (size_t i = 0; i < p.tokens.size(); ++i) {
    const double r = p.probs[i] - q_of[p.tokens[i]];
    if (r > 0.0) {
      tokens.push_back(p.tokens[i]);
      residual.push_back(r);
    }
  }
  if (tokens.empty()) return {false, SampleFrom(p, u_resample)};
  return {false, SampleFrom(Normalised(std::move(tokens), std::move(residual)), u_resample)};
}

}  // namespace dsinfer::runtime
