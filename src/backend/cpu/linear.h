// Dense linear algebra on the CPU over the checkpoint's stored formats. Weights are dequantized
// on the fly, row by row, into a small fp32 buffer (exact: e4m3/e2m1 times a power of two fits
// in fp32), so one read of a weight row serves every token of the batch.
// Convention (as in the reference): y[m, n] = sum_k x[m, k] * W[n, k], W stored [out, in].
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu {

// Dequantizes row r of w into out[w.cols] (fp32).
void DequantRow(const model::WeightMatrix& w, int64_t r, float* out);

// y [m, w.rows] = x [m, w.cols] * W^T, fp32 accumulation. Rows of W are split across the pool.
void MatMul(const model::WeightMatrix& w, const float* x, int64_t m, float* y, ThreadPool& pool);

// Same, but only output rows [row_begin, row_end) of W; y is [m, row_end - row_begin].
void MatMulRows(const model::WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                int64_t m, float* y, ThreadPool& pool);

float Dot(const float* a, const float* b, int64_t n);

// Several query vectors against the same rows (V4's heads share one KV head), each row loaded
// once for all of them: out[j * ldo + r] = Dot(a + j * lda, rows[r], n), bit for bit, for
// j < n_a <= kSharedRowsMax.
// Eight where the build has AVX-512 (32 vector registers hold 8 queries' chains for two rows at a
// time), four with AVX2's 16.
#ifdef __AVX512F__
constexpr int kSharedRowsMax = 8;
#else
constexpr int kSharedRowsMax = 4;
#endif
void DotSharedRows(const float* a, int64_t lda, int n_a, const float* const* rows, int64_t n_rows,
                   int64_t n, float* out, int64_t ldo);

// The weighted sum of the same rows for several weight vectors: y[j * ldy + i] starts at +0 and
// takes, for each row r in order, one fused multiply-add y += p[j * ldp + r] * rows[r][i]
// (j < n_a <= kSharedRowsMax, i < n); each row is loaded once for all j.
void AxpySharedRows(const float* p, int64_t ldp, int n_a, const float* const* rows, int64_t n_rows,
                    int64_t n, float* y, int64_t ldy);

// Which kernels MatMul runs for token rows of w that hold bf16-exact values (the official
// numerics): AMX tiles where the CPU has them, else AVX-512 BF16 dot products, else FP32.
enum class ExactRowKernel { kAmxTiles, kAvx512Bf16, kFp32 };
ExactRowKernel ExactRowKernelFor(const model::WeightMatrix& w);
// The same for this machine and weights that any fast path takes: "amx-bf16", "avx512-bf16" or
// "fp32" (for reports).
const char* MachineMatMulKernel();

}  // namespace dsinfer::backend::cpu
