// `dsinfer draft-vocabulary`: the N most frequent token ids of a text corpus, as the JSON array
// `serve --speculative-token-map` reads (model/draft_vocabulary.h). The corpus should look like
// what the server will generate (e.g. a dump of past responses): drafts are proposed only from
// these ids, so a token outside them can never be drafted, and the share of the corpus the ids
// cover bounds the share of target tokens a draft can match.
//
//   dsinfer draft-vocabulary (--model DIR | --tokenizer FILE) --size N [--out FILE] CORPUS...
//
// Each corpus file is read as UTF-8 text in chunks of whole lines (special tokens spelled in it,
// like </think>, count as themselves). Ties in frequency go to the lower id. A corpus with fewer
// than N distinct tokens gives all of them, and says so.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "text/tokenizer.h"

namespace dsinfer::cli {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;  // tokenized at once, cut after a newline

// Adds the token counts of the file at `path` to counts [vocab]; false (and a message) on error.
bool CountFile(const text::Tokenizer& tok, const std::string& path, std::vector<int64_t>& counts) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: cannot read %s\n", path.c_str());
    return false;
  }
  std::string chunk, line;
  auto flush = [&]() {
    if (chunk.empty()) return true;
    auto ids = tok.Encode(chunk, /*allow_special=*/true);
    if (!ids.ok()) {
      std::fprintf(stderr, "dsinfer draft-vocabulary: %s: %s\n", path.c_str(),
                   ids.status().ToString().c_str());
      return false;
    }
    for (int32_t id : *ids) ++counts[static_cast<size_t>(id)];
    chunk.clear();
    return true;
  };
  while (std::getline(in, line)) {
    chunk += line;
    if (!in.eof()) chunk += '\n';
    if (chunk.size() >= kChunkBytes && !flush()) return false;
  }
  if (in.bad()) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: error reading %s\n", path.c_str());
    return false;
  }
  return flush();
}

}  // namespace

int RunDraftVocabulary(int argc, char** argv) {
  const char* usage =
      "dsinfer draft-vocabulary (--model DIR | --tokenizer FILE) --size N [--out FILE] CORPUS...";
  Args args;
  long long size = 0;
  if (!args.Parse(argc, argv, {"model", "tokenizer", "size", "out"}, {}) ||
      !args.GetInt("size", &size) || size < 1 || args.positional().empty() ||
      (!args.Has("model") && !args.Has("tokenizer"))) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: %s\nusage: %s\n",
                 args.error().empty() ? "give --size N >= 1, a tokenizer and corpus files"
                                      : args.error().c_str(),
                 usage);
    return 2;
  }
  const std::string tokenizer_path =
      FindTokenizer(args.GetOr("model", "."), args.GetOr("tokenizer", ""));
  auto tok = text::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: tokenizer %s: %s\n", tokenizer_path.c_str(),
                 tok.status().ToString().c_str());
    return 1;
  }
  std::vector<int64_t> counts(static_cast<size_t>(tok->vocab_size()), 0);
  for (const std::string& path : args.positional())
    if (!CountFile(*tok, path, counts)) return 1;

  std::vector<int32_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const auto seen = static_cast<int64_t>(
      std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; }));
  const int64_t n = std::min<int64_t>(size, seen);
  if (n == 0) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: the corpus has no tokens\n");
    return 1;
  }
  std::vector<int32_t> ids(order.begin(), order.begin() + n);
  int64_t covered = 0;
  for (int32_t id : ids) covered += counts[static_cast<size_t>(id)];
  std::sort(ids.begin(), ids.end());

  std::string json = "[";
  for (size_t i = 0; i < ids.size(); ++i) json += (i ? "," : "") + std::to_string(ids[i]);
  json += "]\n";
  const std::string out_path = args.GetOr("out", "");
  std::FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: cannot write %s\n", out_path.c_str());
    return 1;
  }
  const bool written = std::fwrite(json.data(), 1, json.size(), out) == json.size();
  if ((out != stdout && std::fclose(out) != 0) || !written) {
    std::fprintf(stderr, "dsinfer draft-vocabulary: writing %s failed\n",
                 out_path.empty() ? "stdout" : out_path.c_str());
    return 1;
  }
  if (n < size)
    std::fprintf(stderr, "the corpus has only %lld distinct tokens: all of them are written\n",
                 static_cast<long long>(seen));
  std::fprintf(stderr, "%lld ids of %d cover %.2f %% of the corpus' %lld tokens\n",
               static_cast<long long>(n), tok->vocab_size(),
               100.0 * static_cast<double>(covered) / static_cast<double>(total),
               static_cast<long long>(total));
  return 0;
}

}  // namespace dsinfer::cli
