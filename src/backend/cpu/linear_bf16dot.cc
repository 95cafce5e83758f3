#include "backend/cpu/linear_bf16dot.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/linear_amx_internal.h"  // kFp4Table: bf16 bits of the e2m1 codes
#include "core/dtype.h"
#include "core/prefetch.h"
#include "core/status.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSINFER_BF16DOT_COMPILED 1
// Compiled for AVX-512 BF16 whatever the build's -march, called only after Available().
#define DSINFER_BF16DOT_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace dsinfer::backend::cpu::bf16dot {

using model::WeightFormat;
using model::WeightMatrix;

namespace {

constexpr int kBlockCols = 128;  // columns per scale block: 4 vectors of 32 bf16
constexpr int kVecWords = 32;    // bf16 per vector
constexpr int kRowTile = 16;     // rows per task unit: a tile's weights stay in L2 across passes
constexpr int kMaxTokens = 16;   // tokens per pass over a row tile (16 accumulators)
constexpr int kChunkBlocks = 8;  // blocks per column chunk (a multiple of 4), see DotTile
// Up to this many tokens a row tile streams whole rows (no column chunks; weights prefetched into
// L2 four row steps ahead, which the L1 prefetcher follows): the tokens' activations stay in L1
// anyway (4 x 8 KiB at 4096 columns). Was 2: at 3 tokens the column chunks' row segments, 16 rows
// apart, ran bf16 at 58-74 % of the read probe, FP8 at 51-60 %, FP4 at 27-32 %; streamed, 98 %,
// 64-69 % and 49-57 % (linear_bench --mib 512, Zen 4 VM, docs/PERF.md "Verify steps: 3-4 tokens
// stream whole rows"); at 4 tokens bf16 66-71 % -> 86-93 %, FP8 / FP4 unchanged within noise.
constexpr int kStreamMaxTokens = 4;
// The many-token kernel (see ManyTokenTile).
constexpr int kGroupTokens = 6;       // tokens per register block
constexpr int kGroupChunkBlocks = 8;  // blocks per column chunk of a token group
// From how many tokens it beats the passes: GMAC/s on Zen 4, two threads, a 16384 x 4096 matrix
// streamed from DRAM, passes -> this kernel (docs/PERF.md):
//   bf16  8: -12 %, 12: +5-15 %, 16: +7 %, 24: +12 %, 32: +15 %;
//   FP8  16: -14 %, 20: -3 %, 24: +0-3 %, 32: +1-3 %, 36 and 40 (8192 rows): +13-14 %;
//   FP4  16: -10 %, 24: -1 %, 32: 0 %, 48: +7 %, 64: +8.5 %.
// With the next tile's prefetches spread through the tile (PrefetchSpread), FP8 gained at 20 and
// 24 tokens (linear_bench --mib 512, 4096 x 4096 and 32768 x 1024, two rounds): 16: -9 to -11 %,
// 20: +0-4 %, 24: +5-8 %; FP4 16: -3 to -5 %, 32: +0-3 %.
constexpr int64_t kManyTokensMinBf16 = 12;
constexpr int64_t kManyTokensMinFp8 = 20;
constexpr int64_t kManyTokensMinFp4 = 40;
// The many-token kernel's token block: the bf16 activations every row tile reads (docs/PERF.md,
// "Prefill op by op; activations in token blocks"). 8 MiB: on the Zen 4 VM (32 MiB L3) 8 MiB of
// activations ran at full speed in one block and 16 MiB at two thirds of it; blocks of 4 MiB lost
// ~9 % where 8 MiB would have fit (the weights are read, and converted, once per block).
constexpr int64_t kActivationBlockBytes = int64_t{8} << 20;

// Position 32 j + p of block b (vector j, word p) holds column 128 b + BlockColumn(f, j, p): the
// order the conversions below produce, so the activations are permuted once per call instead of
// the weights once per row.
//   FP4: a 64-byte load holds the block; vector j is nibble j of each 16-bit word (word p holds
//        columns 4 p .. 4 p + 3).
//   FP8: two 64-byte loads (halves h); vectors 2 h and 2 h + 1 are the low and high bytes of the
//        words of half h.
//   BF16: natural order.
constexpr int BlockColumn(WeightFormat f, int j, int p) {
  switch (f) {
    case WeightFormat::kFp4Packed:
      return 4 * p + j;
    case WeightFormat::kFp8Block:
      return 64 * (j / 2) + 2 * p + j % 2;
    default:
      return kVecWords * j + p;
  }
}

// BlockColumn as a table: position q = 32 j + p of a block -> its column in the block.
using BlockOrder = std::array<uint8_t, kBlockCols>;
constexpr BlockOrder MakeBlockOrder(WeightFormat f) {
  BlockOrder order{};
  for (int q = 0; q < kBlockCols; ++q)
    order[q] = static_cast<uint8_t>(BlockColumn(f, q / kVecWords, q % kVecWords));
  return order;
}
constexpr BlockOrder kFp4Order = MakeBlockOrder(WeightFormat::kFp4Packed);
constexpr BlockOrder kFp8Order = MakeBlockOrder(WeightFormat::kFp8Block);

// A BlockOrder as word permutes of a block's 4 vectors of 32 bf16 (natural order in): word p of
// output vector k is word index[k][p] of the low pair of vectors (columns 0..63) or of the high
// pair (64..127), as bit p of high[k] says.
struct BlockPermute {
  alignas(64) std::array<std::array<uint16_t, 32>, 4> index;
  std::array<uint32_t, 4> high;
};
constexpr BlockPermute MakeBlockPermute(const BlockOrder& order) {
  BlockPermute bp{};
  for (int k = 0; k < 4; ++k)
    for (int p = 0; p < 32; ++p) {
      const int c = order[32 * k + p];
      bp.index[k][p] = static_cast<uint16_t>(c % 64);
      if (c >= 64) bp.high[k] |= uint32_t{1} << p;
    }
  return bp;
}
constexpr BlockPermute kFp4Permute = MakeBlockPermute(kFp4Order);
constexpr BlockPermute kFp8Permute = MakeBlockPermute(kFp8Order);

#ifdef DSINFER_BF16DOT_COMPILED
bool ProbeBf16Dot() {
  const char* env = std::getenv("DSINFER_CPU_BF16DOT");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return false;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  const bool avx512_bf16 = a & (1u << 5);
  if (!(fma && osxsave && avx512f && avx512dq && avx512bw && avx512vl && avx512_bf16)) return false;
  // The OS must save the AVX-512 state (XCR0 bits 1, 2, 5, 6, 7).
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  constexpr uint32_t kAvx512State = 0xe6;
  return (xcr0_lo & kAvx512State) == kAvx512State;
}

// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which trips
// -Wmaybe-uninitialized when they are inlined into a target("avx512f") function (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// bf16 bits of m * 2^-9, the value of the subnormal e4m3 code with mantissa m (m = 0..7; the
// rest unused).
alignas(64) constexpr std::array<uint16_t, 32> kFp8SubnormalBf16 = [] {
  std::array<uint16_t, 32> t{};
  for (int m = 0; m < 8; ++m) t[m] = amx::internal::E4M3MagnitudeBf16(m);
  return t;
}();

// e4m3 codes in the high bytes of the words of `high` (low bytes zero), and the same codes in the
// low 5 bits of `index`'s words -> bf16 of their exact values. Normal codes: the exponent and
// mantissa move into place and the exponent is rebiased (7 -> 127); subnormal codes and zeros
// (exponent bits 0) come from kFp8SubnormalBf16 by their mantissa; then the sign.
DSINFER_BF16DOT_TARGET inline __m512i Fp8HighBytesToBf16(__m512i high, __m512i index,
                                                         __m512i subnormal_table) {
  const __m512i moved = _mm512_and_si512(_mm512_srli_epi16(high, 4), _mm512_set1_epi16(0x07f0));
  __m512i bf = _mm512_add_epi16(moved, _mm512_set1_epi16(120 << 7));
  const __mmask32 low = _mm512_testn_epi16_mask(high, _mm512_set1_epi16(0x7800));
  bf = _mm512_mask_permutexvar_epi16(bf, low, index, subnormal_table);
  // bf | (high & 0x8000)
  return _mm512_ternarylogic_epi32(bf, high, _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xf8);
}

// Block b of one weight row as 4 bf16 vectors in BlockColumn order, unscaled.
template <WeightFormat F>
DSINFER_BF16DOT_TARGET __attribute__((always_inline)) inline void ConvertBlock(const uint8_t* row,
                                                                               int64_t b,
                                                                               __m512i (&v)[4]) {
  if constexpr (F == WeightFormat::kFp4Packed) {
    const __m512i table = _mm512_load_si512(amx::internal::kFp4Table.data());
    // The word permute reads each word's low 5 bits: nibble j and the next nibble's low bit,
    // which the duplicated table ignores.
    const __m512i z = _mm512_loadu_si512(row + b * (kBlockCols / 2));
    v[0] = _mm512_permutexvar_epi16(z, table);
    v[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(z, 4), table);
    v[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(z, 8), table);
    v[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(z, 12), table);
  } else if constexpr (F == WeightFormat::kFp8Block) {
    const __m512i table = _mm512_load_si512(kFp8SubnormalBf16.data());
    for (int h = 0; h < 2; ++h) {
      const __m512i z = _mm512_loadu_si512(row + b * kBlockCols + 64 * h);
      v[2 * h] = Fp8HighBytesToBf16(_mm512_slli_epi16(z, 8), z, table);
      v[2 * h + 1] =
          Fp8HighBytesToBf16(_mm512_and_si512(z, _mm512_set1_epi16(static_cast<int16_t>(0xff00))),
                             _mm512_srli_epi16(z, 8), table);
    }
  } else {
    for (int j = 0; j < 4; ++j) v[j] = _mm512_loadu_si512(row + b * kBlockCols * 2 + 64 * j);
  }
}

// The fp32 values of the n <= 16 e8m0 codes at `codes` (lanes [n, 16) unused, nothing past n
// read): 2^(code - 127), 2^-127 (subnormal) for code 0, NaN for 255 (as E8M0ToF32).
DSINFER_BF16DOT_TARGET inline __m512 E8m0Values(const uint8_t* codes, int n) {
  const __m512i c =
      _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), codes));
  __m512i bits = _mm512_slli_epi32(c, 23);
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()),
                               _mm512_set1_epi32(0x00400000));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(255)),
                               _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(bits);
}

// kFp4LaneChunk[i]: lane d of a block's scale vector is chunk 4 i + d / 4 of a group of 4 blocks
// (dword d of every vector of an FP4 block holds columns of chunk d / 4, see BlockColumn).
alignas(64) constexpr std::array<std::array<int32_t, 16>, 4> kFp4LaneChunk = [] {
  std::array<std::array<int32_t, 16>, 4> idx{};
  for (int i = 0; i < 4; ++i)
    for (int d = 0; d < 16; ++d) idx[i][d] = 4 * i + d / 4;
  return idx;
}();

// The running sums of one row tile for one token group, kept between column chunks: [row in
// tile][token in group] fp32 x 16 lanes. Storing and reloading them is exact, so chunking the
// columns does not change the instruction sequence of any output.
struct TileSums {
  alignas(64) float lanes[kRowTile][kMaxTokens][16];
};

// Blocks [b0, b1) of R weight rows from r (tile_row: r's index in its tile) against the T
// tokens t0 .. t0 + T - 1 of the group (xb: block b of token t at xb + b x_block + 128 t, bf16 in
// BlockColumn order), adding into sums. The first token pass (t0 = 0) prefetches the weights.
// b0 is a multiple of 4 (the FP4 scales are read 4 blocks at a time).
// Summation: bf16 weights (unscaled) add every product into one running sum per output, in
// column order; block-scaled weights sum each block from +0 and add it times its scale with an
// FMA. Either way the sequence of one output does not depend on R, T, t0 or the chunking.
template <WeightFormat F, int R, int T>
DSINFER_BF16DOT_TARGET void DotRows(const WeightMatrix& w, int64_t r, int tile_row, int64_t b0,
                                    int64_t b1, const uint16_t* xb, int64_t x_block, int t0,
                                    TileSums& sums) {
  const int64_t row_bytes = F == WeightFormat::kFp4Packed  ? w.cols / 2
                            : F == WeightFormat::kFp8Block ? w.cols
                                                           : w.cols * 2;
  constexpr int kBlockBytes = F == WeightFormat::kFp4Packed  ? kBlockCols / 2
                              : F == WeightFormat::kFp8Block ? kBlockCols
                                                             : kBlockCols * 2;
  // Weights are prefetched kPrefetchRowSteps row steps ahead (measured on Zen 4, docs/PERF.md).
  // With column chunks (T > kStreamMaxTokens) each row is read in 0.5-2 KiB segments 16 rows
  // apart, which the hardware prefetcher does not follow: into L1, +30-50 % at 8 tokens (into L2
  // only: slower). Up to kStreamMaxTokens tokens whole rows stream: into L2 only, four row steps
  // ahead, which the L1 prefetcher then follows (FP4 at one token +50 % against L1 prefetches,
  // +100 % against none; bf16 +20 %, where L1 prefetches lost 5-15 %).
  constexpr int kPrefetchRowSteps = T > kStreamMaxTokens ? 2 : 4;
  // The loops over rows and tokens are unrolled in full (the pragmas) so that acc stays in
  // registers: at 16 tokens GCC otherwise kept it in memory, 2x slower.
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_load_ps(sums.lanes[tile_row + i][t0 + t]);
  for (int64_t g = b0; g < b1; g += 4) {
    const int64_t g_end = std::min(b1, g + 4);
    __m512 chunk_scales[R];  // FP4: the 16 chunks of blocks g .. g + 3 (lane = chunk)
    if constexpr (F == WeightFormat::kFp4Packed)
      for (int i = 0; i < R; ++i)
        chunk_scales[i] = E8m0Values(w.scales + (r + i) * w.scale_cols + 4 * g,
                                     static_cast<int>(4 * (g_end - g)));
    for (int64_t b = g; b < g_end; ++b) {
      // The same block kPrefetchRowSteps row steps on: the weights a later DotRows call of this
      // chunk reads (past the tile's end the next tile's rows; never past the matrix).
      for (int i = 0; i < R && t0 == 0; ++i) {
        const int64_t ahead_row = std::min(w.rows - 1, r + i + kPrefetchRowSteps * R);
        const uint8_t* ahead = w.data + ahead_row * row_bytes + b * kBlockBytes;
        for (int line = 0; line < kBlockBytes; line += 64) {
          const char* p = reinterpret_cast<const char*>(ahead + line);
          if constexpr (T > kStreamMaxTokens)
            PrefetchToL1(p);
          else
            PrefetchToL2(p);
        }
      }
      if constexpr (F == WeightFormat::kBF16) {
        // R rows side by side: each activation vector is loaded once for all of them (the empty
        // asm keeps GCC from folding the load into every row's instruction as a memory operand,
        // which loads it R times; the loads, not the dot products, bounded the one-row loop).
        __m512i v[R][4];
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i) ConvertBlock<F>(w.data + (r + i) * row_bytes, b, v[i]);
        const uint16_t* xblock = xb + b * x_block + t0 * kBlockCols;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            __m512i xv = _mm512_loadu_si512(xblock + t * kBlockCols + j * kVecWords);
            __asm__("" : "+v"(xv));
#pragma GCC unroll 16
            for (int i = 0; i < R; ++i)
              acc[i][t] = _mm512_dpbf16_ps(acc[i][t], reinterpret_cast<__m512bh>(v[i][j]),
                                           reinterpret_cast<__m512bh>(xv));
          }
      } else {
        for (int i = 0; i < R; ++i) {
          __m512i v[4];
          ConvertBlock<F>(w.data + (r + i) * row_bytes, b, v);
          __m512 scale;
          if constexpr (F == WeightFormat::kFp4Packed)
            scale = _mm512_permutexvar_ps(_mm512_load_si512(kFp4LaneChunk[b - g].data()),
                                          chunk_scales[i]);
          else if constexpr (F == WeightFormat::kFp8Block)
            scale = _mm512_set1_ps(w.Scale(r + i, b * kBlockCols));
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            // One pointer per block and a constant offset per token (with a pointer per token,
            // 16 of them did not fit the general registers: GCC spilled them, 2x slower).
            const uint16_t* xt = xb + b * x_block + (t0 + t) * kBlockCols;
            __m512 part = _mm512_setzero_ps();
#pragma GCC unroll 16
            for (int j = 0; j < 4; ++j)
              part = _mm512_dpbf16_ps(
                  part, reinterpret_cast<__m512bh>(v[j]),
                  reinterpret_cast<__m512bh>(_mm512_loadu_si512(xt + j * kVecWords)));
            acc[i][t] = _mm512_fmadd_ps(part, scale, acc[i][t]);
          }
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) _mm512_store_ps(sums.lanes[tile_row + i][t0 + t], acc[i][t]);
}

// Rows [r0, r1) of one tile (at most kRowTile) against T tokens: y[tokens[t] * ldy + (r - r0)].
// Columns go in chunks of kChunkBlocks blocks (half as many past 8 tokens) so that the group's
// activations for a chunk (16 KiB at T = 8 and at T = 16) stay in L1 while every row of the tile
// passes over them: read from L2 once per row, they cost more than the dot products (measured on
// Zen 4). R rows at a time when there are few tokens, so a few independent chains are in flight.
template <WeightFormat F, int T>
DSINFER_BF16DOT_TARGET void DotTile(const WeightMatrix& w, int64_t r0, int64_t r1,
                                    const uint16_t* xb, int64_t x_block, const int64_t* tokens,
                                    float* y, int64_t ldy) {
  // bf16 weights (no block sums to keep) take R = 2 rows at 3+ tokens, in passes of at most 8
  // tokens (2 x 8 running sums and the block's 8 weight vectors fit the 32 registers): half the
  // activation loads of one row x 16 tokens. Measured on Zen 4 (docs/PERF.md): in cache +23 %,
  // +28 %, +11 % at 4, 8, 16 tokens; from DRAM on two threads +5-8 %. The same R = 2 for FP8 /
  // FP4 (block sums in registers too) measured slower at 16 tokens and was not kept.
  constexpr bool kBf16 = F == WeightFormat::kBF16;
  constexpr int R = T > 1 ? (kBf16 && T > 2 ? 2 : 1) : kBf16 ? 4 : 2;
  constexpr int kPass = kBf16 && T > 8 ? 8 : T;  // tokens of the first pass
  constexpr int kRest = T - kPass;               // tokens of the second pass (bf16 past 8)
  const int64_t blocks = w.cols / kBlockCols;
  // A few tokens' activations stay in L1 anyway; there whole rows stream start to end, which
  // the hardware prefetcher follows from DotRows' L2 prefetches (16 interleaved row segments
  // measured slower from DRAM).
  const int64_t chunk_blocks =
      T <= kStreamMaxTokens ? blocks : T <= 8 ? kChunkBlocks : kChunkBlocks / 2;
  const int n_rows = static_cast<int>(r1 - r0);
  TileSums sums;
  for (int i = 0; i < n_rows; ++i)
    for (int t = 0; t < T; ++t) _mm512_store_ps(sums.lanes[i][t], _mm512_setzero_ps());
  for (int64_t b0 = 0; b0 < blocks; b0 += chunk_blocks) {
    const int64_t b1 = std::min(blocks, b0 + chunk_blocks);
    int i = 0;
    for (; i + R <= n_rows; i += R) {
      DotRows<F, R, kPass>(w, r0 + i, i, b0, b1, xb, x_block, 0, sums);
      if constexpr (kRest > 0) DotRows<F, R, kRest>(w, r0 + i, i, b0, b1, xb, x_block, kPass, sums);
    }
    for (; i < n_rows; ++i) {
      DotRows<F, 1, kPass>(w, r0 + i, i, b0, b1, xb, x_block, 0, sums);
      if constexpr (kRest > 0) DotRows<F, 1, kRest>(w, r0 + i, i, b0, b1, xb, x_block, kPass, sums);
    }
  }
  for (int i = 0; i < n_rows; ++i)
    for (int t = 0; t < T; ++t)
      y[tokens[t] * ldy + i] = _mm512_reduce_add_ps(_mm512_load_ps(sums.lanes[i][t]));
}

// DotTile<F, n> for n = 1 .. kMaxTokens, indexed by n - 1.
template <WeightFormat F, size_t... I>
constexpr auto DotTileTable(std::index_sequence<I...>) {
  return std::array{&DotTile<F, static_cast<int>(I) + 1>...};
}

template <WeightFormat F>
void DotTokens(const WeightMatrix& w, int64_t r0, int64_t r1, const uint16_t* xb, int64_t x_block,
               const int64_t* tokens, int n, float* y, int64_t ldy) {
  static constexpr auto kTiles = DotTileTable<F>(std::make_index_sequence<kMaxTokens>{});
  kTiles[n - 1](w, r0, r1, xb, x_block, tokens, y, ldy);
}

// Many tokens (prefill, large decode batches). The passes above convert every FP8 / FP4 weight
// again for each 16 tokens, and their one or two weight rows against up to 16 tokens load each
// activation vector for one or two dot products. Here token groups of kGroupTokens pass over a
// row tile in register blocks of R rows x kGroupTokens tokens (FP8 / FP4: R = 2, their block
// sums also take registers; bf16: R = 4), so each weight vector serves 6 dot products and each
// activation vector R. An FP8 / FP4 tile is converted once, into a bf16 buffer that stays in L2
// for all groups; bf16 rows are read in place. Every output keeps the passes' instruction
// sequence (FP8 / FP4: per block a sum from +0 of four VDPBF16PS in BlockColumn order, then
// acc = fma(sum, block or lane scales, acc); bf16: one running sum over the columns in order;
// one horizontal sum at the end), so results are bit-identical to the passes for any batch.
class ConvertedTile {
 public:
  // Makes room for rows of `blocks` blocks; grows only, so a thread's tile is allocated once.
  void Reserve(int64_t blocks) {
    blocks_ = blocks;
    const size_t words = static_cast<size_t>(kRowTile * blocks * kBlockCols + 32);
    if (words > capacity_) {
      storage_ = std::make_unique_for_overwrite<uint16_t[]>(words);
      capacity_ = words;
      const uintptr_t misalign = reinterpret_cast<uintptr_t>(storage_.get()) % 64;
      words_ = storage_.get() + (64 - misalign) % 64 / 2;  // 64-byte aligned vector loads
    }
    scales_.resize(kRowTile * blocks * 16);
  }
  // Row i: blocks() x 128 bf16 in BlockColumn order, like a bf16 matrix row.
  uint16_t* Row(int i) { return words_ + i * blocks_ * kBlockCols; }
  const uint8_t* rows() const { return reinterpret_cast<const uint8_t*>(words_); }
  float* BlockScales(int i, int64_t b) { return scales_.data() + (i * blocks_ + b) * 16; }
  const float* scales() const { return scales_.data(); }
  int64_t blocks() const { return blocks_; }

 private:
  int64_t blocks_ = 0;
  std::unique_ptr<uint16_t[]> storage_;  // [kRowTile, blocks, 128] bf16 (+ alignment slack)
  size_t capacity_ = 0;                  // words in storage_
  uint16_t* words_ = nullptr;
  std::vector<float> scales_;  // [kRowTile, blocks, 16] each block's scale per lane
};

// The calling thread's tile, kept between calls: scratch whose contents mean nothing outside one
// ManyTokenTile call, so no state is shared. Allocated per call instead, its 160 KiB came back
// from the OS each time: ~44 page faults a call, which cost more than the kernel at 16 tokens
// on a 64-row matrix (perf stat, docs/PERF.md).
ConvertedTile& ThreadTile(int64_t blocks) {
  thread_local ConvertedTile tile;
  tile.Reserve(blocks);
  return tile;
}

// The weights a token group reads: tile row i, block b at byte rows + (i blocks + b) 256 (128
// bf16 in BlockColumn order), its scale per lane at scales + (i blocks + b) 16 (FP8: the block's
// scale in every lane; FP4: lane d's chunk's, see kFp4LaneChunk; bf16 weights have none).
struct GroupWeights {
  const uint8_t* rows;
  const float* scales;
  int64_t blocks;
};

// The running sums of one token group against a row tile: [row in tile][token in group] fp32 x 16
// lanes, kept between column chunks (storing them is exact).
struct GroupSums {
  alignas(64) float lanes[kRowTile][kGroupTokens][16];
};

// The next tile's weights, prefetched into L2 a few lines per block step while this tile's dot
// products run, so that the fetch and the arithmetic overlap. Issued in bursts (a slice per token
// group), the prefetches filled the miss buffers and stalled the core for the length of each
// burst, and the DRAM then sat idle through the arithmetic that followed: spread out, the bf16
// head at 16 tokens streams 16-17 GB/s instead of 14 (two threads, docs/PERF.md). Into L2
// (T1), not L1: T0 measured ~10 % slower.
struct PrefetchSpread {
  const char* next = nullptr;  // the next line to prefetch
  const char* end = nullptr;   // one past the last
  int per_step = 0;            // lines per block step, in 1/256ths
  int credit = 0;              // 1/256ths of a line not yet issued

  void Step() {
    credit += per_step;
    for (; credit >= 256 && next < end; credit -= 256, next += 64) PrefetchToL2(next);
  }
  void Finish() {
    for (; next < end; next += 64) PrefetchToL2(next);
  }
};

// Weight rows per GroupBlocks call in GroupTile (its register blocks): FP8 / FP4 (scaled) two,
// bf16 four. ManyTokenTile counts GroupBlocks' block steps with it.
constexpr int GroupRowBlock(bool scaled) { return scaled ? 2 : 4; }

// Rows [r0, r0 + rows) of an FP8 or FP4 matrix into tile: DotRows' conversions and scales.
template <WeightFormat F>
DSINFER_BF16DOT_TARGET void ConvertTile(const WeightMatrix& w, int64_t r0, int rows,
                                        ConvertedTile& tile) {
  const int64_t row_bytes = w.RowBytes();
  for (int i = 0; i < rows; ++i)
    for (int64_t g = 0; g < tile.blocks(); g += 4) {
      const int64_t g_end = std::min(tile.blocks(), g + 4);
      __m512 chunk_scales;  // FP4: the 16 chunks of blocks g .. g + 3 (lane = chunk)
      if constexpr (F == WeightFormat::kFp4Packed)
        chunk_scales = E8m0Values(w.scales + (r0 + i) * w.scale_cols + 4 * g,
                                  static_cast<int>(4 * (g_end - g)));
      for (int64_t b = g; b < g_end; ++b) {
        __m512i v[4];
        ConvertBlock<F>(w.data + (r0 + i) * row_bytes, b, v);
        for (int j = 0; j < 4; ++j)
          _mm512_store_si512(tile.Row(i) + b * kBlockCols + j * kVecWords, v[j]);
        __m512 scale;
        if constexpr (F == WeightFormat::kFp4Packed)
          scale =
              _mm512_permutexvar_ps(_mm512_load_si512(kFp4LaneChunk[b - g].data()), chunk_scales);
        else
          scale = _mm512_set1_ps(w.Scale(r0 + i, b * kBlockCols));
        _mm512_storeu_ps(tile.BlockScales(i, b), scale);
      }
    }
}

// Tile rows [i0, i0 + R) x the group's first T tokens over blocks [b0, b1), adding into sums.
// xg: block b of the group's token t at xg + (b kGroupTokens + t) 128. kScaled: FP8 / FP4 (block
// sums times their block or lane scales) or bf16 (one running sum).
template <bool kScaled, int R, int T>
DSINFER_BF16DOT_TARGET void GroupBlocks(const GroupWeights& gw, int i0, int64_t b0, int64_t b1,
                                        const uint16_t* xg, GroupSums& sums,
                                        PrefetchSpread& prefetch) {
  // FP8 / FP4: 2 x 6 running sums, 2 x 6 block sums, 2 weight vectors and one activation vector;
  // bf16: 4 x 6 running sums, 4 weight vectors, one activation vector. 27 / 29 of the 32
  // registers (the pragmas unroll in full so that GCC keeps them there).
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_load_ps(sums.lanes[i0 + i][t]);
  for (int64_t b = b0; b < b1; ++b) {
    prefetch.Step();
    __m512 part[R][T];
    if constexpr (kScaled) {
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) part[i][t] = _mm512_setzero_ps();
    }
    __m512(&sum)[R][T] = kScaled ? part : acc;  // where this block's products go
    const uint16_t* xblock = xg + b * kGroupTokens * kBlockCols;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i wv[R];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i)
        wv[i] = _mm512_loadu_si512(gw.rows + ((i0 + i) * gw.blocks + b) * kBlockCols * 2 + 64 * j);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512i xv = _mm512_load_si512(xblock + t * kBlockCols + j * kVecWords);
        __asm__("" : "+v"(xv));  // one load for all R rows (see DotRows)
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i)
          sum[i][t] = _mm512_dpbf16_ps(sum[i][t], reinterpret_cast<__m512bh>(wv[i]),
                                       reinterpret_cast<__m512bh>(xv));
      }
    }
    if constexpr (kScaled) {
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m512 scale = _mm512_loadu_ps(gw.scales + ((i0 + i) * gw.blocks + b) * 16);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[i][t] = _mm512_fmadd_ps(part[i][t], scale, acc[i][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) _mm512_store_ps(sums.lanes[i0 + i][t], acc[i][t]);
}

// Every row of the tile against the group's first T tokens. The columns go in chunks so that the
// chunk's activations (12 KiB) stay in L1 while every row block passes over them; the weights
// come from L2 once per group.
template <bool kScaled, int T>
DSINFER_BF16DOT_TARGET void GroupTile(const GroupWeights& gw, int rows, const uint16_t* xg,
                                      GroupSums& sums, PrefetchSpread& prefetch) {
  constexpr int R = GroupRowBlock(kScaled);
  for (int64_t b0 = 0; b0 < gw.blocks; b0 += kGroupChunkBlocks) {
    const int64_t b1 = std::min(gw.blocks, b0 + kGroupChunkBlocks);
    int i = 0;
    for (; i + R <= rows; i += R) GroupBlocks<kScaled, R, T>(gw, i, b0, b1, xg, sums, prefetch);
    for (; i < rows; ++i) GroupBlocks<kScaled, 1, T>(gw, i, b0, b1, xg, sums, prefetch);
  }
}

// GroupTile<kScaled, n>. A switch, not a table of GroupTile pointers like DotTokens': the table
// measured 3-5 % slower (bf16, 64 tokens, in cache), presumably as GroupTile is then not inlined.
template <bool kScaled>
DSINFER_BF16DOT_TARGET void GroupTileTokens(const GroupWeights& gw, int rows, int n,
                                            const uint16_t* xg, GroupSums& sums,
                                            PrefetchSpread& prefetch) {
  static_assert(kGroupTokens == 6, "the cases below");
  switch (n) {
    case 1:
      GroupTile<kScaled, 1>(gw, rows, xg, sums, prefetch);
      break;
    case 2:
      GroupTile<kScaled, 2>(gw, rows, xg, sums, prefetch);
      break;
    case 3:
      GroupTile<kScaled, 3>(gw, rows, xg, sums, prefetch);
      break;
    case 4:
      GroupTile<kScaled, 4>(gw, rows, xg, sums, prefetch);
      break;
    case 5:
      GroupTile<kScaled, 5>(gw, rows, xg, sums, prefetch);
      break;
    default:
      GroupTile<kScaled, 6>(gw, rows, xg, sums, prefetch);
      break;
  }
}

// Rows [r0, r1) of one tile (at most kRowTile) of an FP8, FP4 or bf16 matrix against all n_tok
// tokens, packed in groups (xb: group g at xb + g x_group, see GroupBlocks):
// y[tokens[t] * ldy + (r - r0)]. next_r0 .. next_r1: the rows this thread reads next (none when
// equal), whose codes are prefetched into L2 while this tile's dot products run (PrefetchSpread)
// so that the next tile does not start by waiting on DRAM. tile: scratch for the FP8 / FP4
// conversion.
DSINFER_BF16DOT_TARGET void ManyTokenTile(const WeightMatrix& w, int64_t r0, int64_t r1,
                                          int64_t next_r0, int64_t next_r1, const uint16_t* xb,
                                          int64_t x_group, int64_t n_tok, const int64_t* tokens,
                                          float* y, int64_t ldy, ConvertedTile& tile) {
  const int rows = static_cast<int>(r1 - r0);
  const bool scaled = w.format != WeightFormat::kBF16;
  const int64_t row_bytes = w.RowBytes();
  GroupWeights gw{w.data + r0 * row_bytes, nullptr, w.cols / kBlockCols};
  if (scaled) {
    if (w.format == WeightFormat::kFp4Packed)
      ConvertTile<WeightFormat::kFp4Packed>(w, r0, rows, tile);
    else
      ConvertTile<WeightFormat::kFp8Block>(w, r0, rows, tile);
    gw.rows = tile.rows(), gw.scales = tile.scales();
  }
  const int64_t groups = (n_tok + kGroupTokens - 1) / kGroupTokens;
  const int64_t next_lines = (next_r1 - next_r0) * row_bytes / 64;
  const int row_block = GroupRowBlock(scaled);
  const int64_t steps =
      groups * (rows / row_block + rows % row_block) * gw.blocks;  // GroupBlocks' block steps
  PrefetchSpread prefetch;
  prefetch.next = reinterpret_cast<const char*>(w.data + next_r0 * row_bytes);
  prefetch.end = prefetch.next + 64 * next_lines;
  // An even share: spreading over 4/5 of the tile (a quarter more a step) or prefetching two
  // tiles ahead measured the same within the noise (bf16, 16 tokens, from DRAM).
  prefetch.per_step =
      static_cast<int>((next_lines * 256 + steps - 1) / std::max<int64_t>(steps, 1));
  GroupSums sums;
  for (int64_t g = 0; g < groups; ++g) {
    for (int i = 0; i < rows; ++i)
      for (int t = 0; t < kGroupTokens; ++t) _mm512_store_ps(sums.lanes[i][t], _mm512_setzero_ps());
    const uint16_t* xg = xb + g * x_group;
    const int n = static_cast<int>(std::min<int64_t>(kGroupTokens, n_tok - g * kGroupTokens));
    if (scaled)
      GroupTileTokens<true>(gw, rows, n, xg, sums, prefetch);
    else
      GroupTileTokens<false>(gw, rows, n, xg, sums, prefetch);
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < rows; ++i)
        y[tokens[g * kGroupTokens + t] * ldy + i] =
            _mm512_reduce_add_ps(_mm512_load_ps(sums.lanes[i][t]));
  }
  prefetch.Finish();
}

// One token's 128 columns x (bf16-exact fp32) as bf16 in the block order of `permute` (natural
// order when null) at dst. VCVTNE2PS2BF16 rounds, which leaves bf16-exact values unchanged.
DSINFER_BF16DOT_TARGET void PackActivationBlock(const float* x, const BlockPermute* permute,
                                                uint16_t* dst) {
  __m512i w[4];  // natural order: columns 32 k .. 32 k + 31
  for (int k = 0; k < 4; ++k)
    w[k] = reinterpret_cast<__m512i>(
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 32 * k + 16), _mm512_loadu_ps(x + 32 * k)));
  for (int k = 0; k < 4; ++k) {
    __m512i out = w[k];
    if (permute != nullptr) {
      const __m512i index = _mm512_load_si512(permute->index[k].data());
      const __m512i lo = _mm512_permutex2var_epi16(w[0], index, w[1]);
      const __m512i hi = _mm512_permutex2var_epi16(w[2], index, w[3]);
      out = _mm512_mask_blend_epi16(permute->high[k], lo, hi);
    }
    _mm512_storeu_si512(dst + 32 * k, out);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // DSINFER_BF16DOT_COMPILED

}  // namespace

bool Available() {
#ifdef DSINFER_BF16DOT_COMPILED
  static const bool available = ProbeBf16Dot();  // a fact about this machine, computed once
  return available;
#else
  return false;
#endif
}

bool Applies(const WeightMatrix& w) {
  if (w.cols % kBlockCols != 0 || w.data == nullptr) return false;
  switch (w.format) {
    case WeightFormat::kBF16:
      return true;
    case WeightFormat::kFp8Block:  // 128x128 blocks only (V4.1's 32x32 ones take the FP32 GEMV)
      return w.scale_dtype == DType::kF8E8M0 && w.block == 128;
    case WeightFormat::kFp4Packed:
      return w.scale_dtype == DType::kF8E8M0;
    default:
      return false;
  }
}

void MatMulRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                std::span<const int64_t> tokens, float* y, int64_t ldy, ThreadPool& pool) {
#ifdef DSINFER_BF16DOT_COMPILED
  DSINFER_CHECK_MSG(Available() && Applies(w), "bf16dot::MatMulRows: no kernel for this matrix");
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (n_tok == 0 || row_end <= row_begin) return;
  const int64_t k = w.cols;
  // The activations as bf16 in BlockColumn order (the rows are bf16-exact, so the conversion
  // does not round), in groups of `group` tokens whose blocks sit side by side: xb [group][block]
  // [slot][128], so that a group's tokens sit at constant offsets from one pointer per block.
  // The passes take all tokens as one group; the many-token kernel groups of kGroupTokens.
  const BlockPermute* permute = w.format == WeightFormat::kFp4Packed  ? &kFp4Permute
                                : w.format == WeightFormat::kFp8Block ? &kFp8Permute
                                                                      : nullptr;
  const bool many = (w.format == WeightFormat::kFp8Block && n_tok >= kManyTokensMinFp8) ||
                    (w.format == WeightFormat::kFp4Packed && n_tok >= kManyTokensMinFp4) ||
                    (w.format == WeightFormat::kBF16 && n_tok >= kManyTokensMinBf16);
  const int64_t group = many ? kGroupTokens : n_tok;
  const int64_t x_group = group * k;  // words per group
  // 64-byte aligned: a vector load that straddles two cache lines costs two.
  std::vector<uint16_t> xb_storage((n_tok + group - 1) / group * x_group + 32);
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(xb_storage.data()) % 64;
  uint16_t* const xb = xb_storage.data() + (64 - misalign) % 64 / 2;
  for (int64_t s = 0; s < n_tok; ++s) {
    const float* xr = x + tokens[s] * k;
    uint16_t* dst = xb + s / group * x_group + s % group * kBlockCols;
    for (int64_t c0 = 0; c0 < k; c0 += kBlockCols)
      PackActivationBlock(xr + c0, permute, dst + c0 / kBlockCols * group * kBlockCols);
  }
  const int64_t n_tiles = (row_end - row_begin + kRowTile - 1) / kRowTile;
  if (many) {
    // Tokens in blocks whose activations stay in the last-level cache while every row tile
    // passes over them: each tile reads all of its block's activations, so with all tokens at
    // once a prefill chunk (2048 tokens x 8192 columns: 32 MiB of bf16) came from DRAM once per
    // 16-row tile. Blocks are whole token groups, and a token's sums do not depend on its group
    // or block, so the results are those of one block (the batch-invariance tests).
    // The fewest blocks that hold at most kActivationBlockBytes of the tokens' activations,
    // of equal size in whole groups (a last block of a few tokens would pay a whole pass over
    // the weights and their conversion for them). 512 tokens x 8192 columns: one block.
    const int64_t n_groups = (n_tok + kGroupTokens - 1) / kGroupTokens;
    const int64_t token_bytes = k * int64_t{sizeof(uint16_t)};
    const int64_t n_blocks = std::max<int64_t>(
        1, (n_tok * token_bytes + kActivationBlockBytes - 1) / kActivationBlockBytes);
    const int64_t block_tokens = (n_groups + n_blocks - 1) / n_blocks * kGroupTokens;
    for (int64_t s0 = 0; s0 < n_tok; s0 += block_tokens) {
      const int64_t nb = std::min(block_tokens, n_tok - s0);
      const uint16_t* xblock = xb + s0 / kGroupTokens * x_group;
      pool.ParallelForRange(
          n_tiles,
          [&](int64_t ta, int64_t tb) {
            ConvertedTile& converted =
                ThreadTile(w.format == WeightFormat::kBF16 ? 0 : k / kBlockCols);
            for (int64_t tile = ta; tile < tb; ++tile) {
              const int64_t r0 = row_begin + tile * kRowTile;
              const int64_t r1 = std::min(row_end, r0 + kRowTile);
              const int64_t next_r1 = tile + 1 < tb ? std::min(row_end, r1 + kRowTile) : r1;
              ManyTokenTile(w, r0, r1, r1, next_r1, xblock, x_group, nb, tokens.data() + s0,
                            y + (r0 - row_begin), ldy, converted);
            }
          },
          1);
    }
    return;
  }
  const int64_t x_block = n_tok * kBlockCols;  // one group: block b of slot s at b x_block + 128 s
  pool.ParallelForRange(
      n_tiles,
      [&](int64_t ta, int64_t tb) {
        for (int64_t tile = ta; tile < tb; ++tile) {
          const int64_t r0 = row_begin + tile * kRowTile;
          const int64_t r1 = std::min(row_end, r0 + kRowTile);
          for (int64_t s = 0; s < n_tok; s += kMaxTokens) {
            const int n = static_cast<int>(std::min<int64_t>(kMaxTokens, n_tok - s));
            const uint16_t* xs = xb + s * kBlockCols;
            float* yt = y + (r0 - row_begin);
            switch (w.format) {
              case WeightFormat::kFp4Packed:
                DotTokens<WeightFormat::kFp4Packed>(w, r0, r1, xs, x_block, tokens.data() + s, n,
                                                    yt, ldy);
                break;
              case WeightFormat::kFp8Block:
                DotTokens<WeightFormat::kFp8Block>(w, r0, r1, xs, x_block, tokens.data() + s, n, yt,
                                                   ldy);
                break;
              default:
                DotTokens<WeightFormat::kBF16>(w, r0, r1, xs, x_block, tokens.data() + s, n, yt,
                                               ldy);
                break;
            }
          }
        }
      },
      1);
#else
  (void)w, (void)row_begin, (void)row_end, (void)x, (void)tokens, (void)y, (void)ldy, (void)pool;
  DSINFER_CHECK_MSG(false, "the AVX-512 BF16 kernels are not compiled in (Available() is false)");
#endif
}

}  // namespace dsinfer::backend::cpu::bf16dot
