// LayerPlan: what one layer of a DeepSeek-V4-family model does, derived once from ModelConfig.
// The layer program (backend/v4_forward.h) and every backend read behaviour from here, never
// from literals such as `ratio == 4`: a variant (V4.1's kv/index sources, Engram, single-pass
// mHC) is new fields and new derivations here, not new branches in each backend.
// Immutable value type.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace dsinfer::model {

// How a layer's window KV rows are put on the stored grid (official numerics).
enum class WindowQuant : uint8_t {
  kFp8Nope64,  // V4: FP8 round trip of the nope dims in blocks of 64 (spec §5.2)
  kFp8All32,   // V4.1: FP8 round trip of all head_dim dims in blocks of 32, after RoPE (§14.2)
};
// How compressed KV rows are put on the stored grid (official numerics).
enum class CompressedQuant : uint8_t {
  kFp8Nope64,   // V4: as the window rows
  kFp4E4m3x16,  // V4.1: FP4 e2m1 with an e4m3 scale per 16, after RoPE (§14.2)
};

struct LayerPlan {
  int layer = 0;        // index into ModelWeights::layers (backbone, then MTP)
  bool mtp = false;     // an MTP block (its own window state and position count)
  // A V4.1 dSpark stage (spec §14.6): its ring holds the stage's KV of the projected target
  // hidden states (fed by V4Forward::DsparkSeed); a draft block's rows attend over that ring and
  // over each other (no causal mask), and store nothing.
  bool draft_block = false;
  AttentionKind attention = AttentionKind::kSlidingWindow;
  // Compressor over the time axis (spec §5.3): rows of `compress_ratio` tokens, overlapping
  // (two halves of width head_dim, candidates from this and the previous group) or not.
  int compress_ratio = 0;  // 0: window only
  bool owns_compressor = false;
  bool compressor_overlap = false;
  // Gated softmax pooling over the group (a and g projections, their history kept until the
  // group completes); V4.1's ratio-1 compressor has no gate: one row per token, no history.
  bool compressor_gated = false;
  bool compressor_ape = false;  // V4: a positional bias on the gate logits (V4.1: none)
  int compressor_width = 0;  // projection width: (overlap ? 2 : 1) * head_dim
  // Which layer's compressed rows the attention reads (V4: its own; V4.1: the latest kv source).
  int kv_source = -1;
  // Lightning indexer (spec §5.4): a top-k of the compressed rows per query over index keys.
  bool runs_indexer = false;
  int index_ratio = 0;       // compression ratio of the keys it reads
  int index_key_layer = -1;  // the layer that stores those keys (V4: itself; V4.1: kv_source)
  // This layer writes index keys: V4 from its own overlapping compressor of width
  // index_compressor_width (2 * index_head_dim); V4.1 from its compressed latent through wk and
  // k_norm (index_compressor_width 0: no history of its own).
  bool stores_index_keys = false;
  int index_compressor_width = 0;
  bool index_hadamard = true;  // V4: Hadamard before the FP4 round trip of q and k; V4.1: none
  // V4.1: each head's weighted score term is rounded to bf16 before the sum (V4: only the dot
  // and the sum, as pinned by its logit hashes).
  bool index_score_round_terms = false;
  // V4.1: compressed layers that run no indexer attend to the last published selection; the
  // candidate source publishes candidate blocks that later index sources choose inside.
  bool reuses_selection = false;
  bool candidate_source = false;
  bool candidate_masked = false;
  // Attention path details.
  bool q_head_rms_norm = true;  // unweighted per-head RMS norm of q (V4; not V4.1)
  bool rope_yarn = false;       // compress_rope_theta + YaRN (compressed layers) vs rope_theta
  // The attention softmax's shift: the largest logit of the rows (V4.1, spec §5.6) or of the
  // rows and the sink (V4 as pinned by its logit hashes); differs only under bf16 rounding of P.
  bool softmax_max_over_rows = false;
  WindowQuant window_quant = WindowQuant::kFp8Nope64;
  CompressedQuant compressed_quant = CompressedQuant::kFp8Nope64;
  // mHC (spec §4, §14.4): V4 collapses each sublayer's input with its own pre; V4.1 (single
  // pass) with the pre of the previous sublayer, and has no hc_head.
  bool single_pass_hc = false;
  // V4.1 Engram before the block: the layer's index in EngramConfig::layer_ids, or -1.
  int engram = -1;
  // MoE routing (spec §6): by the token's tid2eid row (hash) or top-k of score + bias.
  bool hash_routed = false;
};

// One plan per layer the forward runs: backbone layers first, then MTP layers (V4.1: the dSpark
// stages, whose window rings are the MTP stream).
std::vector<LayerPlan> PlanLayers(const ModelConfig& config);

}  // namespace dsinfer::model
