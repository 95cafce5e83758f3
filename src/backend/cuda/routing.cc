#include "backend/cuda/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace dsinfer::backend::cuda {

Status RouteTokens(const RouterParams& p, std::span<const float> logits,
                   std::span<const int32_t> token_ids, std::vector<int32_t>* chosen,
                   std::vector<float>* weights) {
  const int E = p.n_experts, K = p.top_k;
  const int64_t T = static_cast<int64_t>(token_ids.size());
  if (E < 1 || K < 1 || K > E)
    return InvalidArgument("RouteTokens: need 1 <= top_k <= n_experts, got K=" + std::to_string(K) +
                           " E=" + std::to_string(E));
  if (static_cast<int64_t>(logits.size()) != T * E)
    return InvalidArgument("RouteTokens: logits hold " + std::to_string(logits.size()) +
                           " values, expected tokens*experts = " + std::to_string(T * E));
  if (p.tid2eid == nullptr && p.bias == nullptr)
    return InvalidArgument("RouteTokens: neither a bias (biased top-k) nor a tid2eid table");
  chosen->assign(static_cast<size_t>(T * K), 0);
  weights->assign(static_cast<size_t>(T * K), 0.0f);
  std::vector<float> s(static_cast<size_t>(E));  // [E] sqrt(softplus) scores of one token
  std::vector<int32_t> idx(static_cast<size_t>(E)), hash_ids(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) s[e] = std::sqrt(RouterSoftplus(logits[t * E + e]));
    if (p.tid2eid != nullptr) {
      const int64_t tok = token_ids[t];
      if (tok < 0 || tok >= p.vocab)
        return InvalidArgument("RouteTokens: token id " + std::to_string(tok) +
                               " outside the hash table's " + std::to_string(p.vocab) + " rows");
      for (int k = 0; k < K; ++k) {
        const int32_t e = p.tid2eid[tok * K + k];
        if (e < 0 || e >= E)
          return InvalidArgument("RouteTokens: tid2eid holds expert " + std::to_string(e));
        hash_ids[k] = e;
      }
    }
    // The CPU backend's own rule (backend/router.h), so this oracle cannot drift from moe.cc.
    RouteOneToken(s.data(), E, K, p.tid2eid != nullptr ? hash_ids.data() : nullptr, p.bias,
                  p.route_scale, idx.data(), chosen->data() + t * K, weights->data() + t * K);
  }
  return Status::Ok();
}

Result<RoutedGroups> GroupRoutedTokens(std::span<const int32_t> chosen, int n_experts, int top_k) {
  if (n_experts < 1 || top_k < 1)
    return InvalidArgument("GroupRoutedTokens: need n_experts >= 1 and top_k >= 1");
  if (chosen.size() % static_cast<size_t>(top_k) != 0)
    return InvalidArgument("GroupRoutedTokens: " + std::to_string(chosen.size()) +
                           " routed slots is not a multiple of top_k " + std::to_string(top_k));
  if (chosen.size() > static_cast<size_t>(INT32_MAX))
    return InvalidArgument("GroupRoutedTokens: too many routed slots");
  RoutedGroups g;
  g.offsets.assign(static_cast<size_t>(n_experts) + 1, 0);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int32_t e = chosen[i];
    if (e < 0 || e >= n_experts)
      return InvalidArgument("GroupRoutedTokens: slot " + std::to_string(i) + " routes to expert " +
                             std::to_string(e) + " outside [0, " + std::to_string(n_experts) + ")");
    ++g.offsets[static_cast<size_t>(e) + 1];
  }
  std::partial_sum(g.offsets.begin(), g.offsets.end(), g.offsets.begin());
  // Counting sort, stable: ascending i within each expert.
  std::vector<int32_t> fill(g.offsets.begin(), g.offsets.end() - 1);
  g.slots.resize(chosen.size());
  g.tokens.resize(chosen.size());
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int32_t at = fill[chosen[i]]++;
    g.slots[at] = static_cast<int32_t>(i);
    g.tokens[at] = static_cast<int32_t>(i / static_cast<size_t>(top_k));
  }
  return g;
}

std::vector<ExpertTile> BuildExpertTiles(const RoutedGroups& g, int max_rows) {
  std::vector<ExpertTile> tiles;
  const int step = std::max(1, max_rows);
  for (size_t e = 0; e + 1 < g.offsets.size(); ++e)
    for (int32_t b = g.offsets[e]; b < g.offsets[e + 1]; b += step)
      tiles.push_back({static_cast<int32_t>(e), b, std::min(step, g.offsets[e + 1] - b)});
  return tiles;
}

std::vector<int32_t> ExpertTileWords(const RoutedGroups& g, int max_rows) {
  std::vector<int32_t> words;
  for (const ExpertTile& t : BuildExpertTiles(g, max_rows))
    words.insert(words.end(), {t.expert, t.begin, t.count});
  return words;
}

Result<SparseRowLists> BuildSparseRowLists(const SparseRowSpec& s, std::span<const int64_t> pos,
                                           const std::vector<std::vector<int32_t>>* selected) {
  if (s.window < 1) return InvalidArgument("BuildSparseRowLists: window must be >= 1");
  if (s.ratio < 0) return InvalidArgument("BuildSparseRowLists: ratio must be >= 0");
  if (selected != nullptr && selected->size() != pos.size())
    return InvalidArgument("BuildSparseRowLists: one selected list per query is needed");
  SparseRowLists out;
  out.offsets.reserve(pos.size() + 1);
  out.offsets.push_back(0);
  for (size_t t = 0; t < pos.size(); ++t) {
    const int64_t p = pos[t];
    const int64_t first = std::max<int64_t>(0, p - s.window + 1);
    if (first < s.window_first_pos || p - s.window_first_pos >= s.window_rows)
      return InvalidArgument(
          "BuildSparseRowLists: query position " + std::to_string(p) + " needs window positions " +
          std::to_string(first) + ".." + std::to_string(p) + " outside the pool's " +
          std::to_string(s.window_first_pos) + "+" + std::to_string(s.window_rows));
    for (int64_t q = first; q <= p; ++q)
      out.rows.push_back(static_cast<int32_t>(q - s.window_first_pos));
    auto add_compressed = [&](int64_t j) -> Status {
      if (j < 0 || j >= s.compressed_rows)
        return InvalidArgument("BuildSparseRowLists: compressed row " + std::to_string(j) +
                               " outside the pool's " + std::to_string(s.compressed_rows));
      out.rows.push_back(static_cast<int32_t>(s.compressed_base + j));
      return Status::Ok();
    };
    if (s.ratio > 0 && selected != nullptr) {
      for (int32_t j : (*selected)[t]) DSINFER_RETURN_IF_ERROR(add_compressed(j));
    } else if (s.ratio > 0) {
      for (int64_t j = 0; j < (p + 1) / s.ratio; ++j) DSINFER_RETURN_IF_ERROR(add_compressed(j));
    }
    if (out.rows.size() > static_cast<size_t>(INT32_MAX))
      return InvalidArgument("BuildSparseRowLists: too many rows");
    out.offsets.push_back(static_cast<int32_t>(out.rows.size()));
  }
  return out;
}

}  // namespace dsinfer::backend::cuda
