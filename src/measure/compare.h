// Numerical comparison of two greedy generations that carry top-k logprobs (two OpenAI-compatible
// endpoints serving the same checkpoint, `dsinfer compare endpoints`), and of two logits arrays
// (`dsinfer compare logits`).
//
// Generations: positions are compared in order up to the first divergence (the two sides chose
// different tokens); after it the contexts differ, so nothing later is compared. At each agreeing
// position: |Δ logprob| over the tokens in both top-k sets (and over the chosen token when a
// side's top-k omits it), and a KL(A||B) estimate over the union
// of both top-k sets, each side renormalized over that union, a token missing from one side's
// top-k getting that side's smallest top-k logprob (an upper bound on its true logprob: it ranked
// below all k). Verdict: fail when a divergence is not a near-tie (A's logprob of its own token
// minus A's logprob of B's token >= tie_margin, or B's token absent from A's top-k), or when the
// max |Δ logprob| or the max KL exceed their thresholds.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace dsinfer::measure {

struct TokenStep {
  std::string token;                  // the chosen token (text as the server reports it)
  double logprob = 0;                 // its logprob
  std::map<std::string, double> top;  // top-k alternatives: token text -> logprob
};

struct CompareThresholds {
  double max_abs_logprob_delta = 0.1;  // nats, over shared top-k tokens at agreeing positions
  double max_kl = 0.01;                // nats, top-k estimate per position
  double tie_margin = 0.01;            // nats: a divergence below this margin is a near-tie
};

struct SequenceComparison {
  int64_t compared = 0;          // positions compared (agreeing positions)
  int64_t divergence = -1;       // first index where the tokens differ, -1 if none
  std::string token_a, token_b;  // the tokens at the divergence
  bool a_in_b_top = false, b_in_a_top = false;
  bool near_tie = false;  // the divergence is within tie_margin on side A
  double mean_abs_delta = 0, max_abs_delta = 0;
  int64_t max_delta_position = -1;
  double mean_kl = 0, max_kl = 0;
  int64_t max_kl_position = -1;
  bool pass = true;
  std::string reason;  // why it failed, naming the position; empty on pass
};

// KL(A||B) estimate over the union of the two top-k sets (see the header comment).
double TopKKlEstimate(const std::map<std::string, double>& a,
                      const std::map<std::string, double>& b);

SequenceComparison CompareSequences(std::span<const TokenStep> a, std::span<const TokenStep> b,
                                    const CompareThresholds& thresholds);

// Two logits arrays [n, vocab] (float32, row-major).
struct LogitsComparison {
  double nmse = 0;  // sum (a-b)^2 / sum b^2 over all entries (b is the reference)
  double max_abs = 0;
  int64_t argmax_agree = 0;  // rows whose argmax matches
  int64_t rows = 0;
  double max_kl = 0;  // max over rows of KL(softmax(b) || softmax(a))
  int64_t max_kl_row = -1;
  int64_t first_argmax_mismatch = -1;
};
LogitsComparison CompareLogits(std::span<const float> a, std::span<const float> b, int64_t vocab);

}  // namespace dsinfer::measure
