// The tile unit's arithmetic on AVX-512, for FP8/FP4 weights and one or two tokens.
//
// Why: at one or two tokens a TDPBF16PS does 1/16 of the work it could, and what a decode step
// pays for per 512 weights is converting them into a bf16 A tile, storing it and tile-loading it
// back (on this project's VM a 1 KiB tile load plus the op cost ~50 ns, about what the
// conversion costs), while a 16-row tile reads 16 separate streams of the matrix. These kernels
// read one weight row at a time, start to end (one stream, which the hardware prefetcher follows
// without help), and sum from registers: from memory 1.3-1.5x the tile path's GB/s at one token,
// on par with it in cache (docs/PERF.md). They reproduce the tile path's summation order and
// rounding exactly, so which kernel runs can never change a result (batch invariance, exact
// prefix-cache hits).
//
// The arithmetic, established on the hardware and checked bit for bit against MatMulRows' tile
// path by linear_test on every AMX machine: for each output, one TDPBF16PS forms e = +0 then
// e = fma(a[2i], b[2i], e) for i = 0 .. 15 (the even tile positions, in order), o likewise over
// the odd positions, and adds c = c + (e + o), flushing results that would be subnormal and
// reading subnormal inputs as zero. The tile path keeps two accumulators per output (even chunks,
// odd chunks) and returns their sum. VDPBF16PS on a dword holding two bf16 computes
// acc = fma(low word, fma(high word, acc)), flushed the same way: two steps of such a chain.
// FP32 FMAs reproduce it with MXCSR flush-to-zero set (inputs are never subnormal here:
// activation rows are checked by RowIsBf16Exact, and a dequantized weight that would be
// subnormal is flushed by the multiply that scales it). The final even + odd add runs in the
// caller's mode, as the tile path's does.
//
// Layout: lanes are chunks. A group is 16 consecutive chunks (512 columns) of one weight row;
// lane j carries chunk 16 g + j, and the vectors of a group are its 32 tile positions (slots) in
// TileOrder, in pairs for VDPBF16PS, so lane j runs down its chunk's even and odd positions
// exactly as the tile unit does; the 16 per-chunk sums are then added to the two chains in chunk
// order. Chunks past the last whole group take the tile path's own conversion and scalar FMAs.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cpu/linear_amx_internal.h"
#include "core/aligned.h"
#include "core/prefetch.h"
#include "core/status.h"

#ifdef DSINFER_AMX_COMPILED
#include <immintrin.h>

#include "core/dtype.h"

namespace dsinfer::backend::cpu::amx::internal {
namespace {

using model::WeightFormat;
using model::WeightMatrix;

constexpr int kLanes = 16;                   // chunks per group, one per fp32 lane
constexpr int kGroupCols = kLanes * kTileK;  // 512 columns per group
constexpr int kSlots = kTileK;               // tile positions per chunk
constexpr int kRowsPerScope = 256;           // rows per flush-to-zero scope (ChainSums)

// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which trips
// -Wmaybe-uninitialized (or -Wuninitialized, depending on inlining) when they are inlined into a
// target("avx512f") function (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// MXCSR's flush-to-zero bit for the scope (the tile unit's treatment of subnormal results).
class FlushToZero {
 public:
  FlushToZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz); }
  ~FlushToZero() { _mm_setcsr(saved_); }
  FlushToZero(const FlushToZero&) = delete;
  FlushToZero& operator=(const FlushToZero&) = delete;

 private:
  static constexpr unsigned kFtz = 0x8000;
  unsigned saved_;
};

// Pairs: one VDPBF16PS on dword lanes holding bf16 pairs computes acc = fma(even word,
// fma(odd word, acc)) with subnormals flushed (measured, as for the tile unit), i.e. two steps of
// a chain. Pair q (0..15) of a group puts slot PairSlot(q) in the odd (high) word and the slot
// two further on in the even (low) word: even q extend the even chain, odd q the odd chain, and
// q in increasing order visits each chain's slots in increasing order.
constexpr int PairSlot(int q) { return 4 * (q / 2) + q % 2; }
constexpr int kPairs = kSlots / 2;

// `lines` cache lines from `ahead` (the same group of the row R rows on, RowSums), into L1. The
// rows of a thread's range are one sequential stream, yet the hardware prefetchers alone left
// these kernels at about 12 GB/s from DRAM on two threads on the Sapphire Rapids VM of
// docs/PERF.md, two thirds of their rate in cache; with a prefetch 4 KiB ahead the FP8 matrices
// of a decode step took 19-23 ms instead of 32, the routed experts 13 instead of 20
// (decode_parts_bench). Prefetches past the end of the matrix never fault. always_inline: it
// only prefetches (core/prefetch.h).
DSINFER_AMX_TARGET __attribute__((always_inline)) inline void PrefetchLines(const uint8_t* ahead,
                                                                            int lines) {
  for (int i = 0; i < lines; ++i) PrefetchToL1(ahead + 64 * i);
}

// FP8 gathers from (L_mh, H_mh) (see Fp8Row): slot 8 mh + ml of lane j is byte 8 j + ml.
// kFp8Gather[ml]: into the top byte of dword lane j, the other bytes zero (the fp32 route).
alignas(64) constexpr std::array<std::array<uint8_t, 64>, 8> kFp8Gather = [] {
  std::array<std::array<uint8_t, 64>, 8> idx{};
  for (int ml = 0; ml < 8; ++ml)
    for (int j = 0; j < kLanes; ++j) idx[ml][4 * j + 3] = static_cast<uint8_t>(8 * j + ml);
  return idx;
}();
// kFp8PairGather[ml] (ml = 0, 1): two pairs per dword, slots (ml, ml + 2) in bytes 3 and 1 (the
// high bytes of the two words, pair A) and (ml + 4, ml + 6) in bytes 2 and 0 (pair B, moved up
// by a word shift).
alignas(64) constexpr std::array<std::array<uint8_t, 64>, 2> kFp8PairGather = [] {
  std::array<std::array<uint8_t, 64>, 2> idx{};
  for (int ml = 0; ml < 2; ++ml)
    for (int j = 0; j < kLanes; ++j) {
      idx[ml][4 * j + 3] = static_cast<uint8_t>(8 * j + ml);
      idx[ml][4 * j + 1] = static_cast<uint8_t>(8 * j + ml + 2);
      idx[ml][4 * j + 2] = static_cast<uint8_t>(8 * j + ml + 4);
      idx[ml][4 * j + 0] = static_cast<uint8_t>(8 * j + ml + 6);
    }
  return idx;
}();
constexpr __mmask64 kTopBytes = 0x8888888888888888ull;

// FP4 gathers: byte bi of chunk j, chunks 0..7 from (z[0], z[1]) and 8..15 from (z[2], z[3]) with
// the same indices. kFp4Gather[bi]: into the low byte of dword lane j (the fp32 route);
// kFp4PairGather[h][ml] (ml = 0, 1): the bytes of slots 16 h + ml + {0, 2, 4, 6} into bytes 2, 0,
// 3, 1, so that the low bytes of the two words hold pair (16 h + ml, + 2) and the high bytes pair
// (16 h + ml + 4, + 6), each in low nibbles, and the high nibbles the pairs 8 slots on.
alignas(64) constexpr std::array<std::array<uint8_t, 64>, 16> kFp4Gather = [] {
  std::array<std::array<uint8_t, 64>, 16> idx{};
  for (int bi = 0; bi < 16; ++bi)
    for (int j = 0; j < kLanes; ++j) idx[bi][4 * j] = static_cast<uint8_t>(16 * (j % 8) + bi);
  return idx;
}();
alignas(64) constexpr std::array<std::array<std::array<uint8_t, 64>, 2>, 2> kFp4PairGather = [] {
  std::array<std::array<std::array<uint8_t, 64>, 2>, 2> idx{};
  for (int h = 0; h < 2; ++h)
    for (int ml = 0; ml < 2; ++ml)
      for (int j = 0; j < kLanes; ++j) {
        const int base = 16 * (j % 8) + h;  // byte 2 ml' + h holds slot 16 h + ml' (low nibble)
        idx[h][ml][4 * j + 2] = static_cast<uint8_t>(base + 2 * ml);
        idx[h][ml][4 * j + 0] = static_cast<uint8_t>(base + 2 * (ml + 2));
        idx[h][ml][4 * j + 3] = static_cast<uint8_t>(base + 2 * (ml + 4));
        idx[h][ml][4 * j + 1] = static_cast<uint8_t>(base + 2 * (ml + 6));
      }
  return idx;
}();
constexpr __mmask64 kLowBytesLanes0To7 = 0x0000000011111111ull;
constexpr __mmask64 kLowBytesLanes8To15 = 0x1111111100000000ull;
constexpr __mmask64 kLanes0To7 = 0x00000000ffffffffull;
constexpr __mmask64 kLanes8To15 = 0xffffffff00000000ull;

// Per lane, the exponent of a power-of-two scale e8m0 code e, minus `bias`, as fp32 for
// VSCALEFPS (NaN for the NaN code 255). Scaling by exponent rather than multiplying by the scale
// keeps every input normal: 2^-127 (code 0) is subnormal, and a subnormal input costs a
// microcode assist per instruction.
DSINFER_AMX_TARGET inline __m512 ScaleExponents(__m512i e, int bias) {
  const __m512 exps = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(bias)));
  return _mm512_mask_mov_ps(exps, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                            _mm512_set1_ps(__builtin_nanf("")));
}

// Whether every lane's e lies in [lo, hi] (never, for an empty range).
DSINFER_AMX_TARGET inline bool AllIn(__m512i e, int lo, int hi) {
  return lo <= hi && _mm512_cmpgt_epu32_mask(_mm512_sub_epi32(e, _mm512_set1_epi32(lo)),
                                             _mm512_set1_epi32(hi - lo)) == 0;
}

// Chunk sums (lane = chunk of the group) into one token's two chains, in chunk order.
DSINFER_AMX_TARGET inline void FoldSums(__m512 sums, float* acc) {
  alignas(64) float s[kLanes];
  _mm512_store_ps(s, sums);
  float c0 = acc[0], c1 = acc[1];
  for (int j = 0; j < kLanes; j += 2) {
    c0 += s[j];
    c1 += s[j + 1];
  }
  acc[0] = c0;
  acc[1] = c1;
}

// Four rows' chunk sums (s[i]: row i, lane = chunk) into their chains at once: chains holds
// the even chains of rows 0..3 in lanes 0..3 and the odd chains in lanes 4..7. Each lane adds
// its row's chunks in chunk order, as FoldSums does, so the bits are FoldSums'. Why: row by row
// the fold was 8 lane moves and 8 dependent adds per chain and group plus the chains' round trip
// through memory (perf annotate put about 40 % of the FP4 integer route's samples there, with
// skid); here it is 16 shuffles and 8 adds per 4 rows. Measured 5-10 % faster at one and two
// tokens in cache, within noise from DRAM (docs/PERF.md, 2026-12-05, seventh session).
DSINFER_AMX_TARGET inline __m256 FoldRows4(const __m512 (&s)[4], __m256 chains) {
  // Per 128-bit lane L: t0 = s0[4L], s1[4L], s0[4L+1], s1[4L+1]; t1 the same for 4L+2, 4L+3.
  const __m512 t0 = _mm512_unpacklo_ps(s[0], s[1]), t1 = _mm512_unpackhi_ps(s[0], s[1]);
  const __m512 t2 = _mm512_unpacklo_ps(s[2], s[3]), t3 = _mm512_unpackhi_ps(s[2], s[3]);
  // u[c], lane L: chunk 4 L + c of rows 0..3.
  const auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
  const __m512 u[4] = {_mm512_castpd_ps(_mm512_unpacklo_pd(pd(t0), pd(t2))),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t0), pd(t2))),
                       _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t1), pd(t3))),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t1), pd(t3)))};
  // Step k adds chunk 2k (u[2 (k % 2)], lane k / 2) to the even chains and chunk 2k + 1
  // (u[2 (k % 2) + 1], lane k / 2) to the odd ones: lanes 0, 1 pair up as [u_even | u_odd].
  const __m512i lanes01 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i lanes23 =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 a = _mm512_permutex2var_ps(u[0], lanes01, u[1]);  // steps 0, 2
  const __m512 b = _mm512_permutex2var_ps(u[2], lanes01, u[3]);  // steps 1, 3
  const __m512 c = _mm512_permutex2var_ps(u[0], lanes23, u[1]);  // steps 4, 6
  const __m512 d = _mm512_permutex2var_ps(u[2], lanes23, u[3]);  // steps 5, 7
  chains = _mm256_add_ps(chains, _mm512_castps512_ps256(a));
  chains = _mm256_add_ps(chains, _mm512_castps512_ps256(b));
  chains = _mm256_add_ps(chains, _mm512_extractf32x8_ps(a, 1));
  chains = _mm256_add_ps(chains, _mm512_extractf32x8_ps(b, 1));
  chains = _mm256_add_ps(chains, _mm512_castps512_ps256(c));
  chains = _mm256_add_ps(chains, _mm512_castps512_ps256(d));
  chains = _mm256_add_ps(chains, _mm512_extractf32x8_ps(c, 1));
  return _mm256_add_ps(chains, _mm512_extractf32x8_ps(d, 1));
}

// The per-chunk sums e + o of one group, times the lanes' scales (powers of two, see GroupX).
template <int T>
DSINFER_AMX_TARGET inline void GroupSums(const __m512 (&even)[T], const __m512 (&odd)[T],
                                         __m512 scales, __m512 (&sums)[T]) {
  for (int t = 0; t < T; ++t) sums[t] = _mm512_mul_ps(_mm512_add_ps(even[t], odd[t]), scales);
}

// One slot's 16 weights (fp32, lane = chunk) against T tokens' activations for that slot.
template <int T>
DSINFER_AMX_TARGET inline void SlotFma(__m512 wv, const float* x_slot, int64_t x_token,
                                       __m512 (&chain)[T]) {
  for (int t = 0; t < T; ++t)
    chain[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x_slot + t * x_token), chain[t]);
}

// One pair's 16 weight pairs (bf16) against T tokens' activation pairs.
template <int T>
DSINFER_AMX_TARGET inline void PairDot(__m512i wv, const uint32_t* x_pair, int64_t x_token,
                                       __m512 (&chain)[T]) {
  for (int t = 0; t < T; ++t)
    chain[t] =
        _mm512_dpbf16_ps(chain[t], reinterpret_cast<__m512bh>(wv),
                         reinterpret_cast<__m512bh>(_mm512_loadu_si512(x_pair + t * x_token)));
}

// Activations for T tokens: xs fp32 [group][slot][lane] and xp bf16 pairs [group][pair][lane]
// (times kFp8PairShift for FP8), with the distance between tokens, and per group the range of
// scale codes [code_lo, code_hi] for which the pair route is exact (see MatMulRowsVector).
//
// The pair routes sum weights without their scale and multiply each chunk's e + o by it once:
// a power-of-two factor commutes exactly with every rounding of the chain as long as no product
// or partial sum, scaled or not, is subnormal or overflows. Products of bf16 x (8 significant
// bits) and e4m3/e2m1 codes (4/2) are exact and all partial sums are multiples of 2^(lowest
// product exponent - 16), so bounding the lowest and highest product exponents from the group's
// activation exponents and the scale code keeps every intermediate normal in both domains.
struct GroupX {
  const float* xs;
  int64_t xs_token;
  const uint32_t* xp;
  int64_t xp_token;
  const int16_t* code_lo;  // [groups]
  const int16_t* code_hi;  // [groups]
  // FP4 integer route (Fp4IntegerGroup): ab [token][group][block][parity][plane][64] signed
  // bytes: byte m of parity 0 (even) holds plane p (l, m, h) of A for column 128 block + 2m of
  // the group (its value times 2^-shift of its chunk), of parity 1 for column 128 block + 2m + 1;
  // per token and chunk [token][chunk] the shift, 12 * sum(A) (int_corr) and the scale codes
  // [int_lo, int_hi] for which the route is exact; int_group [group]: the planes every chunk of
  // the group needs for every token (2 or 3), or 0 when a chunk is not an integer one.
  const int8_t* ab;
  int64_t ab_token;
  const int32_t* int_shift;
  const int32_t* int_corr;
  const int32_t* int_lo;
  const int32_t* int_hi;
  int64_t int_token;
  const uint8_t* int_group;
};

// FP8 pair route: the weight bits read as e4m3 value times 2^-120, the activations are stored
// times 2^60 and the chunk sums multiplied by 2^(code - 127 + 60), so the unscaled sums stay
// normal for activation exponents in [-50, 67] (MatMulRowsVector's bounds).
constexpr int kFp8PairShift = 60;

// FP8 row r, whole group g. Group bytes: 8 chunk pairs of 64; pair i (chunks 2i, 2i+1) holds slot
// m = 8 mh + ml of chunk 2i + q at byte 16 mh + 8 q + ml (Fp8PairColumn). L_mh gathers 128-bit
// lane mh of pairs 0..3 and H_mh of pairs 4..7 (a 4x4 transpose of lanes), so lane j = 2i + q
// finds slot m at byte 8 j + ml of (L_mh, H_mh).
// Pair route (no subnormal code in the group, block scales in the group's exact range): a code
// in the high byte of a word, shifted right arithmetically by 4 and masked, is bf16 of its value
// times 2^-120; the pairs go to VDPBF16PS and the chunk sums are scaled (GroupX). General route:
// the same bits in the top byte of a dword, rebiased into the code's exact fp32 value (normal for
// every code), and a scalef makes the weight exactly, flushed as the tile unit flushes.
template <int T>
DSINFER_AMX_TARGET __attribute__((always_inline)) inline void Fp8Group(const WeightMatrix& w,
                                                                       int64_t r, int64_t g,
                                                                       const GroupX& x,
                                                                       __m512 (&sums)[T],
                                                                       VectorRoutes& routes) {
  const uint8_t* row = w.data + r * w.cols;
  const uint8_t* scale_codes = w.scales + (r / kBlockCols) * w.scale_cols;
  const __m128i repeat4 = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const uint8_t* p = row + g * kGroupCols;
  // Lane j's chunk lies in column block 4 g + j / 4.
  uint32_t four = 0;
  std::memcpy(&four, scale_codes + 4 * g, 4);
  const __m512i codes =
      _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(four)), repeat4));
  __m512i lh[8];  // L_0..L_3, H_0..H_3
  __mmask64 subnormal = 0;
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = p + half * 256;
    __m512i y[4];
    for (int i = 0; i < 4; ++i) {
      y[i] = _mm512_loadu_si512(q + 64 * i);
      subnormal |= _mm512_mask_test_epi8_mask(_mm512_testn_epi8_mask(y[i], _mm512_set1_epi8(0x78)),
                                              y[i], _mm512_set1_epi8(0x07));
    }
    const __m512i t0 = _mm512_shuffle_i64x2(y[0], y[1], 0x44);
    const __m512i t1 = _mm512_shuffle_i64x2(y[0], y[1], 0xee);
    const __m512i t2 = _mm512_shuffle_i64x2(y[2], y[3], 0x44);
    const __m512i t3 = _mm512_shuffle_i64x2(y[2], y[3], 0xee);
    lh[4 * half + 0] = _mm512_shuffle_i64x2(t0, t2, 0x88);
    lh[4 * half + 1] = _mm512_shuffle_i64x2(t0, t2, 0xdd);
    lh[4 * half + 2] = _mm512_shuffle_i64x2(t1, t3, 0x88);
    lh[4 * half + 3] = _mm512_shuffle_i64x2(t1, t3, 0xdd);
  }
  __m512 even[T], odd[T];
  for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm512_setzero_ps();
  __m512 scales = _mm512_set1_ps(1.0f);
  const bool pairs = subnormal == 0 && AllIn(codes, x.code_lo[g], x.code_hi[g]);
  ++(pairs ? routes.pairs : routes.general);
  if (pairs) {
    scales = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(codes, _mm512_set1_epi32(kFp8PairShift)), 23));
    const __m512i keep = _mm512_set1_epi16(static_cast<int16_t>(0x87f0));
    const uint32_t* xg = x.xp + g * kPairs * kLanes;
    for (int mh = 0; mh < 4; ++mh)
      for (int ml = 0; ml < 2; ++ml) {  // even chain for ml 0, odd for 1
        const __m512i v = _mm512_permutex2var_epi8(
            lh[mh], _mm512_load_si512(kFp8PairGather[ml].data()), lh[4 + mh]);
        for (int b = 0; b < 2; ++b) {  // pairs (8 mh + ml + 4 b, + 2); the low byte is masked
          __m512i u = b == 0 ? v : _mm512_slli_epi16(v, 8);
          u = _mm512_and_si512(_mm512_srai_epi16(u, 4), keep);
          const int m = 8 * mh + ml + 4 * b;
          const int q = 2 * (m / 4) + m % 2;
          PairDot<T>(u, xg + q * kLanes, x.xp_token, ml == 0 ? even : odd);
        }
      }
  } else {
    const __m512 exps = ScaleExponents(codes, 127);
    const __m512i keep = _mm512_set1_epi32(static_cast<int32_t>(0x87f00000u));
    const __m512i exponent_bits = _mm512_set1_epi32(0x07800000);
    const __m512i rebias = _mm512_set1_epi32(120 << 23);  // e4m3 bias 7 -> fp32 bias 127
    const __m512i one_up = _mm512_set1_epi32(1 << 23);
    const __m512i sign_bit = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
    const __m512i two_to_minus6 = _mm512_set1_epi32(121 << 23);
    const float* xg = x.xs + g * kSlots * kLanes;
    for (int mh = 0; mh < 4; ++mh)
      for (int ml = 0; ml < 8; ++ml) {
        __m512i v = _mm512_maskz_permutex2var_epi8(
            kTopBytes, lh[mh], _mm512_load_si512(kFp8Gather[ml].data()), lh[4 + mh]);
        v = _mm512_and_si512(_mm512_srai_epi32(v, 4), keep);
        // The code's exact value as a normal fp32 (a subnormal fp32 input costs a microcode
        // assist per instruction: weights full of subnormal codes ran 12x slower, docs/PERF.md):
        // normal codes by rebiasing the exponent; subnormal codes (and zeros) as
        // 2^-6 (1 + m/8) - 2^-6 = 2^-6 m/8, which is exact.
        const __mmask16 low = _mm512_testn_epi32_mask(v, exponent_bits);
        v = _mm512_mask_add_epi32(_mm512_add_epi32(v, rebias), low, v,
                                  _mm512_add_epi32(rebias, one_up));
        __m512 value = _mm512_castsi512_ps(v);
        value = _mm512_mask_sub_ps(
            value, low, value,
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(v, sign_bit), two_to_minus6)));
        const __m512 wv = _mm512_scalef_ps(value, exps);
        const int m = 8 * mh + ml;
        SlotFma<T>(wv, xg + m * kLanes, x.xs_token, m % 2 == 0 ? even : odd);
      }
  }
  GroupSums<T>(even, odd, scales, sums);
}

// FP4 integer route. Twice an e2m1 value is an integer in [-12, 12]. When a chunk's activations
// are integers A times 2^shift, every partial sum the tile unit forms for that chunk (a sum of
// some of its products, in any order) is an integer multiple of u = 2^(shift - 1 + code - 127)
// of magnitude at most 12 * sum(|A|) u. With 12 * sum(|A|) <= 2^24 all of them are exact in
// fp32, the tile unit's chains add without rounding, and the chunk's e + o is the exact sum,
// which integer dot products give bit for bit. Exact while u is normal and 2^24 u finite:
// shift + code in [2, 231], with code in [2, 252] for normal, finite weights (MatMulRowsVector's
// int_lo/int_hi). The bound on the sum, not on each A, admits the chunks of w2's input (silu(g) u,
// FP8-quantized): a few large values beside many small ones, past int16 but far from 2^24.
//
// The dot products are VPDPBUSD (unsigned x signed bytes, 64 products per instruction): each
// weight as the byte 2w + 12 in [0, 24] (kFp4ByteTable, one byte lookup per 64 weights), each
// activation as signed bytes A = 65536 h + 256 m + l (l the low byte read as signed, m likewise
// of (A - l) / 256), the h plane only for groups that need it, and the offset taken back as
// 12 * sum(A) per chunk (GroupX::int_corr). Against word lookups and VPDPWSSD on int16 (the
// route before) this halves the lookups and drops three of four shifts (docs/PERF.md,
// 2026-12-05, seventh session).
constexpr int kFp4ByteOffset = 12;
constexpr int32_t kIntegerAbsSumMax = (1 << 24) / 12;        // 1398101: 12 * sum(|A|) <= 2^24
constexpr int kIntegerPlanes = 3;                            // l, m, h (GroupX::ab)
constexpr int kIntegerBlockBytes = 2 * kIntegerPlanes * 64;  // per block of 128 columns
constexpr int kIntegerGroupBytes = 4 * kIntegerBlockBytes;   // per group of 512 columns
// 2w + 12 for the code in an index's low four bits; bits 4 and 5 (the next nibble's, after a
// shift) select one of four copies, and VPERMB ignores bits 6 and 7.
alignas(64) constexpr std::array<uint8_t, 64> kFp4ByteTable = [] {
  constexpr int kTwice[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  std::array<uint8_t, 64> table{};
  for (int i = 0; i < 64; ++i) {
    const int code = i % 16, twice = code < 8 ? kTwice[code] : -kTwice[code - 8];
    table[i] = static_cast<uint8_t>(twice + kFp4ByteOffset);
  }
  return table;
}();

// Chunk totals from VPDPBUSD's dword lanes: the lanes of block b's sums hold 4 partial sums for
// each of chunks 4 b .. 4 b + 3, in order. HalfTotals adds pairs of them for blocks 2 h, 2 h + 1
// (lane l: half l % 2 of chunk 8 h + l / 2), ChunkTotals the halves of both (lane = chunk).
// Integer adds: any order is exact. Split in two so that a caller can reduce blocks 0 and 1
// while 2 and 3 are still being summed, with fewer registers live.
alignas(64) constexpr std::array<std::array<int32_t, 16>, 2> kPairOfLanes = [] {
  std::array<std::array<int32_t, 16>, 2> idx{};  // [first/second of a pair][lane]
  for (int l = 0; l < 16; ++l) {
    const int c = l / 2, h = l % 2;  // lane l: half h of chunk c's four sums
    idx[0][l] = (c < 4 ? 0 : 16) + 4 * (c % 4) + 2 * h;
    idx[1][l] = idx[0][l] + 1;
  }
  return idx;
}();
alignas(64) constexpr std::array<std::array<int32_t, 16>, 2> kHalfOfLanes = [] {
  std::array<std::array<int32_t, 16>, 2> idx{};
  for (int c = 0; c < 16; ++c) {
    idx[0][c] = c < 8 ? 2 * c : 16 + 2 * (c - 8);
    idx[1][c] = idx[0][c] + 1;
  }
  return idx;
}();

DSINFER_AMX_TARGET inline __m512i HalfTotals(__m512i first, __m512i second) {
  const __m512i a = _mm512_load_si512(kPairOfLanes[0].data());
  const __m512i b = _mm512_load_si512(kPairOfLanes[1].data());
  return _mm512_add_epi32(_mm512_permutex2var_epi32(first, a, second),
                          _mm512_permutex2var_epi32(first, b, second));
}

DSINFER_AMX_TARGET inline __m512i ChunkTotals(__m512i lo, __m512i hi) {
  const __m512i c = _mm512_load_si512(kHalfOfLanes[0].data());
  const __m512i d = _mm512_load_si512(kHalfOfLanes[1].data());
  return _mm512_add_epi32(_mm512_permutex2var_epi32(lo, c, hi),
                          _mm512_permutex2var_epi32(lo, d, hi));
}

// Whether every chunk of group g takes the integer route with these scale codes, for every token.
template <int T>
DSINFER_AMX_TARGET inline bool IntegerCodesFit(__m512i codes, const GroupX& x, int64_t g) {
  for (int t = 0; t < T; ++t) {
    const int64_t at = t * x.int_token + g * kLanes;
    const __mmask16 ok = _mm512_cmpge_epi32_mask(codes, _mm512_loadu_si512(x.int_lo + at)) &
                         _mm512_cmple_epi32_mask(codes, _mm512_loadu_si512(x.int_hi + at));
    if (ok != 0xffff) return false;
  }
  return true;
}

// Group g of R FP4 rows (rows[i]: row i's 256 bytes of the group, 4 blocks of 4 chunks;
// codes[i]: its 16 chunk scale codes) by exact integer sums, with the activations in kPlanes (2
// or 3) byte planes. Byte m of block b holds columns 2m (low nibble) and 2m + 1 (high nibble) of
// the block: one lookup of the low nibbles and one of the high give the even and odd columns'
// weight bytes, and dword d of either (columns 8d .. 8d + 7) lies in chunk d / 4, with the
// activations' planes laid out alike (GroupX::ab). Per block the planes are summed from the
// highest, shifting the running sum a byte up before the next: sum(w l) + 256 sum(w m) + ...
// without a register per plane.
//
// The R rows go stage by stage (all rows' blocks 0 and 1, their half totals, blocks 2 and 3,
// then the scaling) rather than row after row. Why: a row's group is one long dependency chain
// (lookup, two to six dot products, permutes, conversion, multiply) of ~60 vector ops; row
// after row, the scheduler held about one such chain and waited on it. Removing any one
// stage's ops barely changed the time, as a latency bound predicts. Interleaved, ns per group
// from L3 on the Sapphire Rapids VM: one token w1 16.8 -> 13.9, w2 20.3 -> 15.0; two tokens
// 23.6 -> 20.8 and 35.0 -> 26.3. From DRAM at one token the experts still read ~21 GB/s: there
// the memory side sets the pace (docs/PERF.md, 2026-12-05, eighth session).
template <int T, int kPlanes, int R>
DSINFER_AMX_TARGET __attribute__((always_inline)) inline void Fp4IntegerRows(
    const uint8_t* const (&rows)[R], const __m512i (&codes)[R], const GroupX& x, int64_t g,
    __m512 (*sums_out)[T]) {
  const __m512i table = _mm512_load_si512(kFp4ByteTable.data());
  __m512i halves[2][T][R];  // [blocks 0-1 / 2-3][token][row] HalfTotals
  for (int half = 0; half < 2; ++half) {
    __m512i block_sums[2][T][R];
    for (int bb = 0; bb < 2; ++bb) {
      const int b = 2 * half + bb;
      for (int i = 0; i < R; ++i) {
        const __m512i z = _mm512_loadu_si512(rows[i] + 64 * b);
        const __m512i even = _mm512_permutexvar_epi8(z, table);
        const __m512i odd = _mm512_permutexvar_epi8(_mm512_srli_epi16(z, 4), table);
        for (int t = 0; t < T; ++t) {
          const int8_t* ab =
              x.ab + t * x.ab_token + g * kIntegerGroupBytes + b * kIntegerBlockBytes;
          __m512i sum = _mm512_setzero_si512();
          for (int p = kPlanes - 1; p >= 0; --p) {  // h, m, l
            if (p != kPlanes - 1) sum = _mm512_slli_epi32(sum, 8);
            sum = _mm512_dpbusd_epi32(sum, even, _mm512_loadu_si512(ab + 64 * p));
            sum = _mm512_dpbusd_epi32(sum, odd, _mm512_loadu_si512(ab + 64 * (kIntegerPlanes + p)));
          }
          block_sums[bb][t][i] = sum;
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < R; ++i)
        halves[half][t][i] = HalfTotals(block_sums[0][t][i], block_sums[1][t][i]);
  }
  for (int t = 0; t < T; ++t) {
    const int64_t at = t * x.int_token + g * kLanes;
    const __m512i corr = _mm512_loadu_si512(x.int_corr + at);
    // The chunk's unit 2^(shift - 1 + code - 127): exponent field shift + code - 1, in [1, 251].
    const __m512i shift_less_one =
        _mm512_add_epi32(_mm512_loadu_si512(x.int_shift + at), _mm512_set1_epi32(-1));
    for (int i = 0; i < R; ++i) {
      const __m512i totals = _mm512_sub_epi32(ChunkTotals(halves[0][t][i], halves[1][t][i]), corr);
      const __m512 unit =
          _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(shift_less_one, codes[i]), 23));
      sums_out[i][t] = _mm512_mul_ps(_mm512_cvtepi32_ps(totals), unit);
    }
  }
}

// Group g of rows r .. r + R - 1 by Fp4IntegerRows when every chunk of every row takes the
// integer route (IntegerCodesFit); returns whether it did (else sums is untouched).
template <int T, int R>
DSINFER_AMX_TARGET __attribute__((always_inline)) inline bool Fp4IntegerGroup(
    const WeightMatrix& w, int64_t r, int64_t stride, int64_t g, const GroupX& x, __m512 (*sums)[T],
    VectorRoutes& routes) {
  if (x.int_group[g] == 0) return false;
  const uint8_t* rows[R];
  __m512i codes[R];
  for (int i = 0; i < R; ++i) {
    rows[i] = w.data + (r + i * stride) * (w.cols / 2) + g * (kGroupCols / 2);
    codes[i] = _mm512_cvtepu8_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(w.scales + (r + i * stride) * w.scale_cols + g * kLanes)));
    if (!IntegerCodesFit<T>(codes[i], x, g)) return false;
  }
  if (x.int_group[g] == 2) {
    Fp4IntegerRows<T, 2, R>(rows, codes, x, g, sums);
  } else {
    Fp4IntegerRows<T, 3, R>(rows, codes, x, g, sums);
    routes.integer_wide += R;
  }
  routes.integer += R;
  return true;
}

// FP4 row r, whole group g, when the integer route (Fp4IntegerGroup, which RowSums tries first)
// does not apply. Chunk j's 16 bytes: slot m = 8 mh + ml is the nibble mh % 2 of byte 2 ml + mh / 2
// (Fp4ChunkColumn), so one gather of bytes serves a low-nibble slot and the slot 8 further on.
// Pair route (every chunk scale in the group's exact range): gathered byte pairs look up bf16
// e2m1 values (kFp4Table), VDPBF16PS sums, the chunk sums are scaled (GroupX).
// General route: fp32 e2m1 values scaled by the lane's scale exponent (exact, flushed as the
// tile unit flushes), FMAs.
template <int T>
DSINFER_AMX_TARGET __attribute__((always_inline)) inline void Fp4Group(const WeightMatrix& w,
                                                                       int64_t r, int64_t g,
                                                                       const GroupX& x,
                                                                       __m512 (&sums)[T],
                                                                       VectorRoutes& routes) {
  const uint8_t* p = w.data + r * (w.cols / 2) + g * (kGroupCols / 2);
  const __m512i z[4] = {_mm512_loadu_si512(p), _mm512_loadu_si512(p + 64),
                        _mm512_loadu_si512(p + 128), _mm512_loadu_si512(p + 192)};
  const __m512i codes = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + r * w.scale_cols + g * kLanes)));
  __m512 even[T], odd[T];
  for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm512_setzero_ps();
  __m512 scales = _mm512_set1_ps(1.0f);
  const bool pairs = AllIn(codes, x.code_lo[g], x.code_hi[g]);
  ++(pairs ? routes.pairs : routes.general);
  if (pairs) {
    scales = _mm512_castsi512_ps(_mm512_slli_epi32(codes, 23));
    const __m512i table = _mm512_load_si512(kFp4Table.data());
    const uint32_t* xg = x.xp + g * kPairs * kLanes;
    for (int h = 0; h < 2; ++h) {  // slots 16 h .. 16 h + 15
      __m512i bytes[2];
      for (int ml = 0; ml < 2; ++ml) {
        const __m512i idx = _mm512_load_si512(kFp4PairGather[h][ml].data());
        bytes[ml] = _mm512_or_si512(_mm512_maskz_permutex2var_epi8(kLanes0To7, z[0], idx, z[1]),
                                    _mm512_maskz_permutex2var_epi8(kLanes8To15, z[2], idx, z[3]));
      }
      // Word shifts 0, 8, 4, 12 bring the pairs at slot offsets 0, 4, 8, 12 to the low bits
      // (the index's bit 4 is ignored by the duplicated table), in each chain's order.
      for (int shift : {0, 8, 4, 12})
        for (int ml = 0; ml < 2; ++ml) {
          const __m512i index = _mm512_srli_epi16(bytes[ml], shift);
          const __m512i v = _mm512_permutexvar_epi16(index, table);
          const int m = 16 * h + ml + (shift == 8 ? 4 : shift == 4 ? 8 : shift);
          const int q = 2 * (m / 4) + m % 2;
          PairDot<T>(v, xg + q * kLanes, x.xp_token, ml == 0 ? even : odd);
        }
    }
  } else {
    const __m512 exps = ScaleExponents(codes, 127);
    const __m512 table = _mm512_loadu_ps(kE2M1Values);  // core/dtype.h
    const float* xg = x.xs + g * kSlots * kLanes;
    for (int h = 0; h < 2; ++h) {  // mh in {2h, 2h + 1}: bytes 2 ml + h
      __m512i bytes[8];
      for (int ml = 0; ml < 8; ++ml) {
        const __m512i idx = _mm512_load_si512(kFp4Gather[2 * ml + h].data());
        bytes[ml] =
            _mm512_or_si512(_mm512_maskz_permutex2var_epi8(kLowBytesLanes0To7, z[0], idx, z[1]),
                            _mm512_maskz_permutex2var_epi8(kLowBytesLanes8To15, z[2], idx, z[3]));
      }
      for (int nibble = 0; nibble < 2; ++nibble)
        for (int ml = 0; ml < 8; ++ml) {  // slots 16 h + 8 nibble + ml
          const __m512i index = nibble == 0 ? bytes[ml] : _mm512_srli_epi32(bytes[ml], 4);
          const __m512 wv = _mm512_scalef_ps(_mm512_permutexvar_ps(index, table), exps);
          SlotFma<T>(wv, xg + (16 * h + 8 * nibble + ml) * kLanes, x.xs_token,
                     ml % 2 == 0 ? even : odd);
        }
    }
  }
  GroupSums<T>(even, odd, scales, sums);
}

DSINFER_AMX_TARGET inline float ScalarFma(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// bf16 bits -> fp32, subnormals read as zero (as the tile unit reads its inputs).
inline float Bf16ToF32Daz(uint16_t bits) { return (bits & 0x7f80) == 0 ? 0.0f : Bf16ToF32(bits); }

// The chunks past the last full group ([c_begin, chunks), fewer than 16) of row r: converted by
// the tile path's own conversion into buf and summed with scalar FMAs in the tile unit's order.
// xt [token][chunk - c_begin][32] fp32 in TileOrder.
DSINFER_AMX_TARGET void TailRow(const WeightMatrix& w, int64_t r, int64_t c_begin, int n_tok,
                                const float* xt, int64_t xt_token, uint16_t* buf, float (*acc)[2]) {
  const int64_t chunks = w.cols / kTileK;
  const int64_t b_begin = c_begin / kPerBlock, n_blocks = (chunks + kPerBlock - 1) / kPerBlock;
  for (int64_t b = b_begin; b < n_blocks; ++b)
    ConvertBlock(w, r, 1, b, BlockChunks(chunks, b), nullptr,
                 buf + (b - b_begin) * kPerBlock * kTileElems);
  for (int64_t c = c_begin; c < chunks; ++c) {
    const uint16_t* a = buf + (c - c_begin) * kTileElems;  // row 0 of chunk c's A tile
    for (int t = 0; t < n_tok; ++t) {
      const float* xc = xt + t * xt_token + (c - c_begin) * kTileK;
      float e = 0.0f, o = 0.0f;
      for (int i = 0; i < kTileK / 2; ++i) {
        e = ScalarFma(Bf16ToF32Daz(a[2 * i]), xc[2 * i], e);
        o = ScalarFma(Bf16ToF32Daz(a[2 * i + 1]), xc[2 * i + 1], o);
      }
      acc[t][c % 2] += e + o;
    }
  }
}

// Rows interleaved by the row sums: one row's groups are more work than the out-of-order window
// holds, so rows one after another overlapped little; R rows group by group keep R rows' loads
// and chains in flight (measured: FP8 at one token -13 %, FP4 unchanged; docs/PERF.md), and four
// rows' chains fold with one set of vector adds (FoldRows4). Eight rows measured no faster. Each
// row still sums its groups in order, so the bits are unchanged. The FP4 integer route goes
// further and interleaves the four rows' instructions (Fp4IntegerRows).
constexpr int kInterleavedRows = 4;

// Rows r + i stride, i = 0 .. R - 1 (R = 1 or kInterleavedRows), group by group, each row's
// groups in order; acc[i stride]: row r + i stride's chains. The groups are inlined: a call per
// group cost as much as its sums.
template <int T, int R, bool kFp8>
DSINFER_AMX_TARGET void RowSumsOf(const WeightMatrix& w, int64_t r, int64_t stride, int64_t groups,
                                  const GroupX& x, float (*acc)[kVectorMaxTokens][2],
                                  VectorRoutes& routes_out) {
  // Counted in a local: through the reference, each group's count was a load and a store that
  // the sums' stores kept the compiler from holding in a register.
  VectorRoutes routes;
  static_assert(R == 1 || R == kInterleavedRows);
  const int64_t row_bytes = kFp8 ? w.cols : w.cols / 2;
  const int64_t group_bytes = kFp8 ? kGroupCols : kGroupCols / 2;
  // The same group of the row each of the R streams reads next (ChainSums): one row on, or R
  // rows on when the rows are adjacent; a whole row's groups ahead in time.
  const int64_t ahead = (stride == 1 ? R : 1) * row_bytes;
  __m256 chains[T];  // R = 4: [even chains of rows 0..3 | odd chains], FoldRows4
  if constexpr (R == kInterleavedRows)
    for (int t = 0; t < T; ++t)
      chains[t] = _mm256_setr_ps(acc[0][t][0], acc[stride][t][0], acc[2 * stride][t][0],
                                 acc[3 * stride][t][0], acc[0][t][1], acc[stride][t][1],
                                 acc[2 * stride][t][1], acc[3 * stride][t][1]);
  for (int64_t g = 0; g < groups; ++g) {
    for (int i = 0; i < R; ++i)
      PrefetchLines(w.data + (r + i * stride) * row_bytes + g * group_bytes + ahead,
                    group_bytes / 64);
    __m512 sums[R][T];
    bool integer = false;  // every row's group took the FP4 integer route
    if constexpr (!kFp8) integer = Fp4IntegerGroup<T, R>(w, r, stride, g, x, sums, routes);
    for (int i = 0; i < R && !integer; ++i) {
      if constexpr (kFp8)
        Fp8Group<T>(w, r + i * stride, g, x, sums[i], routes);
      else if (R == 1 || !Fp4IntegerGroup<T, 1>(w, r + i * stride, 1, g, x, &sums[i], routes))
        Fp4Group<T>(w, r + i * stride, g, x, sums[i], routes);
    }
    for (int t = 0; t < T; ++t) {
      if constexpr (R == kInterleavedRows)
        chains[t] = FoldRows4({sums[0][t], sums[1][t], sums[2][t], sums[3][t]}, chains[t]);
      else
        FoldSums(sums[0][t], acc[0][t]);
    }
  }
  if constexpr (R == kInterleavedRows)
    for (int t = 0; t < T; ++t) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, chains[t]);
      for (int i = 0; i < R; ++i)
        acc[i * stride][t][0] = lanes[i], acc[i * stride][t][1] = lanes[4 + i];
    }
  routes_out += routes;
}

// RowSumsOf for n_tok tokens (the vector kernels' limits: FP8 up to two, FP4 up to three).
template <int R>
DSINFER_AMX_TARGET void RowSums(const WeightMatrix& w, int n_tok, int64_t r, int64_t stride,
                                int64_t groups, const GroupX& x, float (*acc)[kVectorMaxTokens][2],
                                VectorRoutes& routes) {
  static_assert(kVectorMaxTokensFp8 == 2 && kVectorMaxTokens == 3, "the cases below");
  const bool fp8 = w.format == WeightFormat::kFp8Block;
  switch (n_tok) {
    case 1:
      return fp8 ? RowSumsOf<1, R, true>(w, r, stride, groups, x, acc, routes)
                 : RowSumsOf<1, R, false>(w, r, stride, groups, x, acc, routes);
    case 2:
      return fp8 ? RowSumsOf<2, R, true>(w, r, stride, groups, x, acc, routes)
                 : RowSumsOf<2, R, false>(w, r, stride, groups, x, acc, routes);
    default:
      return RowSumsOf<3, R, false>(w, r, stride, groups, x, acc, routes);
  }
}

// The two chains of rows [r0, r1) (at most kRowsPerScope) for every token: acc [row][token][2].
// Not inlined: the flush-to-zero scope must cover exactly these sums.
DSINFER_AMX_TARGET __attribute__((noinline)) void ChainSums(
    const WeightMatrix& w, int64_t r0, int64_t r1, int n_tok, GroupX x, const float* xt,
    int64_t xt_token, uint16_t* tail_buf, float (*acc)[kVectorMaxTokens][2], VectorRoutes& routes) {
  const int64_t chunks = w.cols / kTileK, groups = chunks / kLanes;
  FlushToZero ftz;
  for (int64_t r = r0; r < r1; ++r)
    for (int t = 0; t < n_tok; ++t) acc[r - r0][t][0] = acc[r - r0][t][1] = 0.0f;
  // The interleaved rows come from the four quarters of [r0, r1), so that each walks its
  // quarter row after row: four long sequential streams instead of one stream that jumps back
  // and forth inside every four rows. The hardware prefetchers follow the former much better,
  // and the weight reads are most of these kernels' time from DRAM: six routed experts at one
  // token went from 60-64 % to 69-85 % of the read probe (decode_parts_bench), a batch-16 decode
  // step from ~61 to ~67 % of its roofline, with longer streams better up to kRowsPerScope = 256
  // (docs/PERF.md, ninth session). Each row's sums are unchanged: only which rows share a pass.
  const int64_t stride = (r1 - r0) / kInterleavedRows;
  for (int64_t q = 0; q < stride; ++q)
    RowSums<kInterleavedRows>(w, n_tok, r0 + q, stride, groups, x, acc + q, routes);
  for (int64_t r = r0 + kInterleavedRows * stride; r < r1; ++r)
    RowSums<1>(w, n_tok, r, 1, groups, x, acc + (r - r0), routes);
  if (groups * kLanes < chunks)
    for (int64_t r = r0; r < r1; ++r)
      TailRow(w, r, groups * kLanes, n_tok, xt, xt_token, tail_buf, acc[r - r0]);
}

// One chunk of 32 activations as the integer route's A (the integers of ChunkAsInt16,
// exact_int16.h, under this route's own bound: sum(|A|) <= kIntegerAbsSumMax instead of
// |A| <= 32767), written as byte planes (GroupX::ab): planes points at the chunk's first byte
// in the even l plane of its block, value 2i goes to byte i of the even planes, 2i + 1 to byte i
// of the odd ones. Returns the planes the chunk needs (2 when every h is 0, else 3), or 0 when
// it is not an integer chunk; *corr is 12 times the sum of the A. The scalar loops this replaced
// were the larger part of the activation preparation (~3 % of a batch-16 decode step on the
// Sapphire Rapids VM).
DSINFER_AMX_TARGET int ChunkAsBytePlanes(const float* x, int* shift, int32_t* corr,
                                         int8_t* planes) {
  const __m512i magnitude_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i zero = _mm512_setzero_si512();
  __m512i bits[2], biased[2], significand[2];
  __mmask16 nonzero[2];
  __m512i low = _mm512_set1_epi32(1000);  // lowest set bit's exponent over the nonzero values
  __m512i abs_sum = zero;
  for (int h = 0; h < 2; ++h) {
    bits[h] = _mm512_loadu_si512(x + 16 * h);
    const __m512i magnitude = _mm512_and_si512(bits[h], magnitude_mask);
    nonzero[h] = _mm512_test_epi32_mask(magnitude, magnitude);
    biased[h] = _mm512_srli_epi32(magnitude, 23);
    // Subnormal, infinite or NaN.
    if ((_mm512_mask_cmpeq_epi32_mask(nonzero[h], biased[h], zero) |
         _mm512_mask_cmpeq_epi32_mask(nonzero[h], biased[h], _mm512_set1_epi32(255))) != 0)
      return 0;
    significand[h] = _mm512_or_si512(_mm512_and_si512(magnitude, _mm512_set1_epi32(0x7fffff)),
                                     _mm512_set1_epi32(0x800000));
    // Trailing zeros: the exponent of the lowest set bit alone, converted exactly to fp32.
    const __m512i lowest = _mm512_and_si512(significand[h], _mm512_sub_epi32(zero, significand[h]));
    const __m512i zeros =
        _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(lowest)), 23),
                         _mm512_set1_epi32(127));
    low = _mm512_mask_min_epi32(
        low, nonzero[h], low,
        _mm512_add_epi32(_mm512_sub_epi32(biased[h], _mm512_set1_epi32(150)), zeros));
  }
  int lowest_bit = _mm512_reduce_min_epi32(low);
  if (lowest_bit == 1000) lowest_bit = 0;  // all zero
  __m512i values[2];
  for (int h = 0; h < 2; ++h) {
    const __m512i up =
        _mm512_sub_epi32(biased[h], _mm512_set1_epi32(150 + lowest_bit));   // >= -trailing zeros
    if (_mm512_mask_cmpgt_epi32_mask(nonzero[h], up, zero) != 0) return 0;  // >= 2^24
    const __m512i magnitude =
        _mm512_maskz_srlv_epi32(nonzero[h], significand[h], _mm512_sub_epi32(zero, up));
    abs_sum = _mm512_add_epi32(abs_sum, magnitude);  // each < 2^24: no overflow in 32 lanes
    values[h] =
        _mm512_mask_sub_epi32(magnitude, _mm512_cmplt_epi32_mask(bits[h], zero), zero, magnitude);
  }
  if (_mm512_reduce_add_epi32(abs_sum) > kIntegerAbsSumMax) return 0;
  const __m512i even_index =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_index = _mm512_add_epi32(even_index, _mm512_set1_epi32(1));
  const __m512i parity[2] = {_mm512_permutex2var_epi32(values[0], even_index, values[1]),
                             _mm512_permutex2var_epi32(values[0], odd_index, values[1])};
  __mmask16 high_nonzero = 0;
  for (int p = 0; p < 2; ++p) {
    // A = 65536 h + 256 m + l, l and m low bytes read as signed; |A| <= 1398101 < 2^21 keeps
    // h within [-32, 32].
    const auto low_byte = [](__m512i v) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24); };
    const __m512i l = low_byte(parity[p]);
    const __m512i rest = _mm512_srai_epi32(_mm512_sub_epi32(parity[p], l), 8);
    const __m512i m = low_byte(rest);
    const __m512i h = _mm512_srai_epi32(_mm512_sub_epi32(rest, m), 8);
    high_nonzero |= _mm512_test_epi32_mask(h, h);
    int8_t* out = planes + p * kIntegerPlanes * 64;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(l));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 64), _mm512_cvtepi32_epi8(m));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 128), _mm512_cvtepi32_epi8(h));
  }
  *corr = kFp4ByteOffset * _mm512_reduce_add_epi32(_mm512_add_epi32(values[0], values[1]));
  *shift = lowest_bit;
  return high_nonzero == 0 ? 2 : 3;
}

// Gather indices of one group's activations, relative to the group's first column (512 g):
// [slot m][lane j] the column TileOrder puts at slot m of chunk 16 g + j. A whole group's FP8
// chunks are always in pairs: a chunk without a pair is the row's last, which is in the tail.
struct GroupGather {
  alignas(64) std::array<std::array<int32_t, kLanes>, kSlots> index;
};
constexpr GroupGather MakeGroupGather(WeightFormat format) {
  GroupGather gather{};
  for (int m = 0; m < kSlots; ++m)
    for (int j = 0; j < kLanes; ++j)
      gather.index[m][j] = format == WeightFormat::kFp8Block
                               ? 64 * (j / 2) + kFp8PairOrder[(j % 2) * kTileK + m]
                               : kTileK * j + kFp4ChunkOrder[m];
  return gather;
}
constexpr GroupGather kFp8GroupGather = MakeGroupGather(WeightFormat::kFp8Block);
constexpr GroupGather kFp4GroupGather = MakeGroupGather(WeightFormat::kFp4Packed);

// Group g of one token's row xr in the tiles' order (GroupX): xs_g [slot][lane] fp32 and xp_g
// [pair][lane] bf16 pairs of the values times pair_factor (a power of two). field_min /
// field_max: running extremes of the nonzero values' exponent fields, updated. The scalar loops
// this replaces were about as costly as the matmul itself for a 16 x 4096 call.
DSINFER_AMX_TARGET void GroupActivations(const float* xr, int64_t g, const GroupGather& gather,
                                         float pair_factor, float* xs_g, uint32_t* xp_g,
                                         int* field_min, int* field_max) {
  const float* base = xr + g * kGroupCols;
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i lo = _mm512_set1_epi32(255), hi = _mm512_setzero_si512();
  __m512 v[kSlots];
  for (int m = 0; m < kSlots; ++m) {
    v[m] = _mm512_i32gather_ps(_mm512_load_si512(gather.index[m].data()), base, 4);
    _mm512_storeu_ps(xs_g + m * kLanes, v[m]);
    const __m512i bits = _mm512_and_si512(_mm512_castps_si512(v[m]), magnitude);
    const __mmask16 nonzero = _mm512_test_epi32_mask(bits, bits);
    const __m512i field = _mm512_srli_epi32(bits, 23);
    lo = _mm512_mask_min_epi32(lo, nonzero, lo, field);
    hi = _mm512_mask_max_epi32(hi, nonzero, hi, field);
  }
  const __m512 factor = _mm512_set1_ps(pair_factor);
  for (int q = 0; q < kPairs; ++q) {
    // bf16-exact values (times a power of two): the high halves of their bits.
    const __m512i high = _mm512_castps_si512(_mm512_mul_ps(v[PairSlot(q)], factor));
    const __m512i low = _mm512_castps_si512(_mm512_mul_ps(v[PairSlot(q) + 2], factor));
    _mm512_storeu_si512(
        xp_g + q * kLanes,
        _mm512_or_si512(
            _mm512_and_si512(high, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))),
            _mm512_srli_epi32(low, 16)));
  }
  *field_min = std::min(*field_min, _mm512_reduce_min_epi32(lo));
  *field_max = std::max(*field_max, _mm512_reduce_max_epi32(hi));
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

void MatMulRowsVector(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                      std::span<const int64_t> tokens, float* y, int64_t ldy, ThreadPool& pool,
                      VectorRoutes* routes, bool integer_route) {
  const int n_tok = static_cast<int>(tokens.size());
  DSINFER_CHECK_MSG(
      n_tok >= 1 &&
          n_tok <= (w.format == WeightFormat::kFp8Block ? kVectorMaxTokensFp8 : kVectorMaxTokens),
      "MatMulRowsVector: more tokens than the vector kernels take (VectorApplies)");
  const int64_t k = w.cols, chunks = k / kTileK, groups = chunks / kLanes;
  const int64_t c_tail = groups * kLanes, tail = chunks - c_tail;
  // The activations in the tiles' column order (TileOrder): xs [token][group][slot][lane] fp32,
  // xp [token][group][pair][lane] bf16 pairs (slot PairSlot(q) high, the one two further on low)
  // and xt [token][tail chunk][slot] fp32.
  const int64_t xs_token = groups * kGroupCols, xp_token = groups * kPairs * kLanes;
  const int64_t xt_token = tail * kTileK;
  AlignedVector<float> xs(n_tok * xs_token), xt(n_tok * xt_token);
  AlignedVector<uint32_t> xp(n_tok * xp_token);
  const bool fp8 = w.format == WeightFormat::kFp8Block;
  const float pair_factor = fp8 ? std::ldexp(1.0f, kFp8PairShift) : 1.0f;  // exact
  // Per group, the exponent fields of the smallest and largest nonzero |x| over the tokens (the
  // values are normal: RowIsBf16Exact; 255 / 0 while none was seen).
  std::vector<int> field_min(groups, 255), field_max(groups, 0);
  const GroupGather& gather = fp8 ? kFp8GroupGather : kFp4GroupGather;
  for (int t = 0; t < n_tok; ++t) {
    const float* xr = x + tokens[t] * k;
    for (int64_t g = 0; g < groups; ++g)
      GroupActivations(xr, g, gather, pair_factor, xs.data() + t * xs_token + g * kGroupCols,
                       xp.data() + t * xp_token + g * kPairs * kLanes, &field_min[g],
                       &field_max[g]);
    for (int64_t c = c_tail; c < chunks; ++c) {
      const ChunkOrder order = TileOrder(w.format, chunks, c);
      float* dst = xt.data() + t * xt_token + (c - c_tail) * kTileK;
      for (int m = 0; m < kSlots; ++m) dst[m] = xr[order.base + order.offsets[m]];
    }
  }
  // From the extremes, the scale codes for which the pair routes are exact (GroupX): every
  // product and partial sum, scaled and unscaled, stays normal.
  std::vector<int16_t> code_lo(groups), code_hi(groups);
  for (int64_t g = 0; g < groups; ++g) {
    const bool all_zero = field_min[g] == 255;
    const int ex_min = field_min[g] - 127, ex_max = field_max[g] - 127;
    int lo = 0, hi = 0;
    if (fp8) {
      // Products are multiples of 2^(ex_min - 16 + k) (x: 8 significant bits, e4m3 normals:
      // multiples of 2^-9) and below 2^(ex_max + 10 + k), with k = code - 127 (scaled) or -60
      // (unscaled); chunk sums stay below 2^(ex_max + 15 + k). Weights normal: code >= 7;
      // x * 2^60 finite; the chunk factor 2^(k + 60) normal: code <= 194.
      const bool ok = all_zero || (ex_min >= -50 && ex_max <= 67);
      lo = all_zero ? 7 : std::max(7, 127 - 110 - ex_min);
      hi = all_zero ? 194 : std::min(194, 127 + 112 - ex_max);
      if (!ok) lo = 256;
    } else {
      // Products are multiples of 2^(ex_min - 8 + k) (e2m1: multiples of 0.5) and below
      // 2^(ex_max + 4 + k), with k = code - 127 (scaled) or 0 (unscaled); chunk sums stay below
      // 2^(ex_max + 9 + k). Weights normal: code in [2, 252].
      const bool ok = all_zero || (ex_min >= -118 && ex_max <= 118);
      lo = all_zero ? 2 : std::max(2, 127 - 118 - ex_min);
      hi = all_zero ? 252 : std::min(252, 127 + 118 - ex_max);
      if (!ok) lo = 256;
    }
    code_lo[g] = static_cast<int16_t>(lo), code_hi[g] = static_cast<int16_t>(hi);
  }
  // FP4 integer route (Fp4IntegerGroup): per token and chunk, the activations as integers times
  // 2^shift (shift: the lowest set bit's exponent over the chunk), when they fit.
  const int64_t int_token = groups * kLanes, ab_token = groups * kIntegerGroupBytes;
  AlignedVector<int8_t> ab(fp8 ? 0 : n_tok * ab_token, 0);
  std::vector<int32_t> int_shift(fp8 ? 0 : n_tok * int_token), int_corr(int_shift.size()),
      int_lo(int_shift.size()), int_hi(int_shift.size());
  std::vector<uint8_t> int_group(groups, fp8 || !integer_route ? 0 : 2);
  for (int t = 0; t < n_tok && !fp8 && integer_route; ++t) {
    const float* xr = x + tokens[t] * k;
    for (int64_t c = 0; c < c_tail; ++c) {
      // Chunk c is chunk c % 4 of block (c % 16) / 4 of group c / 16: 16 bytes from byte
      // 16 (c % 4) of each of that block's planes.
      int8_t* planes = ab.data() + t * ab_token + (c / kLanes) * kIntegerGroupBytes +
                       ((c % kLanes) / 4) * kIntegerBlockBytes + 16 * (c % 4);
      int shift = 0;
      const int64_t at = t * int_token + c;
      const int chunk_planes = ChunkAsBytePlanes(xr + c * kTileK, &shift, &int_corr[at], planes);
      int_shift[at] = shift;
      int_lo[at] = chunk_planes > 0 ? std::max(2, 2 - shift) : 1;  // an empty range: never
      int_hi[at] = chunk_planes > 0 ? std::min(252, 231 - shift) : 0;
      uint8_t& group_planes = int_group[c / kLanes];
      if (group_planes != 0)
        group_planes =
            static_cast<uint8_t>(chunk_planes == 0 ? 0 : std::max<int>(group_planes, chunk_planes));
    }
  }
  const GroupX gx{xs.data(),      xs_token,      xp.data(), xp_token,         code_lo.data(),
                  code_hi.data(), ab.data(),     ab_token,  int_shift.data(), int_corr.data(),
                  int_lo.data(),  int_hi.data(), int_token, int_group.data()};
  std::mutex routes_mutex;
  const int64_t n_tiles = (row_end - row_begin + kTileRows - 1) / kTileRows;
  pool.ParallelForRange(
      n_tiles,
      [&](int64_t ta, int64_t tb) {
        AlignedVector<uint16_t> tail_buf(tail > 0 ? (tail / kPerBlock + 1) * kPerBlock * kTileElems
                                                  : 0);  // bf16 A tiles of the tail blocks
        alignas(64) float acc[kRowsPerScope][kVectorMaxTokens][2];
        VectorRoutes task_routes;
        const int64_t r_end = std::min(row_end, row_begin + tb * kTileRows);
        for (int64_t r0 = row_begin + ta * kTileRows; r0 < r_end; r0 += kRowsPerScope) {
          const int64_t r1 = std::min(r_end, r0 + kRowsPerScope);
          ChainSums(w, r0, r1, n_tok, gx, xt.data(), xt_token, tail_buf.data(), acc, task_routes);
          // The chains' sum, in the caller's floating-point mode as the tile path adds them.
          for (int64_t r = r0; r < r1; ++r)
            for (int t = 0; t < n_tok; ++t)
              y[tokens[t] * ldy + (r - row_begin)] = acc[r - r0][t][0] + acc[r - r0][t][1];
        }
        if (routes != nullptr) {
          std::lock_guard<std::mutex> lock(routes_mutex);
          *routes += task_routes;
        }
      },
      1);
}

}  // namespace dsinfer::backend::cpu::amx::internal

#endif  // DSINFER_AMX_COMPILED
