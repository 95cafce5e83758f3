// Structured outputs' request mapping: every API spelling becomes the right grammar spec, two at
// once or a malformed one is a 400 naming the field, and the service hands the engine a compiled
// grammar that applies after </think> when thinking is on (the real V4 tokenizer).
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include "service_harness.h"
#include "text/chat_parser.h"
#include "text/chat_render.h"

namespace dsinfer::server {
namespace {

using grammar::GrammarKind;
using testing::Service;

grammar::GrammarSpec SpecOf(const std::string& body) {
  auto spec = StructuredOutputSpec(Json::parse(body));
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec.ok() && spec->has_value()) << body;
  return spec.ok() && spec->has_value() ? **spec : grammar::GrammarSpec{};
}

std::string ErrorOf(const std::string& body) {
  auto spec = StructuredOutputSpec(Json::parse(body));
  EXPECT_FALSE(spec.ok()) << body;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  return spec.status().message();
}

TEST(StructuredOutputSpec, EveryApiSpellingMapsToItsGrammar) {
  auto s = SpecOf(R"j({"response_format":{"type":"json_schema","json_schema":{"name":"x",
      "strict":true,"schema":{"type":"object"}}}})j");
  EXPECT_EQ(s.kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(Json::parse(s.text), Json::parse(R"j({"type":"object"})j"));
  EXPECT_TRUE(s.strict);
  s = SpecOf(
      R"j({"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"integer"}}}})j");
  EXPECT_FALSE(s.strict) << "non-strict unless asked";
  EXPECT_EQ(SpecOf(R"j({"response_format":{"type":"json_object"}})j").kind,
            GrammarKind::kJsonObject);
  s = SpecOf(R"j({"response_format":{"type":"regex","regex":"a+"}})j");
  EXPECT_EQ(s.kind, GrammarKind::kRegex);
  EXPECT_EQ(s.text, "a+");
  s = SpecOf(R"j({"structured_outputs":{"json":{"type":"string"}}})j");
  EXPECT_EQ(s.kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(SpecOf(R"j({"structured_outputs":{"regex":"[0-9]+"}})j").kind, GrammarKind::kRegex);
  s = SpecOf(R"j({"structured_outputs":{"choice":["yes","no"]}})j");
  EXPECT_EQ(s.kind, GrammarKind::kChoice);
  EXPECT_EQ(s.choices, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ(SpecOf(R"j({"structured_outputs":{"grammar":"root ::= \"a\""}})j").kind,
            GrammarKind::kEbnf);
  EXPECT_EQ(SpecOf(R"j({"structured_outputs":{"json_object":true}})j").kind,
            GrammarKind::kJsonObject);
  s = SpecOf(R"j({"guided_json":"{\"type\":\"boolean\"}"})j");
  EXPECT_EQ(s.kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(s.text, R"j({"type":"boolean"})j");
  EXPECT_EQ(SpecOf(R"j({"guided_regex":"x"})j").kind, GrammarKind::kRegex);
  EXPECT_EQ(SpecOf(R"j({"guided_choice":["a"]})j").kind, GrammarKind::kChoice);
  EXPECT_EQ(SpecOf(R"j({"guided_grammar":"root ::= \"a\""})j").kind, GrammarKind::kEbnf);
  EXPECT_EQ(SpecOf(R"j({"json_schema":{"type":"null"}})j").kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(SpecOf(R"j({"regex":"b"})j").kind, GrammarKind::kRegex);
  EXPECT_EQ(SpecOf(R"j({"ebnf":"root ::= \"b\""})j").kind, GrammarKind::kEbnf);
  s = SpecOf(R"j({"response_format":{"type":"structural_tag","format":{"type":"const_string",)j"
             R"j("value":"hi"}}})j");
  EXPECT_EQ(s.kind, GrammarKind::kStructuralTag);
  EXPECT_EQ(Json::parse(s.text),
            Json::parse(R"j({"type":"structural_tag","format":{"type":"const_string","value":"hi"}})j"));
  s = SpecOf(R"j({"structured_outputs":{"structural_tag":)j"
             R"j("{\"format\":{\"type\":\"const_string\",\"value\":\"hi\"}}"}})j");
  EXPECT_EQ(s.kind, GrammarKind::kStructuralTag);
  EXPECT_EQ(Json::parse(s.text)["format"]["value"], "hi");
  for (const char* none : {R"j({})j", R"j({"response_format":{"type":"text"}})j",
                           R"j({"guided_json":null,"response_format":null})j"}) {
    auto spec = StructuredOutputSpec(Json::parse(none));
    ASSERT_TRUE(spec.ok());
    EXPECT_FALSE(spec->has_value()) << none;
  }
}

TEST(StructuredOutputSpec, MalformedOrConflictingFieldsAreNamed) {
  EXPECT_NE(ErrorOf(R"j({"guided_regex":"a","response_format":{"type":"json_object"}})j")
                .find("only one structured output"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"structured_outputs":{"regex":"a","choice":["b"]}})j").find("only one"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"guided_choice":"a"})j").find("guided_choice"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"guided_choice":["a",1]})j").find("guided_choice"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"guided_json":3})j").find("guided_json"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"regex":["a"]})j").find("regex: must be a string"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"structured_outputs":{"structural_tag":"x"}})j")
                .find("structured_outputs.structural_tag"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"structured_outputs":"a"})j").find("structured_outputs"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"response_format":{"type":"json_schema"}})j")
                .find("response_format.json_schema"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"response_format":{"type":"json_schema","json_schema":{"strict":"yes"}}})j")
                .find("strict"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"response_format":{"type":"yaml"}})j").find("yaml"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"response_format":{"type":"structural_tag","structures":[]}})j")
                .find("structures/triggers form is not supported"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"structured_outputs":{"structural_tag":{}}})j").find("missing"),
            std::string::npos);
}

std::string Chat(const std::string& extra, bool thinking) {
  return R"j({"messages":[{"role":"user","content":"give json"}],"max_tokens":8,)j"
         R"j("chat_template_kwargs":{"thinking":)j" +
         std::string(thinking ? "true" : "false") + "}," + extra + "}";
}

TEST(StructuredOutputService, TheEngineGetsTheCompiledGrammarAfterThinking) {
  auto& service = Service();
  const auto think_end = service.tokenizer().TokenId("</think>");
  ASSERT_TRUE(think_end.has_value());
  auto reply = service.Post("/v1/chat/completions",
                            Chat(R"j("guided_regex":"(yes|no)")j", /*thinking=*/true), "yes");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NE(service.last_params().grammar, nullptr);
  EXPECT_EQ(service.last_params().grammar_after_token, *think_end);
  reply = service.Post(
      "/v1/chat/completions",
      Chat(R"j("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}})j",
           /*thinking=*/false),
      "{}");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NE(service.last_params().grammar, nullptr);
  EXPECT_EQ(service.last_params().grammar_after_token, -1);
  reply = service.Post("/v1/completions",
                       R"j({"prompt":"x","max_tokens":4,"guided_choice":["a","b"]})j",
                       "a");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NE(service.last_params().grammar, nullptr);
  reply = service.Post("/v1/responses",
                       R"j({"input":"x","max_output_tokens":4,"reasoning":{"effort":"none"},
                           "text":{"format":{"type":"json_schema","name":"n","strict":true,
                                             "schema":{"type":"object"}}}})j",
                       "{}");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NE(service.last_params().grammar, nullptr);
  reply = service.Post("/v1/chat/completions", Chat(R"j("temperature":0.5)j", false), "hi");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(service.last_params().grammar, nullptr) << "no constraint unless asked";
}

TEST(StructuredOutputService, InvalidOrPathologicalSpecsAre400sNamingTheProblem) {
  auto& service = Service();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"j("guided_regex":"(unclosed")j", "regex does not compile"},
      {R"j("structured_outputs":{"grammar":"root ::= missing_rule"})j", "grammar does not compile"},
      {R"j("guided_json":"{not json")j", "not valid JSON"},
      {R"j("guided_json":{"type":"array","maxItems":1000000})j", "maxItems is over"},
      {R"j("guided_choice":[])j", "at least one"},
      {R"j("guided_json":{"$ref":"#/$defs/nowhere"})j", "json_schema does not compile"},
  };
  for (const auto& [field, message] : cases) {
    auto reply = service.Post("/v1/chat/completions", Chat(field, false));
    EXPECT_EQ(reply.status, 400) << field << " -> " << reply.body;
    EXPECT_NE(reply.body.find(message), std::string::npos) << field << " -> " << reply.body;
  }
  std::string deep = R"j({"type":"string"})j";
  for (int i = 0; i < 40; ++i) deep = R"j({"type":"array","items":)j" + deep + "}";
  auto reply = service.Post("/v1/chat/completions", Chat(R"j("guided_json":)j" + deep, false));
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("nests deeper"), std::string::npos) << reply.body;
}

TEST(GrammarVocabulary, AddedTokensAreNoTextAndEosStops) {
  const text::Tokenizer& tok = Service().tokenizer();
  const auto think_end = tok.TokenId("</think>");
  ASSERT_TRUE(think_end && tok.eos_id());
  grammar::Vocabulary v = GrammarVocabulary(tok, tok.vocab_size() + 100, *tok.eos_id());
  EXPECT_EQ(v.vocab_size, tok.vocab_size() + 100);
  ASSERT_EQ(static_cast<int32_t>(v.token_bytes.size()), tok.vocab_size());
  EXPECT_EQ(v.token_bytes[*think_end], "");
  EXPECT_EQ(v.token_bytes[*tok.eos_id()], "");
  EXPECT_EQ(v.stop_token_ids, (std::vector<int32_t>{*tok.eos_id()}));
  auto a = tok.Encode("a", false);
  ASSERT_TRUE(a.ok() && a->size() == 1);
  EXPECT_EQ(v.token_bytes[(*a)[0]], "a");
}

// ---- forced tool calls ----------------------------------------------------------------------

const char* kWeatherSchema = R"j({"type":"object","properties":{
    "city":{"type":"string"},
    "unit":{"type":"string","enum":["c","f"]},
    "days":{"type":"integer","minimum":1,"maximum":7},
    "hourly":{"type":"boolean"},
    "where":{"type":"object","properties":{"lat":{"type":"number"}},"required":["lat"]},
    "code":{"$ref":"#/$defs/short"}},
  "required":["city","days"],
  "$defs":{"short":{"type":"string","minLength":1,"maxLength":3}}})j";

text::ChatRequest ToolRequest(text::ModelVersion version) {
  text::ChatRequest chat;
  chat.version = version;
  chat.thinking = false;
  chat.tool_choice = text::ToolChoice::kRequired;
  chat.tools.push_back({.name = "get_weather", .parameters_json = kWeatherSchema});
  chat.tools.push_back({.name = "now"});  // no parameters
  chat.messages.push_back({.role = text::Role::kUser, .content = "weather?"});
  return chat;
}

// The tool-call block the template renders for `calls` in an assistant turn: the text after
// the block's opening line, as the model writes it after a forced prompt.
std::string RenderedCalls(text::ModelVersion version, std::vector<text::ToolCall> calls) {
  text::ChatRequest chat = ToolRequest(version);
  chat.tool_choice = text::ToolChoice::kAuto;
  chat.messages.push_back({.role = text::Role::kAssistant, .tool_calls = std::move(calls)});
  auto prompt = text::RenderPrompt(chat);
  EXPECT_TRUE(prompt.ok()) << prompt.status().ToString();
  const text::DsmlTags tags = text::DsmlTagsFor(version);
  const std::string open = "<" + std::string(text::kDsmlToken) + std::string(tags.block) + ">\n";
  const std::string close = "</" + std::string(text::kDsmlToken) + std::string(tags.block) + ">";
  const size_t from = prompt->rfind(open);
  const size_t to = prompt->rfind(close);
  EXPECT_TRUE(from != std::string::npos && to != std::string::npos) << *prompt;
  return prompt->substr(from + open.size(), to + close.size() - from - open.size());
}

class ToolCallGrammar : public ::testing::TestWithParam<text::ModelVersion> {
 protected:
  static void SetUpTestSuite() {
    const text::Tokenizer& tok = Service().tokenizer();
    auto compiler = grammar::Compiler::Create(
        GrammarVocabulary(tok, tok.vocab_size(), *tok.eos_id()));
    ASSERT_TRUE(compiler.ok()) << compiler.status().ToString();
    compiler_ = std::move(*compiler).release();
  }
  static void TearDownTestSuite() { delete compiler_; }

  // Whether the grammar takes `text` token by token (DSML markers as the added token when
  // `special`, spelled in plain tokens otherwise) and then allows the EOS.
  // `taken`, when given, gets what the grammar took before it refused (for failure messages).
  static bool Accepts(const grammar::GrammarSpec& spec, const std::string& text, bool special,
                      std::string* taken = nullptr) {
    std::string took;
    if (taken == nullptr) taken = &took;
    const text::Tokenizer& tok = Service().tokenizer();
    auto compiled = compiler_->Compile(spec);
    EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
    if (!compiled.ok()) return false;
    auto matcher = grammar::Matcher::Create(*compiled);
    EXPECT_TRUE(matcher.ok());
    auto ids = tok.Encode(text, special);
    EXPECT_TRUE(ids.ok());
    taken->clear();
    for (int32_t id : *ids) {
      if (!(*matcher)->AcceptToken(id)) return false;
      if (const std::string* bytes = tok.TokenBytes(id)) *taken += *bytes;
    }
    return (*matcher)->AcceptToken(*tok.eos_id());
  }

  static grammar::Compiler* compiler_;
};
grammar::Compiler* ToolCallGrammar::compiler_ = nullptr;

TEST_P(ToolCallGrammar, TakesWhatTheTemplateRendersAndParsesBack) {
  const text::ModelVersion version = GetParam();
  auto spec = ToolCallGrammarSpec(ToolRequest(version), ToolCallForcing::kPromptOpened, true);
  ASSERT_TRUE(spec.ok() && spec->has_value()) << spec.status().ToString();
  EXPECT_EQ((*spec)->kind, GrammarKind::kStructuralTag);
  const std::vector<text::ToolCall> calls = {
      {.name = "get_weather",
       .arguments = R"j({"city":"Paris <3</b>\nnew line","unit":"c","days":3,"hourly":false,)j"
                    R"j("where":{"lat":48.85}})j"},
      {.name = "now", .arguments = "{}"},
      {.name = "get_weather", .arguments = R"j({"city":"Oslo","days":7})j"}};
  const std::string block = RenderedCalls(version, calls);
  std::string taken;
  EXPECT_TRUE(Accepts(**spec, block, /*special=*/true, &taken))
      << block << "\nrefused after: " << taken;
  EXPECT_TRUE(Accepts(**spec, block, /*special=*/false, &taken))
      << "DSML spelled in plain tokens; refused after: " << taken;

  // What the engine's output parser makes of it: the calls, arguments as JSON.
  text::OutputParserOptions options;
  options.starts_in_tool_calls = true;
  text::OutputParser parser(options);
  parser.Feed(block);
  parser.Finish(text::BackendFinish::kStop);
  const text::ParseResult& parsed = parser.result();
  ASSERT_EQ(parsed.tool_calls.size(), calls.size()) << block;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(parsed.tool_calls[i].name, calls[i].name);
    EXPECT_EQ(Json::parse(parsed.tool_calls[i].arguments), Json::parse(calls[i].arguments));
  }
}

TEST_P(ToolCallGrammar, RefusesCallsOutsideTheSchemas) {
  const text::ModelVersion version = GetParam();
  auto spec = ToolCallGrammarSpec(ToolRequest(version), ToolCallForcing::kPromptOpened, true);
  ASSERT_TRUE(spec.ok() && spec->has_value());
  const auto refused = [&](const std::string& name, const std::string& arguments) {
    return !Accepts(**spec, RenderedCalls(version, {{.name = name, .arguments = arguments}}),
                    true);
  };
  EXPECT_FALSE(refused("get_weather", R"j({"city":"x","days":2})j")) << "the valid baseline";
  EXPECT_TRUE(refused("get_wether", R"j({"city":"x","days":2})j")) << "unknown tool";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x"})j")) << "required days missing";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":9})j")) << "days over maximum";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":"2"})j")) << "days as a string";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","unit":"k","days":2})j")) << "not in enum";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":2,"unit":"c"})j"))
      << "parameters come in the schema's order";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":2,"extra":1})j"))
      << "a parameter the schema does not name";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":2,"where":{}})j"))
      << "nested required lat missing";
  EXPECT_TRUE(refused("now", R"j({"x":1})j")) << "a tool without parameters takes none";
  EXPECT_FALSE(refused("get_weather", R"j({"city":"x","days":2,"code":"abc"})j")) << "a $ref";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":2,"code":"abcd"})j"))
      << "a $ref's maxLength";
  EXPECT_TRUE(refused("get_weather", R"j({"city":"x","days":2,"code":""})j"))
      << "a $ref's minLength";
  EXPECT_FALSE(Accepts(**spec, "", true)) << "at least one call";
}

TEST_P(ToolCallGrammar, OneCallWithoutParallelCallsAndTheBlockOpenedForAny) {
  const text::ModelVersion version = GetParam();
  const std::vector<text::ToolCall> one = {{.name = "now", .arguments = "{}"}};
  const std::vector<text::ToolCall> two = {{.name = "now", .arguments = "{}"},
                                           {.name = "now", .arguments = "{}"}};
  auto single = ToolCallGrammarSpec(ToolRequest(version), ToolCallForcing::kPromptOpened, false);
  ASSERT_TRUE(single.ok() && single->has_value());
  EXPECT_TRUE(Accepts(**single, RenderedCalls(version, one), true));
  EXPECT_FALSE(Accepts(**single, RenderedCalls(version, two), true));

  // Anthropic "any": the prompt did not open the block, so the output starts with it.
  auto any = ToolCallGrammarSpec(ToolRequest(version), ToolCallForcing::kGrammarOpens, true);
  ASSERT_TRUE(any.ok() && any->has_value());
  const text::DsmlTags tags = text::DsmlTagsFor(version);
  const std::string opened =
      "\n\n<" + std::string(text::kDsmlToken) + std::string(tags.block) + ">\n";
  EXPECT_TRUE(Accepts(**any, opened + RenderedCalls(version, two), true));
  EXPECT_FALSE(Accepts(**any, RenderedCalls(version, two), true));
  EXPECT_FALSE(Accepts(**any, "Sure. " + opened + RenderedCalls(version, two), true))
      << "no answer text before the calls";

  EXPECT_FALSE(ToolCallGrammarSpec(ToolRequest(version), ToolCallForcing::kNone, true)->has_value());
}

TEST_P(ToolCallGrammar, AnAgentsWholeToolListCompiles) {
  // 32 tools of 12 parameters with long descriptions: ~200 KB of schemas, past the 64 KiB a
  // schema given alone may have, is still a grammar (Limits::max_structural_tag_bytes).
  text::ChatRequest chat = ToolRequest(GetParam());
  chat.tools.clear();
  for (int t = 0; t < 32; ++t) {
    Json params = {{"type", "object"}, {"properties", Json::object()}};
    for (int p = 0; p < 12; ++p)
      params["properties"]["p" + std::to_string(p)] = {{"type", "string"},
                                                       {"description", std::string(480, 'd')}};
    chat.tools.push_back({.name = "tool_" + std::to_string(t), .parameters_json = params.dump()});
  }
  auto spec = ToolCallGrammarSpec(chat, ToolCallForcing::kPromptOpened, true);
  ASSERT_TRUE(spec.ok() && spec->has_value());
  EXPECT_GT((*spec)->text.size(), size_t{150000});
  auto compiled = compiler_->Compile(**spec);
  EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
  EXPECT_TRUE(Accepts(**spec, RenderedCalls(GetParam(), {{.name = "tool_31",
                                                          .arguments = R"j({"p3":"x"})j"}}),
                      true));
}

INSTANTIATE_TEST_SUITE_P(Versions, ToolCallGrammar,
                         ::testing::Values(text::ModelVersion::kV4, text::ModelVersion::kV41),
                         [](const ::testing::TestParamInfo<text::ModelVersion>& version) {
                           return version.param == text::ModelVersion::kV4 ? "V4" : "V41";
                         });

TEST(StructuredOutputService, ForcedToolCallsGetTheToolGrammar) {
  auto& service = Service();
  const std::string tools =
      R"j("tools":[{"type":"function","function":{"name":"now","parameters":{"type":"object",)j"
      R"j("properties":{}}}}])j";
  for (const char* choice : {R"j("required")j", R"j({"type":"function","function":{"name":"now"}})j"}) {
    auto reply = service.Post("/v1/chat/completions",
                              Chat(tools + R"j(,"tool_choice":)j" + choice, false), "x");
    ASSERT_EQ(reply.status, 200) << reply.body;
    EXPECT_NE(service.last_params().grammar, nullptr) << choice;
  }
  auto reply = service.Post("/v1/chat/completions", Chat(tools, false), "hi");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(service.last_params().grammar, nullptr) << "auto leaves the model free";
  reply = service.Post("/v1/chat/completions",
                       Chat(tools + R"j(,"tool_choice":"required","parallel_tool_calls":"no")j",
                            false));
  EXPECT_EQ(reply.status, 400) << reply.body;
  const std::string messages =
      R"j({"max_tokens":8,"messages":[{"role":"user","content":"x"}],)j"
      R"j("tools":[{"name":"now","input_schema":{"type":"object","properties":{}}}],)j";
  for (const char* choice : {R"j({"type":"any"})j", R"j({"type":"tool","name":"now"})j",
                             R"j({"type":"any","disable_parallel_tool_use":true})j"}) {
    reply = service.Post("/v1/messages",
                         messages + R"j("thinking":{"type":"disabled"},"tool_choice":)j" +
                             choice + "}",
                         "x");
    ASSERT_EQ(reply.status, 200) << choice << reply.body;
    EXPECT_NE(service.last_params().grammar, nullptr) << choice;
  }
  // With thinking on, the reasoning stays free: the call's grammar starts after </think>.
  reply = service.Post("/v1/messages",
                       messages + R"j("thinking":{"type":"enabled","budget_tokens":1024},)j" +
                           R"j("tool_choice":{"type":"any"}})j",
                       "x");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NE(service.last_params().grammar, nullptr);
  EXPECT_EQ(service.last_params().grammar_after_token, *service.tokenizer().TokenId("</think>"));
  reply = service.Post("/v1/messages", messages + R"j("tool_choice":{"type":"auto"}})j", "x");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(service.last_params().grammar, nullptr);
}

}  // namespace
}  // namespace dsinfer::server
