// `dsinfer serve`: the OpenAI- and Anthropic-compatible HTTP server (docs/SERVER.md).
//
// Start-up order: listen first (so /health answers and /ready says 503 while loading), then load
// the weights and tokenizer, create the engine, attach it. Shutdown: SIGTERM/SIGINT arrive on a
// signalfd polled by the main thread (no work in a signal handler); the server stops accepting,
// in-flight requests get until --shutdown-timeout to finish, then the engine cancels the rest.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>

#include "args.h"
#include "commands.h"
#include "core/system_memory.h"
#include "core/thread_pool.h"
#include "device_flag.h"
#include "model/config.h"
#include "model/demo_model.h"
#include "model/draft_vocabulary.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "server/engine_port.h"
#include "server/http_server.h"
#include "server/kv_events.h"
#include "server/service.h"
#include "text/tokenizer.h"

namespace dsinfer::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "dsinfer serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY | --api-key-file "
    "FILE]\n"
    "              [--served-model-name NAME] [--tokenizer FILE] [--model-version v4|v4.1]\n"
    "              [--max-num-seqs N] [--max-num-batched-tokens N] [--kv-cache-memory "
    "BYTES|NGiB|NMiB|FRACTION]\n"
    "              [--max-queue N] [--max-model-len N] [--threads N] [--max-tokens-limit N]\n"
    "              [--numa off|distribute|isolate|numactl]\n"
    "              [--speculative-tokens 0..4 [--draft-min-confidence P]\n"
    "               [--speculative-token-map FILE]]\n"
    "              [--default-max-tokens N] [--max-connections N] [--max-body-bytes N]\n"
    "              [--shutdown-timeout SECONDS] [--weights auto|map|copy] "
    "[--device cpu|cuda|cuda:N]\n"
    "              [--no-default-thinking] [--kv-events-endpoint tcp://HOST:PORT]\n"
    "              [--kv-events-block-size N] [--kv-events-topic TOPIC]\n"
    "              [--scheduler-metrics none|waiting=NAME,running=NAME,kv_usage=NAME]\n"
    "              [--kv-cache-dir DIR] [--kv-cache-disk-gb GB] [--kv-cache-ram-gb GB]\n"
    "              [--kv-cache-write-back] [--role both|prefill|decode] "
    "[--kv-transfer-deadline SECONDS]\n"
    "              [--bootstrap-timeout SECONDS] [--kv-transfer-test-corrupt N]";

void Log(const char* fmt, const std::string& a = "", const std::string& b = "") {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", std::gmtime(&now));
  std::fprintf(stderr, "[%s] ", stamp);
  std::fprintf(stderr, fmt, a.c_str(), b.c_str());
  std::fprintf(stderr, "\n");
}

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "dsinfer serve: %s\n", error.c_str());
  std::fprintf(stderr, "usage: %s\n", kUsage);
  return 2;
}

// "17179869184", "16GiB", "512MiB", or a fraction of physical RAM such as "0.3".
bool ParseMemory(const std::string& text, int64_t* out) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(value > 0)) return false;
  std::string suffix(end);
  double scale = 1;
  if (suffix == "GiB" || suffix == "G" || suffix == "GB")
    scale = 1024.0 * 1024 * 1024;
  else if (suffix == "MiB" || suffix == "M" || suffix == "MB")
    scale = 1024.0 * 1024;
  else if (suffix == "KiB" || suffix == "K" || suffix == "KB")
    scale = 1024.0;
  else if (!suffix.empty())
    return false;
  if (suffix.empty() && value < 1.0) {
    const std::optional<int64_t> total = TotalMemoryBytes();
    if (!total) return false;
    *out = static_cast<int64_t>(value * static_cast<double>(*total));
    return true;
  }
  *out = static_cast<int64_t>(value * scale);
  return *out > 0;
}

// "none", or comma-separated waiting=NAME,running=NAME,kv_usage=NAME (each optional, an empty
// NAME leaves that gauge out); false on anything else.
bool ParseSchedulerMetrics(const std::string& text, server::SchedulerMetricNames* names) {
  if (text == "none") {
    *names = server::SchedulerMetricNames{"", "", ""};
    return true;
  }
  std::vector<std::pair<std::string, std::string>> items;
  if (!ParseKeyValues(text, &items)) return false;
  for (const auto& [key, value] : items) {
    if (key == "waiting")
      names->waiting = value;
    else if (key == "running")
      names->running = value;
    else if (key == "kv_usage")
      names->kv_usage = value;
    else
      return false;
  }
  return true;
}

bool ReadKeys(const std::string& path, std::vector<std::string>* keys) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    keys->push_back(line.substr(start));
  }
  return true;
}

}  // namespace

int RunServe(int argc, char** argv) {
  Args args;
  if (!args.Parse(argc, argv,
                  {"model",
                   "host",
                   "port",
                   "api-key",
                   "api-key-file",
                   "served-model-name",
                   "tokenizer",
                   "model-version",
                   "max-num-seqs",
                   "max-num-batched-tokens",
                   "kv-cache-memory",
                   "max-queue",
                   "max-model-len",
                   "threads",
                   "numa",
                   "max-tokens-limit",
                   "default-max-tokens",
                   "max-connections",
                   "max-body-bytes",
                   "shutdown-timeout",
                   "weights",
                   "device",
                   "kv-events-endpoint",
                   "kv-events-block-size",
                   "kv-events-topic",
                   "scheduler-metrics",
                   "kv-cache-dir",
                   "kv-cache-disk-gb",
                   "kv-cache-ram-gb",
                   "speculative-tokens",
                   "draft-min-confidence",
                   "speculative-token-map",
                   "role",
                   "kv-transfer-deadline",
                   "bootstrap-timeout",
                   "kv-transfer-test-corrupt"},
                  {"no-default-thinking", "kv-cache-write-back"}) ||
      !args.positional().empty())
    return Usage(args.error());
  long long port = 8000, max_num_seqs = 64, max_batched = 2048, max_queue = 1024, max_model_len = 0,
            threads = 0, speculative_tokens = 0;
  long long max_tokens_limit = 32768, default_max_tokens = 0, max_connections = 256;
  long long max_body = 8 * 1024 * 1024;
  double shutdown_timeout = 30;
  double draft_min_confidence = runtime::EngineOptions{}.draft_min_confidence;
  if (!args.GetInt("port", &port) || !args.GetInt("max-num-seqs", &max_num_seqs) ||
      !args.GetInt("max-num-batched-tokens", &max_batched) ||
      !args.GetInt("max-queue", &max_queue) || !args.GetInt("max-model-len", &max_model_len) ||
      !args.GetInt("threads", &threads) || !args.GetInt("max-tokens-limit", &max_tokens_limit) ||
      !args.GetInt("default-max-tokens", &default_max_tokens) ||
      !args.GetInt("max-connections", &max_connections) ||
      !args.GetInt("max-body-bytes", &max_body) ||
      !args.GetInt("speculative-tokens", &speculative_tokens) ||
      !args.GetDouble("shutdown-timeout", &shutdown_timeout) ||
      !args.GetDouble("draft-min-confidence", &draft_min_confidence))
    return Usage(args.error());
  if (port < 0 || port > 65535 || max_num_seqs < 1 || max_batched < 1 || max_queue < 1 ||
      max_model_len < 0 || threads < 0 || max_tokens_limit < 1 || default_max_tokens < 0 ||
      max_connections < 1 || max_body < 1024 || shutdown_timeout < 0 || speculative_tokens < 0 ||
      speculative_tokens > runtime::kMaxSpeculativeTokens ||
      !(draft_min_confidence >= 0 && draft_min_confidence <= 1))
    return Usage("a numeric flag is out of range");
  if (args.Has("speculative-token-map") && speculative_tokens == 0)
    return Usage("--speculative-token-map needs --speculative-tokens");

  runtime::EngineOptions engine_options;
  engine_options.max_num_seqs = static_cast<int>(max_num_seqs);
  engine_options.max_num_batched_tokens = static_cast<int>(max_batched);
  engine_options.max_queue = static_cast<int>(max_queue);
  engine_options.max_model_len = max_model_len;
  engine_options.speculative_tokens = static_cast<int>(speculative_tokens);
  engine_options.draft_min_confidence = draft_min_confidence;
  if (auto kv = args.Get("kv-cache-memory")) {
    if (!ParseMemory(*kv, &engine_options.kv_cache_bytes))
      return Usage("--kv-cache-memory must be bytes, NGiB, NMiB or a fraction of RAM like 0.3");
  }
  // The persistent KV tiers (runtime/kv_store.h): a RAM tier with --kv-cache-ram-gb alone, a
  // disk tier with --kv-cache-dir (10 GB unless --kv-cache-disk-gb says otherwise) and then a
  // 2 GB RAM tier by default, which is where requests' prefixes are prefetched to off the engine
  // thread.
  const std::string kv_dir = args.GetOr("kv-cache-dir", "");
  double kv_ram_gb = kv_dir.empty() ? 0 : 2, kv_disk_gb = 10;
  if (!args.GetDouble("kv-cache-ram-gb", &kv_ram_gb) ||
      !args.GetDouble("kv-cache-disk-gb", &kv_disk_gb))
    return Usage(args.error());
  if (!(kv_ram_gb >= 0) || !(kv_disk_gb > 0))
    return Usage("--kv-cache-ram-gb must be >= 0 and --kv-cache-disk-gb > 0");
  if (args.Has("kv-cache-write-back") && kv_dir.empty())
    return Usage("--kv-cache-write-back needs --kv-cache-dir");
  if (!kv_dir.empty() || kv_ram_gb > 0) {
    runtime::KvStoreOptions store;
    store.dir = kv_dir;
    store.disk_bytes = kv_dir.empty() ? 0 : static_cast<int64_t>(kv_disk_gb * 1e9);
    store.ram_bytes = static_cast<int64_t>(kv_ram_gb * 1e9);
    store.write_back = args.Has("kv-cache-write-back");
    engine_options.kv_store = store;
  }
  const auto residency = WeightResidencyFlag(args);
  if (!residency) return Usage(kWeightResidencyFlagError);
  const std::optional<int> device = ParseDevice(args.GetOr("device", "cpu"));
  if (!device) return Usage("--device must be cpu, cuda or cuda:N");
  const std::optional<CpuPlacement> placement =
      CpuPlacementOrPrint(args, *device, static_cast<int>(threads), "serve");
  if (!placement) return 2;

  // The checkpoint's family (config.json) sets the chat encoding and the default served name:
  // DeepSeek-V4.1 checkpoints render with the V4.1 encoding as 'deepseek-v4.1-flash'. An
  // explicit --model-version must agree with it.
  const std::string model_dir = args.GetOr("model", "demo-model");
  std::error_code ec;
  bool checkpoint_v41 = false;
  int64_t vocab_size = 0;  // the checkpoint's; 0: none yet (the demo model is written below)
  if (fs::exists(fs::path(model_dir) / "config.json", ec)) {
    auto config = model::ModelConfig::FromFile((fs::path(model_dir) / "config.json").string());
    if (!config.ok()) {
      std::fprintf(stderr, "dsinfer serve: %s/config.json: %s\n", model_dir.c_str(),
                   config.status().ToString().c_str());
      return 1;
    }
    checkpoint_v41 = config->V41();
    vocab_size = config->vocab_size;
  }
  const std::string version = args.GetOr("model-version", checkpoint_v41 ? "v4.1" : "v4");
  if (version != "v4" && version != "v4.1") return Usage("--model-version must be v4 or v4.1");
  if ((version == "v4.1") != checkpoint_v41 && fs::exists(fs::path(model_dir) / "config.json", ec))
    return Usage("--model-version " + version + " does not match the checkpoint, a DeepSeek-" +
                 (checkpoint_v41 ? "V4.1" : "V4") + " model");
  // The draft vocabulary is read before any weight is: a bad map stops startup at once, not
  // after minutes of loading.
  if (auto map = args.Get("speculative-token-map")) {
    if (vocab_size == 0) {
      auto demo = model::PresetConfig("demo");
      if (!demo.ok()) return 1;
      vocab_size = demo->vocab_size;
    }
    auto ids = model::ReadDraftVocabulary(*map, vocab_size);
    if (!ids.ok()) {
      std::fprintf(stderr, "dsinfer serve: --speculative-token-map: %s\n",
                   ids.status().ToString().c_str());
      return 1;
    }
    Log("drafts propose from %s of the vocabulary's ids (%s)", std::to_string(ids->size()), *map);
    engine_options.draft_vocabulary = std::move(ids).value();
  }

  server::ServiceOptions service_options;
  // vLLM's --served-model-name takes several names; here they are comma-separated. The first is
  // the name responses report; all of them are accepted.
  const std::vector<std::string> served_names = SplitCommas(args.GetOr(
      "served-model-name", version == "v4.1" ? "deepseek-v4.1-flash" : "deepseek-v4-flash"));
  if (served_names.empty()) return Usage("--served-model-name must name the model");
  for (const auto& name : served_names)
    if (name.empty()) return Usage("--served-model-name: empty name in the list");
  service_options.served_model_name = served_names.front();
  service_options.served_model_aliases.assign(served_names.begin() + 1, served_names.end());
  if (auto metrics = args.Get("scheduler-metrics")) {
    if (!ParseSchedulerMetrics(*metrics, &service_options.scheduler_metrics))
      return Usage("--scheduler-metrics takes none or waiting=NAME,running=NAME,kv_usage=NAME");
  }

  // Signals go to a signalfd; block them before any thread starts so every thread inherits it.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int signal_fd = signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd < 0) return Usage(std::string("signalfd: ") + std::strerror(errno));

  // KV events for KV-aware routers (server/kv_events.h): bound now (after the signal mask,
  // so its threads inherit it), fed by the engine's prefix
  // cache once it runs.
  std::shared_ptr<server::KvEventPublisher> kv_events;
  if (auto endpoint = args.Get("kv-events-endpoint")) {
    long long block_size = 16;
    if (!args.GetInt("kv-events-block-size", &block_size)) return Usage(args.error());
    if (block_size < 1 || block_size > 4096)
      return Usage("--kv-events-block-size must be in [1, 4096]");
    server::KvEventOptions kv_options;
    kv_options.bind_endpoint = *endpoint;
    kv_options.topic = args.GetOr("kv-events-topic", "");
    kv_options.block_size = static_cast<int>(block_size);
    auto started = server::KvEventPublisher::Start(kv_options);
    if (!started.ok()) return Usage(started.status().message());
    kv_events = std::move(started).value();
    service_options.kv_events.endpoint = kv_events->endpoint();
    service_options.kv_events.topic = kv_options.topic;
    service_options.kv_events.block_size = kv_options.block_size;
    engine_options.prefix_cache_observer = kv_events;
  } else if (args.Has("kv-events-block-size") || args.Has("kv-events-topic")) {
    return Usage("--kv-events-block-size and --kv-events-topic need --kv-events-endpoint");
  }
  // Prefill/decode disaggregation (server/disaggregation.cc): the UCX transfer agent of a
  // prefill or decode worker, started after the signal mask so that its thread inherits it.
  const std::string role = args.GetOr("role", "both");
  double transfer_deadline = 60;
  if (!args.GetDouble("kv-transfer-deadline", &transfer_deadline)) return Usage(args.error());
  if (role == "prefill")
    service_options.role = server::DisaggregationRole::kPrefill;
  else if (role == "decode")
    service_options.role = server::DisaggregationRole::kDecode;
  else if (role != "both")
    return Usage("--role must be both, prefill or decode");
  if (!(transfer_deadline > 0 && transfer_deadline <= 3600))
    return Usage("--kv-transfer-deadline must be in (0, 3600] seconds");
  if (role == "both" && args.Has("kv-transfer-deadline"))
    return Usage("--kv-transfer-deadline needs --role prefill or decode");
  // sglang-router's hand-over: how long a decode worker waits for the prefill worker to publish
  // the request's bootstrap_room before answering 503.
  double bootstrap_timeout = 60;
  if (!args.GetDouble("bootstrap-timeout", &bootstrap_timeout)) return Usage(args.error());
  if (!(bootstrap_timeout > 0 && bootstrap_timeout <= 3600))
    return Usage("--bootstrap-timeout must be in (0, 3600] seconds");
  if (role != "decode" && args.Has("bootstrap-timeout"))
    return Usage("--bootstrap-timeout needs --role decode");
  service_options.bootstrap_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(bootstrap_timeout * 1000));
  // Fault injection for the P/D tests (tests/router/pd_test.py): a decode worker flips one byte
  // of each of its first N pulled states before the checksum, as a damaged transfer would.
  long long corrupt_pulls = 0;
  if (!args.GetInt("kv-transfer-test-corrupt", &corrupt_pulls)) return Usage(args.error());
  if (corrupt_pulls < 0) return Usage("--kv-transfer-test-corrupt must be >= 0");
  if (corrupt_pulls > 0 && role != "decode")
    return Usage("--kv-transfer-test-corrupt needs --role decode");
  if (role != "both") {
    transfer::TransferOptions transfer_options;
    transfer_options.engine_id = "dsinfer-" + role + "-" + std::to_string(getpid());
    transfer_options.hold_deadline =
        std::chrono::milliseconds(static_cast<int64_t>(transfer_deadline * 1000));
    if (corrupt_pulls > 0) {
      auto left = std::make_shared<std::atomic<long long>>(corrupt_pulls);
      transfer_options.after_get_for_test = [left](std::span<uint8_t> bytes) {
        if (!bytes.empty() && left->fetch_sub(1) > 0) bytes[bytes.size() / 2] ^= 0x40;
      };
    }
    auto agent = transfer::KvTransferAgent::Create(transfer_options);
    if (!agent.ok()) {
      std::fprintf(stderr, "dsinfer serve: %s\n", agent.status().ToString().c_str());
      return 1;
    }
    service_options.engine_id = transfer_options.engine_id;
    service_options.kv_transfer = std::move(agent).value();
    // A published room lives as long as the state it describes is held.
    if (role == "prefill")
      service_options.bootstrap_rooms =
          std::make_shared<transfer::BootstrapRooms>(transfer_options.hold_deadline);
  }
  service_options.max_tokens_limit = static_cast<int>(max_tokens_limit);
  service_options.default_max_tokens = static_cast<int>(default_max_tokens);
  service_options.default_thinking = !args.Has("no-default-thinking");
  service_options.access_log = [](const std::string& line) { Log("%s", line); };
  if (args.Has("api-key") && args.Has("api-key-file"))
    return Usage("give --api-key or --api-key-file, not both");
  if (auto key = args.Get("api-key")) service_options.api_keys.push_back(*key);
  if (auto file = args.Get("api-key-file")) {
    if (!ReadKeys(*file, &service_options.api_keys) || service_options.api_keys.empty())
      return Usage("--api-key-file: cannot read a key from " + *file);
  }
  for (const auto& key : service_options.api_keys)
    if (key.empty()) return Usage("--api-key must not be empty");
  server::Service service(service_options);
  server::HttpServerOptions http_options;
  http_options.host = args.GetOr("host", "127.0.0.1");
  http_options.port = static_cast<int>(port);
  http_options.max_connections = static_cast<int>(max_connections);
  http_options.max_body_bytes = static_cast<size_t>(max_body);
  auto http = server::HttpServer::Listen(
      http_options, [&service](const server::HttpRequest& request, server::ResponseSink& sink) {
        service.Handle(request, sink);
      });
  if (!http.ok()) {
    std::fprintf(stderr, "dsinfer serve: %s\n", http.status().ToString().c_str());
    return 1;
  }
  service.SetHttpServer(http->get());
  (*http)->Start();
  Log("listening on http://%s (auth %s)", http_options.host + ":" + std::to_string((*http)->port()),
      service_options.api_keys.empty() ? "off" : "on");

  if (!args.Has("model") && !fs::exists(fs::path(model_dir) / "config.json", ec)) {
    Log("no --model given and ./%s is missing: writing the demo model (preset demo)%s", model_dir);
    auto config = model::PresetConfig("demo");
    if (!config.ok()) return 1;
    ThreadPool pool(static_cast<int>(threads));
    Status st = model::WriteDemoModel(*config, model_dir, model::DemoModelOptions{}, pool);
    if (!st.ok()) {
      std::fprintf(stderr, "dsinfer serve: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  auto t0 = Clock::now();
  Log("loading weights from %s%s", model_dir);
  // A host copy of the weights must leave room for the KV budget (on the CPU: in RAM).
  const int64_t kv_reserve = *device >= 0                        ? 0
                             : engine_options.kv_cache_bytes > 0 ? engine_options.kv_cache_bytes
                                                                 : runtime::DefaultKvCacheBytes();
  auto weights = LoadWeightsOrPrint(model_dir, *residency, "serve",
                                    static_cast<uint64_t>(kv_reserve), placement->weights);
  if (weights == nullptr) return 1;
  Log("weights loaded: %s%s", weights->config().Summary());
  std::string tokenizer_path = FindTokenizer(model_dir, args.GetOr("tokenizer", ""));
  auto tokenizer = text::Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "dsinfer serve: tokenizer %s: %s\n", tokenizer_path.c_str(),
                 tokenizer.status().ToString().c_str());
    return 1;
  }
  Log("tokenizer: %s (%s ids)", tokenizer_path, std::to_string(tokenizer->vocab_size()));
  auto runner = MakeRunner(*device, *weights, engine_options.numerics, *placement);
  if (!runner.ok()) {
    std::fprintf(stderr, "dsinfer serve: %s\n", runner.status().ToString().c_str());
    return 1;
  }
  auto engine = runtime::Engine::Create(*weights, engine_options, std::move(runner).value());
  if (!engine.ok()) {
    std::fprintf(stderr, "dsinfer serve: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  Log("engine on %s, KV budget %s MiB", (*engine)->device(),
      std::to_string((*engine)->kv_cache_bytes() >> 20));
  server::RuntimeEnginePort port_adapter(**engine);
  server::ModelInfo info;
  info.version = version == "v4.1" ? text::ModelVersion::kV41 : text::ModelVersion::kV4;
  info.max_model_len = max_model_len;
  info.created_unix = static_cast<int64_t>(std::time(nullptr));
  info.model_path = fs::absolute(model_dir, ec).string();
  info.tokenizer_path = tokenizer_path;
  info.device = (*engine)->device();
  info.kv_cache_bytes = (*engine)->kv_cache_bytes();
  info.max_num_seqs = engine_options.max_num_seqs;
  info.max_num_batched_tokens = engine_options.max_num_batched_tokens;
  info.max_queue = engine_options.max_queue;
  info.vocab_size = static_cast<int32_t>(weights->config().vocab_size);
  info.eos_token_id = weights->config().eos_token_id;
  service.Attach(&port_adapter, &*tokenizer, info);

  bool announced_ready = false;
  for (;;) {
    pollfd pfd{signal_fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, announced_ready ? -1 : 50);
    if (r > 0) break;
    if (!announced_ready && (*engine)->ready()) {
      announced_ready = true;
      char took[32];
      std::snprintf(took, sizeof(took), "%.1f",
                    std::chrono::duration<double>(Clock::now() - t0).count());
      Log("ready: model '%s' loaded and warmed up in %s s", service_options.served_model_name,
          took);
    }
  }
  signalfd_siginfo info_buf;
  if (::read(signal_fd, &info_buf, sizeof(info_buf)) < 0) info_buf.ssi_signo = SIGTERM;
  Log("%s received: draining (up to %s s)", info_buf.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM",
      std::to_string(static_cast<int>(shutdown_timeout)));
  // Drain with the listener open: /health and /ready answer 503 and new requests get a 503
  // that routers retry on another replica, instead of connection errors, while the requests
  // in flight finish. Then the listener closes.
  service.BeginDrain();
  auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout * 1000));
  (*engine)->Shutdown(deadline);
  (*http)->StopAccepting();
  // Handlers see their final events right after the engine finishes or cancels them.
  (*http)->WaitForConnections(deadline + std::chrono::seconds(5));
  Log("stopped%s%s");
  ::close(signal_fd);
  std::fflush(stderr);
  // Connection threads that are still open (a client that never reads) must not block exit.
  std::_Exit(0);
}

}  // namespace dsinfer::cli
