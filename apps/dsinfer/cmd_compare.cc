// dsinfer compare: numerical comparison of two sides that should compute the same thing.
//   compare logits     two logits files (`dsinfer logits` output), or the engine against a
//                      committed golden (tests/fixtures/golden/*/golden.safetensors)
//   compare endpoints  two OpenAI-compatible servers, greedy generations with top-k logprobs
// Exit codes: 0 pass, 1 fail (a threshold exceeded or a greedy divergence), 2 usage or I/O error.
// The comparison logic lives in src/measure/compare.cc and src/measure/endpoint_compare.cc.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.h"
#include "backend/cpu/cpu_model.h"
#include "commands.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "measure/compare.h"
#include "measure/endpoint_compare.h"
#include "model/weights.h"

namespace dsinfer::cli {
namespace {

using Json = nlohmann::json;

constexpr int kPass = 0, kFail = 1, kError = 2;

// Default NMSE budgets (docs/TESTING.md "dsinfer compare"). fp32-reference against the
// transformers goldens: the tests' budget (tests/tolerance.h kGoldenLogitsNmse, ~5x the measured
// reference-vs-reference floor of 3.7e-12). Anything else: 1e-4, 10x the measured distance between
// the official bf16/FP8 numerics and fp32 (~1e-5) and 10x below the smallest real bug seen (1e-3).
constexpr double kGoldenFp32Nmse = 2e-11;
constexpr double kDefaultNmse = 1e-4;

int Error(const std::string& message) {
  std::fprintf(stderr, "dsinfer compare: %s\n", message.c_str());
  return kError;
}
int Usage(const char* usage, const std::string& error = "") {
  if (!error.empty()) std::fprintf(stderr, "dsinfer compare: %s\n", error.c_str());
  std::fprintf(stderr, "usage: %s\n", usage);
  return kError;
}

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  return false;
}

// A float32 tensor's values; `shape` receives its shape.
Result<std::vector<float>> ReadF32(const io::SafetensorsFile& file, const std::string& name,
                                   std::vector<int64_t>* shape) {
  const io::TensorInfo* info = file.Find(name);
  if (info == nullptr) return NotFound(file.path() + ": no tensor '" + name + "'");
  if (info->dtype != DType::kF32) return InvalidArgument(file.path() + ": " + name + " is not F32");
  auto ref = file.Ref(*info);
  std::vector<float> out(ref.bytes.size() / sizeof(float));  // [elements]
  std::memcpy(out.data(), ref.bytes.data(), out.size() * sizeof(float));
  *shape = info->shape;
  return out;
}

Result<std::vector<int32_t>> ReadI32(const io::SafetensorsFile& file, const std::string& name) {
  const io::TensorInfo* info = file.Find(name);
  if (info == nullptr) return NotFound(file.path() + ": no tensor '" + name + "'");
  if (info->dtype != DType::kI32) return InvalidArgument(file.path() + ": " + name + " is not I32");
  auto ref = file.Ref(*info);
  std::vector<int32_t> out(ref.bytes.size() / sizeof(int32_t));  // [elements]
  std::memcpy(out.data(), ref.bytes.data(), out.size() * sizeof(int32_t));
  return out;
}

struct LogitsThresholds {
  double max_nmse = kDefaultNmse;
  double max_kl = -1;  // < 0: reported, not checked
  bool require_argmax = false;
};

// One compared block of rows; `row_names[i]` says what row i is (e.g. "prompt 3 position 17").
struct LogitsBlock {
  std::string name;
  std::vector<float> a, b;  // [rows, vocab]
  std::vector<std::string> row_names;
};

// Verdict of one comparison; "" when it passes.
std::string LogitsFailure(const measure::LogitsComparison& r, const LogitsThresholds& th,
                          const std::vector<std::string>& row_names) {
  char buf[256];
  if (!std::isfinite(r.nmse) || r.nmse > th.max_nmse) {
    std::snprintf(buf, sizeof(buf), "NMSE %.4g > %.4g", r.nmse, th.max_nmse);
    return buf;
  }
  if (th.max_kl >= 0 && (!std::isfinite(r.max_kl) || r.max_kl > th.max_kl)) {
    std::snprintf(buf, sizeof(buf), "max KL %.4g > %.4g at ", r.max_kl, th.max_kl);
    return buf + row_names[static_cast<size_t>(r.max_kl_row)];
  }
  if (th.require_argmax && r.argmax_agree != r.rows)
    return "argmax differs at " + row_names[static_cast<size_t>(r.first_argmax_mismatch)];
  return "";
}

Json LogitsJson(const measure::LogitsComparison& r, const std::vector<std::string>& row_names,
                const std::string& failure) {
  auto row = [&](int64_t i) { return i < 0 ? Json(nullptr) : Json(row_names[size_t(i)]); };
  return Json{{"rows", r.rows},
              {"nmse", std::isfinite(r.nmse) ? Json(r.nmse) : Json("non-finite")},
              {"max_abs", r.max_abs},
              {"argmax_agree", r.argmax_agree},
              {"first_argmax_mismatch", row(r.first_argmax_mismatch)},
              {"max_kl", r.max_kl},
              {"max_kl_row", row(r.max_kl_row)},
              {"verdict", failure.empty() ? "pass" : "fail"},
              {"reason", failure}};
}

// Compares each block and all of them together; prints the table, writes the JSON.
int ReportLogits(const std::vector<LogitsBlock>& blocks, int64_t vocab, const LogitsThresholds& th,
                 const std::string& json_path, Json header) {
  std::printf("%-10s %6s %12s %11s %9s %11s  %s\n", "block", "rows", "NMSE", "max |d|", "argmax",
              "max KL", "max KL at");
  LogitsBlock all{"all", {}, {}, {}};
  Json per_block = Json::array();
  for (const auto& block : blocks) {
    const auto r = measure::CompareLogits(block.a, block.b, vocab);
    std::printf("%-10s %6lld %12.4g %11.4g %4lld/%-4lld %11.4g  %s\n", block.name.c_str(),
                static_cast<long long>(r.rows), r.nmse, r.max_abs,
                static_cast<long long>(r.argmax_agree), static_cast<long long>(r.rows), r.max_kl,
                r.max_kl_row >= 0 ? block.row_names[size_t(r.max_kl_row)].c_str() : "-");
    Json item = LogitsJson(r, block.row_names, LogitsFailure(r, th, block.row_names));
    item["name"] = block.name;
    per_block.push_back(item);
    if (blocks.size() > 1) {
      all.a.insert(all.a.end(), block.a.begin(), block.a.end());
      all.b.insert(all.b.end(), block.b.begin(), block.b.end());
      all.row_names.insert(all.row_names.end(), block.row_names.begin(), block.row_names.end());
    }
  }
  const LogitsBlock& total = blocks.size() > 1 ? all : blocks[0];
  const auto r = measure::CompareLogits(total.a, total.b, vocab);
  // A block can fail on KL or argmax while the pooled figures pass: any block's failure counts.
  std::string failure = LogitsFailure(r, th, total.row_names);
  for (const auto& item : per_block)
    if (failure.empty() && item["verdict"] == "fail")
      failure = item["name"].get<std::string>() + ": " + item["reason"].get<std::string>();
  std::printf(
      "overall: %lld rows, NMSE %.4g, max |d| %.4g, argmax agree %lld/%lld%s, max KL %.4g at %s\n",
      static_cast<long long>(r.rows), r.nmse, r.max_abs, static_cast<long long>(r.argmax_agree),
      static_cast<long long>(r.rows),
      r.first_argmax_mismatch >= 0
          ? (" (first mismatch " + total.row_names[size_t(r.first_argmax_mismatch)] + ")").c_str()
          : "",
      r.max_kl, r.max_kl_row >= 0 ? total.row_names[size_t(r.max_kl_row)].c_str() : "-");
  std::string kl_text = th.max_kl >= 0 ? std::to_string(th.max_kl) : "not checked";
  std::printf("thresholds: NMSE <= %.4g, max KL %s, argmax %s\n", th.max_nmse, kl_text.c_str(),
              th.require_argmax ? "must agree on every row" : "reported only");
  std::printf("verdict: %s%s\n", failure.empty() ? "PASS" : "FAIL: ", failure.c_str());
  if (!json_path.empty()) {
    header["thresholds"] = {{"max_nmse", th.max_nmse},
                            {"max_kl", th.max_kl >= 0 ? Json(th.max_kl) : Json(nullptr)},
                            {"require_argmax", th.require_argmax}};
    header["blocks"] = per_block;
    header["overall"] = LogitsJson(r, total.row_names, failure);
    header["verdict"] = failure.empty() ? "pass" : "fail";
    header["reason"] = failure;
    Status st = io::WriteTextFile(json_path, header.dump(2) + "\n");
    if (!st.ok()) return Error(st.ToString());
  }
  return failure.empty() ? kPass : kFail;
}

Result<backend::Numerics> ParseNumerics(const std::string& name) {
  if (name == "official") return backend::Numerics::Official();
  if (name == "fp32-reference" || name == "hf") return backend::Numerics::Fp32Reference();
  return InvalidArgument("--numerics must be 'official' or 'fp32-reference', got '" + name + "'");
}

// Two files, tensor `name` [rows, vocab] in each; B is the reference.
int CompareLogitFiles(const Args& args, const LogitsThresholds& th, const char* usage) {
  const std::string tensor = args.GetOr("tensor", "logits");
  auto fa = io::SafetensorsFile::Open(*args.Get("a"));
  if (!fa.ok()) return Error(fa.status().ToString());
  auto fb = io::SafetensorsFile::Open(*args.Get("b"));
  if (!fb.ok()) return Error(fb.status().ToString());
  std::vector<int64_t> shape_a, shape_b;
  LogitsBlock block{tensor, {}, {}, {}};
  auto a = ReadF32(**fa, tensor, &shape_a);
  if (!a.ok()) return Error(a.status().ToString());
  auto b = ReadF32(**fb, tensor, &shape_b);
  if (!b.ok()) return Error(b.status().ToString());
  if (shape_a.size() != 2 || shape_a != shape_b || shape_a[1] <= 0)
    return Usage(usage, "the two '" + tensor + "' tensors must have the same [rows, vocab] shape");
  block.a = std::move(a).value();
  block.b = std::move(b).value();
  for (int64_t i = 0; i < shape_a[0]; ++i) block.row_names.push_back("row " + std::to_string(i));
  if (block.row_names.empty()) return Usage(usage, "the tensors have no rows");
  Json header = {{"mode", "files"},
                 {"a", *args.Get("a")},
                 {"b", *args.Get("b")},
                 {"tensor", tensor},
                 {"vocab", shape_a[1]}};
  return ReportLogits({block}, shape_a[1], th, args.GetOr("output-json", ""), header);
}

// The engine on every golden prompt p<k> (p<k>.ids, p<k>.positions, p<k>.logits [positions,
// vocab]); B is the golden.
int CompareAgainstGolden(const Args& args, const backend::Numerics& numerics,
                         const LogitsThresholds& th) {
  auto golden = io::SafetensorsFile::Open(*args.Get("golden"));
  if (!golden.ok()) return Error(golden.status().ToString());
  const auto residency = WeightResidencyFlag(args);
  if (!residency) return Error(kWeightResidencyFlagError);
  auto weights = model::ModelWeights::Load(*args.Get("model"), *residency);
  if (!weights.ok()) return Error(weights.status().ToString());
  const int64_t vocab = (*weights)->config().vocab_size;
  long long threads = 0;
  if (!args.GetInt("threads", &threads)) return Error(args.error());
  ThreadPool pool(static_cast<int>(threads));
  auto cpu = backend::cpu::CpuModel::Create(**weights, numerics, pool);
  if (!cpu.ok()) return Error(cpu.status().ToString());
  std::vector<LogitsBlock> blocks;
  for (const auto& info : (*golden)->tensors()) {
    const std::string& name = info.name;
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".ids") != 0) continue;
    const std::string prefix = name.substr(0, name.size() - 3);  // "p3."
    auto ids = ReadI32(**golden, name);
    auto positions = ReadI32(**golden, prefix + "positions");
    std::vector<int64_t> shape;
    auto want = ReadF32(**golden, prefix + "logits", &shape);  // [positions, vocab]
    if (!ids.ok() || !positions.ok() || !want.ok())
      return Error(!ids.ok()         ? ids.status().ToString()
                   : !positions.ok() ? positions.status().ToString()
                                     : want.status().ToString());
    if (shape.size() != 2 || shape[1] != vocab ||
        shape[0] != static_cast<int64_t>(positions->size()) || ids->empty())
      return Error(prefix + "logits: shape does not match [positions, " + std::to_string(vocab) +
                   "] (is --model the golden's checkpoint? see its manifest.json)");
    for (int32_t id : *ids)
      if (id < 0 || id >= vocab) return Error(name + ": id " + std::to_string(id) + " >= vocab");
    for (int32_t p : *positions)
      if (p < 0 || p >= static_cast<int32_t>(ids->size()))
        return Error(prefix + "positions: " + std::to_string(p) + " outside the prompt");
    auto state = (*cpu)->NewSequence();
    backend::cpu::ForwardOutput out;  // logits [ids, vocab]
    Status st = (*cpu)->Forward(*state, *ids, {.all_logits = true}, &out);
    if (!st.ok()) return Error(st.ToString());
    LogitsBlock block{prefix.substr(0, prefix.size() - 1), {}, std::move(want).value(), {}};
    for (int32_t p : *positions) {
      const float* row = out.logits.data() + static_cast<int64_t>(p) * vocab;  // [vocab]
      block.a.insert(block.a.end(), row, row + vocab);
      block.row_names.push_back(block.name + " position " + std::to_string(p));
    }
    blocks.push_back(std::move(block));
  }
  if (blocks.empty()) return Error(*args.Get("golden") + ": no p<k>.ids tensors (not a golden)");
  Json header = {{"mode", "golden"},
                 {"model", *args.Get("model")},
                 {"golden", *args.Get("golden")},
                 {"numerics", numerics.Name()},
                 {"vocab", vocab}};
  return ReportLogits(blocks, vocab, th, args.GetOr("output-json", ""), header);
}

int RunCompareLogits(int argc, char** argv) {
  const char* usage =
      "dsinfer compare logits (--a FILE --b FILE [--tensor logits] | --model DIR --golden FILE "
      "[--numerics fp32-reference|official] [--threads N] [--weights auto|map|copy]) "
      "[--max-nmse X] [--max-kl X] "
      "[--require-argmax] [--output-json FILE]";
  if (WantsHelp(argc, argv)) {
    std::printf("usage: %s\n", usage);
    return kPass;
  }
  Args args;
  if (!args.Parse(argc, argv,
                  {"a", "b", "tensor", "model", "golden", "numerics", "threads", "max-nmse",
                   "max-kl", "output-json", "weights"},
                  {"require-argmax"}))
    return Usage(usage, args.error());
  const bool files = args.Has("a") || args.Has("b");
  const bool golden = args.Has("model") || args.Has("golden");
  if (files == golden || (files && !(args.Has("a") && args.Has("b"))) ||
      (golden && !(args.Has("model") && args.Has("golden"))))
    return Usage(usage, "give either --a and --b, or --model and --golden");
  auto numerics = ParseNumerics(args.GetOr("numerics", "fp32-reference"));
  if (!numerics.ok()) return Usage(usage, numerics.status().message());
  LogitsThresholds th;
  // fp32-reference against the transformers goldens is held to the tests' budget.
  if (golden && args.GetOr("numerics", "fp32-reference") != "official")
    th.max_nmse = kGoldenFp32Nmse;
  if (!args.GetDouble("max-nmse", &th.max_nmse) || !args.GetDouble("max-kl", &th.max_kl))
    return Usage(usage, args.error());
  if (th.max_nmse < 0 || (args.Has("max-kl") && th.max_kl < 0))
    return Usage(usage, "thresholds must be >= 0");
  th.require_argmax = args.Has("require-argmax");
  return files ? CompareLogitFiles(args, th, usage) : CompareAgainstGolden(args, *numerics, th);
}

int RunCompareEndpoints(int argc, char** argv) {
  const char* usage =
      "dsinfer compare endpoints --a URL --b URL [--api-key-a K] [--api-key-b K] [--model NAME | "
      "--model-a NAME --model-b NAME] [--prompts FILE.jsonl | --num-prompts N --input-len L "
      "--seed S [--vocab N]] [--max-tokens N] [--top-logprobs K] [--endpoint completions|chat] "
      "[--ignore-eos] [--max-abs-delta X] [--max-kl X] [--tie-margin X] [--timeout S] "
      "[--output-json FILE]";
  if (WantsHelp(argc, argv)) {
    std::printf(
        "usage: %s\nURL: http://HOST:PORT[/PREFIX], the server root (requests go to "
        "PREFIX/v1/completions or PREFIX/v1/chat/completions)\n",
        usage);
    return kPass;
  }
  Args args;
  if (!args.Parse(argc, argv, {"a",           "b",
                               "api-key-a",   "api-key-b",
                               "model",       "model-a",
                               "model-b",     "prompts",
                               "num-prompts", "input-len",
                               "seed",        "vocab",
                               "max-tokens",  "top-logprobs",
                               "endpoint",    "max-abs-delta",
                               "max-kl",      "tie-margin",
                               "timeout",     "output-json"},
                  {"ignore-eos"}) ||
      !args.Has("a") || !args.Has("b"))
    return Usage(usage, args.error().empty() ? "--a and --b are required" : args.error());
  measure::EndpointSide a, b;
  auto url_a = measure::ParseUrl(*args.Get("a"));
  if (!url_a.ok()) return Usage(usage, "--a: " + url_a.status().message());
  auto url_b = measure::ParseUrl(*args.Get("b"));
  if (!url_b.ok()) return Usage(usage, "--b: " + url_b.status().message());
  a.url = *url_a;
  b.url = *url_b;
  a.api_key = args.GetOr("api-key-a", "");
  b.api_key = args.GetOr("api-key-b", "");
  a.model = args.GetOr("model-a", args.GetOr("model", ""));
  b.model = args.GetOr("model-b", args.GetOr("model", ""));

  measure::GreedyRequestOptions options;
  const std::string endpoint = args.GetOr("endpoint", "completions");
  if (endpoint != "completions" && endpoint != "chat")
    return Usage(usage, "--endpoint must be 'completions' or 'chat'");
  options.kind =
      endpoint == "chat" ? measure::EndpointKind::kChat : measure::EndpointKind::kCompletions;
  long long max_tokens = 16, top_logprobs = 5, num_prompts = 8, input_len = 32, seed = 0,
            vocab = 1000;
  measure::CompareThresholds th;
  if (!args.GetInt("max-tokens", &max_tokens) || !args.GetInt("top-logprobs", &top_logprobs) ||
      !args.GetInt("num-prompts", &num_prompts) || !args.GetInt("input-len", &input_len) ||
      !args.GetInt("seed", &seed) || !args.GetInt("vocab", &vocab) ||
      !args.GetDouble("max-abs-delta", &th.max_abs_logprob_delta) ||
      !args.GetDouble("max-kl", &th.max_kl) || !args.GetDouble("tie-margin", &th.tie_margin) ||
      !args.GetDouble("timeout", &options.timeout_s))
    return Usage(usage, args.error());
  if (max_tokens < 1 || top_logprobs < 1 || top_logprobs > 20 || num_prompts < 1 || input_len < 1 ||
      vocab < 12 || options.timeout_s <= 0)
    return Usage(usage,
                 "need --max-tokens >= 1, 1 <= --top-logprobs <= 20, --num-prompts >= 1, "
                 "--input-len >= 1, --vocab >= 12, --timeout > 0");
  if (th.max_abs_logprob_delta < 0 || th.max_kl < 0 || th.tie_margin < 0)
    return Usage(usage, "thresholds must be >= 0");
  options.max_tokens = static_cast<int>(max_tokens);
  options.top_logprobs = static_cast<int>(top_logprobs);
  options.ignore_eos = args.Has("ignore-eos");

  std::vector<measure::ComparePrompt> prompts;
  if (auto file = args.Get("prompts")) {
    auto loaded = measure::LoadPromptsJsonl(*file, options.kind);
    if (!loaded.ok()) return Error(loaded.status().ToString());
    prompts = std::move(loaded).value();
  } else {
    prompts = measure::SyntheticPrompts(static_cast<int>(num_prompts), static_cast<int>(input_len),
                                        static_cast<uint64_t>(seed), options.kind,
                                        static_cast<int>(vocab));
  }
  // Progress on a terminal only: a log file gets the table, not carriage returns.
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto result = measure::CompareEndpoints(a, b, prompts, options, th, [tty](int done, int total) {
    if (!tty) return;
    std::fprintf(stderr, "\rcompared %d/%d prompts", done, total);
    if (done == total) std::fprintf(stderr, "\n");
  });
  std::fputs(measure::EndpointComparisonText(th, result).c_str(), stdout);
  if (auto path = args.Get("output-json")) {
    Status st =
        io::WriteTextFile(*path, measure::EndpointComparisonJson(a, b, options, th, result));
    if (!st.ok()) return Error(st.ToString());
  }
  if (result.errors > 0) return kError;
  return result.pass() ? kPass : kFail;
}

}  // namespace

int RunCompare(int argc, char** argv) {
  const char* usage = "dsinfer compare logits|endpoints [options] (--help for each)";
  if (argc < 2) return Usage(usage);
  const std::string what = argv[1];
  if (what == "--help" || what == "-h") {
    std::printf("usage: %s\n", usage);
    return kPass;
  }
  if (what == "logits") return RunCompareLogits(argc - 1, argv + 1);
  if (what == "endpoints") return RunCompareEndpoints(argc - 1, argv + 1);
  return Usage(usage, "unknown compare target '" + what + "'");
}

}  // namespace dsinfer::cli
