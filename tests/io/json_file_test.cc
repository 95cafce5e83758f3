#include "io/json_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "io_test_util.h"

namespace dsinfer::io {
namespace {

using testing::ScratchDir;
using testing::WriteText;

TEST(JsonFileTest, ReadsObject) {
  ScratchDir dir;
  WriteText(dir.File("config.json"), "{\"hidden_size\": 64, \"names\": [\"a\", \"b\"]}\n");
  auto j = ReadJsonFile(dir.File("config.json"));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["hidden_size"].get<int>(), 64);
  EXPECT_EQ((*j)["names"][1].get<std::string>(), "b");
}

TEST(JsonFileTest, ParseErrorNamesFileAndPosition) {
  ScratchDir dir;
  WriteText(dir.File("bad.json"), "{\n  \"a\": 1,\n  \"b\": tru}\n");
  auto j = ReadJsonFile(dir.File("bad.json"));
  ASSERT_FALSE(j.ok());
  const std::string& msg = j.status().message();
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(msg.find(dir.File("bad.json")), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at byte"), std::string::npos) << msg;
}

TEST(JsonFileTest, RejectsDuplicateKeysAndDeepNesting) {
  auto dup = ParseJsonText(R"({"a":{"x":1,"x":2}})", "dup.json");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("duplicate key 'x' in object 'a'"), std::string::npos)
      << dup.status().message();
  // Same key in sibling objects is fine.
  EXPECT_TRUE(ParseJsonText(R"({"a":{"x":1},"b":{"x":2},"c":[{"x":1},{"x":1}]})", "ok").ok());

  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto too_deep = ParseJsonText(deep, "deep.json");
  ASSERT_FALSE(too_deep.ok());
  EXPECT_NE(too_deep.status().message().find("nested deeper than 64"), std::string::npos);
  std::string fine = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(ParseJsonText(fine, "fine.json").ok());
}

TEST(JsonFileTest, RejectsEmptyTrailingAndMissing) {
  ScratchDir dir;
  WriteText(dir.File("empty.json"), "");
  EXPECT_FALSE(ReadJsonFile(dir.File("empty.json")).ok());
  EXPECT_FALSE(ParseJsonText("{} {}", "two.json").ok());
  auto missing = ReadJsonFile(dir.File("missing.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.json"), std::string::npos);
}

TEST(JsonFileTest, RejectsFilesOver64MiB) {
  ScratchDir dir;
  const std::string path = dir.File("huge.json");
  WriteText(path, "{}");
  ASSERT_EQ(::truncate(path.c_str(), (64 << 20) + 1), 0);  // sparse: nothing is written
  auto j = ReadJsonFile(path);
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("64 MiB"), std::string::npos);
  EXPECT_NE(j.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::io
