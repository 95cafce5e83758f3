// The one-token FP4 GEMV's integer route (AVX2): when a token's activations in a 32-column block
// are exact small integers times a power of two (exact_int16.h; FP8-quantized activations
// nearly always are), the block's dot products with the e2m1 weights are exact integer sums
// that VPMADDWD forms without converting a weight to fp32. The FP32 route (linear.cc's
// GemvRowBlock) sums such a block exactly as well, so both routes give the same bits and the
// route never changes a result; only the time: per 32 weights a lookup, a sign extension and
// two VPMADDWD instead of four fp16 conversions and four FMAs (docs/PERF.md).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/exact_int16.h"
#include "backend/cpu/linear_fused.h"

#ifdef DSINFER_X86_AVX2

namespace dsinfer::backend::cpu::fused {

using model::WeightMatrix;

Fp4IntRow MakeFp4IntRow(const float* x, int64_t k) {
  // unit padded to whole groups of 8 blocks (Fp4IntFactors reads 8).
  Fp4IntRow row{std::vector<int16_t>(k), std::vector<float>((k / 32 + 7) / 8 * 8, 0.0f)};
  for (int64_t b = 0; b < k / 32; ++b) {
    int shift = 0;
    int16_t values[32];
    // Per lane 4 terms, sums below 4 * 12 * 32767 < 2^21 times 2^shift: finite for shift <= 106.
    // (Normal values have shift >= -149, and multiples of 2^-149 below 2^-126 are exact
    // subnormals, so no lower bound; Fp4IntFactors checks each block's factor.)
    if (!ChunkAsInt16(x + 32 * b, 32, &shift, values) || shift > 106) continue;
    int16_t* dst = row.a.data() + 32 * b;
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 8; ++l) {
        dst[16 * h + 2 * l] = values[16 * h + l];
        dst[16 * h + 2 * l + 1] = values[16 * h + 8 + l];
      }
    row.unit[b] = std::ldexp(1.0f, shift);
  }
  return row;
}

namespace {

// Integer route of one 32-column FP4 block (16 bytes of codes) against a Fp4IntRow block (a0:
// its first 16 words, a1: the rest): dword lane l = the exact sum over columns l, 8 + l, 16 + l,
// 24 + l of twice the e2m1 value times the integer activation.
inline __m256i Fp4IntBlock(const uint8_t* p, __m256i a0, __m256i a1) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  // From [lo0..lo3, hi0..hi3, lo4..lo7, hi4..hi7] (lo j: column 2 j, hi j: column 2 j + 1) to
  // columns 0, 8, 1, 9, .., 7, 15.
  const __m128i pairs = _mm_setr_epi8(0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15);
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_and_si128(bytes, mask);                     // even columns' codes
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);  // odd columns' codes
  const __m128i v0 = _mm_shuffle_epi8(lut, _mm_shuffle_epi8(_mm_unpacklo_epi32(lo, hi), pairs));
  const __m128i v1 = _mm_shuffle_epi8(lut, _mm_shuffle_epi8(_mm_unpackhi_epi32(lo, hi), pairs));
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(v0), a0),
                          _mm256_madd_epi16(_mm256_cvtepi8_epi16(v1), a1));
}

// The integer route's factors for the 8 blocks of scales (Fp4BlockScales' output, n valid) and
// unit (Fp4IntRow::unit from the same block, padded): scale x 2^shift where that product is a
// normal number, else 0 (the block takes the FP32 route). A normal product of a power of two is
// exact, so fma(sum, scale x 2^shift, acc) then rounds exactly like the FP32 route's
// fma(sum x 2^shift, scale, acc); a subnormal, infinite or NaN one would not (0 x inf).
// Returns the mask of blocks with a nonzero factor.
inline int Fp4IntFactors(const float* scales, const float* unit, int64_t n, float* out) {
  const __m256 s = _mm256_loadu_ps(scales), u = _mm256_loadu_ps(unit), f = _mm256_mul_ps(s, u);
  // Biased exponent in 1 .. 254: normal.
  const auto normal = [](__m256 v) {
    const __m256i e =
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 23), _mm256_set1_epi32(0xff));
    return _mm256_and_si256(_mm256_cmpgt_epi32(e, _mm256_setzero_si256()),
                            _mm256_cmpgt_epi32(_mm256_set1_epi32(255), e));
  };
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i ok = normal(f);
  ok = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_EQ_OQ)),
                           ok);
  ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes));
  _mm256_storeu_ps(out, _mm256_and_ps(f, _mm256_castsi256_ps(ok)));
  return _mm256_movemask_ps(_mm256_castsi256_ps(ok));
}

// The one-token GEMV of R FP4 rows with the token as exact integers (xi): blocks whose factor
// is nonzero for all R rows take the integer route, the others GemvRowBlock<1, R>'s FP32 step.
// Same lanes, same fma(., ., acc) per block in the same order, same final sum: bit-identical to
// GemvRowBlock.
template <int R>
void GemvFp4IntRowBlock(const WeightMatrix& w, int64_t r, const Fp4IntRow& xi, const float* x,
                        float* y, int64_t y_col) {
  const int64_t k = w.cols;
  const uint8_t* rows = w.data + r * (k / 2);  // [R, k/2]
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  float scales[R][8] = {};
  float factors[R][8];
  int integer = 0;  // blocks of the current group on the integer route
  for (int64_t c0 = 0; c0 < k; c0 += 32) {
    const int64_t block = c0 / 32;
    if (block % 8 == 0) {
      const int64_t n = std::min<int64_t>(8, k / 32 - block);
      Fp4BlockScales<R>(w, r, block, scales);
      integer = 0xff;
      for (int i = 0; i < R; ++i)
        integer &= Fp4IntFactors(scales[i], xi.unit.data() + block, n, factors[i]);
    }
    if (integer >> (block % 8) & 1) {
      const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&xi.a[c0]));
      const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&xi.a[c0 + 16]));
      for (int i = 0; i < R; ++i) {
        const __m256 sum = _mm256_cvtepi32_ps(Fp4IntBlock(rows + i * (k / 2) + c0 / 2, a0, a1));
        acc[i] = _mm256_fmadd_ps(sum, _mm256_broadcast_ss(&factors[i][block % 8]), acc[i]);
      }
      continue;
    }
    for (int i = 0; i < R; ++i) {  // GemvRowBlock<1, R>'s step
      __m256 wv[4];
      LoadE2M1x32(rows + i * (k / 2) + c0 / 2, wv);
      __m256 p = _mm256_setzero_ps();
      for (int q = 0; q < 4; ++q) p = _mm256_fmadd_ps(wv[q], _mm256_loadu_ps(x + c0 + 8 * q), p);
      acc[i] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&scales[i][block % 8]), acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[y_col + i] = HorizontalSum(acc[i]);
}

}  // namespace

void Fp4IntRows(const WeightMatrix& w, int64_t r0, int64_t r1, const Fp4IntRow& xi, const float* x,
                float* y) {
  constexpr int kRows = 4;  // as GemvRowBlock<1, 4>: four independent chains
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) GemvFp4IntRowBlock<kRows>(w, r, xi, x, y, r - r0);
  for (; r < r1; ++r) GemvFp4IntRowBlock<1>(w, r, xi, x, y, r - r0);
}

}  // namespace dsinfer::backend::cpu::fused

#endif
