// Host-side index and shape logic of the CUDA backend's MoE and sparse-attention ops, in plain
// C++ so it is unit-tested on machines without a GPU (tests/cuda, the pure tests):
//  - the router's selection rule (sqrt-softplus scores, biased top-k with ties to the lower
//    expert id, or hash routing; weights from the unbiased scores), the oracle of the GPU router;
//  - grouping of routed (token, slot) pairs per expert, in the CPU backend's order, and the
//    tiles the grouped MoE GEMM runs over;
//  - top-k with ties to the lower index, ascending output (the indexer's rule);
//  - the KV row lists of sparse attention (window rows + selected / all visible compressed rows).
// Everything validates its input and returns a clear error instead of reading out of bounds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/router.h"
#include "core/status.h"

namespace dsinfer::backend::cuda {

// The selection rule itself lives in backend/router.h (shared with the CPU backend).
using ::dsinfer::backend::RouteOneToken;
using ::dsinfer::backend::RouterSoftplus;

struct RouterParams {
  int n_experts = 0;                 // E
  int top_k = 0;                     // K
  float route_scale = 1.0f;          // weights are s / sum(s) * route_scale
  const float* bias = nullptr;       // [E] f32 selection bias (biased routing), or null
  const int32_t* tid2eid = nullptr;  // [vocab, K] hash routing table, or null
  int64_t vocab = 0;                 // rows of tid2eid
};

// Router of T tokens from the gate's logits [T, E]: chosen [T, K] expert ids (hash: the table's
// order; biased: descending biased score, ties -> lower id) and weights [T, K] (f32, from the
// unbiased scores, summed in slot order): validation, then RouteOneToken per token.
Status RouteTokens(const RouterParams& p, std::span<const float> logits,
                   std::span<const int32_t> token_ids, std::vector<int32_t>* chosen,
                   std::vector<float>* weights);

// (token, slot) pairs i = t*K + k grouped by expert: slots[offsets[e] .. offsets[e+1]) are the
// pairs routed to expert e, ascending i (the CPU backend's order, so per-expert GEMM rows match).
struct RoutedGroups {
  std::vector<int32_t> offsets;  // [E + 1]
  std::vector<int32_t> slots;    // [T * K] pair indices i = t*K + k
  std::vector<int32_t> tokens;   // [T * K] tokens[j] = slots[j] / K: the x row of grouped row j
};
Result<RoutedGroups> GroupRoutedTokens(std::span<const int32_t> chosen, int n_experts, int top_k);

// A grouped-GEMM work item: grouped rows [begin, begin + count) all belong to `expert`.
struct ExpertTile {
  int32_t expert = 0;
  int32_t begin = 0;
  int32_t count = 0;
};
// Tiles of at most max_rows rows over the non-empty experts, ascending expert then row.
std::vector<ExpertTile> BuildExpertTiles(const RoutedGroups& g, int max_rows);
// The same tiles as the grouped kernels read them: int32 words [n_tiles, 3] (expert, begin,
// count).
std::vector<int32_t> ExpertTileWords(const RoutedGroups& g, int max_rows);

// KV row lists for sparse attention over a pool laid out as [window rows of the step's
// positions; compressed rows]: for query position pos the window rows are the positions
// max(0, pos - window + 1) .. pos, found at pool row (p - window_first_pos); then the
// compressed rows (pool row compressed_base + j) for j in selected[t] when given (CSA), or
// j = 0 .. (pos + 1) / ratio - 1 (HCA), or none (ratio 0).
struct SparseRowLists {
  std::vector<int32_t> offsets;  // [T + 1]
  std::vector<int32_t> rows;     // [offsets[T]] pool row indices
};
struct SparseRowSpec {
  int window = 0;
  int ratio = 0;                 // 0: window only; 4: selected rows; other: every visible row
  int64_t window_first_pos = 0;  // position held by pool row 0
  int64_t window_rows = 0;       // pool rows [0, window_rows) hold positions window_first_pos..
  int64_t compressed_base = 0;   // pool row of compressed row 0
  int64_t compressed_rows = 0;   // compressed rows in the pool
};
Result<SparseRowLists> BuildSparseRowLists(const SparseRowSpec& s, std::span<const int64_t> pos,
                                           const std::vector<std::vector<int32_t>>* selected);

}  // namespace dsinfer::backend::cuda
