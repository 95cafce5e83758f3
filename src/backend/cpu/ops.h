// Elementwise and small per-token ops of the V4 forward on fp32 buffers (spec §3, §4, §9).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layer_plan.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu {

void RoundBf16InPlace(float* x, int64_t n);

// y = w * (x * rsqrt(mean(x^2) + eps)) over rows of n; w is a bf16/f32 view of [n] (or none).
void RmsNormRows(float* x, int64_t rows, int64_t n, const model::TensorView* weight, double eps,
                 bool round_bf16);

// Per-layer rotary frequencies (interleaved pairs, last rope_dim dims; YaRN on compressed layers).
struct RopeTable {
  std::vector<float> inv_freq;  // [rope_dim / 2] f32
  // rope_theta, or compress_rope_theta with YaRN where the plan says (compressed layers).
  static RopeTable ForPlan(const model::ModelConfig& c, const model::LayerPlan& plan);
};
// Rotates x[0..rope_dim) (the rope part of a head) in place by position pos (inverse: -theta).
void ApplyRope(const RopeTable& rope, float* x, int64_t pos, bool inverse, bool round_bf16);

// mHC (spec §4). H: [hc, hidden] one token's streams. A token's mix is HcMixFloats floats:
// pre [hc], post [hc], comb [hc, hc] (comb[j*hc + k]: source j -> destination k).
inline int HcMixFloats(const model::ModelConfig& c) { return 2 * c.hc_mult + c.hc_mult * c.hc_mult; }
void HcPre(const model::ModelConfig& c, const model::HcParams& p, const float* H, float* x,
           float* mix, bool round_bf16);
// The mix alone (pre, post, comb), and the collapse x = sum_j pre[j] * H[j]: HcPre is the two,
// bit for bit; V4.1's single-pass mHC collapses with a pre carried from the previous sublayer.
void HcMix(const model::ModelConfig& c, const model::HcParams& p, const float* H, float* mix);
void HcCollapse(const model::ModelConfig& c, const float* pre, const float* H, float* x,
                bool round_bf16);
// H[k] <- post_k * a + sum_j comb[j][k] * H[j]
void HcPost(const model::ModelConfig& c, const float* mix, const float* a, float* H,
            bool round_bf16);
// y = sum_j (sigmoid(m_j * scale + base_j) + eps) * H[j]
void HcHead(const model::ModelConfig& c, const model::HcParams& p, const float* H, float* y,
            bool round_bf16);

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// V4.1's compressed KV round trip (spec §14.2; docs/NUMERICS.md, V4.1 assumption 3): per block
// of `block`, s = e4m3(max(amax, 6 * 2^-9) / 6) (fp32 division, RNE; saturated at 448) and
// x <- e2m1(clamp(x / s, +-6)) * s, exact in bf16.
void Fp4E4m3RoundTripInPlace(float* x, int n, int block);

// SwiGLU's gate activation, x / (1 + e^-x).
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// Silu of the bf16 value with these bits, bit for bit, from a table Silu made (256 KiB, made once,
// read-only after). In the official numerics the experts round the gate to bf16 first, so the
// lookup replaces an expf per element: the SwiGLU of a batch-16 decode step's routed experts took
// 5.0 ms of CPU time with one, 4.0 ms with the table, on the Sapphire Rapids VM of docs/PERF.md.
float SiluOfBf16(uint16_t bits);

}  // namespace dsinfer::backend::cpu
