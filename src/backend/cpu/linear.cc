#include "backend/cpu/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/linear_amx.h"
#include "backend/cpu/linear_bf16dot.h"
#include "backend/cpu/linear_fused.h"
#include "core/dtype.h"

namespace dsinfer::backend::cpu {

using model::WeightFormat;
using model::WeightMatrix;

namespace {

void DequantFp8Row(const WeightMatrix& w, int64_t r, float* out) {
  const uint8_t* codes = w.data + r * w.cols;
  for (int64_t c0 = 0; c0 < w.cols; c0 += w.block) {
    int64_t len = std::min<int64_t>(w.block, w.cols - c0);
    float s = w.Scale(r, c0);
    int64_t i = 0;
#ifdef DSINFER_X86_AVX2
    // Exact: the codes' values times 2^-8, the exponent bias difference folded into the scale.
    __m256 vs = _mm256_set1_ps(s * 256.0f);
    for (; i + 8 <= len; i += 8)
      _mm256_storeu_ps(out + c0 + i, _mm256_mul_ps(fused::LoadE4M3x8(codes + c0 + i), vs));
#endif
    for (; i < len; ++i) out[c0 + i] = E4M3ToF32(codes[c0 + i]) * s;
  }
}

void DequantFp4Row(const WeightMatrix& w, int64_t r, float* out) {
  const uint8_t* packed = w.data + r * (w.cols / 2);
  for (int64_t c0 = 0; c0 < w.cols; c0 += 32) {
    float s = w.Scale(r, c0);
    const uint8_t* p = packed + c0 / 2;
    int64_t i = 0;
#ifdef DSINFER_X86_AVX2
    // 16 bytes = 32 nibbles; pshufb maps each nibble to 2*value as int8, exact in fp32.
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
    __m128i v0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));  // elements 0..15
    __m128i v1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));  // elements 16..31
    __m256 vs = _mm256_set1_ps(s * 0.5f);
    _mm256_storeu_ps(out + c0, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), vs));
    _mm256_storeu_ps(
        out + c0 + 8,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), vs));
    _mm256_storeu_ps(out + c0 + 16,
                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), vs));
    _mm256_storeu_ps(
        out + c0 + 24,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), vs));
    i = 32;
#endif
    for (; i < 32; i += 2) {
      uint8_t b = p[i / 2];
      out[c0 + i] = E2M1ToF32(b & 0xf) * s;
      out[c0 + i + 1] = E2M1ToF32(b >> 4) * s;
    }
  }
}

void DequantBf16Row(const WeightMatrix& w, int64_t r, float* out) {
  const uint8_t* src = w.data + r * w.cols * 2;
  int64_t i = 0;
#ifdef DSINFER_X86_AVX2
  for (; i + 8 <= w.cols; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(x));
  }
#endif
  for (; i < w.cols; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    out[i] = Bf16ToF32(b);
  }
}

// Four dot products of x with four weight rows, sharing the loads of x.
void Dot4(const float* x, const float* w0, const float* w1, const float* w2, const float* w3,
          int64_t n, float* out) {
  int64_t i = 0;
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#ifdef DSINFER_X86_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w0 + i), a0);
    a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w1 + i), a1);
    a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w2 + i), a2);
    a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w3 + i), a3);
  }
  s0 = fused::HorizontalSum(a0), s1 = fused::HorizontalSum(a1);
  s2 = fused::HorizontalSum(a2), s3 = fused::HorizontalSum(a3);
#endif
  for (; i < n; ++i) {
    s0 += x[i] * w0[i];
    s1 += x[i] * w1[i];
    s2 += x[i] * w2[i];
    s3 += x[i] * w3[i];
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

#ifdef DSINFER_X86_AVX2
using fused::Fp4BlockScales;
using fused::Fp8BlockScale;
using fused::HorizontalSum;
using fused::LoadBf16x8;
using fused::LoadE2M1x32;
using fused::LoadE4M3x8;

// Fused dequantize-and-dot of R weight rows with M token rows: each weight row is read once,
// converted in registers and multiplied into all M token rows, with no intermediate buffer.
// Writes y[j*ldy + y_col + i] for row r + i. R rows run side by side only to give the core
// independent FMA chains (at M = 1 a single row is one latency-bound chain); every (row, token)
// dot product is the same instruction sequence for any R and M, so results never depend on them.
// kFp8Block: the FP8 scale block's edge (V4 128, V4.1 32), a constant so the per-block loop
// unrolls.
template <int M, int R, int kFp8Block = 128>
void GemvRowBlock(const WeightMatrix& w, int64_t r, const float* x, float* y, int64_t ldy,
                  int64_t y_col) {
  const int64_t k = w.cols;
  __m256 acc[R][M];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < M; ++j) acc[i][j] = _mm256_setzero_ps();
  if (w.format == WeightFormat::kBF16) {
    const uint8_t* rows = w.data + r * k * 2;  // [R, k] bf16
    for (int64_t c = 0; c < k; c += 8) {
      for (int i = 0; i < R; ++i) {
        __m256 wv = LoadBf16x8(rows + i * k * 2 + 2 * c);
        for (int j = 0; j < M; ++j)
          acc[i][j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * k + c), acc[i][j]);
      }
    }
  } else if (w.format == WeightFormat::kFp8Block) {
    const uint8_t* rows = w.data + r * k;  // [R, k] e4m3, one scale per block x block tile
    for (int64_t c0 = 0; c0 < k; c0 += kFp8Block) {
      __m256 part[R][M];
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < M; ++j) part[i][j] = _mm256_setzero_ps();
      for (int64_t c = c0; c < c0 + kFp8Block; c += 8) {
        for (int i = 0; i < R; ++i) {
          __m256 wv = LoadE4M3x8(rows + i * k + c);
          for (int j = 0; j < M; ++j)
            part[i][j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * k + c), part[i][j]);
        }
      }
      for (int i = 0; i < R; ++i) {
        __m256 s = _mm256_set1_ps(Fp8BlockScale(w, r + i, c0));
        for (int j = 0; j < M; ++j) acc[i][j] = _mm256_fmadd_ps(part[i][j], s, acc[i][j]);
      }
    }
  } else {  // kFp4Packed: [R, k/2] bytes, two e2m1 codes each, one scale per 32 columns
    const uint8_t* rows = w.data + r * (k / 2);
    // The block scales (x 0.5: the decoder yields twice the e2m1 values) of 8 blocks at a time,
    // decoded together instead of one Scale() call per 32 weights inside the loop.
    float scales[R][8];
    for (int64_t c0 = 0; c0 < k; c0 += 32) {
      const int64_t block = c0 / 32;
      if (block % 8 == 0) Fp4BlockScales<R>(w, r, block, scales);
      for (int i = 0; i < R; ++i) {
        __m256 wv[4];
        LoadE2M1x32(rows + i * (k / 2) + c0 / 2, wv);
        const __m256 s = _mm256_broadcast_ss(&scales[i][block % 8]);
        for (int j = 0; j < M; ++j)
          acc[i][j] = _mm256_fmadd_ps(fused::Fp4BlockPart(wv, x + j * k + c0), s, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < M; ++j) y[j * ldy + y_col + i] = HorizontalSum(acc[i][j]);
}

// Rows [r0, r1) against M token rows; y[j*ldy + y_offset + (r - r0)]. Fewer tokens, more rows
// side by side, so about four independent accumulator chains are always in flight.
// xi: the M tokens as exact integers (FP4 weights, M <= 2: fused::Fp4IntRows), or null.
template <int M>
void GemvRows(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, float* y, int64_t ldy,
              int64_t y_offset, const fused::Fp4IntRow* xi = nullptr) {
  if (M <= 2 && xi) {
    fused::Fp4IntRows(w, r0, r1, xi, M, x, y + y_offset, ldy);
    return;
  }
  constexpr int kRows = M >= 4 ? 1 : 4 / M;
  int64_t r = r0;
  if (w.format == WeightFormat::kFp8Block && w.block == 32) {  // V4.1's 32x32 blocks
    for (; r + kRows <= r1; r += kRows)
      GemvRowBlock<M, kRows, 32>(w, r, x, y, ldy, y_offset + (r - r0));
    for (; r < r1; ++r) GemvRowBlock<M, 1, 32>(w, r, x, y, ldy, y_offset + (r - r0));
    return;
  }
  for (; r + kRows <= r1; r += kRows) GemvRowBlock<M, kRows>(w, r, x, y, ldy, y_offset + (r - r0));
  for (; r < r1; ++r) GemvRowBlock<M, 1>(w, r, x, y, ldy, y_offset + (r - r0));
}

bool FusedGemvApplies(const WeightMatrix& w) {
  switch (w.format) {
    case WeightFormat::kBF16:
      return w.cols % 8 == 0;
    case WeightFormat::kFp8Block:
      return (w.block == 128 || w.block == 32) && w.cols % w.block == 0;
    case WeightFormat::kFp4Packed:
      return w.cols % 32 == 0;
    default:
      return false;
  }
}

// The register-blocked panels (linear_panel.cc) decode FP8 weights in 128-column blocks only:
// V4.1's 32x32 blocks stay on the GEMV at every token count (the same instruction sequence per
// output, so batch invariance holds).
bool PanelsApply(const WeightMatrix& w) {
  return w.format != WeightFormat::kFp8Block || w.block == 128;
}
#endif

}  // namespace

#if defined(DSINFER_X86_AVX2) && defined(__AVX512F__)
// The attention kernels below on AVX-512 (compiled in when the build's -march has it), with the
// AVX2 kernels' arithmetic lane for lane: a zmm holds their two 8-lane chains, acc0 in lanes
// 0..7 and acc1 in lanes 8..15, which see the same columns in the same order, so every result
// is bit for bit the AVX2 one while each instruction does twice the work (attention at batch
// 16 spent ~4 % of a decode step in these kernels; docs/PERF.md, 2026-12-05, seventh session).
#define DSINFER_X86_AVX512_ROWS 1
namespace {
// GCC 12's AVX-512 headers start some intrinsics from an undefined vector, which trips
// -Wuninitialized once inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// acc0 + acc1 of a zmm of two 8-lane chains.
inline __m256 FoldChains(__m512 acc) {
  return _mm256_add_ps(_mm512_castps512_ps256(acc),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}  // namespace
#endif

float Dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(DSINFER_X86_AVX512_ROWS)
  __m512 acc = _mm512_setzero_ps();  // [acc0 | acc1]
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  s = fused::HorizontalSum(FoldChains(acc));
#elif defined(DSINFER_X86_AVX2)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  s = fused::HorizontalSum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

namespace {

// Column i of the weighted row sum for weight vector j: one fused multiply-add per row, in order.
float AxpyColumn(const float* pj, const float* const* rows, int64_t n_rows, int64_t i) {
  float acc = 0.0f;
  for (int64_t r = 0; r < n_rows; ++r) acc = std::fma(pj[r], rows[r][i], acc);
  return acc;
}

#ifdef DSINFER_X86_AVX2
// DotSharedRows for NA query vectors: Dot's instruction sequence per output (two 8-lane FMA
// chains over 16 columns at a time, their sum reduced, then the scalar tail), interleaved.
template <int NA>
void DotSharedRowsN(const float* a, int64_t lda, const float* const* rows, int64_t n_rows,
                    int64_t n, float* out, int64_t ldo) {
#ifdef DSINFER_X86_AVX512_ROWS
  // Two rows at a time: 2 NA independent chains instead of NA (an FMA's latency is four of its
  // issue slots, so NA = 4 chains kept the FMA units half idle), and each query load serves both
  // rows. Every output keeps its own chain, in Dot's order.
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2) {
    const float* b0 = rows[r];
    const float* b1 = rows[r + 1];
    __m512 acc0[NA], acc1[NA];  // [acc0 | acc1] of rows r, r + 1
    for (int j = 0; j < NA; ++j) acc0[j] = acc1[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 bv0 = _mm512_loadu_ps(b0 + i), bv1 = _mm512_loadu_ps(b1 + i);
      for (int j = 0; j < NA; ++j) {
        const __m512 av = _mm512_loadu_ps(a + j * lda + i);
        acc0[j] = _mm512_fmadd_ps(av, bv0, acc0[j]);
        acc1[j] = _mm512_fmadd_ps(av, bv1, acc1[j]);
      }
    }
    for (int j = 0; j < NA; ++j) {
      float s0 = fused::HorizontalSum(FoldChains(acc0[j]));
      float s1 = fused::HorizontalSum(FoldChains(acc1[j]));
      for (int64_t t = i; t < n; ++t) {
        s0 += a[j * lda + t] * b0[t];
        s1 += a[j * lda + t] * b1[t];
      }
      out[j * ldo + r] = s0;
      out[j * ldo + r + 1] = s1;
    }
  }
  for (; r < n_rows; ++r) {
    const float* b = rows[r];
    __m512 acc[NA];  // [acc0 | acc1]
    for (int j = 0; j < NA; ++j) acc[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 bv = _mm512_loadu_ps(b + i);
      for (int j = 0; j < NA; ++j)
        acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + j * lda + i), bv, acc[j]);
    }
    for (int j = 0; j < NA; ++j) {
      float s = fused::HorizontalSum(FoldChains(acc[j]));
      for (int64_t t = i; t < n; ++t) s += a[j * lda + t] * b[t];
      out[j * ldo + r] = s;
    }
  }
#else
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* b = rows[r];
    __m256 acc0[NA], acc1[NA];
    for (int j = 0; j < NA; ++j) acc0[j] = _mm256_setzero_ps(), acc1[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8);
      for (int j = 0; j < NA; ++j) {
        acc0[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + j * lda + i), b0, acc0[j]);
        acc1[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + j * lda + i + 8), b1, acc1[j]);
      }
    }
    for (int j = 0; j < NA; ++j) {
      float s = fused::HorizontalSum(_mm256_add_ps(acc0[j], acc1[j]));
      for (int64_t t = i; t < n; ++t) s += a[j * lda + t] * b[t];
      out[j * ldo + r] = s;
    }
  }
#endif
}

// AxpySharedRows for NA weight vectors over 16 columns at a time: the NA x 16 running values stay
// in registers while every row passes.
template <int NA>
void AxpySharedRowsN(const float* p, int64_t ldp, const float* const* rows, int64_t n_rows,
                     int64_t n, float* y, int64_t ldy) {
  int64_t i = 0;
#ifdef DSINFER_X86_AVX512_ROWS
  // Each column its own chain: 16 columns per zmm, two zmm of columns at a time so that 2 NA
  // chains are in flight (NA alone left the FMA units half idle on latency).
  for (; i + 32 <= n; i += 32) {
    __m512 acc0[NA], acc1[NA];
    for (int j = 0; j < NA; ++j) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m512 b0 = _mm512_loadu_ps(rows[r] + i), b1 = _mm512_loadu_ps(rows[r] + i + 16);
      for (int j = 0; j < NA; ++j) {
        const __m512 pj = _mm512_set1_ps(p[j * ldp + r]);
        acc0[j] = _mm512_fmadd_ps(pj, b0, acc0[j]);
        acc1[j] = _mm512_fmadd_ps(pj, b1, acc1[j]);
      }
    }
    for (int j = 0; j < NA; ++j) {
      _mm512_storeu_ps(y + j * ldy + i, acc0[j]);
      _mm512_storeu_ps(y + j * ldy + i + 16, acc1[j]);
    }
  }
  for (; i + 16 <= n; i += 16) {
    __m512 acc[NA];
    for (int j = 0; j < NA; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m512 b = _mm512_loadu_ps(rows[r] + i);
      for (int j = 0; j < NA; ++j)
        acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(p[j * ldp + r]), b, acc[j]);
    }
    for (int j = 0; j < NA; ++j) _mm512_storeu_ps(y + j * ldy + i, acc[j]);
  }
#else
  for (; i + 16 <= n; i += 16) {
    __m256 acc0[NA], acc1[NA];
    for (int j = 0; j < NA; ++j) acc0[j] = _mm256_setzero_ps(), acc1[j] = _mm256_setzero_ps();
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m256 b0 = _mm256_loadu_ps(rows[r] + i), b1 = _mm256_loadu_ps(rows[r] + i + 8);
      for (int j = 0; j < NA; ++j) {
        const __m256 pj = _mm256_broadcast_ss(p + j * ldp + r);
        acc0[j] = _mm256_fmadd_ps(pj, b0, acc0[j]);
        acc1[j] = _mm256_fmadd_ps(pj, b1, acc1[j]);
      }
    }
    for (int j = 0; j < NA; ++j) {
      _mm256_storeu_ps(y + j * ldy + i, acc0[j]);
      _mm256_storeu_ps(y + j * ldy + i + 8, acc1[j]);
    }
  }
#endif
  for (; i < n; ++i)
    for (int j = 0; j < NA; ++j) y[j * ldy + i] = AxpyColumn(p + j * ldp, rows, n_rows, i);
}

// f(std::integral_constant<int, n_a>{}) for n_a in 1 .. kSharedRowsMax (others: the maximum).
template <typename F, int... kCounts>
void WithSharedCountOf(int n_a, F&& f, std::integer_sequence<int, kCounts...>) {
  if (n_a < 1 || n_a > kSharedRowsMax) n_a = kSharedRowsMax;
  ((n_a == kCounts + 1 && (f(std::integral_constant<int, kCounts + 1>{}), true)) || ...);
}
template <typename F>
void WithSharedCount(int n_a, F&& f) {
  WithSharedCountOf(n_a, std::forward<F>(f), std::make_integer_sequence<int, kSharedRowsMax>{});
}
#endif

}  // namespace

void DotSharedRows(const float* a, int64_t lda, int n_a, const float* const* rows, int64_t n_rows,
                   int64_t n, float* out, int64_t ldo) {
#ifdef DSINFER_X86_AVX2
  WithSharedCount(n_a, [&](auto na) { DotSharedRowsN<na()>(a, lda, rows, n_rows, n, out, ldo); });
#else
  for (int j = 0; j < n_a; ++j)
    for (int64_t r = 0; r < n_rows; ++r) out[j * ldo + r] = Dot(a + j * lda, rows[r], n);
#endif
}

void AxpySharedRows(const float* p, int64_t ldp, int n_a, const float* const* rows, int64_t n_rows,
                    int64_t n, float* y, int64_t ldy) {
#ifdef DSINFER_X86_AVX2
  WithSharedCount(n_a, [&](auto na) { AxpySharedRowsN<na()>(p, ldp, rows, n_rows, n, y, ldy); });
#else
  for (int j = 0; j < n_a; ++j)
    for (int64_t i = 0; i < n; ++i) y[j * ldy + i] = AxpyColumn(p + j * ldp, rows, n_rows, i);
#endif
}

void DequantRow(const WeightMatrix& w, int64_t r, float* out) {
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, w.data + r * w.cols * 4, w.cols * 4);
      break;
    case WeightFormat::kBF16:
      DequantBf16Row(w, r, out);
      break;
    case WeightFormat::kFp8Block:
      DequantFp8Row(w, r, out);
      break;
    case WeightFormat::kFp4Packed:
      DequantFp4Row(w, r, out);
      break;
  }
}

namespace {

// The FP32 kernels: any weight format, any fp32 activations.
void MatMulRowsFp32(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                    int64_t m, float* y, ThreadPool& pool) {
  const int64_t n_out = row_end - row_begin;
  const int64_t k = w.cols;
#ifdef DSINFER_X86_AVX2
  // Fused kernels: each weight row is converted in registers and multiplied into up to 4 token
  // rows at a time (GemvRows), or, at many tokens, decoded into an L1 panel shared by 48 token
  // rows (fused::PanelRows). Every (row, token) dot product is computed by the same instruction
  // sequence whatever m is and whichever kernel runs it, so results are bit-identical between
  // one-shot prefill, chunked prefill, decode and any batch composition (the runtime's invariance
  // guarantees rest on this). Row tiles keep a tile's weights in L2 while all token groups pass
  // over them.
  if (FusedGemvApplies(w)) {
    constexpr int64_t kRowTile = 16;  // fused::PanelRows takes at most 16 rows
    // The register-blocked panels (linear_panel.cc) decode a weight once per 48 tokens instead
    // of once per 4. Median multiply-adds per core on a 2-core Zen VM, GEMV -> panels
    // (bench/linear_bench --threads 1 --m N, 3 interleaved rounds, docs/PERF.md): FP8 at 16 / 64
    // / 256 tokens 8.5 -> 10.3, 8.7 -> 11.9, 7.6 -> 11.8 GMAC/s (8 tokens: 9.1 -> 7.9, a loss);
    // FP4 8.5 -> 8.5, 9.1 -> 10.4, 8.3 -> 9.3; bf16 11.8 -> 10.1 (a loss), 11.7 -> 13.8,
    // 10.4 -> 11.7 (32 tokens: 11.0 -> 11.6).
    const int64_t panel_min_tokens = w.format == WeightFormat::kFp8Block ? 16 : 32;
    const bool panels = m >= panel_min_tokens && PanelsApply(w);
    // The last m % 4 token rows of an FP4 matmul, when 1 or 2: where their activations are exact
    // small integers (FP8-quantized), the integer route (fused::Fp4IntRows), bit-identical.
    const int64_t tail = m % 4 <= 2 ? m % 4 : 0;
    std::vector<fused::Fp4IntRow> tail_rows;  // [tail]
    if (!panels && tail > 0 && w.format == WeightFormat::kFp4Packed) {
      for (int64_t t = m - tail; t < m; ++t) {
        tail_rows.push_back(fused::MakeFp4IntRow(x + t * k, k));
        if (tail_rows.back().qualifying == 0) {  // e.g. fp32-reference numerics: none ever
          tail_rows.clear();
          break;
        }
      }
    }
    const fused::Fp4IntRow* xi = tail_rows.empty() ? nullptr : tail_rows.data();
    const int64_t n_tiles = (n_out + kRowTile - 1) / kRowTile;
    pool.ParallelForRange(
        n_tiles,
        [&](int64_t ta, int64_t tb) {
          for (int64_t t = ta; t < tb; ++t) {
            int64_t r0 = row_begin + t * kRowTile, r1 = std::min(row_end, r0 + kRowTile);
            if (panels) {
              fused::PanelRows(w, r0, r1, x, m, y, n_out, r0 - row_begin);
              continue;
            }
            for (int64_t g = 0; g < m; g += 4) {
              const float* xg = x + g * k;
              float* yg = y + g * n_out;
              switch (std::min<int64_t>(4, m - g)) {
                case 1:
                  GemvRows<1>(w, r0, r1, xg, yg, n_out, r0 - row_begin, xi);
                  break;
                case 2:
                  GemvRows<2>(w, r0, r1, xg, yg, n_out, r0 - row_begin, xi);
                  break;
                case 3:
                  GemvRows<3>(w, r0, r1, xg, yg, n_out, r0 - row_begin);
                  break;
                default:
                  GemvRows<4>(w, r0, r1, xg, yg, n_out, r0 - row_begin);
                  break;
              }
            }
          }
        },
        1);
    return;
  }
#endif
  constexpr int64_t kTile = 4;
  const int64_t n_tiles = (n_out + kTile - 1) / kTile;
  // Enough tiles per task to amortise scheduling, few enough to balance two cores.
  pool.ParallelForRange(
      n_tiles,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> rows(kTile * k);
        float out4[kTile];
        for (int64_t t = t0; t < t1; ++t) {
          int64_t r0 = row_begin + t * kTile;
          int64_t nr = std::min<int64_t>(kTile, row_end - r0);
          for (int64_t j = 0; j < nr; ++j) DequantRow(w, r0 + j, rows.data() + j * k);
          for (int64_t j = nr; j < kTile; ++j) std::fill_n(rows.data() + j * k, k, 0.0f);
          for (int64_t i = 0; i < m; ++i) {
            Dot4(x + i * k, rows.data(), rows.data() + k, rows.data() + 2 * k, rows.data() + 3 * k,
                 k, out4);
            float* yi = y + i * n_out + (r0 - row_begin);
            for (int64_t j = 0; j < nr; ++j) yi[j] = out4[j];
          }
        }
      },
      4);
}

}  // namespace

void MatMulRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                int64_t m, float* y, ThreadPool& pool) {
  const ExactRowKernel fast = ExactRowKernelFor(w);
  if (fast == ExactRowKernel::kFp32) {
    MatMulRowsFp32(w, row_begin, row_end, x, m, y, pool);
    return;
  }
  // Token rows holding bf16-exact values (the official numerics) go to the fast path, the others
  // to the FP32 kernels. The choice is per row, from that row's values alone, so a token's
  // result never depends on which other tokens share the call.
  const int64_t k = w.cols, n_out = row_end - row_begin;
  std::vector<int64_t> exact, other;
  for (int64_t i = 0; i < m; ++i) (amx::RowIsBf16Exact(x + i * k, k) ? exact : other).push_back(i);
  if (!exact.empty()) {
    if (fast == ExactRowKernel::kAmxTiles)
      amx::MatMulRows(w, row_begin, row_end, x, exact, y, n_out, pool);
    else
      bf16dot::MatMulRows(w, row_begin, row_end, x, exact, y, n_out, pool);
  }
  if (other.empty()) return;
  if (exact.empty()) {
    MatMulRowsFp32(w, row_begin, row_end, x, m, y, pool);
    return;
  }
  std::vector<float> xo(other.size() * k),
      yo(other.size() * n_out);  // [n_other, k], [n_other, n_out]
  for (size_t i = 0; i < other.size(); ++i) std::copy_n(x + other[i] * k, k, xo.data() + i * k);
  MatMulRowsFp32(w, row_begin, row_end, xo.data(), static_cast<int64_t>(other.size()), yo.data(),
                 pool);
  for (size_t i = 0; i < other.size(); ++i)
    std::copy_n(yo.data() + i * n_out, n_out, y + other[i] * n_out);
}

ExactRowKernel ExactRowKernelFor(const WeightMatrix& w) {
  if (amx::Available() && amx::Applies(w)) return ExactRowKernel::kAmxTiles;
  if (bf16dot::Available() && bf16dot::Applies(w)) return ExactRowKernel::kAvx512Bf16;
  return ExactRowKernel::kFp32;
}

const char* MachineMatMulKernel() {
  return amx::Available() ? "amx-bf16" : bf16dot::Available() ? "avx512-bf16" : "fp32";
}

void MatMul(const WeightMatrix& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  MatMulRows(w, 0, w.rows, x, m, y, pool);
}

}  // namespace dsinfer::backend::cpu
