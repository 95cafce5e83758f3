// CPU backend self-check for `dsinfer doctor`: runs the backend's key ops (the fused FP8 / FP4 /
// bf16 GEMV and GEMM of linear.h, RMSNorm and RoPE of ops.h) on seeded random inputs against an
// fp64 reference computed here from an independent decode of the stored formats, and a short
// GEMM throughput probe against the CPU's stated fp32 peak. Read-only use of the ops: this file
// checks them, it does not change how they compute.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace dsinfer::backend::cpu {

// Error budgets of the self-check (derived, as the CUDA conformance budgets are).
// GEMV/GEMM: an fp32 length-K dot product is within ~u*sqrt(K)*sum|x*w| of the exact value in
// practice (u = 2^-24, K <= 512 here: ~1.4e-6); the weights decode exactly (e4m3/e2m1/bf16 times
// a power of two), so 1e-5 of sum|x*w| is ~7x that and a wrong decode or a skipped row fails by
// orders of magnitude.
inline constexpr double kSelfCheckMatMulRelToSumAbs = 1e-5;
// RMSNorm in fp32: the mean square is an fp32 dot (rel. error ~u*sqrt(n)), then rsqrt and two
// products, each 0.5 ulp: under 1e-6 of the element for n <= 4096; budget 2e-5 of |element|
// (plus 1e-6 of the row's largest element for values near zero).
inline constexpr double kSelfCheckRmsNormRel = 2e-5;
// With bf16 rounding of the output, fp32 values that straddle a bf16 rounding boundary land one
// bf16 ulp (<= 2^-7 relative) apart.
inline constexpr double kSelfCheckBf16Ulp = 1.0 / 128.0;
// RoPE: theta is the same fp32 product on both sides (as the reference computes it); cos/sin are
// rounded once to fp32 and the rotation is two fp32 products and a sum: a few fp32 ulps of the
// pair's norm. 1e-6 of the pair's norm is ~16 ulps.
inline constexpr double kSelfCheckRopeRelToNorm = 1e-6;

struct SelfCheckResult {
  std::string op;             // "gemv/fp8-e8m0", "gemm/bf16", "rmsnorm/f32", "rope/inverse", ...
  std::string shape;          // "m=1 rows=203 cols=416"
  std::string error_measure;  // what max_rel_err is relative to
  double max_rel_err = 0;     // worst error over the elements, in the unit error_measure names
  double budget = 0;          // ok needs max_rel_err <= budget
  bool ok = false;
};

// Every check (a fraction of a second in all on one core).
std::vector<SelfCheckResult> RunCpuSelfCheck(ThreadPool& pool, uint32_t seed);

// The CPU's stated fp32 peak: cores x GHz x fp32 lanes x 2 (an FMA is 2 flops) x FMA units.
struct CpuPeak {
  int cores = 0;             // physical cores (SMT siblings share the FMA units)
  std::string cores_source;  // where the count came from
  double ghz = 0;            // clock the peak assumes
  std::string ghz_source;
  int fp32_lanes = 0;  // per vector FMA: 16 (AVX-512), 8 (AVX2+FMA), 4 (SSE, mul+add)
  int fma_units = 0;   // FMA pipes per core (assumed, not detectable through cpuid)
  double gflops = 0;
  std::string derivation;  // the formula with its numbers, for the report
};
CpuPeak ComputeCpuPeak(int cores, double ghz, int fp32_lanes, int fma_units);
// Reads the physical core count and clock from /proc/cpuinfo and /sys (max frequency when
// cpufreq is exposed, otherwise the "cpu MHz" line), and the vector width from the features.
CpuPeak DetectCpuPeak(bool avx512f, bool avx2_fma);

struct GemmProbeResult {
  std::string shape;   // "bf16 W[rows, cols], m tokens"
  double gflops = 0;   // 2*m*rows*cols / median seconds
  double seconds = 0;  // median wall time of one MatMul
  int repeats = 0;
};
// Times cpu::MatMul on a bf16 weight (the fused dequantize-and-dot path) for about
// max_seconds in all.
GemmProbeResult RunCpuGemmProbe(ThreadPool& pool, double max_seconds);

}  // namespace dsinfer::backend::cpu
