// `dsinfer tokenize` and `dsinfer detokenize`: JSON Lines filters over the tokenizer, a stable
// interface for external parity checks.
//
//   dsinfer tokenize --tokenizer FILE [--no-special]
//     stdin: one JSON string per line; stdout: one JSON array of ids per line. Default is HF
//     encode(text, add_special_tokens=False); --no-special is plain-text mode (added tokens
//     spelled in the text are encoded as ordinary text).
//   dsinfer detokenize --tokenizer FILE
//     stdin: one JSON array of ids per line; stdout: one JSON string per line.
//
// The first bad line (not JSON of the right type, invalid UTF-8, unknown id) stops the run with
// a message naming the line on stderr and exit code 1; lines before it have been written.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "text/tokenizer.h"

namespace dsinfer::cli {
namespace {

using Json = nlohmann::json;

void WriteLine(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // callers pipe line by line and wait for each answer
}

int LineError(size_t line_number, const std::string& message) {
  std::fprintf(stderr, "error: stdin line %zu: %s\n", line_number, message.c_str());
  return 1;
}

// Parses one input line; on failure returns nullopt with the parser's explanation in *error.
std::optional<Json> ParseLine(const std::string& line, std::string* error) {
  try {
    return Json::parse(line);
  } catch (const Json::exception& e) {
    *error = std::string("not valid JSON: ") + e.what();
    return std::nullopt;
  }
}

// Parses the common flags and loads the tokenizer; returns an exit code on failure.
std::optional<int> Setup(int argc, char** argv, const char* usage, bool allow_no_special,
                         std::optional<text::Tokenizer>* tokenizer, bool* no_special) {
  Args args;
  std::set<std::string> bool_flags;
  if (allow_no_special) bool_flags.insert("no-special");
  if (!args.Parse(argc, argv, {"tokenizer"}, bool_flags) || !args.positional().empty() ||
      !args.Has("tokenizer")) {
    std::fprintf(stderr, "%s\nusage: %s\n",
                 args.error().empty() ? "--tokenizer FILE is required" : args.error().c_str(),
                 usage);
    return 2;
  }
  *no_special = args.Has("no-special");
  auto tok = text::Tokenizer::FromFile(*args.Get("tokenizer"));
  if (!tok.ok()) {
    std::fprintf(stderr, "error: cannot load tokenizer: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  tokenizer->emplace(std::move(tok).value());
  return std::nullopt;
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  std::optional<text::Tokenizer> tok;
  bool no_special = false;
  if (auto rc =
          Setup(argc, argv, "dsinfer tokenize --tokenizer FILE [--no-special] < strings.jsonl",
                true, &tok, &no_special)) {
    return *rc;
  }
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    std::string error;
    const std::optional<Json> value = ParseLine(line, &error);
    if (!value) return LineError(line_number, error);
    if (!value->is_string()) return LineError(line_number, "expected a JSON string");
    auto ids = tok->Encode(value->get_ref<const std::string&>(), /*allow_special=*/!no_special);
    if (!ids.ok()) return LineError(line_number, ids.status().ToString());
    WriteLine(Json(*ids).dump());
  }
  return 0;
}

int RunDetokenize(int argc, char** argv) {
  std::optional<text::Tokenizer> tok;
  bool no_special = false;
  if (auto rc = Setup(argc, argv, "dsinfer detokenize --tokenizer FILE < ids.jsonl", false, &tok,
                      &no_special)) {
    return *rc;
  }
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    std::string error;
    const std::optional<Json> value = ParseLine(line, &error);
    if (!value) return LineError(line_number, error);
    if (!value->is_array()) return LineError(line_number, "expected a JSON array of token ids");
    std::vector<int32_t> ids;
    ids.reserve(value->size());
    for (const Json& id : *value) {
      if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN ||
          id.get<int64_t>() > INT32_MAX) {
        return LineError(line_number, "token ids must be integers, got " + id.dump());
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    auto text = tok->Decode(ids);
    if (!text.ok()) return LineError(line_number, text.status().ToString());
    WriteLine(Json(*text).dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  return 0;
}

}  // namespace dsinfer::cli
