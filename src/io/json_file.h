// Reading JSON from untrusted files (config.json, index files, safetensors headers) with size
// and nesting limits, duplicate-key rejection, and errors that name the source and the parse
// position. No exception escapes: nlohmann::json's are caught here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace dsinfer::io {

struct JsonParseLimits {
  // Objects + arrays open at once. The parser itself is iterative, but later recursive walks
  // of the document (dump(), comparisons, our own visitors) are not, so depth is bounded here.
  int max_depth = 64;
};

// Parses `text` (one JSON value, trailing whitespace allowed). Rejects duplicate keys in any
// object: nlohmann::json would silently keep the last one, which can hide a second, different
// definition of a tensor or config field. Errors name `source` and the byte offset / line and
// column of the problem.
Result<nlohmann::json> ParseJsonText(std::string_view text, const std::string& source,
                                     const JsonParseLimits& limits = {});

// Reads and parses a JSON file of at most 64 MiB (ParseJsonText's checks apply).
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace dsinfer::io
