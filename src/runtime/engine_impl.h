// The engine's private parts (runtime/engine.h's Engine::Impl), shared by engine.cc (the loop,
// the KvBudget it gives the scheduler, the batched forward, prefix-cache snapshots, the public
// API) and engine_output.cc (what a step gives each sequence: token draws, prompt logprobs,
// events). Engine-thread state unless marked otherwise. Not part of the runtime's interface.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/model_runner.h"
#include "runtime/engine.h"
#include "runtime/kv_manager.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"
#include "runtime/speculative.h"

namespace dsinfer::runtime::engine_detail {

using Clock = std::chrono::steady_clock;
using backend::RunnerState;

struct Request {
  RequestParams params;
  std::shared_ptr<RequestStream> stream;
  Clock::time_point queued_at, scheduled_at;
  bool scheduled = false;
  bool any_event = false;  // the first event carries the prompt logprobs
  int n_live = 0;          // samples not finished
  Usage usage;
  uint64_t seed = 0;
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1 .. as far as computed
  // RequestParams::export_prompt_state: made once, delivered with the first event.
  bool exported = false;
  std::shared_ptr<const std::vector<uint8_t>> exported_state;
  Status export_status;
  // RequestParams::grammar's matchers, one per sample (made by Submit), taken by the samples'
  // sequences as they are created.
  std::vector<std::unique_ptr<grammar::Matcher>> matchers;
};

// One sample of a request (n > 1 forks after the prompt).
struct Sequence {
  SeqId id = 0;
  std::shared_ptr<Request> req;
  int index = 0;
  std::unique_ptr<RunnerState> state;  // null while waiting / after preemption
  std::vector<int32_t> tokens;         // prompt + generated: what the state must consume
  std::vector<int32_t> generated;
  int64_t n_prompt = 0;
  bool forked = false;    // n > 1 copies already made
  bool finished = false;  // its final event is out
  // Speculative decoding: tokens the MTP block proposes after the last context token, and the
  // distribution each was drawn from (the sampler's transform of the MTP logits).
  std::vector<int32_t> drafts;
  std::vector<TokenDistribution> draft_dists;
  // Structured output: the sample's grammar position (null: unconstrained), and whether the
  // grammar applies yet (RequestParams::grammar_after_token seen, or none to wait for).
  std::unique_ptr<grammar::Matcher> matcher;
  bool grammar_active = false;
  bool constrained() const { return matcher != nullptr && grammar_active; }
};

// A constrained sequence's grammar mask for this step's draw, filled while the forward ran.
struct GrammarMask {
  bool filled = false;
  Status status;               // of the fill (non-ok: the draw fails with it)
  std::vector<uint32_t> bits;  // [BitmaskWords(vocab)] u32: the tokens the grammar allows next
};

// The token a sequence draws from a step's logits, and its logprobs when asked for.
struct Draw {
  Status error;  // non-ok: no token (the grammar's mask failed); the sequence fails with it
  int32_t token = 0;
  bool has_logprob = false;
  TokenLogprob logprob;
};

// One sequence's part of a step as it runs: its plan, what the forward returned, what was drawn.
struct ChunkRun {
  Sequence* seq = nullptr;
  const ScheduledChunk* plan = nullptr;
  bool all_rows = false;  // out.logits holds every row of the chunk, else only the last
  // Draft tokens run after the context tokens: the plan's n_draft, or fewer when the sequence
  // has fewer proposed; input holds the chunk's tokens when there are drafts.
  int n_draft = 0;
  std::vector<int32_t> input;
  backend::ForwardOutput out;
  std::vector<TokenLogprob> prompt_logprobs;  // one per prompt row of the plan
  // The sampling row's draw (unless the sequence forks), then one per accepted draft and the
  // token after them; n_accepted of the n_draft drafts were accepted.
  std::vector<Draw> draws;
  int n_accepted = 0;
  GrammarMask mask;  // the sampling row's, when the sequence is constrained (StartMaskFill)

  // The runner returns no rows, the last one, or all of them (the plan's rows are then picked
  // out): whichever is least that covers the plan's logit rows. The final streams of every row
  // come back too with speculation on (the MTP block's input).
  backend::ForwardOptions Options(bool want_hidden) {
    const auto& rows = plan->logit_rows;
    const int32_t last = static_cast<int32_t>(plan->n_tokens + n_draft - 1);
    all_rows = !rows.empty() && !(rows.size() == 1 && rows[0] == last);
    return {.all_logits = all_rows, .want_hidden = want_hidden, .want_logits = !rows.empty()};
  }
  // Logits of chunk row `row` (one of the plan's logit rows): [vocab] f32.
  std::span<const float> Row(int32_t row, int64_t vocab) const {
    const int64_t at = all_rows ? row : 0;
    return std::span<const float>(out.logits).subspan(at * vocab, vocab);
  }
};

}  // namespace dsinfer::runtime::engine_detail

namespace dsinfer::runtime {
// The store EngineOptions::kv_store asks for, keyed to this model, numerics and runner layout
// (engine_kv_tier.cc).
Result<std::unique_ptr<KvStore>> OpenKvStore(const model::ModelWeights& weights,
                                             const EngineOptions& options,
                                             const backend::ModelRunner& runner);
}  // namespace dsinfer::runtime

namespace dsinfer::runtime {

struct Engine::Impl {
  using Request = engine_detail::Request;
  using Sequence = engine_detail::Sequence;
  using ChunkRun = engine_detail::ChunkRun;
  using Draw = engine_detail::Draw;
  using GrammarMask = engine_detail::GrammarMask;
  using Clock = engine_detail::Clock;
  using RunnerState = backend::RunnerState;

  // The KV budget as the scheduler sees it: the runner's states and pages, the prefix cache.
  struct Kv final : KvBudget {
    Impl& e;
    explicit Kv(Impl& engine) : e(engine) {}
    int64_t capacity() const override { return e.options.kv_cache_bytes; }
    int64_t BytesAt(int64_t n_tokens) const override { return e.model->StateBytesAt(n_tokens); }
    int64_t UsedBytes() const override { return e.UsedBytes(); }
    int64_t CacheBytes() const override { return e.prefix_cache.bytes(); }
    void EvictCacheTo(int64_t bytes) override { e.prefix_cache.EvictTo(bytes); }
    Result<int64_t> Start(SeqId id, int64_t max_reuse) override { return e.Start(id, max_reuse); }
    void Release(SeqId id) override { e.seqs.at(id)->state.reset(); }
  };

  const model::ModelWeights& weights;
  EngineOptions options;
  // The pages of paged runners' states (declared before the model and the cache, so it outlives
  // every page they hold; each page also keeps it alive).
  std::shared_ptr<KvManager> kv_pages;
  std::unique_ptr<backend::ModelRunner> model;
  std::string device;
  PrefixCache prefix_cache;
  // The RAM / disk tiers behind the prefix cache (null: none). Its IO runs on its own thread.
  std::unique_ptr<KvStore> kv_store;

  std::mutex mu;  // guards incoming, stopping, draining, stats
  std::condition_variable cv;
  std::deque<std::shared_ptr<Request>> incoming;
  bool stopping = false;
  bool draining = false;
  Clock::time_point drain_deadline;
  EngineStats stats;
  std::vector<std::promise<Status>> flush_waiters;  // FlushPrefixCache calls to answer
  int engine_waiting = 0;  // waiting sequences on the engine side, as of the last step
  std::atomic<bool> is_ready{false};
  std::thread thread;

  // Engine-thread state.
  std::map<SeqId, std::unique_ptr<Sequence>> seqs;  // waiting and running, by id
  SeqId next_id = 0;
  Kv kv{*this};
  Scheduler scheduler;
  std::vector<std::pair<SeqId, SeqId>> forks;  // (child, parent), this step
  int64_t steps = 0, prompt_tokens = 0, generation_tokens = 0;
  int64_t cache_queries = 0, cache_hits = 0;
  SpecDecodeStats spec_stats;
  std::map<std::string, int64_t> finished_by_reason;

  Impl(const model::ModelWeights& w, EngineOptions o);

  // Every state's own bytes (sequences and cache entries) plus every page once.
  int64_t UsedBytes() const;

  void Loop();
  void TakeIncoming();  // under mu
  void DropCancelled();
  void Step();
  // KvBudget::Start: id's state, restored from the prefix cache when it holds a prefix.
  Result<int64_t> Start(SeqId id, int64_t max_reuse);
  void NoteStart(Sequence& s, int64_t start);
  void RunBatch(std::vector<ChunkRun>& batch, StepResult& result);
  Status Forward(std::vector<ChunkRun>& batch);
  void Snapshot(const Sequence& s);
  // The RAM / disk tiers (engine_kv_tier.cc): s's state restored from the longest stored prefix
  // longer than min_tokens (nullptr: none); s's state written to them at a page boundary or one
  // token before its prompt's end.
  std::unique_ptr<RunnerState> RestoreFromStore(const Sequence& s, int64_t min_tokens,
                                                int64_t max_tokens);
  void Persist(const Sequence& s);
  // Prefill/decode disaggregation (engine_kv_tier.cc): s's prompt state before its last token,
  // exported for the request's first event; s's state imported from the request's blob.
  void ExportPromptState(Sequence& s);
  Result<std::unique_ptr<RunnerState>> ImportPromptState(const Sequence& s);
  // The step's draws and prompt logprobs (on the runner's idle threads), applied in batch order.
  void DrawAndEmit(std::vector<ChunkRun>& batch);
  // The token s draws from this step's logits, and its logprobs when asked for: a pure function of
  // s and the logits (the seed, the step, the penalties' history), so the draws of one step run
  // in parallel (DrawAndEmit) and give what each gives alone.
  // `mask`: s's grammar mask already filled for this draw (StartMaskFill), or null to fill it
  // here.
  Draw DrawToken(const Sequence& s, std::span<const float> raw,
                 const GrammarMask* mask = nullptr) const;
  // Fills the grammar masks of the batch's constrained draws on another thread, to overlap the
  // forward: a mask depends only on the tokens the matcher already took, which the forward does
  // not change. The matchers are touched by that thread alone until the returned future is
  // waited for (before the draws). No future when no draw is constrained.
  std::future<void> StartMaskFill(std::vector<ChunkRun>& batch) const;
  // s's adjusted logits (penalties, bias, min_tokens bans) as if `generated` had been generated.
  std::vector<float> AdjustedLogits(const Sequence& s, std::span<const float> raw,
                                    std::span<const int32_t> generated) const;
  SamplingParams SamplerOf(const Sequence& s) const;
  // A draw of `token` from the raw logits: the target's logprobs when the request asks.
  Draw DrawOf(const Sequence& s, std::span<const float> raw, int32_t token) const;
  // The logprob of prompt token `position + 1` from the logits at `position` (also pure).
  TokenLogprob PromptLogprob(const Sequence& s, int64_t position, std::span<const float> raw) const;
  // Gives s its sample's grammar matcher (RequestParams::grammar), if the request has one.
  static void TakeMatcher(Sequence& s, int index);
  // A new event of s's stream (the request's first one carries the prompt logprobs).
  StreamEvent NewEvent(Sequence& s);
  // The draw's token into s's stream and state: stop and length checks, usage, finishing.
  void Emit(Sequence& s, Draw draw);
  void Finish(Sequence& s, FinishReason reason, Status error = Status::Ok());
  // Forks an n > 1 request's other samples at its first token, then draws and emits.
  void Sample(Sequence& s, std::span<const float> logits);
  // Whether Sample would fork s (the draws of such a sequence stay on the engine thread).
  static bool Forks(const Sequence& s) {
    return s.req->params.n > 1 && !s.forked && s.index == 0 && s.generated.empty();
  }
  static SequenceOutcome Outcome(const Sequence& s) {
    return {.id = s.id,
            .n_computed = s.state ? s.state->n_tokens() : 0,
            .n_tokens = static_cast<int64_t>(s.tokens.size()),
            .finished = s.finished};
  }
  // ---- speculative decoding (engine_speculative.cc) -------------------------------------------
  bool speculative() const { return options.speculative_tokens > 0; }
  bool dspark = false;  // speculation drafts with V4.1's dSpark stages (else the MTP block)
  // The draws of a sampling chunk that ran drafts: the rejection rule row by row (pure, as
  // DrawToken), the accepted drafts and the token after them; sets r.n_accepted.
  std::vector<Draw> VerifyDrafts(const Sequence& s, ChunkRun& r) const;
  // After a step, for each (s, run = the chunk that computed s's newest positions): rolls back
  // the rejected draft positions, runs the MTP block over the positions it has not seen (their
  // final streams are in run.out.hidden) and, when s waits for its next token, proposes the
  // next drafts. All sequences share each MTP call (one pass over the block's weights per draft
  // position, not one per sequence); each gets what it would alone. A failure finishes the
  // sequences it concerns with the error.
  struct DraftJob {
    Sequence* seq = nullptr;
    const ChunkRun* run = nullptr;
  };
  void AdvanceDrafts(std::span<const DraftJob> jobs);
  // Where a sequence's drafting starts after a step: the rejected positions rolled back, the
  // drafter's stream length m, the backbone's n, and the drafts wanted (0: only catch up).
  // nullopt: nothing to do (finished now or before).
  struct DraftStart {
    int64_t m = 0, n = 0, want = 0;
  };
  std::optional<DraftStart> StartDrafting(const DraftJob& job);
  // AdvanceDrafts with V4.1's dSpark stages (spec §14.6): the new positions go into the stage
  // rings, one draft block per sequence proposes up to block_size tokens, sampled one position
  // at a time with the Markov bias of the token before, while the confidence head is sure enough
  // (EngineOptions::draft_min_confidence).
  void AdvanceDsparkDrafts(std::span<const DraftJob> jobs);
  void CountSpeculation(const ChunkRun& r);
  void PublishStats();
  // Answers the FlushPrefixCache calls waiting (under mu, after incoming was taken).
  void AnswerFlushes();
};

}  // namespace dsinfer::runtime
