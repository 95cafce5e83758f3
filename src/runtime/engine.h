// The serving engine: one owner thread runs all inference state (sequence states, KV budget,
// prefix cache, scheduler). Other threads talk to it only through Submit / Cancel and the
// per-request RequestStream. Submit, Cancel, Stats and Shutdown are thread-safe.
//
// Usage:
//   auto engine = Engine::Create(weights, options);
//   auto stream = engine->Submit(request);          // Result<std::shared_ptr<RequestStream>>
//   while (auto ev = stream->Next()) { ... if (ev->finished) break; }
//   stream->Cancel();                                // frees the request at the next step
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/model_runner.h"
#include "backend/numerics.h"
#include "core/status.h"
#include "grammar/grammar.h"
#include "model/weights.h"
#include "runtime/kv_store.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"

namespace dsinfer::runtime {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason r);  // "stop", "length", "cancelled", "error"

struct RequestParams {
  std::vector<int32_t> prompt;    // token ids, non-empty
  SamplingParams sampling;        // temperature, top_p, top_k, min_p, seed
  double presence_penalty = 0.0;  // OpenAI semantics, over generated tokens
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;  // HF/vLLM semantics, over prompt + generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;
  int max_tokens = 256;
  int min_tokens = 0;                   // EOS / stop ids are masked until this many tokens
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS
  bool ignore_eos = false;
  int n = 1;              // parallel samples sharing the prompt's KV
  int top_logprobs = -1;  // -1: no logprobs; 0..20: logprob of the sampled token + top-k
  // Log-probability of each prompt token given the tokens before it, with this many top
  // alternatives (0..20); -1: none. Delivered with the first event (StreamEvent::prompt_logprobs).
  int prompt_logprobs = -1;
  std::string request_id;  // for logs/metrics; assigned if empty
  // Prefill/decode disaggregation. A prefill worker's request: the state of prompt[0, n - 1) is
  // exported (ModelRunner::Export) just before the last prompt token runs and delivered with the
  // request's first event (StreamEvent::exported_state). Needs the prefix cache (its checkpoint
  // split ends a prompt chunk there), a paged runner and a prompt of at least 2 tokens.
  bool export_prompt_state = false;
  // A decode worker's request: the state of prompt[0, n - 1) another worker exported, imported
  // instead of computing those positions (refused, and the request failed, when it is not a
  // state of those tokens under this model, numerics and layout).
  std::shared_ptr<const std::vector<uint8_t>> imported_state;
  // Structured output (null: none): every generated token must follow this grammar, compiled by
  // the server against this model's vocabulary (grammar::Compiler). Each sample gets its own
  // matcher; the logits are masked before each draw (greedy or sampled); the sample finishes with
  // kStop when the grammar is complete and its stop token (EOS) drawn, or kLength. Logprobs stay
  // those of the raw distribution, as vLLM's default logprobs_mode (raw_logprobs) reports.
  // Constrained samples are not drafted for (speculative decoding is off for them).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // The grammar applies from the token after this one (the reasoning's closing </think>): what
  // comes before is free. -1: from the first generated token.
  int32_t grammar_after_token = -1;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (token, logprob), best first
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t completion_tokens = 0;     // summed over the n samples
};

// One event of a request's stream. Token events carry new tokens of sample `index`; the final
// event of each sample has finished = true and a finish reason; usage is filled on every event.
struct StreamEvent {
  int index = 0;                       // sample index in [0, n)
  std::vector<int32_t> tokens;         // newly generated tokens (usually one)
  std::vector<TokenLogprob> logprobs;  // parallel to tokens when requested
  // With RequestParams::prompt_logprobs, on the request's first event: one entry per prompt token
  // after the first (which has nothing before it to be predicted from); fewer only when the
  // request ended (cancelled, failed) before its first token.
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Usage usage;
  Status error;  // non-ok only with finish_reason kError
  // RequestParams::export_prompt_state, on the request's first event: the blob, or why it could
  // not be made.
  std::shared_ptr<const std::vector<uint8_t>> exported_state;
  Status export_status;
  // Timing for metrics (engine clock): when the request was queued / first scheduled.
  std::chrono::steady_clock::time_point queued_at, scheduled_at;
};

// Thread-safe single-consumer queue of a request's events.
class RequestStream {
 public:
  explicit RequestStream(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }
  // Blocks until an event is available or the timeout passes (nullopt on timeout).
  std::optional<StreamEvent> Next(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
  // Asks the engine to stop this request; resources are freed at its next step.
  void Cancel();
  bool cancelled() const;
  // Engine side.
  void Push(StreamEvent event);
  int n_finished() const;

 private:
  std::string id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  bool cancelled_ = false;
  int n_finished_ = 0;
};

struct EngineOptions {
  backend::Numerics numerics = backend::Numerics::Official();
  int n_threads = 0;  // compute threads (0: every CPU the process may use)
  int max_num_seqs = 64;              // sequences per step
  int max_num_batched_tokens = 2048;  // tokens per step (prefill chunks + decodes)
  int64_t kv_cache_bytes = 0;  // byte budget for sequence state + prefix cache (0: the default)
  int max_queue = 1024;        // waiting requests before Submit returns ResourceExhausted
  int64_t max_model_len = 0;   // 0: unlimited (state grows with context)
  bool enable_prefix_cache = true;
  int prefix_block_tokens = 128;  // prefix-cache checkpoint granularity
  // Speculative decoding with the checkpoint's MTP block: up to this many draft tokens per
  // sequence and decode step, verified by the target in the same batched forward (0: off; at
  // most kMaxSpeculativeTokens). Lossless: greedy output is bit-identical, sampled output has
  // the same distribution (runtime/speculative.h).
  int speculative_tokens = 0;
  // V4.1's dSpark drafts (spec §14.6): a sequence's draft at block row j is proposed only while
  // the confidence head's probability sigmoid(confidence_j) is at least this (0: always up to
  // speculative_tokens). Rows it would likely lose cost verify rows for nothing.
  double draft_min_confidence = 0.5;
  // The token ids drafts are proposed from (model/draft_vocabulary.h; ascending, distinct: as
  // model::ReadDraftVocabulary returns them). Empty: the whole vocabulary. A smaller head read
  // per draft; outputs unchanged, acceptance lower for tokens outside. Needs speculative_tokens.
  std::vector<int32_t> draft_vocabulary;
  // Told what the prefix cache stores and drops (e.g. the KV-event publisher); may be null.
  std::shared_ptr<PrefixCacheObserver> prefix_cache_observer;
  // The persistent tiers behind the prefix cache (runtime/kv_store.h): a host-RAM tier and a
  // disk directory. Unset: the prefix cache is the only tier. Needs a paged runner and the
  // prefix cache.
  std::optional<KvStoreOptions> kv_store;
};

// The KV budget EngineOptions::kv_cache_bytes = 0 stands for on the CPU: 25 % of physical RAM
// (4 GiB when the system does not say). A GPU runner has its own (ModelRunner::
// DefaultStateBudget).
int64_t DefaultKvCacheBytes();

inline constexpr int kMaxSpeculativeTokens = 4;

// Speculative decoding counters, with vLLM's spec_decode semantics: a draft is one sequence's
// proposal verified in a step (of one or more tokens).
struct SpecDecodeStats {
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  // [k]: drafts whose token at position i (0-based) was accepted.
  std::vector<int64_t> num_accepted_tokens_per_pos;
};

struct EngineStats {
  int n_running = 0;
  int n_waiting = 0;
  int64_t n_tokens_running = 0;  // context tokens (prompt + generated) of the running sequences
  double kv_usage = 0.0;         // fraction of kv_cache_bytes in use
  int64_t kv_bytes_used = 0;     // the states' own bytes + every page once
  int64_t kv_bytes_budget = 0;
  int64_t kv_pages_in_use = 0;  // pages of sequence state (paged runners; runtime/kv_manager.h)
  int64_t kv_page_bytes = 0;
  int64_t kv_page_peak_bytes = 0;
  int64_t prefix_cache_entries = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // prompt tokens found (in any tier)
  bool kv_store_enabled = false;     // the RAM / disk tiers (EngineOptions::kv_store)
  KvStoreStats kv_store;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t preemptions_total = 0;
  std::map<std::string, int64_t> finished_by_reason;
  int64_t steps_total = 0;
  SpecDecodeStats spec_decode;  // all zero with speculation off
};

class Engine {
 public:
  // Steps `runner` (the model on its device), or, when null, the CPU backend over
  // options.n_threads threads. The weights must outlive the engine.
  static Result<std::unique_ptr<Engine>> Create(const model::ModelWeights& weights,
                                                EngineOptions options,
                                                std::unique_ptr<backend::ModelRunner> runner = {});
  ~Engine();  // stops the engine thread (aborting running requests)

  // Validates and enqueues a request. Errors: InvalidArgument (empty prompt, token outside the
  // vocabulary, bad parameters), ResourceExhausted (queue full, or the request can never fit in
  // the KV budget), FailedPrecondition (shutting down).
  Result<std::shared_ptr<RequestStream>> Submit(RequestParams params);
  EngineStats Stats() const;
  const model::ModelConfig& config() const;
  // Stops admitting; lets running requests finish until the deadline, then cancels the rest.
  void Shutdown(std::chrono::steady_clock::time_point deadline);
  // True once the engine thread has run a warm-up step.
  bool ready() const;
  // Drops every prefix-cache entry (SGLang's /flush_cache). Refused with FailedPrecondition
  // while any request is queued or running, as SGLang refuses, and while shutting down. Blocks
  // until the engine thread has answered (at most one step).
  Status FlushPrefixCache();
  // The runner's device ("cpu", "cuda:0 (NVIDIA H200)") and the KV budget in force.
  const std::string& device() const;
  int64_t kv_cache_bytes() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::runtime
