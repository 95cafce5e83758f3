#include "server/service.h"

#include <cctype>
#include <cstdio>
#include <optional>

#include "server/service_core.h"
#include "text/chat_json.h"

namespace dsinfer::server {
namespace {

// Compares without an early exit, so response timing does not reveal how much of a key matched.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Value of one RFC 4648 base64 digit (standard alphabet), -1 for any other byte.
int Base64Digit(char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
  if (ch >= '0' && ch <= '9') return ch - '0' + 52;
  if (ch == '+') return 62;
  if (ch == '/') return 63;
  return -1;
}

// Decodes base64 with optional '=' padding at the end; nullopt on anything malformed.
std::optional<std::string> DecodeBase64(std::string_view in) {
  for (int i = 0; i < 2 && !in.empty() && in.back() == '='; ++i) in.remove_suffix(1);
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : in) {
    int v = Base64Digit(ch);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

bool HasPrefixNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

// Keys arrive as `Authorization: Bearer KEY`, `x-api-key: KEY`, or HTTP Basic with the key as
// the password (what a browser sends after the login prompt the chat page's 401 triggers).
bool Authorized(const Service::Core& core, const HttpRequest& request) {
  if (core.options.api_keys.empty()) return true;
  std::string_view presented;
  std::string basic_password;
  if (const std::string* auth = request.Header("authorization")) {
    std::string_view v = Trim(*auth);
    if (HasPrefixNoCase(v, "bearer ")) {
      presented = Trim(v.substr(7));
    } else if (HasPrefixNoCase(v, "basic ")) {
      if (auto decoded = DecodeBase64(Trim(v.substr(6)))) {
        size_t colon = decoded->find(':');
        if (colon != std::string::npos) basic_password = decoded->substr(colon + 1);
      }
      presented = basic_password;
    }
  }
  if (presented.empty())
    if (const std::string* key = request.Header("x-api-key")) presented = Trim(*key);
  bool ok = false;
  for (const auto& key : core.options.api_keys) ok |= ConstantTimeEquals(presented, key);
  return ok && !presented.empty();
}

ApiFlavor FlavorFor(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ApiFlavor::kAnthropic : ApiFlavor::kOpenAI;
}

// Counts responses by status for /metrics without touching every handler, and writes the access
// log line when the request is done.
class CountingSink final : public ResponseSink {
 public:
  CountingSink(ResponseSink& inner, ServerMetrics& metrics, const HttpRequest& request,
               const std::function<void(const std::string&)>& log)
      : inner_(inner), metrics_(metrics), request_(request), log_(log) {}
  ~CountingSink() override {
    if (!log_) return;
    // Method and path only (printable ASCII, bounded): never the query, a header or the body.
    auto clean = [](std::string_view s) {
      std::string out;
      for (char c : s.substr(0, 200)) out.push_back(c > 0x20 && c < 0x7f ? c : '?');
      return out;
    };
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count();
    char line[512];
    std::snprintf(line, sizeof(line),
                  "access %s %s %d prompt_tokens=%lld completion_tokens=%lld latency_ms=%.1f",
                  clean(request_.method).c_str(), clean(request_.path).c_str(), status_,
                  static_cast<long long>(prompt_tokens_),
                  static_cast<long long>(completion_tokens_), ms);
    log_(line);
  }
  void Send(int status, std::string_view content_type, std::string_view body,
            const HeaderList& headers) override {
    metrics_.CountHttp(status);
    status_ = status;
    inner_.Send(status, content_type, body, headers);
  }
  bool BeginStream(int status, std::string_view content_type, const HeaderList& headers) override {
    metrics_.CountHttp(status);
    status_ = status;
    return inner_.BeginStream(status, content_type, headers);
  }
  void NoteTokens(int64_t prompt, int64_t completion) override {
    prompt_tokens_ = prompt;
    completion_tokens_ = completion;
  }
  bool WriteChunk(std::string_view data) override { return inner_.WriteChunk(data); }
  void EndStream() override { inner_.EndStream(); }
  bool ClientGone() override { return inner_.ClientGone(); }

 private:
  ResponseSink& inner_;
  ServerMetrics& metrics_;
  const HttpRequest& request_;
  const std::function<void(const std::string&)>& log_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int status_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t completion_tokens_ = 0;
};

// Every served name (vLLM's --served-model-name A B C) is a model card.
std::vector<std::string> ServedNames(const Service::Core& core) {
  std::vector<std::string> names = {core.options.served_model_name};
  names.insert(names.end(), core.options.served_model_aliases.begin(),
               core.options.served_model_aliases.end());
  return names;
}

Json ModelObject(const Service::Core& core, const std::string& name) {
  return Json{{"id", name},
              {"object", "model"},
              {"created", core.model.created_unix},
              {"owned_by", "dsinfer"},
              {"type", "model"},
              {"display_name", name},
              {"created_at", "1970-01-01T00:00:00Z"},
              {"root", core.options.served_model_name},
              {"max_model_len",
               core.model.max_model_len > 0 ? Json(core.model.max_model_len) : Json(nullptr)}};
}

void HandleModels(Service::Core& core, ResponseSink& sink) {
  const std::vector<std::string> names = ServedNames(core);
  Json data = Json::array();
  for (const auto& name : names) data.push_back(ModelObject(core, name));
  Json body = {{"object", "list"},
               {"data", data},
               {"has_more", false},
               {"first_id", names.front()},
               {"last_id", names.back()}};
  SendJson(sink, 200, body);
}

void HandleTokenize(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  auto body = ParseBody(request.body);
  if (!body.ok()) return SendError(sink, FromStatus(body.status()), ApiFlavor::kOpenAI);
  // vLLM's form also names the model and may ask for each token's string.
  auto model = OptString(*body, "model");
  if (!model.ok()) return SendError(sink, FromStatus(model.status()), ApiFlavor::kOpenAI);
  if (!core.KnownModel(*model, ApiFlavor::kOpenAI))
    return SendError(sink, core.UnknownModel(**model), ApiFlavor::kOpenAI);
  auto token_strs = OptBool(*body, "return_token_strs");
  if (!token_strs.ok()) return SendError(sink, FromStatus(token_strs.status()), ApiFlavor::kOpenAI);
  std::vector<int32_t> ids;
  if (body->contains("messages")) {
    auto chat =
        text::ChatRequestFromJsonValue(*body, core.model.version, core.options.default_thinking);
    if (!chat.ok()) return SendError(sink, FromStatus(chat.status()), ApiFlavor::kOpenAI);
    auto encoded = core.EncodeChat(*chat);
    if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), ApiFlavor::kOpenAI);
    ids = std::move(encoded->ids);
  } else {
    auto prompt = OptString(*body, "prompt");
    if (!prompt.ok()) return SendError(sink, FromStatus(prompt.status()), ApiFlavor::kOpenAI);
    if (!*prompt)
      return SendError(sink, BadRequest("prompt or messages is required", "prompt"),
                       ApiFlavor::kOpenAI);
    auto special = OptBool(*body, "add_special_tokens");
    if (!special.ok()) return SendError(sink, FromStatus(special.status()), ApiFlavor::kOpenAI);
    auto encoded = core.tokenizer->Encode(**prompt, special->value_or(true));
    if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), ApiFlavor::kOpenAI);
    ids = std::move(*encoded);
  }
  Json out = {{"tokens", ids},
              {"count", ids.size()},
              {"max_model_len",
               core.model.max_model_len > 0 ? Json(core.model.max_model_len) : Json(nullptr)},
              {"token_strs", nullptr}};
  if (token_strs->value_or(false)) {
    out["token_strs"] = Json::array();
    for (int32_t id : ids) out["token_strs"].push_back(TokenText(*core.tokenizer, id));
  }
  SendJson(sink, 200, out);
}

void HandleDetokenize(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  auto body = ParseBody(request.body);
  if (!body.ok()) return SendError(sink, FromStatus(body.status()), ApiFlavor::kOpenAI);
  auto model = OptString(*body, "model");
  if (!model.ok()) return SendError(sink, FromStatus(model.status()), ApiFlavor::kOpenAI);
  if (!core.KnownModel(*model, ApiFlavor::kOpenAI))
    return SendError(sink, core.UnknownModel(**model), ApiFlavor::kOpenAI);
  auto it = body->find("tokens");
  if (it == body->end() || !it->is_array())
    return SendError(sink, BadRequest("tokens: must be an array of token ids", "tokens"),
                     ApiFlavor::kOpenAI);
  std::vector<int32_t> ids;
  for (const auto& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
      return SendError(sink, BadRequest("tokens: must be an array of token ids", "tokens"),
                       ApiFlavor::kOpenAI);
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  auto decoded = core.tokenizer->Decode(ids);
  if (!decoded.ok())
    return SendError(sink, BadRequest(decoded.status().message(), "tokens"), ApiFlavor::kOpenAI);
  SendJson(sink, 200, Json{{"prompt", *decoded}});
}

void HandleGetResponse(Service::Core& core, const std::string& id, bool cancel,
                       ResponseSink& sink) {
  if (cancel) core.CancelInFlight(id);
  auto found = core.FindResponse(id);
  if (!found) {
    ApiError e;
    e.status = 404;
    e.message = "No response with id '" + id + "' (responses are kept in memory, the last " +
                std::to_string(core.options.max_stored_responses) + ")";
    return SendError(sink, e, ApiFlavor::kOpenAI);
  }
  if (cancel && (*found)["status"] == "in_progress") (*found)["status"] = "cancelled";
  SendJson(sink, 200, *found);
}

struct Route {
  const char* path;
  const char* method;
};

}  // namespace

Service::Service(ServiceOptions options) : core_(std::make_unique<Core>(std::move(options))) {
  core_->metrics.SetSchedulerNames(core_->options.scheduler_metrics);
}
Service::~Service() = default;

void Service::Attach(EnginePort* engine, const text::Tokenizer* tokenizer, ModelInfo info) {
  core_->tokenizer = tokenizer;
  core_->model = info;
  core_->engine.store(engine);
}

void Service::SetHttpServer(const HttpServer* server) { core_->http.store(server); }
void Service::BeginDrain() { core_->draining.store(true); }
ServerMetrics& Service::metrics() { return core_->metrics; }

void Service::Handle(const HttpRequest& request, ResponseSink& raw_sink) {
  Core& core = *core_;
  CountingSink counting(raw_sink, core.metrics, request, core.options.access_log);
  ResponseSink& sink = counting;
  const std::string& path = request.path;
  // HEAD is GET without the body (the connection's sink leaves the body out).
  const std::string method = request.method == "HEAD" ? "GET" : request.method;
  const ApiFlavor flavor = FlavorFor(path);
  EnginePort* engine = core.engine.load();

  // Open endpoints: liveness and readiness only. Everything else, the chat page included, needs
  // a key when one is configured.
  // /health is liveness (200 while the weights load) except while draining: routers health-check
  // it, and a 503 there takes a stopping replica out of rotation before its listener closes.
  if (path == "/health") {
    if (core.draining.load())
      return sink.Send(503, "application/json", "{\"status\":\"draining\"}",
                       {{"Retry-After", "5"}});
    return sink.Send(200, "application/json", "{\"status\":\"ok\"}");
  }
  if (path == "/ready") {
    const bool draining = core.draining.load();
    bool ready = engine != nullptr && engine->ready() && !draining;
    return sink.Send(ready ? 200 : 503, "application/json",
                     ready      ? "{\"status\":\"ready\"}"
                     : draining ? "{\"status\":\"draining\"}"
                                : "{\"status\":\"loading\"}",
                     ready ? HeaderList{} : HeaderList{{"Retry-After", "1"}});
  }
  if (path == "/version") return SendJson(sink, 200, Json{{"version", DSINFER_VERSION}});
  if (path == "/" || path == "/index.html") {
    // A browser cannot attach a Bearer header to a navigation, so the page asks for HTTP Basic
    // (any user name, the key as password); the browser then sends those credentials with the
    // page's own API calls too.
    if (!Authorized(core, request))
      return sink.Send(401, "text/plain; charset=utf-8",
                       "dsinfer: this server needs an API key. Sign in with any user name and the "
                       "key as password.\n",
                       {{"WWW-Authenticate", "Basic realm=\"dsinfer\", charset=\"UTF-8\""}});
    if (method != "GET")
      return SendError(sink, ApiError{405, "use GET", "", "", "", 0, false}, flavor);
    return sink.Send(200, "text/html; charset=utf-8", ChatPageHtml(),
                     {{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}});
  }

  if (HandleWorkerEndpoint(core, request, sink, Authorized(core, request))) return;
  if (HandleBootstrapEndpoint(core, request, sink, Authorized(core, request))) return;

  static constexpr Route kRoutes[] = {
      {"/v1/chat/completions", "POST"},
      {"/v1/completions", "POST"},
      {"/v1/responses", "POST"},
      {"/v1/messages", "POST"},
      {"/v1/messages/count_tokens", "POST"},
      {"/v1/models", "GET"},
      {"/tokenize", "POST"},
      {"/detokenize", "POST"},
      {"/metrics", "GET"},
  };
  const Route* route = nullptr;
  for (const auto& r : kRoutes)
    if (path == r.path) route = &r;
  bool response_item = path.rfind("/v1/responses/", 0) == 0 && path.size() > 14;
  const bool model_item = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
  if (!route && !response_item && !model_item) {
    ApiError e;
    e.status = 404;
    e.message = "Unknown endpoint " + method + " " + path;
    return SendError(sink, e, flavor);
  }
  if (!Authorized(core, request)) return SendError(sink, Unauthorized(), flavor);
  if (model_item) {
    if (method != "GET")
      return sink.Send(405, "application/json",
                       Dump(ErrorBody(ApiError{405, "Method " + method + " not allowed; use GET",
                                               "", "", "", 0, false},
                                      flavor)),
                       {{"Allow", "GET"}});
    const std::string id = path.substr(11);
    for (const auto& name : ServedNames(core))
      if (id == name) return SendJson(sink, 200, ModelObject(core, name));
    return SendError(sink, core.UnknownModel(id), flavor);
  }
  if (route && method != route->method) {
    ApiError e;
    e.status = 405;
    e.message = std::string("Method ") + method + " not allowed; use " + route->method;
    HeaderList headers = {{"Allow", route->method}};
    return sink.Send(405, "application/json", Dump(ErrorBody(e, flavor)), headers);
  }
  if (route && std::string_view(route->path) == "/metrics") {
    runtime::EngineStats stats = engine ? engine->Stats() : runtime::EngineStats{};
    const HttpServer* http = core.http.load();
    std::string text = core.metrics.Render(stats, http ? http->open_connections() : 0);
    if (core.options.kv_transfer != nullptr)
      text += RenderKvTransferMetrics(core.options.kv_transfer->Stats());
    if (core.options.bootstrap_rooms != nullptr)
      text += RenderBootstrapRoomMetrics(core.options.bootstrap_rooms->Stats());
    return sink.Send(200, "text/plain; version=0.0.4; charset=utf-8", text);
  }
  if (engine == nullptr || core.tokenizer == nullptr) {
    ApiError e;
    e.status = 503;
    e.message = "The model is still loading; retry shortly";
    e.retry_after_s = 2;
    return SendError(sink, e, flavor);
  }
  if (core.draining.load()) {
    ApiError e;
    e.status = 503;
    e.message = "The server is shutting down";
    e.retry_after_s = 5;
    return SendError(sink, e, flavor);
  }
  if (response_item) {
    std::string rest = path.substr(14);
    bool cancel = false;
    if (rest.size() > 7 && rest.substr(rest.size() - 7) == "/cancel") {
      cancel = true;
      rest.resize(rest.size() - 7);
    }
    if (rest.find('/') != std::string::npos) {
      ApiError e;
      e.status = 404;
      e.message = "Unknown endpoint " + method + " " + path;
      return SendError(sink, e, flavor);
    }
    const char* want = cancel ? "POST" : "GET";
    if (method != want) {
      ApiError e;
      e.status = 405;
      e.message = std::string("Method ") + method + " not allowed; use " + want;
      return sink.Send(405, "application/json", Dump(ErrorBody(e, flavor)), {{"Allow", want}});
    }
    return HandleGetResponse(core, rest, cancel, sink);
  }
  std::string_view p = route->path;
  if (p == "/v1/models") return HandleModels(core, sink);
  if (p == "/tokenize") return HandleTokenize(core, request, sink);
  if (p == "/detokenize") return HandleDetokenize(core, request, sink);
  if (p == "/v1/chat/completions") return HandleChatCompletions(core, request, sink);
  if (p == "/v1/completions") return HandleCompletions(core, request, sink);
  if (p == "/v1/responses") return HandleResponses(core, request, sink);
  if (p == "/v1/messages") return HandleMessages(core, request, sink);
  if (p == "/v1/messages/count_tokens") return HandleCountTokens(core, request, sink);
}

}  // namespace dsinfer::server
