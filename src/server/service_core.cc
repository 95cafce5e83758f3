#include "server/service_core.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "text/utf8.h"

namespace dsinfer::server {
namespace {

constexpr int kMaxJsonDepth = 64;

std::string DefaultErrorType(int status, ApiFlavor flavor) {
  if (flavor == ApiFlavor::kAnthropic) {
    switch (status) {
      case 401:
        return "authentication_error";
      case 403:
        return "permission_error";
      case 404:
        return "not_found_error";
      case 413:
        return "request_too_large";
      case 429:
        return "rate_limit_error";
      case 503:
      case 529:
        return "overloaded_error";
      default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
  }
  if (status == 429) return "rate_limit_exceeded";
  if (status == 503) return "service_unavailable";
  return status >= 500 ? "server_error" : "invalid_request_error";
}

// Deepest [ / { nesting outside strings; stops counting past the limit.
int NestingDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}')
      --depth;
    if (max_depth > kMaxJsonDepth) break;
  }
  return max_depth;
}

}  // namespace

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError Unauthorized() {
  ApiError e;
  e.status = 401;
  e.message = "Invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)";
  e.code = "invalid_api_key";
  return e;
}

ApiError Unsupported(std::string message, std::string param) {
  ApiError e;
  e.status = 422;
  e.code = "unsupported_parameter";
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError FromStatus(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      e.status = 400;
      break;
    case StatusCode::kOutOfRange:
      e.status = 400;
      e.code = "context_length_exceeded";
      break;
    case StatusCode::kResourceExhausted:
      // A full queue clears up; a request that can never fit does not.
      if (status.message().find("queue") != std::string::npos) {
        e.status = 429;
        e.retry_after_s = 1;
      } else {
        e.status = 400;
        e.code = "context_length_exceeded";
        e.should_retry_false = true;
      }
      break;
    case StatusCode::kFailedPrecondition:
      e.status = 503;
      e.retry_after_s = 5;
      break;
    case StatusCode::kUnimplemented:
      e.status = 422;
      e.code = "unsupported_parameter";
      break;
    case StatusCode::kNotFound:
      e.status = 404;
      break;
    default:
      e.status = 500;
      break;
  }
  return e;
}

Json ErrorBody(const ApiError& error, ApiFlavor flavor) {
  std::string type = error.type.empty() ? DefaultErrorType(error.status, flavor) : error.type;
  if (flavor == ApiFlavor::kAnthropic) {
    return Json{{"type", "error"},
                {"error", {{"type", type}, {"message", error.message}}},
                {"request_id", NewId("req_")}};
  }
  return Json{{"error",
               {{"message", error.message},
                {"type", type},
                {"param", error.param.empty() ? Json(nullptr) : Json(error.param)},
                {"code", error.code.empty() ? Json(nullptr) : Json(error.code)}}}};
}

void SendError(ResponseSink& sink, const ApiError& error, ApiFlavor flavor) {
  HeaderList headers;
  if (error.retry_after_s > 0)
    headers.emplace_back("Retry-After", std::to_string(error.retry_after_s));
  if (error.should_retry_false) headers.emplace_back("x-should-retry", "false");
  int status = error.status;
  // Anthropic's SDK knows overload as 529.
  if (flavor == ApiFlavor::kAnthropic && status == 503) status = 529;
  sink.Send(status, "application/json", Dump(ErrorBody(error, flavor)), headers);
}

void SendJson(ResponseSink& sink, int status, const Json& body, const HeaderList& headers) {
  sink.Send(status, "application/json", Dump(body), headers);
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string SseData(const Json& j) { return "data: " + Dump(j) + "\n\n"; }

std::string SseEvent(const std::string& event, const Json& j) {
  return "event: " + event + "\ndata: " + Dump(j) + "\n\n";
}

HeaderList SseHeaders(const std::string& request_id) {
  return {{"Cache-Control", "no-cache"},
          {"X-Accel-Buffering", "no"},
          {"x-request-id", request_id},
          {"request-id", request_id}};
}

Result<Json> ParseBody(const std::string& body) {
  if (NestingDepth(body) > kMaxJsonDepth)
    return InvalidArgument("request JSON is nested more than " + std::to_string(kMaxJsonDepth) +
                           " levels");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("request body is not valid JSON (or not UTF-8)");
  if (!j.is_object()) return InvalidArgument("request body must be a JSON object");
  return j;
}

std::string NewId(const std::string& prefix) {
  thread_local std::mt19937_64 rng(
      std::random_device{}() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffULL));
  return prefix + buf;
}

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

Result<std::optional<double>> OptNumber(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return InvalidArgument(std::string(key) + ": must be a number");
  double v = it->get<double>();
  if (!std::isfinite(v)) return InvalidArgument(std::string(key) + ": must be finite");
  return std::optional<double>(v);
}

Result<std::optional<int64_t>> OptInt(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<int64_t>();
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return InvalidArgument(std::string(key) + ": out of range");
    return std::optional<int64_t>(it->get<int64_t>());
  }
  if (it->is_number_float()) {
    double v = it->get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15)
      return std::optional<int64_t>(static_cast<int64_t>(v));
  }
  return InvalidArgument(std::string(key) + ": must be an integer");
}

Result<std::optional<bool>> OptBool(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return InvalidArgument(std::string(key) + ": must be a boolean");
  return std::optional<bool>(it->get<bool>());
}

Result<std::optional<std::string>> OptString(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return InvalidArgument(std::string(key) + ": must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

Result<std::string> StringField(const Json& object, const char* key, const std::string& path,
                                std::string fallback) {
  // OptString's rule (find on a non-object is end(): the fallback), its error placed in `path`.
  auto value = OptString(object, key);
  if (!value.ok())
    return InvalidArgument((path.empty() ? "" : path + ".") + value.status().message());
  return value->value_or(std::move(fallback));
}

Result<std::vector<std::string>> StopSequences(const Json& body, const char* key) {
  std::vector<std::string> stops;
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->size() > 16) return InvalidArgument(std::string(key) + ": at most 16 stop sequences");
    for (const auto& s : *it) {
      if (!s.is_string()) return InvalidArgument(std::string(key) + ": must contain strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    return InvalidArgument(std::string(key) + ": must be a string or an array of strings");
  }
  return stops;
}

Status ParseSampling(const Json& body, runtime::RequestParams* params) {
  auto& s = params->sampling;
  DSINFER_ASSIGN_OR_RETURN(auto temperature, OptNumber(body, "temperature"));
  if (temperature) {
    if (*temperature < 0 || *temperature > 2)
      return InvalidArgument("temperature: must be in [0, 2]");
    s.temperature = *temperature;
  }
  DSINFER_ASSIGN_OR_RETURN(auto top_p, OptNumber(body, "top_p"));
  if (top_p) {
    if (*top_p <= 0 || *top_p > 1) return InvalidArgument("top_p: must be in (0, 1]");
    s.top_p = *top_p;
  }
  DSINFER_ASSIGN_OR_RETURN(auto top_k, OptInt(body, "top_k"));
  if (top_k) {
    if (*top_k < -1 || *top_k > 100000) return InvalidArgument("top_k: out of range");
    s.top_k = static_cast<int>(std::max<int64_t>(0, *top_k));
  }
  DSINFER_ASSIGN_OR_RETURN(auto min_p, OptNumber(body, "min_p"));
  if (min_p) {
    if (*min_p < 0 || *min_p > 1) return InvalidArgument("min_p: must be in [0, 1]");
    s.min_p = *min_p;
  }
  DSINFER_ASSIGN_OR_RETURN(auto seed, OptInt(body, "seed"));
  if (seed) {
    s.seed = static_cast<uint64_t>(*seed);
    s.has_seed = true;
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    DSINFER_ASSIGN_OR_RETURN(auto v, OptNumber(body, key));
    if (!v) continue;
    if (*v < -2 || *v > 2) return InvalidArgument(std::string(key) + ": must be in [-2, 2]");
    (std::string(key) == "presence_penalty" ? params->presence_penalty
                                            : params->frequency_penalty) = *v;
  }
  DSINFER_ASSIGN_OR_RETURN(auto repetition, OptNumber(body, "repetition_penalty"));
  if (repetition) {
    if (*repetition <= 0 || *repetition > 10)
      return InvalidArgument("repetition_penalty: must be in (0, 10]");
    params->repetition_penalty = *repetition;
  }
  DSINFER_ASSIGN_OR_RETURN(auto ignore_eos, OptBool(body, "ignore_eos"));
  if (ignore_eos) params->ignore_eos = *ignore_eos;
  DSINFER_ASSIGN_OR_RETURN(auto min_tokens, OptInt(body, "min_tokens"));
  if (min_tokens) {
    if (*min_tokens < 0 || *min_tokens > 1000000)
      return InvalidArgument("min_tokens: out of range");
    params->min_tokens = static_cast<int>(*min_tokens);
  }
  auto bias = body.find("logit_bias");
  if (bias != body.end() && !bias->is_null()) {
    if (!bias->is_object()) return InvalidArgument("logit_bias: must be an object");
    if (bias->size() > 1024) return InvalidArgument("logit_bias: at most 1024 entries");
    for (const auto& [key, value] : bias->items()) {
      char* end = nullptr;
      long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
        return InvalidArgument("logit_bias: keys must be token ids");
      if (!value.is_number()) return InvalidArgument("logit_bias: values must be numbers");
      double b = value.get<double>();
      if (!(b >= -100 && b <= 100))
        return InvalidArgument("logit_bias: values must be in [-100, 100]");
      params->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  return Status::Ok();
}

Status ParseGenerationFields(const Json& body, GenerationSpec* spec) {
  DSINFER_RETURN_IF_ERROR(ParseSampling(body, &spec->params));
  DSINFER_ASSIGN_OR_RETURN(auto skip_special, OptBool(body, "skip_special_tokens"));
  spec->skip_special_tokens = skip_special.value_or(true);
  for (const char* key : {"include_stop_str_in_output", "no_stop_trim"}) {
    DSINFER_ASSIGN_OR_RETURN(auto include, OptBool(body, key));
    if (include && *include) spec->include_stop_in_output = true;
  }
  DSINFER_ASSIGN_OR_RETURN(auto separate, OptBool(body, "separate_reasoning"));
  spec->separate_reasoning = separate.value_or(true);
  DSINFER_ASSIGN_OR_RETURN(auto stream_reasoning, OptBool(body, "stream_reasoning"));
  spec->stream_reasoning = stream_reasoning.value_or(true);
  DSINFER_ASSIGN_OR_RETURN(auto include_reasoning, OptBool(body, "include_reasoning"));
  spec->include_reasoning = include_reasoning.value_or(true);
  // SGLang's return_hidden_states: refused rather than answered without them.
  DSINFER_ASSIGN_OR_RETURN(auto hidden, OptBool(body, "return_hidden_states"));
  if (hidden && *hidden)
    return InvalidArgument("return_hidden_states: this server does not return hidden states");
  return Status::Ok();
}

std::string TokenText(const text::Tokenizer& tokenizer, int32_t id) {
  const std::string* bytes = tokenizer.TokenBytes(id);
  return bytes ? text::Utf8Lossy(*bytes) : std::string();
}

Json TokenBytes(const text::Tokenizer& tokenizer, int32_t id) {
  Json out = Json::array();
  if (const std::string* bytes = tokenizer.TokenBytes(id))
    for (unsigned char c : *bytes) out.push_back(static_cast<int>(c));
  return out;
}

Result<EncodedPrompt> Service::Core::EncodeChat(const text::ChatRequest& request) const {
  DSINFER_ASSIGN_OR_RETURN(auto rendered, text::RenderPromptSegments(request));
  DSINFER_ASSIGN_OR_RETURN(auto ids, text::EncodePrompt(*tokenizer, rendered.segments));
  if (model.max_model_len > 0 && static_cast<int64_t>(ids.size()) >= model.max_model_len)
    return OutOfRange("the prompt has " + std::to_string(ids.size()) +
                      " tokens; this model's maximum context length is " +
                      std::to_string(model.max_model_len) + " tokens");
  EncodedPrompt out;
  out.ids = std::move(ids);
  out.thinking = request.thinking;
  out.has_tools = !request.tools.empty() && request.tool_choice != text::ToolChoice::kNone;
  out.forced_tool_call =
      !request.tools.empty() && request.tool_choice == text::ToolChoice::kRequired;
  out.json_output = request.response_format.type == text::ResponseFormatType::kJsonObject;
  out.max_effort = request.reasoning_effort == text::ReasoningEffort::kMax;
  return out;
}

int64_t Service::Core::DefaultMaxTokens(const EncodedPrompt& prompt) const {
  if (options.default_max_tokens > 0) return options.default_max_tokens;
  if (!prompt.thinking) return 8192;
  return prompt.max_effort ? 131072 : 65536;
}

Result<int> Service::Core::ResolveMaxTokens(std::optional<int64_t> requested, size_t prompt_tokens,
                                            int64_t default_tokens) const {
  int64_t limit = options.max_tokens_limit;
  if (model.max_model_len > 0)
    limit = std::min<int64_t>(limit, model.max_model_len - static_cast<int64_t>(prompt_tokens));
  if (requested) {
    if (*requested < 1) return InvalidArgument("max_tokens: must be at least 1");
    if (*requested > options.max_tokens_limit)
      return InvalidArgument("max_tokens: " + std::to_string(*requested) +
                             " is more than the server's limit of " +
                             std::to_string(options.max_tokens_limit));
    if (model.max_model_len > 0 && *requested > limit)
      return OutOfRange("max_tokens " + std::to_string(*requested) + " + prompt " +
                        std::to_string(prompt_tokens) +
                        " tokens exceeds the maximum context length of " +
                        std::to_string(model.max_model_len));
    return static_cast<int>(*requested);
  }
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(limit, default_tokens)));
}

bool Service::Core::KnownModel(const std::optional<std::string>& name, ApiFlavor flavor) const {
  // Absent is the served model; an empty name is refused like any other unknown one.
  if (!name || *name == options.served_model_name) return true;
  for (const auto& alias : options.served_model_aliases)
    if (*name == alias) return true;
  // DeepSeek's Anthropic endpoint maps every claude-* name to its model (guides/anthropic_api).
  if (flavor == ApiFlavor::kAnthropic && name->rfind("claude", 0) == 0) return true;
  return false;
}

ApiError Service::Core::UnknownModel(const std::string& name) const {
  ApiError e;
  e.status = 404;
  e.code = "model_not_found";
  e.param = "model";
  e.message = "The model '" + name + "' does not exist; this server serves '" +
              options.served_model_name + "'";
  return e;
}

void Service::Core::StoreResponse(const std::string& id, Json response) {
  std::lock_guard lock(store_mu);
  if (stored.emplace(id, std::move(response)).second) stored_order.push_back(id);
  while (static_cast<int>(stored_order.size()) > options.max_stored_responses) {
    stored.erase(stored_order.front());
    stored_order.pop_front();
  }
}

std::optional<Json> Service::Core::FindResponse(const std::string& id) const {
  std::lock_guard lock(store_mu);
  auto it = stored.find(id);
  if (it != stored.end()) return it->second;
  auto live = in_flight.find(id);
  if (live != in_flight.end()) return live->second.snapshot;
  return std::nullopt;
}

void Service::Core::TrackInFlight(const std::string& id,
                                  std::shared_ptr<runtime::RequestStream> stream, Json snapshot) {
  std::lock_guard lock(store_mu);
  in_flight[id] = InFlight{std::move(stream), std::move(snapshot)};
}

void Service::Core::UntrackInFlight(const std::string& id) {
  std::lock_guard lock(store_mu);
  in_flight.erase(id);
}

bool Service::Core::CancelInFlight(const std::string& id) {
  std::lock_guard lock(store_mu);
  auto it = in_flight.find(id);
  if (it == in_flight.end()) return false;
  it->second.stream->Cancel();
  return true;
}

std::optional<Json> BodyForServedModel(const Service::Core& core, const HttpRequest& request,
                                       ResponseSink& sink, ApiFlavor flavor) {
  auto body = ParseBody(request.body);
  if (!body.ok()) {
    SendError(sink, FromStatus(body.status()), flavor);
    return std::nullopt;
  }
  auto model = OptString(*body, "model");
  if (!model.ok()) {
    SendError(sink, FromStatus(model.status()), flavor);
    return std::nullopt;
  }
  if (!core.KnownModel(*model, flavor)) {
    SendError(sink, core.UnknownModel(**model), flavor);
    return std::nullopt;
  }
  return std::move(body).value();
}

ApiError GenerationFailed(const Status& error) {
  ApiError e;
  e.status = 500;
  e.message = error.ok() ? "generation failed" : error.message();
  return e;
}

}  // namespace dsinfer::server
