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
    : dev_(dev),
      weights_(weights),
      numerics_(numerics),
      program_(weights.config(), numerics),
      ws_(std::make_unique<Workspace>()),
      routing_(std::make_unique<Routing>()) {
  const model::ModelConfig& c = weights.config();
  hc_shape_.hc = c.hc_mult;
  hc_shape_.hidden = c.hidden;
  hc_shape_.sinkhorn_iters = c.hc_sinkhorn_iters;
  hc_shape_.norm_eps = static_cast<float>(c.norm_eps);
  hc_shape_.hc_eps = static_cast<float>(c.hc_eps);
}

CudaModel::~CudaModel() = default;

Result<std::unique_ptr<CudaModel::DeviceLayer>> CudaModel::UploadLayer(
  CudaDevice& dev, const model::ModelConfig& c, const model::LayerPlan& plan,
  const model::LayerWeights& lw) {
  auto d = std::make_unique<DeviceLayer>();
  d->ratio = plan.compress_ratio;
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
  if (plan.owns_compressor) {
    DSINFER_ASSIGN_OR_RETURN(d->compressor, UploadCompressor(dev, lw.compressor));
  }
  if (plan.runs_indexer) {
    DSINFER_ASSIGN_OR_RETURN(d->index_wq_b, UploadWeight(dev, lw.indexer.wq_b));
    DSINFER_ASSIGN_OR_RETURN(d->index_weights_proj, UploadWeight(dev, lw.indexer.weights_proj));
    DSINFER_ASSIGN_OR_RETURN(d->index_compressor, UploadCompressor(dev, lw.indexer.compressor));
  }
  const cpu::RopeTable rope = cpu::RopeTable::ForPlan(c, plan);
  DSINFER_ASSIGN_OR_RETURN(d->inv_freq,
                           dev.Upload(rope.inv_freq.data(), rope.inv_freq.size() * 4));
  DSINFER_ASSIGN_OR_RETURN(d->gate, UploadWeight(dev, lw.gate));
  if (plan.hash_routed) {
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
  if (plan.mtp) {
    DSINFER_ASSIGN_OR_RETURN(d->e_proj, UploadWeight(dev, lw.e_proj));
    DSINFER_ASSIGN_OR_RETURN(d->h_proj, UploadWeight(dev, lw.h_proj));
    DSINFER_ASSIGN_OR_RETURN(d->enorm, UploadF32(dev, lw.enorm));
    DSINFER_ASSIGN_OR_RETURN(d->hnorm, UploadF32(dev, lw.hnorm));
    DSINFER_ASSIGN_OR_RETURN(d->norm, UploadF32(dev, lw.norm));
    DSINFER_ASSIGN_OR_RETURN(d->hc_head, UploadHc(dev, lw.hc_head));
  }
  return d;
}

namespace {
// DeepSeek-V4.1's ops are not on the GPU yet; Create refuses V4.1 checkpoints before they could
// be reached, so these errors only guard the interface.
Status V41OnGpu(const char* op) {
  return Unimplemented(std::string("CUDA: ") + op +
                       " (DeepSeek-V4.1) is not implemented on the GPU");
}
}  // namespace

Status CudaModel::Supports(const model::ModelConfig& c) {
  if (c.V41())
    return Unimplemented(
        "the CUDA backend does not run DeepSeek-V4.1 checkpoints yet (CSA2 roles, single-pass "
        "mHC, Engram and the V4.1 KV formats are implemented on the CPU backend only): use "
        "--device cpu");
  return Status::Ok();
}

Result<std::unique_ptr<CudaModel>> CudaModel::Create(CudaDevice& dev,
                                                     const model::ModelWeights& weights,
                                                     Numerics numerics, Fp8GemmPath fp8_gemm,
                                                     ExpertGemmPath experts) {
  const model::ModelConfig& c = weights.config();
  DSINFER_RETURN_IF_ERROR(Supports(c));
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
  for (const model::LayerPlan& plan : m->program_.plans()) {
    DSINFER_ASSIGN_OR_RETURN(auto d, UploadLayer(dev, c, plan, weights.layers[plan.layer]));
    m->layers_.push_back(std::move(d));
  }
  DSINFER_RETURN_IF_ERROR(dev.Synchronize());
  size_t f = 0, t = 0;
  if (free_before > 0 && cudaMemGetInfo(&f, &t) == cudaSuccess)
    m->weight_bytes_ = free_before - static_cast<int64_t>(f);
  return m;
}

// ---- sequence state --------------------------------------------------------------------------

Result<std::unique_ptr<CudaSequence>> CudaModel::NewSequence() {
  const model::ModelConfig& c = config();
  auto s = std::make_unique<CudaSequence>();
  s->owner = this;
  s->layers.resize(program_.plans().size());
  for (const model::LayerPlan& plan : program_.plans()) {
    CudaLayerState& ls = s->layers[plan.layer];
    const int64_t ring_n = int64_t{c.window} * c.head_dim;
    DSINFER_ASSIGN_OR_RETURN(ls.ring, dev_.Alloc(static_cast<size_t>(ring_n) * 4));
    DSINFER_RETURN_IF_ERROR(dev_.Memset(ls.ring.data(), 0, ls.ring.bytes()));
    DSINFER_RETURN_IF_ERROR(EnsureCapacity(plan.layer, ls, 0));
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
    if (plan.owns_compressor)
      DSINFER_RETURN_IF_ERROR(init(ls.compressor, plan.compress_ratio, plan.compressor_width,
                                   plan.compressor_overlap));
    if (plan.runs_indexer)
      DSINFER_RETURN_IF_ERROR(
          init(ls.index_compressor, plan.index_ratio, plan.index_compressor_width, true));
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
  s->length = from.length;
  s->mtp_length = from.mtp_length;
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
  for (const model::LayerPlan& plan : program_.plans()) {
    const int r = plan.owns_compressor ? plan.compress_ratio : 0;
    const int64_t need = r > 0 ? std::max<int64_t>(0, n_tokens) / r : 0;
    const int64_t cap = r > 0 ? std::max<int64_t>(16, 2 * need) : 0;
    b += int64_t{c.window} * hd * 4 + (window_region + cap) * hd * 4;  // ring + pool
    if (r > 0) b += (plan.compressor_overlap ? 4 : 2) * r * int64_t{plan.compressor_width} * 4;
    if (plan.runs_indexer)  // indexer keys + its compressor's pending and previous groups
      b += cap * ihd * 4 + 4 * int64_t{plan.index_ratio} * plan.index_compressor_width * 4;
  }
  return b;
}

// The pool holds the window region (window - 1 + kMaxStepTokens rows) and the compressed rows
// of n_tokens_after positions; index keys likewise. Growth doubles and keeps the rows.
Status CudaModel::EnsureCapacity(int li, CudaLayerState& ls, int64_t n_tokens_after) {
  const model::ModelConfig& c = config();
  const model::LayerPlan& plan = program_.plans()[li];
  const int r = plan.owns_compressor ? plan.compress_ratio : 0;
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
  const int64_t keys_need = plan.runs_indexer ? n_tokens_after / plan.index_ratio : 0;
  if (plan.runs_indexer && keys_need > ls.index_capacity) {
    const int64_t ihd = c.index_head_dim;
    const int64_t cap = std::max<int64_t>({keys_need, 2 * ls.index_capacity, 16});
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

// ---- stepping --------------------------------------------------------------------------------

Status CudaModel::Forward(CudaSequence& seq, std::span<const int32_t> tokens,
                          const ForwardOptions& options, ForwardOutput* out) {
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
    DSINFER_RETURN_IF_ERROR(program_.CheckTokens(ch.tokens));
    for (const CudaChunk& other : chunks)
      if (&other != &ch && other.seq == ch.seq)
        return InvalidArgument("ForwardBatch: a sequence appears twice");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ch.tokens.size()));
  }
  for (CudaChunk& ch : chunks) {
    ch.out->logits.clear();
    ch.out->hidden.clear();
  }
  const int64_t V = c.vocab_size, HD = int64_t{c.hc_mult} * c.hidden;
  // Rounds of at most kMaxStepTokens tokens per sequence (the pool's window region holds that).
  for (int64_t b = 0; b < longest; b += kMaxStepTokens) {
    std::vector<Segment> segments;
    std::vector<CudaChunk*> owners;  // [segments]
    std::vector<int32_t> tokens;     // [T]
    std::vector<int64_t> logit_rows, hidden_rows;
    for (CudaChunk& ch : chunks) {
      const int64_t n = static_cast<int64_t>(ch.tokens.size());
      if (b >= n) continue;
      const int64_t len = std::min(kMaxStepTokens, n - b);
      const auto row = static_cast<int64_t>(tokens.size());
      segments.push_back({row, len, ch.seq->length, ch.seq});
      owners.push_back(&ch);
      tokens.insert(tokens.end(), ch.tokens.begin() + b, ch.tokens.begin() + b + len);
      const bool last = b + len == n;
      if (ch.options.want_logits && (last || ch.options.all_logits))
        for (int64_t t = ch.options.all_logits ? 0 : len - 1; t < len; ++t)
          logit_rows.push_back(row + t);
      if (ch.options.want_hidden)
        for (int64_t t = 0; t < len; ++t) hidden_rows.push_back(row + t);
    }
    V4Forward::StepResult result;
    DSINFER_RETURN_IF_ERROR(
        program_.Step(*this, {segments, tokens, logit_rows, hidden_rows}, &result));
    // A round that brings nothing back still ends complete (a prefill's timing, the next
    // round's staging).
    if (logit_rows.empty() && hidden_rows.empty()) DSINFER_RETURN_IF_ERROR(dev_.Synchronize());
    // Each chunk's rows of the results, appended round after round.
    int64_t li = 0, hi = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      CudaChunk& ch = *owners[i];
      const int64_t len = segments[i].n;
      int64_t n_logits = 0;
      while (li + n_logits < static_cast<int64_t>(logit_rows.size()) &&
             logit_rows[li + n_logits] < segments[i].row + len)
        ++n_logits;
      ch.out->logits.insert(ch.out->logits.end(), result.logits.begin() + li * V,
                            result.logits.begin() + (li + n_logits) * V);
      li += n_logits;
      if (ch.options.want_hidden) {
        ch.out->hidden.insert(ch.out->hidden.end(), result.hidden.begin() + hi * HD,
                              result.hidden.begin() + (hi + len) * HD);
        hi += len;
      }
      ch.seq->length += len;
    }
  }
  return Status::Ok();
}

Status CudaModel::ForwardMtp(CudaSequence& seq, std::span<const float> hidden,
                             std::span<const int32_t> next_tokens, std::vector<float>* logits) {
  const model::ModelConfig& c = config();
  DSINFER_RETURN_IF_ERROR(program_.CheckMtpInputs(next_tokens, hidden));
  if (seq.owner != this) return InvalidArgument("ForwardMtp: the sequence is another model's");
  const int64_t n = static_cast<int64_t>(next_tokens.size());
  const int64_t HD = int64_t{c.hc_mult} * c.hidden;
  logits->clear();
  for (int64_t b = 0; b < n; b += kMaxStepTokens) {
    const int64_t len = std::min(kMaxStepTokens, n - b);
    const Segment seg{0, len, seq.mtp_length, &seq};
    std::vector<float> part;
    DSINFER_RETURN_IF_ERROR(program_.Mtp(*this, 0, seg, next_tokens.subspan(b, len),
                                         hidden.subspan(b * HD, len * HD), &part));
    logits->insert(logits->end(), part.begin(), part.end());
    seq.mtp_length += len;
  }
  return Status::Ok();
}

Status CudaModel::BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) {
  const model::ModelConfig& c = config();
  segments_.assign(segments.begin(), segments.end());
  step_rows_ = static_cast<int64_t>(tokens.size());
  step_stats_ = {};
  // Room for the compressed rows this step may add (backbone positions; an MTP step's are
  // lower, and capacity only grows).
  for (const Segment& sg : segments)
    for (const model::LayerPlan& plan : program_.plans())
      if (!plan.mtp)
        DSINFER_RETURN_IF_ERROR(
            EnsureCapacity(plan.layer, Seq(&sg - segments.data()).layers[plan.layer],
                           sg.start_pos + sg.n));
  DSINFER_ASSIGN_OR_RETURN(step_tokens_buf_, dev_.UploadStaged(tokens.data(), tokens.size() * 4));
  // Positions for RoPE: [T] per row, then per attention head and per indexer head.
  const int64_t T = step_rows_;
  std::vector<int64_t> pos;  // [T * (1 + n_heads + index_n_heads)]
  pos.reserve(static_cast<size_t>(T * (1 + c.n_heads + c.index_n_heads)));
  for (int per : {1, c.n_heads, c.index_n_heads})
    for (const Segment& sg : segments)
      for (int64_t t = 0; t < sg.n; ++t) pos.insert(pos.end(), static_cast<size_t>(per), sg.start_pos + t);
  DSINFER_ASSIGN_OR_RETURN(step_pos_buf_, dev_.UploadStaged(pos.data(), pos.size() * 8));
  step_.tokens = step_tokens_buf_.as<const int32_t>();
  step_.pos = step_pos_buf_.as<const int64_t>();
  step_.pos_heads = step_.pos + T;
  step_.pos_index_heads = step_.pos_heads + T * c.n_heads;
  return Status::Ok();
}

Result<float*> CudaModel::Get(Buf buf, int64_t n_floats) {
  return ws_->Get(dev_, static_cast<int>(buf), n_floats);
}

Status CudaModel::Mark(Phase phase) {
  if (!time_phases_) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(dev_.Synchronize());
  const auto now = std::chrono::steady_clock::now();
  double* bucket = phase == Phase::kAttentionDense         ? &phase_times_.attention_dense
                   : phase == Phase::kAttentionPerSequence ? &phase_times_.attention_per_sequence
                   : phase == Phase::kMoe                  ? &phase_times_.moe
                   : phase == Phase::kHead                 ? &phase_times_.head
                                                           : nullptr;
  if (bucket != nullptr) *bucket += std::chrono::duration<double>(now - phase_mark_).count();
  phase_mark_ = now;
  return Status::Ok();
}

// ---- dense ops -------------------------------------------------------------------------------

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

Status CudaModel::Embed(int copies, float* out) {
  const model::ModelConfig& c = config();
  return CudaStatus(LaunchEmbed(embed_.as<const uint16_t>(), step_.tokens, step_rows_, copies,
                                c.hidden, out, dev_.stream()),
                    "Embed");
}

Status CudaModel::HcPre(int layer, HcSite site, const float* H, float* x, float* mix) {
  const DeviceLayer& d = *layers_[layer];
  const DeviceHc& p = site == HcSite::kAttn ? d.hc_attn : d.hc_ffn;
  DSINFER_ASSIGN_OR_RETURN(float* dots,
                           ws_->Get(dev_, Workspace::kDots, step_rows_ * (config().HcRows() + 1)));
  return cuda::HcPre(dev_, hc_shape_, p.fn.as<float>(), p.base.as<float>(), p.scale.as<float>(),
                     H, step_rows_, dots, x, mix, numerics_.round_bf16);
}

Status CudaModel::HcPost(const float* mix, const float* y, float* H) {
  return cuda::HcPost(dev_, hc_shape_, mix, y, H, step_rows_, numerics_.round_bf16);
}

Status CudaModel::HcHead(int layer, const float* H, int64_t rows, float* y) {
  const float* fn = layer < 0 ? hc_head_fn_.as<float>() : layers_[layer]->hc_head.fn.as<float>();
  const float* base =
      layer < 0 ? hc_head_base_.as<float>() : layers_[layer]->hc_head.base.as<float>();
  const float* scale =
      layer < 0 ? hc_head_scale_.as<float>() : layers_[layer]->hc_head.scale.as<float>();
  DSINFER_ASSIGN_OR_RETURN(float* dots,
                           ws_->Get(dev_, Workspace::kDots, rows * (config().hc_mult + 1)));
  return CudaStatus(LaunchHcHead(hc_shape_, fn, base, scale, H, rows, dots, y,
                                 numerics_.round_bf16, dev_.stream()),
                    "HcHead");
}

Status CudaModel::RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) {
  const float* w = nullptr;
  if (layer < 0) {
    w = norm_.as<float>();
  } else {
    const DeviceLayer& d = *layers_[layer];
    switch (norm) {
      case Norm::kAttn:
        w = d.attn_norm.as<float>();
        break;
      case Norm::kFfn:
        w = d.ffn_norm.as<float>();
        break;
      case Norm::kQ:
        w = d.q_norm.as<float>();
        break;
      case Norm::kKv:
        w = d.kv_norm.as<float>();
        break;
      case Norm::kCompressor:
        w = d.compressor.norm.as<float>();
        break;
      case Norm::kIndexCompressor:
        w = d.index_compressor.norm.as<float>();
        break;
      case Norm::kE:
        w = d.enorm.as<float>();
        break;
      case Norm::kH:
        w = d.hnorm.as<float>();
        break;
      case Norm::kFinal:
        w = d.norm.as<float>();
        break;
      case Norm::kIndexKey:  // V4.1 (refused at Create)
      case Norm::kMain:
        break;
    }
  }
  if (w == nullptr) return Internal("RmsNorm: layer " + std::to_string(layer) + " has no such norm");
  return RmsNormRows(dev_, x, rows, dim, w, config().norm_eps, numerics_.round_bf16);
}

Status CudaModel::HeadRmsNorm(float* x, int64_t rows, int64_t dim) {
  return CudaStatus(LaunchHeadRmsNorm(x, rows, dim, static_cast<float>(config().norm_eps),
                                      numerics_.round_bf16, dev_.stream()),
                    "head norm");
}

Status CudaModel::Linear(int layer, Weight weight, LinearMode mode, const float* x, int64_t rows,
                         float* y) {
  const DeviceWeight* w = &head_;
  if (weight != Weight::kHead) {
    const DeviceLayer& d = *layers_[layer];
    switch (weight) {
      case Weight::kWqA:
        w = &d.wq_a;
        break;
      case Weight::kWqB:
        w = &d.wq_b;
        break;
      case Weight::kWkv:
        w = &d.wkv;
        break;
      case Weight::kWoB:
        w = &d.wo_b;
        break;
      case Weight::kCompressorWkv:
        w = &d.compressor.wkv;
        break;
      case Weight::kCompressorWgate:
        w = &d.compressor.wgate;
        break;
      case Weight::kIndexWqB:
        w = &d.index_wq_b;
        break;
      case Weight::kIndexWeightsProj:
        w = &d.index_weights_proj;
        break;
      case Weight::kIndexCompressorWkv:
        w = &d.index_compressor.wkv;
        break;
      case Weight::kIndexCompressorWgate:
        w = &d.index_compressor.wgate;
        break;
      case Weight::kEProj:
        w = &d.e_proj;
        break;
      case Weight::kHProj:
        w = &d.h_proj;
        break;
      case Weight::kIndexWk:  // V4.1 (refused at Create)
      case Weight::kEngramWkv:
      case Weight::kMainProj:
      case Weight::kMarkovHead:
      case Weight::kConfidence:
        return V41OnGpu("this linear");
      case Weight::kDraftHead:  // DraftVocabulary() is empty: the GPU runner does not draft
      case Weight::kDraftMarkovHead:
        return Unimplemented("Linear: the GPU runner has no draft vocabulary");
      case Weight::kHead:
        break;
    }
  }
  if (w->view.data == nullptr)
    return Internal("Linear: layer " + std::to_string(layer) + " has no such weight");
  if (mode == LinearMode::kFp32) return MatMul(dev_, *w, x, rows, y);
  return QuantLinear(*w, x, rows, y);
}

Status CudaModel::Rope(int layer, float* x, RopeRows rows, int64_t stride, int64_t offset,
                       bool inverse) {
  const model::ModelConfig& c = config();
  const int64_t T = step_rows_;
  const int64_t n = rows == RopeRows::kTokens  ? T
                    : rows == RopeRows::kHeads ? T * c.n_heads
                                               : T * c.index_n_heads;
  const int64_t* pos = rows == RopeRows::kTokens  ? step_.pos
                       : rows == RopeRows::kHeads ? step_.pos_heads
                                                  : step_.pos_index_heads;
  return ApplyRope(dev_, x, n, stride, offset, pos, layers_[layer]->inv_freq.as<float>(),
                   c.rope_dim / 2, inverse, numerics_.round_bf16);
}

Status CudaModel::RopeAt(int layer, float* x, std::span<const int64_t> positions, int64_t stride,
                         int64_t offset) {
  if (positions.empty()) return Status::Ok();
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dpos,
                           dev_.UploadStaged(positions.data(), positions.size() * 8));
  return ApplyRope(dev_, x, static_cast<int64_t>(positions.size()), stride, offset,
                   dpos.as<const int64_t>(), layers_[layer]->inv_freq.as<float>(),
                   config().rope_dim / 2, false, numerics_.round_bf16);  // freed in stream order
}

Status CudaModel::ScaleRound(float* x, int64_t n, float scale) {
  return CudaStatus(LaunchScaleRound(x, n, scale, numerics_.round_bf16, dev_.stream()),
                    "scale / round");
}

Status CudaModel::Fp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  return CudaStatus(LaunchFp8RoundTrip(x, rows, n, stride, block, dev_.stream()), "FP8 round trip");
}

Status CudaModel::Fp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  return CudaStatus(LaunchFp4RoundTrip(x, rows, n, stride, block, dev_.stream()), "FP4 round trip");
}

Status CudaModel::Hadamard(float* x, int64_t rows, int64_t n) {
  return CudaStatus(
      LaunchHadamard(x, rows, static_cast<int>(n), numerics_.round_bf16, dev_.stream()),
      "Hadamard");
}

Status CudaModel::AddToStreams(const float* e, float* X) {
  // One add per token and stream (the MTP block's input; not a hot path), then the rounding.
  const model::ModelConfig& c = config();
  const int64_t D = c.hidden;
  for (int64_t t = 0; t < step_rows_; ++t)
    for (int k = 0; k < c.hc_mult; ++k) {
      float* row = X + (t * c.hc_mult + k) * D;
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(LaunchAdd(row, e + t * D, D, row, dev_.stream()), "MTP input"));
    }
  return ScaleRound(X, step_rows_ * c.hc_mult * D, 1.0f);
}

Status CudaModel::GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                             float* dst) {
  // Runs of consecutive rows go in one copy.
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(dst + static_cast<int64_t>(i) * width, src + rows[i] * width,
                        static_cast<size_t>((j - i) * width) * 4, cudaMemcpyDeviceToDevice,
                        dev_.stream()),
        "gather rows"));
    i = j;
  }
  return Status::Ok();
}

Status CudaModel::Download(const float* src, int64_t n, float* host) {
  return dev_.CopyToHost(host, src, static_cast<size_t>(n) * 4);
}

Status CudaModel::Upload(const float* host, int64_t n, float* dst) {
  return dev_.CopyToDevice(dst, host, static_cast<size_t>(n) * 4);
}

// ---- DeepSeek-V4.1 ops: refused (Create refuses V4.1 checkpoints first) ------------------------

Status CudaModel::HcPreCarried(int, HcSite, const float*, const float*, int64_t, float*, float*) {
  return V41OnGpu("single-pass mHC");
}
Status CudaModel::HcCollapse(const float*, int64_t, const float*, int64_t, float*) {
  return V41OnGpu("single-pass mHC");
}
Status CudaModel::Fp4E4m3RoundTrip(float*, int64_t, int64_t, int64_t, int) {
  return V41OnGpu("the FP4 / e4m3 KV round trip");
}
Status CudaModel::EngramBegin() { return V41OnGpu("Engram"); }
Status CudaModel::EngramGather(int, float*) { return V41OnGpu("Engram"); }
Status CudaModel::EngramGate(int, const float*, float*) { return V41OnGpu("Engram"); }
Status CudaModel::DraftAttention(int, const float*, const float*, float*) {
  return V41OnGpu("dSpark drafting");
}
Status CudaModel::MarkovEmbed(int, std::span<const int32_t>, float*) {
  return V41OnGpu("dSpark drafting");
}

}  // namespace dsinfer::backend::cuda
