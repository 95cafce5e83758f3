// End-to-end check of `dsinfer tokenize` / `dsinfer detokenize` (the stable CLI that external
// parity checks drive) against the HF fixtures. Skipped when the dsinfer binary is not built.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer_test_util.h"

namespace dsinfer::text {
namespace {

using testing::FixturePath;
using testing::ReadAll;

std::string Binary() { return std::string(DSINFER_BINARY_DIR) + "/apps/dsinfer"; }

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// Runs `dsinfer <args>` with `input` on stdin; files live in a per-test temp directory.
CliRun RunCli(const std::string& args, const std::string& input) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dsinfer_cli_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string in = (dir / "in").string(), out = (dir / "out").string(),
                    err = (dir / "err").string();
  std::ofstream(in, std::ios::binary) << input;
  const std::string cmd =
      "'" + Binary() + "' " + args + " < '" + in + "' > '" + out + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  std::filesystem::remove_all(dir);
  return r;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    lines.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

class TokenizerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(Binary())) GTEST_SKIP() << "dsinfer binary not built";
  }
  const std::string tokenizer_flag_ =
      "--tokenizer '" + FixturePath("deepseek-v4/tokenizer.json") + "'";
};

TEST_F(TokenizerCli, TokenizeAndDetokenizeMatchFixtures) {
  std::ifstream corpus(FixturePath("encode_corpus.jsonl"), std::ios::binary);
  std::string line, input;
  std::vector<nlohmann::json> records;
  // Every 10th string keeps the run short while still covering each corpus category.
  for (int i = 0; std::getline(corpus, line); ++i) {
    if (i % 10 != 0) continue;
    records.push_back(nlohmann::json::parse(line));
    input += nlohmann::json(records.back()["text"]).dump() + "\n";
  }
  const CliRun special = RunCli("tokenize " + tokenizer_flag_, input);
  const CliRun plain = RunCli("tokenize --no-special " + tokenizer_flag_, input);
  ASSERT_EQ(special.exit_code, 0) << special.err;
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto special_lines = Lines(special.out), plain_lines = Lines(plain.out);
  ASSERT_EQ(special_lines.size(), records.size());
  ASSERT_EQ(plain_lines.size(), records.size());
  std::string ids_input;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& rec = records[i];
    const auto& expected_special = rec.contains("v4") ? rec["v4"] : rec["plain"];
    EXPECT_EQ(nlohmann::json::parse(special_lines[i]), expected_special) << i;
    EXPECT_EQ(nlohmann::json::parse(plain_lines[i]), rec["plain"]) << i;
    ids_input += special_lines[i] + "\n";
  }
  const CliRun decoded = RunCli("detokenize " + tokenizer_flag_, ids_input);
  ASSERT_EQ(decoded.exit_code, 0) << decoded.err;
  const auto decoded_lines = Lines(decoded.out);
  ASSERT_EQ(decoded_lines.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(nlohmann::json::parse(decoded_lines[i]), records[i]["text"]) << i;
  }
}

TEST_F(TokenizerCli, BadLinesFailCleanlyAfterEarlierOutput) {
  const struct {
    const char* command;
    std::string input;
  } cases[] = {
      {"tokenize", "\"ok\"\n123\n"},
      {"tokenize", "\"ok\"\n\"\\ud800\"\n"},
      {"tokenize", "\"ok\"\n\"a\xff\"\n"},
      {"detokenize", "[19923]\n[1, 999999]\n"},
      {"detokenize", "[19923]\n[1.5]\n"},
  };
  for (const auto& c : cases) {
    const CliRun r = RunCli(std::string(c.command) + " " + tokenizer_flag_, c.input);
    EXPECT_EQ(r.exit_code, 1) << c.input;
    EXPECT_EQ(Lines(r.out).size(), 1u) << "the good first line is answered: " << r.out;
    EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
  }
  EXPECT_EQ(RunCli("tokenize", "").exit_code, 2);  // --tokenizer missing: usage error
  EXPECT_EQ(RunCli("tokenize --tokenizer /nonexistent.json", "\"x\"\n").exit_code, 1);
}

}  // namespace
}  // namespace dsinfer::text
