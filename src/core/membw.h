// A STREAM-like memory bandwidth probe: the read bandwidth this machine sustains with the
// given pool, measured in the same run as a benchmark so roofline ratios compare like with like.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace dsinfer {

struct BandwidthResult {
  double read_gbps = 0;  // GB/s (1e9 bytes) reading, median of repeats
  double copy_gbps = 0;  // GB/s counting read + write bytes
  int64_t bytes = 0;     // working-set size
};

// Working set should be far larger than the last-level cache (default 1 GiB). measure_copy =
// false skips the second buffer and the copy passes (copy_gbps 0): for callers that only need
// the read bandwidth, such as a probe before every benchmark step.
BandwidthResult MeasureMemoryBandwidth(ThreadPool& pool, int64_t bytes = int64_t{1} << 30,
                                       int repeats = 5, bool measure_copy = true);

}  // namespace dsinfer
