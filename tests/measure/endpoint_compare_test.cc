// `compare endpoints` request/response handling without a server: both OpenAI logprobs shapes
// (as dsinfer serve writes them, src/server/openai_chat.cc), malformed responses, the request
// bodies, the prompts file, and the per-prompt verdict bookkeeping.
#include "measure/endpoint_compare.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace dsinfer::measure {
namespace {

TEST(EndpointCompare, ParsesCompletionsLogprobs) {
  const char* body = R"({"choices": [{"index": 0, "text": "ab", "logprobs": {
      "tokens": ["a", "b"], "token_logprobs": [-0.5, null],
      "top_logprobs": [{"a": -0.5, "c": -1.5}, {"b": -9999, "d": -3}],
      "text_offset": [0, 1]}}]})";
  auto steps = ParseGreedyResponse(body, EndpointKind::kCompletions);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].token, "a");
  EXPECT_DOUBLE_EQ((*steps)[0].logprob, -0.5);
  EXPECT_DOUBLE_EQ((*steps)[0].top.at("c"), -1.5);
  EXPECT_DOUBLE_EQ((*steps)[1].logprob, -9999);  // null: what a JSON encoder writes for -inf
  EXPECT_EQ((*steps)[1].top.size(), 2u);
}

TEST(EndpointCompare, ParsesChatLogprobs) {
  const char* body = R"({"choices": [{"index": 0, "message": {"role": "assistant"},
      "logprobs": {"content": [
        {"token": "x", "logprob": -0.1, "bytes": [120],
         "top_logprobs": [{"token": "x", "logprob": -0.1}, {"token": "y", "logprob": -2.4},
                          {"token": "y", "logprob": -7.0}]},
        {"token": "z", "logprob": -0.2, "top_logprobs": []}]}}]})";
  auto steps = ParseGreedyResponse(body, EndpointKind::kChat);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].token, "x");
  EXPECT_DOUBLE_EQ((*steps)[0].top.at("y"), -2.4);  // best first: the duplicate text keeps -2.4
  EXPECT_EQ((*steps)[1].token, "z");
  EXPECT_TRUE((*steps)[1].top.empty());
}

TEST(EndpointCompare, RejectsResponsesWithoutUsableLogprobs) {
  const char* cases[] = {
      "not json",
      R"({"choices": []})",
      R"({"choices": [{"text": "a", "logprobs": null}]})",
      R"({"choices": [{"logprobs": {"tokens": ["a"], "token_logprobs": []}}]})",
      R"({"choices": [{"logprobs": {"tokens": ["a"], "token_logprobs": ["x"]}}]})",
      R"({"choices": [{"logprobs": {"tokens": ["a"], "token_logprobs": [-1],
          "top_logprobs": [{"a": -1}, {"b": -2}]}}]})",
  };
  for (const char* body : cases)
    EXPECT_FALSE(ParseGreedyResponse(body, EndpointKind::kCompletions).ok()) << body;
  EXPECT_FALSE(ParseGreedyResponse(R"({"choices": [{"logprobs": {"content": [{"token": "a"}]}}]})",
                                   EndpointKind::kChat)
                   .ok());
  // A completions-shaped answer on the chat path is not silently read as empty.
  EXPECT_FALSE(ParseGreedyResponse(
                   R"({"choices": [{"logprobs": {"tokens": ["a"], "token_logprobs": [-1]}}]})",
                   EndpointKind::kChat)
                   .ok());
}

TEST(EndpointCompare, RequestBodiesAskForGreedyLogprobs) {
  GreedyRequestOptions opt;
  opt.max_tokens = 7;
  opt.top_logprobs = 3;
  ComparePrompt ids_prompt;
  ids_prompt.ids = {5, 6};
  auto c = nlohmann::json::parse(GreedyRequestBody(ids_prompt, "m", opt));
  EXPECT_EQ(c["temperature"], 0);
  EXPECT_EQ(c["logprobs"], 3);
  EXPECT_EQ(c["max_tokens"], 7);
  EXPECT_EQ(c["prompt"], nlohmann::json::array({5, 6}));
  EXPECT_EQ(c["model"], "m");
  EXPECT_FALSE(c.contains("ignore_eos"));
  opt.kind = EndpointKind::kChat;
  opt.ignore_eos = true;
  ComparePrompt text_prompt;
  text_prompt.text = "hi";
  auto chat = nlohmann::json::parse(GreedyRequestBody(text_prompt, "", opt));
  EXPECT_EQ(chat["logprobs"], true);
  EXPECT_EQ(chat["top_logprobs"], 3);
  EXPECT_EQ(chat["messages"][0]["content"], "hi");
  EXPECT_EQ(chat["ignore_eos"], true);
  EXPECT_FALSE(chat.contains("model"));
}

TEST(EndpointCompare, PromptsFileAndSyntheticPrompts) {
  const std::string path = ::testing::TempDir() + "/compare_prompts.jsonl";
  {
    std::ofstream out(path);
    out << R"({"prompt": "hello"})"
        << "\n\n"
        << R"({"prompt": [1, 2, 3]})"
        << "\n";
  }
  auto loaded = LoadPromptsJsonl(path, EndpointKind::kCompletions);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].text, "hello");
  EXPECT_EQ((*loaded)[1].ids, (std::vector<int32_t>{1, 2, 3}));
  // Token ids cannot go to a chat endpoint; the error names the line.
  auto chat = LoadPromptsJsonl(path, EndpointKind::kChat);
  ASSERT_FALSE(chat.ok());
  EXPECT_NE(chat.status().message().find(":3:"), std::string::npos) << chat.status().message();
  {
    std::ofstream out(path);
    out << R"({"prompt": [1, -2]})"
        << "\n";
  }
  EXPECT_FALSE(LoadPromptsJsonl(path, EndpointKind::kCompletions).ok());
  std::remove(path.c_str());
  EXPECT_FALSE(LoadPromptsJsonl(path, EndpointKind::kCompletions).ok());

  auto a = SyntheticPrompts(3, 5, 9, EndpointKind::kCompletions, 100);
  auto b = SyntheticPrompts(3, 5, 9, EndpointKind::kCompletions, 100);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[2].ids, b[2].ids);  // deterministic in the seed
  EXPECT_NE(a[0].ids, a[1].ids);
  for (int32_t id : a[0].ids) EXPECT_TRUE(id >= 10 && id < 100);
}

TEST(EndpointCompare, ReportNamesTheFirstFailingPromptAndPosition) {
  auto step = [](const std::string& token, double lp) {
    TokenStep s;
    s.token = token;
    s.logprob = lp;
    s.top = {{token, lp}, {"other", lp - 2}};
    return s;
  };
  const CompareThresholds th;
  EndpointComparison out;
  AddPromptComparison(0, {step("a", -0.1), step("b", -0.2)}, {step("a", -0.1), step("b", -0.2)}, 2,
                      th, &out);
  AddPromptComparison(1, {step("a", -0.1), step("b", -0.2)}, {step("a", -0.1), step("c", -0.2)}, 2,
                      th, &out);
  EXPECT_FALSE(out.pass());
  EXPECT_EQ(out.failed, 1);
  EXPECT_EQ(out.reason.rfind("prompt 1: greedy divergence at position 1", 0), 0u) << out.reason;
  auto report = nlohmann::json::parse(EndpointComparisonJson({}, {}, {}, th, out));
  EXPECT_EQ(report["verdict"], "fail");
  EXPECT_EQ(report["prompts"][0]["verdict"], "pass");
  EXPECT_EQ(report["prompts"][1]["first_divergence"], 1);
  EXPECT_EQ(report["prompts"][1]["b_token_in_a_top"], false);
  EXPECT_TRUE(report["prompts"][1]["divergence_margin_a"].is_null());  // B's token not in A's top
  EXPECT_EQ(report["summary"]["compared_positions"], 3);
  EXPECT_NE(EndpointComparisonText(th, out).find("FAIL"), std::string::npos);
}

TEST(EndpointCompare, SideWithoutTopLogprobsIsAnErrorNotAPass) {
  TokenStep bare;
  bare.token = "a";
  bare.logprob = -0.1;
  TokenStep full = bare;
  full.top = {{"a", -0.1}, {"b", -3.0}};
  EndpointComparison out;
  AddPromptComparison(4, {full, full}, {full, bare}, 2, {}, &out);
  EXPECT_EQ(out.errors, 1);
  EXPECT_FALSE(out.pass());
  EXPECT_NE(out.reason.find("prompt 4: B returned no top_logprobs at position 1"),
            std::string::npos)
      << out.reason;
}

TEST(Compare, ChosenTokenLogprobIsComparedWhenTopKOmitsIt) {
  // Neither side lists its chosen token among the alternatives; the chosen logprobs differ by 0.4.
  TokenStep a, b;
  a.token = b.token = "t";
  a.logprob = -0.1;
  b.logprob = -0.5;
  a.top = b.top = {{"u", -2.0}};
  std::vector<TokenStep> sa = {a}, sb = {b};
  SequenceComparison r = CompareSequences(sa, sb, {});
  EXPECT_FALSE(r.pass);
  EXPECT_NEAR(r.max_abs_delta, 0.4, 1e-12);
  EXPECT_EQ(r.max_delta_position, 0);
}

}  // namespace
}  // namespace dsinfer::measure
