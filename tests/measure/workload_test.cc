// Unit tests of what `bench serve` sends and scrapes: per-level /metrics deltas (counters summed
// over labels, histograms bucket by bucket), request plans distinct across levels and requests,
// the length-distribution parser and sampler, and the prompts-file (JSONL) parser.
#include "measure/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "measure/prometheus.h"

namespace dsinfer::measure {
namespace {

using Json = nlohmann::json;

std::string Scrape(int successes_stop, int successes_length, int hits, int b1, int b2, int count) {
  return "# TYPE dsinfer:request_success counter\n"
         "dsinfer:request_success_total{finished_reason=\"stop\"} " +
         std::to_string(successes_stop) +
         "\n"
         "dsinfer:request_success_total{finished_reason=\"length\"} " +
         std::to_string(successes_length) +
         "\n"
         "dsinfer:prefix_cache_hits_total " +
         std::to_string(hits) +
         "\n"
         "dsinfer:num_requests_running 3\n"
         "dsinfer:ttft_seconds_bucket{le=\"0.1\"} " +
         std::to_string(b1) +
         "\n"
         "dsinfer:ttft_seconds_bucket{le=\"1\"} " +
         std::to_string(b2) +
         "\n"
         "dsinfer:ttft_seconds_bucket{le=\"+Inf\"} " +
         std::to_string(count) +
         "\n"
         "dsinfer:ttft_seconds_sum 1.5\n"
         "dsinfer:ttft_seconds_count " +
         std::to_string(count) + "\n";
}

TEST(PromSnapshot, CountersSumOverLabelsAndGaugesAreLeftOut) {
  auto snap = ParsePrometheusSnapshot(Scrape(2, 5, 40, 1, 6, 7));
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ(snap->counters.at("dsinfer:request_success_total"), 7);
  EXPECT_EQ(snap->counters.at("dsinfer:prefix_cache_hits_total"), 40);
  EXPECT_EQ(snap->counters.count("dsinfer:num_requests_running"), 0u);
  ASSERT_EQ(snap->histograms.count("dsinfer:ttft_seconds"), 1u);
  EXPECT_EQ(snap->histograms.at("dsinfer:ttft_seconds").count, 7);
}

TEST(PromSnapshot, DeltaIsPerCounterAndPerBucket) {
  auto before = ParsePrometheusSnapshot(Scrape(2, 5, 40, 1, 6, 7));
  auto after = ParsePrometheusSnapshot(Scrape(3, 9, 40, 4, 10, 12));
  ASSERT_TRUE(before.ok() && after.ok());
  PromSnapshot d = SnapshotDelta(*before, *after);
  EXPECT_EQ(d.counters.at("dsinfer:request_success_total"), 5);
  EXPECT_EQ(d.counters.at("dsinfer:prefix_cache_hits_total"), 0);
  const PromHistogram& h = d.histograms.at("dsinfer:ttft_seconds");
  EXPECT_EQ(h.count, 5);
  EXPECT_DOUBLE_EQ(h.sum, 0);
  ASSERT_EQ(h.buckets.size(), 3u);
  EXPECT_EQ(h.buckets[0], std::make_pair(0.1, 3.0));
  EXPECT_EQ(h.buckets[1], std::make_pair(1.0, 4.0));
  EXPECT_TRUE(std::isinf(h.buckets[2].first));
  EXPECT_EQ(h.buckets[2].second, 5);
  // Names new in `after` (e.g. the first scrape of a fresh server) count from 0.
  PromSnapshot empty;
  EXPECT_EQ(SnapshotDelta(empty, *after).counters.at("dsinfer:request_success_total"), 12);
}

TEST(PromSnapshot, MalformedScrapeIsAnError) {
  EXPECT_FALSE(ParsePrometheusSnapshot("dsinfer:x_total abc\n").ok());
}

// The prompt of a synthetic plan: its token ids (completions) or its text (chat).
std::string PromptOf(const RequestPlan& plan) {
  Json body = Json::parse(plan.body);
  return plan.chat ? body["messages"][0]["content"].get<std::string>() : body["prompt"].dump();
}

TEST(Workload, SyntheticPromptsDifferAcrossLevelsAndRequestsAndRepeatPerSeed) {
  for (bool chat : {false, true}) {
    WorkloadConfig cfg;
    cfg.chat = chat;
    cfg.seed = 7;
    std::set<std::string> prompts;
    for (int level = 0; level < 3; ++level)
      for (int i = 0; i < 20; ++i) prompts.insert(PromptOf(PlanRequest(cfg, level, i, 20)));
    EXPECT_EQ(prompts.size(), 60u) << "chat=" << chat;
    // The same (seed, level, index) gives the same body; another seed another one.
    EXPECT_EQ(PlanRequest(cfg, 1, 3, 20).body, PlanRequest(cfg, 1, 3, 20).body);
    WorkloadConfig other = cfg;
    other.seed = 8;
    EXPECT_NE(PlanRequest(cfg, 1, 3, 20).body, PlanRequest(other, 1, 3, 20).body);
  }
}

TEST(Workload, ExtraBodyFieldsRideOnEveryRequestOverTheGeneratedOnes) {
  WorkloadConfig cfg;
  cfg.extra_body_json = R"j({"response_format":{"type":"json_object"},"ignore_eos":false})j";
  const auto body = nlohmann::json::parse(PlanRequest(cfg, 0, 1, 4).body);
  EXPECT_EQ(body["response_format"]["type"], "json_object");
  EXPECT_EQ(body["ignore_eos"], false);
  EXPECT_TRUE(body.contains("prompt"));
  EXPECT_TRUE(CheckExtraBody(cfg.extra_body_json).ok());
  EXPECT_FALSE(CheckExtraBody("[1]").ok());
  EXPECT_FALSE(CheckExtraBody("{oops").ok());
}

TEST(Workload, SyntheticBodyAsksForAStreamWithUsageAndTheLengths) {
  WorkloadConfig cfg;
  cfg.model = "m";
  cfg.input_len = {LengthSpec::Kind::kFixed, 12, 0, "12"};
  cfg.output_len = {LengthSpec::Kind::kFixed, 5, 0, "5"};
  cfg.vocab_hint = 50;
  Json body = Json::parse(PlanRequest(cfg, 0, 0, 1).body);
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["max_tokens"], 5);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["temperature"], 0);  // greedy unless asked
  EXPECT_FALSE(body.contains("seed"));
  ASSERT_EQ(body["prompt"].size(), 12u);
  for (const Json& id : body["prompt"]) {
    EXPECT_GE(id.get<int>(), 10);
    EXPECT_LT(id.get<int>(), 50);
  }
}

TEST(Workload, SampledRequestsCarryTheTemperatureAndASeedOfTheirOwn) {
  WorkloadConfig cfg;
  cfg.seed = 3;
  cfg.temperature = 0.8;
  const Json a = Json::parse(PlanRequest(cfg, 0, 0, 4).body);
  const Json b = Json::parse(PlanRequest(cfg, 0, 1, 4).body);
  EXPECT_EQ(a["temperature"], 0.8);
  ASSERT_TRUE(a.contains("seed") && b.contains("seed"));
  EXPECT_NE(a["seed"], b["seed"]);
  EXPECT_EQ(a["seed"], Json::parse(PlanRequest(cfg, 0, 0, 4).body)["seed"]);  // repeatable
}

TEST(LengthSpec, ParsesTheThreeFormsAndRejectsBadOnes) {
  auto fixed = ParseLengthSpec("32");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->kind, LengthSpec::Kind::kFixed);
  EXPECT_EQ(fixed->a, 32);
  auto uniform = ParseLengthSpec("uniform:16:64");
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->kind, LengthSpec::Kind::kUniform);
  EXPECT_EQ(uniform->a, 16);
  EXPECT_EQ(uniform->b, 64);
  auto normal = ParseLengthSpec("normal:100:12.5");
  ASSERT_TRUE(normal.ok());
  EXPECT_EQ(normal->kind, LengthSpec::Kind::kNormal);
  EXPECT_EQ(normal->b, 12.5);
  EXPECT_EQ(normal->text, "normal:100:12.5");
  for (const char* bad : {"", "0", "-3", "2.5", "x", "uniform:8", "uniform:9:8", "uniform:0:4",
                          "uniform:1.5:4", "normal:0:1", "normal:10:-1", "normal:10:nan",
                          "gamma:1:2", "uniform:1:2:3", "32:", "normal:1e300:1"}) {
    auto r = ParseLengthSpec(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("expected N"), std::string::npos) << bad;
  }
}

TEST(LengthSpec, SamplesStayInRangeAndMatchTheDistribution) {
  std::mt19937_64 rng(1);
  const LengthSpec uniform = *ParseLengthSpec("uniform:3:6");
  std::set<int> seen;
  for (int i = 0; i < 2000; ++i) {
    const int v = SampleLength(uniform, rng);
    ASSERT_GE(v, 3);
    ASSERT_LE(v, 6);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 4u);  // both ends are reachable
  const LengthSpec normal = *ParseLengthSpec("normal:50:10");
  double sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) sum += SampleLength(normal, rng);
  EXPECT_NEAR(sum / n, 50, 0.5);  // standard error 10/sqrt(20000) = 0.07
  // A wide normal around 1 is clipped, never below 1.
  const LengthSpec clipped = *ParseLengthSpec("normal:1:50");
  for (int i = 0; i < 2000; ++i) ASSERT_GE(SampleLength(clipped, rng), 1);
  EXPECT_EQ(SampleLength(*ParseLengthSpec("7"), rng), 7);
}

TEST(Workload, LengthsVaryPerRequestUnderADistribution) {
  WorkloadConfig cfg;
  cfg.input_len = *ParseLengthSpec("uniform:4:40");
  cfg.output_len = *ParseLengthSpec("uniform:2:9");
  std::set<size_t> input_lens;
  std::set<int> output_lens;
  for (int i = 0; i < 64; ++i) {
    Json body = Json::parse(PlanRequest(cfg, 0, i, 64).body);
    input_lens.insert(body["prompt"].size());
    output_lens.insert(body["max_tokens"].get<int>());
    EXPECT_GE(body["prompt"].size(), 4u);
    EXPECT_LE(body["prompt"].size(), 40u);
  }
  EXPECT_GT(input_lens.size(), 10u);
  EXPECT_GT(output_lens.size(), 4u);
}

TEST(PromptsJsonl, ParsesPromptsMessagesAndMaxTokens) {
  const std::string text =
      "{\"prompt\": \"Hello there\"}\n"
      "\n"
      "{\"prompt\": [1, 2, 3], \"max_tokens\": 7}\r\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 3}\n";
  auto r = ParsePromptsJsonl(text, "p.jsonl");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_FALSE((*r)[0].chat);
  EXPECT_EQ((*r)[0].prompt_json, "\"Hello there\"");
  EXPECT_EQ((*r)[0].max_tokens, 0);
  EXPECT_EQ((*r)[1].prompt_json, "[1,2,3]");
  EXPECT_EQ((*r)[1].max_tokens, 7);
  EXPECT_TRUE((*r)[2].chat);
  EXPECT_EQ((*r)[2].max_tokens, 3);

  // Plans take the lines in order (from a seeded start) and keep their endpoint and max_tokens.
  WorkloadConfig cfg;
  cfg.prompts = *r;
  cfg.output_len = *ParseLengthSpec("11");
  std::multiset<std::string> prompts;
  for (int i = 0; i < 3; ++i) {
    const RequestPlan plan = PlanRequest(cfg, 0, i, 3);
    Json body = Json::parse(plan.body);
    if (plan.chat) {
      EXPECT_EQ(body["messages"][0]["content"], "hi");
      EXPECT_EQ(body["max_tokens"], 3);
      prompts.insert("chat");
    } else {
      prompts.insert(body["prompt"].dump());
      EXPECT_EQ(body["max_tokens"], body["prompt"].is_string() ? 11 : 7);
    }
  }
  EXPECT_EQ(prompts, (std::multiset<std::string>{"\"Hello there\"", "[1,2,3]", "chat"}));
  // The next level starts where this one ended (3 prompts per level, 3 lines: it wraps).
  EXPECT_EQ(PlanRequest(cfg, 1, 0, 3).body, PlanRequest(cfg, 0, 0, 3).body);
  EXPECT_NE(PlanRequest(cfg, 1, 0, 2).body, PlanRequest(cfg, 0, 0, 2).body);
}

TEST(PromptsJsonl, BadLinesNameTheLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"{\"prompt\": \"a\"}\n{not json\n", "line 2: not valid JSON"},
      {"[1, 2]\n", "line 1: expected a JSON object"},
      {"{\"text\": \"a\"}\n", "line 1: needs exactly one of"},
      {"{\"prompt\": \"a\", \"messages\": []}\n", "line 1: needs exactly one of"},
      {"\n\n{\"prompt\": \"\"}\n", "line 3: \"prompt\" must be"},
      {"{\"prompt\": [1, -2]}\n", "line 1: \"prompt\" must be"},
      {"{\"messages\": []}\n", "line 1: \"messages\" must be"},
      {"{\"messages\": [{\"content\": \"x\"}]}\n", "line 1: each message"},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}\n", "line 1: \"max_tokens\""},
      {"{\"prompt\": \"a\", \"max_tokens\": \"5\"}\n", "line 1: \"max_tokens\""},
      {"\n  \n", "no prompts"},
  };
  for (const auto& [text, want] : cases) {
    auto r = ParsePromptsJsonl(text, "bad.jsonl");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(
        r.status().message().find(std::string("bad.jsonl") + (want[0] == 'n' ? ": " : " ") + want),
        std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace dsinfer::measure
