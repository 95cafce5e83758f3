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

// ---- DeepSeek-V4.1 (spec §14.1, reference/v41/LAYOUT.md) ----------------------------------------

namespace dsinfer::model {
namespace {

// The released V4.1-Flash HF config.json (values of spec §14.1; key names of LAYOUT.md).
nlohmann::json V41FlashConfigJson() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  ratios.insert(ratios.end(), {0, 0, 0});
  nlohmann::json text = {{"vocab_size", 129280},
                         {"hidden_size", 5120},
                         {"moe_intermediate_size", 2304},
                         {"num_hidden_layers", 40},
                         {"num_attention_heads", 64},
                         {"num_key_value_heads", 1},
                         {"head_dim", 512},
                         {"q_lora_rank", 1280},
                         {"o_lora_rank", 1024},
                         {"o_groups", 8},
                         {"qk_rope_head_dim", 64},
                         {"rms_norm_eps", 1e-20},
                         {"swiglu_limit", 10.0},
                         {"sliding_window", 128},
                         {"rope_theta", 10000},
                         {"compress_rope_theta", 160000},
                         {"rope_scaling",
                          {{"rope_type", "yarn"},
                           {"factor", 16},
                           {"beta_fast", 32},
                           {"beta_slow", 1},
                           {"original_max_position_embeddings", 65536}}},
                         {"max_position_embeddings", 1048576},
                         {"n_routed_experts", 384},
                         {"n_shared_experts", 1},
                         {"num_experts_per_tok", 6},
                         {"scoring_func", "sqrtsoftplus"},
                         {"routed_scaling_factor", 1.5},
                         {"norm_topk_prob", true},
                         {"topk_method", "noaux_tc"},
                         {"compress_ratios", ratios},
                         {"kv_source_layer_ids", {2, 8, 14, 20}},
                         {"index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}},
                         {"candidate_source_layer_id", 20},
                         {"candidate_topk_blocks", 2048},
                         {"candidate_block_size", 8},
                         {"index_n_heads", 32},
                         {"index_head_dim", 128},
                         {"index_topk", 512},
                         {"hc_mult", 4},
                         {"hc_sinkhorn_iters", 20},
                         {"hc_eps", 1e-6},
                         {"engram_layer_ids", {1, 14}},
                         {"engram_num_embeddings", {384006168, 384016682}},
                         {"engram_max_ngram_size", 4},
                         {"engram_vocab_size", 16000000},
                         {"engram_n_heads", 8},
                         {"engram_head_dim", 256},
                         {"engram_pad_token_id", 2},
                         {"engram_compressed_vocab_size", 99092},
                         {"num_nextn_predict_layers", 3},
                         {"dspark_block_size", 5},
                         {"dspark_noise_token_id", 128799},
                         {"dspark_target_layer_ids", {37, 38, 39}},
                         {"dspark_markov_rank", 256},
                         {"dspark_n_routed_experts", 128},
                         {"dspark_num_experts_per_tok", 3}};
  return {{"architectures", {"DeepseekV41ForCausalLM"}},
          {"model_type", "deepseek_v41"},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"image_token_id", 129264},
          {"quantization_config",
           {{"quant_method", "fp8"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {32, 32}},
            {"scale_fmt", "ue8m0"},
            {"expert_dtype", "fp4"}}},
          {"text_config", text},
          {"vision_config",
           {{"num_hidden_layers", 32},
            {"hidden_size", 1024},
            {"num_attention_heads", 16},
            {"intermediate_size", 2816},
            {"patch_size", 14}}}};
}

TEST(ModelConfigV41, ParsesTheReleasedHfConfig) {
  auto c = ModelConfig::FromJson(V41FlashConfigJson());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->V41());
  EXPECT_EQ(c->weight_block, 32);
  EXPECT_EQ(c->act_block, 32);
  EXPECT_EQ(c->norm_eps, 1e-20);
  EXPECT_TRUE(c->vision);
  EXPECT_EQ(c->image_token_id, 129264);
  EXPECT_EQ(c->Attention(0), AttentionKind::kSlidingWindow);
  EXPECT_EQ(c->Attention(2), AttentionKind::kSharedCompressed);
  EXPECT_EQ(c->KvSourceOf(19), 14);
  EXPECT_EQ(c->KvSourceOf(39), 20);
  EXPECT_TRUE(c->IsIndexSource(36));
  EXPECT_FALSE(c->IsKvSource(24));
  EXPECT_EQ(c->RoutedExperts(41), 128);  // a dSpark stage
  EXPECT_EQ(c->ExpertsPerToken(41), 3);
  EXPECT_EQ(c->engram.RowsPerToken(), 24);
  EXPECT_FALSE(c->HashRouted(0));
}

TEST(ModelConfigV41, ParsesTheInferenceConfigForm) {
  const nlohmann::json hf = V41FlashConfigJson();
  const nlohmann::json& t = hf["text_config"];
  // inference/config.json: flat ModelArgs names (LAYOUT.md's mapping).
  nlohmann::json j = {{"vocab_size", 129280},
                      {"dim", 5120},
                      {"moe_inter_dim", 2304},
                      {"n_layers", 40},
                      {"n_mtp_layers", 3},
                      {"n_heads", 64},
                      {"head_dim", 512},
                      {"rope_head_dim", 64},
                      {"q_lora_rank", 1280},
                      {"o_groups", 8},
                      {"o_lora_rank", 1024},
                      {"window_size", 128},
                      {"norm_eps", 1e-20},
                      {"n_routed_experts", 384},
                      {"n_shared_experts", 1},
                      {"n_activated_experts", 6},
                      {"score_func", "sqrtsoftplus"},
                      {"route_scale", 1.5},
                      {"swiglu_limit", 10.0},
                      {"compress_ratios", t["compress_ratios"]},
                      {"kv_source_layers", t["kv_source_layer_ids"]},
                      {"index_source_layers", t["index_source_layer_ids"]},
                      {"candidate_source_layer", 20},
                      {"candidate_topk_blocks", 2048},
                      {"candidate_block_size", 8},
                      {"index_n_heads", 32},
                      {"index_head_dim", 128},
                      {"index_topk", 512},
                      {"rope_theta", 10000},
                      {"compress_rope_theta", 160000},
                      {"original_seq_len", 65536},
                      {"rope_factor", 16},
                      {"beta_fast", 32},
                      {"beta_slow", 1},
                      {"hc_mult", 4},
                      {"hc_sinkhorn_iters", 20},
                      {"hc_eps", 1e-6},
                      {"engram_layer_ids", {1, 14}},
                      {"engram_num_embeddings", {384006168, 384016682}},
                      {"engram_max_ngram_size", 4},
                      {"engram_vocab_size", 16000000},
                      {"engram_n_heads", 8},
                      {"engram_head_dim", 256},
                      {"engram_pad_id", 2},
                      {"engram_compressed_vocab_size", 99092},
                      {"dspark_block_size", 5},
                      {"dspark_noise_token_id", 128799},
                      {"dspark_target_layer_ids", {37, 38, 39}},
                      {"dspark_markov_rank", 256},
                      {"dspark_n_routed_experts", 128},
                      {"dspark_n_activated_experts", 3},
                      {"image_token_id", 129264},
                      {"vision_n_layers", 32},
                      {"dtype", "fp8"},
                      {"expert_dtype", "fp4"}};
  auto flat = ModelConfig::FromJson(j);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  auto nested = ModelConfig::FromJson(hf);
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(flat->ToJson(), nested->ToJson());
  EXPECT_EQ(flat->yarn.factor, 16);
  EXPECT_TRUE(flat->vision);
}

// Every tensor class of the released checkpoint: count and bytes of the public census
// (reference/v41/LAYOUT.md, "Verification"), less the vision tower and the image_* vectors,
// which this engine skips (text only).
TEST(ModelConfigV41, ExpectedTensorsMatchTheReleasedCensus) {
  auto c = ModelConfig::FromJson(V41FlashConfigJson());
  ASSERT_TRUE(c.ok());
  uint64_t n = 0, bytes = 0, engram_bytes = 0, mtp_n = 0, mtp_bytes = 0;
  std::map<std::string, std::vector<int64_t>> shape;
  for (const TensorSpec& s : ExpectedTensors(*c)) {
    uint64_t b = DTypeSize(s.dtypes[0]);
    for (int64_t d : s.shape) b *= static_cast<uint64_t>(d);
    ++n, bytes += b;
    if (s.name.find(".engram.") != std::string::npos) engram_bytes += b;
    if (s.name.rfind("mtp.", 0) == 0) ++mtp_n, mtp_bytes += b;
    shape[s.name] = s.shape;
  }
  EXPECT_EQ(n, 95822u - 3u);
  EXPECT_EQ(bytes, 5151556608ull + 158155200ull + 7932874632ull + 2647654400ull + 203073076240ull +
                       288777830400ull + 157409280ull + 1416960000ull - 3ull * 5120 * 2);
  EXPECT_EQ(engram_bytes, 203073076240ull);  // census class "engram", 12 tensors
  EXPECT_EQ(mtp_n, 2401u);                   // census class "draft_mtp"
  EXPECT_EQ(mtp_bytes, 7932874632ull);
  // Entries read one by one in the census.
  EXPECT_EQ(shape["layers.0.attn.wo_a.scale"], (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(shape["layers.0.ffn.experts.0.w2.weight"], (std::vector<int64_t>{5120, 1152}));
  EXPECT_EQ(shape["layers.0.hc_attn_fn"], (std::vector<int64_t>{24, 20480}));
  EXPECT_EQ(shape["layers.1.engram.embed.scale"], (std::vector<int64_t>{384006168, 8}));
  EXPECT_EQ(shape["layers.14.engram.wkv.weight"], (std::vector<int64_t>{25600, 6144}));
  EXPECT_EQ(shape.count("hc_head_fn"), 0u);
  EXPECT_EQ(shape.count("layers.3.attn.compressor.wkv.weight"), 0u);     // not a kv source
  EXPECT_EQ(shape.count("layers.20.attn.compressor.wgate.weight"), 0u);  // ratio 1: no gate
  EXPECT_EQ(shape["layers.20.attn.indexer.wk.weight"], (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(shape.count("layers.24.attn.indexer.wk.weight"), 0u);
  EXPECT_EQ(shape["layers.24.attn.indexer.wq_b.weight"], (std::vector<int64_t>{4096, 1280}));
  EXPECT_EQ(shape["mtp.0.main_proj.weight"], (std::vector<int64_t>{5120, 15360}));
  EXPECT_EQ(shape["mtp.2.markov_head.head.weight"], (std::vector<int64_t>{129280, 256}));
  EXPECT_EQ(shape["layers.5.ffn.gate.bias_vl"], (std::vector<int64_t>{384}));
}

TEST(ModelConfigV41, RejectsInconsistentRoles) {
  auto bad = [](auto mutate) {
    nlohmann::json j = V41FlashConfigJson();
    mutate(j["text_config"]);
    return ModelConfig::FromJson(j);
  };
  auto expect_error = [](const Result<ModelConfig>& r, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  };
  expect_error(bad([](nlohmann::json& t) {
                 t["kv_source_layer_ids"] = {8, 14, 20};
               }),
               "no kv source");
  expect_error(bad([](nlohmann::json& t) {
                 t["kv_source_layer_ids"] = {2, 8, 14, 21};
               }),
               "reads kv source");
  expect_error(bad([](nlohmann::json& t) {
                 t["index_source_layer_ids"] = {8, 14, 20};
               }),
               "nothing to reuse");
  expect_error(bad([](nlohmann::json& t) { t["candidate_source_layer_id"] = 21; }),
               "not an index source");
  expect_error(bad([](nlohmann::json& t) { t["candidate_topk_blocks"] = 10; }), "fewer candidates");
  expect_error(bad([](nlohmann::json& t) { t["compress_ratios"][5] = 4; }), "not a V4.1 ratio");
  expect_error(bad([](nlohmann::json& t) { t["engram_layer_ids"] = {14, 1}; }), "ascending");
  expect_error(bad([](nlohmann::json& t) { t["engram_head_dim"] = 250; }), "engram_head_dim");
  expect_error(bad([](nlohmann::json& t) { t["num_hash_layers"] = 3; }), "hash");
  expect_error(bad([](nlohmann::json& t) { t.erase("dspark_markov_rank"); }), "dspark_markov_rank");
  expect_error(bad([](nlohmann::json& t) { t["gate_temp"] = 0; }), "gate_temp");
  nlohmann::json j = V41FlashConfigJson();
  j["quantization_config"]["weight_block_size"] = {128, 128};
  expect_error(ModelConfig::FromJson(j), "[32, 32]");
}

}  // namespace
}  // namespace dsinfer::model
