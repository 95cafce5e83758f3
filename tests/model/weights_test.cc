// Checkpoint binding: zero-copy loading, and every malformed-checkpoint class is a clear error
// naming the tensor and the file (never a crash).
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "../backend/test_models.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "model/demo_model.h"
#include "text/tokenizer.h"

namespace dsinfer::model {
namespace {

namespace fs = std::filesystem;

// Under this process's own directory, which is removed at exit (each ctest case is a process of
// its own, and the tiny checkpoint is 136 MB: leaving it behind filled CI's disk).
std::string TempDir(const std::string& name) {
  fs::path p = fs::path(testing::TestTempDir()) / name;
  fs::remove_all(p);
  return p.string();
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGE_SIZE);
}

const std::string& TinyDir() {
  static const std::string dir = [] {
    std::string d = TempDir("tiny-a");
    ThreadPool pool(2);
    Status st = WriteDemoModel(*PresetConfig("tiny-a"), d, {}, pool);
    DSINFER_CHECK_MSG(st.ok(), st.ToString());
    return d;
  }();
  return dir;
}

// Copies the tiny checkpoint into a single model.safetensors, letting `edit` change or drop
// tensors (return false to drop).
using Edit = std::function<bool(io::OwnedTensor&)>;
std::string EditedCopy(const std::string& name, const Edit& edit) {
  auto src = io::Checkpoint::Open(TinyDir());
  DSINFER_CHECK(src.ok());
  std::vector<io::OwnedTensor> tensors;
  for (const auto& tname : (*src)->TensorNames()) {
    io::TensorRef ref = (*src)->Find(tname);
    io::OwnedTensor t{
        tname, ref.info->dtype, ref.info->shape, {ref.bytes.begin(), ref.bytes.end()}};
    if (edit(t)) tensors.push_back(std::move(t));
  }
  std::string dir = TempDir(name);
  fs::create_directories(dir);
  fs::copy_file(TinyDir() + "/config.json", dir + "/config.json");
  Status st = io::WriteSafetensors(dir + "/model.safetensors", tensors);
  DSINFER_CHECK_MSG(st.ok(), st.ToString());
  return dir;
}

void ExpectLoadError(const std::string& dir, const std::string& tensor, const std::string& what) {
  auto w = ModelWeights::Load(dir);
  ASSERT_FALSE(w.ok()) << "loaded a bad checkpoint: " << dir;
  const std::string& msg = w.status().message();
  EXPECT_NE(msg.find(tensor), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
}

TEST(ModelWeights, LoadsTinyCheckpointAndSingleFileCopy) {
  auto sharded = ModelWeights::Load(TinyDir());
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  auto single = ModelWeights::Load(EditedCopy("single", [](io::OwnedTensor&) { return true; }));
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ((*single)->layers.size(), 5u);  // 4 backbone + MTP
}

TEST(ModelWeights, MalformedCheckpointsAreClearErrors) {
  ExpectLoadError(
      EditedCopy("missing",
                 [](io::OwnedTensor& t) { return t.name != "layers.2.attn.wkv.weight"; }),
      "layers.2.attn.wkv.weight", "missing");
  ExpectLoadError(EditedCopy("dtype",
                             [](io::OwnedTensor& t) {
                               if (t.name == "layers.1.attn.kv_norm.weight") t.dtype = DType::kF16;
                               return true;
                             }),
                  "layers.1.attn.kv_norm.weight", "dtype");
  ExpectLoadError(EditedCopy("shape",
                             [](io::OwnedTensor& t) {
                               if (t.name == "layers.0.attn.attn_sink") t.shape = {2, 2};
                               return true;
                             }),
                  "layers.0.attn.attn_sink", "shape");
  ExpectLoadError(EditedCopy("nan_scale",
                             [](io::OwnedTensor& t) {
                               if (t.name == "layers.3.ffn.experts.1.w2.scale") t.bytes[5] = 0xff;
                               return true;
                             }),
                  "layers.3.ffn.experts.1.w2.scale", "NaN");
  ExpectLoadError(EditedCopy("tid2eid",
                             [](io::OwnedTensor& t) {
                               if (t.name == "layers.0.ffn.gate.tid2eid")
                                 t.bytes[8] = 0x7f;  // expert id far out of range
                               return true;
                             }),
                  "layers.0.ffn.gate.tid2eid", "expert id");
  // A config that disagrees with the tensors: one more layer than the checkpoint has.
  std::string dir = EditedCopy("config", [](io::OwnedTensor&) { return true; });
  auto c = PresetConfig("tiny-a");
  c->n_layers = 5;
  c->compress_ratios = {0, 4, 128, 4, 0, 0};
  std::ofstream(dir + "/config.json") << c->ToJson().dump();
  ExpectLoadError(dir, "layers.4.", "missing");
  // Garbage config.json.
  std::ofstream(dir + "/config.json") << "{\"hidden_size\": ";
  EXPECT_FALSE(ModelWeights::Load(dir).ok());
}

// Loading must not copy weights: after Load the resident set grows by far less than the
// checkpoint (only the small tensors that validation reads are touched).
TEST(ModelWeights, LoadIsZeroCopy) {
  std::string dir = TempDir("demo");
  ThreadPool pool(2);
  ASSERT_TRUE(WriteDemoModel(*PresetConfig("demo"), dir, {}, pool).ok());
  int64_t before = ResidentBytes();
  auto w = ModelWeights::Load(dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  int64_t after = ResidentBytes();
  uint64_t size = (*w)->checkpoint().TotalBytes();
  double grown = static_cast<double>(after - before);
  std::printf("checkpoint %.1f MB; resident set grew by %.1f MB after Load (%.1f%%)\n", size / 1e6,
              grown / 1e6, 100.0 * grown / size);
  EXPECT_LT(grown, 0.1 * size);
}

// --weights copy: every view points into the copy and reads the same bytes as the mapped load.
TEST(ModelWeights, CopiedLoadBindsTheSameBytes) {
  auto mapped = ModelWeights::Load(TinyDir(), WeightResidency::kMap);
  auto copied = ModelWeights::Load(TinyDir(), WeightResidency::kCopy);
  ASSERT_TRUE(mapped.ok() && copied.ok()) << copied.status().ToString();
  EXPECT_FALSE((*mapped)->copied());
  EXPECT_TRUE((*copied)->copied());
  const WeightMatrix& a = (*mapped)->head;
  const WeightMatrix& b = (*copied)->head;
  ASSERT_EQ(a.Bytes(), b.Bytes());
  EXPECT_NE(a.data, b.data);
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.Bytes())), 0);
  const WeightMatrix& wa = (*mapped)->layers[1].experts[0].w2;
  const WeightMatrix& wb = (*copied)->layers[1].experts[0].w2;
  EXPECT_EQ(std::memcmp(wa.data, wb.data, static_cast<size_t>(wa.Bytes())), 0);
  EXPECT_EQ(std::memcmp(wa.scales, wb.scales, static_cast<size_t>(wa.rows * wa.scale_cols)), 0);
}

// ---- V4.1 ---------------------------------------------------------------------------------------

std::string V41Tokenizer() {
  auto tok = io::ReadTextFile(std::string(DSINFER_SOURCE_DIR) +
                              "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json");
  auto overlay = io::ReadTextFile(std::string(DSINFER_SOURCE_DIR) +
                                  "/tests/fixtures/v41/tokenizer_overlay.json");
  DSINFER_CHECK(tok.ok() && overlay.ok());
  auto json = text::ApplyAddedTokenOverlay(*tok, *overlay);
  DSINFER_CHECK(json.ok());
  return *json;
}

TEST(ModelWeights, LoadsAV41CheckpointWithItsRolesAndTokenMap) {
  const std::string dir = TempDir("tiny-v41-a");
  ThreadPool pool(2);
  DemoModelOptions options;
  // Engram layers need the tokenizer: refused without one.
  Status refused = WriteDemoModel(*PresetConfig("tiny-v41-a"), dir, options, pool);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("tokenizer"), std::string::npos);
  options.tokenizer_json = V41Tokenizer();
  ASSERT_TRUE(WriteDemoModel(*PresetConfig("tiny-v41-a"), dir, options, pool).ok());
  auto w = ModelWeights::Load(dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelWeights& m = **w;
  EXPECT_EQ(m.layers.size(), 9u);                      // 8 layers + 1 dSpark stage
  EXPECT_TRUE(m.layers[2].compressor.wgate.valid());   // ratio-2 kv source
  EXPECT_FALSE(m.layers[4].compressor.wgate.valid());  // ratio-1 kv source: no gate
  EXPECT_TRUE(m.layers[4].indexer.wk.valid());
  EXPECT_FALSE(m.layers[6].indexer.wk.valid());  // index source, not a kv source
  EXPECT_TRUE(m.layers[6].indexer.wq_b.valid());
  EXPECT_TRUE(m.layers[3].engram.valid());
  EXPECT_TRUE(m.layers[8].dspark.main_proj.valid());
  EXPECT_EQ(m.layers[0].wq_a.block, 32);
  EXPECT_EQ(m.layers[0].wq_a.Bytes(), 32 * 64 + 1 * 2);  // [32, 64] codes + [1, 2] scales
  ASSERT_EQ(m.engram_token_map.size(), 512u);
  EXPECT_EQ(m.engram_token_map[2], 2);  // the pad token's class
  // The tokenizer must give the config's class count.
  std::ofstream(dir + "/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})";
  EXPECT_FALSE(ModelWeights::Load(dir).ok());
  std::filesystem::remove(dir + "/tokenizer.json");
  auto none = ModelWeights::Load(dir);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("tokenizer.json"), std::string::npos);
}

TEST(ModelWeights, V41VisionTensorsAreSkipped) {
  const std::string dir = TempDir("tiny-v41-vision");
  ThreadPool pool(2);
  DemoModelOptions options;
  options.tokenizer_json = V41Tokenizer();
  ASSERT_TRUE(WriteDemoModel(*PresetConfig("tiny-v41-c"), dir, options, pool).ok());
  // A shard with vision tensors, named in the index like the released checkpoint's.
  io::OwnedTensor patch{
      "vision.patch_embed.weight", DType::kBF16, {4, 4}, std::vector<uint8_t>(32)};
  io::OwnedTensor start{"image_start", DType::kBF16, {64}, std::vector<uint8_t>(128)};
  ASSERT_TRUE(io::WriteSafetensors(dir + "/vision.safetensors", {patch, start}).ok());
  nlohmann::json index =
      nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  index["weight_map"]["vision.patch_embed.weight"] = "vision.safetensors";
  index["weight_map"]["image_start"] = "vision.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  auto w = ModelWeights::Load(dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->skipped_vision_tensors, 2);
}

TEST(ModelWeights, ResidencyChoice) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  const auto resolve = [](WeightResidency r, uint64_t bytes, uint64_t reserve,
                          std::optional<int64_t> available) {
    return ResolveWeightResidency(r, bytes, reserve, available);
  };
  // auto: a copy only with 10 % of the available memory to spare after weights + reserve.
  EXPECT_EQ(*resolve(WeightResidency::kAuto, 12 * kGiB, 6 * kGiB, 20 * kGiB),
            WeightResidency::kCopy);
  EXPECT_EQ(*resolve(WeightResidency::kAuto, 12 * kGiB, 7 * kGiB, 20 * kGiB),
            WeightResidency::kMap);
  EXPECT_EQ(*resolve(WeightResidency::kAuto, 1, 0, std::nullopt), WeightResidency::kMap);
  EXPECT_EQ(*resolve(WeightResidency::kMap, 1, 0, 100 * kGiB), WeightResidency::kMap);
  // copy: an error naming the sizes and the way out when it cannot fit; unknown memory: tried.
  auto too_big = resolve(WeightResidency::kCopy, 150 * kGiB, 0, 100 * kGiB);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("150.0 GiB"), std::string::npos);
  EXPECT_NE(too_big.status().message().find("--weights map"), std::string::npos);
  EXPECT_EQ(*resolve(WeightResidency::kCopy, 150 * kGiB, 0, std::nullopt), WeightResidency::kCopy);
  for (auto r : {WeightResidency::kAuto, WeightResidency::kMap, WeightResidency::kCopy})
    EXPECT_EQ(ParseWeightResidency(WeightResidencyName(r)), r);
  EXPECT_FALSE(ParseWeightResidency("mmap").has_value());
}

}  // namespace
}  // namespace dsinfer::model
