// Single-threaded encode throughput of the tokenizer, comparable with
// reference/tokenizer/bench_hf.py (same default text, same tokenizer, median of N runs).
//
// usage: tokenizer_bench [--tokenizer FILE] [--text FILE] [--runs N]
// Run from the repository root (default paths are relative to it):
//   default tokenizer: tests/fixtures/tokenizer/deepseek-v4/tokenizer.json
//   default text: the "text" fields of tests/fixtures/tokenizer/encode_corpus.jsonl joined by "\n"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string CorpusText(const std::string& jsonl_path) {
  std::ifstream in(jsonl_path, std::ios::binary);
  std::string line, text;
  bool first = true;
  while (std::getline(in, line)) {
    if (!first) text += '\n';
    first = false;
    text += nlohmann::json::parse(line)["text"].get<std::string>();
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = ".";
  std::string tokenizer_path = root + "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json";
  std::string text_path;
  int runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer"))
      tokenizer_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--text"))
      text_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--runs"))
      runs = std::max(1, std::atoi(argv[i + 1]));
  }
  const std::string text = text_path.empty()
                               ? CorpusText(root + "/tests/fixtures/tokenizer/encode_corpus.jsonl")
                               : ReadAll(text_path);
  auto tok = dsinfer::text::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::vector<double> seconds;
  size_t tokens = 0;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    auto ids = tok->Encode(text, /*allow_special=*/true);
    const auto stop = std::chrono::steady_clock::now();
    if (!ids.ok()) {
      std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
      return 1;
    }
    tokens = ids->size();
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::printf(
      "dsinfer tokenizer: %zu bytes, %zu tokens, median of %d runs %.4f s: %.2f MB/s, %.0f "
      "tokens/s\n",
      text.size(), tokens, runs, median, text.size() / median / 1e6, tokens / median);
  return 0;
}
