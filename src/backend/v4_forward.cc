#include "backend/v4_forward.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dsinfer::backend {

using model::LayerPlan;

V4Forward::V4Forward(const model::ModelConfig& config, const Numerics& numerics)
    : config_(config), numerics_(numerics), plans_(model::PlanLayers(config)) {}

Status V4Forward::CheckTokens(std::span<const int32_t> tokens) const {
  if (tokens.empty()) return InvalidArgument("Forward: empty token chunk");
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= config_.vocab_size)
      return InvalidArgument("token id " + std::to_string(tok) + " outside the vocabulary [0, " +
                             std::to_string(config_.vocab_size) + ")");
  return Status::Ok();
}

Status V4Forward::CheckMtpBlock() const {
  if (config_.n_mtp_layers == 0) return FailedPrecondition("this checkpoint has no MTP block");
  if (config_.V41())
    return FailedPrecondition(
        "DeepSeek-V4.1's mtp.* tensors are dSpark stages, not a V4 MTP block (they draft through "
        "DsparkSeed / DsparkDraft)");
  return Status::Ok();
}

Status V4Forward::CheckDspark() const {
  if (!config_.V41() || config_.n_mtp_layers == 0 || config_.dspark.block_size <= 0)
    return FailedPrecondition("this checkpoint has no dSpark stages");
  return Status::Ok();
}

int64_t V4Forward::HiddenWidth() const {
  if (CheckDspark().ok())
    return static_cast<int64_t>(config_.dspark.target_layer_ids.size()) * config_.hidden;
  return int64_t{config_.hc_mult} * config_.hidden;
}

Status V4Forward::OneHotCarry(V4Ops& ops, int64_t T, StepContext& ctx) const {
  const int hc = config_.hc_mult;
  DSINFER_ASSIGN_OR_RETURN(float* carry, ops.Get(Buf::kCarry, T * hc));  // [T, hc]
  std::vector<float> one_hot(static_cast<size_t>(T * hc), 0.0f);
  for (int64_t t = 0; t < T; ++t) one_hot[t * hc] = 1.0f;
  DSINFER_RETURN_IF_ERROR(ops.Upload(one_hot.data(), T * hc, carry));
  ctx.carry = carry;
  ctx.carry_stride = hc;
  return Status::Ok();
}

Status V4Forward::CheckMtpInputs(std::span<const int32_t> next,
                                 std::span<const float> hidden) const {
  DSINFER_RETURN_IF_ERROR(CheckMtpBlock());
  const int64_t HD = int64_t{config_.hc_mult} * config_.hidden;
  if (next.empty() || static_cast<int64_t>(hidden.size()) != static_cast<int64_t>(next.size()) * HD)
    return InvalidArgument("ForwardMtp: hidden must be [n, hc_mult, hidden] for n next tokens");
  return CheckTokens(next).WithContext("ForwardMtp");
}

Status V4Forward::Step(V4Ops& ops, const StepRequest& req, StepResult* result) const {
  const model::ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(req.tokens.size());
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D;
  const int n_segments = static_cast<int>(req.segments.size());
  DSINFER_RETURN_IF_ERROR(ops.BeginStep(req.segments, req.tokens));
  DSINFER_RETURN_IF_ERROR(ops.Mark(Phase::kStart));
  // Embedding, copied into every stream (spec §3).
  DSINFER_ASSIGN_OR_RETURN(float* H, ops.Get(Buf::kH, T * HD));  // [T, hc, D]
  DSINFER_RETURN_IF_ERROR(ops.Embed(c.hc_mult, H));
  StepContext ctx;
  if (c.V41()) {
    // Single-pass mHC (spec §14.4): layer 0's attention collapses H with the one-hot pre.
    DSINFER_RETURN_IF_ERROR(OneHotCarry(ops, T, ctx));
    // Engram's n-gram row ids, once per step for every Engram layer (spec §14.5).
    if (c.engram.enabled()) DSINFER_RETURN_IF_ERROR(ops.EngramBegin());
  }
  // dSpark's input (spec §14.6): the mean over the hc streams entering each target layer (after
  // its Engram), taken as the collapse with the uniform pre 1 / hc (a power of two: the same
  // rounding as a mean).
  const auto& targets = c.dspark.target_layer_ids;
  const bool capture = !req.hidden_rows.empty() && CheckDspark().ok();
  float* means = nullptr;    // [targets, T, D]
  float* uniform = nullptr;  // [T, hc]
  if (capture) {
    const auto n_targets = static_cast<int64_t>(targets.size());
    DSINFER_ASSIGN_OR_RETURN(means, ops.Get(Buf::kTargetMean, n_targets * T * D));
    DSINFER_ASSIGN_OR_RETURN(uniform, ops.Get(Buf::kUniformPre, T * c.hc_mult));
    const std::vector<float> pre(static_cast<size_t>(T * c.hc_mult), 1.0f / c.hc_mult);
    DSINFER_RETURN_IF_ERROR(ops.Upload(pre.data(), T * c.hc_mult, uniform));
  }
  for (int li = 0; li < c.n_layers; ++li) {
    const LayerPlan& plan = plans_[li];
    if (plan.engram >= 0) DSINFER_RETURN_IF_ERROR(Engram(ops, plan, T, H));
    if (capture)
      for (size_t k = 0; k < targets.size(); ++k)
        if (targets[k] == li)
          DSINFER_RETURN_IF_ERROR(ops.HcCollapse(H, T, uniform, c.hc_mult,
                                                 means + static_cast<int64_t>(k) * T * D));
    DSINFER_RETURN_IF_ERROR(Block(ops, plan, T, n_segments, H, ctx));
  }

  result->logits.clear();
  result->hidden.clear();
  const auto n_logits = static_cast<int64_t>(req.logit_rows.size());
  if (n_logits > 0) {
    DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kHeadIn, n_logits * HD));  // [n, hc, D]
    DSINFER_RETURN_IF_ERROR(ops.GatherRows(H, req.logit_rows, HD, rows));
    if (c.V41()) {
      // No hc_head: the last FFN's pre collapses the streams (spec §14.4).
      DSINFER_ASSIGN_OR_RETURN(float* pre, ops.Get(Buf::kHeadPre, n_logits * ctx.carry_stride));
      DSINFER_RETURN_IF_ERROR(ops.GatherRows(ctx.carry, req.logit_rows, ctx.carry_stride, pre));
      DSINFER_RETURN_IF_ERROR(
          Head(ops, -1, rows, n_logits, &result->logits, pre, ctx.carry_stride));
    } else {
      DSINFER_RETURN_IF_ERROR(Head(ops, -1, rows, n_logits, &result->logits));
    }
  }
  const auto n_hidden = static_cast<int64_t>(req.hidden_rows.size());
  if (n_hidden > 0 && capture) {
    // [n, targets, D] from each target's [T, D] rows.
    const auto n_targets = static_cast<int64_t>(targets.size());
    DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kHeadIn, n_hidden * D));  // [n, D]
    std::vector<float> host(static_cast<size_t>(n_hidden * D));                 // [n, D]
    result->hidden.resize(static_cast<size_t>(n_hidden * n_targets * D));
    for (int64_t k = 0; k < n_targets; ++k) {
      DSINFER_RETURN_IF_ERROR(ops.GatherRows(means + k * T * D, req.hidden_rows, D, rows));
      DSINFER_RETURN_IF_ERROR(ops.Download(rows, n_hidden * D, host.data()));
      for (int64_t r = 0; r < n_hidden; ++r)
        std::copy_n(host.begin() + r * D, D, result->hidden.begin() + (r * n_targets + k) * D);
    }
  } else if (n_hidden > 0) {
    DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kHeadIn, n_hidden * HD));  // [n, hc, D]
    DSINFER_RETURN_IF_ERROR(ops.GatherRows(H, req.hidden_rows, HD, rows));
    result->hidden.resize(static_cast<size_t>(n_hidden * HD));
    DSINFER_RETURN_IF_ERROR(ops.Download(rows, n_hidden * HD, result->hidden.data()));
  }
  return ops.Mark(Phase::kHead);
}

Status V4Forward::Mtp(V4Ops& ops, int mtp_index, const Segment& segment,
                      std::span<const int32_t> next, std::span<const float> hidden,
                      std::vector<float>* logits, bool last_row_logits,
                      std::vector<float>* last_hidden) const {
  const int64_t n = static_cast<int64_t>(next.size());
  std::vector<int64_t> logit_rows, stream_rows;
  if (logits != nullptr) {
    for (int64_t t = last_row_logits ? n - 1 : 0; t < n; ++t) logit_rows.push_back(t);
  }
  if (last_hidden != nullptr) stream_rows.push_back(n - 1);
  std::vector<float> unused;
  return MtpRows(ops, mtp_index, std::span<const Segment>(&segment, 1), next, hidden, logit_rows,
                 logits != nullptr ? logits : &unused, stream_rows,
                 last_hidden != nullptr ? last_hidden : &unused);
}

Status V4Forward::MtpRows(V4Ops& ops, int mtp_index, std::span<const Segment> segments,
                          std::span<const int32_t> next, std::span<const float> hidden,
                          std::span<const int64_t> logit_rows, std::vector<float>* logits,
                          std::span<const int64_t> stream_rows,
                          std::vector<float>* streams) const {
  const model::ModelConfig& c = config_;
  const LayerPlan& plan = plans_[c.n_layers + mtp_index];
  const int L = plan.layer;
  const int64_t n = static_cast<int64_t>(next.size());
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D;
  const int n_segments = static_cast<int>(segments.size());
  DSINFER_RETURN_IF_ERROR(ops.BeginStep(segments, next));
  // X = e_proj(enorm(embed(next))) + h_proj(hnorm(H)), broadcast over the streams (spec §8).
  DSINFER_ASSIGN_OR_RETURN(float* e, ops.Get(Buf::kMtpE, n * D));  // [n, D]
  DSINFER_RETURN_IF_ERROR(ops.Embed(1, e));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kE, e, n, D));
  DSINFER_ASSIGN_OR_RETURN(float* hn, ops.Get(Buf::kMtpHidden, n * HD));  // [n, hc, D]
  DSINFER_RETURN_IF_ERROR(ops.Upload(hidden.data(), n * HD, hn));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kH, hn, n * c.hc_mult, D));
  DSINFER_ASSIGN_OR_RETURN(float* ep, ops.Get(Buf::kY, n * D));  // [n, D]
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kEProj, LinearMode::kQuantized, e, n, ep));
  DSINFER_ASSIGN_OR_RETURN(float* X, ops.Get(Buf::kH, n * HD));  // [n, hc, D]
  DSINFER_RETURN_IF_ERROR(
      ops.Linear(L, Weight::kHProj, LinearMode::kQuantized, hn, n * c.hc_mult, X));
  DSINFER_RETURN_IF_ERROR(ops.AddToStreams(ep, X));
  StepContext ctx;
  DSINFER_RETURN_IF_ERROR(Block(ops, plan, n, n_segments, X, ctx));
  const auto n_streams = static_cast<int64_t>(stream_rows.size());
  if (n_streams > 0) {
    DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kHeadIn, n_streams * HD));  // [k, hc, D]
    DSINFER_RETURN_IF_ERROR(ops.GatherRows(X, stream_rows, HD, rows));
    streams->resize(static_cast<size_t>(n_streams * HD));
    DSINFER_RETURN_IF_ERROR(ops.Download(rows, n_streams * HD, streams->data()));
  }
  const auto n_logits = static_cast<int64_t>(logit_rows.size());
  if (n_logits == 0) return Status::Ok();
  DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kHeadIn, n_logits * HD));  // [k, hc, D]
  DSINFER_RETURN_IF_ERROR(ops.GatherRows(X, logit_rows, HD, rows));
  return Head(ops, L, rows, n_logits, logits, nullptr, 0, /*draft=*/true);
}

Status V4Forward::Head(V4Ops& ops, int layer, float* H, int64_t rows, std::vector<float>* logits,
                       const float* pre, int64_t pre_stride, bool draft) const {
  const model::ModelConfig& c = config_;
  DSINFER_ASSIGN_OR_RETURN(float* y, ops.Get(Buf::kHeadY, rows * c.hidden));  // [rows, D]
  if (pre != nullptr)
    DSINFER_RETURN_IF_ERROR(ops.HcCollapse(H, rows, pre, pre_stride, y));
  else
    DSINFER_RETURN_IF_ERROR(ops.HcHead(layer, H, rows, y));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(layer, Norm::kFinal, y, rows, c.hidden));
  return VocabularyProjection(ops, layer, Weight::kHead, y, rows,
                              draft ? ops.DraftVocabulary() : std::span<const int32_t>(),
                              -INFINITY, Buf::kLogits, logits);
}

Status V4Forward::VocabularyProjection(V4Ops& ops, int layer, Weight weight, const float* y,
                                       int64_t rows, std::span<const int32_t> ids, float fill,
                                       Buf buf, std::vector<float>* out) const {
  const int64_t V = config_.vocab_size;
  if (ids.empty()) {
    DSINFER_ASSIGN_OR_RETURN(float* d, ops.Get(buf, rows * V));  // [rows, V]
    DSINFER_RETURN_IF_ERROR(ops.Linear(layer, weight, LinearMode::kFp32, y, rows, d));
    out->resize(static_cast<size_t>(rows * V));
    return ops.Download(d, rows * V, out->data());
  }
  const auto S = static_cast<int64_t>(ids.size());
  const Weight rows_of = weight == Weight::kHead ? Weight::kDraftHead : Weight::kDraftMarkovHead;
  DSINFER_ASSIGN_OR_RETURN(float* d, ops.Get(buf, rows * S));  // [rows, S]
  DSINFER_RETURN_IF_ERROR(ops.Linear(layer, rows_of, LinearMode::kFp32, y, rows, d));
  std::vector<float> sub(static_cast<size_t>(rows * S));  // [rows, S]
  DSINFER_RETURN_IF_ERROR(ops.Download(d, rows * S, sub.data()));
  out->assign(static_cast<size_t>(rows * V), fill);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < S; ++i) (*out)[r * V + ids[i]] = sub[r * S + i];
  return Status::Ok();
}

Status V4Forward::Engram(V4Ops& ops, const LayerPlan& plan, int64_t T, float* H) const {
  const model::ModelConfig& c = config_;
  const int64_t R = c.engram.RowsPerToken(), KV = int64_t{c.hc_mult + 1} * c.hidden;
  DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kEngramRows, T * R * c.engram.head_dim));
  DSINFER_RETURN_IF_ERROR(ops.EngramGather(plan.layer, rows));           // [T, R * head_dim_e]
  DSINFER_ASSIGN_OR_RETURN(float* kv, ops.Get(Buf::kEngramKv, T * KV));  // [T, (hc + 1) * D]
  DSINFER_RETURN_IF_ERROR(
      ops.Linear(plan.layer, Weight::kEngramWkv, LinearMode::kQuantized, rows, T, kv));
  return ops.EngramGate(plan.layer, kv, H);
}

Status V4Forward::Block(V4Ops& ops, const LayerPlan& plan, int64_t T, int n_segments, float* H,
                        StepContext& ctx) const {
  const int64_t D = config_.hidden;
  const int L = plan.layer;
  DSINFER_ASSIGN_OR_RETURN(float* x, ops.Get(Buf::kX, T * D));             // [T, D]
  DSINFER_ASSIGN_OR_RETURN(float* y, ops.Get(Buf::kY, T * D));             // [T, D]
  DSINFER_ASSIGN_OR_RETURN(float* mix, ops.Get(Buf::kMix, T * MixFloats()));  // [T, mix]
  if (plan.single_pass_hc) {
    // V4.1 (spec §14.4): each sublayer computes its mix from the current streams and collapses
    // them with the pre carried from the previous sublayer, then passes its own pre on. (Engram,
    // §14.5, updated the streams before the block: Step.)
    DSINFER_ASSIGN_OR_RETURN(float* mix_ffn, ops.Get(Buf::kMixFfn, T * MixFloats()));  // [T, mix]
    DSINFER_RETURN_IF_ERROR(
        ops.HcPreCarried(L, HcSite::kAttn, H, ctx.carry, ctx.carry_stride, x, mix));
    DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kAttn, x, T, D));
    DSINFER_RETURN_IF_ERROR(Attention(ops, plan, T, n_segments, x, y, ctx));
    DSINFER_RETURN_IF_ERROR(ops.HcPost(mix, y, H));
    DSINFER_RETURN_IF_ERROR(ops.HcPreCarried(L, HcSite::kFfn, H, mix, MixFloats(), x, mix_ffn));
    DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kFfn, x, T, D));
    DSINFER_RETURN_IF_ERROR(ops.Route(L, plan.hash_routed, x));
    DSINFER_RETURN_IF_ERROR(ops.Experts(L, x, y));
    DSINFER_RETURN_IF_ERROR(ops.HcPost(mix_ffn, y, H));
    ctx.carry = mix_ffn;
    ctx.carry_stride = MixFloats();
    return ops.Mark(Phase::kMoe);
  }
  // Attention sub-layer (spec §3).
  DSINFER_RETURN_IF_ERROR(ops.HcPre(L, HcSite::kAttn, H, x, mix));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kAttn, x, T, D));
  DSINFER_RETURN_IF_ERROR(Attention(ops, plan, T, n_segments, x, y, ctx));
  DSINFER_RETURN_IF_ERROR(ops.HcPost(mix, y, H));
  // MoE sub-layer (spec §6).
  DSINFER_RETURN_IF_ERROR(ops.HcPre(L, HcSite::kFfn, H, x, mix));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kFfn, x, T, D));
  DSINFER_RETURN_IF_ERROR(ops.Route(L, plan.hash_routed, x));
  DSINFER_RETURN_IF_ERROR(ops.Experts(L, x, y));
  DSINFER_RETURN_IF_ERROR(ops.HcPost(mix, y, H));
  return ops.Mark(Phase::kMoe);
}

Status V4Forward::Compress(V4Ops& ops, const LayerPlan& plan, Compressor which, int64_t T,
                           int n_segments, const float* x) const {
  const model::ModelConfig& c = config_;
  const Numerics& nm = numerics_;
  const int L = plan.layer;
  const bool index = which == Compressor::kIndex;
  const int ratio = index ? plan.index_ratio : plan.compress_ratio;
  const int64_t width = index ? plan.index_compressor_width : plan.compressor_width;
  const int64_t d = index ? c.index_head_dim : c.head_dim;
  const bool gated = index || plan.compressor_gated;
  // a = wkv x, g = wgate x, in fp32 (spec §5.3); V4.1's ungated ratio-1 compressor: a = wkv x,
  // a bf16 linear, one row per token (§14.3).
  DSINFER_ASSIGN_OR_RETURN(float* a, ops.Get(Buf::kA, T * width));  // [T, width]
  const Weight wkv = index ? Weight::kIndexCompressorWkv : Weight::kCompressorWkv;
  const Weight wgate = index ? Weight::kIndexCompressorWgate : Weight::kCompressorWgate;
  DSINFER_RETURN_IF_ERROR(
      ops.Linear(L, wkv, gated ? LinearMode::kFp32 : LinearMode::kQuantized, x, T, a));
  float* g = nullptr;
  if (gated) {
    DSINFER_ASSIGN_OR_RETURN(g, ops.Get(Buf::kG, T * width));  // [T, width]
    DSINFER_RETURN_IF_ERROR(ops.Linear(L, wgate, LinearMode::kFp32, x, T, g));
  }
  // At most T / ratio rows complete, plus one per sequence whose open group the step finishes.
  DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kRows, (T / ratio + n_segments) * d));
  DSINFER_ASSIGN_OR_RETURN(CompressedRows done, ops.CompressorPool(L, which, a, g, rows));
  // V4.1 kv sources that are index sources key the indexer with their latent (norm, no RoPE).
  const bool keys_from_latent =
      !index && plan.stores_index_keys && plan.index_compressor_width == 0;
  float* latent = nullptr;
  if (done.n > 0) {
    // row = norm(bf16(row)); RoPE at the group's first position; then the stored format's
    // round trip: FP8 on the nope dims (V4 KV rows), FP4 with e4m3 scales per 16 (V4.1 KV
    // rows), Hadamard + FP4 (V4 indexer keys).
    if (nm.round_bf16) DSINFER_RETURN_IF_ERROR(ops.ScaleRound(rows, done.n * d, 1.0f));
    DSINFER_RETURN_IF_ERROR(
        ops.RmsNorm(L, index ? Norm::kIndexCompressor : Norm::kCompressor, rows, done.n, d));
    if (keys_from_latent) {
      DSINFER_ASSIGN_OR_RETURN(latent, ops.Get(Buf::kLatent, done.n * d));  // [n, head_dim]
      std::vector<int64_t> all(static_cast<size_t>(done.n));
      for (int64_t i = 0; i < done.n; ++i) all[i] = i;
      DSINFER_RETURN_IF_ERROR(ops.GatherRows(rows, all, d, latent));
    }
    DSINFER_RETURN_IF_ERROR(ops.RopeAt(L, rows, done.first_pos, d, d - c.rope_dim));
    if (index && nm.indexer_fp4) {
      if (plan.index_hadamard) DSINFER_RETURN_IF_ERROR(ops.Hadamard(rows, done.n, d));
      DSINFER_RETURN_IF_ERROR(ops.Fp4RoundTrip(rows, done.n, d, d, 32));
    } else if (!index && nm.kv_fp8_round_trip) {
      if (plan.compressed_quant == model::CompressedQuant::kFp4E4m3x16)
        DSINFER_RETURN_IF_ERROR(ops.Fp4E4m3RoundTrip(rows, done.n, d, d, 16));
      else
        DSINFER_RETURN_IF_ERROR(ops.Fp8RoundTrip(rows, done.n, c.NopeDim(), d, 64));
    }
  }
  DSINFER_RETURN_IF_ERROR(ops.StoreCompressed(L, which, done, rows));
  if (!keys_from_latent || done.n == 0) return Status::Ok();
  // Index keys (spec §14.3): k = FP4(RoPE(k_norm(wk(latent)))), wk a bf16 linear.
  const int64_t di = c.index_head_dim;
  DSINFER_ASSIGN_OR_RETURN(float* keys, ops.Get(Buf::kIndexKeys, done.n * di));  // [n, di]
  DSINFER_RETURN_IF_ERROR(
      ops.Linear(L, Weight::kIndexWk, LinearMode::kQuantized, latent, done.n, keys));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kIndexKey, keys, done.n, di));
  DSINFER_RETURN_IF_ERROR(ops.RopeAt(L, keys, done.first_pos, di, di - c.rope_dim));
  if (nm.indexer_fp4) DSINFER_RETURN_IF_ERROR(ops.Fp4RoundTrip(keys, done.n, di, di, 32));
  return ops.StoreCompressed(L, Compressor::kIndex, done, keys);
}

Result<Selection> V4Forward::Indexer(V4Ops& ops, const LayerPlan& plan, int64_t T, int n_segments,
                                     const float* x, const float* qr, StepContext& ctx) const {
  const model::ModelConfig& c = config_;
  const Numerics& nm = numerics_;
  const int L = plan.layer;
  const auto Q = LinearMode::kQuantized;
  const int64_t ih = c.index_n_heads, ihd = c.index_head_dim;
  DSINFER_ASSIGN_OR_RETURN(float* qi, ops.Get(Buf::kQi, T * ih * ihd));  // [T, ih, ihd]
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kIndexWqB, Q, qr, T, qi));
  DSINFER_RETURN_IF_ERROR(ops.Rope(L, qi, RopeRows::kIndexHeads, ihd, ihd - c.rope_dim, false));
  if (nm.indexer_fp4) {
    if (plan.index_hadamard) DSINFER_RETURN_IF_ERROR(ops.Hadamard(qi, T * ih, ihd));
    DSINFER_RETURN_IF_ERROR(ops.Fp4RoundTrip(qi, T * ih, ihd, ihd, 32));
  }
  DSINFER_ASSIGN_OR_RETURN(float* wts, ops.Get(Buf::kWts, T * ih));  // [T, ih]
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kIndexWeightsProj, Q, x, T, wts));
  const float wscale = 1.0f / std::sqrt(static_cast<float>(ihd) * static_cast<float>(ih));
  DSINFER_RETURN_IF_ERROR(ops.ScaleRound(wts, T * ih, wscale));
  // V4: the indexer's own overlapping compressor makes its keys.
  if (plan.stores_index_keys && plan.index_compressor_width > 0)
    DSINFER_RETURN_IF_ERROR(Compress(ops, plan, Compressor::kIndex, T, n_segments, x));
  DSINFER_RETURN_IF_ERROR(ops.Mark(Phase::kAttentionDense));
  IndexerQuery query;
  query.layer = L;
  query.key_layer = plan.index_key_layer;
  query.ratio = plan.index_ratio;
  query.qi = qi;
  query.wts = wts;
  if (plan.candidate_source || plan.candidate_masked) {
    query.candidate_block_size = c.candidate_block_size;
    query.candidate_topk_blocks = c.candidate_topk_blocks;
    if (plan.candidate_source) query.candidate_blocks_out = &ctx.candidates;
    if (plan.candidate_masked) query.candidate_blocks = &ctx.candidates;
  }
  return ops.IndexerSelect(query);
}

Status V4Forward::Attention(V4Ops& ops, const LayerPlan& plan, int64_t T, int n_segments,
                            const float* x, float* out, StepContext& ctx) const {
  const model::ModelConfig& c = config_;
  const int L = plan.layer;
  const int64_t H = c.n_heads, hd = c.head_dim, nope = c.NopeDim();
  const auto Q = LinearMode::kQuantized;

  // Query path (spec §5.1): c_q = q_norm(wq_a x); q = wq_b c_q; per-head RMS; RoPE.
  DSINFER_ASSIGN_OR_RETURN(float* qr, ops.Get(Buf::kQr, T * c.q_lora_rank));  // [T, q_lora]
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kWqA, Q, x, T, qr));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kQ, qr, T, c.q_lora_rank));
  DSINFER_ASSIGN_OR_RETURN(float* q, ops.Get(Buf::kQ, T * H * hd));  // [T, H, hd]
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kWqB, Q, qr, T, q));
  if (plan.q_head_rms_norm) DSINFER_RETURN_IF_ERROR(ops.HeadRmsNorm(q, T * H, hd));
  DSINFER_RETURN_IF_ERROR(ops.Rope(L, q, RopeRows::kHeads, hd, nope, false));

  DSINFER_ASSIGN_OR_RETURN(float* kv, ops.Get(Buf::kKv, T * hd));  // [T, hd]
  DSINFER_RETURN_IF_ERROR(WindowKv(ops, plan, T, x, kv));
  DSINFER_ASSIGN_OR_RETURN(float* o, ops.Get(Buf::kO, T * H * hd));  // [T, H, hd]
  if (plan.draft_block) {
    // dSpark (spec §14.6): the block's rows over the stage's ring and each other; nothing kept.
    DSINFER_RETURN_IF_ERROR(ops.DraftAttention(L, q, kv, o));
    DSINFER_RETURN_IF_ERROR(ops.Rope(L, o, RopeRows::kHeads, hd, nope, true));
    return OutputProjection(ops, plan, T, o, out);
  }

  // Compressed rows completed by this step become visible to its later queries.
  if (plan.owns_compressor)
    DSINFER_RETURN_IF_ERROR(Compress(ops, plan, Compressor::kKv, T, n_segments, x));

  // Lightning indexer (spec §5.4): queries, head weights, keys, the per-query selection. V4.1
  // layers without an indexer attend to the last published selection (spec §14.3).
  Selection selected;
  const Selection* attend = nullptr;
  if (plan.runs_indexer) {
    DSINFER_ASSIGN_OR_RETURN(selected, Indexer(ops, plan, T, n_segments, x, qr, ctx));
    attend = &selected;
  } else {
    DSINFER_RETURN_IF_ERROR(ops.Mark(Phase::kAttentionDense));
    if (plan.reuses_selection) attend = &ctx.published;
  }

  // Sparse attention with sink over window + compressed rows, de-rotated at the query position.
  DSINFER_RETURN_IF_ERROR(
      ops.SparseAttention(L, plan.kv_source, plan.compress_ratio, q, kv, attend, o));
  DSINFER_RETURN_IF_ERROR(ops.Rope(L, o, RopeRows::kHeads, hd, nope, true));
  DSINFER_RETURN_IF_ERROR(ops.StoreWindow(L, kv));
  if (plan.runs_indexer && plan.single_pass_hc) ctx.published = std::move(selected);
  DSINFER_RETURN_IF_ERROR(ops.Mark(Phase::kAttentionPerSequence));
  return OutputProjection(ops, plan, T, o, out);
}

Status V4Forward::OutputProjection(V4Ops& ops, const LayerPlan& plan, int64_t T, const float* o,
                                   float* out) const {
  // Output (spec §5.7): wo_a per group (bf16, no activation quantization), then wo_b.
  const model::ModelConfig& c = config_;
  const int L = plan.layer;
  DSINFER_ASSIGN_OR_RETURN(float* z, ops.Get(Buf::kZ, T * c.o_groups * c.o_lora_rank));
  DSINFER_RETURN_IF_ERROR(ops.OutputProjectionA(L, o, z));
  if (numerics_.round_bf16)
    DSINFER_RETURN_IF_ERROR(ops.ScaleRound(z, T * c.o_groups * c.o_lora_rank, 1.0f));
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kWoB, LinearMode::kQuantized, z, T, out));
  return ops.Mark(Phase::kAttentionDense);
}

Status V4Forward::WindowKv(V4Ops& ops, const LayerPlan& plan, int64_t T, const float* x,
                           float* kv) const {
  // Window KV (spec §5.2): kv_norm(wkv x), RoPE on the tail, FP8 round trip of the nope dims
  // (V4.1, §14.2: of all dims, in blocks of 32).
  const int L = plan.layer;
  const int64_t hd = config_.head_dim, nope = config_.NopeDim();
  DSINFER_RETURN_IF_ERROR(ops.Linear(L, Weight::kWkv, LinearMode::kQuantized, x, T, kv));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L, Norm::kKv, kv, T, hd));
  DSINFER_RETURN_IF_ERROR(ops.Rope(L, kv, RopeRows::kTokens, hd, nope, false));
  if (!numerics_.kv_fp8_round_trip) return Status::Ok();
  if (plan.window_quant == model::WindowQuant::kFp8All32)
    return ops.Fp8RoundTrip(kv, T, hd, hd, 32);
  return ops.Fp8RoundTrip(kv, T, nope, hd, 64);
}

Status V4Forward::DsparkSeed(V4Ops& ops, std::span<const Segment> segments,
                             std::span<const float> hidden, std::vector<float>* main_x) const {
  DSINFER_RETURN_IF_ERROR(CheckDspark());
  const model::ModelConfig& c = config_;
  const int64_t D = c.hidden, hd = c.head_dim, K = HiddenWidth();
  int64_t T = 0;
  for (const Segment& sg : segments) T += sg.n;
  if (T == 0 || static_cast<int64_t>(hidden.size()) != T * K)
    return InvalidArgument("DsparkSeed: hidden must be [n, targets * hidden] for the segments' " +
                           std::to_string(T) + " positions");
  // No token is read (the stages' input is the backbone's hidden state); BeginStep still wants
  // one id per row for the positions.
  const std::vector<int32_t> no_tokens(static_cast<size_t>(T), 0);
  DSINFER_RETURN_IF_ERROR(ops.BeginStep(segments, no_tokens));
  const int L0 = c.n_layers;
  DSINFER_ASSIGN_OR_RETURN(float* in, ops.Get(Buf::kDsparkIn, T * K));  // [T, targets * D]
  DSINFER_RETURN_IF_ERROR(ops.Upload(hidden.data(), T * K, in));
  DSINFER_ASSIGN_OR_RETURN(float* mx, ops.Get(Buf::kMainX, T * D));  // [T, D]
  DSINFER_RETURN_IF_ERROR(ops.Linear(L0, Weight::kMainProj, LinearMode::kQuantized, in, T, mx));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(L0, Norm::kMain, mx, T, D));
  if (main_x != nullptr) {
    main_x->resize(static_cast<size_t>(T * D));
    DSINFER_RETURN_IF_ERROR(ops.Download(mx, T * D, main_x->data()));
  }
  // Every stage keeps its own KV of the same main_x rows, at the backbone's positions.
  DSINFER_ASSIGN_OR_RETURN(float* kv, ops.Get(Buf::kKv, T * hd));  // [T, hd]
  for (int s = 0; s < c.n_mtp_layers; ++s) {
    const LayerPlan& plan = plans_[c.n_layers + s];
    DSINFER_RETURN_IF_ERROR(WindowKv(ops, plan, T, mx, kv));
    DSINFER_RETURN_IF_ERROR(ops.StoreWindow(plan.layer, kv));
  }
  return Status::Ok();
}

Status V4Forward::DsparkDraft(V4Ops& ops, std::span<const Segment> segments,
                              std::span<const int32_t> tokens, std::span<const int> n_logits,
                              std::vector<float>* logits, std::vector<float>* x) const {
  DSINFER_RETURN_IF_ERROR(CheckDspark());
  const model::ModelConfig& c = config_;
  const int64_t D = c.hidden, HD = int64_t{c.hc_mult} * D, V = c.vocab_size;
  const int B = c.dspark.block_size;
  const auto T = static_cast<int64_t>(tokens.size());
  if (!n_logits.empty() && n_logits.size() != segments.size())
    return InvalidArgument("DsparkDraft: one logits count per draft block");
  std::vector<int64_t> head_rows;  // the rows whose logits come back, segment after segment
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& sg = segments[i];
    if (sg.n != B)
      return InvalidArgument("DsparkDraft: a draft block has " + std::to_string(B) +
                             " rows, not " + std::to_string(sg.n));
    const int wanted = n_logits.empty() ? B : n_logits[i];
    if (wanted < 0 || wanted > B)
      return InvalidArgument("DsparkDraft: logits of " + std::to_string(wanted) + " rows of " +
                             std::to_string(B));
    for (int r = 0; r < wanted; ++r) head_rows.push_back(sg.row + r);
  }
  DSINFER_RETURN_IF_ERROR(CheckTokens(tokens).WithContext("DsparkDraft"));
  DSINFER_RETURN_IF_ERROR(ops.BeginStep(segments, tokens));
  // [token, noise...] embedded into every stream; single-pass mHC from the one-hot pre.
  DSINFER_ASSIGN_OR_RETURN(float* H, ops.Get(Buf::kH, T * HD));  // [T, hc, D]
  DSINFER_RETURN_IF_ERROR(ops.Embed(c.hc_mult, H));
  StepContext ctx;
  DSINFER_RETURN_IF_ERROR(OneHotCarry(ops, T, ctx));
  for (int s = 0; s < c.n_mtp_layers; ++s)
    DSINFER_RETURN_IF_ERROR(Block(ops, plans_[c.n_layers + s], T, static_cast<int>(segments.size()),
                                  H, ctx));
  // The head: the last stage's carried pre collapses the streams; its norm; the main vocabulary
  // projection. The collapsed rows (before the norm) also feed the confidence head.
  const int last = c.n_layers + c.n_mtp_layers - 1;
  DSINFER_ASSIGN_OR_RETURN(float* y, ops.Get(Buf::kHeadY, T * D));  // [T, D]
  DSINFER_RETURN_IF_ERROR(ops.HcCollapse(H, T, ctx.carry, ctx.carry_stride, y));
  x->resize(static_cast<size_t>(T * D));
  DSINFER_RETURN_IF_ERROR(ops.Download(y, T * D, x->data()));
  const auto R = static_cast<int64_t>(head_rows.size());
  logits->resize(static_cast<size_t>(R * V));
  if (R == 0) return Status::Ok();
  DSINFER_ASSIGN_OR_RETURN(float* rows, ops.Get(Buf::kHeadIn, R * D));  // [R, D]
  DSINFER_RETURN_IF_ERROR(ops.GatherRows(y, head_rows, D, rows));
  DSINFER_RETURN_IF_ERROR(ops.RmsNorm(last, Norm::kFinal, rows, R, D));
  // Over the draft vocabulary when one is set (-inf elsewhere: never proposed).
  return VocabularyProjection(ops, last, Weight::kHead, rows, R, ops.DraftVocabulary(), -INFINITY,
                              Buf::kLogits, logits);
}

Status V4Forward::DsparkMarkov(V4Ops& ops, std::span<const int32_t> prev,
                               std::span<const float> x, std::vector<float>* bias,
                               std::vector<float>* confidence) const {
  DSINFER_RETURN_IF_ERROR(CheckDspark());
  const model::ModelConfig& c = config_;
  const int64_t D = c.hidden, r = c.dspark.markov_rank;
  const auto R = static_cast<int64_t>(prev.size());
  if (R == 0 || static_cast<int64_t>(x.size()) != R * D)
    return InvalidArgument("DsparkMarkov: x must be [n, hidden] for n previous tokens");
  DSINFER_RETURN_IF_ERROR(CheckTokens(prev).WithContext("DsparkMarkov"));
  const int last = c.n_layers + c.n_mtp_layers - 1;
  // bias = markov_head (fp32) of the previous token's Markov embedding.
  DSINFER_ASSIGN_OR_RETURN(float* e, ops.Get(Buf::kMarkovEmbed, R * r));  // [R, rank]
  DSINFER_RETURN_IF_ERROR(ops.MarkovEmbed(last, prev, e));
  // With a draft vocabulary only its entries (0 elsewhere: the logits there are -inf anyway).
  DSINFER_RETURN_IF_ERROR(VocabularyProjection(ops, last, Weight::kMarkovHead, e, R,
                                               ops.DraftVocabulary(), 0.0f, Buf::kMarkovBias,
                                               bias));
  // confidence = proj (fp32) of [x, Markov embedding].
  std::vector<float> embed(static_cast<size_t>(R * r));  // [R, rank]
  DSINFER_RETURN_IF_ERROR(ops.Download(e, R * r, embed.data()));
  std::vector<float> joined(static_cast<size_t>(R * (D + r)));  // [R, D + rank]
  for (int64_t i = 0; i < R; ++i) {
    std::copy_n(x.begin() + i * D, D, joined.begin() + i * (D + r));
    std::copy_n(embed.begin() + i * r, r, joined.begin() + i * (D + r) + D);
  }
  DSINFER_ASSIGN_OR_RETURN(float* ci, ops.Get(Buf::kConfidenceIn, R * (D + r)));
  DSINFER_RETURN_IF_ERROR(ops.Upload(joined.data(), R * (D + r), ci));
  DSINFER_ASSIGN_OR_RETURN(float* co, ops.Get(Buf::kConfidence, R));  // [R, 1]
  DSINFER_RETURN_IF_ERROR(ops.Linear(last, Weight::kConfidence, LinearMode::kFp32, ci, R, co));
  confidence->resize(static_cast<size_t>(R));
  return ops.Download(co, R, confidence->data());
}

}  // namespace dsinfer::backend
