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

// Sums the buffer so the compiler cannot drop the reads. The range is read as 8 interleaved
// streams with software prefetch a few KiB ahead: the access pattern the matmul kernels use (16
// weight rows at a time), and on the machines measured here the fastest one. A single sequential
// stream leaves bandwidth unused (~13 vs ~25 GB/s on this project's 2-core VM), which would make
// every roofline ratio computed against it look better than it is.
float ReadRange(const float* p, int64_t n) {
  constexpr int kStreams = 8;
  constexpr int64_t kPrefetchFloats = 1024;           // 4 KiB ahead in each stream
  const int64_t len = (n / kStreams) & ~int64_t{31};  // floats per stream, whole 128-byte steps
  float total = 0;
#if defined(__AVX2__)
  __m256 acc[kStreams];
  for (auto& v : acc) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < len; i += 32) {
    for (int s = 0; s < kStreams; ++s) {
      const float* q = p + s * len + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchFloats), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchFloats + 16), _MM_HINT_T0);
      acc[s] = _mm256_add_ps(
          acc[s], _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8)),
                                _mm256_add_ps(_mm256_loadu_ps(q + 16), _mm256_loadu_ps(q + 24))));
    }
  }
  float lanes[8];
  for (int s = 1; s < kStreams; ++s) acc[0] = _mm256_add_ps(acc[0], acc[s]);
  _mm256_storeu_ps(lanes, acc[0]);
  for (float v : lanes) total += v;
#else
  for (int64_t i = 0; i < len; ++i)
    for (int s = 0; s < kStreams; ++s) total += p[s * len + i];
#endif
  for (int64_t i = kStreams * len; i < n; ++i) total += p[i];  // the remainder, sequentially
  return total;
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
