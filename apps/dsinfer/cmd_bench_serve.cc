// dsinfer bench serve: drives an OpenAI-compatible server with streaming requests and reports
// TTFT, TPOT, ITL, end-to-end latency, throughput and goodput per concurrency level (JSON, CSV).
// The work is in src/measure/load.cc; this file parses flags and writes the reports.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "measure/load.h"
#include "measure/plot.h"

namespace dsinfer::cli {
namespace {

bool ParseIntList(const std::string& text, std::vector<int>* out) {
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1) return false;
    out->push_back(static_cast<int>(v));
  }
  return !out->empty();
}

// "ttft=500,tpot=50,e2e=2000" (milliseconds).
bool ParseSlo(const std::string& text, measure::LoadConfig* cfg) {
  std::vector<std::pair<std::string, std::string>> items;
  if (!ParseKeyValues(text, &items)) return false;
  for (const auto& [key, value] : items) {
    const double v = std::atof(value.c_str());
    if (key == "ttft")
      cfg->slo_ttft_ms = v;
    else if (key == "tpot")
      cfg->slo_tpot_ms = v;
    else if (key == "e2e")
      cfg->slo_e2e_ms = v;
    else
      return false;
  }
  return true;
}

}  // namespace

// The server's speculative decoding over the level (its dsinfer:spec_decode_* counters), when
// it speculates: draft acceptance and tokens per verified draft.
static void PrintSpeculation(int concurrency, const measure::LevelResult& level) {
  if (!level.has_server_delta) return;
  const auto& counters = level.server_delta.counters;
  auto counter = [&](const char* name) {
    auto it = counters.find(std::string("dsinfer:spec_decode_") + name + "_total");
    return it == counters.end() ? 0.0 : it->second;
  };
  const double drafts = counter("num_drafts"), proposed = counter("num_draft_tokens"),
               accepted = counter("num_accepted_tokens");
  if (drafts <= 0 || proposed <= 0) return;
  std::fprintf(stderr,
               "concurrency %d: speculative decoding: %.0f of %.0f draft tokens accepted "
               "(%.3f), %.3f tokens per verified draft\n",
               concurrency, accepted, proposed, accepted / proposed, 1.0 + accepted / drafts);
}

int RunBenchServe(int argc, char** argv) {
  const char* usage =
      "dsinfer bench serve --url http://HOST:PORT [--api-key K] [--model NAME] [--num-prompts N] "
      "[--prompts FILE.jsonl] [--input-len LEN] [--output-len LEN] [--vocab N] "
      "[--concurrency 1,4,16 | --request-rate R] "
      "[--seed S] [--temperature T] [--endpoint completions|chat] [--slo ttft=MS,tpot=MS,e2e=MS] "
      "[--extra-body JSON] [--output-json FILE] [--csv FILE] [--plot-dir DIR] [--timeout S]\n"
      "  --extra-body: a JSON object of fields every request also carries, e.g. a "
      "structured-output "
      "constraint\n"
      "  LEN: N | uniform:LO:HI | normal:MEAN:STD (per request, seeded, clipped to >= 1)\n"
      "  --prompts: one {\"prompt\": ...} or {\"messages\": [...]} per line, optional "
      "\"max_tokens\"";
  Args args;
  if (!args.Parse(argc, argv,
                  {"url", "api-key", "model", "num-prompts", "prompts", "input-len", "output-len",
                   "vocab", "concurrency", "request-rate", "seed", "temperature", "endpoint", "slo",
                   "output-json", "csv", "plot-dir", "timeout", "extra-body"},
                  {}) ||
      !args.Has("url")) {
    std::fprintf(stderr, "%s\nusage: %s\n", args.error().c_str(), usage);
    return 2;
  }
  measure::LoadConfig cfg;
  auto url = measure::ParseUrl(*args.Get("url"));
  if (!url.ok()) {
    std::fprintf(stderr, "bench serve: %s\n", url.status().ToString().c_str());
    return 2;
  }
  cfg.url = *url;
  cfg.api_key = args.GetOr("api-key", "");
  cfg.workload.model = args.GetOr("model", "");
  long long n = 0;
  double d = 0;
  if (args.Has("num-prompts") && args.GetInt("num-prompts", &n))
    cfg.num_prompts = static_cast<int>(n);
  for (const auto& [flag, spec] : {std::pair{"input-len", &cfg.workload.input_len},
                                   std::pair{"output-len", &cfg.workload.output_len}}) {
    if (!args.Has(flag)) continue;
    auto parsed = measure::ParseLengthSpec(*args.Get(flag));
    if (!parsed.ok()) {
      std::fprintf(stderr, "bench serve: --%s: %s\n", flag, parsed.status().message().c_str());
      return 2;
    }
    *spec = *parsed;
  }
  if (args.Has("prompts")) {
    const std::string path = *args.Get("prompts");
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench serve: --prompts: cannot open %s\n", path.c_str());
      return 2;
    }
    std::stringstream text;
    text << in.rdbuf();
    auto prompts = measure::ParsePromptsJsonl(text.str(), path);
    if (!prompts.ok()) {
      std::fprintf(stderr, "bench serve: --prompts: %s\n", prompts.status().message().c_str());
      return 2;
    }
    cfg.workload.prompts = std::move(*prompts);
    cfg.workload.prompts_source = path;
  }
  if (args.Has("extra-body")) {
    cfg.workload.extra_body_json = *args.Get("extra-body");
    if (Status st = measure::CheckExtraBody(cfg.workload.extra_body_json); !st.ok()) {
      std::fprintf(stderr, "bench serve: --extra-body: %s\n", st.message().c_str());
      return 2;
    }
  }
  if (args.Has("vocab") && args.GetInt("vocab", &n)) cfg.workload.vocab_hint = static_cast<int>(n);
  if (args.Has("seed") && args.GetInt("seed", &n)) cfg.workload.seed = static_cast<uint64_t>(n);
  if (args.Has("request-rate") && args.GetDouble("request-rate", &d)) cfg.request_rate = d;
  if (args.Has("temperature") && args.GetDouble("temperature", &d)) cfg.workload.temperature = d;
  if (args.Has("timeout") && args.GetDouble("timeout", &d)) cfg.timeout_s = d;
  if (!args.error().empty()) {
    std::fprintf(stderr, "bench serve: %s\n", args.error().c_str());
    return 2;
  }
  if (cfg.num_prompts < 1 || cfg.workload.vocab_hint < 12 ||
      !(cfg.workload.temperature >= 0 && cfg.workload.temperature <= 2)) {
    std::fprintf(stderr,
                 "bench serve: --num-prompts must be >= 1, --vocab >= 12 and --temperature in "
                 "[0, 2]\n");
    return 2;
  }
  std::string endpoint = args.GetOr("endpoint", "completions");
  if (endpoint != "completions" && endpoint != "chat") {
    std::fprintf(stderr, "bench serve: --endpoint must be completions or chat\n");
    return 2;
  }
  if (!cfg.workload.prompts.empty()) {
    if (args.Has("endpoint") || args.Has("input-len")) {
      std::fprintf(stderr,
                   "bench serve: with --prompts each line picks its endpoint and length; drop "
                   "--endpoint/--input-len\n");
      return 2;
    }
    endpoint = "per-line";
  }
  cfg.workload.chat = endpoint == "chat";
  if (args.Has("slo") && !ParseSlo(*args.Get("slo"), &cfg)) {
    std::fprintf(stderr, "bench serve: bad --slo (ttft=MS,tpot=MS,e2e=MS)\n");
    return 2;
  }
  std::vector<int> levels;
  if (cfg.request_rate > 0) {
    levels = {0};
  } else if (!ParseIntList(args.GetOr("concurrency", "1"), &levels)) {
    std::fprintf(stderr, "bench serve: bad --concurrency\n");
    return 2;
  }
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  std::string levels_json, csv = measure::CsvHeader();
  std::vector<measure::LevelFigures> figures;
  int failed_total = 0;
  for (size_t level_index = 0; level_index < levels.size(); ++level_index) {
    const int c = levels[level_index];
    auto progress = [&](int done, int total) {
      if (tty) {
        const int width = 30, filled = width * done / total;
        std::fprintf(stderr, "\rconcurrency %d [%s%s] %d/%d", c, std::string(filled, '#').c_str(),
                     std::string(width - filled, '.').c_str(), done, total);
        if (done == total) std::fprintf(stderr, "\n");
      } else if (done == total || done % std::max(1, total / 4) == 0) {
        std::fprintf(stderr, "concurrency %d: %d/%d requests\n", c, done, total);
      }
    };
    measure::LevelResult level = measure::RunLevel(cfg, static_cast<int>(level_index), c, progress);
    for (const auto& r : level.records) {
      if (!r.ok && failed_total == 0)
        std::fprintf(stderr, "bench serve: first failure: %s %s\n", r.error.c_str(),
                     r.detail.c_str());
      failed_total += r.ok ? 0 : 1;
    }
    PrintSpeculation(c, level);
    if (!levels_json.empty()) levels_json += ",";
    levels_json += measure::LevelJson(cfg, level);
    csv += measure::LevelCsv(cfg, level);
    figures.push_back(measure::Figures(cfg, level));
  }
  std::printf("%s", csv.c_str());
  if (args.Has("csv")) std::ofstream(*args.Get("csv")) << csv;
  if (args.Has("output-json")) {
    const std::string config = measure::ConfigJson(cfg, *args.Get("url"), endpoint);
    std::ofstream(*args.Get("output-json"))
        << "{\"config\":" << config << ",\"results\":[" << levels_json << "]}\n";
  }
  if (args.Has("plot-dir")) {
    auto written = measure::WriteServePlots(*args.Get("plot-dir"), figures);
    if (!written.ok()) {
      std::fprintf(stderr, "bench serve: %s\n", written.status().ToString().c_str());
      return 2;
    }
    for (const std::string& path : *written)
      std::fprintf(stderr, "bench serve: wrote %s\n", path.c_str());
  }
  return failed_total == 0 ? 0 : 1;
}

}  // namespace dsinfer::cli
