// The arithmetic roof of this machine's CPU matmul kernels, measured: the multiply-add units
// they can use (AVX2 / AVX-512 FMA, AVX-512 BF16 dot products, AMX-BF16 tiles, or on any other
// CPU the compiler's vectorized fp32 multiply-adds) run in a loop of independent accumulator
// chains with operands in registers. No kernel reaches it (weights have to be loaded and
// converted); it is the upper bound a step's multiply-adds are set against, as the read-bandwidth
// probe is for its bytes (`dsinfer bench model`, build/bench/cpu_peak_bench).
#pragma once

#include "core/thread_pool.h"

namespace dsinfer::backend::cpu {

// kPortableFma: fp32 multiply-adds as the compiler vectorizes plain C++ for the build's target
// (what the FP32 kernels' portable fallbacks run on); available on every CPU, so the roof is
// never 0 (on x86-64 the intrinsic units are faster and chosen instead).
enum class PeakUnit { kPortableFma, kAvx2Fma, kAvx512Fma, kAvx512Bf16, kAmxBf16 };

// The unit's name as printed ("AVX-512 BF16 dot products", ...).
const char* PeakUnitName(PeakUnit unit);

// Whether this CPU (and OS) can run the unit; AMX also needs DSINFER_CPU_AMX unset or not "0",
// as the AMX kernels do.
bool PeakUnitAvailable(PeakUnit unit);

// Multiply-adds per second (units of 1e9) of the unit on the calling thread over `iterations`
// loop trips (each trip a fixed number of independent instructions); 0 when it is absent.
double OneCorePeakGmacs(PeakUnit unit, long iterations);

struct ComputePeak {
  PeakUnit unit = PeakUnit::kPortableFma;
  double gmacs = 0;  // all of the pool's threads at once, 1e9 multiply-adds per second
};

// The fastest available unit, run on every thread of `pool` at once for about `seconds`.
ComputePeak MeasureComputePeak(ThreadPool& pool, double seconds = 0.2);

}  // namespace dsinfer::backend::cpu
