// Unit tests of what `bench serve` sends and scrapes: per-level /metrics deltas (counters summed
// over labels, histograms bucket by bucket), and request plans distinct across levels and requests.
#include "measure/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
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
  ASSERT_EQ(body["prompt"].size(), 12u);
  for (const Json& id : body["prompt"]) {
    EXPECT_GE(id.get<int>(), 10);
    EXPECT_LT(id.get<int>(), 50);
  }
}

}  // namespace
}  // namespace dsinfer::measure
