#include "measure/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/status.h"

namespace dsinfer::measure {

double Percentile(const std::vector<double>& sorted, double p) {
  DSINFER_CHECK(!sorted.empty() && p >= 0 && p <= 100);
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

LatencyStats Summarize(std::vector<double> values) {
  LatencyStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(s.count);
  s.median = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  s.min = values.front();
  s.max = values.back();
  return s;
}

}  // namespace dsinfer::measure
