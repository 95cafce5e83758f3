// Device helpers shared by the CUDA kernel files (kernels.cu, model_kernels.cu): bf16 rounding
// with the CPU's bits, and warp / block reductions. Inline (not an anonymous namespace): a file
// that uses only some of them gets no "declared but never referenced" warning.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::backend::cuda {

// Same bits as core/dtype.h F32ToBf16 + Bf16ToF32 (RNE, quiet NaN).
__device__ __forceinline__ float RoundBf16(float f) {
  uint32_t u = static_cast<uint32_t>(__float_as_int(f));
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return __int_as_float(static_cast<int>((u | 0x400000u) & 0xffff0000u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return __int_as_float(static_cast<int>(u & 0xffff0000u));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x (multiple of 32, <= 1024) threads; every thread gets it.
inline __device__ float BlockSum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) >> 5;
  float s = lane < n_warps ? partial[lane] : 0.0f;
  return WarpSum(s);
}

}  // namespace dsinfer::backend::cuda
