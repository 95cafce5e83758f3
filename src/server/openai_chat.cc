// POST /v1/chat/completions and POST /v1/completions (OpenAI wire format, DeepSeek extras:
// reasoning_content, prompt_cache_hit_tokens / prompt_cache_miss_tokens, finish_reason
// "aborted"). Stream shapes: serving-protocols.md §2.5 "Chat Completions stream" and §3.2.
#include "server/service_core.h"
#include "text/chat_json.h"

namespace dsinfer::server {
namespace {

std::string ChatFinishReason(const SampleOutput& s) {
  if (s.stopped_by_sequence) return "stop";
  switch (s.engine_finish) {
    case runtime::FinishReason::kLength:
      return "length";
    case runtime::FinishReason::kCancelled:
      return "aborted";
    case runtime::FinishReason::kError:
      return "error";
    default:
      return s.tool_calls.empty() ? "stop" : "tool_calls";
  }
}

int64_t ReasoningTokens(const Generation& g) {
  int64_t n = 0;
  for (const auto& s : g.samples()) n += s.reasoning_tokens;
  return n;
}

Json ChatUsage(const runtime::Usage& u, int64_t reasoning_tokens) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
              {"prompt_cache_hit_tokens", u.cached_prompt_tokens},
              {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_prompt_tokens}};
}

Json ChatLogprobEntries(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps) {
  Json content = Json::array();
  for (const auto& lp : lps) {
    Json top = Json::array();
    for (const auto& [id, value] : lp.top)
      top.push_back(
          {{"token", TokenText(tok, id)}, {"logprob", value}, {"bytes", TokenBytes(tok, id)}});
    content.push_back({{"token", TokenText(tok, lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", TokenBytes(tok, lp.token)},
                       {"top_logprobs", top}});
  }
  return content;
}

std::string ToolCallId(const std::string& response_id, int index) {
  return "call_" + response_id + "_" + std::to_string(index);
}

// Common request-level options of both endpoints.
struct StreamOptions {
  bool stream = false;
  bool include_usage = false;
};

Result<StreamOptions> ParseStreamOptions(const Json& body) {
  StreamOptions out;
  DSINFER_ASSIGN_OR_RETURN(auto stream, OptBool(body, "stream"));
  out.stream = stream.value_or(false);
  auto it = body.find("stream_options");
  if (it != body.end() && !it->is_null()) {
    if (!out.stream) return InvalidArgument("stream_options: only allowed when stream is true");
    if (!it->is_object()) return InvalidArgument("stream_options: must be an object");
    DSINFER_ASSIGN_OR_RETURN(auto usage, OptBool(*it, "include_usage"));
    out.include_usage = usage.value_or(false);
  }
  return out;
}

class ChatStream final : public GenerationObserver {
 public:
  ChatStream(Service::Core& core, ResponseSink& sink, std::string id, bool thinking,
             bool include_usage, bool logprobs)
      : core_(core),
        sink_(sink),
        id_(std::move(id)),
        created_(UnixNow()),
        thinking_(thinking),
        include_usage_(include_usage),
        logprobs_(logprobs) {}
  void set_generation(const Generation* g) { generation_ = g; }

  Json Chunk(Json choices) const {
    Json chunk = {{"id", id_},
                  {"object", "chat.completion.chunk"},
                  {"created", created_},
                  {"model", core_.options.served_model_name},
                  {"system_fingerprint", "fp_dsinfer"},
                  {"choices", std::move(choices)}};
    if (include_usage_) chunk["usage"] = nullptr;
    return chunk;
  }
  bool Write(Json choices) { return sink_.WriteChunk(SseData(Chunk(std::move(choices)))); }
  Json Choice(int index, Json delta, Json logprobs = nullptr, Json finish = nullptr) const {
    return Json{{"index", index},
                {"delta", std::move(delta)},
                {"logprobs", std::move(logprobs)},
                {"finish_reason", std::move(finish)}};
  }

  bool SendRoles(int n) {
    Json choices = Json::array();
    for (int i = 0; i < n; ++i) {
      Json delta =
          thinking_ ? Json{{"role", "assistant"}, {"content", nullptr}, {"reasoning_content", ""}}
                    : Json{{"role", "assistant"}, {"content", ""}};
      choices.push_back(Choice(i, delta));
    }
    return Write(choices);
  }

  bool OnDelta(int index, const OutputDelta& d,
               std::span<const runtime::TokenLogprob> lps) override {
    Json delta;
    Json logprobs = nullptr;
    switch (d.kind) {
      case OutputDelta::Kind::kReasoning:
        delta = {{"content", nullptr}, {"reasoning_content", d.text}};
        break;
      case OutputDelta::Kind::kContent:
        delta = thinking_ ? Json{{"content", d.text}, {"reasoning_content", nullptr}}
                          : Json{{"content", d.text}};
        if (logprobs_) logprobs = {{"content", ChatLogprobEntries(*core_.tokenizer, lps)}};
        break;
      case OutputDelta::Kind::kToolCallStart:
        delta = {
            {"tool_calls", Json::array({{{"index", d.tool_index},
                                         {"id", ToolCallId(id_, d.tool_index)},
                                         {"type", "function"},
                                         {"function", {{"name", d.text}, {"arguments", ""}}}}})}};
        break;
      case OutputDelta::Kind::kToolCallArguments:
        delta = {{"tool_calls",
                  Json::array({{{"index", d.tool_index}, {"function", {{"arguments", d.text}}}}})}};
        break;
    }
    return Write(Json::array({Choice(index, delta, logprobs)}));
  }
  bool OnIdle() override { return sink_.WriteChunk(": keep-alive\n\n"); }
  bool OnSampleDone(int index) override {
    const SampleOutput& s = generation_->samples()[index];
    return Write(Json::array({Choice(index, Json{{"content", ""}}, nullptr, ChatFinishReason(s))}));
  }
  void Finish(GenerationEnd end) {
    if (end == GenerationEnd::kClientGone) return;
    if (end == GenerationEnd::kError) {
      ApiError e = GenerationFailed(generation_->error());
      sink_.WriteChunk(SseData(ErrorBody(e, ApiFlavor::kOpenAI)));
    } else if (include_usage_) {
      Json chunk = Chunk(Json::array());
      chunk["usage"] = ChatUsage(generation_->usage(), ReasoningTokens(*generation_));
      sink_.WriteChunk(SseData(chunk));
    }
    sink_.WriteChunk("data: [DONE]\n\n");
    sink_.EndStream();
  }

 private:
  Service::Core& core_;
  ResponseSink& sink_;
  std::string id_;
  int64_t created_;
  bool thinking_;
  bool include_usage_;
  bool logprobs_;
  const Generation* generation_ = nullptr;
};

}  // namespace

// chat_template_kwargs {"thinking": bool, "reasoning_effort": str} is vLLM/SGLang's spelling of
// the DeepSeek fields; the DeepSeek fields win when both are present.
Status ApplyTemplateKwargs(const Json& body, text::ChatRequest* chat) {
  auto it = body.find("chat_template_kwargs");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return InvalidArgument("chat_template_kwargs: must be an object");
  bool explicit_thinking = body.contains("thinking") && !body["thinking"].is_null();
  for (const char* key : {"thinking", "enable_thinking"}) {
    auto t = it->find(key);
    if (t == it->end() || explicit_thinking) continue;
    if (!t->is_boolean())
      return InvalidArgument(std::string("chat_template_kwargs.") + key + ": must be a boolean");
    chat->thinking = t->get<bool>();
  }
  auto effort = it->find("reasoning_effort");
  if (effort != it->end() && effort->is_string() && !body.contains("reasoning_effort")) {
    std::string e = effort->get<std::string>();
    if (e == "low" || e == "minimal")
      chat->reasoning_effort = text::ReasoningEffort::kLow;
    else if (e == "medium" || e == "high")
      chat->reasoning_effort = text::ReasoningEffort::kHigh;
    else if (e == "xhigh")
      chat->reasoning_effort = text::ReasoningEffort::kXhigh;
    else if (e == "max")
      chat->reasoning_effort = text::ReasoningEffort::kMax;
    else
      return InvalidArgument("chat_template_kwargs.reasoning_effort: unknown value '" + e + "'");
  }
  return Status::Ok();
}

void HandleChatCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  GenerationSpec spec;
  auto body = ParseBody(request.body);
  if (!body.ok()) return SendError(sink, FromStatus(body.status()), flavor);
  auto model = OptString(*body, "model");
  if (!model.ok()) return SendError(sink, FromStatus(model.status()), flavor);
  if (!core.KnownModel(*model, flavor)) return SendError(sink, core.UnknownModel(**model), flavor);
  auto stream_options = ParseStreamOptions(*body);
  if (!stream_options.ok()) return SendError(sink, FromStatus(stream_options.status()), flavor);
  auto n = OptInt(*body, "n");
  if (!n.ok()) return SendError(sink, FromStatus(n.status()), flavor);
  if (n->value_or(1) < 1 || n->value_or(1) > 16)
    return SendError(sink, BadRequest("n: must be in [1, 16]", "n"), flavor);
  auto logprobs = OptBool(*body, "logprobs");
  auto top_logprobs = OptInt(*body, "top_logprobs");
  if (!logprobs.ok()) return SendError(sink, FromStatus(logprobs.status()), flavor);
  if (!top_logprobs.ok()) return SendError(sink, FromStatus(top_logprobs.status()), flavor);
  if (*top_logprobs && (**top_logprobs < 0 || **top_logprobs > 20))
    return SendError(sink, BadRequest("top_logprobs: must be in [0, 20]", "top_logprobs"), flavor);
  if (*top_logprobs && !logprobs->value_or(false))
    return SendError(sink, BadRequest("top_logprobs: requires logprobs to be true", "top_logprobs"),
                     flavor);
  auto max_tokens = OptInt(*body, "max_completion_tokens");
  if (max_tokens.ok() && !*max_tokens) max_tokens = OptInt(*body, "max_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  auto stops = StopSequences(*body, "stop");
  if (!stops.ok()) return SendError(sink, BadRequest(stops.status().message(), "stop"), flavor);
  Status sampling = ParseSampling(*body, &spec.params);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);

  auto chat =
      text::ChatRequestFromJson(request.body, core.model.version, core.options.default_thinking);
  if (!chat.ok()) return SendError(sink, FromStatus(chat.status()), flavor);
  Status kwargs = ApplyTemplateKwargs(*body, &*chat);
  if (!kwargs.ok()) return SendError(sink, FromStatus(kwargs), flavor);
  if (chat->response_format.type == text::ResponseFormatType::kJsonObject) {
    bool mentions_json = false;
    for (const auto& m : chat->messages) {
      std::string lower = m.content;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      mentions_json |= lower.find("json") != std::string::npos;
    }
    if (!mentions_json)
      return SendError(
          sink,
          BadRequest("response_format json_object requires the word 'json' in the messages",
                     "response_format"),
          flavor);
  }
  if (chat->response_format.type == text::ResponseFormatType::kRegex)
    return SendError(sink, Unsupported("response_format regex is not supported", "response_format"),
                     flavor);
  auto encoded = core.EncodeChat(*chat);
  if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), flavor);
  auto resolved_max = core.ResolveMaxTokens(*max_tokens, encoded->ids.size());
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);

  const std::string id = NewId("chatcmpl-");
  spec.params.prompt = std::move(encoded->ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.n = static_cast<int>(n->value_or(1));
  spec.params.top_logprobs =
      logprobs->value_or(false) ? static_cast<int>(top_logprobs->value_or(0)) : -1;
  spec.params.request_id = id;
  spec.thinking = encoded->thinking;
  spec.parse_tools = encoded->has_tools;
  spec.forced_tool_call = encoded->forced_tool_call;
  spec.json_output = encoded->json_output;
  spec.stop = std::move(*stops);
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  Generation& g = **generation;
  const bool want_logprobs = logprobs->value_or(false);

  if (stream_options->stream) {
    ChatStream stream(core, sink, id, encoded->thinking, stream_options->include_usage,
                      want_logprobs);
    stream.set_generation(&g);
    if (!sink.BeginStream(200, "text/event-stream", SseHeaders(id)) ||
        !stream.SendRoles(static_cast<int>(g.samples().size())))
      return;
    stream.Finish(g.Run(&stream, &sink));
    return;
  }
  GenerationEnd end = g.Run(nullptr, &sink);
  if (end == GenerationEnd::kClientGone) return;
  if (end == GenerationEnd::kError) {
    ApiError e = GenerationFailed(g.error());
    return SendError(sink, e, flavor);
  }
  Json choices = Json::array();
  for (size_t i = 0; i < g.samples().size(); ++i) {
    const SampleOutput& s = g.samples()[i];
    Json message = {
        {"role", "assistant"},
        {"content", s.content.empty() && !s.tool_calls.empty() ? Json(nullptr) : Json(s.content)}};
    if (encoded->thinking) message["reasoning_content"] = s.reasoning;
    if (!s.tool_calls.empty()) {
      Json calls = Json::array();
      for (size_t t = 0; t < s.tool_calls.size(); ++t)
        calls.push_back(
            {{"id", ToolCallId(id, static_cast<int>(t))},
             {"type", "function"},
             {"function",
              {{"name", s.tool_calls[t].name}, {"arguments", s.tool_calls[t].arguments}}}});
      message["tool_calls"] = calls;
    }
    Json lp = nullptr;
    if (want_logprobs) lp = {{"content", ChatLogprobEntries(*core.tokenizer, s.logprobs)}};
    choices.push_back({{"index", i},
                       {"message", message},
                       {"logprobs", lp},
                       {"finish_reason", ChatFinishReason(s)}});
  }
  Json response = {{"id", id},
                   {"object", "chat.completion"},
                   {"created", UnixNow()},
                   {"model", core.options.served_model_name},
                   {"system_fingerprint", "fp_dsinfer"},
                   {"choices", choices},
                   {"usage", ChatUsage(g.usage(), ReasoningTokens(g))}};
  SendJson(sink, 200, response, {{"x-request-id", id}});
}

// The /v1/completions prompt: a string, token ids, or a one-element array of either.
Result<std::vector<int32_t>> CompletionPrompt(const Service::Core& core, const Json& body,
                                              std::string* text) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return InvalidArgument("prompt: required");
  Json prompt = *it;
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = prompt[0];
  std::vector<int32_t> ids;
  if (prompt.is_string()) {
    *text = prompt.get<std::string>();
    // No chat template here: the caller writes the whole prompt, special tokens included.
    DSINFER_ASSIGN_OR_RETURN(ids, core.tokenizer->Encode(*text, /*allow_special=*/true));
    auto bos = core.tokenizer->bos_id();
    if (bos && (ids.empty() || ids[0] != *bos)) ids.insert(ids.begin(), *bos);
    return ids;
  }
  if (prompt.is_array()) {
    for (const auto& t : prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= core.tokenizer->vocab_size())
        return InvalidArgument("prompt: token ids must be integers in the vocabulary");
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    if (ids.empty()) return InvalidArgument("prompt: must not be empty");
    DSINFER_ASSIGN_OR_RETURN(*text, core.tokenizer->Decode(ids));
    return ids;
  }
  return InvalidArgument(
      "prompt: must be a string, an array of token ids, or a one-element array of either");
}

namespace {

Json CompletionLogprobs(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps,
                        size_t offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  for (const auto& lp : lps) {
    std::string t = TokenText(tok, lp.token);
    tokens.push_back(t);
    token_logprobs.push_back(lp.logprob);
    Json alternatives = Json::object();
    for (const auto& [id, value] : lp.top) alternatives[TokenText(tok, id)] = value;
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += t.size();
  }
  return Json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top},
              {"text_offset", offsets}};
}

class CompletionStream final : public GenerationObserver {
 public:
  CompletionStream(Service::Core& core, ResponseSink& sink, std::string id, bool include_usage,
                   bool logprobs)
      : core_(core),
        sink_(sink),
        id_(std::move(id)),
        created_(UnixNow()),
        include_usage_(include_usage),
        logprobs_(logprobs) {}
  void set_generation(const Generation* g) {
    generation_ = g;
    offsets_.assign(g->samples().size(), 0);
  }
  Json Chunk(Json choices) const {
    Json c = {{"id", id_},
              {"object", "text_completion"},
              {"created", created_},
              {"model", core_.options.served_model_name},
              {"system_fingerprint", "fp_dsinfer"},
              {"choices", std::move(choices)}};
    if (include_usage_) c["usage"] = nullptr;
    return c;
  }
  bool OnDelta(int index, const OutputDelta& d,
               std::span<const runtime::TokenLogprob> lps) override {
    Json lp = nullptr;
    if (logprobs_) lp = CompletionLogprobs(*core_.tokenizer, lps, offsets_[index]);
    offsets_[index] += d.text.size();
    Json choice = {
        {"index", index}, {"text", d.text}, {"logprobs", lp}, {"finish_reason", nullptr}};
    return sink_.WriteChunk(SseData(Chunk(Json::array({choice}))));
  }
  bool OnIdle() override { return sink_.WriteChunk(": keep-alive\n\n"); }
  bool OnSampleDone(int index) override {
    const SampleOutput& s = generation_->samples()[index];
    Json choice = {{"index", index},
                   {"text", ""},
                   {"logprobs", nullptr},
                   {"finish_reason", ChatFinishReason(s)}};
    return sink_.WriteChunk(SseData(Chunk(Json::array({choice}))));
  }
  void Finish(GenerationEnd end) {
    if (end == GenerationEnd::kClientGone) return;
    if (end == GenerationEnd::kError) {
      ApiError e = GenerationFailed(generation_->error());
      sink_.WriteChunk(SseData(ErrorBody(e, ApiFlavor::kOpenAI)));
    } else if (include_usage_) {
      Json chunk = Chunk(Json::array());
      chunk["usage"] = ChatUsage(generation_->usage(), 0);
      sink_.WriteChunk(SseData(chunk));
    }
    sink_.WriteChunk("data: [DONE]\n\n");
    sink_.EndStream();
  }

 private:
  Service::Core& core_;
  ResponseSink& sink_;
  std::string id_;
  int64_t created_;
  bool include_usage_;
  bool logprobs_;
  const Generation* generation_ = nullptr;
  std::vector<size_t> offsets_;
};

}  // namespace

void HandleCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  GenerationSpec spec;
  auto body = ParseBody(request.body);
  if (!body.ok()) return SendError(sink, FromStatus(body.status()), flavor);
  auto model = OptString(*body, "model");
  if (!model.ok()) return SendError(sink, FromStatus(model.status()), flavor);
  if (!core.KnownModel(*model, flavor)) return SendError(sink, core.UnknownModel(**model), flavor);
  if (body->contains("suffix") && !(*body)["suffix"].is_null())
    return SendError(
        sink, Unsupported("suffix (fill-in-the-middle) is not supported by this model", "suffix"),
        flavor);
  auto stream_options = ParseStreamOptions(*body);
  if (!stream_options.ok()) return SendError(sink, FromStatus(stream_options.status()), flavor);
  auto n = OptInt(*body, "n");
  if (!n.ok()) return SendError(sink, FromStatus(n.status()), flavor);
  if (n->value_or(1) < 1 || n->value_or(1) > 16)
    return SendError(sink, BadRequest("n: must be in [1, 16]", "n"), flavor);
  auto logprobs = OptInt(*body, "logprobs");
  if (!logprobs.ok()) return SendError(sink, FromStatus(logprobs.status()), flavor);
  if (*logprobs && (**logprobs < 0 || **logprobs > 20))
    return SendError(sink, BadRequest("logprobs: must be in [0, 20]", "logprobs"), flavor);
  auto echo = OptBool(*body, "echo");
  if (!echo.ok()) return SendError(sink, FromStatus(echo.status()), flavor);
  auto max_tokens = OptInt(*body, "max_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  auto stops = StopSequences(*body, "stop");
  if (!stops.ok()) return SendError(sink, BadRequest(stops.status().message(), "stop"), flavor);
  Status sampling = ParseSampling(*body, &spec.params);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);
  std::string prompt_text;
  auto ids = CompletionPrompt(core, *body, &prompt_text);
  if (!ids.ok()) return SendError(sink, BadRequest(ids.status().message(), "prompt"), flavor);
  if (core.model.max_model_len > 0 && static_cast<int64_t>(ids->size()) >= core.model.max_model_len)
    return SendError(sink,
                     FromStatus(OutOfRange("the prompt has " + std::to_string(ids->size()) +
                                           " tokens; the maximum context length is " +
                                           std::to_string(core.model.max_model_len))),
                     flavor);
  auto resolved_max = core.ResolveMaxTokens(
      max_tokens->has_value() ? *max_tokens : std::optional<int64_t>(16), ids->size());
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);

  const std::string id = NewId("cmpl-");
  spec.params.prompt = std::move(*ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.n = static_cast<int>(n->value_or(1));
  spec.params.top_logprobs = logprobs->has_value() ? static_cast<int>(**logprobs) : -1;
  spec.params.request_id = id;
  spec.raw_text = true;
  spec.stop = std::move(*stops);
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  Generation& g = **generation;

  if (stream_options->stream) {
    CompletionStream stream(core, sink, id, stream_options->include_usage, logprobs->has_value());
    stream.set_generation(&g);
    if (!sink.BeginStream(200, "text/event-stream", SseHeaders(id))) return;
    if (echo->value_or(false)) {
      for (size_t i = 0; i < g.samples().size(); ++i) {
        OutputDelta d;
        d.text = prompt_text;
        stream.OnDelta(static_cast<int>(i), d, {});
      }
    }
    stream.Finish(g.Run(&stream, &sink));
    return;
  }
  GenerationEnd end = g.Run(nullptr, &sink);
  if (end == GenerationEnd::kClientGone) return;
  if (end == GenerationEnd::kError) {
    ApiError e = GenerationFailed(g.error());
    return SendError(sink, e, flavor);
  }
  Json choices = Json::array();
  for (size_t i = 0; i < g.samples().size(); ++i) {
    const SampleOutput& s = g.samples()[i];
    std::string text = echo->value_or(false) ? prompt_text + s.content : s.content;
    Json lp = nullptr;
    if (logprobs->has_value()) lp = CompletionLogprobs(*core.tokenizer, s.logprobs, 0);
    choices.push_back(
        {{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", ChatFinishReason(s)}});
  }
  Json response = {{"id", id},
                   {"object", "text_completion"},
                   {"created", UnixNow()},
                   {"model", core.options.served_model_name},
                   {"system_fingerprint", "fp_dsinfer"},
                   {"choices", choices},
                   {"usage", ChatUsage(g.usage(), 0)}};
  SendJson(sink, 200, response, {{"x-request-id", id}});
}

}  // namespace dsinfer::server
