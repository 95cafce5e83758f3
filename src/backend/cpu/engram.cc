// The Engram ops of CpuOps (V4.1, spec §14.5): n-gram row ids of the step's tokens (with each
// sequence's previous token classes, kept in its state), the table rows read where the table
// lies (the real tables are ~101 GB each: only the 24 rows a token names are touched), and the
// gated update of the streams.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"

namespace dsinfer::backend::cpu {

Status CpuOps::EngramBegin() {
  const model::ModelConfig& c = config();
  if (!engram_hasher_) return Internal("EngramBegin: this model has no Engram layers");
  const model::EngramHasher& h = *engram_hasher_;
  const std::vector<int32_t>& class_of = weights_.engram_token_map;
  const int n = h.ngram(), R = h.rows_per_token();
  const auto T = static_cast<int64_t>(tokens_.size());
  const int32_t pad_class = class_of[c.engram.pad_id];
  engram_ids_.assign(static_cast<size_t>(h.n_layers()), std::vector<int64_t>(T * R));
  // tok[s]: the class s positions back: the step's own tokens, else the sequence's history,
  // else (before the sequence) the pad class. Text input has no dead positions.
  for (int64_t t = 0; t < T; ++t) {
    const Segment& sg = segments_[seg_of_[t]];
    const int64_t p = pos_of_[t];
    int64_t tok[8];
    for (int s = 0; s < n; ++s) {
      const int64_t q = p - s;
      tok[s] = q < 0               ? pad_class
               : q >= sg.start_pos ? class_of[tokens_[t - s]]
                                   : State(seg_of_[t]).TokenClass(q);
    }
    for (int j = 0; j < h.n_layers(); ++j) h.RowIds(j, tok, engram_ids_[j].data() + t * R);
  }
  // The step's classes for the next steps' n-grams (after all reads: a long step's later
  // positions may share ring slots with the history it read).
  for (int64_t t = 0; t < T; ++t) State(seg_of_[t]).SetTokenClass(pos_of_[t], class_of[tokens_[t]]);
  return Status::Ok();
}

Status CpuOps::EngramGather(int layer, float* rows) {
  const model::EngramConfig& e = config().engram;
  const int j = plans_[layer].engram;
  if (j < 0 || j >= static_cast<int>(engram_ids_.size()))
    return Internal("EngramGather: layer " + std::to_string(layer) + " has no Engram row ids");
  const model::EngramWeights& ew = Layer(layer).engram;
  const int R = e.RowsPerToken(), hd = e.head_dim, per_scale = 32;
  const auto T = static_cast<int64_t>(tokens_.size());
  const std::vector<int64_t>& ids = engram_ids_[j];
  for (int64_t i = 0; i < T * R; ++i) {
    const uint8_t* codes = ew.table.data + ids[i] * hd;
    const uint8_t* scales = ew.table_scale.data + ids[i] * (hd / per_scale);
    float* out = rows + i * hd;
    for (int b = 0; b < hd / per_scale; ++b) {
      // The table is never scanned at load (it is the size of the disk): a NaN code or scale is
      // found here, on the row that holds it, and fails the step.
      if (scales[b] == 0xff)
        return InvalidArgument("Engram table of layer " + std::to_string(layer) + ", row " +
                               std::to_string(ids[i]) + ": NaN e8m0 scale");
      const float s = E8M0ToF32(scales[b]);
      for (int k = 0; k < per_scale; ++k) {
        const uint8_t code = codes[b * per_scale + k];
        if ((code & 0x7f) == 0x7f)
          return InvalidArgument("Engram table of layer " + std::to_string(layer) + ", row " +
                                 std::to_string(ids[i]) + ": NaN e4m3 code");
        out[b * per_scale + k] = E4M3ToF32(code) * s;
      }
    }
  }
  stats_.engram_bytes += T * R * (hd + hd / per_scale);
  return Status::Ok();
}

Status CpuOps::EngramGate(int layer, const float* kv, float* H) {
  const model::ModelConfig& c = config();
  const model::EngramWeights& ew = Layer(layer).engram;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden, HD = int64_t{hc} * D, KV = int64_t{hc + 1} * D;
  const float eps = static_cast<float>(c.norm_eps);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  const bool rb = numerics_.round_bf16;
  // q_weight[j] * k_weight[j], per stream: [hc, D].
  std::vector<float> qk(static_cast<size_t>(HD));
  for (int64_t i = 0; i < HD; ++i) qk[i] = ew.q_weight.F32At(i) * ew.k_weight.F32At(i);
  pool_.ParallelFor(static_cast<int64_t>(tokens_.size()) * hc, [&](int64_t task) {
    const int64_t t = task / hc;
    const int j = static_cast<int>(task % hc);
    float* h = H + t * HD + j * D;
    const float* key = kv + t * KV + j * D;
    const float* value = kv + t * KV + hc * D;
    const float* w = qk.data() + j * D;
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += h[d] * w[d] * key[d];
    const float rstd = 1.0f / std::sqrt(Dot(h, h, D) / static_cast<float>(D) + eps) *
                       (1.0f / std::sqrt(Dot(key, key, D) / static_cast<float>(D) + eps));
    dot = dot * rstd * inv_sqrt_d;
    const float mag = std::sqrt(std::max(std::fabs(dot), 1e-6f));
    const float gate = Sigmoid(dot > 0.0f ? mag : dot < 0.0f ? -mag : 0.0f);
    for (int64_t d = 0; d < D; ++d) {
      const float v = h[d] + gate * value[d];
      h[d] = rb ? RoundBf16(v) : v;
    }
  });
  return Status::Ok();
}

}  // namespace dsinfer::backend::cpu
