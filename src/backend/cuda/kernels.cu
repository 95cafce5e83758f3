// Generic CUDA kernels of the V4 forward (see kernels.h). They decode the checkpoint's formats
// exactly (e4m3, e2m1, e8m0 are exact in fp32) and compute in fp32, rounding with explicit _rn
// intrinsics where the CPU oracle (backend/cpu) multiplies and adds separately, so the GPU
// differs from the CPU only by summation order. The official numerics' FP8 linears of 9+ tokens
// run on tensor cores instead (tc_gemm.cu).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_decode.cuh"

namespace dsinfer::backend::cuda {

namespace {

using Format = DeviceWeightView::Format;

// Weight element (r, c) as fp32: exact decode times its power-of-two block scale.
template <Format F>
__device__ __forceinline__ float LoadW(const DeviceWeightView& w, int64_t r, int64_t c) {
  if constexpr (F == Format::kF32) {
    return reinterpret_cast<const float*>(w.data)[r * w.cols + c];
  } else if constexpr (F == Format::kBF16) {
    uint32_t b = reinterpret_cast<const uint16_t*>(w.data)[r * w.cols + c];
    return __int_as_float(static_cast<int>(b << 16));
  } else if constexpr (F == Format::kFp8Block) {
    return E4m3ToF32(w.data[r * w.cols + c]) * ScaleAt(w, (r >> 7) * w.scale_cols + (c >> 7));
  } else {
    uint8_t byte = w.data[r * (w.cols / 2) + (c >> 1)];
    return E2m1ToF32((c & 1) ? (byte >> 4) : (byte & 0xfu)) *
           ScaleAt(w, r * w.scale_cols + (c >> 5));
  }
}

__global__ void NoopKernel() {}

// ---- dense linear ----------------------------------------------------------------------------
constexpr int kTileN = 64;  // weight rows per block
constexpr int kTileM = 64;  // tokens per block
constexpr int kTileK = 32;

// 256 threads, 4x4 outputs each; W and x tiles are staged in shared memory (W decoded to fp32).
template <Format F>
__global__ void __launch_bounds__(256)
    MatMulTiledKernel(DeviceWeightView w, const float* x, int64_t m, float* y) {
  __shared__ float ws[kTileK][kTileN + 1];
  __shared__ float xs[kTileK][kTileM + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < w.cols; k0 += kTileK) {
    for (int i = 0; i < (kTileN * kTileK) / 256; ++i) {
      const int idx = threadIdx.x + i * 256;
      const int rr = idx / kTileK, kk = idx % kTileK;
      const int64_t k = k0 + kk;
      const int64_t n = n0 + rr, mm = m0 + rr;
      ws[kk][rr] = (n < w.rows && k < w.cols) ? LoadW<F>(w, n, k) : 0.0f;
      xs[kk][rr] = (mm < m && k < w.cols) ? x[mm * w.cols + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t mm = m0 + ty + 16 * i;
    if (mm >= m) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < w.rows) y[mm * w.rows + n] = acc[i][j];
    }
  }
}

// The warp's sums acc[j] of one weight row for its first m tokens: out[j * stride].
template <int kMaxRows>
__device__ __forceinline__ void StoreRowSums(const float* acc, int m, int lane, float* out,
                                             int64_t stride) {
#pragma unroll
  for (int j = 0; j < kMaxRows; ++j) {
    if (j >= m) break;
    const float sum = WarpSum(acc[j]);
    if (lane == 0) out[j * stride] = sum;
  }
}

// Decode (m <= kGemvMaxM tokens): one warp per weight row, the row is read once for all tokens.
constexpr int kGemvMaxM = 8;
// Up to this many tokens the vectorised GEMV runs in passes of kGemvMaxM (see LaunchMatMulFor).
constexpr int64_t kGemvChunkedMaxM = 64;
template <Format F>
__global__ void __launch_bounds__(256)
    GemvKernel(DeviceWeightView w, const float* x, int m, float* y) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= w.rows) return;
  float acc[kGemvMaxM] = {};
  for (int64_t c = lane; c < w.cols; c += 32) {
    const float wv = LoadW<F>(w, r, c);
#pragma unroll
    for (int j = 0; j < kGemvMaxM; ++j)
      if (j < m) acc[j] = fmaf(wv, x[j * w.cols + c], acc[j]);
  }
  StoreRowSums<kGemvMaxM>(acc, m, lane, y + r, w.rows);
}

// ---- vectorised decode-shaped kernels ---------------------------------------------------------
// Each lane reads 16 bytes of a weight row per load (4 f32, 8 bf16, 16 e4m3 or 32 e2m1), so a
// warp moves 512 contiguous bytes per instruction instead of 32-128: the scalar kernels above
// were bound by the number of loads in flight, not by bandwidth (docs/PERF.md, GPU section).
// Used when every row starts on a 16-byte boundary (row bytes and the base pointers aligned).
template <Format F>
constexpr int kVecElems = F == Format::kF32        ? 4
                          : F == Format::kBF16     ? 8
                          : F == Format::kFp8Block ? 16
                                                   : 32;

template <Format F>
__host__ __device__ constexpr int64_t RowBytes(int64_t cols) {
  return F == Format::kF32        ? cols * 4
         : F == Format::kBF16     ? cols * 2
         : F == Format::kFp8Block ? cols
                                  : cols / 2;
}

// Weight rows per warp in the vectorised kernels: each float4 of activations read feeds that
// many rows. With one row per warp the activation reads (L1 / L2) are 8 x m times the FP4
// weight bytes (2 x m for bf16), and L1 bandwidth, not DRAM, bounded batched decode (H200:
// docs/PERF.md, GPU section). Four rows per warp also means a quarter of the warps, which
// starves matrices of a few thousand rows at one token (measured: the attention projections
// took 2.1 instead of 1.4 ms per batch-1 step), so the GEMV uses four only from kManyRows rows.
constexpr int kVecRows = 4;
constexpr int64_t kManyRows = 16384;

// One 16-byte chunk of a weight row (elements c0 .. c0 + kVecElems<F>) and its block scale
// (1 for f32 / bf16).
struct WChunk {
  uint32_t words[4] = {0, 0, 0, 0};
  float scale = 1.0f;
};

template <Format F>
__device__ __forceinline__ WChunk LoadWChunk(const DeviceWeightView& w, int64_t r, int64_t c0) {
  const uint4 raw =
      *reinterpret_cast<const uint4*>(w.data + r * RowBytes<F>(w.cols) + RowBytes<F>(c0));
  WChunk k;
  k.words[0] = raw.x;
  k.words[1] = raw.y;
  k.words[2] = raw.z;
  k.words[3] = raw.w;
  if constexpr (F == Format::kFp8Block) k.scale = ScaleAt(w, (r >> 7) * w.scale_cols + (c0 >> 7));
  if constexpr (F == Format::kFp4Packed) k.scale = ScaleAt(w, r * w.scale_cols + (c0 >> 5));
  return k;
}

// Elements 4q .. 4q + 3 of a chunk as fp32: the exact decode times the block scale.
template <Format F>
__device__ __forceinline__ void DecodeQuad(const WChunk& k, int q, float* out) {
  if constexpr (F == Format::kF32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __int_as_float(static_cast<int>(k.words[i]));  // q = 0
  } else if constexpr (F == Format::kBF16) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = k.words[2 * q + h];
      out[2 * h] = __int_as_float(static_cast<int>(word << 16));
      out[2 * h + 1] = __int_as_float(static_cast<int>(word & 0xffff0000u));
    }
  } else if constexpr (F == Format::kFp8Block) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = E4m3ToF32((k.words[q] >> (8 * i)) & 0xffu) * k.scale;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out[i] = E2m1ToF32((k.words[q >> 1] >> (4 * (4 * (q & 1) + i))) & 0xfu) * k.scale;
  }
}

// acc[rr][j] += row rr of chunks . x_j[c0 .. c0 + kVecElems<F>) for the first m rows of x
// (float4 loads). Per (row, token) the products are added in element order, as a one-row loop.
template <Format F, int kRows, int kMaxRows>
__device__ __forceinline__ void AccumulateRows(const WChunk* chunks, const float* const* xrows,
                                               int m, int64_t c0, float (*acc)[kMaxRows]) {
#pragma unroll
  for (int q = 0; q < kVecElems<F> / 4; ++q) {
    float wv[kRows][4];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) DecodeQuad<F>(chunks[rr], q, wv[rr]);
#pragma unroll
    for (int j = 0; j < kMaxRows; ++j) {
      if (j >= m) break;
      const float4 v = reinterpret_cast<const float4*>(xrows[j] + c0)[q];
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        acc[rr][j] = fmaf(wv[rr][0], v.x, acc[rr][j]);
        acc[rr][j] = fmaf(wv[rr][1], v.y, acc[rr][j]);
        acc[rr][j] = fmaf(wv[rr][2], v.z, acc[rr][j]);
        acc[rr][j] = fmaf(wv[rr][3], v.w, acc[rr][j]);
      }
    }
  }
}

// The warp's kRows weight rows (from r0; n_rows of them exist) times the first m rows of x:
// y[j * stride + r0 + rr].
template <Format F, int kRows, int kMaxRows>
__device__ __forceinline__ void VecRowsTimesX(const DeviceWeightView& w, int64_t r0, int n_rows,
                                              const float* const* xrows, int m, int lane, float* y,
                                              int64_t stride) {
  constexpr int E = kVecElems<F>;
  float acc[kRows][kMaxRows] = {};
  for (int64_t c0 = lane * E; c0 < w.cols; c0 += 32 * E) {
    WChunk chunks[kRows];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr)
      if (rr < n_rows) chunks[rr] = LoadWChunk<F>(w, r0 + rr, c0);
    AccumulateRows<F, kRows, kMaxRows>(chunks, xrows, m, c0, acc);
  }
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr)
    if (rr < n_rows) StoreRowSums<kMaxRows>(acc[rr], m, lane, y + r0 + rr, stride);
}

// Blocks of 8 warps of kRows rows each over `rows` rows.
template <int kRows>
unsigned VecBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + 8 * kRows - 1) / (8 * kRows));
}

template <Format F, int kRows>
__global__ void __launch_bounds__(256)
    GemvVecKernel(DeviceWeightView w, const float* x, int m, float* y) {
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5)) * kRows;
  if (r0 >= w.rows) return;  // whole warps
  const float* xrows[kGemvMaxM];
#pragma unroll
  for (int j = 0; j < kGemvMaxM; ++j) xrows[j] = x + j * w.cols;
  const int n_rows = static_cast<int>(w.rows - r0 < kRows ? w.rows - r0 : kRows);
  VecRowsTimesX<F, kRows, kGemvMaxM>(w, r0, n_rows, xrows, m, threadIdx.x & 31, y, w.rows);
}

// GemvVecKernel over m <= kGemvMaxM tokens: kVecRows rows per warp from kManyRows rows.
template <Format F>
void LaunchGemvVec(const DeviceWeightView& w, const float* x, int m, float* y,
                   cudaStream_t stream) {
  if (w.rows >= kManyRows)
    GemvVecKernel<F, kVecRows><<<VecBlocks<kVecRows>(w.rows), 256, 0, stream>>>(w, x, m, y);
  else
    GemvVecKernel<F, 1><<<VecBlocks<1>(w.rows), 256, 0, stream>>>(w, x, m, y);
}

// Whether the vectorised kernels apply: 16-byte aligned rows of whole 16-byte chunks, and an
// aligned activation matrix.
template <Format F>
bool VecApplies(const uint8_t* data, int64_t cols, const float* x) {
  return cols % kVecElems<F> == 0 && RowBytes<F>(cols) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(data) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

template <Format F>
cudaError_t LaunchMatMulFor(const DeviceWeightView& w, const float* x, int64_t m, float* y,
                            cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((w.rows + 7) / 8);
  if (m > kGemvMaxM && m <= kGemvChunkedMaxM && VecApplies<F>(w.data, w.cols, x)) {
    // Decode batches: one vectorised GEMV pass per 8 tokens reads the weights m/8 times, still
    // far faster than the tiled kernel's scalar decode (measured on an H200, batch 16 of the
    // bench preset: 54 ms per step with the tiled kernel for the head and dense layers).
    for (int64_t j0 = 0; j0 < m; j0 += kGemvMaxM)
      LaunchGemvVec<F>(w, x + j0 * w.cols, static_cast<int>(std::min<int64_t>(kGemvMaxM, m - j0)),
                       y + j0 * w.rows, stream);
  } else if (m <= kGemvMaxM) {
    if (VecApplies<F>(w.data, w.cols, x))
      LaunchGemvVec<F>(w, x, static_cast<int>(m), y, stream);
    else
      GemvKernel<F><<<blocks, 256, 0, stream>>>(w, x, static_cast<int>(m), y);
  } else {
    dim3 grid(static_cast<unsigned>((w.rows + kTileN - 1) / kTileN),
              static_cast<unsigned>((m + kTileM - 1) / kTileM));
    MatMulTiledKernel<F><<<grid, 256, 0, stream>>>(w, x, m, y);
  }
  return cudaGetLastError();
}

// ---- norms, RoPE -----------------------------------------------------------------------------
__global__ void RmsNormKernel(float* x, int64_t n, const float* weight, float eps,
                              bool round_bf16) {
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(row[i], row[i], ss);
  ss = BlockSum(ss);
  const float inv = 1.0f / sqrtf(__fadd_rn(ss / static_cast<float>(n), eps));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = __fmul_rn(row[i], inv);
    if (weight != nullptr) v = __fmul_rn(v, weight[i]);
    row[i] = round_bf16 ? RoundBf16(v) : v;
  }
}

__global__ void RopeKernel(float* x, int64_t row_stride, int64_t offset, const int64_t* positions,
                           const float* inv_freq, int half, bool inverse, bool round_bf16) {
  float* p = x + static_cast<int64_t>(blockIdx.x) * row_stride + offset;
  const float pos = static_cast<float>(positions[blockIdx.x]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float theta = __fmul_rn(pos, inv_freq[i]);
    const float c = static_cast<float>(cos(static_cast<double>(theta)));
    float s = static_cast<float>(sin(static_cast<double>(theta)));
    if (inverse) s = -s;
    const float a = p[2 * i], b = p[2 * i + 1];
    const float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    const float rb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    p[2 * i] = round_bf16 ? RoundBf16(ra) : ra;
    p[2 * i + 1] = round_bf16 ? RoundBf16(rb) : rb;
  }
}

// ---- mHC -------------------------------------------------------------------------------------
constexpr int kMaxHc = 8;

// dots[t, j] = fn_j . H_t for j < n_rows; dots[t, n_rows] = H_t . H_t.
__global__ void HcDotsKernel(const float* fn, const float* H, int64_t n, int n_rows, float* dots) {
  const int64_t t = blockIdx.x;
  const int j = blockIdx.y;
  const float* h = H + t * n;
  const float* a = j < n_rows ? fn + static_cast<int64_t>(j) * n : h;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(a[i], h[i], s);
  s = BlockSum(s);
  if (threadIdx.x == 0) dots[t * (n_rows + 1) + j] = s;
}

__device__ __forceinline__ float Sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// Mix coefficients of one token (thread 0 of each block; hc <= 8), then x = sum_j pre_j H_j.
__global__ void HcPreKernel(HcShape s, const float* base, const float* scale, const float* H,
                            const float* dots, float* x, float* mix_out, bool round_bf16) {
  __shared__ float mix[2 * kMaxHc + kMaxHc * kMaxHc];
  const int hc = s.hc;
  const int n_rows = (2 + hc) * hc;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    const float* d = dots + t * (n_rows + 1);
    const float n = static_cast<float>(hc * s.hidden);
    const float r = 1.0f / sqrtf(__fadd_rn(d[n_rows] / n, s.norm_eps));
    float* pre = mix;
    float* post = mix + hc;
    float* C = mix + 2 * hc;
    for (int j = 0; j < hc; ++j) {
      pre[j] =
          __fadd_rn(Sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(d[j], r), scale[0]), base[j])), s.hc_eps);
      post[j] =
          2.0f * Sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(d[hc + j], r), scale[1]), base[hc + j]));
    }
    for (int i = 0; i < hc * hc; ++i)
      C[i] = __fadd_rn(__fmul_rn(__fmul_rn(d[2 * hc + i], r), scale[2]), base[2 * hc + i]);
    for (int j = 0; j < hc; ++j) {  // row softmax + eps
      float mx = -INFINITY;
      for (int k = 0; k < hc; ++k) mx = fmaxf(mx, C[j * hc + k]);
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += (C[j * hc + k] = expf(C[j * hc + k] - mx));
      for (int k = 0; k < hc; ++k) C[j * hc + k] = __fadd_rn(C[j * hc + k] / sum, s.hc_eps);
    }
    for (int it = 0; it < s.sinkhorn_iters; ++it) {
      if (it > 0) {
        for (int j = 0; j < hc; ++j) {  // rows
          float sum = 0.0f;
          for (int k = 0; k < hc; ++k) sum += C[j * hc + k];
          for (int k = 0; k < hc; ++k) C[j * hc + k] /= (sum + s.hc_eps);
        }
      }
      for (int k = 0; k < hc; ++k) {  // columns
        float sum = 0.0f;
        for (int j = 0; j < hc; ++j) sum += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] /= (sum + s.hc_eps);
      }
    }
    if (blockIdx.y == 0)
      for (int i = 0; i < 2 * hc + hc * hc; ++i) mix_out[t * (2 * hc + hc * hc) + i] = mix[i];
  }
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= s.hidden) return;
  const float* h = H + t * hc * s.hidden;
  float acc = 0.0f;
  for (int j = 0; j < hc; ++j) acc = __fadd_rn(acc, __fmul_rn(mix[j], h[j * s.hidden + i]));
  x[t * s.hidden + i] = round_bf16 ? RoundBf16(acc) : acc;
}

__global__ void HcPostKernel(HcShape s, const float* mix_in, const float* a, float* H,
                             bool round_bf16) {
  const int hc = s.hc;
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= s.hidden) return;
  const float* mix = mix_in + t * (2 * hc + hc * hc);
  float* h = H + t * hc * s.hidden;
  float src[kMaxHc];
  for (int j = 0; j < hc; ++j) src[j] = h[j * s.hidden + i];
  const float ai = a[t * s.hidden + i];
  for (int k = 0; k < hc; ++k) {
    float acc = __fmul_rn(mix[hc + k], ai);
    for (int j = 0; j < hc; ++j) acc = __fadd_rn(acc, __fmul_rn(mix[2 * hc + j * hc + k], src[j]));
    h[k * s.hidden + i] = round_bf16 ? RoundBf16(acc) : acc;
  }
}

__global__ void HcHeadKernel(HcShape s, const float* base, const float* scale, const float* H,
                             const float* dots, float* y, bool round_bf16) {
  const int hc = s.hc;
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= s.hidden) return;
  const float* d = dots + t * (hc + 1);
  const float r = 1.0f / sqrtf(__fadd_rn(d[hc] / static_cast<float>(hc * s.hidden), s.norm_eps));
  const float* h = H + t * hc * s.hidden;
  float acc = 0.0f;
  for (int j = 0; j < hc; ++j) {
    const float pre =
        __fadd_rn(Sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(d[j], r), scale[0]), base[j])), s.hc_eps);
    acc = __fadd_rn(acc, __fmul_rn(pre, h[j * s.hidden + i]));
  }
  y[t * s.hidden + i] = round_bf16 ? RoundBf16(acc) : acc;
}

// ---- probes ----------------------------------------------------------------------------------
__global__ void ReadProbeKernel(const float4* x, int64_t n4, float* out) {
  float s = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 v = x[i];
    s += (v.x + v.y) + (v.z + v.w);
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

// ---- MoE router (spec §6) ----------------------------------------------------------------------
constexpr int kRouterThreads = 256;

// (va, ia) ranks before (vb, ib): larger value first, ties to the lower index.
__device__ __forceinline__ bool RanksBefore(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// One block per token. Dynamic shared memory: scores [E] f32, biased [E] f32, taken [E] int.
// Scores are sqrt(softplus(logit)) as moe.cc; selection is the hash table's row or K rounds of a
// block-wide arg-best over the untaken experts (the same order std::partial_sort gives with the
// CPU's comparator); weights from the unbiased scores, summed in slot order.
__global__ void __launch_bounds__(kRouterThreads)
    RouterKernel(const float* logits, int E, int K, const float* bias, const int32_t* tid2eid,
                 int64_t vocab, const int32_t* token_ids, float route_scale, int32_t* chosen,
                 float* weights) {
  extern __shared__ float router_smem[];
  float* s = router_smem;
  float* biased = router_smem + E;
  int* taken = reinterpret_cast<int*>(router_smem + 2 * E);
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  __shared__ int sel[kRouterMaxK];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = blockDim.x >> 5;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float x = logits[t * E + e];
    s[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
    biased[e] = bias != nullptr ? __fadd_rn(s[e], bias[e]) : 0.0f;
    taken[e] = 0;
  }
  __syncthreads();
  if (tid2eid != nullptr) {
    if (threadIdx.x == 0) {
      const int64_t tok = token_ids[t];
      for (int k = 0; k < K; ++k) {
        int e = (tok >= 0 && tok < vocab) ? tid2eid[tok * K + k] : -1;
        sel[k] = (e >= 0 && e < E) ? e : -1;  // -1: rejected by the host-side grouping
      }
    }
  } else {
    for (int k = 0; k < K; ++k) {
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (!taken[e] && RanksBefore(biased[e], e, bv, bi)) bv = biased[e], bi = e;
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (RanksBefore(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < n_warps; ++w)
          if (RanksBefore(best_v[w], best_i[w], bv, bi)) bv = best_v[w], bi = best_i[w];
        // bi stays INT_MAX only when every untaken biased score is NaN.
        sel[k] = bi < E ? bi : -1;
        if (bi < E) taken[bi] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum = __fadd_rn(sum, sel[k] >= 0 ? s[sel[k]] : 0.0f);
    for (int k = 0; k < K; ++k) {
      chosen[t * K + k] = sel[k];
      weights[t * K + k] = sel[k] >= 0 ? __fmul_rn(__fdiv_rn(s[sel[k]], sum), route_scale) : 0.0f;
    }
  }
}

// ---- grouped MoE GEMM -------------------------------------------------------------------------
// grid.x: tiles (expert, begin, count <= kGroupedTileRows grouped rows); grid.y: blocks of 8
// weight rows, one warp per row. Each weight row of the tile's expert is read once for all of
// the tile's rows (the GEMV kernel's scheme, per expert). y[j, r] for grouped row j reads x row
// row_token[j].
template <Format F>
__global__ void __launch_bounds__(256)
    GroupedMatMulKernel(const DeviceWeightView* experts, const int32_t* tiles,
                        const int32_t* row_token, const float* x, int64_t rows, int64_t cols,
                        float* y) {
  const int32_t expert = tiles[3 * blockIdx.x], begin = tiles[3 * blockIdx.x + 1],
                count = tiles[3 * blockIdx.x + 2];
  const DeviceWeightView w = experts[expert];
  const int64_t r = static_cast<int64_t>(blockIdx.y) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;  // whole warps: r depends on the warp only
  int64_t xrow[kGroupedTileRows];
#pragma unroll
  for (int j = 0; j < kGroupedTileRows; ++j)
    xrow[j] = j < count ? static_cast<int64_t>(row_token[begin + j]) * cols : 0;
  float acc[kGroupedTileRows] = {};
  for (int64_t c = lane; c < cols; c += 32) {
    const float wv = LoadW<F>(w, r, c);
#pragma unroll
    for (int j = 0; j < kGroupedTileRows; ++j)
      if (j < count) acc[j] = fmaf(wv, x[xrow[j] + c], acc[j]);
  }
  // count is the same for the whole block
  StoreRowSums<kGroupedTileRows>(acc, count, lane, y + static_cast<int64_t>(begin) * rows + r,
                                 rows);
}

// GroupedMatMulKernel with 16-byte weight loads and kVecRows rows per warp (see GemvVecKernel;
// grid.y counts blocks of 8 * kVecRows rows: a step's routed experts give enough tiles); every
// expert's data is 16-byte aligned (separate allocations) and x's rows are (checked at launch).
template <Format F>
__global__ void __launch_bounds__(256)
    GroupedMatMulVecKernel(const DeviceWeightView* experts, const int32_t* tiles,
                           const int32_t* row_token, const float* x, int64_t rows, int64_t cols,
                           float* y) {
  const int32_t expert = tiles[3 * blockIdx.x], begin = tiles[3 * blockIdx.x + 1],
                count = tiles[3 * blockIdx.x + 2];
  const DeviceWeightView w = experts[expert];
  const int64_t r0 = (static_cast<int64_t>(blockIdx.y) * 8 + (threadIdx.x >> 5)) * kVecRows;
  if (r0 >= rows) return;  // whole warps: r0 depends on the warp only
  const float* xrows[kGroupedTileRows];
#pragma unroll
  for (int j = 0; j < kGroupedTileRows; ++j)
    xrows[j] = x + (j < count ? static_cast<int64_t>(row_token[begin + j]) * cols : 0);
  const int n_rows = static_cast<int>(rows - r0 < kVecRows ? rows - r0 : kVecRows);
  // count is the same for the whole block
  VecRowsTimesX<F, kVecRows, kGroupedTileRows>(w, r0, n_rows, xrows, count, threadIdx.x & 31,
                                               y + static_cast<int64_t>(begin) * rows, rows);
}

template <Format F>
void LaunchGroupedFor(dim3 grid, const DeviceWeightView* experts, const int32_t* tiles,
                      const int32_t* row_token, const float* x, int64_t rows, int64_t cols,
                      float* y, cudaStream_t stream) {
  // Expert data are separate 256-byte aligned allocations: alignment hinges on the row bytes.
  if (cols % kVecElems<F> == 0 && RowBytes<F>(cols) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const dim3 vec_grid(grid.x, VecBlocks<kVecRows>(rows));
    GroupedMatMulVecKernel<F>
        <<<vec_grid, 256, 0, stream>>>(experts, tiles, row_token, x, rows, cols, y);
  } else {
    GroupedMatMulKernel<F><<<grid, 256, 0, stream>>>(experts, tiles, row_token, x, rows, cols, y);
  }
}

// ---- indexer scores and top-k (spec §5.4) ------------------------------------------------------
// grid (key blocks of 8, tokens), one warp per key j < n_vis[t]:
// score = sum_h relu(round?(q[t,h] . k[j])) * w[t,h], heads in order as attention.cc.
__global__ void __launch_bounds__(256)
    IndexerScoresKernel(const float* q, const float* w, const float* keys, const int32_t* n_vis,
                        int heads, int head_dim, int64_t stride, bool round_bf16, float* scores) {
  const int64_t t = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (j >= n_vis[t]) return;
  const float* kj = keys + j * head_dim;
  float s = 0.0f;
  for (int h = 0; h < heads; ++h) {
    const float* qh = q + (t * heads + h) * head_dim;
    float d = 0.0f;
    for (int i = lane; i < head_dim; i += 32) d = fmaf(qh[i], kj[i], d);
    d = WarpSum(d);
    if (round_bf16) d = RoundBf16(d);
    s = __fadd_rn(s, __fmul_rn(fmaxf(d, 0.0f), w[t * heads + h]));
  }
  if (lane == 0) scores[t * stride + j] = round_bf16 ? RoundBf16(s) : s;
}

// A total order on floats as unsigned keys (larger float -> larger key); -0 is +0, as the CPU's
// float comparison treats them as equal.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = static_cast<uint32_t>(__float_as_int(f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ int BlockSumInt(int v) {
  __shared__ int partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  int total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += partial[w];
  return total;
}

// Exclusive prefix count of `flag` over the block in thread order; *total: the block's count.
__device__ int BlockExclusiveCount(bool flag, int* total) {
  __shared__ int warp_counts[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  __syncthreads();  // `warp_counts` may still be read by a previous call
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (w < warp) before += warp_counts[w];
    all += warp_counts[w];
  }
  *total = all;
  return before + in_warp;
}

// One block per token: the k largest of scores[t, 0..n[t]) (ties -> lower index), written
// ascending to idx[t, 0..min(n, k)), the rest -1. The k-th largest key is found exactly by a
// bitwise search (32 block-wide counts), then one ordered compaction takes every key above it
// and the lowest-index keys equal to it.
__global__ void __launch_bounds__(256)
    TopKKernel(const float* scores, int64_t stride, const int32_t* n, int k, int32_t* idx) {
  const int64_t t = blockIdx.x;
  const float* s = scores + t * stride;
  int32_t* out = idx + t * k;
  const int count = n[t];
  if (count <= k) {
    for (int j = threadIdx.x; j < k; j += blockDim.x) out[j] = j < count ? j : -1;
    return;
  }
  uint32_t kth = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = kth | (1u << bit);
    int c = 0;
    for (int j = threadIdx.x; j < count; j += blockDim.x) c += OrderedKey(s[j]) >= cand ? 1 : 0;
    if (BlockSumInt(c) >= k) kth = cand;  // every thread sees the same total
  }
  int above = 0;
  for (int j = threadIdx.x; j < count; j += blockDim.x) above += OrderedKey(s[j]) > kth ? 1 : 0;
  const int need_equal = k - BlockSumInt(above);
  int written = 0, equal_seen = 0;
  for (int base = 0; base < count; base += blockDim.x) {
    const int j = base + static_cast<int>(threadIdx.x);
    const uint32_t key = j < count ? OrderedKey(s[j]) : 0u;
    const bool is_equal = j < count && key == kth;
    int n_equal = 0, n_take = 0;
    const int equal_rank = equal_seen + BlockExclusiveCount(is_equal, &n_equal);
    const bool take = (j < count && key > kth) || (is_equal && equal_rank < need_equal);
    const int at = written + BlockExclusiveCount(take, &n_take);
    if (take) out[at] = j;
    written += n_take;
    equal_seen += n_equal;
  }
}

// ---- sparse attention with sink (spec §5.6) ----------------------------------------------------
__device__ float BlockMax(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = partial[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, partial[w]);
  return m;
}

// One block per (token t, head h). Rows of the KV pool attended to: rows[offsets[t] ..
// offsets[t+1]). probs: scratch [heads, offsets[T]] holding the logits, then the (bf16-rounded
// where the reference rounds) probabilities. out = sum_j p_j v_j / (sum_j p_j + exp(sink - max)),
// as attention.cc (K = V = the pool row; no de-rotation here: that is the RoPE op's).
__global__ void __launch_bounds__(kAttnThreads)
    SparseAttentionKernel(const float* q, int heads, int head_dim, const float* kv,
                          const int32_t* offsets, const int32_t* rows, int64_t total_rows,
                          const float* sink, float scale, bool round_bf16, float* probs,
                          float* out) {
  const int64_t t = blockIdx.x / heads;
  const int h = static_cast<int>(blockIdx.x % heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = blockDim.x >> 5;
  const float* qh = q + (t * heads + h) * head_dim;
  const int32_t begin = offsets[t];
  const int32_t n = offsets[t + 1] - begin;
  const int32_t* my_rows = rows + begin;
  float* p = probs + static_cast<int64_t>(h) * total_rows + begin;
  for (int32_t j = warp; j < n; j += n_warps) {
    const float* kr = kv + static_cast<int64_t>(my_rows[j]) * head_dim;
    float d = 0.0f;
    for (int i = lane; i < head_dim; i += 32) d = fmaf(qh[i], kr[i], d);
    d = WarpSum(d);
    if (lane == 0) p[j] = __fmul_rn(d, scale);
  }
  __syncthreads();  // logits (global) visible to the whole block
  const float sink_h = sink[h];
  float mx = sink_h;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, p[j]);
  mx = BlockMax(mx);
  float denom = 0.0f;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(__fsub_rn(p[j], mx));
    denom += e;
    p[j] = round_bf16 ? RoundBf16(e) : e;  // P is cast to bf16 before P.V
  }
  denom = __fadd_rn(BlockSum(denom), expf(__fsub_rn(sink_h, mx)));
  __syncthreads();  // probabilities visible to the whole block
  const float inv = 1.0f / denom;
  float* oh = out + (t * heads + h) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int32_t j = 0; j < n; ++j)
      acc = fmaf(p[j], kv[static_cast<int64_t>(my_rows[j]) * head_dim + i], acc);
    const float o = __fmul_rn(acc, inv);
    oh[i] = round_bf16 ? RoundBf16(o) : o;
  }
}

// ---- compressor pooling (spec §5.3) ------------------------------------------------------------
// grid (groups, channel blocks of 128), one thread per output channel c of group j: the softmax
// over the group's candidates of the gate (g + ape) weighting the projections a, independently
// per channel, candidates in attention.cc's order (overlap: the previous group's first halves,
// then the current group's second halves; without a previous group those are -inf and drop out).
__global__ void __launch_bounds__(128)
    CompressorPoolKernel(const float* a, const float* g, const float* ape, int ratio, int width,
                         bool overlap, const float* prev_a, const float* prev_score, float* rows) {
  const int64_t j = blockIdx.x;
  const int d = overlap ? width / 2 : width;
  const int c = static_cast<int>(blockIdx.y) * 128 + static_cast<int>(threadIdx.x);
  if (c >= d) return;
  const float* ga = a + j * ratio * width;  // this group's rows [ratio, width]
  const float* gg = g + j * ratio * width;
  // Candidate s of the previous group (first half, channel c): (score, kv).
  auto prev = [&](int s, float* score, float* kv) {
    if (j > 0) {
      *score = __fadd_rn(gg[(s - ratio) * width + c], ape[s * width + c]);
      *kv = ga[(s - ratio) * width + c];
    } else if (prev_a != nullptr) {
      *score = prev_score[s * width + c];
      *kv = prev_a[s * width + c];
    } else {
      *score = -INFINITY;
      *kv = 0.0f;
    }
  };
  const int off = overlap ? d : 0;  // the current group's half
  float mx = -INFINITY;
  if (overlap)
    for (int s = 0; s < ratio; ++s) {
      float sc, kv;
      prev(s, &sc, &kv);
      mx = fmaxf(mx, sc);
    }
  for (int s = 0; s < ratio; ++s)
    mx = fmaxf(mx, __fadd_rn(gg[s * width + off + c], ape[s * width + off + c]));
  float sum = 0.0f, acc = 0.0f;
  if (overlap)
    for (int s = 0; s < ratio; ++s) {
      float sc, kv;
      prev(s, &sc, &kv);
      const float e = expf(__fsub_rn(sc, mx));  // -inf candidates contribute 0
      sum = __fadd_rn(sum, e);
      acc = __fadd_rn(acc, __fmul_rn(e, kv));
    }
  for (int s = 0; s < ratio; ++s) {
    const float sc = __fadd_rn(gg[s * width + off + c], ape[s * width + off + c]);
    const float e = expf(__fsub_rn(sc, mx));
    sum = __fadd_rn(sum, e);
    acc = __fadd_rn(acc, __fmul_rn(e, ga[s * width + off + c]));
  }
  rows[j * d + c] = __fdiv_rn(acc, sum);
}

}  // namespace

cudaError_t ProbeKernelImageOnCurrentDevice() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, NoopKernel);
}

cudaError_t LaunchMatMul(const DeviceWeightView& w, const float* x, int64_t m, float* y,
                         cudaStream_t stream) {
  if (m <= 0 || w.rows <= 0) return cudaSuccess;
  switch (w.format) {
    case Format::kF32:
      return LaunchMatMulFor<Format::kF32>(w, x, m, y, stream);
    case Format::kBF16:
      return LaunchMatMulFor<Format::kBF16>(w, x, m, y, stream);
    case Format::kFp8Block:
      return LaunchMatMulFor<Format::kFp8Block>(w, x, m, y, stream);
    case Format::kFp4Packed:
      return LaunchMatMulFor<Format::kFp4Packed>(w, x, m, y, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchRmsNorm(float* x, int64_t rows, int64_t n, const float* weight, float eps,
                          bool round_bf16, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, n, weight, eps, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* x, int64_t rows, int64_t row_stride, int64_t offset,
                       const int64_t* positions, const float* inv_freq, int half, bool inverse,
                       bool round_bf16, cudaStream_t stream) {
  if (rows <= 0 || half <= 0) return cudaSuccess;
  const int threads = half < 256 ? ((half + 31) / 32) * 32 : 256;
  RopeKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      x, row_stride, offset, positions, inv_freq, half, inverse, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchHcPre(const HcShape& s, const float* fn, const float* base, const float* scale,
                        const float* H, int64_t tokens, float* dots, float* x, float* mix,
                        bool round_bf16, cudaStream_t stream) {
  if (s.hc < 1 || s.hc > kMaxHc) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  const int n_rows = (2 + s.hc) * s.hc;
  HcDotsKernel<<<dim3(static_cast<unsigned>(tokens), n_rows + 1), 256, 0, stream>>>(
      fn, H, s.hc * s.hidden, n_rows, dots);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((s.hidden + 255) / 256));
  HcPreKernel<<<grid, 256, 0, stream>>>(s, base, scale, H, dots, x, mix, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchHcPost(const HcShape& s, const float* mix, const float* a, float* H,
                         int64_t tokens, bool round_bf16, cudaStream_t stream) {
  if (s.hc < 1 || s.hc > kMaxHc) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((s.hidden + 255) / 256));
  HcPostKernel<<<grid, 256, 0, stream>>>(s, mix, a, H, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchHcHead(const HcShape& s, const float* fn, const float* base, const float* scale,
                         const float* H, int64_t tokens, float* dots, float* y, bool round_bf16,
                         cudaStream_t stream) {
  if (s.hc < 1 || s.hc > kMaxHc) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  HcDotsKernel<<<dim3(static_cast<unsigned>(tokens), s.hc + 1), 256, 0, stream>>>(
      fn, H, s.hc * s.hidden, s.hc, dots);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((s.hidden + 255) / 256));
  HcHeadKernel<<<grid, 256, 0, stream>>>(s, base, scale, H, dots, y, round_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchReadProbe(const float* x, int64_t n, float* out, cudaStream_t stream) {
  ReadProbeKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const float4*>(x), n / 4, out);
  return cudaGetLastError();
}

cudaError_t LaunchRouter(const float* logits, int64_t tokens, int n_experts, int top_k,
                         const float* bias, const int32_t* tid2eid, int64_t vocab,
                         const int32_t* token_ids, float route_scale, int32_t* chosen,
                         float* weights, cudaStream_t stream) {
  if (n_experts < 1 || top_k < 1 || top_k > kRouterMaxK || top_k > n_experts ||
      n_experts > kRouterMaxExperts || (bias == nullptr && tid2eid == nullptr))
    return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(n_experts) * 12;
  RouterKernel<<<static_cast<unsigned>(tokens), kRouterThreads, smem, stream>>>(
      logits, n_experts, top_k, bias, tid2eid, vocab, token_ids, route_scale, chosen, weights);
  return cudaGetLastError();
}

cudaError_t LaunchGroupedMatMul(DeviceWeightView::Format format, const DeviceWeightView* experts,
                                const int32_t* tiles, int64_t n_tiles, const int32_t* row_token,
                                const float* x, int64_t rows, int64_t cols, float* y,
                                cudaStream_t stream) {
  if (n_tiles <= 0 || rows <= 0) return cudaSuccess;
  if (n_tiles > INT32_MAX || (rows + 7) / 8 > 65535) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((rows + 7) / 8));
  switch (format) {
    case Format::kF32:
      LaunchGroupedFor<Format::kF32>(grid, experts, tiles, row_token, x, rows, cols, y, stream);
      break;
    case Format::kBF16:
      LaunchGroupedFor<Format::kBF16>(grid, experts, tiles, row_token, x, rows, cols, y, stream);
      break;
    case Format::kFp8Block:
      LaunchGroupedFor<Format::kFp8Block>(grid, experts, tiles, row_token, x, rows, cols, y,
                                          stream);
      break;
    case Format::kFp4Packed:
      LaunchGroupedFor<Format::kFp4Packed>(grid, experts, tiles, row_token, x, rows, cols, y,
                                           stream);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchIndexerScores(const float* q, const float* w, const float* keys,
                                const int32_t* n_vis, int64_t tokens, int heads, int head_dim,
                                int64_t max_keys, bool round_bf16, float* scores,
                                cudaStream_t stream) {
  if (tokens <= 0 || max_keys <= 0) return cudaSuccess;
  if (tokens > 65535 || (max_keys + 7) / 8 > INT32_MAX) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>((max_keys + 7) / 8), static_cast<unsigned>(tokens));
  IndexerScoresKernel<<<grid, 256, 0, stream>>>(q, w, keys, n_vis, heads, head_dim, max_keys,
                                                round_bf16, scores);
  return cudaGetLastError();
}

cudaError_t LaunchTopK(const float* scores, int64_t tokens, int64_t stride, const int32_t* n, int k,
                       int32_t* idx, cudaStream_t stream) {
  if (tokens <= 0 || k <= 0) return cudaSuccess;
  TopKKernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(scores, stride, n, k, idx);
  return cudaGetLastError();
}

cudaError_t LaunchSparseAttention(const float* q, int64_t tokens, int heads, int head_dim,
                                  const float* kv, const int32_t* offsets, const int32_t* rows,
                                  int64_t total_rows, const float* sink, float scale,
                                  bool round_bf16, float* probs, float* out, cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0) return cudaSuccess;
  if (tokens * heads > INT32_MAX) return cudaErrorInvalidValue;
  SparseAttentionKernel<<<static_cast<unsigned>(tokens * heads), kAttnThreads, 0, stream>>>(
      q, heads, head_dim, kv, offsets, rows, total_rows, sink, scale, round_bf16, probs, out);
  return cudaGetLastError();
}

cudaError_t LaunchCompressorPool(const float* a, const float* g, const float* ape, int64_t n_groups,
                                 int ratio, int width, bool overlap, const float* prev_a,
                                 const float* prev_score, float* rows, cudaStream_t stream) {
  if (ratio < 1 || width < 1 || (overlap && width % 2 != 0)) return cudaErrorInvalidValue;
  if (n_groups <= 0) return cudaSuccess;
  const int d = overlap ? width / 2 : width;
  if (n_groups > INT32_MAX || (d + 127) / 128 > 65535) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>(n_groups), static_cast<unsigned>((d + 127) / 128));
  CompressorPoolKernel<<<grid, 128, 0, stream>>>(a, g, ape, ratio, width, overlap, prev_a,
                                                 prev_score, rows);
  return cudaGetLastError();
}

}  // namespace dsinfer::backend::cuda
