#include "backend/cpu/linear_amx.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DSINFER_AMX_COMPILED 1
// The kernels are compiled for AMX/AVX-512 whatever the build's -march, and only called after
// the runtime check in Available(), so one binary runs on any x86-64 CPU.
#define DSINFER_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,f16c")))
#endif

namespace dsinfer::backend::cpu::amx {

using model::WeightFormat;
using model::WeightMatrix;

namespace {

// Tile geometry (palette 1): every tile is 16 rows of 64 bytes.
constexpr int kTileRows = 16;                   // weight rows per A tile = rows of C
constexpr int kTileK = 32;                      // bf16 values per A row (one 64-byte tile row)
constexpr int kTileTokens = 16;                 // tokens per B tile = columns of C
constexpr int kTileElems = kTileRows * kTileK;  // 512 bf16 per A or B tile
constexpr int kGroupsPerPass = 2;               // C tiles 0..3: 2 token groups x 2 chains
constexpr int kBlockCols = 128;                 // columns converted per row per call
constexpr int kPrefetchCols = 4 * kBlockCols;   // software prefetch distance along a row

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
  const bool osxsave = c & (1u << 27), f16c = c & (1u << 29);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  const bool avx512_bf16 = a & (1u << 5);
  if (!(osxsave && f16c && avx512f && avx512dq && avx512bw && avx512vl && amx_bf16 && amx_tile &&
        avx512_bf16))
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

// 32 e4m3 codes times a power-of-two scale -> 32 bf16 (exact). e4m3 -> fp16 by moving the bits
// into place (the exponent bias difference, 2^8, is folded into the scale); e4m3 subnormals
// become fp16 subnormals of the same value, which the conversion to fp32 handles exactly.
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

// 16 bytes = 32 e2m1 codes (low nibble first) times a power-of-two scale -> 32 bf16 (exact):
// the 16-entry table of scaled values is looked up with one word permute.
DSINFER_AMX_TARGET void ConvertFp4Chunk(const uint8_t* packed, float scale, uint16_t* out) {
  const __m512 values = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                       -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m256i table = reinterpret_cast<__m256i>(
      _mm512_cvtneps_pbh(_mm512_mul_ps(values, _mm512_set1_ps(scale))));  // 16 bf16
  const __m512i bytes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed)));
  // Word 2i <- low nibble of byte i, word 2i + 1 <- its high nibble: natural element order.
  const __m512i idx =
      _mm512_or_si512(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0f)),
                      _mm512_slli_epi32(_mm512_and_si512(bytes, _mm512_set1_epi32(0xf0)), 12));
  _mm512_storeu_si512(out, _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(table)));
}

// Columns [128b, 128b + 32 n_chunks) of weight rows [r0, r0 + nr) as n_chunks (<= 4) bf16 A
// tiles at out + j * 512, each [16 rows][32] (rows >= nr zero). 128 columns per row per call:
// one FP8 scale, four FP4 scales in one word, whole cache lines.
DSINFER_AMX_TARGET void ConvertBlock(const WeightMatrix& w, int64_t r0, int nr, int64_t b,
                                     int n_chunks, uint16_t* __restrict out) {
  const WeightFormat format = w.format;
  const uint8_t* __restrict data = w.data;
  const int64_t k = w.cols, col0 = b * kBlockCols;
  for (int i = 0; i < nr; ++i) {
    const int64_t r = r0 + i;
    uint16_t* dst = out + i * kTileK;
    if (format == WeightFormat::kBF16) {
      for (int j = 0; j < n_chunks; ++j)
        std::memcpy(dst + j * kTileElems, data + (r * k + col0 + j * kTileK) * 2, kTileK * 2);
    } else if (format == WeightFormat::kFp8Block) {
      const uint8_t* row = data + r * k + col0;
      // 16 rows are 16 streams the hardware prefetcher picks up late; ask for lines ahead.
      if (col0 + kPrefetchCols < k) {
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchCols), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchCols + 64), _MM_HINT_T0);
      }
      const float s = w.Scale(r, col0);  // one scale per 128x128 block
      for (int j = 0; j < n_chunks; ++j) ConvertFp8Chunk(row + j * kTileK, s, dst + j * kTileElems);
    } else {  // kFp4Packed: one scale per 32 columns
      const uint8_t* row = data + r * (k / 2) + col0 / 2;
      if (col0 + kPrefetchCols < k)
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchCols / 2), _MM_HINT_T0);
      const uint8_t* scale_codes = w.scales + r * w.scale_cols + col0 / 32;
      for (int j = 0; j < n_chunks; ++j)
        ConvertFp4Chunk(row + j * (kTileK / 2), E8M0ToF32(scale_codes[j]), dst + j * kTileElems);
    }
  }
  if (nr < kTileRows)
    for (int j = 0; j < n_chunks; ++j)
      std::memset(out + j * kTileElems + nr * kTileK, 0, (kTileRows - nr) * kTileK * 2);
}

// One pass of a weight row tile over NG (1 or 2) token groups of B tiles (xg [group][chunk]
// [16 k-pairs][width tokens][2], b_elems = 32 * width bf16 per tile). Each group accumulates even
// chunks in C tile 2g and odd chunks in C tile 2g + 1: two independent chains hide the tile unit's
// latency, and the fixed split keeps every element's summation order the same for any batch.
// kConvert: abuf is a ring of two 4-chunk halves and block b + 1 is converted while block b's tile
// ops run (the conversion overlaps the tile unit, and tile loads, which do not forward from the
// store buffer, read stores long retired); otherwise abuf already holds the whole row tile
// [chunks][512]. Tile numbers are immediates, hence the templates.
template <int NG, bool kConvert>
DSINFER_AMX_TARGET void TilePass(const WeightMatrix& w, int64_t r0, int nr, uint16_t* abuf,
                                 const uint16_t* xg, int64_t chunks, int width,
                                 float (*cbuf)[kTileRows * kTileTokens]) {
  const int64_t b_elems = int64_t{32} * width;
  const int b_stride = 4 * width;                 // bytes per B tile row, and per C tile row
  constexpr int kPerBlock = kBlockCols / kTileK;  // 4 chunks
  const int64_t n_blocks = (chunks + kPerBlock - 1) / kPerBlock;
  auto block_chunks = [&](int64_t b) {
    return static_cast<int>(std::min<int64_t>(kPerBlock, chunks - b * kPerBlock));
  };
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (NG > 1) {
    _tile_zero(2);
    _tile_zero(3);
  }
  if constexpr (kConvert) ConvertBlock(w, r0, nr, 0, block_chunks(0), abuf);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint16_t* a_block = abuf + (kConvert ? (b % 2) * kPerBlock : b * kPerBlock) * kTileElems;
    if constexpr (kConvert)
      if (b + 1 < n_blocks)
        ConvertBlock(w, r0, nr, b + 1, block_chunks(b + 1),
                     abuf + ((b + 1) % 2) * kPerBlock * kTileElems);
    const int nc = block_chunks(b);
    for (int j = 0; j < nc; ++j) {
      const int64_t c = b * kPerBlock + j;
      const uint16_t* a = a_block + j * kTileElems;
      const uint16_t* b0 = xg + c * b_elems;
      if (c % 2 == 0) {
        _tile_loadd(4, a, 64);
        _tile_loadd(5, b0, b_stride);
        _tile_dpbf16ps(0, 4, 5);
        if constexpr (NG > 1) {
          _tile_loadd(6, b0 + chunks * b_elems, b_stride);
          _tile_dpbf16ps(2, 4, 6);
        }
      } else if constexpr (NG == 1) {  // a B tile of its own: no wait on the even op's reads
        _tile_loadd(7, a, 64);
        _tile_loadd(6, b0, b_stride);
        _tile_dpbf16ps(1, 7, 6);
      } else {
        _tile_loadd(7, a, 64);
        _tile_loadd(5, b0, b_stride);
        _tile_dpbf16ps(1, 7, 5);
        _tile_loadd(6, b0 + chunks * b_elems, b_stride);
        _tile_dpbf16ps(3, 7, 6);
      }
    }
  }
  _tile_stored(0, cbuf[0], b_stride);
  _tile_stored(1, cbuf[1], b_stride);
  if constexpr (NG > 1) {
    _tile_stored(2, cbuf[2], b_stride);
    _tile_stored(3, cbuf[3], b_stride);
  }
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
  // Up to 2 groups (32 tokens) go in one pass converting on the fly; more convert the row tile
  // once into abuf and reuse it for every pass.
  const bool one_pass = n_groups <= kGroupsPerPass;
  std::vector<uint16_t> abuf((one_pass ? 2 * kBlockCols / kTileK : chunks) *
                             kTileElems);  // bf16 A tiles
  alignas(64) float cbuf[2 * kGroupsPerPass][kTileRows * kTileTokens];
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t r0 = row_begin + t * kTileRows;
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, row_end - r0));
    if (!one_pass)
      for (int64_t c0 = 0; c0 < chunks; c0 += kBlockCols / kTileK)
        ConvertBlock(w, r0, nr, c0 / (kBlockCols / kTileK),
                     static_cast<int>(std::min<int64_t>(kBlockCols / kTileK, chunks - c0)),
                     abuf.data() + c0 * kTileElems);
    for (int64_t g0 = 0; g0 < n_groups; g0 += kGroupsPerPass) {
      const int ng = static_cast<int>(std::min<int64_t>(kGroupsPerPass, n_groups - g0));
      const uint16_t* xg = xv + g0 * chunks * 32 * width;
      if (one_pass)
        ng == 1 ? TilePass<1, true>(w, r0, nr, abuf.data(), xg, chunks, width, cbuf)
                : TilePass<2, true>(w, r0, nr, abuf.data(), xg, chunks, width, cbuf);
      else
        ng == 1 ? TilePass<1, false>(w, r0, nr, abuf.data(), xg, chunks, width, cbuf)
                : TilePass<2, false>(w, r0, nr, abuf.data(), xg, chunks, width, cbuf);
      for (int g = 0; g < ng; ++g)
        for (int j = 0; j < width; ++j) {
          const int64_t slot = (g0 + g) * width + j;
          if (slot >= n_tok) break;
          float* yt = y + tokens[slot] * ldy + (r0 - row_begin);
          for (int n = 0; n < nr; ++n)
            yt[n] = cbuf[2 * g][n * width + j] + cbuf[2 * g + 1][n * width + j];
        }
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
    case WeightFormat::kFp8Block:
    case WeightFormat::kFp4Packed:
      return w.scale_dtype == DType::kF8E8M0;  // power-of-two scales keep the bf16 weights exact
    default:
      return false;
  }
}

bool RowIsBf16Exact(const float* x, int64_t k) {
  for (int64_t i = 0; i < k; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t exponent = (u >> 23) & 0xff;
    if ((u & 0xffff) != 0 || exponent == 0xff || (exponent == 0 && (u & 0x7fffff) != 0))
      return false;
  }
  return true;
}

void MatMulRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                std::span<const int64_t> tokens, float* y, int64_t ldy, ThreadPool& pool) {
#ifdef DSINFER_AMX_COMPILED
  const int64_t k = w.cols, chunks = k / kTileK;
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (n_tok == 0 || row_end <= row_begin) return;
  // Token groups of `width`: all tokens when they fit one tile, else 16 per group.
  const int width = static_cast<int>(std::min<int64_t>(kTileTokens, n_tok));
  const int64_t n_groups = (n_tok + width - 1) / width;
  const int64_t b_elems = int64_t{32} * width;  // bf16 per B tile: 16 k-pairs x width x 2
  // B tiles: xv [group][chunk][16 k-pairs][width tokens][2] bf16 (the tile unit's pair
  // layout); unused token slots of the last group stay zero.
  std::vector<uint16_t> xv(n_groups * chunks * b_elems, 0);
  for (int64_t slot = 0; slot < n_tok; ++slot) {
    const float* xr = x + tokens[slot] * k;
    uint16_t* base = xv.data() + (slot / width) * chunks * b_elems + (slot % width) * 2;
    for (int64_t c = 0; c < chunks; ++c) {
      uint16_t* dst = base + c * b_elems;
      const float* src = xr + c * kTileK;
      for (int kk = 0; kk < kTileK / 2; ++kk) {
        dst[kk * width * 2] = static_cast<uint16_t>(std::bit_cast<uint32_t>(src[2 * kk]) >> 16);
        dst[kk * width * 2 + 1] =
            static_cast<uint16_t>(std::bit_cast<uint32_t>(src[2 * kk + 1]) >> 16);
      }
    }
  }
  const int64_t n_tiles = (row_end - row_begin + kTileRows - 1) / kTileRows;
  pool.ParallelForRange(
      n_tiles,
      [&](int64_t ta, int64_t tb) {
        RunRowTiles(w, row_begin, row_end, ta, tb, xv.data(), width, tokens, y, ldy);
      },
      1);
#else
  (void)w, (void)row_begin, (void)row_end, (void)x, (void)tokens, (void)y, (void)ldy, (void)pool;
  DSINFER_CHECK_MSG(false, "AMX kernels are not compiled in (Available() is false)");
#endif
}

}  // namespace dsinfer::backend::cpu::amx
