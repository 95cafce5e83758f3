#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dtype.h"

namespace dsinfer {

float PowerOfTwoScale(float amax, float amax_floor, float inv_range) {
  float f = std::max(amax, amax_floor) * inv_range;  // a multiply, as the reference does
  return std::ldexp(1.0f, CeilLog2FromBits(f));
}

namespace {
constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;
// fp32(1/448) and fp32(1/6): the reference multiplies by these constants.
constexpr float kInvE4M3Max = 1.0f / 448.0f;
constexpr float kInvE2M1Max = 1.0f / 6.0f;
constexpr float kFp8AmaxFloor = 1e-4f;
constexpr float kFp4AmaxFloor = 6.0f * 1.1754943508222875e-38f;  // 6 * 2^-126

float BlockAmax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}
}  // namespace

void ActQuantFp8(const float* x, int n, int block, uint8_t* codes, float* scales) {
  for (int b0 = 0, ib = 0; b0 < n; b0 += block, ++ib) {
    int len = std::min(block, n - b0);
    float s = PowerOfTwoScale(BlockAmax(x + b0, len), kFp8AmaxFloor, kInvE4M3Max);
    scales[ib] = s;
    for (int i = 0; i < len; ++i) {
      float v = std::clamp(x[b0 + i] / s, -kE4M3Max, kE4M3Max);
      codes[b0 + i] = F32ToE4M3(v);
    }
  }
}

namespace {
// Per block: x <- bf16(grid(clamp(x / s, +-range)) * s) with s a power of two; grid(v) is the
// format's decode(encode(v)) (core/dtype.h), formed without the codes.
// A NaN input encodes as the format's NaN code (e4m3) or saturates to +range (e2m1, which has
// none), as the codec functions do; `nan_decoded` is that code's value.
template <float (*kRoundToGrid)(float)>
void RoundTripInPlace(float* x, int n, int block, float amax_floor, float inv_range, float range,
                      float nan_decoded) {
  for (int b0 = 0; b0 < n; b0 += block) {
    int len = std::min(block, n - b0);
    float s = PowerOfTwoScale(BlockAmax(x + b0, len), amax_floor, inv_range);
    for (int i = 0; i < len; ++i) {
      float v = x[b0 + i];
      float q = std::isnan(v) ? nan_decoded : kRoundToGrid(std::clamp(v / s, -range, range));
      x[b0 + i] = RoundBf16(q * s);
    }
  }
}
}  // namespace

void Fp8RoundTripInPlace(float* x, int n, int block) {
  RoundTripInPlace<RoundToE4M3>(x, n, block, kFp8AmaxFloor, kInvE4M3Max, kE4M3Max,
                                std::numeric_limits<float>::quiet_NaN());
}

void Fp4RoundTripInPlace(float* x, int n, int block) {
  RoundTripInPlace<RoundToE2M1>(x, n, block, kFp4AmaxFloor, kInvE2M1Max, kE2M1Max, kE2M1Max);
}

void HadamardInPlace(float* x, int n, bool round_to_bf16) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) x[i] = round_to_bf16 ? RoundBf16(x[i] * scale) : x[i] * scale;
}

}  // namespace dsinfer
