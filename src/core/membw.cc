#include "core/membw.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dsinfer {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Sums the buffer so the compiler cannot drop the reads; wide loads like the GEMV kernels use.
float ReadRange(const float* p, int64_t n) {
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  float total = 0;
  for (float v : out) total += v;
  for (; i < n; ++i) total += p[i];
  return total;
#else
  float total = 0;
  for (int64_t i = 0; i < n; ++i) total += p[i];
  return total;
#endif
}

}  // namespace

BandwidthResult MeasureMemoryBandwidth(ThreadPool& pool, int64_t bytes, int repeats,
                                       bool measure_copy) {
  int64_t n = bytes / 4;
  n -= n % 1024;
  auto deleter = [](float* p) { std::free(p); };
  std::unique_ptr<float, decltype(deleter)> a(static_cast<float*>(std::aligned_alloc(64, n * 4)),
                                              deleter);
  std::unique_ptr<float, decltype(deleter)> b(
      measure_copy ? static_cast<float*>(std::aligned_alloc(64, n * 4)) : nullptr, deleter);
  // First touch from the pool so pages are spread like the benchmark's.
  pool.ParallelForRange(
      n,
      [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) a.get()[i] = 1.0f;
        if (b) std::fill(b.get() + s, b.get() + e, 0.0f);
      },
      1 << 16);
  std::vector<double> reads, copies;
  volatile float sink = 0;
  for (int r = 0; r < repeats + 1; ++r) {
    const int64_t n_chunks = pool.size() * 4;
    const int64_t chunk = (n + n_chunks - 1) / n_chunks;
    std::vector<float> partial(n_chunks, 0.0f);
    auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n_chunks, [&](int64_t c) {
      int64_t s = c * chunk, e = std::min(n, s + chunk);
      if (s < e) partial[c] = ReadRange(a.get() + s, e - s);
    });
    auto t1 = std::chrono::steady_clock::now();
    if (b)
      pool.ParallelFor(n_chunks, [&](int64_t c) {
        int64_t s = c * chunk, e = std::min(n, s + chunk);
        if (s < e) std::memcpy(b.get() + s, a.get() + s, (e - s) * 4);
      });
    auto t2 = std::chrono::steady_clock::now();
    for (float v : partial) sink = sink + v;
    if (r == 0) continue;  // warm-up
    reads.push_back(bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
    if (b) copies.push_back(2.0 * bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9);
  }
  (void)sink;
  return {Median(reads), copies.empty() ? 0.0 : Median(copies), n * 4};
}

}  // namespace dsinfer
