// DeepSeek-V4.1-Flash configuration (spec §14.1; key names in reference/v41/LAYOUT.md): parsing
// of the HF config.json (the text fields nested under text_config, the `_ids` key names, the
// vision tower under vision_config) and of the flat inference config.json (ModelArgs names),
// the V4.1 validation rules, the HF form written for demo checkpoints, and the V4.1 presets.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "model/config.h"
#include "model/config_internal.h"
#include "model/engram.h"

namespace dsinfer::model {

using nlohmann::json;

int EngramConfig::IndexOf(int layer) const {
  for (size_t i = 0; i < layer_ids.size(); ++i)
    if (layer_ids[i] == layer) return static_cast<int>(i);
  return -1;
}

bool ModelConfig::IsKvSource(int li) const {
  return std::find(kv_source_layers.begin(), kv_source_layers.end(), li) != kv_source_layers.end();
}

bool ModelConfig::IsIndexSource(int li) const {
  return std::find(index_source_layers.begin(), index_source_layers.end(), li) !=
         index_source_layers.end();
}

int ModelConfig::KvSourceOf(int li) const {
  int source = -1;
  for (int s : kv_source_layers)
    if (s <= li) source = s;
  return source;
}

int ModelConfig::RoutedExperts(int li) const {
  return V41() && li >= n_layers ? dspark.n_routed_experts : n_routed_experts;
}

int ModelConfig::ExpertsPerToken(int li) const {
  return V41() && li >= n_layers ? dspark.n_activated_experts : n_experts_per_tok;
}

namespace internal {

namespace {

std::string Ids(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Ascending, distinct, inside [0, n).
Status LayerList(const char* name, const std::vector<int>& v, int n) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= n)
      return InvalidArgument(std::string("config: ") + name + " " + Ids(v) +
                             " names a layer outside [0, " + std::to_string(n) + ")");
    if (i > 0 && v[i] <= v[i - 1])
      return InvalidArgument(std::string("config: ") + name + " " + Ids(v) +
                             " must be strictly ascending");
  }
  return Status::Ok();
}

// Reads a list of integers (absent: leaves *out as it is).
Status ReadIntList(const json& j, const char* key, std::vector<int>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_array())
    return InvalidArgument(std::string("config.json: '") + key + "' must be an array");
  out->clear();
  for (const auto& v : *it) {
    if (!v.is_number_integer())
      return InvalidArgument(std::string("config.json: '") + key + "' entries must be integers");
    const int64_t x = v.get<int64_t>();
    if (x < -1 || x > (1 << 24))
      return InvalidArgument(std::string("config.json: '") + key + "' entry out of range");
    out->push_back(static_cast<int>(x));
  }
  return Status::Ok();
}

Status ReadInt64List(const json& j, const char* key, std::vector<int64_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_array())
    return InvalidArgument(std::string("config.json: '") + key + "' must be an array");
  out->clear();
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return InvalidArgument(std::string("config.json: '") + key +
                             "' entries must be non-negative integers");
    out->push_back(v.get<int64_t>());
  }
  return Status::Ok();
}

}  // namespace

Status ValidateV41(const ModelConfig& c) {
  const int L = c.n_layers;
  if (c.n_hash_layers != 0)
    return InvalidArgument("config: DeepSeek-V4.1 has no hash-routed layers (num_hash_layers = " +
                           std::to_string(c.n_hash_layers) + ")");
  for (int li = 0; li < L + c.n_mtp_layers; ++li) {
    const int r = c.compress_ratios[li];
    if (r < 0 || r > 2)
      return InvalidArgument("config: compress_ratios[" + std::to_string(li) +
                             "] = " + std::to_string(r) + " is not a V4.1 ratio (0, 1 or 2)");
    if (li >= L && r != 0)
      return InvalidArgument("config: dSpark stages must have compress ratio 0");
  }
  DSINFER_RETURN_IF_ERROR(LayerList("kv_source_layer_ids", c.kv_source_layers, L));
  DSINFER_RETURN_IF_ERROR(LayerList("index_source_layer_ids", c.index_source_layers, L));
  for (int s : c.kv_source_layers)
    if (c.compress_ratios[s] == 0)
      return InvalidArgument("config: kv source layer " + std::to_string(s) +
                             " has compress ratio 0 (window only)");
  for (int li = 0; li < L; ++li) {
    const int r = c.compress_ratios[li];
    if (r == 0) {
      if (c.IsIndexSource(li))
        return InvalidArgument("config: index source layer " + std::to_string(li) +
                               " has compress ratio 0 (window only)");
      continue;
    }
    // Every compressed layer reads the rows of the latest kv source, which must pool as it does.
    const int src = c.KvSourceOf(li);
    if (src < 0)
      return InvalidArgument("config: layer " + std::to_string(li) + " (ratio " +
                             std::to_string(r) + ") has no kv source at or before it");
    if (c.compress_ratios[src] != r)
      return InvalidArgument("config: layer " + std::to_string(li) + " has ratio " +
                             std::to_string(r) + " but reads kv source " + std::to_string(src) +
                             " of ratio " + std::to_string(c.compress_ratios[src]));
    // Index keys come from the kv source; only a kv source that is an index source writes them.
    if (c.IsIndexSource(li) && !c.IsIndexSource(src))
      return InvalidArgument("config: index source layer " + std::to_string(li) +
                             " reads kv source " + std::to_string(src) +
                             ", which is not an index source (it writes no index keys)");
    // Layers that run no indexer reuse the latest index source's selection over the same rows.
    if (!c.IsIndexSource(li)) {
      int idx = -1;
      for (int s : c.index_source_layers)
        if (s <= li) idx = s;
      if (idx < 0 || c.KvSourceOf(idx) != src)
        return InvalidArgument("config: layer " + std::to_string(li) +
                               " runs no indexer and no index source before it reads kv source " +
                               std::to_string(src) + " (nothing to reuse)");
    }
  }
  if (!c.index_source_layers.empty()) {
    DSINFER_RETURN_IF_ERROR(Positive("index_n_heads", c.index_n_heads));
    DSINFER_RETURN_IF_ERROR(Positive("index_topk", c.index_topk));
    if (c.index_head_dim <= 0 || c.index_head_dim % 32 != 0 || c.index_head_dim < c.rope_dim)
      return InvalidArgument(
          "config: index_head_dim must be a positive multiple of 32 (FP4 blocks) and >= "
          "qk_rope_head_dim");
  }
  if (c.candidate_source_layer >= 0) {
    if (!c.IsIndexSource(c.candidate_source_layer))
      return InvalidArgument("config: candidate_source_layer_id " +
                             std::to_string(c.candidate_source_layer) + " is not an index source");
    DSINFER_RETURN_IF_ERROR(Positive("candidate_topk_blocks", c.candidate_topk_blocks));
    DSINFER_RETURN_IF_ERROR(Positive("candidate_block_size", c.candidate_block_size));
    // With fewer candidate rows than index_topk, the reference's top-k would have to return
    // masked rows (docs/NUMERICS.md, V4.1 assumption 7); the released config has 16377 >= 512.
    if (int64_t{c.candidate_topk_blocks - 1} * c.candidate_block_size + 1 < c.index_topk)
      return InvalidArgument(
          "config: candidate_topk_blocks x candidate_block_size leaves fewer candidates than "
          "index_topk");
    for (int s : c.index_source_layers)
      if (s > c.candidate_source_layer && c.KvSourceOf(s) != c.KvSourceOf(c.candidate_source_layer))
        return InvalidArgument("config: index source " + std::to_string(s) +
                               " reads other rows than the candidate source layer");
  } else if (c.candidate_source_layer < -1) {
    return InvalidArgument("config: candidate_source_layer_id must be a layer or -1");
  }
  if (c.head_dim % 32 != 0)
    return InvalidArgument("config: V4.1 head_dim must be a multiple of 32 (FP8 KV blocks)");
  if (c.weight_block != 32 || c.act_block != 32)
    return InvalidArgument(
        "config: V4.1 uses 32x32 FP8 weight blocks and 32-wide activation "
        "blocks");
  if (!(c.gate_temp > 0)) return InvalidArgument("config: gate_temp must be positive");
  const EngramConfig& e = c.engram;
  if (e.enabled()) {
    DSINFER_RETURN_IF_ERROR(LayerList("engram_layer_ids", e.layer_ids, L));
    if (e.num_embeddings.size() != e.layer_ids.size())
      return InvalidArgument("config: engram_num_embeddings needs one entry per Engram layer");
    if (e.max_ngram_size < 2 || e.max_ngram_size > 8)
      return InvalidArgument("config: engram_max_ngram_size must be in [2, 8]");
    DSINFER_RETURN_IF_ERROR(Positive("engram_n_heads", e.n_heads));
    if (e.head_dim <= 0 || e.head_dim % 32 != 0 || e.RowsPerToken() * int64_t{e.head_dim} > 65536)
      return InvalidArgument(
          "config: engram_head_dim must be a positive multiple of 32 (e8m0 row scales)");
    if (e.vocab_size < 2 || e.vocab_size > (int64_t{1} << 40))
      return InvalidArgument("config: engram_vocab_size out of range");
    if (e.compressed_vocab_size < 1 || e.compressed_vocab_size > (int64_t{1} << 24))
      return InvalidArgument("config: engram_compressed_vocab_size out of range");
    if (e.pad_id < 0 || e.pad_id >= c.vocab_size)
      return InvalidArgument("config: engram_pad_token_id outside the vocabulary");
  }
  if (c.n_mtp_layers > 0) {
    const DsparkConfig& d = c.dspark;
    DSINFER_RETURN_IF_ERROR(Positive("dspark_n_routed_experts", d.n_routed_experts));
    DSINFER_RETURN_IF_ERROR(Positive("dspark_num_experts_per_tok", d.n_activated_experts));
    DSINFER_RETURN_IF_ERROR(Positive("dspark_markov_rank", d.markov_rank));
    if (d.n_activated_experts > d.n_routed_experts || d.n_routed_experts > 65536)
      return InvalidArgument("config: dspark_num_experts_per_tok exceeds dspark_n_routed_experts");
    if (d.target_layer_ids.empty())
      return InvalidArgument("config: dspark_target_layer_ids is empty");
    for (int t : d.target_layer_ids)
      if (t < 0 || t >= L)
        return InvalidArgument("config: dspark_target_layer_ids names a layer outside the model");
    if (d.target_layer_ids.size() > 16)
      return InvalidArgument("config: too many dspark_target_layer_ids");
  }
  if (c.image_token_id < -1 || c.image_token_id >= c.vocab_size)
    return InvalidArgument("config: image_token_id outside the vocabulary");
  return Status::Ok();
}

Result<ModelConfig> FromJsonV41(const json& top) {
  ModelConfig c;
  c.family = ModelFamily::kV41;
  c.weight_block = 32;
  c.act_block = 32;
  c.norm_eps = 1e-20;
  c.n_mtp_layers = 0;
  // HF form: the text model's fields under text_config; inference form: flat ModelArgs names.
  const auto text_it = top.find("text_config");
  const bool hf = text_it != top.end();
  if (hf && !text_it->is_object())
    return InvalidArgument("config.json: 'text_config' must be an object");
  const json& j = hf ? *text_it : top;
  auto field = [&](const char* hf_key, const char* inf_key, auto* out, bool required) {
    return ReadField(j, hf ? hf_key : inf_key, out, required);
  };
  auto list = [&](const char* hf_key, const char* inf_key, std::vector<int>* out) {
    return ReadIntList(j, hf ? hf_key : inf_key, out);
  };
  DSINFER_RETURN_IF_ERROR(field("vocab_size", "vocab_size", &c.vocab_size, true));
  DSINFER_RETURN_IF_ERROR(field("hidden_size", "dim", &c.hidden, true));
  DSINFER_RETURN_IF_ERROR(field("moe_intermediate_size", "moe_inter_dim", &c.moe_inter, true));
  DSINFER_RETURN_IF_ERROR(field("num_hidden_layers", "n_layers", &c.n_layers, true));
  DSINFER_RETURN_IF_ERROR(field("num_attention_heads", "n_heads", &c.n_heads, true));
  int n_kv_heads = 1;
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_key_value_heads", &n_kv_heads, false));
  if (n_kv_heads != 1)
    return InvalidArgument("config.json: num_key_value_heads must be 1 for DeepSeek-V4.1");
  DSINFER_RETURN_IF_ERROR(field("head_dim", "head_dim", &c.head_dim, true));
  DSINFER_RETURN_IF_ERROR(field("qk_rope_head_dim", "rope_head_dim", &c.rope_dim, true));
  DSINFER_RETURN_IF_ERROR(field("q_lora_rank", "q_lora_rank", &c.q_lora_rank, true));
  DSINFER_RETURN_IF_ERROR(field("o_groups", "o_groups", &c.o_groups, true));
  DSINFER_RETURN_IF_ERROR(field("o_lora_rank", "o_lora_rank", &c.o_lora_rank, true));
  DSINFER_RETURN_IF_ERROR(field("sliding_window", "window_size", &c.window, true));
  DSINFER_RETURN_IF_ERROR(field("rms_norm_eps", "norm_eps", &c.norm_eps, false));
  DSINFER_RETURN_IF_ERROR(field("swiglu_limit", "swiglu_limit", &c.swiglu_limit, false));
  DSINFER_RETURN_IF_ERROR(field("rope_theta", "rope_theta", &c.rope_theta, false));
  DSINFER_RETURN_IF_ERROR(
      field("compress_rope_theta", "compress_rope_theta", &c.compress_rope_theta, false));
  DSINFER_RETURN_IF_ERROR(field("max_position_embeddings", "max_position_embeddings",
                                &c.max_position_embeddings, false));
  DSINFER_RETURN_IF_ERROR(field("n_routed_experts", "n_routed_experts", &c.n_routed_experts, true));
  DSINFER_RETURN_IF_ERROR(
      field("n_shared_experts", "n_shared_experts", &c.n_shared_experts, false));
  DSINFER_RETURN_IF_ERROR(
      field("num_experts_per_tok", "n_activated_experts", &c.n_experts_per_tok, true));
  DSINFER_RETURN_IF_ERROR(field("num_hash_layers", "n_hash_layers", &c.n_hash_layers, false));
  DSINFER_RETURN_IF_ERROR(field("routed_scaling_factor", "route_scale", &c.route_scale, false));
  DSINFER_RETURN_IF_ERROR(field("gate_temp", "gate_temp", &c.gate_temp, false));
  std::string score_func = "sqrtsoftplus";
  DSINFER_RETURN_IF_ERROR(field("scoring_func", "score_func", &score_func, false));
  if (score_func != "sqrtsoftplus")
    return InvalidArgument("config.json: scoring_func '" + score_func +
                           "' is not supported (want sqrtsoftplus)");
  DSINFER_RETURN_IF_ERROR(field("index_n_heads", "index_n_heads", &c.index_n_heads, false));
  DSINFER_RETURN_IF_ERROR(field("index_head_dim", "index_head_dim", &c.index_head_dim, false));
  DSINFER_RETURN_IF_ERROR(field("index_topk", "index_topk", &c.index_topk, false));
  DSINFER_RETURN_IF_ERROR(field("hc_mult", "hc_mult", &c.hc_mult, true));
  DSINFER_RETURN_IF_ERROR(
      field("hc_sinkhorn_iters", "hc_sinkhorn_iters", &c.hc_sinkhorn_iters, true));
  DSINFER_RETURN_IF_ERROR(field("hc_eps", "hc_eps", &c.hc_eps, false));
  DSINFER_RETURN_IF_ERROR(list("compress_ratios", "compress_ratios", &c.compress_ratios));
  if (c.compress_ratios.empty())
    return InvalidArgument("config.json: 'compress_ratios' must be a non-empty array");
  DSINFER_RETURN_IF_ERROR(list("kv_source_layer_ids", "kv_source_layers", &c.kv_source_layers));
  DSINFER_RETURN_IF_ERROR(
      list("index_source_layer_ids", "index_source_layers", &c.index_source_layers));
  DSINFER_RETURN_IF_ERROR(field("candidate_source_layer_id", "candidate_source_layer",
                                &c.candidate_source_layer, false));
  DSINFER_RETURN_IF_ERROR(
      field("candidate_topk_blocks", "candidate_topk_blocks", &c.candidate_topk_blocks, false));
  DSINFER_RETURN_IF_ERROR(
      field("candidate_block_size", "candidate_block_size", &c.candidate_block_size, false));
  // Engram.
  EngramConfig& e = c.engram;
  DSINFER_RETURN_IF_ERROR(list("engram_layer_ids", "engram_layer_ids", &e.layer_ids));
  DSINFER_RETURN_IF_ERROR(ReadInt64List(j, "engram_num_embeddings", &e.num_embeddings));
  const bool engram = !e.layer_ids.empty();
  DSINFER_RETURN_IF_ERROR(
      field("engram_max_ngram_size", "engram_max_ngram_size", &e.max_ngram_size, engram));
  DSINFER_RETURN_IF_ERROR(field("engram_vocab_size", "engram_vocab_size", &e.vocab_size, engram));
  DSINFER_RETURN_IF_ERROR(field("engram_n_heads", "engram_n_heads", &e.n_heads, engram));
  DSINFER_RETURN_IF_ERROR(field("engram_head_dim", "engram_head_dim", &e.head_dim, engram));
  DSINFER_RETURN_IF_ERROR(field("engram_pad_token_id", "engram_pad_id", &e.pad_id, false));
  DSINFER_RETURN_IF_ERROR(field("engram_compressed_vocab_size", "engram_compressed_vocab_size",
                                &e.compressed_vocab_size, engram));
  // dSpark stages.
  DSINFER_RETURN_IF_ERROR(
      field("num_nextn_predict_layers", "n_mtp_layers", &c.n_mtp_layers, false));
  const bool spark = c.n_mtp_layers > 0;
  DsparkConfig& d = c.dspark;
  DSINFER_RETURN_IF_ERROR(field("dspark_block_size", "dspark_block_size", &d.block_size, spark));
  DSINFER_RETURN_IF_ERROR(
      field("dspark_noise_token_id", "dspark_noise_token_id", &d.noise_token_id, spark));
  DSINFER_RETURN_IF_ERROR(
      list("dspark_target_layer_ids", "dspark_target_layer_ids", &d.target_layer_ids));
  DSINFER_RETURN_IF_ERROR(field("dspark_markov_rank", "dspark_markov_rank", &d.markov_rank, spark));
  DSINFER_RETURN_IF_ERROR(
      field("dspark_n_routed_experts", "dspark_n_routed_experts", &d.n_routed_experts, spark));
  DSINFER_RETURN_IF_ERROR(field("dspark_num_experts_per_tok", "dspark_n_activated_experts",
                                &d.n_activated_experts, spark));
  // RoPE / YaRN: HF rope_scaling, or the inference keys.
  if (hf) {
    auto rs = j.find("rope_scaling");
    if (rs != j.end() && !rs->is_null()) {
      if (!rs->is_object()) return InvalidArgument("config.json: rope_scaling must be an object");
      std::string type;
      DSINFER_RETURN_IF_ERROR(ReadField(*rs, "rope_type", &type, false));
      if (type.empty()) DSINFER_RETURN_IF_ERROR(ReadField(*rs, "type", &type, false));
      if (type != "yarn") return InvalidArgument("config.json: rope_scaling type must be yarn");
      DSINFER_RETURN_IF_ERROR(ReadField(*rs, "factor", &c.yarn.factor, true));
      DSINFER_RETURN_IF_ERROR(
          ReadField(*rs, "original_max_position_embeddings", &c.yarn.original_seq_len, true));
      DSINFER_RETURN_IF_ERROR(ReadField(*rs, "beta_fast", &c.yarn.beta_fast, false));
      DSINFER_RETURN_IF_ERROR(ReadField(*rs, "beta_slow", &c.yarn.beta_slow, false));
    }
  } else {
    DSINFER_RETURN_IF_ERROR(ReadField(j, "rope_factor", &c.yarn.factor, false));
    DSINFER_RETURN_IF_ERROR(ReadField(j, "original_seq_len", &c.yarn.original_seq_len, false));
    DSINFER_RETURN_IF_ERROR(ReadField(j, "beta_fast", &c.yarn.beta_fast, false));
    DSINFER_RETURN_IF_ERROR(ReadField(j, "beta_slow", &c.yarn.beta_slow, false));
  }
  // Top level (HF) or flat (inference): ids, quantization, vision.
  DSINFER_RETURN_IF_ERROR(ReadField(top, "image_token_id", &c.image_token_id, false));
  DSINFER_RETURN_IF_ERROR(ReadField(top, "bos_token_id", &c.bos_token_id, false));
  DSINFER_RETURN_IF_ERROR(ReadField(top, "eos_token_id", &c.eos_token_id, false));
  if (hf) {
    auto quant = top.find("quantization_config");
    if (quant != top.end() && !quant->is_null()) {
      if (!quant->is_object())
        return InvalidArgument("config.json: quantization_config must be an object");
      std::string fmt = "e4m3", scale_fmt = "ue8m0", expert_dtype = "fp4";
      DSINFER_RETURN_IF_ERROR(ReadField(*quant, "fmt", &fmt, false));
      DSINFER_RETURN_IF_ERROR(ReadField(*quant, "scale_fmt", &scale_fmt, false));
      DSINFER_RETURN_IF_ERROR(ReadField(*quant, "expert_dtype", &expert_dtype, false));
      if (fmt != "e4m3" || scale_fmt != "ue8m0" || expert_dtype != "fp4")
        return InvalidArgument(
            "config.json: V4.1 quantization_config must be e4m3 weights, ue8m0 scales, fp4 "
            "experts");
      auto block = quant->find("weight_block_size");
      if (block != quant->end() &&
          (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
           (*block)[0] != 32 || (*block)[1] != 32))
        return InvalidArgument("config.json: V4.1 uses [32, 32] weight blocks");
    }
    auto vision = top.find("vision_config");
    c.vision = vision != top.end() && vision->is_object() && !vision->empty();
  } else {
    std::string dtype = "fp8", expert_dtype = "fp4";
    DSINFER_RETURN_IF_ERROR(ReadField(j, "dtype", &dtype, false));
    DSINFER_RETURN_IF_ERROR(ReadField(j, "expert_dtype", &expert_dtype, false));
    if (dtype != "fp8" || expert_dtype != "fp4")
      return InvalidArgument("config.json: V4.1 needs dtype fp8 and expert_dtype fp4");
    c.vision = j.contains("vision_n_layers") && !j["vision_n_layers"].is_null();
  }
  DSINFER_RETURN_IF_ERROR(c.Validate().WithContext("config.json"));
  return c;
}

bool LooksLikeV41(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("text_config")) return true;
  auto mt = j.find("model_type");
  if (mt != j.end() && mt->is_string() && mt->get<std::string>().rfind("deepseek_v41", 0) == 0)
    return true;
  // The inference form: flat ModelArgs names with the V4.1 source lists.
  return j.contains("dim") && (j.contains("kv_source_layers") || j.contains("engram_layer_ids"));
}

json ToJsonV41(const ModelConfig& c) {
  json t;
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden;
  t["moe_intermediate_size"] = c.moe_inter;
  t["num_hidden_layers"] = c.n_layers;
  t["num_attention_heads"] = c.n_heads;
  t["num_key_value_heads"] = 1;
  t["head_dim"] = c.head_dim;
  t["qk_rope_head_dim"] = c.rope_dim;
  t["q_lora_rank"] = c.q_lora_rank;
  t["o_lora_rank"] = c.o_lora_rank;
  t["o_groups"] = c.o_groups;
  t["hidden_act"] = "silu";
  t["swiglu_limit"] = c.swiglu_limit;
  t["rms_norm_eps"] = c.norm_eps;
  t["tie_word_embeddings"] = false;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["rope_theta"] = c.rope_theta;
  t["rope_scaling"] = {{"rope_type", "yarn"},
                       {"factor", c.yarn.factor},
                       {"beta_fast", c.yarn.beta_fast},
                       {"beta_slow", c.yarn.beta_slow},
                       {"original_max_position_embeddings", c.yarn.original_seq_len}};
  t["compress_rope_theta"] = c.compress_rope_theta;
  t["n_routed_experts"] = c.n_routed_experts;
  t["n_shared_experts"] = c.n_shared_experts;
  t["num_experts_per_tok"] = c.n_experts_per_tok;
  t["scoring_func"] = "sqrtsoftplus";
  t["topk_method"] = "noaux_tc";
  t["norm_topk_prob"] = true;
  t["routed_scaling_factor"] = c.route_scale;
  t["gate_temp"] = c.gate_temp;
  t["sliding_window"] = c.window;
  t["compress_ratios"] = c.compress_ratios;
  t["kv_source_layer_ids"] = c.kv_source_layers;
  t["index_source_layer_ids"] = c.index_source_layers;
  t["candidate_source_layer_id"] = c.candidate_source_layer;
  t["candidate_topk_blocks"] = c.candidate_topk_blocks;
  t["candidate_block_size"] = c.candidate_block_size;
  t["index_n_heads"] = c.index_n_heads;
  t["index_head_dim"] = c.index_head_dim;
  t["index_topk"] = c.index_topk;
  t["hc_mult"] = c.hc_mult;
  t["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  t["hc_eps"] = c.hc_eps;
  if (c.engram.enabled()) {
    const EngramConfig& e = c.engram;
    t["engram_layer_ids"] = e.layer_ids;
    t["engram_num_embeddings"] = e.num_embeddings;
    t["engram_max_ngram_size"] = e.max_ngram_size;
    t["engram_vocab_size"] = e.vocab_size;
    t["engram_n_heads"] = e.n_heads;
    t["engram_head_dim"] = e.head_dim;
    t["engram_pad_token_id"] = e.pad_id;
    t["engram_compressed_vocab_size"] = e.compressed_vocab_size;
  }
  t["num_nextn_predict_layers"] = c.n_mtp_layers;
  if (c.n_mtp_layers > 0) {
    const DsparkConfig& d = c.dspark;
    t["dspark_block_size"] = d.block_size;
    t["dspark_noise_token_id"] = d.noise_token_id;
    t["dspark_target_layer_ids"] = d.target_layer_ids;
    t["dspark_markov_rank"] = d.markov_rank;
    t["dspark_n_routed_experts"] = d.n_routed_experts;
    t["dspark_num_experts_per_tok"] = d.n_activated_experts;
  }
  t["model_type"] = "deepseek_v41_text";
  json j;
  j["architectures"] = {"DeepseekV41ForCausalLM"};
  j["model_type"] = "deepseek_v41";
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  if (c.image_token_id >= 0) j["image_token_id"] = c.image_token_id;
  j["torch_dtype"] = "bfloat16";
  j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                              {"fmt", "e4m3"},         {"weight_block_size", {32, 32}},
                              {"scale_fmt", "ue8m0"},  {"expert_dtype", "fp4"}};
  j["text_config"] = std::move(t);
  return j;
}

// ---- presets -----------------------------------------------------------------------------------

namespace {

ModelConfig V41Base() {
  ModelConfig c;
  c.family = ModelFamily::kV41;
  c.weight_block = 32, c.act_block = 32;
  c.norm_eps = 1e-20, c.hc_eps = 1e-6;
  c.n_shared_experts = 1;
  c.hc_mult = 4, c.hc_sinkhorn_iters = 20;
  c.max_position_embeddings = 4096;
  c.engram.max_ngram_size = 4, c.engram.pad_id = 2, c.engram.compressed_vocab_size = 99092;
  return c;
}

// The oracle's tiny configurations (reference/v41/write_tiny.py; their values are in each
// tests/fixtures/v41/golden/<preset>/manifest.json, which golden_v41_test checks against).
void TinyDims(ModelConfig& c) {
  c.vocab_size = 512, c.hidden = 64, c.moe_inter = 32, c.n_heads = 4, c.head_dim = 64;
  c.rope_dim = 16, c.q_lora_rank = 32, c.o_lora_rank = 32, c.o_groups = 2;
  c.index_n_heads = 2, c.index_head_dim = 32;
  c.engram.head_dim = 32;
  c.n_mtp_layers = 1;
  c.dspark.block_size = 3, c.dspark.noise_token_id = 287, c.dspark.markov_rank = 32;
  c.dspark.n_routed_experts = 4, c.dspark.n_activated_experts = 2;
}

// V4.1-Flash's layer dimensions (spec §14.1) for the bench presets: everything but the layer
// count, the roles and the routed experts. Engram tables use a small hash range (row reads per
// token do not depend on it).
void FlashDims(ModelConfig& c) {
  c.vocab_size = 129280, c.hidden = 5120, c.moe_inter = 2304, c.n_heads = 64, c.head_dim = 512;
  c.rope_dim = 64, c.q_lora_rank = 1280, c.o_lora_rank = 1024, c.o_groups = 8;
  c.candidate_topk_blocks = 2048, c.candidate_block_size = 8;
  c.n_experts_per_tok = 6, c.window = 128;
  c.index_n_heads = 32, c.index_head_dim = 128, c.index_topk = 512;
  c.max_position_embeddings = 1048576;
  c.engram.layer_ids = {0}, c.engram.vocab_size = 16000, c.engram.n_heads = 8;
  c.engram.head_dim = 256;
  c.image_token_id = 129264;
}

}  // namespace

std::vector<std::string> V41PresetNames() {
  return {"tiny-v41-a", "tiny-v41-b",          "tiny-v41-c",
          "demo-v4.1",  "demo-v4.1-bigengram", "bench-v4.1", "bench-v4.1-dspark"};
}

Result<ModelConfig> V41PresetConfig(const std::string& name) {
  ModelConfig c = V41Base();
  if (name == "tiny-v41-a") {
    TinyDims(c);
    c.n_layers = 8, c.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0};
    c.kv_source_layers = {2, 4}, c.index_source_layers = {2, 4, 6};
    c.candidate_source_layer = 4, c.candidate_topk_blocks = 6, c.candidate_block_size = 4;
    c.n_routed_experts = 8, c.n_experts_per_tok = 2, c.window = 16, c.index_topk = 16;
    c.engram.layer_ids = {1, 3}, c.engram.num_embeddings = {434, 606};
    c.engram.vocab_size = 61, c.engram.n_heads = 2;
    c.dspark.target_layer_ids = {5, 6, 7};
  } else if (name == "tiny-v41-b") {
    TinyDims(c);
    c.n_layers = 10, c.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0};
    c.kv_source_layers = {2, 4, 6}, c.index_source_layers = {2, 4, 6, 8};
    c.candidate_source_layer = 6, c.candidate_topk_blocks = 4, c.candidate_block_size = 8;
    c.n_routed_experts = 8, c.n_experts_per_tok = 2, c.window = 8, c.index_topk = 8;
    c.gate_temp = 0.8;
    c.engram.layer_ids = {1, 5}, c.engram.num_embeddings = {304, 462};
    c.engram.max_ngram_size = 3, c.engram.vocab_size = 40, c.engram.n_heads = 3;
    c.dspark.target_layer_ids = {8, 9};
  } else if (name == "tiny-v41-c") {
    TinyDims(c);
    c.n_layers = 6, c.compress_ratios = {0, 2, 2, 1, 1, 1, 0};
    c.kv_source_layers = {1, 3}, c.index_source_layers = {1, 3, 4, 5};
    c.candidate_source_layer = 3, c.candidate_topk_blocks = 8, c.candidate_block_size = 4;
    c.n_routed_experts = 16, c.n_experts_per_tok = 3, c.window = 32, c.index_topk = 24;
    c.yarn.factor = 4, c.yarn.original_seq_len = 256;
    c.engram.layer_ids = {0, 2}, c.engram.num_embeddings = {384, 552};
    c.engram.vocab_size = 53, c.engram.n_heads = 2;
    c.dspark.target_layer_ids = {3, 4, 5};
  } else if (name == "demo-v4.1" || name == "demo-v4.1-bigengram") {
    // The real vocabulary (so the V4.1 tokenizer and chat format work) and every V4.1 role:
    // window-only, ratio-2 kv+index source (Engram before it), ratio-2 reuse, ratio-1 kv+index
    // source with the candidate pre-filter, ratio-1 reuse, ratio-1 masked index source; three
    // dSpark stages. Small enough to serve at once.
    c.vocab_size = 129280, c.hidden = 256, c.moe_inter = 128, c.n_heads = 4, c.head_dim = 128;
    c.rope_dim = 32, c.q_lora_rank = 128, c.o_lora_rank = 64, c.o_groups = 2;
    c.n_layers = 7, c.compress_ratios = {0, 2, 2, 1, 1, 1, 1, 0, 0, 0};
    c.kv_source_layers = {1, 3}, c.index_source_layers = {1, 3, 5};
    c.candidate_source_layer = 3, c.candidate_topk_blocks = 16, c.candidate_block_size = 8;
    c.n_routed_experts = 16, c.n_experts_per_tok = 4, c.window = 64;
    c.index_n_heads = 4, c.index_head_dim = 64, c.index_topk = 64;
    c.max_position_embeddings = 1048576;
    c.engram.layer_ids = {1, 4}, c.engram.vocab_size = 1000, c.engram.n_heads = 4;
    c.engram.head_dim = 64;
    c.image_token_id = 129264;
    c.n_mtp_layers = 3;
    c.dspark = {5, 128799, {4, 5, 6}, 32, 8, 2};
    if (name == "demo-v4.1-bigengram") {
      // The released Engram geometry (two tables of ~384 M rows x 256, ~101 GB each): larger
      // than this machine's memory, written as file holes (create-demo-model --sparse-engram),
      // to show that serving reads rows on demand.
      c.engram.vocab_size = 16000000, c.engram.n_heads = 8, c.engram.head_dim = 256;
    }
  } else if (name == "bench-v4.1") {
    // Real V4.1-Flash layer dimensions (spec §14.1) in two layers, one per compressed ratio
    // (ratio 2 kv + index source with Engram before it; ratio 1 kv + index + candidate source),
    // so it fits in 24 GiB: ~17.6 GB, most of it 2 x 384 FP4 experts.
    FlashDims(c);
    c.n_layers = 2, c.compress_ratios = {2, 1};
    c.kv_source_layers = {0, 1}, c.index_source_layers = {0, 1};
    c.candidate_source_layer = 1;
    c.n_routed_experts = 384;
    c.n_mtp_layers = 0;
  } else if (name == "bench-v4.1-dspark") {
    // For timing dSpark drafting: the three dSpark stages at V4.1-Flash's sizes (spec §14.6:
    // 128 FP4 experts top-3 each, Markov rank 256, blocks of 5, three 5120-wide targets into
    // main_proj), behind one backbone layer of bench-v4.1's ratio-1 kind with 128 experts
    // (its size does not enter the drafting's cost; it keeps the preset at ~13 GB). The three
    // targets all read that one layer.
    FlashDims(c);
    c.n_layers = 1, c.compress_ratios = {1, 0, 0, 0};
    c.kv_source_layers = {0}, c.index_source_layers = {0};
    c.candidate_source_layer = 0;
    c.n_routed_experts = 128;
    c.n_mtp_layers = 3;
    c.dspark = {5, 128799, {0, 0, 0}, 256, 128, 3};
  } else {
    return NotFound("unknown preset '" + name + "'");
  }
  // Rows per Engram table: the sum of the layer's primes (model/engram.h checks it at load).
  if (c.engram.enabled() && c.engram.num_embeddings.empty())
    c.engram.num_embeddings = EngramTableRows(c.engram);
  DSINFER_RETURN_IF_ERROR(c.Validate().WithContext("preset " + name));
  return c;
}

}  // namespace internal
}  // namespace dsinfer::model
