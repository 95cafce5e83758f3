// CpuOps: the step context, scratch buffers, and the dense per-row ops (embedding, mHC, norms,
// linears, RoPE, round trips, transfers). Sequence-state ops are in attention.cc, MoE in moe.cc.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace dsinfer::backend::cpu {

namespace {

const model::WeightMatrix& WeightOf(const model::ModelWeights& w, int layer, Weight which) {
  if (which == Weight::kHead) return w.head;
  const model::LayerWeights& lw = w.layers[layer];
  switch (which) {
    case Weight::kWqA:
      return lw.wq_a;
    case Weight::kWqB:
      return lw.wq_b;
    case Weight::kWkv:
      return lw.wkv;
    case Weight::kWoB:
      return lw.wo_b;
    case Weight::kCompressorWkv:
      return lw.compressor.wkv;
    case Weight::kCompressorWgate:
      return lw.compressor.wgate;
    case Weight::kIndexWqB:
      return lw.indexer.wq_b;
    case Weight::kIndexWeightsProj:
      return lw.indexer.weights_proj;
    case Weight::kIndexCompressorWkv:
      return lw.indexer.compressor.wkv;
    case Weight::kIndexCompressorWgate:
      return lw.indexer.compressor.wgate;
    case Weight::kEProj:
      return lw.e_proj;
    case Weight::kHProj:
      return lw.h_proj;
    case Weight::kIndexWk:
      return lw.indexer.wk;
    case Weight::kEngramWkv:
      return lw.engram.wkv;
    case Weight::kMainProj:
      return lw.dspark.main_proj;
    case Weight::kMarkovHead:
      return lw.dspark.markov_head;
    case Weight::kConfidence:
      return lw.dspark.confidence_proj;
    case Weight::kHead:
    case Weight::kDraftHead:  // CpuOps::Linear answers these two
    case Weight::kDraftMarkovHead:
      break;
  }
  return w.head;
}

const model::TensorView& NormOf(const model::ModelWeights& w, int layer, Norm which) {
  if (layer < 0) return w.norm;  // the main head's final norm
  const model::LayerWeights& lw = w.layers[layer];
  switch (which) {
    case Norm::kAttn:
      return lw.attn_norm;
    case Norm::kFfn:
      return lw.ffn_norm;
    case Norm::kQ:
      return lw.q_norm;
    case Norm::kKv:
      return lw.kv_norm;
    case Norm::kCompressor:
      return lw.compressor.norm;
    case Norm::kIndexCompressor:
      return lw.indexer.compressor.norm;
    case Norm::kE:
      return lw.enorm;
    case Norm::kH:
      return lw.hnorm;
    case Norm::kFinal:
      return lw.norm;
    case Norm::kIndexKey:
      return lw.indexer.k_norm;
    case Norm::kMain:
      return lw.dspark.main_norm;
  }
  return lw.norm;
}

}  // namespace

CpuOps::CpuOps(const model::ModelWeights& weights, const Numerics& numerics,
               const std::vector<model::LayerPlan>& plans, ThreadPool& pool)
    : weights_(weights), numerics_(numerics), plans_(plans), pool_(pool) {
  for (const model::LayerPlan& p : plans) rope_.push_back(RopeTable::ForPlan(config(), p));
  if (config().engram.enabled()) {
    // Validated when the weights were bound (model/weights.cc): cannot fail here.
    auto hasher = model::EngramHasher::Create(config().engram);
    DSINFER_CHECK_MSG(hasher.ok(), hasher.status().ToString());
    engram_hasher_.emplace(std::move(hasher).value());
  }
}

Status CpuOps::BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) {
  segments_.assign(segments.begin(), segments.end());
  tokens_.assign(tokens.begin(), tokens.end());
  const size_t T = tokens.size();
  pos_of_.resize(T);
  seg_of_.resize(T);
  for (size_t si = 0; si < segments.size(); ++si)
    for (int64_t t = 0; t < segments[si].n; ++t) {
      pos_of_[segments[si].row + t] = segments[si].start_pos + t;
      seg_of_[segments[si].row + t] = static_cast<int32_t>(si);
    }
  stats_ = {};
  return Status::Ok();
}

Result<float*> CpuOps::Get(Buf buf, int64_t n_floats) {
  auto& b = buffers_[static_cast<size_t>(buf)];
  if (static_cast<int64_t>(b.size()) < n_floats) b.resize(static_cast<size_t>(n_floats));
  return b.data();
}

Status CpuOps::Embed(int copies, float* out) {
  const int64_t D = config().hidden, T = static_cast<int64_t>(tokens_.size());
  pool_.ParallelFor(T, [&](int64_t t) {
    const uint8_t* row = weights_.embed.data + static_cast<int64_t>(tokens_[t]) * D * 2;
    for (int64_t i = 0; i < D; ++i) {
      uint16_t b;
      std::memcpy(&b, row + 2 * i, 2);
      const float v = Bf16ToF32(b);
      for (int k = 0; k < copies; ++k) out[(t * copies + k) * D + i] = v;
    }
  });
  return Status::Ok();
}

Status CpuOps::MarkovEmbed(int layer, std::span<const int32_t> ids, float* out) {
  const model::WeightMatrix& table = Layer(layer).dspark.markov_embed;  // [vocab, rank] bf16
  const int64_t rank = table.cols;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] < 0 || ids[r] >= table.rows)
      return InvalidArgument("MarkovEmbed: token id " + std::to_string(ids[r]) +
                             " outside the vocabulary");
    const uint8_t* row = table.data + static_cast<int64_t>(ids[r]) * rank * 2;
    for (int64_t i = 0; i < rank; ++i) {
      uint16_t b;
      std::memcpy(&b, row + 2 * i, 2);
      out[static_cast<int64_t>(r) * rank + i] = Bf16ToF32(b);
    }
  }
  return Status::Ok();
}

Status CpuOps::HcPre(int layer, HcSite site, const float* H, float* x, float* mix) {
  const model::ModelConfig& c = config();
  const model::HcParams& p = site == HcSite::kAttn ? Layer(layer).hc_attn : Layer(layer).hc_ffn;
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D, M = HcMixFloats(c);
  pool_.ParallelFor(static_cast<int64_t>(tokens_.size()), [&](int64_t t) {
    cpu::HcPre(c, p, H + t * HD, x + t * D, mix + t * M, numerics_.round_bf16);
  });
  return Status::Ok();
}

Status CpuOps::HcPreCarried(int layer, HcSite site, const float* H, const float* carry,
                            int64_t carry_stride, float* x, float* mix) {
  const model::ModelConfig& c = config();
  const model::HcParams& p = site == HcSite::kAttn ? Layer(layer).hc_attn : Layer(layer).hc_ffn;
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D, M = HcMixFloats(c);
  pool_.ParallelFor(static_cast<int64_t>(tokens_.size()), [&](int64_t t) {
    cpu::HcMix(c, p, H + t * HD, mix + t * M);
    cpu::HcCollapse(c, carry + t * carry_stride, H + t * HD, x + t * D, numerics_.round_bf16);
  });
  return Status::Ok();
}

Status CpuOps::HcCollapse(const float* H, int64_t rows, const float* pre, int64_t pre_stride,
                          float* y) {
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D;
  for (int64_t t = 0; t < rows; ++t)
    cpu::HcCollapse(c, pre + t * pre_stride, H + t * HD, y + t * D, numerics_.round_bf16);
  return Status::Ok();
}

Status CpuOps::HcPost(const float* mix, const float* y, float* H) {
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D, M = HcMixFloats(c);
  pool_.ParallelFor(static_cast<int64_t>(tokens_.size()), [&](int64_t t) {
    cpu::HcPost(c, mix + t * M, y + t * D, H + t * HD, numerics_.round_bf16);
  });
  return Status::Ok();
}

Status CpuOps::HcHead(int layer, const float* H, int64_t rows, float* y) {
  const model::ModelConfig& c = config();
  const model::HcParams& p = layer < 0 ? weights_.hc_head : Layer(layer).hc_head;
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D;
  for (int64_t t = 0; t < rows; ++t) cpu::HcHead(c, p, H + t * HD, y + t * D, numerics_.round_bf16);
  return Status::Ok();
}

Status CpuOps::RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) {
  RmsNormRows(x, rows, dim, &NormOf(weights_, layer, norm), config().norm_eps,
              numerics_.round_bf16);
  return Status::Ok();
}

Status CpuOps::HeadRmsNorm(float* x, int64_t rows, int64_t dim) {
  const float eps = static_cast<float>(config().norm_eps);
  const bool rb = numerics_.round_bf16;
  pool_.ParallelFor(rows, [&](int64_t r) {
    float* v = x + r * dim;
    const float ss = Dot(v, v, dim);
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    if (rb) inv = RoundBf16(inv);
    for (int64_t i = 0; i < dim; ++i) v[i] = rb ? RoundBf16(v[i] * inv) : v[i] * inv;
  });
  return Status::Ok();
}

Status CpuOps::Linear(int layer, Weight weight, LinearMode mode, const float* x, int64_t rows,
                      float* y) {
  const bool draft = weight == Weight::kDraftHead || weight == Weight::kDraftMarkovHead;
  if (draft && draft_vocabulary_ == nullptr)
    return FailedPrecondition("Linear: no draft vocabulary is set");
  const model::WeightMatrix& w =
      !draft                        ? WeightOf(weights_, layer, weight)
      : weight == Weight::kDraftHead ? draft_vocabulary_->head()
                                     : draft_vocabulary_->markov_head();
  if (!w.valid()) return Internal("layer " + std::to_string(layer) + " has no such weight");
  stats_.macs += rows * w.Elements();
  if (mode == LinearMode::kFp32) {
    MatMul(w, x, rows, y, pool_);
    return Status::Ok();
  }
  // The reference's FP8/FP4 linear: FP8 activation quantization in front of FP8/FP4 weights.
  const bool quantized =
      w.format == model::WeightFormat::kFp8Block || w.format == model::WeightFormat::kFp4Packed;
  if (quantized && numerics_.quantize_activations) {
    std::vector<float> xq(x, x + rows * w.cols);  // [rows, cols]
    for (int64_t r = 0; r < rows; ++r)
      Fp8RoundTripInPlace(xq.data() + r * w.cols, static_cast<int>(w.cols), config().act_block);
    MatMul(w, xq.data(), rows, y, pool_);
  } else {
    MatMul(w, x, rows, y, pool_);
  }
  if (numerics_.round_bf16) RoundBf16InPlace(y, rows * w.rows);
  return Status::Ok();
}

Status CpuOps::OutputProjectionA(int layer, const float* o, float* z) {
  const model::ModelConfig& c = config();
  const model::WeightMatrix& wo_a = Layer(layer).wo_a;
  const int64_t T = static_cast<int64_t>(tokens_.size());
  const int G = c.o_groups;
  const int64_t L = c.o_lora_rank, group_in = int64_t{c.n_heads / G} * c.head_dim;
  const int64_t row_in = int64_t{c.n_heads} * c.head_dim;
  std::vector<float> og(T * group_in), zg(T * L);  // [T, group_in], [T, L]
  for (int g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(o + t * row_in + g * group_in, group_in, og.data() + t * group_in);
    MatMulRows(wo_a, g * L, (g + 1) * L, og.data(), T, zg.data(), pool_);
    for (int64_t t = 0; t < T; ++t) std::copy_n(zg.data() + t * L, L, z + t * G * L + g * L);
  }
  stats_.macs += T * wo_a.Elements();
  return Status::Ok();
}

Status CpuOps::Rope(int layer, float* x, RopeRows rows, int64_t stride, int64_t offset,
                    bool inverse) {
  const model::ModelConfig& c = config();
  const int per_token = rows == RopeRows::kTokens  ? 1
                        : rows == RopeRows::kHeads ? c.n_heads
                                                   : c.index_n_heads;
  const RopeTable& rope = rope_[layer];
  const bool rb = numerics_.round_bf16;
  pool_.ParallelFor(static_cast<int64_t>(tokens_.size()), [&](int64_t t) {
    for (int h = 0; h < per_token; ++h)
      ApplyRope(rope, x + (t * per_token + h) * stride + offset, pos_of_[t], inverse, rb);
  });
  return Status::Ok();
}

Status CpuOps::RopeAt(int layer, float* x, std::span<const int64_t> positions, int64_t stride,
                      int64_t offset) {
  for (size_t r = 0; r < positions.size(); ++r)
    ApplyRope(rope_[layer], x + static_cast<int64_t>(r) * stride + offset, positions[r], false,
              numerics_.round_bf16);
  return Status::Ok();
}

Status CpuOps::ScaleRound(float* x, int64_t n, float scale) {
  const bool rb = numerics_.round_bf16;
  for (int64_t i = 0; i < n; ++i) x[i] = rb ? RoundBf16(x[i] * scale) : x[i] * scale;
  return Status::Ok();
}

Status CpuOps::Fp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  for (int64_t r = 0; r < rows; ++r) Fp8RoundTripInPlace(x + r * stride, static_cast<int>(n), block);
  return Status::Ok();
}

Status CpuOps::Fp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  for (int64_t r = 0; r < rows; ++r) Fp4RoundTripInPlace(x + r * stride, static_cast<int>(n), block);
  return Status::Ok();
}

Status CpuOps::Fp4E4m3RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  for (int64_t r = 0; r < rows; ++r)
    Fp4E4m3RoundTripInPlace(x + r * stride, static_cast<int>(n), block);
  return Status::Ok();
}

Status CpuOps::Hadamard(float* x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    HadamardInPlace(x + r * n, static_cast<int>(n), numerics_.round_bf16);
  return Status::Ok();
}

Status CpuOps::AddToStreams(const float* e, float* X) {
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D;
  const bool rb = numerics_.round_bf16;
  for (int64_t t = 0; t < static_cast<int64_t>(tokens_.size()); ++t)
    for (int k = 0; k < c.hc_mult; ++k)
      for (int64_t i = 0; i < D; ++i) {
        const float v = e[t * D + i] + X[t * HD + k * D + i];
        X[t * HD + k * D + i] = rb ? RoundBf16(v) : v;
      }
  return Status::Ok();
}

Status CpuOps::GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                          float* dst) {
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(src + rows[r] * width, width, dst + static_cast<int64_t>(r) * width);
  return Status::Ok();
}

Status CpuOps::Download(const float* src, int64_t n, float* host) {
  if (src != host) std::copy_n(src, n, host);
  return Status::Ok();
}

Status CpuOps::Upload(const float* host, int64_t n, float* dst) {
  if (host != dst) std::copy_n(host, n, dst);
  return Status::Ok();
}

}  // namespace dsinfer::backend::cpu
