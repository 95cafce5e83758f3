#include "backend/cpu/cpu_model.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace dsinfer::backend::cpu {

CpuModel::CpuModel(const model::ModelWeights& weights, Numerics numerics, ThreadPool& pool)
    : weights_(weights), numerics_(numerics), pool_(pool) {}

CpuModel::~CpuModel() = default;

Result<std::unique_ptr<CpuModel>> CpuModel::Create(const model::ModelWeights& weights,
                                                   Numerics numerics, ThreadPool& pool) {
  auto m = std::unique_ptr<CpuModel>(new CpuModel(weights, numerics, pool));
  const auto& c = weights.config();
  for (int li = 0; li < c.n_layers + c.n_mtp_layers; ++li)
    m->rope_.push_back(std::make_unique<RopeTable>(RopeTable::ForLayer(c, li)));
  return m;
}

namespace {

void InitLayerState(const model::ModelConfig& c, int li, LayerState& ls) {
  ls.window_kv.assign(static_cast<size_t>(c.window) * c.head_dim, 0.0f);
  ls.compressed.clear();
  ls.index_keys.clear();
  int r = c.CompressRatio(li);
  if (r > 0) ls.compressor.Init(r, (r == 4 ? 2 : 1) * c.head_dim, r == 4);
  if (r == 4) ls.index_compressor.Init(4, 2 * c.index_head_dim, true);
}

}  // namespace

void CpuModel::Reset(SequenceState& s) const {
  const auto& c = config();
  s.n_tokens = 0;
  s.mtp_n_tokens = 0;
  s.layers.resize(c.n_layers);
  s.mtp.resize(c.n_mtp_layers);
  for (int li = 0; li < c.n_layers; ++li) InitLayerState(c, li, s.layers[li]);
  for (int k = 0; k < c.n_mtp_layers; ++k) InitLayerState(c, c.n_layers + k, s.mtp[k]);
  s.last_hidden.clear();
  s.last_token = -1;
}

int64_t CpuModel::StateBytes(const SequenceState& s) const {
  auto layer_bytes = [](const LayerState& l) {
    return static_cast<int64_t>(l.window_kv.size() + l.compressed.size() + l.index_keys.size() +
                                l.compressor.kv.size() + l.compressor.score.size() +
                                l.index_compressor.kv.size() + l.index_compressor.score.size()) *
           4;
  };
  int64_t total =
      static_cast<int64_t>(s.last_hidden.size()) * 4 + static_cast<int64_t>(sizeof(SequenceState));
  for (const auto& l : s.layers) total += layer_bytes(l);
  for (const auto& l : s.mtp) total += layer_bytes(l);
  return total;
}

int64_t CpuModel::StateBytesAt(int64_t n_tokens) const {
  const auto& c = config();
  int64_t total = static_cast<int64_t>(sizeof(SequenceState)) + int64_t{c.hc_mult} * c.hidden * 4;
  for (int li = 0; li < c.n_layers + c.n_mtp_layers; ++li) {
    total += int64_t{c.window} * c.head_dim * 4;
    int r = c.CompressRatio(li);
    if (r == 0) continue;
    int64_t coff = r == 4 ? 2 : 1;
    total += 2 * (coff * r) * coff * c.head_dim * 4;  // compressor kv + score slots
    total += (n_tokens / r) * c.head_dim * 4;         // compressed rows
    if (r == 4) {
      total += 2 * 8 * 2 * int64_t{c.index_head_dim} * 4;
      total += (n_tokens / 4) * c.index_head_dim * 4;
    }
  }
  return total;
}

std::unique_ptr<SequenceState> CpuModel::NewSequence() const {
  auto s = std::make_unique<SequenceState>();
  Reset(*s);
  return s;
}

void CpuModel::Block(const model::LayerWeights& lw, std::span<Segment> segments,
                     std::span<const int32_t> tokens, std::vector<float>& H) {
  const auto& c = config();
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t D = c.hidden, HD = static_cast<int64_t>(c.hc_mult) * D;
  const bool rb = numerics_.round_bf16;
  std::vector<float> x(T * D), y(T * D);  // [T, D]
  std::vector<HcMix> mix(T);
  // Attention sub-layer.
  pool_.ParallelFor(T, [&](int64_t t) {
    HcPre(c, lw.hc_attn, H.data() + t * HD, x.data() + t * D, &mix[t], rb);
  });
  RmsNormRows(x.data(), T, D, &lw.attn_norm, c.norm_eps, rb);
  Attention(lw, segments, T, x.data(), y.data());
  pool_.ParallelFor(T,
                    [&](int64_t t) { HcPost(c, mix[t], y.data() + t * D, H.data() + t * HD, rb); });
  // MoE sub-layer.
  pool_.ParallelFor(
      T, [&](int64_t t) { HcPre(c, lw.hc_ffn, H.data() + t * HD, x.data() + t * D, &mix[t], rb); });
  RmsNormRows(x.data(), T, D, &lw.ffn_norm, c.norm_eps, rb);
  Moe(lw, tokens, x.data(), y.data());
  pool_.ParallelFor(T,
                    [&](int64_t t) { HcPost(c, mix[t], y.data() + t * D, H.data() + t * HD, rb); });
}

void CpuModel::Logits(const float* H, int64_t T, const model::HcParams& hc_head,
                      const model::TensorView& norm, float* logits) {
  const auto& c = config();
  const int64_t D = c.hidden, HD = static_cast<int64_t>(c.hc_mult) * D;
  std::vector<float> y(T * D);
  for (int64_t t = 0; t < T; ++t)
    HcHead(c, hc_head, H + t * HD, y.data() + t * D, numerics_.round_bf16);
  RmsNormRows(y.data(), T, D, &norm, c.norm_eps, numerics_.round_bf16);
  MatMul(weights_.head, y.data(), T, logits, pool_);  // fp32 head
  step_stats_.macs += T * weights_.head.Elements();
}

Status CpuModel::Forward(SequenceState& state, std::span<const int32_t> tokens,
                         const ForwardOptions& options, ForwardOutput* out) {
  SequenceChunk chunk{&state, tokens, options, out};
  return ForwardBatch(std::span<SequenceChunk>(&chunk, 1));
}

Status CpuModel::ForwardBatch(std::span<SequenceChunk> chunks) {
  const auto& c = config();
  // Validate everything before touching any state: a bad chunk fails the step and loses nothing.
  int64_t T = 0;
  for (const auto& ch : chunks) {
    if (ch.state == nullptr || ch.out == nullptr)
      return InvalidArgument("ForwardBatch: chunk without state/output");
    if (ch.tokens.empty()) return InvalidArgument("Forward: empty token chunk");
    if (ch.state->layers.size() != static_cast<size_t>(c.n_layers))
      return FailedPrecondition("sequence state not initialised");
    for (int32_t tok : ch.tokens)
      if (tok < 0 || tok >= c.vocab_size)
        return InvalidArgument("token id " + std::to_string(tok) + " outside the vocabulary [0, " +
                               std::to_string(c.vocab_size) + ")");
    for (const auto& other : chunks)
      if (&other != &ch && other.state == ch.state)
        return InvalidArgument("ForwardBatch: a sequence appears twice");
    T += static_cast<int64_t>(ch.tokens.size());
  }
  const int64_t D = c.hidden, HD = static_cast<int64_t>(c.hc_mult) * D;
  step_stats_ = {};
  std::vector<int32_t> tokens;  // [T] flattened
  tokens.reserve(T);
  for (const auto& ch : chunks) tokens.insert(tokens.end(), ch.tokens.begin(), ch.tokens.end());

  // Embedding, copied into every stream.
  std::vector<float> H(T * HD);  // [T, hc, D]
  pool_.ParallelFor(T, [&](int64_t t) {
    const uint8_t* row = weights_.embed.data + static_cast<int64_t>(tokens[t]) * D * 2;
    for (int64_t i = 0; i < D; ++i) {
      uint16_t b;
      std::memcpy(&b, row + 2 * i, 2);
      float v = Bf16ToF32(b);
      for (int k = 0; k < c.hc_mult; ++k) H[t * HD + k * D + i] = v;
    }
  });
  std::vector<Segment> segments(chunks.size());
  for (int li = 0; li < c.n_layers; ++li) {
    int64_t row = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      segments[i] = {row, static_cast<int64_t>(chunks[i].tokens.size()), chunks[i].state->n_tokens,
                     &chunks[i].state->layers[li]};
      row += segments[i].n;
    }
    Block(weights_.layers[li], segments, tokens, H);
  }

  // Head: only the positions each sequence asked for.
  std::vector<int64_t> head_rows;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!chunks[i].options.want_logits) continue;
    int64_t first = chunks[i].options.all_logits ? 0 : segments[i].n - 1;
    for (int64_t t = first; t < segments[i].n; ++t) head_rows.push_back(segments[i].row + t);
  }
  std::vector<float> Hsel(head_rows.size() * HD);
  for (size_t r = 0; r < head_rows.size(); ++r)
    std::copy_n(H.data() + head_rows[r] * HD, HD, Hsel.data() + r * HD);
  std::vector<float> logits(head_rows.size() * c.vocab_size);
  Logits(Hsel.data(), static_cast<int64_t>(head_rows.size()), weights_.hc_head, weights_.norm,
         logits.data());

  size_t r = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto& ch = chunks[i];
    const Segment& sg = segments[i];
    int64_t n_out = !ch.options.want_logits ? 0 : ch.options.all_logits ? sg.n : 1;
    ch.out->logits.assign(logits.begin() + r * c.vocab_size,
                          logits.begin() + (r + n_out) * c.vocab_size);
    r += n_out;
    if (ch.options.want_hidden)
      ch.out->hidden.assign(H.begin() + sg.row * HD, H.begin() + (sg.row + sg.n) * HD);
    ch.state->last_hidden.assign(H.begin() + (sg.row + sg.n - 1) * HD,
                                 H.begin() + (sg.row + sg.n) * HD);
    ch.state->last_token = ch.tokens.back();
    ch.state->n_tokens += sg.n;
  }
  return Status::Ok();
}

Status CpuModel::ForwardMtp(SequenceState& state, std::span<const float> hidden,
                            std::span<const int32_t> next_tokens, std::vector<float>* logits) {
  const auto& c = config();
  if (c.n_mtp_layers == 0) return FailedPrecondition("this checkpoint has no MTP block");
  const int64_t n = static_cast<int64_t>(next_tokens.size());
  const int64_t D = c.hidden, HD = static_cast<int64_t>(c.hc_mult) * D;
  if (n == 0 || static_cast<int64_t>(hidden.size()) != n * HD)
    return InvalidArgument("ForwardMtp: hidden must be [n, hc_mult, hidden] for n next tokens");
  for (int32_t tok : next_tokens)
    if (tok < 0 || tok >= c.vocab_size)
      return InvalidArgument("ForwardMtp: token id outside the vocabulary");
  const model::LayerWeights& lw = weights_.layers[c.n_layers];
  const bool rb = numerics_.round_bf16;

  std::vector<float> e(n * D);  // [n, D] enorm(embed(next token))
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = weights_.embed.data + static_cast<int64_t>(next_tokens[t]) * D * 2;
    for (int64_t i = 0; i < D; ++i) {
      uint16_t b;
      std::memcpy(&b, row + 2 * i, 2);
      e[t * D + i] = Bf16ToF32(b);
    }
  }
  RmsNormRows(e.data(), n, D, &lw.enorm, c.norm_eps, rb);
  std::vector<float> hn(hidden.begin(), hidden.end());  // [n * hc, D] hnorm per stream
  RmsNormRows(hn.data(), n * c.hc_mult, D, &lw.hnorm, c.norm_eps, rb);
  auto linear = [&](const model::WeightMatrix& w, std::vector<float> in, int64_t m, float* y) {
    if (numerics_.quantize_activations)
      for (int64_t r = 0; r < m; ++r)
        Fp8RoundTripInPlace(in.data() + r * D, static_cast<int>(D), c.act_block);
    MatMul(w, in.data(), m, y, pool_);
    if (rb) RoundBf16InPlace(y, m * w.rows);
  };
  std::vector<float> ep(n * D), hp(n * HD);
  linear(lw.e_proj, e, n, ep.data());
  linear(lw.h_proj, hn, n * c.hc_mult, hp.data());
  std::vector<float> X(n * HD);  // [n, hc, D]
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < c.hc_mult; ++k)
      for (int64_t i = 0; i < D; ++i) {
        float v = ep[t * D + i] + hp[t * HD + k * D + i];
        X[t * HD + k * D + i] = rb ? RoundBf16(v) : v;
      }
  Segment seg{0, n, state.mtp_n_tokens, &state.mtp[0]};
  Block(lw, std::span<Segment>(&seg, 1), next_tokens, X);
  logits->resize(n * c.vocab_size);
  Logits(X.data(), n, lw.hc_head, lw.norm, logits->data());
  state.mtp_n_tokens += n;
  return Status::Ok();
}

}  // namespace dsinfer::backend::cpu
