// The CPU matmul kernels (FP32 fused kernels and the AMX tile path) against an fp64 reference
// over the stored formats, and the batch invariance the runtime relies on: a token's output row
// is bit-identical whatever other tokens share the call and wherever it sits in the batch.
#include "backend/cpu/linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../tolerance.h"
#include "backend/cpu/linear_amx.h"
#include "backend/cpu/linear_amx_internal.h"
#include "backend/cpu/linear_bf16dot.h"
#include "backend/cpu/linear_fused.h"
#include "backend/random_weights.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace dsinfer::backend::cpu {
namespace {

using model::WeightFormat;

// Random codes of the given format [rows, cols] with e8m0 scales 2^-12 .. 2^-4 (FP8: per
// 128x128 block; FP4: per 1x32). FP8 codes are uniform over all codes (subnormals and both zeros
// in nearly every 64 codes: the AMX path's general conversion) or distributed like trained
// weights (subnormals rare: its fast conversion).
HostWeight MakeMatrix(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed,
                      bool trained = false) {
  std::mt19937 rng(seed);
  return RandomWeight(rng, format, rows, cols,
                      {.scale_code_lo = 127 - 12,
                       .scale_code_hi = 127 - 4,
                       .fp8_trained_distribution = trained,
                       .name = "test.weight"});
}

// Token rows [m, k]: the official numerics' FP8 linear inputs (e4m3 codes times power-of-two
// block scales, bf16-exact) when quantized, else arbitrary fp32.
std::vector<float> MakeTokens(int64_t m, int64_t k, bool quantized, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = nd(rng);
  if (quantized)
    for (int64_t t = 0; t < m; ++t) Fp8RoundTripInPlace(x.data() + t * k, static_cast<int>(k), 128);
  return x;
}

// Checks y [m, rows] against fp64 sums over the exactly dequantized weights. Every product is
// exact in fp32 (both paths), so the only error is fp32 summation: |err| <= k * u * sum|x w|
// (tolerance::kFp32SumUnitRoundoff, the classic recursive-summation bound).
void ExpectNearReference(const model::WeightMatrix& w, const std::vector<float>& x, int64_t m,
                         const std::vector<float>& y) {
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantRow(w, r, row.data());
    for (int64_t t = 0; t < m; ++t) {
      double sum = 0, abs_sum = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        const double p = static_cast<double>(x[t * w.cols + c]) * row[c];
        sum += p, abs_sum += std::fabs(p);
      }
      const double bound =
          static_cast<double>(w.cols) * tolerance::kFp32SumUnitRoundoff * abs_sum + 1e-30;
      ASSERT_LE(std::fabs(y[t * w.rows + r] - sum), bound)
          << w.name << " row " << r << " token " << t << " k " << w.cols;
    }
  }
}

struct Shape {
  WeightFormat format;
  int64_t rows, cols;
};

// Rows: one, ragged, whole 16-row tiles and more; columns: whole 128-column blocks and odd chunk
// counts (FP8 96 and 160: a chunk without a pair).
const Shape kShapes[] = {
    {WeightFormat::kFp8Block, 130, 256}, {WeightFormat::kFp8Block, 17, 384},
    {WeightFormat::kFp8Block, 1, 128},   {WeightFormat::kFp8Block, 20, 96},
    {WeightFormat::kFp8Block, 33, 160},  {WeightFormat::kFp4Packed, 33, 96},
    {WeightFormat::kFp4Packed, 16, 512}, {WeightFormat::kBF16, 40, 64},
    {WeightFormat::kBF16, 3, 160},       {WeightFormat::kBF16, 32, 4096},
};

TEST(Linear, MatchesFp64ReferenceForEveryFormatAndBatch) {
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (const Shape& s : kShapes)
    for (bool quantized : {true, false})
      for (int64_t m : {1, 5, 16, 17, 70}) {
        HostWeight w = MakeMatrix(s.format, s.rows, s.cols, seed++);
        auto x = MakeTokens(m, s.cols, quantized, seed++);
        std::vector<float> y(m * s.rows);
        MatMul(w.view, x.data(), m, y.data(), pool);
        ExpectNearReference(w.view, x, m, y);
      }
}

// V4.1's FP8 weights carry one scale per 32x32 block: the GEMV at every token count (no
// panels, no bf16 tile paths), within the fp32 summation bound and batch-invariant bit for bit.
TEST(Linear, Fp8Block32MatchesFp64AndIsBatchInvariant) {
  ThreadPool pool(2);
  uint32_t seed = 100;
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{33, 64}, {130, 96}, {17, 5120}})
    for (bool quantized : {true, false})
      for (int64_t m : {1, 3, 16, 37}) {
        std::mt19937 rng(seed++);
        HostWeight w = RandomWeight(rng, WeightFormat::kFp8Block, rows, cols,
                                    {.scale_code_lo = 127 - 12,
                                     .scale_code_hi = 127 - 4,
                                     .name = "test.block32",
                                     .fp8_block = 32});
        ASSERT_EQ(w.view.Scale(31, 31), E8M0ToF32(w.scales[0]));
        if (rows > 32) {  // the second block row exists
          ASSERT_EQ(w.view.Scale(32, 33), E8M0ToF32(w.scales[w.view.scale_cols + 1]));
        }
        auto x = MakeTokens(m, cols, quantized, seed++);
        std::vector<float> y(m * rows), alone(rows);
        MatMul(w.view, x.data(), m, y.data(), pool);
        ExpectNearReference(w.view, x, m, y);
        for (int64_t t = 0; t < m; ++t) {
          MatMul(w.view, x.data() + t * cols, 1, alone.data(), pool);
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(std::bit_cast<uint32_t>(alone[r]), std::bit_cast<uint32_t>(y[t * rows + r]))
                << "token " << t << " row " << r;
        }
      }
}

// A token's row must not depend on the call it is in: alone vs. at any position in a batch that
// mixes bf16-exact (AMX when present) and arbitrary fp32 rows (FP32 kernels).
// 37 and 100 tokens take the register-blocked panels (linear_panel.cc): groups of 6 and a ragged
// one, one and three chunks of 48; the rows alone take the one-row GEMV.
TEST(Linear, TokenResultIsIndependentOfTheBatch) {
  ThreadPool pool(2);
  for (const Shape& s : kShapes)
    for (const int64_t m : {37, 100}) {
      HostWeight w = MakeMatrix(s.format, s.rows, s.cols, 7);
      auto xq = MakeTokens(m, s.cols, true, 8);
      auto xf = MakeTokens(m, s.cols, false, 9);
      std::vector<float> x(m * s.cols);
      for (int64_t t = 0; t < m; ++t) {  // every third row arbitrary fp32
        const auto& src = t % 3 == 1 ? xf : xq;
        std::copy_n(src.data() + t * s.cols, s.cols, x.data() + t * s.cols);
      }
      std::vector<float> batch(m * s.rows), alone(s.rows);
      MatMul(w.view, x.data(), m, batch.data(), pool);
      for (int64_t t = 0; t < m; ++t) {
        MatMul(w.view, x.data() + t * s.cols, 1, alone.data(), pool);
        for (int64_t r = 0; r < s.rows; ++r)
          ASSERT_EQ(std::bit_cast<uint32_t>(alone[r]),
                    std::bit_cast<uint32_t>(batch[t * s.rows + r]))
              << "token " << t << " row " << r << " rows " << s.rows << " cols " << s.cols;
      }
      // A row range (the grouped output projection's use) equals the same rows of the full call.
      std::vector<float> part(m * 5);
      const int64_t r0 = s.rows > 5 ? s.rows - 5 : 0, r1 = std::min<int64_t>(s.rows, r0 + 5);
      MatMulRows(w.view, r0, r1, x.data(), m, part.data(), pool);
      for (int64_t t = 0; t < m; ++t)
        for (int64_t r = r0; r < r1; ++r)
          ASSERT_EQ(part[t * (r1 - r0) + (r - r0)], batch[t * s.rows + r]);
    }
}

#ifdef DSINFER_X86_AVX2
// The fused kernels' e4m3 decoder (a sign-extending bit move into fp16) against the scalar
// decode for every code: value times 2^-8, bit for bit, both zeros included. The two NaN codes
// (0x7f, 0xff) decode to finite +-480 * 2^-8 there; checkpoints hold no NaN weights.
// Attention's shared-row kernels compute each query's values exactly as the one-query code does:
// Dot for the scores, one fused multiply-add per row into each output for the weighted sum. Heads
// grouped or alone, the results are the same bits (columns with a tail past 16 included).
TEST(Linear, SharedRowKernelsMatchTheOneQuerySequence) {
  std::mt19937 rng(70);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {512, 64, 37}) {
    const int64_t n_rows = 29;
    std::vector<float> data(n_rows * n), a(kSharedRowsMax * n), p(kSharedRowsMax * n_rows);
    for (auto* v : {&data, &a, &p})
      for (auto& x : *v) x = nd(rng);
    std::vector<const float*> rows(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) rows[r] = data.data() + ((r * 7) % n_rows) * n;
    for (int n_a = 1; n_a <= kSharedRowsMax; ++n_a) {
      std::vector<float> dots(n_a * n_rows), sums(n_a * n);
      DotSharedRows(a.data(), n, n_a, rows.data(), n_rows, n, dots.data(), n_rows);
      AxpySharedRows(p.data(), n_rows, n_a, rows.data(), n_rows, n, sums.data(), n);
      for (int j = 0; j < n_a; ++j) {
        for (int64_t r = 0; r < n_rows; ++r)
          ASSERT_EQ(std::bit_cast<uint32_t>(dots[j * n_rows + r]),
                    std::bit_cast<uint32_t>(Dot(a.data() + j * n, rows[r], n)))
              << "query " << j << " of " << n_a << " row " << r << " n " << n;
        for (int64_t i = 0; i < n; ++i) {
          float acc = 0.0f;
          for (int64_t r = 0; r < n_rows; ++r) acc = std::fma(p[j * n_rows + r], rows[r][i], acc);
          ASSERT_EQ(std::bit_cast<uint32_t>(sums[j * n + i]), std::bit_cast<uint32_t>(acc))
              << "weights " << j << " of " << n_a << " column " << i << " n " << n;
        }
      }
    }
  }
}

TEST(Linear, E4m3VectorDecodeIsExactForEveryCode) {
  for (int code = 0; code < 256; ++code) {
    uint8_t codes[8];
    std::fill_n(codes, 8, static_cast<uint8_t>(code));
    float got[8];
    _mm256_storeu_ps(got, fused::LoadE4M3x8(codes));
    const bool nan_code = (code & 0x7f) == 0x7f;
    const float want = nan_code ? (code & 0x80 ? -480.0f : 480.0f) : E4M3ToF32(code);
    for (float g : got)
      ASSERT_EQ(std::bit_cast<uint32_t>(g), std::bit_cast<uint32_t>(want * 0x1p-8f))
          << "code " << code;
  }
}
#endif

#ifdef DSINFER_X86_AVX2
// The fused kernels' e2m1 decoder against the scalar decode for every byte (both nibbles):
// twice the value, bit for bit, -0 included.
TEST(Linear, E2m1VectorDecodeIsExactForEveryByte) {
  for (int byte = 0; byte < 256; ++byte) {
    uint8_t packed[16];
    std::fill_n(packed, 16, static_cast<uint8_t>(byte));
    __m256 v[4];
    fused::LoadE2M1x32(packed, v);
    float got[32];
    for (int q = 0; q < 4; ++q) _mm256_storeu_ps(got + 8 * q, v[q]);
    for (int c = 0; c < 32; ++c) {
      const float want = 2.0f * E2M1ToF32(c % 2 == 0 ? byte & 0xf : byte >> 4);
      ASSERT_EQ(std::bit_cast<uint32_t>(got[c]), std::bit_cast<uint32_t>(want))
          << "byte " << byte << " column " << c;
    }
  }
}
#endif

#ifdef DSINFER_X86_AVX2
// The one-token FP4 GEMV's integer route (linear_fp4int.cc) at its edges: which blocks qualify
// (integers up to 32767 times 2^shift, shift up to 106, no subnormal value) and outputs
// bit-identical to the FP32 route whatever the scale codes (0: a subnormal scale, 254 with a
// large shift: an overflowing factor, 255: NaN; those blocks fall back). The token alone and
// first of 2 takes the integer routes; first of 3 or 4 the FP32 GEMV.
TEST(Linear, Fp4IntegerGemvRouteIsExactAtItsEdges) {
  ThreadPool pool(1);
  constexpr int64_t kRows = 9, kCols = 256 + 96;  // a whole group of 8 blocks and 3 more
  constexpr int64_t kBlocks = kCols / 32;
  struct Case {
    int shift;     // of the lowest set bit: the odd anchor at the start of every block
    int anchor;    // |A| there
    int lo, hi;    // the other |A|: uniform in [lo, hi], hi at column 7 (zeros: see below)
    bool integer;  // whether the blocks qualify
  };
  const Case cases[] = {{0, 1, 0, 32767, true},
                        {0, 1, 0, 32768, false},  // the int16 bound
                        {-126, 1, 0, 300, true},
                        {-127, 3, 2, 300, true},             // lowest bit below 2^-126
                        {-140, 16385, 16384, 32767, true},   // all normal, bit at 2^-140
                        {-141, 32769, 32768, 32768, false},  // normal needs |A| > 32767
                        {-149, 1, 0, 1, false},              // a subnormal value
                        {106, 1, 0, 32767, true},
                        {107, 1, 0, 3, false},  // sums' overflow bound
                        {-60, 1, 0, 12345, true}};
  uint32_t seed = 4000;
  for (const Case& c : cases)
    for (int code : {0, 1, 2, 100, 127, 200, 254, 255})
      for (bool positive : {false, true}) {  // positive: every product >= 0, so overflowing
        // lanes are all +inf and only a NaN from an infinite factor tells the routes apart
        std::mt19937 rng(++seed);
        HostWeight w =
            RandomWeight(rng, WeightFormat::kFp4Packed, kRows, kCols,
                         {.scale_code_lo = code, .scale_code_hi = code, .name = "int.weight"});
        if (positive)
          for (uint8_t& byte : w.data) byte &= 0x77;  // both nibbles' sign bits
        std::vector<float> x(4 * kCols);  // [4, kCols]: the token first, then three others
        std::normal_distribution<float> normal;
        for (int64_t i = 0; i < kCols; ++i) {
          int magnitude = c.lo + static_cast<int>(rng() % (c.hi - c.lo + 1));
          if (i % 32 == 0) magnitude = c.anchor;
          if (i % 32 == 7) magnitude = c.hi;
          // Zeros; column 8 j + 3 for all j: lane 3's sums are 0, so an infinite factor would
          // make a NaN the FP32 route does not.
          if (i % 32 == 9 || i % 32 == 30 || i % 8 == 3) magnitude = 0;
          const float sign = positive || rng() % 2 ? 1.0f : -1.0f;
          x[i] = sign * std::ldexp(static_cast<float>(magnitude), c.shift);
        }
        // The others: FP8-quantized (mostly qualifying) in batches of 2 and 3 with the token, so
        // that the 2- and 3-token integer routes run.
        auto quantized = MakeTokens(3, kCols, true, seed + 100000);
        std::copy(quantized.begin(), quantized.end(), x.begin() + kCols);
        const fused::Fp4IntRow row = fused::MakeFp4IntRow(x.data(), kCols);
        int64_t qualifying = 0;
        for (int64_t b = 0; b < kBlocks; ++b) qualifying += row.unit[b] != 0.0f;
        EXPECT_EQ(qualifying, c.integer ? kBlocks : 0) << "shift " << c.shift << " hi " << c.hi;
        std::vector<float> batch(4 * kRows);  // [4, kRows]: the FP32 route (GemvRowBlock<4, 1>)
        MatMul(w.view, x.data(), 4, batch.data(), pool);
        for (int64_t m = 1; m <= 3; ++m) {  // the integer routes for 1 and 2 tokens, FP32 for 3
          std::vector<float> y(m * kRows);
          MatMul(w.view, x.data(), m, y.data(), pool);
          for (int64_t i = 0; i < m * kRows; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(batch[i]))
                << "shift " << c.shift << " hi " << c.hi << " code " << code << " positive "
                << positive << " m " << m << " token " << i / kRows << " row " << i % kRows << ": "
                << y[i] << " vs " << batch[i];
        }
        // The token's row of batch, bit-identical to its one-token route (asserted above).
        if (code >= 2 && code <= 200 && c.shift >= -60 && c.shift <= 0)
          ExpectNearReference(w.view, x, 1, batch);
      }
}

// Most blocks of FP8-quantized Gaussian activations qualify for the integer route (the claim the
// route's speed rests on; measured ~98.6 % of 32-column blocks).
TEST(Linear, Fp4IntegerRouteTakesMostQuantizedBlocks) {
  auto x = MakeTokens(8, 4096, true, 77);
  int64_t qualifying = 0;
  for (int t = 0; t < 8; ++t) {
    const fused::Fp4IntRow row = fused::MakeFp4IntRow(x.data() + t * 4096, 4096);
    for (int64_t b = 0; b < 4096 / 32; ++b) qualifying += row.unit[b] != 0.0f;
  }
  EXPECT_GT(qualifying, 8 * 128 * 95 / 100);
  // Arbitrary fp32 values (24 significant bits) never do.
  auto xf = MakeTokens(1, 4096, false, 78);
  const fused::Fp4IntRow row = fused::MakeFp4IntRow(xf.data(), 4096);
  for (int64_t b = 0; b < 4096 / 32; ++b) EXPECT_EQ(row.unit[b], 0.0f);
}
#endif

TEST(Linear, Bf16ExactnessIsDecidedPerValue) {
  std::vector<float> x = {0.0f, -0.0f, 1.5f, Bf16ToF32(0x3f81), -448.0f, 0x1p-120f};
  EXPECT_TRUE(amx::RowIsBf16Exact(x.data(), static_cast<int64_t>(x.size())));
  const float not_exact[] = {1.0f + 0x1p-10f, std::nanf(""), INFINITY, 0x1p-130f};
  for (float v : not_exact) EXPECT_FALSE(amx::RowIsBf16Exact(&v, 1)) << v;
  // Rows longer than the function's chunks of 64: one inexact value anywhere, first or last of a
  // chunk or in the tail, decides.
  for (int64_t k : {64, 4096, 4100}) {
    std::vector<float> row(k);
    for (int64_t i = 0; i < k; ++i) row[i] = x[i % x.size()];
    EXPECT_TRUE(amx::RowIsBf16Exact(row.data(), k)) << k;
    for (int64_t at : {int64_t{0}, int64_t{63}, int64_t{64}, k - 1})
      for (float v : not_exact) {
        if (at >= k) continue;
        const float kept = row[at];
        row[at] = v;
        EXPECT_FALSE(amx::RowIsBf16Exact(row.data(), k)) << k << " " << at << " " << v;
        row[at] = kept;
      }
  }
}

TEST(Linear, AmxTilesMatchFp64Reference) {
  if (!amx::Available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU (or DSINFER_CPU_AMX=0): FP32 kernels only";
  ThreadPool pool(2);
  for (const Shape& s : kShapes)
    for (bool trained : {false, true}) {
      if (trained && s.format != WeightFormat::kFp8Block) continue;
      HostWeight w = MakeMatrix(s.format, s.rows, s.cols, 11, trained);
      ASSERT_TRUE(amx::Applies(w.view));
      for (int64_t m : {1, 21, 40}) {  // one pass converting on the fly; several passes
        auto x = MakeTokens(m, s.cols, true, 12);
        std::vector<int64_t> tokens(m);
        for (int64_t t = 0; t < m; ++t) tokens[t] = t;
        std::vector<float> y(m * s.rows, NAN);
        amx::MatMulRows(w.view, 0, s.rows, x.data(), tokens, y.data(), s.rows, pool);
        ExpectNearReference(w.view, x, m, y);
      }
    }
}

// The AVX-512 BF16 kernels (the fast path on CPUs without AMX), called directly so that they are
// tested on AMX machines too: against fp64 over every FP8 code (uniform codes: subnormals and
// both zeros), trained-like codes, FP4 and bf16; one token, a whole token group, several groups
// and a ragged last group; ragged row tiles.
const Shape kDotShapes[] = {
    {WeightFormat::kFp8Block, 130, 256}, {WeightFormat::kFp8Block, 17, 384},
    {WeightFormat::kFp8Block, 1, 128},   {WeightFormat::kFp4Packed, 33, 640},
    {WeightFormat::kFp4Packed, 16, 512}, {WeightFormat::kBF16, 40, 128},
    {WeightFormat::kBF16, 19, 4096},
};

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(Linear, Bf16DotMatchesFp64Reference) {
  if (!bf16dot::Available())
    GTEST_SKIP() << "no AVX512-BF16 on this CPU (or DSINFER_CPU_BF16DOT=0)";
  ThreadPool pool(2);
  uint32_t seed = 40;
  for (const Shape& s : kDotShapes)
    for (bool trained : {false, true}) {
      if (trained && s.format != WeightFormat::kFp8Block) continue;
      HostWeight w = MakeMatrix(s.format, s.rows, s.cols, seed++, trained);
      ASSERT_TRUE(bf16dot::Applies(w.view));
      // The many-token kernel at bf16 17 and 45, FP8 and FP4 45 (groups of 6: 2 x 6 and 5; 7 x 6
      // and 3).
      for (int64_t m : {1, 2, 8, 17, 45}) {
        auto x = MakeTokens(m, s.cols, true, seed++);
        std::vector<float> y(m * s.rows, NAN);
        bf16dot::MatMulRows(w.view, 0, s.rows, x.data(), Iota(m), y.data(), s.rows, pool);
        ExpectNearReference(w.view, x, m, y);
      }
    }
  HostWeight odd = MakeMatrix(WeightFormat::kFp8Block, 4, 96, 1);
  EXPECT_FALSE(bf16dot::Applies(odd.view)) << "columns must be whole 128-column blocks";
}

// Each output is one fixed instruction sequence: a token's row is bit-identical alone, at any
// position of any batch size, and for any row range; and MatMul sends bf16-exact rows here when
// there are no AMX tiles.
TEST(Linear, Bf16DotTokenResultIsIndependentOfTheBatch) {
  if (!bf16dot::Available())
    GTEST_SKIP() << "no AVX512-BF16 on this CPU (or DSINFER_CPU_BF16DOT=0)";
  ThreadPool pool(2);
  for (const Shape& s : kDotShapes) {
    HostWeight w = MakeMatrix(s.format, s.rows, s.cols, 50);
    const int64_t m = 53;  // up to three passes of 16 tokens and a remainder
    auto x = MakeTokens(m, s.cols, true, 51);
    std::vector<float> alone(m * s.rows);
    for (int64_t t = 0; t < m; ++t)
      bf16dot::MatMulRows(w.view, 0, s.rows, x.data(), std::vector<int64_t>{t}, alone.data(),
                          s.rows, pool);
    // 9+: the tokens' blocks side by side, in passes of up to 16 (17: 16 and 1; 34: 16, 16, 2).
    // The many-token kernel (bf16 12+, FP8 32+, FP4 40+) in groups of 6 (16: 2 x 6 and 4; 34:
    // 5 x 6 and 4; 47: 7 x 6 and 5; 48: no remainder; 53: 8 x 6 and 5).
    for (int64_t n : {2, 3, 8, 9, 16, 17, 19, 34, 39, 40, 47, 48, 53}) {
      std::vector<int64_t> tokens(n);  // tokens in reverse order from m - 1
      for (int64_t i = 0; i < n; ++i) tokens[i] = m - 1 - i;
      std::vector<float> batch(m * s.rows, NAN);
      bf16dot::MatMulRows(w.view, 0, s.rows, x.data(), tokens, batch.data(), s.rows, pool);
      for (int64_t t : tokens)
        for (int64_t r = 0; r < s.rows; ++r)
          ASSERT_EQ(std::bit_cast<uint32_t>(alone[t * s.rows + r]),
                    std::bit_cast<uint32_t>(batch[t * s.rows + r]))
              << "token " << t << " of " << n << " row " << r << " shape " << s.rows << "x"
              << s.cols;
    }
    const int64_t r0 = s.rows > 3 ? 3 : 0, r1 = s.rows;  // tiles start at another row
    std::vector<float> part(m * (r1 - r0));
    bf16dot::MatMulRows(w.view, r0, r1, x.data(), Iota(m), part.data(), r1 - r0, pool);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t r = r0; r < r1; ++r)
        ASSERT_EQ(std::bit_cast<uint32_t>(part[t * (r1 - r0) + (r - r0)]),
                  std::bit_cast<uint32_t>(alone[t * s.rows + r]));
    if (!amx::Available()) {
      std::vector<float> via_matmul(m * s.rows);
      MatMul(w.view, x.data(), m, via_matmul.data(), pool);
      EXPECT_EQ(0, std::memcmp(via_matmul.data(), alone.data(), alone.size() * sizeof(float)));
    }
  }
}

// A prefill chunk whose bf16 activations exceed the many-token kernel's 8 MiB block runs in
// token blocks (each passes over all row tiles): every token's result is still the one it gets
// in a batch that fits one block. 8192 columns are 16 KiB of bf16 per token: 520 tokens are two
// blocks (264 and 256 tokens: 44 groups of 6, then 42 and a group of 4), 1100 tokens three (372,
// 372, 356); FP8 and bf16 (the o-proj formats), rows not a multiple of the 16-row tile.
TEST(Linear, Bf16DotTokenBlocksGiveTheResultsOfOneBlock) {
  if (!bf16dot::Available())
    GTEST_SKIP() << "no AVX512-BF16 on this CPU (or DSINFER_CPU_BF16DOT=0)";
  ThreadPool pool(2);
  for (WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kBF16}) {
    const int64_t rows = 40, cols = 8192;
    HostWeight w = MakeMatrix(f, rows, cols, 60);
    ASSERT_TRUE(bf16dot::Applies(w.view));
    for (int64_t m : {520, 1100}) {
      auto x = MakeTokens(m, cols, true, 61);
      std::vector<float> blocked(m * rows, NAN), small(m * rows, NAN);
      bf16dot::MatMulRows(w.view, 0, rows, x.data(), Iota(m), blocked.data(), rows, pool);
      // The reference: batches of 96 tokens (1.5 MiB, one block, the many-token kernel too).
      for (int64_t t0 = 0; t0 < m; t0 += 96) {
        std::vector<int64_t> tokens;
        for (int64_t t = t0; t < std::min(m, t0 + 96); ++t) tokens.push_back(t);
        bf16dot::MatMulRows(w.view, 0, rows, x.data(), tokens, small.data(), rows, pool);
      }
      for (int64_t i = 0; i < m * rows; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(small[i]), std::bit_cast<uint32_t>(blocked[i]))
            << "token " << i / rows << " of " << m << " row " << i % rows;
    }
  }
}

// FP4 scale codes at the ends of the e8m0 range: 0 is 2^-127 (a subnormal scale, exact in the
// fp32 multiply), 255 is NaN and poisons only its rows' outputs.
TEST(Linear, Bf16DotScaleCodesAtTheEnds) {
  if (!bf16dot::Available())
    GTEST_SKIP() << "no AVX512-BF16 on this CPU (or DSINFER_CPU_BF16DOT=0)";
  ThreadPool pool(1);
  HostWeight w = MakeMatrix(WeightFormat::kFp4Packed, 4, 256, 60);
  w.data.assign(w.data.size(), 0x77);  // every weight 6
  w.view.data = w.data.data();
  w.scales.assign(w.scales.size(), 127);  // scale 1
  w.view.scales = w.scales.data();
  w.scales[0 * w.view.scale_cols + 3] = 0;    // row 0, chunk 3: 2^-127
  w.scales[1 * w.view.scale_cols + 5] = 255;  // row 1, chunk 5: NaN
  w.scales[2 * w.view.scale_cols + 7] = 254;  // row 2, chunk 7: 2^127
  std::vector<float> x(2 * 256, 0.0f);        // [2, 256]
  x[3 * 32] = 0x1p100f;                       // token 0, row 0: 6 * 2^-127 * 2^100 = 1.5 * 2^-25
  x[256 + 1] = 1.0f;                          // token 1: 6 from chunk 0 (scale 1) in every row
  x[256 + 7 * 32] = 0x1p-120f;                // token 1, row 2: 6 * 2^127 * 2^-120 = 768
  std::vector<float> y(2 * 4);
  bf16dot::MatMulRows(w.view, 0, 4, x.data(), Iota(2), y.data(), 4, pool);
  EXPECT_EQ(y[0], 0x1.8p-25f);
  EXPECT_EQ(y[3], 0x1.8p102f);                            // 6 * 2^100 with scale 1
  EXPECT_TRUE(std::isnan(y[1]) && std::isnan(y[4 + 1]));  // NaN * 0 is NaN
  EXPECT_EQ(y[4 + 2], 6.0f + 768.0f);
  EXPECT_EQ(y[4 + 3], 6.0f);  // + 6 * 2^-120 rounds away
}

// The vector kernels (FP8/FP4, up to 2 tokens) compute the tile unit's arithmetic: the same
// outputs bit for bit as the tile path, for whole 512-column groups, the chunks past the last
// group (FP8 with an unpaired last chunk included), every FP8 code (uniform codes: subnormals and
// zeros in nearly every group), scales whose products are flushed (tiny) or overflow (huge), and
// activations far from 1 (the guard that sends a group to the general route).
TEST(Linear, VectorKernelsMatchTheTilesBitForBit) {
  if (!amx::Available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU (or DSINFER_CPU_AMX=0): FP32 kernels only";
  // The probe that enables them for kAuto agrees (unless switched off for a comparison).
  const char* env = std::getenv("DSINFER_CPU_VECTOR");
  if (env == nullptr || std::string(env) != "0") {
    EXPECT_TRUE(amx::VectorInUse());
  }
  ThreadPool pool(2);
  const Shape shapes[] = {
      {WeightFormat::kFp8Block, 37, 512},  {WeightFormat::kFp8Block, 20, 1120},
      {WeightFormat::kFp8Block, 5, 160},   {WeightFormat::kFp8Block, 130, 4096},
      {WeightFormat::kFp4Packed, 33, 512}, {WeightFormat::kFp4Packed, 16, 608},
      {WeightFormat::kFp4Packed, 3, 96},   {WeightFormat::kFp4Packed, 64, 2048},
  };
  struct Scales {
    int lo, hi;
  };
  const Scales scale_ranges[] = {{115, 123}, {0, 12}, {236, 250}};
  uint32_t seed = 40;
  for (const Shape& s : shapes)
    for (const Scales& sc : scale_ranges)
      for (bool trained : {false, true}) {
        if (trained && s.format != WeightFormat::kFp8Block) continue;
        std::mt19937 rng(++seed);
        HostWeight w = RandomWeight(rng, s.format, s.rows, s.cols,
                                    {.scale_code_lo = sc.lo,
                                     .scale_code_hi = sc.hi,
                                     .fp8_trained_distribution = trained,
                                     .name = "vector.weight"});
        const int64_t m = 6;                // token rows in x; the kernels read a listed subset
        for (int magnitude : {0, -70, 58})  // rows 4, 5 times 2^magnitude: the exact-range guard
          for (const std::vector<int64_t>& tokens :
               {std::vector<int64_t>{0}, {5, 2}, {3}, {1, 4}, {4}, {2, 5, 0}, {4, 1, 3}}) {
            auto x = MakeTokens(m, s.cols, true, seed + 1000);
            for (int64_t i = 4 * s.cols; i < m * s.cols; ++i) x[i] = std::ldexp(x[i], magnitude);
            // Three tokens: FP4 only (kVectorMaxTokensFp8).
            const bool applies = tokens.size() <= 2 || s.format == WeightFormat::kFp4Packed;
            ASSERT_EQ(amx::VectorApplies(w.view, static_cast<int64_t>(tokens.size())), applies);
            if (!applies) continue;
            std::vector<float> tiles(m * s.rows, 7.0f), vector(m * s.rows, 7.0f);
            amx::MatMulRows(w.view, 0, s.rows, x.data(), tokens, tiles.data(), s.rows, pool,
                            amx::Kernel::kTiles);
            amx::MatMulRows(w.view, 0, s.rows, x.data(), tokens, vector.data(), s.rows, pool,
                            amx::Kernel::kVector);
            for (size_t i = 0; i < tiles.size(); ++i) {
              const bool both_nan = std::isnan(tiles[i]) && std::isnan(vector[i]);
              ASSERT_TRUE(both_nan ||
                          std::bit_cast<uint32_t>(tiles[i]) == std::bit_cast<uint32_t>(vector[i]))
                  << s.rows << "x" << s.cols << " format " << static_cast<int>(s.format)
                  << " scales [" << sc.lo << ", " << sc.hi << "] trained " << trained << " x * 2^"
                  << magnitude << " tokens " << tokens.size() << " at " << i << ": tiles "
                  << tiles[i] << " vector " << vector[i];
            }
          }
      }
}

#ifdef DSINFER_AMX_COMPILED
// Rows [0, rows) of w for the listed tokens of x through the AMX tile path and through the vector
// kernels (integer_route: see MatMulRowsVector): tiles and vector [highest token + 1][rows] (7
// where nothing was written). Returns the vector kernels' routes.
amx::internal::VectorRoutes TilesAndVector(const model::WeightMatrix& w, const float* x,
                                           std::span<const int64_t> tokens, ThreadPool& pool,
                                           std::vector<float>* tiles, std::vector<float>* vector,
                                           bool integer_route = true) {
  const int64_t n = *std::max_element(tokens.begin(), tokens.end()) + 1;
  tiles->assign(n * w.rows, 7.0f);
  vector->assign(n * w.rows, 7.0f);
  amx::MatMulRows(w, 0, w.rows, x, tokens, tiles->data(), w.rows, pool, amx::Kernel::kTiles);
  amx::internal::VectorRoutes routes;
  amx::internal::MatMulRowsVector(w, 0, w.rows, x, tokens, vector->data(), w.rows, pool, &routes,
                                  integer_route);
  return routes;
}

// The vector kernels' pair routes (unscaled weights by VDPBF16PS, each chunk's sum scaled once)
// against the tiles bit for bit at the edges of the scale codes they accept for activation
// exponents in [e_min, e_max]: FP4 code in [max(2, 9 - e_min), min(252, 245 - e_max)], FP8 in
// [max(7, 17 - e_min), min(194, 239 - e_max)] (MatMulRowsVector). Taken just inside, where the
// smallest products are exactly 2^-126 or the largest sums near 2^128; the general route just
// outside, and for every code when the exponents leave the range the unscaled sums need. The
// FP4 integer route, which many of these chunks would fit, is kept out.
TEST(Linear, VectorPairRoutesAreExactAtTheirEdges) {
  if (!amx::Available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU (or DSINFER_CPU_AMX=0): FP32 kernels only";
  ThreadPool pool(2);
  constexpr int64_t kRows = 37, kCols = 1024 + 96;  // two whole groups and a tail of 3 chunks
  constexpr int64_t kRowGroups = kRows * 2;
  struct Case {
    WeightFormat format;
    int code, e_min, e_max;
    bool pairs;
  };
  constexpr WeightFormat kFp4 = WeightFormat::kFp4Packed, kFp8 = WeightFormat::kFp8Block;
  const Case cases[] = {
      {kFp4, 9, 0, 9, true},          {kFp4, 8, 0, 9, false},        {kFp4, 236, 0, 9, true},
      {kFp4, 237, 0, 9, false},       {kFp4, 127, -118, -100, true}, {kFp4, 126, -118, -100, false},
      {kFp4, 127, -119, -100, false}, {kFp4, 127, 100, 118, true},   {kFp4, 128, 100, 118, false},
      {kFp4, 120, 100, 119, false},   {kFp4, 2, 3, 12, false},       {kFp4, 1, 20, 30, false},
      {kFp4, 252, -20, -7, true},     {kFp4, 253, -20, -7, false},   {kFp4, 255, 0, 10, false},
      {kFp4, 0, 0, 10, false},        {kFp8, 17, 0, 9, true},        {kFp8, 16, 0, 9, false},
      {kFp8, 194, 0, 9, true},        {kFp8, 195, 0, 9, false},      {kFp8, 67, -50, -40, true},
      {kFp8, 66, -50, -40, false},    {kFp8, 67, -51, -40, false},   {kFp8, 172, 60, 67, true},
      {kFp8, 173, 60, 67, false},     {kFp8, 120, 60, 68, false}};
  uint32_t seed = 1900;
  for (const Case& c : cases) {
    std::mt19937 rng(++seed);
    HostWeight w = RandomWeight(rng, c.format, kRows, kCols,
                                {.scale_code_lo = c.code,
                                 .scale_code_hi = c.code,
                                 .fp8_trained_distribution = true,
                                 .name = "pairs.weight"});
    std::vector<float> x(2 * kCols);  // [2, kCols]: bf16-exact, exponents in [e_min, e_max]
    for (int64_t i = 0; i < 2 * kCols; ++i) {
      int e = c.e_min + static_cast<int>(rng() % (c.e_max - c.e_min + 1));
      if (i % 32 == 0) e = c.e_min;  // every chunk reaches both ends of the range
      if (i % 32 == 7) e = c.e_max;
      const float mantissa = static_cast<float>(128 + rng() % 128) / 128.0f;
      x[i] = (rng() % 2 ? -1.0f : 1.0f) * std::ldexp(mantissa, e);
      if (i % 32 == 9 || i % 32 == 30) x[i] = 0.0f;
    }
    for (const std::vector<int64_t>& tokens : {std::vector<int64_t>{0}, {1, 0}}) {
      std::vector<float> tiles, vector;
      const amx::internal::VectorRoutes routes =
          TilesAndVector(w.view, x.data(), tokens, pool, &tiles, &vector, false);
      for (size_t i = 0; i < tiles.size(); ++i) {
        const bool both_nan = std::isnan(tiles[i]) && std::isnan(vector[i]);
        ASSERT_TRUE(both_nan ||
                    std::bit_cast<uint32_t>(tiles[i]) == std::bit_cast<uint32_t>(vector[i]))
            << "format " << static_cast<int>(c.format) << " code " << c.code << " exponents ["
            << c.e_min << ", " << c.e_max << "] tokens " << tokens.size() << " at " << i
            << ": tiles " << tiles[i] << " vector " << vector[i];
      }
      EXPECT_EQ(routes.integer + routes.pairs + routes.general, kRowGroups);
      EXPECT_EQ(routes.integer, 0);
      // FP8 weights drawn as trained ones still hold a rare subnormal code, which sends its
      // group to the general route whatever the scale.
      if (c.format == kFp4 || !c.pairs)
        EXPECT_EQ(routes.pairs, c.pairs ? kRowGroups : 0)
            << "format " << static_cast<int>(c.format) << " code " << c.code << " exponents ["
            << c.e_min << ", " << c.e_max << "]";
      else
        EXPECT_GT(routes.pairs, kRowGroups / 2) << "FP8 code " << c.code;
    }
  }
}

// The FP4 integer route (activations that are integers times a power of two, summed exactly)
// against the tiles bit for bit, at the edges of the scale range it accepts: taken just inside
// them, with large integers and weights (the smallest unit 2^-126, the largest 2^103), and not
// taken just outside; at the bound on the integers' absolute sum (partial sums up to 2^24
// units): taken at 1398101, with the third byte plane, and not at 1398102; not for integers
// of 2^21; while bf16 Gaussians take whichever route fits.
TEST(Linear, Fp4IntegerRouteIsExactAtItsEdges) {
  if (!amx::Available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU (or DSINFER_CPU_AMX=0): FP32 kernels only";
  ThreadPool pool(2);
  constexpr int64_t kRows = 32, kCols = 1024 + 96;  // two whole groups and a tail
  constexpr int64_t kGroupRows = kRows * 2;
  struct Case {
    int code, shift;
    bool integer;
  };
  const Case cases[] = {{2, 0, true},     {2, -1, false},   {1, 5, false},
                        {127, -20, true}, {252, -21, true}, {252, -20, false},
                        {200, 31, true},  {200, 32, false}, {60, 68, true}};
  // kMixedPlanes: token 0's row as kIntegers (two planes), token 1's as kAbsSumEdge (three).
  enum class Kind { kIntegers, kAbsSumEdge, kPastAbsSum, kMixedPlanes, kTooWide, kGaussian };
  uint32_t seed = 900;
  for (const Case& c : cases)
    for (Kind kind : {Kind::kIntegers, Kind::kAbsSumEdge, Kind::kPastAbsSum, Kind::kMixedPlanes,
                      Kind::kTooWide, Kind::kGaussian}) {
      std::mt19937 rng(++seed);
      HostWeight w =
          RandomWeight(rng, WeightFormat::kFp4Packed, kRows, kCols,
                       {.scale_code_lo = c.code, .scale_code_hi = c.code, .name = "int.weight"});
      std::vector<float> x(2 * kCols);  // [2, kCols]
      std::normal_distribution<float> normal;
      for (int64_t i = 0; i < 2 * kCols; ++i) {
        // Integers with at most 8 significant bits (bf16-exact) up to 254 * 2^7, two byte
        // planes each, an odd one at the start of every chunk (its lowest set bit is 2^shift)
        // and the largest next. The edge kinds: bf16-exact integers whose absolute sum is
        // 1398101 (5 + 2^20 + 85 * 2^12 + 85 * 2^4), or one more; too wide: 2^21 next.
        int magnitude = static_cast<int>(rng() % 255) << (rng() % 8);
        if (i % 32 == 0) magnitude = 1 + 2 * static_cast<int>(rng() % 128);
        if (i % 32 == 1) magnitude = kind == Kind::kTooWide ? 1 << 21 : 254 << 7;
        const bool edge_row = kind == Kind::kAbsSumEdge || kind == Kind::kPastAbsSum ||
                              (kind == Kind::kMixedPlanes && i >= kCols);
        if (edge_row) {
          constexpr int kEdge[5] = {5, 1 << 20, 85 << 12, 85 << 4, 0};
          magnitude = i % 32 < 5 ? kEdge[i % 32] : 0;
          if (i % 32 == 4 && kind == Kind::kPastAbsSum) magnitude = 1;
        }
        const float sign = rng() % 2 ? -1.0f : 1.0f;
        x[i] = kind == Kind::kGaussian ? RoundBf16(normal(rng) * std::ldexp(1.0f, c.shift + 8))
                                       : sign * std::ldexp(static_cast<float>(magnitude), c.shift);
      }
      for (const std::vector<int64_t>& tokens : {std::vector<int64_t>{0}, {1, 0}}) {
        std::vector<float> tiles, vector;
        const amx::internal::VectorRoutes routes =
            TilesAndVector(w.view, x.data(), tokens, pool, &tiles, &vector);
        for (size_t i = 0; i < tiles.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(tiles[i]), std::bit_cast<uint32_t>(vector[i]))
              << "code " << c.code << " shift " << c.shift << " kind " << static_cast<int>(kind)
              << " tokens " << tokens.size() << " at " << i << ": tiles " << tiles[i] << " vector "
              << vector[i];
        EXPECT_EQ(routes.integer + routes.pairs + routes.general, kGroupRows);
        if (kind != Kind::kGaussian) {
          const bool integer = c.integer && kind != Kind::kPastAbsSum && kind != Kind::kTooWide;
          // A group takes three planes when any of its tokens' chunks needs them.
          const bool wide =
              kind == Kind::kAbsSumEdge || (kind == Kind::kMixedPlanes && tokens.size() == 2);
          EXPECT_EQ(routes.integer, integer ? kGroupRows : 0)
              << "code " << c.code << " shift " << c.shift << " kind " << static_cast<int>(kind);
          EXPECT_EQ(routes.integer_wide, integer && wide ? kGroupRows : 0)
              << "code " << c.code << " shift " << c.shift << " kind " << static_cast<int>(kind);
        }
      }
    }
}

// The vector kernels take the FP4 integer route for four interleaved rows at once when every row
// of the block fits, and row by row otherwise: here rows 1 and 6 (blocks 0 and 1) carry scale
// code 1, where a weight is subnormal and no integer route is exact, in one group each, and
// rows 32..34 are the tail past the last block of four. Each row's route is its own and the bits
// are the tiles'.
TEST(Linear, Fp4IntegerRouteIsChosenPerRowInsideABlock) {
  if (!amx::Available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU (or DSINFER_CPU_AMX=0): FP32 kernels only";
  ThreadPool pool(2);
  constexpr int64_t kRows = 35, kCols = 1024 + 96;  // two whole groups and a tail
  std::mt19937 rng(4242);
  HostWeight w = RandomWeight(rng, WeightFormat::kFp4Packed, kRows, kCols,
                              {.scale_code_lo = 118, .scale_code_hi = 132, .name = "mixed.weight"});
  const int64_t scale_cols = w.view.scale_cols;
  for (int64_t c = 0; c < 16; ++c) {
    w.scales[1 * scale_cols + c] = 1;       // row 1, group 0
    w.scales[6 * scale_cols + 16 + c] = 1;  // row 6, group 1
  }
  std::vector<float> x(3 * kCols);  // [3, kCols] FP8-quantized, as the experts' inputs are
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (int t = 0; t < 3; ++t) Fp8RoundTripInPlace(x.data() + t * kCols, kCols, 128);
  for (const std::vector<int64_t>& tokens : {std::vector<int64_t>{0}, {1, 0}, {2, 0, 1}}) {
    std::vector<float> tiles, vector;
    const amx::internal::VectorRoutes routes =
        TilesAndVector(w.view, x.data(), tokens, pool, &tiles, &vector);
    for (size_t i = 0; i < tiles.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(tiles[i]), std::bit_cast<uint32_t>(vector[i]))
          << "tokens " << tokens.size() << " at " << i;
    EXPECT_EQ(routes.integer, kRows * 2 - 2) << "tokens " << tokens.size();
    EXPECT_EQ(routes.general, 2) << "tokens " << tokens.size();
    EXPECT_EQ(routes.pairs, 0) << "tokens " << tokens.size();
  }
}
#endif

}  // namespace
}  // namespace dsinfer::backend::cpu
