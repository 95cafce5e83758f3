// Launch wrappers of the small kernels that chain the V4 ops into a forward pass on the GPU
// (model_kernels.cu, used by cuda_model.cc): embedding, elementwise rounding and scaling, the
// official numerics' activation round trips (FP8 / FP4 / Hadamard, exactly as core/quant.h),
// the per-head query norm, SwiGLU, the MoE combine and the window ring's gather / scatter.
// Raw device pointers, shapes in elements; they only enqueue work on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::backend::cuda {

// H [T, hc, D] f32: every stream of token t = the bf16 embedding row tokens[t] ([vocab, D] bf16).
cudaError_t LaunchEmbed(const uint16_t* embed, const int32_t* tokens, int64_t T, int hc, int64_t D,
                        float* H, cudaStream_t stream);

// x [n] <- round_bf16 ? bf16(x * s) : x * s (s = 1: a plain bf16 rounding).
cudaError_t LaunchScaleRound(float* x, int64_t n, float s, bool round_bf16, cudaStream_t stream);

// out [n] = a [n] + b [n] (fp32 adds, as the CPU's loops).
cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream);

// core/quant.h Fp8RoundTripInPlace / Fp4RoundTripInPlace over the first n of each of `rows`
// rows (row stride `stride`), in blocks of `block` columns: bit for bit the CPU's result.
cudaError_t LaunchFp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block,
                               cudaStream_t stream);
cudaError_t LaunchFp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block,
                               cudaStream_t stream);
// core/quant.h ActQuantFp8 with blocks of 128 on each of `rows` rows of n: codes [rows, n] e4m3
// and scales [rows, ceil(n / 128)] f32, bit for bit the CPU's (the tensor-core GEMM's input).
cudaError_t LaunchActQuantFp8(const float* x, int64_t rows, int64_t n, uint8_t* codes,
                              float* scales, cudaStream_t stream);
// core/quant.h HadamardInPlace on each row of n (a power of two <= 4096), bit for bit.
cudaError_t LaunchHadamard(float* x, int64_t rows, int n, bool round_bf16, cudaStream_t stream);

// attention.cc's per-head query norm over rows of n: x * bf16?(1 / sqrt(mean(x^2) + eps)), no
// weight; the reciprocal is rounded to bf16 first in the official numerics, as the CPU does.
cudaError_t LaunchHeadRmsNorm(float* x, int64_t rows, int64_t n, float eps, bool round_bf16,
                              cudaStream_t stream);

// moe.cc's SwiGLU: h [rows, inter] = silu(min(g, L)) * clamp(u, -L, L) * weight[row] (weight
// null: 1), with the CPU's rounding points; g and u [rows, inter] (h may alias g).
cudaError_t LaunchSwiGlu(const float* g, const float* u, int64_t rows, int64_t inter,
                         const float* row_weight, float limit, bool round_bf16, float* h,
                         cudaStream_t stream);

// out [T, D] = sum_k y[rows[t, k]] (k in order: the CPU's expert order) + shared[t] (null:
// none), rounded to bf16 at the end when asked; rows [T, K] int32 grouped-row indices.
cudaError_t LaunchMoeCombine(const float* y, const int32_t* rows, int K, const float* shared,
                             int64_t T, int64_t D, bool round_bf16, float* out,
                             cudaStream_t stream);

// dst [n, width] = ring rows of positions first_pos .. first_pos + n - 1 (slot p % W).
cudaError_t LaunchRingGather(const float* ring, int W, int64_t width, int64_t first_pos, int64_t n,
                             float* dst, cudaStream_t stream);
// ring slot (first_pos + i) % W <- src row i for the last min(n, W) rows of src [n, width].
cudaError_t LaunchRingScatter(const float* src, int64_t n, int64_t first_pos, int W, int64_t width,
                              float* ring, cudaStream_t stream);

}  // namespace dsinfer::backend::cuda
