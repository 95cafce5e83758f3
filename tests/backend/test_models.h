// Shared helpers for backend tests: tiny checkpoints written once per test binary into a
// temporary directory by the same code as `dsinfer create-demo-model`.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "io/text_file.h"
#include "model/demo_model.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace dsinfer::testing {

// A directory of this process's own, removed when the process exits normally (checkpoints of
// the demo preset are 146 MB: a test run leaving them behind fills /tmp within a day).
inline std::string TestTempDir() {
  struct Owned {
    std::filesystem::path path;
    Owned()
        : path(std::filesystem::temp_directory_path() /
               ("dsinfer_test_" + std::to_string(::getpid()))) {
      std::filesystem::create_directories(path);
    }
    ~Owned() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Owned dir;
  return dir.path.string();
}

// The V4.1 tokenizer: V4's with tests/fixtures/v41/tokenizer_overlay.json applied (what
// `create-demo-model --tokenizer ... --tokenizer-overlay ...` writes next to a V4.1 checkpoint).
inline std::string V41TokenizerJson() {
  const std::string root = DSINFER_SOURCE_DIR;
  auto tok = io::ReadTextFile(root + "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json");
  auto overlay = io::ReadTextFile(root + "/tests/fixtures/v41/tokenizer_overlay.json");
  DSINFER_CHECK_MSG(tok.ok() && overlay.ok(), "V4.1 tokenizer fixtures missing");
  auto json = text::ApplyAddedTokenOverlay(*tok, *overlay);
  DSINFER_CHECK_MSG(json.ok(), json.status().ToString());
  return std::move(json).value();
}

// Writes (once) and loads the preset's checkpoint; aborts the test binary on failure.
inline const model::ModelWeights& PresetWeights(const std::string& preset, uint64_t seed = 1) {
  static std::map<std::string, std::unique_ptr<model::ModelWeights>>* cache =
      new std::map<std::string, std::unique_ptr<model::ModelWeights>>();
  std::string key = preset + "/" + std::to_string(seed);
  auto it = cache->find(key);
  if (it != cache->end()) return *it->second;
  std::string dir = TestTempDir() + "/" + preset + "-" + std::to_string(seed);
  auto config = model::PresetConfig(preset);
  DSINFER_CHECK_MSG(config.ok(), config.status().ToString());
  ThreadPool pool(2);
  model::DemoModelOptions options;
  options.seed = seed;
  if (config->engram.enabled()) options.tokenizer_json = V41TokenizerJson();
  Status st = model::WriteDemoModel(*config, dir, options, pool);
  DSINFER_CHECK_MSG(st.ok(), st.ToString());
  auto weights = model::ModelWeights::Load(dir);
  DSINFER_CHECK_MSG(weights.ok(), weights.status().ToString());
  return *((*cache)[key] = std::move(weights).value());
}

}  // namespace dsinfer::testing
