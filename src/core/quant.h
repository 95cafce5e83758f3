// Activation quantization primitives of the V4 reference (spec §2.2-2.4), on fp32 buffers.
// Pure functions, thread-safe. Inputs are the fp32 values of bf16 activations; outputs are
// exactly what the reference computes (power-of-two scales from the exponent bits).
#pragma once

#include <cstdint>

namespace dsinfer {

// Power-of-two scale for one block: 2^ceil(log2(max(amax, floor) * inv_range)).
float PowerOfTwoScale(float amax, float amax_floor, float inv_range);

// act_quant for a GEMM input: x [n] -> codes [n] e4m3 and scales [ceil(n/block)] (powers of two).
void ActQuantFp8(const float* x, int n, int block, uint8_t* codes, float* scales);

// act_quant(inplace=True): x <- bf16(e4m3(clamp(x/s, +-448)) * s) per block (KV QAT round trip).
void Fp8RoundTripInPlace(float* x, int n, int block);

// fp4_act_quant(inplace=True): x <- bf16(e2m1(clamp(x/s, +-6)) * s) per block of `block`.
void Fp4RoundTripInPlace(float* x, int n, int block);

// Sylvester (natural-order) Walsh-Hadamard transform of x [n], n a power of two, scaled by
// n^-0.5, then rounded to bf16 as the reference's bf16 kernel output is.
void HadamardInPlace(float* x, int n, bool round_to_bf16);

}  // namespace dsinfer
