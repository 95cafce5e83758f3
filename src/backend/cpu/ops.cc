#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "backend/cpu/linear.h"
#include "core/dtype.h"

namespace dsinfer::backend::cpu {

void RoundBf16InPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = RoundBf16(x[i]);
}

void RmsNormRows(float* x, int64_t rows, int64_t n, const model::TensorView* weight, double eps,
                 bool round_bf16) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    float ss = Dot(row, row, n);
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
    for (int64_t i = 0; i < n; ++i) {
      float v = row[i] * inv;
      if (weight) v *= weight->F32At(i);
      row[i] = round_bf16 ? RoundBf16(v) : v;
    }
  }
}

RopeTable RopeTable::ForPlan(const model::ModelConfig& c, const model::LayerPlan& plan) {
  RopeTable t;
  int d = c.rope_dim;
  const bool compressed = plan.rope_yarn;
  double base = compressed ? c.compress_rope_theta : c.rope_theta;
  t.inv_freq.resize(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    // fp32 like the reference: base ** (2i / d) in fp32, then its reciprocal.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    t.inv_freq[i] = 1.0f / std::pow(static_cast<float>(base), exponent);
  }
  if (compressed) {
    // YaRN (spec §9): frequencies past the correction range are divided by `factor`.
    auto corr = [&](double n_rot) {
      return d *
             std::log(static_cast<double>(c.yarn.original_seq_len) /
                      (n_rot * 2 * std::numbers::pi)) /
             (2 * std::log(base));
    };
    double low = std::max(std::floor(corr(c.yarn.beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(c.yarn.beta_slow)), static_cast<double>(d - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < d / 2; ++i) {
      float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
      float f = t.inv_freq[i];
      t.inv_freq[i] = f / static_cast<float>(c.yarn.factor) * ramp + f * (1.0f - ramp);
    }
  }
  return t;
}

void ApplyRope(const RopeTable& rope, float* x, int64_t pos, bool inverse, bool round_bf16) {
  int n = static_cast<int>(rope.inv_freq.size());
  float p = static_cast<float>(pos);
  for (int i = 0; i < n; ++i) {
    float theta = p * rope.inv_freq[i];  // fp32 outer product, as the reference
    float c = static_cast<float>(std::cos(static_cast<double>(theta)));
    float s = static_cast<float>(std::sin(static_cast<double>(theta)));
    if (inverse) s = -s;
    float a = x[2 * i], b = x[2 * i + 1];
    float ra = a * c - b * s, rb = a * s + b * c;
    x[2 * i] = round_bf16 ? RoundBf16(ra) : ra;
    x[2 * i + 1] = round_bf16 ? RoundBf16(rb) : rb;
  }
}

namespace {

// m = (fn . v) * rsqrt(mean(v^2) + eps) for all rows of fn; v = the flattened streams.
void HcMixes(const model::ModelConfig& c, const model::HcParams& p, const float* H, int64_t n_rows,
             float* m) {
  int64_t n = static_cast<int64_t>(c.hc_mult) * c.hidden;
  float ss = Dot(H, H, n);
  float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(c.norm_eps));
  const float* fn = reinterpret_cast<const float*>(p.fn.data);
  // Dot(fn row j, H) for every j, bit for bit, kSharedRowsMax rows per pass over H: one Dot at a
  // time ran a single chain of n / 16 dependent FMAs (the mHC mixing of a batch-16 decode step
  // took 3.6 ms that way, 3.1 ms this way, on the Sapphire Rapids VM of docs/PERF.md).
  for (int64_t j0 = 0; j0 < n_rows; j0 += kSharedRowsMax) {
    const int n_a = static_cast<int>(std::min<int64_t>(kSharedRowsMax, n_rows - j0));
    DotSharedRows(fn + j0 * n, n, n_a, &H, 1, n, m + j0, 1);
  }
  for (int64_t j = 0; j < n_rows; ++j) m[j] *= r;
}

float F32(const model::TensorView& t, int64_t i) { return t.F32At(i); }

}  // namespace

void HcPre(const model::ModelConfig& c, const model::HcParams& p, const float* H, float* x,
           float* mix, bool round_bf16) {
  HcMix(c, p, H, mix);
  HcCollapse(c, mix, H, x, round_bf16);
}

void HcCollapse(const model::ModelConfig& c, const float* pre, const float* H, float* x,
                bool round_bf16) {
  const int hc = c.hc_mult;
  const int64_t d = c.hidden;
  for (int64_t i = 0; i < d; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j) acc += pre[j] * H[j * d + i];
    x[i] = round_bf16 ? RoundBf16(acc) : acc;
  }
}

void HcMix(const model::ModelConfig& c, const model::HcParams& p, const float* H, float* mix) {
  const int hc = c.hc_mult;
  const float eps = static_cast<float>(c.hc_eps);
  std::vector<float> m(c.HcRows());
  HcMixes(c, p, H, c.HcRows(), m.data());
  float* pre = mix;
  float* post = mix + hc;
  float* C = mix + 2 * hc;  // [hc, hc]
  float s0 = F32(p.scale, 0), s1 = F32(p.scale, 1), s2 = F32(p.scale, 2);
  for (int j = 0; j < hc; ++j) {
    pre[j] = Sigmoid(m[j] * s0 + F32(p.base, j)) + eps;
    post[j] = 2.0f * Sigmoid(m[hc + j] * s1 + F32(p.base, hc + j));
  }
  for (int i = 0; i < hc * hc; ++i) C[i] = m[2 * hc + i] * s2 + F32(p.base, 2 * hc + i);
  // Sinkhorn: row softmax (+eps), column normalisation, then (iters-1) x [row, column].
  for (int j = 0; j < hc; ++j) {
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) mx = std::max(mx, C[j * hc + k]);
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum += (C[j * hc + k] = std::exp(C[j * hc + k] - mx));
    for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / sum + eps;
  }
  auto normalize_columns = [&] {
    for (int k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < hc; ++j) sum += C[j * hc + k];
      for (int j = 0; j < hc; ++j) C[j * hc + k] /= (sum + eps);
    }
  };
  auto normalize_rows = [&] {
    for (int j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += C[j * hc + k];
      for (int k = 0; k < hc; ++k) C[j * hc + k] /= (sum + eps);
    }
  };
  normalize_columns();
  for (int it = 1; it < c.hc_sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
}

void HcPost(const model::ModelConfig& c, const float* mix, const float* a, float* H,
            bool round_bf16) {
  const int hc = c.hc_mult;
  const int64_t d = c.hidden;
  const float* post = mix + hc;
  const float* comb = mix + 2 * hc;  // [hc, hc]
  std::vector<float> out(hc * d);
  for (int k = 0; k < hc; ++k) {
    for (int64_t i = 0; i < d; ++i) {
      float acc = post[k] * a[i];
      for (int j = 0; j < hc; ++j) acc += comb[j * hc + k] * H[j * d + i];
      out[k * d + i] = round_bf16 ? RoundBf16(acc) : acc;
    }
  }
  std::copy(out.begin(), out.end(), H);
}

void Fp4E4m3RoundTripInPlace(float* x, int n, int block) {
  constexpr float kFloor = 6.0f * 0x1p-9f;  // the smallest scale is e4m3's smallest subnormal
  for (int b0 = 0; b0 < n; b0 += block) {
    const int len = std::min(block, n - b0);
    float amax = 0.0f;
    for (int i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    const float s = RoundToE4M3(std::min(std::max(amax, kFloor) / 6.0f, 448.0f));
    for (int i = 0; i < len; ++i)
      x[b0 + i] = RoundToE2M1(std::clamp(x[b0 + i] / s, -6.0f, 6.0f)) * s;
  }
}

float SiluOfBf16(uint16_t bits) {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t b = 0; b < 65536; ++b) t[b] = Silu(Bf16ToF32(static_cast<uint16_t>(b)));
    return t;
  }();
  return table[bits];
}

void HcHead(const model::ModelConfig& c, const model::HcParams& p, const float* H, float* y,
            bool round_bf16) {
  const int hc = c.hc_mult;
  std::vector<float> m(hc), pre(hc);
  HcMixes(c, p, H, hc, m.data());
  for (int j = 0; j < hc; ++j)
    pre[j] = Sigmoid(m[j] * F32(p.scale, 0) + F32(p.base, j)) + static_cast<float>(c.hc_eps);
  const int64_t d = c.hidden;
  for (int64_t i = 0; i < d; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j) acc += pre[j] * H[j * d + i];
    y[i] = round_bf16 ? RoundBf16(acc) : acc;
  }
}

}  // namespace dsinfer::backend::cpu
