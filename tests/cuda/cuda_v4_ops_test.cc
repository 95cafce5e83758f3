// The CUDA backend's V4-specific ops: router, grouped MoE GEMM over routed tokens, indexer
// scores + top-k, sparse attention with sink, compressor pooling. The host-side index logic
// (routing.h) is tested here on every machine; the device conformance tests (vs the CPU backend,
// guard bytes around every output) skip with "no CUDA device: <reason>" without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/cuda/conformance.h"
#include "backend/cuda/device.h"
#include "backend/cuda/routing.h"
#include "device_test_util.h"

namespace dsinfer::backend::cuda {
namespace {

// ---- host-side logic (always runs) -------------------------------------------------------------

float Score(float logit) { return std::sqrt(std::log1p(std::exp(logit))); }

TEST(CudaRouting, BiasedTopKSelectsOnBiasedScoresAndWeighsUnbiased) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};  // [1, 4]
  const std::vector<float> bias = {1.0f, 0.0f, 0.0f, -2.0f};   // [4]
  const std::vector<int32_t> tokens = {5};
  RouterParams p;
  p.n_experts = 4;
  p.top_k = 2;
  p.route_scale = 1.5f;
  p.bias = bias.data();
  std::vector<int32_t> chosen;
  std::vector<float> weights;
  ASSERT_TRUE(RouteTokens(p, logits, tokens, &chosen, &weights).ok());
  // Biased: 0.83+1, 1.15, 1.46, 1.75-2: experts 0 then 2 (3 has the best unbiased score).
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 2}));
  const float s0 = Score(0.0f), s2 = Score(2.0f);
  EXPECT_FLOAT_EQ(weights[0], s0 / (s0 + s2) * 1.5f);
  EXPECT_FLOAT_EQ(weights[1], s2 / (s0 + s2) * 1.5f);
}

TEST(CudaRouting, ExactTiesGoToTheLowerExpertId) {
  std::vector<float> logits(2 * 6, 0.25f);  // [2, 6] every expert ties
  logits[6 + 4] = 1.0f;                     // token 1: expert 4 first, then the ties in id order
  const std::vector<float> bias(6, 0.0f);
  const std::vector<int32_t> tokens = {0, 1};
  RouterParams p;
  p.n_experts = 6;
  p.top_k = 3;
  p.bias = bias.data();
  std::vector<int32_t> chosen;
  std::vector<float> weights;
  ASSERT_TRUE(RouteTokens(p, logits, tokens, &chosen, &weights).ok());
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 1, 2, 4, 0, 1}));
  EXPECT_FLOAT_EQ(weights[0] + weights[1] + weights[2], 1.0f);
}

TEST(CudaRouting, HashRoutingReadsTheTableAndRejectsBadIds) {
  const std::vector<int32_t> table = {3, 1, 0, 0, 2, 3};  // [vocab 3, K 2]
  std::vector<float> logits(2 * 4, 0.0f);
  logits[4 + 2] = 2.0f;
  RouterParams p;
  p.n_experts = 4;
  p.top_k = 2;
  p.tid2eid = table.data();
  p.vocab = 3;
  std::vector<int32_t> chosen;
  std::vector<float> weights;
  ASSERT_TRUE(RouteTokens(p, logits, std::vector<int32_t>{0, 2}, &chosen, &weights).ok());
  EXPECT_EQ(chosen, (std::vector<int32_t>{3, 1, 2, 3}));
  EXPECT_FLOAT_EQ(weights[2], Score(2.0f) / (Score(2.0f) + Score(0.0f)));
  EXPECT_FALSE(RouteTokens(p, logits, std::vector<int32_t>{0, 3}, &chosen, &weights).ok());
  const std::vector<int32_t> bad_table = {0, 4, 0, 0, 0, 0};
  p.tid2eid = bad_table.data();
  EXPECT_FALSE(RouteTokens(p, logits, std::vector<int32_t>{0, 1}, &chosen, &weights).ok());
}

TEST(CudaRouting, RejectsMalformedRouterInput) {
  const std::vector<float> bias(4, 0.0f), logits(8, 0.0f);
  const std::vector<int32_t> tokens = {0, 1};
  std::vector<int32_t> chosen;
  std::vector<float> weights;
  RouterParams p;
  p.n_experts = 4;
  p.top_k = 5;  // more than the experts
  p.bias = bias.data();
  EXPECT_FALSE(RouteTokens(p, logits, tokens, &chosen, &weights).ok());
  p.top_k = 2;
  EXPECT_FALSE(RouteTokens(p, std::vector<float>(7), tokens, &chosen, &weights).ok());
  p.bias = nullptr;  // neither bias nor table
  EXPECT_FALSE(RouteTokens(p, logits, tokens, &chosen, &weights).ok());
}

TEST(CudaRouting, GroupsSlotsPerExpertInSlotOrder) {
  const std::vector<int32_t> chosen = {2, 0, 1, 2, 2, 2};  // [T 3, K 2]
  auto g = GroupRoutedTokens(chosen, 4, 2);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->offsets, (std::vector<int32_t>{0, 1, 2, 6, 6}));
  EXPECT_EQ(g->slots, (std::vector<int32_t>{1, 2, 0, 3, 4, 5}));
  EXPECT_EQ(g->tokens, (std::vector<int32_t>{0, 1, 0, 1, 2, 2}));
  std::vector<ExpertTile> tiles = BuildExpertTiles(*g, 2);
  ASSERT_EQ(tiles.size(), 4u);
  EXPECT_EQ(std::tie(tiles[0].expert, tiles[0].begin, tiles[0].count), std::make_tuple(0, 0, 1));
  EXPECT_EQ(std::tie(tiles[1].expert, tiles[1].begin, tiles[1].count), std::make_tuple(1, 1, 1));
  EXPECT_EQ(std::tie(tiles[2].expert, tiles[2].begin, tiles[2].count), std::make_tuple(2, 2, 2));
  EXPECT_EQ(std::tie(tiles[3].expert, tiles[3].begin, tiles[3].count), std::make_tuple(2, 4, 2));
  EXPECT_FALSE(GroupRoutedTokens(std::vector<int32_t>{0, 4}, 4, 2).ok());
  EXPECT_FALSE(GroupRoutedTokens(std::vector<int32_t>{0, -1}, 4, 2).ok());
  EXPECT_FALSE(GroupRoutedTokens(std::vector<int32_t>{0, 1, 2}, 4, 2).ok());
}

TEST(CudaRouting, TilesCoverEveryGroupedRowOnce) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> e_d(0, 9);
  std::vector<int32_t> chosen(37 * 6);
  for (auto& e : chosen) e = e_d(rng);
  auto g = GroupRoutedTokens(chosen, 12, 6);  // experts 10 and 11 unused
  ASSERT_TRUE(g.ok());
  std::vector<int> covered(chosen.size(), 0);
  for (const ExpertTile& t : BuildExpertTiles(*g, 8)) {
    EXPECT_GE(t.count, 1);
    EXPECT_LE(t.count, 8);
    for (int32_t j = t.begin; j < t.begin + t.count; ++j) {
      ++covered[j];
      EXPECT_EQ(chosen[g->slots[j]], t.expert);  // the row belongs to the tile's expert
      EXPECT_EQ(g->tokens[j], g->slots[j] / 6);
    }
  }
  for (int c : covered) EXPECT_EQ(c, 1);
}

TEST(CudaRouting, SparseRowListsWindowAndCompressedRows) {
  SparseRowSpec spec;
  spec.window = 4;
  spec.ratio = 0;
  spec.window_first_pos = 2;  // pool rows 0..4 hold positions 2..6
  spec.window_rows = 5;
  std::vector<int64_t> pos = {5, 6};
  auto w = BuildSparseRowLists(spec, pos, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->offsets, (std::vector<int32_t>{0, 4, 8}));
  EXPECT_EQ(w->rows, (std::vector<int32_t>{0, 1, 2, 3, 1, 2, 3, 4}));
  // HCA (ratio 2 here): every visible compressed row after the window rows.
  spec.ratio = 2;
  spec.compressed_base = 5;
  spec.compressed_rows = 3;
  auto h = BuildSparseRowLists(spec, pos, nullptr);
  ASSERT_TRUE(h.ok());
  // pos 5: window positions 2..5, compressed rows (5+1)/2 = 3; pos 6: 3..6 and 7/2 = 3.
  EXPECT_EQ(h->rows, (std::vector<int32_t>{0, 1, 2, 3, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(h->offsets, (std::vector<int32_t>{0, 7, 14}));
  // CSA: the selected rows.
  spec.ratio = 4;
  std::vector<std::vector<int32_t>> selected = {{1}, {0, 2}};
  auto c = BuildSparseRowLists(spec, pos, &selected);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rows, (std::vector<int32_t>{0, 1, 2, 3, 6, 1, 2, 3, 4, 5, 7}));
  // Out of the pool: a selected row past it, a window position before it.
  selected[1] = {3};
  EXPECT_FALSE(BuildSparseRowLists(spec, pos, &selected).ok());
  spec.ratio = 0;
  EXPECT_FALSE(BuildSparseRowLists(spec, std::vector<int64_t>{4}, nullptr).ok());
  EXPECT_FALSE(BuildSparseRowLists(spec, std::vector<int64_t>{7}, nullptr).ok());
}

// ---- device conformance (skips without a GPU) --------------------------------------------------

TEST(CudaRouter, MatchesCpuRule) {
  DEVICE_OR_SKIP(dev);
  for (bool hash : {false, true})
    for (auto [tokens, experts, k] :
         {std::tuple<int64_t, int, int>{1, 1, 1}, {3, 8, 8}, {64, 256, 6}, {5, 300, 16}})
      ExpectPass(CheckRouter(*dev, tokens, experts, k, hash, false,
                             static_cast<uint32_t>(tokens + experts)));
  for (int64_t tokens : {1, 40}) ExpectPass(CheckRouter(*dev, tokens, 256, 6, false, true, 9));
}

TEST(CudaGroupedMatMul, MatchesCpuPerExpert) {
  DEVICE_OR_SKIP(dev);
  using F = model::WeightFormat;
  for (F f : {F::kFp4Packed, F::kFp8Block, F::kBF16, F::kF32})
    for (auto [tokens, experts, k, rows, cols] :
         {std::tuple<int64_t, int, int, int64_t, int64_t>{1, 2, 1, 1, 32},
          {2, 8, 6, 130, 224},
          {17, 9, 2, 7, 4096},
          {64, 32, 6, 512, 1024}})
      ExpectPass(CheckGroupedMatMul(*dev, f, tokens, experts, k, rows, cols,
                                    static_cast<uint32_t>(rows + cols)));
}

TEST(CudaIndexer, ScoresAndTopKMatchCpu) {
  DEVICE_OR_SKIP(dev);
  for (bool round : {false, true})
    for (auto [tokens, heads, dim, k, first] :
         {std::tuple<int64_t, int, int, int, int64_t>{1, 1, 32, 1, 3},
          {4, 8, 64, 8, 20},
          {3, 64, 128, 512, 4096},
          {1, 4, 128, 512, 1 << 20}})
      ExpectPass(CheckIndexerTopK(*dev, tokens, heads, dim, k, first, round, false,
                                  static_cast<uint32_t>(dim + k)));
  for (int k : {1, 7, 100}) ExpectPass(CheckIndexerTopK(*dev, 6, 4, 64, k, 700, false, true, 5));
}

TEST(CudaSparseAttention, MatchesCpuOverWindowAndCompressedRows) {
  DEVICE_OR_SKIP(dev);
  for (bool round : {false, true})
    for (auto [tokens, heads, dim, window, ratio, first] :
         {std::tuple<int64_t, int, int, int, int, int64_t>{1, 1, 64, 1, 0, 0},
          {7, 4, 512, 128, 0, 3},
          {9, 3, 100, 16, 4, 61},
          {2, 2, 512, 128, 4, 300000},
          {4, 8, 512, 128, 128, 20000}})
      ExpectPass(CheckSparseAttention(*dev, tokens, heads, dim, window, ratio, first, round,
                                      static_cast<uint32_t>(dim + first)));
}

TEST(CudaCompressor, PoolingMatchesCpu) {
  DEVICE_OR_SKIP(dev);
  for (bool prev : {false, true})
    for (auto [groups, width] : {std::pair<int64_t, int>{1, 2 * 512}, {7, 2 * 50}, {64, 2 * 128}})
      ExpectPass(CheckCompressorPool(*dev, groups, 4, width, true, prev,
                                     static_cast<uint32_t>(groups + width)));
  for (auto [groups, width] : {std::pair<int64_t, int>{1, 512}, {3, 130}, {16, 512}})
    ExpectPass(CheckCompressorPool(*dev, groups, 128, width, false, false,
                                   static_cast<uint32_t>(groups * width)));
}

}  // namespace
}  // namespace dsinfer::backend::cuda
