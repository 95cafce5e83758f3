// Parser for the Prometheus text exposition format, enough to read histograms from /metrics:
// `name{le="0.5"} 3`, `name_sum 1.2`, `name_count 3`. Used to check `bench serve` figures against a
// server's own histograms.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsinfer::measure {

struct PromHistogram {
  std::vector<std::pair<double, double>> buckets;  // (upper bound "le", cumulative count), sorted
  double sum = 0;
  double count = 0;
  // The bucket index holding the q-quantile (q in [0,1]): first bucket whose cumulative count
  // reaches q*count. Returns -1 for an empty histogram.
  int QuantileBucket(double q) const;
};

// Histograms by base name (without _bucket/_sum/_count). Samples with labels other than `le`
// are ignored for simplicity (dsinfer's histograms carry only `le`).
Result<std::map<std::string, PromHistogram>> ParsePrometheusHistograms(const std::string& text);

// One /metrics scrape: counters (samples named *_total, summed over their label sets, so
// `request_success_total{finished_reason=...}` becomes one request count) and histograms.
struct PromSnapshot {
  std::map<std::string, double> counters;
  std::map<std::string, PromHistogram> histograms;
};
Result<PromSnapshot> ParsePrometheusSnapshot(const std::string& text);
// after - before for every counter and histogram (bucket by bucket, matched on "le") in `after`;
// what `before` lacks counts as 0. Attributes a scrape-to-scrape window's traffic to one level.
PromSnapshot SnapshotDelta(const PromSnapshot& before, const PromSnapshot& after);

}  // namespace dsinfer::measure
