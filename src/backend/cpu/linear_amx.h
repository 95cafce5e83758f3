// Matrix multiply on Intel AMX tiles (AMX-BF16): the path that makes batched CPU decode
// bandwidth-bound instead of compute-bound. One TDPBF16PS multiplies a 16x32 bf16 weight tile by
// a 32x16 bf16 activation tile (8192 multiply-adds); measured on this project's Sapphire Rapids
// VM it runs ~55x the AVX-512 FP32 FMA rate, so the cost left is converting the stored weights
// (e4m3 / e2m1 with e8m0 scales) into bf16 tiles. bf16 weights need no conversion: full row
// tiles are loaded straight from the matrix. FP8 and FP4 are converted with integer ops (an
// exponent add replaces the multiply by the scale), streamed across row tiles two blocks ahead
// of the tile ops, and placed in a fixed permuted column order inside each scale block (the
// order the conversion produces; the activation tiles use the same order), see TileOrder.
//
// Exactness: the path is used only for token rows whose fp32 values are exactly bf16 (the
// official numerics feed FP8/FP4 linears e4m3 values times power-of-two scales, and bf16-rounded
// activations elsewhere) and for weights whose dequantized values are exactly bf16 (e4m3 and
// e2m1 codes times e8m0 scales have at most 4 significant bits). Every product is then the exact
// product the FP32 path forms; only the summation order differs (fp32 accumulation inside the
// tile unit). Rows that are not bf16-exact (the fp32-reference numerics) keep the FP32 kernels.
// One difference remains by design of the hardware: the tile unit treats subnormal inputs
// (|v| < 2^-126) as zero. Activation rows holding them are not bf16-exact here (FP32 kernels);
// weights that small (a bf16 weight, or an e4m3/e2m1 code times a scale below 2^-117) do not
// occur in trained checkpoints, and would contribute zero instead of < 2^-126 per product.
//
// Invariance: each output element (weight row, token) is accumulated by the same sequence of
// tile operations over k (in TileOrder, fixed per weight format) whatever other rows and tokens
// share its tiles (checked on the hardware: moving a row or token to another tile position, or
// changing its neighbours, leaves it bit-identical), so results do not depend on batch
// composition or chunking.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu::amx {

// True when this CPU has AMX-BF16 and AVX-512 BF16 and the kernel grants tile state to the
// process. Checked once; DSINFER_CPU_AMX=0 in the environment disables the path (to compare).
bool Available();

// Whether w has an AMX kernel: bf16, or FP8/FP4 with e8m0 (power-of-two) scales, cols % 32 == 0.
bool Applies(const model::WeightMatrix& w);

// True when every value of x [k] is exactly a bf16 number that is zero or normal (the tile unit
// treats subnormal inputs as zero) and finite.
bool RowIsBf16Exact(const float* x, int64_t k);

// For each listed token t (a row index of x [*, w.cols], fp32 holding bf16-exact values) and each
// weight row r in [row_begin, row_end): y[t * ldy + (r - row_begin)] = sum_k x[t, k] * W[r, k].
// Weight row tiles are split across the pool. For FP8/FP4 weights and at most 2 tokens the
// AVX-512 vector kernels run instead of the tile unit (`kernel` forces one, for tests and
// benchmarks): they compute the tile unit's exact arithmetic, so the result is bit-identical
// either way and the choice cannot break batch invariance. DSINFER_CPU_VECTOR=0 in the
// environment keeps the tile kernels for kAuto (to compare).
enum class Kernel { kAuto, kTiles, kVector };
bool VectorApplies(const model::WeightMatrix& w, int64_t n_tokens);
// Whether kAuto uses the vector kernels here: not disabled by DSINFER_CPU_VECTOR=0, and they
// matched the tile path bit for bit on a probe run once on this CPU.
bool VectorInUse();
void MatMulRows(const model::WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                std::span<const int64_t> tokens, float* y, int64_t ldy, ThreadPool& pool,
                Kernel kernel = Kernel::kAuto);

}  // namespace dsinfer::backend::cpu::amx
