// Small kernels that chain the V4 ops into a forward pass (see model_kernels.h). Each mirrors a
// loop of the CPU backend (backend/cpu, core/quant.h) with the same fp32 operations in the same
// order, written with _rn intrinsics so nvcc cannot contract them into FMAs the CPU does not do.
#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/model_kernels.h"

namespace dsinfer::backend::cuda {

namespace {

constexpr int kThreads = 256;

unsigned BlocksFor(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void EmbedKernel(const uint16_t* embed, const int32_t* tokens, int hc, int64_t D,
                            float* H) {
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= D) return;
  const uint32_t b = embed[static_cast<int64_t>(tokens[t]) * D + i];
  const float v = __int_as_float(static_cast<int>(b << 16));
  for (int k = 0; k < hc; ++k) H[(t * hc + k) * D + i] = v;
}

__global__ void ScaleRoundKernel(float* x, int64_t n, float s, bool round_bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = s == 1.0f ? x[i] : __fmul_rn(x[i], s);
  x[i] = round_bf16 ? RoundBf16(v) : v;
}

__global__ void AddKernel(const float* a, const float* b, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __fadd_rn(a[i], b[i]);
}

// core/dtype.h RoundToSmallFloatGrid<kMantissaBits, kMinNormalExponent>: round |v| to the grid
// of a small float format by adding and subtracting 1.5 * 2^23 at the value's step.
template <int kMantissaBits, int kMinNormalExponent>
__device__ __forceinline__ float RoundToGrid(float v) {
  const float a = fabsf(v);
  const int exponent =
      static_cast<int>((static_cast<uint32_t>(__float_as_int(a)) >> 23) & 0xffu) - 127;
  const int step_exponent =
      (exponent < kMinNormalExponent ? kMinNormalExponent : exponent) - kMantissaBits;
  const float inv_step = __int_as_float((127 - step_exponent) << 23);
  const float step = __int_as_float((127 + step_exponent) << 23);
  constexpr float kRoundingMagic = 12582912.0f;
  const float shifted = __fadd_rn(__fmul_rn(a, inv_step), kRoundingMagic);
  return copysignf(__fmul_rn(__fsub_rn(shifted, kRoundingMagic), step), v);
}

// core/quant.cc PowerOfTwoScale: 2^ceil(log2(max(amax, floor) * inv_range)) from the bits.
__device__ __forceinline__ float PowerOfTwoScale(float amax, float amax_floor, float inv_range) {
  const float f = __fmul_rn(fmaxf(amax, amax_floor), inv_range);
  const uint32_t u = static_cast<uint32_t>(__float_as_int(f));
  const int e = static_cast<int>((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0 ? 1 : 0);
  return ldexpf(1.0f, e);
}

// max |v| over the thread block (<= 128 threads); every thread gets it. Call once per kernel.
__device__ __forceinline__ float BlockAbsMax(float v) {
  __shared__ float partial[4];
  float m = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = m;
  __syncthreads();
  float amax = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) amax = fmaxf(amax, partial[w]);
  return amax;
}

// core/quant.cc RoundTripInPlace: one block of `block` threads (<= 128) per (row, column
// block).
template <int kMantissaBits, int kMinNormalExponent>
__global__ void __launch_bounds__(128)
    RoundTripKernel(float* x, int64_t n, int64_t stride, int block, float amax_floor,
                    float inv_range, float range, float nan_decoded) {
  const int64_t n_blocks = (n + block - 1) / block;
  const int64_t row = blockIdx.x / n_blocks;
  const int64_t c = (blockIdx.x % n_blocks) * block + threadIdx.x;
  const bool in = threadIdx.x < block && c < n;
  float* p = x + row * stride + c;
  const float v = in ? *p : 0.0f;
  const float amax = BlockAbsMax(v);
  if (!in) return;
  const float s = PowerOfTwoScale(amax, amax_floor, inv_range);
  float q;
  if (isnan(v)) {
    q = nan_decoded;
  } else {
    q = RoundToGrid<kMantissaBits, kMinNormalExponent>(
        fminf(fmaxf(__fdiv_rn(v, s), -range), range));
  }
  *p = RoundBf16(__fmul_rn(q, s));
}

// The e4m3 code of q, a value of the e4m3 grid (|q| <= 448, from RoundToGrid<3, -6>).
__device__ __forceinline__ uint32_t E4m3CodeOfGridValue(float q) {
  const uint32_t bits = static_cast<uint32_t>(__float_as_int(q));
  const uint32_t sign = (bits >> 24) & 0x80u;
  const float a = fabsf(q);
  if (a < 0.015625f) return sign | static_cast<uint32_t>(a * 512.0f);  // subnormal m * 2^-9
  const uint32_t e = ((bits >> 23) & 0xffu) - 127u + 7u, m = (bits >> 20) & 7u;
  return sign | (e << 3) | m;
}

// core/quant.cc ActQuantFp8 for blocks of 128: one block of 128 threads per (row, column block);
// codes [rows, n] e4m3, scales [rows, n_blocks] f32. Same scale and grid as RoundTripKernel, so
// decode(code) * scale is exactly the FP8 round trip's value.
__global__ void __launch_bounds__(128)
    ActQuantFp8Kernel(const float* x, int64_t n, int64_t n_blocks, uint8_t* codes, float* scales) {
  const int64_t row = blockIdx.x / n_blocks, b = blockIdx.x % n_blocks;
  const int64_t c = b * 128 + threadIdx.x;
  const bool in = c < n;
  const float v = in ? x[row * n + c] : 0.0f;
  const float amax = BlockAbsMax(v);
  const float s = PowerOfTwoScale(amax, 1e-4f, 1.0f / 448.0f);
  if (threadIdx.x == 0) scales[row * n_blocks + b] = s;
  if (!in) return;
  codes[row * n + c] =
      static_cast<uint8_t>(isnan(v) ? 0x7fu
                                    : E4m3CodeOfGridValue(RoundToGrid<3, -6>(
                                          fminf(fmaxf(__fdiv_rn(v, s), -448.0f), 448.0f))));
}

// One block per row; the butterflies of core/quant.cc HadamardInPlace (each output of a stage is
// one add or subtract, so the order of the stage's work does not change a bit).
__global__ void HadamardKernel(float* x, int n, float scale, bool round_bf16) {
  extern __shared__ float v[];
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = row[i];
  __syncthreads();
  for (int h = 1; h < n; h *= 2) {
    for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const int j = (p / h) * 2 * h + (p % h);
      const float a = v[j], b = v[j + h];
      v[j] = __fadd_rn(a, b);
      v[j + h] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float s = __fmul_rn(v[i], scale);
    row[i] = round_bf16 ? RoundBf16(s) : s;
  }
}

__global__ void HeadRmsNormKernel(float* x, int64_t n, float eps, bool round_bf16) {
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(row[i], row[i], ss);
  ss = BlockSum(ss);
  float inv = 1.0f / sqrtf(__fadd_rn(ss / static_cast<float>(n), eps));
  if (round_bf16) inv = RoundBf16(inv);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = __fmul_rn(row[i], inv);
    row[i] = round_bf16 ? RoundBf16(v) : v;
  }
}

__global__ void SwiGluKernel(const float* g, const float* u, int64_t inter, const float* row_weight,
                             float limit, bool round_bf16, float* h) {
  const int64_t r = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= inter) return;
  const int64_t i = r * inter + j;
  float gv = g[i], uv = u[i];
  if (round_bf16) gv = RoundBf16(gv), uv = RoundBf16(uv);
  uv = fminf(fmaxf(uv, -limit), limit);
  gv = fminf(gv, limit);
  const float w = row_weight != nullptr ? row_weight[r] : 1.0f;
  const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)));
  const float v = __fmul_rn(__fmul_rn(silu, uv), w);
  h[i] = round_bf16 ? RoundBf16(v) : v;
}

__global__ void MoeCombineKernel(const float* y, const int32_t* rows, int K, const float* shared,
                                 int64_t D, bool round_bf16, float* out) {
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= D) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k)
    acc = __fadd_rn(acc, y[static_cast<int64_t>(rows[t * K + k]) * D + i]);
  if (shared != nullptr) acc = __fadd_rn(acc, shared[t * D + i]);
  out[t * D + i] = round_bf16 ? RoundBf16(acc) : acc;
}

__global__ void RingGatherKernel(const float* ring, int W, int64_t width, int64_t first_pos,
                                 float* dst) {
  const int64_t r = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= width) return;
  dst[r * width + i] = ring[((first_pos + r) % W) * width + i];
}

__global__ void RingScatterKernel(const float* src, int64_t first_row, int64_t first_pos, int W,
                                  int64_t width, float* ring) {
  const int64_t r = first_row + blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= width) return;
  ring[((first_pos + r) % W) * width + i] = src[r * width + i];
}

// Grid of (rows, column blocks) for a row-wise elementwise kernel: rows on x (up to 2^31 - 1;
// y is limited to 65535, which a batched step's rows exceed), columns on y.
bool RowGrid(int64_t rows, int64_t width, dim3* grid) {
  if (rows <= 0 || width <= 0) return false;
  *grid = dim3(static_cast<unsigned>(rows), BlocksFor(width));
  return true;
}

}  // namespace

cudaError_t LaunchEmbed(const uint16_t* embed, const int32_t* tokens, int64_t T, int hc, int64_t D,
                        float* H, cudaStream_t stream) {
  dim3 grid;
  if (!RowGrid(T, D, &grid)) return cudaSuccess;
  if (T > INT32_MAX) return cudaErrorInvalidValue;
  EmbedKernel<<<grid, kThreads, 0, stream>>>(embed, tokens, hc, D, H);
  return cudaGetLastError();
}

cudaError_t LaunchScaleRound(float* x, int64_t n, float s, bool round_bf16, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleRoundKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, s, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

namespace {
template <int kMantissaBits, int kMinNormalExponent>
cudaError_t LaunchRoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block,
                            float amax_floor, float inv_range, float range, float nan_decoded,
                            cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  const int64_t n_blocks = (n + block - 1) / block;
  if (block < 1 || block > 128 || n > stride || rows * n_blocks > INT32_MAX)
    return cudaErrorInvalidValue;
  const int threads = ((block + 31) / 32) * 32;
  // One flat grid of rows x column blocks (a batched step has more rows than grid.y allows).
  const unsigned grid = static_cast<unsigned>(rows * n_blocks);
  RoundTripKernel<kMantissaBits, kMinNormalExponent><<<grid, threads, 0, stream>>>(
      x, n, stride, block, amax_floor, inv_range, range, nan_decoded);
  return cudaGetLastError();
}
}  // namespace

// Constants of core/quant.cc (the reference's): 1/448 and 1/6 as fp32, the amax floors.
cudaError_t LaunchFp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block,
                               cudaStream_t stream) {
  return LaunchRoundTrip<3, -6>(x, rows, n, stride, block, 1e-4f, 1.0f / 448.0f, 448.0f,
                                __builtin_nanf(""), stream);
}

cudaError_t LaunchActQuantFp8(const float* x, int64_t rows, int64_t n, uint8_t* codes,
                              float* scales, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  const int64_t n_blocks = (n + 127) / 128;
  if (rows * n_blocks > INT32_MAX) return cudaErrorInvalidValue;
  ActQuantFp8Kernel<<<static_cast<unsigned>(rows * n_blocks), 128, 0, stream>>>(x, n, n_blocks,
                                                                                codes, scales);
  return cudaGetLastError();
}

cudaError_t LaunchFp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block,
                               cudaStream_t stream) {
  return LaunchRoundTrip<1, 0>(x, rows, n, stride, block, 6.0f * 1.1754943508222875e-38f,
                               1.0f / 6.0f, 6.0f, 6.0f, stream);
}

cudaError_t LaunchHadamard(float* x, int64_t rows, int n, bool round_bf16, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (n < 1 || n > 4096 || (n & (n - 1)) != 0 || rows > INT32_MAX) return cudaErrorInvalidValue;
  const float scale = 1.0f / sqrtf(static_cast<float>(n));
  HadamardKernel<<<static_cast<unsigned>(rows), 128, static_cast<size_t>(n) * 4, stream>>>(
      x, n, scale, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchHeadRmsNorm(float* x, int64_t rows, int64_t n, float eps, bool round_bf16,
                              cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;
  HeadRmsNormKernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(x, n, eps, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* g, const float* u, int64_t rows, int64_t inter,
                         const float* row_weight, float limit, bool round_bf16, float* h,
                         cudaStream_t stream) {
  dim3 grid;
  if (!RowGrid(rows, inter, &grid)) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;
  SwiGluKernel<<<grid, kThreads, 0, stream>>>(g, u, inter, row_weight, limit, round_bf16, h);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* y, const int32_t* rows, int K, const float* shared,
                             int64_t T, int64_t D, bool round_bf16, float* out,
                             cudaStream_t stream) {
  dim3 grid;
  if (!RowGrid(T, D, &grid)) return cudaSuccess;
  if (T > INT32_MAX) return cudaErrorInvalidValue;
  MoeCombineKernel<<<grid, kThreads, 0, stream>>>(y, rows, K, shared, D, round_bf16, out);
  return cudaGetLastError();
}

cudaError_t LaunchRingGather(const float* ring, int W, int64_t width, int64_t first_pos, int64_t n,
                             float* dst, cudaStream_t stream) {
  dim3 grid;
  if (!RowGrid(n, width, &grid)) return cudaSuccess;
  if (n > INT32_MAX || W < 1 || first_pos < 0) return cudaErrorInvalidValue;
  RingGatherKernel<<<grid, kThreads, 0, stream>>>(ring, W, width, first_pos, dst);
  return cudaGetLastError();
}

cudaError_t LaunchRingScatter(const float* src, int64_t n, int64_t first_pos, int W, int64_t width,
                              float* ring, cudaStream_t stream) {
  if (W < 1 || first_pos < 0) return cudaErrorInvalidValue;
  const int64_t first_row = n > W ? n - W : 0;
  dim3 grid;
  if (!RowGrid(n - first_row, width, &grid)) return cudaSuccess;
  RingScatterKernel<<<grid, kThreads, 0, stream>>>(src, first_row, first_pos, W, width, ring);
  return cudaGetLastError();
}

}  // namespace dsinfer::backend::cuda
