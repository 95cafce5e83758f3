#include "backend/cpu/peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>

#include "backend/cpu/linear_amx.h"
#include "backend/cpu/linear_bf16dot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DSINFER_PEAK_X86 1
#endif

namespace dsinfer::backend::cpu {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Each loop trip issues a fixed set of independent instructions (more chains than the latency
// times the issue rate, so the units never wait on a result); the returned value depends on every
// chain so the compiler keeps them.
constexpr int kFmaChains = 12;

// Plain C++: kPortableLanes independent chains of a * x + y, which the compiler vectorizes (and
// contracts into FMAs where the target has them) for whatever CPU it builds for.
constexpr int kPortableLanes = 64;

float PortableFmaTrips(long trips) {
  float a[kPortableLanes];
  for (int i = 0; i < kPortableLanes; ++i) a[i] = static_cast<float>(i) * 1e-3f;
  const float x = 0.999f, y = 1e-4f;
  for (long n = 0; n < trips; ++n)
    for (int i = 0; i < kPortableLanes; ++i) a[i] = a[i] * x + y;
  float sum = 0;
  for (int i = 0; i < kPortableLanes; ++i) sum += a[i];
  return sum;
}

#ifdef DSINFER_PEAK_X86
__attribute__((target("avx2,fma"))) float Avx2FmaTrips(long trips) {
  __m256 a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
  for (long n = 0; n < trips; ++n)
    for (int i = 0; i < kFmaChains; ++i) a[i] = _mm256_fmadd_ps(x, a[i], y);
  float sum = 0;
  for (int i = 0; i < kFmaChains; ++i) sum += _mm256_cvtss_f32(a[i]);
  return sum;
}

__attribute__((target("avx512f"))) float Avx512FmaTrips(long trips) {
  __m512 a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
  for (long n = 0; n < trips; ++n)
    for (int i = 0; i < kFmaChains; ++i) a[i] = _mm512_fmadd_ps(x, a[i], y);
  float sum = 0;
  for (int i = 0; i < kFmaChains; ++i) sum += _mm512_cvtss_f32(a[i]);
  return sum;
}

__attribute__((target("avx512f,avx512bf16"))) float Avx512Bf16Trips(long trips) {
  __m512 a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3800));  // 2^-15
  for (long n = 0; n < trips; ++n)
    for (int i = 0; i < kFmaChains; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  float sum = 0;
  for (int i = 0; i < kFmaChains; ++i) sum += _mm512_cvtss_f32(a[i]);
  return sum;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Four accumulator tiles of 16 x 16 fp32, each TDPBF16PS 16 x 16 x 32 multiply-adds.
__attribute__((target("amx-tile,amx-bf16"))) float AmxBf16Trips(long trips) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  std::fill(a, a + 16 * 32, uint16_t{0x3f80});  // 1.0
  std::fill(b, b + 16 * 32, uint16_t{0x3000});  // 2^-31
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, b, 64);
  for (long n = 0; n < trips; ++n) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 6);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}
#endif

// Multiply-adds one trip of the unit's loop does.
double MacsPerTrip(PeakUnit unit) {
  switch (unit) {
    case PeakUnit::kPortableFma:
      return kPortableLanes;
    case PeakUnit::kAvx2Fma:
      return kFmaChains * 8.0;
    case PeakUnit::kAvx512Fma:
      return kFmaChains * 16.0;
    case PeakUnit::kAvx512Bf16:
      return kFmaChains * 32.0;
    case PeakUnit::kAmxBf16:
      return 4.0 * 16 * 16 * 32;
  }
  return 0;
}

// Runs `trips` trips of the unit's loop on the calling thread (it must be available).
float RunTrips(PeakUnit unit, long trips) {
  switch (unit) {
    case PeakUnit::kPortableFma:
      return PortableFmaTrips(trips);
#ifdef DSINFER_PEAK_X86
    case PeakUnit::kAvx2Fma:
      return Avx2FmaTrips(trips);
    case PeakUnit::kAvx512Fma:
      return Avx512FmaTrips(trips);
    case PeakUnit::kAvx512Bf16:
      return Avx512Bf16Trips(trips);
    case PeakUnit::kAmxBf16:
      return AmxBf16Trips(trips);
#else
    default:
      break;  // the x86 units: never available here
#endif
  }
  return 0;
}

}  // namespace

const char* PeakUnitName(PeakUnit unit) {
  switch (unit) {
    case PeakUnit::kPortableFma:
      return "portable FP32 FMA";
    case PeakUnit::kAvx2Fma:
      return "AVX2 FMA";
    case PeakUnit::kAvx512Fma:
      return "AVX-512 FMA";
    case PeakUnit::kAvx512Bf16:
      return "AVX-512 BF16 dot products";
    case PeakUnit::kAmxBf16:
      return "AMX-BF16 tiles";
  }
  return "?";
}

bool PeakUnitAvailable(PeakUnit unit) {
  switch (unit) {
    case PeakUnit::kPortableFma:
      return true;
#ifdef DSINFER_PEAK_X86
    case PeakUnit::kAvx2Fma:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case PeakUnit::kAvx512Fma:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f");
    case PeakUnit::kAvx512Bf16:
      return bf16dot::Available();  // checks the OS's zmm state too
    case PeakUnit::kAmxBf16:
      return amx::Available();  // includes the OS permission request
#else
    default:
      return false;
#endif
  }
  return false;
}

double OneCorePeakGmacs(PeakUnit unit, long iterations) {
  if (!PeakUnitAvailable(unit) || iterations <= 0) return 0;
  const double t0 = Now();
  volatile float sink = RunTrips(unit, iterations);  // volatile: the loop's result is kept
  const double dt = Now() - t0;
  static_cast<void>(sink);
  return dt > 0 ? iterations * MacsPerTrip(unit) / dt / 1e9 : 0;
}

ComputePeak MeasureComputePeak(ThreadPool& pool, double seconds) {
  // The fastest unit present: each unit in this order is at least as fast as the ones after it
  // on every CPU that has it (AMX > BF16 dot products = 2 x the FMA of the same width; the
  // portable loop, last, is always there).
  ComputePeak peak;
  const PeakUnit order[] = {PeakUnit::kAmxBf16, PeakUnit::kAvx512Bf16, PeakUnit::kAvx512Fma,
                            PeakUnit::kAvx2Fma, PeakUnit::kPortableFma};
  peak.unit = *std::find_if(std::begin(order), std::end(order), PeakUnitAvailable);
  // Size the chunks from a short single-thread run, then run 4 chunks per thread at once: the
  // total multiply-adds over the wall time is the pool's rate whatever the task distribution.
  const long probe_trips = 20000;
  const double one = std::max(OneCorePeakGmacs(peak.unit, probe_trips), 1e-3);
  const int n_chunks = pool.size() * 4;
  const long trips = std::max<long>(
      1, static_cast<long>(seconds * one * 1e9 * pool.size() / n_chunks / MacsPerTrip(peak.unit)));
  std::atomic<float> sink{0};
  const double t0 = Now();
  pool.ParallelFor(n_chunks, [&](int64_t) {
    sink.store(RunTrips(peak.unit, trips), std::memory_order_relaxed);
  });
  const double dt = Now() - t0;
  peak.gmacs =
      dt > 0 ? n_chunks * static_cast<double>(trips) * MacsPerTrip(peak.unit) / dt / 1e9 : 0;
  return peak;
}

}  // namespace dsinfer::backend::cpu
