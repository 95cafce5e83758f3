// Throughput of the CPU matmul kernels on bench-preset shapes, streaming a weight set larger than
// the last-level cache (as decode does), against the machine's read bandwidth measured in the
// same run. Run it twice to compare the AMX tile path with the FP32 kernels:
//   build/bench/linear_bench [--threads N] [--mib 1024] [--repeats 5]
//   DSINFER_CPU_AMX=0 build/bench/linear_bench ...
// --kernel tiles|vector forces the AMX path's kernel (default: the automatic choice).
// --fp8-codes uniform draws FP8 codes uniformly (subnormal codes in nearly every 512-weight group,
// the kernels' slow route) instead of as a trained checkpoint stores them (the default).
// --warm 1: one untimed pass, then the repeats back to back with the bandwidth probed once
// before them, so a small set (--mib 1: one matrix) stays in cache. By default each repeat
// follows its own probe, whose 256 MiB read evicts the set: every pass streams from DRAM.
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
#include "backend/random_weights.h"
#include "core/membw.h"
#include "core/quant.h"

namespace {

using dsinfer::model::WeightFormat;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

// Random matrices [rows, cols] of `f` (backend/random_weights.h, e8m0 scales 2^-9 .. 2^-7)
// adding up to about total_bytes of weight codes.
struct Set {
  std::vector<dsinfer::backend::HostWeight> mats;
  int64_t bytes = 0;
};

Set MakeSet(WeightFormat f, int64_t rows, int64_t cols, int64_t total_bytes, bool trained_fp8) {
  Set s;
  std::mt19937 rng(1);
  while (s.mats.empty() || s.bytes < total_bytes) {
    s.mats.push_back(dsinfer::backend::RandomWeight(rng, f, rows, cols,
                                                    {.scale_code_lo = 127 - 9,
                                                     .scale_code_hi = 127 - 7,
                                                     .fp8_trained_distribution = trained_fp8}));
    s.bytes += static_cast<int64_t>(s.mats.back().data.size());
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 5;
  int64_t mib = 1024, only_m = 0;
  std::string only, kernel_name = "auto", fp8_codes = "trained";
  bool warm = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mib")) mib = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];             // a case name prefix
    if (!std::strcmp(argv[i], "--m")) only_m = std::atoll(argv[i + 1]);  // any count, e.g. 256
    if (!std::strcmp(argv[i], "--kernel")) kernel_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--fp8-codes")) fp8_codes = argv[i + 1];
    if (!std::strcmp(argv[i], "--warm")) warm = std::atoi(argv[i + 1]) != 0;
  }
  if (fp8_codes != "trained" && fp8_codes != "uniform") {
    std::fprintf(stderr, "--fp8-codes: trained or uniform, not '%s'\n", fp8_codes.c_str());
    return 2;
  }
  namespace amx = dsinfer::backend::cpu::amx;
  const amx::Kernel kernel = kernel_name == "tiles"    ? amx::Kernel::kTiles
                             : kernel_name == "vector" ? amx::Kernel::kVector
                                                       : amx::Kernel::kAuto;
  dsinfer::ThreadPool pool(threads);
  const bool amx_on = amx::Available();
  std::printf("kernels: %s (%s), threads %d, weight set %lld MiB per format, FP8 codes %s, %s\n",
              dsinfer::backend::cpu::MachineMatMulKernel(), kernel_name.c_str(), threads,
              static_cast<long long>(mib), fp8_codes.c_str(),
              warm ? "warm (repeats back to back)" : "cold (a probe before each repeat)");
  struct Case {
    const char* name;
    WeightFormat f;
    int64_t rows, cols;
  };
  const Case cases[] = {{"fp4 expert w1 2048x4096", WeightFormat::kFp4Packed, 2048, 4096},
                        {"fp4 expert w2 4096x2048", WeightFormat::kFp4Packed, 4096, 2048},
                        {"fp8 dense 4096x4096", WeightFormat::kFp8Block, 4096, 4096},
                        {"fp8 q-up 32768x1024", WeightFormat::kFp8Block, 32768, 1024},
                        {"fp8 o-down 4096x8192", WeightFormat::kFp8Block, 4096, 8192},
                        {"bf16 o-group 1024x4096", WeightFormat::kBF16, 1024, 4096},
                        {"bf16 head 8192x4096", WeightFormat::kBF16, 8192, 4096}};
  for (const Case& c : cases) {
    if (!only.empty() && std::string(c.name).rfind(only, 0) != 0) continue;
    Set set = MakeSet(c.f, c.rows, c.cols, mib << 20, fp8_codes == "trained");
    const std::vector<int64_t> token_counts =
        only_m > 0 ? std::vector<int64_t>{only_m} : std::vector<int64_t>{1, 2, 4, 16, 64};
    for (int64_t m : token_counts) {
      if (kernel == amx::Kernel::kVector && !(amx_on && amx::VectorApplies(set.mats[0].view, m)))
        continue;
      std::vector<int64_t> tokens(m);
      for (int64_t t = 0; t < m; ++t) tokens[t] = t;
      std::vector<float> x(m * c.cols), y(m * c.rows);
      std::mt19937 rng(2);
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(rng);
      for (int64_t t = 0; t < m; ++t)  // official numerics: FP8-quantized activations
        dsinfer::Fp8RoundTripInPlace(x.data() + t * c.cols, static_cast<int>(c.cols), 128);
      std::vector<double> times, gbps;
      double cpu = 0, wall = 0;
      auto pass = [&] {
        for (const auto& w : set.mats)
          if (kernel == amx::Kernel::kAuto || !amx_on)
            dsinfer::backend::cpu::MatMul(w.view, x.data(), m, y.data(), pool);
          else
            amx::MatMulRows(w.view, 0, c.rows, x.data(), tokens, y.data(), c.rows, pool, kernel);
      };
      double bw = 0;
      if (warm) {
        bw = dsinfer::MeasureMemoryBandwidth(pool, 256 << 20, 1, false).read_gbps;
        pass();
      }
      for (int r = 0; r < repeats; ++r) {
        if (!warm) bw = dsinfer::MeasureMemoryBandwidth(pool, 256 << 20, 1, false).read_gbps;
        const double c0 = CpuSeconds(), t0 = Now();
        pass();
        const double dt = Now() - t0;
        cpu += CpuSeconds() - c0, wall += dt;
        times.push_back(set.bytes / dt / 1e9 / bw);  // share of this repeat's bandwidth
        gbps.push_back(set.bytes / dt / 1e9);
      }
      std::sort(times.begin(), times.end());
      std::sort(gbps.begin(), gbps.end());
      // Per CPU second: what the threads achieved while they ran, which a host taking this
      // machine's CPU time away (steal) does not dilute.
      // Multiply-adds per CPU second: the figure to hold against the FMA peak
      // (bench/cpu_peak_bench) once many tokens make the kernel compute bound.
      const double weights_per_byte = c.f == WeightFormat::kBF16        ? 0.5
                                      : c.f == WeightFormat::kFp4Packed ? 2.0
                                                                        : 1.0;
      const double cpu_gbps = cpu > 0 ? set.bytes * double(repeats) / cpu / 1e9 : 0.0;
      std::printf(
          "%-26s m=%-3lld  weights at %5.1f%% of read bandwidth (median of %d, %.2f GB/s)  "
          "cpu/wall %.2f  %.2f GB/s per CPU second  %.2f GMAC/s per CPU second\n",
          c.name, static_cast<long long>(m), 100 * times[times.size() / 2], repeats,
          gbps[gbps.size() / 2], cpu / wall, cpu_gbps, cpu_gbps * weights_per_byte * m);
    }
  }
}
