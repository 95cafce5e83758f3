#include "server/structured_output.h"

#include <utility>
#include <vector>

#include "text/chat_render.h"

namespace dsinfer::server {
namespace {

using grammar::GrammarKind;
using grammar::GrammarSpec;

Status FieldError(const std::string& field, const std::string& what) {
  return InvalidArgument(field + ": " + what);
}

// A JSON Schema given as an object (or boolean), or as its JSON text (vLLM and SGLang accept
// both).
Result<GrammarSpec> SchemaSpec(const Json& value, const std::string& field, bool strict) {
  GrammarSpec spec{.kind = GrammarKind::kJsonSchema, .strict = strict};
  if (value.is_object() || value.is_boolean())
    spec.text = Dump(value);
  else if (value.is_string())
    spec.text = value.get<std::string>();
  else
    return FieldError(field, "must be a JSON Schema object or its JSON text");
  return spec;
}

Result<GrammarSpec> StringSpec(const Json& value, const std::string& field, GrammarKind kind) {
  if (!value.is_string()) return FieldError(field, "must be a string");
  return GrammarSpec{.kind = kind, .text = value.get<std::string>()};
}

Result<GrammarSpec> ChoiceSpec(const Json& value, const std::string& field) {
  if (!value.is_array()) return FieldError(field, "must be an array of strings");
  GrammarSpec spec{.kind = GrammarKind::kChoice};
  for (const Json& c : value) {
    if (!c.is_string()) return FieldError(field, "must be an array of strings");
    spec.choices.push_back(c.get<std::string>());
  }
  return spec;
}

// An xgrammar structural tag ({"type": "structural_tag", "format": {...}}), given as an object or
// as its JSON text (vLLM's structured_outputs.structural_tag). The older SGLang form
// (structures / triggers) is refused by name rather than misread.
Result<GrammarSpec> StructuralTagSpec(const Json& value, const std::string& field) {
  Json tag = value;
  if (value.is_string()) {
    tag = Json::parse(value.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (tag.is_discarded()) return FieldError(field, "is not valid JSON");
  }
  if (!tag.is_object()) return FieldError(field, "must be an object");
  if (!tag.contains("format")) {
    if (tag.contains("structures"))
      return FieldError(field,
                        "the structures/triggers form is not supported; give \"format\" "
                        "(xgrammar's structural tag)");
    return FieldError(field, "missing \"format\"");
  }
  tag["type"] = "structural_tag";
  return GrammarSpec{.kind = GrammarKind::kStructuralTag, .text = tag.dump()};
}

Result<std::optional<GrammarSpec>> ResponseFormatSpec(const Json& format) {
  if (!format.is_object()) return FieldError("response_format", "must be an object");
  DSINFER_ASSIGN_OR_RETURN(std::string type,
                           StringField(format, "type", "response_format", "text"));
  if (type == "text") return std::optional<GrammarSpec>();
  if (type == "json_object") return std::optional<GrammarSpec>(GrammarSpec{});
  if (type == "json_schema") {
    auto js = format.find("json_schema");
    if (js == format.end() || !js->is_object())
      return FieldError("response_format.json_schema", "missing");
    auto strict = js->find("strict");
    if (strict != js->end() && !strict->is_null() && !strict->is_boolean())
      return FieldError("response_format.json_schema.strict", "must be a boolean");
    auto schema = js->find("schema");
    DSINFER_ASSIGN_OR_RETURN(
        GrammarSpec spec,
        SchemaSpec(schema == js->end() || schema->is_null() ? Json::object() : *schema,
                   "response_format.json_schema.schema",
                   strict != js->end() && strict->is_boolean() && strict->get<bool>()));
    return std::optional<GrammarSpec>(std::move(spec));
  }
  if (type == "regex") {
    auto regex = format.find("regex");
    if (regex == format.end()) return FieldError("response_format.regex", "missing");
    DSINFER_ASSIGN_OR_RETURN(GrammarSpec spec,
                             StringSpec(*regex, "response_format.regex", GrammarKind::kRegex));
    return std::optional<GrammarSpec>(std::move(spec));
  }
  if (type == "structural_tag") {  // vLLM / SGLang: the tag's fields beside "type"
    DSINFER_ASSIGN_OR_RETURN(GrammarSpec spec, StructuralTagSpec(format, "response_format"));
    return std::optional<GrammarSpec>(std::move(spec));
  }
  return FieldError("response_format.type", "unknown value '" + type + "'");
}

// vLLM's structured_outputs object: exactly one of its constraint keys.
Result<std::vector<std::pair<std::string, GrammarSpec>>> VllmStructuredOutputs(const Json& so) {
  if (!so.is_object()) return FieldError("structured_outputs", "must be an object");
  std::vector<std::pair<std::string, GrammarSpec>> found;
  for (const auto& [key, value] : so.items()) {
    if (value.is_null()) continue;
    const std::string field = "structured_outputs." + key;
    if (key == "json") {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, SchemaSpec(value, field, /*strict=*/true));
      found.emplace_back(field, std::move(s));
    } else if (key == "regex") {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, StringSpec(value, field, GrammarKind::kRegex));
      found.emplace_back(field, std::move(s));
    } else if (key == "choice") {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, ChoiceSpec(value, field));
      found.emplace_back(field, std::move(s));
    } else if (key == "grammar") {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, StringSpec(value, field, GrammarKind::kEbnf));
      found.emplace_back(field, std::move(s));
    } else if (key == "json_object") {
      if (!value.is_boolean()) return FieldError(field, "must be a boolean");
      if (value.get<bool>()) found.emplace_back(field, GrammarSpec{});
    } else if (key == "structural_tag") {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, StructuralTagSpec(value, field));
      found.emplace_back(field, std::move(s));
    } else {
      // whitespace_pattern, backend options...: refused, not ignored.
      return FieldError(field,
                        "is not supported (json, regex, choice, grammar, json_object, "
                        "structural_tag are)");
    }
  }
  return found;
}

}  // namespace

Result<std::optional<GrammarSpec>> StructuredOutputSpec(const Json& body) {
  std::vector<std::pair<std::string, GrammarSpec>> found;
  auto present = [&](const char* key) -> const Json* {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* format = present("response_format")) {
    DSINFER_ASSIGN_OR_RETURN(auto spec, ResponseFormatSpec(*format));
    if (spec) found.emplace_back("response_format", std::move(*spec));
  }
  if (const Json* so = present("structured_outputs")) {
    DSINFER_ASSIGN_OR_RETURN(auto specs, VllmStructuredOutputs(*so));
    for (auto& s : specs) found.push_back(std::move(s));
  }
  // vLLM's older guided_* fields and SGLang's json_schema / regex / ebnf.
  if (const Json* v = present("guided_json")) {
    DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, SchemaSpec(*v, "guided_json", true));
    found.emplace_back("guided_json", std::move(s));
  }
  if (const Json* v = present("json_schema")) {
    DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, SchemaSpec(*v, "json_schema", true));
    found.emplace_back("json_schema", std::move(s));
  }
  for (const char* key : {"guided_regex", "regex"})
    if (const Json* v = present(key)) {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, StringSpec(*v, key, GrammarKind::kRegex));
      found.emplace_back(key, std::move(s));
    }
  for (const char* key : {"guided_grammar", "ebnf"})
    if (const Json* v = present(key)) {
      DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, StringSpec(*v, key, GrammarKind::kEbnf));
      found.emplace_back(key, std::move(s));
    }
  if (const Json* v = present("guided_choice")) {
    DSINFER_ASSIGN_OR_RETURN(GrammarSpec s, ChoiceSpec(*v, "guided_choice"));
    found.emplace_back("guided_choice", std::move(s));
  }
  if (found.empty()) return std::optional<GrammarSpec>();
  if (found.size() > 1)
    return InvalidArgument("only one structured output constraint may be given; got " +
                           found[0].first + " and " + found[1].first);
  return std::optional<GrammarSpec>(std::move(found[0].second));
}

grammar::Vocabulary GrammarVocabulary(const text::Tokenizer& tokenizer, int32_t vocab_size,
                                      int32_t eos_token_id) {
  grammar::Vocabulary v;
  const int32_t n = std::min(tokenizer.vocab_size(), vocab_size);
  v.token_bytes.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const std::string* bytes = tokenizer.TokenBytes(id);
    if (bytes != nullptr && !tokenizer.IsAddedToken(id)) v.token_bytes[id] = *bytes;
  }
  // The DSML marker is an added token the model writes inside tool-call markup: a tool-call
  // grammar spells "<｜DSML｜invoke ..." with it (or with plain tokens; the output parser reads
  // the text either way).
  if (std::optional<int32_t> dsml = tokenizer.TokenId(text::kDsmlToken); dsml && *dsml < n)
    v.token_bytes[*dsml] = text::kDsmlToken;
  v.vocab_size = vocab_size;
  if (eos_token_id >= 0 && eos_token_id < vocab_size) v.stop_token_ids = {eos_token_id};
  return v;
}

Result<std::optional<GrammarSpec>> ToolCallGrammarSpec(const text::ChatRequest& chat,
                                                       ToolCallForcing forcing, bool parallel) {
  if (forcing == ToolCallForcing::kNone || chat.tools.empty()) return std::optional<GrammarSpec>();
  const text::DsmlTags tags = text::DsmlTagsFor(chat.version);
  const std::string dsml = text::kDsmlToken;
  Json calls = Json::array();
  const Json no_parameters = {{"type", "object"}, {"properties", Json::object()}};
  for (const text::ToolDefinition& tool : chat.tools) {
    Json schema = no_parameters;  // no schema given, or null
    if (tool.parameters_json) {
      schema = Json::parse(*tool.parameters_json, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded())
        return FieldError("tools", "parameters of '" + tool.name + "' are not valid JSON");
      if (schema.is_null()) schema = no_parameters;
    }
    // As the template renders a call (chat_render.cc AppendToolCallsBlock): the invoke line, one
    // parameter per line, the closing tag.
    calls.push_back(Json{
        {"type", "tag"},
        {"begin", "<" + dsml + std::string(tags.invoke) + " name=\"" + tool.name + "\">\n"},
        {"content", {{"type", "json_schema"},
                     {"json_schema", schema},
                     // Parameters in the schema's order: xgrammar's any_order bounds only
                     // their count (a required one could be missing, another repeated).
                     // JSON values are rendered with single spaces (", ", ": "); a run of
                     // whitespace is never needed, and unbounded it lets a call run forever.
                     {"max_whitespace_cnt", 1},
                     {"style", chat.version == text::ModelVersion::kV41 ? "deepseek_v4_1_xml"
                                                                         : "deepseek_xml"}}},
        {"end", "</" + dsml + std::string(tags.invoke) + ">"}});
  }
  Json elements = Json::array();
  if (forcing == ToolCallForcing::kGrammarOpens)
    elements.push_back(Json{{"type", "const_string"},
                            {"value", "\n\n<" + dsml + std::string(tags.block) + ">\n"}});
  elements.push_back(Json{{"type", "tags_with_separator"},
                          {"tags", calls},
                          {"separator", "\n"},
                          {"at_least_one", true},
                          {"stop_after_first", !parallel}});
  elements.push_back(
      Json{{"type", "const_string"}, {"value", "\n</" + dsml + std::string(tags.block) + ">"}});
  Json tag = {{"type", "structural_tag"},
              {"format", {{"type", "sequence"}, {"elements", elements}}}};
  return std::optional<GrammarSpec>(
      GrammarSpec{.kind = GrammarKind::kStructuralTag, .text = tag.dump()});
}

Status AttachStructuredOutput(Service::Core& core, const Json& body, bool thinking,
                              GenerationSpec* spec, std::optional<GrammarSpec> tool_calls) {
  // The body's constraint is read (and refused when malformed) even when a forced tool call
  // takes its place.
  DSINFER_ASSIGN_OR_RETURN(std::optional<GrammarSpec> wanted, StructuredOutputSpec(body));
  if (tool_calls) wanted = std::move(tool_calls);
  if (!wanted) return Status::Ok();
  DSINFER_ASSIGN_OR_RETURN(grammar::Compiler * compiler, core.Grammars());
  DSINFER_ASSIGN_OR_RETURN(spec->params.grammar, compiler->Compile(*wanted));
  spec->params.grammar_after_token = -1;
  if (thinking) {
    const std::optional<int32_t> think_end = core.tokenizer->TokenId("</think>");
    if (!think_end) return Internal("structured output with thinking: no </think> token");
    spec->params.grammar_after_token = *think_end;
  }
  return Status::Ok();
}

Result<grammar::Compiler*> Service::Core::Grammars() {
  std::lock_guard<std::mutex> lock(grammar_mu);
  if (grammar_compiler == nullptr) {
    if (tokenizer == nullptr) return FailedPrecondition("no tokenizer attached");
    const int32_t vocab = model.vocab_size > 0 ? model.vocab_size : tokenizer->vocab_size();
    const int32_t eos =
        model.eos_token_id >= 0 ? model.eos_token_id : tokenizer->eos_id().value_or(-1);
    DSINFER_ASSIGN_OR_RETURN(grammar_compiler,
                             grammar::Compiler::Create(GrammarVocabulary(*tokenizer, vocab, eos)));
  }
  return grammar_compiler.get();
}

}  // namespace dsinfer::server
