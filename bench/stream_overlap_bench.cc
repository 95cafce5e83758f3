// How much compute between loads costs a streaming read on this machine.
//
// Why: the CPU kernels for routed experts at one token read their weights once and do a fixed
// amount of arithmetic per 256 bytes. On the Sapphire Rapids VM of docs/PERF.md they reached
// ~22 GB/s from DRAM where the read probe reaches 31-33 and the same kernel from L3 ~30, and
// no prefetch distance or level changed that. This benchmark separates the two effects with a
// synthetic kernel: each thread reads its half of a buffer in the kernels' pattern (four rows
// interleaved, 256 bytes per row per step, a software prefetch `--ahead` bytes on) and runs a
// dependent chain of `busy` integer multiply-adds per 256 bytes (scalar, so any x86-64 or
// ARM CPU runs it). For each busy count it prints the rate with the buffer in cache (compute
// alone) and from DRAM (compute and memory together), and how much of the shorter of the two
// the longer hid.
//
// usage: stream_overlap_bench [--threads N] [--ahead BYTES] [--row BYTES] [--mib N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/prefetch.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace {

constexpr int64_t kGroupBytes = 256;  // one row's bytes per step (512 FP4 weights)
constexpr int kRows = 4;              // rows interleaved, as the FP4 vector kernels do

struct Options {
  int threads = 2;
  int64_t ahead = 8192;      // software prefetch distance in bytes
  int64_t row = 2048;        // bytes per row (an FP4 expert's w1 row of 4096 columns)
  int64_t mib = 1024;        // the DRAM buffer
  int64_t cache_kib = 1024;  // the in-cache buffer (per thread: half)
};

// Reads [base, base + bytes) row block by row block, four rows interleaved step by step, with
// `busy` dependent multiply-adds per 256 bytes; returns a value that depends on every byte.
uint64_t Stream(const uint8_t* base, int64_t bytes, const Options& o, int busy) {
  uint64_t total = 0;
  const int64_t block = kRows * o.row, steps = o.row / kGroupBytes;
  for (int64_t r = 0; r + block <= bytes; r += block)
    for (int64_t s = 0; s < steps; ++s)
      for (int i = 0; i < kRows; ++i) {
        const uint8_t* p = base + r + i * o.row + s * kGroupBytes;
        for (int64_t l = 0; l < kGroupBytes; l += 64) dsinfer::PrefetchToL1(p + o.ahead + l);
        uint64_t v = 0;
        for (int64_t k = 0; k < kGroupBytes; k += 8) {
          uint64_t word = 0;
          std::memcpy(&word, p + k, 8);
          v ^= word;
        }
        for (int b = 0; b < busy; ++b) v = v * 0x9E3779B97F4A7C15ull + 1;
        total += v;
      }
  return total;
}

// A buffer of `bytes` (plus slack for the prefetches past its end), in 2 MiB pages where the
// kernel grants them, as the engine's copied weights are (io::MappedFile::CopyIntoMemory).
struct Buffer {
  explicit Buffer(int64_t bytes) : size(bytes + (4 << 20)) {
    constexpr size_t kHuge = size_t{2} << 20;
    size = (size + kHuge - 1) / kHuge * kHuge;
    data = static_cast<uint8_t*>(std::aligned_alloc(kHuge, size));
    if (data == nullptr) return;
#ifdef __linux__
    (void)madvise(data, size, MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < size; i += 64) data[i] = static_cast<uint8_t>(i >> 6);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  size_t size;
  uint8_t* data = nullptr;
};

// Best of five: GB/s over `bytes` split between the threads, each pass `passes` times.
double Rate(const uint8_t* buf, int64_t bytes, int passes, const Options& o, int busy) {
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<uint64_t> sums(o.threads, 0);
    const int64_t part = bytes / o.threads;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < o.threads; ++t)
      workers.emplace_back([&, t] {
        for (int k = 0; k < passes; ++k) sums[t] += Stream(buf + t * part, part, o, busy);
      });
    for (std::thread& w : workers) w.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t all = 0;
    for (uint64_t s : sums) all += s;
    if (all == 42) std::printf(" ");  // keeps the reads
    best = std::max(best, static_cast<double>(bytes) * passes / dt / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc % 2 == 0) {  // a flag without its value
    std::fprintf(
        stderr,
        "usage: stream_overlap_bench [--threads N] [--ahead BYTES] [--row BYTES] [--mib N]\n");
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--threads")
      o.threads = static_cast<int>(value);
    else if (flag == "--ahead")
      o.ahead = value;
    else if (flag == "--row")
      o.row = value;
    else if (flag == "--mib")
      o.mib = value;
    else {
      std::fprintf(
          stderr,
          "usage: stream_overlap_bench [--threads N] [--ahead BYTES] [--row BYTES] [--mib N]\n");
      return 2;
    }
  }
  if (o.threads < 1 || o.row < kGroupBytes || o.row % kGroupBytes != 0 || o.mib < 16) {
    std::fprintf(stderr, "stream_overlap_bench: threads >= 1, row a multiple of 256, mib >= 16\n");
    return 2;
  }
  const int64_t dram_bytes = o.mib << 20, cache_bytes = o.cache_kib << 10;
  if (o.ahead < 0 || o.ahead > (2 << 20)) {
    std::fprintf(stderr, "stream_overlap_bench: --ahead within [0, 2 MiB]\n");
    return 2;
  }
  const Buffer dram(dram_bytes), cache(cache_bytes);
  if (dram.data == nullptr || cache.data == nullptr) {
    std::fprintf(stderr, "stream_overlap_bench: cannot allocate %lld MiB\n",
                 static_cast<long long>(o.mib));
    return 1;
  }
  std::printf(
      "threads %d, rows of %lld bytes, %d interleaved, prefetch %lld bytes ahead, %lld MiB from "
      "DRAM\n",
      o.threads, static_cast<long long>(o.row), kRows, static_cast<long long>(o.ahead),
      static_cast<long long>(o.mib));
  std::printf("%6s %14s %14s %12s\n", "busy", "cache GB/s", "DRAM GB/s", "hidden");
  const int cache_passes = static_cast<int>(std::max<int64_t>(1, dram_bytes / cache_bytes));
  const double memory_alone = Rate(dram.data, dram_bytes, 1, o, 0);
  for (int busy : {0, 4, 8, 16, 32, 64}) {
    const double in_cache = Rate(cache.data, cache_bytes, cache_passes, o, busy);
    const double from_dram = Rate(dram.data, dram_bytes, 1, o, busy);
    // Times per byte: compute alone c, memory alone m, both t. Perfect overlap gives
    // t = max(c, m), none gives c + m; "hidden" is the share of min(c, m) that did not add.
    const double c = 1.0 / in_cache, m = 1.0 / memory_alone, t = 1.0 / from_dram;
    const double hidden = std::clamp((c + m - t) / std::min(c, m), 0.0, 1.0);
    std::printf("%6d %14.1f %14.1f %11.0f%%\n", busy, in_cache, from_dram, 100.0 * hidden);
  }
  return 0;
}
