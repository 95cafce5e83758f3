// Checkpoint directories: single file, sharded index, and every index inconsistency.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace dsinfer::io {
namespace {

using testing::ScratchDir;
using testing::WriteText;

OwnedTensor U8(const std::string& name, std::vector<uint8_t> bytes) {
  return {name, DType::kU8, {static_cast<int64_t>(bytes.size())}, std::move(bytes)};
}

// Two shards: a,b in shard 1; c in shard 2; index maps exactly those.
void WriteShardedCheckpoint(const ScratchDir& dir, const std::string& weight_map_json) {
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00001-of-00002.safetensors"),
                               {U8("a", {1, 2}), U8("b", {3})})
                  .ok());
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), {U8("c", {4, 5, 6})}).ok());
  WriteText(dir.File("model.safetensors.index.json"),
            R"({"metadata":{"total_size":6},"weight_map":)" + weight_map_json + "}");
}

const char* kGoodMap =
    R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
    R"("c":"model-00002-of-00002.safetensors"})";

TEST(CheckpointTest, OpensShardedCheckpoint) {
  ScratchDir dir;
  WriteShardedCheckpoint(dir, kGoodMap);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->dir(), dir.path());
  EXPECT_EQ((*ckpt)->TensorNames(), (std::vector<std::string>{"a", "b", "c"}));
  TensorRef c = (*ckpt)->Find("c");
  ASSERT_NE(c.info, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(c.bytes.begin(), c.bytes.end()), (std::vector<uint8_t>{4, 5, 6}));
  EXPECT_EQ(*c.file, dir.File("model-00002-of-00002.safetensors"));
  TensorRef missing = (*ckpt)->Find("nope");
  EXPECT_EQ(missing.info, nullptr);
  EXPECT_TRUE(missing.bytes.empty());
  const uint64_t sizes = std::filesystem::file_size(dir.File("model-00001-of-00002.safetensors")) +
                         std::filesystem::file_size(dir.File("model-00002-of-00002.safetensors"));
  EXPECT_EQ((*ckpt)->TotalBytes(), sizes);
  EXPECT_EQ((*ckpt)->shards().size(), 2u);
}

// The random-access hint (Engram tables) lands on the tensor's own mapped bytes: madvise accepts
// the page-aligned range inside the shard; the bytes read the same after; unknown names fail.
TEST(CheckpointTest, AdviseRandomAccessCoversATensorAndRefusesUnknownNames) {
  ScratchDir dir;
  WriteShardedCheckpoint(dir, kGoodMap);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_TRUE((*ckpt)->AdviseRandomAccess("c").ok());
  EXPECT_TRUE((*ckpt)->AdviseRandomAccess("a").ok());
  TensorRef c = (*ckpt)->Find("c");
  EXPECT_EQ(std::vector<uint8_t>(c.bytes.begin(), c.bytes.end()), (std::vector<uint8_t>{4, 5, 6}));
  EXPECT_EQ((*ckpt)->AdviseRandomAccess("nope").code(), StatusCode::kNotFound);
}

TEST(CheckpointTest, OpensSingleFileCheckpointAndTrailingSlash) {
  ScratchDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), {U8("w", {9, 8})}).ok());
  auto ckpt = Checkpoint::Open(dir.path() + "/");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  TensorRef w = (*ckpt)->Find("w");
  ASSERT_NE(w.info, nullptr);
  EXPECT_EQ(w.bytes[1], 8);
  EXPECT_EQ(*w.file, dir.File("model.safetensors"));
  EXPECT_EQ((*ckpt)->TotalBytes(), std::filesystem::file_size(dir.File("model.safetensors")));
}

TEST(CheckpointTest, SymlinkedShardsAreAllowed) {  // the Hugging Face cache layout
  ScratchDir dir;
  std::filesystem::create_directories(dir.File("blobs"));
  std::filesystem::create_directories(dir.File("snap"));
  ASSERT_TRUE(WriteSafetensors(dir.File("blobs/abc123"), {U8("w", {1})}).ok());
  std::filesystem::create_symlink("../blobs/abc123", dir.File("snap/model.safetensors"));
  auto ckpt = Checkpoint::Open(dir.File("snap"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_NE((*ckpt)->Find("w").info, nullptr);
}

struct BadCheckpoint {
  const char* label;
  std::string weight_map;             // JSON for "weight_map" (or a whole index if `whole_index`)
  std::vector<const char*> expected;  // substrings of the error
  bool whole_index = false;
};

TEST(CheckpointTest, IndexErrorsNameTensorAndShard) {
  const std::vector<BadCheckpoint> cases = {
      {"missing shard file",
       R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
       R"("c":"model-00003-of-00002.safetensors"})",
       {"model-00003-of-00002.safetensors", "No such file"}},
      {"tensor missing in shard",
       R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
       R"("c":"model-00002-of-00002.safetensors","ghost":"model-00002-of-00002.safetensors"})",
       {"tensor 'ghost'", "model-00002-of-00002.safetensors", "does not contain it"}},
      {"tensor in shard but not in map",
       R"({"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"})",
       {"tensor 'b'", "model-00001-of-00002.safetensors", "does not list"}},
      {"tensor mapped to the wrong shard",
       R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
       R"("c":"model-00001-of-00002.safetensors"})",
       {"tensor 'c'", "does not contain it"}},
      {"parent traversal",
       R"({"a":"../model-00001-of-00002.safetensors"})",
       {"tensor 'a'", "'../model-00001-of-00002.safetensors'", "not a plain file name"}},
      {"absolute path", R"({"a":"/etc/passwd"})", {"'/etc/passwd'", "not a plain file name"}},
      {"subdirectory", R"({"a":"sub/x.safetensors"})", {"not a plain file name"}},
      {"dot dot", R"({"a":".."})", {"not a plain file name"}},
      {"empty name", R"({"a":""})", {"not a plain file name"}},
      {"non-string shard", R"({"a":3})", {"tensor 'a'", "not a string"}},
      {"empty map", R"({})", {"\"weight_map\" is empty"}},
      {"weight_map not object", R"([1])", {"missing \"weight_map\" object"}},
      {"duplicate tensor in index",
       R"({"a":"model-00001-of-00002.safetensors","a":"model-00002-of-00002.safetensors"})",
       {"duplicate key 'a'"}},
      {"malformed JSON", R"({"a":)", {"invalid JSON at byte", "line 1"}},
      {"no weight_map", R"({"metadata":{}})", {"missing \"weight_map\""}, true},
      {"index not object", R"([])", {"not a JSON object"}, true},
  };
  for (const BadCheckpoint& c : cases) {
    SCOPED_TRACE(c.label);
    ScratchDir dir;
    WriteShardedCheckpoint(dir, c.weight_map);
    if (c.whole_index) WriteText(dir.File("model.safetensors.index.json"), c.weight_map);
    auto ckpt = Checkpoint::Open(dir.path());
    ASSERT_FALSE(ckpt.ok());
    const std::string& msg = ckpt.status().message();
    EXPECT_NE(msg.find(dir.path()), std::string::npos) << msg;
    for (const char* want : c.expected) EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

TEST(CheckpointTest, BadShardErrorNamesShardAndTensor) {
  ScratchDir dir;
  WriteShardedCheckpoint(dir, kGoodMap);
  // Corrupt shard 2: size mismatch for tensor 'c'.
  std::string header = R"({"c":{"dtype":"U8","shape":[4],"data_offsets":[0,3]}})";
  testing::WriteBytes(dir.File("model-00002-of-00002.safetensors"),
                      testing::RawSafetensors(header, 3));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  const std::string& msg = ckpt.status().message();
  EXPECT_NE(msg.find(dir.File("model-00002-of-00002.safetensors")), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'c'"), std::string::npos) << msg;
}

TEST(CheckpointTest, MissingFilesAreNotFound) {
  ScratchDir dir;
  auto empty = Checkpoint::Open(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("neither model.safetensors.index.json nor "
                                          "model.safetensors"),
            std::string::npos);
  auto absent = Checkpoint::Open(dir.File("does-not-exist"));
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find(dir.File("does-not-exist")), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::io
