// Throughput of the CPU matmul kernels on bench-preset shapes, streaming a weight set larger than
// the last-level cache (as decode does), against the machine's read bandwidth measured in the
// same run. Run it twice to compare the AMX tile path with the FP32 kernels:
//   build/bench/linear_bench [--threads N] [--mib 1024] [--repeats 5]
//   DSINFER_CPU_AMX=0 build/bench/linear_bench ...
// Per (format, tokens): median wall time per weight set, weight GB/s, share of read bandwidth,
// and CPU seconds per wall second (how busy the pool was; < threads means stalls or contention).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/linear_amx.h"
#include "core/membw.h"
#include "core/quant.h"

namespace {

using dsinfer::model::WeightFormat;
using dsinfer::model::WeightMatrix;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

struct Set {
  std::vector<uint8_t> data, scales;  // all matrices back to back
  std::vector<WeightMatrix> mats;
  int64_t bytes = 0;
};

// n matrices [rows, cols] of random codes with e8m0 scales near 2^-8.
Set MakeSet(WeightFormat f, int64_t rows, int64_t cols, int64_t total_bytes) {
  Set s;
  const int64_t per = f == WeightFormat::kFp4Packed ? rows * cols / 2 : rows * cols;
  const int64_t per_scales =
      f == WeightFormat::kFp4Packed ? rows * cols / 32 : ((rows + 127) / 128) * (cols / 128);
  const int64_t n = std::max<int64_t>(1, total_bytes / per);
  s.data.resize(n * per);
  s.scales.resize(n * per_scales);
  std::mt19937 rng(1);
  for (auto& b : s.data) b = static_cast<uint8_t>(rng() & 0x7e);  // no NaN e4m3 codes
  for (auto& b : s.scales) b = static_cast<uint8_t>(127 - 8 + rng() % 3);
  for (int64_t i = 0; i < n; ++i) {
    WeightMatrix w;
    w.format = f;
    w.data = s.data.data() + i * per;
    w.scales = s.scales.data() + i * per_scales;
    w.scale_dtype = dsinfer::DType::kF8E8M0;
    w.rows = rows;
    w.cols = cols;
    w.scale_cols = f == WeightFormat::kFp4Packed ? cols / 32 : cols / 128;
    w.block = f == WeightFormat::kFp4Packed ? 32 : 128;
    s.mats.push_back(w);
  }
  s.bytes = n * per;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 5;
  int64_t mib = 1024, only_m = 0;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mib")) mib = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];  // a case name prefix
    if (!std::strcmp(argv[i], "--m")) only_m = std::atoll(argv[i + 1]);
  }
  dsinfer::ThreadPool pool(threads);
  const bool amx = dsinfer::backend::cpu::amx::Available();
  std::printf("kernels: %s, threads %d, weight set %lld MiB per format\n",
              amx ? "AMX tiles (bf16-exact rows)" : "FP32", threads, static_cast<long long>(mib));
  struct Case {
    const char* name;
    WeightFormat f;
    int64_t rows, cols;
  };
  const Case cases[] = {{"fp4 expert w1 2048x4096", WeightFormat::kFp4Packed, 2048, 4096},
                        {"fp4 expert w2 4096x2048", WeightFormat::kFp4Packed, 4096, 2048},
                        {"fp8 dense 4096x4096", WeightFormat::kFp8Block, 4096, 4096}};
  for (const Case& c : cases) {
    if (!only.empty() && std::string(c.name).rfind(only, 0) != 0) continue;
    Set set = MakeSet(c.f, c.rows, c.cols, mib << 20);
    for (int64_t m : {1, 4, 16, 64}) {
      if (only_m != 0 && m != only_m) continue;
      std::vector<float> x(m * c.cols), y(m * c.rows);
      std::mt19937 rng(2);
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(rng);
      for (int64_t t = 0; t < m; ++t)  // official numerics: FP8-quantized activations
        dsinfer::Fp8RoundTripInPlace(x.data() + t * c.cols, static_cast<int>(c.cols), 128);
      std::vector<double> times;
      double cpu = 0, wall = 0;
      for (int r = 0; r < repeats; ++r) {
        const double bw = dsinfer::MeasureMemoryBandwidth(pool, 256 << 20, 1, false).read_gbps;
        const double c0 = CpuSeconds(), t0 = Now();
        for (const WeightMatrix& w : set.mats)
          dsinfer::backend::cpu::MatMul(w, x.data(), m, y.data(), pool);
        const double dt = Now() - t0;
        cpu += CpuSeconds() - c0, wall += dt;
        times.push_back(set.bytes / dt / 1e9 / bw);  // share of this repeat's bandwidth
      }
      std::sort(times.begin(), times.end());
      std::printf(
          "%-26s m=%-3lld  weights at %5.1f%% of read bandwidth (median of %d)  cpu/wall %.2f\n",
          c.name, static_cast<long long>(m), 100 * times[times.size() / 2], repeats, cpu / wall);
    }
  }
}
