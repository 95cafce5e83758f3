// Tensor-core GEMM of the official numerics' FP8 linears (see kernels.h LaunchTcMatMul): FP8
// block-scaled weights times activations already quantized to e4m3 codes with one power-of-two
// scale per 1x128 block (ActQuantFp8), as the reference's act_quant + fp8_gemm compute.
//
// Tiles: 64 tokens x 64 weight rows per block of 4 warps (2 x 2, 32 x 32 each), one 128-column
// scale block of K per pipeline stage, two stages filled by cp.async. Shared-memory rows are 144
// bytes, so the 32-bit fragment loads of 8 rows x 4 threads fall on 32 different banks.
//
// Arithmetic: every MMA starts from zero and its sum (exact products of e4m3 codes) is scaled by
// act_scale * weight_scale (a product of powers of two: exact) and added to an fp32 accumulator
// with one fmaf, so the result differs from the CPU's fp32 dot product only by summation order
// within 16 or 32 products and by the MMA's own internal adds (measured: docs/NUMERICS.md).
//   kF16: codes widened exactly to fp16 (e4m3 is a subset), m16n8k16 fp16 MMA with fp32
//         accumulation: any sm_80+ device.
//   kFp8: m16n8k32 e4m3 MMA (sm_89+): twice the MMA rate. Hopper's FP8 MMAs add with fewer
//         bits than fp32 when one accumulator runs across many instructions; from zero over 32
//         products the measured error equals the fp16 path's (H200, docs/NUMERICS.md).
// Both read A and B fragments from the same byte offsets of the same k range, so the pairing of
// k slots inside an MMA never depends on which of the two documented fragment orders the
// hardware uses.
#include <climits>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/tc_mma.cuh"
#include "backend/cuda/weight_decode.cuh"

namespace dsinfer::backend::cuda {

namespace {

constexpr int kBM = 64;    // tokens per block
constexpr int kBN = 64;    // weight rows per block (divides the 128-row weight scale block)
constexpr int kBK = 128;   // K per stage: one activation / weight scale block
constexpr int kRow = 144;  // shared-memory bytes per tile row (kBK + 16: conflict-free loads)
constexpr int kThreads = 128;

struct TcArgs {
  const uint8_t* a;       // activation codes [m, K] e4m3
  const float* a_scales;  // [m, k_blocks] f32
  DeviceWeightView w;     // FP8 block-scaled [N, K]
  int64_t m = 0;
  int kb_per_split = 0;  // K blocks per grid.z slice
  float* y = nullptr;    // [m, N], or [splits, m, N] partial sums when gridDim.z > 1
};

template <TcMma kMma>
__global__ void __launch_bounds__(kThreads, 3) TcMatMulKernel(TcArgs p) {
  __shared__ __align__(16) uint8_t a_tile[2][kBM * kRow];  // [stage][token row][k byte]
  __shared__ __align__(16) uint8_t b_tile[2][kBN * kRow];  // [stage][weight row][k byte]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1;  // the warp's 32 x 32 quarter of the tile
  const int g = lane >> 2, t = lane & 3;    // fragment row group, thread in group
  const int64_t K = p.w.cols, N = p.w.rows, M = p.m;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int k_blocks = static_cast<int>((K + kBK - 1) / kBK);
  const int kb_begin = static_cast<int>(blockIdx.z) * p.kb_per_split;
  const int kb_end = min(k_blocks, kb_begin + p.kb_per_split);

  // One stage: 64 rows x 8 chunks of 16 bytes for each operand; rows past M / N and columns
  // past K are zero-filled (K % 16 == 0, so a chunk is all in or all out).
  auto load = [&](int stage, int kb) {
#pragma unroll
    for (int i = 0; i < (kBM * kBK / 16) / kThreads; ++i) {
      const int chunk = tid + i * kThreads;
      const int r = chunk >> 3, c = (chunk & 7) * 16;
      const int64_t k = static_cast<int64_t>(kb) * kBK + c;
      const bool a_in = m0 + r < M && k < K, b_in = n0 + r < N && k < K;
      CpAsync16(&a_tile[stage][r * kRow + c], a_in ? p.a + (m0 + r) * K + k : p.a, a_in);
      CpAsync16(&b_tile[stage][r * kRow + c], b_in ? p.w.data + (n0 + r) * K + k : p.w.data, b_in);
    }
    CpAsyncCommit();
  };

  float acc[2][4][4] = {};  // [m16 tile][n8 tile][fragment]
  if (kb_begin < kb_end) load(0, kb_begin);
  for (int kb = kb_begin; kb < kb_end; ++kb) {
    const int stage = (kb - kb_begin) & 1;
    if (kb + 1 < kb_end) {
      load(stage ^ 1, kb + 1);  // the other stage was released by the previous iteration's sync
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    // Scales of this K block: the weight's (rows n0.. share one 128-row block) times each
    // fragment row's activation scale. Rows past M get 0 (their outputs are not stored).
    const float sw = ScaleAt(p.w, (n0 >> 7) * p.w.scale_cols + kb);
    float s[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wm * 32 + mt * 16 + g + 8 * h;
        s[mt][h] = row < M ? p.a_scales[row * k_blocks + kb] * sw : 0.0f;
      }
    const uint8_t* as = a_tile[stage] + (wm * 32 + g) * kRow + 4 * t;
    const uint8_t* bs = b_tile[stage] + (wn * 32 + g) * kRow + 4 * t;
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      uint32_t af[2][4], bf[4][2];  // e4m3 x 4 per register
      LoadAFragments<kRow>(as, ks, af);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint8_t* q = bs + nt * 8 * kRow + ks * 32;
        bf[nt][0] = Shared32(q);       // weight row g, k 4t..4t+3
        bf[nt][1] = Shared32(q + 16);  // weight row g, k 16+4t..
      }
      MmaStep32<kMma>(af, bf,
                      [&](int mt, int nt, const float* r) { AddScaled(acc[mt][nt], r, s[mt]); });
    }
    __syncthreads();  // this stage may be refilled by the next iteration
  }

  float* out = p.y + static_cast<int64_t>(blockIdx.z) * M * N;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wm * 32 + mt * 16 + g + 8 * h;
        const int64_t col = n0 + wn * 32 + nt * 8 + 2 * t;
        if (row >= M) continue;
        if (col < N) out[row * N + col] = acc[mt][nt][2 * h];
        if (col + 1 < N) out[row * N + col + 1] = acc[mt][nt][2 * h + 1];
      }
}

// y [n] = sum over s of partial [s, n], in order of s (a fixed order: deterministic).
__global__ void SumSplitsKernel(const float* partial, int splits, int64_t n, float* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = partial[i];
  for (int s = 1; s < splits; ++s) v += partial[s * n + i];
  y[i] = v;
}

}  // namespace

bool TcMatMulApplies(const DeviceWeightView& w) {
  return w.format == DeviceWeightView::Format::kFp8Block && w.cols % 16 == 0 && w.cols > 0 &&
         w.rows > 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

int TcMatMulSplits(const DeviceWeightView& w, int64_t m, int sm_count) {
  const int64_t tiles = ((w.rows + kBN - 1) / kBN) * ((m + kBM - 1) / kBM);
  const int64_t k_blocks = (w.cols + kBK - 1) / kBK;
  // Two blocks per SM keep enough loads in flight for a decode-sized m; more splits only add
  // partial-sum traffic.
  const int64_t want = (2 * static_cast<int64_t>(sm_count) + tiles - 1) / tiles;
  int64_t splits = want < 1 ? 1 : (want > k_blocks ? k_blocks : want);
  const int64_t per = (k_blocks + splits - 1) / splits;
  splits = (k_blocks + per - 1) / per;  // no empty slice
  return static_cast<int>(splits);
}

cudaError_t LaunchTcMatMul(TcMma mma, const DeviceWeightView& w, const uint8_t* codes,
                           const float* scales, int64_t m, int splits, float* partial, float* y,
                           cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (!TcMatMulApplies(w) || reinterpret_cast<uintptr_t>(codes) % 16 != 0 || splits < 1 ||
      (splits > 1 && partial == nullptr))
    return cudaErrorInvalidValue;
  const int64_t k_blocks = (w.cols + kBK - 1) / kBK;
  const int64_t per = (k_blocks + splits - 1) / splits;
  const int64_t m_tiles = (m + kBM - 1) / kBM;
  if (m_tiles > 65535 || splits > 65535 || (w.rows + kBN - 1) / kBN > INT32_MAX)
    return cudaErrorInvalidValue;
  TcArgs args;
  args.a = codes;
  args.a_scales = scales;
  args.w = w;
  args.m = m;
  args.kb_per_split = static_cast<int>(per);
  args.y = splits > 1 ? partial : y;
  const dim3 grid(static_cast<unsigned>((w.rows + kBN - 1) / kBN), static_cast<unsigned>(m_tiles),
                  static_cast<unsigned>(splits));
  if (mma == TcMma::kFp8)
    TcMatMulKernel<TcMma::kFp8><<<grid, kThreads, 0, stream>>>(args);
  else
    TcMatMulKernel<TcMma::kF16><<<grid, kThreads, 0, stream>>>(args);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  const int64_t n = m * w.rows;
  SumSplitsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(partial, splits, n,
                                                                              y);
  return cudaGetLastError();
}

}  // namespace dsinfer::backend::cuda
