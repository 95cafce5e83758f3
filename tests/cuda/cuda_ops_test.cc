// CUDA backend conformance: every GPU op against the CPU backend over a shape grid (one token,
// ragged batches, sizes off the tile multiples, long-context positions), with guard bytes around
// every output (backend/cuda/conformance.h). Without a usable GPU every device test skips with
// "no CUDA device: <reason>"; the pure tests (kernel path selection, arch matching, the
// no-device report) always run.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/conformance.h"
#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/paths.h"
#include "backend/random_weights.h"
#include "device_test_util.h"

namespace dsinfer::backend::cuda {
namespace {

TEST(CudaPaths, SelectionByComputeCapability) {
  KernelPaths hopper = PathsFor(9, 0);
  EXPECT_TRUE(hopper.supported_arch);
  EXPECT_TRUE(hopper.fp8_tensor_cores);
  EXPECT_FALSE(hopper.fp4_tensor_cores);
  EXPECT_FALSE(hopper.not_yet_used.empty());  // wgmma is not implemented yet: degraded
  KernelPaths ada = PathsFor(8, 9);
  EXPECT_TRUE(ada.fp8_tensor_cores);
  EXPECT_FALSE(ada.fp4_tensor_cores);
  KernelPaths ampere = PathsFor(8, 0);
  EXPECT_TRUE(ampere.supported_arch);
  EXPECT_FALSE(ampere.fp8_tensor_cores);
  EXPECT_TRUE(PathsFor(10, 0).fp4_tensor_cores);
  EXPECT_TRUE(PathsFor(12, 0).fp4_tensor_cores);
  KernelPaths turing = PathsFor(7, 5);
  EXPECT_FALSE(turing.supported_arch);
  EXPECT_NE(turing.fp8_gemm.find("sm_80"), std::string::npos);
}

TEST(CudaPaths, CompiledForMatchesCudaCompatibilityRules) {
  EXPECT_TRUE(CompiledFor(9, 0, {"90a"}));
  EXPECT_FALSE(CompiledFor(10, 0, {"90a"}));  // arch-specific code runs on 9.0 only
  EXPECT_TRUE(CompiledFor(8, 6, {"80"}));     // same-major cubin
  EXPECT_TRUE(CompiledFor(9, 0, {"80"}));     // PTX JIT
  EXPECT_FALSE(CompiledFor(9, 0, {"80-real"}));
  EXPECT_FALSE(CompiledFor(8, 0, {"86-real"}));
  EXPECT_TRUE(CompiledFor(12, 0, {"80-virtual"}));
  EXPECT_FALSE(CompiledFor(8, 0, {}));
  EXPECT_FALSE(CompiledArchs().empty());  // DSINFER_CUDA_ARCHS reached the library
}

TEST(CudaDevice, EnumerationExplainsAMissingDevice) {
  auto devices = EnumerateDevices();
  if (devices.ok()) {
    ASSERT_FALSE(devices->empty());
    for (const DeviceInfo& d : *devices) {
      EXPECT_FALSE(d.name.empty());
      EXPECT_GE(d.sm_major, 1);
      EXPECT_GT(d.total_bytes, 0);
      EXPECT_GT(d.runtime_version, 0);
    }
    return;
  }
  EXPECT_EQ(devices.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(devices.status().message().empty());
  auto dev = CudaDevice::Open(0);  // opening fails the same way, without crashing
  EXPECT_FALSE(dev.ok());
}

TEST(CudaDevice, BuffersAndCopiesRoundTrip) {
  DEVICE_OR_SKIP(dev);
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  auto buf = dev->Upload(host.data(), host.size() * 4);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  std::vector<float> back(host.size());
  ASSERT_TRUE(dev->CopyToHost(back.data(), buf->data(), back.size() * 4).ok());
  EXPECT_EQ(back, host);
  DeviceBuffer moved = std::move(buf).value();
  EXPECT_EQ(moved.bytes(), host.size() * 4);
  EXPECT_FALSE(CudaDevice::Open(1000).ok());
}

// Staged uploads queue behind the stream's work without draining it; the staging is reused
// after a synchronisation and grows (after one) when an upload does not fit. Every buffer must
// arrive intact, including ones staged before a reuse or a growth.
TEST(CudaDevice, StagedUploadsArriveIntact) {
  DEVICE_OR_SKIP(dev);
  std::vector<std::vector<int32_t>> hosts;
  std::vector<DeviceBuffer> bufs;
  for (int64_t n : {1, 1000, 300000, 1 << 20, 7, 3 << 20, 5}) {  // crosses the 4 MiB staging
    std::vector<int32_t> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[i] = static_cast<int32_t>(i * 2654435761u + n);
    std::vector<int32_t> h = want;
    auto b = dev->UploadStaged(h.data(), h.size() * 4);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    std::fill(h.begin(), h.end(), -1);  // the staging holds its own copy: scribbling is safe
    hosts.push_back(std::move(want));
    bufs.push_back(std::move(b).value());
  }
  for (size_t k = 0; k < bufs.size(); ++k) {
    std::vector<int32_t> back(hosts[k].size());
    ASSERT_TRUE(dev->CopyToHost(back.data(), bufs[k].data(), back.size() * 4).ok());
    EXPECT_EQ(back, hosts[k]) << "upload " << k;
  }
  EXPECT_TRUE(dev->UploadStaged(nullptr, 0).ok());
}

using model::WeightFormat;
using MatMulCase = std::tuple<WeightFormat, bool, int64_t, int64_t, int64_t>;

class CudaMatMul : public testing::TestWithParam<MatMulCase> {};

TEST_P(CudaMatMul, MatchesCpu) {
  DEVICE_OR_SKIP(dev);
  auto [format, f32_scales, m, rows, cols] = GetParam();
  ExpectPass(CheckMatMul(*dev, format, f32_scales, m, rows, cols,
                         static_cast<uint32_t>(m * 131 + rows + cols)));
}

// Shapes: one token; decode batches 2..8 (GEMV); 9 (first tiled); ragged prefill; rows/cols
// off the 64/32 tiles and the 128 scale block; checkpoint-like sizes (K = 4096, N = 2048).
INSTANTIATE_TEST_SUITE_P(Formats, CudaMatMul,
                         testing::Combine(testing::Values(WeightFormat::kF32, WeightFormat::kBF16,
                                                          WeightFormat::kFp8Block,
                                                          WeightFormat::kFp4Packed),
                                          testing::Bool(), testing::Values(1, 8, 9, 67),
                                          testing::Values(1, 130, 520),
                                          testing::Values(32, 224, 4096)));

TEST(CudaMatMul, KNotAMultipleOf32) {
  DEVICE_OR_SKIP(dev);
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kFp8Block})
    for (int64_t cols : {1, 50, 100, 129, 1000})
      ExpectPass(CheckMatMul(*dev, f, false, 5, 70, cols, 3));
}

TEST(CudaFp4Experts, ReblockedToFp8MatchesCpuFp4) {
  DEVICE_OR_SKIP(dev);
  for (auto [m, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 2048, 4096},
                               {7, 300, 96},
                               {64, 4096, 2048},
                               {129, 128, 128}})
    ExpectPass(CheckReblockedFp4MatMul(*dev, m, rows, cols, 11));
}

// The tensor-core GEMM of the official numerics: its act quant bit for bit, then both MMAs
// against the CPU over token counts around the 64-token tile and the GEMV limit, rows off the
// 64-row tile, K below one scale block, a partial last block and checkpoint-sized K (split K).
TEST(CudaTcMatMul, ActQuantCodesMatchCpuBitForBit) {
  DEVICE_OR_SKIP(dev);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 16}, {5, 128}, {3, 1000}, {64, 4096}})
    ExpectPass(CheckActQuantCodes(*dev, rows, n, static_cast<uint32_t>(rows + n)));
}

TEST(CudaTcMatMul, MatchesCpuOnTheActQuantRoundTrip) {
  DEVICE_OR_SKIP(dev);
  for (TcMma mma : AvailableTcMmas(dev->info())) {
    double worst = 0;
    for (int64_t m : {9, 16, 64, 65, 300})
      for (int64_t rows : {64, 130, 1024})
        for (int64_t cols : {16, 96, 128, 4096}) {
          CheckResult r =
              CheckTcMatMul(*dev, mma, m, rows, cols, static_cast<uint32_t>(m * 7 + rows + cols));
          EXPECT_TRUE(r.ok) << r.op << " " << r.shape << ": " << r.detail;
          worst = std::max(worst, r.budget_share);
        }
    std::printf("  tc-matmul/%s: worst budget share %.3g over 60 shapes\n",
                mma == TcMma::kFp8 ? "fp8-mma" : "f16-mma", worst);
  }
}

// The routed FP4 experts' tensor-core grouped GEMM: one routed token, tiles of 1..64 rows, an
// expert with two tiles, rows off the 64-row tile, V4's expert widths as K (with fewer rows
// than V4's: the CPU oracle's sum |x w| of every output is what takes the time).
TEST(CudaTcGrouped, MatchesCpuOnTheActQuantRoundTrip) {
  DEVICE_OR_SKIP(dev);
  struct Case {
    int64_t tokens;
    int experts, k;
    int64_t rows, cols;
  };
  for (TcMma mma : AvailableTcMmas(dev->info())) {
    double worst = 0;
    for (const Case& c :
         {Case{1, 4, 6, 64, 128}, Case{13, 8, 6, 100, 256}, Case{70, 6, 2, 130, 384},
          Case{64, 32, 6, 256, 4096}, Case{96, 16, 6, 320, 2048}}) {
      CheckResult r = CheckTcGroupedMatMul(*dev, mma, c.tokens, c.experts, c.k, c.rows, c.cols,
                                           static_cast<uint32_t>(c.tokens + c.rows + c.cols));
      EXPECT_TRUE(r.ok) << r.op << " " << r.shape << ": " << r.detail;
      worst = std::max(worst, r.budget_share);
    }
    std::printf("  tc-grouped/%s: worst budget share %.3g over 5 shapes\n",
                mma == TcMma::kFp8 ? "fp8-mma" : "f16-mma", worst);
  }
}

TEST(CudaTcMatMul, RefusesWhatItCannotRun) {
  DEVICE_OR_SKIP(dev);
  std::mt19937 rng(3);
  auto upload = [&](model::WeightFormat f, int64_t cols) {
    HostWeight w = RandomWeight(rng, f, 64, cols, {.name = "refuse.w"});
    auto d = UploadWeight(*dev, w.view);
    EXPECT_TRUE(d.ok());
    return std::move(d).value();
  };
  auto x = dev->Alloc(64 * 4096 * 4);
  auto y = dev->Alloc(64 * 64 * 4);
  ASSERT_TRUE(x.ok() && y.ok());
  // Not FP8, and FP8 rows that are not whole 16-byte chunks: InvalidArgument, nothing launched.
  for (auto [f, cols] : {std::pair{model::WeightFormat::kBF16, int64_t{128}},
                         {model::WeightFormat::kFp4Packed, 128},
                         {model::WeightFormat::kFp8Block, 100}}) {
    DeviceWeight w = upload(f, cols);
    EXPECT_EQ(TcMatMul(*dev, w, x->as<float>(), 16, y->as<float>(), TcMma::kF16).code(),
              StatusCode::kInvalidArgument);
  }
  DeviceWeight w = upload(model::WeightFormat::kFp8Block, 256);
  if (dev->info().Sm() < 89) {
    EXPECT_EQ(TcMatMul(*dev, w, x->as<float>(), 16, y->as<float>(), TcMma::kFp8).code(),
              StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(TcMatMul(*dev, w, x->as<float>(), 0, y->as<float>(), TcMma::kF16).ok());
  EXPECT_TRUE(dev->Synchronize().ok());
}

TEST(CudaRmsNorm, MatchesCpu) {
  DEVICE_OR_SKIP(dev);
  for (bool round : {false, true})
    for (bool weight : {false, true})
      for (auto [rows, n] :
           {std::pair<int64_t, int64_t>{1, 4096}, {2, 1}, {5, 1000}, {64, 512}, {3, 7168}})
        ExpectPass(CheckRmsNorm(*dev, rows, n, weight, round, static_cast<uint32_t>(rows + n)));
}

TEST(CudaRope, MatchesCpuIncludingLongContextPositions) {
  DEVICE_OR_SKIP(dev);
  for (bool round : {false, true})
    for (bool inverse : {false, true})
      for (bool yarn : {false, true})
        for (int64_t rows : {1, 13, 1024})
          for (int rope_dim : {64, 2, 510})
            ExpectPass(CheckRope(*dev, rows, rope_dim, yarn, inverse, round,
                                 static_cast<uint32_t>(rows * rope_dim)));
}

TEST(CudaMhc, SinkhornPreAndPostMatchCpu) {
  DEVICE_OR_SKIP(dev);
  for (bool round : {false, true})
    for (int hc : {1, 4, 8})
      for (auto [hidden, tokens] : {std::pair<int64_t, int64_t>{4096, 1}, {1000, 5}, {257, 33}})
        ExpectPass(
            CheckHc(*dev, hc, hidden, tokens, round, static_cast<uint32_t>(hc * hidden + tokens)));
}

TEST(CudaConformance, DoctorGridPasses) {
  DEVICE_OR_SKIP(dev);
  for (const CheckResult& r : RunConformance(*dev)) ExpectPass(r);
}

}  // namespace
}  // namespace dsinfer::backend::cuda
