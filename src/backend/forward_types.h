// Backend-neutral types of a forward step: what a caller asks of a sequence's chunk, what comes
// back, a step's accounting, and the opaque per-sequence state handle. Shared by every backend,
// the layer program (v4_forward.h) and the engine (runtime/), which includes no backend's own
// headers.
#pragma once

#include <cstdint>
#include <vector>

namespace dsinfer::backend {

struct ForwardOptions {
  bool all_logits = false;   // logits for every position of the chunk (else the last only)
  bool want_hidden = false;  // also return every position's drafting input (V4: its final
                             // streams, the MTP block's input; V4.1: dSpark's target-layer means)
  bool want_logits = true;   // false: skip the head (prefill chunks that end mid-prompt)
};

struct ForwardOutput {
  std::vector<float> logits;  // [n_positions, vocab] f32
  std::vector<float> hidden;  // [n_tokens, V4Forward::HiddenWidth()] f32 when want_hidden
};

// What the last step had to read and compute, for roofline accounting in benchmarks.
struct StepStats {
  int64_t routed_expert_bytes = 0;  // weights of every routed expert that received >= 1 token
  int64_t n_routed_experts_used = 0;
  int64_t kv_bytes = 0;  // sequence state read by attention (window rows, compressed rows, keys)
  int64_t engram_bytes = 0;  // V4.1 Engram table rows read (codes and scales)
  // Multiply-adds of the step: every linear layer (each token times the weights it goes through:
  // a routed expert only for its tokens, the head only for the rows asked for), attention scores
  // and values over the visible rows, indexer scores. Left out, under 0.5 % of a token's: the mHC
  // mixes, norms, RoPE and the router's top-k.
  int64_t macs = 0;
};

// One sequence's complete decode state on a backend's device (window ring, compressed rows,
// indexer keys, compressor history). Created, copied, stepped and serialized by its backend
// only; everything else sees this handle.
class RunnerState {
 public:
  virtual ~RunnerState() = default;
  virtual int64_t n_tokens() const = 0;
  // The lowest length Truncate accepts now (n_tokens when the state cannot roll back).
  virtual int64_t rollback_floor() const = 0;
};

}  // namespace dsinfer::backend
