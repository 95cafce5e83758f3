// Attention (window + compressor + indexer + sparse attention with sink) and MoE of one V4
// layer on the GPU, step for step as backend/cpu/attention.cc and moe.cc.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_model_internal.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/model_kernels.h"
#include "backend/cuda/routing.h"

namespace dsinfer::backend::cuda {

namespace {

Status CopyD2D(CudaDevice& dev, float* dst, const float* src, int64_t n, const char* what) {
  if (n <= 0) return Status::Ok();
  return CudaStatus(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, dev.stream()),
      what);
}

// `width` floats of each of `rows` rows from src (row stride src_stride) to dst (row stride
// dst_stride): a column slice when src or dst points into a wider matrix.
Status Copy2D(CudaDevice& dev, float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
              int64_t width, int64_t rows, const char* what) {
  if (rows <= 0 || width <= 0) return Status::Ok();
  return CudaStatus(
      cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * 4, src,
                        static_cast<size_t>(src_stride) * 4, static_cast<size_t>(width) * 4,
                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, dev.stream()),
      what);
}

}  // namespace

// Feeds one sequence's n new tokens (positions start_pos..; a, g: their projections [n, width])
// into one compressor: the pooled rows of every group that completes (written to rows_out
// [n_groups, d]), their norm, RoPE at the group's first position and the numerics'
// post-processing (attention.cc CompressorFeed + CompressorPush), and the state's new partial /
// previous groups.
Status CudaModel::CompressorStep(const DeviceCompressor& cw, CudaCompressorState& st, int li,
                                 int64_t start_pos, int64_t T, const float* a, const float* g,
                                 int d, float* rows_out, bool index_keys) {
  const model::ModelConfig& c = config();
  const Numerics& nm = numerics_;
  const int r = st.ratio, w = st.width;
  const int64_t p0 = start_pos % r;  // tokens of the open group already in the state
  const int64_t n_all = p0 + T, n_groups = n_all / r, left = n_all % r;
  if (n_groups == 0) {
    // No group completes (most decode steps): the new rows join the open group in place, two
    // copies instead of assembling the group elsewhere and copying it back (up to six).
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, st.pending_a.as<float>() + p0 * w, a, T * w, "open a"));
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, st.pending_g.as<float>() + p0 * w, g, T * w, "open g"));
    return Status::Ok();
  }
  // The open group's rows, then the step's: complete groups start at row 0.
  DSINFER_ASSIGN_OR_RETURN(float* a_all, ws_->Get(dev_, Workspace::kAall, n_all * w));
  DSINFER_ASSIGN_OR_RETURN(float* g_all, ws_->Get(dev_, Workspace::kGall, n_all * w));
  DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, a_all, st.pending_a.as<float>(), p0 * w, "pending a"));
  DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, g_all, st.pending_g.as<float>(), p0 * w, "pending g"));
  DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, a_all + p0 * w, a, T * w, "step a"));
  DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, g_all + p0 * w, g, T * w, "step g"));
  const bool has_prev = st.overlap && start_pos - p0 >= r;
  DSINFER_RETURN_IF_ERROR(CompressorPool(dev_, a_all, g_all, cw.ape.as<float>(), n_groups, r, w,
                                         st.overlap, has_prev ? st.prev_a.as<float>() : nullptr,
                                         has_prev ? st.prev_score.as<float>() : nullptr, rows_out));
  if (st.overlap) {
    const int64_t last = (n_groups - 1) * r * w;
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, st.prev_a.as<float>(), a_all + last, r * w, "prev a"));
    DSINFER_RETURN_IF_ERROR(CudaStatus(LaunchAdd(g_all + last, cw.ape.as<float>(), r * w,
                                                 st.prev_score.as<float>(), dev_.stream()),
                                       "prev score"));
  }
  DSINFER_RETURN_IF_ERROR(
      CopyD2D(dev_, st.pending_a.as<float>(), a_all + n_groups * r * w, left * w, "open a"));
  DSINFER_RETURN_IF_ERROR(
      CopyD2D(dev_, st.pending_g.as<float>(), g_all + n_groups * r * w, left * w, "open g"));
  // Post-processing of the new rows [n_groups, d].
  const bool rb = nm.round_bf16;
  if (rb)
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchScaleRound(rows_out, n_groups * d, 1.0f, true, dev_.stream()), "round rows"));
  DSINFER_RETURN_IF_ERROR(
      RmsNormRows(dev_, rows_out, n_groups, d, cw.norm.as<float>(), c.norm_eps, rb));
  std::vector<int64_t> first(static_cast<size_t>(n_groups));  // [n_groups] group start positions
  for (int64_t j = 0; j < n_groups; ++j) first[j] = start_pos - p0 + j * r;
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dfirst, dev_.UploadStaged(first.data(), first.size() * 8));
  const DeviceLayer& dl = *layers_[li];
  DSINFER_RETURN_IF_ERROR(ApplyRope(dev_, rows_out, n_groups, d, d - c.rope_dim,
                                    dfirst.as<const int64_t>(), dl.inv_freq.as<float>(),
                                    c.rope_dim / 2, false, rb));
  if (index_keys) {
    if (nm.indexer_fp4) {
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(LaunchHadamard(rows_out, n_groups, d, rb, dev_.stream()), "Hadamard keys"));
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(LaunchFp4RoundTrip(rows_out, n_groups, d, d, 32, dev_.stream()), "FP4 keys"));
    }
  } else if (nm.kv_fp8_round_trip) {
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchFp8RoundTrip(rows_out, n_groups, c.NopeDim(), d, 64, dev_.stream()), "FP8 rows"));
  }
  return Status::Ok();  // buffers freed on return are released in stream order
}

Status CudaModel::Attention(int li, std::span<Segment> segments, int64_t T, const float* x,
                            float* out) {
  const model::ModelConfig& c = config();
  const Numerics& nm = numerics_;
  const DeviceLayer& d = *layers_[li];
  const bool rb = nm.round_bf16;
  const int H = c.n_heads, hd = c.head_dim, rd = c.rope_dim, nope = hd - rd;
  const int ratio = d.ratio;
  const int W = c.window;
  const int64_t window_region = W - 1 + kMaxStepTokens;
  const float* inv_freq = d.inv_freq.as<float>();

  // ---- query path, all sequences' rows at once (positions per row from step_).
  DSINFER_ASSIGN_OR_RETURN(float* qr, ws_->Get(dev_, Workspace::kQr, T * c.q_lora_rank));
  DSINFER_RETURN_IF_ERROR(QuantLinear(d.wq_a, x, T, qr));
  DSINFER_RETURN_IF_ERROR(
      RmsNormRows(dev_, qr, T, c.q_lora_rank, d.q_norm.as<float>(), c.norm_eps, rb));
  DSINFER_ASSIGN_OR_RETURN(float* q, ws_->Get(dev_, Workspace::kQ, T * H * hd));  // [T, H, hd]
  DSINFER_RETURN_IF_ERROR(QuantLinear(d.wq_b, qr, T, q));
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(LaunchHeadRmsNorm(q, T * H, hd, static_cast<float>(c.norm_eps), rb, dev_.stream()),
                 "head norm"));
  DSINFER_RETURN_IF_ERROR(
      ApplyRope(dev_, q, T * H, hd, nope, step_.pos_heads, inv_freq, rd / 2, false, rb));

  // ---- window KV rows [T, hd].
  DSINFER_ASSIGN_OR_RETURN(float* kv, ws_->Get(dev_, Workspace::kKv, T * hd));
  DSINFER_RETURN_IF_ERROR(QuantLinear(d.wkv, x, T, kv));
  DSINFER_RETURN_IF_ERROR(RmsNormRows(dev_, kv, T, hd, d.kv_norm.as<float>(), c.norm_eps, rb));
  DSINFER_RETURN_IF_ERROR(ApplyRope(dev_, kv, T, hd, nope, step_.pos, inv_freq, rd / 2, false, rb));
  if (nm.kv_fp8_round_trip)
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchFp8RoundTrip(kv, T, nope, hd, 64, dev_.stream()), "FP8 KV"));

  // ---- compressor and indexer projections, all rows at once (fp32, no rounding).
  float *ca = nullptr, *cg = nullptr, *ia = nullptr, *ig = nullptr, *qi = nullptr, *wts = nullptr;
  const int ih = c.index_n_heads, ihd = c.index_head_dim;
  if (ratio > 0) {
    const int64_t w = d.compressor.wkv.view.rows;
    DSINFER_ASSIGN_OR_RETURN(ca, ws_->Get(dev_, Workspace::kA, T * w));  // [T, w]
    DSINFER_ASSIGN_OR_RETURN(cg, ws_->Get(dev_, Workspace::kG, T * w));  // [T, w]
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.compressor.wkv, x, T, ca));
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.compressor.wgate, x, T, cg));
  }
  if (ratio == 4) {
    DSINFER_ASSIGN_OR_RETURN(qi, ws_->Get(dev_, Workspace::kQi, T * ih * ihd));  // [T, ih, ihd]
    DSINFER_RETURN_IF_ERROR(QuantLinear(d.index_wq_b, qr, T, qi));
    DSINFER_RETURN_IF_ERROR(ApplyRope(dev_, qi, T * ih, ihd, ihd - rd, step_.pos_index_heads,
                                      inv_freq, rd / 2, false, rb));
    if (nm.indexer_fp4) {
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(LaunchHadamard(qi, T * ih, ihd, rb, dev_.stream()), "Hadamard q"));
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(LaunchFp4RoundTrip(qi, T * ih, ihd, ihd, 32, dev_.stream()), "FP4 q"));
    }
    DSINFER_ASSIGN_OR_RETURN(wts, ws_->Get(dev_, Workspace::kWts, T * ih));  // [T, ih]
    DSINFER_RETURN_IF_ERROR(QuantLinear(d.index_weights_proj, x, T, wts));
    const float wscale = 1.0f / std::sqrt(static_cast<float>(ihd) * ih);
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchScaleRound(wts, T * ih, wscale, rb, dev_.stream()), "indexer weights"));
    const int64_t w = d.index_compressor.wkv.view.rows;
    DSINFER_ASSIGN_OR_RETURN(ia, ws_->Get(dev_, Workspace::kIa, T * w));  // [T, w]
    DSINFER_ASSIGN_OR_RETURN(ig, ws_->Get(dev_, Workspace::kIg, T * w));  // [T, w]
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.index_compressor.wkv, x, T, ia));
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.index_compressor.wgate, x, T, ig));
  }

  // ---- per sequence: its pool, compressors, indexer selection and sparse attention.
  DSINFER_RETURN_IF_ERROR(MarkPhase(&phase_times_.attention_dense));
  DSINFER_ASSIGN_OR_RETURN(float* o, ws_->Get(dev_, Workspace::kO, T * H * hd));  // [T, H, hd]
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const Segment& sg : segments) {
    CudaLayerState& ls = sg.seq->layers[li];
    const int64_t P = sg.seq->n_tokens, n = static_cast<int64_t>(sg.tokens.size()), r0 = sg.row;
    std::vector<int64_t> pos(static_cast<size_t>(n));  // [n] host copy for the row lists
    for (int64_t t = 0; t < n; ++t) pos[t] = P + t;
    // The pool's window region: positions base .. P + n - 1 in order (the ring's, then the new).
    const int64_t base = std::max<int64_t>(0, P - (W - 1));
    float* pool = ls.pool.as<float>();
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchRingGather(ls.ring.as<float>(), W, hd, base, P - base, pool, dev_.stream()),
        "ring gather"));
    DSINFER_RETURN_IF_ERROR(
        CopyD2D(dev_, pool + (P - base) * hd, kv + r0 * hd, n * hd, "window rows"));
    // Compressed rows of groups completed in this step join the pool.
    const int64_t n_comp = ratio > 0 ? (P + n) / ratio : 0;
    if (ratio > 0) {
      const int64_t w = ls.compressor.width;
      DSINFER_RETURN_IF_ERROR(CompressorStep(d.compressor, ls.compressor, li, P, n, ca + r0 * w,
                                             cg + r0 * w, hd,
                                             pool + (window_region + P / ratio) * hd, false));
    }
    // Indexer (CSA): per-query top-k of the visible compressed rows.
    std::vector<std::vector<int32_t>> selected;
    if (ratio == 4) {
      const int64_t w = ls.index_compressor.width;
      DSINFER_RETURN_IF_ERROR(CompressorStep(d.index_compressor, ls.index_compressor, li, P, n,
                                             ia + r0 * w, ig + r0 * w, ihd,
                                             ls.index_keys.as<float>() + (P / 4) * ihd, true));
      std::vector<int32_t> n_vis(static_cast<size_t>(n));  // [n]
      int32_t max_vis = 0;
      for (int64_t t = 0; t < n; ++t) {
        n_vis[t] = static_cast<int32_t>((P + t + 1) / 4);
        max_vis = std::max(max_vis, n_vis[t]);
      }
      selected.resize(static_cast<size_t>(n));
      if (max_vis <= c.index_topk) {
        for (int64_t t = 0; t < n; ++t) {
          selected[t].resize(n_vis[t]);
          std::iota(selected[t].begin(), selected[t].end(), 0);
        }
      } else {
        // n_vis[t] <= max_vis <= n_comp by construction; one upload serves both kernels.
        DSINFER_ASSIGN_OR_RETURN(float* scores, ws_->Get(dev_, Workspace::kScores, n * max_vis));
        DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dn,
                                 dev_.UploadStaged(n_vis.data(), n_vis.size() * 4));
        DSINFER_ASSIGN_OR_RETURN(DeviceBuffer didx,
                                 dev_.Alloc(static_cast<size_t>(n * c.index_topk) * 4));
        DSINFER_RETURN_IF_ERROR(
            CudaStatus(LaunchIndexerScores(qi + r0 * ih * ihd, wts + r0 * ih,
                                           ls.index_keys.as<float>(), dn.as<const int32_t>(), n, ih,
                                           ihd, max_vis, rb, scores, dev_.stream()),
                       "IndexerScores"));
        DSINFER_RETURN_IF_ERROR(
            CudaStatus(LaunchTopK(scores, n, max_vis, dn.as<const int32_t>(), c.index_topk,
                                  didx.as<int32_t>(), dev_.stream()),
                       "TopK"));
        std::vector<int32_t> idx(static_cast<size_t>(n * c.index_topk));  // [n, topk]
        DSINFER_RETURN_IF_ERROR(dev_.CopyToHost(idx.data(), didx.data(), idx.size() * 4));
        for (int64_t t = 0; t < n; ++t)
          for (int k = 0; k < c.index_topk; ++k) {
            const int32_t j = idx[t * c.index_topk + k];
            if (j >= 0) selected[t].push_back(j);
          }
      }
    }
    // Sparse attention with sink over this sequence's pool.
    SparseRowSpec spec;
    spec.window = W;
    spec.ratio = ratio;
    spec.window_first_pos = base;
    spec.window_rows = P - base + n;
    spec.compressed_base = window_region;
    spec.compressed_rows = n_comp;
    DSINFER_ASSIGN_OR_RETURN(SparseRowLists lists,
                             BuildSparseRowLists(spec, pos, ratio == 4 ? &selected : nullptr));
    // BuildSparseRowLists checked every row against the pool; offsets and rows go up together.
    const int64_t total = static_cast<int64_t>(lists.rows.size());
    std::vector<int32_t> packed = lists.offsets;  // [n + 1 offsets | total rows]
    packed.insert(packed.end(), lists.rows.begin(), lists.rows.end());
    DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dlists,
                             dev_.UploadStaged(packed.data(), packed.size() * 4));
    DSINFER_ASSIGN_OR_RETURN(
        float* probs, ws_->Get(dev_, Workspace::kProbs, int64_t{H} * std::max<int64_t>(total, 1)));
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchSparseAttention(q + r0 * H * hd, n, H, hd, pool, dlists.as<const int32_t>(),
                              dlists.as<const int32_t>() + n + 1, total, d.attn_sink.as<float>(),
                              scale, rb, probs, o + r0 * H * hd, dev_.stream()),
        "SparseAttention"));
    step_stats_.kv_bytes += (P - base + n + n_comp) * hd * 4;
    if (ratio == 4) step_stats_.kv_bytes += n_comp * int64_t{ihd} * 4;
    // The last `window` KV rows stay in the ring for the next step.
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchRingScatter(kv + r0 * hd, n, P, W, hd, ls.ring.as<float>(), dev_.stream()),
                   "ring scatter"));
  }
  DSINFER_RETURN_IF_ERROR(
      ApplyRope(dev_, o, T * H, hd, nope, step_.pos_heads, inv_freq, rd / 2, true, rb));

  DSINFER_RETURN_IF_ERROR(MarkPhase(&phase_times_.attention_per_sequence));
  // ---- grouped output projection: wo_a per group (no act quant), then wo_b.
  const int G = c.o_groups;
  const int64_t group_in = int64_t{H / G} * hd, L = c.o_lora_rank;
  DSINFER_ASSIGN_OR_RETURN(float* z, ws_->Get(dev_, Workspace::kZ, T * G * L));       // [T, G*L]
  DSINFER_ASSIGN_OR_RETURN(float* og, ws_->Get(dev_, Workspace::kOg, T * group_in));  // [T, in]
  DSINFER_ASSIGN_OR_RETURN(float* zg, ws_->Get(dev_, Workspace::kZg, T * L));         // [T, L]
  for (int g = 0; g < G; ++g) {
    DSINFER_RETURN_IF_ERROR(
        Copy2D(dev_, og, group_in, o + g * group_in, int64_t{H} * hd, group_in, T, "o group"));
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.wo_a_groups[g], og, T, zg));
    DSINFER_RETURN_IF_ERROR(Copy2D(dev_, z + g * L, G * L, zg, L, L, T, "z group"));
  }
  if (rb)
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchScaleRound(z, T * G * L, 1.0f, true, dev_.stream()), "round z"));
  DSINFER_RETURN_IF_ERROR(QuantLinear(d.wo_b, z, T, out));
  return MarkPhase(&phase_times_.attention_dense);  // buffers freed on return: stream order
}

Status CudaModel::Moe(int li, int64_t T, const float* x, float* out) {
  const model::ModelConfig& c = config();
  const Numerics& nm = numerics_;
  const DeviceLayer& d = *layers_[li];
  const bool rb = nm.round_bf16;
  const int64_t D = c.hidden, inter = c.moe_inter;
  const int E = c.n_routed_experts, K = c.n_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);

  // Router on the device; its choices come back to group the tokens per expert.
  DSINFER_ASSIGN_OR_RETURN(float* logits,
                           ws_->Get(dev_, Workspace::kRouterLogits, T * E));  // [T, E]
  DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.gate, x, T, logits));
  // chosen [T, K] int32 then weights [T, K] f32 in one buffer: one copy back.
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dsel, dev_.Alloc(static_cast<size_t>(2 * T * K) * 4));
  const bool hash = d.tid2eid.data() != nullptr;
  DSINFER_RETURN_IF_ERROR(Route(dev_, logits, T, E, K, hash ? nullptr : d.gate_bias.as<float>(),
                                hash ? d.tid2eid.as<int32_t>() : nullptr, c.vocab_size,
                                step_.tokens, static_cast<float>(c.route_scale), dsel.as<int32_t>(),
                                dsel.as<float>() + T * K));
  std::vector<int32_t> sel(static_cast<size_t>(2 * T * K));  // [chosen | weight bits]
  DSINFER_RETURN_IF_ERROR(dev_.CopyToHost(sel.data(), dsel.data(), sel.size() * 4));
  std::span<const int32_t> chosen(sel.data(), static_cast<size_t>(T * K));
  for (int32_t e : chosen)
    if (e < 0 || e >= E) return Internal("MoE router chose expert " + std::to_string(e));
  DSINFER_ASSIGN_OR_RETURN(RoutedGroups groups, GroupRoutedTokens(chosen, E, K));
  const model::LayerWeights& lw = weights_.layers[li];
  for (int e = 0; e < E; ++e)
    if (groups.offsets[e + 1] > groups.offsets[e]) {
      step_stats_.routed_expert_bytes +=
          lw.experts[e].w1.Bytes() + lw.experts[e].w2.Bytes() + lw.experts[e].w3.Bytes();
      step_stats_.n_routed_experts_used++;
    }
  const int64_t TK = T * K;
  // Everything the expert kernels index, in one upload of int32 words: per token its grouped
  // rows in ascending order (the CPU adds the routed outputs in expert order), per grouped row
  // its routing weight (f32 bits) and x row, the identity rows (w2 reads grouped row j itself),
  // and the grouped-GEMM tiles. GroupRoutedTokens' x rows are < T by construction.
  const std::vector<int32_t> tile_list = ExpertTileWords(groups, kGroupedTileRows);  // [n, 3]
  std::vector<int32_t> idx(static_cast<size_t>(4 * TK) + tile_list.size());
  int32_t* token_rows = idx.data();       // [T, K]
  int32_t* row_weight = token_rows + TK;  // [TK] f32 bits
  int32_t* row_token = row_weight + TK;   // [TK]
  int32_t* identity = row_token + TK;     // [TK]
  int32_t* tile_words = identity + TK;    // [n_tiles, 3]
  std::vector<int32_t> fill(static_cast<size_t>(T), 0);
  for (int64_t j = 0; j < TK; ++j) {
    const int32_t t = groups.tokens[j];
    token_rows[t * K + fill[t]++] = static_cast<int32_t>(j);
    row_weight[j] = sel[T * K + groups.slots[j]];  // the weight's bits
    row_token[j] = t;
    identity[j] = static_cast<int32_t>(j);
  }
  std::copy(tile_list.begin(), tile_list.end(), tile_words);
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer didx, dev_.UploadStaged(idx.data(), idx.size() * 4));
  const int32_t* d_token_rows = didx.as<const int32_t>();
  const float* d_row_weight = reinterpret_cast<const float*>(d_token_rows + TK);
  const int32_t* d_row_token = d_token_rows + 2 * TK;
  const int32_t* d_identity = d_token_rows + 3 * TK;
  const int32_t* d_tiles = d_token_rows + 4 * TK;
  const int64_t n_tiles = static_cast<int64_t>(tile_list.size() / 3);
  // The tensor-core path's 64-row tiles and input codes, made when a set first needs them.
  DeviceBuffer tc_tiles;
  int64_t n_tc_tiles = 0;
  auto tc_tile_list = [&]() -> Status {
    if (tc_tiles.data() != nullptr) return Status::Ok();
    const std::vector<int32_t> words = ExpertTileWords(groups, kTcGroupedTileRows);
    n_tc_tiles = static_cast<int64_t>(words.size() / 3);
    DSINFER_ASSIGN_OR_RETURN(tc_tiles, dev_.UploadStaged(words.data(), words.size() * 4));
    return Status::Ok();
  };
  // in_rows rows of `in` (already the act quant's round trip) -> codes and scales, then the
  // grouped GEMM on tensor cores (quantizing a value on the grid gives back its code). w1 and w3
  // read the same input: it is quantized once for both.
  DeviceBuffer codes, scales;
  const float* coded_in = nullptr;
  auto tc_grouped = [&](const DeviceExpertSet& set, const int32_t* rows_of, const float* in,
                        int64_t in_rows, float* y, const char* what) -> Status {
    DSINFER_RETURN_IF_ERROR(tc_tile_list());
    const int64_t k = set.cols;
    if (in != coded_in) {
      DSINFER_ASSIGN_OR_RETURN(codes, dev_.Alloc(static_cast<size_t>(in_rows * k)));
      DSINFER_ASSIGN_OR_RETURN(scales, dev_.Alloc(static_cast<size_t>(in_rows * (k / 128)) * 4));
      DSINFER_RETURN_IF_ERROR(CudaStatus(
          LaunchActQuantFp8(in, in_rows, k, codes.as<uint8_t>(), scales.as<float>(), dev_.stream()),
          what));
      coded_in = in;
    }
    return CudaStatus(LaunchTcGroupedMatMul(*expert_mma_, set.views.as<const DeviceWeightView>(),
                                            tc_tiles.as<const int32_t>(), n_tc_tiles, rows_of,
                                            codes.as<const uint8_t>(), scales.as<const float>(),
                                            set.rows, k, y, dev_.stream()),
                      what);  // codes and scales are freed in stream order
  };
  auto grouped = [&](const DeviceExpertSet& set, const int32_t* rows_of, const float* in,
                     int64_t in_rows, float* y, const char* what) {
    if (UseTensorCores(set)) return tc_grouped(set, rows_of, in, in_rows, y, what);
    return CudaStatus(
        LaunchGroupedMatMul(set.format, set.views.as<const DeviceWeightView>(), d_tiles, n_tiles,
                            rows_of, in, set.rows, set.cols, y, dev_.stream()),
        what);
  };

  DSINFER_ASSIGN_OR_RETURN(float* xq, ws_->Get(dev_, Workspace::kXq, T * D));  // [T, D]
  DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, xq, x, T * D, "moe input"));
  if (nm.quantize_activations)
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchFp8RoundTrip(xq, T, D, D, c.act_block, dev_.stream()), "moe act quant"));
  DSINFER_ASSIGN_OR_RETURN(float* gate, ws_->Get(dev_, Workspace::kExpertGate, TK * inter));
  DSINFER_ASSIGN_OR_RETURN(float* up, ws_->Get(dev_, Workspace::kExpertUp, TK * inter));
  DSINFER_ASSIGN_OR_RETURN(float* down, ws_->Get(dev_, Workspace::kExpertDown, TK * D));  // [TK, D]
  DSINFER_RETURN_IF_ERROR(grouped(d.w1, d_row_token, xq, T, gate, "experts w1"));
  DSINFER_RETURN_IF_ERROR(grouped(d.w3, d_row_token, xq, T, up, "experts w3"));
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      LaunchSwiGlu(gate, up, TK, inter, d_row_weight, limit, rb, gate, dev_.stream()), "SwiGLU"));
  if (nm.quantize_activations)
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchFp8RoundTrip(gate, TK, inter, inter, c.act_block, dev_.stream()), "h act quant"));
  DSINFER_RETURN_IF_ERROR(grouped(d.w2, d_identity, gate, TK, down, "experts w2"));
  if (rb)
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(LaunchScaleRound(down, TK * D, 1.0f, true, dev_.stream()), "round experts"));

  float* shared = nullptr;
  if (c.n_shared_experts > 0) {
    DSINFER_ASSIGN_OR_RETURN(float* sg, ws_->Get(dev_, Workspace::kSharedGate, T * inter));
    DSINFER_ASSIGN_OR_RETURN(float* su, ws_->Get(dev_, Workspace::kSharedUp, T * inter));
    DSINFER_ASSIGN_OR_RETURN(shared, ws_->Get(dev_, Workspace::kSharedOut, T * D));
    DSINFER_RETURN_IF_ERROR(MatMulQuantized(d.shared_w1, xq, T, sg));
    DSINFER_RETURN_IF_ERROR(MatMulQuantized(d.shared_w3, xq, T, su));
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchSwiGlu(sg, su, T, inter, nullptr, limit, rb, sg, dev_.stream()), "shared SwiGLU"));
    if (nm.quantize_activations)
      DSINFER_RETURN_IF_ERROR(CudaStatus(
          LaunchFp8RoundTrip(sg, T, inter, inter, c.act_block, dev_.stream()), "shared quant"));
    DSINFER_RETURN_IF_ERROR(MatMulQuantized(d.shared_w2, sg, T, shared));
    if (rb)
      DSINFER_RETURN_IF_ERROR(
          CudaStatus(LaunchScaleRound(shared, T * D, 1.0f, true, dev_.stream()), "round shared"));
  }
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(LaunchMoeCombine(down, d_token_rows, K, shared, T, D, rb, out, dev_.stream()),
                 "MoE combine"));
  return Status::Ok();  // buffers freed on return are released in stream order
}

}  // namespace dsinfer::backend::cuda
