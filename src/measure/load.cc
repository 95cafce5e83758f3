#include "measure/load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "measure/sse.h"

namespace dsinfer::measure {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool HasOutput(const Json& chunk, bool chat) {
  auto c = chunk.find("choices");
  if (c == chunk.end() || !c->is_array() || c->empty()) return false;
  const Json& choice = (*c)[0];
  auto nonempty = [](const Json& obj, const char* key) {
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() && !it->get<std::string>().empty();
  };
  if (!chat) return nonempty(choice, "text");
  auto d = choice.find("delta");
  return d != choice.end() && d->is_object() &&
         (nonempty(*d, "content") || nonempty(*d, "reasoning_content"));
}

RequestRecord OneRequest(const LoadConfig& cfg, int level, int index) {
  RequestRecord rec;
  const RequestPlan plan = PlanRequest(cfg.workload, level, index, cfg.num_prompts);
  HttpRequestSpec req;
  req.path = plan.chat ? "/v1/chat/completions" : "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  if (!cfg.api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + cfg.api_key);
  req.body = plan.body;
  req.timeout_s = cfg.timeout_s;
  SseReader sse;
  std::string error_body;
  bool stream_error = false, saw_usage = false;
  double last_token_s = -1;
  int status = 0;
  const auto t0 = Clock::now();
  auto result = HttpCall(cfg.url, req, [&](std::string_view bytes) {
    const double now = Since(t0);
    if (error_body.size() < 4096 && status == 0) error_body.append(bytes);
    for (const std::string& event : sse.Feed(bytes)) {
      Json chunk = Json::parse(event, nullptr, /*allow_exceptions=*/false);
      if (chunk.is_discarded() || chunk.contains("error")) {
        stream_error = true;
        continue;
      }
      if (HasOutput(chunk, plan.chat)) {
        if (last_token_s < 0) {
          rec.ttft_s = now;
        } else {
          rec.itl_s.push_back(now - last_token_s);
        }
        last_token_s = now;
      }
      auto u = chunk.find("usage");
      if (u != chunk.end() && u->is_object()) {
        rec.prompt_tokens = u->value("prompt_tokens", int64_t{0});
        rec.output_tokens = u->value("completion_tokens", int64_t{0});
        auto details = u->find("prompt_tokens_details");
        if (details != u->end() && details->is_object())
          rec.cached_prompt_tokens = details->value("cached_tokens", int64_t{0});
        saw_usage = true;
      }
    }
  });
  rec.e2e_s = Since(t0);
  if (!result.ok()) {
    rec.error = "io";
    rec.detail = result.status().ToString();
    return rec;
  }
  status = result->status;
  if (status != 200) {
    rec.error = "http_" + std::to_string(status);
    return rec;
  }
  if (stream_error || last_token_s < 0) {
    rec.error = "stream_error";
    return rec;
  }
  if (!saw_usage) {
    rec.error = "no_usage";
    return rec;
  }
  rec.ok = true;
  return rec;
}

}  // namespace

Result<PromSnapshot> ScrapeMetrics(const LoadConfig& cfg) {
  HttpRequestSpec req;
  req.method = "GET";
  req.path = "/metrics";
  if (!cfg.api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + cfg.api_key);
  req.timeout_s = std::min(cfg.timeout_s, 10.0);
  DSINFER_ASSIGN_OR_RETURN(HttpResult res, HttpCall(cfg.url, req));
  if (res.status != 200) return IoError("GET /metrics: HTTP " + std::to_string(res.status));
  return ParsePrometheusSnapshot(res.body);
}

namespace {

// The server's request-success counter (dsinfer:, vllm:, sglang: prefixes alike), or nullptr.
const double* RequestSuccessCount(const PromSnapshot& snap) {
  for (const auto& [name, value] : snap.counters) {
    const std::string suffix = "request_success_total";
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return &value;
  }
  return nullptr;
}

}  // namespace

LevelResult RunLevel(const LoadConfig& cfg, int level_index, int concurrency,
                     const std::function<void(int, int)>& progress) {
  LevelResult level;
  level.concurrency = cfg.request_rate > 0 ? 0 : concurrency;
  level.records.resize(static_cast<size_t>(cfg.num_prompts));
  std::optional<PromSnapshot> before;
  if (cfg.scrape_metrics) {
    Result<PromSnapshot> scraped = ScrapeMetrics(cfg);
    if (scraped.ok()) {
      before = std::move(*scraped);
    } else {
      level.server_metrics_error = scraped.status().ToString();
    }
  } else {
    level.server_metrics_error = "not scraped";
  }
  std::atomic<int> next{0}, done{0};
  std::mutex progress_mu;
  auto finished = [&] {
    const int d = ++done;
    if (progress) {
      std::lock_guard lock(progress_mu);
      progress(d, cfg.num_prompts);
    }
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  if (cfg.request_rate > 0) {
    // Poisson arrivals: one thread per request, launched at exponential gaps.
    std::mt19937_64 rng(cfg.workload.seed);
    std::exponential_distribution<double> gap(cfg.request_rate);
    for (int i = 0; i < cfg.num_prompts; ++i) {
      threads.emplace_back([&, i] {
        level.records[static_cast<size_t>(i)] = OneRequest(cfg, level_index, i);
        finished();
      });
      std::this_thread::sleep_for(std::chrono::duration<double>(gap(rng)));
    }
  } else {
    for (int w = 0; w < std::max(1, concurrency); ++w) {
      threads.emplace_back([&] {
        for (int i = next++; i < cfg.num_prompts; i = next++) {
          level.records[static_cast<size_t>(i)] = OneRequest(cfg, level_index, i);
          finished();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  level.duration_s = Since(t0);
  if (level.server_metrics_error.empty()) {
    // A server may count a request just after its stream's last byte: wait (briefly) until its
    // success counter covers this level's completed requests, so the delta holds all of them.
    const int completed = static_cast<int>(std::count_if(
        level.records.begin(), level.records.end(), [](const RequestRecord& r) { return r.ok; }));
    const auto settle_deadline = Clock::now() + std::chrono::seconds(2);
    for (;;) {
      Result<PromSnapshot> after = ScrapeMetrics(cfg);
      if (!after.ok()) {  // keep an earlier, shorter-settled delta if there is one
        if (!level.has_server_delta) level.server_metrics_error = after.status().ToString();
        break;
      }
      level.server_delta = SnapshotDelta(*before, *after);
      level.has_server_delta = true;
      const double* successes = RequestSuccessCount(level.server_delta);
      if (successes == nullptr || *successes >= completed || Clock::now() > settle_deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return level;
}

namespace {

struct Summary {
  int completed = 0, failed = 0, good = 0;
  int64_t input_tokens = 0, output_tokens = 0, cached_prompt_tokens = 0;
  std::map<std::string, int> errors;
  LatencyStats ttft, tpot, itl, e2e;  // milliseconds
};

Summary Summarize(const LoadConfig& cfg, const LevelResult& level) {
  Summary s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const auto& r : level.records) {
    if (!r.ok) {
      ++s.failed;
      ++s.errors[r.error];
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.output_tokens;
    s.cached_prompt_tokens += r.cached_prompt_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.e2e_s * 1e3);
    double r_tpot = 0;
    if (r.output_tokens > 1) {
      r_tpot = (r.e2e_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1);
      tpot.push_back(r_tpot);
    }
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    const bool good = (cfg.slo_ttft_ms <= 0 || r.ttft_s * 1e3 <= cfg.slo_ttft_ms) &&
                      (cfg.slo_tpot_ms <= 0 || r_tpot <= cfg.slo_tpot_ms) &&
                      (cfg.slo_e2e_ms <= 0 || r.e2e_s * 1e3 <= cfg.slo_e2e_ms);
    if (good) ++s.good;
  }
  s.ttft = measure::Summarize(ttft);
  s.tpot = measure::Summarize(tpot);
  s.itl = measure::Summarize(itl);
  s.e2e = measure::Summarize(e2e);
  return s;
}

Json StatsJson(const LatencyStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"median", s.median}, {"p90", s.p90},
          {"p99", s.p99},     {"min", s.min},   {"max", s.max}};
}

// The level's /metrics delta: counters, and histograms with their finite buckets (the +Inf
// bucket equals "count"; JSON has no infinity).
Json ServerDeltaJson(const PromSnapshot& delta) {
  Json histograms = Json::object();
  for (const auto& [name, h] : delta.histograms) {
    Json buckets = Json::array();
    for (const auto& [le, count] : h.buckets)
      if (std::isfinite(le)) buckets.push_back({le, count});
    histograms[name] = {{"count", h.count}, {"sum", h.sum}, {"buckets", buckets}};
  }
  return {{"counters", delta.counters}, {"histograms", histograms}};
}

}  // namespace

LevelFigures Figures(const LoadConfig& cfg, const LevelResult& level) {
  const Summary s = Summarize(cfg, level);
  const double dur = level.duration_s > 0 ? level.duration_s : 1e-9;
  LevelFigures f;
  f.concurrency = level.concurrency;
  f.request_rate = cfg.request_rate;
  f.ttft_ms = s.ttft;
  f.tpot_ms = s.tpot;
  f.itl_ms = s.itl;
  f.e2e_ms = s.e2e;
  f.request_throughput = s.completed / dur;
  f.output_token_throughput = static_cast<double>(s.output_tokens) / dur;
  f.total_token_throughput = static_cast<double>(s.input_tokens + s.output_tokens) / dur;
  return f;
}

std::string LevelJson(const LoadConfig& cfg, const LevelResult& level) {
  const Summary s = Summarize(cfg, level);
  const double dur = level.duration_s > 0 ? level.duration_s : 1e-9;
  Json j = {
      {"concurrency", level.concurrency},
      {"request_rate", cfg.request_rate},
      {"completed", s.completed},
      {"failed", s.failed},
      {"errors", s.errors},
      {"duration_s", level.duration_s},
      {"total_input_tokens", s.input_tokens},
      {"total_output_tokens", s.output_tokens},
      {"total_cached_prompt_tokens", s.cached_prompt_tokens},
      {"mean_input_tokens", s.completed ? static_cast<double>(s.input_tokens) / s.completed : 0.0},
      {"mean_output_tokens",
       s.completed ? static_cast<double>(s.output_tokens) / s.completed : 0.0},
      {"request_throughput", s.completed / dur},
      {"output_token_throughput", static_cast<double>(s.output_tokens) / dur},
      {"total_token_throughput", static_cast<double>(s.input_tokens + s.output_tokens) / dur},
      {"request_goodput", s.good / dur},
      {"ttft_ms", StatsJson(s.ttft)},
      {"tpot_ms", StatsJson(s.tpot)},
      {"itl_ms", StatsJson(s.itl)},
      {"e2e_ms", StatsJson(s.e2e)}};
  if (level.has_server_delta) {
    j["server_metrics"] = ServerDeltaJson(level.server_delta);
  } else {
    j["server_metrics"] = nullptr;
    j["server_metrics_error"] = level.server_metrics_error;
  }
  return j.dump();
}

std::string ConfigJson(const LoadConfig& cfg, const std::string& url_text,
                       const std::string& endpoint) {
  const WorkloadConfig& w = cfg.workload;
  Json j = {
      {"url", url_text},
      {"endpoint", endpoint},
      {"num_prompts", cfg.num_prompts},
      {"input_len", w.input_len.text},
      {"output_len", w.output_len.text},
      {"seed", w.seed},
      {"temperature", w.temperature},
      {"request_rate", cfg.request_rate},
      {"slo_ms", {{"ttft", cfg.slo_ttft_ms}, {"tpot", cfg.slo_tpot_ms}, {"e2e", cfg.slo_e2e_ms}}}};
  if (!w.extra_body_json.empty())
    j["extra_body"] = Json::parse(w.extra_body_json, nullptr, /*allow_exceptions=*/false);
  if (!w.prompts_source.empty()) {
    j["prompts_file"] = w.prompts_source;
    j["prompts_in_file"] = w.prompts.size();
  }
  return j.dump();
}

std::string CsvHeader() {
  return "concurrency,request_rate,completed,failed,duration_s,request_throughput,"
         "output_token_throughput,total_token_throughput,request_goodput,ttft_mean_ms,"
         "ttft_median_ms,ttft_p99_ms,tpot_mean_ms,tpot_median_ms,tpot_p99_ms,itl_median_ms,"
         "itl_p99_ms,e2e_mean_ms,e2e_median_ms,e2e_p99_ms,mean_input_tokens,mean_output_tokens\n";
}

std::string LevelCsv(const LoadConfig& cfg, const LevelResult& level) {
  const Summary s = Summarize(cfg, level);
  const double dur = level.duration_s > 0 ? level.duration_s : 1e-9;
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "%d,%g,%d,%d,%.3f,%.4f,%.3f,%.3f,%.4f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,"
                "%.2f,%.2f,%.1f,%.1f\n",
                level.concurrency, cfg.request_rate, s.completed, s.failed, level.duration_s,
                s.completed / dur, static_cast<double>(s.output_tokens) / dur,
                static_cast<double>(s.input_tokens + s.output_tokens) / dur, s.good / dur,
                s.ttft.mean, s.ttft.median, s.ttft.p99, s.tpot.mean, s.tpot.median, s.tpot.p99,
                s.itl.median, s.itl.p99, s.e2e.mean, s.e2e.median, s.e2e.p99,
                s.completed > 0 ? static_cast<double>(s.input_tokens) / s.completed : 0.0,
                s.completed > 0 ? static_cast<double>(s.output_tokens) / s.completed : 0.0);
  return buf;
}

}  // namespace dsinfer::measure
