// Warp-level MMA building blocks shared by the tensor-core GEMMs (tc_gemm.cu: dense FP8
// linears; tc_grouped.cu: routed FP4 experts): cp.async staging, shared-memory fragment loads,
// e4m3 -> fp16 widening and the two mma.sync shapes. Force-inlined, not in an anonymous
// namespace, like weight_decode.cuh.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace dsinfer::backend::cuda {

__device__ __forceinline__ void CpAsync16(uint8_t* smem, const uint8_t* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill without reading
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ uint32_t Shared32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Two e4m3 codes (low 16 bits of `two`) -> two fp16 (low half = first code); exact.
__device__ __forceinline__ uint32_t E4m3PairToF16Pair(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// d = A (16 x 16 fp16) * B (16 x 8 fp16), fp32 accumulation from zero.
__device__ __forceinline__ void MmaF16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// d = A (16 x 32 e4m3) * B (32 x 8 e4m3), from zero. Only sm_89+ has the instruction; the
// launcher never selects kFp8 elsewhere (the trap marks a dispatch bug).
__device__ __forceinline__ void MmaFp8(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
#else
  (void)a;
  (void)b;
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  asm volatile("trap;");
#endif
}

// acc[i] += r[i] * s[i / 2] for one 16 x 8 output fragment (rows g and g + 8).
__device__ __forceinline__ void AddScaled(float* acc, const float* r, const float* s) {
  acc[0] = fmaf(r[0], s[0], acc[0]);
  acc[1] = fmaf(r[1], s[0], acc[1]);
  acc[2] = fmaf(r[2], s[1], acc[2]);
  acc[3] = fmaf(r[3], s[1], acc[3]);
}

// A fragments of one 32-column step ks from a shared tile of kRowBytes per row; `as` points at
// the warp's fragment row g, column byte 4t: per 16-row tile mt, row g k 4t..4t+3, row g + 8
// k 4t.., row g k 16+4t.., row g + 8 k 16+4t.. (4 e4m3 codes per register).
template <int kRowBytes>
__device__ __forceinline__ void LoadAFragments(const uint8_t* as, int ks, uint32_t (&af)[2][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const uint8_t* q = as + mt * 16 * kRowBytes + ks * 32;
    af[mt][0] = Shared32(q);
    af[mt][1] = Shared32(q + 8 * kRowBytes);
    af[mt][2] = Shared32(q + 16);
    af[mt][3] = Shared32(q + 8 * kRowBytes + 16);
  }
}

// The MMAs of one 32-column step of a warp's 32 x 32 quarter: A fragments af[mt] (rows mt*16..,
// 4 e4m3 codes per register: row g k 4t.., row g+8 k 4t.., row g k 16+4t.., row g+8 k 16+4t..)
// times B fragments bf[nt] (weight row g of nt*8.., k 4t.. and 16+4t..). Each product sum r[4]
// starts from zero and goes to add(mt, nt, r): one m16n8k32 e4m3 MMA for kFp8; for kF16 two
// m16n8k16 MMAs on the exactly widened codes, each passed on its own (the low pair of each
// register fills k slots 2t, 2t+1, the high pair 2t+8, 2t+9, the same way for A and B, so the
// two cover k 0..15 and 16..31 whichever fragment order the hardware documents).
template <TcMma kMma, typename Add>
__device__ __forceinline__ void MmaStep32(const uint32_t (&af)[2][4], const uint32_t (&bf)[4][2],
                                          Add add) {
  if constexpr (kMma == TcMma::kFp8) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float r[4];
        MmaFp8(r, af[mt], bf[nt]);
        add(mt, nt, r);
      }
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t hb[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        hb[nt][0] = E4m3PairToF16Pair(bf[nt][half]);
        hb[nt][1] = E4m3PairToF16Pair(bf[nt][half] >> 16);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t row_g = af[mt][2 * half], row_g8 = af[mt][2 * half + 1];
        const uint32_t a0 = E4m3PairToF16Pair(row_g), a1 = E4m3PairToF16Pair(row_g8);
        const uint32_t a2 = E4m3PairToF16Pair(row_g >> 16);
        const uint32_t a3 = E4m3PairToF16Pair(row_g8 >> 16);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          float r[4];
          MmaF16(r, a0, a1, a2, a3, hb[nt][0], hb[nt][1]);
          add(mt, nt, r);
        }
      }
    }
  }
}

}  // namespace dsinfer::backend::cuda
