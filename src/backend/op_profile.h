// Where a step's time goes, op by op: ProfiledOps wraps any V4Ops and times every call the layer
// program makes into an OpProfile, keyed by the op (and, for Linear, the weight: the head and
// the attention projections differ by orders of magnitude). Meant for `dsinfer bench model
// --profile`, on a backend whose ops run synchronously (the CPU): on the GPU a call returns when
// its kernels are queued, so its time there is launch cost, not work (the GPU keeps its phase
// marks, V4Ops::Mark).
// The wrapper forwards every argument and result unchanged, so a profiled step computes the same
// bits as an unprofiled one (tests/backend/forward_test.cc, Forward.ProfiledSteps...).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/v4_ops.h"

namespace dsinfer::backend {

class OpProfile {
 public:
  struct Entry {
    std::string op;
    int64_t calls = 0;
    double seconds = 0;
  };

  void Add(const std::string& op, double seconds);
  void Clear() { by_op_.clear(); }
  // Every op seen, the most expensive first (ties: by name).
  std::vector<Entry> Sorted() const;
  double TotalSeconds() const;
  // A Markdown table: op, calls per step, ms per step, share of the profiled time; `steps`
  // divides the totals (the profile of several steps shown per step).
  std::string Table(int steps) const;

 private:
  std::map<std::string, Entry> by_op_;
};

// The weight's checkpoint name within its layer (the profile's label for Linear).
const char* WeightName(Weight weight);

class ProfiledOps final : public V4Ops {
 public:
  ProfiledOps(V4Ops& inner, OpProfile& profile) : inner_(inner), profile_(profile) {}

  Status BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) override;
  Result<float*> Get(Buf buf, int64_t n_floats) override;
  Status Embed(int copies, float* out) override;
  Status HcPre(int layer, HcSite site, const float* H, float* x, float* mix) override;
  Status HcPost(const float* mix, const float* y, float* H) override;
  Status HcHead(int layer, const float* H, int64_t rows, float* y) override;
  Status HcPreCarried(int layer, HcSite site, const float* H, const float* carry,
                      int64_t carry_stride, float* x, float* mix) override;
  Status HcCollapse(const float* H, int64_t rows, const float* pre, int64_t pre_stride,
                    float* y) override;
  Status RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) override;
  Status HeadRmsNorm(float* x, int64_t rows, int64_t dim) override;
  std::span<const int32_t> DraftVocabulary() const override;
  Status Linear(int layer, Weight weight, LinearMode mode, const float* x, int64_t rows,
                float* y) override;
  Status OutputProjectionA(int layer, const float* o, float* z) override;
  Status Rope(int layer, float* x, RopeRows rows, int64_t stride, int64_t offset,
              bool inverse) override;
  Status RopeAt(int layer, float* x, std::span<const int64_t> positions, int64_t stride,
                int64_t offset) override;
  Status ScaleRound(float* x, int64_t n, float scale) override;
  Status Fp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status Fp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status Fp4E4m3RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) override;
  Status Hadamard(float* x, int64_t rows, int64_t n) override;
  Status AddToStreams(const float* e, float* X) override;
  Result<CompressedRows> CompressorPool(int layer, Compressor which, const float* a, const float* g,
                                        float* rows_out) override;
  Status StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                         const float* data) override;
  Result<Selection> IndexerSelect(const IndexerQuery& query) override;
  Status SparseAttention(int layer, int kv_layer, int ratio, const float* q, const float* kv,
                         const Selection* selected, float* o) override;
  Status StoreWindow(int layer, const float* kv) override;
  Status EngramBegin() override;
  Status EngramGather(int layer, float* rows) override;
  Status EngramGate(int layer, const float* kv, float* H) override;
  Status DraftAttention(int layer, const float* q, const float* kv, float* o) override;
  Status MarkovEmbed(int layer, std::span<const int32_t> ids, float* out) override;
  Status Route(int layer, bool hash, const float* x) override;
  Status Experts(int layer, const float* x, float* out) override;
  Status GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                    float* dst) override;
  Status Download(const float* src, int64_t n, float* host) override;
  Status Upload(const float* host, int64_t n, float* dst) override;
  Status Mark(Phase phase) override { return inner_.Mark(phase); }

 private:
  // Runs fn() and adds its wall time under `op`.
  template <typename Fn>
  auto Timed(const std::string& op, Fn&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = fn();
    profile_.Add(op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return result;
  }

  V4Ops& inner_;
  OpProfile& profile_;
};

}  // namespace dsinfer::backend
