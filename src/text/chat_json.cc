#include "text/chat_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

namespace dsinfer::text {
namespace {

// ordered_json keeps object keys in document order: the prompt prints them in that order.
using json = nlohmann::ordered_json;

Status FieldError(const std::string& path, const std::string& what) {
  return InvalidArgument(path + ": " + what);
}

Result<std::string> StringField(const json& obj, const char* key, const std::string& path,
                                bool required) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return FieldError(path + "." + key, "missing");
    return std::string();
  }
  if (!it->is_string()) return FieldError(path + "." + key, "must be a string");
  return it->get<std::string>();
}

// String content, null, or an array of text parts (joined by "\n\n").
Result<std::string> ContentField(const json& msg, const std::string& path) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return FieldError(path + ".content", "must be a string or an array");
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    const std::string part_path = path + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) return FieldError(part_path, "must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(part, "type", part_path, true));
    if (type == "image_url" || type == "image" || type == "input_image")
      return Unimplemented(part_path + ": image input is not supported by this model");
    if (type != "text")
      return FieldError(part_path, "unsupported content part type '" + type + "'");
    DSINFER_ASSIGN_OR_RETURN(std::string part_text, StringField(part, "text", part_path, true));
    if (i) text += "\n\n";  // as deepseek-recipe joins text parts
    text += part_text;
  }
  return text;
}

Result<ToolCall> ParseToolCall(const json& call, const std::string& path) {
  if (!call.is_object()) return FieldError(path, "must be an object");
  ToolCall out;
  DSINFER_ASSIGN_OR_RETURN(out.id, StringField(call, "id", path, false));
  auto fn = call.find("function");
  if (fn == call.end() || !fn->is_object()) return FieldError(path + ".function", "missing");
  DSINFER_ASSIGN_OR_RETURN(out.name, StringField(*fn, "name", path + ".function", true));
  auto args = fn->find("arguments");
  if (args == fn->end() || args->is_null()) {
    out.arguments = "{}";
  } else if (args->is_string()) {
    out.arguments = args->get<std::string>();
  } else if (args->is_object()) {
    out.arguments = args->dump();
  } else {
    return FieldError(path + ".function.arguments", "must be a JSON string");
  }
  return out;
}

Result<ChatMessage> ParseMessage(const json& msg, const std::string& path) {
  if (!msg.is_object()) return FieldError(path, "must be an object");
  ChatMessage out;
  DSINFER_ASSIGN_OR_RETURN(std::string role, StringField(msg, "role", path, true));
  // "developer" is OpenAI's newer name for the system role (the official converter refuses it).
  if (role == "system" || role == "developer")
    out.role = Role::kSystem;
  else if (role == "user")
    out.role = Role::kUser;
  else if (role == "assistant")
    out.role = Role::kAssistant;
  else if (role == "tool")
    out.role = Role::kTool;
  else if (role == "latest_reminder")
    out.role = Role::kLatestReminder;
  else
    return FieldError(path + ".role", "unknown role '" + role + "'");
  DSINFER_ASSIGN_OR_RETURN(out.content, ContentField(msg, path));
  if (out.role == Role::kAssistant) {
    auto rc = msg.find("reasoning_content");
    if (rc != msg.end() && !rc->is_null()) {
      if (!rc->is_string()) return FieldError(path + ".reasoning_content", "must be a string");
      out.reasoning_content = rc->get<std::string>();
    }
    auto calls = msg.find("tool_calls");
    if (calls != msg.end() && !calls->is_null()) {
      if (!calls->is_array()) return FieldError(path + ".tool_calls", "must be an array");
      for (size_t i = 0; i < calls->size(); ++i) {
        DSINFER_ASSIGN_OR_RETURN(
            ToolCall call,
            ParseToolCall((*calls)[i], path + ".tool_calls[" + std::to_string(i) + "]"));
        out.tool_calls.push_back(std::move(call));
      }
    }
    auto prefix = msg.find("prefix");
    if (prefix != msg.end() && !prefix->is_null()) {
      if (!prefix->is_boolean()) return FieldError(path + ".prefix", "must be a boolean");
      out.prefix = prefix->get<bool>();
    }
  }
  if (out.role == Role::kTool) {
    DSINFER_ASSIGN_OR_RETURN(out.tool_call_id, StringField(msg, "tool_call_id", path, false));
  }
  return out;
}

// Tool names as the converter accepts them: ASCII letters, digits, '_' and '-'.
Status CheckToolName(const std::string& name, const std::string& path) {
  if (name.empty()) return FieldError(path, "must not be empty");
  for (unsigned char c : name)
    if (!std::isalnum(c) && c != '_' && c != '-')
      return FieldError(path, "'" + name + "' does not match ^[a-zA-Z0-9_-]+$");
  return Status::Ok();
}

Result<ToolDefinition> ParseTool(const json& tool, const std::string& path) {
  if (!tool.is_object()) return FieldError(path, "must be an object");
  DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(tool, "type", path, false));
  if (!type.empty() && type != "function")
    return FieldError(path + ".type", "unsupported tool type '" + type + "'");
  auto fn = tool.find("function");
  if (fn == tool.end() || !fn->is_object()) return FieldError(path + ".function", "missing");
  const std::string fn_path = path + ".function";
  ToolDefinition out;
  DSINFER_ASSIGN_OR_RETURN(out.name, StringField(*fn, "name", fn_path, true));
  auto desc = fn->find("description");
  if (desc != fn->end() && !desc->is_null()) {
    if (!desc->is_string()) return FieldError(fn_path + ".description", "must be a string");
    out.description = desc->get<std::string>();
  }
  DSINFER_RETURN_IF_ERROR(CheckToolName(out.name, fn_path + ".name"));
  auto params = fn->find("parameters");
  // The converter lists a function without parameters as taking an empty object.
  out.parameters_json = "{}";
  if (params != fn->end() && !params->is_null()) {
    if (!params->is_object()) return FieldError(fn_path + ".parameters", "must be an object");
    out.parameters_json = params->dump();
  }
  // defer_loading (on the function object or next to it) is type-checked and otherwise has no
  // effect: the official converter lists deferred tools like any other.
  for (const json* holder : {&*fn, &tool}) {
    auto it = holder->find("defer_loading");
    if (it != holder->end() && !it->is_null() && !it->is_boolean())
      return FieldError(fn_path + ".defer_loading", "must be a boolean");
  }
  return out;
}

Result<ReasoningEffort> ParseEffort(const std::string& value) {
  if (value == "minimal" || value == "low") return ReasoningEffort::kLow;
  if (value == "medium" || value == "high") return ReasoningEffort::kHigh;
  if (value == "xhigh") return ReasoningEffort::kXhigh;
  if (value == "max") return ReasoningEffort::kMax;
  return FieldError("reasoning_effort", "unknown value '" + value + "'");
}

bool MentionsJson(const std::vector<ChatMessage>& messages) {
  for (const auto& m : messages) {
    std::string lower = m.content;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("json") != std::string::npos) return true;
  }
  return false;
}

// Each assistant message with tool calls is followed by exactly one tool message per call (in any
// order; the prompt lists the results in call order), and every tool message answers such a call.
Status PairToolResults(std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string path = "messages[" + std::to_string(i) + "]";
    if (messages[i].role == Role::kTool)
      return FieldError(path,
                        "a tool message must answer a tool call of the assistant message "
                        "before it");
    if (messages[i].role != Role::kAssistant || messages[i].tool_calls.empty()) continue;
    const auto& calls = messages[i].tool_calls;
    size_t end = i + 1;
    while (end < messages.size() && messages[end].role == Role::kTool) ++end;
    std::vector<ChatMessage> ordered(calls.size());
    std::vector<bool> answered(calls.size(), false);
    for (size_t t = i + 1; t < end; ++t) {
      size_t c = 0;
      while (c < calls.size() && (answered[c] || calls[c].id != messages[t].tool_call_id)) ++c;
      if (c == calls.size())
        return FieldError("messages[" + std::to_string(t) + "].tool_call_id",
                          "'" + messages[t].tool_call_id +
                              "' answers no unanswered tool call of messages[" + std::to_string(i) +
                              "]");
      answered[c] = true;
      ordered[c] = std::move(messages[t]);
    }
    for (size_t c = 0; c < calls.size(); ++c)
      if (!answered[c])
        return FieldError(path + ".tool_calls",
                          "tool call '" + calls[c].id + "' has no tool message answering it");
    std::move(ordered.begin(), ordered.end(), messages.begin() + static_cast<long>(i) + 1);
    i = end - 1;
  }
  return Status::Ok();
}

// What deepseek-recipe's request converters refuse or normalize after reading a request, so that
// an accepted request renders the official prompt.
Status ApplyConverterRules(ChatRequest& req, bool keep_empty_system) {
  auto& messages = req.messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].prefix) continue;
    if (i + 1 != messages.size() || messages[i].role != Role::kAssistant)
      return FieldError("messages[" + std::to_string(i) + "].prefix",
                        "only the final message, an assistant one, can be a prefix");
    const bool any_calls = std::any_of(messages.begin(), messages.end(),
                                       [](const ChatMessage& m) { return !m.tool_calls.empty(); });
    if (!req.tools.empty() || any_calls)
      return FieldError("messages[" + std::to_string(i) + "].prefix",
                        "a prefix message cannot be combined with tools or tool calls");
    if (req.response_format.type == ResponseFormatType::kJsonObject)
      return FieldError("messages[" + std::to_string(i) + "].prefix",
                        "a prefix message cannot be combined with response_format json_object");
  }
  if (req.thinking && req.tool_choice == ToolChoice::kRequired)
    return FieldError("tool_choice",
                      "'required' or a named function needs thinking disabled (thinking "
                      "{\"type\": \"disabled\"} or reasoning_effort \"none\")");
  if (req.response_format.type == ResponseFormatType::kJsonObject && !MentionsJson(messages))
    return FieldError("response_format", "json_object requires the word 'json' in the messages");
  DSINFER_RETURN_IF_ERROR(PairToolResults(messages));
  if (!keep_empty_system)
    std::erase_if(messages, [](const ChatMessage& m) {
      return m.role == Role::kSystem && m.content.empty();
    });
  // Earlier reasoning: kept (empty when there was none) in thinking mode, dropped without it.
  for (auto& m : messages) {
    if (m.role != Role::kAssistant) continue;
    if (!req.thinking)
      m.reasoning_content.reset();
    else if (!m.reasoning_content)
      m.reasoning_content = "";
  }
  return Status::Ok();
}

Result<ChatRequest> Convert(const json& body, ModelVersion version, bool default_thinking,
                            bool keep_empty_system) {
  if (!body.is_object()) return InvalidArgument("request must be a JSON object");
  ChatRequest req;
  req.version = version;
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array())
    return FieldError("messages", "missing or not an array");
  if (messages->empty()) return FieldError("messages", "must not be empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    DSINFER_ASSIGN_OR_RETURN(ChatMessage m,
                             ParseMessage((*messages)[i], "messages[" + std::to_string(i) + "]"));
    req.messages.push_back(std::move(m));
  }
  // vLLM's continue_final_message: the last message, the assistant's, is continued; the same as
  // DeepSeek's own `prefix: true` on it, with the same rules and refusals.
  auto continue_final = body.find("continue_final_message");
  if (continue_final != body.end() && !continue_final->is_null()) {
    if (!continue_final->is_boolean())
      return FieldError("continue_final_message", "must be a boolean");
    if (continue_final->get<bool>()) {
      if (req.messages.back().role != Role::kAssistant)
        return FieldError("continue_final_message", "the last message must be the assistant's");
      req.messages.back().prefix = true;
    }
  }
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return FieldError("tools", "must be an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      DSINFER_ASSIGN_OR_RETURN(ToolDefinition t,
                               ParseTool((*tools)[i], "tools[" + std::to_string(i) + "]"));
      for (const auto& existing : req.tools)
        if (existing.name == t.name)
          return FieldError("tools", "duplicate tool name '" + t.name + "'");
      req.tools.push_back(std::move(t));
    }
  }
  auto choice = body.find("tool_choice");
  if (choice != body.end() && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "auto")
        req.tool_choice = ToolChoice::kAuto;
      else if (c == "none")
        req.tool_choice = ToolChoice::kNone;
      else if (c == "required")
        req.tool_choice = ToolChoice::kRequired;
      else
        return FieldError("tool_choice", "unknown value '" + c + "'");
    } else if (choice->is_object()) {
      auto fn = choice->find("function");
      if (fn == choice->end() || !fn->is_object())
        return FieldError("tool_choice.function", "missing");
      DSINFER_ASSIGN_OR_RETURN(std::string name,
                               StringField(*fn, "name", "tool_choice.function", true));
      std::vector<ToolDefinition> kept;
      for (auto& t : req.tools)
        if (t.name == name) kept.push_back(std::move(t));
      if (kept.empty()) return FieldError("tool_choice", "names unknown tool '" + name + "'");
      req.tools = std::move(kept);
      req.tool_choice = ToolChoice::kRequired;
    } else {
      return FieldError("tool_choice", "must be a string or an object");
    }
  }
  std::optional<bool> thinking;
  auto th = body.find("thinking");
  if (th != body.end() && !th->is_null()) {
    if (!th->is_object()) return FieldError("thinking", "must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type, StringField(*th, "type", "thinking", true));
    if (type == "enabled")
      thinking = true;
    else if (type == "disabled")
      thinking = false;
    else
      return FieldError("thinking.type", "unknown value '" + type + "'");
  }
  // chat_template_kwargs {"thinking" | "enable_thinking": bool, "reasoning_effort": str} is
  // vLLM's / SGLang's spelling of the DeepSeek fields, which win when both are present. (The
  // official converter ignores it; honouring it is a documented difference.)
  auto kwargs = body.find("chat_template_kwargs");
  std::optional<bool> kwargs_thinking;
  const json* kwargs_effort = nullptr;
  if (kwargs != body.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) return FieldError("chat_template_kwargs", "must be an object");
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto t = kwargs->find(key);
      if (t == kwargs->end() || t->is_null()) continue;
      if (!t->is_boolean())
        return FieldError(std::string("chat_template_kwargs.") + key, "must be a boolean");
      kwargs_thinking = t->get<bool>();
    }
    auto e = kwargs->find("reasoning_effort");
    if (e != kwargs->end() && !e->is_null()) {
      if (!e->is_string())
        return FieldError("chat_template_kwargs.reasoning_effort", "must be a string");
      kwargs_effort = &*e;
    }
  }
  const json* effort = kwargs_effort;
  if (auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) effort = &*it;
  if (effort) {
    if (!effort->is_string()) return FieldError("reasoning_effort", "must be a string");
    const std::string e = effort->get<std::string>();
    if (e == "none") {
      if (!thinking) thinking = false;
    } else {
      DSINFER_ASSIGN_OR_RETURN(ReasoningEffort parsed, ParseEffort(e));
      req.reasoning_effort = parsed;
      if (!thinking) thinking = true;
    }
  }
  if (kwargs_thinking && (th == body.end() || th->is_null())) thinking = kwargs_thinking;
  req.thinking = thinking.value_or(default_thinking);
  auto format = body.find("response_format");
  if (format != body.end() && !format->is_null()) {
    if (!format->is_object()) return FieldError("response_format", "must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type,
                             StringField(*format, "type", "response_format", true));
    // A structural tag (vLLM / SGLang) is enforced by the server's grammar and, like regex,
    // adds nothing to the prompt.
    if (type == "text" || type == "structural_tag") {
      req.response_format.type = ResponseFormatType::kText;
    } else if (type == "json_object") {
      req.response_format.type = ResponseFormatType::kJsonObject;
    } else if (type == "json_schema") {
      auto js = format->find("json_schema");
      if (js == format->end() || !js->is_object())
        return FieldError("response_format.json_schema", "missing");
      auto schema = js->find("schema");
      req.response_format.type = ResponseFormatType::kJsonSchema;
      req.response_format.schema_json = schema == js->end() ? "{}" : schema->dump();
    } else if (type == "regex") {
      req.response_format.type = ResponseFormatType::kRegex;
      DSINFER_ASSIGN_OR_RETURN(req.response_format.regex,
                               StringField(*format, "regex", "response_format", false));
    } else {
      return FieldError("response_format.type", "unknown value '" + type + "'");
    }
  }
  DSINFER_RETURN_IF_ERROR(ApplyConverterRules(req, keep_empty_system));
  return req;
}

}  // namespace

Result<ChatRequest> ChatRequestFromJson(std::string_view json_text, ModelVersion version,
                                        bool default_thinking) {
  try {
    json body = json::parse(json_text);
    return Convert(body, version, default_thinking, /*keep_empty_system=*/false);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("request is not valid JSON: ") + e.what());
  }
}

Result<ChatRequest> ChatRequestFromJsonValue(const json& body, ModelVersion version,
                                             bool default_thinking, bool keep_empty_system) {
  // Convert reads with find / is_* / get on checked types, which do not throw; the guard keeps
  // that promise should a later field forget to check.
  try {
    return Convert(body, version, default_thinking, keep_empty_system);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("request: ") + e.what());
  }
}

}  // namespace dsinfer::text
