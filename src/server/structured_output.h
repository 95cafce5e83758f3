// Structured outputs: every API's spelling of "constrain the output" read into one grammar spec
// (src/grammar), compiled against the served model's vocabulary (cached by spec) and attached to
// the engine request. Spellings: OpenAI response_format (json_schema strict / non-strict,
// json_object) and the Responses API's text.format (converted to response_format first); vLLM's
// structured_outputs {json, regex, choice, grammar, json_object} and the older guided_json /
// guided_regex / guided_choice / guided_grammar; SGLang's json_schema / regex / ebnf. At most one
// may be given. With thinking on, the grammar applies after the reasoning's </think>.
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

// Reads the body's structured output and, when there is one, compiles it (Core::Grammars) into
// spec->params.grammar, applying after </think> when `thinking`. InvalidArgument (a 400) for an
// invalid or oversized schema / regex / choice / grammar, naming the problem.
Status AttachStructuredOutput(Service::Core& core, const Json& body, bool thinking,
                              GenerationSpec* spec);

}  // namespace dsinfer::server
