// Element types of checkpoint tensors and their exact scalar codecs.
// All codecs are pure functions (thread-safe). Encoders round to nearest, ties to even,
// matching torch's dtype casts (verified exhaustively in tests/core/codec_test.cc).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace dsinfer {

enum class DType : uint8_t {
  kF32,
  kF64,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: bias 7, max 448, no inf, NaN = 0x7f/0xff
  kF8E8M0,  // float8_e8m0fnu: value 2^(code-127), 0xff = NaN
  kI8,      // in V4 checkpoints: packed FP4 e2m1 pairs (low nibble = even element)
  kU8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// Safetensors dtype string ("BF16", "F8_E4M3", ...) <-> DType.
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);
std::string_view SafetensorsName(DType dtype);
size_t DTypeSize(DType dtype);

// ---- bfloat16 -------------------------------------------------------------------------------
inline float Bf16ToF32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline uint16_t F32ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
// Rounds an fp32 value to the nearest bf16 value and returns it as fp32.
inline float RoundBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

// ---- float16 --------------------------------------------------------------------------------
float F16ToF32(uint16_t h);

// ---- rounding to a small float grid ---------------------------------------------------------
// Rounds |v| to the grid of a float format whose binade [2^e, 2^(e+1)) holds 2^mantissa_bits
// values and whose smallest normal binade is 2^min_normal_exponent (below it the step stays
// 2^(min_normal_exponent - mantissa_bits): the subnormals), ties to even, keeping v's sign.
// The caller has clamped v to the format's range and excluded NaN. Exact: the grid step is a
// power of two, so v / step is formed exactly and the magic-number add rounds it to an integer
// (|v / step| <= 2^(mantissa_bits + 1) << 2^23) in the default round-to-nearest-even mode.
template <int kMantissaBits, int kMinNormalExponent>
inline float RoundToSmallFloatGrid(float v) {
  float a = std::fabs(v);
  int exponent = static_cast<int>((std::bit_cast<uint32_t>(a) >> 23) & 0xff) - 127;
  int step_exponent =
      (exponent < kMinNormalExponent ? kMinNormalExponent : exponent) - kMantissaBits;
  float inv_step = std::bit_cast<float>(static_cast<uint32_t>(127 - step_exponent) << 23);
  float step = std::bit_cast<float>(static_cast<uint32_t>(127 + step_exponent) << 23);
  constexpr float kRoundingMagic = 12582912.0f;   // 1.5 * 2^23: the sum's ulp is 1
  float shifted = a * inv_step + kRoundingMagic;  // not folded: no -ffast-math (Warnings.cmake)
  return std::copysign((shifted - kRoundingMagic) * step, v);
}

// ---- FP8 e4m3fn ----------------------------------------------------------------------------
float E4M3ToF32(uint8_t code);
// Saturating RNE cast as used by the reference after clamping to +-448 (NaN -> 0x7f).
uint8_t F32ToE4M3(float f);
// E4M3ToF32(F32ToE4M3(v)) for finite v with |v| <= 448, without forming the code.
inline float RoundToE4M3(float v) { return RoundToSmallFloatGrid<3, -6>(v); }
// ---- FP4 e2m1 ------------------------------------------------------------------------------
inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline float E2M1ToF32(uint8_t nibble) { return kE2M1Values[nibble & 0xf]; }
// RNE to the e2m1 grid with saturation at +-6 (ties go to the even code).
uint8_t F32ToE2M1(float f);
// E2M1ToF32(F32ToE2M1(v)) for finite v with |v| <= 6, without forming the code.
inline float RoundToE2M1(float v) { return RoundToSmallFloatGrid<1, 0>(v); }
// ---- e8m0 scale ----------------------------------------------------------------------------
inline float E8M0ToF32(uint8_t code) {
  if (code == 0xff) return std::nanf("");
  if (code == 0) return std::ldexp(1.0f, -127);  // subnormal fp32, exact
  return std::bit_cast<float>(static_cast<uint32_t>(code) << 23);
}

// Power-of-two scale exponent ceil(log2(f)) computed from the bits, as the reference's
// ue8m0 scale rounding does: exponent_bits - 127 + (mantissa != 0). f must be positive, normal.
inline int CeilLog2FromBits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  int exponent = static_cast<int>((u >> 23) & 0xff) - 127;
  return exponent + ((u & 0x7fffff) != 0 ? 1 : 0);
}

}  // namespace dsinfer
