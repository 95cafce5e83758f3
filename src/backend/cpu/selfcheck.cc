#include "backend/cpu/selfcheck.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "backend/cpu/linear.h"
#include "backend/cpu/linear_amx.h"
#include "backend/cpu/ops.h"
#include "backend/random_weights.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "model/weights.h"

namespace dsinfer::backend::cpu {

namespace {

using model::WeightFormat;

// Weight (r, c) decoded from the stored bytes here, independently of linear.cc's decoders.
double ReferenceWeight(const model::WeightMatrix& w, int64_t r, int64_t c) {
  switch (w.format) {
    case WeightFormat::kBF16: {
      uint16_t b;
      std::memcpy(&b, w.data + 2 * (r * w.cols + c), 2);
      return Bf16ToF32(b);
    }
    case WeightFormat::kFp8Block: {
      double s = std::ldexp(1.0, int{w.scales[(r / 128) * w.scale_cols + c / 128]} - 127);
      return static_cast<double>(E4M3ToF32(w.data[r * w.cols + c])) * s;
    }
    case WeightFormat::kFp4Packed: {
      uint8_t b = w.data[r * (w.cols / 2) + c / 2];
      double s = std::ldexp(1.0, int{w.scales[r * w.scale_cols + c / 32]} - 127);
      return static_cast<double>(E2M1ToF32((c & 1) ? (b >> 4) : (b & 0xf))) * s;
    }
    case WeightFormat::kF32: {
      float v;
      std::memcpy(&v, w.data + 4 * (r * w.cols + c), 4);
      return v;
    }
  }
  return 0;
}

std::string FormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kFp8Block:
      return "fp8-e8m0";
    case WeightFormat::kFp4Packed:
      return "fp4-e8m0";
    case WeightFormat::kF32:
      return "f32";
  }
  return "?";
}

// Worst |err| / scale over the elements; a non-finite output is an infinite error.
void Track(double* worst, double got, double want, double scale) {
  double e = std::isfinite(got) ? std::fabs(got - want) / std::max(scale, 1e-300) : INFINITY;
  *worst = std::max(*worst, e);
}

// quantized_input: x is FP8 act_quant round-tripped as the official numerics feed FP8/FP4
// linears, so the rows are bf16-exact and run on the AMX tiles where the CPU has them (the
// shape string names the kernel); otherwise arbitrary fp32 rows on the FP32 kernels.
SelfCheckResult CheckMatMul(ThreadPool& pool, WeightFormat format, int64_t m, int64_t rows,
                            int64_t cols, bool quantized_input, std::mt19937& rng) {
  SelfCheckResult r;
  r.op = std::string(m == 1 ? "gemv/" : "gemm/") + FormatName(format) +
         (quantized_input ? "/act-fp8" : "");
  r.shape =
      "m=" + std::to_string(m) + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);

  r.error_measure = "sum|x*w| of the output element";
  r.budget = kSelfCheckMatMulRelToSumAbs;
  HostWeight w = RandomWeight(rng, format, rows, cols, {.name = "selfcheck.w"});
  if (quantized_input)
    r.shape += ExactRowKernelFor(w.view) == ExactRowKernel::kFp32         ? " kernel=fp32"
               : ExactRowKernelFor(w.view) == ExactRowKernel::kAvx512Bf16 ? " kernel=avx512-bf16"
               : amx::VectorApplies(w.view, m) && amx::VectorInUse()
                   ? " kernel=avx512-vector (tile-exact)"
                   : " kernel=amx-bf16";
  std::vector<float> x = RandomFloats(rng, m * cols, 1.0f);  // [m, cols]
  if (quantized_input)
    for (int64_t i = 0; i < m; ++i)
      Fp8RoundTripInPlace(x.data() + i * cols, static_cast<int>(cols), 128);
  std::vector<float> y(static_cast<size_t>(m * rows), NAN);  // [m, rows]
  MatMul(w.view, x.data(), m, y.data(), pool);
  double worst = 0;
  std::vector<double> wrow(static_cast<size_t>(cols));  // [cols] fp64 row of W
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) wrow[k] = ReferenceWeight(w.view, n, k);
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0, sum_abs = 0;
      for (int64_t k = 0; k < cols; ++k) {
        double p = static_cast<double>(x[i * cols + k]) * wrow[k];
        sum += p;
        sum_abs += std::fabs(p);
      }
      Track(&worst, y[i * rows + n], sum, sum_abs);
    }
  }
  r.max_rel_err = worst;
  r.ok = worst <= r.budget;
  return r;
}

SelfCheckResult CheckRmsNorm(int64_t rows, int64_t n, bool round_bf16, std::mt19937& rng) {
  SelfCheckResult r;
  r.op = round_bf16 ? "rmsnorm/bf16-out" : "rmsnorm/f32";
  r.shape = "rows=" + std::to_string(rows) + " n=" + std::to_string(n);
  r.error_measure = "|element| + 1e-6 * max|row|";
  r.budget = round_bf16 ? kSelfCheckBf16Ulp : kSelfCheckRmsNormRel;
  std::vector<float> x = RandomFloats(rng, rows * n, 3.0f);  // [rows, n]
  std::vector<float> wt = RandomFloats(rng, n, 1.0f);        // [n] f32
  model::TensorView weight;
  weight.data = reinterpret_cast<const uint8_t*>(wt.data());
  weight.dtype = DType::kF32;
  weight.shape = {n};
  weight.name = "selfcheck.norm";
  const double eps = 1e-6;
  std::vector<float> y = x;
  RmsNormRows(y.data(), rows, n, &weight, eps, round_bf16);
  double worst = 0;
  std::vector<double> want(static_cast<size_t>(n));  // [n] fp64 reference row
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x.data() + row * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    double row_max = 0;
    for (int64_t i = 0; i < n; ++i) {
      want[i] = static_cast<double>(xr[i]) * inv * wt[i];
      row_max = std::max(row_max, std::fabs(want[i]));
    }
    for (int64_t i = 0; i < n; ++i)
      Track(&worst, y[row * n + i], want[i], std::fabs(want[i]) + 1e-6 * row_max);
  }
  r.max_rel_err = worst;
  r.ok = worst <= r.budget;
  return r;
}

SelfCheckResult CheckRope(int rope_dim, bool inverse, std::mt19937& rng) {
  SelfCheckResult r;
  r.op = inverse ? "rope/inverse" : "rope/forward";
  r.error_measure = "norm of the rotated pair";
  r.budget = kSelfCheckRopeRelToNorm;
  RopeTable table;
  table.inv_freq.resize(static_cast<size_t>(rope_dim / 2));  // [rope_dim/2] f32
  for (int i = 0; i < rope_dim / 2; ++i)
    table.inv_freq[i] =
        1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(rope_dim));
  // Positions up to a long context: theta grows, so a wrong angle reduction would show.
  const std::vector<int64_t> positions = {0, 1, 7, 1000, 65535, 1000003};
  r.shape = "rope_dim=" + std::to_string(rope_dim) + " positions=0..1000003";
  double worst = 0;
  for (int64_t pos : positions) {
    std::vector<float> x = RandomFloats(rng, rope_dim, 1.0f);  // [rope_dim] one head's rope part
    std::vector<float> y = x;
    ApplyRope(table, y.data(), pos, inverse, false);
    for (int i = 0; i < rope_dim / 2; ++i) {
      // The reference's angle is an fp32 product; everything after it is exact here.
      double theta = static_cast<double>(static_cast<float>(pos) * table.inv_freq[i]);
      double c = std::cos(theta), s = inverse ? -std::sin(theta) : std::sin(theta);
      double a = x[2 * i], b = x[2 * i + 1];
      double norm = std::hypot(a, b);
      Track(&worst, y[2 * i], a * c - b * s, norm);
      Track(&worst, y[2 * i + 1], a * s + b * c, norm);
    }
  }
  r.max_rel_err = worst;
  r.ok = worst <= r.budget;
  return r;
}

}  // namespace

std::vector<SelfCheckResult> RunCpuSelfCheck(ThreadPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<SelfCheckResult> out;
  // 203 rows: not a multiple of the 4-row GEMV groups nor of the 128-row FP8 scale blocks;
  // 416 cols: a multiple of the FP4 block (32) but not of 128 or of the 8-lane vectors' 64.
  for (WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kFp4Packed, WeightFormat::kBF16})
    for (int64_t m : {int64_t{1}, int64_t{5}})
      out.push_back(CheckMatMul(pool, f, m, 203, 416, false, rng));
  // The official numerics' inputs (the AMX tile path where present), a 17-token batch: one full
  // tile group plus a ragged one.
  for (WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kFp4Packed, WeightFormat::kBF16})
    out.push_back(CheckMatMul(pool, f, 17, 203, 416, true, rng));
  // One token of those inputs (the tile-exact AVX-512 kernels where in use): 1056 columns, two
  // 512-column groups and a tail chunk.
  for (WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kFp4Packed})
    out.push_back(CheckMatMul(pool, f, 1, 203, 1056, true, rng));
  // Whole 128-column blocks (what the AVX-512 BF16 kernels take on CPUs without AMX; 416 and 1056
  // columns fall back to FP32 there): 384 columns, one token and 17 (two token groups, one
  // ragged).
  for (WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kFp4Packed, WeightFormat::kBF16})
    for (int64_t m : {int64_t{1}, int64_t{17}})
      out.push_back(CheckMatMul(pool, f, m, 203, 384, true, rng));
  out.push_back(CheckRmsNorm(3, 1000, false, rng));
  out.push_back(CheckRmsNorm(3, 1000, true, rng));
  out.push_back(CheckRope(64, false, rng));
  out.push_back(CheckRope(64, true, rng));
  return out;
}

CpuPeak ComputeCpuPeak(int cores, double ghz, int fp32_lanes, int fma_units) {
  CpuPeak p;
  p.cores = cores;
  p.ghz = ghz;
  p.fp32_lanes = fp32_lanes;
  p.fma_units = fma_units;
  p.gflops = cores * ghz * fp32_lanes * 2.0 * fma_units;
  std::ostringstream s;
  s << cores << " cores x " << ghz << " GHz x " << fp32_lanes << " fp32 lanes x 2 flops/FMA x "
    << fma_units << " FMA units = " << p.gflops << " GFLOP/s";
  p.derivation = s.str();
  return p;
}

CpuPeak DetectCpuPeak(bool avx512f, bool avx2_fma) {
  // Physical cores: distinct (physical id, core id) pairs of /proc/cpuinfo.
  std::set<std::pair<std::string, std::string>> core_ids;
  double mhz = 0;
  int processors = 0;
  {
    std::ifstream in("/proc/cpuinfo");
    std::string line, phys = "0";
    while (std::getline(in, line)) {
      auto value = [&] {
        size_t colon = line.find(':');
        return colon == std::string::npos ? std::string() : line.substr(colon + 1);
      };
      if (line.rfind("processor", 0) == 0) ++processors;
      if (line.rfind("physical id", 0) == 0) phys = value();
      if (line.rfind("core id", 0) == 0) core_ids.insert({phys, value()});
      if (line.rfind("cpu MHz", 0) == 0 && mhz == 0) mhz = std::atof(value().c_str());
    }
  }
  int cores = static_cast<int>(core_ids.size());
  std::string cores_source = "distinct (physical id, core id) in /proc/cpuinfo";
  if (cores == 0) {
    cores = std::max(1, processors);
    cores_source = "processor lines in /proc/cpuinfo (no core ids)";
  }
  double ghz = 0;
  std::string ghz_source;
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    long long khz = 0;
    if (f >> khz && khz > 0) {
      ghz = static_cast<double>(khz) / 1e6;
      ghz_source = "cpufreq cpuinfo_max_freq";
    }
  }
  if (ghz == 0 && mhz > 0) {
    ghz = mhz / 1000.0;
    ghz_source = "/proc/cpuinfo cpu MHz (current clock; no cpufreq)";
  }
  if (ghz == 0) {
    ghz = 2.0;
    ghz_source = "assumed 2.0 GHz (no clock reported)";
  }
  const int lanes = avx512f ? 16 : avx2_fma ? 8 : 4;
  // Two FMA pipes per core is what Intel server cores since Skylake-SP (the 2-unit parts) and
  // AMD Zen cores have; cpuid does not report it, so the peak states it as an assumption.
  CpuPeak p = ComputeCpuPeak(cores, ghz, lanes, 2);
  p.cores_source = cores_source;
  p.ghz_source = ghz_source;
  p.derivation += " (" +
                  std::string(avx512f    ? "AVX-512"
                              : avx2_fma ? "AVX2+FMA"
                                         : "SSE") +
                  " detected; 2 FMA units per core assumed; cores from " + cores_source +
                  "; clock from " + ghz_source + ")";
  if (avx512f)
    p.derivation +=
        "; the fused GEMV/GEMM kernels use 256-bit AVX2 vectors, so they can reach at "
        "most half of this AVX-512 peak";
  return p;
}

GemmProbeResult RunCpuGemmProbe(ThreadPool& pool, double max_seconds) {
  constexpr int64_t kRows = 2048, kCols = 2048, kTokens = 64;
  std::mt19937 rng(7);
  HostWeight w = RandomWeight(rng, WeightFormat::kBF16, kRows, kCols, {.name = "selfcheck.w"});
  std::vector<float> x = RandomFloats(rng, kTokens * kCols, 1.0f);  // [m, cols]
  std::vector<float> y(static_cast<size_t>(kTokens * kRows));       // [m, rows]
  using Clock = std::chrono::steady_clock;
  std::vector<double> times;
  const auto start = Clock::now();
  MatMul(w.view, x.data(), kTokens, y.data(), pool);  // warm-up: pages, caches, pool threads
  while (times.size() < 3 ||
         (std::chrono::duration<double>(Clock::now() - start).count() < max_seconds &&
          times.size() < 50)) {
    auto t0 = Clock::now();
    MatMul(w.view, x.data(), kTokens, y.data(), pool);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  GemmProbeResult r;
  r.shape = "bf16 W[" + std::to_string(kRows) + ", " + std::to_string(kCols) +
            "], m=" + std::to_string(kTokens) + " tokens";
  r.seconds = times[times.size() / 2];
  r.repeats = static_cast<int>(times.size());
  r.gflops = 2.0 * kTokens * kRows * kCols / r.seconds / 1e9;
  return r;
}

}  // namespace dsinfer::backend::cpu
