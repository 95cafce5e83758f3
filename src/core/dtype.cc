#include "core/dtype.h"

#include <array>

namespace dsinfer {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 12> kDTypes = {{
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E8M0, "F8_E8M0", 1},
    {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},
    {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},
    {DType::kI64, "I64", 8},
    {DType::kBool, "BOOL", 1},
}};

// Decoded value of every e4m3fn code, built once at compile time.
constexpr std::array<float, 256> BuildE4M3Table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    int sign = code >> 7;
    int exponent = (code >> 3) & 0xf;
    int mantissa = code & 7;
    float value = 0.0f;
    if (exponent == 0xf && mantissa == 7) {
      value = __builtin_nanf("");
    } else if (exponent == 0) {
      value = static_cast<float>(mantissa) / 512.0f;  // m * 2^-9
    } else {
      float m = 1.0f + static_cast<float>(mantissa) / 8.0f;
      float p = 1.0f;
      for (int i = 0; i < exponent; ++i) p *= 2.0f;
      value = m * p / 128.0f;  // 2^(e-7)
    }
    table[code] = sign ? -value : value;
  }
  return table;
}
constexpr std::array<float, 256> kE4M3Table = BuildE4M3Table();

}  // namespace

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

std::string_view SafetensorsName(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

float F16ToF32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? std::nanf("") : INFINITY;
  } else {
    value =
        std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, static_cast<int>(exponent) - 15);
  }
  return sign ? -value : value;
}

float E4M3ToF32(uint8_t code) { return kE4M3Table[code]; }

// The grid value's bits give the code: below 2^-6 the code is the value in units of 2^-9
// (up to 8, which is also 2^-6's normal code); above, exponent + 7 and the top 3 mantissa bits.
uint8_t F32ToE4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (the reference clamps to +-448 first)
  float r = RoundToE4M3(a);             // at most 448
  if (r < 0.015625f) return sign | static_cast<uint8_t>(r * 512.0f);
  uint32_t u = std::bit_cast<uint32_t>(r);
  int exponent = static_cast<int>(u >> 23) - 127;
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | ((u >> 20) & 7));
}

// Codes 0..7 hold the grid's magnitudes in order.
uint8_t F32ToE2M1(float f) {
  if (std::isnan(f)) return 0x7;  // no NaN in e2m1; saturate like the reference's clamp
  uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  float a = std::fabs(f);
  if (a >= 6.0f) return sign | 0x7;
  float r = RoundToE2M1(a);
  // 0, 0.5, 1, 1.5 -> 0..3 (steps of 0.5); 2, 3 -> 4, 5; 4, 6 -> 6, 7.
  int code = r < 2.0f   ? static_cast<int>(r * 2.0f)
             : r < 4.0f ? static_cast<int>(r) + 2
                        : static_cast<int>(r * 0.5f) + 4;
  return sign | static_cast<uint8_t>(code);
}

}  // namespace dsinfer
