// The HTTP API of `dsinfer serve`: OpenAI Chat Completions / Completions / Responses, Anthropic
// Messages, models, tokenize/detokenize, health/readiness, Prometheus metrics and the chat page.
// Wire formats follow serving-protocols.md §3; request conversion §2.5; DeepSeek fields §2.6.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/engine_port.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "text/chat_types.h"
#include "text/tokenizer.h"
#include "transfer/bootstrap_rooms.h"
#include "transfer/kv_transfer.h"

namespace dsinfer::server {

// Where the KV-event publisher (server/kv_events.h) can be reached, for GET /kv_event_sources
// and /server_info; an empty endpoint: events are off.
struct KvEventsInfo {
  std::string endpoint;  // what a subscriber connects to: "tcp://127.0.0.1:5557"
  std::string topic;
  int block_size = 16;  // tokens per published block
};

// `dsinfer serve --role`: a prefill worker hands each do_remote_decode request's state to a
// decode worker; a decode worker continues do_remote_prefill requests from such a state; both
// (the default) does everything itself. Every role serves plain requests whole.
enum class DisaggregationRole { kBoth, kPrefill, kDecode };

struct ServiceOptions {
  std::string served_model_name = "deepseek-v4-flash";
  // More names the model answers to (vLLM's --served-model-name A B C: A is the name responses
  // report, every name is accepted as `model` and listed by /v1/models).
  std::vector<std::string> served_model_aliases;
  std::vector<std::string> api_keys;  // empty: no authentication
  int max_tokens_limit = 32768;       // largest accepted max_tokens
  // When the request gives none; 0: deepseek-recipe's defaults (8192 without thinking, 65536 with
  // it, 131072 at max effort). Always capped by max_tokens_limit and the context left.
  int default_max_tokens = 0;
  bool default_thinking = true;     // DeepSeek's API default
  int max_stored_responses = 1024;  // for GET /v1/responses/{id}
  // Receives one line per request (method, path, status, tokens, latency; never a body or a
  // key). Unset: no access log.
  std::function<void(const std::string&)> access_log;
  KvEventsInfo kv_events;
  SchedulerMetricNames scheduler_metrics;  // /metrics gauges under an endpoint picker's names
  DisaggregationRole role = DisaggregationRole::kBoth;
  std::string engine_id = "dsinfer";  // names this worker in kv_transfer_params
  // The UCX transfer agent of a prefill or decode worker (null with --role both).
  std::shared_ptr<transfer::KvTransferAgent> kv_transfer;
  // sglang-router's hand-over (server/disaggregation.cc): a prefill worker's published rooms
  // (null with other roles), and how long a decode worker waits for its room to be published.
  std::shared_ptr<transfer::BootstrapRooms> bootstrap_rooms;
  std::chrono::milliseconds bootstrap_timeout{std::chrono::seconds(60)};
};

// What the service needs to know about the loaded model.
struct ModelInfo {
  text::ModelVersion version = text::ModelVersion::kV4;
  int64_t max_model_len = 0;  // prompt + output tokens; 0: unlimited
  int64_t created_unix = 0;
  // For the routers' /server_info and /model_info (worker_endpoints.cc).
  std::string model_path;      // the checkpoint directory
  std::string tokenizer_path;  // the tokenizer.json in use
  std::string device;          // "cpu", "cuda:0 (NVIDIA H200)"
  int64_t kv_cache_bytes = 0;  // the engine's KV / state budget
  int max_num_seqs = 0;        // most sequences in one step
  int max_num_batched_tokens = 0;
  int max_queue = 0;
  // The model's logits row and end-of-message token, for structured outputs' grammars
  // (0 / -1: the tokenizer's vocab_size / EOS).
  int32_t vocab_size = 0;
  int32_t eos_token_id = -1;
};

class Service {
 public:
  explicit Service(ServiceOptions options);
  ~Service();
  // Until Attach, every endpoint except /health, /ready and /metrics answers 503 (loading).
  // The engine and tokenizer must outlive the service.
  void Attach(EnginePort* engine, const text::Tokenizer* tokenizer, ModelInfo info);
  // Used for the connection gauge in /metrics (optional).
  void SetHttpServer(const HttpServer* server);
  // Requests that arrive from now on are refused with 503 (shutdown has begun).
  void BeginDrain();

  void Handle(const HttpRequest& request, ResponseSink& sink);
  ServerMetrics& metrics();

  struct Core;  // shared by the per-protocol handler files

 private:
  std::unique_ptr<Core> core_;
};

}  // namespace dsinfer::server
