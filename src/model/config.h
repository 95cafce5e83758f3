// ModelConfig: the validated shape of a DeepSeek-V4-family checkpoint, read from the official
// config.json. Variants are values, not code paths: nothing assumes 43 layers or 4096 hidden.
// V4.1 (spec §14) is the same struct with its fields set (family kV41: kv/index source layers,
// the candidate pre-filter, Engram, dSpark) rather than a second model. Thread-compatible value
// type.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsinfer::model {

// kV4: DeepSeek-V4-Flash (spec §1-13). kV41: DeepSeek-V4.1-Flash (spec §14): CSA2 roles,
// single-pass mHC, Engram, 32x32 FP8 blocks, no hash layers.
enum class ModelFamily { kV4, kV41 };

// Attention kind of a layer, from its compress ratio.
enum class AttentionKind {
  kSlidingWindow,      // ratio 0: window only
  kCompressedSparse,   // ratio 4 (CSA): overlapping compressor + lightning indexer top-k
  kHeavilyCompressed,  // ratio > 4 (HCA, 128 in V4-Flash): non-overlapping compressor, all rows
  kSharedCompressed,   // V4.1 ratio 1 or 2 (CSA2): the latest kv source's compressed rows at the
                       // indices the latest index source selected
};

// Engram (spec §14.5): n-gram hash embeddings added to the streams before some blocks.
struct EngramConfig {
  std::vector<int> layer_ids;           // blocks with an Engram module, ascending
  std::vector<int64_t> num_embeddings;  // table rows per Engram layer (= the sum of its primes)
  int max_ngram_size = 0;               // n-grams 2..max_ngram_size
  int64_t vocab_size = 0;               // the primes are the first ones >= this
  int n_heads = 0;                      // hash heads per n-gram
  int head_dim = 0;                     // table row width
  int pad_id = 2;                       // token whose class stands for "before the sequence"
  int64_t compressed_vocab_size = 0;    // classes of the token map
  bool enabled() const { return !layer_ids.empty(); }
  // Row ids per position and layer: (max_ngram_size - 1) n-grams x n_heads heads.
  int RowsPerToken() const { return (max_ngram_size - 1) * n_heads; }
  // Index of `layer` in layer_ids, or -1.
  int IndexOf(int layer) const;
};

// dSpark drafting stages (spec §14.6; backend/v4_forward.h, DsparkSeed / DsparkDraft).
struct DsparkConfig {
  int block_size = 0;
  int noise_token_id = -1;
  std::vector<int> target_layer_ids;
  int markov_rank = 0;
  int n_routed_experts = 0;
  int n_activated_experts = 0;
};

struct YarnConfig {
  double factor = 16.0;
  int64_t original_seq_len = 65536;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kV4;
  int vocab_size = 0;
  int hidden = 0;    // dim
  int n_layers = 0;  // backbone layers (excludes MTP)
  int n_mtp_layers = 0;
  int n_heads = 0;
  int head_dim = 0;  // 512 in V4-Flash; K = V = one latent of this size
  int rope_dim = 0;  // qk_rope_head_dim: the LAST rope_dim dims of each head are rotated
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int window = 0;  // sliding_window
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int n_experts_per_tok = 0;
  int moe_inter = 0;
  int n_hash_layers = 0;
  double route_scale = 1.5;
  double swiglu_limit = 10.0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;
  double norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  YarnConfig yarn;
  int64_t max_position_embeddings = 1048576;
  // One entry per backbone layer, then one per MTP layer.
  std::vector<int> compress_ratios;
  int bos_token_id = 0;
  int eos_token_id = 1;
  int weight_block = 128;   // FP8 weight block (quantization_config.weight_block_size)
  int act_block = 128;      // activation quantization block in front of FP8/FP4 linears
  int fp4_block = 32;       // FP4 expert scale block along K
  bool experts_fp4 = true;  // expert_dtype "fp4" (packed I8) vs FP8 like the dense layers

  // ---- V4.1 (family kV41; spec §14) ----
  // Layers that own a compressor (ratio 2: gated pooling, ratio 1: one row per token) and the
  // shared compressed KV every later layer of the same ratio reads.
  std::vector<int> kv_source_layers;
  // Layers that run the lightning indexer; the others reuse the last published top-k.
  std::vector<int> index_source_layers;
  // Candidate pre-filter (spec §14.3): at this index source the scores are max-pooled over
  // blocks of candidate_block_size positions, the top candidate_topk_blocks blocks (the newest
  // one pinned) kept, and later index sources only choose inside them. -1: off.
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  double gate_temp = 1.0;  // MoE router logits are divided by it
  EngramConfig engram;
  DsparkConfig dspark;
  int image_token_id = -1;  // -1: none
  bool vision = false;      // a vision tower is present (its tensors are skipped: text only)

  // Layer index li covers the backbone (0..n_layers-1) and MTP (n_layers..).
  int CompressRatio(int li) const { return compress_ratios[li]; }
  AttentionKind Attention(int li) const;
  bool HashRouted(int li) const { return li < n_hash_layers; }
  bool HasIndexer(int li) const { return Attention(li) == AttentionKind::kCompressedSparse; }
  bool V41() const { return family == ModelFamily::kV41; }
  bool IsKvSource(int li) const;
  bool IsIndexSource(int li) const;
  // V4.1: the kv source whose compressed rows layer li reads (the latest one at or before it),
  // or -1.
  int KvSourceOf(int li) const;
  // Routed experts and experts per token of layer li (dSpark stages have their own counts).
  int RoutedExperts(int li) const;
  int ExpertsPerToken(int li) const;
  int NopeDim() const { return head_dim - rope_dim; }
  int HcRows() const { return (2 + hc_mult) * hc_mult; }

  Status Validate() const;
  // The V4 layer-role rules (compress ratios 0 / 4 / 2^k, hash layers, the indexer dims).
  Status ValidateV4Roles() const;
  static Result<ModelConfig> FromJson(const nlohmann::json& json);
  static Result<ModelConfig> FromFile(const std::string& config_json_path);
  // The official config.json form (HF field names).
  nlohmann::json ToJson() const;
  std::string Summary() const;
};

// Named configurations for create-demo-model. Returns NotFound for an unknown name.
Result<ModelConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace dsinfer::model
