// Tensor-core grouped GEMM of the routed FP4 experts (see kernels.h LaunchTcGroupedMatMul): each
// tile is up to 64 grouped rows of one expert (the tokens routed to it, gathered by row index)
// times 64 of its weight rows. The activations are e4m3 codes with one power-of-two scale per
// 1x128 block (ActQuantFp8), as the reference feeds its FP4 expert GEMM.
//
// FP4 -> FP8 on the fly: the packed e2m1 nibbles are staged in shared memory as stored (half
// the bytes of FP8) and widened to e4m3 codes when a fragment is read. Every e2m1 value (0, 0.5,
// 1, 1.5, 2, 3, 4, 6 and negatives) is an e4m3 value, so the widening is exact and the weight
// keeps its own 1x32 power-of-two scales: one MMA covers exactly one 32-column scale block
// (m16n8k32 e4m3, or two m16n8k16 fp16 MMAs on exactly widened codes), starts from zero, and is
// added to the fp32 accumulator times act_scale * weight_scale (exact) with one fmaf, as in
// tc_gemm.cu. The weight scale differs per output column here, so each fragment element takes
// its own.
#include <climits>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/tc_mma.cuh"
#include "backend/cuda/weight_decode.cuh"

namespace dsinfer::backend::cuda {

namespace {

constexpr int kBM = kTcGroupedTileRows;  // grouped rows per block
constexpr int kBN = 64;                  // weight rows per block
constexpr int kBK = 128;                 // K per stage: one activation scale block
constexpr int kRowA = 144;               // shared bytes per A row (128 codes + 16: no conflicts)
constexpr int kRowB = 80;                // shared bytes per B row (64 packed bytes + 16)
constexpr int kThreads = 128;

struct GroupedArgs {
  const DeviceWeightView* experts;  // [E] FP4 views, rows x cols each
  const int32_t* tiles;             // [n_tiles, 3] (expert, begin, count <= kBM)
  const int32_t* rows_of;           // [grouped rows]: the A row of each grouped row
  const uint8_t* a;                 // [*, K] e4m3 codes
  const float* a_scales;            // [*, K / 128] f32
  int64_t n = 0, k = 0;             // weight rows, columns
  float* y = nullptr;               // [grouped rows, n]
};

// Four e2m1 codes (16 bits, low nibble first) -> four e4m3 codes in the same order, exact:
// magnitudes 0..7 are looked up with one byte permute, the sign bits move from bit 3 of each
// nibble to bit 7 of each byte.
__device__ __forceinline__ uint32_t E2m1QuadToE4m3(uint32_t v) {
  constexpr uint32_t kLo = 0x3C383000u;  // 0, 0.5, 1, 1.5
  constexpr uint32_t kHi = 0x4C484440u;  // 2, 3, 4, 6
  const uint32_t mags = __byte_perm(kLo, kHi, v & 0x7777u);
  const uint32_t s = v & 0x8888u;
  return mags | ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) |
         ((s & 0x8000u) << 16);
}

__device__ __forceinline__ uint32_t Shared16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}

// acc[i] += r[i] * (row scale * column scale) for one 16 x 8 fragment: elements 0, 1 are row g,
// columns 2t, 2t + 1; elements 2, 3 row g + 8.
__device__ __forceinline__ void AddScaledPerColumn(float* acc, const float* r, const float* s_row,
                                                   const float* s_col) {
  acc[0] = fmaf(r[0], s_row[0] * s_col[0], acc[0]);
  acc[1] = fmaf(r[1], s_row[0] * s_col[1], acc[1]);
  acc[2] = fmaf(r[2], s_row[1] * s_col[0], acc[2]);
  acc[3] = fmaf(r[3], s_row[1] * s_col[1], acc[3]);
}

template <TcMma kMma>
__global__ void __launch_bounds__(kThreads) TcGroupedKernel(GroupedArgs p) {
  __shared__ __align__(16) uint8_t a_tile[2][kBM * kRowA];  // [stage][grouped row][k byte]
  __shared__ __align__(16) uint8_t b_tile[2][kBN * kRowB];  // [stage][weight row][packed byte]
  __shared__ int32_t a_row[kBM];                            // A row of each tile row, -1: none
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1;
  const int g = lane >> 2, t = lane & 3;
  const int32_t expert = p.tiles[3 * blockIdx.y], begin = p.tiles[3 * blockIdx.y + 1],
                count = p.tiles[3 * blockIdx.y + 2];
  const DeviceWeightView w = p.experts[expert];
  const int64_t K = p.k, N = p.n, half_k = K / 2;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int k_blocks = static_cast<int>(K / kBK);
  if (tid < kBM) a_row[tid] = tid < count ? p.rows_of[begin + tid] : -1;
  __syncthreads();

  auto load = [&](int stage, int kb) {
#pragma unroll
    for (int i = 0; i < (kBM * kBK / 16) / kThreads; ++i) {  // A: 64 rows x 8 chunks
      const int chunk = tid + i * kThreads;
      const int r = chunk >> 3, c = (chunk & 7) * 16;
      const int32_t src = a_row[r];
      CpAsync16(&a_tile[stage][r * kRowA + c],
                src >= 0 ? p.a + static_cast<int64_t>(src) * K + kb * kBK + c : p.a, src >= 0);
    }
#pragma unroll
    for (int i = 0; i < (kBN * kBK / 32) / kThreads; ++i) {  // B: 64 rows x 4 chunks
      const int chunk = tid + i * kThreads;
      const int r = chunk >> 2, c = (chunk & 3) * 16;
      const bool in = n0 + r < N;
      CpAsync16(&b_tile[stage][r * kRowB + c],
                in ? w.data + (n0 + r) * half_k + kb * 64 + c : w.data, in);
    }
    CpAsyncCommit();
  };

  float acc[2][4][4] = {};  // [m16 tile][n8 tile][fragment]
  load(0, 0);
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < k_blocks) {
      load(stage ^ 1, kb + 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    float s_row[2][2];  // activation scales of the fragment rows (0 past the tile)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t src = a_row[wm * 32 + mt * 16 + g + 8 * h];
        s_row[mt][h] = src >= 0 ? p.a_scales[static_cast<int64_t>(src) * k_blocks + kb] : 0.0f;
      }
    const uint8_t* as = a_tile[stage] + (wm * 32 + g) * kRowA + 4 * t;
    const uint8_t* bs = b_tile[stage] + (wn * 32 + g) * kRowB + 2 * t;
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      // Weight scales of this thread's output columns (weight rows n0 + wn*32 + nt*8 + 2t + c)
      // for the 32-column block ks of this stage; 0 past N (those outputs are not stored).
      float s_col[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t n = n0 + wn * 32 + nt * 8 + 2 * t + c;
          s_col[nt][c] = n < N ? ScaleAt(w, n * w.scale_cols + kb * 4 + ks) : 0.0f;
        }
      uint32_t af[2][4], bf[4][2];
      LoadAFragments<kRowA>(as, ks, af);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint8_t* q = bs + nt * 8 * kRowB + ks * 16;  // weight row g, packed k 0..31
        bf[nt][0] = E2m1QuadToE4m3(Shared16(q));           // k 4t..4t+3
        bf[nt][1] = E2m1QuadToE4m3(Shared16(q + 8));       // k 16+4t..
      }
      MmaStep32<kMma>(af, bf, [&](int mt, int nt, const float* r) {
        AddScaledPerColumn(acc[mt][nt], r, s_row[mt], s_col[nt]);
      });
    }
    __syncthreads();  // this stage may be refilled by the next iteration
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm * 32 + mt * 16 + g + 8 * h;
        const int64_t col = n0 + wn * 32 + nt * 8 + 2 * t;
        if (row >= count) continue;
        float* out = p.y + static_cast<int64_t>(begin + row) * N;
        if (col < N) out[col] = acc[mt][nt][2 * h];
        if (col + 1 < N) out[col + 1] = acc[mt][nt][2 * h + 1];
      }
}

}  // namespace

bool TcGroupedApplies(DeviceWeightView::Format format, int64_t rows, int64_t cols) {
  return format == DeviceWeightView::Format::kFp4Packed && rows > 0 && cols > 0 && cols % kBK == 0;
}

cudaError_t LaunchTcGroupedMatMul(TcMma mma, const DeviceWeightView* experts, const int32_t* tiles,
                                  int64_t n_tiles, const int32_t* rows_of, const uint8_t* codes,
                                  const float* scales, int64_t rows, int64_t cols, float* y,
                                  cudaStream_t stream) {
  if (n_tiles <= 0) return cudaSuccess;
  if (!TcGroupedApplies(DeviceWeightView::Format::kFp4Packed, rows, cols) ||
      reinterpret_cast<uintptr_t>(codes) % 16 != 0 || n_tiles > 65535 ||
      (rows + kBN - 1) / kBN > INT32_MAX)
    return cudaErrorInvalidValue;
  GroupedArgs args;
  args.experts = experts;
  args.tiles = tiles;
  args.rows_of = rows_of;
  args.a = codes;
  args.a_scales = scales;
  args.n = rows;
  args.k = cols;
  args.y = y;
  const dim3 grid(static_cast<unsigned>((rows + kBN - 1) / kBN), static_cast<unsigned>(n_tiles));
  if (mma == TcMma::kFp8)
    TcGroupedKernel<TcMma::kFp8><<<grid, kThreads, 0, stream>>>(args);
  else
    TcGroupedKernel<TcMma::kF16><<<grid, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace dsinfer::backend::cuda
