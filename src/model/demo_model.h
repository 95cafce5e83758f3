// create-demo-model: writes a random-weight checkpoint in the official V4 / V4.1 layout and
// formats (FP8 e4m3 + e8m0 block scales of the config's edge, 128 or 32, packed FP4 experts with
// per-32 e8m0 scales, tid2eid, hc_* params, MTP / dSpark stages, V4.1 Engram tables with per-row
// per-32 scales), sharded with model.safetensors.index.json. Deterministic: the same config and
// seed give byte-identical files on every machine (golden fixtures depend on it).
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
  // Written as DIR/tokenizer.json when non-empty (V4.1 Engram builds its token map from it, so a
  // config with Engram layers needs one).
  std::string tokenizer_json;
  // V4.1 Engram tables (and their scales) left as file holes, i.e. zeros, instead of random
  // values: a checkpoint with the real ~101 GB tables costs no disk (the RSS demonstration).
  bool sparse_engram_tables = false;
};

Status WriteDemoModel(const ModelConfig& config, const std::string& dir,
                      const DemoModelOptions& options, ThreadPool& pool);

}  // namespace dsinfer::model
