#include "grammar/grammar.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

namespace dsinfer::grammar {

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, std::shared_ptr<const std::vector<uint32_t>> mask)
      : compiled(std::move(g)), also_allowed(std::move(mask)) {}
  xgrammar::CompiledGrammar compiled;
  // [BitmaskWords(vocab)] u32 ANDed into every mask xgrammar fills (null: none). JSON grammars
  // carry the tokens without a control byte (< 0x20): compact JSON has no raw control byte
  // anywhere, but xgrammar 0.2.8's length-bounded strings (minLength / maxLength) allow any byte
  // but '"', '\', '\r' and '\n' unescaped, so "\x0f" came out inside a string (invalid JSON).
  std::shared_ptr<const std::vector<uint32_t>> also_allowed;
};

namespace {

using Json = nlohmann::json;

// xgrammar reports errors as exceptions (std::runtime_error subclasses) with a file:line prefix
// from its logging macros; the reason after the last "] " or ": " prefix is what a client needs.
std::string Reason(const std::exception& e) {
  std::string what = e.what();
  // Its fatal-log messages read "[time] file.cc:line: reason"; keep the reason.
  if (size_t at = what.find(".cc:"); at != std::string::npos) {
    size_t colon = what.find(": ", at);
    if (colon != std::string::npos) what = what.substr(colon + 2);
  }
  while (!what.empty() && std::isspace(static_cast<unsigned char>(what.back()))) what.pop_back();
  return what;
}

// The keywords whose integer value a grammar engine unrolls into that many repetitions.
constexpr const char* kRepetitionKeywords[] = {"minItems",    "maxItems",      "minLength",
                                               "maxLength",   "minProperties", "maxProperties",
                                               "minContains", "maxContains"};

// {n} / {n,} / {n,m} counts in a regex: the largest (each is unrolled by the compiler).
int64_t LargestRegexCount(const std::string& regex) {
  int64_t largest = 0;
  for (size_t i = 0; i < regex.size(); ++i) {
    if (regex[i] == '\\') {
      ++i;
      continue;
    }
    if (regex[i] != '{') continue;
    int64_t value = 0;
    bool digits = false;
    for (size_t j = i + 1; j < regex.size(); ++j) {
      const char c = regex[j];
      if (c >= '0' && c <= '9') {
        value = std::min<int64_t>(value * 10 + (c - '0'), std::numeric_limits<int32_t>::max());
        digits = true;
      } else {
        if (digits) largest = std::max(largest, value);
        value = 0;
        digits = false;
        if (c != ',') break;
      }
    }
  }
  return largest;
}

struct SchemaWalk {
  const Limits& limits;
  size_t enum_values = 0;

  // nested: the product of the repetition counts of the schemas enclosing `node`.
  Status Walk(const Json& node, int depth, int64_t nested) {
    if (depth > limits.max_json_depth)
      return InvalidArgument("schema nests deeper than " + std::to_string(limits.max_json_depth) +
                             " levels");
    if (node.is_array()) {
      for (const Json& item : node) DSINFER_RETURN_IF_ERROR(Walk(item, depth + 1, nested));
      return Status::Ok();
    }
    if (!node.is_object()) return Status::Ok();
    int64_t count = 1;  // this schema's largest repetition count
    for (const auto& [key, value] : node.items())
      for (const char* keyword : kRepetitionKeywords) {
        if (key != keyword || !value.is_number()) continue;
        if (value.get<double>() > static_cast<double>(limits.max_repetition))
          return InvalidArgument("schema " + key + " is over " +
                                 std::to_string(limits.max_repetition));
        if (value.get<double>() >= 1) count = std::max(count, value.get<int64_t>());
      }
    nested *= count;  // at most 2^16 * 1024: no overflow
    if (nested > limits.max_nested_repetition)
      return InvalidArgument(
          "schema's nested repetition counts (maxItems, maxLength, ...) "
          "multiply to more than " +
          std::to_string(limits.max_nested_repetition));
    for (const auto& [key, value] : node.items()) {
      if (key == "enum" && value.is_array()) enum_values += value.size();
      if (key == "const") ++enum_values;
      if (key == "pattern" && value.is_string() &&
          LargestRegexCount(value.get<std::string>()) > limits.max_repetition)
        return InvalidArgument("schema pattern repeats more than " +
                               std::to_string(limits.max_repetition) + " times");
      DSINFER_RETURN_IF_ERROR(Walk(value, depth + 1, nested));
    }
    if (enum_values > limits.max_enum_values)
      return InvalidArgument("schema has more than " + std::to_string(limits.max_enum_values) +
                             " enum/const values");
    return Status::Ok();
  }
};

// A structural tag's embedded JSON schemas (every "json_schema" member) and regexes ("pattern"
// of a regex format) are held to the same bounds as a schema or regex given alone; the enum
// budget is shared by all of them, as one grammar carries them all.
Status CheckEmbeddedSchemas(const Json& node, const Limits& limits, int depth,
                            SchemaWalk* schemas) {
  if (depth > limits.max_json_depth)
    return InvalidArgument("structural_tag nests deeper than " +
                           std::to_string(limits.max_json_depth) + " levels");
  if (node.is_array()) {
    for (const Json& item : node)
      DSINFER_RETURN_IF_ERROR(CheckEmbeddedSchemas(item, limits, depth + 1, schemas));
    return Status::Ok();
  }
  if (!node.is_object()) return Status::Ok();
  for (const auto& [key, value] : node.items()) {
    if (key == "json_schema" && (value.is_object() || value.is_boolean())) {
      DSINFER_RETURN_IF_ERROR(schemas->Walk(value, depth + 1, 1));
    } else if (key == "json_schema" && value.is_string()) {
      Json parsed = Json::parse(value.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) return InvalidArgument("structural_tag json_schema is not JSON");
      DSINFER_RETURN_IF_ERROR(schemas->Walk(parsed, depth + 1, 1));
    } else if (key == "pattern" && value.is_string() &&
               LargestRegexCount(value.get<std::string>()) > limits.max_repetition) {
      return InvalidArgument("structural_tag pattern repeats more than " +
                             std::to_string(limits.max_repetition) + " times");
    } else {
      DSINFER_RETURN_IF_ERROR(CheckEmbeddedSchemas(value, limits, depth + 1, schemas));
    }
  }
  return Status::Ok();
}

// An EBNF string literal of `text` (UTF-8): quote, backslash and control bytes escaped, each
// control byte as a fixed-width \uXXXX so a hex digit after it cannot extend it.
std::string EbnfLiteral(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

const char* GrammarKindName(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema:
      return "json_schema";
    case GrammarKind::kJsonObject:
      return "json_object";
    case GrammarKind::kRegex:
      return "regex";
    case GrammarKind::kChoice:
      return "choice";
    case GrammarKind::kEbnf:
      return "grammar";
    case GrammarKind::kStructuralTag:
      return "structural_tag";
  }
  return "?";
}

Status CheckLimits(const GrammarSpec& spec, const Limits& limits) {
  const std::string what = GrammarKindName(spec.kind);
  const size_t max_bytes = spec.kind == GrammarKind::kStructuralTag
                              ? limits.max_structural_tag_bytes
                              : limits.max_text_bytes;
  if (spec.text.size() > max_bytes)
    return InvalidArgument(what + " is longer than " + std::to_string(max_bytes) +
                           " bytes");
  switch (spec.kind) {
    case GrammarKind::kJsonSchema: {
      Json schema = Json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return InvalidArgument("json_schema is not valid JSON");
      if (!schema.is_object() && !schema.is_boolean())
        return InvalidArgument("json_schema must be a JSON object");
      return SchemaWalk{limits}.Walk(schema, 0, 1);
    }
    case GrammarKind::kJsonObject:
      return Status::Ok();
    case GrammarKind::kRegex:
      if (spec.text.empty()) return InvalidArgument("regex is empty");
      if (LargestRegexCount(spec.text) > limits.max_repetition)
        return InvalidArgument("regex repeats more than " + std::to_string(limits.max_repetition) +
                               " times");
      return Status::Ok();
    case GrammarKind::kChoice:
      if (spec.choices.empty()) return InvalidArgument("choice needs at least one entry");
      if (spec.choices.size() > limits.max_choices)
        return InvalidArgument("choice has more than " + std::to_string(limits.max_choices) +
                               " entries");
      for (const std::string& c : spec.choices) {
        if (c.empty()) return InvalidArgument("choice entries must not be empty");
        if (c.size() > limits.max_choice_bytes)
          return InvalidArgument("a choice entry is longer than " +
                                 std::to_string(limits.max_choice_bytes) + " bytes");
      }
      return Status::Ok();
    case GrammarKind::kEbnf:
      if (spec.text.empty()) return InvalidArgument("grammar is empty");
      return Status::Ok();
    case GrammarKind::kStructuralTag: {
      Json tag = Json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (tag.is_discarded() || !tag.is_object())
        return InvalidArgument("structural_tag must be a JSON object");
      SchemaWalk schemas{limits};
      return CheckEmbeddedSchemas(tag, limits, 0, &schemas);
    }
  }
  return InvalidArgument("unknown grammar kind");
}

struct Compiler::Impl {
  Limits limits;
  int32_t vocab_size = 0;
  std::optional<xgrammar::GrammarCompiler> compiler;
  // [BitmaskWords(vocab_size)] u32: set for every token whose bytes hold no control byte (< 0x20);
  // special tokens ("" bytes) and ids past the tokenizer's are left to xgrammar.
  std::shared_ptr<const std::vector<uint32_t>> no_control_bytes;
};

Compiler::Compiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Compiler::~Compiler() = default;

Result<std::unique_ptr<Compiler>> Compiler::Create(Vocabulary vocabulary, Limits limits) {
  if (vocabulary.vocab_size <= 0 ||
      static_cast<int64_t>(vocabulary.token_bytes.size()) > vocabulary.vocab_size)
    return InvalidArgument("grammar vocabulary: " + std::to_string(vocabulary.token_bytes.size()) +
                           " tokens for a vocab_size of " + std::to_string(vocabulary.vocab_size));
  for (int32_t id : vocabulary.stop_token_ids)
    if (id < 0 || id >= vocabulary.vocab_size)
      return InvalidArgument("grammar vocabulary: stop token " + std::to_string(id) +
                             " is outside the vocabulary");
  auto impl = std::make_unique<Impl>();
  impl->limits = limits;
  impl->vocab_size = vocabulary.vocab_size;
  auto no_control = std::make_shared<std::vector<uint32_t>>(
      static_cast<size_t>(BitmaskWords(vocabulary.vocab_size)), ~0u);
  for (size_t id = 0; id < vocabulary.token_bytes.size(); ++id) {
    const std::string& bytes = vocabulary.token_bytes[id];
    if (std::any_of(bytes.begin(), bytes.end(),
                    [](char b) { return static_cast<unsigned char>(b) < 0x20; }))
      (*no_control)[id / 32] &= ~(1u << (id % 32));
  }
  impl->no_control_bytes = std::move(no_control);
  try {
    // RAW: the strings are the tokens' bytes as they are; "" marks a token xgrammar treats as
    // special (never text).
    xgrammar::TokenizerInfo info(vocabulary.token_bytes, xgrammar::VocabType::RAW,
                                 vocabulary.vocab_size, vocabulary.stop_token_ids);
    // Two threads: a compile runs on a request thread, beside the engine's compute threads.
    impl->compiler.emplace(info, /*max_threads=*/2, /*cache_enabled=*/true, limits.cache_bytes);
  } catch (const std::exception& e) {
    return Internal("grammar engine: " + Reason(e));
  }
  return std::unique_ptr<Compiler>(new Compiler(std::move(impl)));
}

int32_t Compiler::vocab_size() const { return impl_->vocab_size; }

Result<std::shared_ptr<const CompiledGrammar>> Compiler::Compile(const GrammarSpec& spec) {
  DSINFER_RETURN_IF_ERROR(CheckLimits(spec, impl_->limits));
  xgrammar::GrammarCompiler& c = *impl_->compiler;
  try {
    // Compact JSON (no free whitespace): a model cannot spend its tokens on indentation runs,
    // and every output still parses as the schema's JSON.
    constexpr bool kAnyWhitespace = false;
    switch (spec.kind) {
      case GrammarKind::kJsonSchema:
        return std::make_shared<const CompiledGrammar>(
            c.CompileJSONSchema(spec.text, kAnyWhitespace, std::nullopt, std::nullopt,
                                spec.strict),
            impl_->no_control_bytes);
      case GrammarKind::kJsonObject:
        return std::make_shared<const CompiledGrammar>(
            c.CompileJSONSchema(R"({"type":"object"})", kAnyWhitespace, std::nullopt,
                                std::nullopt, false),
            impl_->no_control_bytes);
      case GrammarKind::kRegex:
        return std::make_shared<const CompiledGrammar>(c.CompileRegex(spec.text), nullptr);
      case GrammarKind::kChoice: {
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < spec.choices.size(); ++i)
          ebnf += (i ? " | " : "") + EbnfLiteral(spec.choices[i]);
        return std::make_shared<const CompiledGrammar>(c.CompileGrammar(ebnf, "root"), nullptr);
      }
      case GrammarKind::kEbnf:
        return std::make_shared<const CompiledGrammar>(c.CompileGrammar(spec.text, "root"),
                                                       nullptr);
      case GrammarKind::kStructuralTag:
        // No control-byte mask: raw string parameters (DSML string="true") may hold newlines.
        return std::make_shared<const CompiledGrammar>(c.CompileStructuralTag(spec.text),
                                                       nullptr);
    }
  } catch (const std::exception& e) {
    return InvalidArgument(std::string(GrammarKindName(spec.kind)) +
                           " does not compile: " + Reason(e));
  }
  return InvalidArgument("unknown grammar kind");
}

int32_t BitmaskWords(int32_t vocab_size) { return (vocab_size + 31) / 32; }

void ApplyBitmask(std::span<float> logits, std::span<const uint32_t> bitmask) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const size_t covered = std::min(logits.size(), bitmask.size() * 32);
  // Word by word: inside a string or a free-text span almost every word is all ones (nothing to
  // do) and outside one almost every word is zero, so the per-bit loop runs only on mixed words.
  for (size_t word = 0; word * 32 < covered; ++word) {
    const uint32_t bits = bitmask[word];
    const size_t begin = word * 32;
    const size_t end = std::min(covered, begin + 32);
    if (bits == ~0u) continue;
    for (size_t t = begin; t < end; ++t)
      if (((bits >> (t - begin)) & 1u) == 0) logits[t] = minus_inf;
  }
  for (size_t t = covered; t < logits.size(); ++t) logits[t] = minus_inf;
}

struct Matcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  std::optional<xgrammar::GrammarMatcher> matcher;
  int32_t vocab_size = 0;
};

Matcher::Matcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matcher::~Matcher() = default;

Result<std::unique_ptr<Matcher>> Matcher::Create(std::shared_ptr<const CompiledGrammar> grammar) {
  if (!grammar) return InvalidArgument("grammar matcher: no grammar");
  auto impl = std::make_unique<Impl>();
  try {
    impl->vocab_size = grammar->compiled.GetTokenizerInfo().GetVocabSize();
    // The tokenizer's stop tokens end the output; no rollback history is kept (tokens are
    // accepted only once drawn).
    impl->matcher.emplace(grammar->compiled, std::nullopt, /*terminate_without_stop_token=*/false,
                          /*max_rollback_tokens=*/0);
  } catch (const std::exception& e) {
    return Internal("grammar matcher: " + Reason(e));
  }
  impl->grammar = std::move(grammar);
  return std::unique_ptr<Matcher>(new Matcher(std::move(impl)));
}

int32_t Matcher::vocab_size() const { return impl_->vocab_size; }

Status Matcher::FillNextTokenBitmask(std::span<uint32_t> bitmask) {
  if (static_cast<int64_t>(bitmask.size()) != BitmaskWords(impl_->vocab_size))
    return InvalidArgument("grammar bitmask: " + std::to_string(bitmask.size()) + " words for " +
                           std::to_string(impl_->vocab_size) + " tokens");
  if (impl_->matcher->IsTerminated()) {
    std::fill(bitmask.begin(), bitmask.end(), 0u);
    return Status::Ok();
  }
  int64_t shape[1] = {static_cast<int64_t>(bitmask.size())};
  DLTensor tensor{};
  tensor.data = bitmask.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();  // int32: the same bits as our u32 words
  tensor.shape = shape;
  tensor.strides = nullptr;
  tensor.byte_offset = 0;
  try {
    impl_->matcher->FillNextTokenBitmask(&tensor);
  } catch (const std::exception& e) {
    return Internal("grammar matcher: " + Reason(e));
  }
  if (const auto& also = impl_->grammar->also_allowed; also != nullptr)
    for (size_t w = 0; w < bitmask.size() && w < also->size(); ++w) bitmask[w] &= (*also)[w];
  return Status::Ok();
}

bool Matcher::AcceptToken(int32_t token) {
  if (token < 0 || token >= impl_->vocab_size || impl_->matcher->IsTerminated()) return false;
  try {
    return impl_->matcher->AcceptToken(token);
  } catch (const std::exception&) {
    return false;
  }
}

bool Matcher::IsTerminated() const { return impl_->matcher->IsTerminated(); }

}  // namespace dsinfer::grammar
