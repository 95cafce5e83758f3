#include "server/metrics.h"

#include <cstdio>

namespace dsinfer::server {
namespace {

// vLLM's bucket boundaries (seconds), so dashboards built for it port directly.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kTokenBuckets = {1,     2,      5,      10,     20,     50,    100,
                                           200,   500,    1000,   2000,   5000,   10000, 20000,
                                           50000, 100000, 200000, 500000, 1000000};

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void Metric(std::string* out, const std::string& name, const char* type, const std::string& help) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void Sample(std::string* out, const std::string& name, double value,
            const std::string& labels = "") {
  out->append(name);
  if (!labels.empty()) out->append("{").append(labels).append("}");
  out->append(" ").append(Number(value)).append("\n");
}

// One unlabelled metric: its HELP / TYPE lines and its sample; a counter's sample is NAME_total.
void Single(std::string* out, const std::string& name, const char* type, const std::string& help,
            double value) {
  Metric(out, name, type, help);
  Sample(out, name + (std::string(type) == "counter" ? "_total" : ""), value);
}

// The RAM / disk tiers behind the prefix cache (runtime/kv_store.h), per tier where it applies.
void RenderKvTier(std::string* out, const runtime::KvStoreStats& k) {
  const std::string p = "dsinfer:kv_tier_";
  auto per_tier = [&](const std::string& name, const char* type, const std::string& help,
                      double ram, double disk) {
    Metric(out, p + name, type, help);
    const std::string sample = p + name + (std::string(type) == "counter" ? "_total" : "");
    Sample(out, sample, ram, "tier=\"ram\"");
    Sample(out, sample, disk, "tier=\"disk\"");
  };
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    Single(out, p + name, "counter", help, v);
  };
  per_tier("entries", "gauge", "Entries held by the tier.", static_cast<double>(k.ram_entries),
           static_cast<double>(k.disk_entries));
  per_tier("bytes", "gauge", "Bytes held by the tier.", static_cast<double>(k.ram_bytes),
           static_cast<double>(k.disk_bytes));
  per_tier("hits", "counter",
           "Entries served from the RAM tier / read (verified) from the disk tier.",
           static_cast<double>(k.ram_hits), static_cast<double>(k.disk_hits));
  per_tier("hit_bytes", "counter", "Bytes served from the RAM tier / read from the disk tier.",
           static_cast<double>(k.ram_hit_bytes), static_cast<double>(k.disk_read_bytes));
  per_tier("evictions", "counter", "Entries evicted from the tier (disk: files deleted).",
           static_cast<double>(k.ram_evictions), static_cast<double>(k.disk_evictions));
  counter("lookups", "Sequence starts that looked beyond the hot prefix cache.",
          static_cast<double>(k.lookups));
  counter("misses", "Lookups that found no longer stored prefix.", static_cast<double>(k.misses));
  counter("hit_tokens", "Prompt tokens restored from the RAM or disk tier.",
          static_cast<double>(k.hit_tokens));
  counter("stores", "Entry files written to the disk tier.", static_cast<double>(k.stores));
  counter("store_bytes", "Bytes written to the disk tier.", static_cast<double>(k.store_bytes));
  counter("store_errors", "Disk writes that failed (full or read-only directory, ...).",
          static_cast<double>(k.store_errors));
  counter("checksum_failures",
          "Entries found truncated, corrupt, foreign or naming other tokens: deleted, recomputed.",
          static_cast<double>(k.checksum_failures));
  counter("load_seconds", "Seconds spent reading and verifying disk-tier entries.", k.load_seconds);
  counter("store_seconds", "Seconds spent writing disk-tier entries (IO thread).", k.store_seconds);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  Metric(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    Sample(out, name + "_bucket", static_cast<double>(cumulative),
           "le=\"" + Number(bounds_[i]) + "\"");
  }
  Sample(out, name + "_bucket", static_cast<double>(count_), "le=\"+Inf\"");
  Sample(out, name + "_sum", sum_);
  Sample(out, name + "_count", static_cast<double>(count_));
}

ServerMetrics::ServerMetrics()
    : ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kLatencyBuckets),
      queue_(kLatencyBuckets),
      prompt_tokens_(kTokenBuckets),
      generation_tokens_(kTokenBuckets) {}

void ServerMetrics::SetSchedulerNames(SchedulerMetricNames names) {
  std::lock_guard lock(mu_);
  scheduler_names_ = std::move(names);
}

void ServerMetrics::ObserveTimeToFirstToken(double s) {
  std::lock_guard lock(mu_);
  ttft_.Observe(s);
}
void ServerMetrics::ObserveInterTokenLatency(double s) {
  std::lock_guard lock(mu_);
  itl_.Observe(s);
}
void ServerMetrics::ObserveEndToEnd(double s) {
  std::lock_guard lock(mu_);
  e2e_.Observe(s);
}
void ServerMetrics::ObserveQueueTime(double s) {
  std::lock_guard lock(mu_);
  queue_.Observe(s);
}
void ServerMetrics::ObserveRequestTokens(int64_t prompt_tokens, int64_t generation_tokens) {
  std::lock_guard lock(mu_);
  prompt_tokens_.Observe(static_cast<double>(prompt_tokens));
  generation_tokens_.Observe(static_cast<double>(generation_tokens));
}
void ServerMetrics::CountFinished(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++finished_[reason];
}
void ServerMetrics::CountAborted(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++aborted_[reason];
}
void ServerMetrics::CountHttp(int status) {
  std::lock_guard lock(mu_);
  ++http_responses_[status];
}

std::string ServerMetrics::Render(const runtime::EngineStats& stats, int open_connections) const {
  std::string out;
  const std::string p = "dsinfer:";
  Metric(&out, p + "num_requests_running", "gauge", "Requests in the engine's running batch.");
  Sample(&out, p + "num_requests_running", stats.n_running);
  Metric(&out, p + "num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
  Sample(&out, p + "num_requests_waiting", stats.n_waiting);
  Metric(&out, p + "kv_cache_usage_perc", "gauge", "Fraction of the KV/state budget in use (0-1).");
  Sample(&out, p + "kv_cache_usage_perc", stats.kv_usage);
  Metric(&out, p + "kv_cache_bytes", "gauge",
         "Bytes of sequence state in use: the states' own plus every page once.");
  Sample(&out, p + "kv_cache_bytes", static_cast<double>(stats.kv_bytes_used));
  Metric(&out, p + "kv_pages", "gauge",
         "Pages of sequence state in use (shared by the requests and cache entries of a prefix).");
  Sample(&out, p + "kv_pages", static_cast<double>(stats.kv_pages_in_use));
  Metric(&out, p + "prefix_cache_entries", "gauge", "Prefix-cache entries held.");
  Sample(&out, p + "prefix_cache_entries", static_cast<double>(stats.prefix_cache_entries));
  Metric(&out, p + "prefix_cache_queries", "counter",
         "Prompt tokens looked up in the prefix cache.");
  Sample(&out, p + "prefix_cache_queries_total", static_cast<double>(stats.prefix_cache_queries));
  Metric(&out, p + "prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.");
  Sample(&out, p + "prefix_cache_hits_total", static_cast<double>(stats.prefix_cache_hits));
  if (stats.kv_store_enabled) RenderKvTier(&out, stats.kv_store);
  Metric(&out, p + "prompt_tokens", "counter", "Prefill tokens processed.");
  Sample(&out, p + "prompt_tokens_total", static_cast<double>(stats.prompt_tokens_total));
  Metric(&out, p + "generation_tokens", "counter", "Tokens generated.");
  Sample(&out, p + "generation_tokens_total", static_cast<double>(stats.generation_tokens_total));
  Metric(&out, p + "num_preemptions", "counter", "Requests preempted by the scheduler.");
  Sample(&out, p + "num_preemptions_total", static_cast<double>(stats.preemptions_total));
  const runtime::SpecDecodeStats& spec = stats.spec_decode;
  if (!spec.num_accepted_tokens_per_pos.empty()) {  // speculative decoding is on
    // vLLM's spec_decode_* semantics: a draft is one sequence's proposal verified in a step.
    Metric(&out, p + "spec_decode_num_drafts", "counter", "Speculative drafts verified.");
    Sample(&out, p + "spec_decode_num_drafts_total", static_cast<double>(spec.num_drafts));
    Metric(&out, p + "spec_decode_num_draft_tokens", "counter", "Draft tokens proposed.");
    Sample(&out, p + "spec_decode_num_draft_tokens_total",
           static_cast<double>(spec.num_draft_tokens));
    Metric(&out, p + "spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.");
    Sample(&out, p + "spec_decode_num_accepted_tokens_total",
           static_cast<double>(spec.num_accepted_tokens));
    Metric(&out, p + "spec_decode_num_accepted_tokens_per_pos", "counter",
           "Draft tokens accepted, by position in the draft (0-based).");
    for (size_t i = 0; i < spec.num_accepted_tokens_per_pos.size(); ++i)
      Sample(&out, p + "spec_decode_num_accepted_tokens_per_pos_total",
             static_cast<double>(spec.num_accepted_tokens_per_pos[i]),
             "position=\"" + std::to_string(i) + "\"");
    Metric(&out, p + "spec_decode_mean_acceptance_length", "gauge",
           "Tokens emitted per verified draft: 1 + accepted / drafts (1 when none yet).");
    Sample(&out, p + "spec_decode_mean_acceptance_length",
           1.0 + (spec.num_drafts > 0 ? static_cast<double>(spec.num_accepted_tokens) /
                                            static_cast<double>(spec.num_drafts)
                                      : 0.0));
  }
  Metric(&out, p + "http_open_connections", "gauge", "Open HTTP connections.");
  Sample(&out, p + "http_open_connections", open_connections);

  std::lock_guard lock(mu_);
  // The same gauges under an endpoint picker's names (SchedulerMetricNames).
  const std::pair<const std::string*, double> scheduler_gauges[] = {
      {&scheduler_names_.waiting, static_cast<double>(stats.n_waiting)},
      {&scheduler_names_.running, static_cast<double>(stats.n_running)},
      {&scheduler_names_.kv_usage, stats.kv_usage}};
  for (const auto& [name, value] : scheduler_gauges) {
    if (name->empty()) continue;
    Metric(&out, *name, "gauge", "Alias of the dsinfer: gauge for endpoint pickers.");
    Sample(&out, *name, value);
  }
  Metric(&out, p + "request_success", "counter", "Finished requests by finish reason.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = finished_.find(reason);
    Sample(&out, p + "request_success_total",
           it == finished_.end() ? 0.0 : static_cast<double>(it->second),
           std::string("finished_reason=\"") + reason + "\"");
  }
  Metric(&out, p + "num_aborted_requests", "counter",
         "Requests aborted before finishing, by reason.");
  for (const char* reason : {"client_disconnect", "cancel_endpoint", "shutdown"}) {
    auto it = aborted_.find(reason);
    Sample(&out, p + "num_aborted_requests_total",
           it == aborted_.end() ? 0.0 : static_cast<double>(it->second),
           std::string("reason=\"") + reason + "\"");
  }
  Metric(&out, p + "http_responses", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : http_responses_)
    Sample(&out, p + "http_responses_total", static_cast<double>(n),
           "code=\"" + std::to_string(status) + "\"");
  ttft_.Render(p + "time_to_first_token_seconds",
               "Time to first token (request arrival to first token).", &out);
  itl_.Render(p + "inter_token_latency_seconds", "Time between consecutive token events.", &out);
  e2e_.Render(p + "e2e_request_latency_seconds", "Request arrival to last token.", &out);
  queue_.Render(p + "request_queue_time_seconds", "Time spent waiting before first scheduled.",
                &out);
  prompt_tokens_.Render(p + "request_prompt_tokens", "Prompt tokens per request.", &out);
  generation_tokens_.Render(p + "request_generation_tokens", "Generated tokens per request.", &out);
  return out;
}

std::string RenderKvTransferMetrics(const transfer::TransferStats& t) {
  std::string out;
  const std::string p = "dsinfer:kv_transfer_";
  auto one = [&](const std::string& name, const char* type, const std::string& help, double v) {
    Single(&out, p + name, type, help, v);
  };
  one("held_blobs", "gauge", "Prefilled states held for a decode worker to pull.",
      static_cast<double>(t.held_blobs));
  one("held_bytes", "gauge", "Bytes of the held states.", static_cast<double>(t.held_bytes));
  one("holds", "counter", "States handed over (held for a pull).",
      static_cast<double>(t.holds_total));
  one("released_pulled", "counter", "Held states released after their pull.",
      static_cast<double>(t.released_pulled_total));
  one("released_deadline", "counter", "Held states released unpulled at their deadline.",
      static_cast<double>(t.released_deadline_total));
  one("pulls", "counter", "States pulled from a prefill worker.",
      static_cast<double>(t.pulls_total));
  one("pull_failures", "counter", "Failed pulls (checksum mismatches included).",
      static_cast<double>(t.pull_failures_total));
  one("checksum_failures", "counter", "Pulled states whose SHA-256 did not match.",
      static_cast<double>(t.checksum_failures_total));
  one("pulled_bytes", "counter", "Bytes pulled.", static_cast<double>(t.pulled_bytes_total));
  one("pull_seconds", "counter", "Seconds spent in successful pulls (acquire, get, checksum).",
      t.pull_seconds_total);
  return out;
}

std::string RenderBootstrapRoomMetrics(const transfer::BootstrapRoomStats& b) {
  std::string out;
  const std::string p = "dsinfer:kv_transfer_bootstrap_rooms_";
  auto one = [&](const std::string& name, const char* type, const std::string& help, double v) {
    Single(&out, p + name, type, help, v);
  };
  one("waiting", "gauge", "Published bootstrap rooms no decode worker has taken yet.",
      static_cast<double>(b.waiting_rooms));
  one("published", "counter", "Bootstrap rooms published (state held, or the failure).",
      static_cast<double>(b.published_total));
  one("taken", "counter", "Bootstrap rooms taken by a decode worker.",
      static_cast<double>(b.taken_total));
  one("expired", "counter", "Bootstrap rooms dropped untaken at the hold deadline.",
      static_cast<double>(b.expired_total));
  return out;
}

}  // namespace dsinfer::server
