// Structured outputs: constrained decoding on a grammar engine (xgrammar's C++ core, built from
// its pinned PyPI source archive by cmake/Xgrammar.cmake). A side layer on core: it knows token
// ids and their bytes, not the tokenizer or the HTTP APIs. The server compiles a request's
// schema / regex / choice / EBNF into a CompiledGrammar (cached by its text); the engine gives
// each sequence a Matcher that masks the logits before every draw and accepts every drawn token.
// xgrammar's exceptions never leave this library: every failure is a Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsinfer::grammar {

// The model's vocabulary as the grammar sees it.
struct Vocabulary {
  // [<= vocab_size] the bytes each token id stands for; empty for tokens the grammar must never
  // take as text (added and special tokens: "<think>", DSML markers, BOS/EOS; ids naming none).
  std::vector<std::string> token_bytes;
  int32_t vocab_size = 0;               // the model's logits row (may exceed token_bytes)
  std::vector<int32_t> stop_token_ids;  // what ends a completed grammar's output (the EOS)
};

enum class GrammarKind {
  kJsonSchema,  // text: a JSON Schema document
  kJsonObject,  // any JSON object (OpenAI json_object); text unused
  kRegex,       // text: a regular expression the whole output matches
  kChoice,      // choices: the output is exactly one of them
  kEbnf,        // text: a GBNF-style EBNF grammar whose root rule is `root`
  // text: an xgrammar structural tag ({"type": "structural_tag", "format": {...}}): sequences of
  // literal markup, tags and JSON schemas, e.g. a tool-call block whose arguments follow each
  // tool's schema in the DeepSeek DSML parameter syntax (style "deepseek_xml").
  kStructuralTag,
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  // kJsonSchema: OpenAI's strict (objects take no properties the schema does not name); false
  // keeps JSON Schema's default (additional properties allowed unless the schema says not).
  bool strict = true;
};
const char* GrammarKindName(GrammarKind kind);  // "json_schema", "json_object", "regex", ...

// Bounds on what a request may ask to compile, so a pathological schema or grammar costs a 400
// instead of seconds of compile time and unbounded memory.
struct Limits {
  size_t max_text_bytes = 64 * 1024;  // a schema, regex or grammar's text
  // A structural tag's text: it may carry a whole tool list's schemas (a forced tool call over
  // an agent's tools); each embedded schema is still held to the bounds below.
  size_t max_structural_tag_bytes = 1024 * 1024;
  int max_json_depth = 32;            // nesting of a schema's JSON document
  size_t max_enum_values = 1024;      // enum / const values summed over a schema
  size_t max_choices = 256;           // guided_choice entries
  size_t max_choice_bytes = 1024;     // each choice
  int64_t max_repetition = 1024;      // {n,m} counts in a regex, minItems/maxItems/...Length
  // The product of those counts along a schema's nesting (an array of 999 arrays of 999
  // strings of 999 characters compiles for seconds): a bound on what one schema unrolls.
  int64_t max_nested_repetition = 1 << 16;
  int64_t cache_bytes = 256ll << 20;  // compiled grammars kept (least recently used dropped)
};

// Checks spec against limits (and that a schema parses as JSON) before any compilation:
// InvalidArgument naming the bound or the problem.
Status CheckLimits(const GrammarSpec& spec, const Limits& limits);

class CompiledGrammar;  // a grammar compiled against the vocabulary; immutable, shareable

// Compiles GrammarSpecs against one vocabulary; keeps compiled grammars keyed by their spec.
// Thread-safe (the server's request threads compile; the engine only makes Matchers).
class Compiler {
 public:
  static Result<std::unique_ptr<Compiler>> Create(Vocabulary vocabulary, Limits limits = {});
  ~Compiler();
  // InvalidArgument for a spec over the limits or that does not compile (message: the engine's
  // reason, e.g. the schema keyword or regex position it rejects).
  Result<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec);
  int32_t vocab_size() const;

 private:
  struct Impl;
  explicit Compiler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Words of a token bitmask over vocab_size tokens: bit (t % 32) of word t / 32 is token t.
int32_t BitmaskWords(int32_t vocab_size);

// Sets every logit whose token's bit is clear to -inf (tokens past the mask's bits too).
// logits: [vocab] f32; bitmask: [BitmaskWords(vocab)] u32.
void ApplyBitmask(std::span<float> logits, std::span<const uint32_t> bitmask);

// One sequence's position in a grammar. Not thread-safe; one per sequence.
class Matcher {
 public:
  static Result<std::unique_ptr<Matcher>> Create(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  // The tokens allowed next. bitmask: [BitmaskWords(vocab_size)] u32. After the grammar is
  // complete only its stop tokens are allowed; after it terminated, none.
  Status FillNextTokenBitmask(std::span<uint32_t> bitmask);
  // Advances by `token`; false (and no change) when the grammar does not allow it.
  bool AcceptToken(int32_t token);
  // True once a stop token was accepted after a complete output: nothing more may follow.
  bool IsTerminated() const;
  int32_t vocab_size() const;

 private:
  struct Impl;
  explicit Matcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::grammar
