// Lossless speculative decoding, the sampling side: the distribution the sampler draws from (so a
// draft's and the target's can be compared), and the standard rejection rule (Leviathan et al.
// 2023; Chen et al. 2023): a draft token x drawn from q is accepted with probability
// min(1, p(x) / q(x)); on rejection the token is drawn from the normalised residual
// max(0, p - q). The emitted token is then distributed exactly as p, whatever q is. Greedy is the
// special case p = one-hot(argmax): accepted exactly when the draft matches. Pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/sampler.h"

namespace dsinfer::runtime {

// A distribution over token ids with finite support: probs sum to 1 (tokens distinct).
struct TokenDistribution {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
  double ProbOf(int32_t token) const;
};

// The distribution Sample(logits, params, step) draws from (temperature, top-k, min-p, top-p,
// in Sample's order and with its weights; greedy and degenerate logits: one token with 1).
// logits are the adjusted ones (penalties, bias and bans already applied).
TokenDistribution SamplingDistribution(std::span<const float> logits, const SamplingParams& params);

// The token at uniform u in [0, 1) of the cumulative distribution (in the distribution's order).
int32_t SampleFrom(const TokenDistribution& dist, double u);

struct DraftVerdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the residual's draw
};

// The rejection rule for one draft token drawn from q, against the target p: accepted when
// u_accept * q(draft) < p(draft); else the token at u_resample of the normalised max(0, p - q)
// (p itself when the residual has no mass, i.e. p == q up to rounding).
DraftVerdict VerifyDraft(const TokenDistribution& p, const TokenDistribution& q, int32_t draft,
                         double u_accept, double u_resample);

}  // namespace dsinfer::runtime
