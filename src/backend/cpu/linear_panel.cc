// Register-blocked panels for the fused FP32 kernels at many tokens (prefill, large decode
// batches). The one-row GEMV of linear.cc decodes each weight again for every 4 token rows; here
// a tile of 16 weight rows is decoded once per 256-column panel and 48 token rows into an fp32
// buffer, and 2 rows x 6 tokens of accumulators (12 registers; FP4: 2 x 3 with its block sums
// in registers) run over the panel while the panel's token rows stay in L1. Measured per core
// on a 2-core Zen VM (bench/linear_bench --m 64 / 256, docs/PERF.md): FP8 8.7 / 7.6 -> 11.9 /
// 11.8 GMAC/s, 44 / 38 -> 60 / 59 % of the FMA peak.
//
// Every (row, token) dot product is the one-row GEMV's instruction sequence, in the same order:
//   bf16:  acc = fma(w, x, acc) over all columns, 8 at a time;
//   FP8:   per 128 columns part = fma(w, x, part) from zero, 8 columns at a time, then
//          acc = fma(part, s, acc);
//   FP4:   the same with 32-column blocks;
// then one HorizontalSum. Decoding into memory and back changes no value (the decoders are
// exact), and the sums carried across panels go through memory unchanged, so results are
// bit-identical to linear.cc's GEMV whatever the batch (tests/backend/linear_test.cc).
#include "backend/cpu/linear_fused.h"

#ifdef DSINFER_X86_AVX2
#include "core/prefetch.h"

namespace dsinfer::backend::cpu::fused {
namespace {

using model::WeightFormat;
using model::WeightMatrix;

constexpr int kTileRows = 16;     // weight rows per call (linear.cc's row tile)
constexpr int kPanelCols = 256;   // multiple of both block widths (FP8 128, FP4 32)
constexpr int kGroupTokens = 6;   // token rows per register block
constexpr int kChunkTokens = 48;  // token rows whose accumulators live in the scratch at once

// Per call (on the stack, ~41 KiB): the decoded panel and the chains carried across panels.
struct Scratch {
  alignas(32) float w[kTileRows][kPanelCols];  // [rows, panel cols] decoded weights
  float scale[kTileRows][kPanelCols / 32];     // [rows, blocks of the panel] (FP8 uses [r][0..1])
  alignas(32) float acc[kTileRows][kChunkTokens][8];  // [rows, tokens, lanes] running sums
};

// Columns per block scale; 0 for bf16 (one chain over the row, no scale).
int BlockCols(const WeightMatrix& w) {
  return w.format == WeightFormat::kFp8Block ? 128 : w.format == WeightFormat::kFp4Packed ? 32 : 0;
}

// Decodes columns [c0, c0 + cols) of rows [r0, r0 + rows) into s.w and their block scales into
// s.scale (the values the GEMV would compute in registers).
void DecodePanel(const WeightMatrix& w, int64_t r0, int rows, int64_t c0, int cols, Scratch& s) {
  const int64_t k = w.cols;
  for (int i = 0; i < rows; ++i) {
    const int64_t r = r0 + i;
    float* out = s.w[i];
    if (w.format == WeightFormat::kBF16) {
      for (int c = 0; c < cols; c += 8)
        _mm256_store_ps(out + c, LoadBf16x8(w.data + (r * k + c0 + c) * 2));
    } else if (w.format == WeightFormat::kFp8Block) {
      for (int c = 0; c < cols; c += 8)
        _mm256_store_ps(out + c, LoadE4M3x8(w.data + r * k + c0 + c));
      for (int b = 0; b < cols / 128; ++b) s.scale[i][b] = Fp8BlockScale(w, r, c0 + b * 128);
    } else {  // kFp4Packed
      for (int c = 0; c < cols; c += 32) {
        __m256 v[4];
        LoadE2M1x32(w.data + r * (k / 2) + (c0 + c) / 2, v);
        for (int q = 0; q < 4; ++q) _mm256_store_ps(out + c + 8 * q, v[q]);
      }
      float scales[1][8];
      Fp4BlockScales<1>(w, r, c0 / 32, scales);
      for (int b = 0; b < cols / 32; ++b) s.scale[i][b] = scales[0][b];
    }
  }
}

// Bytes of the weight codes of `cols` columns.
int64_t CodeBytes(const WeightMatrix& w, int64_t cols) {
  return w.format == WeightFormat::kBF16       ? cols * 2
         : w.format == WeightFormat::kFp8Block ? cols
                                               : cols / 2;
}

// Asks for the codes of the panel that follows (the next columns of these rows, or the first
// panel of the next tile) while this one is computed: decoding is a separate phase, and without
// this its loads wait on DRAM with no arithmetic to overlap (measured: a quarter of the time).
// always_inline: it only prefetches (core/prefetch.h).
__attribute__((always_inline)) inline void PrefetchNextPanel(const WeightMatrix& w, int64_t r0,
                                                             int rows, int64_t c0, int cols) {
  int64_t next_c = c0 + cols, next_r = r0, n_rows = rows;
  if (next_c >= w.cols) {
    next_c = 0, next_r = r0 + rows;
    n_rows = static_cast<int>(std::min<int64_t>(kTileRows, w.rows - next_r));
  }
  const int64_t row_bytes = CodeBytes(w, w.cols), offset = CodeBytes(w, next_c),
                bytes = CodeBytes(w, std::min<int64_t>(kPanelCols, w.cols - next_c));
  for (int i = 0; i < n_rows; ++i) {
    const char* p = reinterpret_cast<const char*>(w.data + (next_r + i) * row_bytes + offset);
    for (int64_t b = 0; b < bytes; b += 64) PrefetchToL1(p + b);
  }
}

// R decoded rows (from row i0 of the panel) x MT token rows (x: token t at x + t * ldx, panel
// columns from 0) over `cols` columns of bf16 or FP8 blocks; running sums in
// s.acc[i0 + i][t0 + t].
template <int R, int MT>
void Block(Scratch& s, int i0, const float* x, int64_t ldx, int cols, int block, int t0) {
  __m256 part[R][MT];
  if (block == 0) {  // bf16: one chain over the whole row, carried across panels in s.acc
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < MT; ++t) part[i][t] = _mm256_load_ps(s.acc[i0 + i][t0 + t]);
    for (int c = 0; c < cols; c += 8) {
      __m256 wv[R];
      for (int i = 0; i < R; ++i) wv[i] = _mm256_load_ps(s.w[i0 + i] + c);
      for (int t = 0; t < MT; ++t) {
        __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
        asm("" : "+x"(xv));  // one load for all R rows (see below)
        for (int i = 0; i < R; ++i) part[i][t] = _mm256_fmadd_ps(wv[i], xv, part[i][t]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < MT; ++t) _mm256_store_ps(s.acc[i0 + i][t0 + t], part[i][t]);
    return;
  }
  for (int b0 = 0; b0 < cols; b0 += block) {
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < MT; ++t) part[i][t] = _mm256_setzero_ps();
    for (int c = b0; c < b0 + block; c += 8) {
      // Each token's 8 columns are loaded once for both rows. As a memory operand of every FMA
      // (GCC's choice) they were loaded twice, and the loads, not the FMAs, bounded the loop:
      // 9 -> 12 GMAC/s per core at 64 tokens.
      __m256 wv[R];
      for (int i = 0; i < R; ++i) wv[i] = _mm256_load_ps(s.w[i0 + i] + c);
      for (int t = 0; t < MT; ++t) {
        __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
        asm("" : "+x"(xv));  // keeps xv in a register: GCC would fold the load into each FMA
        for (int i = 0; i < R; ++i) part[i][t] = _mm256_fmadd_ps(wv[i], xv, part[i][t]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m256 sv = _mm256_set1_ps(s.scale[i0 + i][b0 / block]);
      for (int t = 0; t < MT; ++t) {
        float* acc = s.acc[i0 + i][t0 + t];
        _mm256_store_ps(acc, _mm256_fmadd_ps(part[i][t], sv, _mm256_load_ps(acc)));
      }
    }
  }
}

// R decoded rows x MT token rows over FP4's 32-column blocks: the running sums stay in registers
// across the panel (storing them every 32 columns cost more than the arithmetic), so R x MT is
// at most 2 x 3 (6 sums + 6 block sums + 2 weights + 1 token vector).
template <int R, int MT>
void NarrowBlocks(Scratch& s, int i0, const float* x, int64_t ldx, int cols, int t0) {
  __m256 acc[R][MT];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < MT; ++t) acc[i][t] = _mm256_load_ps(s.acc[i0 + i][t0 + t]);
  for (int b0 = 0; b0 < cols; b0 += 32) {
    __m256 part[R][MT];
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < MT; ++t) part[i][t] = _mm256_setzero_ps();
    for (int c = b0; c < b0 + 32; c += 8) {
      __m256 wv[R];
      for (int i = 0; i < R; ++i) wv[i] = _mm256_load_ps(s.w[i0 + i] + c);
      for (int t = 0; t < MT; ++t) {
        __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
        asm("" : "+x"(xv));  // one load for all R rows (see Block)
        for (int i = 0; i < R; ++i) part[i][t] = _mm256_fmadd_ps(wv[i], xv, part[i][t]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m256 sv = _mm256_set1_ps(s.scale[i0 + i][b0 / 32]);
      for (int t = 0; t < MT; ++t) acc[i][t] = _mm256_fmadd_ps(part[i][t], sv, acc[i][t]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < MT; ++t) _mm256_store_ps(s.acc[i0 + i][t0 + t], acc[i][t]);
}

// Every row of an FP4 panel against MT <= 3 token rows.
template <int MT>
void NarrowGroup(Scratch& s, int rows, const float* x, int64_t ldx, int cols, int t0) {
  int i = 0;
  for (; i + 2 <= rows; i += 2) NarrowBlocks<2, MT>(s, i, x, ldx, cols, t0);
  if (i < rows) NarrowBlocks<1, MT>(s, i, x, ldx, cols, t0);
}

// Every row of the panel against MT token rows.
template <int MT>
void Group(Scratch& s, int rows, const float* x, int64_t ldx, int cols, int block, int t0) {
  if (block == 32) {  // FP4: 3 tokens at a time
    constexpr int kFirst = MT < 3 ? MT : 3;
    NarrowGroup<kFirst>(s, rows, x, ldx, cols, t0);
    if constexpr (MT > 3) NarrowGroup<MT - 3>(s, rows, x + 3 * ldx, ldx, cols, t0 + 3);
    return;
  }
  int i = 0;
  for (; i + 2 <= rows; i += 2) Block<2, MT>(s, i, x, ldx, cols, block, t0);
  if (i < rows) Block<1, MT>(s, i, x, ldx, cols, block, t0);
}

}  // namespace

void PanelRows(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t m, float* y,
               int64_t ldy, int64_t y_offset) {
  Scratch s;
  const int rows = static_cast<int>(r1 - r0);
  const int block = BlockCols(w);
  const int64_t k = w.cols;
  for (int64_t t0 = 0; t0 < m; t0 += kChunkTokens) {
    const int tc = static_cast<int>(std::min<int64_t>(kChunkTokens, m - t0));
    for (int i = 0; i < rows; ++i)
      for (int t = 0; t < tc; ++t) _mm256_store_ps(s.acc[i][t], _mm256_setzero_ps());
    for (int64_t c0 = 0; c0 < k; c0 += kPanelCols) {
      // k is a multiple of the block width (FusedGemvApplies), so panels hold whole blocks.
      const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, k - c0));
      DecodePanel(w, r0, rows, c0, cols, s);
      PrefetchNextPanel(w, r0, rows, c0, cols);
      for (int g = 0; g < tc; g += kGroupTokens) {
        const float* xg = x + (t0 + g) * k + c0;
        // A switch, not a table of Group<MT> pointers: the table measured ~8 % slower (bf16,
        // 64 tokens), presumably as the calls are no longer inlined.
        switch (std::min(kGroupTokens, tc - g)) {
          case 1:
            Group<1>(s, rows, xg, k, cols, block, g);
            break;
          case 2:
            Group<2>(s, rows, xg, k, cols, block, g);
            break;
          case 3:
            Group<3>(s, rows, xg, k, cols, block, g);
            break;
          case 4:
            Group<4>(s, rows, xg, k, cols, block, g);
            break;
          case 5:
            Group<5>(s, rows, xg, k, cols, block, g);
            break;
          default:
            Group<6>(s, rows, xg, k, cols, block, g);
            break;
        }
      }
    }
    for (int t = 0; t < tc; ++t)
      for (int i = 0; i < rows; ++i)
        y[(t0 + t) * ldy + y_offset + i] = HorizontalSum(_mm256_load_ps(s.acc[i][t]));
  }
}

}  // namespace dsinfer::backend::cpu::fused

#endif
