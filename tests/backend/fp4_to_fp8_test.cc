// FP4 -> FP8 re-blocking (spec §11.1): the converted FP8 block weight must dequantize to exactly
// the same fp32 values (bit for bit) as the FP4 source, and lossy blocks must be reported.
#include "backend/fp4_to_fp8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear.h"

namespace dsinfer::backend {
namespace {

struct Fp4Source {
  std::vector<uint8_t> packed;  // [rows, cols/2] e2m1 pairs
  std::vector<uint8_t> scales;  // [rows, cols/32] e8m0
  model::WeightMatrix view;
};

// Random codes; scale exponents drawn from [base - spread, base].
Fp4Source MakeFp4(int64_t rows, int64_t cols, int base_code, int spread, uint32_t seed) {
  Fp4Source s;
  std::mt19937 rng(seed);
  s.packed.resize(rows * cols / 2);
  s.scales.resize(rows * cols / 32);
  for (auto& b : s.packed) b = static_cast<uint8_t>(rng());
  std::uniform_int_distribution<int> d(base_code - spread, base_code);
  for (auto& c : s.scales) c = static_cast<uint8_t>(d(rng));
  s.view.format = model::WeightFormat::kFp4Packed;
  s.view.data = s.packed.data();
  s.view.scales = s.scales.data();
  s.view.scale_dtype = DType::kF8E8M0;
  s.view.rows = rows;
  s.view.cols = cols;
  s.view.scale_cols = cols / 32;
  s.view.block = 32;
  s.view.name = "test.w1";
  return s;
}

void ExpectBitExact(const model::WeightMatrix& a, const model::WeightMatrix& b) {
  std::vector<float> ra(a.cols), rb(b.cols);
  for (int64_t r = 0; r < a.rows; ++r) {
    cpu::DequantRow(a, r, ra.data());
    cpu::DequantRow(b, r, rb.data());
    for (int64_t c = 0; c < a.cols; ++c)
      // Same value, and the same bits except for the sign of zero (+0 and -0 both decode to 0).
      ASSERT_TRUE(ra[c] == rb[c] && (ra[c] == 0.0f || std::bit_cast<uint32_t>(ra[c]) ==
                                                          std::bit_cast<uint32_t>(rb[c])))
          << "row " << r << " col " << c << ": " << ra[c] << " vs " << rb[c];
  }
}

TEST(Fp4ToFp8, BitExactOnCheckpointLikeScales) {
  // Expert scales in V4 checkpoints sit within a few binades of each other; 14 is the limit.
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{256, 256}, {200, 96}, {1, 32}, {129, 160}}) {
    Fp4Source src = MakeFp4(rows, cols, 120, 14, static_cast<uint32_t>(rows * 7 + cols));
    auto fp8 = ReblockFp4ToFp8(src.view);
    ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
    EXPECT_EQ(fp8->inexact, 0);
    EXPECT_EQ(fp8->scale_cols, (cols + 127) / 128);
    EXPECT_EQ(fp8->scales.size(), static_cast<size_t>(((rows + 127) / 128) * fp8->scale_cols));
    ExpectBitExact(src.view, fp8->View("test.w1.fp8"));
  }
}

TEST(Fp4ToFp8, BlockScaleIsMaxMinusSix) {
  Fp4Source src = MakeFp4(128, 128, 130, 0, 1);
  src.scales[5 * 4 + 2] = 133;  // one larger scale in the block
  auto fp8 = ReblockFp4ToFp8(src.view);
  ASSERT_TRUE(fp8.ok());
  ASSERT_EQ(fp8->scales.size(), 1u);
  EXPECT_EQ(fp8->scales[0], 133 - 6);
  EXPECT_EQ(fp8->inexact, 0);
  ExpectBitExact(src.view, fp8->View("x"));
}

TEST(Fp4ToFp8, TinyScalesClampToSmallestE8m0) {
  Fp4Source src = MakeFp4(64, 64, 3, 3, 2);  // scales 2^-127 .. 2^-124
  auto fp8 = ReblockFp4ToFp8(src.view);
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->scales[0], 0);
  EXPECT_EQ(fp8->inexact, 0);
  ExpectBitExact(src.view, fp8->View("x"));
}

TEST(Fp4ToFp8, ReportsLossyBlocks) {
  Fp4Source src = MakeFp4(128, 128, 140, 0, 3);
  for (auto& c : src.scales) c = 100;  // 2^-27: far below the block maximum...
  src.scales[0] = 140;                 // ...which is 2^13, so the rest underflows e4m3
  auto fp8 = ReblockFp4ToFp8(src.view);
  ASSERT_TRUE(fp8.ok());
  EXPECT_GT(fp8->inexact, 0);
}

TEST(Fp4ToFp8, RejectsNaNScaleAndWrongFormat) {
  Fp4Source src = MakeFp4(32, 64, 127, 2, 4);
  src.scales[3] = 0xff;
  auto r = ReblockFp4ToFp8(src.view);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NaN"), std::string::npos);
  src.view.format = model::WeightFormat::kBF16;
  EXPECT_FALSE(ReblockFp4ToFp8(src.view).ok());
}

TEST(Fp4ToFp8, AcceptsF32PowerOfTwoScales) {
  Fp4Source src = MakeFp4(128, 64, 127, 4, 5);
  std::vector<float> f32(src.scales.size());
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = E8M0ToF32(src.scales[i]);
  model::WeightMatrix v = src.view;
  v.scales = reinterpret_cast<const uint8_t*>(f32.data());
  v.scale_dtype = DType::kF32;
  auto fp8 = ReblockFp4ToFp8(v);
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  EXPECT_EQ(fp8->inexact, 0);
  ExpectBitExact(v, fp8->View("x"));
  f32[7] = 0.3f;
  EXPECT_FALSE(ReblockFp4ToFp8(v).ok());
}

}  // namespace
}  // namespace dsinfer::backend
