#include "backend/cuda/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "backend/fp4_to_fp8.h"
#include "core/dtype.h"
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

std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Host-side storage of a random weight matrix in one of the checkpoint formats.
struct HostWeight {
  std::vector<uint8_t> data, scales;
  model::WeightMatrix view;
};

HostWeight RandomWeight(std::mt19937& rng, model::WeightFormat format, bool f32_scales,
                        int64_t rows, int64_t cols) {
  HostWeight h;
  model::WeightMatrix& v = h.view;
  v.format = format;
  v.rows = rows;
  v.cols = cols;
  v.name = "conformance.w";
  std::uniform_int_distribution<int> byte(0, 255), scale_code(120, 130);
  int64_t scale_rows = 0;
  switch (format) {
    case model::WeightFormat::kF32: {
      std::vector<float> f = RandomFloats(rng, rows * cols, 0.05f);
      h.data.resize(f.size() * 4);
      std::memcpy(h.data.data(), f.data(), h.data.size());
      break;
    }
    case model::WeightFormat::kBF16: {
      std::vector<float> f = RandomFloats(rng, rows * cols, 0.05f);
      h.data.resize(f.size() * 2);
      for (size_t i = 0; i < f.size(); ++i) {
        uint16_t b = F32ToBf16(f[i]);
        std::memcpy(h.data.data() + 2 * i, &b, 2);
      }
      break;
    }
    case model::WeightFormat::kFp8Block:
      h.data.resize(static_cast<size_t>(rows * cols));
      for (auto& b : h.data) {
        b = static_cast<uint8_t>(byte(rng));
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
      }
      v.block = 128;
      v.scale_cols = (cols + 127) / 128;
      scale_rows = (rows + 127) / 128;
      break;
    case model::WeightFormat::kFp4Packed:
      h.data.resize(static_cast<size_t>(rows * cols / 2));
      for (auto& b : h.data) b = static_cast<uint8_t>(byte(rng));
      v.block = 32;
      v.scale_cols = cols / 32;
      scale_rows = rows;
      break;
  }
  if (scale_rows > 0) {
    const int64_t n = scale_rows * v.scale_cols;
    v.scale_dtype = f32_scales ? DType::kF32 : DType::kF8E8M0;
    h.scales.resize(static_cast<size_t>(n * (f32_scales ? 4 : 1)));
    for (int64_t i = 0; i < n; ++i) {
      uint8_t code = static_cast<uint8_t>(scale_code(rng));
      if (f32_scales) {
        float s = E8M0ToF32(code);
        std::memcpy(h.scales.data() + 4 * i, &s, 4);
      } else {
        h.scales[i] = code;
      }
    }
  }
  v.data = h.data.data();
  v.scales = h.scales.empty() ? nullptr : h.scales.data();
  return h;
}

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

// GPU MatMul of `gpu_weight` vs CPU MatMul of `cpu_weight` (same values, maybe other formats).
CheckResult CompareMatMul(CudaDevice& dev, CheckResult r, const model::WeightMatrix& cpu_weight,
                          const model::WeightMatrix& gpu_weight, int64_t m, std::mt19937& rng) {
  const int64_t rows = cpu_weight.rows, cols = cpu_weight.cols;
  std::vector<float> x = RandomFloats(rng, m * cols, 1.0f);  // [m, cols]
  std::vector<float> y_cpu(static_cast<size_t>(m * rows));   // [m, rows]
  ThreadPool pool(2);
  cpu::MatMul(cpu_weight, x.data(), m, y_cpu.data(), pool);
  // Budgets from sum |x * w| per output element (exactly dequantized weights, in double).
  std::vector<double> sum_abs(static_cast<size_t>(m * rows), 0.0);
  std::vector<float> wrow(static_cast<size_t>(cols));
  for (int64_t n = 0; n < rows; ++n) {
    cpu::DequantRow(cpu_weight, n, wrow.data());
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k)
        s += std::fabs(static_cast<double>(x[i * cols + k]) * wrow[k]);
      sum_abs[i * rows + n] = s;
    }
  }
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
  HostWeight w = RandomWeight(rng, format, f32_scales, rows, cols);
  return CompareMatMul(dev, std::move(r), w.view, w.view, m, rng);
}

CheckResult CheckReblockedFp4MatMul(CudaDevice& dev, int64_t m, int64_t rows, int64_t cols,
                                    uint32_t seed) {
  CheckResult r;
  r.op = "matmul/fp4-reblocked-fp8";
  r.shape = Shape({{"m", m}, {"rows", rows}, {"cols", cols}});
  std::mt19937 rng(seed);
  HostWeight w = RandomWeight(rng, model::WeightFormat::kFp4Packed, false, rows, cols);
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
    cpu::HcMix mix;
    cpu::HcPre(c, p, H.data() + t * n, x_cpu.data() + t * hidden, &mix, round_bf16);
    std::copy(mix.pre.begin(), mix.pre.end(), mix_cpu.begin() + t * mix_n);
    std::copy(mix.post.begin(), mix.post.end(), mix_cpu.begin() + t * mix_n + hc);
    std::copy(mix.comb.begin(), mix.comb.end(), mix_cpu.begin() + t * mix_n + 2 * hc);
    cpu::HcPost(c, mix, a.data() + t * hidden, h_cpu.data() + t * n, round_bf16);
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
  const double rel = round_bf16 ? kBf16Ulp : 10 * kElementwiseRel;
  for (int64_t i = 0; i < tokens * hidden; ++i)
    cmp.Add("x", i, x_gpu[i], x_cpu[i], rel * std::fabs(x_cpu[i]) + kElementwiseFloor);
  for (int64_t i = 0; i < tokens * n; ++i)
    cmp.Add("H", i, h_gpu[i], h_cpu[i], rel * std::fabs(h_cpu[i]) + kElementwiseFloor);
  cmp.Finish(&r);
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
  return out;
}

}  // namespace dsinfer::backend::cuda
