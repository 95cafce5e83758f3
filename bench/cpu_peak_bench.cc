// Peak arithmetic rates of one core for the instruction families the CPU kernels can use: AVX2
// FMA, AVX-512 FMA, AVX-512 BF16 dot products and AMX-BF16 tile dot products (independent
// accumulator chains, operands in registers/tiles: an upper bound, not a kernel figure).
//   build/bench/cpu_peak_bench
// Families this CPU lacks are reported as absent (checked at run time; the binary runs anywhere).
#include <chrono>
#include <cstdio>
#include <cstring>

#include "backend/cpu/linear_amx.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DSINFER_PEAK_X86 1
#endif

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#ifdef DSINFER_PEAK_X86
constexpr long kIters = 20000000;

__attribute__((target("avx2,fma"))) double Avx2Fma() {
  __m256 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_ps(i * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
  const double t0 = Now();
  for (long n = 0; n < kIters; ++n)
    for (int i = 0; i < 10; ++i) a[i] = _mm256_fmadd_ps(x, a[i], y);
  const double dt = Now() - t0;
  float sink = 0;
  for (int i = 0; i < 10; ++i) sink += a[i][0];
  std::printf("  (checksum %g)\n", sink);
  return kIters * 10.0 * 16 / dt / 1e9;
}

__attribute__((target("avx512f"))) double Avx512Fma() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(i * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
  const double t0 = Now();
  for (long n = 0; n < kIters; ++n)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(x, a[i], y);
  const double dt = Now() - t0;
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += a[i][0];
  std::printf("  (checksum %g)\n", sink);
  return kIters * 12.0 * 32 / dt / 1e9;
}

__attribute__((target("avx512f,avx512bf16"))) double Avx512Bf16() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(i * 1e-3f);
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3800));  // 2^-15
  const double t0 = Now();
  for (long n = 0; n < kIters; ++n)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  const double dt = Now() - t0;
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += a[i][0];
  std::printf("  (checksum %g)\n", sink);
  return kIters * 12.0 * 64 / dt / 1e9;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) double AmxBf16() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) static uint16_t ab[2][16 * 32];
  for (int i = 0; i < 16 * 32; ++i) ab[0][i] = 0x3f80, ab[1][i] = 0x3000;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab[0], 64);
  _tile_loadd(5, ab[1], 64);
  _tile_loadd(6, ab[1], 64);
  const long iters = kIters / 4;
  const double t0 = Now();
  for (long n = 0; n < iters; ++n) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 6);
  }
  const double dt = Now() - t0;
  alignas(64) static float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  std::printf("  (checksum %g)\n", c[0]);
  return iters * 4.0 * 16 * 16 * 32 * 2 / dt / 1e9;
}
#endif

}  // namespace

int main() {
#ifdef DSINFER_PEAK_X86
  __builtin_cpu_init();
  std::printf("one core, GFLOP/s (multiply + add = 2):\n");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    std::printf("AVX2 FMA        %8.1f\n", Avx2Fma());
  else
    std::printf("AVX2 FMA        absent\n");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512)
    std::printf("AVX-512 FMA     %8.1f\n", Avx512Fma());
  else
    std::printf("AVX-512 FMA     absent\n");
  if (avx512 && __builtin_cpu_supports("avx512bf16"))
    std::printf("AVX-512 BF16 dp %8.1f\n", Avx512Bf16());
  else
    std::printf("AVX-512 BF16 dp absent\n");
  // The AMX check includes the OS permission request the kernels need.
  if (dsinfer::backend::cpu::amx::Available())
    std::printf("AMX BF16 tiles  %8.1f\n", AmxBf16());
  else
    std::printf("AMX BF16 tiles  absent (or DSINFER_CPU_AMX=0)\n");
#else
  std::printf("not an x86-64 build: nothing to measure\n");
#endif
}
