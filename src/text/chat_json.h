// OpenAI Chat Completions request JSON -> ChatRequest. The text layer's only JSON-facing entry
// point for chat; the HTTP server will reuse it. Every malformed field is an InvalidArgument
// naming the field (e.g. "messages[2].role: unknown role 'bot'"); nothing throws.
//
// Accepted subset: messages (roles system, user, assistant, tool, latest_reminder; content as a
// string, null, or an array of {"type":"text"} parts), assistant reasoning_content / tool_calls /
// prefix, tool tool_call_id, tools (function tools; defer_loading), tool_choice (auto, none,
// required, or a named function, which keeps only that tool and makes it required), thinking
// {"type": "enabled"|"disabled"}, reasoning_effort, response_format (text, json_object,
// json_schema, regex). Thinking resolution: thinking.type wins; otherwise reasoning_effort "none"
// disables thinking; otherwise `default_thinking` applies.
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
Result<ChatRequest> ChatRequestFromJsonValue(const nlohmann::ordered_json& body,
                                             ModelVersion version, bool default_thinking = true);

}  // namespace dsinfer::text
