#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_model_internal.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/model_kernels.h"
#include "core/dtype.h"

namespace dsinfer::backend::cuda {

namespace {

// A plain tensor (norm weights, hc params, ape, sinks, biases) as a device f32 array.
Result<DeviceBuffer> UploadF32(CudaDevice& dev, const model::TensorView& t) {
  if (!t.valid()) return InvalidArgument("UploadF32: missing tensor " + t.name);
  const int64_t n = t.NumElements();
  std::vector<float> v(static_cast<size_t>(n));  // [n] f32
  for (int64_t i = 0; i < n; ++i) v[i] = t.F32At(i);
  return dev.Upload(v.data(), v.size() * 4);
}

Result<DeviceHc> UploadHc(CudaDevice& dev, const model::HcParams& p) {
  DeviceHc h;
  DSINFER_ASSIGN_OR_RETURN(h.fn, UploadF32(dev, p.fn));
  DSINFER_ASSIGN_OR_RETURN(h.base, UploadF32(dev, p.base));
  DSINFER_ASSIGN_OR_RETURN(h.scale, UploadF32(dev, p.scale));
  return h;
}

Result<DeviceCompressor> UploadCompressor(CudaDevice& dev, const model::CompressorWeights& cw) {
  DeviceCompressor d;
  DSINFER_ASSIGN_OR_RETURN(d.wkv, UploadWeight(dev, cw.wkv));
  DSINFER_ASSIGN_OR_RETURN(d.wgate, UploadWeight(dev, cw.wgate));
  DSINFER_ASSIGN_OR_RETURN(d.ape, UploadF32(dev, cw.ape));
  DSINFER_ASSIGN_OR_RETURN(d.norm, UploadF32(dev, cw.norm));
  return d;
}

// Rows [r0, r0 + n) of w as their own matrix. FP8 rows that start on a scale block (r0 % 128
// == 0) are a view into the uploaded matrix; otherwise they are decoded on the host into an
// exact f32 copy (e4m3 times a power of two is exact in fp32).
Result<DeviceWeight> RowSlice(CudaDevice& dev, const model::WeightMatrix& w, const DeviceWeight& dw,
                              int64_t r0, int64_t n, DeviceBuffer* keep) {
  DeviceWeight s;
  s.name = w.name + "[" + std::to_string(r0) + ":" + std::to_string(r0 + n) + "]";
  s.view = dw.view;
  s.view.rows = n;
  if (w.format == model::WeightFormat::kFp8Block && r0 % 128 == 0) {
    s.view.data = dw.view.data + r0 * w.cols;
    s.view.scales = dw.view.scales + (r0 / 128) * w.scale_cols * (dw.view.scales_f32 ? 4 : 1);
    return s;
  }
  if (w.format != model::WeightFormat::kFp8Block)
    return InvalidArgument(w.name + ": row slices need an FP8 block-scaled matrix");
  std::vector<float> f(static_cast<size_t>(n * w.cols));  // [n, cols] f32
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < w.cols; ++c)
      f[r * w.cols + c] = E4M3ToF32(w.data[(r0 + r) * w.cols + c]) * w.Scale(r0 + r, c);
  DSINFER_ASSIGN_OR_RETURN(*keep, dev.Upload(f.data(), f.size() * 4));
  s.view.format = DeviceWeightView::Format::kF32;
  s.view.data = keep->as<const uint8_t>();
  s.view.scales = nullptr;
  s.view.scales_f32 = false;
  s.view.scale_cols = 0;
  return s;
}

}  // namespace

CudaModel::CudaModel(CudaDevice& dev, const model::ModelWeights& weights, Numerics numerics)
    : dev_(dev), weights_(weights), numerics_(numerics), ws_(std::make_unique<Workspace>()) {
  const model::ModelConfig& c = weights.config();
  hc_shape_.hc = c.hc_mult;
  hc_shape_.hidden = c.hidden;
  hc_shape_.sinkhorn_iters = c.hc_sinkhorn_iters;
  hc_shape_.norm_eps = static_cast<float>(c.norm_eps);
  hc_shape_.hc_eps = static_cast<float>(c.hc_eps);
}

CudaModel::~CudaModel() = default;

Result<std::unique_ptr<CudaModel>> CudaModel::Create(CudaDevice& dev,
                                                     const model::ModelWeights& weights,
                                                     Numerics numerics, Fp8GemmPath fp8_gemm,
                                                     ExpertGemmPath experts) {
  const model::ModelConfig& c = weights.config();
  if (c.hc_mult < 1 || c.hc_mult > 8) return InvalidArgument("CudaModel: hc_mult must be 1..8");
  if (c.index_head_dim > 4096 || (c.index_head_dim & (c.index_head_dim - 1)) != 0)
    return InvalidArgument("CudaModel: index_head_dim must be a power of two <= 4096");
  if (fp8_gemm == Fp8GemmPath::kTensorFp8 && dev.info().Sm() < 89)
    return FailedPrecondition("CudaModel: FP8 MMA needs sm_89 or newer");
  auto m = std::unique_ptr<CudaModel>(new CudaModel(dev, weights, numerics));
  switch (fp8_gemm) {
    case Fp8GemmPath::kAuto:
      m->tc_mma_ = DefaultTcMma(dev.info());
      break;
    case Fp8GemmPath::kGeneric:
      break;
    case Fp8GemmPath::kTensorF16:
      m->tc_mma_ = TcMma::kF16;
      break;
    case Fp8GemmPath::kTensorFp8:
      m->tc_mma_ = TcMma::kFp8;
      break;
  }
  if (experts == ExpertGemmPath::kTensor)
    m->expert_mma_ = m->tc_mma_.value_or(DefaultTcMma(dev.info()));
  // The weights' footprint: the drop in free device memory over the upload (the pool's
  // granularity included).
  int64_t free_before = 0;
  {
    size_t f = 0, t = 0;
    if (dev.Activate().ok() && cudaMemGetInfo(&f, &t) == cudaSuccess)
      free_before = static_cast<int64_t>(f);
  }
  DSINFER_ASSIGN_OR_RETURN(
      m->embed_, dev.Upload(weights.embed.data, static_cast<size_t>(c.vocab_size) * c.hidden * 2));
  DSINFER_ASSIGN_OR_RETURN(m->head_, UploadWeight(dev, weights.head));
  DSINFER_ASSIGN_OR_RETURN(m->norm_, UploadF32(dev, weights.norm));
  DSINFER_ASSIGN_OR_RETURN(m->hc_head_fn_, UploadF32(dev, weights.hc_head.fn));
  DSINFER_ASSIGN_OR_RETURN(m->hc_head_base_, UploadF32(dev, weights.hc_head.base));
  DSINFER_ASSIGN_OR_RETURN(m->hc_head_scale_, UploadF32(dev, weights.hc_head.scale));
  for (int li = 0; li < c.n_layers; ++li) {
    const model::LayerWeights& lw = weights.layers[li];
    auto d = std::make_unique<DeviceLayer>();
    d->ratio = lw.compress_ratio;
    DSINFER_ASSIGN_OR_RETURN(d->hc_attn, UploadHc(dev, lw.hc_attn));
    DSINFER_ASSIGN_OR_RETURN(d->hc_ffn, UploadHc(dev, lw.hc_ffn));
    DSINFER_ASSIGN_OR_RETURN(d->attn_norm, UploadF32(dev, lw.attn_norm));
    DSINFER_ASSIGN_OR_RETURN(d->ffn_norm, UploadF32(dev, lw.ffn_norm));
    DSINFER_ASSIGN_OR_RETURN(d->q_norm, UploadF32(dev, lw.q_norm));
    DSINFER_ASSIGN_OR_RETURN(d->kv_norm, UploadF32(dev, lw.kv_norm));
    DSINFER_ASSIGN_OR_RETURN(d->attn_sink, UploadF32(dev, lw.attn_sink));
    DSINFER_ASSIGN_OR_RETURN(d->wq_a, UploadWeight(dev, lw.wq_a));
    DSINFER_ASSIGN_OR_RETURN(d->wq_b, UploadWeight(dev, lw.wq_b));
    DSINFER_ASSIGN_OR_RETURN(d->wkv, UploadWeight(dev, lw.wkv));
    DSINFER_ASSIGN_OR_RETURN(d->wo_a, UploadWeight(dev, lw.wo_a));
    DSINFER_ASSIGN_OR_RETURN(d->wo_b, UploadWeight(dev, lw.wo_b));
    d->wo_a_copies.resize(c.o_groups);
    for (int g = 0; g < c.o_groups; ++g) {
      DSINFER_ASSIGN_OR_RETURN(
          DeviceWeight s, RowSlice(dev, lw.wo_a, d->wo_a, int64_t{g} * c.o_lora_rank, c.o_lora_rank,
                                   &d->wo_a_copies[g]));
      d->wo_a_groups.push_back(std::move(s));
    }
    if (lw.compress_ratio > 0) {
      DSINFER_ASSIGN_OR_RETURN(d->compressor, UploadCompressor(dev, lw.compressor));
    }
    if (lw.compress_ratio == 4) {
      DSINFER_ASSIGN_OR_RETURN(d->index_wq_b, UploadWeight(dev, lw.indexer.wq_b));
      DSINFER_ASSIGN_OR_RETURN(d->index_weights_proj, UploadWeight(dev, lw.indexer.weights_proj));
      DSINFER_ASSIGN_OR_RETURN(d->index_compressor, UploadCompressor(dev, lw.indexer.compressor));
    }
    cpu::RopeTable rope = cpu::RopeTable::ForLayer(c, li);
    DSINFER_ASSIGN_OR_RETURN(d->inv_freq,
                             dev.Upload(rope.inv_freq.data(), rope.inv_freq.size() * 4));
    DSINFER_ASSIGN_OR_RETURN(d->gate, UploadWeight(dev, lw.gate));
    if (lw.tid2eid.valid()) {
      const int64_t n = lw.tid2eid.NumElements();
      std::vector<int32_t> ids(static_cast<size_t>(n));  // [vocab, K] int32
      for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(lw.tid2eid.IntAt(i));
      DSINFER_ASSIGN_OR_RETURN(d->tid2eid, dev.Upload(ids.data(), ids.size() * 4));
    } else {
      DSINFER_ASSIGN_OR_RETURN(d->gate_bias, UploadF32(dev, lw.gate_bias));
    }
    if (c.n_shared_experts > 0) {
      DSINFER_ASSIGN_OR_RETURN(d->shared_w1, UploadWeight(dev, lw.shared.w1));
      DSINFER_ASSIGN_OR_RETURN(d->shared_w3, UploadWeight(dev, lw.shared.w3));
      DSINFER_ASSIGN_OR_RETURN(d->shared_w2, UploadWeight(dev, lw.shared.w2));
    }
    std::vector<const model::WeightMatrix*> w1, w3, w2;
    for (const auto& e : lw.experts) w1.push_back(&e.w1), w3.push_back(&e.w3), w2.push_back(&e.w2);
    DSINFER_ASSIGN_OR_RETURN(d->w1, UploadExperts(dev, w1));
    DSINFER_ASSIGN_OR_RETURN(d->w3, UploadExperts(dev, w3));
    DSINFER_ASSIGN_OR_RETURN(d->w2, UploadExperts(dev, w2));
    m->layers_.push_back(std::move(d));
  }
  DSINFER_RETURN_IF_ERROR(dev.Synchronize());
  size_t f = 0, t = 0;
  if (free_before > 0 && cudaMemGetInfo(&f, &t) == cudaSuccess)
    m->weight_bytes_ = free_before - static_cast<int64_t>(f);
  return m;
}

Result<std::unique_ptr<CudaSequence>> CudaModel::NewSequence() {
  const model::ModelConfig& c = config();
  auto s = std::make_unique<CudaSequence>();
  s->owner = this;
  s->layers.resize(c.n_layers);
  for (int li = 0; li < c.n_layers; ++li) {
    CudaLayerState& ls = s->layers[li];
    const int64_t ring_n = int64_t{c.window} * c.head_dim;
    DSINFER_ASSIGN_OR_RETURN(ls.ring, dev_.Alloc(static_cast<size_t>(ring_n) * 4));
    DSINFER_RETURN_IF_ERROR(dev_.Memset(ls.ring.data(), 0, ls.ring.bytes()));
    DSINFER_RETURN_IF_ERROR(EnsureCapacity(li, ls, 0));
    const int r = c.CompressRatio(li);
    auto init = [&](CudaCompressorState& st, int ratio, int width, bool overlap) -> Status {
      st.ratio = ratio, st.width = width, st.overlap = overlap;
      const size_t bytes = static_cast<size_t>(ratio) * width * 4;
      DSINFER_ASSIGN_OR_RETURN(st.pending_a, dev_.Alloc(bytes));
      DSINFER_ASSIGN_OR_RETURN(st.pending_g, dev_.Alloc(bytes));
      if (overlap) {
        DSINFER_ASSIGN_OR_RETURN(st.prev_a, dev_.Alloc(bytes));
        DSINFER_ASSIGN_OR_RETURN(st.prev_score, dev_.Alloc(bytes));
      }
      return Status::Ok();
    };
    if (r > 0)
      DSINFER_RETURN_IF_ERROR(init(ls.compressor, r, (r == 4 ? 2 : 1) * c.head_dim, r == 4));
    if (r == 4) DSINFER_RETURN_IF_ERROR(init(ls.index_compressor, 4, 2 * c.index_head_dim, true));
  }
  return s;
}

namespace {

Result<DeviceBuffer> CloneBuffer(CudaDevice& dev, const DeviceBuffer& from) {
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer b, dev.Alloc(from.bytes()));
  if (from.bytes() > 0)
    DSINFER_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(b.data(), from.data(), from.bytes(),
                                                       cudaMemcpyDeviceToDevice, dev.stream()),
                                       "copy sequence"));
  return b;
}

Status CloneCompressor(CudaDevice& dev, const CudaCompressorState& from, CudaCompressorState* to) {
  to->ratio = from.ratio, to->width = from.width, to->overlap = from.overlap;
  DSINFER_ASSIGN_OR_RETURN(to->pending_a, CloneBuffer(dev, from.pending_a));
  DSINFER_ASSIGN_OR_RETURN(to->pending_g, CloneBuffer(dev, from.pending_g));
  DSINFER_ASSIGN_OR_RETURN(to->prev_a, CloneBuffer(dev, from.prev_a));
  DSINFER_ASSIGN_OR_RETURN(to->prev_score, CloneBuffer(dev, from.prev_score));
  return Status::Ok();
}

int64_t CompressorBytes(const CudaCompressorState& c) {
  return static_cast<int64_t>(c.pending_a.bytes() + c.pending_g.bytes() + c.prev_a.bytes() +
                              c.prev_score.bytes());
}

}  // namespace

Result<std::unique_ptr<CudaSequence>> CudaModel::CopySequence(const CudaSequence& from) {
  if (from.owner != this) return InvalidArgument("CopySequence: the sequence is another model's");
  DSINFER_RETURN_IF_ERROR(dev_.Activate());
  auto s = std::make_unique<CudaSequence>();
  s->owner = this;
  s->n_tokens = from.n_tokens;
  s->layers.resize(from.layers.size());
  for (size_t li = 0; li < from.layers.size(); ++li) {
    const CudaLayerState& a = from.layers[li];
    CudaLayerState& b = s->layers[li];
    DSINFER_ASSIGN_OR_RETURN(b.ring, CloneBuffer(dev_, a.ring));
    DSINFER_ASSIGN_OR_RETURN(b.pool, CloneBuffer(dev_, a.pool));
    b.compressed_capacity = a.compressed_capacity;
    DSINFER_ASSIGN_OR_RETURN(b.index_keys, CloneBuffer(dev_, a.index_keys));
    b.index_capacity = a.index_capacity;
    DSINFER_RETURN_IF_ERROR(CloneCompressor(dev_, a.compressor, &b.compressor));
    DSINFER_RETURN_IF_ERROR(CloneCompressor(dev_, a.index_compressor, &b.index_compressor));
  }
  return s;
}

int64_t CudaModel::SequenceBytes(const CudaSequence& seq) {
  int64_t b = 0;
  for (const CudaLayerState& ls : seq.layers)
    b += static_cast<int64_t>(ls.ring.bytes() + ls.pool.bytes() + ls.index_keys.bytes()) +
         CompressorBytes(ls.compressor) + CompressorBytes(ls.index_compressor);
  return b;
}

int64_t CudaModel::SequenceBytesAt(int64_t n_tokens) const {
  // NewSequence's buffers and EnsureCapacity's growth rule, with the doubling's worst case
  // (capacity < 2 x need, or the minimum of 16 rows).
  const model::ModelConfig& c = config();
  const int64_t hd = c.head_dim, ihd = c.index_head_dim;
  const int64_t window_region = c.window - 1 + kMaxStepTokens;
  int64_t b = 0;
  for (int li = 0; li < c.n_layers; ++li) {
    const int r = c.CompressRatio(li);
    const int64_t need = r > 0 ? std::max<int64_t>(0, n_tokens) / r : 0;
    const int64_t cap = r > 0 ? std::max<int64_t>(16, 2 * need) : 0;
    b += int64_t{c.window} * hd * 4 + (window_region + cap) * hd * 4;  // ring + pool
    if (r > 0) {
      const int64_t width = (r == 4 ? 2 : 1) * hd;  // the compressor's projection width
      b += (r == 4 ? 4 : 2) * r * width * 4;        // pending a / g (+ previous a / score)
    }
    if (r == 4) b += cap * ihd * 4 + 4 * 4 * (2 * ihd) * 4;  // indexer keys + its compressor
  }
  return b;
}

// The pool holds the window region (window - 1 + kMaxStepTokens rows) and the compressed rows
// of n_tokens_after positions; index keys likewise. Growth doubles and keeps the rows.
Status CudaModel::EnsureCapacity(int li, CudaLayerState& ls, int64_t n_tokens_after) {
  const model::ModelConfig& c = config();
  const int r = c.CompressRatio(li);
  const int64_t hd = c.head_dim;
  const int64_t window_region = c.window - 1 + kMaxStepTokens;
  const int64_t need = r > 0 ? n_tokens_after / r : 0;
  if (!ls.pool.data() || need > ls.compressed_capacity) {
    const int64_t cap = std::max<int64_t>({need, 2 * ls.compressed_capacity, r > 0 ? 16 : 0});
    DSINFER_ASSIGN_OR_RETURN(DeviceBuffer pool,
                             dev_.Alloc(static_cast<size_t>((window_region + cap) * hd) * 4));
    if (ls.pool.data() && ls.compressed_capacity > 0)
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(pool.as<float>() + window_region * hd,
                                     ls.pool.as<float>() + window_region * hd,
                                     static_cast<size_t>(ls.compressed_capacity * hd) * 4,
                                     cudaMemcpyDeviceToDevice, dev_.stream()),
                     "pool growth"));
    DSINFER_RETURN_IF_ERROR(dev_.Synchronize());
    ls.pool = std::move(pool);
    ls.compressed_capacity = cap;
  }
  if (r == 4 && need > ls.index_capacity) {
    const int64_t ihd = c.index_head_dim;
    const int64_t cap = std::max<int64_t>({need, 2 * ls.index_capacity, 16});
    DSINFER_ASSIGN_OR_RETURN(DeviceBuffer keys, dev_.Alloc(static_cast<size_t>(cap * ihd) * 4));
    if (ls.index_capacity > 0)
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(keys.data(), ls.index_keys.data(),
                                     static_cast<size_t>(ls.index_capacity * ihd) * 4,
                                     cudaMemcpyDeviceToDevice, dev_.stream()),
                     "index key growth"));
    DSINFER_RETURN_IF_ERROR(dev_.Synchronize());
    ls.index_keys = std::move(keys);
    ls.index_capacity = cap;
  }
  return Status::Ok();
}

bool CudaModel::UseTensorCores(const DeviceWeight& w, int64_t m) const {
  return tc_mma_.has_value() && numerics_.quantize_activations && m >= kTcMinTokens &&
         config().act_block == 128 && TcMatMulApplies(w.view);
}

bool CudaModel::UseTensorCores(const DeviceExpertSet& set) const {
  return expert_mma_.has_value() && numerics_.quantize_activations && config().act_block == 128 &&
         TcGroupedApplies(set);
}

Status CudaModel::MatMulQuantized(const DeviceWeight& w, const float* x, int64_t m, float* y) {
  // Quantizing a value already on the grid gives back its code and an equivalent scale, so the
  // tensor-core path computes the same products.
  if (UseTensorCores(w, m)) return TcMatMul(dev_, w, x, m, y, *tc_mma_);
  return MatMul(dev_, w, x, m, y);
}

Status CudaModel::QuantLinear(const DeviceWeight& w, const float* x, int64_t m, float* y) {
  const Numerics& nm = numerics_;
  const bool quantized = w.view.format == DeviceWeightView::Format::kFp8Block ||
                         w.view.format == DeviceWeightView::Format::kFp4Packed;
  if (UseTensorCores(w, m)) {
    DSINFER_RETURN_IF_ERROR(TcMatMul(dev_, w, x, m, y, *tc_mma_));
  } else if (quantized && nm.quantize_activations) {
    DSINFER_ASSIGN_OR_RETURN(float* xq, ws_->Get(dev_, Workspace::kQuant, m * w.view.cols));
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(xq, x, static_cast<size_t>(m * w.view.cols) * 4,
                                   cudaMemcpyDeviceToDevice, dev_.stream()),
                   "QuantLinear copy"));
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchFp8RoundTrip(xq, m, w.view.cols, w.view.cols, config().act_block, dev_.stream()),
        "act quant"));
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, w, xq, m, y));
  } else {
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, w, x, m, y));
  }
  if (nm.round_bf16)
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchScaleRound(y, m * w.view.rows, 1.0f, true, dev_.stream()), "round"));
  return Status::Ok();
}

Status CudaModel::Forward(CudaSequence& seq, std::span<const int32_t> tokens,
                          const cpu::ForwardOptions& options, cpu::ForwardOutput* out) {
  CudaChunk chunk{&seq, tokens, options, out};
  return ForwardBatch(std::span<CudaChunk>(&chunk, 1));
}

Status CudaModel::ForwardBatch(std::span<CudaChunk> chunks) {
  const model::ModelConfig& c = config();
  // Validate everything before touching any state: a bad chunk fails the step and loses nothing.
  int64_t longest = 0;
  for (const CudaChunk& ch : chunks) {
    if (ch.seq == nullptr || ch.out == nullptr)
      return InvalidArgument("ForwardBatch: chunk without sequence/output");
    if (ch.seq->owner != this)
      return InvalidArgument("Forward: the sequence belongs to another model");
    if (ch.tokens.empty()) return InvalidArgument("Forward: empty token chunk");
    if (ch.options.want_hidden)
      return Unimplemented("Forward: the GPU forward does not return hidden states (no MTP yet)");
    for (int32_t tok : ch.tokens)
      if (tok < 0 || tok >= c.vocab_size)
        return InvalidArgument("token id " + std::to_string(tok) + " outside the vocabulary [0, " +
                               std::to_string(c.vocab_size) + ")");
    for (const CudaChunk& other : chunks)
      if (&other != &ch && other.seq == ch.seq)
        return InvalidArgument("ForwardBatch: a sequence appears twice");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ch.tokens.size()));
  }
  for (CudaChunk& ch : chunks) {
    ch.out->logits.clear();
    ch.out->hidden.clear();
  }
  // Rounds of at most kMaxStepTokens tokens per sequence (the pool's window region holds that).
  for (int64_t b = 0; b < longest; b += kMaxStepTokens) {
    std::vector<Segment> segments;
    int64_t row = 0;
    for (CudaChunk& ch : chunks) {
      const int64_t n = static_cast<int64_t>(ch.tokens.size());
      if (b >= n) continue;
      const int64_t len = std::min(kMaxStepTokens, n - b);
      const bool last = b + len == n;
      segments.push_back({ch.seq, ch.tokens.subspan(b, len), row, ch.options.all_logits,
                          ch.options.want_logits && (last || ch.options.all_logits),
                          &ch.out->logits});
      row += len;
    }
    DSINFER_RETURN_IF_ERROR(Step(segments));
  }
  return Status::Ok();
}

Status CudaModel::MarkPhase(double* bucket) {
  if (!time_phases_) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(dev_.Synchronize());
  const auto now = std::chrono::steady_clock::now();
  if (bucket != nullptr) *bucket += std::chrono::duration<double>(now - phase_mark_).count();
  phase_mark_ = now;
  return Status::Ok();
}

Status CudaModel::Step(std::span<Segment> segments) {
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D;
  step_stats_ = {};
  DSINFER_RETURN_IF_ERROR(MarkPhase(nullptr));
  std::vector<int32_t> tokens;  // [T] the step's tokens, sequence after sequence
  for (const Segment& sg : segments) {
    tokens.insert(tokens.end(), sg.tokens.begin(), sg.tokens.end());
    for (int li = 0; li < c.n_layers; ++li)
      DSINFER_RETURN_IF_ERROR(EnsureCapacity(
          li, sg.seq->layers[li], sg.seq->n_tokens + static_cast<int64_t>(sg.tokens.size())));
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  // H [T, hc, D]: the residual streams.
  DSINFER_ASSIGN_OR_RETURN(float* H, ws_->Get(dev_, Workspace::kH, T * HD));
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dtok, dev_.UploadStaged(tokens.data(), tokens.size() * 4));
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(LaunchEmbed(embed_.as<const uint16_t>(), dtok.as<const int32_t>(), T, c.hc_mult, D,
                             H, dev_.stream()),
                 "Embed"));
  // Positions for RoPE: [T] per row, then per attention head and per indexer head.
  std::vector<int64_t> pos;  // [T * (1 + n_heads + index_n_heads)]
  pos.reserve(static_cast<size_t>(T * (1 + c.n_heads + c.index_n_heads)));
  for (int per : {1, c.n_heads, c.index_n_heads})
    for (const Segment& sg : segments)
      for (int64_t t = 0; t < static_cast<int64_t>(sg.tokens.size()); ++t)
        pos.insert(pos.end(), static_cast<size_t>(per), sg.seq->n_tokens + t);
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dpos, dev_.UploadStaged(pos.data(), pos.size() * 8));
  step_.tokens = dtok.as<const int32_t>();
  step_.pos = dpos.as<const int64_t>();
  step_.pos_heads = step_.pos + T;
  step_.pos_index_heads = step_.pos_heads + T * c.n_heads;
  for (int li = 0; li < c.n_layers; ++li) DSINFER_RETURN_IF_ERROR(Block(li, segments, T, H));
  for (const Segment& sg : segments) sg.seq->n_tokens += static_cast<int64_t>(sg.tokens.size());

  // Head over the rows the sequences asked for, gathered contiguously.
  int64_t n_out = 0;
  for (const Segment& sg : segments)
    if (sg.want_logits) n_out += sg.all_logits ? static_cast<int64_t>(sg.tokens.size()) : 1;
  if (n_out == 0) return dev_.Synchronize();
  DSINFER_ASSIGN_OR_RETURN(float* Hsel, ws_->Get(dev_, Workspace::kHsel, n_out * HD));
  int64_t at = 0;
  for (const Segment& sg : segments) {
    if (!sg.want_logits) continue;
    const int64_t n = static_cast<int64_t>(sg.tokens.size());
    const int64_t first = sg.all_logits ? 0 : n - 1;
    DSINFER_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(Hsel + at * HD, H + (sg.row + first) * HD,
                                                       static_cast<size_t>((n - first) * HD) * 4,
                                                       cudaMemcpyDeviceToDevice, dev_.stream()),
                                       "head rows"));
    at += n - first;
  }
  DSINFER_ASSIGN_OR_RETURN(float* y, ws_->Get(dev_, Workspace::kHead, n_out * D));
  DSINFER_ASSIGN_OR_RETURN(float* dots, ws_->Get(dev_, Workspace::kDots, n_out * (c.hc_mult + 1)));
  const bool rb = numerics_.round_bf16;
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(LaunchHcHead(hc_shape_, hc_head_fn_.as<float>(), hc_head_base_.as<float>(),
                              hc_head_scale_.as<float>(), Hsel, n_out, dots, y, rb, dev_.stream()),
                 "HcHead"));
  DSINFER_RETURN_IF_ERROR(RmsNormRows(dev_, y, n_out, D, norm_.as<float>(), c.norm_eps, rb));
  DSINFER_ASSIGN_OR_RETURN(float* dl, ws_->Get(dev_, Workspace::kLogits, n_out * c.vocab_size));
  DSINFER_RETURN_IF_ERROR(MatMul(dev_, head_, y, n_out, dl));
  std::vector<float> logits(static_cast<size_t>(n_out * c.vocab_size));  // [n_out, vocab]
  DSINFER_RETURN_IF_ERROR(dev_.CopyToHost(logits.data(), dl, logits.size() * 4));
  DSINFER_RETURN_IF_ERROR(MarkPhase(&phase_times_.head));
  at = 0;
  for (const Segment& sg : segments) {
    if (!sg.want_logits) continue;
    const int64_t k = sg.all_logits ? static_cast<int64_t>(sg.tokens.size()) : 1;
    sg.logits->insert(sg.logits->end(), logits.begin() + at * c.vocab_size,
                      logits.begin() + (at + k) * c.vocab_size);
    at += k;
  }
  return Status::Ok();
}

Status CudaModel::Block(int li, std::span<Segment> segments, int64_t T, float* H) {
  const model::ModelConfig& c = config();
  const DeviceLayer& d = *layers_[li];
  const int64_t D = c.hidden;
  const bool rb = numerics_.round_bf16;
  DSINFER_ASSIGN_OR_RETURN(float* x, ws_->Get(dev_, Workspace::kX, T * D));  // [T, D]
  DSINFER_ASSIGN_OR_RETURN(float* y, ws_->Get(dev_, Workspace::kY, T * D));  // [T, D]
  const int mix_n = 2 * c.hc_mult + c.hc_mult * c.hc_mult;
  DSINFER_ASSIGN_OR_RETURN(float* mix, ws_->Get(dev_, Workspace::kMix, T * mix_n));
  DSINFER_ASSIGN_OR_RETURN(float* dots, ws_->Get(dev_, Workspace::kDots, T * (c.HcRows() + 1)));
  // Attention sub-layer.
  DSINFER_RETURN_IF_ERROR(HcPre(dev_, hc_shape_, d.hc_attn.fn.as<float>(),
                                d.hc_attn.base.as<float>(), d.hc_attn.scale.as<float>(), H, T, dots,
                                x, mix, rb));
  DSINFER_RETURN_IF_ERROR(RmsNormRows(dev_, x, T, D, d.attn_norm.as<float>(), c.norm_eps, rb));
  DSINFER_RETURN_IF_ERROR(Attention(li, segments, T, x, y));
  DSINFER_RETURN_IF_ERROR(HcPost(dev_, hc_shape_, mix, y, H, T, rb));
  // MoE sub-layer.
  DSINFER_RETURN_IF_ERROR(HcPre(dev_, hc_shape_, d.hc_ffn.fn.as<float>(), d.hc_ffn.base.as<float>(),
                                d.hc_ffn.scale.as<float>(), H, T, dots, x, mix, rb));
  DSINFER_RETURN_IF_ERROR(RmsNormRows(dev_, x, T, D, d.ffn_norm.as<float>(), c.norm_eps, rb));
  DSINFER_RETURN_IF_ERROR(Moe(li, T, x, y));
  DSINFER_RETURN_IF_ERROR(HcPost(dev_, hc_shape_, mix, y, H, T, rb));
  return MarkPhase(&phase_times_.moe);
}

}  // namespace dsinfer::backend::cuda
