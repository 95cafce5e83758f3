// Internals shared by the protocol handlers (service.cc, openai_*.cc, anthropic_messages.cc):
// JSON helpers, error shapes, sampling-parameter parsing, prompt encoding, response storage.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "grammar/grammar.h"
#include "server/generation.h"
#include "server/service.h"
#include "text/chat_render.h"

namespace dsinfer::server {

using Json = nlohmann::ordered_json;

enum class ApiFlavor { kOpenAI, kAnthropic };

struct ApiError {
  int status = 400;
  std::string message;
  std::string type;   // empty: derived from the status and flavor
  std::string code;   // OpenAI "code" (empty: null)
  std::string param;  // OpenAI "param" (empty: null)
  int retry_after_s = 0;
  bool should_retry_false = false;  // x-should-retry: false for deterministic failures
};

ApiError BadRequest(std::string message, std::string param = "");
// 401: no valid API key (the same for every route that checks one).
ApiError Unauthorized();
// 422: well-formed and valid, but asks for something this server does not do (FIM suffix,
// previous_response_id, image input, regex output constraints).
ApiError Unsupported(std::string message, std::string param = "");
// Maps an engine / renderer Status to the status code the API contract names (§3.5).
ApiError FromStatus(const Status& status);
Json ErrorBody(const ApiError& error, ApiFlavor flavor);
void SendError(ResponseSink& sink, const ApiError& error, ApiFlavor flavor);
// The 500 for a generation that failed inside the engine (message: the engine's error, if any).
ApiError GenerationFailed(const Status& error);
void SendJson(ResponseSink& sink, int status, const Json& body, const HeaderList& headers = {});
// dump() that never throws: ill-formed UTF-8 is replaced with U+FFFD.
std::string Dump(const Json& j);
std::string SseData(const Json& j);
std::string SseEvent(const std::string& event, const Json& j);
HeaderList SseHeaders(const std::string& request_id);

// Parses a request body as a JSON object, with a nesting-depth limit checked before parsing.
Result<Json> ParseBody(const std::string& body);

// Random hex id with a prefix: "chatcmpl-3f9a...".
std::string NewId(const std::string& prefix);
int64_t UnixNow();

// Typed optional fields: absent or null -> nullopt; wrong type -> InvalidArgument naming it.
Result<std::optional<double>> OptNumber(const Json& body, const char* key);
Result<std::optional<int64_t>> OptInt(const Json& body, const char* key);
Result<std::optional<bool>> OptBool(const Json& body, const char* key);
Result<std::optional<std::string>> OptString(const Json& body, const char* key);
// A string field of a request object inside `path` (for the message): `fallback` when the field
// is absent or null, or when `object` is not an object; InvalidArgument "path.key: must be a
// string" when it is another type. Json::value(key, "") would throw instead.
Result<std::string> StringField(const Json& object, const char* key, const std::string& path,
                                std::string fallback = {});
// "stop": a string or an array of at most 16 strings.
Result<std::vector<std::string>> StopSequences(const Json& body, const char* key);

// Common sampling fields shared by the OpenAI and Anthropic requests (temperature, top_p,
// top_k, min_p, seed, penalties, logit_bias, ...) into engine parameters.
Status ParseSampling(const Json& body, runtime::RequestParams* params);
// ParseSampling, plus vLLM's skip_special_tokens (default true) for the output text.
Status ParseGenerationFields(const Json& body, GenerationSpec* spec);

// Token-level string for logprobs: lossy UTF-8 of the token's bytes, plus the raw bytes.
std::string TokenText(const text::Tokenizer& tokenizer, int32_t id);
Json TokenBytes(const text::Tokenizer& tokenizer, int32_t id);

struct EncodedPrompt {
  std::vector<int32_t> ids;
  bool thinking = false;
  bool has_tools = false;
  bool forced_tool_call = false;  // tool_choice required: the prompt opened the DSML block
  bool json_output = false;       // response_format json_object
  bool max_effort = false;        // reasoning_effort max
};

struct Service::Core {
  explicit Core(ServiceOptions o) : options(std::move(o)) {}

  ServiceOptions options;
  ServerMetrics metrics;
  std::atomic<EnginePort*> engine{nullptr};
  const text::Tokenizer* tokenizer = nullptr;
  ModelInfo model;
  std::atomic<const HttpServer*> http{nullptr};
  std::atomic<bool> draining{false};

  // Renders and encodes a chat request; enforces the prompt-length limit.
  Result<EncodedPrompt> EncodeChat(const text::ChatRequest& request) const;
  // Resolves max_tokens against the limits and the context left after the prompt; without one,
  // `default_tokens` (capped the same way).
  Result<int> ResolveMaxTokens(std::optional<int64_t> requested, size_t prompt_tokens,
                               int64_t default_tokens) const;
  // A chat request's max_tokens when it gives none: --default-max-tokens, or else
  // deepseek-recipe's defaults (8192 without thinking, 65536 with it, 131072 at max effort).
  int64_t DefaultMaxTokens(const EncodedPrompt& prompt) const;
  // True when `model` names the served model (or is absent). Anthropic clients send claude-*.
  bool KnownModel(const std::optional<std::string>& model, ApiFlavor flavor) const;
  ApiError UnknownModel(const std::string& model) const;

  // Structured outputs' compiler for the served model's vocabulary (its cache of compiled
  // grammars is keyed by spec), made on first use.
  Result<grammar::Compiler*> Grammars();
  std::mutex grammar_mu;
  std::unique_ptr<grammar::Compiler> grammar_compiler;  // guarded by grammar_mu

  // Responses API storage: finished responses by id, and in-flight requests to cancel.
  void StoreResponse(const std::string& id, Json response);
  std::optional<Json> FindResponse(const std::string& id) const;
  void TrackInFlight(const std::string& id, std::shared_ptr<runtime::RequestStream> stream,
                     Json snapshot);
  void UntrackInFlight(const std::string& id);
  bool CancelInFlight(const std::string& id);

  mutable std::mutex store_mu;
  std::map<std::string, Json> stored;
  std::deque<std::string> stored_order;
  struct InFlight {
    std::shared_ptr<runtime::RequestStream> stream;
    Json snapshot;
  };
  std::map<std::string, InFlight> in_flight;
};

// Protocol handlers (request already authenticated, engine attached, body size checked).
void HandleChatCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink);
void HandleCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink);
void HandleResponses(Service::Core& core, const HttpRequest& request, ResponseSink& sink);
void HandleMessages(Service::Core& core, const HttpRequest& request, ResponseSink& sink);
void HandleCountTokens(Service::Core& core, const HttpRequest& request, ResponseSink& sink);
// Anthropic Messages request -> OpenAI-chat-shaped JSON the text layer converts (shared with
// count_tokens).
Result<Json> MessagesToChatJson(const Json& body, bool default_thinking);
// Responses request -> OpenAI-chat-shaped JSON (shared with /v1/responses/render); the role of
// developer messages depends on the model version.
Result<Json> ResponsesToChatJson(const Json& body, text::ModelVersion version);
// The /v1/completions prompt as ids; `text` gets its text, `bos_inserted` whether ids[0] is a BOS
// the server added (shared with /v1/completions/render).
Result<std::vector<int32_t>> CompletionPrompt(const Service::Core& core, const Json& body,
                                              std::string* text, bool* bos_inserted);
// The request body as JSON when it parses and names a served model (or none); otherwise the
// error is sent in the API's shape and nullopt returned.
std::optional<Json> BodyForServedModel(const Service::Core& core, const HttpRequest& request,
                                       ResponseSink& sink, ApiFlavor flavor);
// Routers' and schedulers' endpoints (worker_endpoints.cc): true when `request.path` is one of
// them, which it then answered (authentication and method included).
bool HandleWorkerEndpoint(Service::Core& core, const HttpRequest& request, ResponseSink& sink,
                          bool authorized);

// Prefill/decode disaggregation (disaggregation.cc): a request's kv_transfer_params as this
// worker's role allows them (InvalidArgument otherwise).
class RoomPublication;
struct KvTransferRequest {
  bool remote_decode = false;   // a prefill worker's request: hand the state over
  bool remote_prefill = false;  // a decode worker's request: continue from a handed-over state
  std::optional<transfer::TransferDescriptor> descriptor;  // null: nothing travels (short prompt)
  // sglang-router's hand-over (bootstrap_host / bootstrap_port / bootstrap_room in the body
  // instead of kv_transfer_params): the decode worker fetches the descriptor from the prefill
  // worker's bootstrap endpoint; the prefill worker publishes it there under the room.
  std::optional<uint64_t> bootstrap_room;
  std::string bootstrap_host;
  int bootstrap_port = 0;
  bool stream = false;
  // A prefill worker's: publishes the room's failure unless the state was published first.
  std::shared_ptr<RoomPublication> publication;
};
Result<KvTransferRequest> ParseKvTransferParams(const Service::Core& core, const Json& body);
// Before Generation::Start: asks the engine for the export (prefill), or pulls the state and
// hands it to the engine (decode; FailedPrecondition when the transfer fails, so that the router
// retries).
Status PrepareDisaggregated(Service::Core& core, const KvTransferRequest& kv,
                            runtime::RequestParams* params);
// After a prefill worker's generation: holds its exported state for the decode worker; the
// kv_transfer_params the response carries.
Result<Json> HoldForRemoteDecode(Service::Core& core, const Generation& generation,
                                 const runtime::RequestParams& params);

// A prefill worker's GET /dsinfer/bootstrap?room=N[&wait_ms=M] (disaggregation.cc): the
// descriptor published under the room, for the decode worker of sglang-router's hand-over. True
// when `request.path` was it (and answered).
bool HandleBootstrapEndpoint(Service::Core& core, const HttpRequest& request, ResponseSink& sink,
                             bool authorized);

// The APIs without the hand-over (Responses, Anthropic Messages) refuse kv_transfer_params
// rather than ignore them: true when the 422 was sent.
bool RefuseKvTransferParams(const Json& body, ResponseSink& sink, ApiFlavor flavor);

// The chat page served at "/".
std::string_view ChatPageHtml();

}  // namespace dsinfer::server
