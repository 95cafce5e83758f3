// Chi-square tests for the sampling tests: goodness of fit of counts to a distribution, and the
// homogeneity of two samples of equal size, with cells of small expected count pooled; the
// critical value by the Wilson-Hilferty approximation (within 1 % of the exact quantile for
// df >= 3 at these levels).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace dsinfer::testing {

struct ChiSquare {
  double statistic = 0.0;
  int df = 0;
  double critical = 0.0;  // the statistic's quantile at 1 - alpha
  bool Rejects() const { return statistic > critical; }
};

// z = the standard normal's 1 - alpha quantile (3.719: alpha = 1e-4; 3.090: alpha = 1e-3).
inline double ChiSquareCritical(int df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// counts[i] against n * probs[i]; cells expected below 5 pooled into one.
inline ChiSquare GoodnessOfFit(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                               double z) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  ChiSquare r;
  double pooled_obs = 0, pooled_exp = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    if (e < 5.0) {
      pooled_obs += static_cast<double>(counts[i]), pooled_exp += e;
      continue;
    }
    r.statistic += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (pooled_exp > 0) {
    r.statistic += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
    ++cells;
  }
  r.df = std::max(1, cells - 1);
  r.critical = ChiSquareCritical(r.df, z);
  return r;
}

// Two samples of equal size over the same cells (keys): sum (a - b)^2 / (a + b), cells with
// a + b < 10 pooled into one.
template <typename Key>
ChiSquare Homogeneity(const std::map<Key, int64_t>& a, const std::map<Key, int64_t>& b, double z) {
  std::map<Key, std::pair<int64_t, int64_t>> cells;
  for (const auto& [k, v] : a) cells[k].first = v;
  for (const auto& [k, v] : b) cells[k].second = v;
  ChiSquare r;
  int64_t pooled_a = 0, pooled_b = 0;
  int n = 0;
  for (const auto& [k, ab] : cells) {
    const auto [x, y] = ab;
    if (x + y < 10) {
      pooled_a += x, pooled_b += y;
      continue;
    }
    r.statistic += static_cast<double>((x - y) * (x - y)) / static_cast<double>(x + y);
    ++n;
  }
  if (pooled_a + pooled_b > 0) {
    r.statistic += static_cast<double>((pooled_a - pooled_b) * (pooled_a - pooled_b)) /
                   static_cast<double>(pooled_a + pooled_b);
    ++n;
  }
  r.df = std::max(1, n - 1);
  r.critical = ChiSquareCritical(r.df, z);
  return r;
}

}  // namespace dsinfer::testing
