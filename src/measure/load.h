// The `bench serve` load generator: streams requests at an OpenAI-compatible endpoint at a fixed
// concurrency (N client threads, each sending back to back) or at a Poisson request rate (arrival
// gaps exponential with mean 1/rate, seeded), and times each request. Metric definitions follow
// vLLM's benchmark_serving (docs: serving-protocols.md §1.5):
//   TTFT  send start -> first SSE chunk carrying output text (text / content / reasoning_content)
//   ITL   gaps between consecutive such chunks
//   TPOT  (e2e - ttft) / (output_tokens - 1), requests with >= 2 output tokens
//   E2E   send start -> end of the stream
// Output and prompt token counts come from the server's usage (stream_options.include_usage).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "measure/http_client.h"
#include "measure/stats.h"

namespace dsinfer::measure {

struct LoadConfig {
  Url url;
  std::string api_key;
  std::string model;  // "" -> omitted from the request
  bool chat = false;  // /v1/chat/completions instead of /v1/completions
  int num_prompts = 16;
  int input_len = 32;     // completions: token ids; chat: words
  int output_len = 16;    // max_tokens with ignore_eos
  int vocab_hint = 1000;  // synthetic token ids are drawn from [10, vocab_hint)
  uint64_t seed = 0;
  double request_rate = 0;  // > 0: Poisson arrivals, unbounded concurrency
  double timeout_s = 600;
  double slo_ttft_ms = 0, slo_tpot_ms = 0, slo_e2e_ms = 0;  // 0: no SLO on that metric
};

struct RequestRecord {
  bool ok = false;
  std::string error;   // kind: "http_<status>", "io", "no_usage", "stream_error"
  std::string detail;  // the error message, for the first-error line
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

struct LevelResult {
  int concurrency = 0;  // 0 in request-rate mode
  double duration_s = 0;
  std::vector<RequestRecord> records;
};

// Runs cfg.num_prompts requests at one concurrency level (ignored when request_rate > 0).
// progress (optional) is called after each finished request with (done, total).
LevelResult RunLevel(const LoadConfig& cfg, int concurrency,
                     const std::function<void(int, int)>& progress = nullptr);

// The JSON object of one level: counts, errors by kind, throughputs, ttft/tpot/itl/e2e in ms,
// goodput. Serialized text (nlohmann stays inside this layer).
std::string LevelJson(const LoadConfig& cfg, const LevelResult& level);
std::string CsvHeader();
std::string LevelCsv(const LoadConfig& cfg, const LevelResult& level);

}  // namespace dsinfer::measure
