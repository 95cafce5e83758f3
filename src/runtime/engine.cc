// Engine loop: one owner thread for all inference state. Each step it (1) takes new requests,
// (2) drops cancelled ones, (3) asks the scheduler (runtime/scheduler.h) for a plan, during
// which the scheduler starts admitted states (restored from the prefix cache when it can) and
// releases preempted ones through Impl::Kv, (4) runs the plan's chunks in one batched forward
// and caches prompt checkpoints, (5) draws and streams tokens (engine_output.cc), and
// (6) reports each sequence's outcome to the scheduler.
#include "runtime/engine.h"

#include <algorithm>
#include <random>

#include "runtime/engine_impl.h"

namespace dsinfer::runtime {

using engine_detail::Clock;
using engine_detail::Request;

namespace {

SchedulerOptions SchedulerFor(const EngineOptions& o) {
  return {.max_num_seqs = o.max_num_seqs,
          .max_num_batched_tokens = o.max_num_batched_tokens,
          .checkpoint_tokens = o.enable_prefix_cache ? o.prefix_block_tokens : 0};
}

// Submit's checks of a request against the model and the options (the budget is the scheduler's).
Status ValidateRequest(const RequestParams& p, const model::ModelConfig& c, int64_t max_model_len) {
  if (p.prompt.empty()) return InvalidArgument("prompt must contain at least one token");
  for (int32_t t : p.prompt)
    if (t < 0 || t >= c.vocab_size)
      return InvalidArgument("prompt token " + std::to_string(t) + " is outside the vocabulary");
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= c.vocab_size) return InvalidArgument("stop token id outside the vocabulary");
  if (p.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return InvalidArgument("min_tokens must be in [0, max_tokens]");
  if (p.n < 1 || p.n > 16) return InvalidArgument("n must be in [1, 16]");
  if (p.top_logprobs > 20) return InvalidArgument("top_logprobs must be <= 20");
  if (p.prompt_logprobs > 20) return InvalidArgument("prompt_logprobs must be <= 20");
  const auto& sp = p.sampling;
  if (!(sp.temperature >= 0) || !(sp.top_p > 0 && sp.top_p <= 1) || sp.top_k < 0 ||
      !(sp.min_p >= 0 && sp.min_p <= 1))
    return InvalidArgument("invalid sampling parameters");
  if (!(p.repetition_penalty > 0)) return InvalidArgument("repetition_penalty must be > 0");
  if (max_model_len > 0 && static_cast<int64_t>(p.prompt.size()) >= max_model_len)
    return InvalidArgument("prompt of " + std::to_string(p.prompt.size()) +
                           " tokens exceeds max_model_len " + std::to_string(max_model_len));
  return Status::Ok();
}

}  // namespace

int64_t DefaultKvCacheBytes() { return backend::DefaultCpuStateBudget(); }

Engine::Impl::Impl(const model::ModelWeights& w, EngineOptions o)
    : weights(w), options(o), scheduler(SchedulerFor(o), &kv) {
  spec_stats.num_accepted_tokens_per_pos.assign(static_cast<size_t>(o.speculative_tokens), 0);
}

int64_t Engine::Impl::UsedBytes() const {
  int64_t b = prefix_cache.bytes() + model->PageBytesInUse();
  for (const auto& [id, s] : seqs)
    if (s->state) b += model->StateBytes(*s->state);
  return b;
}

void Engine::Impl::AnswerFlushes() {
  if (flush_waiters.empty()) return;
  Status answer = Status::Ok();
  if (scheduler.empty()) {
    prefix_cache.Clear();
  } else {
    answer = FailedPrecondition(std::to_string(scheduler.num_running() + scheduler.num_waiting()) +
                                " requests are queued or running; the prefix cache is flushed only "
                                "when the engine is idle");
  }
  for (auto& waiter : flush_waiters) waiter.set_value(answer);
  flush_waiters.clear();
}

void Engine::Impl::PublishStats() {
  std::lock_guard<std::mutex> lock(mu);
  stats.n_running = scheduler.num_running();
  stats.n_tokens_running = 0;
  for (const auto& [id, s] : seqs)
    if (s->state) stats.n_tokens_running += static_cast<int64_t>(s->tokens.size());
  engine_waiting = scheduler.num_waiting();
  stats.n_waiting = engine_waiting + static_cast<int>(incoming.size());
  stats.kv_bytes_used = UsedBytes();
  stats.kv_bytes_budget = options.kv_cache_bytes;
  stats.kv_usage = options.kv_cache_bytes > 0
                       ? static_cast<double>(stats.kv_bytes_used) / options.kv_cache_bytes
                       : 0;
  const KvManager::Stats pages = kv_pages->stats();
  stats.kv_pages_in_use = pages.pages_in_use;
  stats.kv_page_bytes = pages.bytes_in_use;
  stats.kv_page_peak_bytes = pages.peak_bytes;
  stats.prefix_cache_entries = static_cast<int64_t>(prefix_cache.size());
  stats.prefix_cache_queries = cache_queries;
  stats.prefix_cache_hits = cache_hits;
  stats.kv_store_enabled = kv_store != nullptr;
  if (kv_store != nullptr) stats.kv_store = kv_store->stats();
  stats.prompt_tokens_total = prompt_tokens;
  stats.generation_tokens_total = generation_tokens;
  stats.preemptions_total = scheduler.preemptions();
  stats.finished_by_reason = finished_by_reason;
  stats.steps_total = steps;
  stats.spec_decode = spec_stats;
}

void Engine::Impl::NoteStart(Sequence& s, int64_t start) {
  const bool first_time = s.generated.empty() && !s.req->scheduled;
  if (first_time && options.enable_prefix_cache) cache_queries += s.n_prompt;
  if (first_time && start > 0) {
    cache_hits += start;
    s.req->usage.cached_prompt_tokens = start;
  }
  if (!s.req->scheduled) {
    s.req->scheduled = true;
    s.req->scheduled_at = Clock::now();
  }
}

Result<int64_t> Engine::Impl::Start(SeqId id, int64_t max_reuse) {
  Sequence& s = *seqs.at(id);
  // A decode worker's request starts from the state the prefill worker sent (on a restart after
  // preemption too); only when positions before the prompt's end must be computed (never: the
  // prompt logprobs are refused with a remote prefill) does it compute them itself.
  if (s.req->params.imported_state != nullptr && max_reuse >= s.n_prompt - 1) {
    s.drafts.clear();
    s.draft_dists.clear();
    DSINFER_ASSIGN_OR_RETURN(s.state, ImportPromptState(s));
    if (!s.req->scheduled) {
      s.req->scheduled = true;
      s.req->scheduled_at = Clock::now();
      s.req->usage.cached_prompt_tokens = s.n_prompt - 1;  // not computed here
    }
    return s.n_prompt - 1;
  }
  const PrefixCache::Entry* hit =
      options.enable_prefix_cache ? prefix_cache.Lookup(s.tokens, max_reuse) : nullptr;
  s.drafts.clear();  // proposed for a state that is gone (preemption)
  s.draft_dists.clear();
  if (kv_store != nullptr) {
    const int64_t hot = hit != nullptr ? static_cast<int64_t>(hit->tokens.size()) : 0;
    if (auto restored = RestoreFromStore(s, hot, max_reuse)) {
      s.state = std::move(restored);
      Snapshot(s);  // into the hot tier, so the next request of this prefix shares its pages
      const int64_t start = s.state->n_tokens();
      NoteStart(s, start);
      return start;
    }
  }
  DSINFER_ASSIGN_OR_RETURN(s.state, hit != nullptr ? model->Copy(*hit->state) : model->NewState());
  const int64_t start = hit != nullptr ? static_cast<int64_t>(hit->tokens.size()) : 0;
  NoteStart(s, start);
  return start;
}

Status Engine::Impl::Forward(std::vector<ChunkRun>& batch) {
  std::vector<backend::RunnerChunk> chunks(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i].seq;
    const ScheduledChunk& c = *batch[i].plan;
    // The plan starts where the state is.
    DSINFER_CHECK(s.state != nullptr && s.state->n_tokens() == c.start);
    ChunkRun& r = batch[i];
    // Drafts follow the context tokens (the plan's n_draft are room reserved; the sequence
    // may have proposed fewer, e.g. near max_tokens).
    r.n_draft = std::min(c.n_draft, static_cast<int>(s.drafts.size()));
    // A prefill worker's request: the state the decode worker continues from is the one before
    // the last prompt token (the prefix cache's split ends a chunk there).
    if (s.req->params.export_prompt_state && !s.req->exported && c.start == s.n_prompt - 1)
      ExportPromptState(s);
    chunks[i].tokens = std::span<const int32_t>(s.tokens).subspan(c.start, c.n_tokens);
    if (r.n_draft > 0) {
      r.input.assign(chunks[i].tokens.begin(), chunks[i].tokens.end());
      r.input.insert(r.input.end(), s.drafts.begin(), s.drafts.begin() + r.n_draft);
      chunks[i].tokens = r.input;
    }
    chunks[i].state = s.state.get();
    chunks[i].options = r.Options(speculative());
    chunks[i].out = &batch[i].out;
    if (c.start < s.n_prompt) prompt_tokens += std::min(c.n_tokens, s.n_prompt - c.start);
  }
  ++steps;
  return model->ForwardBatch(chunks);
}

void Engine::Impl::Snapshot(const Sequence& s) {
  if (kv_store != nullptr) Persist(s);
  std::span<const int32_t> prefix(s.tokens.data(), s.state->n_tokens());
  if (prefix_cache.Contains(prefix)) return;
  // Snapshots live under the same budget (their own bytes; pages they share with the sequence
  // are counted once, already): make room by LRU eviction, or skip caching.
  auto snap = model->Snapshot(*s.state);
  if (!snap.ok()) return;  // no room on the device for a snapshot: skip caching this one
  const int64_t snap_bytes = model->StateBytes(**snap);
  const int64_t live = UsedBytes() - prefix_cache.bytes();
  prefix_cache.EvictTo(std::max<int64_t>(0, options.kv_cache_bytes - live - snap_bytes));
  if (UsedBytes() + snap_bytes <= options.kv_cache_bytes)
    prefix_cache.Insert(prefix, std::shared_ptr<const RunnerState>(std::move(snap).value()),
                        snap_bytes);
}

void Engine::Impl::RunBatch(std::vector<ChunkRun>& batch, StepResult& result) {
  std::future<void> masks = StartMaskFill(batch);
  const Status st = Forward(batch);
  if (masks.valid()) masks.wait();
  if (!st.ok()) {
    for (ChunkRun& r : batch) Finish(*r.seq, FinishReason::kError, st);
  } else {
    // Chunks that do not sample know every next token: the MTP block catches up now, so that a
    // prefix-cache snapshot holds it too.
    if (speculative()) {
      std::vector<DraftJob> catch_up;
      for (ChunkRun& r : batch)
        if (!r.plan->samples) catch_up.push_back({r.seq, &r});
      AdvanceDrafts(catch_up);
    }
    for (ChunkRun& r : batch)
      if (r.plan->snapshot_after && r.seq->state != nullptr) Snapshot(*r.seq);
    DrawAndEmit(batch);
  }
  for (ChunkRun& r : batch) result.sequences.push_back(Outcome(*r.seq));
  for (const auto& [child, parent] : forks) {
    const Sequence& c = *seqs.at(child);
    if (c.finished) continue;  // its one token was its last: nothing to schedule
    SequenceOutcome o = Outcome(c);
    o.forked_from = parent;
    result.sequences.push_back(o);
  }
  forks.clear();
}

void Engine::Impl::DropCancelled() {
  bool force_cancel = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    force_cancel = draining && Clock::now() >= drain_deadline;
  }
  for (auto it = seqs.begin(); it != seqs.end();) {
    if (force_cancel || it->second->req->stream->cancelled()) {
      Finish(*it->second, FinishReason::kCancelled);
      scheduler.Remove(it->first);
      it = seqs.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::Impl::Step() {
  DropCancelled();
  if (scheduler.empty()) return;
  const StepPlan plan = scheduler.Schedule();
  for (const FailedStart& f : plan.failed) Finish(*seqs.at(f.id), FinishReason::kError, f.error);
  std::vector<ChunkRun> batch;
  for (const ScheduledChunk& c : plan.chunks)
    batch.push_back({.seq = seqs.at(c.id).get(), .plan = &c});
  StepResult result;
  if (!batch.empty()) RunBatch(batch, result);
  const Status st = scheduler.Update(result);
  DSINFER_CHECK_MSG(st.ok(), st.ToString());
  std::erase_if(seqs, [](const auto& entry) { return entry.second->finished; });
}

void Engine::Impl::TakeIncoming() {
  while (!incoming.empty()) {
    auto req = std::move(incoming.front());
    incoming.pop_front();
    auto s = std::make_unique<Sequence>();
    s->id = next_id++;
    s->req = req;
    s->tokens = req->params.prompt;
    s->n_prompt = static_cast<int64_t>(req->params.prompt.size());
    TakeMatcher(*s, 0);
    req->n_live = req->params.n;
    req->usage.prompt_tokens = s->n_prompt;
    const Status added = scheduler.Add({.id = s->id,
                                        .n_prompt = s->n_prompt,
                                        .max_context = s->n_prompt + req->params.max_tokens,
                                        .prompt_logits = req->params.prompt_logprobs >= 0,
                                        .n_draft = options.speculative_tokens});
    if (!added.ok()) {  // Submit checked the same: only a bug gets here, and it loses nothing
      Finish(*s, FinishReason::kError, added);
      continue;
    }
    seqs.emplace(s->id, std::move(s));
  }
  // Submit's queue bound counts these now; waiting for the step's PublishStats would let a
  // burst past max_queue while the step runs.
  engine_waiting = scheduler.num_waiting();
}

void Engine::Impl::Loop() {
  {
    // Warm-up: one token through every layer so the first request pays no first-touch costs.
    auto state = model->NewState();
    if (state.ok()) {
      backend::ForwardOutput out;
      const int32_t bos[1] = {weights.config().bos_token_id};
      backend::RunnerChunk chunk{state->get(), bos, {}, &out};
      (void)model->ForwardBatch(std::span<backend::RunnerChunk>(&chunk, 1));
    }
    is_ready = true;
  }
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu);
      if (scheduler.empty())
        cv.wait(lock, [&] { return stopping || !incoming.empty() || !flush_waiters.empty(); });
      if (stopping) break;
      TakeIncoming();
      AnswerFlushes();
    }
    Step();
    PublishStats();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& waiter : flush_waiters) waiter.set_value(FailedPrecondition("engine is stopping"));
    flush_waiters.clear();
  }
  for (auto& [id, s] : seqs) Finish(*s, FinishReason::kCancelled);
  seqs.clear();
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& req : impl_->incoming) {
    StreamEvent ev;
    ev.finished = true;
    ev.finish_reason = FinishReason::kCancelled;
    req->stream->Push(std::move(ev));
  }
}

Result<std::unique_ptr<Engine>> Engine::Create(const model::ModelWeights& weights,
                                               EngineOptions options,
                                               std::unique_ptr<backend::ModelRunner> runner) {
  if (options.max_num_seqs < 1 || options.max_num_batched_tokens < 1 || options.max_queue < 1 ||
      options.prefix_block_tokens < 1)
    return InvalidArgument(
        "engine options: max_num_seqs, max_num_batched_tokens, max_queue must be >= 1");
  if (options.speculative_tokens < 0 || options.speculative_tokens > kMaxSpeculativeTokens)
    return InvalidArgument("engine options: speculative_tokens must be in [0, " +
                           std::to_string(kMaxSpeculativeTokens) + "]");
  if (runner == nullptr) {
    backend::CpuRunnerOptions cpu;
    cpu.n_threads = options.n_threads;
    DSINFER_ASSIGN_OR_RETURN(runner, backend::MakeCpuRunner(weights, options.numerics, cpu));
  }
  if (!(options.draft_min_confidence >= 0 && options.draft_min_confidence <= 1))
    return InvalidArgument("engine options: draft_min_confidence must be in [0, 1]");
  if (options.speculative_tokens > 0)
    DSINFER_RETURN_IF_ERROR(runner->CheckSpeculation(options.speculative_tokens));
  if (!options.draft_vocabulary.empty()) {
    if (options.speculative_tokens == 0)
      return InvalidArgument("engine options: a draft vocabulary needs speculative_tokens > 0");
    DSINFER_RETURN_IF_ERROR(runner->UseDraftVocabulary(options.draft_vocabulary));
  }
  if (options.kv_cache_bytes <= 0) options.kv_cache_bytes = runner->DefaultStateBudget();
  auto impl = std::make_unique<Impl>(weights, options);
  // V4.1 drafts with its dSpark stages; V4 with its MTP block.
  impl->dspark = options.speculative_tokens > 0 && runner->CheckDspark().ok();
  if (options.kv_store) {
    DSINFER_ASSIGN_OR_RETURN(impl->kv_store, OpenKvStore(weights, options, *runner));
  }
  impl->prefix_cache.set_observer(impl->options.prefix_cache_observer.get());
  // Paged runners take their pages from the engine's KV manager, under the same budget.
  impl->kv_pages = KvManager::Create(options.kv_cache_bytes);
  DSINFER_RETURN_IF_ERROR(runner->UsePageAllocator(impl->kv_pages));
  impl->model = std::move(runner);
  impl->device = impl->model->device();
  int64_t one = impl->model->StateBytesAt(1);
  if (one > options.kv_cache_bytes)
    return ResourceExhausted("KV budget of " + std::to_string(options.kv_cache_bytes) +
                             " bytes cannot hold even one sequence (" + std::to_string(one) +
                             " bytes)");
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(impl)));
  Impl* p = engine->impl_.get();
  p->thread = std::thread([p] { p->Loop(); });
  return engine;
}

Result<std::shared_ptr<RequestStream>> Engine::Submit(RequestParams params) {
  DSINFER_RETURN_IF_ERROR(
      ValidateRequest(params, impl_->weights.config(), impl_->options.max_model_len));
  // The scheduler's check: the context and the draft positions a verify step writes past it.
  const int64_t total = static_cast<int64_t>(params.prompt.size()) + params.max_tokens +
                        impl_->options.speculative_tokens;
  DSINFER_RETURN_IF_ERROR(CheckFitsBudget(impl_->kv, total));
  if (params.export_prompt_state || params.imported_state != nullptr) {
    if (params.prompt.size() < 2)
      return InvalidArgument(
          "prefill/decode disaggregation needs a prompt of at least 2 tokens (the state before "
          "the last one travels)");
    if (params.export_prompt_state && !impl_->options.enable_prefix_cache)
      return InvalidArgument(
          "a prefill worker needs the prefix cache (its checkpoint split ends the chunk where "
          "the state is exported)");
    if (params.imported_state != nullptr && params.prompt_logprobs >= 0)
      return InvalidArgument(
          "prompt_logprobs cannot be computed for a prompt prefilled on another worker");
  }
  auto req = std::make_shared<Request>();
  if (params.grammar != nullptr) {
    // The samples' matchers are made here, on the caller's thread: the engine thread only steps.
    if (params.grammar_after_token >= impl_->weights.config().vocab_size)
      return InvalidArgument("grammar_after_token is outside the vocabulary");
    for (int i = 0; i < params.n; ++i) {
      DSINFER_ASSIGN_OR_RETURN(auto matcher, grammar::Matcher::Create(params.grammar));
      if (matcher->vocab_size() != impl_->weights.config().vocab_size)
        return InvalidArgument("the grammar was compiled for " +
                               std::to_string(matcher->vocab_size()) + " tokens, the model has " +
                               std::to_string(impl_->weights.config().vocab_size));
      req->matchers.push_back(std::move(matcher));
    }
    // A grammar no output can satisfy (a schema that only refers to itself, say) is refused
    // here rather than failing at its first draw. bitmask: [BitmaskWords(vocab)] u32.
    std::vector<uint32_t> bitmask(grammar::BitmaskWords(impl_->weights.config().vocab_size));
    DSINFER_RETURN_IF_ERROR(req->matchers[0]->FillNextTokenBitmask(bitmask));
    if (std::all_of(bitmask.begin(), bitmask.end(), [](uint32_t w) { return w == 0; }))
      return InvalidArgument("the grammar matches no output");
  }
  if (params.request_id.empty()) {
    static_assert(sizeof(uintptr_t) <= 8);
    params.request_id = "req-" + std::to_string(reinterpret_cast<uintptr_t>(req.get()));
  }
  req->seed = params.sampling.has_seed ? params.sampling.seed : std::random_device{}();
  req->stream = std::make_shared<RequestStream>(params.request_id);
  req->params = std::move(params);
  // Disk-tier entries of the prompt's prefix come into the RAM tier here, on the caller's
  // thread, before the engine schedules the request.
  if (impl_->kv_store != nullptr)
    impl_->kv_store->Prefetch(req->params.prompt,
                              static_cast<int64_t>(req->params.prompt.size()) - 1);
  req->queued_at = Clock::now();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping || impl_->draining) return FailedPrecondition("engine is shutting down");
    if (static_cast<int>(impl_->incoming.size()) + impl_->engine_waiting >=
        impl_->options.max_queue)
      return ResourceExhausted("request queue is full");
    impl_->incoming.push_back(req);
  }
  impl_->cv.notify_all();
  return req->stream;
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats s = impl_->stats;
  s.n_waiting = std::max<int>(s.n_waiting, static_cast<int>(impl_->incoming.size()));
  return s;
}

const model::ModelConfig& Engine::config() const { return impl_->weights.config(); }

bool Engine::ready() const { return impl_->is_ready.load(); }

Status Engine::FlushPrefixCache() {
  std::future<Status> answer;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping || impl_->draining) return FailedPrecondition("engine is shutting down");
    impl_->flush_waiters.emplace_back();
    answer = impl_->flush_waiters.back().get_future();
  }
  impl_->cv.notify_all();
  return answer.get();
}

const std::string& Engine::device() const { return impl_->device; }

int64_t Engine::kv_cache_bytes() const { return impl_->options.kv_cache_bytes; }

void Engine::Shutdown(std::chrono::steady_clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->draining = true;
    impl_->drain_deadline = deadline;
  }
  impl_->cv.notify_all();
  while (true) {
    EngineStats s = Stats();
    if (s.n_running == 0 && s.n_waiting == 0) break;
    if (std::chrono::steady_clock::now() > deadline + std::chrono::seconds(5)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace dsinfer::runtime
