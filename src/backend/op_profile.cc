#include "backend/op_profile.h"

#include <algorithm>
#include <cstdio>

namespace dsinfer::backend {

void OpProfile::Add(const std::string& op, double seconds) {
  Entry& e = by_op_[op];
  if (e.op.empty()) e.op = op;
  ++e.calls;
  e.seconds += seconds;
}

std::vector<OpProfile::Entry> OpProfile::Sorted() const {
  std::vector<Entry> out;
  out.reserve(by_op_.size());
  for (const auto& [op, e] : by_op_) out.push_back(e);
  std::stable_sort(out.begin(), out.end(),
                   [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}

double OpProfile::TotalSeconds() const {
  double total = 0;
  for (const auto& [op, e] : by_op_) total += e.seconds;
  return total;
}

std::string OpProfile::Table(int steps) const {
  const double per = steps > 0 ? 1.0 / steps : 1.0;
  const double total = TotalSeconds();
  std::string out = "| op | calls/step | ms/step | share |\n|---|---|---|---|\n";
  char line[256];
  for (const Entry& e : Sorted()) {
    std::snprintf(line, sizeof line, "| %s | %.1f | %.2f | %.1f %% |\n", e.op.c_str(),
                  static_cast<double>(e.calls) * per, e.seconds * per * 1e3,
                  total > 0 ? 100.0 * e.seconds / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "| all ops | | %.2f | 100 %% |\n", total * per * 1e3);
  out += line;
  return out;
}

const char* WeightName(Weight weight) {
  switch (weight) {
    case Weight::kWqA: return "wq_a";
    case Weight::kWqB: return "wq_b";
    case Weight::kWkv: return "wkv";
    case Weight::kWoB: return "wo_b";
    case Weight::kCompressorWkv: return "compressor.wkv";
    case Weight::kCompressorWgate: return "compressor.wgate";
    case Weight::kIndexWqB: return "indexer.wq_b";
    case Weight::kIndexWeightsProj: return "indexer.weights_proj";
    case Weight::kIndexCompressorWkv: return "indexer.compressor.wkv";
    case Weight::kIndexCompressorWgate: return "indexer.compressor.wgate";
    case Weight::kEProj: return "mtp.e_proj";
    case Weight::kHProj: return "mtp.h_proj";
    case Weight::kHead: return "head";
    case Weight::kIndexWk: return "indexer.wk";
    case Weight::kEngramWkv: return "engram.wkv";
    case Weight::kMainProj: return "dspark.main_proj";
    case Weight::kMarkovHead: return "dspark.markov_head";
    case Weight::kConfidence: return "dspark.confidence_head";
    case Weight::kDraftHead: return "head (draft vocabulary)";
    case Weight::kDraftMarkovHead: return "dspark.markov_head (draft vocabulary)";
  }
  return "?";
}

namespace {

std::string CompressorName(Compressor which) {
  return which == Compressor::kKv ? "kv" : "index";
}

}  // namespace

Status ProfiledOps::BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) {
  return Timed("begin_step", [&] { return inner_.BeginStep(segments, tokens); });
}
// Get hands out scratch pointers; not an op, not timed.
Result<float*> ProfiledOps::Get(Buf buf, int64_t n_floats) { return inner_.Get(buf, n_floats); }
Status ProfiledOps::Embed(int copies, float* out) {
  return Timed("embed", [&] { return inner_.Embed(copies, out); });
}
Status ProfiledOps::HcPre(int layer, HcSite site, const float* H, float* x, float* mix) {
  return Timed("mhc_pre", [&] { return inner_.HcPre(layer, site, H, x, mix); });
}
Status ProfiledOps::HcPost(const float* mix, const float* y, float* H) {
  return Timed("mhc_post", [&] { return inner_.HcPost(mix, y, H); });
}
Status ProfiledOps::HcHead(int layer, const float* H, int64_t rows, float* y) {
  return Timed("mhc_head", [&] { return inner_.HcHead(layer, H, rows, y); });
}
Status ProfiledOps::HcPreCarried(int layer, HcSite site, const float* H, const float* carry,
                                 int64_t carry_stride, float* x, float* mix) {
  return Timed("mhc_pre", [&] {
    return inner_.HcPreCarried(layer, site, H, carry, carry_stride, x, mix);
  });
}
Status ProfiledOps::HcCollapse(const float* H, int64_t rows, const float* pre, int64_t pre_stride,
                               float* y) {
  return Timed("mhc_collapse", [&] { return inner_.HcCollapse(H, rows, pre, pre_stride, y); });
}
Status ProfiledOps::RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) {
  return Timed("rms_norm", [&] { return inner_.RmsNorm(layer, norm, x, rows, dim); });
}
Status ProfiledOps::HeadRmsNorm(float* x, int64_t rows, int64_t dim) {
  return Timed("rms_norm", [&] { return inner_.HeadRmsNorm(x, rows, dim); });
}
std::span<const int32_t> ProfiledOps::DraftVocabulary() const {
  return inner_.DraftVocabulary();
}
Status ProfiledOps::Linear(int layer, Weight weight, LinearMode mode, const float* x, int64_t rows,
                           float* y) {
  return Timed(std::string("linear ") + WeightName(weight),
               [&] { return inner_.Linear(layer, weight, mode, x, rows, y); });
}
Status ProfiledOps::OutputProjectionA(int layer, const float* o, float* z) {
  return Timed("linear wo_a (grouped)", [&] { return inner_.OutputProjectionA(layer, o, z); });
}
Status ProfiledOps::Rope(int layer, float* x, RopeRows rows, int64_t stride, int64_t offset,
                         bool inverse) {
  return Timed("rope", [&] { return inner_.Rope(layer, x, rows, stride, offset, inverse); });
}
Status ProfiledOps::RopeAt(int layer, float* x, std::span<const int64_t> positions, int64_t stride,
                           int64_t offset) {
  return Timed("rope", [&] { return inner_.RopeAt(layer, x, positions, stride, offset); });
}
Status ProfiledOps::ScaleRound(float* x, int64_t n, float scale) {
  return Timed("round trips", [&] { return inner_.ScaleRound(x, n, scale); });
}
Status ProfiledOps::Fp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  return Timed("round trips", [&] { return inner_.Fp8RoundTrip(x, rows, n, stride, block); });
}
Status ProfiledOps::Fp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) {
  return Timed("round trips", [&] { return inner_.Fp4RoundTrip(x, rows, n, stride, block); });
}
Status ProfiledOps::Fp4E4m3RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride,
                                     int block) {
  return Timed("round trips", [&] { return inner_.Fp4E4m3RoundTrip(x, rows, n, stride, block); });
}
Status ProfiledOps::Hadamard(float* x, int64_t rows, int64_t n) {
  return Timed("hadamard", [&] { return inner_.Hadamard(x, rows, n); });
}
Status ProfiledOps::AddToStreams(const float* e, float* X) {
  return Timed("add_to_streams", [&] { return inner_.AddToStreams(e, X); });
}
Result<CompressedRows> ProfiledOps::CompressorPool(int layer, Compressor which, const float* a,
                                                   const float* g, float* rows_out) {
  return Timed("compressor_pool " + CompressorName(which),
               [&] { return inner_.CompressorPool(layer, which, a, g, rows_out); });
}
Status ProfiledOps::StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                                    const float* data) {
  return Timed("store_compressed " + CompressorName(which),
               [&] { return inner_.StoreCompressed(layer, which, rows, data); });
}
Result<Selection> ProfiledOps::IndexerSelect(const IndexerQuery& query) {
  return Timed("indexer_select", [&] { return inner_.IndexerSelect(query); });
}
Status ProfiledOps::SparseAttention(int layer, int kv_layer, int ratio, const float* q,
                                    const float* kv, const Selection* selected, float* o) {
  // By kind: the window only, the window + selected CSA rows, the window + every HCA row.
  const char* kind = ratio == 0 ? "sparse_attention window"
                     : selected  ? "sparse_attention window+selected"
                                 : "sparse_attention window+all compressed";
  return Timed(kind,
               [&] { return inner_.SparseAttention(layer, kv_layer, ratio, q, kv, selected, o); });
}
Status ProfiledOps::StoreWindow(int layer, const float* kv) {
  return Timed("store_window", [&] { return inner_.StoreWindow(layer, kv); });
}
Status ProfiledOps::EngramBegin() {
  return Timed("engram", [&] { return inner_.EngramBegin(); });
}
Status ProfiledOps::EngramGather(int layer, float* rows) {
  return Timed("engram", [&] { return inner_.EngramGather(layer, rows); });
}
Status ProfiledOps::EngramGate(int layer, const float* kv, float* H) {
  return Timed("engram", [&] { return inner_.EngramGate(layer, kv, H); });
}
Status ProfiledOps::DraftAttention(int layer, const float* q, const float* kv, float* o) {
  return Timed("dspark attention", [&] { return inner_.DraftAttention(layer, q, kv, o); });
}
Status ProfiledOps::MarkovEmbed(int layer, std::span<const int32_t> ids, float* out) {
  return Timed("dspark markov embed", [&] { return inner_.MarkovEmbed(layer, ids, out); });
}
Status ProfiledOps::Route(int layer, bool hash, const float* x) {
  return Timed("moe route", [&] { return inner_.Route(layer, hash, x); });
}
Status ProfiledOps::Experts(int layer, const float* x, float* out) {
  return Timed("moe experts (routed + shared)", [&] { return inner_.Experts(layer, x, out); });
}
Status ProfiledOps::GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                               float* dst) {
  return Timed("gather/copy", [&] { return inner_.GatherRows(src, rows, width, dst); });
}
Status ProfiledOps::Download(const float* src, int64_t n, float* host) {
  return Timed("gather/copy", [&] { return inner_.Download(src, n, host); });
}
Status ProfiledOps::Upload(const float* host, int64_t n, float* dst) {
  return Timed("gather/copy", [&] { return inner_.Upload(host, n, dst); });
}

}  // namespace dsinfer::backend
