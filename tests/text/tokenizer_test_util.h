// Shared helpers for the tokenizer tests: loading the committed DeepSeek tokenizers and fixtures.
#pragma once

#include <cstdio>
#include <cstdlib>
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

// Each loaded once per process, on first use: ctest runs every test in its own process, and a
// test that needs only V4 should not pay for parsing V3 too.
inline const Tokenizer& LoadOnce(bool v3) {
  auto load = [](bool want_v3) {
    auto tok = want_v3 ? Tokenizer::FromJson(V3Json()) : Tokenizer::FromFile(V4Path());
    if (!tok.ok()) {
      std::fprintf(stderr, "cannot load tokenizer: %s\n", tok.status().ToString().c_str());
      std::abort();
    }
    return new Tokenizer(std::move(tok).value());
  };
  if (v3) {
    static const Tokenizer* tok = load(true);
    return *tok;
  }
  static const Tokenizer* tok = load(false);
  return *tok;
}
inline const Tokenizer& V4() { return LoadOnce(false); }
inline const Tokenizer& V3() { return LoadOnce(true); }

}  // namespace dsinfer::text::testing
