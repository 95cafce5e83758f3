// Latency statistics for `bench serve`: mean, median, p90, p99 over a sample of durations.
// Percentiles use linear interpolation between closest ranks (numpy's default "linear" method,
// which vLLM's benchmark_serving reports): rank = p/100 * (n-1), value = x[floor] +
// frac * (x[ceil] - x[floor]) over the sorted sample. An empty sample gives all zeros, count 0.
#pragma once

#include <cstdint>
#include <vector>

namespace dsinfer::measure {

struct LatencyStats {
  int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};

// p in [0, 100]; `sorted` ascending and non-empty.
double Percentile(const std::vector<double>& sorted, double p);
LatencyStats Summarize(std::vector<double> values);

}  // namespace dsinfer::measure
