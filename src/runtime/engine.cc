// Engine loop: one owner thread for all inference state. Each step it (1) takes new requests,
// (2) drops cancelled ones, (3) builds a token-budgeted batch — decodes first, then prefill
// chunks FCFS — preempting the newest sequences (by recompute) if the KV budget would overflow,
// (4) runs one batched forward, (5) samples and streams tokens.
#include "runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <list>
#include <optional>
#include <random>
#include <thread>

#include "backend/model_runner.h"
#include "runtime/prefix_cache.h"

namespace dsinfer::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using backend::RunnerState;

struct Request {
  RequestParams params;
  std::shared_ptr<RequestStream> stream;
  Clock::time_point queued_at, scheduled_at;
  bool scheduled = false;
  int n_live = 0;  // samples not finished
  Usage usage;
  uint64_t seed = 0;
};

// One sample of a request (n > 1 forks after the prompt).
struct Sequence {
  std::shared_ptr<Request> req;
  int index = 0;
  std::unique_ptr<RunnerState> state;  // null while waiting / after preemption
  std::vector<int32_t> tokens;         // prompt + generated: what the state must consume
  std::vector<int32_t> generated;
  int64_t n_prompt = 0;
  bool forked = false;   // n > 1 copies already made
  uint64_t arrival = 0;  // FCFS order
};

uint64_t SampleSeed(uint64_t seed, int index) {
  return seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index);
}

}  // namespace

int64_t DefaultKvCacheBytes() { return backend::DefaultCpuStateBudget(); }

struct Engine::Impl {
  const model::ModelWeights& weights;
  EngineOptions options;
  std::unique_ptr<backend::ModelRunner> model;
  std::string device;
  PrefixCache prefix_cache;

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
  std::list<std::unique_ptr<Sequence>> waiting;
  std::list<std::unique_ptr<Sequence>> running;
  uint64_t next_arrival = 0;
  int64_t preemptions = 0, steps = 0, prompt_tokens = 0, generation_tokens = 0;
  int64_t cache_queries = 0, cache_hits = 0;
  std::map<std::string, int64_t> finished_by_reason;

  Impl(const model::ModelWeights& w, EngineOptions o) : weights(w), options(o) {}

  // Every state's own bytes (running sequences and cache entries) plus every page once.
  int64_t UsedBytes() const {
    int64_t b = prefix_cache.bytes() + model->PageBytesInUse();
    for (const auto& s : running)
      if (s->state) b += model->StateBytes(*s->state);
    return b;
  }

  void Finish(Sequence& s, FinishReason reason, Status error = Status::Ok()) {
    StreamEvent ev;
    ev.index = s.index;
    ev.finished = true;
    ev.finish_reason = reason;
    ev.error = std::move(error);
    ev.usage = s.req->usage;
    ev.queued_at = s.req->queued_at;
    ev.scheduled_at = s.req->scheduled_at;
    s.req->n_live--;
    ++finished_by_reason[FinishReasonName(reason)];
    s.req->stream->Push(std::move(ev));
    s.state.reset();
  }

  // Tokens of s to run this step: what remains, within the budget, ending at the next
  // prefix-cache boundary while in the prompt (so a snapshot can be taken after the step).
  int64_t ChunkSize(const Sequence& s, int64_t budget) const {
    int64_t pos = s.state->n_tokens();
    int64_t n = std::min(static_cast<int64_t>(s.tokens.size()) - pos, budget);
    if (options.enable_prefix_cache && pos < s.n_prompt - 1) {
      int64_t block = options.prefix_block_tokens;
      n = std::min(n, std::min<int64_t>((pos / block + 1) * block, s.n_prompt - 1) - pos);
    }
    return n;
  }

  void Loop();
  bool Step();
  void Admit(std::vector<Sequence*>& batch, std::vector<int64_t>& counts, int64_t& budget);
  // The token s draws from this step's logits, and its logprobs when asked for: a pure function of
  // s and the logits (the seed, the step, the penalties' history), so the draws of one step run
  // in parallel (Step) and give what each gives alone.
  struct Draw {
    int32_t token = 0;
    bool has_logprob = false;
    TokenLogprob logprob;
  };
  Draw DrawToken(const Sequence& s, std::span<const float> raw) const;
  // The draw's token into s's stream and state: stop and length checks, usage, finishing.
  void Emit(Sequence& s, Draw draw);
  // Forks an n > 1 request's other samples at its first token, then draws and emits.
  void Sample(Sequence& s, std::span<const float> logits);
  // Whether Sample would fork s (the draws of such a sequence stay on the engine thread).
  static bool Forks(const Sequence& s) {
    return s.req->params.n > 1 && !s.forked && s.index == 0 && s.generated.empty();
  }
  void PublishStats();
  // Answers the FlushPrefixCache calls waiting (under mu, after incoming was taken).
  void AnswerFlushes();
};

void Engine::Impl::AnswerFlushes() {
  if (flush_waiters.empty()) return;
  Status answer = Status::Ok();
  if (running.empty() && waiting.empty()) {
    prefix_cache.Clear();
  } else {
    answer = FailedPrecondition(std::to_string(running.size() + waiting.size()) +
                                " requests are queued or running; the prefix cache is flushed "
                                "only when the engine is idle");
  }
  for (auto& waiter : flush_waiters) waiter.set_value(answer);
  flush_waiters.clear();
}

void Engine::Impl::PublishStats() {
  std::lock_guard<std::mutex> lock(mu);
  stats.n_running = static_cast<int>(running.size());
  stats.n_tokens_running = 0;
  for (const auto& s : running) stats.n_tokens_running += static_cast<int64_t>(s->tokens.size());
  engine_waiting = static_cast<int>(waiting.size());
  stats.n_waiting = static_cast<int>(waiting.size() + incoming.size());
  stats.kv_bytes_used = UsedBytes();
  stats.kv_bytes_budget = options.kv_cache_bytes;
  stats.kv_usage = options.kv_cache_bytes > 0
                       ? static_cast<double>(stats.kv_bytes_used) / options.kv_cache_bytes
                       : 0;
  stats.prefix_cache_queries = cache_queries;
  stats.prefix_cache_hits = cache_hits;
  stats.prompt_tokens_total = prompt_tokens;
  stats.generation_tokens_total = generation_tokens;
  stats.preemptions_total = preemptions;
  stats.finished_by_reason = finished_by_reason;
  stats.steps_total = steps;
}

void Engine::Impl::Sample(Sequence& s, std::span<const float> raw) {
  const RequestParams& p = s.req->params;
  // n > 1: the prompt was computed once; fork the other samples from its state now.
  if (Forks(s)) {
    s.forked = true;
    for (int i = 1; i < p.n; ++i) {
      auto copy = std::make_unique<Sequence>();
      copy->req = s.req;
      copy->index = i;
      auto state = model->Copy(*s.state);
      if (!state.ok()) {  // no device memory for this sample's copy: it fails, the others go on
        Finish(*copy, FinishReason::kError, state.status());
        continue;
      }
      copy->state = std::move(state).value();
      copy->tokens = s.tokens;
      copy->n_prompt = s.n_prompt;
      copy->forked = true;
      copy->arrival = s.arrival;
      Sequence& c = *copy;
      running.push_back(std::move(copy));
      Sample(c, raw);
    }
  }
  Emit(s, DrawToken(s, raw));
}

Engine::Impl::Draw Engine::Impl::DrawToken(const Sequence& s, std::span<const float> raw) const {
  const RequestParams& p = s.req->params;
  std::vector<float> logits(raw.begin(), raw.end());
  std::vector<int32_t> banned;
  const int eos = weights.config().eos_token_id;
  if (static_cast<int>(s.generated.size()) < p.min_tokens) {
    banned = p.stop_token_ids;
    if (!p.ignore_eos) banned.push_back(eos);
  }
  LogitsAdjustments adj{p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
                        &p.logit_bias, &banned};
  AdjustLogits(logits, adj, std::span<const int32_t>(s.tokens.data(), s.n_prompt), s.generated);
  SamplingParams sp = p.sampling;
  sp.seed = SampleSeed(s.req->seed, s.index);
  Draw draw;
  draw.token = runtime::Sample(logits, sp, s.generated.size());
  if (p.top_logprobs >= 0) {
    draw.has_logprob = true;
    draw.logprob.token = draw.token;
    double log_normalizer = 0.0;
    draw.logprob.logprob = LogprobOf(raw, draw.token, &log_normalizer);
    draw.logprob.top = TopLogprobs(raw, p.top_logprobs, &log_normalizer);
  }
  return draw;
}

void Engine::Impl::Emit(Sequence& s, Draw draw) {
  const RequestParams& p = s.req->params;
  const int eos = weights.config().eos_token_id;
  const int32_t tok = draw.token;

  StreamEvent ev;
  ev.index = s.index;
  ev.queued_at = s.req->queued_at;
  ev.scheduled_at = s.req->scheduled_at;
  bool is_stop =
      (!p.ignore_eos && tok == eos) ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
  s.req->usage.completion_tokens++;
  ++generation_tokens;
  s.generated.push_back(tok);
  if (!is_stop) {
    ev.tokens.push_back(tok);
    if (draw.has_logprob) ev.logprobs.push_back(std::move(draw.logprob));
  }
  int64_t total_len = static_cast<int64_t>(s.tokens.size()) + 1;
  bool length = static_cast<int>(s.generated.size()) >= p.max_tokens ||
                (options.max_model_len > 0 && total_len >= options.max_model_len);
  ev.usage = s.req->usage;
  if (is_stop || length) {
    ev.finished = true;
    ev.finish_reason = is_stop ? FinishReason::kStop : FinishReason::kLength;
    s.req->n_live--;
    ++finished_by_reason[FinishReasonName(ev.finish_reason)];
    s.state.reset();
  } else {
    s.tokens.push_back(tok);
  }
  s.req->stream->Push(std::move(ev));
}

void Engine::Impl::Admit(std::vector<Sequence*>& batch, std::vector<int64_t>& counts,
                         int64_t& budget) {
  while (!waiting.empty() && budget > 0 && static_cast<int>(batch.size()) < options.max_num_seqs &&
         static_cast<int>(running.size()) < options.max_num_seqs) {
    Sequence& s = *waiting.front();
    // A (re)admitted sequence needs its whole context's state; wait while it does not fit.
    int64_t need = model->StateBytesAt(static_cast<int64_t>(s.tokens.size()));
    if (UsedBytes() + need > options.kv_cache_bytes) {
      prefix_cache.EvictTo(std::max<int64_t>(
          0, options.kv_cache_bytes - need - (UsedBytes() - prefix_cache.bytes())));
      if (UsedBytes() + need > options.kv_cache_bytes) break;
    }
    // Resumed (preempted) sequences may also restore their prompt's prefix (an exact copy).
    const bool first_time = s.generated.empty() && !s.req->scheduled;
    const PrefixCache::Entry* hit = nullptr;
    if (options.enable_prefix_cache) {
      if (first_time) cache_queries += s.n_prompt;
      hit = prefix_cache.Lookup(s.tokens, s.n_prompt - 1);
    }
    auto state = hit != nullptr ? model->Copy(*hit->state) : model->NewState();
    if (!state.ok()) {
      // The device cannot hold another state now (the budget exceeds what it has): wait for
      // running sequences to finish, or fail this request if nothing runs.
      if (!running.empty()) break;
      Finish(s, FinishReason::kError, state.status());
      waiting.pop_front();
      continue;
    }
    s.state = std::move(state).value();
    if (hit != nullptr && first_time) {
      cache_hits += static_cast<int64_t>(hit->tokens.size());
      s.req->usage.cached_prompt_tokens = static_cast<int64_t>(hit->tokens.size());
    }
    if (!s.req->scheduled) {
      s.req->scheduled = true;
      s.req->scheduled_at = Clock::now();
    }
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
    Sequence& r = *running.back();
    int64_t n = ChunkSize(r, budget);
    batch.push_back(&r);
    counts.push_back(n);
    budget -= n;
  }
}

bool Engine::Impl::Step() {
  // Cancellations and engine drain deadline.
  bool force_cancel = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    force_cancel = draining && Clock::now() >= drain_deadline;
  }
  auto drop_cancelled = [&](std::list<std::unique_ptr<Sequence>>& list) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->req->stream->cancelled() || force_cancel) {
        Finish(**it, FinishReason::kCancelled);
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop_cancelled(running);
  drop_cancelled(waiting);
  if (running.empty() && waiting.empty()) return false;

  // Build the batch: decodes (one token) first, then prefill chunks of running sequences, then
  // new admissions, all under the token budget.
  std::vector<Sequence*> batch;
  std::vector<int64_t> counts;
  int64_t budget = options.max_num_batched_tokens;
  running.sort([](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& sp : running) {
      Sequence& s = *sp;
      int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.state->n_tokens();
      bool is_decode = remaining == 1;
      if ((pass == 0) != is_decode || remaining <= 0 || budget <= 0) continue;
      if (static_cast<int>(batch.size()) >= options.max_num_seqs) break;
      int64_t n = ChunkSize(s, budget);
      batch.push_back(&s);
      counts.push_back(n);
      budget -= n;
    }
  }
  Admit(batch, counts, budget);

  // KV budget: the state growth of this step must fit; otherwise evict cached prefixes, then
  // preempt the newest running sequences (their work is recomputed later, tokens are kept).
  auto growth = [&] {
    int64_t g = 0;
    for (size_t i = 0; i < batch.size(); ++i)
      g += model->StateBytesAt(batch[i]->state->n_tokens() + counts[i]) -
           model->StateBytesAt(batch[i]->state->n_tokens());
    return g;
  };
  while (!batch.empty() && UsedBytes() + growth() > options.kv_cache_bytes) {
    int64_t over = UsedBytes() + growth() - options.kv_cache_bytes;
    if (prefix_cache.bytes() > 0) {
      prefix_cache.EvictTo(std::max<int64_t>(0, prefix_cache.bytes() - over));
      continue;
    }
    if (running.size() <= 1) break;  // admission guaranteed a lone sequence fits
    auto victim =
        std::max_element(running.begin(), running.end(),
                         [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
    Sequence* v = victim->get();
    auto bi = std::find(batch.begin(), batch.end(), v);
    if (bi != batch.end()) {
      counts.erase(counts.begin() + (bi - batch.begin()));
      batch.erase(bi);
    }
    v->state.reset();
    ++preemptions;
    waiting.push_front(std::move(*victim));
    running.erase(victim);
  }
  if (batch.empty()) return !running.empty() || !waiting.empty();

  std::vector<backend::RunnerChunk> chunks(batch.size());
  std::vector<backend::ForwardOutput> outs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    int64_t pos = s.state->n_tokens();
    bool completes = pos + counts[i] == static_cast<int64_t>(s.tokens.size());
    chunks[i].state = s.state.get();
    chunks[i].tokens = std::span<const int32_t>(s.tokens.data() + pos, counts[i]);
    chunks[i].options.want_logits = completes;
    chunks[i].out = &outs[i];
    if (pos < s.n_prompt) prompt_tokens += std::min<int64_t>(counts[i], s.n_prompt - pos);
  }
  Status st = model->ForwardBatch(chunks);
  ++steps;
  if (!st.ok()) {
    for (Sequence* s : batch) Finish(*s, FinishReason::kError, st);
  } else {
    for (size_t i = 0; i < batch.size(); ++i) {
      Sequence& s = *batch[i];
      int64_t pos = s.state->n_tokens();
      if (options.enable_prefix_cache && s.generated.empty() && pos <= s.n_prompt - 1 &&
          (pos % options.prefix_block_tokens == 0 || pos == s.n_prompt - 1)) {
        std::span<const int32_t> prefix(s.tokens.data(), pos);
        if (!prefix_cache.Contains(prefix)) {
          // Snapshots live under the same budget (their own bytes; pages they share with the
          // sequence are counted once, already): make room by LRU eviction, or skip caching.
          auto snap = model->Snapshot(*s.state);
          if (snap.ok()) {  // no room on the device for a snapshot: skip caching this one
            const int64_t snap_bytes = model->StateBytes(**snap);
            int64_t live = UsedBytes() - prefix_cache.bytes();
            prefix_cache.EvictTo(
                std::max<int64_t>(0, options.kv_cache_bytes - live - snap_bytes));
            if (UsedBytes() + snap_bytes <= options.kv_cache_bytes)
              prefix_cache.Insert(
                  prefix, std::shared_ptr<const RunnerState>(std::move(snap).value()), snap_bytes);
          }
        }
      }
    }
    // The draws: forking sequences on this thread, the rest in parallel on the runner's idle
    // threads (each draw is a pure function of its sequence), emitted in batch order after.
    std::vector<size_t> parallel;  // indices into batch
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!chunks[i].options.want_logits) continue;
      if (Forks(*batch[i]))
        Sample(*batch[i], outs[i].logits);
      else
        parallel.push_back(i);
    }
    std::vector<Draw> draws(parallel.size());
    model->ParallelFor(static_cast<int64_t>(parallel.size()), [&](int64_t k) {
      draws[k] = DrawToken(*batch[parallel[k]], outs[parallel[k]].logits);
    });
    for (size_t k = 0; k < parallel.size(); ++k) Emit(*batch[parallel[k]], std::move(draws[k]));
  }
  running.remove_if([](const auto& s) { return s->state == nullptr; });
  return true;
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
      if (running.empty() && waiting.empty())
        cv.wait(lock, [&] { return stopping || !incoming.empty() || !flush_waiters.empty(); });
      if (stopping) break;
      while (!incoming.empty()) {
        auto req = std::move(incoming.front());
        incoming.pop_front();
        auto s = std::make_unique<Sequence>();
        s->req = req;
        s->tokens = req->params.prompt;
        s->n_prompt = static_cast<int64_t>(req->params.prompt.size());
        s->arrival = next_arrival++;
        req->n_live = req->params.n;
        req->usage.prompt_tokens = s->n_prompt;
        waiting.push_back(std::move(s));
      }
      // Submit's queue bound counts these now; waiting for the step's PublishStats would let a
      // burst past max_queue while the step runs.
      engine_waiting = static_cast<int>(waiting.size());
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
  for (auto* list : {&running, &waiting})
    for (auto& s : *list) Finish(*s, FinishReason::kCancelled);
  running.clear();
  waiting.clear();
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
  if (runner == nullptr) {
    backend::CpuRunnerOptions cpu;
    cpu.n_threads = options.n_threads;
    DSINFER_ASSIGN_OR_RETURN(runner, backend::MakeCpuRunner(weights, options.numerics, cpu));
  }
  if (options.kv_cache_bytes <= 0) options.kv_cache_bytes = runner->DefaultStateBudget();
  auto impl = std::make_unique<Impl>(weights, options);
  impl->prefix_cache.set_observer(impl->options.prefix_cache_observer.get());
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
  const auto& c = impl_->weights.config();
  if (params.prompt.empty()) return InvalidArgument("prompt must contain at least one token");
  for (int32_t t : params.prompt)
    if (t < 0 || t >= c.vocab_size)
      return InvalidArgument("prompt token " + std::to_string(t) + " is outside the vocabulary");
  for (int32_t t : params.stop_token_ids)
    if (t < 0 || t >= c.vocab_size) return InvalidArgument("stop token id outside the vocabulary");
  if (params.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens)
    return InvalidArgument("min_tokens must be in [0, max_tokens]");
  if (params.n < 1 || params.n > 16) return InvalidArgument("n must be in [1, 16]");
  if (params.top_logprobs > 20) return InvalidArgument("top_logprobs must be <= 20");
  // Needs logits for every prompt row (the scheduler asks for the last row only so far).
  if (params.prompt_logprobs >= 0)
    return Unimplemented("prompt logprobs are not computed by this engine yet");
  const auto& sp = params.sampling;
  if (!(sp.temperature >= 0) || !(sp.top_p > 0 && sp.top_p <= 1) || sp.top_k < 0 ||
      !(sp.min_p >= 0 && sp.min_p <= 1))
    return InvalidArgument("invalid sampling parameters");
  if (!(params.repetition_penalty > 0)) return InvalidArgument("repetition_penalty must be > 0");
  const int64_t total = static_cast<int64_t>(params.prompt.size()) + params.max_tokens;
  if (impl_->options.max_model_len > 0 &&
      static_cast<int64_t>(params.prompt.size()) >= impl_->options.max_model_len)
    return InvalidArgument("prompt of " + std::to_string(params.prompt.size()) +
                           " tokens exceeds max_model_len " +
                           std::to_string(impl_->options.max_model_len));
  int64_t need = impl_->model->StateBytesAt(total);
  if (need > impl_->options.kv_cache_bytes)
    return ResourceExhausted("request needs " + std::to_string(need) +
                             " bytes of sequence state, more than the KV " + "budget of " +
                             std::to_string(impl_->options.kv_cache_bytes) + " bytes");
  auto req = std::make_shared<Request>();
  if (params.request_id.empty()) {
    static_assert(sizeof(uintptr_t) <= 8);
    params.request_id = "req-" + std::to_string(reinterpret_cast<uintptr_t>(req.get()));
  }
  req->seed = params.sampling.has_seed ? params.sampling.seed : std::random_device{}();
  req->stream = std::make_shared<RequestStream>(params.request_id);
  req->params = std::move(params);
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
