// The attention ops of CpuOps that read or write sequence state (spec §5.3-5.6): compressor
// pooling and storage, the lightning indexer's selection, sparse attention with sink over the
// window ring and the compressed rows, the window store. Packed rows are unpacked once per
// sequence and step into scratch, then read in place.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear.h"
#include "core/dtype.h"

namespace dsinfer::backend::cpu {

// ---- attention kernels ------------------------------------------------------------------------

void PoolGroup(std::span<const float* const> rows, int ratio, int width, bool overlap,
               float* out) {
  const int d = overlap ? width / 2 : width;
  const int n = static_cast<int>(rows.size());
  for (int c = 0; c < d; ++c) {
    // Candidate s: its gate logit and value in channel c (the previous group's first half, then
    // the group's own second half, when overlapping). Absent candidates: -inf and 0.
    auto candidate = [&](int s, float* score, float* value) {
      const float* r = rows[s];
      if (r == nullptr) {
        *score = -INFINITY, *value = 0.0f;
        return;
      }
      const int dim = overlap && s >= ratio ? d + c : c;
      *value = r[dim];
      *score = r[width + dim];
    };
    float mx = -INFINITY, sc, kv;
    for (int s = 0; s < n; ++s) {
      candidate(s, &sc, &kv);
      mx = std::max(mx, sc);
    }
    float sum = 0.0f, acc = 0.0f;
    for (int s = 0; s < n; ++s) {
      candidate(s, &sc, &kv);
      const float e = std::exp(sc - mx);  // -inf candidates contribute 0
      sum += e;
      acc += e * kv;
    }
    out[c] = acc / sum;
  }
}

void IndexerScores(const float* q, const float* w, std::span<const float* const> keys, int heads,
                   int head_dim, bool round_bf16, float* scores, bool round_terms) {
  // Every head against every key, heads in groups sharing each key's loads (the same Dot per
  // head and key), then each key's score summed over the heads in order. Keys go in blocks so
  // the [heads, keys] products stay small (64 KiB) at any length.
  constexpr int kKeyBlock = 256;
  const int n_keys = static_cast<int>(keys.size());
  std::vector<float> dots(static_cast<size_t>(heads) * kKeyBlock);  // [heads, block]
  for (int j0 = 0; j0 < n_keys; j0 += kKeyBlock) {
    const int nb = std::min(kKeyBlock, n_keys - j0);
    for (int h0 = 0; h0 < heads; h0 += kSharedRowsMax)
      DotSharedRows(q + int64_t{h0} * head_dim, head_dim, std::min(kSharedRowsMax, heads - h0),
                    keys.data() + j0, nb, head_dim, dots.data() + int64_t{h0} * nb, nb);
    for (int j = 0; j < nb; ++j) {
      float s = 0.0f;
      for (int h = 0; h < heads; ++h) {
        float dv = dots[int64_t{h} * nb + j];
        if (round_bf16) dv = RoundBf16(dv);
        const float term = std::max(dv, 0.0f) * w[h];
        s += round_bf16 && round_terms ? RoundBf16(term) : term;
      }
      scores[j0 + j] = round_bf16 ? RoundBf16(s) : s;
    }
  }
}

std::vector<int32_t> TopK(std::span<const float> scores, int k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::clamp<int>(k, 0, static_cast<int>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void AttendHeads(const float* q, int n_heads, std::span<const float* const> rows, int head_dim,
                 const float* sink, float scale, bool round_bf16, float* o,
                 bool max_over_rows_only) {
  // The heads attend to the same rows (one KV head), loaded once for all of them; each head's
  // arithmetic is the one-head sequence (Dot for the scores, one FMA per row into its output).
  const auto n_rows = static_cast<int64_t>(rows.size());
  std::vector<float> weights(static_cast<size_t>(n_heads * n_rows));  // [heads, rows] logits, P
  DotSharedRows(q, head_dim, n_heads, rows.data(), n_rows, head_dim, weights.data(), n_rows);
  std::vector<float> denom(static_cast<size_t>(n_heads));  // [heads]
  for (int j = 0; j < n_heads; ++j) {
    float* w = weights.data() + j * n_rows;
    float mx = max_over_rows_only && n_rows > 0 ? -INFINITY : sink[j];
    for (int64_t r = 0; r < n_rows; ++r) {
      w[r] *= scale;
      mx = std::max(mx, w[r]);
    }
    denom[j] = std::exp(sink[j] - mx);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float e = std::exp(w[r] - mx);
      denom[j] += e;
      w[r] = round_bf16 ? RoundBf16(e) : e;  // P is cast to bf16 before P.V
    }
  }
  AxpySharedRows(weights.data(), n_rows, n_heads, rows.data(), n_rows, head_dim, o, head_dim);
  for (int j = 0; j < n_heads; ++j) {
    float* oh = o + int64_t{j} * head_dim;
    const float inv = 1.0f / denom[j];
    for (int i = 0; i < head_dim; ++i) oh[i] = round_bf16 ? RoundBf16(oh[i] * inv) : oh[i] * inv;
  }
}

// ---- state ops ------------------------------------------------------------------------------

Result<CompressedRows> CpuOps::CompressorPool(int layer, Compressor which, const float* a,
                                              const float* g, float* rows_out) {
  const model::LayerPlan& plan = plans_[layer];
  const bool index = which == Compressor::kIndex;
  const model::CompressorWeights& cw = index ? Layer(layer).indexer.compressor
                                             : Layer(layer).compressor;
  const int r = index ? plan.index_ratio : plan.compress_ratio;
  const int w = index ? plan.index_compressor_width : plan.compressor_width;
  const bool overlap = index || plan.compressor_overlap;
  const int d = overlap ? w / 2 : w;
  CompressedRows done;
  done.per_segment.assign(segments_.size(), 0);
  if (g == nullptr) {
    // No gate (V4.1 ratio 1): every token completes its own row, a itself.
    if (index || plan.compressor_gated)
      return Internal("layer " + std::to_string(layer) + ": a gated compressor without gates");
    for (size_t si = 0; si < segments_.size(); ++si) {
      const Segment& sg = segments_[si];
      for (int64_t t = 0; t < sg.n; ++t) {
        const int64_t pos = sg.start_pos + t;
        if ((pos + 1) % r != 0) continue;
        std::copy_n(a + (sg.row + t) * w, w, rows_out + done.n * d);
        done.first_pos.push_back(pos + 1 - r);
        ++done.per_segment[si];
        ++done.n;
      }
    }
    return done;
  }
  std::vector<const float*> cand(static_cast<size_t>(overlap ? 2 * r : r));
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    SequenceState& st = State(si);
    for (int64_t t = 0; t < sg.n; ++t) {
      // History row of this position: a, then g + ape of its offset in the group (V4.1: no ape).
      const int64_t pos = sg.start_pos + t;
      float* h = st.History(layer, index, pos);
      std::copy_n(a + (sg.row + t) * w, w, h);
      const float* gsrc = g + (sg.row + t) * w;
      const int64_t ape_row = pos % r;
      if (cw.ape.valid()) {
        for (int i = 0; i < w; ++i) h[w + i] = gsrc[i] + cw.ape.F32At(ape_row * w + i);
      } else {
        std::copy_n(gsrc, w, h + w);
      }
      if ((pos + 1) % r != 0) continue;
      // The group completes: pool it from its candidates' history rows.
      const int64_t first = pos + 1 - r;
      const int64_t from = overlap ? first - r : first;
      for (int64_t p = from; p <= pos; ++p)
        cand[p - from] = p < 0 ? nullptr : st.History(layer, index, p);
      PoolGroup(cand, r, w, overlap, rows_out + done.n * d);
      done.first_pos.push_back(first);
      ++done.per_segment[si];
      ++done.n;
    }
  }
  return done;
}

Status CpuOps::StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                               const float* data) {
  const model::LayerPlan& plan = plans_[layer];
  const bool index = which == Compressor::kIndex;
  const int r = index ? plan.index_ratio : plan.compress_ratio;
  const int64_t d = index ? config().index_head_dim : config().head_dim;
  int64_t k = 0;
  for (size_t si = 0; si < segments_.size(); ++si)
    for (int64_t i = 0; i < rows.per_segment[si]; ++i, ++k)
      DSINFER_RETURN_IF_ERROR(State(si).WriteRow(layer, index, rows.first_pos[k] / r, data + k * d));
  return Status::Ok();
}

namespace {

// The candidate blocks of one query (spec §14.3, level one): block b holds rows
// [b * size, (b + 1) * size) of the n_vis visible ones; its score is its rows' highest; the block
// holding the newest row is pinned; the `keep` best blocks (ties: the lower block), ascending.
// Every visible block is reachable, the pinned one included, so min(keep, n_blocks) are kept
// (NUMERICS.md row 17); callers skip the scoring where all of them fit.
std::vector<int32_t> CandidateBlocks(std::span<const float> scores, int size, int keep) {
  const int64_t n_vis = static_cast<int64_t>(scores.size());
  const int n_blocks = static_cast<int>((n_vis + size - 1) / size);
  keep = std::min(keep, n_blocks);
  std::vector<float> block_score(static_cast<size_t>(n_blocks), -INFINITY);  // [n_blocks]
  for (int64_t j = 0; j < n_vis; ++j)
    block_score[j / size] = std::max(block_score[j / size], scores[j]);
  if (n_blocks > 0) block_score.back() = INFINITY;
  return TopK(block_score, keep);
}

// The attention sink's per-head logits [heads] as fp32.
std::vector<float> SinkValues(const model::TensorView& sink, int heads) {
  std::vector<float> out(static_cast<size_t>(heads));
  for (int h = 0; h < heads; ++h) out[h] = sink.F32At(h);
  return out;
}

}  // namespace

Result<Selection> CpuOps::IndexerSelect(const IndexerQuery& q) {
  const model::ModelConfig& c = config();
  const int ratio = q.ratio;
  const int ih = c.index_n_heads, ihd = c.index_head_dim;
  const bool rb = numerics_.round_bf16;
  const bool round_terms = plans_[q.layer].index_score_round_terms;
  const int64_t T = static_cast<int64_t>(tokens_.size());
  if (ratio <= 0 || q.key_layer < 0 || q.key_layer >= static_cast<int>(plans_.size()))
    return Internal("IndexerSelect: no keys to select from");
  if (q.candidate_blocks != nullptr && q.candidate_blocks->size() != static_cast<size_t>(T))
    return Internal("IndexerSelect: candidate blocks of another step");
  const bool candidates = q.candidate_blocks_out != nullptr || q.candidate_blocks != nullptr;
  const int cbs = q.candidate_block_size;
  if (candidates && cbs <= 0)
    return Internal("IndexerSelect: candidate block size must be positive");
  Selection selected(static_cast<size_t>(T));
  if (q.candidate_blocks_out != nullptr) q.candidate_blocks_out->assign(static_cast<size_t>(T), {});
  // Each sequence's keys that its last query sees, unpacked once (only where some query must
  // score them: at most index_topk visible means all are selected, unless candidate blocks are
  // chosen or applied).
  std::vector<AlignedVector<float>> keys(segments_.size());  // [segments][n_keys, ihd]
  std::vector<std::vector<const float*>> key_ptrs(segments_.size());
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    const int64_t n_keys = (sg.start_pos + sg.n) / ratio;
    // No query of the sequence scores keys when all its visible rows are selected and, for a
    // candidate source, all its blocks fit the budget (a consumer's rows are a subset of them).
    const bool blocks_scored = q.candidate_blocks_out != nullptr &&
                               (n_keys + cbs - 1) / cbs > q.candidate_topk_blocks;
    if (n_keys <= c.index_topk && !blocks_scored) continue;
    keys[si].resize(static_cast<size_t>(n_keys * ihd));
    key_ptrs[si].resize(static_cast<size_t>(n_keys));
    pool_.ParallelFor(n_keys, [&](int64_t j) {
      State(si).ReadRow(q.key_layer, true, j, keys[si].data() + j * ihd);
      key_ptrs[si][j] = keys[si].data() + j * ihd;
    });
    stats_.kv_bytes += n_keys * State(si).layout().index_key.Bytes();
  }
  std::vector<int64_t> scored(static_cast<size_t>(T), 0);  // [T] keys scored
  pool_.ParallelFor(T, [&](int64_t t) {
    const int n_vis = static_cast<int>((pos_of_[t] + 1) / ratio);
    const float* const* all = key_ptrs[seg_of_[t]].data();
    const float* qt = q.qi + t * ih * ihd;
    const float* wt = q.wts + t * ih;
    if (q.candidate_blocks != nullptr) {
      // Level two: only the candidate blocks' rows compete (ascending, so ties still go to the
      // lower row); all of them when they are at most index_topk.
      std::vector<int32_t> rows;
      for (int32_t b : (*q.candidate_blocks)[t])
        for (int32_t j = b * cbs; j < std::min((b + 1) * cbs, n_vis); ++j) rows.push_back(j);
      if (static_cast<int>(rows.size()) <= c.index_topk) {
        selected[t] = std::move(rows);
        return;
      }
      std::vector<const float*> ptrs(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) ptrs[i] = all[rows[i]];
      std::vector<float> scores(rows.size());
      IndexerScores(qt, wt, ptrs, ih, ihd, rb, scores.data(), round_terms);
      scored[t] = static_cast<int64_t>(rows.size());
      for (int32_t i : TopK(scores, c.index_topk)) selected[t].push_back(rows[i]);
      return;
    }
    bool blocks_out = q.candidate_blocks_out != nullptr && n_vis > 0;
    if (blocks_out && (n_vis + cbs - 1) / cbs <= q.candidate_topk_blocks) {
      // Every visible block fits the budget: all are candidates, whatever their scores.
      std::vector<int32_t>& all_blocks = (*q.candidate_blocks_out)[t];
      all_blocks.resize(static_cast<size_t>((n_vis + cbs - 1) / cbs));
      std::iota(all_blocks.begin(), all_blocks.end(), 0);
      blocks_out = false;
    }
    if (n_vis <= c.index_topk && !blocks_out) {
      selected[t].resize(static_cast<size_t>(n_vis));
      std::iota(selected[t].begin(), selected[t].end(), 0);
      return;
    }
    scored[t] = n_vis;
    std::vector<float> scores(static_cast<size_t>(n_vis));
    IndexerScores(qt, wt, std::span<const float* const>(all, n_vis), ih, ihd, rb, scores.data(),
                  round_terms);
    selected[t] = TopK(scores, c.index_topk);
    if (blocks_out)
      (*q.candidate_blocks_out)[t] = CandidateBlocks(scores, cbs, q.candidate_topk_blocks);
  });
  for (int64_t t = 0; t < T; ++t) stats_.macs += scored[t] * ih * int64_t{ihd};
  return selected;
}

Status CpuOps::SparseAttention(int layer, int kv_layer, int ratio, const float* q, const float* kv,
                               const Selection* selected, float* o) {
  const model::ModelConfig& c = config();
  const int H = c.n_heads, hd = c.head_dim, W = c.window;
  const int64_t T = static_cast<int64_t>(tokens_.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool rb = numerics_.round_bf16;
  const bool max_over_rows = plans_[layer].softmax_max_over_rows;
  const std::vector<float> sink = SinkValues(Layer(layer).attn_sink, H);  // [H]

  // Per sequence, unpacked once: the ring's window rows before the step (positions
  // [ring_first, start_pos)) and the compressed rows its queries read.
  struct Unpacked {
    int64_t ring_first = 0;
    AlignedVector<float> ring;          // [start_pos - ring_first, hd]
    std::vector<int32_t> slot;          // compressed row j -> row in `rows` (-1: not read)
    AlignedVector<float> rows;          // [n_read, hd]
  };
  std::vector<Unpacked> un(segments_.size());
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    SequenceState& st = State(si);
    Unpacked& u = un[si];
    u.ring_first = std::max<int64_t>(0, sg.start_pos - (W - 1));
    const int64_t n_ring = sg.start_pos - u.ring_first;
    u.ring.resize(static_cast<size_t>(n_ring * hd));
    for (int64_t p = u.ring_first; p < sg.start_pos; ++p)
      st.ReadWindow(layer, p, u.ring.data() + (p - u.ring_first) * hd);
    int64_t n_read = 0;
    if (ratio > 0) {
      const int64_t n_comp = (sg.start_pos + sg.n) / ratio;
      u.slot.assign(static_cast<size_t>(n_comp), -1);
      if (selected != nullptr) {
        for (int64_t t = 0; t < sg.n; ++t)
          for (int32_t j : (*selected)[sg.row + t])
            if (u.slot[j] < 0) u.slot[j] = static_cast<int32_t>(n_read++);
      } else {  // every visible row: the last query sees them all
        for (int64_t j = 0; j < n_comp; ++j) u.slot[j] = static_cast<int32_t>(n_read++);
      }
      u.rows.resize(static_cast<size_t>(n_read * hd));
      for (int64_t j = 0; j < n_comp; ++j)
        if (u.slot[j] >= 0) st.ReadRow(kv_layer, false, j, u.rows.data() + u.slot[j] * hd);
    }
    stats_.kv_bytes +=
        n_ring * st.layout().kv_row.Bytes() + n_read * st.layout().compressed_row.Bytes();
  }

  // A task takes one token and up to kSharedRowsMax of its heads.
  std::vector<int64_t> visible(static_cast<size_t>(T));  // [T] rows each query attends to
  const int head_groups = (H + kSharedRowsMax - 1) / kSharedRowsMax;
  pool_.ParallelFor(T * head_groups, [&](int64_t task) {
    const int64_t t = task / head_groups;
    const int h0 = static_cast<int>(task % head_groups) * kSharedRowsMax;
    const int nh = std::min(kSharedRowsMax, H - h0);
    const int64_t pos = pos_of_[t];
    const int si = seg_of_[t];
    const Segment& sg = segments_[si];
    const Unpacked& u = un[si];
    std::vector<const float*> rows;
    for (int64_t p = std::max<int64_t>(0, pos - W + 1); p <= pos; ++p)
      rows.push_back(p >= sg.start_pos ? kv + (sg.row + p - sg.start_pos) * hd
                                       : u.ring.data() + (p - u.ring_first) * hd);
    if (selected != nullptr) {
      for (int32_t j : (*selected)[t]) rows.push_back(u.rows.data() + int64_t{u.slot[j]} * hd);
    } else if (ratio > 0) {
      for (int64_t j = 0; j < (pos + 1) / ratio; ++j)
        rows.push_back(u.rows.data() + int64_t{u.slot[j]} * hd);
    }
    if (h0 == 0) visible[t] = static_cast<int64_t>(rows.size());
    AttendHeads(q + (t * H + h0) * hd, nh, rows, hd, sink.data() + h0, scale, rb,
                o + (t * H + h0) * hd, max_over_rows);
  });
  for (int64_t t = 0; t < T; ++t) stats_.macs += visible[t] * H * int64_t{hd} * 2;
  return Status::Ok();
}

Status CpuOps::DraftAttention(int layer, const float* q, const float* kv, float* o) {
  const model::ModelConfig& c = config();
  const int H = c.n_heads, hd = c.head_dim, W = c.window;
  const int64_t T = static_cast<int64_t>(tokens_.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool rb = numerics_.round_bf16;
  const bool max_over_rows = plans_[layer].softmax_max_over_rows;
  const std::vector<float> sink = SinkValues(Layer(layer).attn_sink, H);  // [H]
  // Per segment, the rows every one of its queries reads: the ring (positions [start_pos - W,
  // start_pos), unpacked once), then the block's own rows.
  std::vector<AlignedVector<float>> ring(segments_.size());  // [segments][n_ring, hd]
  std::vector<std::vector<const float*>> rows(segments_.size());
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    SequenceState& st = State(si);
    const int64_t first = std::max<int64_t>(0, sg.start_pos - W);
    if (sg.start_pos != st.mtp_n_tokens())
      return Internal("DraftAttention: the block must start where the stage's ring ends (" +
                      std::to_string(st.mtp_n_tokens()) + "), not at " +
                      std::to_string(sg.start_pos));
    ring[si].resize(static_cast<size_t>((sg.start_pos - first) * hd));
    for (int64_t p = first; p < sg.start_pos; ++p)
      st.ReadWindow(layer, p, ring[si].data() + (p - first) * hd);
    for (int64_t p = first; p < sg.start_pos; ++p)
      rows[si].push_back(ring[si].data() + (p - first) * hd);
    for (int64_t t = 0; t < sg.n; ++t) rows[si].push_back(kv + (sg.row + t) * hd);
    stats_.kv_bytes += (sg.start_pos - first) * st.layout().kv_row.Bytes();
  }
  const int head_groups = (H + kSharedRowsMax - 1) / kSharedRowsMax;
  pool_.ParallelFor(T * head_groups, [&](int64_t task) {
    const int64_t t = task / head_groups;
    const int h0 = static_cast<int>(task % head_groups) * kSharedRowsMax;
    const int nh = std::min(kSharedRowsMax, H - h0);
    AttendHeads(q + (t * H + h0) * hd, nh, rows[seg_of_[t]], hd, sink.data() + h0, scale, rb,
                o + (t * H + h0) * hd, max_over_rows);
  });
  for (int64_t t = 0; t < T; ++t)
    stats_.macs += static_cast<int64_t>(rows[seg_of_[t]].size()) * H * int64_t{hd} * 2;
  return Status::Ok();
}

Status CpuOps::StoreWindow(int layer, const float* kv) {
  const int64_t hd = config().head_dim;
  for (int64_t t = 0; t < static_cast<int64_t>(tokens_.size()); ++t)
    DSINFER_RETURN_IF_ERROR(State(seg_of_[t]).WriteWindow(layer, pos_of_[t], kv + t * hd));
  return Status::Ok();
}

}  // namespace dsinfer::backend::cpu
