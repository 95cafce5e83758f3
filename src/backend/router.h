// The V4 MoE router's selection rule (spec §6), shared by every backend: the CPU forward pass
// uses it directly and the CUDA backend's conformance checks use it as the GPU router's oracle,
// so there is one definition of tie-breaking and weight normalisation.
#pragma once

#include <cstdint>

namespace dsinfer::backend {

// torch.nn.functional.softplus(beta=1, threshold=20).
float RouterSoftplus(float x);

// One token. scores [E]: sqrt(softplus(gate logit)) per expert. Selection: hash_ids [K] (the
// tid2eid row, already validated) when non-null, else the top-K of scores + bias [E],
// descending, ties to the lower expert id. Weights [K]: the unbiased scores of the chosen
// experts normalised in slot order, times route_scale. idx_scratch: [E] workspace.
// V4.1 (spec §14.6) divides by (sum + 1e-20) and normalises only when top_k > 1: sum_eps and
// normalize say so (the defaults are V4's rule: for positive scores, sum + 0 is sum bit for bit).
void RouteOneToken(const float* scores, int n_experts, int top_k, const int32_t* hash_ids,
                   const float* bias, float route_scale, int32_t* idx_scratch, int32_t* chosen,
                   float* weights, float sum_eps = 0.0f, bool normalize = true);

}  // namespace dsinfer::backend
