// The MoE ops of CpuOps (spec §6): sqrt(softplus) scores, hash or biased top-k routing, routed
// experts grouped so each expert's weights are read once for all of its tokens, shared expert.
#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "backend/router.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace dsinfer::backend::cpu {

namespace {

// SwiGLU expert over n rows of xq [n, hidden] (already activation-quantized when the mode asks):
// h = silu(min(w1 x, L)) * clamp(w3 x, -L, L) * route_weight; out = w2 h. out [n, hidden].
void Expert(const model::ExpertWeights& ew, const float* xq, int64_t n, const float* route_weight,
            float limit, const Numerics& nm, int act_block, ThreadPool& pool, float* out) {
  const int64_t inter = ew.w1.rows;
  std::vector<float> g(n * inter), u(n * inter);
  MatMul(ew.w1, xq, n, g.data(), pool);
  MatMul(ew.w3, xq, n, u.data(), pool);
  for (int64_t i = 0; i < n; ++i) {
    float w = route_weight ? route_weight[i] : 1.0f;
    for (int64_t j = 0; j < inter; ++j) {
      float gv = g[i * inter + j], uv = u[i * inter + j];
      if (nm.round_bf16) gv = RoundBf16(gv), uv = RoundBf16(uv);
      uv = std::clamp(uv, -limit, limit);
      // min(gv, L) leaves a gate at or below L as it is: bf16-exact when rounded.
      const float silu = nm.round_bf16 && gv <= limit
                             ? SiluOfBf16(static_cast<uint16_t>(std::bit_cast<uint32_t>(gv) >> 16))
                             : Silu(std::min(gv, limit));
      float h = silu * uv * w;  // routing weight applied before w2
      g[i * inter + j] = nm.round_bf16 ? RoundBf16(h) : h;
    }
    if (nm.quantize_activations)
      Fp8RoundTripInPlace(g.data() + i * inter, static_cast<int>(inter), act_block);
  }
  MatMul(ew.w2, g.data(), n, out, pool);
  if (nm.round_bf16) RoundBf16InPlace(out, n * ew.w2.rows);
}

}  // namespace

Status CpuOps::Route(int layer, bool hash, const float* x) {
  const model::ModelConfig& c = config();
  const model::LayerWeights& lw = Layer(layer);
  const int64_t T = static_cast<int64_t>(tokens_.size());
  const int E = c.RoutedExperts(layer), K = c.ExpertsPerToken(layer);  // dSpark: its own bank
  if (hash && !lw.tid2eid.valid()) return Internal("hash-routed layer without tid2eid");
  // fp32 scores; selection by the token's hash row or by top-k of (score + bias).
  std::vector<float> logits(T * E);  // [T, E]
  MatMul(lw.gate, x, T, logits.data(), pool_);
  stats_.macs += T * lw.gate.Elements();
  chosen_.resize(static_cast<size_t>(T * K));
  weight_.resize(static_cast<size_t>(T * K));
  std::vector<float> bias;  // [E] selection bias (biased routing)
  if (!hash) {
    bias.resize(E);
    for (int e = 0; e < E; ++e) bias[e] = lw.gate_bias.F32At(e);
  }
  std::vector<int32_t> idx(E), hash_ids(K);  // [E] scratch, [K] one token's tid2eid row
  // V4.1 (spec §14.6): logits / gate_temp; weights over (sum + 1e-20), normalised when K > 1.
  const bool v41 = c.V41();
  const float temp = static_cast<float>(c.gate_temp);
  for (int64_t t = 0; t < T; ++t) {
    float* s = logits.data() + t * E;
    if (v41)
      for (int e = 0; e < E; ++e) s[e] = std::sqrt(RouterSoftplus(s[e] / temp));
    else
      for (int e = 0; e < E; ++e) s[e] = std::sqrt(RouterSoftplus(s[e]));
    if (hash)  // ids validated at load (model/weights.cc)
      for (int k = 0; k < K; ++k)
        hash_ids[k] = static_cast<int32_t>(lw.tid2eid.IntAt(int64_t{tokens_[t]} * K + k));
    RouteOneToken(s, E, K, hash ? hash_ids.data() : nullptr, bias.data(),
                  static_cast<float>(c.route_scale), idx.data(), chosen_.data() + t * K,
                  weight_.data() + t * K, v41 ? 1e-20f : 0.0f, !v41 || K > 1);
  }
  return Status::Ok();
}

Status CpuOps::Experts(int layer, const float* x, float* out) {
  const model::ModelConfig& c = config();
  const model::LayerWeights& lw = Layer(layer);
  const Numerics& nm = numerics_;
  const int64_t T = static_cast<int64_t>(tokens_.size());
  const int64_t D = c.hidden;
  const int E = c.RoutedExperts(layer), K = c.ExpertsPerToken(layer);  // dSpark: its own bank
  const float limit = static_cast<float>(c.swiglu_limit);
  const std::vector<int32_t>& chosen = chosen_;
  const std::vector<float>& weight = weight_;
  std::vector<float> xq(x, x + T * D);  // [T, D] the experts' shared quantized input
  if (nm.quantize_activations)
    for (int64_t t = 0; t < T; ++t)
      Fp8RoundTripInPlace(xq.data() + t * D, static_cast<int>(D), c.act_block);

  // Group (token, slot) pairs by expert: one pass over each expert's weights.
  std::vector<std::vector<int64_t>> by_expert(E);
  for (int64_t i = 0; i < T * K; ++i) by_expert[chosen[i]].push_back(i);
  std::vector<int> used;  // experts with tokens, ascending
  for (int e = 0; e < E; ++e)
    if (!by_expert[e].empty()) used.push_back(e);
  // Experts run concurrently, one per thread with single-threaded matmuls: a routed expert gets
  // a token or two in decode, where splitting its three small matmuls across the pool costs a
  // synchronisation each. Each element is computed by the same kernel either way, and outputs
  // are summed in expert order below, so results do not depend on the schedule.
  // At decode sizes the shared expert is one more such task, handed out first (the largest):
  // alone after the routed ones, its three matmuls at 16 tokens read 75 MB at ~12.5 GB/s (a
  // batch-16 step on the Sapphire Rapids VM of docs/PERF.md) while the routed phase reads at ~21.
  // At prefill sizes it is a GEMM worth both cores and runs on the pool after them.
  constexpr int64_t kSharedAsTaskMaxTokens = 64;
  const bool shared_as_task = c.n_shared_experts > 0 && T <= kSharedAsTaskMaxTokens;
  std::vector<float> shared(c.n_shared_experts > 0 ? T * D : 0);  // [T, D]
  const int64_t first_routed = shared_as_task ? 1 : 0;
  // Experts with the most tokens first, so that the phase ends on one-token ones and the thread
  // that finishes first waits less; outputs[u] keeps expert order for the sum.
  std::vector<int64_t> schedule(used.size());  // task -> index into used
  std::iota(schedule.begin(), schedule.end(), int64_t{0});
  std::stable_sort(schedule.begin(), schedule.end(), [&](int64_t a, int64_t b) {
    return by_expert[used[a]].size() > by_expert[used[b]].size();
  });
  std::vector<std::vector<float>> outputs(used.size());  // [n_used][n, D]
  pool_.ParallelFor(first_routed + static_cast<int64_t>(used.size()), [&](int64_t task) {
    ThreadPool serial(1);  // no worker threads: runs on this task's thread
    if (task < first_routed) {
      Expert(lw.shared, xq.data(), T, nullptr, limit, nm, c.act_block, serial, shared.data());
      return;
    }
    const int64_t u = schedule[task - first_routed];
    const int e = used[u];
    const auto& slots = by_expert[e];
    const int64_t n = static_cast<int64_t>(slots.size());
    std::vector<float> xe(n * D), we(n);  // [n, D], [n]
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(xq.data() + (slots[i] / K) * D, D, xe.data() + i * D);
      we[i] = weight[slots[i]];
    }
    outputs[u].resize(n * D);
    Expert(lw.experts[e], xe.data(), n, we.data(), limit, nm, c.act_block, serial,
           outputs[u].data());
  });
  std::vector<float> acc(T * D, 0.0f);  // fp32 accumulation of routed outputs
  for (size_t u = 0; u < used.size(); ++u) {
    const int e = used[u];
    const auto& slots = by_expert[e];
    stats_.routed_expert_bytes +=
        lw.experts[e].w1.Bytes() + lw.experts[e].w2.Bytes() + lw.experts[e].w3.Bytes();
    stats_.n_routed_experts_used++;
    stats_.macs += static_cast<int64_t>(slots.size()) * lw.experts[e].Elements();
    for (size_t i = 0; i < slots.size(); ++i) {
      float* dst = acc.data() + (slots[i] / K) * D;
      const float* src = outputs[u].data() + i * D;
      for (int64_t j = 0; j < D; ++j) dst[j] += src[j];
    }
  }
  if (c.n_shared_experts > 0) {
    if (!shared_as_task)
      Expert(lw.shared, xq.data(), T, nullptr, limit, nm, c.act_block, pool_, shared.data());
    stats_.macs += T * lw.shared.Elements();
    for (int64_t i = 0; i < T * D; ++i) acc[i] += shared[i];
  }
  for (int64_t i = 0; i < T * D; ++i) out[i] = nm.round_bf16 ? RoundBf16(acc[i]) : acc[i];
  return Status::Ok();
}

}  // namespace dsinfer::backend::cpu
