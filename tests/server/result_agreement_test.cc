// Each API's streamed and non-streamed replies to the same generation carry the same output:
// text, reasoning, tool calls, logprobs, usage and finish reason, for complete outputs and for
// outputs cut by max_tokens after every token (inside reasoning, inside DSML tool-call markup,
// inside a parameter value). The stream is folded back into a final object the way an SDK's
// stream helper does it and compared with the non-streamed reply.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service_harness.h"

namespace dsinfer::server::testing {
namespace {

using Json = nlohmann::ordered_json;

int TokenCount(const std::string& text) {
  static const text::Tokenizer* tok = [] {
    auto t = text::Tokenizer::FromFile(InProcessService::TokenizerPath());
    return new text::Tokenizer(std::move(t).value());
  }();
  auto ids = tok->Encode(text, /*allow_special=*/true);
  return ids.ok() ? static_cast<int>(ids->size()) : 0;
}

// Reasoning, an answer, then two tool calls (a string and a JSON parameter), then end of message.
const std::string kToolOutput =
    "Need the weather \xF0\x9F\x8C\xA7.</think>Checking Paris.\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"centre\"</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">[1, 2]</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
const std::string kTextOutput =
    "Let me think\n about it.</think>The answer is 42, and that is final.<｜end▁of▁sentence｜>";

std::vector<Json> SseDataLines(const std::string& body) {
  std::vector<Json> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find('\n', at);
    const std::string payload = body.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") out.push_back(Json::parse(payload));
    at = end;
  }
  return out;
}

std::string WithMaxTokens(std::string body, int max_tokens, const char* key = "max_tokens") {
  if (max_tokens <= 0) return body;
  body.pop_back();  // the closing brace
  return body + ",\"" + key + "\":" + std::to_string(max_tokens) + "}";
}

std::string Streamed(std::string body) {
  body.pop_back();
  return body + ",\"stream\":true}";
}

// Streamed, with the usage chunk at the end.
std::string StreamedWithUsage(std::string body) {
  body.pop_back();
  return body + R"(,"stream":true,"stream_options":{"include_usage":true}})";
}

// A tool call id names its response; two requests have different ids, so compare the index only.
std::string WithoutResponseId(std::string s, const std::string& id) {
  for (size_t at; !id.empty() && (at = s.find(id)) != std::string::npos;)
    s.replace(at, id.size(), "ID");
  return s;
}

// --- OpenAI chat -------------------------------------------------------------------------------

Json FoldChatStream(const std::string& body) {
  Json choices = Json::array();
  Json usage;
  std::string id;
  for (const Json& chunk : SseDataLines(body)) {
    if (chunk.contains("error")) return chunk;
    id = chunk["id"];
    if (chunk.contains("usage") && !chunk["usage"].is_null()) usage = chunk["usage"];
    for (const Json& c : chunk["choices"]) {
      const size_t i = c["index"];
      while (choices.size() <= i)
        choices.push_back({{"content", ""},
                           {"reasoning_content", ""},
                           {"tool_calls", Json::array()},
                           {"logprobs", Json::array()},
                           {"finish_reason", nullptr}});
      Json& out = choices[i];
      const Json& d = c["delta"];
      if (d.contains("content") && d["content"].is_string())
        out["content"] = out["content"].get<std::string>() + d["content"].get<std::string>();
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
        out["reasoning_content"] =
            out["reasoning_content"].get<std::string>() + d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const Json& tc : d["tool_calls"]) {
          const size_t t = tc["index"];
          Json& calls = out["tool_calls"];
          while (calls.size() <= t) calls.push_back({{"id", ""}, {"name", ""}, {"arguments", ""}});
          if (tc.contains("id")) calls[t]["id"] = WithoutResponseId(tc["id"], id);
          if (tc["function"].contains("name")) calls[t]["name"] = tc["function"]["name"];
          calls[t]["arguments"] = calls[t]["arguments"].get<std::string>() +
                                  tc["function"]["arguments"].get<std::string>();
        }
      }
      if (c["logprobs"].is_object())
        for (const Json& e : c["logprobs"]["content"]) out["logprobs"].push_back(e);
      if (!c["finish_reason"].is_null()) out["finish_reason"] = c["finish_reason"];
    }
  }
  return {{"choices", choices}, {"usage", usage}};
}

Json NormalizeChat(const Json& reply) {
  if (reply.contains("error")) return reply;
  Json choices = Json::array();
  const std::string id = reply["id"];
  for (const Json& c : reply["choices"]) {
    const Json& m = c["message"];
    Json calls = Json::array();
    if (m.contains("tool_calls"))
      for (const Json& tc : m["tool_calls"])
        calls.push_back({{"id", WithoutResponseId(tc["id"], id)},
                         {"name", tc["function"]["name"]},
                         {"arguments", tc["function"]["arguments"]}});
    choices.push_back(
        {{"content", m["content"].is_null() ? "" : m["content"].get<std::string>()},
         {"reasoning_content", m.value("reasoning_content", "")},
         {"tool_calls", calls},
         {"logprobs", c["logprobs"].is_null() ? Json::array() : c["logprobs"]["content"]},
         {"finish_reason", c["finish_reason"]}});
  }
  return {{"choices", choices}, {"usage", reply["usage"]}};
}

void ExpectChatAgrees(const std::string& body, const std::string& output, int max_tokens) {
  const std::string request = WithMaxTokens(body, max_tokens);
  const Reply whole = Service().Post("/v1/chat/completions", request, output);
  const Reply stream = Service().Post("/v1/chat/completions", StreamedWithUsage(request), output);
  ASSERT_EQ(whole.status, 200) << whole.body;
  ASSERT_EQ(stream.status, 200) << stream.body;
  ASSERT_EQ(whole.violation, "");
  ASSERT_EQ(stream.violation, "");
  const Json a = NormalizeChat(Json::parse(whole.body));
  const Json b = FoldChatStream(stream.body);
  EXPECT_EQ(a, b) << "max_tokens " << max_tokens << "\nnon-streamed: " << a.dump()
                  << "\nstreamed:     " << b.dump();
}

const std::string kChatTools =
    R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},)"
    R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}])";

TEST(ResultAgreement, ChatAtEveryTruncation) {
  const std::string body = R"({"messages":[{"role":"user","content":"weather?"}],"n":2,)"
                           R"("logprobs":true,"top_logprobs":2,)" +
                           kChatTools + "}";
  const int tokens = TokenCount(kToolOutput);
  ASSERT_GT(tokens, 40);
  for (int max_tokens = 1; max_tokens <= tokens + 1; ++max_tokens)
    ExpectChatAgrees(body, kToolOutput, max_tokens);
  // Thinking disabled (no reasoning field), a stop sequence, no logprobs.
  const std::string plain =
      R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"},"stop":["final"]})";
  for (int max_tokens = 1; max_tokens <= TokenCount(kTextOutput) + 1; ++max_tokens)
    ExpectChatAgrees(plain, kTextOutput, max_tokens);
  // A tool call the prompt forced open (tool_choice required).
  const std::string forced = R"({"messages":[{"role":"user","content":"x"}],)" + kChatTools +
                             R"(,"tool_choice":"required","thinking":{"type":"disabled"}})";
  const std::string forced_output = kToolOutput.substr(kToolOutput.find("<｜DSML｜invoke"));
  for (int max_tokens = 1; max_tokens <= TokenCount(forced_output) + 1; ++max_tokens)
    ExpectChatAgrees(forced, forced_output, max_tokens);
}

TEST(ResultAgreement, ChatEngineFailureIsTheSameErrorBothWays) {
  const std::string body = R"({"messages":[{"role":"user","content":"x"}]})";
  const Reply whole =
      Service().Post("/v1/chat/completions", body, kTextOutput, EngineFailure::kMidStream);
  const Reply stream = Service().Post("/v1/chat/completions", Streamed(body), kTextOutput,
                                      EngineFailure::kMidStream);
  EXPECT_EQ(whole.status, 500);
  ASSERT_EQ(stream.status, 200);
  const auto lines = SseDataLines(stream.body);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["error"]["message"], Json::parse(whole.body)["error"]["message"]);
}

// --- OpenAI completions ------------------------------------------------------------------------

Json FoldCompletionStream(const std::string& body) {
  Json choices = Json::array();
  Json usage;
  for (const Json& chunk : SseDataLines(body)) {
    if (chunk.contains("usage") && !chunk["usage"].is_null()) usage = chunk["usage"];
    for (const Json& c : chunk["choices"]) {
      const size_t i = c["index"];
      while (choices.size() <= i)
        choices.push_back({{"index", choices.size()},
                           {"text", ""},
                           {"logprobs",
                            {{"tokens", Json::array()},
                             {"token_logprobs", Json::array()},
                             {"top_logprobs", Json::array()},
                             {"text_offset", Json::array()}}},
                           {"finish_reason", nullptr}});
      Json& out = choices[i];
      out["text"] = out["text"].get<std::string>() + c["text"].get<std::string>();
      if (c["logprobs"].is_object())
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (const Json& v : c["logprobs"][key]) out["logprobs"][key].push_back(v);
      if (!c["finish_reason"].is_null()) out["finish_reason"] = c["finish_reason"];
    }
  }
  return {{"choices", choices}, {"usage", usage}};
}

TEST(ResultAgreement, CompletionsAtEveryTruncationWithEchoAndLogprobs) {
  const std::string body =
      R"({"prompt":"Once upon","n":2,"echo":true,"logprobs":2,"stop":["final"]})";
  const std::string output = "a time, there was text.\nThe end is final here.";
  for (int max_tokens = 1; max_tokens <= TokenCount(output) + 1; ++max_tokens) {
    const std::string request = WithMaxTokens(body, max_tokens);
    const Reply whole = Service().Post("/v1/completions", request, output);
    const Reply stream = Service().Post("/v1/completions", StreamedWithUsage(request), output);
    ASSERT_EQ(whole.status, 200) << whole.body;
    ASSERT_EQ(stream.status, 200) << stream.body;
    Json a = Json::parse(whole.body);
    a = {{"choices", a["choices"]}, {"usage", a["usage"]}};
    const Json b = FoldCompletionStream(stream.body);
    EXPECT_EQ(a, b) << "max_tokens " << max_tokens << "\nnon-streamed: " << a.dump()
                    << "\nstreamed:     " << b.dump();
    // The echoed prompt comes first, and each logprob's offset points at its token's text (the
    // token a stop sequence cut shows as far as the text goes).
    const Json& c = a["choices"][0];
    const std::string text = c["text"];
    EXPECT_EQ(text.rfind("Once upon", 0), 0u);
    // The echoed prompt's tokens come first: the BOS the server added (no text, offset 0), then
    // the prompt's own, the first of which has no logprob.
    EXPECT_EQ(c["logprobs"]["tokens"][0], "<｜begin▁of▁sentence｜>");
    EXPECT_TRUE(c["logprobs"]["token_logprobs"][0].is_null());
    EXPECT_TRUE(c["logprobs"]["top_logprobs"][0].is_null());
    EXPECT_EQ(c["logprobs"]["text_offset"][1], 0);
    EXPECT_EQ(c["logprobs"]["token_logprobs"][1], -0.625);  // the harness's value for position 1
    for (size_t t = 1; t < c["logprobs"]["tokens"].size(); ++t) {
      const size_t offset = c["logprobs"]["text_offset"][t];
      const std::string token = c["logprobs"]["tokens"][t];
      ASSERT_LE(offset, text.size());
      EXPECT_EQ(text.substr(offset, token.size()), token.substr(0, text.size() - offset))
          << "token " << t;
    }
  }
}

// --- Anthropic messages ------------------------------------------------------------------------

// Folds the events the way the anthropic SDK's MessageStream accumulates them.
Json FoldMessagesStream(const std::string& body) {
  Json message;
  std::vector<std::string> partial_json;
  for (const Json& e : SseDataLines(body)) {
    const std::string type = e["type"];
    if (type == "message_start") {
      message = e["message"];
    } else if (type == "content_block_start") {
      message["content"].push_back(e["content_block"]);
      partial_json.emplace_back();
    } else if (type == "content_block_delta") {
      Json& block = message["content"][e["index"].get<size_t>()];
      const Json& d = e["delta"];
      if (d["type"] == "text_delta")
        block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      else if (d["type"] == "thinking_delta")
        block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (d["type"] == "signature_delta")
        block["signature"] = d["signature"];
      else if (d["type"] == "input_json_delta")
        partial_json[e["index"].get<size_t>()] += d["partial_json"].get<std::string>();
    } else if (type == "content_block_stop") {
      const size_t i = e["index"];
      if (message["content"][i]["type"] == "tool_use")
        message["content"][i]["input"] = Json::parse(partial_json[i]);
    } else if (type == "message_delta") {
      message["stop_reason"] = e["delta"]["stop_reason"];
      message["stop_sequence"] = e["delta"]["stop_sequence"];
      message["usage"] = e["usage"];
    }
  }
  return message;
}

// Ids name the message; replaced, so two requests compare.
Json WithoutMessageId(Json message) {
  const std::string id = message["id"];
  return Json::parse(WithoutResponseId(message.dump(), id.substr(4)));
}

TEST(ResultAgreement, MessagesAtEveryTruncation) {
  const std::string body =
      R"({"model":"claude-x","messages":[{"role":"user","content":"weather?"}],)"
      R"("thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["final"],)"
      R"("tools":[{"name":"get_weather","input_schema":{"type":"object"}},)"
      R"({"name":"get_time","input_schema":{"type":"object"}}]})";
  for (const std::string& output : {kToolOutput, kTextOutput}) {
    for (int max_tokens = 1; max_tokens <= TokenCount(output) + 1; ++max_tokens) {
      const std::string request = WithMaxTokens(body, max_tokens);
      const Reply whole = Service().Post("/v1/messages", request, output);
      const Reply stream = Service().Post("/v1/messages", Streamed(request), output);
      ASSERT_EQ(whole.status, 200) << whole.body;
      ASSERT_EQ(stream.status, 200) << stream.body;
      const Json a = WithoutMessageId(Json::parse(whole.body));
      const Json b = WithoutMessageId(FoldMessagesStream(stream.body));
      EXPECT_EQ(a["content"], b["content"]) << "max_tokens " << max_tokens;
      for (const char* key : {"stop_reason", "stop_sequence"})
        EXPECT_EQ(a[key], b[key]) << key << " at max_tokens " << max_tokens;
      EXPECT_EQ(a["usage"]["output_tokens"], b["usage"]["output_tokens"]);
      EXPECT_EQ(a["usage"]["input_tokens"], b["usage"]["input_tokens"]);
      // Every answer has a text or tool_use block.
      bool answered = false;
      for (const Json& block : a["content"]) answered |= block["type"] != "thinking";
      EXPECT_TRUE(answered) << a.dump();
    }
  }
}

// --- OpenAI responses --------------------------------------------------------------------------

Json NormalizeResponse(Json response) {
  const std::string id = response["id"];
  Json out = Json::parse(WithoutResponseId(response.dump(), id));
  for (const char* key : {"created_at", "completed_at"}) out.erase(key);
  return out;
}

TEST(ResultAgreement, ResponsesAtEveryTruncation) {
  const std::string body =
      R"({"input":"weather?","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},)"
      R"({"type":"function","name":"get_time","parameters":{"type":"object"}}]})";
  for (const std::string& output : {kToolOutput, kTextOutput}) {
    for (int max_tokens = 1; max_tokens <= TokenCount(output) + 1; ++max_tokens) {
      const std::string request = WithMaxTokens(body, max_tokens, "max_output_tokens");
      const Reply whole = Service().Post("/v1/responses", request, output);
      const Reply stream = Service().Post("/v1/responses", Streamed(request), output);
      ASSERT_EQ(whole.status, 200) << whole.body;
      ASSERT_EQ(stream.status, 200) << stream.body;
      const auto events = SseDataLines(stream.body);
      ASSERT_FALSE(events.empty());
      const Json a = NormalizeResponse(Json::parse(whole.body));
      const Json b = NormalizeResponse(events.back()["response"]);
      EXPECT_EQ(a, b) << "max_tokens " << max_tokens;
      // The deltas add up to the final items.
      std::string text, reasoning, arguments;
      for (const Json& e : events) {
        if (e["type"] == "response.output_text.delta") text += e["delta"];
        if (e["type"] == "response.reasoning_text.delta") reasoning += e["delta"];
        if (e["type"] == "response.function_call_arguments.delta") arguments += e["delta"];
      }
      std::string want_text, want_reasoning, want_arguments;
      for (const Json& item : a["output"]) {
        if (item["type"] == "message") want_text += item["content"][0]["text"];
        if (item["type"] == "reasoning") want_reasoning += item["content"][0]["text"];
        if (item["type"] == "function_call") want_arguments += item["arguments"];
      }
      EXPECT_EQ(text, want_text);
      EXPECT_EQ(reasoning, want_reasoning);
      EXPECT_EQ(arguments, want_arguments);
    }
  }
}

// The text a reply carries (content, reasoning, tool names and arguments), streamed or not, for
// every API, and the number of tool calls.
struct Carried {
  std::string text;
  int tool_calls = 0;
};

Carried CarriedBy(const std::string& path, const Reply& reply, bool streamed) {
  Carried out;
  if (path == "/v1/chat/completions") {
    const Json j = streamed ? FoldChatStream(reply.body) : NormalizeChat(Json::parse(reply.body));
    for (const Json& c : j["choices"]) {
      out.text += c["reasoning_content"].get<std::string>() + c["content"].get<std::string>();
      for (const Json& t : c["tool_calls"]) {
        out.text += t["name"].get<std::string>() + t["arguments"].get<std::string>();
        ++out.tool_calls;
      }
    }
  } else if (path == "/v1/messages") {
    const Json m = streamed ? FoldMessagesStream(reply.body) : Json::parse(reply.body);
    for (const Json& b : m["content"]) {
      if (b["type"] == "thinking") out.text += b["thinking"].get<std::string>();
      if (b["type"] == "text") out.text += b["text"].get<std::string>();
      if (b["type"] == "tool_use") {
        out.text += b["name"].get<std::string>() + b["input"].dump();
        ++out.tool_calls;
      }
    }
  } else {
    const Json r = streamed ? SseDataLines(reply.body).back()["response"] : Json::parse(reply.body);
    for (const Json& item : r["output"]) {
      if (item["type"] == "function_call") {
        out.text += item["name"].get<std::string>() + item["arguments"].get<std::string>();
        ++out.tool_calls;
      } else {
        out.text += item["content"][0]["text"].get<std::string>();
      }
    }
  }
  return out;
}

struct Api {
  const char* path;
  std::string tools;        // the request's tools field
  std::string forced;       // fields that force a call of get_weather, thinking disabled
  std::string json_object;  // fields that ask for a JSON object, thinking disabled
};

const Api kApis[] = {
    {"/v1/chat/completions", kChatTools,
     R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},"thinking":{"type":"disabled"})",
     R"("response_format":{"type":"json_object"},"thinking":{"type":"disabled"})"},
    {"/v1/messages",
     R"("tools":[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object"}}])",
     R"("tool_choice":{"type":"tool","name":"get_weather"},"thinking":{"type":"disabled"})", ""},
    {"/v1/responses",
     R"("tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},{"type":"function","name":"get_time","parameters":{"type":"object"}}])",
     R"("tool_choice":{"type":"function","name":"get_weather"},"reasoning":{"effort":"none"})",
     R"("text":{"format":{"type":"json_object"}},"reasoning":{"effort":"none"})"},
};

std::string Body(const Api& api, const std::string& extra) {
  const bool messages = std::string(api.path) == "/v1/messages";
  const bool responses = std::string(api.path) == "/v1/responses";
  std::string body =
      responses  ? R"({"input":"answer in json please",)"
      : messages ? R"({"max_tokens":256,"messages":[{"role":"user","content":"json please"}],)"
                 : R"({"messages":[{"role":"user","content":"json please"}],)";
  return body + api.tools + (extra.empty() ? "" : "," + extra) + "}";
}

// Issue 31: whatever the model writes reaches the client. Model-opened tool-call markup cut after
// every byte comes back as a call or as its own text; a forced call the model never makes comes
// back as text; JSON mode without JSON comes back as the text.
TEST(NothingGeneratedIsLost, ToolMarkupCutAtEveryByteForEveryApi) {
  const size_t block = kToolOutput.find("\n\n<｜DSML｜tool_calls>");
  const size_t named = kToolOutput.find("get_weather\">") + std::string("get_weather\"").size();
  for (const Api& api : kApis) {
    for (size_t cut = block + 2; cut <= named + 8; ++cut) {
      const std::string output = kToolOutput.substr(0, cut);
      if (!text::IsValidUtf8(output)) continue;  // the engine generates tokens, whole characters
      for (bool streamed : {false, true}) {
        std::string body = Body(api, "");
        if (streamed) body = Streamed(body);
        const Reply reply = Service().Post(api.path, body, output);
        ASSERT_EQ(reply.status, 200) << reply.body;
        const Carried c = CarriedBy(api.path, reply, streamed);
        if (cut >= named)
          EXPECT_EQ(c.tool_calls, 1) << api.path << " cut " << cut;
        else
          EXPECT_NE(c.text.find(output.substr(block + 2)), std::string::npos)
              << api.path << (streamed ? " streamed" : "") << " cut " << cut << ": " << c.text;
      }
    }
  }
}

TEST(NothingGeneratedIsLost, ForcedToolCallAndJsonModeKeepTheText) {
  const std::string refusal = "I will not call a tool; the answer is 42.";
  for (const Api& api : kApis) {
    for (bool streamed : {false, true}) {
      std::string body = Body(api, api.forced);
      if (streamed) body = Streamed(body);
      const Reply forced = Service().Post(api.path, body, refusal);
      ASSERT_EQ(forced.status, 200) << api.path << " " << forced.body;
      EXPECT_NE(CarriedBy(api.path, forced, streamed).text.find(refusal), std::string::npos)
          << api.path << " " << forced.body;
      if (api.json_object.empty()) continue;
      body = Body(api, api.json_object);
      if (streamed) body = Streamed(body);
      const Reply json = Service().Post(api.path, body, "No JSON from me.");
      ASSERT_EQ(json.status, 200) << api.path << " " << json.body;
      EXPECT_EQ(CarriedBy(api.path, json, streamed).text, "No JSON from me.") << json.body;
    }
  }
}

// vLLM's skip_special_tokens: placeholder tokens are left out by default, kept when asked.
TEST(NothingGeneratedIsLost, SpecialTokensFollowSkipSpecialTokens) {
  const std::string output = "a<｜place▁holder▁no▁3｜>b";
  const std::string body =
      R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"})";
  Json skipped = Json::parse(Service().Post("/v1/chat/completions", body + "}", output).body);
  EXPECT_EQ(skipped["choices"][0]["message"]["content"], "ab");
  Json kept = Json::parse(
      Service()
          .Post("/v1/chat/completions", body + R"(,"skip_special_tokens":false})", output)
          .body);
  EXPECT_EQ(kept["choices"][0]["message"]["content"], output);
  Json completion = Json::parse(
      Service()
          .Post("/v1/completions", R"({"prompt":"x","skip_special_tokens":false})", output)
          .body);
  EXPECT_EQ(completion["choices"][0]["text"], output);
  EXPECT_EQ(
      Service().Post("/v1/chat/completions", body + R"(,"skip_special_tokens":1})", output).status,
      400);
}

// lm-eval's loglikelihood request: prompt token ids, echo, logprobs, max_tokens 0 (score only).
// The reply carries the prompt's tokens with their logprobs (null for the first) and no output.
TEST(PromptLogprobs, EchoWithMaxTokensZeroScoresThePromptOnly) {
  for (bool streamed : {false, true}) {
    std::string body =
        R"({"prompt":[100,200,300,400],"echo":true,"logprobs":1,"max_tokens":0,"prompt_logprobs":2})";
    if (streamed) body = Streamed(body);
    const Reply reply = Service().Post("/v1/completions", body, "generated");
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json c = streamed ? FoldCompletionStream(reply.body)["choices"][0]
                            : Json::parse(reply.body)["choices"][0];
    const Json& lp = c["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 4u) << c.dump();
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_EQ(lp["token_logprobs"][1], -0.625);
    EXPECT_EQ(lp["token_logprobs"][3], -0.875);
    EXPECT_EQ(lp["top_logprobs"][1].size(), 1u);
    EXPECT_EQ(c["text"].get<std::string>().find("generated"), std::string::npos);
    if (!streamed) {
      const Json whole = Json::parse(reply.body);
      EXPECT_EQ(whole["usage"]["completion_tokens"], 0);
      const Json& prompt = whole["choices"][0]["prompt_logprobs"];
      ASSERT_EQ(prompt.size(), 4u);
      EXPECT_TRUE(prompt[0].is_null());
      EXPECT_EQ(prompt[2]["300"]["logprob"], -0.75);
      EXPECT_EQ(prompt[2]["300"]["rank"], 1);
    }
  }
  // Without echo, max_tokens 0 has nothing to return.
  EXPECT_EQ(Service().Post("/v1/completions", R"({"prompt":"x","max_tokens":0})", "y").status, 400);
  // Chat: vLLM's top-level prompt_logprobs.
  const Reply chat = Service().Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"prompt_logprobs":0,"thinking":{"type":"disabled"}})",
      "ok");
  ASSERT_EQ(chat.status, 200) << chat.body;
  const Json j = Json::parse(chat.body);
  EXPECT_EQ(j["prompt_logprobs"].size(), Service().last_params().prompt.size());
  EXPECT_TRUE(j["prompt_logprobs"][0].is_null());
}

// stream_options.continuous_usage_stats: every chunk carries the usage so far.
TEST(PromptLogprobs, ContinuousUsageStatsInEveryChunk) {
  const Reply r = Service().Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"},"stream":true,)"
      R"("stream_options":{"include_usage":true,"continuous_usage_stats":true}})",
      "one two three");
  ASSERT_EQ(r.status, 200) << r.body;
  int64_t last = -1;
  for (const Json& chunk : SseDataLines(r.body)) {
    ASSERT_TRUE(chunk["usage"].is_object()) << chunk.dump();
    EXPECT_GE(chunk["usage"]["completion_tokens"].get<int64_t>(), last);
    last = chunk["usage"]["completion_tokens"];
  }
  EXPECT_EQ(last, 3);
  EXPECT_EQ(Service()
                .Post("/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"x"}],"stream":true,)"
                      R"("stream_options":{"continuous_usage_stats":true}})",
                      "x")
                .status,
            400);
}

// Without max_tokens, a chat request gets deepseek-recipe's defaults (8192 without thinking,
// 65536 with it, 131072 at max effort), capped by --max-tokens-limit (32768) and the context.
TEST(Defaults, MaxTokensFollowTheOfficialConverter) {
  ModelInfo info;
  info.max_model_len = 1 << 20;
  auto tokenizer = text::Tokenizer::FromFile(InProcessService::TokenizerPath());
  ASSERT_TRUE(tokenizer.ok());
  InProcessService service(std::move(tokenizer).value(), info);
  auto max_tokens = [&](const std::string& path, const std::string& body) {
    EXPECT_EQ(service.Post(path, body, "x").status, 200) << body;
    return service.last_params().max_tokens;
  };
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(max_tokens("/v1/chat/completions", "{" + user + R"(,"thinking":{"type":"disabled"}})"),
            8192);
  EXPECT_EQ(max_tokens("/v1/chat/completions", "{" + user + "}"), 32768);  // 65536, capped
  EXPECT_EQ(max_tokens("/v1/responses", R"({"input":"x","reasoning":{"effort":"none"}})"), 8192);
  EXPECT_EQ(max_tokens("/v1/completions", R"({"prompt":"x"})"), 16);  // OpenAI's legacy default
}

}  // namespace
}  // namespace dsinfer::server::testing
