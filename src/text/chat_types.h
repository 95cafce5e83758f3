// Plain data model of a DeepSeek V4 / V4.1 chat request, as the prompt renderer consumes it.
// No JSON types here: protocol adapters (chat_json.h, later the server) fill these structs.
// Semantics follow deepseek-recipe 0.2.0's Conversation (the oracle of the fixtures in
// tests/fixtures/chat/).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dsinfer::text {

enum class ModelVersion { kV4, kV41 };

enum class Role { kSystem, kUser, kAssistant, kTool, kLatestReminder };

struct ToolCall {
  std::string id;
  std::string name;
  // Caller-supplied JSON text, expected to be an object. Not validated: text that is not a JSON
  // object renders as a single string parameter named "arguments", as the oracle does.
  std::string arguments;
};

struct ChatMessage {
  Role role = Role::kUser;
  std::string content;
  // Assistant only. nullopt and "" differ: V4 renders a missing reasoning as a bare "</think>".
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only
  // Assistant only: continue this message instead of starting a new turn (chat-prefix
  // completion). Meaningful on the last message.
  bool prefix = false;
};

struct ToolDefinition {
  std::string name;
  std::optional<std::string> description;
  // JSON text of the parameters schema; nullopt renders as null. Must parse as JSON.
  std::optional<std::string> parameters_json;
  // Deferred tools are accepted but left out of the schema list in the prompt.
  bool defer_loading = false;
};

enum class ToolChoice { kAuto, kNone, kRequired };

enum class ReasoningEffort { kLow, kHigh, kXhigh, kMax };

enum class ResponseFormatType { kText, kJsonObject, kJsonSchema, kRegex };

struct ResponseFormat {
  ResponseFormatType type = ResponseFormatType::kText;
  std::string schema_json;  // kJsonSchema: the JSON Schema text (must parse as JSON)
  std::string regex;        // kRegex: not rendered; enforcement is the decoder's business
};

struct ChatRequest {
  ModelVersion version = ModelVersion::kV4;
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  bool thinking = true;
  std::optional<ReasoningEffort> reasoning_effort;  // nullopt behaves as high
  ResponseFormat response_format;
};

}  // namespace dsinfer::text
