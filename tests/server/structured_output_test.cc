// Structured outputs' request mapping: every API spelling becomes the right grammar spec, two at
// once or a malformed one is a 400 naming the field, and the service hands the engine a compiled
// grammar that applies after </think> when thinking is on (the real V4 tokenizer).
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include "service_harness.h"

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

}  // namespace
}  // namespace dsinfer::server
