// ModelConfig parsing/validation and the expected-tensor table against the official V4-Flash
// layout (spec §1, §11).
#include "model/config.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "model/weights.h"

namespace dsinfer::model {
namespace {

nlohmann::json FlashConfigJson() {
  // The official V4-Flash config.json values (spec §1.1).
  std::vector<int> ratios = {0, 0};
  for (int i = 2; i < 43; ++i) ratios.push_back(i % 2 == 0 ? 4 : 128);
  ratios.push_back(0);
  return {{"architectures", {"DeepseekV4ForCausalLM"}},
          {"model_type", "deepseek_v4"},
          {"vocab_size", 129280},
          {"hidden_size", 4096},
          {"num_hidden_layers", 43},
          {"num_nextn_predict_layers", 1},
          {"num_attention_heads", 64},
          {"num_key_value_heads", 1},
          {"head_dim", 512},
          {"qk_rope_head_dim", 64},
          {"q_lora_rank", 1024},
          {"o_groups", 8},
          {"o_lora_rank", 1024},
          {"sliding_window", 128},
          {"compress_ratios", ratios},
          {"compress_rope_theta", 160000},
          {"rope_theta", 10000},
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 16},
            {"original_max_position_embeddings", 65536},
            {"beta_fast", 32},
            {"beta_slow", 1}}},
          {"max_position_embeddings", 1048576},
          {"index_n_heads", 64},
          {"index_head_dim", 128},
          {"index_topk", 512},
          {"n_routed_experts", 256},
          {"n_shared_experts", 1},
          {"num_experts_per_tok", 6},
          {"moe_intermediate_size", 2048},
          {"num_hash_layers", 3},
          {"scoring_func", "sqrtsoftplus"},
          {"routed_scaling_factor", 1.5},
          {"swiglu_limit", 10.0},
          {"hc_mult", 4},
          {"hc_sinkhorn_iters", 20},
          {"hc_eps", 1e-6},
          {"rms_norm_eps", 1e-6},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"quantization_config",
           {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"scale_fmt", "ue8m0"},
            {"weight_block_size", {128, 128}},
            {"activation_scheme", "dynamic"}}},
          {"expert_dtype", "fp4"}};
}

TEST(ModelConfig, ParsesOfficialFlashConfig) {
  auto c = ModelConfig::FromJson(FlashConfigJson());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->n_layers, 43);
  EXPECT_EQ(c->NopeDim(), 448);
  EXPECT_EQ(c->Attention(0), AttentionKind::kSlidingWindow);
  EXPECT_EQ(c->Attention(2), AttentionKind::kCompressedSparse);
  EXPECT_EQ(c->Attention(3), AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c->Attention(43), AttentionKind::kSlidingWindow);  // MTP
  EXPECT_TRUE(c->HashRouted(2));
  EXPECT_FALSE(c->HashRouted(3));
  EXPECT_FALSE(c->HashRouted(43));
}

TEST(ModelConfig, ExpectedTensorsMatchOfficialLayout) {
  auto c = ModelConfig::FromJson(FlashConfigJson());
  ASSERT_TRUE(c.ok());
  std::map<std::string, TensorSpec> by_name;
  for (auto& s : ExpectedTensors(*c)) by_name[s.name] = s;
  // Shapes from the spec §11 table.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"embed.weight", {129280, 4096}},
      {"head.weight", {129280, 4096}},
      {"hc_head_fn", {4, 16384}},
      {"layers.0.hc_attn_fn", {24, 16384}},
      {"layers.0.hc_ffn_scale", {3}},
      {"layers.5.attn.attn_sink", {64}},
      {"layers.5.attn.wq_a.scale", {8, 32}},
      {"layers.5.attn.wq_b.weight", {32768, 1024}},
      {"layers.5.attn.wq_b.scale", {256, 8}},
      {"layers.5.attn.wkv.scale", {4, 32}},
      {"layers.5.attn.wo_a.scale", {64, 32}},
      {"layers.5.attn.wo_b.scale", {32, 64}},
      {"layers.2.attn.compressor.ape", {4, 1024}},
      {"layers.2.attn.compressor.wkv.weight", {1024, 4096}},
      {"layers.3.attn.compressor.ape", {128, 512}},
      {"layers.3.attn.compressor.wgate.weight", {512, 4096}},
      {"layers.2.attn.indexer.wq_b.scale", {64, 8}},
      {"layers.2.attn.indexer.weights_proj.weight", {64, 4096}},
      {"layers.2.attn.indexer.compressor.ape", {4, 256}},
      {"layers.2.attn.indexer.compressor.norm.weight", {128}},
      {"layers.2.ffn.gate.tid2eid", {129280, 6}},
      {"layers.3.ffn.gate.bias", {256}},
      {"layers.3.ffn.shared_experts.w1.scale", {16, 32}},
      {"layers.3.ffn.shared_experts.w2.scale", {32, 16}},
      {"layers.3.ffn.experts.255.w1.weight", {2048, 2048}},
      {"layers.3.ffn.experts.255.w1.scale", {2048, 128}},
      {"layers.3.ffn.experts.0.w2.weight", {4096, 1024}},
      {"layers.3.ffn.experts.0.w2.scale", {4096, 64}},
      {"mtp.0.e_proj.scale", {32, 32}},
      {"mtp.0.hc_head_fn", {4, 16384}},
      {"mtp.0.ffn.gate.bias", {256}},
  };
  for (const auto& [name, shape] : expected) {
    auto it = by_name.find(name);
    ASSERT_NE(it, by_name.end()) << name;
    EXPECT_EQ(it->second.shape, shape) << name;
  }
  EXPECT_EQ(by_name.count("layers.0.attn.compressor.ape"), 0u);       // window-only layer
  EXPECT_EQ(by_name.count("layers.3.attn.indexer.wq_b.weight"), 0u);  // HCA has no indexer
  EXPECT_EQ(by_name.count("mtp.0.attn.compressor.ape"), 0u);
  EXPECT_EQ(by_name.count("mtp.0.embed.weight"), 0u);  // MTP shares embed and head
  // Total bytes of the official checkpoint: 159,609,485,896 (spec §11, the index's total_size).
  uint64_t total = 0;
  for (const auto& [name, s] : by_name) {
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    total += n * DTypeSize(s.dtypes[0]) *
             (name.find("tid2eid") != std::string::npos ? 2 : 1);  // I64 officially
  }
  EXPECT_EQ(total, 159609485896ull);
}

TEST(ModelConfig, RejectsBadConfigs) {
  auto bad = [](auto mutate) {
    nlohmann::json j = FlashConfigJson();
    mutate(j);
    return ModelConfig::FromJson(j);
  };
  auto r = bad([](nlohmann::json& j) { j.erase("hidden_size"); });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hidden_size"), std::string::npos);
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["hidden_size"] = "4096"; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["hidden_size"] = -1; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["hidden_size"] = 1e300; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["compress_ratios"] = {0, 4}; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["compress_ratios"][5] = 3; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["num_key_value_heads"] = 8; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["o_groups"] = 7; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["num_experts_per_tok"] = 300; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["scoring_func"] = "softmax"; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["model_type"] = "llama"; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) {
                 j["quantization_config"]["weight_block_size"] = {64, 64};
               }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["num_hidden_layers"] = 1000000; }).ok());
  EXPECT_FALSE(bad([](nlohmann::json& j) { j["hc_sinkhorn_iters"] = 2000000000; }).ok());
  EXPECT_FALSE(ModelConfig::FromJson(nlohmann::json::array()).ok());
}

TEST(ModelConfig, PresetsRoundTripThroughConfigJson) {
  for (const auto& name : PresetNames()) {
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    auto back = ModelConfig::FromJson(c->ToJson());
    ASSERT_TRUE(back.ok()) << name << ": " << back.status().ToString();
    EXPECT_EQ(back->ToJson(), c->ToJson()) << name;
  }
  EXPECT_FALSE(PresetConfig("no-such-preset").ok());
}

}  // namespace
}  // namespace dsinfer::model
