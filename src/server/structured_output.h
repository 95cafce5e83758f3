// Structured outputs: every API's spelling of "constrain the output" read into one grammar spec
// (src/grammar), compiled against the served model's vocabulary (cached by spec) and attached to
// the engine request. Spellings: OpenAI response_format (json_schema strict / non-strict,
// json_object) and the Responses API's text.format (converted to response_format first); vLLM's
// structured_outputs {json, regex, choice, grammar, json_object} and the older guided_json /
// guided_regex / guided_choice / guided_grammar; SGLang's json_schema / regex / ebnf. At most one
// may be given. With thinking on, the grammar applies after the reasoning's </think>.
//
// Forced tool calls (tool_choice "required" or a named function, Anthropic "any" / "tool") are
// a grammar too: the DSML tool-call block with one tag per tool whose parameters follow that
// tool's JSON schema (xgrammar's structural tag, parameter style "deepseek_xml"), so every call
// parses and its arguments validate. It takes the place of a response_format: a forced turn's
// output is the tool calls, which carry no answer text for a format to shape.
#pragma once

#include <optional>

#include "grammar/grammar.h"
#include "server/service_core.h"

namespace dsinfer::server {

// The request's structured-output spec (nullopt: none asked for). InvalidArgument naming the
// field for a malformed one, or for two given at once.
Result<std::optional<grammar::GrammarSpec>> StructuredOutputSpec(const Json& body);

// The served model's vocabulary as the grammar sees it: token id -> bytes, added tokens (chat
// markup, BOS/EOS) as no text, the EOS as the stop token.
grammar::Vocabulary GrammarVocabulary(const text::Tokenizer& tokenizer, int32_t vocab_size,
                                      int32_t eos_token_id);

// Where a forced tool call's block is opened.
enum class ToolCallForcing {
  kNone,          // the model may answer or call tools as it likes
  kPromptOpened,  // tool_choice required / named: the rendered prompt ends inside the block
  kGrammarOpens,  // Anthropic "any": the prompt is rendered as "auto" (as the official converter
                  // does), the grammar makes the output start with the block
};

// The grammar of a forced tool-call turn: `parallel` false allows exactly one call, true one or
// more. nullopt for kNone or a request without tools.
Result<std::optional<grammar::GrammarSpec>> ToolCallGrammarSpec(const text::ChatRequest& chat,
                                                                ToolCallForcing forcing,
                                                                bool parallel);

// Compiles the turn's grammar (Core::Grammars) into spec->params.grammar, applying after
// </think> when `thinking`: `tool_calls` when the tool call is forced, else the body's structured
// output, if any. InvalidArgument (a 400) for an invalid or oversized schema / regex / choice /
// grammar, naming the problem.
Status AttachStructuredOutput(Service::Core& core, const Json& body, bool thinking,
                              GenerationSpec* spec,
                              std::optional<grammar::GrammarSpec> tool_calls = std::nullopt);

}  // namespace dsinfer::server
