#include "backend/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsinfer::backend {

float RouterSoftplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void RouteOneToken(const float* scores, int n_experts, int top_k, const int32_t* hash_ids,
                   const float* bias, float route_scale, int32_t* idx_scratch, int32_t* chosen,
                   float* weights, float sum_eps, bool normalize) {
  const int E = n_experts, K = top_k;
  if (hash_ids != nullptr) {
    std::copy_n(hash_ids, K, chosen);
  } else {
    std::iota(idx_scratch, idx_scratch + E, 0);
    auto biased = [&](int32_t e) { return scores[e] + bias[e]; };
    std::partial_sort(idx_scratch, idx_scratch + K, idx_scratch + E, [&](int32_t a, int32_t b) {
      const float va = biased(a), vb = biased(b);
      return va > vb || (va == vb && a < b);
    });
    std::copy_n(idx_scratch, K, chosen);
  }
  if (!normalize) {
    for (int k = 0; k < K; ++k) weights[k] = scores[chosen[k]] * route_scale;
    return;
  }
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += scores[chosen[k]];  // unbiased scores
  sum += sum_eps;
  for (int k = 0; k < K; ++k) weights[k] = scores[chosen[k]] / sum * route_scale;
}

}  // namespace dsinfer::backend
