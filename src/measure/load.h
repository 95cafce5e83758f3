// The `bench serve` load generator: streams requests at an OpenAI-compatible endpoint at a fixed
// concurrency (N client threads, each sending back to back) or at a Poisson request rate (arrival
// gaps exponential with mean 1/rate, seeded), and times each request. Metric definitions follow
// vLLM's benchmark_serving (docs: serving-protocols.md §1.5):
//   TTFT  send start -> first SSE chunk carrying output text (text / content / reasoning_content)
//   ITL   gaps between consecutive such chunks
//   TPOT  (e2e - ttft) / (output_tokens - 1), requests with >= 2 output tokens
//   E2E   send start -> end of the stream
// Output and prompt token counts come from the server's usage (stream_options.include_usage).
// Request bodies come from measure/workload.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "measure/http_client.h"
#include "measure/prometheus.h"
#include "measure/stats.h"
#include "measure/workload.h"

namespace dsinfer::measure {

struct LoadConfig {
  Url url;
  std::string api_key;
  WorkloadConfig workload;  // what each request sends (and the seed of the arrival gaps)
  int num_prompts = 16;     // requests per level
  double request_rate = 0;  // > 0: Poisson arrivals, unbounded concurrency
  double timeout_s = 600;
  double slo_ttft_ms = 0, slo_tpot_ms = 0, slo_e2e_ms = 0;  // 0: no SLO on that metric
  bool scrape_metrics = true;  // GET /metrics before and after each level (skipped if it fails)
};

struct RequestRecord {
  bool ok = false;
  std::string error;   // kind: "http_<status>", "io", "no_usage", "stream_error"
  std::string detail;  // the error message, for the first-error line
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // usage.prompt_tokens_details.cached_tokens, when reported
};

struct LevelResult {
  int concurrency = 0;  // 0 in request-rate mode
  double duration_s = 0;
  std::vector<RequestRecord> records;
  // The server's /metrics change over the level (scraped right before and after it), so each
  // level's figures can be checked against the server's own histograms of that level alone.
  bool has_server_delta = false;
  PromSnapshot server_delta;
  std::string server_metrics_error;  // why there is no delta ("" when there is one)
};

// Runs cfg.num_prompts requests at one concurrency level (ignored when request_rate > 0);
// `level` is the level's 0-based position in the run, which makes its prompts its own.
// progress (optional) is called after each finished request with (done, total).
LevelResult RunLevel(const LoadConfig& cfg, int level, int concurrency,
                     const std::function<void(int, int)>& progress = nullptr);

// GET /metrics at cfg.url, parsed.
Result<PromSnapshot> ScrapeMetrics(const LoadConfig& cfg);

// The headline numbers of one level (latencies in ms), for plots.
struct LevelFigures {
  int concurrency = 0;
  double request_rate = 0;
  LatencyStats ttft_ms, tpot_ms, itl_ms, e2e_ms;
  double request_throughput = 0, output_token_throughput = 0, total_token_throughput = 0;
};
LevelFigures Figures(const LoadConfig& cfg, const LevelResult& level);

// The JSON object of one level: counts, errors by kind, throughputs, ttft/tpot/itl/e2e in ms,
// goodput. Serialized text (nlohmann stays inside this layer).
std::string LevelJson(const LoadConfig& cfg, const LevelResult& level);
// The report's "config" object: url, endpoint, prompts source, lengths (as given), seed, rate,
// SLOs.
std::string ConfigJson(const LoadConfig& cfg, const std::string& url_text,
                       const std::string& endpoint);
std::string CsvHeader();
std::string LevelCsv(const LoadConfig& cfg, const LevelResult& level);

}  // namespace dsinfer::measure
