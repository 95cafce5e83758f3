// Activations as exact small integers, for the FP4 integer routes (linear_amx_vector.cc on
// AVX-512, linear.cc on AVX2). Twice an e2m1 value is an integer in [-12, 12]; when a chunk's
// activations are integers A times a common 2^shift with |A| <= 32767, a dot product of up to 32
// of them with e2m1 weights is an integer below 2^24 times 2^shift, so any fp32 chain that sums
// it is exact and an integer dot product gives the same value. FP8-quantized activations (e4m3
// times a power-of-two block scale) nearly always qualify.
// Internal to backend/cpu.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace dsinfer::backend::cpu {

// Writes x[i] = a[i] * 2^shift for i < n and returns true when every x[i] is zero or a normal
// number and the integers fit int16 (|a| <= 32767); shift is the exponent of the lowest set bit
// over the chunk (0 for an all-zero chunk). Returns false otherwise (a and shift then unspecified).
// The AVX-512 integer route (linear_amx_vector.cc, ChunkAsBytePlanes) makes the same integers
// under its own bound (on the sum of |a|, for its byte planes); each kernel's edge tests pin its
// rule.
inline bool ChunkAsInt16(const float* x, int n, int* shift, int16_t* a) {
  int low = 1000;  // lowest set bit's exponent over the nonzero values
  for (int i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu;
    if (bits == 0) continue;
    const int biased = static_cast<int>(bits >> 23);
    if (biased == 0 || biased == 255) return false;               // subnormal, infinite or NaN
    const uint32_t significand = (bits & 0x7fffffu) | 0x800000u;  // x = significand 2^(biased-150)
    low = std::min(low, biased - 150 + std::countr_zero(significand));
  }
  if (low == 1000) low = 0;  // all zero
  for (int i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
    const uint32_t magnitude_bits = bits & 0x7fffffffu;
    int32_t magnitude = 0;
    if (magnitude_bits != 0) {
      const uint32_t significand = (magnitude_bits & 0x7fffffu) | 0x800000u;
      const int up = static_cast<int>(magnitude_bits >> 23) - 150 - low;  // >= -countr_zero
      if (up > 0) return false;  // significand * 2^up >= 2^24
      magnitude = static_cast<int32_t>(significand >> -up);
      if (magnitude > 32767) return false;
    }
    a[i] = static_cast<int16_t>((bits >> 31) != 0 ? -magnitude : magnitude);
  }
  *shift = low;
  return true;
}

}  // namespace dsinfer::backend::cpu
