// Attention of one V4 layer (spec §5): query path, window KV, compressor (CSA/HCA), lightning
// indexer (CSA), sparse attention with sink, de-rotation and the grouped output projection.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace dsinfer::backend::cpu {

namespace {

using model::WeightMatrix;

// Linear with the reference's numerics: FP8 activation quantization (block 128) in front of
// FP8/FP4 weights, bf16 output.
void QuantLinear(const WeightMatrix& w, const float* x, int64_t m, float* y, const Numerics& nm,
                 ThreadPool& pool, int act_block) {
  bool quantized =
      w.format == model::WeightFormat::kFp8Block || w.format == model::WeightFormat::kFp4Packed;
  if (quantized && nm.quantize_activations) {
    std::vector<float> xq(x, x + m * w.cols);
    for (int64_t r = 0; r < m; ++r)
      Fp8RoundTripInPlace(xq.data() + r * w.cols, static_cast<int>(w.cols), act_block);
    MatMul(w, xq.data(), m, y, pool);
  } else {
    MatMul(w, x, m, y, pool);
  }
  if (nm.round_bf16) RoundBf16InPlace(y, m * w.rows);
}

// Feeds one token's projections into a compressor; when its group completes, writes the pooled
// row (width d, before norm/RoPE) to *row and returns true.
bool CompressorPush(CompressorState& st, int64_t pos, const float* a, const float* g, float* row) {
  const int r = st.ratio, w = st.width;
  const int slot = st.overlap ? r + static_cast<int>(pos % r) : static_cast<int>(pos % r);
  std::copy(a, a + w, st.kv.begin() + static_cast<int64_t>(slot) * w);
  std::copy(g, g + w, st.score.begin() + static_cast<int64_t>(slot) * w);
  if ((pos + 1) % r != 0) return false;
  const int d = st.overlap ? w / 2 : w;
  for (int c = 0; c < d; ++c) {
    // Candidates: overlap -> previous group's first half + current group's second half.
    float mx = -INFINITY;
    auto visit = [&](auto&& fn) {
      if (st.overlap) {
        for (int s = 0; s < r; ++s) fn(st.score[s * w + c], st.kv[s * w + c]);
        for (int s = r; s < 2 * r; ++s) fn(st.score[s * w + d + c], st.kv[s * w + d + c]);
      } else {
        for (int s = 0; s < r; ++s) fn(st.score[s * w + c], st.kv[s * w + c]);
      }
    };
    visit([&](float sc, float) { mx = std::max(mx, sc); });
    float sum = 0.0f, acc = 0.0f;
    visit([&](float sc, float kv) {
      float e = std::exp(sc - mx);  // -inf slots (no previous group) contribute 0
      sum += e;
      acc += e * kv;
    });
    row[c] = acc / sum;
  }
  if (st.overlap) {
    // The current group becomes the previous one; the new current group starts empty.
    std::copy(st.kv.begin() + static_cast<int64_t>(r) * w, st.kv.end(), st.kv.begin());
    std::copy(st.score.begin() + static_cast<int64_t>(r) * w, st.score.end(), st.score.begin());
    std::fill(st.score.begin() + static_cast<int64_t>(r) * w, st.score.end(), -INFINITY);
    std::fill(st.kv.begin() + static_cast<int64_t>(r) * w, st.kv.end(), 0.0f);
  } else {
    std::fill(st.score.begin(), st.score.end(), -INFINITY);
    std::fill(st.kv.begin(), st.kv.end(), 0.0f);
  }
  return true;
}

// Compressor projections for all rows of a step: a = wkv x, g = wgate x (fp32, no rounding).
void CompressorProject(const model::CompressorWeights& cw, int64_t T, const float* x,
                       ThreadPool& pool, std::vector<float>* a, std::vector<float>* g) {
  a->resize(T * cw.wkv.rows);
  g->resize(T * cw.wgate.rows);
  MatMul(cw.wkv, x, T, a->data(), pool);
  MatMul(cw.wgate, x, T, g->data(), pool);
}

// Feeds one segment's projections (rows [seg.row, seg.row + seg.n) of a and g) into its
// compressor, pooling completed groups; norm and RoPE at the group's first position, then
// `post` finishes each row (FP8 or Hadamard+FP4) before it is appended to rows_out.
template <typename PostFn>
void CompressorFeed(const model::CompressorWeights& cw, CompressorState& st,
                    const model::ModelConfig& c, const RopeTable& rope, const Segment& seg,
                    const std::vector<float>& a, const std::vector<float>& g, int d,
                    const Numerics& nm, std::vector<float>& rows_out, PostFn&& post) {
  const int w = st.width;
  std::vector<float> row(d), gt(w);
  for (int64_t t = 0; t < seg.n; ++t) {
    int64_t pos = seg.start_pos + t;
    const float* gsrc = g.data() + (seg.row + t) * w;
    int64_t ape_row = pos % st.ratio;
    for (int i = 0; i < w; ++i) gt[i] = gsrc[i] + cw.ape.F32At(ape_row * w + i);
    if (!CompressorPush(st, pos, a.data() + (seg.row + t) * w, gt.data(), row.data())) continue;
    if (nm.round_bf16) RoundBf16InPlace(row.data(), d);
    RmsNormRows(row.data(), 1, d, &cw.norm, c.norm_eps, nm.round_bf16);
    int64_t first_pos = pos + 1 - st.ratio;
    ApplyRope(rope, row.data() + d - c.rope_dim, first_pos, false, nm.round_bf16);
    post(row.data());
    rows_out.insert(rows_out.end(), row.begin(), row.end());
  }
}

// Top-k indices of scores (ties -> lower index first), returned ascending.
std::vector<int32_t> TopK(const std::vector<float>& scores, int k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

void CpuModel::Attention(const model::LayerWeights& lw, std::span<Segment> segments, int64_t T,
                         const float* x, float* out) {
  const model::ModelConfig& c = config();
  const Numerics& nm = numerics_;
  const int li = lw.layer_id;
  const RopeTable& rope = *rope_[li];
  const int H = c.n_heads, hd = c.head_dim, rd = c.rope_dim, nope = hd - rd;
  const int ratio = lw.compress_ratio;
  const float eps = static_cast<float>(c.norm_eps);
  const int W = c.window;
  // Absolute position of every row of the step.
  std::vector<int64_t> pos_of(T);
  std::vector<int32_t> seg_of(T);
  for (size_t si = 0; si < segments.size(); ++si)
    for (int64_t t = 0; t < segments[si].n; ++t) {
      pos_of[segments[si].row + t] = segments[si].start_pos + t;
      seg_of[segments[si].row + t] = static_cast<int32_t>(si);
    }

  // ---- query path: c_q = q_norm(wq_a x); q = wq_b c_q; per-head RMS (no weight); RoPE.
  std::vector<float> qr(T * c.q_lora_rank);  // [T, q_lora] also the indexer's input
  QuantLinear(lw.wq_a, x, T, qr.data(), nm, pool_, c.act_block);
  RmsNormRows(qr.data(), T, c.q_lora_rank, &lw.q_norm, c.norm_eps, nm.round_bf16);
  std::vector<float> q(T * H * hd);  // [T, H, hd]
  QuantLinear(lw.wq_b, qr.data(), T, q.data(), nm, pool_, c.act_block);
  pool_.ParallelFor(T, [&](int64_t t) {
    for (int h = 0; h < H; ++h) {
      float* qh = q.data() + (t * H + h) * hd;
      float ss = Dot(qh, qh, hd);
      float inv = 1.0f / std::sqrt(ss / hd + eps);
      if (nm.round_bf16) inv = RoundBf16(inv);
      for (int i = 0; i < hd; ++i) qh[i] = nm.round_bf16 ? RoundBf16(qh[i] * inv) : qh[i] * inv;
      ApplyRope(rope, qh + nope, pos_of[t], false, nm.round_bf16);
    }
  });

  // ---- window KV: kv_norm(wkv x), RoPE on the tail, FP8 round trip on the nope dims.
  std::vector<float> kv(T * hd);  // [T, hd]
  QuantLinear(lw.wkv, x, T, kv.data(), nm, pool_, c.act_block);
  RmsNormRows(kv.data(), T, hd, &lw.kv_norm, c.norm_eps, nm.round_bf16);
  for (int64_t t = 0; t < T; ++t) {
    float* row = kv.data() + t * hd;
    ApplyRope(rope, row + nope, pos_of[t], false, nm.round_bf16);
    if (nm.kv_fp8_round_trip) Fp8RoundTripInPlace(row, nope, 64);
  }
  // Window row of position p for segment si (p >= start_pos - (W - 1)): the step's own rows
  // from kv, earlier ones from the sequence's ring, which is rewritten only at the end of this
  // function. Pointers, not copies: gathering each sequence's window into a contiguous buffer
  // moved 4 MB per layer at batch 16 and context 128.
  auto window_row = [&](int si, int64_t p) -> const float* {
    const Segment& sg = segments[si];
    return p >= sg.start_pos ? kv.data() + (sg.row + p - sg.start_pos) * hd
                             : sg.layer->window_kv.data() + (p % W) * hd;
  };

  // ---- compressor: new compressed rows become visible to later queries of the same step.
  if (ratio > 0) {
    std::vector<float> a, g;
    CompressorProject(lw.compressor, T, x, pool_, &a, &g);
    for (auto& sg : segments)
      CompressorFeed(lw.compressor, sg.layer->compressor, c, rope, sg, a, g, hd, nm,
                     sg.layer->compressed, [&](float* row) {
                       if (nm.kv_fp8_round_trip) Fp8RoundTripInPlace(row, nope, 64);
                     });
  }

  // ---- indexer (CSA): per-query top-k of the visible compressed rows.
  std::vector<std::vector<int32_t>> selected(T);
  std::vector<int64_t> scored(T, 0);  // [T] compressed rows the indexer scored (past its top-k)
  if (ratio == 4) {
    const int ih = c.index_n_heads, ihd = c.index_head_dim;
    std::vector<float> qi(T * ih * ihd);  // [T, ih, ihd]
    QuantLinear(lw.indexer.wq_b, qr.data(), T, qi.data(), nm, pool_, c.act_block);
    for (int64_t t = 0; t < T; ++t) {
      for (int h = 0; h < ih; ++h) {
        float* v = qi.data() + (t * ih + h) * ihd;
        ApplyRope(rope, v + ihd - rd, pos_of[t], false, nm.round_bf16);
        if (nm.indexer_fp4) {
          HadamardInPlace(v, ihd, nm.round_bf16);
          Fp4RoundTripInPlace(v, ihd, 32);
        }
      }
    }
    std::vector<float> wts(T * ih);  // [T, ih]
    QuantLinear(lw.indexer.weights_proj, x, T, wts.data(), nm, pool_, c.act_block);
    const float wscale = 1.0f / std::sqrt(static_cast<float>(ihd) * ih);
    for (auto& v : wts) v = nm.round_bf16 ? RoundBf16(v * wscale) : v * wscale;
    std::vector<float> a, g;
    CompressorProject(lw.indexer.compressor, T, x, pool_, &a, &g);
    for (auto& sg : segments)
      CompressorFeed(lw.indexer.compressor, sg.layer->index_compressor, c, rope, sg, a, g, ihd, nm,
                     sg.layer->index_keys, [&](float* row) {
                       if (nm.indexer_fp4) {
                         HadamardInPlace(row, ihd, nm.round_bf16);
                         Fp4RoundTripInPlace(row, ihd, 32);
                       }
                     });
    pool_.ParallelFor(T, [&](int64_t t) {
      const LayerState& ls = *segments[seg_of[t]].layer;
      int n_vis = static_cast<int>((pos_of[t] + 1) / 4);
      if (n_vis <= c.index_topk) {
        selected[t].resize(n_vis);
        std::iota(selected[t].begin(), selected[t].end(), 0);
        return;
      }
      scored[t] = n_vis;
      // Every index head against every visible key, the heads in groups sharing each key's
      // loads (the same Dot per head and key), then each key's score summed over the heads in
      // order. Keys go in blocks so the [heads, keys] products stay small (64 KiB) at any length.
      constexpr int kKeyBlock = 256;
      std::vector<float> scores(n_vis);
      std::vector<const float*> keys(kKeyBlock);
      std::vector<float> dots(static_cast<int64_t>(ih) * kKeyBlock);  // [ih, block]
      for (int j0 = 0; j0 < n_vis; j0 += kKeyBlock) {
        const int nb = std::min(kKeyBlock, n_vis - j0);
        for (int j = 0; j < nb; ++j)
          keys[j] = ls.index_keys.data() + static_cast<int64_t>(j0 + j) * ihd;
        for (int h0 = 0; h0 < ih; h0 += kSharedRowsMax)
          DotSharedRows(qi.data() + (t * ih + h0) * ihd, ihd, std::min(kSharedRowsMax, ih - h0),
                        keys.data(), nb, ihd, dots.data() + static_cast<int64_t>(h0) * nb, nb);
        for (int j = 0; j < nb; ++j) {
          float s = 0.0f;
          for (int h = 0; h < ih; ++h) {
            float d = dots[static_cast<int64_t>(h) * nb + j];
            if (nm.round_bf16) d = RoundBf16(d);
            s += std::max(d, 0.0f) * wts[t * ih + h];
          }
          scores[j0 + j] = nm.round_bf16 ? RoundBf16(s) : s;
        }
      }
      selected[t] = TopK(scores, c.index_topk);
    });
  }

  // ---- sparse attention with sink over window + compressed rows. A task takes one token and up
  // to kSharedRowsMax of its heads: the heads attend to the same rows (one KV head), which are
  // loaded once for all of them; each head's arithmetic is the one-head sequence (Dot for the
  // scores, one FMA per row into its output), so grouping changes no value.
  std::vector<float> o(T * H * hd);  // [T, H, hd]
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<int64_t> visible(T);  // [T] rows each query attends to (written by the first task)
  const int head_groups = (H + kSharedRowsMax - 1) / kSharedRowsMax;
  pool_.ParallelFor(T * head_groups, [&](int64_t task) {
    const int64_t t = task / head_groups;
    const int h0 = static_cast<int>(task % head_groups) * kSharedRowsMax;
    const int nh = std::min(kSharedRowsMax, H - h0);
    const int64_t pos = pos_of[t];
    const int si = seg_of[t];
    const LayerState& ls = *segments[si].layer;
    std::vector<const float*> rows;
    for (int64_t p = std::max<int64_t>(0, pos - W + 1); p <= pos; ++p)
      rows.push_back(window_row(si, p));
    if (ratio == 4) {
      for (int32_t j : selected[t])
        rows.push_back(ls.compressed.data() + static_cast<int64_t>(j) * hd);
    } else if (ratio > 0) {
      int64_t n_vis = (pos + 1) / ratio;
      for (int64_t j = 0; j < n_vis; ++j) rows.push_back(ls.compressed.data() + j * hd);
    }
    const int64_t n_rows = static_cast<int64_t>(rows.size());
    if (h0 == 0) visible[t] = n_rows;
    const float* qt = q.data() + (t * H + h0) * hd;  // [nh, hd]
    std::vector<float> weights(nh * n_rows);         // [nh, rows] logits, then bf16 P
    DotSharedRows(qt, hd, nh, rows.data(), n_rows, hd, weights.data(), n_rows);
    std::vector<float> denom(nh);  // [nh]
    for (int j = 0; j < nh; ++j) {
      float* w = weights.data() + j * n_rows;
      const float sink = lw.attn_sink.F32At(h0 + j);
      float mx = sink;
      for (int64_t r = 0; r < n_rows; ++r) {
        w[r] *= scale;
        mx = std::max(mx, w[r]);
      }
      denom[j] = std::exp(sink - mx);
      for (int64_t r = 0; r < n_rows; ++r) {
        const float e = std::exp(w[r] - mx);
        denom[j] += e;
        w[r] = nm.round_bf16 ? RoundBf16(e) : e;  // P is cast to bf16 before P.V
      }
    }
    float* ot = o.data() + (t * H + h0) * hd;  // [nh, hd]
    AxpySharedRows(weights.data(), n_rows, nh, rows.data(), n_rows, hd, ot, hd);
    for (int j = 0; j < nh; ++j) {
      float* oh = ot + j * hd;
      const float inv = 1.0f / denom[j];
      for (int i = 0; i < hd; ++i) oh[i] = nm.round_bf16 ? RoundBf16(oh[i] * inv) : oh[i] * inv;
      ApplyRope(rope, oh + nope, pos, true, nm.round_bf16);  // de-rotate at the query position
    }
  });

  // ---- grouped output projection: wo_a per group (bf16, no act quant), then wo_b (FP8).
  const int G = c.o_groups;
  const int64_t group_in = static_cast<int64_t>(H / G) * hd;
  std::vector<float> z(T * G * c.o_lora_rank);  // [T, G * o_lora]
  std::vector<float> og(T * group_in), zg(T * c.o_lora_rank);
  for (int g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(o.data() + t * H * hd + g * group_in, group_in, og.data() + t * group_in);
    MatMulRows(lw.wo_a, static_cast<int64_t>(g) * c.o_lora_rank,
               static_cast<int64_t>(g + 1) * c.o_lora_rank, og.data(), T, zg.data(), pool_);
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(zg.data() + t * c.o_lora_rank, c.o_lora_rank,
                  z.data() + t * G * c.o_lora_rank + static_cast<int64_t>(g) * c.o_lora_rank);
  }
  if (nm.round_bf16) RoundBf16InPlace(z.data(), static_cast<int64_t>(z.size()));
  QuantLinear(lw.wo_b, z.data(), T, out, nm, pool_, c.act_block);

  // Multiply-adds: the projections (wo_a: each group's rows see the group's slice, so its rows
  // times its columns per token), then the scores and values over each query's visible rows.
  int64_t per_token = lw.wq_a.Elements() + lw.wq_b.Elements() + lw.wkv.Elements() +
                      lw.wo_a.Elements() + lw.wo_b.Elements();
  if (ratio > 0) per_token += lw.compressor.wkv.Elements() + lw.compressor.wgate.Elements();
  if (ratio == 4)
    per_token += lw.indexer.wq_b.Elements() + lw.indexer.weights_proj.Elements() +
                 lw.indexer.compressor.wkv.Elements() + lw.indexer.compressor.wgate.Elements();
  step_stats_.macs += T * per_token;
  for (int64_t t = 0; t < T; ++t)
    step_stats_.macs += visible[t] * H * int64_t{hd} * 2 +  // q . k and p . v
                        scored[t] * c.index_n_heads * int64_t{c.index_head_dim};

  for (const auto& sg : segments) {
    // The window rows the segment's queries see: the ring's from the oldest visible position on,
    // then the step's.
    const int64_t window_rows = std::min<int64_t>(sg.start_pos, W - 1) + sg.n;
    step_stats_.kv_bytes += static_cast<int64_t>(window_rows * hd + sg.layer->compressed.size() +
                                                 sg.layer->index_keys.size()) *
                            4;
  }

  // ---- keep the last `window` KV rows of each sequence for its next step.
  for (int64_t t = 0; t < T; ++t) {
    LayerState& ls = *segments[seg_of[t]].layer;
    std::copy_n(kv.data() + t * hd, hd, ls.window_kv.data() + (pos_of[t] % W) * hd);
  }
}

}  // namespace dsinfer::backend::cpu
