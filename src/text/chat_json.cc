#include "text/chat_json.h"

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
  if (role == "system")
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
  auto params = fn->find("parameters");
  if (params != fn->end() && !params->is_null()) {
    if (!params->is_object()) return FieldError(fn_path + ".parameters", "must be an object");
    out.parameters_json = params->dump();
  }
  // Accepted on the function object or next to it.
  const json* deferred = nullptr;
  if (auto it = fn->find("defer_loading"); it != fn->end())
    deferred = &*it;
  else if (auto it2 = tool.find("defer_loading"); it2 != tool.end())
    deferred = &*it2;
  if (deferred && !deferred->is_null()) {
    if (!deferred->is_boolean()) return FieldError(fn_path + ".defer_loading", "must be a boolean");
    out.defer_loading = deferred->get<bool>();
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

Result<ChatRequest> Convert(const json& body, ModelVersion version, bool default_thinking) {
  if (!body.is_object()) return InvalidArgument("request must be a JSON object");
  ChatRequest req;
  req.version = version;
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array())
    return FieldError("messages", "missing or not an array");
  for (size_t i = 0; i < messages->size(); ++i) {
    DSINFER_ASSIGN_OR_RETURN(ChatMessage m,
                             ParseMessage((*messages)[i], "messages[" + std::to_string(i) + "]"));
    req.messages.push_back(std::move(m));
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
  auto effort = body.find("reasoning_effort");
  if (effort != body.end() && !effort->is_null()) {
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
  req.thinking = thinking.value_or(default_thinking);
  auto format = body.find("response_format");
  if (format != body.end() && !format->is_null()) {
    if (!format->is_object()) return FieldError("response_format", "must be an object");
    DSINFER_ASSIGN_OR_RETURN(std::string type,
                             StringField(*format, "type", "response_format", true));
    if (type == "text") {
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
  return req;
}

}  // namespace

Result<ChatRequest> ChatRequestFromJson(std::string_view json_text, ModelVersion version,
                                        bool default_thinking) {
  try {
    json body = json::parse(json_text);
    return Convert(body, version, default_thinking);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("request is not valid JSON: ") + e.what());
  }
}

Result<ChatRequest> ChatRequestFromJsonValue(const json& body, ModelVersion version,
                                             bool default_thinking) {
  // Convert reads with find / is_* / get on checked types, which do not throw; the guard keeps
  // that promise should a later field forget to check.
  try {
    return Convert(body, version, default_thinking);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("request: ") + e.what());
  }
}

}  // namespace dsinfer::text
