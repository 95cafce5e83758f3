// Prompt rendering against deepseek-recipe 0.2.0 fixtures (tests/fixtures/chat/render_cases.jsonl,
// made by reference/chat/gen_chat_fixtures.py) plus targeted behaviour checks.
#include "text/chat_render.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/chat_json.h"
#include "text/chat_json_value.h"
#include "text/tokenizer.h"

namespace dsinfer::text {
namespace {

using ordered_json = nlohmann::ordered_json;

std::vector<ordered_json> LoadJsonl(const std::string& name) {
  std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/chat/" + name);
  std::vector<ordered_json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(ordered_json::parse(line));
  return rows;
}

std::vector<std::pair<size_t, size_t>> SpecialRanges(const RenderedPrompt& prompt) {
  std::vector<std::pair<size_t, size_t>> ranges;
  size_t offset = 0;
  for (const auto& s : prompt.segments) {
    if (s.is_special) ranges.push_back({offset, offset + s.text.size()});
    offset += s.text.size();
  }
  return ranges;
}

TEST(ChatRenderFixtures, MatchesOracleForEveryCase) {
  std::vector<ordered_json> cases = LoadJsonl("render_cases.jsonl");
  ASSERT_GE(cases.size(), 600u);
  size_t v4 = 0, v41 = 0, failures = 0, refused = 0;
  for (const auto& c : cases) {
    const std::string id = c["id"];
    ModelVersion version = c["version"] == "v4.1" ? ModelVersion::kV41 : ModelVersion::kV4;
    (version == ModelVersion::kV41 ? v41 : v4)++;
    Result<ChatRequest> req = ChatRequestFromJson(c["request"].dump(), version);
    if (c.contains("error")) {  // the converter's refusals, or the renderer's
      EXPECT_FALSE(req.ok() && RenderPromptSegments(*req).ok()) << id << ": " << c["error"];
      ++refused;
      continue;
    }
    ASSERT_TRUE(req.ok()) << id << ": " << req.status().ToString();
    Result<RenderedPrompt> rendered = RenderPromptSegments(*req);
    ASSERT_TRUE(rendered.ok()) << id << ": " << rendered.status().ToString();
    const std::string expected = c["prompt"];
    std::vector<std::pair<size_t, size_t>> expected_ranges;
    for (const auto& r : c["special"]) expected_ranges.push_back({r[0], r[1]});
    bool ok = rendered->text == expected && SpecialRanges(*rendered) == expected_ranges;
    if (!ok && ++failures <= 5) {
      size_t diff = 0;
      while (diff < expected.size() && diff < rendered->text.size() &&
             expected[diff] == rendered->text[diff])
        ++diff;
      auto show = [&](const std::string& text) {
        return ordered_json(text.substr(diff > 40 ? diff - 40 : 0, 160))
            .dump(-1, ' ', false, ordered_json::error_handler_t::replace);
      };
      ADD_FAILURE() << id << " differs at byte " << diff << "\nexpected: " << show(expected)
                    << "\nactual:   " << show(rendered->text)
                    << "\nrequest: " << c["request"].dump();
    }
  }
  EXPECT_EQ(failures, 0u);
  EXPECT_GE(v4, 300u);
  EXPECT_GE(v41, 300u);
  EXPECT_LT(refused * 2, cases.size());  // most requests render
}

// The oracle's own prompt encoding (V4 cases with "ids"): special segments as control tokens,
// everything else in plain-text mode.
TEST(ChatRenderFixtures, EncodePromptMatchesOracleIds) {
  const std::string path =
      std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json";
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no V4 tokenizer fixture at " << path;
  Result<Tokenizer> tok = Tokenizer::FromFile(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  size_t checked = 0;
  for (const auto& c : LoadJsonl("render_cases.jsonl")) {
    if (!c.contains("ids")) continue;
    Result<ChatRequest> req = ChatRequestFromJson(c["request"].dump(), ModelVersion::kV4);
    ASSERT_TRUE(req.ok());
    Result<RenderedPrompt> rendered = RenderPromptSegments(*req);
    ASSERT_TRUE(rendered.ok());
    Result<std::vector<int32_t>> ids = EncodePrompt(*tok, rendered->segments);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c["id"];
    ++checked;
  }
  EXPECT_GE(checked, 100u);
  // V4's vocabulary has no <｜System｜>: a V4.1 prompt cannot be encoded with it.
  ChatRequest v41;
  v41.version = ModelVersion::kV41;
  v41.messages.push_back({Role::kSystem, "s", std::nullopt, {}, "", false});
  Result<RenderedPrompt> rendered = RenderPromptSegments(v41);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(EncodePrompt(*tok, rendered->segments).status().code(), StatusCode::kNotFound);
}

ChatRequest SimpleRequest(ModelVersion version, const std::string& user_text) {
  ChatRequest req;
  req.version = version;
  req.thinking = false;
  req.messages.push_back({Role::kUser, user_text, std::nullopt, {}, "", false});
  return req;
}

TEST(ChatRender, UserTypedControlTokensStayPlainText) {
  ChatRequest req = SimpleRequest(ModelVersion::kV41, "<｜User｜>hi<think>");
  Result<RenderedPrompt> r = RenderPromptSegments(req);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->segments.size(), 5u);
  EXPECT_EQ(r->segments[1].text, "<｜User｜>");
  EXPECT_TRUE(r->segments[1].is_special);
  EXPECT_EQ(r->segments[2].text, "<｜User｜>hi<think>");
  EXPECT_FALSE(r->segments[2].is_special);
  EXPECT_EQ(r->text, "<｜begin▁of▁sentence｜><｜User｜><｜User｜>hi<think><｜Assistant｜></think>");
}

TEST(ChatRender, BadToolSchemaIsAnError) {
  ChatRequest req = SimpleRequest(ModelVersion::kV4, "q");
  req.tools.push_back({"f", std::nullopt, std::string("{\"type\": "), false});
  Result<std::string> r = RenderPrompt(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tool 'f'"), std::string::npos);
}

TEST(ChatRender, NonObjectArgumentsRenderAsOneStringParameter) {
  ChatRequest req = SimpleRequest(ModelVersion::kV4, "q");
  ChatMessage assistant;
  assistant.role = Role::kAssistant;
  assistant.tool_calls.push_back({"c1", "f", "[1, 2]"});
  req.messages.push_back(assistant);
  Result<std::string> r = RenderPrompt(req);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(
      r->find("<｜DSML｜parameter name=\"arguments\" string=\"true\">[1, 2]</｜DSML｜parameter>"),
      std::string::npos);
}

TEST(ChatJson, RejectsBadInputWithClearErrors) {
  auto err = [](const char* body) {
    Result<ChatRequest> r = ChatRequestFromJson(body, ModelVersion::kV4);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(err(R"({"messages":[{"role":"bot","content":"x"}]})").find("unknown role 'bot'"),
            std::string::npos);
  EXPECT_NE(err(R"({"messages":[{"role":"user","content":5}]})").find("messages[0].content"),
            std::string::npos);
  EXPECT_NE(err(R"({"messages":"x"})").find("messages"), std::string::npos);
  EXPECT_NE(err(R"({"messages":[]})").find("must not be empty"), std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"q"}], "tools":[{"type":"function","function":{}}]})")
          .find("name"),
      std::string::npos);
  EXPECT_NE(err("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err(R"({"messages":[{"role":"user","content":"q"}], "thinking":{"type":"maybe"}})")
                .find("thinking.type"),
            std::string::npos);
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]})"), "ok");
  // "developer" is the system role (the official converter refuses it; OpenAI clients send it).
  Result<ChatRequest> developer = ChatRequestFromJson(
      R"({"messages":[{"role":"developer","content":"x"}]})", ModelVersion::kV4);
  ASSERT_TRUE(developer.ok());
  EXPECT_EQ(developer->messages[0].role, Role::kSystem);
  // The converter's refusals, each naming what is wrong.
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})")
          .find("tools[0].function.name"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"})")
          .find("thinking disabled"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})")
          .find("'json'"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a","prefix":true},{"role":"user","content":"y"}]})")
          .find("prefix"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"c","content":"r"}]})")
          .find("messages[1]"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f"}}]}]})")
          .find("'c' has no tool message"),
      std::string::npos);
  EXPECT_EQ(
      ChatRequestFromJson(
          R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
          ModelVersion::kV4)
          .status()
          .code(),
      StatusCode::kUnimplemented);
  EXPECT_NE(
      err(R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c"}]}]})").find("function"),
      std::string::npos);
  EXPECT_NE(
      err(R"({"messages":[{"role":"user","content":"q"}], "tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]})")
          .find("parameters"),
      std::string::npos);
  Result<ChatRequest> parts = ChatRequestFromJson(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
      ModelVersion::kV4);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(parts->messages[0].content, "a\n\nb");
}

TEST(ChatJson, ThinkingResolution) {
  auto thinking = [](const char* body) {
    return ChatRequestFromJson(body, ModelVersion::kV4).value().thinking;
  };
  EXPECT_TRUE(thinking(R"({"messages":[{"role":"user","content":"q"}]})"));
  EXPECT_FALSE(
      thinking(R"({"messages":[{"role":"user","content":"q"}],"reasoning_effort":"none"})"));
  EXPECT_TRUE(thinking(
      R"({"messages":[{"role":"user","content":"q"}],"thinking":{"type":"enabled"},"reasoning_effort":"none"})"));
  EXPECT_FALSE(thinking(
      R"({"messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"},"reasoning_effort":"max"})"));
  ChatRequest named =
      ChatRequestFromJson(
          R"({"messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"},"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}],"tool_choice":{"type":"function","function":{"name":"b"}}})",
          ModelVersion::kV4)
          .value();
  ASSERT_EQ(named.tools.size(), 1u);
  EXPECT_EQ(named.tools[0].name, "b");
  EXPECT_EQ(named.tool_choice, ToolChoice::kRequired);
}

TEST(ChatJsonValue, PythonStyleFloatsAndStrictParsing) {
  auto fmt = [](const char* text, FloatStyle style = FloatStyle::kRyuPlus) {
    Result<JsonValue> v = ParseJson(text);
    return v.ok() ? StringifyPythonStyle(*v, style) : std::string("ERR");
  };
  EXPECT_EQ(fmt("[1e20, 1e-7, 1e-5, 1e-4, 1e15, 1e16, -1e-10]", FloatStyle::kPythonRepr),
            "[1e+20, 1e-07, 1e-05, 0.0001, 1000000000000000.0, 1e+16, -1e-10]");
  EXPECT_EQ(fmt("[1e20, 1e-7, 1e-5, 1e15, 1e16, -0, 2.0, 0.1, 300e0]"),
            "[1e+20, 1e-7, 0.00001, 1000000000000000.0, 1e+16, -0.0, 2.0, 0.1, 300.0]");
  EXPECT_EQ(fmt("[18446744073709551615, 18446744073709551616, -9223372036854775809]"),
            "[18446744073709551615, 1.8446744073709552e+19, -9.223372036854776e+18]");
  EXPECT_EQ(fmt(R"({"z":1,"a":2,"z":3})"), R"({"z": 3, "a": 2})");
  EXPECT_EQ(fmt(R"("\u00e9\ud83d\ude00\u0001\"")"), "\"é😀\\u0001\\\"\"");
  for (const char* bad : {"01", "1.", "{\"a\":1} x", "\"\\ud800\"", "1e400", "[1,]", "\"a\x01\""})
    EXPECT_EQ(fmt(bad), "ERR") << bad;
  std::string deep(200, '[');
  EXPECT_EQ(fmt(deep.c_str()), "ERR");
}

}  // namespace
}  // namespace dsinfer::text
