#include "backend/cuda/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/model_kernels.h"
#include "backend/cuda/ops.h"
#include "backend/fp4_to_fp8.h"
#include "backend/random_weights.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace dsinfer::backend::cuda {

namespace {

constexpr size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xa5;

// A device output of n floats with kGuardBytes of a known pattern on each side. The payload
// starts as `init` or, without one, all-ones bytes (NaN floats).
class GuardedOutput {
 public:
  static Result<GuardedOutput> Make(CudaDevice& dev, int64_t n, const float* init) {
    GuardedOutput g;
    g.n_ = n;
    const size_t bytes = static_cast<size_t>(n) * 4 + 2 * kGuardBytes;
    DSINFER_ASSIGN_OR_RETURN(g.buf_, dev.Alloc(bytes));
    DSINFER_RETURN_IF_ERROR(dev.Memset(g.buf_.data(), kGuardByte, bytes));
    if (init != nullptr) {
      DSINFER_RETURN_IF_ERROR(dev.CopyToDevice(g.ptr(), init, static_cast<size_t>(n) * 4));
    } else {
      DSINFER_RETURN_IF_ERROR(dev.Memset(g.ptr(), 0xff, static_cast<size_t>(n) * 4));
    }
    DSINFER_RETURN_IF_ERROR(dev.Synchronize());
    return g;
  }
  float* ptr() const { return reinterpret_cast<float*>(buf_.as<uint8_t>() + kGuardBytes); }
  // Downloads the payload; fails if a guard byte changed (an out-of-bounds write).
  Status Fetch(CudaDevice& dev, std::vector<float>* out) const {
    std::vector<uint8_t> all(buf_.bytes());
    DSINFER_RETURN_IF_ERROR(dev.CopyToHost(all.data(), buf_.data(), all.size()));
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (all[i] != kGuardByte)
        return Internal("guard byte " + std::to_string(i) + " before the output was overwritten");
      if (all[all.size() - 1 - i] != kGuardByte)
        return Internal("guard byte " + std::to_string(i) + " after the output was overwritten");
    }
    out->resize(static_cast<size_t>(n_));
    std::memcpy(out->data(), all.data() + kGuardBytes, static_cast<size_t>(n_) * 4);
    return Status::Ok();
  }

 private:
  DeviceBuffer buf_;
  int64_t n_ = 0;
};

// Element-by-element comparison against per-element budgets.
class Comparison {
 public:
  void Add(const std::string& what, int64_t i, float gpu, float cpu, double budget) {
    double share;
    if (std::isnan(cpu) && std::isnan(gpu)) return;
    if (!std::isfinite(gpu) || !std::isfinite(cpu)) {
      share = INFINITY;
    } else {
      share = std::fabs(static_cast<double>(gpu) - cpu) / std::max(budget, 1e-300);
    }
    if (share > worst_) worst_ = share;
    if (share > 1.0 && first_failure_.empty())
      first_failure_ = what + "[" + std::to_string(i) + "]: gpu " + std::to_string(gpu) + " cpu " +
                       std::to_string(cpu) + " budget " + std::to_string(budget);
  }
  void Finish(CheckResult* r) const {
    r->budget_share = worst_;
    r->ok = first_failure_.empty();
    r->detail = first_failure_;
  }

 private:
  double worst_ = 0;
  std::string first_failure_;
};

CheckResult Failed(CheckResult r, const Status& s) {
  r.ok = false;
  r.detail = s.ToString();
  return r;
}

#define CHECK_OK_OR_FAIL(expr)                       \
  do {                                               \
    ::dsinfer::Status _st = (expr);                  \
    if (!_st.ok()) return Failed(std::move(r), _st); \
  } while (0)
#define ASSIGN_OR_FAIL(lhs, expr)                                          \
  auto DSINFER_CONCAT(_res_, __LINE__) = (expr);                           \
  if (!DSINFER_CONCAT(_res_, __LINE__).ok())                               \
    return Failed(std::move(r), DSINFER_CONCAT(_res_, __LINE__).status()); \
  lhs = std::move(DSINFER_CONCAT(_res_, __LINE__)).value()

std::string FormatName(model::WeightFormat f, bool f32_scales) {
  switch (f) {
    case model::WeightFormat::kF32:
      return "f32";
    case model::WeightFormat::kBF16:
      return "bf16";
    case model::WeightFormat::kFp8Block:
      return f32_scales ? "fp8-f32scale" : "fp8-e8m0";
    case model::WeightFormat::kFp4Packed:
      return f32_scales ? "fp4-f32scale" : "fp4-e8m0";
  }
  return "?";
}

// Budgets are relative to sum_k |x[i, k] * w[n, k]| per output element [m, rows] (exactly
// dequantized weights, in double).
std::vector<double> SumAbsProducts(const model::WeightMatrix& w, const std::vector<float>& x,
                                   int64_t m) {
  const int64_t rows = w.rows, cols = w.cols;
  std::vector<double> sum_abs(static_cast<size_t>(m * rows), 0.0);
  std::vector<float> wrow(static_cast<size_t>(cols));
  for (int64_t n = 0; n < rows; ++n) {
    cpu::DequantRow(w, n, wrow.data());
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k)
        s += std::fabs(static_cast<double>(x[i * cols + k]) * wrow[k]);
      sum_abs[i * rows + n] = s;
    }
  }
  return sum_abs;
}

// Normal floats spread over many binades (2^-30 .. 2^20) with exact zeros, grid ties of e2m1
// (2.5) and e4m3 (-9) and one NaN: the inputs of the bit-exact rounding checks.
std::vector<float> WideRangeFloats(std::mt19937& rng, int64_t n) {
  std::vector<float> x = RandomFloats(rng, n, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-30, 20), pick(0, 15);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::ldexp(x[i], exp_dist(rng));
    const int p = pick(rng);
    if (p == 0) x[i] = 0.0f;
    if (p == 1) x[i] = 2.5f;   // an e2m1 tie (2 | 3) once the block's scale is 1
    if (p == 2) x[i] = -9.0f;  // an e4m3 tie at scale 1/4 .. 1 (8 | 10)
  }
  if (!x.empty()) x[x.size() / 2] = std::nanf("");
  return x;
}

// GPU MatMul of `gpu_weight` vs CPU MatMul of `cpu_weight` (same values, maybe other formats).
CheckResult CompareMatMul(CudaDevice& dev, CheckResult r, const model::WeightMatrix& cpu_weight,
                          const model::WeightMatrix& gpu_weight, int64_t m, std::mt19937& rng) {
  const int64_t rows = cpu_weight.rows, cols = cpu_weight.cols;
  std::vector<float> x = RandomFloats(rng, m * cols, 1.0f);  // [m, cols]
  std::vector<float> y_cpu(static_cast<size_t>(m * rows));   // [m, rows]
  ThreadPool pool(2);
  cpu::MatMul(cpu_weight, x.data(), m, y_cpu.data(), pool);
  const std::vector<double> sum_abs = SumAbsProducts(cpu_weight, x, m);
  ASSIGN_OR_FAIL(DeviceWeight dw, UploadWeight(dev, gpu_weight));
  ASSIGN_OR_FAIL(DeviceBuffer dx, dev.Upload(x.data(), x.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dy, GuardedOutput::Make(dev, m * rows, nullptr));
  CHECK_OK_OR_FAIL(MatMul(dev, dw, dx.as<float>(), m, dy.ptr()));
  std::vector<float> y_gpu;
  CHECK_OK_OR_FAIL(dy.Fetch(dev, &y_gpu));
  Comparison cmp;
  for (int64_t i = 0; i < m * rows; ++i)
    cmp.Add("y", i, y_gpu[i], y_cpu[i], kMatMulRelToSumAbs * sum_abs[i] + 1e-30);
  cmp.Finish(&r);
  return r;
}

std::string Shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (const auto& [name, v] : dims)
    s += (s.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(v);
  return s;
}

}  // namespace

CheckResult CheckMatMul(CudaDevice& dev, model::WeightFormat format, bool f32_scales, int64_t m,
                        int64_t rows, int64_t cols, uint32_t seed) {
  CheckResult r;
  r.op = "matmul/" + FormatName(format, f32_scales);
  r.shape = Shape({{"m", m}, {"rows", rows}, {"cols", cols}});
  std::mt19937 rng(seed);
  HostWeight w =
      RandomWeight(rng, format, rows, cols, {.f32_scales = f32_scales, .name = "conformance.w"});
  return CompareMatMul(dev, std::move(r), w.view, w.view, m, rng);
}

CheckResult CheckReblockedFp4MatMul(CudaDevice& dev, int64_t m, int64_t rows, int64_t cols,
                                    uint32_t seed) {
  CheckResult r;
  r.op = "matmul/fp4-reblocked-fp8";
  r.shape = Shape({{"m", m}, {"rows", rows}, {"cols", cols}});
  std::mt19937 rng(seed);
  HostWeight w =
      RandomWeight(rng, model::WeightFormat::kFp4Packed, rows, cols, {.name = "conformance.w"});
  ASSIGN_OR_FAIL(Fp8BlockWeight fp8, ReblockFp4ToFp8(w.view));
  if (fp8.inexact != 0) {
    r.detail = "re-blocking was inexact for " + std::to_string(fp8.inexact) + " elements";
    return r;
  }
  return CompareMatMul(dev, std::move(r), w.view, fp8.View("conformance.w.fp8"), m, rng);
}

CheckResult CheckRmsNorm(CudaDevice& dev, int64_t rows, int64_t n, bool with_weight,
                         bool round_bf16, uint32_t seed) {
  CheckResult r;
  r.op = std::string("rmsnorm/") + (round_bf16 ? "bf16" : "f32") + (with_weight ? "" : "-noweight");
  r.shape = Shape({{"rows", rows}, {"n", n}});
  std::mt19937 rng(seed);
  std::vector<float> x = RandomFloats(rng, rows * n, 3.0f);  // [rows, n]
  std::vector<uint8_t> w_bf16(static_cast<size_t>(n) * 2);   // [n] bf16 (checkpoint format)
  std::vector<float> w_f32(static_cast<size_t>(n));          // [n] f32, same values
  std::vector<float> wv = RandomFloats(rng, n, 0.5f);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b = F32ToBf16(1.0f + wv[i]);
    std::memcpy(w_bf16.data() + 2 * i, &b, 2);
    w_f32[i] = Bf16ToF32(b);
  }
  model::TensorView weight;
  weight.data = w_bf16.data();
  weight.dtype = DType::kBF16;
  weight.shape = {n};
  std::vector<float> y_cpu = x;
  cpu::RmsNormRows(y_cpu.data(), rows, n, with_weight ? &weight : nullptr, 1e-6, round_bf16);
  ASSIGN_OR_FAIL(DeviceBuffer dw, dev.Upload(w_f32.data(), w_f32.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dx, GuardedOutput::Make(dev, rows * n, x.data()));
  CHECK_OK_OR_FAIL(RmsNormRows(dev, dx.ptr(), rows, n, with_weight ? dw.as<float>() : nullptr, 1e-6,
                               round_bf16));
  std::vector<float> y_gpu;
  CHECK_OK_OR_FAIL(dx.Fetch(dev, &y_gpu));
  Comparison cmp;
  for (int64_t row = 0; row < rows; ++row) {
    float mx = 0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(y_cpu[row * n + i]));
    for (int64_t i = row * n; i < (row + 1) * n; ++i) {
      double rel = round_bf16 ? kBf16Ulp : kElementwiseRel;
      cmp.Add("y", i, y_gpu[i], y_cpu[i], rel * std::fabs(y_cpu[i]) + kElementwiseFloor * mx);
    }
  }
  cmp.Finish(&r);
  return r;
}

CheckResult CheckRope(CudaDevice& dev, int64_t rows, int rope_dim, bool compressed_layer,
                      bool inverse, bool round_bf16, uint32_t seed) {
  CheckResult r;
  r.op = std::string("rope/") + (round_bf16 ? "bf16" : "f32") + (inverse ? "-inverse" : "") +
         (compressed_layer ? "-yarn" : "");
  r.shape = Shape({{"rows", rows}, {"rope_dim", rope_dim}});
  std::mt19937 rng(seed);
  // The table itself is host code shared with the CPU backend; the op under test is the rotation.
  cpu::RopeTable table;
  const int half = rope_dim / 2;
  const float base = compressed_layer ? 160000.0f : 10000.0f;
  for (int i = 0; i < half; ++i) {
    float f = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rope_dim));
    if (compressed_layer && i > half / 2) f /= 16.0f;  // YaRN-like divided tail
    table.inv_freq.push_back(f);
  }
  const int64_t stride = rope_dim + 448;  // a head: nope dims, then the rope dims
  const int64_t offset = 448;
  std::vector<float> x = RandomFloats(rng, rows * stride, 1.0f);   // [rows, stride]
  std::vector<int64_t> pos(static_cast<size_t>(rows));             // [rows]
  std::uniform_int_distribution<int64_t> pd(0, int64_t{1} << 20);  // up to 1M-token contexts
  for (auto& p : pos) p = pd(rng);
  if (rows > 0) pos[0] = 0;
  std::vector<float> y_cpu = x;
  for (int64_t row = 0; row < rows; ++row)
    cpu::ApplyRope(table, y_cpu.data() + row * stride + offset, pos[row], inverse, round_bf16);
  ASSIGN_OR_FAIL(DeviceBuffer dpos, dev.Upload(pos.data(), pos.size() * 8));
  ASSIGN_OR_FAIL(DeviceBuffer dfreq, dev.Upload(table.inv_freq.data(), table.inv_freq.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dx, GuardedOutput::Make(dev, rows * stride, x.data()));
  CHECK_OK_OR_FAIL(ApplyRope(dev, dx.ptr(), rows, stride, offset, dpos.as<int64_t>(),
                             dfreq.as<float>(), half, inverse, round_bf16));
  std::vector<float> y_gpu;
  CHECK_OK_OR_FAIL(dx.Fetch(dev, &y_gpu));
  Comparison cmp;
  for (int64_t i = 0; i < rows * stride; ++i) {
    double rel = round_bf16 ? kBf16Ulp : kElementwiseRel;
    cmp.Add("x", i, y_gpu[i], y_cpu[i], rel * std::fabs(y_cpu[i]) + kElementwiseFloor);
  }
  cmp.Finish(&r);
  return r;
}

CheckResult CheckHc(CudaDevice& dev, int hc, int64_t hidden, int64_t tokens, bool round_bf16,
                    uint32_t seed) {
  CheckResult r;
  r.op = std::string("mhc/") + (round_bf16 ? "bf16" : "f32");
  r.shape = Shape({{"hc", hc}, {"hidden", hidden}, {"tokens", tokens}});
  std::mt19937 rng(seed);
  model::ModelConfig c;
  c.hc_mult = hc;
  c.hidden = static_cast<int>(hidden);
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.norm_eps = 1e-6;
  const int n_rows = c.HcRows();
  const int64_t n = hc * hidden;
  std::vector<float> fn = RandomFloats(rng, n_rows * n, 0.02f);     // [(2+hc)*hc, hc*hidden]
  std::vector<float> base = RandomFloats(rng, n_rows, 0.5f);        // [(2+hc)*hc]
  std::vector<float> scale = {0.7f, 1.3f, 2.0f};                    // [3]
  std::vector<float> H = RandomFloats(rng, tokens * n, 1.0f);       // [tokens, hc, hidden]
  std::vector<float> a = RandomFloats(rng, tokens * hidden, 1.0f);  // [tokens, hidden]
  auto view = [](const std::vector<float>& v, std::vector<int64_t> shape) {
    model::TensorView t;
    t.data = reinterpret_cast<const uint8_t*>(v.data());
    t.dtype = DType::kF32;
    t.shape = std::move(shape);
    return t;
  };
  model::HcParams p{view(fn, {n_rows, n}), view(base, {n_rows}), view(scale, {3})};
  const int mix_n = 2 * hc + hc * hc;
  std::vector<float> x_cpu(static_cast<size_t>(tokens * hidden));   // [tokens, hidden]
  std::vector<float> mix_cpu(static_cast<size_t>(tokens * mix_n));  // [tokens, mix_n]
  std::vector<float> h_cpu = H;
  for (int64_t t = 0; t < tokens; ++t) {
    cpu::HcPre(c, p, H.data() + t * n, x_cpu.data() + t * hidden, mix_cpu.data() + t * mix_n,
               round_bf16);
    cpu::HcPost(c, mix_cpu.data() + t * mix_n, a.data() + t * hidden, h_cpu.data() + t * n,
                round_bf16);
  }
  ASSIGN_OR_FAIL(DeviceBuffer dfn, dev.Upload(fn.data(), fn.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dbase, dev.Upload(base.data(), base.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dscale, dev.Upload(scale.data(), scale.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer da, dev.Upload(a.data(), a.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer ddots, dev.Alloc(static_cast<size_t>(tokens * (n_rows + 1)) * 4));
  ASSIGN_OR_FAIL(GuardedOutput dh, GuardedOutput::Make(dev, tokens * n, H.data()));
  ASSIGN_OR_FAIL(GuardedOutput dx, GuardedOutput::Make(dev, tokens * hidden, nullptr));
  ASSIGN_OR_FAIL(GuardedOutput dmix, GuardedOutput::Make(dev, tokens * mix_n, nullptr));
  HcShape s;
  s.hc = hc;
  s.hidden = hidden;
  s.sinkhorn_iters = c.hc_sinkhorn_iters;
  s.norm_eps = static_cast<float>(c.norm_eps);
  s.hc_eps = static_cast<float>(c.hc_eps);
  CHECK_OK_OR_FAIL(HcPre(dev, s, dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), dh.ptr(),
                         tokens, ddots.as<float>(), dx.ptr(), dmix.ptr(), round_bf16));
  CHECK_OK_OR_FAIL(HcPost(dev, s, dmix.ptr(), da.as<float>(), dh.ptr(), tokens, round_bf16));
  std::vector<float> x_gpu, mix_gpu, h_gpu;
  CHECK_OK_OR_FAIL(dx.Fetch(dev, &x_gpu));
  CHECK_OK_OR_FAIL(dmix.Fetch(dev, &mix_gpu));
  CHECK_OK_OR_FAIL(dh.Fetch(dev, &h_gpu));
  Comparison cmp;
  // The mixes pass through exp and 20 Sinkhorn sweeps; an input error of a few fp32 ulps stays a
  // few ulps (the normalisations are contractive), so the fp32 budget applies with a 10x margin.
  for (int64_t i = 0; i < tokens * mix_n; ++i)
    cmp.Add("mix", i, mix_gpu[i], mix_cpu[i], 10 * kElementwiseRel * std::fabs(mix_cpu[i]) + 1e-7);
  // x = sum_j pre_j H_j and H'_k = post_k a + sum_j comb_jk H_j are sums of hc terms that can
  // cancel: a relative error e of the mixes moves them by up to e * (sum of the terms' absolute
  // values), which can be far above e * |result| (measured on an H200: x = 8.5e-4 from terms of
  // size ~1 differed by 2e-6). So the mixes' budget applies to that sum, plus the output's own
  // rounding relative to the result.
  const double mix_rel = 10 * kElementwiseRel;
  const double rel = round_bf16 ? kBf16Ulp : 10 * kElementwiseRel;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* m = mix_cpu.data() + t * mix_n;
    const float* h = H.data() + t * n;
    for (int64_t i = 0; i < hidden; ++i) {
      double terms = 0;
      for (int j = 0; j < hc; ++j) terms += std::fabs(double{m[j]} * h[j * hidden + i]);
      const int64_t xi = t * hidden + i;
      cmp.Add("x", xi, x_gpu[xi], x_cpu[xi],
              mix_rel * terms + rel * std::fabs(x_cpu[xi]) + kElementwiseFloor);
      for (int k = 0; k < hc; ++k) {
        double h_terms = std::fabs(double{m[hc + k]} * a[xi]);
        for (int j = 0; j < hc; ++j)
          h_terms += std::fabs(double{m[2 * hc + j * hc + k]} * h[j * hidden + i]);
        const int64_t hi = t * n + k * hidden + i;
        cmp.Add("H", hi, h_gpu[hi], h_cpu[hi],
                mix_rel * h_terms + rel * std::fabs(h_cpu[hi]) + kElementwiseFloor);
      }
    }
  }
  cmp.Finish(&r);
  return r;
}

CheckResult CheckActivationRounding(CudaDevice& dev, const std::string& kind, int64_t rows,
                                    int64_t n, int64_t stride, int block, bool round_bf16,
                                    uint32_t seed) {
  CheckResult r;
  r.op = "act-rounding/" + kind;
  r.shape = Shape({{"rows", rows}, {"n", n}, {"stride", stride}, {"block", block}});
  std::mt19937 rng(seed);
  const std::vector<float> x = WideRangeFloats(rng, rows * stride);  // [rows, stride]
  std::vector<float> want = x;
  for (int64_t row = 0; row < rows; ++row) {
    float* p = want.data() + row * stride;
    if (kind == "fp8") Fp8RoundTripInPlace(p, static_cast<int>(n), block);
    if (kind == "fp4") Fp4RoundTripInPlace(p, static_cast<int>(n), block);
    if (kind == "hadamard") HadamardInPlace(p, static_cast<int>(n), round_bf16);
  }
  ASSIGN_OR_FAIL(GuardedOutput dx, GuardedOutput::Make(dev, rows * stride, x.data()));
  cudaError_t err = cudaSuccess;
  if (kind == "fp8") err = LaunchFp8RoundTrip(dx.ptr(), rows, n, stride, block, dev.stream());
  if (kind == "fp4") err = LaunchFp4RoundTrip(dx.ptr(), rows, n, stride, block, dev.stream());
  if (kind == "hadamard")
    err = LaunchHadamard(dx.ptr(), rows, static_cast<int>(n), round_bf16, dev.stream());
  CHECK_OK_OR_FAIL(CudaStatus(err, r.op.c_str()));
  std::vector<float> got;
  CHECK_OK_OR_FAIL(dx.Fetch(dev, &got));
  Comparison cmp;  // bit for bit: a zero budget fails any difference
  for (int64_t i = 0; i < rows * stride; ++i) {
    if (std::isnan(want[i]) != std::isnan(got[i]) ||
        (!std::isnan(want[i]) && std::memcmp(&want[i], &got[i], 4) != 0))
      cmp.Add("x", i, got[i], want[i], 0.0);
  }
  cmp.Finish(&r);
  return r;
}

// ---- the tensor-core GEMM of the official numerics ----------------------------------------------

CheckResult CheckActQuantCodes(CudaDevice& dev, int64_t rows, int64_t n, uint32_t seed) {
  CheckResult r;
  r.op = "act-quant/fp8-codes";
  r.shape = Shape({{"rows", rows}, {"n", n}});
  std::mt19937 rng(seed);
  const std::vector<float> x = WideRangeFloats(rng, rows * n);  // [rows, n]
  const int64_t n_blocks = (n + 127) / 128;
  std::vector<uint8_t> want_codes(static_cast<size_t>(rows * n));        // [rows, n] e4m3
  std::vector<float> want_scales(static_cast<size_t>(rows * n_blocks));  // [rows, n_blocks]
  for (int64_t row = 0; row < rows; ++row)
    ActQuantFp8(x.data() + row * n, static_cast<int>(n), 128, want_codes.data() + row * n,
                want_scales.data() + row * n_blocks);
  ASSIGN_OR_FAIL(DeviceBuffer dx, dev.Upload(x.data(), x.size() * 4));
  // Codes in a guarded float buffer (4 codes per float); unwritten bytes stay 0xff.
  ASSIGN_OR_FAIL(GuardedOutput dcodes, GuardedOutput::Make(dev, (rows * n + 3) / 4, nullptr));
  ASSIGN_OR_FAIL(GuardedOutput dscales, GuardedOutput::Make(dev, rows * n_blocks, nullptr));
  CHECK_OK_OR_FAIL(CudaStatus(
      LaunchActQuantFp8(dx.as<float>(), rows, n, reinterpret_cast<uint8_t*>(dcodes.ptr()),
                        dscales.ptr(), dev.stream()),
      r.op.c_str()));
  std::vector<float> got_codes, got_scales;
  CHECK_OK_OR_FAIL(dcodes.Fetch(dev, &got_codes));
  CHECK_OK_OR_FAIL(dscales.Fetch(dev, &got_scales));
  const auto* codes = reinterpret_cast<const uint8_t*>(got_codes.data());
  Comparison cmp;  // bit for bit
  for (int64_t i = 0; i < rows * n; ++i)
    if (codes[i] != want_codes[i])
      cmp.Add("code", i, static_cast<float>(codes[i]), static_cast<float>(want_codes[i]), 0.0);
  for (int64_t i = 0; i < rows * n_blocks; ++i)
    if (std::memcmp(&got_scales[i], &want_scales[i], 4) != 0)
      cmp.Add("scale", i, got_scales[i], want_scales[i], 0.0);
  cmp.Finish(&r);
  return r;
}

CheckResult CheckTcMatMul(CudaDevice& dev, TcMma mma, int64_t m, int64_t rows, int64_t cols,
                          uint32_t seed) {
  CheckResult r;
  r.op = mma == TcMma::kFp8 ? "tc-matmul/fp8-mma" : "tc-matmul/f16-mma";
  r.shape = Shape({{"m", m}, {"rows", rows}, {"cols", cols}});
  std::mt19937 rng(seed);
  HostWeight w =
      RandomWeight(rng, model::WeightFormat::kFp8Block, rows, cols, {.name = "conformance.w"});
  const std::vector<float> x = RandomFloats(rng, m * cols, 1.0f);  // [m, cols]
  // The CPU oracle: the act quant's round trip, then the fp32 GEMM.
  std::vector<float> xq = x;
  for (int64_t i = 0; i < m; ++i)
    Fp8RoundTripInPlace(xq.data() + i * cols, static_cast<int>(cols), 128);
  std::vector<float> y_cpu(static_cast<size_t>(m * rows));  // [m, rows]
  ThreadPool pool(2);
  cpu::MatMul(w.view, xq.data(), m, y_cpu.data(), pool);
  const std::vector<double> sum_abs = SumAbsProducts(w.view, xq, m);
  ASSIGN_OR_FAIL(DeviceWeight dw, UploadWeight(dev, w.view));
  ASSIGN_OR_FAIL(DeviceBuffer dx, dev.Upload(x.data(), x.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dy, GuardedOutput::Make(dev, m * rows, nullptr));
  CHECK_OK_OR_FAIL(TcMatMul(dev, dw, dx.as<float>(), m, dy.ptr(), mma));
  std::vector<float> y_gpu;
  CHECK_OK_OR_FAIL(dy.Fetch(dev, &y_gpu));
  const double rel = mma == TcMma::kFp8 ? kTcFp8RelToSumAbs : kMatMulRelToSumAbs;
  Comparison cmp;
  for (int64_t i = 0; i < m * rows; ++i)
    cmp.Add("y", i, y_gpu[i], y_cpu[i], rel * sum_abs[i] + 1e-30);
  cmp.Finish(&r);
  return r;
}

// ---- MoE router, grouped MoE GEMM, indexer + top-k, sparse attention ---------------------------

namespace {

// A guarded int32 output (same 4-byte elements as GuardedOutput's floats) starting as kUnwritten
// so an element the kernel forgot to write is told apart from the -1 padding.
constexpr int32_t kUnwritten = 0x7eadbeef;

Result<GuardedOutput> MakeIntOutput(CudaDevice& dev, int64_t n) {
  std::vector<float> init(static_cast<size_t>(n));
  for (auto& f : init) std::memcpy(&f, &kUnwritten, 4);
  return GuardedOutput::Make(dev, n, init.data());
}

std::vector<int32_t> AsInts(const std::vector<float>& v) {
  std::vector<int32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

}  // namespace

CheckResult CheckRouter(CudaDevice& dev, int64_t tokens, int n_experts, int top_k, bool hash,
                        bool ties, uint32_t seed) {
  CheckResult r;
  r.op = std::string("router/") + (hash ? "hash" : "biased-topk") + (ties ? "-ties" : "");
  r.shape = Shape({{"tokens", tokens}, {"experts", n_experts}, {"k", top_k}});
  std::mt19937 rng(seed);
  const int E = n_experts, K = top_k;
  std::vector<float> logits = RandomFloats(rng, tokens * E, 2.0f);  // [T, E]
  // Ties: logits on a coarse grid and no bias, so many experts score exactly the same on both
  // sides (the same float function of the same input) and the lower-id rule decides.
  if (ties)
    for (auto& v : logits) v = std::round(v * 2.0f) / 2.0f;
  std::vector<float> bias = RandomFloats(rng, E, 0.1f);  // [E]
  if (ties) std::fill(bias.begin(), bias.end(), 0.0f);
  const int64_t vocab = 97;
  std::uniform_int_distribution<int32_t> expert_d(0, E - 1), token_d(0, vocab - 1);
  std::vector<int32_t> tid2eid(static_cast<size_t>(vocab * K));  // [vocab, K]
  for (auto& e : tid2eid) e = expert_d(rng);
  std::vector<int32_t> token_ids(static_cast<size_t>(tokens));  // [T]
  for (auto& t : token_ids) t = token_d(rng);
  RouterParams p;
  p.n_experts = E;
  p.top_k = K;
  p.route_scale = 2.5f;
  p.bias = hash ? nullptr : bias.data();
  p.tid2eid = hash ? tid2eid.data() : nullptr;
  p.vocab = vocab;
  std::vector<int32_t> chosen_cpu;
  std::vector<float> weights_cpu;
  CHECK_OK_OR_FAIL(RouteTokens(p, logits, token_ids, &chosen_cpu, &weights_cpu));
  ASSIGN_OR_FAIL(DeviceBuffer dlogits, dev.Upload(logits.data(), logits.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dbias, dev.Upload(bias.data(), bias.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dtable, dev.Upload(tid2eid.data(), tid2eid.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dtokens, dev.Upload(token_ids.data(), token_ids.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dchosen, MakeIntOutput(dev, tokens * K));
  ASSIGN_OR_FAIL(GuardedOutput dweights, GuardedOutput::Make(dev, tokens * K, nullptr));
  CHECK_OK_OR_FAIL(Route(dev, dlogits.as<float>(), tokens, E, K, hash ? nullptr : dbias.as<float>(),
                         hash ? dtable.as<int32_t>() : nullptr, vocab, dtokens.as<int32_t>(),
                         p.route_scale, reinterpret_cast<int32_t*>(dchosen.ptr()), dweights.ptr()));
  std::vector<float> chosen_raw, weights_gpu;
  CHECK_OK_OR_FAIL(dchosen.Fetch(dev, &chosen_raw));
  CHECK_OK_OR_FAIL(dweights.Fetch(dev, &weights_gpu));
  const std::vector<int32_t> chosen_gpu = AsInts(chosen_raw);
  Comparison cmp;
  for (int64_t t = 0; t < tokens; ++t) {
    bool same = true;
    for (int k = 0; k < K; ++k) {
      const int32_t a = chosen_cpu[t * K + k], g = chosen_gpu[t * K + k];
      if (a == g) continue;
      same = false;
      // A different pick is accepted only at a near-tie of the CPU's biased scores: the GPU's
      // expf / log1pf may differ from glibc's by a few ulps (never at an exact tie: ties mode).
      const bool valid = g >= 0 && g < E;
      auto biased = [&](int32_t e) {
        return std::sqrt(RouterSoftplus(logits[t * E + e])) + bias[e];
      };
      if (hash || ties || !valid ||
          std::fabs(biased(a) - biased(g)) > 1e-5 * std::max(std::fabs(biased(a)), 1.0f)) {
        r.ok = false;
        r.detail = "token " + std::to_string(t) + " slot " + std::to_string(k) + ": gpu expert " +
                   std::to_string(g) + " cpu expert " + std::to_string(a);
        r.budget_share = INFINITY;
        return r;
      }
    }
    if (!same) continue;  // a near-tie swap: the weights belong to other experts
    for (int k = 0; k < K; ++k) {
      const int64_t i = t * K + k;
      // sqrt(softplus) and a normalisation: a few fp32 ulps; 2e-5 relative is > 100 ulps.
      cmp.Add("weight", i, weights_gpu[i], weights_cpu[i],
              kElementwiseRel * std::fabs(weights_cpu[i]) + 1e-7);
    }
  }
  cmp.Finish(&r);
  return r;
}

namespace {

// A routed batch and the CPU's answer for it: cpu::MatMul per expert on the gathered rows.
struct GroupedCase {
  std::vector<HostWeight> experts;  // [E] rows x cols each
  RoutedGroups groups;
  std::vector<float> x;         // [tokens, cols]
  std::vector<float> y_cpu;     // [grouped rows, rows]
  std::vector<double> sum_abs;  // [grouped rows, rows] sum |x w| of each output
};

// Routing: the first `heavy` slots to expert 0 (more than one tile), the last expert never used,
// the rest random. quantized: x is the act quant's round trip (what the official numerics feed
// the experts, and the only input the tensor-core path computes exactly).
Result<GroupedCase> MakeGroupedCase(model::WeightFormat format, int64_t tokens, int n_experts,
                                    int top_k, int64_t rows, int64_t cols, size_t heavy,
                                    bool quantized, std::mt19937& rng) {
  GroupedCase c;
  for (int e = 0; e < n_experts; ++e)
    c.experts.push_back(RandomWeight(rng, format, rows, cols, {.name = "conformance.w"}));
  std::uniform_int_distribution<int32_t> expert_d(0, std::max(0, n_experts - 2));
  std::vector<int32_t> chosen(static_cast<size_t>(tokens * top_k));  // [T, K]
  for (size_t i = 0; i < chosen.size(); ++i) chosen[i] = i < heavy ? 0 : expert_d(rng);
  DSINFER_ASSIGN_OR_RETURN(c.groups, GroupRoutedTokens(chosen, n_experts, top_k));
  c.x = RandomFloats(rng, tokens * cols, 1.0f);
  if (quantized)
    for (int64_t t = 0; t < tokens; ++t)
      Fp8RoundTripInPlace(c.x.data() + t * cols, static_cast<int>(cols), 128);
  const int64_t n_rows = static_cast<int64_t>(c.groups.slots.size());
  c.y_cpu.resize(static_cast<size_t>(n_rows * rows));
  c.sum_abs.assign(c.y_cpu.size(), 0.0);
  ThreadPool pool(2);
  std::vector<float> wrow(static_cast<size_t>(cols));
  for (int e = 0; e < n_experts; ++e) {
    const int64_t b = c.groups.offsets[e], n = c.groups.offsets[e + 1] - b;
    if (n == 0) continue;
    std::vector<float> xe(static_cast<size_t>(n * cols));  // [n, cols] this expert's rows
    for (int64_t j = 0; j < n; ++j)
      std::copy_n(c.x.data() + c.groups.tokens[b + j] * cols, cols, xe.data() + j * cols);
    cpu::MatMul(c.experts[e].view, xe.data(), n, c.y_cpu.data() + b * rows, pool);
    for (int64_t o = 0; o < rows; ++o) {
      cpu::DequantRow(c.experts[e].view, o, wrow.data());
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < cols; ++k) sum += std::fabs(double{xe[j * cols + k]} * wrow[k]);
        c.sum_abs[(b + j) * rows + o] = sum;
      }
    }
  }
  return c;
}

// Runs `op` (a grouped GEMM into a guarded output of the case's size) and compares with `rel`.
template <typename Op>
void CompareGrouped(CudaDevice& dev, const GroupedCase& c, int64_t rows, double rel, Op op,
                    CheckResult* r) {
  std::vector<const model::WeightMatrix*> views;
  for (const HostWeight& h : c.experts) views.push_back(&h.view);
  const int64_t n_rows = static_cast<int64_t>(c.groups.slots.size());
  auto fail = [&](const Status& s) { r->ok = false, r->detail = s.ToString(); };
  Result<DeviceExpertSet> set = UploadExperts(dev, views);
  if (!set.ok()) return fail(set.status());
  Result<DeviceBuffer> dx = dev.Upload(c.x.data(), c.x.size() * 4);
  if (!dx.ok()) return fail(dx.status());
  Result<GuardedOutput> dy = GuardedOutput::Make(dev, n_rows * rows, nullptr);
  if (!dy.ok()) return fail(dy.status());
  if (Status s = op(*set, dx->as<float>(), dy->ptr()); !s.ok()) return fail(s);
  std::vector<float> y_gpu;
  if (Status s = dy->Fetch(dev, &y_gpu); !s.ok()) return fail(s);
  Comparison cmp;
  for (size_t i = 0; i < c.y_cpu.size(); ++i)
    cmp.Add("y", static_cast<int64_t>(i), y_gpu[i], c.y_cpu[i], rel * c.sum_abs[i] + 1e-30);
  cmp.Finish(r);
}

}  // namespace

CheckResult CheckGroupedMatMul(CudaDevice& dev, model::WeightFormat format, int64_t tokens,
                               int n_experts, int top_k, int64_t rows, int64_t cols,
                               uint32_t seed) {
  CheckResult r;
  r.op = "grouped-matmul/" + FormatName(format, false);
  r.shape = Shape(
      {{"tokens", tokens}, {"experts", n_experts}, {"k", top_k}, {"rows", rows}, {"cols", cols}});
  std::mt19937 rng(seed);
  ASSIGN_OR_FAIL(GroupedCase c,
                 MakeGroupedCase(format, tokens, n_experts, top_k, rows, cols, 11, false, rng));
  CompareGrouped(
      dev, c, rows, kMatMulRelToSumAbs,
      [&](const DeviceExpertSet& set, const float* x, float* y) {
        return GroupedMatMul(dev, set, c.groups, x, tokens, y);
      },
      &r);
  return r;
}

CheckResult CheckTcGroupedMatMul(CudaDevice& dev, TcMma mma, int64_t tokens, int n_experts,
                                 int top_k, int64_t rows, int64_t cols, uint32_t seed) {
  CheckResult r;
  r.op = mma == TcMma::kFp8 ? "tc-grouped/fp4-fp8-mma" : "tc-grouped/fp4-f16-mma";
  r.shape = Shape(
      {{"tokens", tokens}, {"experts", n_experts}, {"k", top_k}, {"rows", rows}, {"cols", cols}});
  std::mt19937 rng(seed);
  // 70 slots on expert 0: two tiles of it when there are that many.
  ASSIGN_OR_FAIL(GroupedCase c, MakeGroupedCase(model::WeightFormat::kFp4Packed, tokens, n_experts,
                                                top_k, rows, cols, 70, true, rng));
  CompareGrouped(
      dev, c, rows, mma == TcMma::kFp8 ? kTcFp8RelToSumAbs : kMatMulRelToSumAbs,
      [&](const DeviceExpertSet& set, const float* x, float* y) {
        return TcGroupedMatMul(dev, set, c.groups, x, tokens, y, mma);
      },
      &r);
  return r;
}

CheckResult CheckIndexerTopK(CudaDevice& dev, int64_t tokens, int heads, int head_dim, int top_k,
                             int64_t first_pos, bool round_bf16, bool ties, uint32_t seed) {
  CheckResult r;
  r.op = std::string("indexer-topk/") + (round_bf16 ? "bf16" : "f32") + (ties ? "-ties" : "");
  r.shape = Shape({{"tokens", tokens},
                   {"heads", heads},
                   {"head_dim", head_dim},
                   {"k", top_k},
                   {"first_pos", first_pos}});
  std::mt19937 rng(seed);
  // Query t sits at position first_pos + 5 t and sees (pos + 1) / 4 compressed keys (CSA).
  std::vector<int32_t> n_vis(static_cast<size_t>(tokens));  // [T]
  for (int64_t t = 0; t < tokens; ++t) n_vis[t] = static_cast<int32_t>((first_pos + 5 * t + 1) / 4);
  const int64_t n_keys = *std::max_element(n_vis.begin(), n_vis.end());
  const int64_t stride = n_keys + 3;  // rows of the score buffer are wider than any n_vis
  std::vector<float> q = RandomFloats(rng, tokens * heads * head_dim, 1.0f);  // [T, ih, ihd]
  std::vector<float> keys = RandomFloats(rng, n_keys * head_dim, 1.0f);       // [n_keys, ihd]
  std::vector<float> w = RandomFloats(rng, tokens * heads, 0.1f);             // [T, ih]
  if (ties) {  // small integers and w = 1/8: exact sums on both sides, many equal scores
    for (auto* v : {&q, &keys})
      for (auto& x : *v) x = std::clamp(std::round(x), -1.0f, 2.0f);
    for (auto& x : w) x = 0.125f;
  }
  // CPU scores: the CPU backend's own kernel (cpu::IndexerScores), and each score's error scale
  // (the sum over heads of |w| (sum |q k| + |q.k|)).
  std::vector<float> s_cpu(static_cast<size_t>(tokens * stride), 0.0f);  // [T, stride]
  std::vector<double> s_scale(s_cpu.size(), 0.0);
  std::vector<const float*> key_rows(static_cast<size_t>(n_keys));  // [n_keys]
  for (int64_t j = 0; j < n_keys; ++j) key_rows[j] = keys.data() + j * head_dim;
  for (int64_t t = 0; t < tokens; ++t) {
    cpu::IndexerScores(q.data() + t * heads * head_dim, w.data() + t * heads,
                       std::span<const float* const>(key_rows.data(), n_vis[t]), heads, head_dim,
                       round_bf16, s_cpu.data() + t * stride);
    for (int64_t j = 0; j < n_vis[t]; ++j)
      for (int h = 0; h < heads; ++h) {
        const float* qh = q.data() + (t * heads + h) * head_dim;
        const float* kj = keys.data() + j * head_dim;
        double abs_dot = 0, dot = 0;
        for (int i = 0; i < head_dim; ++i) {
          abs_dot += std::fabs(double{qh[i]} * kj[i]);
          dot += double{qh[i]} * kj[i];
        }
        s_scale[t * stride + j] += (abs_dot + std::fabs(dot)) * std::fabs(w[t * heads + h]);
      }
  }
  ASSIGN_OR_FAIL(DeviceBuffer dq, dev.Upload(q.data(), q.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dk, dev.Upload(keys.data(), keys.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dw, dev.Upload(w.data(), w.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dscores, GuardedOutput::Make(dev, tokens * stride, nullptr));
  CHECK_OK_OR_FAIL(IndexerScores(dev, dq.as<float>(), dw.as<float>(), dk.as<float>(), n_keys, n_vis,
                                 heads, head_dim, stride, round_bf16, dscores.ptr()));
  ASSIGN_OR_FAIL(GuardedOutput didx, MakeIntOutput(dev, tokens * top_k));
  CHECK_OK_OR_FAIL(
      TopK(dev, dscores.ptr(), stride, n_vis, top_k, reinterpret_cast<int32_t*>(didx.ptr())));
  std::vector<float> s_gpu, idx_raw;
  CHECK_OK_OR_FAIL(dscores.Fetch(dev, &s_gpu));
  CHECK_OK_OR_FAIL(didx.Fetch(dev, &idx_raw));
  const std::vector<int32_t> idx_gpu = AsInts(idx_raw);
  Comparison cmp;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < stride; ++j) {
      const int64_t i = t * stride + j;
      if (j >= n_vis[t]) {  // past the visible keys: must still hold the NaN start pattern
        uint32_t bits;
        std::memcpy(&bits, &s_gpu[i], 4);
        if (bits != 0xffffffffu) {
          r.detail = "score [" + std::to_string(t) + ", " + std::to_string(j) +
                     "] past the visible keys was written";
          r.budget_share = INFINITY;
          return r;
        }
        continue;
      }
      // Dots: fp32 summation order (kMatMulRelToSumAbs of sum |q k|); bf16 rounding of a dot or
      // of the score may land one bf16 ulp apart.
      const double rel = round_bf16 ? kBf16Ulp : kMatMulRelToSumAbs;
      cmp.Add("score", i, s_gpu[i], s_cpu[i], rel * s_scale[i] + 1e-30);
    }
    // Top-k, exactly: of the GPU's own scores (the selection rule), and in ties mode (exact
    // scores on both sides) of the CPU's scores too.
    const int32_t n = n_vis[t];
    std::vector<float> mine(s_gpu.begin() + t * stride, s_gpu.begin() + t * stride + n);
    std::vector<int32_t> want = cpu::TopK(mine, top_k);
    if (ties) {
      std::vector<float> theirs(s_cpu.begin() + t * stride, s_cpu.begin() + t * stride + n);
      if (cpu::TopK(theirs, top_k) != want) {
        r.detail = "token " + std::to_string(t) + ": exact CPU and GPU scores select differently";
        r.budget_share = INFINITY;
        return r;
      }
    }
    want.resize(static_cast<size_t>(top_k), -1);
    for (int k = 0; k < top_k; ++k)
      if (idx_gpu[t * top_k + k] != want[k]) {
        r.detail = "top-k of token " + std::to_string(t) + " slot " + std::to_string(k) + ": gpu " +
                   std::to_string(idx_gpu[t * top_k + k]) + " want " + std::to_string(want[k]);
        r.budget_share = INFINITY;
        return r;
      }
  }
  cmp.Finish(&r);
  return r;
}

CheckResult CheckSparseAttention(CudaDevice& dev, int64_t tokens, int heads, int head_dim,
                                 int window, int ratio, int64_t first_pos, bool round_bf16,
                                 uint32_t seed) {
  CheckResult r;
  r.op = std::string("sparse-attn/") + (round_bf16 ? "bf16" : "f32") + "-r" + std::to_string(ratio);
  r.shape = Shape({{"tokens", tokens},
                   {"heads", heads},
                   {"head_dim", head_dim},
                   {"window", window},
                   {"first_pos", first_pos}});
  std::mt19937 rng(seed);
  // The step's queries sit at first_pos .. first_pos + tokens - 1; the pool holds the window
  // positions they need, then every compressed row visible to the last query.
  std::vector<int64_t> pos(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) pos[t] = first_pos + t;
  SparseRowSpec spec;
  spec.window = window;
  spec.ratio = ratio;
  spec.window_first_pos = std::max<int64_t>(0, first_pos - window + 1);
  spec.window_rows = first_pos + tokens - spec.window_first_pos;
  spec.compressed_base = spec.window_rows;
  spec.compressed_rows = ratio > 0 ? (first_pos + tokens) / ratio : 0;
  const int64_t pool_rows = spec.window_rows + spec.compressed_rows;
  // CSA: each query selects up to 64 of its visible rows (random scores, the indexer's rule).
  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens && ratio == 4; ++t)
    selected[t] = cpu::TopK(RandomFloats(rng, (pos[t] + 1) / 4, 1.0f), 64);
  ASSIGN_OR_FAIL(SparseRowLists lists,
                 BuildSparseRowLists(spec, pos, ratio == 4 ? &selected : nullptr));
  std::vector<float> q = RandomFloats(rng, tokens * heads * head_dim, 1.0f);  // [T, H, hd]
  std::vector<float> kv = RandomFloats(rng, pool_rows * head_dim, 1.0f);      // [pool, hd]
  std::vector<float> sink = RandomFloats(rng, heads, 1.0f);                   // [H]
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // CPU: the CPU backend's own kernel (cpu::AttendHeads, one head at a time), and each output's
  // error scale (sum_j p_j |v_j,i| / denominator, recomputed in double).
  std::vector<float> o_cpu(q.size());     // [T, H, hd]
  std::vector<double> o_scale(q.size());  // sum_j p_j |v_j,i| / denom
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t b = lists.offsets[t], n = lists.offsets[t + 1] - b;
    std::vector<const float*> rows(static_cast<size_t>(n));  // [n]
    for (int32_t j = 0; j < n; ++j) rows[j] = kv.data() + int64_t{lists.rows[b + j]} * head_dim;
    for (int h = 0; h < heads; ++h) {
      const float* qh = q.data() + (t * heads + h) * head_dim;
      cpu::AttendHeads(qh, 1, rows, head_dim, sink.data() + h, scale, round_bf16,
                       o_cpu.data() + (t * heads + h) * head_dim);
      std::vector<double> logits(static_cast<size_t>(n));
      double mx = sink[h];
      for (int32_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int i = 0; i < head_dim; ++i) dot += double{qh[i]} * rows[j][i];
        logits[j] = dot * scale;
        mx = std::max(mx, logits[j]);
      }
      double denom = std::exp(sink[h] - mx);
      for (int32_t j = 0; j < n; ++j) denom += std::exp(logits[j] - mx);
      for (int i = 0; i < head_dim; ++i) {
        double acc_abs = 0;
        for (int32_t j = 0; j < n; ++j) acc_abs += std::exp(logits[j] - mx) * std::fabs(rows[j][i]);
        o_scale[(t * heads + h) * head_dim + i] = acc_abs / denom;
      }
    }
  }
  ASSIGN_OR_FAIL(DeviceBuffer dq, dev.Upload(q.data(), q.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dkv, dev.Upload(kv.data(), kv.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dsink, dev.Upload(sink.data(), sink.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput dout, GuardedOutput::Make(dev, tokens * heads * head_dim, nullptr));
  CHECK_OK_OR_FAIL(SparseAttention(dev, dq.as<float>(), heads, head_dim, dkv.as<float>(), pool_rows,
                                   lists, dsink.as<float>(), scale, round_bf16, dout.ptr()));
  std::vector<float> o_gpu;
  CHECK_OK_OR_FAIL(dout.Fetch(dev, &o_gpu));
  Comparison cmp;
  for (size_t i = 0; i < o_cpu.size(); ++i) {
    // Logits are O(1) fp32 dots (a few ulps apart), exp is a few ulps: 2e-5 of the output's
    // scale is ample. bf16: a probability or the output may round one bf16 ulp apart.
    const double budget =
        round_bf16 ? kBf16Ulp * (o_scale[i] + std::fabs(o_cpu[i])) : kElementwiseRel * o_scale[i];
    cmp.Add("o", static_cast<int64_t>(i), o_gpu[i], o_cpu[i], budget + 1e-7);
  }
  cmp.Finish(&r);
  return r;
}

CheckResult CheckCompressorPool(CudaDevice& dev, int64_t n_groups, int ratio, int width,
                                bool overlap, bool with_prev, uint32_t seed) {
  CheckResult r;
  r.op = std::string("compressor/") + (overlap ? "csa-overlap" : "hca") +
         (with_prev ? "-continued" : "-first");
  r.shape = Shape({{"groups", n_groups}, {"ratio", ratio}, {"width", width}});
  std::mt19937 rng(seed);
  const int64_t T = n_groups * ratio;
  const int d = overlap ? width / 2 : width;
  std::vector<float> a = RandomFloats(rng, T * width, 1.0f);        // [T, width] wkv x
  std::vector<float> g = RandomFloats(rng, T * width, 2.0f);        // [T, width] wgate x
  std::vector<float> ape = RandomFloats(rng, ratio * width, 0.5f);  // [ratio, width]
  std::vector<float> prev_a = RandomFloats(rng, ratio * width, 1.0f);      // [ratio, width]
  std::vector<float> prev_score = RandomFloats(rng, ratio * width, 2.0f);  // [ratio, width]
  // Reference: the CPU backend's pooling (cpu::PoolGroup) over projection rows [2, width] (a,
  // then g + ape); a continued sequence starts with a previous (complete, ape added) group.
  const bool pass_prev = overlap && with_prev;
  std::vector<float> hist(static_cast<size_t>((ratio + T) * 2 * width));  // [prev | T][2, width]
  for (int s_ = 0; s_ < ratio; ++s_)
    for (int i = 0; i < width; ++i) {
      hist[s_ * 2 * width + i] = prev_a[s_ * width + i];
      hist[s_ * 2 * width + width + i] = prev_score[s_ * width + i];
    }
  for (int64_t pos = 0; pos < T; ++pos)
    for (int i = 0; i < width; ++i) {
      float* h = hist.data() + (ratio + pos) * 2 * width;
      h[i] = a[pos * width + i];
      h[width + i] = g[pos * width + i] + ape[(pos % ratio) * width + i];
    }
  std::vector<float> rows_cpu(static_cast<size_t>(n_groups * d));  // [groups, d]
  std::vector<double> rows_scale(rows_cpu.size());                 // weighted mean |a|
  std::vector<const float*> cand(static_cast<size_t>(overlap ? 2 * ratio : ratio));
  for (int64_t j = 0; j < n_groups; ++j) {
    const int64_t from = overlap ? j * ratio - ratio : j * ratio;  // first candidate position
    for (size_t k = 0; k < cand.size(); ++k) {
      const int64_t p = from + static_cast<int64_t>(k);
      cand[k] = p < 0 && !pass_prev ? nullptr : hist.data() + (ratio + p) * 2 * width;
    }
    cpu::PoolGroup(cand, ratio, width, overlap, rows_cpu.data() + j * d);
    for (int c = 0; c < d; ++c) {  // error scale: the softmax-weighted mean of |a|
      double mx = -INFINITY, sum = 0, acc_abs = 0;
      auto cand_at = [&](size_t k, double* sc, double* v) {
        const int dim = overlap && static_cast<int>(k) >= ratio ? d + c : c;
        *v = cand[k] ? cand[k][dim] : 0.0;
        *sc = cand[k] ? cand[k][width + dim] : -INFINITY;
      };
      double sc, v;
      for (size_t k = 0; k < cand.size(); ++k) cand_at(k, &sc, &v), mx = std::max(mx, sc);
      for (size_t k = 0; k < cand.size(); ++k) {
        cand_at(k, &sc, &v);
        sum += std::exp(sc - mx);
        acc_abs += std::exp(sc - mx) * std::fabs(v);
      }
      rows_scale[j * d + c] = acc_abs / sum;
    }
  }
  ASSIGN_OR_FAIL(DeviceBuffer da, dev.Upload(a.data(), a.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dg, dev.Upload(g.data(), g.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dape, dev.Upload(ape.data(), ape.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dprev_a, dev.Upload(prev_a.data(), prev_a.size() * 4));
  ASSIGN_OR_FAIL(DeviceBuffer dprev_s, dev.Upload(prev_score.data(), prev_score.size() * 4));
  ASSIGN_OR_FAIL(GuardedOutput drows, GuardedOutput::Make(dev, n_groups * d, nullptr));
  CHECK_OK_OR_FAIL(CompressorPool(dev, da.as<float>(), dg.as<float>(), dape.as<float>(), n_groups,
                                  ratio, width, overlap, pass_prev ? dprev_a.as<float>() : nullptr,
                                  pass_prev ? dprev_s.as<float>() : nullptr, drows.ptr()));
  std::vector<float> rows_gpu;
  CHECK_OK_OR_FAIL(drows.Fetch(dev, &rows_gpu));
  Comparison cmp;
  // A softmax-weighted mean: exp a few ulps apart, fp32 sums of <= 256 terms in the same order.
  for (size_t i = 0; i < rows_cpu.size(); ++i)
    cmp.Add("row", static_cast<int64_t>(i), rows_gpu[i], rows_cpu[i],
            kElementwiseRel * rows_scale[i] + 1e-7);
  cmp.Finish(&r);
  return r;
}

namespace {

// The V4-specific ops' grid (router, grouped MoE GEMM, indexer + top-k, sparse attention).
void AppendV4OpConformance(CudaDevice& dev, uint32_t* seed, std::vector<CheckResult>* out) {
  using F = model::WeightFormat;
  // Router: one token, a ragged batch, V4's 256 experts top-6; hash layers; exact ties.
  for (auto [tokens, experts, k] :
       {std::tuple<int64_t, int, int>{1, 8, 2}, {7, 256, 6}, {33, 70, 6}})
    for (bool hash : {false, true})
      out->push_back(CheckRouter(dev, tokens, experts, k, hash, false, (*seed)++));
  out->push_back(CheckRouter(dev, 19, 256, 6, false, true, (*seed)++));
  // Grouped MoE GEMM: every routed format, rows/cols off the 8-row and 128-col blocks.
  for (F format : {F::kFp4Packed, F::kFp8Block, F::kBF16}) {
    out->push_back(CheckGroupedMatMul(dev, format, 1, 4, 6, 70, 160, (*seed)++));
    out->push_back(CheckGroupedMatMul(dev, format, 9, 6, 3, 129, 96, (*seed)++));
    out->push_back(CheckGroupedMatMul(dev, format, 5, 16, 6, 256, 512, (*seed)++));
  }
  // The routed experts' tensor-core grouped GEMM (CheckTcGroupedMatMul) is not in this grid
  // yet: it is not the default path until measured on a GPU, and any failed check here makes
  // doctor's verdict "unsupported". test_cuda runs it (CudaTcGrouped.*); it joins the grid when
  // it becomes the default.
  // Indexer + top-k: every query sees fewer keys than k; some do; long context; exact ties.
  for (bool round : {false, true}) {
    out->push_back(CheckIndexerTopK(dev, 3, 4, 32, 16, 0, round, false, (*seed)++));
    out->push_back(CheckIndexerTopK(dev, 6, 8, 72, 16, 50, round, false, (*seed)++));
    out->push_back(CheckIndexerTopK(dev, 2, 4, 128, 512, 65536, round, false, (*seed)++));
  }
  out->push_back(CheckIndexerTopK(dev, 5, 4, 64, 24, 300, false, true, (*seed)++));
  // Compressor pooling: CSA overlap (first groups and a continued sequence), HCA, odd widths.
  for (bool prev : {false, true}) {
    out->push_back(CheckCompressorPool(dev, 5, 4, 2 * 72, true, prev, (*seed)++));
    out->push_back(CheckCompressorPool(dev, 3, 4, 2 * 512, true, prev, (*seed)++));
  }
  out->push_back(CheckCompressorPool(dev, 2, 128, 100, false, false, (*seed)++));
  out->push_back(CheckCompressorPool(dev, 1, 128, 512, false, false, (*seed)++));
  // Sparse attention with sink: first token; CSA with selected rows; HCA; a long context.
  for (bool round : {false, true}) {
    out->push_back(CheckSparseAttention(dev, 1, 4, 64, 8, 0, 0, round, (*seed)++));
    out->push_back(CheckSparseAttention(dev, 5, 3, 72, 16, 4, 37, round, (*seed)++));
    out->push_back(CheckSparseAttention(dev, 3, 2, 512, 128, 128, 1000, round, (*seed)++));
    out->push_back(CheckSparseAttention(dev, 1, 2, 128, 128, 4, 100000, round, (*seed)++));
    out->push_back(CheckSparseAttention(dev, 2, 2, 64, 128, 128, 65535, round, (*seed)++));
  }
}

}  // namespace

CheckResult CheckForward(CudaDevice& dev, const model::ModelWeights& weights, int64_t n_tokens,
                         uint32_t seed) {
  CheckResult r;
  r.op = "forward/fp32-reference";
  const int64_t V = weights.config().vocab_size;
  r.shape = Shape({{"tokens", n_tokens}, {"layers", weights.config().n_layers}, {"vocab", V}});
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
  for (auto& id : ids) id = pick(rng);
  ThreadPool pool(2);
  ASSIGN_OR_FAIL(auto cpu_model, cpu::CpuModel::Create(weights, Numerics::Fp32Reference(), pool));
  auto cpu_state = cpu_model->NewSequence();
  ForwardOutput want, got;
  CHECK_OK_OR_FAIL(cpu_model->Forward(*cpu_state, ids, {.all_logits = true}, &want));
  ASSIGN_OR_FAIL(auto gpu_model, CudaModel::Create(dev, weights, Numerics::Fp32Reference()));
  ASSIGN_OR_FAIL(auto gpu_state, gpu_model->NewSequence());
  CHECK_OK_OR_FAIL(gpu_model->Forward(*gpu_state, ids, {.all_logits = true}, &got));
  if (got.logits.size() != want.logits.size()) {
    r.detail = "the GPU returned " + std::to_string(got.logits.size()) + " logits, the CPU " +
               std::to_string(want.logits.size());
    return r;
  }
  double worst = 0;
  int64_t worst_pos = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    double err = 0, ref = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double a = got.logits[t * V + v], b = want.logits[t * V + v];
      err += (a - b) * (a - b);
      ref += b * b;
    }
    const double nmse = ref > 0 ? err / ref : err;
    if (!(nmse <= worst)) {  // NaN counts as worst
      worst = nmse;
      worst_pos = t;
    }
  }
  r.budget_share = worst / kForwardLogitsNmse;
  r.ok = r.budget_share <= 1.0;
  char detail[160];
  std::snprintf(detail, sizeof detail, "worst logits NMSE %.3g at position %lld (budget %.0e)",
                worst, static_cast<long long>(worst_pos), kForwardLogitsNmse);
  r.detail = detail;
  return r;
}

std::vector<CheckResult> RunConformance(CudaDevice& dev) {
  std::vector<CheckResult> out;
  uint32_t seed = 1;
  using F = model::WeightFormat;
  struct Mm {
    int64_t m, rows, cols;
  };
  // One token, decode batches up to the GEMV limit (8), ragged prefill, sizes off the 64x64x32
  // tile, a K that is not a multiple of the 128 scale block, and one checkpoint-sized matrix.
  const Mm shapes[] = {{1, 256, 512},  {3, 200, 384},   {8, 129, 160},    {9, 70, 96},
                       {67, 130, 224}, {1, 1024, 4096}, {130, 2048, 1024}};
  for (auto [format, f32s] : {std::pair{F::kF32, false},
                              {F::kBF16, false},
                              {F::kFp8Block, false},
                              {F::kFp8Block, true},
                              {F::kFp4Packed, false},
                              {F::kFp4Packed, true}}) {
    for (const Mm& s : shapes)
      out.push_back(CheckMatMul(dev, format, f32s, s.m, s.rows, s.cols, seed++));
  }
  for (const Mm& s : {Mm{1, 100, 50}, Mm{5, 33, 100}, Mm{20, 129, 200}})  // K % 32 != 0 (no FP4)
    for (F format : {F::kF32, F::kBF16, F::kFp8Block})
      out.push_back(CheckMatMul(dev, format, false, s.m, s.rows, s.cols, seed++));
  for (const Mm& s : {Mm{1, 256, 256}, Mm{5, 200, 96}, Mm{33, 2048, 512}})
    out.push_back(CheckReblockedFp4MatMul(dev, s.m, s.rows, s.cols, seed++));
  for (bool round : {false, true}) {
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 4096}, {3, 1000}, {17, 512}}) {
      out.push_back(CheckRmsNorm(dev, rows, n, true, round, seed++));
      out.push_back(CheckRmsNorm(dev, rows, n, false, round, seed++));
    }
    for (int64_t rows : {1, 7, 300})
      for (bool inverse : {false, true})
        out.push_back(CheckRope(dev, rows, 64, rows == 7, inverse, round, seed++));
    for (auto [hidden, tokens] : {std::pair<int64_t, int64_t>{256, 1}, {1000, 3}, {4096, 9}})
      out.push_back(CheckHc(dev, 4, hidden, tokens, round, seed++));
  }
  // The tensor-core GEMM (9+ tokens of the official numerics): its act quant bit for bit, then
  // both MMAs over tiles off the 64 x 64 grid, a partial last K block, split K and a K of 56
  // scale blocks (wo_b-like).
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{3, 4096}, {9, 96}, {2, 1000}})
    out.push_back(CheckActQuantCodes(dev, rows, n, seed++));
  for (TcMma mma : AvailableTcMmas(dev.info()))
    for (const Mm& s : {Mm{9, 70, 96}, Mm{67, 130, 224}, Mm{130, 2048, 1024}, Mm{16, 4096, 4096},
                        Mm{200, 256, 7168}})
      out.push_back(CheckTcMatMul(dev, mma, s.m, s.rows, s.cols, seed++));
  AppendV4OpConformance(dev, &seed, &out);
  // The official numerics' activation rounding: act quant (block 128), KV nope dims (block 64 of
  // a wider row), indexer keys / queries (Hadamard then FP4 block 32).
  out.push_back(CheckActivationRounding(dev, "fp8", 3, 4096, 4096, 128, false, seed++));
  out.push_back(CheckActivationRounding(dev, "fp8", 9, 448, 512, 64, false, seed++));
  out.push_back(CheckActivationRounding(dev, "fp8", 2, 1000, 1000, 128, false, seed++));
  out.push_back(CheckActivationRounding(dev, "fp4", 5, 128, 128, 32, false, seed++));
  out.push_back(CheckActivationRounding(dev, "fp4", 3, 100, 128, 32, false, seed++));
  for (bool round : {false, true}) {
    out.push_back(CheckActivationRounding(dev, "hadamard", 7, 128, 128, 0, round, seed++));
    out.push_back(CheckActivationRounding(dev, "hadamard", 2, 1024, 1024, 0, round, seed++));
  }
  return out;
}

}  // namespace dsinfer::backend::cuda
