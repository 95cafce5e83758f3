// Shared helpers for the tokenizer tests: loading the committed DeepSeek tokenizers and fixtures.
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "text/tokenizer.h"

namespace dsinfer::text::testing {

inline std::string FixturePath(const std::string& name) {
  return std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string V4Path() { return FixturePath("deepseek-v4/tokenizer.json"); }

// V3 = the committed overlay (everything but "model") + V4's model, which the fixture script
// asserts is identical to the V3 file's model.
inline std::string V3Json() {
  nlohmann::json overlay =
      nlohmann::json::parse(ReadAll(FixturePath("deepseek-v3/tokenizer_overlay.json")));
  nlohmann::json v4 = nlohmann::json::parse(ReadAll(V4Path()));
  overlay["model"] = std::move(v4["model"]);
  return overlay.dump();
}

// Loaded once per test binary: parsing 6 MB of JSON per test would dominate the run time.
struct Tokenizers {
  Tokenizer v4;
  Tokenizer v3;
};

inline const Tokenizers& Shared() {
  static const Tokenizers* shared = [] {
    auto v4 = Tokenizer::FromFile(V4Path());
    auto v3 = Tokenizer::FromJson(V3Json());
    if (!v4.ok() || !v3.ok()) {
      std::fprintf(stderr, "cannot load tokenizers: %s / %s\n", v4.status().ToString().c_str(),
                   v3.status().ToString().c_str());
      std::abort();
    }
    return new Tokenizers{std::move(v4).value(), std::move(v3).value()};
  }();
  return *shared;
}

}  // namespace dsinfer::text::testing
