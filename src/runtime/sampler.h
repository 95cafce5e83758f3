// Token sampling from fp32 logits. Deterministic per request: the random stream is a pure
// function of (seed, step), so a request samples the same tokens whatever else is batched.
// Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dsinfer::runtime {

struct SamplingParams {
  double temperature = 1.0;  // 0 -> greedy
  double top_p = 1.0;
  int top_k = 0;  // 0 -> disabled
  double min_p = 0.0;
  uint64_t seed = 0;
  bool has_seed = false;  // false: the engine draws a seed per request
};

// Penalties and biases applied to logits before sampling (vLLM/OpenAI semantics).
struct LogitsAdjustments {
  double presence_penalty = 0.0;    // subtract once for every token already generated
  double frequency_penalty = 0.0;   // subtract per occurrence in the generated tokens
  double repetition_penalty = 1.0;  // divide positive / multiply negative logits of seen tokens
  const std::vector<std::pair<int32_t, float>>* logit_bias = nullptr;
  const std::vector<int32_t>* banned = nullptr;  // set to -inf (EOS/stop ids before min_tokens)
};

// prompt: the request's prompt ids; generated: ids sampled so far.
void AdjustLogits(std::span<float> logits, const LogitsAdjustments& adj,
                  std::span<const int32_t> prompt, std::span<const int32_t> generated);

// log(sum(exp(logits))), the log-softmax normalizer.
double LogSumExp(std::span<const float> logits);
// log_softmax(logits)[token] (*log_normalizer, when given, receives LogSumExp) and the top-k
// (token, logprob) pairs, best first (ties: lower id first); log_normalizer, when given, is
// LogSumExp(logits) already computed.
float LogprobOf(std::span<const float> logits, int32_t token, double* log_normalizer = nullptr);
std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logits, int k,
                                                   const double* log_normalizer = nullptr);

// exp(x) for x <= 0 (a logit minus the largest one, times 1 / T), in float: within 2e-7 of the
// exact value (relative; subnormal results within one subnormal step), exactly 1 at 0 and 0 for
// x <= -104, -inf and NaN (a NaN logit weighs nothing). Branch-free, so loops over a vocabulary
// vectorize: glibc's expf, a call per logit, was most of the sampler's time (0.8 of 0.9 ms per
// token over 129,280).
float ExpNonPositive(float x);

// Counter-based generator (splitmix64 of seed and counter): reproducible and order-free.
double UniformFromCounter(uint64_t seed, uint64_t counter);

// The top-k path's cut: of candidates in the sampler's order with probabilities prob (summing
// to 1, non-empty), how many min_p (against the first) and then top_p keep (at least one).
size_t KeptByMinPTopP(std::span<const double> prob, double min_p, double top_p);

// Returns the index of the largest logit (lowest index on ties).
int32_t ArgMax(std::span<const float> logits);

// Samples one token. `step` is the request's decode step (selects the random number).
int32_t Sample(std::span<const float> logits, const SamplingParams& params, uint64_t step);

}  // namespace dsinfer::runtime
