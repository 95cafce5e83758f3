// Peak arithmetic rates for the instruction families the CPU kernels can use: AVX2 FMA, AVX-512
// FMA, AVX-512 BF16 dot products and AMX-BF16 tile dot products (independent accumulator chains,
// operands in registers/tiles: an upper bound, not a kernel figure), on one core and on every
// thread at once (the roof `dsinfer bench model` sets a step's multiply-adds against).
//   build/bench/cpu_peak_bench [--threads N]
// Families this CPU lacks are reported as absent (checked at run time; the binary runs anywhere).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/peak.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
  namespace cpu = dsinfer::backend::cpu;
  int threads = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  std::printf("one core, GFLOP/s (multiply + add = 2):\n");
  const cpu::PeakUnit units[] = {cpu::PeakUnit::kPortableFma, cpu::PeakUnit::kAvx2Fma,
                                 cpu::PeakUnit::kAvx512Fma, cpu::PeakUnit::kAvx512Bf16,
                                 cpu::PeakUnit::kAmxBf16};
  for (cpu::PeakUnit u : units) {
    // AMX trips are 4 tile instructions of 8192 multiply-adds each: fewer trips for a similar time.
    const long trips = u == cpu::PeakUnit::kAmxBf16 ? 5000000 : 20000000;
    if (cpu::PeakUnitAvailable(u))
      std::printf("%-26s %8.1f\n", cpu::PeakUnitName(u), 2 * cpu::OneCorePeakGmacs(u, trips));
    else
      std::printf("%-26s absent%s\n", cpu::PeakUnitName(u),
                  u == cpu::PeakUnit::kAmxBf16 ? " (or DSINFER_CPU_AMX=0)" : "");
  }
  dsinfer::ThreadPool pool(threads);
  const cpu::ComputePeak all = cpu::MeasureComputePeak(pool, 0.5);
  if (all.gmacs > 0)
    std::printf("all %d threads, %s: %.1f GFLOP/s\n", pool.size(), cpu::PeakUnitName(all.unit),
                2 * all.gmacs);
  else
    std::printf("all %d threads: no multiply-add unit this tool knows\n", pool.size());
}
