// Shared helpers for backend tests: tiny checkpoints written once per test binary into a
// temporary directory by the same code as `dsinfer create-demo-model`.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "model/demo_model.h"
#include "model/weights.h"

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
  Status st = model::WriteDemoModel(*config, dir, options, pool);
  DSINFER_CHECK_MSG(st.ok(), st.ToString());
  auto weights = model::ModelWeights::Load(dir);
  DSINFER_CHECK_MSG(weights.ok(), weights.status().ToString());
  return *((*cache)[key] = std::move(weights).value());
}

}  // namespace dsinfer::testing
