// Matrix multiply with AVX-512 BF16 dot products (VDPBF16PS), for x86 CPUs that have AVX512-BF16
// but no AMX tiles: AMD Zen 4 and Zen 5 (EPYC Genoa/Turin, Ryzen 7000/9000), Intel Cooper Lake.
// There the FP32 kernels are compute-bound long before memory is: measured on this project's
// Zen 4 VM, a zmm VDPBF16PS (32 multiply-adds) issues as fast as a zmm FMA (16), and converting
// e2m1 / e4m3 codes into bf16 takes a word permute and a few integer ops per 32 weights, so one
// token reads FP4 experts and FP8 matrices at memory speed and 16 tokens cost little more than
// one (docs/PERF.md).
//
// Exactness: used, like the AMX path, only for token rows whose values are exactly bf16 and zero
// or normal (amx::RowIsBf16Exact) and for weights whose values are exactly bf16. Weights are
// converted unscaled (an e2m1 or e4m3 value is always a normal bf16, subnormal e4m3 codes
// included) and each 128-column block's partial sum is multiplied by its scale in fp32, so every
// product is the exact product the FP32 path forms and no scale can make a weight subnormal.
// The instruction reads subnormal inputs as zero: bf16 weights below 2^-126 (none in trained
// checkpoints) contribute zero, and products below 2^-126 are flushed. e4m3 code 0x7f/0xff (NaN in
// e4m3fn) reads as +-480, as in the FP32 kernels.
//
// Invariance: each output (weight row, token) is computed by one fixed instruction sequence: for
// each 128-column block, t = +0, then four VDPBF16PS over the block's 4 vectors of 32 bf16 (in a
// fixed per-format column order), then acc = fma(t, block scale, acc) (bf16 weights, unscaled:
// the four VDPBF16PS go straight into acc); finally a fixed horizontal sum of acc. It is the
// same for any number of tokens, any batch composition and any row split across threads, so
// results never depend on them.
//
// Kernels: up to 16 tokens at a time, weights converted in registers (passes of 16 tokens over
// a 16-row tile). Many tokens (bf16 12+, FP8 32+, FP4 40+: prefill, large decode batches): an
// FP8 / FP4 tile is converted once into an L2-resident bf16 buffer, then groups of 6 tokens run
// register blocks of 2 (FP8 / FP4) or 4 (bf16) rows x 6 tokens over it. Both run the sequence
// above.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu::bf16dot {

// True when this CPU has AVX-512 F/BW/VL/DQ and AVX512-BF16 and the OS saves the zmm state.
// Checked once; DSINFER_CPU_BF16DOT=0 in the environment disables the path (to compare).
bool Available();

// Whether w has a kernel here: bf16, or FP8/FP4 with e8m0 (power-of-two) scales, cols % 128 == 0.
bool Applies(const model::WeightMatrix& w);

// For each listed token t (a row index of x [*, w.cols], fp32 holding bf16-exact values, see
// amx::RowIsBf16Exact) and each weight row r in [row_begin, row_end):
// y[t * ldy + (r - row_begin)] = sum_k x[t, k] * W[r, k]. Row tiles are split across the pool.
// Requires Available() and Applies(w).
void MatMulRows(const model::WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                std::span<const int64_t> tokens, float* y, int64_t ldy, ThreadPool& pool);

}  // namespace dsinfer::backend::cpu::bf16dot
