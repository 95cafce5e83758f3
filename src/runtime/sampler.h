// Token sampling from fp32 logits. Deterministic per request: the random stream is a pure
// function of (seed, step), so a request samples the same tokens whatever else is batched.
// Thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dsinfer::runtime {

struct SamplingParams {
  double temperature = 1.0;  // 0 -> greedy
  double top_p = 1.0;
  int top_k = 0;             // 0 -> disabled
  double min_p = 0.0;
  uint64_t seed = 0;
};

// Counter-based generator (splitmix64 of seed and counter): reproducible and order-free.
double UniformFromCounter(uint64_t seed, uint64_t counter);

// Returns the index of the largest logit (lowest index on ties).
int32_t ArgMax(std::span<const float> logits);

// Samples one token. `step` is the request's decode step (selects the random number).
int32_t Sample(std::span<const float> logits, const SamplingParams& params, uint64_t step);

}  // namespace dsinfer::runtime
