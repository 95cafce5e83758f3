// libFuzzer target for text::OutputParser (model output -> reasoning, content, DSML tool calls).
// Input: byte 0 picks the options (thinking stage, tool calls, JSON mode, a stop sequence, the
// backend's finish), byte 1 seeds the chunking, the rest is the model output. Checks what the
// parser promises: the same result however the output is chunked (here: whole, and in
// fuzzer-chosen chunks that split UTF-8 characters and markers), every delta valid UTF-8, the
// deltas add up to the result, tool indices in order, and no text invented beyond what U+FFFD
// replacement and JSON-mode spaces allow.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_parser.h"
#include "text/utf8.h"

namespace {

using dsinfer::text::BackendFinish;
using dsinfer::text::OutputParser;
using dsinfer::text::OutputParserOptions;
using dsinfer::text::ParseResult;
using dsinfer::text::ParserEvent;

// What the events of one run add up to, and the parser's own result.
struct Run {
  ParseResult result;
  std::string reasoning, content;
  std::vector<std::string> names, arguments;
};

Run Parse(const OutputParserOptions& options, const std::vector<std::string_view>& chunks,
          BackendFinish finish) {
  OutputParser parser(options);
  Run run;
  auto take = [&](const std::vector<ParserEvent>& events) {
    for (const ParserEvent& e : events) {
      if (!dsinfer::text::IsValidUtf8(e.text)) std::abort();
      switch (e.kind) {
        case ParserEvent::Kind::kReasoning:
          run.reasoning += e.text;
          break;
        case ParserEvent::Kind::kContent:
          run.content += e.text;
          break;
        case ParserEvent::Kind::kToolCallBegin:
          // Tool calls are numbered 0, 1, 2, ... in order of their beginning.
          if (e.tool_index != static_cast<int>(run.names.size())) std::abort();
          run.names.push_back(e.text);
          run.arguments.emplace_back();
          break;
        case ParserEvent::Kind::kToolCallArguments:
          if (e.tool_index < 0 || e.tool_index + 1 != static_cast<int>(run.names.size())) {
            std::abort();  // arguments belong to the call that began last
          }
          run.arguments.back() += e.text;
          break;
        case ParserEvent::Kind::kStopSequence:
          break;
      }
    }
  };
  for (std::string_view c : chunks) take(parser.Feed(c));
  take(parser.Finish(finish));
  if (!parser.done()) std::abort();
  run.result = parser.result();
  return run;
}

bool SameResult(const ParseResult& a, const ParseResult& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.stop_sequence != b.stop_sequence ||
      a.finish_reason != b.finish_reason || a.tool_calls.size() != b.tool_calls.size()) {
    return false;
  }
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments) {
      return false;
    }
  }
  return true;
}

// The events must add up to the result the parser reports.
void CheckConsistent(const Run& run) {
  if (run.reasoning != run.result.reasoning || run.content != run.result.content) std::abort();
  if (run.names.size() != run.result.tool_calls.size()) std::abort();
  for (size_t i = 0; i < run.names.size(); ++i) {
    if (run.names[i] != run.result.tool_calls[i].name ||
        run.arguments[i] != run.result.tool_calls[i].arguments) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  uint32_t chunk_seed = data[1] | 1u;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  OutputParserOptions options;
  options.thinking = static_cast<dsinfer::text::ThinkingStage>(mode & 3);
  options.parse_tool_calls = (mode & 4) != 0;
  options.starts_in_tool_calls = (mode & 8) != 0;
  options.parse_json_output = (mode & 16) != 0;
  if (mode & 32) options.stop_sequences = {"STOP", "\n\n", "</｜DSML｜"};
  const BackendFinish finish = (mode & 64) ? BackendFinish::kLength : BackendFinish::kStop;

  std::vector<std::string_view> chunks;
  for (size_t pos = 0; pos < text.size();) {
    chunk_seed = chunk_seed * 1103515245u + 12345u;  // a fixed LCG: the input decides the splits
    const size_t len = std::min<size_t>(text.size() - pos, 1 + (chunk_seed >> 16) % 7);
    chunks.push_back(text.substr(pos, len));
    pos += len;
  }
  const Run whole = Parse(options, {text}, finish);
  const Run chunked = Parse(options, chunks, finish);
  CheckConsistent(whole);
  CheckConsistent(chunked);
  if (!SameResult(whole.result, chunked.result)) std::abort();
  // U+FFFD (3 bytes) may replace one byte; JSON mode turns text runs into single spaces.
  if (whole.result.content.size() + whole.result.reasoning.size() > 3 * text.size() + 1) {
    std::abort();
  }
  return 0;
}
