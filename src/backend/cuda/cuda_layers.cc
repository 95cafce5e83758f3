// The GPU's V4Ops that read or write sequence state (compressor pooling and storage, the
// indexer's selection, sparse attention over the pool, the window ring) and the grouped ops
// (output projection, MoE router and experts). The layer program (backend/v4_forward.cc) calls
// them in the order of the spec.
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

// Feeds each sequence's new tokens into one compressor of `layer`: the raw pooled rows of every
// group that completes (before norm and RoPE) into rows_out, and the state's new partial /
// previous groups.
Result<CompressedRows> CudaModel::CompressorPool(int layer, Compressor which, const float* a,
                                                 const float* g, float* rows_out) {
  const bool index = which == Compressor::kIndex;
  const DeviceLayer& dl = *layers_[layer];
  const DeviceCompressor& cw = index ? dl.index_compressor : dl.compressor;
  CompressedRows done;
  done.per_segment.assign(segments_.size(), 0);
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    CudaLayerState& ls = Seq(si).layers[layer];
    CudaCompressorState& st = index ? ls.index_compressor : ls.compressor;
    const int r = st.ratio, w = st.width;
    const int d = st.overlap ? w / 2 : w;
    const int64_t T = sg.n, p0 = sg.start_pos % r;  // tokens of the open group already held
    const int64_t n_all = p0 + T, n_groups = n_all / r, left = n_all % r;
    const float* sa = a + sg.row * w;
    const float* sgate = g + sg.row * w;
    if (n_groups == 0) {
      // No group completes (most decode steps): the new rows join the open group in place.
      DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, st.pending_a.as<float>() + p0 * w, sa, T * w, "open a"));
      DSINFER_RETURN_IF_ERROR(
          CopyD2D(dev_, st.pending_g.as<float>() + p0 * w, sgate, T * w, "open g"));
      continue;
    }
    // The open group's rows, then the step's: complete groups start at row 0.
    DSINFER_ASSIGN_OR_RETURN(float* a_all, ws_->Get(dev_, Workspace::kAall, n_all * w));
    DSINFER_ASSIGN_OR_RETURN(float* g_all, ws_->Get(dev_, Workspace::kGall, n_all * w));
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, a_all, st.pending_a.as<float>(), p0 * w, "pending a"));
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, g_all, st.pending_g.as<float>(), p0 * w, "pending g"));
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, a_all + p0 * w, sa, T * w, "step a"));
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, g_all + p0 * w, sgate, T * w, "step g"));
    const bool has_prev = st.overlap && sg.start_pos - p0 >= r;
    DSINFER_RETURN_IF_ERROR(cuda::CompressorPool(
        dev_, a_all, g_all, cw.ape.as<float>(), n_groups, r, w, st.overlap,
        has_prev ? st.prev_a.as<float>() : nullptr, has_prev ? st.prev_score.as<float>() : nullptr,
        rows_out + done.n * d));
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
    for (int64_t j = 0; j < n_groups; ++j) done.first_pos.push_back(sg.start_pos - p0 + j * r);
    done.per_segment[si] = n_groups;
    done.n += n_groups;
  }
  return done;
}

Status CudaModel::StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                                  const float* data) {
  const model::ModelConfig& c = config();
  const bool index = which == Compressor::kIndex;
  const int64_t d = index ? c.index_head_dim : c.head_dim;
  const int64_t window_region = c.window - 1 + kMaxStepTokens;
  int64_t k = 0;
  for (size_t si = 0; si < segments_.size(); ++si) {
    const int64_t n = rows.per_segment[si];
    if (n == 0) continue;
    CudaLayerState& ls = Seq(si).layers[layer];
    const CudaCompressorState& st = index ? ls.index_compressor : ls.compressor;
    const int64_t j = rows.first_pos[k] / st.ratio;  // the first new row's index
    float* dst = index ? ls.index_keys.as<float>() + j * d
                       : ls.pool.as<float>() + (window_region + j) * d;
    DSINFER_RETURN_IF_ERROR(CopyD2D(dev_, dst, data + k * d, n * d, "store compressed rows"));
    k += n;
  }
  return Status::Ok();
}

Result<Selection> CudaModel::IndexerSelect(const IndexerQuery& query) {
  // The GPU runs V4 only (CudaModel::Create refuses V4.1): keys of the querying layer itself,
  // no candidate pre-filter.
  if (query.key_layer != query.layer || query.candidate_blocks != nullptr ||
      query.candidate_blocks_out != nullptr)
    return Unimplemented("CUDA: the V4.1 indexer roles are not implemented on the GPU");
  const int layer = query.layer;
  const float* qi = query.qi;
  const float* wts = query.wts;
  const model::ModelConfig& c = config();
  const int ratio = query.ratio;
  const int ih = c.index_n_heads, ihd = c.index_head_dim;
  Selection selected(static_cast<size_t>(step_rows_));
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    CudaLayerState& ls = Seq(si).layers[layer];
    const int64_t n = sg.n, r0 = sg.row;
    std::vector<int32_t> n_vis(static_cast<size_t>(n));  // [n]
    int32_t max_vis = 0;
    for (int64_t t = 0; t < n; ++t) {
      n_vis[t] = static_cast<int32_t>((sg.start_pos + t + 1) / ratio);
      max_vis = std::max(max_vis, n_vis[t]);
    }
    if (max_vis <= c.index_topk) {
      for (int64_t t = 0; t < n; ++t) {
        selected[r0 + t].resize(n_vis[t]);
        std::iota(selected[r0 + t].begin(), selected[r0 + t].end(), 0);
      }
      continue;
    }
    // n_vis[t] <= max_vis <= the keys the pool holds; one upload serves both kernels.
    DSINFER_ASSIGN_OR_RETURN(float* scores, ws_->Get(dev_, Workspace::kScores, n * max_vis));
    DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dn, dev_.UploadStaged(n_vis.data(), n_vis.size() * 4));
    DSINFER_ASSIGN_OR_RETURN(DeviceBuffer didx,
                             dev_.Alloc(static_cast<size_t>(n * c.index_topk) * 4));
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchIndexerScores(qi + r0 * ih * ihd, wts + r0 * ih, ls.index_keys.as<float>(),
                            dn.as<const int32_t>(), n, ih, ihd, max_vis, numerics_.round_bf16,
                            scores, dev_.stream()),
        "IndexerScores"));
    DSINFER_RETURN_IF_ERROR(CudaStatus(LaunchTopK(scores, n, max_vis, dn.as<const int32_t>(),
                                                  c.index_topk, didx.as<int32_t>(), dev_.stream()),
                                       "TopK"));
    std::vector<int32_t> idx(static_cast<size_t>(n * c.index_topk));  // [n, topk]
    DSINFER_RETURN_IF_ERROR(dev_.CopyToHost(idx.data(), didx.data(), idx.size() * 4));
    for (int64_t t = 0; t < n; ++t)
      for (int k = 0; k < c.index_topk; ++k) {
        const int32_t j = idx[t * c.index_topk + k];
        if (j >= 0) selected[r0 + t].push_back(j);
      }
    step_stats_.kv_bytes += int64_t{max_vis} * ihd * 4;
  }
  return selected;
}

Status CudaModel::SparseAttention(int layer, int kv_layer, int ratio, const float* q,
                                  const float* kv, const Selection* selected, float* o) {
  const model::ModelConfig& c = config();
  // The pool holds a layer's window rows and its own compressed rows side by side; a layer that
  // reads another layer's rows (V4.1's kv sources) needs them gathered first.
  if (ratio > 0 && kv_layer != layer)
    return Unimplemented("GPU sparse attention over another layer's compressed rows");
  const DeviceLayer& d = *layers_[layer];
  const int H = c.n_heads, hd = c.head_dim, W = c.window;
  const int64_t window_region = W - 1 + kMaxStepTokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    CudaLayerState& ls = Seq(si).layers[layer];
    const int64_t P = sg.start_pos, n = sg.n, r0 = sg.row;
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
    const int64_t n_comp = ratio > 0 ? (P + n) / ratio : 0;
    std::vector<std::vector<int32_t>> mine;  // this sequence's rows of the selection
    if (selected != nullptr)
      mine.assign(selected->begin() + r0, selected->begin() + r0 + n);
    SparseRowSpec spec;
    spec.window = W;
    spec.ratio = ratio;
    spec.window_first_pos = base;
    spec.window_rows = P - base + n;
    spec.compressed_base = window_region;
    spec.compressed_rows = n_comp;
    DSINFER_ASSIGN_OR_RETURN(SparseRowLists lists,
                             BuildSparseRowLists(spec, pos, selected != nullptr ? &mine : nullptr));
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
                              scale, numerics_.round_bf16, probs, o + r0 * H * hd, dev_.stream()),
        "SparseAttention"));
    step_stats_.kv_bytes += (P - base + n + n_comp) * hd * 4;
  }
  return Status::Ok();
}

Status CudaModel::StoreWindow(int layer, const float* kv) {
  const model::ModelConfig& c = config();
  // The last `window` KV rows stay in the ring for the next step.
  for (size_t si = 0; si < segments_.size(); ++si) {
    const Segment& sg = segments_[si];
    DSINFER_RETURN_IF_ERROR(CudaStatus(
        LaunchRingScatter(kv + sg.row * c.head_dim, sg.n, sg.start_pos, c.window, c.head_dim,
                          Seq(si).layers[layer].ring.as<float>(), dev_.stream()),
        "ring scatter"));
  }
  return Status::Ok();
}

Status CudaModel::OutputProjectionA(int layer, const float* o, float* z) {
  const model::ModelConfig& c = config();
  const DeviceLayer& d = *layers_[layer];
  const int64_t T = step_rows_, H = c.n_heads, hd = c.head_dim;
  const int G = c.o_groups;
  const int64_t group_in = (H / G) * hd, L = c.o_lora_rank;
  DSINFER_ASSIGN_OR_RETURN(float* og, ws_->Get(dev_, Workspace::kOg, T * group_in));  // [T, in]
  DSINFER_ASSIGN_OR_RETURN(float* zg, ws_->Get(dev_, Workspace::kZg, T * L));         // [T, L]
  for (int g = 0; g < G; ++g) {
    DSINFER_RETURN_IF_ERROR(
        Copy2D(dev_, og, group_in, o + g * group_in, H * hd, group_in, T, "o group"));
    DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.wo_a_groups[g], og, T, zg));
    DSINFER_RETURN_IF_ERROR(Copy2D(dev_, z + g * L, G * L, zg, L, L, T, "z group"));
  }
  return Status::Ok();
}

// ---- MoE ------------------------------------------------------------------------------------

Status CudaModel::Route(int layer, bool hash, const float* x) {
  const model::ModelConfig& c = config();
  const DeviceLayer& d = *layers_[layer];
  const int64_t T = step_rows_;
  const int E = c.n_routed_experts, K = c.n_experts_per_tok;
  if (hash && d.tid2eid.data() == nullptr) return Internal("hash-routed layer without tid2eid");
  // Router on the device; its choices come back to group the tokens per expert.
  DSINFER_ASSIGN_OR_RETURN(float* logits,
                           ws_->Get(dev_, Workspace::kRouterLogits, T * E));  // [T, E]
  DSINFER_RETURN_IF_ERROR(MatMul(dev_, d.gate, x, T, logits));
  // chosen [T, K] int32 then weights [T, K] f32 in one buffer: one copy back.
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dsel, dev_.Alloc(static_cast<size_t>(2 * T * K) * 4));
  DSINFER_RETURN_IF_ERROR(cuda::Route(
      dev_, logits, T, E, K, hash ? nullptr : d.gate_bias.as<float>(),
      hash ? d.tid2eid.as<int32_t>() : nullptr, c.vocab_size, step_.tokens,
      static_cast<float>(c.route_scale), dsel.as<int32_t>(), dsel.as<float>() + T * K));
  Routing& rt = *routing_;
  rt.layer = layer;
  rt.sel.resize(static_cast<size_t>(2 * T * K));  // [chosen | weight bits]
  DSINFER_RETURN_IF_ERROR(dev_.CopyToHost(rt.sel.data(), dsel.data(), rt.sel.size() * 4));
  std::span<const int32_t> chosen(rt.sel.data(), static_cast<size_t>(T * K));
  for (int32_t e : chosen)
    if (e < 0 || e >= E) return Internal("MoE router chose expert " + std::to_string(e));
  DSINFER_ASSIGN_OR_RETURN(rt.groups, GroupRoutedTokens(chosen, E, K));
  const model::LayerWeights& lw = weights_.layers[layer];
  for (int e = 0; e < E; ++e)
    if (rt.groups.offsets[e + 1] > rt.groups.offsets[e]) {
      step_stats_.routed_expert_bytes +=
          lw.experts[e].w1.Bytes() + lw.experts[e].w2.Bytes() + lw.experts[e].w3.Bytes();
      step_stats_.n_routed_experts_used++;
    }
  // Everything the expert kernels index, in one upload of int32 words: per token its grouped
  // rows in ascending order (the CPU adds the routed outputs in expert order), per grouped row
  // its routing weight (f32 bits) and x row, the identity rows (w2 reads grouped row j itself),
  // and the grouped-GEMM tiles. GroupRoutedTokens' x rows are < T by construction.
  const int64_t TK = T * K;
  const std::vector<int32_t> tile_list = ExpertTileWords(rt.groups, kGroupedTileRows);  // [n, 3]
  std::vector<int32_t> idx(static_cast<size_t>(4 * TK) + tile_list.size());
  int32_t* token_rows = idx.data();       // [T, K]
  int32_t* row_weight = token_rows + TK;  // [TK] f32 bits
  int32_t* row_token = row_weight + TK;   // [TK]
  int32_t* identity = row_token + TK;     // [TK]
  int32_t* tile_words = identity + TK;    // [n_tiles, 3]
  std::vector<int32_t> fill(static_cast<size_t>(T), 0);
  for (int64_t j = 0; j < TK; ++j) {
    const int32_t t = rt.groups.tokens[j];
    token_rows[t * K + fill[t]++] = static_cast<int32_t>(j);
    row_weight[j] = rt.sel[TK + rt.groups.slots[j]];  // the weight's bits
    row_token[j] = t;
    identity[j] = static_cast<int32_t>(j);
  }
  std::copy(tile_list.begin(), tile_list.end(), tile_words);
  DSINFER_ASSIGN_OR_RETURN(rt.lists, dev_.UploadStaged(idx.data(), idx.size() * 4));
  rt.n_tiles = static_cast<int64_t>(tile_list.size() / 3);
  return Status::Ok();
}

Status CudaModel::Experts(int layer, const float* x, float* out) {
  const model::ModelConfig& c = config();
  const Numerics& nm = numerics_;
  const DeviceLayer& d = *layers_[layer];
  const Routing& rt = *routing_;
  if (rt.layer != layer) return Internal("Experts: no routing of this layer");
  const bool rb = nm.round_bf16;
  const int64_t T = step_rows_, D = c.hidden, inter = c.moe_inter;
  const int K = c.n_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);
  const int64_t TK = T * K;
  const int32_t* d_token_rows = rt.lists.as<const int32_t>();
  const float* d_row_weight = reinterpret_cast<const float*>(d_token_rows + TK);
  const int32_t* d_row_token = d_token_rows + 2 * TK;
  const int32_t* d_identity = d_token_rows + 3 * TK;
  const int32_t* d_tiles = d_token_rows + 4 * TK;
  // The tensor-core path's 64-row tiles and input codes, made when a set first needs them.
  DeviceBuffer tc_tiles;
  int64_t n_tc_tiles = 0;
  auto tc_tile_list = [&]() -> Status {
    if (tc_tiles.data() != nullptr) return Status::Ok();
    const std::vector<int32_t> words = ExpertTileWords(rt.groups, kTcGroupedTileRows);
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
        LaunchGroupedMatMul(set.format, set.views.as<const DeviceWeightView>(), d_tiles, rt.n_tiles,
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
  return CudaStatus(
      LaunchMoeCombine(down, d_token_rows, K, shared, T, D, rb, out, dev_.stream()), "MoE combine");
}

}  // namespace dsinfer::backend::cuda
