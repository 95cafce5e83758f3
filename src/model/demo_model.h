// create-demo-model: writes a random-weight checkpoint in the official V4 layout and formats
// (FP8 e4m3 + e8m0 128x128 block scales, packed FP4 experts with per-32 e8m0 scales, tid2eid,
// hc_* params, MTP), sharded with model.safetensors.index.json. Deterministic: the same config
// and seed give byte-identical files on every machine (golden fixtures depend on it).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/config.h"

namespace dsinfer::model {

struct DemoModelOptions {
  uint64_t seed = 1;
  // Shard boundary target. 0 = choose: two shards for small models (exercises the index),
  // ~4 GiB shards for large ones.
  uint64_t max_shard_bytes = 0;
};

Status WriteDemoModel(const ModelConfig& config, const std::string& dir,
                      const DemoModelOptions& options, ThreadPool& pool);

}  // namespace dsinfer::model
