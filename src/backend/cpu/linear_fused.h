// Building blocks of the CPU's fused FP32 kernels (linear.cc: one-row GEMV, linear_panel.cc:
// register-blocked panels): weight decoders that are exact in fp32 and the horizontal sum.
// Both kernels compute every (row, token) dot product with the same instruction sequence, so a
// token's result never depends on which kernel or batch it went through; these shared helpers
// are half of that guarantee.
// Internal to backend/cpu; AVX2 + FMA + F16C builds only.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DSINFER_X86_AVX2 1

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace dsinfer::backend::cpu::fused {

// Lanes summed pairwise in a fixed order (the last step of every fused dot product).
inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

// 8 bf16 -> fp32 (exact).
inline __m256 LoadBf16x8(const uint8_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 e4m3 codes -> fp32 * 2^-8 (the 2^8 bias correction is folded into the block scale). The
// bits move into fp16 position; e4m3 subnormals become fp16 subnormals of the same value.
// Sign-extending the byte and shifting it by 7 puts the sign at bit 15, the exponent and
// mantissa at bits 13..7 and a copy of the sign at bit 14, which the mask clears: three integer
// ops instead of two masks, two shifts and an or.
inline __m256 LoadE4M3x8(const uint8_t* p) {
  const __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(
      _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16(static_cast<int16_t>(0xBFFF))));
}

// 32 e2m1 codes (16 bytes, low nibble = even column) -> 4 x 8 fp32 holding twice their values
// (integers -12 .. 12, exact), columns in order. Twice every e2m1 value is an fp16 whose low
// byte is zero, so one byte lookup gives its high byte and a zero byte beside it makes the fp16:
// one lookup, two unpacks and a conversion per 16 weights instead of sign extensions to 32 bits
// and int-to-float conversions.
inline void LoadE2M1x32(const uint8_t* p, __m256 out[4]) {
  const __m128i lut =
      _mm_setr_epi8(0x00, 0x3C, 0x40, 0x42, 0x44, 0x46, 0x48, 0x4A,  // 0 .. 12
                    static_cast<char>(0x80), static_cast<char>(0xBC), static_cast<char>(0xC0),
                    static_cast<char>(0xC2), static_cast<char>(0xC4), static_cast<char>(0xC6),
                    static_cast<char>(0xC8), static_cast<char>(0xCA));  // -0 ..
  const __m128i mask = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
  __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m128i lo = _mm_and_si128(bytes, mask);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  __m128i h0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));  // columns 0..15
  __m128i h1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));  // columns 16..31
  out[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, h0));
  out[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, h0));
  out[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, h1));
  out[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, h1));
}

// The FP32 route's sum of one 32-column FP4 block (wv: LoadE2M1x32) with 32 activations x: lane l
// over columns l, 8 + l, 16 + l, 24 + l in that order, from zero by FMA (like the FP8 blocks).
inline __m256 Fp4BlockPart(const __m256 (&wv)[4], const float* x) {
  __m256 p = _mm256_setzero_ps();
  for (int q = 0; q < 4; ++q) p = _mm256_fmadd_ps(wv[q], _mm256_loadu_ps(x + 8 * q), p);
  return p;
}

// Scale(row, column) x 0.5 of FP4 rows r .. r + R - 1 for the 8 blocks of 32 columns from
// `block` (fewer at the end of a row): e8m0 codes 1 .. 254 are the fp32 exponent bits; 0 and
// 255 (2^-127 and NaN) take Scale()'s general decode. The 0.5 undoes LoadE2M1x32's doubling.
template <int R>
inline void Fp4BlockScales(const model::WeightMatrix& w, int64_t r, int64_t block,
                           float (*out)[8]) {
  const int64_t n = std::min<int64_t>(8, w.scale_cols - block);
  for (int i = 0; i < R; ++i) {
    if (n == 8 && w.scale_dtype != DType::kF32) {
      const uint8_t* codes = w.scales + (r + i) * w.scale_cols + block;
      const __m256i c =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
      const __m256i special = _mm256_or_si256(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()),
                                              _mm256_cmpeq_epi32(c, _mm256_set1_epi32(255)));
      if (_mm256_testz_si256(special, special)) {
        _mm256_storeu_ps(out[i], _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(c, 23)),
                                               _mm256_set1_ps(0.5f)));
        continue;
      }
    }
    for (int64_t b = 0; b < n; ++b) out[i][b] = w.Scale(r + i, (block + b) * 32) * 0.5f;
  }
}

// The FP8 block scale that goes with LoadE4M3x8's codes: Scale(r, c) x 2^8.
inline float Fp8BlockScale(const model::WeightMatrix& w, int64_t r, int64_t c) {
  return w.Scale(r, c) * 256.0f;
}

// Rows [r0, r1) of w (r1 - r0 <= 16) against m >= 1 token rows x [m, w.cols], register-blocked
// over column panels that stay in L1 (linear_panel.cc). Writes y[j * ldy + y_offset + r - r0],
// bit-identical to the one-row GEMV of linear.cc for every (row, token).
void PanelRows(const model::WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t m,
               float* y, int64_t ldy, int64_t y_offset);

// One token row of an FP4 matmul as exact integers (exact_int16.h), for the integer route of
// the one-token GEMV. a [k] int16: each 32-column block in the order of the madd pairs, column
// l beside column 8 + l ([x0, x8, x1, x9, .., x7, x15, x16, x24, ..]), so that dword lane l of
// the sums covers columns l, 8 + l, 16 + l and 24 + l, the FP32 route's lane l. unit [k / 32]:
// 2^shift, or 0 where the block takes the FP32 route. The route is used only where the FP32
// route's block sum is exact as well (every partial sum an integer below 2^24 times 2^shift),
// so both give the same bits and a token's result never depends on which one ran.
struct Fp4IntRow {
  std::vector<int16_t> a;   // [k]
  std::vector<float> unit;  // [k / 32 rounded up to 8]
  int64_t qualifying = 0;   // blocks with a nonzero unit
};

// Token row x [k] (k a multiple of 32) in that form.
Fp4IntRow MakeFp4IntRow(const float* x, int64_t k);

// FP4 rows [r0, r1) of w against m = 1 or 2 token rows x [m, k] given also as xi [m]. Writes
// y[j * ldy + r - r0], bit-identical to the GEMV of linear.cc (GemvRowBlock<m, R>). (At 3
// tokens the FP32 GEMV measured faster: 9.0-10.0 against 7.5-8.5 GMAC/s per core.)
void Fp4IntRows(const model::WeightMatrix& w, int64_t r0, int64_t r1, const Fp4IntRow* xi, int m,
                const float* x, float* y, int64_t ldy);

}  // namespace dsinfer::backend::cpu::fused

#endif
