// Unit tests of the measure layer: percentile statistics, the SSE reader under split reads, the
// Prometheus histogram parser, the compare verdicts on synthetic logprob data, and the bench
// serve CSV row.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "measure/compare.h"
#include "measure/load.h"
#include "measure/prometheus.h"
#include "measure/sse.h"
#include "measure/stats.h"

namespace dsinfer::measure {
namespace {

TEST(Stats, LinearInterpolationPercentiles) {
  // numpy.percentile([1..10], [50, 90, 99]) = 5.5, 9.1, 9.91
  std::vector<double> v = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  LatencyStats s = Summarize(v);
  EXPECT_EQ(s.count, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_NEAR(s.p90, 9.1, 1e-12);
  EXPECT_NEAR(s.p99, 9.91, 1e-12);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 10);
}

TEST(Stats, SingleAndEmpty) {
  LatencyStats one = Summarize({3.0});
  EXPECT_EQ(one.median, 3.0);
  EXPECT_EQ(one.p99, 3.0);
  LatencyStats none = Summarize({});
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.mean, 0);
}

TEST(Sse, EveryTwoWaySplitGivesTheSameEvents) {
  const std::string stream =
      ": keep-alive\n\ndata: {\"a\":1}\n\ndata: {\"b\":\r\ndata: 2}\r\n\r\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseReader r;
    auto e1 = r.Feed(std::string_view(stream).substr(0, cut));
    auto e2 = r.Feed(std::string_view(stream).substr(cut));
    e1.insert(e1.end(), e2.begin(), e2.end());
    ASSERT_EQ(e1.size(), 2u) << "cut at " << cut;
    EXPECT_EQ(e1[0], "{\"a\":1}");
    EXPECT_EQ(e1[1], "{\"b\":\n2}");
    EXPECT_TRUE(r.done());
  }
}

TEST(Sse, ByteByByteAndNoDoneYet) {
  const std::string stream = "data: x\n\ndata: y\n";
  SseReader r;
  std::vector<std::string> all;
  for (char c : stream)
    for (auto& e : r.Feed(std::string_view(&c, 1))) all.push_back(e);
  ASSERT_EQ(all.size(), 1u);  // "y" has no terminating blank line yet
  EXPECT_EQ(all[0], "x");
  EXPECT_FALSE(r.done());
}

// One CSV field per header column; the realized mean lengths count completed requests only.
TEST(LoadCsv, RowMatchesHeaderAndCarriesMeanLengths) {
  LoadConfig cfg;
  LevelResult level;
  level.concurrency = 4;
  level.duration_s = 2.0;
  for (int i = 0; i < 3; ++i) {
    RequestRecord r;
    r.ok = i < 2;  // the third failed: its tokens are not part of the means
    r.prompt_tokens = 100 + 20 * i;
    r.output_tokens = 10 + 4 * i;
    r.ttft_s = 0.1, r.e2e_s = 0.5;
    level.records.push_back(r);
  }
  const std::string header = CsvHeader(), row = LevelCsv(cfg, level);
  auto fields = [](const std::string& line) {
    std::vector<std::string> out(1);
    for (char ch : line) {
      if (ch == '\n') break;
      if (ch == ',')
        out.emplace_back();
      else
        out.back() += ch;
    }
    return out;
  };
  const auto names = fields(header), values = fields(row);
  ASSERT_EQ(names.size(), values.size()) << header << row;
  EXPECT_EQ(names[names.size() - 2], "mean_input_tokens");
  EXPECT_EQ(values[values.size() - 2], "110.0");  // (100 + 120) / 2
  EXPECT_EQ(names.back(), "mean_output_tokens");
  EXPECT_EQ(values.back(), "12.0");  // (10 + 14) / 2
}

TEST(Prometheus, ParsesHistogramsAndQuantileBucket) {
  const std::string text =
      "# HELP dsinfer:ttft Time.\n# TYPE dsinfer:ttft histogram\n"
      "dsinfer:ttft_bucket{le=\"0.1\"} 1\n"
      "dsinfer:ttft_bucket{le=\"0.5\"} 3\n"
      "dsinfer:ttft_bucket{le=\"1\"} 4\n"
      "dsinfer:ttft_bucket{le=\"+Inf\"} 4\n"
      "dsinfer:ttft_sum 1.25\n"
      "dsinfer:ttft_count 4\n"
      "dsinfer:generation_tokens_total 17\n"
      "dsinfer:request_success_total{finished_reason=\"stop\"} 2\n";
  auto h = ParsePrometheusHistograms(text);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 1u);
  const PromHistogram& t = h->at("dsinfer:ttft");
  EXPECT_EQ(t.count, 4);
  EXPECT_DOUBLE_EQ(t.sum, 1.25);
  ASSERT_EQ(t.buckets.size(), 4u);
  EXPECT_TRUE(std::isinf(t.buckets.back().first));
  EXPECT_EQ(t.QuantileBucket(0.5), 1);  // 2 of 4 reached in the le=0.5 bucket
  EXPECT_EQ(t.QuantileBucket(0.25), 0);
  EXPECT_EQ(t.QuantileBucket(1.0), 2);
}

TEST(Prometheus, RejectsMalformedValue) {
  EXPECT_FALSE(ParsePrometheusHistograms("x_bucket{le=\"1\"} abc\n").ok());
  EXPECT_FALSE(ParsePrometheusHistograms("x_bucket{le=\"1\" 3\n").ok());
}

std::vector<TokenStep> Synthetic(int n) {
  std::vector<TokenStep> s;
  for (int i = 0; i < n; ++i) {
    TokenStep t;
    t.token = "t" + std::to_string(i);
    t.logprob = -0.2;
    t.top = {{t.token, -0.2}, {"alt" + std::to_string(i), -2.0}, {"z", -4.0}};
    s.push_back(t);
  }
  return s;
}

TEST(Compare, IdenticalPasses) {
  auto a = Synthetic(8);
  SequenceComparison r = CompareSequences(a, a, {});
  EXPECT_TRUE(r.pass) << r.reason;
  EXPECT_EQ(r.divergence, -1);
  EXPECT_EQ(r.compared, 8);
  EXPECT_EQ(r.max_abs_delta, 0);
  EXPECT_NEAR(r.max_kl, 0, 1e-12);
}

TEST(Compare, FlippedTokenFailsAtThatPosition) {
  auto a = Synthetic(8), b = Synthetic(8);
  b[5].token = "alt5";  // B chose A's second choice: a 1.8-nat margin, not a tie
  b[5].top = {{"alt5", -0.2}, {"t5", -2.0}, {"z", -4.0}};
  SequenceComparison r = CompareSequences(a, b, {});
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.divergence, 5);
  EXPECT_EQ(r.compared, 5);
  EXPECT_TRUE(r.b_in_a_top);
  EXPECT_TRUE(r.a_in_b_top);
  EXPECT_FALSE(r.near_tie);
  EXPECT_NE(r.reason.find("position 5"), std::string::npos) << r.reason;
}

TEST(Compare, NearTieDivergencePasses) {
  auto a = Synthetic(6), b = Synthetic(6);
  a[3].top["alt3"] = -0.205;  // A's top-2 within 0.005 nats of its top-1
  b[3].token = "alt3";
  b[3].top = {{"alt3", -0.2}, {"t3", -0.204}, {"z", -4.0}};
  SequenceComparison r = CompareSequences(a, b, {});
  EXPECT_EQ(r.divergence, 3);
  EXPECT_TRUE(r.near_tie);
  EXPECT_TRUE(r.pass) << r.reason;
}

TEST(Compare, PerturbedLogprobsFailOnDeltaNamingPosition) {
  auto a = Synthetic(6), b = Synthetic(6);
  b[2].top["alt2"] = -2.5;  // 0.5 nats off; same greedy tokens
  SequenceComparison r = CompareSequences(a, b, {});
  EXPECT_EQ(r.divergence, -1);
  EXPECT_FALSE(r.pass);
  EXPECT_NEAR(r.max_abs_delta, 0.5, 1e-12);
  EXPECT_EQ(r.max_delta_position, 2);
  EXPECT_NE(r.reason.find("position 2"), std::string::npos) << r.reason;
}

TEST(Compare, KlEstimateMatchesHandComputation) {
  // Same support: KL of the renormalized distributions.
  std::map<std::string, double> a = {{"x", std::log(0.6)}, {"y", std::log(0.2)}};
  std::map<std::string, double> b = {{"x", std::log(0.4)}, {"y", std::log(0.4)}};
  const double pa0 = 0.75, pa1 = 0.25, pb = 0.5;
  EXPECT_NEAR(TopKKlEstimate(a, b), pa0 * std::log(pa0 / pb) + pa1 * std::log(pa1 / pb), 1e-12);
  // A token missing from B's top-k takes B's smallest logprob (the stated floor).
  std::map<std::string, double> c = {{"x", std::log(0.4)}};
  std::map<std::string, double> c_filled = {{"x", std::log(0.4)}, {"y", std::log(0.4)}};
  EXPECT_NEAR(TopKKlEstimate(a, c), TopKKlEstimate(a, c_filled), 1e-12);
}

TEST(Compare, LogitsArgmaxAndNmse) {
  // [2 rows, 3 vocab]
  std::vector<float> ref = {1, 2, 3, 3, 2, 1};
  std::vector<float> same = ref;
  LogitsComparison r = CompareLogits(same, ref, 3);
  EXPECT_EQ(r.argmax_agree, 2);
  EXPECT_EQ(r.nmse, 0);
  EXPECT_EQ(r.first_argmax_mismatch, -1);
  std::vector<float> off = {1, 2, 3, 1, 2, 3};  // row 1's argmax moves
  r = CompareLogits(off, ref, 3);
  EXPECT_EQ(r.argmax_agree, 1);
  EXPECT_EQ(r.first_argmax_mismatch, 1);
  EXPECT_EQ(r.max_abs, 2);
  EXPECT_NEAR(r.nmse, 8.0 / 28.0, 1e-12);
  EXPECT_EQ(r.max_kl_row, 1);
  EXPECT_GT(r.max_kl, 0.5);
}

}  // namespace
}  // namespace dsinfer::measure
