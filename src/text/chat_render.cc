#include "text/chat_render.h"

#include <algorithm>
#include <string_view>

#include "text/chat_json_value.h"
#include "text/tokenizer.h"

namespace dsinfer::text {
namespace {

constexpr std::string_view kV4HighEffort =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";
constexpr std::string_view kV4MaxEffort =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are certain that no assumption remains unchecked and no error remains "
    "undiscovered.\n\n";
constexpr std::string_view kV4JsonObjectSection =
    "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\n"
    "Reply with JSON object ONLY.";
constexpr std::string_view kSchemaSectionHeader =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// Builds alternating plain/special segments, merging adjacent plain text.
class SegmentBuilder {
 public:
  void Plain(std::string_view text) {
    if (text.empty()) return;
    if (segments_.empty() || segments_.back().is_special) segments_.push_back({"", false});
    segments_.back().text.append(text);
  }
  void Special(std::string_view token) { segments_.push_back({std::string(token), true}); }
  void Append(const std::vector<PromptSegment>& other) {
    for (const auto& s : other) s.is_special ? Special(s.text) : Plain(s.text);
  }
  // Template prose: the special spellings it mentions ("｜DSML｜", "<think>", "</think>") are
  // control tokens, as the oracle marks them; the rest is plain text.
  void Template(std::string_view text) {
    static constexpr std::string_view kMarked[] = {kDsmlToken, kThinkEnd, kThinkStart};
    size_t plain_start = 0;
    size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      for (std::string_view token : kMarked) {
        if (text.substr(i, token.size()) == token) {
          Plain(text.substr(plain_start, i - plain_start));
          Special(token);
          i += token.size();
          plain_start = i;
          matched = true;
          break;
        }
      }
      if (!matched) ++i;
    }
    Plain(text.substr(plain_start));
  }
  bool empty() const { return segments_.empty(); }
  std::vector<PromptSegment> Take() { return std::move(segments_); }

 private:
  std::vector<PromptSegment> segments_;
};

// Version-specific spellings and rules.
struct Dialect {
  bool v41 = false;
  DsmlTags tags() const { return DsmlTagsFor(v41 ? ModelVersion::kV41 : ModelVersion::kV4); }
  std::string_view block_name() const { return tags().block; }
  std::string_view invoke_tag() const { return tags().invoke; }
  std::string_view parameter_tag() const { return tags().parameter; }
  FloatStyle floats() const { return v41 ? FloatStyle::kPythonRepr : FloatStyle::kRyuPlus; }
};

// A message after normalization. System bodies are segments because the tools prompt appended
// to the first system message contains control tokens.
struct NormalizedMessage {
  Role role = Role::kUser;
  std::vector<PromptSegment> system_body;
  const ChatMessage* source = nullptr;  // user/assistant/tool/reminder: the caller's message
  std::string merged_user_text;         // user: content, after merging consecutive users
};

std::string_view EffortText(const Dialect& dialect, std::optional<ReasoningEffort> effort) {
  ReasoningEffort e = effort.value_or(ReasoningEffort::kHigh);
  if (dialect.v41) {
    switch (e) {
      case ReasoningEffort::kLow:
        return "Reasoning Effort: 50 (range 1-100, the higher the value, the more thorough the "
               "reasoning)\n\n";
      case ReasoningEffort::kMax:
        return "Reasoning Effort: 100 (range 1-100, the higher the value, the more thorough the "
               "reasoning)\n\n";
      default:
        return "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the "
               "reasoning)\n\n";
    }
  }
  switch (e) {
    case ReasoningEffort::kLow:
      return "";
    case ReasoningEffort::kMax:
      return kV4MaxEffort;
    default:
      return kV4HighEffort;
  }
}

void AppendDsmlOpen(const Dialect&, std::string_view tag_and_attrs, SegmentBuilder* out) {
  out->Plain("<");
  out->Special(kDsmlToken);
  out->Plain(tag_and_attrs);
}

void AppendDsmlClose(std::string_view tag, SegmentBuilder* out) {
  out->Plain("</");
  out->Special(kDsmlToken);
  out->Plain(tag);
  out->Plain(">");
}

// One tool call's parameters. Arguments that are not a JSON object become one string parameter
// "arguments" holding the raw text (the oracle's fallback).
std::vector<SegmentBuilder> RenderParameters(const Dialect& dialect, const ToolCall& call) {
  std::vector<std::pair<std::string, std::pair<bool, std::string>>> params;  // key, (is_str, text)
  Result<JsonValue> parsed = ParseJson(call.arguments);
  if (parsed.ok() && parsed->kind == JsonValue::Kind::kObject) {
    for (const auto& [key, value] : parsed->object) {
      if (value.kind == JsonValue::Kind::kString)
        params.push_back({key, {true, value.string_value}});
      else
        params.push_back({key, {false, StringifyPythonStyle(value, dialect.floats())}});
    }
  } else {
    params.push_back({"arguments", {true, call.arguments}});
  }
  std::vector<SegmentBuilder> rendered;
  for (const auto& [key, typed] : params) {
    SegmentBuilder b;
    std::string attrs = std::string(dialect.parameter_tag()) + " name=\"" + key + "\" string=\"" +
                        (typed.first ? "true" : "false") + "\">";
    AppendDsmlOpen(dialect, attrs, &b);
    b.Plain(typed.second);
    AppendDsmlClose(dialect.parameter_tag(), &b);
    rendered.push_back(std::move(b));
  }
  return rendered;
}

void AppendToolCallsBlock(const Dialect& dialect, const std::vector<ToolCall>& calls,
                          SegmentBuilder* out) {
  out->Plain("\n\n");
  AppendDsmlOpen(dialect, std::string(dialect.block_name()) + ">\n", out);
  for (size_t c = 0; c < calls.size(); ++c) {
    if (c) out->Plain("\n");
    AppendDsmlOpen(dialect,
                   std::string(dialect.invoke_tag()) + " name=\"" + calls[c].name + "\">\n", out);
    std::vector<SegmentBuilder> params = RenderParameters(dialect, calls[c]);
    // V4 ends every parameter line with "\n"; V4.1 joins them and adds one "\n", which differs
    // only for a call without parameters.
    for (size_t p = 0; p < params.size(); ++p) {
      if (dialect.v41 && p) out->Plain("\n");
      out->Append(params[p].Take());
      if (!dialect.v41) out->Plain("\n");
    }
    if (dialect.v41) out->Plain("\n");
    AppendDsmlClose(dialect.invoke_tag(), out);
  }
  out->Plain("\n");
  AppendDsmlClose(dialect.block_name(), out);
}

Result<std::string> ToolSchemaLine(const Dialect& d, const ToolDefinition& tool) {
  JsonValue line;
  line.kind = JsonValue::Kind::kObject;
  JsonValue name;
  name.kind = JsonValue::Kind::kString;
  name.string_value = tool.name;
  JsonValue description;
  description.kind = JsonValue::Kind::kString;
  description.string_value = tool.description.value_or("");
  JsonValue parameters;  // null unless given
  if (tool.parameters_json) {
    Result<JsonValue> parsed = ParseJson(*tool.parameters_json);
    if (!parsed.ok()) return parsed.status().WithContext("parameters of tool '" + tool.name + "'");
    parameters = std::move(parsed).value();
  }
  line.object.emplace_back("name", std::move(name));
  line.object.emplace_back("description", std::move(description));
  line.object.emplace_back("parameters", std::move(parameters));
  return StringifyPythonStyle(line, d.floats());
}

Status AppendToolsPrompt(const Dialect& d, const std::vector<ToolDefinition>& tools,
                         SegmentBuilder* out) {
  // V4 ends each listed tool's line with "\n"; V4.1 joins the lines with "\n" and adds one. The
  // two differ only when every tool is deferred.
  std::string schemas;
  bool first = true;
  for (const auto& tool : tools) {
    DSINFER_ASSIGN_OR_RETURN(std::string line, ToolSchemaLine(d, tool));
    if (tool.defer_loading) continue;  // deferred tools are validated but not listed
    if (d.v41 && !first) schemas += '\n';
    schemas += line;
    if (!d.v41) schemas += '\n';
    first = false;
  }
  if (d.v41) schemas += '\n';
  const std::string dsml = kDsmlToken;
  const std::string block = "<" + dsml + std::string(d.block_name()) + ">";
  const std::string block_end = "</" + dsml + std::string(d.block_name()) + ">";
  const std::string invoke = "<" + dsml + std::string(d.invoke_tag());
  const std::string invoke_end = "</" + dsml + std::string(d.invoke_tag()) + ">";
  const std::string param = "<" + dsml + std::string(d.parameter_tag());
  const std::string param_end = "</" + dsml + std::string(d.parameter_tag()) + ">";
  out->Template(
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
      "invoke tools by writing a \"" +
      block + "\" block like the following:\n\n" + block + "\n" + invoke +
      " name=\"$TOOL_NAME\">\n" + param +
      " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" + param_end + "\n...\n" +
      invoke_end + "\n" + invoke + " name=\"$TOOL_NAME2\">\n...\n" + invoke_end + "\n" + block_end +
      "\n\nString parameters should be specified as is and set `string=\"true\"`. For all other "
      "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
      "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output "
      "your complete reasoning inside <think>...</think> BEFORE any tool calls or final "
      "response.\n\nOtherwise, output directly after </think> with tool calls or final "
      "response.\n\n### Available Tool Schemas\n\n");
  out->Plain(schemas);
  out->Plain(
      "\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
      "tool calls.\n");
  return Status::Ok();
}

// Position of a tool result's call in the preceding assistant's call list.
std::optional<size_t> CallPosition(const std::vector<std::string>& order, const std::string& id) {
  auto it = std::find(order.begin(), order.end(), id);
  if (it == order.end()) return std::nullopt;
  return static_cast<size_t>(it - order.begin());
}

// Tool results are reordered to follow the order of the calls they answer (V4.1): within each
// run of user/tool messages, tool slots are stably sorted by call position, an unknown id
// counting as position 0.
void SortToolResultsV41(std::vector<NormalizedMessage>* messages) {
  std::vector<std::string> order;
  auto& msgs = *messages;
  size_t idx = 0;
  while (idx < msgs.size()) {
    const NormalizedMessage& m = msgs[idx];
    if (m.role == Role::kAssistant && !m.source->tool_calls.empty()) {
      order.clear();
      for (const auto& call : m.source->tool_calls) order.push_back(call.id);
      ++idx;
      continue;
    }
    auto in_run = [](const NormalizedMessage& x) {
      return x.role == Role::kTool || x.role == Role::kUser;
    };
    if (!in_run(m)) {
      ++idx;
      continue;
    }
    size_t start = idx;
    while (idx < msgs.size() && in_run(msgs[idx])) ++idx;
    std::vector<size_t> slots;
    for (size_t i = start; i < idx; ++i)
      if (msgs[i].role == Role::kTool) slots.push_back(i);
    if (slots.size() < 2 || order.empty()) continue;
    std::vector<NormalizedMessage> tools;
    for (size_t s : slots) tools.push_back(msgs[s]);
    std::stable_sort(tools.begin(), tools.end(), [&](const auto& a, const auto& b) {
      return CallPosition(order, a.source->tool_call_id).value_or(0) <
             CallPosition(order, b.source->tool_call_id).value_or(0);
    });
    for (size_t k = 0; k < slots.size(); ++k) msgs[slots[k]] = tools[k];
  }
}

// V4: the N messages after an assistant with N tool calls are insertion-sorted so that tool
// results come first, in call order; a result with an unknown id compares equal to every other
// result, and user messages compare equal to each other. This reproduces the oracle's orders
// (including where unknown ids end up), which a plain stable sort by key would not.
void SortToolResultsV4(std::vector<NormalizedMessage>* messages) {
  auto& msgs = *messages;
  for (size_t a = 0; a < msgs.size(); ++a) {
    if (msgs[a].role != Role::kAssistant || msgs[a].source->tool_calls.empty()) continue;
    std::vector<std::string> order;
    for (const auto& call : msgs[a].source->tool_calls) order.push_back(call.id);
    size_t begin = a + 1;
    size_t end = begin;
    while (end < msgs.size() && end - begin < order.size() &&
           (msgs[end].role == Role::kTool || msgs[end].role == Role::kUser))
      ++end;
    auto less = [&](const NormalizedMessage& x, const NormalizedMessage& y) {
      const bool x_tool = x.role == Role::kTool, y_tool = y.role == Role::kTool;
      if (x_tool != y_tool) return x_tool;
      if (!x_tool) return false;
      auto px = CallPosition(order, x.source->tool_call_id);
      auto py = CallPosition(order, y.source->tool_call_id);
      return px && py && *px < *py;
    };
    for (size_t i = begin + 1; i < end; ++i)
      for (size_t j = i; j > begin && less(msgs[j], msgs[j - 1]); --j)
        std::swap(msgs[j], msgs[j - 1]);
  }
}

std::vector<PromptSegment> PlainBody(const std::string& text) {
  SegmentBuilder b;
  b.Plain(text);
  return b.Take();
}

std::vector<NormalizedMessage> Normalize(const Dialect& d, const std::vector<ChatMessage>& in) {
  std::vector<NormalizedMessage> out;
  if (!d.v41) {
    // V4 has no mid-conversation system turn: every system message joins one leading system
    // message ("\n\n" between non-empty parts), wherever it appears.
    bool any_system = false;
    std::string merged;
    for (const auto& m : in) {
      if (m.role != Role::kSystem) continue;
      any_system = true;
      if (!merged.empty() && !m.content.empty()) merged += "\n\n";
      merged += m.content;
    }
    if (any_system) out.push_back({Role::kSystem, PlainBody(merged), nullptr});
  }
  for (const auto& m : in) {
    if (m.role == Role::kSystem) {
      if (d.v41) out.push_back({Role::kSystem, PlainBody(m.content), nullptr});
      continue;
    }
    if (!d.v41 && m.role == Role::kUser && !out.empty() && out.back().role == Role::kUser) {
      // V4 merges consecutive user messages, "\n\n" between non-empty parts.
      std::string& merged = out.back().merged_user_text;
      if (!merged.empty() && !m.content.empty()) merged += "\n\n";
      merged += m.content;
      continue;
    }
    if (d.v41 && m.role == Role::kLatestReminder && !out.empty() &&
        out.back().role == Role::kLatestReminder)
      continue;  // V4.1 keeps only the first of consecutive reminders
    out.push_back({m.role, {}, &m});
    if (m.role == Role::kUser) out.back().merged_user_text = m.content;
  }
  if (d.v41)
    SortToolResultsV41(&out);
  else
    SortToolResultsV4(&out);
  return out;
}

void AppendAssistant(const Dialect& d, const ChatRequest& req, const NormalizedMessage& msg,
                     size_t index, bool is_last, bool keep_reasoning, SegmentBuilder* out) {
  const ChatMessage& m = *msg.source;
  out->Special(kAssistantToken);
  const bool open_prefix = m.prefix && is_last;
  const bool has_answer = !m.content.empty() || !m.tool_calls.empty();
  // Reasoning of earlier turns is kept only when tools are on (V4 even outside thinking mode).
  const bool keep = keep_reasoning && index > 0 && (req.thinking || !d.v41);
  const bool v41_first = d.v41 && index == 0;  // V4.1 renders no reasoning in message 0
  if (open_prefix && !v41_first && (req.thinking || (!d.v41 && m.reasoning_content))) {
    // The turn being continued keeps its reasoning (V4 even outside thinking mode); "</think>"
    // closes it only once an answer has started.
    if (m.reasoning_content || d.v41) {
      out->Special(kThinkStart);
      out->Plain(m.reasoning_content.value_or(""));
      // Outside thinking mode the reasoning is history, so it is always closed.
      if (has_answer || !req.thinking) out->Special(kThinkEnd);
    } else if (has_answer) {
      out->Special(kThinkEnd);
    }
  } else if (!open_prefix && keep && (m.reasoning_content || (d.v41 && req.thinking))) {
    out->Special(kThinkStart);
    out->Plain(m.reasoning_content.value_or(""));
    out->Special(kThinkEnd);
  } else {
    out->Special(kThinkEnd);
  }
  out->Plain(m.content);
  if (!m.tool_calls.empty()) AppendToolCallsBlock(d, m.tool_calls, out);
  // V4.1 never closes a prefix message; V4 only leaves the last one open.
  if (!(m.prefix && (d.v41 || is_last))) out->Special(kEosToken);
}

}  // namespace

DsmlTags DsmlTagsFor(ModelVersion version) {
  if (version == ModelVersion::kV41) return {" calls", " invoke", " parameter"};
  return {"tool_calls", "invoke", "parameter"};
}

Result<RenderedPrompt> RenderPromptSegments(const ChatRequest& req) {
  const Dialect d{req.version == ModelVersion::kV41};
  std::vector<NormalizedMessage> messages = Normalize(d, req.messages);

  const bool has_tools = req.tool_choice != ToolChoice::kNone && !req.tools.empty();
  const ResponseFormatType format = req.response_format.type;
  std::string format_section;
  if (format == ResponseFormatType::kJsonObject) {
    format_section = d.v41 ? std::string(kSchemaSectionHeader) + "{\"type\": \"json_object\"}"
                           : std::string(kV4JsonObjectSection);
  } else if (format == ResponseFormatType::kJsonSchema) {
    Result<JsonValue> schema = ParseJson(req.response_format.schema_json);
    if (!schema.ok()) return schema.status().WithContext("response_format schema");
    format_section = std::string(kSchemaSectionHeader) + StringifyPythonStyle(*schema, d.floats());
  }
  if (has_tools || !format_section.empty()) {
    if (messages.empty() || messages.front().role != Role::kSystem)
      messages.insert(messages.begin(), NormalizedMessage{Role::kSystem, {}, nullptr});
    SegmentBuilder body;
    body.Append(messages.front().system_body);
    if (has_tools) {
      body.Plain("\n\n");
      DSINFER_RETURN_IF_ERROR(AppendToolsPrompt(d, req.tools, &body));
    }
    body.Plain(format_section);
    messages.front().system_body = body.Take();
  } else {
    // Tool schemas are validated even when tool_choice=none hides them.
    for (const auto& tool : req.tools) DSINFER_RETURN_IF_ERROR(ToolSchemaLine(d, tool).status());
  }

  SegmentBuilder out;
  out.Special(kBosToken);
  const std::string_view effort = req.thinking ? EffortText(d, req.reasoning_effort) : "";
  if (messages.empty() && !d.v41) out.Plain(effort);
  for (size_t i = 0; i < messages.size(); ++i) {
    const NormalizedMessage& msg = messages[i];
    const Role prev = i > 0 ? messages[i - 1].role : Role::kAssistant;
    const bool prev_user_or_tool = i > 0 && (prev == Role::kUser || prev == Role::kTool);
    if (i == 0) {
      if (d.v41 && (!effort.empty() || msg.role == Role::kSystem)) out.Special(kSystemToken);
      out.Plain(effort);
    }
    switch (msg.role) {
      case Role::kSystem:
        if (i > 0 && d.v41) out.Special(kSystemToken);
        out.Append(msg.system_body);
        break;
      case Role::kUser:
        prev_user_or_tool ? out.Plain("\n\n") : out.Special(kUserToken);
        out.Plain(msg.merged_user_text);
        break;
      case Role::kTool: {
        // V4 opens a new user turn for a tool result unless it follows another tool result.
        const bool joins = d.v41 ? prev_user_or_tool : (i > 0 && prev == Role::kTool);
        joins ? out.Plain("\n\n") : out.Special(kUserToken);
        out.Plain("<tool_result>" + msg.source->content + "</tool_result>");
        break;
      }
      case Role::kLatestReminder:
        out.Special(kLatestReminderToken);
        out.Plain(msg.source->content);
        break;
      case Role::kAssistant:
        AppendAssistant(d, req, msg, i, i + 1 == messages.size(), has_tools, &out);
        break;
    }
  }
  const bool ends_open = !messages.empty() && messages.back().role == Role::kAssistant &&
                         messages.back().source->prefix;
  if (!ends_open) {
    out.Special(kAssistantToken);
    out.Special(req.thinking ? kThinkStart : kThinkEnd);
  }
  // A required tool choice opens the tool-call block for the model (after a prefix, too).
  if (req.tool_choice == ToolChoice::kRequired && !req.tools.empty()) {
    out.Plain("\n\n<");
    out.Special(kDsmlToken);
    out.Plain(std::string(d.block_name()) + ">\n");
  }
  RenderedPrompt result;
  result.segments = out.Take();
  for (const auto& s : result.segments) result.text += s.text;
  return result;
}

Result<std::string> RenderPrompt(const ChatRequest& request) {
  DSINFER_ASSIGN_OR_RETURN(RenderedPrompt rendered, RenderPromptSegments(request));
  return std::move(rendered.text);
}

Result<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer,
                                          std::span<const PromptSegment> segments) {
  std::vector<int32_t> ids;
  for (const auto& segment : segments) {
    if (segment.is_special) {
      // As the oracle: a control token the vocabulary lacks (e.g. V4.1's "<｜System｜>" with a
      // V4 tokenizer) is an error, not silently spelled out as text.
      std::optional<int32_t> id = tokenizer.TokenId(segment.text);
      if (!id) return NotFound("special token \"" + segment.text + "\" is not in the vocabulary");
      ids.push_back(*id);
      continue;
    }
    DSINFER_ASSIGN_OR_RETURN(std::vector<int32_t> piece,
                             tokenizer.Encode(segment.text, /*allow_special=*/false));
    ids.insert(ids.end(), piece.begin(), piece.end());
  }
  return ids;
}

}  // namespace dsinfer::text
