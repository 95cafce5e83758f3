// GPU-vs-CPU op conformance checks, callable as a library (by `dsinfer doctor`) and by the
// test_cuda suite. Each check builds seeded random inputs in the checkpoint's formats, runs the
// CUDA op and the CPU backend's op (backend/cpu, the oracle) on the same data, and compares
// element by element against an error budget; outputs are surrounded by guard bytes that must
// survive, and start as NaN so an element the kernel forgot to write fails the comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/kernels.h"
#include "model/weights.h"

namespace dsinfer::backend::cuda {

// Error budgets (derived, not yet measured on a GPU: docs/SUPPORT.md). The GPU differs from the
// CPU only by fp32 summation order and libm (expf, sqrtf are the same IEEE ops on both sides).
// A length-K fp32 dot product has a rounding error well below u*sqrt(K)*sum|x*w| on each side
// (u = 2^-24); 1e-5 of sum|x*w| is > 20x that for K = 8192.
inline constexpr double kMatMulRelToSumAbs = 1e-5;
// The tensor-core GEMM's e4m3 MMA sums its 32 exact products inside the instruction with fewer
// bits than fp32 (Hopper's FP8 MMAs keep about 14, DeepSeek-V3 report §3.3.2). Worst case with a
// 13-bit aligned adder: each product loses <= 2^-13 of the MMA's largest, so <= 32 * 2^-13 =
// 2^-8 of sum |x w|. (The fp16 MMA path has fp32 adds and keeps kMatMulRelToSumAbs.)
inline constexpr double kTcFp8RelToSumAbs = 0x1p-8;
// fp32 elementwise ops after a reduction (RMSNorm, mHC): relative to the element, plus a floor
// relative to the row's largest element for cancellation.
inline constexpr double kElementwiseRel = 2e-5;
inline constexpr double kElementwiseFloor = 1e-6;
// Outputs rounded to bf16 may land one bf16 ulp (<= 2^-7 |x|) apart when the fp32 values before
// rounding straddle a rounding boundary.
inline constexpr double kBf16Ulp = 1.0 / 128.0;

struct CheckResult {
  std::string op;     // "matmul/fp8-e8m0", "rmsnorm/bf16", ...
  std::string shape;  // "m=3 rows=200 cols=384"
  bool ok = false;
  double budget_share = 0;  // worst |gpu - cpu| / budget over the elements (ok needs <= 1)
  std::string detail;       // first failure: element, values, or the error status
};

CheckResult CheckMatMul(CudaDevice& dev, model::WeightFormat format, bool f32_scales, int64_t m,
                        int64_t rows, int64_t cols, uint32_t seed);
// Routed-expert FP4 weights re-blocked to FP8 on the host (backend/fp4_to_fp8.h), run through
// the GPU's FP8 path, against the CPU's FP4 path on the original weights.
CheckResult CheckReblockedFp4MatMul(CudaDevice& dev, int64_t m, int64_t rows, int64_t cols,
                                    uint32_t seed);
CheckResult CheckRmsNorm(CudaDevice& dev, int64_t rows, int64_t n, bool with_weight,
                         bool round_bf16, uint32_t seed);
CheckResult CheckRope(CudaDevice& dev, int64_t rows, int rope_dim, bool compressed_layer,
                      bool inverse, bool round_bf16, uint32_t seed);
// hc_pre (mixes, Sinkhorn, x) then hc_post, for `tokens` tokens.
CheckResult CheckHc(CudaDevice& dev, int hc, int64_t hidden, int64_t tokens, bool round_bf16,
                    uint32_t seed);

// Router: the GPU router vs the CPU backend's selection rule (routing.h RouteTokens, moe.cc's
// semantics); hash routing, biased top-k, and exact ties (ties -> lower id).
CheckResult CheckRouter(CudaDevice& dev, int64_t tokens, int n_experts, int top_k, bool hash,
                        bool ties, uint32_t seed);
// Grouped MoE GEMM over routed tokens vs cpu::MatMul per expert on the gathered rows.
CheckResult CheckGroupedMatMul(CudaDevice& dev, model::WeightFormat format, int64_t tokens,
                               int n_experts, int top_k, int64_t rows, int64_t cols, uint32_t seed);
// The tensor-core grouped GEMM of FP4 experts (ops.h TcGroupedMatMul) vs cpu::MatMul per
// expert on the act quant's round trip of the same activations.
CheckResult CheckTcGroupedMatMul(CudaDevice& dev, TcMma mma, int64_t tokens, int n_experts,
                                 int top_k, int64_t rows, int64_t cols, uint32_t seed);
// Indexer scores vs attention.cc's loop (cpu::Dot), then the GPU top-k vs the top-k rule.
CheckResult CheckIndexerTopK(CudaDevice& dev, int64_t tokens, int heads, int head_dim, int top_k,
                             int64_t first_pos, bool round_bf16, bool ties, uint32_t seed);
// Sparse attention with sink over window + compressed rows vs attention.cc's loop.
CheckResult CheckSparseAttention(CudaDevice& dev, int64_t tokens, int heads, int head_dim,
                                 int window, int ratio, int64_t first_pos, bool round_bf16,
                                 uint32_t seed);

// Compressor pooling (CSA overlap / HCA) vs attention.cc's CompressorPush, mirrored step for
// step (it is private to attention.cc); prev: a continued sequence with a previous group.
CheckResult CheckCompressorPool(CudaDevice& dev, int64_t n_groups, int ratio, int width,
                                bool overlap, bool with_prev, uint32_t seed);

// The activation rounding steps of the official numerics on the GPU (model_kernels.h) against
// core/quant.h bit for bit: "fp8" / "fp4" round trips over the first n of each row (stride
// `stride`) in blocks of `block`, or "hadamard" (n a power of two). Inputs span many binades per
// block, with exact zeros, ties of the target grids and a NaN.
CheckResult CheckActivationRounding(CudaDevice& dev, const std::string& kind, int64_t rows,
                                    int64_t n, int64_t stride, int block, bool round_bf16,
                                    uint32_t seed);

// The act quant in front of the tensor-core GEMM (LaunchActQuantFp8) vs core/quant.h
// ActQuantFp8: codes and scales bit for bit, over many binades with zeros, ties and a NaN.
CheckResult CheckActQuantCodes(CudaDevice& dev, int64_t rows, int64_t n, uint32_t seed);
// The tensor-core GEMM (ops.h TcMatMul) on FP8 weights vs the CPU's MatMul on the act quant's
// round trip of the same activations.
CheckResult CheckTcMatMul(CudaDevice& dev, TcMma mma, int64_t m, int64_t rows, int64_t cols,
                          uint32_t seed);

// The whole GPU forward (CudaModel, fp32-reference numerics) against the CPU backend's
// (CpuModel) on the same weights: the logits of every position of n_tokens seeded ids, worst
// NMSE over positions against kForwardLogitsNmse. Both sides compute in fp32 with exactly
// dequantized weights, so they differ by summation order only: the budget is the golden suites'
// (tests/tolerance.h kGoldenLogitsNmse, 5x the transformers-vs-engine floor); measured on an
// H200: 2.9e-13 (docs/SUPPORT.md).
inline constexpr double kForwardLogitsNmse = 2e-11;
CheckResult CheckForward(CudaDevice& dev, const model::ModelWeights& weights, int64_t n_tokens,
                         uint32_t seed);

// The standard grid (one token, ragged batches, sizes off the tile multiples, every format):
// what `dsinfer doctor` runs. A few seconds on any supported GPU.
std::vector<CheckResult> RunConformance(CudaDevice& dev);

}  // namespace dsinfer::backend::cuda
