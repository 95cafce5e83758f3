// POST /v1/responses (OpenAI Responses API, stateless like DeepSeek's: no previous_response_id),
// streaming events per serving-protocols.md §2.5 "Responses stream" and §3.3. Finished
// responses are kept in memory for GET /v1/responses/{id}; in-flight ones can be cancelled.
#include "server/service_core.h"
#include "server/structured_output.h"
#include "text/chat_json.h"

namespace dsinfer::server {
namespace {

// Text of a content value: a string, or parts joined by blank lines (as the official converter
// joins them). Image and file parts are refused (422).
Result<std::string> PartsText(const Json& content, const std::string& path) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return InvalidArgument(path + ": must be a string or an array of parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    if (!part.is_object()) return InvalidArgument(path + ": parts must be objects");
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(part, "type", path));
    if (type != "input_text" && type != "output_text" && type != "text" &&
        type != "reasoning_text" && type != "summary_text")
      return Unimplemented(path + ": unsupported content part type '" + type + "'");
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return InvalidArgument(path + ": part text must be a string");
    if (i) out += "\n\n";
    out += text->get<std::string>();
  }
  return out;
}

}  // namespace

// Responses request -> the OpenAI chat shape the text layer understands, following
// deepseek-recipe's ResponsesRequest conversion: `instructions` is the first system message;
// developer messages are user messages for V4 and system messages for V4.1; assistant output up to
// the next other item is one assistant message (texts joined by blank lines, empty ones skipped;
// function calls after them), except that a reasoning item, or text after a function call, starts a
// new one; a reasoning item no assistant output follows is an assistant message of its own;
// consecutive reasoning items join by newlines, empty ones are skipped; a reasoning item's summary
// is not its reasoning.
Result<Json> ResponsesToChatJson(const Json& body, text::ModelVersion version) {
  const char* developer_role = version == text::ModelVersion::kV41 ? "system" : "user";
  Json messages = Json::array();
  auto instructions = body.find("instructions");
  if (instructions != body.end() && !instructions->is_null()) {
    if (!instructions->is_string()) return InvalidArgument("instructions: must be a string");
    // Empty instructions are no system message; an empty system message in the input is one.
    if (!instructions->get<std::string>().empty())
      messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) return InvalidArgument("input: required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    if (input->empty()) return InvalidArgument("input: must not be empty");
    std::optional<std::string> pending_reasoning;
    bool assistant_open = false;  // messages.back() takes more assistant output
    auto open_assistant = [&]() -> Json& {
      if (!assistant_open) {
        messages.push_back({{"role", "assistant"}, {"content", ""}});
        assistant_open = true;
      }
      Json& m = messages.back();
      if (pending_reasoning) {
        m["reasoning_content"] = *pending_reasoning;
        pending_reasoning.reset();
      }
      return m;
    };
    // Reasoning that no assistant output took becomes an assistant message of its own.
    auto close_assistant = [&] {
      if (pending_reasoning) open_assistant();
      assistant_open = false;
    };
    for (size_t i = 0; i < input->size(); ++i) {
      const Json& item = (*input)[i];
      const std::string path = "input[" + std::to_string(i) + "]";
      if (!item.is_object()) return InvalidArgument(path + ": must be an object");
      DSINFER_ASSIGN_OR_RETURN(
          std::string type,
          StringField(item, "type", path, item.contains("role") ? "message" : ""));
      if (type == "message") {
        DSINFER_ASSIGN_OR_RETURN(std::string role, StringField(item, "role", path));
        DSINFER_ASSIGN_OR_RETURN(std::string text,
                                 PartsText(item.value("content", Json()), path + ".content"));
        if (role == "assistant") {
          if (assistant_open && messages.back().contains("tool_calls")) close_assistant();
          Json& m = open_assistant();
          std::string content = m["content"];
          m["content"] = content.empty() || text.empty() ? content + text : content + "\n\n" + text;
        } else if (role == "user" || role == "developer" || role == "system") {
          close_assistant();
          messages.push_back(
              {{"role", role == "developer" ? developer_role : role}, {"content", text}});
        } else {
          return InvalidArgument(path + ".role: unknown role '" + role + "'");
        }
      } else if (type == "reasoning") {
        std::string text;
        if (item.contains("content") && !item["content"].is_null()) {
          DSINFER_ASSIGN_OR_RETURN(text, PartsText(item["content"], path + ".content"));
        }
        if (text.empty()) continue;
        if (assistant_open) close_assistant();
        pending_reasoning = pending_reasoning ? *pending_reasoning + "\n" + text : text;
      } else if (type == "function_call") {
        if (!item.contains("name") || !item["name"].is_string())
          return InvalidArgument(path + ".name: must be a string");
        std::string args = item.contains("arguments") && item["arguments"].is_string()
                               ? item["arguments"].get<std::string>()
                               : "{}";
        DSINFER_ASSIGN_OR_RETURN(std::string call_id, StringField(item, "call_id", path));
        Json& m = open_assistant();
        if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
        m["tool_calls"].push_back({{"id", call_id},
                                   {"type", "function"},
                                   {"function", {{"name", item["name"]}, {"arguments", args}}}});
      } else if (type == "function_call_output") {
        std::string output;
        if (item.contains("output")) {
          if (item["output"].is_string()) {
            output = item["output"].get<std::string>();
          } else {
            DSINFER_ASSIGN_OR_RETURN(output, PartsText(item["output"], path + ".output"));
          }
        }
        DSINFER_ASSIGN_OR_RETURN(std::string call_id, StringField(item, "call_id", path));
        close_assistant();
        messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
      } else {
        return InvalidArgument(path + ".type: unsupported input item type '" + type + "'");
      }
    }
    close_assistant();
  } else {
    return InvalidArgument("input: must be a string or an array of items");
  }
  Json chat = {{"messages", messages}};
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return InvalidArgument("tools: must be an array");
    Json converted = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string tpath = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return InvalidArgument(tpath + ": must be an object");
      DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(t, "type", tpath));
      if (type != "function") return Unimplemented("tools: only function tools are supported");
      DSINFER_ASSIGN_OR_RETURN(std::string name, StringField(t, "name", tpath));
      Json fn = {{"name", name}};
      if (t.contains("description")) fn["description"] = t["description"];
      if (t.contains("parameters")) fn["parameters"] = t["parameters"];
      converted.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = converted;
  }
  auto choice = body.find("tool_choice");
  if (choice != body.end() && !choice->is_null()) {
    if (choice->is_object() && choice->contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    else
      chat["tool_choice"] = *choice;
  }
  auto reasoning = body.find("reasoning");
  if (reasoning != body.end() && reasoning->is_object() && reasoning->contains("effort") &&
      !(*reasoning)["effort"].is_null())
    chat["reasoning_effort"] = (*reasoning)["effort"];
  // The official converter reads thinking from reasoning.effort only ("none" disables it); a
  // `thinking` field would be ignored there, so it is refused here rather than rendered
  // differently.
  if (body.contains("thinking") && !body["thinking"].is_null())
    return InvalidArgument(
        "thinking: not a Responses field; use reasoning.effort \"none\" to disable thinking");
  auto text = body.find("text");
  if (text != body.end() && text->is_object() && text->contains("format") &&
      (*text)["format"].is_object()) {
    const Json& format = (*text)["format"];
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(format, "type", "text.format", "text"));
    if (type == "json_schema")
      chat["response_format"] = {
          {"type", "json_schema"},
          {"json_schema",
           {{"schema", format.value("schema", Json::object())},
            {"strict", format.contains("strict") ? format["strict"] : Json(nullptr)}}}};
    else
      chat["response_format"] = {{"type", type}};
  }
  return chat;
}

namespace {

// The request's field as given (HandleResponses checked its type), or `fallback` when it is
// absent or null, or when `object` is not an object: for echoing fields into the response.
Json Echo(const Json& object, const char* key, Json fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? fallback : *it;
}

Json ResponseUsage(const runtime::Usage& u, int64_t reasoning_tokens) {
  return Json{{"input_tokens", u.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
              {"output_tokens", u.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

// Builds the response object and its output items as the generation proceeds.
class ResponseBuilder final : public GenerationObserver {
 public:
  ResponseBuilder(Service::Core& core, ResponseSink* sink, std::string id, const Json& request)
      : sink_(sink), id_(std::move(id)) {
    response_ = {{"id", id_},
                 {"object", "response"},
                 {"created_at", UnixNow()},
                 {"status", "in_progress"},
                 {"error", nullptr},
                 {"incomplete_details", nullptr},
                 {"instructions", request.value("instructions", Json())},
                 {"max_output_tokens", request.value("max_output_tokens", Json())},
                 {"model", core.options.served_model_name},
                 {"output", Json::array()},
                 {"parallel_tool_calls", Echo(request, "parallel_tool_calls", true)},
                 {"previous_response_id", nullptr},
                 {"reasoning",
                  {{"effort", Echo(Echo(request, "reasoning", Json()), "effort", Json())},
                   {"summary", nullptr}}},
                 {"store", Echo(request, "store", true)},
                 {"temperature", request.value("temperature", Json(1.0))},
                 {"text", {{"format", {{"type", "text"}}}}},
                 {"tool_choice", request.value("tool_choice", Json("auto"))},
                 {"tools", request.value("tools", Json::array())},
                 {"top_p", request.value("top_p", Json(1.0))},
                 {"truncation", "disabled"},
                 {"usage", nullptr},
                 {"metadata", request.value("metadata", Json::object())}};
  }
  const Json& response() const { return response_; }
  Json& mutable_response() { return response_; }

  bool Emit(const std::string& type, Json event) {
    if (!sink_) return true;
    event["type"] = type;
    event["sequence_number"] = sequence_++;
    Json ordered = {{"type", type}, {"sequence_number", event["sequence_number"]}};
    for (auto& [k, v] : event.items())
      if (k != "type" && k != "sequence_number") ordered[k] = v;
    return sink_->WriteChunk(SseEvent(type, ordered));
  }
  bool Start() {
    return Emit("response.created", {{"response", response_}}) &&
           Emit("response.in_progress", {{"response", response_}});
  }

  bool OnDelta(int, const OutputDelta& d, std::span<const runtime::TokenLogprob>) override {
    using K = OutputDelta::Kind;
    std::string want = d.kind == K::kReasoning ? "reasoning"
                       : d.kind == K::kContent ? "message"
                                               : "function_call";
    bool ok = true;
    if (d.kind == K::kToolCallStart || current_ != want) {
      ok = CloseItem();
      ok = ok && OpenItem(want, d);
    }
    if (d.kind == K::kToolCallStart) return ok;
    Json& item = response_["output"].back();
    const int index = static_cast<int>(response_["output"].size()) - 1;
    if (d.kind == K::kReasoning) {
      item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.text;
      return ok && Emit("response.reasoning_text.delta", {{"item_id", item["id"]},
                                                          {"output_index", index},
                                                          {"content_index", 0},
                                                          {"delta", d.text}});
    }
    if (d.kind == K::kContent) {
      item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.text;
      return ok && Emit("response.output_text.delta", {{"item_id", item["id"]},
                                                       {"output_index", index},
                                                       {"content_index", 0},
                                                       {"delta", d.text},
                                                       {"logprobs", Json::array()}});
    }
    item["arguments"] = item["arguments"].get<std::string>() + d.text;
    return ok && Emit("response.function_call_arguments.delta",
                      {{"item_id", item["id"]}, {"output_index", index}, {"delta", d.text}});
  }
  bool OnIdle() override { return sink_ ? sink_->WriteChunk(": keep-alive\n\n") : true; }

  bool OpenItem(const std::string& kind, const OutputDelta& d) {
    current_ = kind;
    const int index = static_cast<int>(response_["output"].size());
    const std::string suffix = id_ + "_" + std::to_string(index);
    Json item, part;
    if (kind == "reasoning") {
      item = {{"id", "rs_" + suffix},
              {"type", "reasoning"},
              {"status", "in_progress"},
              {"summary", Json::array()},
              {"content", Json::array()}};
      part = {{"type", "reasoning_text"}, {"text", ""}};
    } else if (kind == "message") {
      item = {{"id", "msg_" + suffix},
              {"type", "message"},
              {"role", "assistant"},
              {"status", "in_progress"},
              {"content", Json::array()}};
      part = {{"type", "output_text"},
              {"text", ""},
              {"annotations", Json::array()},
              {"logprobs", Json::array()}};
    } else {
      item = {{"id", "fc_" + suffix},
              {"type", "function_call"},
              {"status", "in_progress"},
              {"call_id", "call_" + id_ + "_" + std::to_string(tool_calls_++)},
              {"name", d.text},
              {"arguments", ""}};
    }
    bool ok = Emit("response.output_item.added", {{"output_index", index}, {"item", item}});
    if (!part.is_null()) {
      item["content"].push_back(part);
      ok = ok && Emit("response.content_part.added", {{"item_id", item["id"]},
                                                      {"output_index", index},
                                                      {"content_index", 0},
                                                      {"part", part}});
    }
    response_["output"].push_back(item);
    return ok;
  }

  // Whether the output holds a message or a function call (reasoning alone answers nothing).
  bool HasAnswerItem() const {
    for (const auto& item : response_["output"])
      if (item["type"] == "message" || item["type"] == "function_call") return true;
    return false;
  }

  bool CloseItem() {
    if (current_.empty()) return true;
    Json& item = response_["output"].back();
    const int index = static_cast<int>(response_["output"].size()) - 1;
    item["status"] = "completed";
    bool ok = true;
    if (current_ == "reasoning" || current_ == "message") {
      Json part = item["content"][0];
      const std::string text = part["text"];
      if (current_ == "reasoning") {
        ok = Emit("response.reasoning_text.done", {{"item_id", item["id"]},
                                                   {"output_index", index},
                                                   {"content_index", 0},
                                                   {"text", text}});
      } else {
        ok = Emit("response.output_text.done", {{"item_id", item["id"]},
                                                {"output_index", index},
                                                {"content_index", 0},
                                                {"text", text},
                                                {"logprobs", Json::array()}});
      }
      ok = ok && Emit("response.content_part.done", {{"item_id", item["id"]},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"part", part}});
    } else {
      ok = Emit(
          "response.function_call_arguments.done",
          {{"item_id", item["id"]}, {"output_index", index}, {"arguments", item["arguments"]}});
    }
    ok = ok && Emit("response.output_item.done", {{"output_index", index}, {"item", item}});
    current_.clear();
    return ok;
  }

  // Closes the open item and sets the final status and usage.
  void Complete(const Generation& g, GenerationEnd end) {
    CloseItem();
    const bool finished = end != GenerationEnd::kCancelled && end != GenerationEnd::kClientGone &&
                          end != GenerationEnd::kError;
    if (finished && !HasAnswerItem()) {
      // The model stopped before any text or tool call (its first token was a stop token, or it
      // only reasoned): the answer is an empty message, as OpenAI's API returns it, rather than
      // no message at all (clients read output[...].content of the message they expect).
      OpenItem("message", OutputDelta{});
      CloseItem();
    }
    const SampleOutput& s = g.samples()[0];
    int64_t reasoning_tokens = s.reasoning_tokens;
    response_["usage"] = ResponseUsage(g.usage(), reasoning_tokens);
    response_["completed_at"] = UnixNow();
    if (end == GenerationEnd::kCancelled || end == GenerationEnd::kClientGone) {
      response_["status"] = "cancelled";
    } else if (end == GenerationEnd::kError) {
      response_["status"] = "failed";
      response_["error"] = {{"code", "server_error"},
                            {"message", GenerationFailed(g.error()).message}};
    } else if (s.engine_finish == runtime::FinishReason::kLength && !s.stopped_by_sequence) {
      response_["status"] = "incomplete";
      response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
    } else {
      response_["status"] = "completed";
    }
    // A message followed by a tool call is commentary, not the final answer.
    for (auto& item : response_["output"])
      if (item["type"] == "message")
        item["phase"] = s.tool_calls == 0 ? "final_answer" : "commentary";
  }

 private:
  ResponseSink* sink_;
  std::string id_;
  Json response_;
  std::string current_;  // type of the open output item ("" when none)
  int64_t sequence_ = 0;
  int tool_calls_ = 0;
};

}  // namespace

void HandleResponses(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  GenerationSpec spec;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body || RefuseKvTransferParams(*body, sink, flavor)) return;
  if (body->contains("previous_response_id") && !(*body)["previous_response_id"].is_null())
    return SendError(sink,
                     Unsupported("previous_response_id is not supported (stateless Responses API)",
                                 "previous_response_id"),
                     flavor);
  auto stream = OptBool(*body, "stream");
  if (!stream.ok()) return SendError(sink, FromStatus(stream.status()), flavor);
  for (const char* flag : {"store", "parallel_tool_calls"}) {
    auto value = OptBool(*body, flag);
    if (!value.ok()) return SendError(sink, FromStatus(value.status()), flavor);
  }
  auto max_tokens = OptInt(*body, "max_output_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  Status sampling = ParseGenerationFields(*body, &spec);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);
  auto chat_json = ResponsesToChatJson(*body, core.model.version);
  if (!chat_json.ok()) return SendError(sink, FromStatus(chat_json.status()), flavor);
  auto chat =
      text::ChatRequestFromJsonValue(*chat_json, core.model.version, core.options.default_thinking,
                                     /*keep_empty_system=*/true);
  if (!chat.ok()) return SendError(sink, FromStatus(chat.status()), flavor);
  auto encoded = core.EncodeChat(*chat);
  if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), flavor);
  auto resolved_max =
      core.ResolveMaxTokens(*max_tokens, encoded->ids.size(), core.DefaultMaxTokens(*encoded));
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);

  auto parallel_calls = OptBool(*body, "parallel_tool_calls");  // a bool: checked above
  auto tool_grammar = ToolCallGrammarSpec(
      *chat, encoded->forced_tool_call ? ToolCallForcing::kPromptOpened : ToolCallForcing::kNone,
      !parallel_calls.ok() || parallel_calls->value_or(true));
  if (!tool_grammar.ok()) return SendError(sink, FromStatus(tool_grammar.status()), flavor);
  Status structured = AttachStructuredOutput(core, *chat_json, encoded->thinking, &spec,
                                             std::move(*tool_grammar));
  if (!structured.ok()) return SendError(sink, FromStatus(structured), flavor);

  const std::string id = NewId("resp_");
  spec.params.prompt = std::move(encoded->ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.request_id = id;
  spec.thinking = encoded->thinking;
  spec.parse_tools = encoded->has_tools;
  spec.forced_tool_call = encoded->forced_tool_call;
  spec.json_output = encoded->json_output;
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  Generation& g = **generation;

  const bool streaming = stream->value_or(false);
  ResponseBuilder builder(core, streaming ? &sink : nullptr, id, *body);
  core.TrackInFlight(id, g.stream(), builder.response());
  if (streaming) {
    if (!sink.BeginStream(200, "text/event-stream", SseHeaders(id)) || !builder.Start()) {
      core.UntrackInFlight(id);
      return;
    }
  }
  GenerationEnd end = g.Run(builder, &sink);
  builder.Complete(g, end);
  core.StoreResponse(id, builder.response());
  core.UntrackInFlight(id);
  if (end == GenerationEnd::kClientGone) return;
  if (streaming) {
    const std::string status = builder.response()["status"];
    const std::string event = status == "completed"    ? "response.completed"
                              : status == "incomplete" ? "response.incomplete"
                              : status == "failed"     ? "response.failed"
                                                       : "response.cancelled";
    builder.Emit(event == "response.cancelled" ? "response.failed" : event,
                 {{"response", builder.response()}});
    sink.EndStream();
    return;
  }
  if (end == GenerationEnd::kError) {
    ApiError e = GenerationFailed(g.error());
    return SendError(sink, e, flavor);
  }
  SendJson(sink, 200, builder.response(), {{"x-request-id", id}});
}

}  // namespace dsinfer::server
