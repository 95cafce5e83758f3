#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_file.h"
#include "model/config_internal.h"

namespace dsinfer::model {
namespace {

using internal::Positive;
using internal::ReadField;
using nlohmann::json;

bool IsPowerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

AttentionKind ModelConfig::Attention(int li) const {
  int r = compress_ratios[li];
  if (r == 0) return AttentionKind::kSlidingWindow;
  if (V41()) return AttentionKind::kSharedCompressed;
  if (r == 4) return AttentionKind::kCompressedSparse;
  return AttentionKind::kHeavilyCompressed;
}

Status ModelConfig::Validate() const {
  DSINFER_RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  DSINFER_RETURN_IF_ERROR(Positive("hidden_size", hidden));
  DSINFER_RETURN_IF_ERROR(Positive("num_hidden_layers", n_layers));
  DSINFER_RETURN_IF_ERROR(Positive("num_attention_heads", n_heads));
  DSINFER_RETURN_IF_ERROR(Positive("head_dim", head_dim));
  DSINFER_RETURN_IF_ERROR(Positive("qk_rope_head_dim", rope_dim));
  DSINFER_RETURN_IF_ERROR(Positive("q_lora_rank", q_lora_rank));
  DSINFER_RETURN_IF_ERROR(Positive("o_groups", o_groups));
  DSINFER_RETURN_IF_ERROR(Positive("o_lora_rank", o_lora_rank));
  DSINFER_RETURN_IF_ERROR(Positive("sliding_window", window));
  DSINFER_RETURN_IF_ERROR(Positive("n_routed_experts", n_routed_experts));
  DSINFER_RETURN_IF_ERROR(Positive("num_experts_per_tok", n_experts_per_tok));
  DSINFER_RETURN_IF_ERROR(Positive("moe_intermediate_size", moe_inter));
  DSINFER_RETURN_IF_ERROR(Positive("hc_mult", hc_mult));
  DSINFER_RETURN_IF_ERROR(Positive("hc_sinkhorn_iters", hc_sinkhorn_iters));
  if (n_layers > 4096 || hidden > (1 << 16) || vocab_size > (1 << 24) || n_heads > 4096 ||
      head_dim > 8192 || n_routed_experts > 65536 || hc_mult > 64 || window > (1 << 20))
    return InvalidArgument("config: dimensions are implausibly large");
  // V4 uses 20. The mHC mixes run this many Sinkhorn rounds per token and layer, so a hostile
  // count would hang the first request (noticed while writing fuzz_model_config).
  if (hc_sinkhorn_iters > 1000)
    return InvalidArgument("config: hc_sinkhorn_iters is implausibly large (V4 uses 20)");
  if (rope_dim > head_dim || rope_dim % 2 != 0)
    return InvalidArgument("config: qk_rope_head_dim must be even and <= head_dim");
  if (n_heads % o_groups != 0)
    return InvalidArgument("config: num_attention_heads must be divisible by o_groups");
  if (n_experts_per_tok > n_routed_experts)
    return InvalidArgument("config: num_experts_per_tok exceeds n_routed_experts");
  if (n_shared_experts < 0 || n_shared_experts > 1)
    return InvalidArgument("config: n_shared_experts must be 0 or 1");
  if (n_mtp_layers < 0 || n_mtp_layers > 8)
    return InvalidArgument("config: num_nextn_predict_layers out of range");
  if (static_cast<int>(compress_ratios.size()) < n_layers + n_mtp_layers)
    return InvalidArgument("config: compress_ratios has " + std::to_string(compress_ratios.size()) +
                           " entries, need num_hidden_layers + num_nextn_predict_layers = " +
                           std::to_string(n_layers + n_mtp_layers));
  if (V41()) {
    DSINFER_RETURN_IF_ERROR(internal::ValidateV41(*this));
  } else {
    DSINFER_RETURN_IF_ERROR(ValidateV4Roles());
  }
  if (hidden % act_block != 0 && hidden > act_block)
    return InvalidArgument("config: hidden_size must be a multiple of the activation block");
  if (experts_fp4 && (hidden % fp4_block != 0 || moe_inter % fp4_block != 0))
    return InvalidArgument(
        "config: FP4 experts need hidden and moe_intermediate_size multiples of 32");
  if (!(norm_eps > 0) || !(hc_eps > 0))
    return InvalidArgument("config: eps values must be positive");
  if (!(rope_theta > 0) || !(compress_rope_theta > 0) || !(yarn.factor >= 1) ||
      yarn.original_seq_len <= 0)
    return InvalidArgument("config: bad rope parameters");
  if (bos_token_id < 0 || bos_token_id >= vocab_size || eos_token_id < 0 ||
      eos_token_id >= vocab_size)
    return InvalidArgument("config: bos/eos token id outside the vocabulary");
  return Status::Ok();
}

Status ModelConfig::ValidateV4Roles() const {
  if (n_hash_layers < 0 || n_hash_layers > n_layers)
    return InvalidArgument("config: num_hash_layers out of range");
  bool any_csa = false;
  for (int li = 0; li < n_layers + n_mtp_layers; ++li) {
    int r = compress_ratios[li];
    if (r < 0 || r == 1 || r == 2 || r == 3 || (r > 4 && !IsPowerOfTwo(r)) || r > 4096)
      return InvalidArgument("config: compress_ratios[" + std::to_string(li) +
                             "] = " + std::to_string(r) +
                             " is not supported for V4 (0, 4 or a power of two > 4)");
    if (li >= n_layers && r != 0)
      return InvalidArgument("config: MTP layers must have compress ratio 0");
    any_csa = any_csa || r == 4;
  }
  if (any_csa) {
    DSINFER_RETURN_IF_ERROR(Positive("index_n_heads", index_n_heads));
    DSINFER_RETURN_IF_ERROR(Positive("index_topk", index_topk));
    if (!IsPowerOfTwo(index_head_dim) || index_head_dim < rope_dim)
      return InvalidArgument(
          "config: index_head_dim must be a power of two >= qk_rope_head_dim (Hadamard)");
  }
  return Status::Ok();
}

Result<ModelConfig> ModelConfig::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("config.json: top level must be an object");
  if (internal::LooksLikeV41(j)) return internal::FromJsonV41(j);
  ModelConfig c;
  std::string model_type;
  DSINFER_RETURN_IF_ERROR(ReadField(j, "model_type", &model_type, false));
  if (!model_type.empty() && model_type != "deepseek_v4")
    return InvalidArgument("config.json: model_type '" + model_type +
                           "' is not supported (want deepseek_v4)");
  DSINFER_RETURN_IF_ERROR(ReadField(j, "vocab_size", &c.vocab_size, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "hidden_size", &c.hidden, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_hidden_layers", &c.n_layers, true));
  c.n_mtp_layers = 1;
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_nextn_predict_layers", &c.n_mtp_layers, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_attention_heads", &c.n_heads, true));
  int n_kv_heads = 1;
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_key_value_heads", &n_kv_heads, false));
  if (n_kv_heads != 1)
    return InvalidArgument("config.json: num_key_value_heads must be 1 for DeepSeek-V4");
  DSINFER_RETURN_IF_ERROR(ReadField(j, "head_dim", &c.head_dim, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "qk_rope_head_dim", &c.rope_dim, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "q_lora_rank", &c.q_lora_rank, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "o_groups", &c.o_groups, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "o_lora_rank", &c.o_lora_rank, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "sliding_window", &c.window, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "n_routed_experts", &c.n_routed_experts, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "n_shared_experts", &c.n_shared_experts, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_experts_per_tok", &c.n_experts_per_tok, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "moe_intermediate_size", &c.moe_inter, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "num_hash_layers", &c.n_hash_layers, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "routed_scaling_factor", &c.route_scale, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "swiglu_limit", &c.swiglu_limit, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "index_n_heads", &c.index_n_heads, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "index_head_dim", &c.index_head_dim, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "index_topk", &c.index_topk, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "hc_mult", &c.hc_mult, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "hc_sinkhorn_iters", &c.hc_sinkhorn_iters, true));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "hc_eps", &c.hc_eps, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "rms_norm_eps", &c.norm_eps, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "rope_theta", &c.rope_theta, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "compress_rope_theta", &c.compress_rope_theta, false));
  DSINFER_RETURN_IF_ERROR(
      ReadField(j, "max_position_embeddings", &c.max_position_embeddings, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "bos_token_id", &c.bos_token_id, false));
  DSINFER_RETURN_IF_ERROR(ReadField(j, "eos_token_id", &c.eos_token_id, false));
  std::string score_func = "sqrtsoftplus";
  DSINFER_RETURN_IF_ERROR(ReadField(j, "scoring_func", &score_func, false));
  if (score_func != "sqrtsoftplus")
    return InvalidArgument("config.json: scoring_func '" + score_func +
                           "' is not supported (want sqrtsoftplus)");

  auto ratios = j.find("compress_ratios");
  if (ratios == j.end() || !ratios->is_array())
    return InvalidArgument("config.json: 'compress_ratios' must be an array");
  for (const auto& r : *ratios) {
    if (!r.is_number_integer())
      return InvalidArgument("config.json: compress_ratios entries must be integers");
    int64_t v = r.get<int64_t>();
    if (v < 0 || v > 1 << 20)
      return InvalidArgument("config.json: compress_ratios entry out of range");
    c.compress_ratios.push_back(static_cast<int>(v));
  }

  auto rope_scaling = j.find("rope_scaling");
  if (rope_scaling != j.end() && !rope_scaling->is_null()) {
    if (!rope_scaling->is_object())
      return InvalidArgument("config.json: rope_scaling must be an object");
    std::string type;
    DSINFER_RETURN_IF_ERROR(ReadField(*rope_scaling, "type", &type, false));
    if (type.empty()) DSINFER_RETURN_IF_ERROR(ReadField(*rope_scaling, "rope_type", &type, false));
    if (type != "yarn") return InvalidArgument("config.json: rope_scaling type must be yarn");
    DSINFER_RETURN_IF_ERROR(ReadField(*rope_scaling, "factor", &c.yarn.factor, true));
    DSINFER_RETURN_IF_ERROR(ReadField(*rope_scaling, "original_max_position_embeddings",
                                      &c.yarn.original_seq_len, true));
    DSINFER_RETURN_IF_ERROR(ReadField(*rope_scaling, "beta_fast", &c.yarn.beta_fast, false));
    DSINFER_RETURN_IF_ERROR(ReadField(*rope_scaling, "beta_slow", &c.yarn.beta_slow, false));
  }

  auto quant = j.find("quantization_config");
  if (quant != j.end() && quant->is_object()) {
    std::string fmt = "e4m3", scale_fmt = "ue8m0";
    DSINFER_RETURN_IF_ERROR(ReadField(*quant, "fmt", &fmt, false));
    DSINFER_RETURN_IF_ERROR(ReadField(*quant, "scale_fmt", &scale_fmt, false));
    if (fmt != "e4m3" || scale_fmt != "ue8m0")
      return InvalidArgument(
          "config.json: quantization_config must be e4m3 weights with ue8m0 scales");
    auto block = quant->find("weight_block_size");
    if (block != quant->end()) {
      if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
          (*block)[0] != (*block)[1])
        return InvalidArgument("config.json: weight_block_size must be [B, B]");
      c.weight_block = (*block)[0].get<int>();
      if (c.weight_block != 128)
        return InvalidArgument("config.json: V4 uses 128x128 weight blocks");
    }
  }
  std::string expert_dtype = "fp4";
  DSINFER_RETURN_IF_ERROR(ReadField(j, "expert_dtype", &expert_dtype, false));
  if (expert_dtype != "fp4" && expert_dtype != "fp8")
    return InvalidArgument("config.json: expert_dtype must be fp4 or fp8");
  c.experts_fp4 = expert_dtype == "fp4";
  DSINFER_RETURN_IF_ERROR(c.Validate().WithContext("config.json"));
  return c;
}

Result<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  DSINFER_ASSIGN_OR_RETURN(json j, io::ReadJsonFile(path));
  auto config = FromJson(j);
  if (!config.ok()) return config.status().WithContext(path);
  return config;
}

json ModelConfig::ToJson() const {
  if (V41()) return internal::ToJsonV41(*this);
  json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["torch_dtype"] = "bfloat16";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden;
  j["num_hidden_layers"] = n_layers;
  j["num_nextn_predict_layers"] = n_mtp_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = head_dim;
  j["qk_rope_head_dim"] = rope_dim;
  j["q_lora_rank"] = q_lora_rank;
  j["o_groups"] = o_groups;
  j["o_lora_rank"] = o_lora_rank;
  j["attention_bias"] = false;
  j["sliding_window"] = window;
  j["compress_ratios"] = compress_ratios;
  j["compress_rope_theta"] = compress_rope_theta;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = {{"type", "yarn"},
                       {"factor", yarn.factor},
                       {"original_max_position_embeddings", yarn.original_seq_len},
                       {"beta_fast", yarn.beta_fast},
                       {"beta_slow", yarn.beta_slow}};
  j["max_position_embeddings"] = max_position_embeddings;
  j["index_n_heads"] = index_n_heads;
  j["index_head_dim"] = index_head_dim;
  j["index_topk"] = index_topk;
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = n_experts_per_tok;
  j["moe_intermediate_size"] = moe_inter;
  j["num_hash_layers"] = n_hash_layers;
  j["scoring_func"] = "sqrtsoftplus";
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = true;
  j["routed_scaling_factor"] = route_scale;
  j["swiglu_limit"] = swiglu_limit;
  j["hidden_act"] = "silu";
  j["hc_mult"] = hc_mult;
  j["hc_sinkhorn_iters"] = hc_sinkhorn_iters;
  j["hc_eps"] = hc_eps;
  j["rms_norm_eps"] = norm_eps;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["tie_word_embeddings"] = false;
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"scale_fmt", "ue8m0"},
                              {"weight_block_size", {weight_block, weight_block}},
                              {"activation_scheme", "dynamic"}};
  j["expert_dtype"] = experts_fp4 ? "fp4" : "fp8";
  return j;
}

std::string ModelConfig::Summary() const {
  std::ostringstream os;
  int n_csa = 0, n_hca = 0, n_swa = 0;
  for (int li = 0; li < n_layers; ++li) {
    switch (Attention(li)) {
      case AttentionKind::kSlidingWindow:
        ++n_swa;
        break;
      case AttentionKind::kCompressedSparse:
        ++n_csa;
        break;
      case AttentionKind::kHeavilyCompressed:
        ++n_hca;
        break;
      case AttentionKind::kSharedCompressed:  // V4.1, summarised below
        break;
    }
  }
  if (V41()) {
    int n_r2 = 0, n_r1 = 0;
    for (int li = 0; li < n_layers; ++li) {
      n_r2 += compress_ratios[li] == 2;
      n_r1 += compress_ratios[li] == 1;
    }
    os << "deepseek_v4.1: vocab " << vocab_size << ", hidden " << hidden << ", layers " << n_layers
       << " (" << n_layers - n_r2 - n_r1 << " window, " << n_r2 << " ratio-2, " << n_r1
       << " ratio-1; " << kv_source_layers.size() << " kv sources, " << index_source_layers.size()
       << " index sources), engram " << engram.layer_ids.size() << ", dspark " << n_mtp_layers
       << ", heads " << n_heads << "x" << head_dim << " (rope " << rope_dim << "), experts "
       << n_routed_experts << " top-" << n_experts_per_tok << " inter " << moe_inter
       << " fp4, window " << window << ", hc " << hc_mult;
    return os.str();
  }
  os << "deepseek_v4: vocab " << vocab_size << ", hidden " << hidden << ", layers " << n_layers
     << " (" << n_swa << " window, " << n_csa << " CSA, " << n_hca << " HCA; " << n_hash_layers
     << " hash-routed), mtp " << n_mtp_layers << ", heads " << n_heads << "x" << head_dim
     << " (rope " << rope_dim << "), experts " << n_routed_experts << " top-" << n_experts_per_tok
     << " inter " << moe_inter << (experts_fp4 ? " fp4" : " fp8") << ", window " << window
     << ", hc " << hc_mult;
  return os.str();
}

// ---- presets -----------------------------------------------------------------------------------

namespace {

ModelConfig TinyBase() {
  ModelConfig c;
  c.max_position_embeddings = 1048576;
  c.n_shared_experts = 1;
  c.hc_sinkhorn_iters = 20;
  return c;
}

}  // namespace

Result<ModelConfig> PresetConfig(const std::string& name) {
  ModelConfig c = TinyBase();
  if (name == "tiny-a") {
    c.vocab_size = 1024, c.hidden = 128, c.n_layers = 4, c.compress_ratios = {0, 4, 128, 4, 0};
    c.n_hash_layers = 1, c.n_heads = 4, c.head_dim = 64, c.rope_dim = 16, c.q_lora_rank = 64;
    c.o_groups = 2, c.o_lora_rank = 32, c.n_routed_experts = 8, c.n_experts_per_tok = 2,
    c.moe_inter = 64;
    c.window = 16, c.index_n_heads = 2, c.index_head_dim = 32, c.index_topk = 8, c.hc_mult = 4;
    c.n_mtp_layers = 1;
  } else if (name == "tiny-b") {
    c.vocab_size = 1536, c.hidden = 256, c.n_layers = 3, c.compress_ratios = {4, 128, 0, 0};
    c.n_hash_layers = 2, c.n_heads = 8, c.head_dim = 128, c.rope_dim = 32, c.q_lora_rank = 128;
    c.o_groups = 4, c.o_lora_rank = 32, c.n_routed_experts = 16, c.n_experts_per_tok = 4,
    c.moe_inter = 32;
    c.window = 32, c.index_n_heads = 4, c.index_head_dim = 64, c.index_topk = 16, c.hc_mult = 2;
    c.n_mtp_layers = 1;
  } else if (name == "tiny-c") {
    c.vocab_size = 2048, c.hidden = 128, c.n_layers = 6,
    c.compress_ratios = {0, 0, 4, 128, 4, 128, 0};
    c.n_hash_layers = 3, c.n_heads = 2, c.head_dim = 64, c.rope_dim = 16, c.q_lora_rank = 32;
    c.o_groups = 1, c.o_lora_rank = 64, c.n_routed_experts = 4, c.n_experts_per_tok = 3,
    c.moe_inter = 96;
    c.window = 8, c.index_n_heads = 2, c.index_head_dim = 32, c.index_topk = 4, c.hc_mult = 4;
    c.n_mtp_layers = 1;
  } else if (name == "demo") {
    // The embedded demo model: the real vocabulary (so the real tokenizer and chat format work),
    // every layer kind, small enough to serve instantly on a laptop.
    c.vocab_size = 129280, c.hidden = 256, c.n_layers = 4, c.compress_ratios = {0, 4, 128, 4, 0};
    c.n_hash_layers = 1, c.n_heads = 4, c.head_dim = 128, c.rope_dim = 32, c.q_lora_rank = 128;
    c.o_groups = 2, c.o_lora_rank = 64, c.n_routed_experts = 16, c.n_experts_per_tok = 4,
    c.moe_inter = 128;
    c.window = 64, c.index_n_heads = 4, c.index_head_dim = 64, c.index_topk = 64, c.hc_mult = 4;
    c.n_mtp_layers = 1;
  } else if (name == "bench" || name == "bench-mtp") {
    // Real V4-Flash layer dimensions (spec §1), only 3 layers (window, CSA, HCA) so it fits in
    // 24 GiB: ~12 GB of weights, most of it 3 x 256 FP4 experts. bench-mtp adds V4's MTP block
    // (~4 GB more) so that speculative drafting can be timed at real sizes (bench model
    // --verify).
    c.vocab_size = 129280, c.hidden = 4096, c.n_layers = 3, c.compress_ratios = {0, 4, 128, 0};
    c.n_hash_layers = 1, c.n_heads = 64, c.head_dim = 512, c.rope_dim = 64, c.q_lora_rank = 1024;
    c.o_groups = 8, c.o_lora_rank = 1024, c.n_routed_experts = 256, c.n_experts_per_tok = 6;
    c.moe_inter = 2048, c.window = 128, c.index_n_heads = 64, c.index_head_dim = 128,
    c.index_topk = 512;
    c.hc_mult = 4, c.n_mtp_layers = name == "bench-mtp" ? 1 : 0;
  } else {
    auto v41 = internal::V41PresetConfig(name);
    if (v41.ok() || v41.status().code() != StatusCode::kNotFound) return v41;
    std::string known;
    for (const std::string& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
    return NotFound("unknown preset '" + name + "' (known: " + known + ")");
  }
  DSINFER_RETURN_IF_ERROR(c.Validate().WithContext("preset " + name));
  return c;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names = {"tiny-a", "tiny-b", "tiny-c", "demo", "bench", "bench-mtp"};
  for (std::string& n : internal::V41PresetNames()) names.push_back(std::move(n));
  return names;
}

}  // namespace dsinfer::model
