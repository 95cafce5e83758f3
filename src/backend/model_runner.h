// What the engine steps: a model whose per-sequence decode state lives on one device — the CPU
// backend (MakeCpuRunner) or a GPU (backend/cuda/cuda_runner.h). The engine (runtime/engine.h)
// schedules, budgets and caches states through this interface only, so continuous batching,
// preemption, the prefix cache and n > 1 forks work the same on every device.
// Thread-compatible: one owner thread (the engine's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/forward_types.h"
#include "backend/numerics.h"
#include "backend/page_allocator.h"
#include "core/status.h"
#include "model/state_layout.h"
#include "model/weights.h"

namespace dsinfer::backend {

// One sequence's slice of a batched step.
struct RunnerChunk {
  RunnerState* state = nullptr;
  std::span<const int32_t> tokens;
  ForwardOptions options;
  ForwardOutput* out = nullptr;
};

// One sequence's slice of a batched MTP call (ModelRunner::ForwardMtpBatch).
struct MtpRun {
  RunnerState* state = nullptr;
  std::span<const float> hidden;              // [n, hc, hidden] f32 streams at the MTP positions
  std::span<const int32_t> next;              // [n] the tokens one position later
  std::vector<float>* logits = nullptr;       // out: [vocab] f32 of the last row (null: no head)
  std::vector<float>* last_hidden = nullptr;  // out: [hc, hidden] f32 of the last row, or null
};

// One sequence's part of a batched dSpark seeding (ModelRunner::DsparkSeed).
struct DsparkSeedRun {
  RunnerState* state = nullptr;
  std::span<const float> hidden;  // [n, HiddenWidth()] the backbone's captures at the stages'
                                  // next positions [MtpTokens, + n)
};

// One sequence's dSpark draft block (ModelRunner::DsparkDraft).
struct DsparkDraftRun {
  RunnerState* state = nullptr;  // its stage rings hold every backbone position
  int32_t token = 0;             // the pending token, at position n_tokens
  int n_logits = -1;  // the block's first rows whose logits are wanted (-1: all of them)
  std::vector<float>* logits = nullptr;  // out: [n_logits, vocab] f32 before the Markov bias
  std::vector<float>* x = nullptr;       // out: [block, hidden] f32 collapsed streams
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // "cpu", "cuda:0 (NVIDIA H200)", ...: for logs and /metrics.
  virtual std::string device() const = 0;
  virtual Result<std::unique_ptr<RunnerState>> NewState() = 0;
  // An exact copy (n > 1 forks, prefix-cache restores): stepping the copy gives bit-identical
  // results to stepping the original. Paged runners share the pages copy-on-write.
  virtual Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) = 0;
  // A copy for keeping (a prefix-cache entry): only what the next token needs (no rollback).
  // Restore it with Copy.
  virtual Result<std::unique_ptr<RunnerState>> Snapshot(const RunnerState& from) {
    return Copy(from);
  }
  // Bytes a state holds apart from shared pages, an upper bound of what a state holds with its
  // pages after n_tokens tokens (non-decreasing in n_tokens), and the bytes of every page alive
  // (each counted once, however many states share it). Used bytes = the states' own + pages.
  virtual int64_t StateBytes(const RunnerState& state) const = 0;
  virtual int64_t StateBytesAt(int64_t n_tokens) const = 0;
  virtual int64_t PageBytesInUse() const { return 0; }
  // Pages come from `pages` from now on (before the first state is made; paged runners only).
  virtual Status UsePageAllocator(std::shared_ptr<PageAllocator> pages) {
    (void)pages;
    return Status::Ok();
  }
  // The layout of a paged runner's states (nullptr: not paged).
  virtual const model::StateLayout* layout() const { return nullptr; }
  // The KV budget when the user sets none: 25 % of RAM on the CPU, most of the free device
  // memory on a GPU.
  virtual int64_t DefaultStateBudget() const = 0;
  // Runs every chunk in one batched step (cpu::CpuModel::ForwardBatch's contract); a bad
  // argument fails before any state changes.
  virtual Status ForwardBatch(std::span<RunnerChunk> chunks) = 0;

  // ---- state operations (model/state_layout.h) -------------------------------------------------
  // Back to n tokens, state.rollback_floor() <= n <= state.n_tokens().
  virtual Status Truncate(RunnerState& state, int64_t n_tokens) {
    (void)state, (void)n_tokens;
    return Unimplemented("Truncate: " + device() + " states cannot roll back yet");
  }
  // The state as a self-describing blob (pages from first_page on, the boundary, `tokens` =
  // the ids it consumed), and back; Import refuses a blob of another model, numerics or layout,
  // or of other tokens, and builds nothing then.
  virtual Result<std::vector<uint8_t>> Export(const RunnerState& state,
                                              std::span<const int32_t> tokens,
                                              int64_t first_page) {
    (void)state, (void)tokens, (void)first_page;
    return Unimplemented("Export: " + device() + " states cannot be serialized yet");
  }
  virtual Result<std::unique_ptr<RunnerState>> Import(std::span<const uint8_t> blob,
                                                      std::span<const int32_t> tokens,
                                                      const RunnerState* base) {
    (void)blob, (void)tokens, (void)base;
    return Unimplemented("Import: " + device() + " states cannot be deserialized yet");
  }

  // ---- speculative decoding with the checkpoint's MTP block -----------------------------------
  // Ok when this runner can draft n_draft tokens per step with MTP block 0 and roll them back
  // (the engine refuses to start with speculation otherwise).
  virtual Status CheckSpeculation(int n_draft) const {
    (void)n_draft;
    return Unimplemented("speculative decoding: the " + device() +
                         " runner has no MTP drafting or rollback yet");
  }
  // Positions of the state's MTP stream (MTP position p reads the backbone's final streams at p
  // and the token at p + 1, and predicts the token at p + 2).
  virtual int64_t MtpTokens(const RunnerState& state) const {
    (void)state;
    return 0;
  }
  // Runs MTP positions [MtpTokens, + next.size()): hidden [n, hc, hidden] the backbone's final
  // streams there (or the MTP block's own, chaining drafts), next [n] the tokens one later.
  // logits (when not null) receives the last row's [vocab], last_hidden the block's final
  // streams of the last row [hc, hidden].
  virtual Status ForwardMtp(RunnerState& state, std::span<const float> hidden,
                            std::span<const int32_t> next, std::vector<float>* logits,
                            std::vector<float>* last_hidden) {
    (void)state, (void)hidden, (void)next, (void)logits, (void)last_hidden;
    return Unimplemented("ForwardMtp: " + device() + " runner");
  }
  // ForwardMtp for several sequences at once (speculative drafting across a batch: one pass
  // over the MTP block's weights instead of one per sequence), with the results each would get
  // alone. The default runs them one by one.
  virtual Status ForwardMtpBatch(std::span<const MtpRun> runs) {
    for (const MtpRun& r : runs)
      DSINFER_RETURN_IF_ERROR(ForwardMtp(*r.state, r.hidden, r.next, r.logits, r.last_hidden));
    return Status::Ok();
  }
  // The MTP stream back to n positions (the backbone is untouched).
  virtual Status TruncateMtp(RunnerState& state, int64_t n) {
    (void)state, (void)n;
    return Unimplemented("TruncateMtp: " + device() + " runner");
  }

  // ---- speculative decoding with V4.1's dSpark stages (spec §14.6) ----------------------------
  // The checkpoint has dSpark stages this runner drafts with (then CheckSpeculation is about
  // them, MtpTokens counts the positions in the stages' rings, and ForwardOutput::hidden rows
  // are HiddenWidth() floats: the mean streams entering each target layer).
  virtual Status CheckDspark() const {
    return Unimplemented("dSpark drafting: the " + device() + " runner");
  }
  // Floats per row of ForwardOutput::hidden (0: this runner returns none).
  virtual int64_t HiddenWidth() const { return 0; }
  // Feeds each run's positions into every stage's ring (advancing MtpTokens).
  virtual Status DsparkSeed(std::span<const DsparkSeedRun> runs) {
    (void)runs;
    return Unimplemented("DsparkSeed: " + device() + " runner");
  }
  // The draft block of each run, in one pass over the stages' weights.
  virtual Status DsparkDraft(std::span<const DsparkDraftRun> runs) {
    (void)runs;
    return Unimplemented("DsparkDraft: " + device() + " runner");
  }
  // The Markov bias [R, vocab] and confidence logits [R] of R draft rows: prev [R] the token
  // before each row's prediction, x [R, hidden] the row's collapsed streams.
  virtual Status DsparkMarkov(std::span<const int32_t> prev, std::span<const float> x,
                              std::vector<float>* bias, std::vector<float>* confidence) {
    (void)prev, (void)x, (void)bias, (void)confidence;
    return Unimplemented("DsparkMarkov: " + device() + " runner");
  }

  // ---- the draft vocabulary (model/draft_vocabulary.h) ----------------------------------------
  // From now on the drafters (MTP, dSpark) propose only from `ids` (ascending, distinct, in the
  // vocabulary: model::ParseDraftVocabulary's output): their vocabulary projections read those
  // rows only. The target's logits are unchanged, so outputs are too; acceptance may drop.
  virtual Status UseDraftVocabulary(std::vector<int32_t> ids) {
    (void)ids;
    return Unimplemented("a draft vocabulary: the " + device() + " runner does not draft");
  }

  // fn(0) .. fn(n - 1), on the runner's host threads where it has them, idle between steps (the
  // engine's per-sequence sampling); fn must be safe to run concurrently for different indices.
  // Without host threads of its own, one after another on the caller's.
  virtual void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
};

struct CpuRunnerOptions {
  int n_threads = 0;  // 0: every CPU the process may use; ignored when cpus is set
  // CpuPlacement::cpus: thread i pinned to cpus[i] (--numa); empty: no thread pinned.
  std::vector<int> cpus;
  model::StateLayoutOptions layout;
};

// The CPU backend: a CpuModel over its own thread pool.
Result<std::unique_ptr<ModelRunner>> MakeCpuRunner(const model::ModelWeights& weights,
                                                   Numerics numerics,
                                                   const CpuRunnerOptions& options = {});

// 25 % of physical RAM (4 GiB when the system does not say): the CPU's default KV budget.
int64_t DefaultCpuStateBudget();

}  // namespace dsinfer::backend
