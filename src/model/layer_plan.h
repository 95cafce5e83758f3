// LayerPlan: what one layer of a DeepSeek-V4-family model does, derived once from ModelConfig.
// The layer program (backend/v4_forward.h) and every backend read behaviour from here, never
// from literals such as `ratio == 4`: a variant (V4.1's kv/index sources, Engram, single-pass
// mHC) is new fields and new derivations here, not new branches in each backend.
// Immutable value type.
#pragma once

#include <vector>

#include "model/config.h"

namespace dsinfer::model {

struct LayerPlan {
  int layer = 0;        // index into ModelWeights::layers (backbone, then MTP)
  bool mtp = false;     // an MTP block (its own window state and position count)
  AttentionKind attention = AttentionKind::kSlidingWindow;
  // Compressor over the time axis (spec §5.3): rows of `compress_ratio` tokens, overlapping
  // (two halves of width head_dim, candidates from this and the previous group) or not.
  int compress_ratio = 0;  // 0: window only
  bool owns_compressor = false;
  bool compressor_overlap = false;
  int compressor_width = 0;  // projection width: (overlap ? 2 : 1) * head_dim
  // Which layer's compressed rows the attention reads (V4: its own; V4.1: the latest kv source).
  int kv_source = -1;
  // Lightning indexer (spec §5.4): its own overlapping compressor of ratio index_ratio over
  // index_head_dim, and a top-k of the compressed rows per query.
  bool runs_indexer = false;
  int index_ratio = 0;
  int index_compressor_width = 0;  // 2 * index_head_dim
  // Attention path details.
  bool q_head_rms_norm = true;  // unweighted per-head RMS norm of q (V4; not V4.1)
  bool rope_yarn = false;       // compress_rope_theta + YaRN (compressed layers) vs rope_theta
  // MoE routing (spec §6): by the token's tid2eid row (hash) or top-k of score + bias.
  bool hash_routed = false;
};

// One plan per layer of the config: backbone layers first, then MTP layers.
std::vector<LayerPlan> PlanLayers(const ModelConfig& config);

}  // namespace dsinfer::model
