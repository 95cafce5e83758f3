// Prometheus metrics with vLLM's names and semantics, prefixed "dsinfer:". Engine gauges and
// counters come from EngineStats at scrape time; latency histograms and request outcomes are
// recorded by the server as requests finish. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "transfer/bootstrap_rooms.h"
#include "transfer/kv_transfer.h"

namespace dsinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // Appends the _bucket/_sum/_count lines for `name`.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;    // ascending upper bounds (+Inf implied)
  std::vector<uint64_t> counts_;  // [bounds_.size() + 1], non-cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

// The gauges an endpoint picker scrapes (the Gateway API Inference Extension's EPP and llm-d:
// --total-queued-requests-metric, --total-running-requests-metric,
// --kv-cache-usage-percentage-metric), repeated under the names it is configured with; vLLM's
// names are its defaults. An empty name leaves that gauge out.
struct SchedulerMetricNames {
  std::string waiting = "vllm:num_requests_waiting";
  std::string running = "vllm:num_requests_running";
  std::string kv_usage = "vllm:kv_cache_usage_perc";
};

class ServerMetrics {
 public:
  ServerMetrics();
  void SetSchedulerNames(SchedulerMetricNames names);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveEndToEnd(double seconds);
  void ObserveQueueTime(double seconds);
  void ObserveRequestTokens(int64_t prompt_tokens, int64_t generation_tokens);
  // finished_reason: "stop", "length", "abort", "error" (vLLM's label values).
  void CountFinished(const std::string& finished_reason);
  // reason: "client_disconnect", "cancel_endpoint", "shutdown".
  void CountAborted(const std::string& reason);
  void CountHttp(int status);
  std::string Render(const runtime::EngineStats& stats, int open_connections) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_, queue_, prompt_tokens_, generation_tokens_;
  std::map<std::string, int64_t> finished_;
  std::map<std::string, int64_t> aborted_;
  std::map<int, int64_t> http_responses_;
  SchedulerMetricNames scheduler_names_;
};

// The prefill/decode KV transfer's counters (a prefill or decode worker's /metrics).
std::string RenderKvTransferMetrics(const transfer::TransferStats& t);
// A prefill worker's sglang-router bootstrap rooms.
std::string RenderBootstrapRoomMetrics(const transfer::BootstrapRoomStats& b);

}  // namespace dsinfer::server
