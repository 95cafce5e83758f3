#include "backend/cuda/ops.h"

#include <algorithm>
#include <string>

#include "backend/cuda/model_kernels.h"

namespace dsinfer::backend::cuda {

Result<DeviceWeight> UploadWeight(CudaDevice& dev, const model::WeightMatrix& w) {
  if (!w.valid()) return InvalidArgument("UploadWeight: empty weight " + w.name);
  DeviceWeight d;
  d.name = w.name;
  DeviceWeightView& v = d.view;
  v.rows = w.rows;
  v.cols = w.cols;
  v.scale_cols = w.scale_cols;
  v.scales_f32 = w.scale_dtype == DType::kF32;
  int64_t data_bytes = 0, scale_rows = 0;
  switch (w.format) {
    case model::WeightFormat::kF32:
      v.format = DeviceWeightView::Format::kF32;
      data_bytes = w.rows * w.cols * 4;
      break;
    case model::WeightFormat::kBF16:
      v.format = DeviceWeightView::Format::kBF16;
      data_bytes = w.rows * w.cols * 2;
      break;
    case model::WeightFormat::kFp8Block:
      v.format = DeviceWeightView::Format::kFp8Block;
      data_bytes = w.rows * w.cols;
      scale_rows = (w.rows + 127) / 128;
      break;
    case model::WeightFormat::kFp4Packed:
      if (w.cols % 32 != 0) return InvalidArgument(w.name + ": FP4 cols must be a multiple of 32");
      v.format = DeviceWeightView::Format::kFp4Packed;
      data_bytes = w.rows * w.cols / 2;
      scale_rows = w.rows;
      break;
  }
  DSINFER_ASSIGN_OR_RETURN(d.data, dev.Upload(w.data, static_cast<size_t>(data_bytes)));
  if (scale_rows > 0) {
    const int64_t scale_bytes = scale_rows * w.scale_cols * (v.scales_f32 ? 4 : 1);
    DSINFER_ASSIGN_OR_RETURN(d.scales, dev.Upload(w.scales, static_cast<size_t>(scale_bytes)));
  }
  v.data = d.data.as<const uint8_t>();
  v.scales = d.scales.as<const uint8_t>();
  return d;
}

Status MatMul(CudaDevice& dev, const DeviceWeight& w, const float* x, int64_t m, float* y) {
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchMatMul(w.view, x, m, y, dev.stream()), ("MatMul " + w.name).c_str());
}

Status TcMatMul(CudaDevice& dev, const DeviceWeight& w, const float* x, int64_t m, float* y,
                TcMma mma) {
  if (!TcMatMulApplies(w.view))
    return InvalidArgument("TcMatMul: " + w.name + " is not an FP8 matrix of 16-byte rows");
  if (mma == TcMma::kFp8 && dev.info().Sm() < 89)
    return FailedPrecondition("TcMatMul: FP8 MMA needs sm_89 or newer");
  if (m <= 0) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  const int64_t k_blocks = (w.view.cols + 127) / 128;
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer codes, dev.Alloc(static_cast<size_t>(m * w.view.cols)));
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer scales, dev.Alloc(static_cast<size_t>(m * k_blocks) * 4));
  const int splits = TcMatMulSplits(w.view, m, std::max(1, dev.info().sm_count));
  DeviceBuffer partial;
  if (splits > 1) {
    DSINFER_ASSIGN_OR_RETURN(partial, dev.Alloc(static_cast<size_t>(splits * m * w.view.rows) * 4));
  }
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      LaunchActQuantFp8(x, m, w.view.cols, codes.as<uint8_t>(), scales.as<float>(), dev.stream()),
      "TcMatMul act quant"));
  return CudaStatus(LaunchTcMatMul(mma, w.view, codes.as<const uint8_t>(), scales.as<const float>(),
                                   m, splits, partial.as<float>(), y, dev.stream()),
                    ("TcMatMul " + w.name).c_str());
}

std::vector<TcMma> AvailableTcMmas(const DeviceInfo& info) {
  if (info.Sm() >= 89) return {TcMma::kF16, TcMma::kFp8};
  return {TcMma::kF16};
}

TcMma DefaultTcMma(const DeviceInfo& info) {
  // The FP8 MMA where it was measured (H200, 2026-12-04): its worst error over the conformance
  // grid was 2.2e-7 of sum |x w| (the fp16 MMA's: 2.0e-7; docs/NUMERICS.md) at 3 % more
  // throughput. Other FP8-capable architectures keep the fp16 MMA until measured.
  return info.sm_major == 9 ? TcMma::kFp8 : TcMma::kF16;
}

Status RmsNormRows(CudaDevice& dev, float* x, int64_t rows, int64_t n, const float* weight,
                   double eps, bool round_bf16) {
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(
      LaunchRmsNorm(x, rows, n, weight, static_cast<float>(eps), round_bf16, dev.stream()),
      "RmsNorm");
}

Status ApplyRope(CudaDevice& dev, float* x, int64_t rows, int64_t row_stride, int64_t offset,
                 const int64_t* positions, const float* inv_freq, int half, bool inverse,
                 bool round_bf16) {
  if (offset + 2 * half > row_stride) return InvalidArgument("ApplyRope: rope dims past the row");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchRope(x, rows, row_stride, offset, positions, inv_freq, half, inverse,
                               round_bf16, dev.stream()),
                    "Rope");
}

Status HcPre(CudaDevice& dev, const HcShape& s, const float* fn, const float* base,
             const float* scale, const float* H, int64_t tokens, float* dots, float* x, float* mix,
             bool round_bf16) {
  if (s.hc < 1 || s.hc > 8) return InvalidArgument("HcPre: hc_mult must be 1..8");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(
      LaunchHcPre(s, fn, base, scale, H, tokens, dots, x, mix, round_bf16, dev.stream()), "HcPre");
}

Status HcPost(CudaDevice& dev, const HcShape& s, const float* mix, const float* a, float* H,
              int64_t tokens, bool round_bf16) {
  if (s.hc < 1 || s.hc > 8) return InvalidArgument("HcPost: hc_mult must be 1..8");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchHcPost(s, mix, a, H, tokens, round_bf16, dev.stream()), "HcPost");
}

Status Route(CudaDevice& dev, const float* logits, int64_t tokens, int n_experts, int top_k,
             const float* bias, const int32_t* tid2eid, int64_t vocab, const int32_t* token_ids,
             float route_scale, int32_t* chosen, float* weights) {
  if (n_experts < 1 || n_experts > kRouterMaxExperts || top_k < 1 || top_k > kRouterMaxK ||
      top_k > n_experts)
    return InvalidArgument("Route: need 1 <= top_k <= min(n_experts, " +
                           std::to_string(kRouterMaxK) +
                           ") and n_experts <= " + std::to_string(kRouterMaxExperts) +
                           ", got K=" + std::to_string(top_k) + " E=" + std::to_string(n_experts));
  if (bias == nullptr && tid2eid == nullptr)
    return InvalidArgument("Route: neither a bias (biased top-k) nor a tid2eid table");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchRouter(logits, tokens, n_experts, top_k, bias, tid2eid, vocab, token_ids,
                                 route_scale, chosen, weights, dev.stream()),
                    "Router");
}

Result<DeviceExpertSet> UploadExperts(CudaDevice& dev,
                                      std::span<const model::WeightMatrix* const> experts) {
  if (experts.empty()) return InvalidArgument("UploadExperts: no experts");
  DeviceExpertSet set;
  std::vector<DeviceWeightView> views;
  for (const model::WeightMatrix* w : experts) {
    if (w == nullptr) return InvalidArgument("UploadExperts: a missing expert weight");
    DSINFER_ASSIGN_OR_RETURN(DeviceWeight d, UploadWeight(dev, *w));
    if (!views.empty() &&
        (d.view.format != views[0].format || d.view.rows != views[0].rows ||
         d.view.cols != views[0].cols || d.view.scales_f32 != views[0].scales_f32))
      return InvalidArgument("UploadExperts: " + w->name + " differs in format or shape from " +
                             set.weights[0].name);
    views.push_back(d.view);
    set.weights.push_back(std::move(d));
  }
  set.format = views[0].format;
  set.rows = views[0].rows;
  set.cols = views[0].cols;
  set.data_16b_aligned = std::all_of(views.begin(), views.end(), [](const DeviceWeightView& v) {
    return reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
  });
  DSINFER_ASSIGN_OR_RETURN(set.views, dev.Upload(views.data(), views.size() * sizeof(views[0])));
  return set;
}

namespace {

// GroupedMatMul's argument checks: groups for this set, rows inside x.
Status CheckGroups(const char* op, const DeviceExpertSet& experts, const RoutedGroups& groups,
                   int64_t x_rows) {
  const int64_t n_experts = static_cast<int64_t>(experts.weights.size());
  if (static_cast<int64_t>(groups.offsets.size()) != n_experts + 1)
    return InvalidArgument(std::string(op) + ": groups are for " +
                           std::to_string(static_cast<int64_t>(groups.offsets.size()) - 1) +
                           " experts, the set has " + std::to_string(n_experts));
  if (groups.tokens.size() != groups.slots.size() ||
      groups.offsets.back() != static_cast<int32_t>(groups.slots.size()))
    return InvalidArgument(std::string(op) + ": inconsistent groups");
  for (int32_t tok : groups.tokens)
    if (tok < 0 || tok >= x_rows)
      return InvalidArgument(std::string(op) + ": grouped row reads x row " + std::to_string(tok) +
                             " of " + std::to_string(x_rows));
  return Status::Ok();
}

// The grouped kernels' index buffers on the device: tiles [n_tiles, 3] (expert, begin, count
// <= tile_rows) and the x row of each grouped row.
struct GroupIndex {
  DeviceBuffer tiles, rows;
  int64_t n_tiles = 0;
};

Result<GroupIndex> UploadGroupIndex(CudaDevice& dev, const RoutedGroups& groups, int tile_rows) {
  GroupIndex index;
  const std::vector<int32_t> packed = ExpertTileWords(groups, tile_rows);  // [n_tiles, 3]
  index.n_tiles = static_cast<int64_t>(packed.size() / 3);
  if (index.n_tiles == 0) return index;
  DSINFER_ASSIGN_OR_RETURN(index.tiles, dev.Upload(packed.data(), packed.size() * 4));
  DSINFER_ASSIGN_OR_RETURN(index.rows, dev.Upload(groups.tokens.data(), groups.tokens.size() * 4));
  return index;
}

}  // namespace

bool TcGroupedApplies(const DeviceExpertSet& experts) {
  return experts.data_16b_aligned && TcGroupedApplies(experts.format, experts.rows, experts.cols);
}

Status TcGroupedMatMul(CudaDevice& dev, const DeviceExpertSet& experts, const RoutedGroups& groups,
                       const float* x, int64_t x_rows, float* y, TcMma mma) {
  if (!TcGroupedApplies(experts))
    return InvalidArgument("TcGroupedMatMul: the experts are not FP4 with 128-column blocks");
  if (mma == TcMma::kFp8 && dev.info().Sm() < 89)
    return FailedPrecondition("TcGroupedMatMul: FP8 MMA needs sm_89 or newer");
  DSINFER_RETURN_IF_ERROR(CheckGroups("TcGroupedMatMul", experts, groups, x_rows));
  DSINFER_ASSIGN_OR_RETURN(GroupIndex index, UploadGroupIndex(dev, groups, kTcGroupedTileRows));
  if (index.n_tiles == 0) return Status::Ok();
  const int64_t k = experts.cols;
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer codes, dev.Alloc(static_cast<size_t>(x_rows * k)));
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer scales,
                           dev.Alloc(static_cast<size_t>(x_rows * k / 128) * 4));
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      LaunchActQuantFp8(x, x_rows, k, codes.as<uint8_t>(), scales.as<float>(), dev.stream()),
      "TcGroupedMatMul act quant"));
  return CudaStatus(
      LaunchTcGroupedMatMul(mma, experts.views.as<const DeviceWeightView>(),
                            index.tiles.as<const int32_t>(), index.n_tiles,
                            index.rows.as<const int32_t>(), codes.as<const uint8_t>(),
                            scales.as<const float>(), experts.rows, k, y, dev.stream()),
      "TcGroupedMatMul");  // the buffers are freed in stream order
}

Status GroupedMatMul(CudaDevice& dev, const DeviceExpertSet& experts, const RoutedGroups& groups,
                     const float* x, int64_t x_rows, float* y) {
  DSINFER_RETURN_IF_ERROR(CheckGroups("GroupedMatMul", experts, groups, x_rows));
  DSINFER_ASSIGN_OR_RETURN(GroupIndex index, UploadGroupIndex(dev, groups, kGroupedTileRows));
  if (index.n_tiles == 0) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(LaunchGroupedMatMul(experts.format, experts.views.as<const DeviceWeightView>(),
                                     index.tiles.as<const int32_t>(), index.n_tiles,
                                     index.rows.as<const int32_t>(), x, experts.rows, experts.cols,
                                     y, dev.stream()),
                 "GroupedMatMul"));
  return Status::Ok();  // the index buffers are freed in stream order
}

Status IndexerScores(CudaDevice& dev, const float* q, const float* w, const float* keys,
                     int64_t n_keys, std::span<const int32_t> n_vis, int heads, int head_dim,
                     int64_t max_keys, bool round_bf16, float* scores) {
  if (heads < 1 || head_dim < 1) return InvalidArgument("IndexerScores: empty heads");
  for (int32_t v : n_vis)
    if (v < 0 || v > max_keys || v > n_keys)
      return InvalidArgument("IndexerScores: " + std::to_string(v) + " visible keys, but " +
                             std::to_string(n_keys) + " keys and a row stride of " +
                             std::to_string(max_keys));
  if (n_vis.empty()) return Status::Ok();
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dn, dev.Upload(n_vis.data(), n_vis.size() * 4));
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      LaunchIndexerScores(q, w, keys, dn.as<const int32_t>(), static_cast<int64_t>(n_vis.size()),
                          heads, head_dim, max_keys, round_bf16, scores, dev.stream()),
      "IndexerScores"));
  return Status::Ok();  // the index buffers are freed in stream order
}

Status TopK(CudaDevice& dev, const float* scores, int64_t stride, std::span<const int32_t> n, int k,
            int32_t* idx) {
  if (k < 1) return InvalidArgument("TopK: k must be >= 1");
  for (int32_t v : n)
    if (v < 0 || v > stride)
      return InvalidArgument("TopK: " + std::to_string(v) + " scores in a row of " +
                             std::to_string(stride));
  if (n.empty()) return Status::Ok();
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer dn, dev.Upload(n.data(), n.size() * 4));
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  DSINFER_RETURN_IF_ERROR(CudaStatus(LaunchTopK(scores, static_cast<int64_t>(n.size()), stride,
                                                dn.as<const int32_t>(), k, idx, dev.stream()),
                                     "TopK"));
  return Status::Ok();  // the index buffers are freed in stream order
}

Status SparseAttention(CudaDevice& dev, const float* q, int heads, int head_dim, const float* kv,
                       int64_t pool_rows, const SparseRowLists& lists, const float* sink,
                       float scale, bool round_bf16, float* out) {
  if (heads < 1 || head_dim < 1) return InvalidArgument("SparseAttention: empty heads");
  if (lists.offsets.empty() || lists.offsets.front() != 0 ||
      lists.offsets.back() != static_cast<int32_t>(lists.rows.size()))
    return InvalidArgument("SparseAttention: malformed row lists");
  for (size_t t = 0; t + 1 < lists.offsets.size(); ++t)
    if (lists.offsets[t + 1] < lists.offsets[t])
      return InvalidArgument("SparseAttention: row list offsets decrease");
  for (int32_t r : lists.rows)
    if (r < 0 || r >= pool_rows)
      return InvalidArgument("SparseAttention: row " + std::to_string(r) + " outside the pool's " +
                             std::to_string(pool_rows));
  const int64_t tokens = static_cast<int64_t>(lists.offsets.size()) - 1;
  if (tokens == 0) return Status::Ok();
  const int64_t total = static_cast<int64_t>(lists.rows.size());
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer doff,
                           dev.Upload(lists.offsets.data(), lists.offsets.size() * 4));
  // An empty list still needs a valid pointer; never read past the host vector.
  DeviceBuffer drows;
  if (total > 0) {
    DSINFER_ASSIGN_OR_RETURN(drows, dev.Upload(lists.rows.data(), lists.rows.size() * 4));
  } else {
    DSINFER_ASSIGN_OR_RETURN(drows, dev.Alloc(4));
  }
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer probs,
                           dev.Alloc(static_cast<size_t>(std::max<int64_t>(1, heads * total)) * 4));
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(LaunchSparseAttention(q, tokens, heads, head_dim, kv, doff.as<const int32_t>(),
                                       drows.as<const int32_t>(), total, sink, scale, round_bf16,
                                       probs.as<float>(), out, dev.stream()),
                 "SparseAttention"));
  return Status::Ok();  // the index buffers are freed in stream order
}

Status CompressorPool(CudaDevice& dev, const float* a, const float* g, const float* ape,
                      int64_t n_groups, int ratio, int width, bool overlap, const float* prev_a,
                      const float* prev_score, float* rows) {
  if (ratio < 1 || width < 1 || (overlap && width % 2 != 0))
    return InvalidArgument("CompressorPool: need ratio >= 1 and width >= 1 (even with overlap)");
  if ((prev_a == nullptr) != (prev_score == nullptr))
    return InvalidArgument("CompressorPool: prev_a and prev_score go together");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchCompressorPool(a, g, ape, n_groups, ratio, width, overlap, prev_a,
                                         prev_score, rows, dev.stream()),
                    "CompressorPool");
}

}  // namespace dsinfer::backend::cuda
