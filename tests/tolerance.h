// The single tolerance table of the numerical tests. Every entry states where its number comes
// from (error analysis or measured reference-vs-reference drift). Never loosen one silently:
// change it here with the before/after figures in the commit message and in docs/NUMERICS.md.
#pragma once

namespace dsinfer::tolerance {

// Golden logits, engine (fp32-reference numerics) vs transformers fp32 on the same checkpoint.
// Both sides compute in fp32 with exactly dequantized weights; they differ only by summation
// order and libm (exp, pow, cos/sin). Error analysis: per-op relative error ~ n*eps32 with n <= 2048
// terms -> ~1e-4 worst case per op, ~1e-6 typical; through ~10 sub-layers the NMSE stays <= 1e-8
// (measured: see docs/NUMERICS.md). Budget = 1e-6 NMSE per position (100x the measured drift) so a
// single wrong op (NMSE >= 1e-3 for any real bug seen so far) cannot hide.
inline constexpr double kGoldenLogitsNmse = 1e-6;
// Worst element |a - b| / (max |b| over the row): measured <= 1e-4; budget 1e-3.
inline constexpr double kGoldenLogitsMaxRel = 1e-3;
// Greedy continuation: a step whose reference top-1/top-2 margin is below this is a near-tie:
// either token is accepted there and the comparison of that prompt stops (tolerance policy 2).
// 1e-3 logits = 10x the worst measured logit error.
inline constexpr double kGreedyTieMargin = 1e-3;
// MTP logits vs the oracle assembled from transformers modules: same numerics as above.
inline constexpr double kMtpLogitsNmse = 1e-6;

}  // namespace dsinfer::tolerance
