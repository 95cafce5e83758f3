// Exact decoding of the checkpoint's small formats on the device (e8m0 scales, e4m3 codes, e2m1
// nibbles: all exact in fp32), shared by the generic kernels (kernels.cu) and the tensor-core GEMM
// (tc_gemm.cu). Force-inlined, not in an anonymous namespace: a file that uses only some of them
// gets no "declared but never referenced" warning.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace dsinfer::backend::cuda {

__device__ __forceinline__ float E8m0ToF32(uint8_t c) {
  if (c == 0xff) return __int_as_float(0x7fc00000);
  if (c == 0) return __int_as_float(0x00400000);  // 2^-127, an fp32 subnormal
  return __int_as_float(static_cast<int>(static_cast<uint32_t>(c) << 23));
}

__device__ __forceinline__ float E4m3ToF32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  if ((c & 0x7f) == 0x7f) return __int_as_float(0x7fc00000);
  if (e == 0) {  // subnormal: m * 2^-9
    float v = static_cast<float>(m) * 0.001953125f;
    return __int_as_float(static_cast<int>(static_cast<uint32_t>(__float_as_int(v)) | sign));
  }
  return __int_as_float(static_cast<int>(sign | ((e + 120u) << 23) | (m << 20)));
}

__device__ __forceinline__ float E2m1ToF32(uint32_t nibble) {
  const uint32_t mag = nibble & 7u, e = mag >> 1, mant = mag & 1u;
  float v = e == 0 ? 0.5f * static_cast<float>(mant)
                   : (1.0f + 0.5f * static_cast<float>(mant)) * static_cast<float>(1u << (e - 1));
  return (nibble & 8u) ? -v : v;
}

__device__ __forceinline__ float ScaleAt(const DeviceWeightView& w, int64_t idx) {
  if (w.scales_f32) return reinterpret_cast<const float*>(w.scales)[idx];
  return E8m0ToF32(w.scales[idx]);
}

}  // namespace dsinfer::backend::cuda
