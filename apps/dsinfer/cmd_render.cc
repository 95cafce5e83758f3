// `dsinfer render`: OpenAI Chat Completions request (JSON on stdin) -> DeepSeek V4 / V4.1 prompt.
//
//   dsinfer render [--model DIR] [--version v4|v4.1] < request.json
//     stdout: {"prompt": "...", "special_ranges": [[start, end], ...], "ids": [...]}
//     special_ranges are byte offsets of the control tokens the template wrote; everything else is
//     encoded as plain text. "ids" needs --model (DIR/tokenizer.json). --version defaults to v4.
//
// Bad requests (unknown role, malformed tool schema, wrong types) exit 1 with the reason.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "args.h"
#include "commands.h"
#include "text/chat_json.h"
#include "text/chat_render.h"
#include "text/tokenizer.h"

namespace dsinfer::cli {

int RunRender(int argc, char** argv) {
  const char* usage = "dsinfer render [--model DIR] [--version v4|v4.1] < request.json";
  Args args;
  if (!args.Parse(argc, argv, {"model", "version"}, {}) || !args.positional().empty()) {
    std::fprintf(stderr, "%s\nusage: %s\n", args.error().c_str(), usage);
    return 2;
  }
  const std::string version_name = args.GetOr("version", "v4");
  text::ModelVersion version;
  if (version_name == "v4") {
    version = text::ModelVersion::kV4;
  } else if (version_name == "v4.1") {
    version = text::ModelVersion::kV41;
  } else {
    std::fprintf(stderr, "--version must be v4 or v4.1\nusage: %s\n", usage);
    return 2;
  }
  std::optional<text::Tokenizer> tokenizer;
  if (auto dir = args.Get("model")) {
    auto tok = text::Tokenizer::FromFile(*dir + "/tokenizer.json");
    if (!tok.ok()) {
      std::fprintf(stderr, "error: cannot load tokenizer: %s\n", tok.status().ToString().c_str());
      return 1;
    }
    tokenizer.emplace(std::move(tok).value());
  }

  const std::string body((std::istreambuf_iterator<char>(std::cin)),
                         std::istreambuf_iterator<char>());
  auto request = text::ChatRequestFromJson(body, version);
  if (!request.ok()) {
    std::fprintf(stderr, "error: %s\n", request.status().ToString().c_str());
    return 1;
  }
  auto rendered = text::RenderPromptSegments(*request);
  if (!rendered.ok()) {
    std::fprintf(stderr, "error: %s\n", rendered.status().ToString().c_str());
    return 1;
  }
  nlohmann::ordered_json out;
  out["prompt"] = rendered->text;
  out["special_ranges"] = nlohmann::ordered_json::array();
  size_t offset = 0;
  for (const auto& segment : rendered->segments) {
    if (segment.is_special) out["special_ranges"].push_back({offset, offset + segment.text.size()});
    offset += segment.text.size();
  }
  if (tokenizer) {
    auto ids = text::EncodePrompt(*tokenizer, rendered->segments);
    if (!ids.ok()) {
      std::fprintf(stderr, "error: cannot encode prompt: %s\n", ids.status().ToString().c_str());
      return 1;
    }
    out["ids"] = *ids;
  }
  // Requests may hold invalid UTF-8 only if the JSON parser let it through; never throw here.
  const std::string text =
      out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace dsinfer::cli
