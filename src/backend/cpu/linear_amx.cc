#include "backend/cpu/linear_amx.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear_amx_internal.h"
#include "backend/random_weights.h"
#include "core/aligned.h"
#include "core/dtype.h"
#include "core/prefetch.h"
#include "core/quant.h"
#include "core/status.h"

#ifdef DSINFER_AMX_COMPILED
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace dsinfer::backend::cpu::amx {

using model::WeightFormat;
using model::WeightMatrix;
using namespace internal;  // NOLINT: this file is the tile half of the internal interface

namespace {

// Tile geometry beyond linear_amx_internal.h.
constexpr int kGroupsPerPass = 2;              // C tiles 0..3: 2 token groups x 2 chains
constexpr int kPrefetchCols = 4 * kBlockCols;  // software prefetch distance along a row

#ifdef DSINFER_AMX_COMPILED
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which trips
// -Wmaybe-uninitialized when they are inlined into a target("avx512f") function (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

bool ProbeAmx() {
  const char* env = std::getenv("DSINFER_CPU_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return false;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  const bool avx512vbmi = c & (1u << 1);  // the vector kernels' byte permutes
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  const bool avx512_bf16 = a & (1u << 5);
  if (!(fma && osxsave && f16c && avx512f && avx512dq && avx512bw && avx512vl && avx512vbmi &&
        amx_bf16 && amx_tile && avx512_bf16))
    return false;
  // The OS must save the AVX-512 state (XCR0 bits 1, 2, 5, 6, 7) and the tile state (17, 18).
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(xcr0_hi) << 32) | xcr0_lo;
  constexpr uint64_t kAvx512State = 0xe6, kTileState = (1ull << 17) | (1ull << 18);
  if ((xcr0 & kAvx512State) != kAvx512State || (xcr0 & kTileState) != kTileState) return false;
  // Linux hands out the 8 KiB tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM
  // for XFEATURE_XTILEDATA); the grant covers the whole process.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline uint16_t Bf16Bits(float exact) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(exact) >> 16);
}

// 32 e4m3 codes times a power-of-two scale -> 32 bf16 in natural order (exact). e4m3 -> fp16 by
// moving the bits into place (the exponent bias difference, 2^8, is folded into the scale); e4m3
// subnormals become fp16 subnormals of the same value, which the conversion to fp32 handles.
DSINFER_AMX_TARGET void ConvertFp8Chunk(const uint8_t* codes, float scale, uint16_t* out) {
  const __m512i h =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(0x80)), 8);
  const __m512i mag = _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(0x7f)), 7);
  const __m512i half_bits = _mm512_or_si512(sign, mag);  // fp16 of code * 2^-8
  const __m512 s = _mm512_set1_ps(scale * 256.0f);
  const __m512 f0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(half_bits)), s);
  const __m512 f1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(half_bits, 1)), s);
  _mm512_storeu_si512(out, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f1, f0)));
}

// E4M3MagnitudeBf16 for every magnitude, as ConvertFp8PairTable's tables start from it.
alignas(64) constexpr std::array<uint16_t, 128> kE4M3Bf16 = [] {
  std::array<uint16_t, 128> bits{};
  for (int m = 0; m < 128; ++m) bits[m] = E4M3MagnitudeBf16(m);
  return bits;
}();

// VPERMI2B tables of a scale code in [kFp8TableCodeLo, kFp8TableCodeHi]: the high and low
// bytes of kE4M3Bf16 times 2^(code - 127), entries 0 .. 63 in the first vector of each pair.
// In that range every nonzero scaled value stays a normal bf16 (2^-9 .. 480 times the scale).
constexpr int kFp8TableCodeLo = 10, kFp8TableCodeHi = 246;
struct Fp8ByteTables {
  __m512i hi0, hi1, lo0, lo1;
};
DSINFER_AMX_TARGET inline Fp8ByteTables MakeFp8ByteTables(int scale_code) {
  const __m512i add = _mm512_set1_epi16(static_cast<int16_t>((scale_code - 127) << 7));
  __m256i lo[4], hi[4];
  for (int i = 0; i < 4; ++i) {
    // Entry 0 (zero) keeps its bits.
    const __mmask32 nonzero = i == 0 ? 0xfffffffeu : 0xffffffffu;
    const __m512i words =
        _mm512_mask_add_epi16(_mm512_load_si512(kE4M3Bf16.data() + 32 * i), nonzero,
                              _mm512_load_si512(kE4M3Bf16.data() + 32 * i), add);
    lo[i] = _mm512_cvtepi16_epi8(words);
    hi[i] = _mm512_cvtepi16_epi8(_mm512_srli_epi16(words, 8));
  }
  auto join = [](__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  };
  return {join(hi[0], hi[1]), join(hi[2], hi[3]), join(lo[0], lo[1]), join(lo[2], lo[3])};
}

// 64 e4m3 codes (a chunk pair) -> the pair's two tile rows, out0 and out1, in Fp8PairColumn
// order (the byte unpacks' order), exact: two byte lookups by magnitude (VPERMI2B) give the
// bf16's low and high bytes, the code's sign goes into the high byte, and the unpacks make
// words. Zeros, subnormal codes and every scale in the tables' range need no special case: the
// shift-and-add conversion this replaces tested each word for zero and each code for
// subnormality, and cost 39 ns per 512 weights against the tile op's 13 (docs/PERF.md).
DSINFER_AMX_TARGET inline void ConvertFp8PairTable(const uint8_t* codes, const Fp8ByteTables& t,
                                                   uint16_t* out0, uint16_t* out1) {
  const __m512i x = _mm512_loadu_si512(codes);
  const __m512i magnitude = _mm512_and_si512(x, _mm512_set1_epi8(0x7f));
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, magnitude, t.lo1);
  // high | (x & 0x80)
  const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, magnitude, t.hi1), x,
                                               _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);
  _mm512_storeu_si512(out0, _mm512_unpacklo_epi8(lo, hi));
  _mm512_storeu_si512(out1, _mm512_unpackhi_epi8(lo, hi));
}

// The general path for a chunk pair: exact values in natural order, then placed in pair order.
DSINFER_AMX_TARGET void ConvertFp8PairGeneral(const uint8_t* codes, float scale, uint16_t* out0,
                                              uint16_t* out1) {
  alignas(64) uint16_t natural[2 * kTileK];
  ConvertFp8Chunk(codes, scale, natural);
  ConvertFp8Chunk(codes + kTileK, scale, natural + kTileK);
  const __m512i lo = _mm512_load_si512(natural), hi = _mm512_load_si512(natural + kTileK);
  _mm512_storeu_si512(out0,
                      _mm512_permutex2var_epi16(lo, _mm512_load_si512(kFp8PairOrder.data()), hi));
  _mm512_storeu_si512(
      out1, _mm512_permutex2var_epi16(lo, _mm512_load_si512(kFp8PairOrder.data() + kTileK), hi));
}

// Per-word right shifts: with the 16 chunk bytes broadcast to every 128-bit lane, word j of lane l
// holds bytes 2j and 2j + 1 (elements 4j .. 4j + 3); shifting it right by 4 l leaves element
// 4j + l in its low nibble (Fp4ChunkColumn).
alignas(64) constexpr std::array<uint16_t, 32> kFp4Shifts = [] {
  std::array<uint16_t, 32> shifts{};
  for (int m = 0; m < 32; ++m) shifts[m] = static_cast<uint16_t>(4 * (m / 8));
  return shifts;
}();
constexpr __mmask32 kFp4NonzeroEntries = 0xfefefefe;

// 16 bytes = 32 e2m1 codes (low nibble first) times 2^(e - 127) -> 32 bf16 in Fp4ChunkColumn
// order (exact when every scaled value stays normal, e in [2, 252]). exponent_add holds
// (e - 127) << 7 in both halves. The chunk is broadcast to all four 128-bit lanes; per-word
// shifts move each output word's nibble to its low bits (bit 4 is the next nibble's, which the
// duplicated 32-entry table ignores); a word permute looks up the bf16 value in a table whose
// nonzero entries had the scale added to their exponent. The zero entries become +0, also for
// the code -0: the tile unit's sums start at +0, so a -0 weight contributes exactly what +0 does.
DSINFER_AMX_TARGET inline void ConvertFp4ChunkFast(const uint8_t* packed, uint32_t exponent_add,
                                                   uint16_t* out) {
  const __m512i x =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed)));
  const __m512i idx = _mm512_srlv_epi16(x, _mm512_load_si512(kFp4Shifts.data()));
  const __m512i scaled =
      _mm512_maskz_add_epi16(kFp4NonzeroEntries, _mm512_load_si512(kFp4Table.data()),
                             _mm512_set1_epi32(static_cast<int32_t>(exponent_add)));
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(idx, scaled));
}

// Any scale code: the fast path when it applies, else exact values one by one.
DSINFER_AMX_TARGET void ConvertFp4Chunk(const uint8_t* packed, int scale_code, uint16_t* out) {
  if (scale_code >= 2 && scale_code <= 252) {
    const uint32_t add = static_cast<uint16_t>((scale_code - 127) << 7);
    ConvertFp4ChunkFast(packed, add | add << 16, out);
    return;
  }
  const float scale = E8M0ToF32(static_cast<uint8_t>(scale_code));
  for (int m = 0; m < kTileK; ++m) {
    const int col = Fp4ChunkColumn(m);
    const uint8_t byte = packed[col / 2];
    out[m] = Bf16Bits(E2M1ToF32(col % 2 ? byte >> 4 : byte & 0xf) * scale);
  }
}

// The FP4 exponent adds ((e - 127) << 7 in both halves of a dword) of weight rows [r0, r0 + nr),
// all chunks: adds [nr][chunks]. Returns false, leaving adds unusable, when a scale code is
// outside the fast path's range [2, 252]. One vector pass per row tile, so the conversion loop
// only broadcasts a dword from memory per chunk.
DSINFER_AMX_TARGET bool Fp4ExponentAdds(const WeightMatrix& w, int64_t r0, int nr, int64_t chunks,
                                        uint32_t* adds) {
  __mmask16 bad = 0;
  for (int i = 0; i < nr; ++i) {
    const uint8_t* codes = w.scales + (r0 + i) * w.scale_cols;
    uint32_t* dst = adds + i * chunks;
    for (int64_t c = 0; c < chunks; c += 16) {
      const __mmask16 live = static_cast<__mmask16>(
          chunks - c >= 16 ? 0xffff : (1u << (chunks - c)) - 1);  // no read past the row
      const __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, codes + c));
      // e in [2, 252] iff e - 2 <= 250 as unsigned.
      bad |= _mm512_mask_cmpgt_epu32_mask(live, _mm512_sub_epi32(e, _mm512_set1_epi32(2)),
                                          _mm512_set1_epi32(250));
      const __m512i add =
          _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(127)), 7),
                           _mm512_set1_epi32(0xffff));
      _mm512_mask_storeu_epi32(dst + c, live, _mm512_or_si512(add, _mm512_slli_epi32(add, 16)));
    }
  }
  return bad == 0;
}

// Byte offset of element `element` (row-major index) in w's data.
inline int64_t ElementByte(const WeightMatrix& w, int64_t element) {
  return w.format == WeightFormat::kFp4Packed ? element / 2
         : w.format == WeightFormat::kBF16    ? element * 2
                                              : element;
}

// Software prefetch for a row tile's 16 streams, which the hardware prefetcher picks up late:
// `lines` cache lines of row r at column col + kPrefetchCols, or, past the row's end, of the same
// row of the next row tile (where this thread most likely goes next).
// always_inline: it only prefetches (core/prefetch.h).
__attribute__((always_inline)) inline void PrefetchAhead(const WeightMatrix& w, int64_t r,
                                                         int64_t col, int lines) {
  const int64_t k = w.cols;
  int64_t element = r * k + col + kPrefetchCols;
  if (col + kPrefetchCols >= k) element += (kTileRows - 1) * k;
  if (element >= w.rows * k) return;
  const int64_t byte = ElementByte(w, element);
  for (int l = 0; l < lines; ++l) PrefetchToL1(w.data + byte + 64 * l);
}

}  // namespace

// 128 columns per row per call: one FP8 scale, four FP4 scales, whole cache lines. fp4_adds: the
// row tile's Fp4ExponentAdds, or null when they did not apply.
DSINFER_AMX_TARGET void internal::ConvertBlock(const WeightMatrix& w, int64_t r0, int nr, int64_t b,
                                               int n_chunks, const uint32_t* fp4_adds,
                                               uint16_t* __restrict out) {
  const WeightFormat format = w.format;
  const uint8_t* __restrict data = w.data;
  const int64_t k = w.cols, col0 = b * kBlockCols;
  if (format == WeightFormat::kFp8Block && nr == kTileRows && n_chunks == kPerBlock &&
      r0 / kBlockCols == (r0 + kTileRows - 1) / kBlockCols) {
    // The common case, a whole block of 16 rows under one scale, without the per-row work of
    // the loop below (scale lookups, table checks): that work cost about as much as the
    // conversions themselves.
    const int scale_code = w.scales[(r0 / kBlockCols) * w.scale_cols + col0 / kBlockCols];
    if (scale_code >= kFp8TableCodeLo && scale_code <= kFp8TableCodeHi) {
      const Fp8ByteTables tables = MakeFp8ByteTables(scale_code);
      const uint8_t* row = data + r0 * k + col0;
      for (int i = 0; i < kTileRows; ++i, row += k) {
        PrefetchAhead(w, r0 + i, col0, 2);
        uint16_t* dst = out + i * kTileK;
        ConvertFp8PairTable(row, tables, dst, dst + kTileElems);
        ConvertFp8PairTable(row + 2 * kTileK, tables, dst + 2 * kTileElems, dst + 3 * kTileElems);
      }
      return;
    }
  }
  Fp8ByteTables tables{};
  int table_code = -1;  // the scale code `tables` were made for
  for (int i = 0; i < nr; ++i) {
    const int64_t r = r0 + i;
    uint16_t* dst = out + i * kTileK;
    if (format == WeightFormat::kBF16) {
      for (int j = 0; j < n_chunks; ++j)
        std::memcpy(dst + j * kTileElems, data + (r * k + col0 + j * kTileK) * 2, kTileK * 2);
    } else if (format == WeightFormat::kFp8Block) {
      const uint8_t* row = data + r * k + col0;
      // 16 rows are 16 streams the hardware prefetcher picks up late; ask for lines ahead.
      PrefetchAhead(w, r, col0, 2);
      const int scale_code = w.scales[(r / 128) * w.scale_cols + col0 / 128];  // 128x128 block
      const bool in_tables = scale_code >= kFp8TableCodeLo && scale_code <= kFp8TableCodeHi;
      // The rows of a tile share their code unless the tile straddles a 128-row block.
      if (in_tables && scale_code != table_code) {
        tables = MakeFp8ByteTables(scale_code);
        table_code = scale_code;
      }
      int j = 0;
      for (; j + 2 <= n_chunks; j += 2) {
        uint16_t* out0 = dst + j * kTileElems;
        uint16_t* out1 = out0 + kTileElems;
        if (in_tables)
          ConvertFp8PairTable(row + j * kTileK, tables, out0, out1);
        else
          ConvertFp8PairGeneral(row + j * kTileK, E8M0ToF32(static_cast<uint8_t>(scale_code)), out0,
                                out1);
      }
      if (j < n_chunks)  // the last chunk of a row with an odd chunk count: natural order
        ConvertFp8Chunk(row + j * kTileK, E8M0ToF32(static_cast<uint8_t>(scale_code)),
                        dst + j * kTileElems);
    } else {  // kFp4Packed: one scale per 32 columns
      const uint8_t* row = data + r * (k / 2) + col0 / 2;
      PrefetchAhead(w, r, col0, 1);
      if (fp4_adds != nullptr) {
        const uint32_t* adds = fp4_adds + i * (k / kTileK) + col0 / kTileK;
        for (int j = 0; j < n_chunks; ++j)
          ConvertFp4ChunkFast(row + j * (kTileK / 2), adds[j], dst + j * kTileElems);
        continue;
      }
      const uint8_t* scale_codes = w.scales + r * w.scale_cols + col0 / 32;
      for (int j = 0; j < n_chunks; ++j)
        ConvertFp4Chunk(row + j * (kTileK / 2), scale_codes[j], dst + j * kTileElems);
    }
  }
  if (nr < kTileRows)
    for (int j = 0; j < n_chunks; ++j)
      std::memset(out + j * kTileElems + nr * kTileK, 0, (kTileRows - nr) * kTileK * 2);
}

namespace {

// The tile ops of one block (nc chunks from chunk c0) of a row tile against NG (1 or 2) token
// groups of B tiles (xg [group][chunk][16 k-pairs][width tokens][2], b_elems = 32 * width bf16
// per tile). A tile of chunk c0 + j: a + j * a_step, rows a_stride bytes apart. Each group
// accumulates even chunks in C tile 2g and odd chunks in C tile 2g + 1: two independent chains
// hide the tile unit's latency, and the fixed split keeps every element's summation order the
// same for any batch. Tile numbers are immediates, hence the template.
template <int NG>
DSINFER_AMX_TARGET inline void BlockTileOps(const uint16_t* a, int64_t a_step, int64_t a_stride,
                                            const uint16_t* xg, int64_t chunks, int64_t c0, int nc,
                                            int width) {
  const int64_t b_elems = int64_t{32} * width;
  const int b_stride = 4 * width;  // bytes per B tile row
  for (int j = 0; j < nc; ++j) {
    const int64_t c = c0 + j;
    const uint16_t* aj = a + j * a_step;
    const uint16_t* b0 = xg + c * b_elems;
    if (c % 2 == 0) {
      _tile_loadd(4, aj, a_stride);
      _tile_loadd(5, b0, b_stride);
      _tile_dpbf16ps(0, 4, 5);
      if constexpr (NG > 1) {
        _tile_loadd(6, b0 + chunks * b_elems, b_stride);
        _tile_dpbf16ps(2, 4, 6);
      }
    } else if constexpr (NG == 1) {  // a B tile of its own: no wait on the even op's reads
      _tile_loadd(7, aj, a_stride);
      _tile_loadd(6, b0, b_stride);
      _tile_dpbf16ps(1, 7, 6);
    } else {
      _tile_loadd(7, aj, a_stride);
      _tile_loadd(5, b0, b_stride);
      _tile_dpbf16ps(1, 7, 5);
      _tile_loadd(6, b0 + chunks * b_elems, b_stride);
      _tile_dpbf16ps(3, 7, 6);
    }
  }
}

template <int NG>
DSINFER_AMX_TARGET inline void ZeroAccumulators() {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (NG > 1) {
    _tile_zero(2);
    _tile_zero(3);
  }
}

template <int NG>
DSINFER_AMX_TARGET inline void StoreAccumulators(int width,
                                                 float (*cbuf)[kTileRows * kTileTokens]) {
  const int c_stride = 4 * width;  // bytes per C tile row
  _tile_stored(0, cbuf[0], c_stride);
  _tile_stored(1, cbuf[1], c_stride);
  if constexpr (NG > 1) {
    _tile_stored(2, cbuf[2], c_stride);
    _tile_stored(3, cbuf[3], c_stride);
  }
}

// The row tile's results: y[token, r0 - row_begin + n] = even chain + odd chain, for the ng groups
// of `width` token slots starting at group g0.
void EmitRowTile(const float (*cbuf)[kTileRows * kTileTokens], int ng, int64_t g0, int width,
                 int nr, std::span<const int64_t> tokens, float* y, int64_t ldy, int64_t y_col) {
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  for (int g = 0; g < ng; ++g)
    for (int j = 0; j < width; ++j) {
      const int64_t slot = (g0 + g) * width + j;
      if (slot >= n_tok) return;
      float* yt = y + tokens[slot] * ldy + y_col;
      for (int n = 0; n < nr; ++n)
        yt[n] = cbuf[2 * g][n * width + j] + cbuf[2 * g + 1][n * width + j];
    }
}

// One pass of a row tile whose A tiles need no conversion on the fly: bf16 weights read straight
// from the matrix (kDirect, 16 full rows), or a row tile already converted into abuf
// [chunks][512] (several passes over one row tile).
template <int NG, bool kDirect>
DSINFER_AMX_TARGET void TilePass(const WeightMatrix& w, int64_t r0, const uint16_t* abuf,
                                 const uint16_t* xg, int64_t chunks, int width,
                                 float (*cbuf)[kTileRows * kTileTokens]) {
  const int64_t n_blocks = (chunks + kPerBlock - 1) / kPerBlock;
  const uint16_t* direct = reinterpret_cast<const uint16_t*>(w.data) + r0 * w.cols;
  ZeroAccumulators<NG>();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int nc = BlockChunks(chunks, b);
    if constexpr (kDirect) {
      for (int i = 0; i < kTileRows; ++i) PrefetchAhead(w, r0 + i, b * kBlockCols, 2);
      BlockTileOps<NG>(direct + b * kBlockCols, kTileK, w.cols * 2, xg, chunks, b * kPerBlock, nc,
                       width);
    } else {
      BlockTileOps<NG>(abuf + b * kPerBlock * kTileElems, kTileElems, 64, xg, chunks, b * kPerBlock,
                       nc, width);
    }
  }
  StoreAccumulators<NG>(width, cbuf);
}

// Row tiles [tile_begin, tile_end) of FP8/FP4 weights (or a ragged bf16 tile) against all tokens
// in one pass each (ng = 1 or 2 groups), converting on the fly. The blocks of consecutive row
// tiles form one stream: block s + kLookahead is converted into a ring while block s's tile ops
// run, so the conversion overlaps the tile unit across row tile boundaries too, and tile loads
// (which do not forward from the store buffer) read stores that have retired. One block ahead:
// with the ring on cache lines (core/aligned.h), FP8 at 16 tokens took 21.2-21.7 ms per decode
// step's dense matrices at one block, 21.8-22.3 at two, 23.5-24.3 at four (a larger ring
// crowds L1); FP4 at 16 and 64 tokens the same within noise (docs/PERF.md, eighth session).
constexpr int kLookahead = 1;
template <int NG>
DSINFER_AMX_TARGET void StreamRowTiles(const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                                       int64_t tile_begin, int64_t tile_end, const uint16_t* xv,
                                       int64_t chunks, int width, std::span<const int64_t> tokens,
                                       float* y, int64_t ldy, uint16_t* ring,
                                       uint32_t* fp4_adds /* [2][16][chunks] */) {
  const int64_t n_blocks = (chunks + kPerBlock - 1) / kPerBlock;
  const int64_t n_steps = (tile_end - tile_begin) * n_blocks;
  const bool fp4 = w.format == WeightFormat::kFp4Packed;
  bool adds_valid[2] = {false, false};  // per tile parity: Fp4ExponentAdds applied
  auto tile_rows = [&](int64_t t, int64_t* r0) {
    *r0 = row_begin + t * kTileRows;
    return static_cast<int>(std::min<int64_t>(kTileRows, row_end - *r0));
  };
  auto convert = [&](int64_t step) {
    const int64_t t = tile_begin + step / n_blocks, b = step % n_blocks;
    int64_t r0 = 0;
    const int nr = tile_rows(t, &r0);
    uint32_t* adds = fp4_adds + (t % 2) * kTileRows * chunks;
    // A tile's adds are made at its first block; the previous tile's conversions are all done
    // by then, so two buffers (by tile parity) suffice.
    if (fp4 && b == 0) adds_valid[t % 2] = Fp4ExponentAdds(w, r0, nr, chunks, adds);
    ConvertBlock(w, r0, nr, b, BlockChunks(chunks, b), fp4 && adds_valid[t % 2] ? adds : nullptr,
                 ring + (step % (kLookahead + 1)) * kPerBlock * kTileElems);
  };
  // No bulk prefetch of the next row tile into L2 here: ConvertBlock's own prefetches, four
  // blocks ahead along each row and on into the next row tile, cover the stream. A slice of the
  // next tile per block step (prefetcht1) was issued here while those were deleted by the
  // compiler (core/prefetch.h); with both, FP8 at 16 tokens ran 14 % slower than with these
  // alone (docs/PERF.md, 2026-12-05).
  alignas(64) float cbuf[2 * kGroupsPerPass][kTileRows * kTileTokens];
  for (int64_t s = 0; s < std::min<int64_t>(kLookahead, n_steps); ++s) convert(s);
  for (int64_t s = 0; s < n_steps; ++s) {
    if (s + kLookahead < n_steps) convert(s + kLookahead);
    const int64_t t = tile_begin + s / n_blocks, b = s % n_blocks;
    if (b == 0) ZeroAccumulators<NG>();
    BlockTileOps<NG>(ring + (s % (kLookahead + 1)) * kPerBlock * kTileElems, kTileElems, 64, xv,
                     chunks, b * kPerBlock, BlockChunks(chunks, b), width);
    if (b == n_blocks - 1) {
      StoreAccumulators<NG>(width, cbuf);
      int64_t r0 = 0;
      const int nr = tile_rows(t, &r0);
      EmitRowTile(cbuf, NG, 0, width, nr, tokens, y, ldy, r0 - row_begin);
    }
  }
}

// StreamRowTiles for ng (1 or 2) token groups.
DSINFER_AMX_TARGET void StreamRowTiles(int ng, const WeightMatrix& w, int64_t row_begin,
                                       int64_t row_end, int64_t tile_begin, int64_t tile_end,
                                       const uint16_t* xv, int64_t chunks, int width,
                                       std::span<const int64_t> tokens, float* y, int64_t ldy,
                                       uint16_t* ring, uint32_t* fp4_adds) {
  if (ng == 1)
    StreamRowTiles<1>(w, row_begin, row_end, tile_begin, tile_end, xv, chunks, width, tokens, y,
                      ldy, ring, fp4_adds);
  else
    StreamRowTiles<2>(w, row_begin, row_end, tile_begin, tile_end, xv, chunks, width, tokens, y,
                      ldy, ring, fp4_adds);
}

// Weight row tiles [tile_begin, tile_end) against every token group of xv (groups of `width`
// tokens: B and C tiles are only as wide as the tokens, so a decode step of one token moves
// 64 bytes of activations per tile op instead of 1 KiB).
DSINFER_AMX_TARGET void RunRowTiles(const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                                    int64_t tile_begin, int64_t tile_end, const uint16_t* xv,
                                    int width, std::span<const int64_t> tokens, float* y,
                                    int64_t ldy) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    const bool a_tile = t == 4 || t == 7;  // weights: 16 rows x 32 bf16; C and B: width wide
    cfg.colsb[t] = static_cast<uint16_t>(a_tile ? 64 : 4 * width);
    cfg.rows[t] = kTileRows;
  }
  _tile_loadconfig(&cfg);
  const int64_t chunks = w.cols / kTileK;
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  const int64_t n_groups = (n_tok + width - 1) / width;
  // Up to 2 groups (32 tokens) go in one pass per row tile converting on the fly; more convert
  // each row tile once into abuf and reuse it for every pass. Full bf16 row tiles need no
  // conversion at all.
  const bool one_pass = n_groups <= kGroupsPerPass;
  const bool bf16 = w.format == WeightFormat::kBF16;
  AlignedVector<uint16_t> abuf((one_pass ? (kLookahead + 1) * kPerBlock : chunks) *
                               kTileElems);  // bf16 A tiles
  std::vector<uint32_t> fp4_adds(w.format == WeightFormat::kFp4Packed ? 2 * kTileRows * chunks
                                                                      : 0);  // [2][16][chunks]
  if (one_pass && !bf16) {
    StreamRowTiles(static_cast<int>(n_groups), w, row_begin, row_end, tile_begin, tile_end, xv,
                   chunks, width, tokens, y, ldy, abuf.data(), fp4_adds.data());
    _tile_release();
    return;
  }
  alignas(64) float cbuf[2 * kGroupsPerPass][kTileRows * kTileTokens];
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t r0 = row_begin + t * kTileRows;
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, row_end - r0));
    if (one_pass && nr < kTileRows) {  // the ragged bf16 tile: copied through the ring
      StreamRowTiles(static_cast<int>(n_groups), w, row_begin, row_end, t, t + 1, xv, chunks, width,
                     tokens, y, ldy, abuf.data(), fp4_adds.data());
      continue;
    }
    const bool direct = bf16 && nr == kTileRows;
    if (!direct) {
      const bool fp4 = w.format == WeightFormat::kFp4Packed;
      const uint32_t* adds =
          fp4 && Fp4ExponentAdds(w, r0, nr, chunks, fp4_adds.data()) ? fp4_adds.data() : nullptr;
      for (int64_t b = 0; b * kPerBlock < chunks; ++b)
        ConvertBlock(w, r0, nr, b, BlockChunks(chunks, b), adds,
                     abuf.data() + b * kPerBlock * kTileElems);
    }
    for (int64_t g0 = 0; g0 < n_groups; g0 += kGroupsPerPass) {
      const int ng = static_cast<int>(std::min<int64_t>(kGroupsPerPass, n_groups - g0));
      const uint16_t* xg = xv + g0 * chunks * 32 * width;
      if (direct)
        ng == 1 ? TilePass<1, true>(w, r0, nullptr, xg, chunks, width, cbuf)
                : TilePass<2, true>(w, r0, nullptr, xg, chunks, width, cbuf);
      else
        ng == 1 ? TilePass<1, false>(w, r0, abuf.data(), xg, chunks, width, cbuf)
                : TilePass<2, false>(w, r0, abuf.data(), xg, chunks, width, cbuf);
      EmitRowTile(cbuf, ng, g0, width, nr, tokens, y, ldy, r0 - row_begin);
    }
  }
  _tile_release();
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // DSINFER_AMX_COMPILED

}  // namespace

bool Available() {
#ifdef DSINFER_AMX_COMPILED
  static const bool available = ProbeAmx();  // a fact about this machine, computed once
  return available;
#else
  return false;
#endif
}

bool Applies(const WeightMatrix& w) {
  if (w.cols % kTileK != 0 || w.data == nullptr) return false;
  switch (w.format) {
    case WeightFormat::kBF16:
      return true;
    case WeightFormat::kFp8Block:  // 128x128 blocks only (V4.1's 32x32 ones take the FP32 GEMV)
      return w.scale_dtype == DType::kF8E8M0 && w.block == 128;
    case WeightFormat::kFp4Packed:
      return w.scale_dtype == DType::kF8E8M0;  // power-of-two scales keep the bf16 weights exact
    default:
      return false;
  }
}

bool RowIsBf16Exact(const float* x, int64_t k) {
  // Non-zero when x's bits are not a finite, normal-or-zero bf16 value.
  auto inexact = [](float v) {
    const uint32_t u = std::bit_cast<uint32_t>(v);
    const uint32_t exponent = (u >> 23) & 0xff;
    return (u & 0xffff) | static_cast<uint32_t>(exponent == 0xff) |
           static_cast<uint32_t>(exponent == 0 && (u & 0x7fffff) != 0);
  };
  // Branch-free within chunks of 64 so that the compiler vectorizes the test (the one-value
  // early exit kept it scalar: ~1 % of a batch-16 decode step, run on every matmul's rows).
  constexpr int64_t kChunk = 64;
  int64_t i = 0;
  for (; i + kChunk <= k; i += kChunk) {
    uint32_t any = 0;
    for (int64_t j = 0; j < kChunk; ++j) any |= inexact(x[i + j]);
    if (any != 0) return false;
  }
  uint32_t any = 0;
  for (; i < k; ++i) any |= inexact(x[i]);
  return any == 0;
}

bool VectorApplies(const WeightMatrix& w, int64_t n_tokens) {
#ifdef DSINFER_AMX_COMPILED
  const int64_t most = w.format == WeightFormat::kFp4Packed  ? kVectorMaxTokens
                       : w.format == WeightFormat::kFp8Block ? kVectorMaxTokensFp8
                                                             : 0;
  return n_tokens >= 1 && n_tokens <= most;
#else
  (void)w, (void)n_tokens;
  return false;
#endif
}

#ifdef DSINFER_AMX_COMPILED
namespace {
// The vector kernels reproduce the tile unit as measured on the CPUs this project has run on. A
// CPU whose TDPBF16PS or VDPBF16PS rounded differently would make results depend on the token
// count, so they are used only after matching the tile path bit for bit on a probe on this
// machine: FP8 with uniform codes (subnormals: the general route) and trained-like codes (the
// pair route), FP4; two 512-column groups and a tail chunk; one, two and (FP4) three tokens,
// one of them with per-element magnitudes from 2^-60 to 2^40.
bool VectorMatchesTiles() {
  ThreadPool serial(1);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  constexpr int64_t kRows = 16, kCols = 1056, kTokens = 3;
  std::vector<float> x(kTokens * kCols);  // [3, kCols]
  for (int64_t i = 0; i < kTokens * kCols; ++i)
    x[i] = i < kCols || i >= 2 * kCols
               ? normal(rng)
               : std::ldexp(normal(rng), static_cast<int>(rng() % 101) - 60);
  for (int64_t t = 0; t < kTokens; ++t)
    Fp8RoundTripInPlace(x.data() + t * kCols, static_cast<int>(kCols), 128);
  const std::vector<int64_t> token_sets[] = {{0}, {1}, {0, 1}, {2, 1, 0}};
  for (int kind = 0; kind < 3; ++kind) {
    const WeightFormat f = kind < 2 ? WeightFormat::kFp8Block : WeightFormat::kFp4Packed;
    const HostWeight w = RandomWeight(
        rng, f, kRows, kCols,
        {.scale_code_lo = 100, .scale_code_hi = 130, .fp8_trained_distribution = kind == 1});
    for (const std::vector<int64_t>& tokens : token_sets) {
      if (!VectorApplies(w.view, static_cast<int64_t>(tokens.size()))) continue;
      std::vector<float> tiles(kTokens * kRows, 0.0f), vector(kTokens * kRows, 0.0f);
      MatMulRows(w.view, 0, kRows, x.data(), tokens, tiles.data(), kRows, serial, Kernel::kTiles);
      MatMulRows(w.view, 0, kRows, x.data(), tokens, vector.data(), kRows, serial, Kernel::kVector);
      if (std::memcmp(tiles.data(), vector.data(), tiles.size() * sizeof(float)) != 0) return false;
    }
  }
  return true;
}

}  // namespace
#endif

// DSINFER_CPU_VECTOR=0 keeps the tile kernels for every batch (to compare; results are the same).
bool VectorInUse() {
#ifdef DSINFER_AMX_COMPILED
  if (!Available()) return false;
  static const bool enabled = [] {  // a fact about this process and machine, settled once
    const char* env = std::getenv("DSINFER_CPU_VECTOR");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return VectorMatchesTiles();
  }();
  return enabled;
#else
  return false;
#endif
}

void MatMulRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                std::span<const int64_t> tokens, float* y, int64_t ldy, ThreadPool& pool,
                Kernel kernel) {
#ifdef DSINFER_AMX_COMPILED
  const int64_t k = w.cols, chunks = k / kTileK;
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (n_tok == 0 || row_end <= row_begin) return;
  DSINFER_CHECK_MSG(kernel != Kernel::kVector || VectorApplies(w, n_tok),
                    "the vector kernels take FP8 weights at up to 2 tokens, FP4 at up to 3");
  if (kernel == Kernel::kVector ||
      (kernel == Kernel::kAuto && VectorApplies(w, n_tok) && VectorInUse())) {
    MatMulRowsVector(w, row_begin, row_end, x, tokens, y, ldy, pool);
    return;
  }
  // Token groups of `width`: all tokens when they fit one tile, else 16 per group.
  const int width = static_cast<int>(std::min<int64_t>(kTileTokens, n_tok));
  const int64_t n_groups = (n_tok + width - 1) / width;
  const int64_t b_elems = int64_t{32} * width;  // bf16 per B tile: 16 k-pairs x width x 2
  // B tiles: xv [group][chunk][16 k-pairs][width tokens][2] bf16 (the tile unit's pair
  // layout) in TileOrder; unused token slots of the last group stay zero.
  // Made by the pool, chunk ranges per task, each B tile row (one k-pair, every token of the
  // group) written whole: on the calling thread, token by token, this took ~40 us per call at 16
  // tokens and 4096 columns, ~2.5 ms of a batch-16 decode step while the other core waited.
  AlignedVector<uint16_t> xv(n_groups * chunks * b_elems, 0);
  pool.ParallelForRange(
      chunks,
      [&](int64_t c0, int64_t c1) {
        for (int64_t g = 0; g < n_groups; ++g) {
          const int64_t slots = std::min<int64_t>(width, n_tok - g * width);
          for (int64_t c = c0; c < c1; ++c) {
            const ChunkOrder order = TileOrder(w.format, chunks, c);
            uint16_t* tile = xv.data() + (g * chunks + c) * b_elems;
            for (int kk = 0; kk < kTileK / 2; ++kk) {
              const int64_t even = order.base + order.offsets[2 * kk];
              const int64_t odd = order.base + order.offsets[2 * kk + 1];
              uint16_t* row = tile + kk * width * 2;
              for (int64_t j = 0; j < slots; ++j) {
                const float* xr = x + tokens[g * width + j] * k;
                row[2 * j] = Bf16Bits(xr[even]);
                row[2 * j + 1] = Bf16Bits(xr[odd]);
              }
            }
          }
        }
      },
      16);
  const int64_t n_tiles = (row_end - row_begin + kTileRows - 1) / kTileRows;
  pool.ParallelForRange(
      n_tiles,
      [&](int64_t ta, int64_t tb) {
        RunRowTiles(w, row_begin, row_end, ta, tb, xv.data(), width, tokens, y, ldy);
      },
      1);
#else
  (void)w, (void)row_begin, (void)row_end, (void)x, (void)tokens, (void)y, (void)ldy, (void)pool,
      (void)kernel;
  DSINFER_CHECK_MSG(false, "AMX kernels are not compiled in (Available() is false)");
#endif
}

}  // namespace dsinfer::backend::cpu::amx
