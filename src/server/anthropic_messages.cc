// POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages API as DeepSeek's
// Anthropic endpoint serves it: claude-* model names map to the served model, x-api-key or
// Bearer auth, anthropic-version ignored). Events per serving-protocols.md §2.5 and §3.4.
#include "server/service_core.h"
#include "server/structured_output.h"
#include "text/chat_json.h"

namespace dsinfer::server {
namespace {

// What deepseek-recipe's Messages converter writes for a document block it cannot read.
Result<std::string> DocumentText(const Json& block, const std::string& path) {
  const Json* source = block.contains("source") ? &block["source"] : nullptr;
  DSINFER_ASSIGN_OR_RETURN(
      std::string media_type,
      StringField(source ? *source : Json(), "media_type", path + ".source", "unknown"));
  return "[Unsupported document type: " + media_type + "]";
}

// Text of a block list (text and document blocks), joined by blank lines as the official
// converter joins them; an image is refused (422).
Result<std::string> BlocksText(const Json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return InvalidArgument(path + ": must be a string or an array of blocks");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& block = content[i];
    const std::string bpath = path + "[" + std::to_string(i) + "]";
    if (!block.is_object()) return InvalidArgument(bpath + ": must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(block, "type", bpath));
    if (i) out += "\n\n";
    if (type == "text") {
      if (!block.contains("text") || !block["text"].is_string())
        return InvalidArgument(bpath + ".text: must be a string");
      out += block["text"].get<std::string>();
    } else if (type == "document") {
      DSINFER_ASSIGN_OR_RETURN(std::string text, DocumentText(block, bpath));
      out += text;
    } else if (type == "image") {
      return Unimplemented(bpath + ": image input is not supported by this model");
    } else {
      return InvalidArgument(bpath + ": unsupported block type '" + type + "'");
    }
  }
  return out;
}

Json AnthropicUsage(const runtime::Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens - u.cached_prompt_tokens},
              {"output_tokens", u.completion_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", u.cached_prompt_tokens}};
}

std::string StopReason(const SampleOutput& s) {
  if (s.stopped_by_sequence) return "stop_sequence";
  if (s.engine_finish == runtime::FinishReason::kLength) return "max_tokens";
  if (s.tool_calls > 0) return "tool_use";
  return "end_turn";
}

// A tool call's input object: its arguments when they are a JSON object; otherwise (truncated or
// malformed arguments) the raw text under "arguments", so nothing the model wrote is lost.
Json ToolInput(const std::string& arguments) {
  Json input = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded() || !input.is_object()) input = Json{{"arguments", arguments}};
  return input;
}

// The Messages result builder: the content blocks (thinking, text, tool_use) as they arrive;
// streaming, also their events. A tool_use block's input is sent whole when the block closes
// (one input_json_delta), because only then is it known whether the arguments form a JSON
// object: the stream and the final message then carry the same input.
class MessageResult final : public GenerationObserver {
 public:
  MessageResult(ResponseSink& sink, bool streaming, std::string id, std::string model)
      : sink_(sink), streaming_(streaming), id_(std::move(id)), model_(std::move(model)) {}
  void set_generation(const Generation* g) { generation_ = g; }

  // Streaming: the head and message_start. The cache split is known only once the engine
  // schedules the prompt; message_delta carries it.
  bool Begin(int64_t prompt_tokens) {
    if (!streaming_) return true;
    if (!sink_.BeginStream(200, "text/event-stream", SseHeaders(id_))) return false;
    Json usage = {{"input_tokens", prompt_tokens},
                  {"output_tokens", 1},
                  {"cache_creation_input_tokens", 0},
                  {"cache_read_input_tokens", 0}};
    Json message = {{"id", id_},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", model_},
                    {"content", Json::array()},
                    {"stop_reason", nullptr},
                    {"stop_sequence", nullptr},
                    {"usage", usage}};
    return Event("message_start", {{"message", message}});
  }

  bool OnDelta(int, const OutputDelta& d, std::span<const runtime::TokenLogprob>) override {
    using K = OutputDelta::Kind;
    const std::string want = d.kind == K::kReasoning ? "thinking"
                             : d.kind == K::kContent ? "text"
                                                     : "tool_use";
    bool ok = true;
    if (d.kind == K::kToolCallStart || open_ != want) {
      ok = CloseBlock();
      Json block;
      if (want == "thinking")
        block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
      else if (want == "text")
        block = {{"type", "text"}, {"text", ""}};
      else
        block = {{"type", "tool_use"},
                 {"id", ToolId(d.tool_index)},
                 {"name", d.text},
                 {"input", Json::object()}};
      ok = ok && OpenBlock(block);
    }
    if (d.kind == K::kToolCallStart) return ok;
    Json& block = content_.back();
    const int index = static_cast<int>(content_.size()) - 1;
    if (d.kind == K::kToolCallArguments) {
      arguments_ += d.text;
      return ok;
    }
    const char* field = d.kind == K::kReasoning ? "thinking" : "text";
    block[field] = block[field].get<std::string>() + d.text;
    Json delta = d.kind == K::kReasoning ? Json{{"type", "thinking_delta"}, {"thinking", d.text}}
                                         : Json{{"type", "text_delta"}, {"text", d.text}};
    return ok && Event("content_block_delta", {{"index", index}, {"delta", delta}});
  }

  bool OnIdle() override { return Event("ping", Json::object()); }

  // Closes the open block; when a finished answer has neither text nor a tool call (the model
  // stopped at once, or only reasoned), adds an empty text block, as the API's clients expect one.
  void Complete(GenerationEnd end) {
    CloseBlock();
    if (end == GenerationEnd::kError) return;
    for (const auto& block : content_)
      if (block["type"] != "thinking") return;
    OpenBlock({{"type", "text"}, {"text", ""}});
    CloseBlock();
  }

  Json StopSequence(const SampleOutput& s) const {
    return s.stopped_by_sequence ? Json(s.stop_sequence) : Json(nullptr);
  }

  // Streaming: message_delta and message_stop, or the error event.
  void FinishStream(GenerationEnd end) {
    if (end == GenerationEnd::kError) {
      sink_.WriteChunk(SseEvent(
          "error", ErrorBody(GenerationFailed(generation_->error()), ApiFlavor::kAnthropic)));
      sink_.EndStream();
      return;
    }
    const SampleOutput& s = generation_->samples()[0];
    Event("message_delta",
          {{"delta", {{"stop_reason", StopReason(s)}, {"stop_sequence", StopSequence(s)}}},
           {"usage", AnthropicUsage(generation_->usage())}});
    Event("message_stop", Json::object());
    sink_.EndStream();
  }

  Json Response() const {
    const SampleOutput& s = generation_->samples()[0];
    return Json{{"id", id_},
                {"type", "message"},
                {"role", "assistant"},
                {"model", model_},
                {"content", content_},
                {"stop_reason", StopReason(s)},
                {"stop_sequence", StopSequence(s)},
                {"usage", AnthropicUsage(generation_->usage())}};
  }

 private:
  bool Event(const std::string& type, Json data) {
    if (!streaming_) return true;
    Json ordered = {{"type", type}};
    for (auto& [k, v] : data.items()) ordered[k] = v;
    return sink_.WriteChunk(SseEvent(type, ordered));
  }

  bool OpenBlock(Json block) {
    open_ = block["type"];
    content_.push_back(std::move(block));
    const int index = static_cast<int>(content_.size()) - 1;
    bool ok = Event("content_block_start", {{"index", index}, {"content_block", content_.back()}});
    if (open_ == "thinking") ok = ok && Event("ping", Json::object());
    return ok;
  }

  bool CloseBlock() {
    if (open_.empty()) return true;
    Json& block = content_.back();
    const int index = static_cast<int>(content_.size()) - 1;
    bool ok = true;
    if (open_ == "thinking") {
      // Clients send thinking blocks back with their signature; ours is the message id.
      block["signature"] = id_;
      ok = Event("content_block_delta",
                 {{"index", index}, {"delta", {{"type", "signature_delta"}, {"signature", id_}}}});
    } else if (open_ == "tool_use") {
      block["input"] = ToolInput(arguments_);
      arguments_.clear();
      ok = Event(
          "content_block_delta",
          {{"index", index},
           {"delta", {{"type", "input_json_delta"}, {"partial_json", Dump(block["input"])}}}});
    }
    ok = ok && Event("content_block_stop", {{"index", index}});
    open_.clear();
    return ok;
  }

  std::string ToolId(int index) const {
    return "toolu_" + id_.substr(4) + "_" + std::to_string(index);
  }

  ResponseSink& sink_;
  const bool streaming_;
  const std::string id_;
  const std::string model_;
  const Generation* generation_ = nullptr;
  Json content_ = Json::array();
  std::string open_;       // type of the open content block ("" when none)
  std::string arguments_;  // the open tool_use block's arguments so far
};

}  // namespace

// Follows deepseek-recipe's MessagesRequest conversion: text blocks joined by blank lines, a
// user message's tool_result blocks first (as tool messages) and its other blocks after them,
// tool_choice "any" as "auto" (the converter forces only a named tool; the tool-call grammar then
// makes the output a call: EncodeMessages), thinking "adaptive" as
// enabled.
Result<Json> MessagesToChatJson(const Json& body, bool default_thinking) {
  (void)default_thinking;
  Json messages = Json::array();
  auto system = body.find("system");
  if (system != body.end() && !system->is_null()) {
    DSINFER_ASSIGN_OR_RETURN(std::string text, BlocksText(*system, "system"));
    messages.push_back({{"role", "system"}, {"content", text}});
  }
  auto input = body.find("messages");
  if (input == body.end() || !input->is_array())
    return InvalidArgument("messages: must be an array");
  if (input->empty()) return InvalidArgument("messages: must not be empty");
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& msg = (*input)[i];
    const std::string path = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return InvalidArgument(path + ": must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string role, StringField(msg, "role", path));
    if (role != "user" && role != "assistant")
      return InvalidArgument(path + ".role: must be user or assistant");
    auto content = msg.find("content");
    if (content == msg.end()) return InvalidArgument(path + ".content: required");
    if (content->is_string()) {
      messages.push_back({{"role", role}, {"content", *content}});
      continue;
    }
    if (!content->is_array())
      return InvalidArgument(path + ".content: must be a string or an array of blocks");
    if (content->empty()) return InvalidArgument(path + ".content: must not be empty");
    std::string text, reasoning;
    bool has_text = false, has_reasoning = false;
    Json tool_calls = Json::array();
    for (size_t b = 0; b < content->size(); ++b) {
      const Json& block = (*content)[b];
      const std::string bpath = path + ".content[" + std::to_string(b) + "]";
      if (!block.is_object()) return InvalidArgument(bpath + ": must be an object");
      DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(block, "type", bpath));
      std::string piece;
      if (type == "text") {
        if (!block.contains("text") || !block["text"].is_string())
          return InvalidArgument(bpath + ".text: must be a string");
        piece = block["text"].get<std::string>();
      } else if (type == "document") {
        DSINFER_ASSIGN_OR_RETURN(piece, DocumentText(block, bpath));
      } else if (type == "image") {
        return Unimplemented(bpath + ": image input is not supported by this model");
      } else if (type == "thinking" && role == "assistant") {
        DSINFER_ASSIGN_OR_RETURN(std::string thinking, StringField(block, "thinking", bpath));
        reasoning += thinking;
        has_reasoning = true;  // any signature is accepted: they are not portable
        continue;
      } else if (type == "tool_use" && role == "assistant") {
        if (!block.contains("name") || !block["name"].is_string())
          return InvalidArgument(bpath + ".name: must be a string");
        Json input_obj = block.value("input", Json::object());
        if (!input_obj.is_object()) return InvalidArgument(bpath + ".input: must be an object");
        DSINFER_ASSIGN_OR_RETURN(std::string id, StringField(block, "id", bpath));
        tool_calls.push_back(
            {{"id", id},
             {"type", "function"},
             {"function", {{"name", block["name"]}, {"arguments", Dump(input_obj)}}}});
        continue;
      } else if (type == "tool_result" && role == "user") {
        if (has_text)
          return InvalidArgument(bpath + ": tool_result blocks must come before other content");
        std::string result;
        if (block.contains("content") && !block["content"].is_null()) {
          DSINFER_ASSIGN_OR_RETURN(result, BlocksText(block["content"], bpath + ".content"));
        }
        DSINFER_ASSIGN_OR_RETURN(std::string tool_use_id, StringField(block, "tool_use_id", bpath));
        messages.push_back({{"role", "tool"}, {"tool_call_id", tool_use_id}, {"content", result}});
        continue;
      } else {
        return InvalidArgument(bpath + ": unsupported block type '" + type + "' in a " + role +
                               " message");
      }
      if (has_text) text += "\n\n";
      text += piece;
      has_text = true;
    }
    if (role == "user" && !has_text) continue;  // only tool results
    Json out = {{"role", role}, {"content", text}};
    if (has_reasoning) out["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) out["tool_calls"] = tool_calls;
    messages.push_back(out);
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
      DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(t, "type", tpath, "custom"));
      if (type.rfind("web_search", 0) == 0)
        return Unimplemented(tpath + ": server tools (web_search) are not supported");
      DSINFER_ASSIGN_OR_RETURN(std::string name, StringField(t, "name", tpath));
      Json fn = {{"name", name}};
      if (t.contains("description")) fn["description"] = t["description"];
      fn["parameters"] = t.value("input_schema", Json::object());
      converted.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = converted;
  }
  auto choice = body.find("tool_choice");
  if (choice != body.end() && !choice->is_null()) {
    if (!choice->is_object()) return InvalidArgument("tool_choice: must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(*choice, "type", "tool_choice", "auto"));
    if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool") {
      DSINFER_ASSIGN_OR_RETURN(std::string name, StringField(*choice, "name", "tool_choice"));
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else if (type == "auto" || type == "any") {
      chat["tool_choice"] = "auto";
    } else {
      return InvalidArgument("tool_choice.type: unknown value '" + type + "'");
    }
  }
  auto thinking = body.find("thinking");
  if (thinking != body.end() && !thinking->is_null()) {
    if (!thinking->is_object()) return InvalidArgument("thinking: must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(*thinking, "type", "thinking"));
    auto budget = OptInt(*thinking, "budget_tokens");
    if (!budget.ok() || (*budget && **budget < 0))
      return InvalidArgument("thinking.budget_tokens: must be a non-negative integer");
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      return InvalidArgument("thinking.type: unknown value '" + type + "'");
    chat["thinking"] = {{"type", type == "disabled" ? "disabled" : "enabled"}};
  }
  auto output_config = body.find("output_config");
  if (output_config != body.end() && output_config->is_object() &&
      output_config->contains("effort")) {
    std::string effort =
        (*output_config)["effort"].is_string() ? (*output_config)["effort"].get<std::string>() : "";
    chat["reasoning_effort"] = effort == "ultra" ? "max" : effort;
  }
  return chat;
}

namespace {

struct EncodedMessages {
  EncodedPrompt prompt;
  // The forced tool call's grammar: tool_choice "tool" (rendered as a named function: the prompt
  // opens the block) or "any" (rendered as "auto", as the official converter does: the grammar
  // opens it); one call when disable_parallel_tool_use.
  std::optional<grammar::GrammarSpec> tool_grammar;
};

Result<EncodedMessages> EncodeMessages(Service::Core& core, const Json& body) {
  DSINFER_ASSIGN_OR_RETURN(Json chat_json, MessagesToChatJson(body, core.options.default_thinking));
  DSINFER_ASSIGN_OR_RETURN(auto chat, text::ChatRequestFromJsonValue(chat_json, core.model.version,
                                                                     core.options.default_thinking,
                                                                     /*keep_empty_system=*/true));
  EncodedMessages out;
  DSINFER_ASSIGN_OR_RETURN(out.prompt, core.EncodeChat(chat));
  ToolCallForcing forcing = ToolCallForcing::kNone;
  bool parallel = true;
  auto choice = body.find("tool_choice");
  if (choice != body.end() && choice->is_object()) {  // its shape was checked by the conversion
    if (choice->value("type", "") == "any") forcing = ToolCallForcing::kGrammarOpens;
    auto single = choice->find("disable_parallel_tool_use");
    if (single != choice->end() && !single->is_null()) {
      if (!single->is_boolean())
        return InvalidArgument("tool_choice.disable_parallel_tool_use: must be a boolean");
      parallel = !single->get<bool>();
    }
  }
  if (out.prompt.forced_tool_call) forcing = ToolCallForcing::kPromptOpened;
  DSINFER_ASSIGN_OR_RETURN(out.tool_grammar, ToolCallGrammarSpec(chat, forcing, parallel));
  return out;
}

}  // namespace

void HandleCountTokens(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kAnthropic;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body) return;
  auto encoded = EncodeMessages(core, *body);
  if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), flavor);
  SendJson(sink, 200, Json{{"input_tokens", encoded->prompt.ids.size()}});
}

void HandleMessages(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kAnthropic;
  GenerationSpec spec;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body || RefuseKvTransferParams(*body, sink, flavor)) return;
  auto stream = OptBool(*body, "stream");
  if (!stream.ok()) return SendError(sink, FromStatus(stream.status()), flavor);
  auto max_tokens = OptInt(*body, "max_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  if (!*max_tokens) return SendError(sink, BadRequest("max_tokens: required"), flavor);
  auto stops = StopSequences(*body, "stop_sequences");
  if (!stops.ok()) return SendError(sink, FromStatus(stops.status()), flavor);
  for (const auto& s : *stops)
    if (s.empty())
      return SendError(sink, BadRequest("stop_sequences: must not contain empty strings"), flavor);
  Status sampling = ParseGenerationFields(*body, &spec);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);
  auto messages = EncodeMessages(core, *body);
  if (!messages.ok()) return SendError(sink, FromStatus(messages.status()), flavor);
  EncodedPrompt* encoded = &messages->prompt;
  auto resolved_max =
      core.ResolveMaxTokens(*max_tokens, encoded->ids.size(), core.DefaultMaxTokens(*encoded));
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);
  // The Messages API has no structured-output field of its own here: only a forced tool call
  // constrains the output.
  Status structured = AttachStructuredOutput(core, Json::object(), encoded->thinking, &spec,
                                             std::move(messages->tool_grammar));
  if (!structured.ok()) return SendError(sink, FromStatus(structured), flavor);

  const std::string id = NewId("msg_");
  const int64_t prompt_tokens = static_cast<int64_t>(encoded->ids.size());
  spec.params.prompt = std::move(encoded->ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.request_id = id;
  spec.thinking = encoded->thinking;
  spec.parse_tools = encoded->has_tools;
  spec.forced_tool_call = encoded->forced_tool_call;
  spec.json_output = encoded->json_output;
  spec.stop = std::move(*stops);
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  const bool streaming = stream->value_or(false);
  // Anthropic clients see the model name they asked for (claude-* names map to the served model).
  const std::string model_name = body->contains("model") && (*body)["model"].is_string()
                                     ? (*body)["model"].get<std::string>()
                                     : core.options.served_model_name;
  MessageResult result(sink, streaming, id, model_name);
  result.set_generation(generation->get());
  if (!result.Begin(prompt_tokens)) return;
  const GenerationEnd end = (*generation)->Run(result, &sink);
  if (end == GenerationEnd::kClientGone) return;
  result.Complete(end);
  if (streaming) return result.FinishStream(end);
  if (end == GenerationEnd::kError)
    return SendError(sink, GenerationFailed((*generation)->error()), flavor);
  SendJson(sink, 200, result.Response(), {{"request-id", id}});
}

}  // namespace dsinfer::server
