// OpenAI Chat Completions request JSON -> ChatRequest, with deepseek-recipe's ChatCompletionRequest
// conversion rules, so an accepted request renders the prompt the official converter renders
// (fixtures: tests/fixtures/chat/converter_cases.jsonl through the server, render_cases.jsonl).
// Every malformed field is an InvalidArgument naming the field (e.g. "messages[2].role: unknown
// role 'bot'"); image parts are Unimplemented; nothing throws.
//
// Accepted subset: messages (roles system, developer (as system), user, assistant, tool,
// latest_reminder; content as a string, null, or an array of {"type":"text"} parts joined by blank
// lines), assistant reasoning_content / tool_calls / prefix, tool tool_call_id, tools (function
// tools; names [a-zA-Z0-9_-]+, missing parameters as {}; defer_loading type-checked and, as in the
// official converter, not applied), tool_choice (auto, none, required, or a named function, which
// keeps only that tool and makes it required), thinking {"type": "enabled"|"disabled"},
// reasoning_effort, chat_template_kwargs (thinking / enable_thinking / reasoning_effort, vLLM's
// spelling; the DeepSeek fields win), response_format (text, json_object, json_schema, regex).
// Thinking resolution: thinking.type wins; then chat_template_kwargs; then reasoning_effort "none"
// disables thinking; otherwise `default_thinking` applies.
// Converter rules: refused are a forced tool choice in thinking mode, a prefix message that is not
// the final assistant one or that comes with tools / tool calls / json_object, json_object without
// the word "json" in the messages, and tool messages that do not answer exactly the preceding
// assistant message's calls (they are put in call order). Empty system messages are dropped;
// earlier assistant reasoning is kept (empty when absent) in thinking mode and dropped without it.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "core/status.h"
#include "text/chat_types.h"

namespace dsinfer::text {

Result<ChatRequest> ChatRequestFromJson(std::string_view json_text, ModelVersion version,
                                        bool default_thinking = true);
// The same, from a parsed body (the server parses each request once and converts the other
// APIs' requests to this shape as JSON values, never through text).
// `keep_empty_system`: an empty system message still renders (the Messages converter keeps a
// given `system`; the Chat and Responses converters drop empty ones).
Result<ChatRequest> ChatRequestFromJsonValue(const nlohmann::ordered_json& body,
                                             ModelVersion version, bool default_thinking = true,
                                             bool keep_empty_system = false);

}  // namespace dsinfer::text
