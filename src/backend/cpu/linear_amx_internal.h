// Shared by the two halves of the AMX matmul path: the tile kernels (linear_amx.cc) and the
// AVX-512 kernels that reproduce the tile unit's arithmetic bit for bit for a few tokens
// (linear_amx_vector.cc). Both must see one definition of the tile geometry and of the column
// order inside the tiles, since that order is the summation order.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "model/weights.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define DSINFER_AMX_COMPILED 1
// The kernels are compiled for AMX/AVX-512 whatever the build's -march, and only called after
// the runtime check in Available(), so one binary runs on any x86-64 CPU. avx512vnni is named
// for the FP4 integer route (VPDPWSSD): every AMX CPU has it, but a -march=native build on a CPU
// without AVX-512 (Zen 2) does not enable it implicitly.
#define DSINFER_AMX_TARGET                                                                       \
  __attribute__((                                                                                \
      target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx512vnni,fma,amx-tile," \
             "amx-bf16,f16c")))
#endif

namespace dsinfer::backend::cpu::amx::internal {

// Tile geometry (palette 1): every tile is 16 rows of 64 bytes.
constexpr int kTileRows = 16;                   // weight rows per A tile = rows of C
constexpr int kTileK = 32;                      // bf16 values per A row (one 64-byte tile row)
constexpr int kTileTokens = 16;                 // tokens per B tile = columns of C
constexpr int kTileElems = kTileRows * kTileK;  // 512 bf16 per A or B tile
constexpr int kBlockCols = 128;                 // columns converted per row per call
constexpr int kPerBlock = kBlockCols / kTileK;  // 4 chunks per block

// Chunks in block b of a row with `chunks` chunks (the last block may be short).
inline int BlockChunks(int64_t chunks, int64_t b) {
  const int64_t left = chunks - b * kPerBlock;
  return static_cast<int>(left < kPerBlock ? left : kPerBlock);
}

// Column order inside the tiles. The activation (B) tiles are laid out in the same order, so
// any fixed permutation of the columns within one scale block leaves every product unchanged and
// only fixes a (batch-independent) summation order. The orders below are the ones the fast
// conversions produce directly, which saves a shuffle per 32 weights:
//   FP8: a chunk pair (2j, 2j + 1) of one 128x128 block, position p = 32 * slot + m, holds
//        column 16 * (m / 8) + 8 * slot + m % 8 of its 64 (the order of the byte unpacks);
//   FP4: position m of a chunk holds column 4 * (m % 8) + m / 8 of its 32 (the order of the
//        per-lane nibble shifts);
//   bf16, and an FP8 chunk without a pair (the last one when k / 32 is odd): natural order.
constexpr int Fp8PairColumn(int p) {
  const int slot = p / 32, m = p % 32;
  return 16 * (m / 8) + 8 * slot + m % 8;
}
constexpr int Fp4ChunkColumn(int m) { return 4 * (m % 8) + m / 8; }

// Tile position m of chunk c holds column base + offsets[m] of w.
struct ChunkOrder {
  int64_t base;
  const uint16_t* offsets;  // [32]
};

constexpr std::array<uint16_t, 64> MakeOrder(int (*column)(int), int n) {
  std::array<uint16_t, 64> order{};
  for (int p = 0; p < n; ++p) order[p] = static_cast<uint16_t>(column(p));
  return order;
}
// Also the word indices of the permutes that produce these orders from natural order.
alignas(64) inline constexpr std::array<uint16_t, 64> kFp8PairOrder = MakeOrder(Fp8PairColumn, 64);
alignas(64) inline constexpr std::array<uint16_t, 64> kFp4ChunkOrder = MakeOrder(Fp4ChunkColumn,
                                                                                 32);
alignas(64) inline constexpr std::array<uint16_t, 64> kNaturalOrder =
    MakeOrder([](int m) { return m; }, 32);

// The order of chunk c's tile positions (chunks = w.cols / 32).
inline ChunkOrder TileOrder(model::WeightFormat format, int64_t chunks, int64_t c) {
  if (format == model::WeightFormat::kFp8Block && (c / 2) * 2 + 1 < chunks)
    return {(c / 2) * 64, kFp8PairOrder.data() + (c % 2) * kTileK};
  if (format == model::WeightFormat::kFp4Packed) return {c * kTileK, kFp4ChunkOrder.data()};
  return {c * kTileK, kNaturalOrder.data()};
}

// bf16 bits of the e4m3 magnitude m = 0 .. 127 (eeee fff) at scale 1, exact: 2^(e - 7) (1 + f/8)
// for e >= 1, f 2^-9 for e = 0 (subnormal codes; 0 for m = 0). m = 127, e4m3fn's NaN, gives 480,
// as every conversion of the CPU kernels reads it. Used by the tiles' FP8 tables (linear_amx.cc)
// and the AVX-512 BF16 kernels' subnormal table (linear_bf16dot.cc).
constexpr uint16_t E4M3MagnitudeBf16(int m) {
  const int e = m >> 3, f = m & 7;
  const float value = e > 0 ? std::bit_cast<float>(static_cast<uint32_t>(e + 120) << 23) *
                                  (1.0f + static_cast<float>(f) / 8.0f)
                            : static_cast<float>(f) * 0x1p-9f;
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16);
}

// bf16 bits of the e2m1 codes 0..15, twice (the index's bit 4 is the next element's); 0 and 8
// are zeros.
alignas(64) inline constexpr std::array<uint16_t, 32> kFp4Table = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80,
    0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0, 0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040,
    0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

#ifdef DSINFER_AMX_COMPILED
// Columns [128b, 128b + 32 n_chunks) of weight rows [r0, r0 + nr) as n_chunks (<= 4) bf16 A
// tiles at out + j * 512, each [16 rows][32] in TileOrder (rows >= nr zero). fp4_adds: the row
// tile's FP4 exponent adds, or null (any scale: the general per-chunk conversion).
void ConvertBlock(const model::WeightMatrix& w, int64_t r0, int nr, int64_t b, int n_chunks,
                  const uint32_t* fp4_adds, uint16_t* out);

// The vector kernels' share of MatMulRows (same contract), for FP4 weights and at most
// kVectorMaxTokens tokens, FP8 weights and at most kVectorMaxTokensFp8. Measured, ns per 512
// weights from L3 on the Sapphire Rapids VM of docs/PERF.md, vector against tiles: FP4 at three
// tokens w1 35 vs 46, w2 39 vs 38, at four 57 vs 45 and 51 vs 45. FP8 stays at two: its vector
// route (bf16 pairs) costs per token what FP4's integer route does not, and at four tokens the
// tiles were already faster when FP4 also took the pairs (docs/PERF.md, third session).
constexpr int kVectorMaxTokens = 3;
constexpr int kVectorMaxTokensFp8 = 2;
// How many 512-column row groups took each route (linear_amx_vector.cc): for tests and
// benchmarks that need to know a route ran.
struct VectorRoutes {
  int64_t integer = 0;       // FP4, exact integer sums
  int64_t integer_wide = 0;  // of those, with a third byte plane (some |A| near 2^15 or past)
  int64_t pairs = 0;         // bf16 pairs, VDPBF16PS
  int64_t general = 0;       // fp32 FMAs
  VectorRoutes& operator+=(const VectorRoutes& o) {
    integer += o.integer, integer_wide += o.integer_wide, pairs += o.pairs, general += o.general;
    return *this;
  }
};
// integer_route false keeps FP4 groups off the integer route (tests of the other routes' edges).
void MatMulRowsVector(const model::WeightMatrix& w, int64_t row_begin, int64_t row_end,
                      const float* x, std::span<const int64_t> tokens, float* y, int64_t ldy,
                      ThreadPool& pool, VectorRoutes* routes = nullptr, bool integer_route = true);
#endif

}  // namespace dsinfer::backend::cpu::amx::internal
