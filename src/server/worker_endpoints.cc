// The endpoints routers and schedulers call on a worker, beside the inference APIs: what
// vllm-router (0.1.17) and sglang-router (0.3.2) were seen to call, and their admin fan-out
// targets (docs/SERVER.md, "Scale-out"):
//   GET  /get_load                       SGLang's array form, what load-aware policies poll
//   POST /flush_cache, /reset_prefix_cache  drop the prefix cache (refused while requests run)
//   GET  /server_info, /get_server_info  configuration and limits (sglang-router reads it when a
//        /model_info, /get_model_info    worker registers; vllm-router for kv_aware)
//   GET  /kv_event_sources               where the KV-event publisher listens (vLLM's form)
//   POST /v1/chat/completions/render, /v1/completions/render, /v1/responses/render
//        the prompt a request renders to, and its ids: vllm-router's cache_aware and kv_aware
//        policies call these on every worker for every routed request
//   GET  /health_generate                one real token through the engine
//   POST /start_profile, /stop_profile, /sleep, /wake_up: 501, with the reason; GET /is_sleeping
#include <chrono>
#include <optional>

#include "server/service_core.h"
#include "text/chat_json.h"

#ifndef DSINFER_VERSION
#error "DSINFER_VERSION must be defined by the build (src/CMakeLists.txt)"
#endif

namespace dsinfer::server {
namespace {

using Clock = std::chrono::steady_clock;

Json OrNull(int64_t value) { return value > 0 ? Json(value) : Json(nullptr); }

// SGLang's /get_load: one entry per data-parallel rank (dsinfer has one).
void GetLoad(EnginePort& engine, ResponseSink& sink) {
  const runtime::EngineStats stats = engine.Stats();
  Json rank = {{"dp_rank", 0},
               {"num_reqs", stats.n_running + stats.n_waiting},
               {"num_waiting_reqs", stats.n_waiting},
               {"num_tokens", stats.n_tokens_running}};
  SendJson(sink, 200, Json::array({rank}));
}

// SGLang answers 200 when flushed and 400 when requests run; vLLM's /reset_prefix_cache the same.
void FlushCache(EnginePort& engine, ResponseSink& sink) {
  Status flushed = engine.FlushPrefixCache();
  if (!flushed.ok()) {
    ApiError e = BadRequest("Cache not flushed: " + flushed.message());
    e.should_retry_false = false;
    return SendError(sink, e, ApiFlavor::kOpenAI);
  }
  SendJson(sink, 200, Json{{"success", true}, {"message", "Cache flushed."}});
}

Json ServedNames(const Service::Core& core) {
  Json names = Json::array({core.options.served_model_name});
  for (const auto& alias : core.options.served_model_aliases) names.push_back(alias);
  return names;
}

// SGLang's and vLLM's key names where the meaning is the same.
Json ServerInfo(const Service::Core& core, EnginePort& engine) {
  const ModelInfo& m = core.model;
  const runtime::EngineStats stats = engine.Stats();
  Json kv_events = nullptr;
  if (!core.options.kv_events.endpoint.empty())
    kv_events = {{"endpoint", core.options.kv_events.endpoint},
                 {"topic", core.options.kv_events.topic},
                 {"block_size", core.options.kv_events.block_size},
                 {"encoding", "msgpack"}};
  return Json{{"version", DSINFER_VERSION},
              {"engine", "dsinfer"},
              {"model_path", m.model_path},
              {"tokenizer_path", m.tokenizer_path},
              {"served_model_name", core.options.served_model_name},
              {"served_model_names", ServedNames(core)},
              {"model_version", m.version == text::ModelVersion::kV41 ? "v4.1" : "v4"},
              {"device", m.device},
              {"context_length", OrNull(m.max_model_len)},
              {"max_model_len", OrNull(m.max_model_len)},
              {"max_running_requests", m.max_num_seqs},
              {"max_num_seqs", m.max_num_seqs},
              {"max_num_batched_tokens", m.max_num_batched_tokens},
              {"max_queued_requests", m.max_queue},
              {"kv_cache_bytes", m.kv_cache_bytes},
              {"kv_cache_usage", stats.kv_usage},
              {"dp_size", 1},
              {"tp_size", 1},
              {"kv_events", kv_events},
              {"draining", core.draining.load()}};
}

Json ModelInfoJson(const Service::Core& core) {
  return Json{{"model_path", core.model.model_path},
              {"tokenizer_path", core.model.tokenizer_path},
              {"served_model_name", core.options.served_model_name},
              {"served_model_names", ServedNames(core)},
              {"is_generation", true},
              {"has_image_understanding", false},
              {"has_audio_understanding", false},
              {"preferred_sampling_params", nullptr},
              {"max_model_len", OrNull(core.model.max_model_len)},
              {"weight_version", "default"}};
}

// vLLM's GET /kv_event_sources: a bare array, one entry per data-parallel rank.
Json KvEventSources(const Service::Core& core) {
  Json sources = Json::array();
  if (!core.options.kv_events.endpoint.empty())
    sources.push_back({{"data_parallel_rank", 0},
                       {"endpoint", core.options.kv_events.endpoint},
                       {"replay_endpoint", nullptr},
                       {"topic", core.options.kv_events.topic},
                       {"block_size", core.options.kv_events.block_size}});
  return sources;
}

// The reply of every render endpoint: vLLM's shape (token_ids) plus the rendered text.
void SendRendered(Service::Core& core, const std::vector<int32_t>& ids, ResponseSink& sink) {
  auto text = core.tokenizer->Decode(ids);
  if (!text.ok()) return SendError(sink, FromStatus(text.status()), ApiFlavor::kOpenAI);
  SendJson(sink, 200,
           Json{{"request_id", NewId("render-")},
                {"model", core.options.served_model_name},
                {"prompt", *text},
                {"token_ids", ids},
                {"count", ids.size()},
                {"features", nullptr}});
}

// The same checks and rendering as the generation handlers, without generating: what a request
// would put in front of the engine.
void RenderChat(Service::Core& core, const HttpRequest& request, bool responses_api,
                ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body) return;
  Json chat_json = *body;
  if (responses_api) {
    auto converted = ResponsesToChatJson(*body, core.model.version);
    if (!converted.ok()) return SendError(sink, FromStatus(converted.status()), flavor);
    chat_json = std::move(converted).value();
  }
  auto chat =
      text::ChatRequestFromJsonValue(chat_json, core.model.version, core.options.default_thinking,
                                     /*keep_empty_system=*/responses_api);
  if (!chat.ok()) return SendError(sink, FromStatus(chat.status()), flavor);
  auto encoded = core.EncodeChat(*chat);
  if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), flavor);
  SendRendered(core, encoded->ids, sink);
}

void RenderCompletion(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body) return;
  std::string text;
  bool bos_inserted = false;
  auto ids = CompletionPrompt(core, *body, &text, &bos_inserted);
  if (!ids.ok()) return SendError(sink, FromStatus(ids.status()), flavor);
  SendRendered(core, *ids, sink);
}

// SGLang's /health_generate: one token through the engine, so a wedged engine is seen even
// though the HTTP side still answers /health.
void HealthGenerate(Service::Core& core, EnginePort& engine, ResponseSink& sink) {
  runtime::RequestParams params;
  auto bos = core.tokenizer->bos_id();
  params.prompt = {bos.value_or(0)};
  params.max_tokens = 1;
  params.sampling.temperature = 0;
  params.request_id = NewId("health-");
  auto stream = engine.Submit(std::move(params));
  if (!stream.ok()) {
    ApiError e = FromStatus(stream.status());
    if (e.status == 429) e.status = 503;  // busy is not unhealthy, but cannot prove health now
    e.retry_after_s = 1;
    return SendError(sink, e, ApiFlavor::kOpenAI);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    auto event = (*stream)->Next(std::chrono::milliseconds(200));
    if (!event) continue;
    if (!event->finished) continue;
    if (event->finish_reason == runtime::FinishReason::kError) {
      ApiError e = GenerationFailed(event->error);
      e.status = 503;
      return SendError(sink, e, ApiFlavor::kOpenAI);
    }
    return sink.Send(200, "application/json", "{\"status\":\"ok\"}");
  }
  (*stream)->Cancel();
  ApiError e;
  e.status = 503;
  e.message = "The engine did not produce a token within 20 s";
  e.retry_after_s = 5;
  SendError(sink, e, ApiFlavor::kOpenAI);
}

void NotImplementedHere(const std::string& what, ResponseSink& sink) {
  ApiError e;
  e.status = 501;
  e.type = "not_implemented";
  e.message = what;
  SendError(sink, e, ApiFlavor::kOpenAI);
}

enum class Need { kNothing, kEngine };

struct WorkerRoute {
  const char* path;
  const char* method;
  Need need;
};

constexpr WorkerRoute kWorkerRoutes[] = {
    {"/get_load", "GET", Need::kEngine},
    {"/flush_cache", "POST", Need::kEngine},
    {"/reset_prefix_cache", "POST", Need::kEngine},
    {"/server_info", "GET", Need::kEngine},
    {"/get_server_info", "GET", Need::kEngine},
    {"/model_info", "GET", Need::kEngine},
    {"/get_model_info", "GET", Need::kEngine},
    {"/kv_event_sources", "GET", Need::kNothing},
    {"/v1/chat/completions/render", "POST", Need::kEngine},
    {"/v1/completions/render", "POST", Need::kEngine},
    {"/v1/responses/render", "POST", Need::kEngine},
    {"/health_generate", "GET", Need::kEngine},
    {"/start_profile", "POST", Need::kNothing},
    {"/stop_profile", "POST", Need::kNothing},
    {"/sleep", "POST", Need::kNothing},
    {"/wake_up", "POST", Need::kNothing},
    {"/is_sleeping", "GET", Need::kNothing},
};

}  // namespace

bool HandleWorkerEndpoint(Service::Core& core, const HttpRequest& request, ResponseSink& sink,
                          bool authorized) {
  const WorkerRoute* route = nullptr;
  for (const auto& r : kWorkerRoutes)
    if (request.path == r.path) route = &r;
  if (route == nullptr) return false;
  const auto flavor = ApiFlavor::kOpenAI;
  if (!authorized) {
    SendError(sink, Unauthorized(), flavor);
    return true;
  }
  // vllm-router's /health_generate fan-out may use either; a GET-only route stays GET-only.
  const bool method_ok =
      request.method == route->method ||
      (std::string_view(route->path) == "/health_generate" && request.method == "POST");
  if (!method_ok) {
    ApiError e;
    e.status = 405;
    e.message = std::string("Method ") + request.method + " not allowed; use " + route->method;
    sink.Send(405, "application/json", Dump(ErrorBody(e, flavor)), {{"Allow", route->method}});
    return true;
  }
  const std::string_view path = route->path;
  EnginePort* engine = core.engine.load();
  if (route->need == Need::kEngine && (engine == nullptr || core.tokenizer == nullptr)) {
    ApiError e;
    e.status = 503;
    e.message = "The model is still loading; retry shortly";
    e.retry_after_s = 2;
    SendError(sink, e, flavor);
    return true;
  }
  if (path == "/get_load") {
    GetLoad(*engine, sink);
  } else if (path == "/flush_cache" || path == "/reset_prefix_cache") {
    FlushCache(*engine, sink);
  } else if (path == "/server_info" || path == "/get_server_info") {
    SendJson(sink, 200, ServerInfo(core, *engine));
  } else if (path == "/model_info" || path == "/get_model_info") {
    SendJson(sink, 200, ModelInfoJson(core));
  } else if (path == "/kv_event_sources") {
    SendJson(sink, 200, KvEventSources(core));
  } else if (path == "/v1/chat/completions/render") {
    RenderChat(core, request, /*responses_api=*/false, sink);
  } else if (path == "/v1/responses/render") {
    RenderChat(core, request, /*responses_api=*/true, sink);
  } else if (path == "/v1/completions/render") {
    RenderCompletion(core, request, sink);
  } else if (path == "/health_generate") {
    if (core.draining.load()) {
      ApiError e;
      e.status = 503;
      e.message = "The server is shutting down";
      e.retry_after_s = 5;
      SendError(sink, e, flavor);
    } else {
      HealthGenerate(core, *engine, sink);
    }
  } else if (path == "/start_profile" || path == "/stop_profile") {
    NotImplementedHere(
        "dsinfer has no built-in profiler endpoint; profile the process from outside "
        "(perf record -g -p PID on the CPU, nsys/ncu on a GPU), see docs/PERF.md",
        sink);
  } else if (path == "/sleep" || path == "/wake_up") {
    NotImplementedHere(
        "sleep mode is not supported: dsinfer cannot release and restore its weights and KV "
        "memory while running; stop the replica instead",
        sink);
  } else if (path == "/is_sleeping") {
    SendJson(sink, 200, Json{{"is_sleeping", false}});
  }
  return true;
}

}  // namespace dsinfer::server
