// ModelConfig: the validated shape of a DeepSeek-V4-family checkpoint, read from the official
// config.json. Variants are values, not code paths: nothing assumes 43 layers or 4096 hidden.
// V4.1 (spec §14) adds fields here (kv/index source layers, Engram, single-pass mHC) rather
// than a second model. Thread-compatible value type.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsinfer::model {

enum class ModelFamily { kV4 };

// Attention kind of a layer, from its compress ratio.
enum class AttentionKind {
  kSlidingWindow,      // ratio 0: window only
  kCompressedSparse,   // ratio 4 (CSA): overlapping compressor + lightning indexer top-k
  kHeavilyCompressed,  // ratio > 4 (HCA, 128 in V4-Flash): non-overlapping compressor, all rows
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

  // Layer index li covers the backbone (0..n_layers-1) and MTP (n_layers..).
  int CompressRatio(int li) const { return compress_ratios[li]; }
  AttentionKind Attention(int li) const;
  bool HashRouted(int li) const { return li < n_hash_layers; }
  bool HasIndexer(int li) const { return Attention(li) == AttentionKind::kCompressedSparse; }
  int NopeDim() const { return head_dim - rope_dim; }
  int HcRows() const { return (2 + hc_mult) * hc_mult; }

  Status Validate() const;
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
