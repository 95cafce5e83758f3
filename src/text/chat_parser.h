// Incremental parser for DeepSeek V4 / V4.1 model output: splits generated text into reasoning,
// answer content and DSML tool calls (arguments streamed as JSON text), and watches for stop
// sequences. Results equal deepseek-recipe 0.2.0's parse of the whole output no matter how the
// text is chunked, including splits inside UTF-8 characters, special-token spellings and DSML tags
// (fixtures: tests/fixtures/chat/parse_cases.jsonl).
//
// The matcher works on bytes: every stage has a list of patterns (KMP), bytes that may still
// become a pattern are held back, and the first pattern to complete switches the stage. The
// stages and patterns mirror the oracle's state machine:
//   Common (answer) / Reasoning / Json / MatchedJson / ToolCalls / ToolName / ToolCallArguments /
//   ParamName / ParamType / ParamValue / Finished.
// Deliberate difference: in JSON-output mode the oracle turns each flushed run of text around the
// JSON into one space, so its output depends on chunking; here each such run between two
// matches is one space, which is what the oracle produces for the whole text in one piece.
//
// Malformed or truncated markup never fails: unknown text inside a tool block is skipped, a call
// whose name never ends is dropped, truncated arguments are reported as far as they got (as the
// oracle does). Invalid UTF-8 in the input becomes U+FFFD, so every emitted delta is valid UTF-8.
// Thread-compatible (one parser per generation stream).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer::text {

enum class ThinkingStage {
  kOff,                    // thinking disabled: answer content, leading newlines dropped
  kReasoningStart,         // prompt ended with "<think>": reasoning, leading newlines dropped
  kReasoningContinuation,  // continuing a prefix's reasoning: leading newlines kept
  kContentContinuation,    // continuing a prefix's answer after "</think>": newlines kept
};

struct OutputParserOptions {
  ThinkingStage thinking = ThinkingStage::kReasoningStart;
  bool parse_tool_calls = true;
  // The prompt already opened the tool-call block (tool_choice=required). Wins over `thinking`.
  bool starts_in_tool_calls = false;
  // Response format json_object: keep the JSON (fenced or bare), turn surrounding text to spaces.
  bool parse_json_output = false;
  // Matched only in answer text and JSON, never in reasoning or tool markup. Empty ones ignored.
  std::vector<std::string> stop_sequences;
  // Serving mode: output the oracle drops reaches the client as answer content. A tool-call block
  // that ends (or is cut off) before its next call is announced returns the text written since
  // the last complete call (the block's opening marker included, leading newlines not); in
  // JSON-output mode, text with no JSON at all is returned as it is instead of as one space.
  // Off for the oracle comparison (parse_cases.jsonl).
  bool recover_unparsed = false;
};

enum class BackendFinish { kStop, kLength, kContentFilter };
enum class FinishReason { kStop, kLength, kToolCalls, kContentFilter };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", ...

struct ParserEvent {
  enum class Kind {
    kReasoning,          // text: reasoning delta
    kContent,            // text: answer delta
    kToolCallBegin,      // tool_index, text: the tool name (arguments follow)
    kToolCallArguments,  // tool_index, text: arguments JSON delta
    kStopSequence,       // text: the stop sequence that ended the output
  };
  Kind kind = Kind::kContent;
  std::string text;
  int tool_index = -1;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text as streamed; incomplete if the output was truncated
};

struct ParseResult {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  std::optional<std::string> stop_sequence;  // the one that matched, if any
  FinishReason finish_reason = FinishReason::kStop;
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;
  ~OutputParser();

  // Consumes any bytes. Returns the deltas that are now certain (adjacent deltas of one kind are
  // merged). After a stop sequence, further input is ignored.
  std::vector<ParserEvent> Feed(std::string_view bytes);
  // Flushes held-back text (an unfinished marker is plain text after all) and fixes the finish
  // reason. Later Feed/Finish calls return nothing.
  std::vector<ParserEvent> Finish(BackendFinish backend_finish);

  // True once a stop sequence matched (generation can be cut) or Finish ran.
  bool done() const;
  // Accumulated so far; final after Finish.
  const ParseResult& result() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::text
