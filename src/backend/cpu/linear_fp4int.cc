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
    ++row.qualifying;
  }
  return row;
}

namespace {

// Twice the e2m1 values of one 32-column FP4 block (16 bytes of codes) as int16 words in the
// order of Fp4IntRow::a: w[0] holds columns 0, 8, 1, 9, .., 7, 15, w[1] columns 16, 24, .., 31.
inline void Fp4IntWords(const uint8_t* p, __m256i w[2]) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  // From [lo0..lo3, hi0..hi3, lo4..lo7, hi4..hi7] (lo j: column 2 j, hi j: column 2 j + 1) to
  // columns 0, 8, 1, 9, .., 7, 15.
  const __m128i pairs = _mm_setr_epi8(0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15);
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_and_si128(bytes, mask);                     // even columns' codes
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);  // odd columns' codes
  w[0] = _mm256_cvtepi8_epi16(
      _mm_shuffle_epi8(lut, _mm_shuffle_epi8(_mm_unpacklo_epi32(lo, hi), pairs)));
  w[1] = _mm256_cvtepi8_epi16(
      _mm_shuffle_epi8(lut, _mm_shuffle_epi8(_mm_unpackhi_epi32(lo, hi), pairs)));
}

// Dword lane l: the exact sum over columns l, 8 + l, 16 + l, 24 + l of the block's words times
// the token's integers a [32] (Fp4IntRow::a of the block), as fp32 (below 2^21: exact).
inline __m256 Fp4IntSum(const __m256i w[2], const int16_t* a) {
  return _mm256_cvtepi32_ps(_mm256_add_epi32(
      _mm256_madd_epi16(w[0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_madd_epi16(w[1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16)))));
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

// M tokens x R FP4 rows from row r, in groups of 8 blocks: the blocks where every token's factor
// is nonzero for every row take the integer route; for the others the FP32 route's block sums
// (GemvRowBlock's) are formed first, in a loop of their own, so the integer loop carries no fp32
// decoder (fewer live registers). Each (row, token) gets the same fma(., ., acc) per block in
// the same order and the same final sum as GemvRowBlock<M, R>: bit-identical.
template <int M, int R>
void GemvFp4IntRowBlock(const WeightMatrix& w, int64_t r, const Fp4IntRow* xi, const float* x,
                        float* y, int64_t ldy, int64_t y_col) {
  const int64_t k = w.cols, blocks = k / 32;
  const uint8_t* rows = w.data + r * (k / 2);  // [R, k/2]
  __m256 acc[R][M];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < M; ++j) acc[i][j] = _mm256_setzero_ps();
  float scales[R][8] = {};
  float factors[M][R][8];
  alignas(32) float parts[8][R][M][8];  // [block of the group][row][token][lane]
  for (int64_t g = 0; g < blocks; g += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, blocks - g));
    Fp4BlockScales<R>(w, r, g, scales);
    int integer = (1 << n) - 1;
    for (int j = 0; j < M; ++j)
      for (int i = 0; i < R; ++i)
        integer &= Fp4IntFactors(scales[i], xi[j].unit.data() + g, n, factors[j][i]);
    for (int b = 0; b < n; ++b) {
      if (integer >> b & 1) continue;
      for (int i = 0; i < R; ++i) {
        __m256 wv[4];
        LoadE2M1x32(rows + i * (k / 2) + (g + b) * 16, wv);
        for (int j = 0; j < M; ++j)
          _mm256_store_ps(parts[b][i][j], Fp4BlockPart(wv, x + j * k + 32 * (g + b)));
      }
    }
    for (int b = 0; b < n; ++b) {
      if (integer >> b & 1) {
        for (int i = 0; i < R; ++i) {
          __m256i words[2];
          Fp4IntWords(rows + i * (k / 2) + (g + b) * 16, words);
          for (int j = 0; j < M; ++j)
            acc[i][j] = _mm256_fmadd_ps(Fp4IntSum(words, &xi[j].a[32 * (g + b)]),
                                        _mm256_broadcast_ss(&factors[j][i][b]), acc[i][j]);
        }
        continue;
      }
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < M; ++j)
          acc[i][j] = _mm256_fmadd_ps(_mm256_load_ps(parts[b][i][j]),
                                      _mm256_broadcast_ss(&scales[i][b]), acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < M; ++j) y[j * ldy + y_col + i] = HorizontalSum(acc[i][j]);
}

template <int M>
void IntRows(const WeightMatrix& w, int64_t r0, int64_t r1, const Fp4IntRow* xi, const float* x,
             float* y, int64_t ldy) {
  constexpr int kRows = 4 / M;  // as GemvRows: about four chains in flight
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) GemvFp4IntRowBlock<M, kRows>(w, r, xi, x, y, ldy, r - r0);
  for (; r < r1; ++r) GemvFp4IntRowBlock<M, 1>(w, r, xi, x, y, ldy, r - r0);
}

}  // namespace

void Fp4IntRows(const WeightMatrix& w, int64_t r0, int64_t r1, const Fp4IntRow* xi, int m,
                const float* x, float* y, int64_t ldy) {
  if (m == 1)
    IntRows<1>(w, r0, r1, xi, x, y, ldy);
  else
    IntRows<2>(w, r0, r1, xi, x, y, ldy);
}

}  // namespace dsinfer::backend::cpu::fused

#endif
