// DeepSeek V4 / V4.1 prompt rendering, byte-identical to deepseek-recipe 0.2.0's
// DeepseekV4Encoding / DeepseekV41Encoding (fixtures: tests/fixtures/chat/render_cases.jsonl).
//
// The prompt is returned as segments so that tokenization can keep user text harmless: only the
// special-token spellings the template itself writes are encoded as control tokens; everything
// else (message text, reasoning, tool arguments, and the template's ordinary prose) is encoded as
// plain BPE text, so a user who types "<｜User｜>" gets ordinary text tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/chat_types.h"

namespace dsinfer::text {

class Tokenizer;

struct PromptSegment {
  std::string text;
  // true: exactly one special-token spelling written by the template (encoded with added-token
  // recognition). false: plain text. Adjacent plain segments are always merged, because BPE
  // pre-tokenization depends on the whole run between special tokens.
  bool is_special = false;
};

struct RenderedPrompt {
  std::string text;                     // concatenation of all segments
  std::vector<PromptSegment> segments;  // alternating plain / special runs
};

// Renders the request. Fails with InvalidArgument for malformed embedded JSON (tool parameter
// schemas, response schema); tool-call arguments that are not a JSON object are rendered the way
// the oracle renders them, not rejected.
Result<RenderedPrompt> RenderPromptSegments(const ChatRequest& request);
Result<std::string> RenderPrompt(const ChatRequest& request);

// Encodes segments: each special segment as its token id (NotFound if the vocabulary lacks it),
// plain ones in plain-text mode.
Result<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer,
                                          std::span<const PromptSegment> segments);

// Special-token spellings (fullwidth ｜ U+FF5C, ▁ U+2581).
inline constexpr const char* kBosToken = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kEosToken = "<｜end▁of▁sentence｜>";
inline constexpr const char* kUserToken = "<｜User｜>";
inline constexpr const char* kAssistantToken = "<｜Assistant｜>";
inline constexpr const char* kSystemToken = "<｜System｜>";
inline constexpr const char* kLatestReminderToken = "<｜latest_reminder｜>";
inline constexpr const char* kThinkStart = "<think>";
inline constexpr const char* kThinkEnd = "</think>";
inline constexpr const char* kDsmlToken = "｜DSML｜";

// The DSML tool-call markup's tag names, written after "<｜DSML｜" / "</｜DSML｜": V4 writes
// "tool_calls" / "invoke" / "parameter", V4.1 " calls" / " invoke" / " parameter".
struct DsmlTags {
  std::string_view block;
  std::string_view invoke;
  std::string_view parameter;
};
DsmlTags DsmlTagsFor(ModelVersion version);

}  // namespace dsinfer::text
