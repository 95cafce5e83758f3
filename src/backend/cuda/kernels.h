// Launch wrappers of the CUDA kernels (kernels.cu). Raw device pointers; shapes in elements.
// They only enqueue work on `stream` and return the launch status; ownership, uploads and
// synchronisation are the callers' (ops.h). Generic kernels: correct on every sm_80+ device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::backend::cuda {

// A weight matrix [rows = out, cols = in] in device memory, in the checkpoint's stored format.
struct DeviceWeightView {
  enum class Format : uint8_t { kF32, kBF16, kFp8Block, kFp4Packed };
  Format format = Format::kF32;
  const uint8_t* data = nullptr;  // f32 / bf16 [rows, cols], e4m3 [rows, cols], e2m1 [rows, cols/2]
  const uint8_t* scales = nullptr;  // FP8: [ceil(rows/128), scale_cols]; FP4: [rows, scale_cols]
  bool scales_f32 = false;          // scales are f32 powers of two instead of e8m0 codes
  int64_t rows = 0, cols = 0, scale_cols = 0;
};

// cudaFuncGetAttributes on a trivial kernel: cudaErrorNoKernelImageForDevice when this binary
// has no code for the current device.
cudaError_t ProbeKernelImageOnCurrentDevice();

// y [m, rows] = x [m, cols] * W^T, fp32 accumulation; x and y are fp32.
cudaError_t LaunchMatMul(const DeviceWeightView& w, const float* x, int64_t m, float* y,
                         cudaStream_t stream);

// In place over `rows` rows of n: x = w * x * rsqrt(mean(x^2) + eps); weight f32 [n] or null.
cudaError_t LaunchRmsNorm(float* x, int64_t rows, int64_t n, const float* weight, float eps,
                          bool round_bf16, cudaStream_t stream);

// Rotates x[r * row_stride + offset + (0..2*half)) of each row r by positions[r] (interleaved
// pairs); inv_freq f32 [half].
cudaError_t LaunchRope(float* x, int64_t rows, int64_t row_stride, int64_t offset,
                       const int64_t* positions, const float* inv_freq, int half, bool inverse,
                       bool round_bf16, cudaStream_t stream);

// mHC (spec §4) for `tokens` tokens. H: [tokens, hc, hidden] f32; fn [(2+hc)*hc, hc*hidden] f32,
// base [(2+hc)*hc], scale [3]. Outputs x [tokens, hidden] and mix [tokens, 2*hc + hc*hc]
// (pre, post, comb with comb[j*hc + k]: source j -> destination k). dots: scratch
// [tokens, (2+hc)*hc + 1] f32.
struct HcShape {
  int hc = 4;
  int64_t hidden = 0;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
};
cudaError_t LaunchHcPre(const HcShape& s, const float* fn, const float* base, const float* scale,
                        const float* H, int64_t tokens, float* dots, float* x, float* mix,
                        bool round_bf16, cudaStream_t stream);
// H[t, k] <- post_k * a[t] + sum_j comb[j][k] * H[t, j], in place; a: [tokens, hidden].
cudaError_t LaunchHcPost(const HcShape& s, const float* mix, const float* a, float* H,
                         int64_t tokens, bool round_bf16, cudaStream_t stream);

// Performance probes: sum of n floats (reads n*4 bytes; out: [1] f32, accumulated).
cudaError_t LaunchReadProbe(const float* x, int64_t n, float* out, cudaStream_t stream);

}  // namespace dsinfer::backend::cuda
