// Decode state of one sequence on the CPU backend (spec §10.2): per layer a window ring of
// post-processed KV rows, the compressed KV rows, the compressors' partial groups, and the
// indexer's compressed keys. Engine-thread only. Reset() gives a clean state for a new
// sequence (the reference does not reset; see spec §10.2 on stale slots).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace dsinfer::backend::cpu {

// Partial groups of one compressor. overlap: slots [0, r) hold the previous complete group,
// [r, 2r) the current one; otherwise slots [0, r).
struct CompressorState {
  int ratio = 0;
  int width = 0;  // coff * d: projection width
  bool overlap = false;
  std::vector<float> kv;     // [n_slots, width] f32 projections a_t
  std::vector<float> score;  // [n_slots, width] f32 gate logits g_t + ape (init -inf)

  void Init(int r, int w, bool ov) {
    ratio = r, width = w, overlap = ov;
    int n_slots = ov ? 2 * r : r;
    kv.assign(static_cast<size_t>(n_slots) * w, 0.0f);
    score.assign(static_cast<size_t>(n_slots) * w, -std::numeric_limits<float>::infinity());
  }
};

struct LayerState {
  // Window ring: slot p % window holds the KV row of position p, for the last `window` positions.
  std::vector<float> window_kv;   // [window, head_dim] f32 (bf16-exact in official mode)
  std::vector<float> compressed;  // [n_rows, head_dim] f32 compressed KV rows
  CompressorState compressor;
  std::vector<float> index_keys;  // [n_rows, index_head_dim] f32 (CSA layers)
  CompressorState index_compressor;
};

struct SequenceState {
  int64_t n_tokens = 0;            // positions processed so far
  std::vector<LayerState> layers;  // backbone layers
  std::vector<LayerState> mtp;     // MTP layers (their own window)
  int64_t mtp_n_tokens = 0;
  // Main model's final stream state of the last processed position: the MTP input.
  std::vector<float> last_hidden;  // [hc_mult, hidden] f32
  int32_t last_token = -1;
};

}  // namespace dsinfer::backend::cpu
