// Model subcommands: create-demo-model, inspect, logits, generate (token-id prompts).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "args.h"
#include "backend/cpu/cpu_model.h"
#include "commands.h"
#include "device_flag.h"
#ifdef DSINFER_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#endif
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "model/demo_model.h"
#include "model/draft_vocabulary.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "text/chat_parser.h"
#include "text/chat_render.h"
#include "text/tokenizer.h"

namespace dsinfer::cli {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "dsinfer: %s\n", s.ToString().c_str());
  return 1;
}
int Usage(const char* usage, const std::string& error = "") {
  if (!error.empty()) std::fprintf(stderr, "dsinfer: %s\n", error.c_str());
  std::fprintf(stderr, "usage: %s\n", usage);
  return 2;
}

Result<backend::Numerics> ParseNumerics(const std::string& name) {
  if (name == "official") return backend::Numerics::Official();
  if (name == "fp32-reference" || name == "hf") return backend::Numerics::Fp32Reference();
  return InvalidArgument("--numerics must be 'official' or 'fp32-reference', got '" + name + "'");
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int RunCreateDemoModel(int argc, char** argv) {
  const char* usage =
      "dsinfer create-demo-model DIR [--preset tiny-a|tiny-b|tiny-c|demo|bench|bench-mtp|tiny-v41-a|"
      "tiny-v41-b|tiny-v41-c|demo-v4.1|demo-v4.1-bigengram|bench-v4.1|bench-v4.1-dspark] [--seed N] "
      "[--tokenizer FILE [--tokenizer-overlay FILE]] [--sparse-engram]";
  Args args;
  if (!args.Parse(argc, argv, {"preset", "seed", "threads", "tokenizer", "tokenizer-overlay"},
                  {"sparse-engram"}) ||
      args.positional().size() != 1)
    return Usage(usage, args.error());
  if (args.Has("tokenizer-overlay") && !args.Has("tokenizer"))
    return Usage(usage, "--tokenizer-overlay needs --tokenizer");
  long long seed = 1, threads = 0;
  if (!args.GetInt("seed", &seed) || !args.GetInt("threads", &threads))
    return Usage(usage, args.error());
  auto config = model::PresetConfig(args.GetOr("preset", "demo"));
  if (!config.ok()) return Fail(config.status());
  ThreadPool pool(static_cast<int>(threads));
  model::DemoModelOptions options;
  options.seed = static_cast<uint64_t>(seed);
  options.sparse_engram_tables = args.Has("sparse-engram");
  if (auto tok = args.Get("tokenizer")) {
    // The model directory carries its tokenizer, as published checkpoints do; the V4.1 one is
    // V4's with an overlay (tests/fixtures/v41/tokenizer_overlay.json).
    auto text = io::ReadTextFile(*tok);
    if (!text.ok()) return Fail(text.status());
    options.tokenizer_json = std::move(text).value();
    if (auto overlay_path = args.Get("tokenizer-overlay")) {
      auto overlay = io::ReadTextFile(*overlay_path);
      if (!overlay.ok()) return Fail(overlay.status());
      auto applied = text::ApplyAddedTokenOverlay(options.tokenizer_json, *overlay);
      if (!applied.ok()) return Fail(applied.status().WithContext(*overlay_path));
      options.tokenizer_json = std::move(applied).value();
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  Status st = model::WriteDemoModel(*config, args.positional()[0], options, pool);
  if (!st.ok()) return Fail(st);
  std::fprintf(stderr, "wrote %s (%s) in %.1f s\n", args.positional()[0].c_str(),
               config->Summary().c_str(), Seconds(t0, std::chrono::steady_clock::now()));
  return 0;
}

int RunInspect(int argc, char** argv) {
  const char* usage = "dsinfer inspect --model DIR";
  Args args;
  if (!args.Parse(argc, argv, {"model"}, {}) || !args.Has("model"))
    return Usage(usage, args.error());
  auto weights = model::ModelWeights::Load(*args.Get("model"));
  if (!weights.ok()) return Fail(weights.status());
  const auto& w = **weights;
  std::printf("%s\n", w.config().Summary().c_str());
  std::printf("tensors: %zu, checkpoint bytes: %llu\n", model::ExpectedTensors(w.config()).size(),
              static_cast<unsigned long long>(w.checkpoint().TotalBytes()));
  return 0;
}

// "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N; nullopt for anything else.
// Logits of every position of `ids` on the GPU forward, `step` tokens per call.
Status GpuLogits(int ordinal, const model::ModelWeights& weights, backend::Numerics numerics,
                 const std::vector<int32_t>& ids, size_t step, std::vector<float>* all) {
#ifdef DSINFER_HAVE_CUDA
  DSINFER_RETURN_IF_ERROR(backend::cuda::CudaModel::Supports(weights.config()));
  DSINFER_ASSIGN_OR_RETURN(auto dev, backend::cuda::CudaDevice::Open(ordinal));
  DSINFER_ASSIGN_OR_RETURN(auto model, backend::cuda::CudaModel::Create(*dev, weights, numerics));
  DSINFER_ASSIGN_OR_RETURN(auto seq, model->NewSequence());
  for (size_t i = 0; i < ids.size(); i += step) {
    const size_t n = std::min(step, ids.size() - i);
    backend::cpu::ForwardOutput out;
    DSINFER_RETURN_IF_ERROR(model->Forward(*seq, std::span<const int32_t>(ids.data() + i, n),
                                           {.all_logits = true}, &out));
    all->insert(all->end(), out.logits.begin(), out.logits.end());
  }
  return Status::Ok();
#else
  (void)ordinal, (void)weights, (void)numerics, (void)ids, (void)step, (void)all;
  return FailedPrecondition(
      "--device cuda: this binary was built without the CUDA backend (DSINFER_CUDA=OFF)");
#endif
}

int RunLogits(int argc, char** argv) {
  const char* usage =
      "dsinfer logits --model DIR --ids 0,5,7 --out FILE [--numerics official|fp32-reference] "
      "[--chunk N] [--weights auto|map|copy] [--device cpu|cuda|cuda:N]";
  Args args;
  if (!args.Parse(argc, argv,
                  {"model", "ids", "out", "numerics", "chunk", "threads", "weights", "device"},
                  {}) ||
      !args.Has("model") || !args.Has("ids") || !args.Has("out"))
    return Usage(usage, args.error());
  const std::optional<int> device = ParseDevice(args.GetOr("device", "cpu"));
  if (!device) return Usage(usage, "--device must be cpu, cuda or cuda:N");
  std::vector<int32_t> ids;
  if (!ParseIdList(*args.Get("ids"), &ids))
    return Usage(usage, "--ids must be a comma-separated list of ids");
  long long chunk = 0, threads = 0;
  if (!args.GetInt("chunk", &chunk) || !args.GetInt("threads", &threads) || chunk < 0)
    return Usage(usage, args.error());
  auto numerics = ParseNumerics(args.GetOr("numerics", "official"));
  if (!numerics.ok()) return Fail(numerics.status());
  const auto residency = WeightResidencyFlag(args);
  if (!residency) return Usage(usage, kWeightResidencyFlagError);
  auto weights = LoadWeightsOrPrint(*args.Get("model"), *residency, "logits");
  if (weights == nullptr) return 1;
  const int64_t vocab = weights->config().vocab_size;
  std::vector<float> all;
  all.reserve(ids.size() * vocab);
  size_t step = chunk > 0 ? static_cast<size_t>(chunk) : ids.size();
  if (*device >= 0) {
    Status st = GpuLogits(*device, *weights, *numerics, ids, step, &all);
    if (!st.ok()) return Fail(st);
  } else {
    ThreadPool pool(static_cast<int>(threads));
    auto cpu = backend::cpu::CpuModel::Create(*weights, *numerics, pool);
    if (!cpu.ok()) return Fail(cpu.status());
    auto state = (*cpu)->NewSequence();
    for (size_t i = 0; i < ids.size(); i += step) {
      size_t n = std::min(step, ids.size() - i);
      backend::cpu::ForwardOutput out;
      Status st = (*cpu)->Forward(*state, std::span<const int32_t>(ids.data() + i, n),
                                  {.all_logits = true}, &out);
      if (!st.ok()) return Fail(st);
      all.insert(all.end(), out.logits.begin(), out.logits.end());
    }
  }
  io::OwnedTensor t{"logits", DType::kF32, {static_cast<int64_t>(ids.size()), vocab}, {}};
  t.bytes.resize(all.size() * 4);
  std::memcpy(t.bytes.data(), all.data(), t.bytes.size());
  Status st = io::WriteSafetensors(
      *args.Get("out"), {t},
      {{"numerics", (*numerics).Name()}, {"device", args.GetOr("device", "cpu")}});
  if (!st.ok()) return Fail(st);
  return 0;
}

int RunGenerate(int argc, char** argv) {
  const char* usage =
      "dsinfer generate --model DIR (--prompt-ids 0,5,7 | --prompt TEXT [--chat [--no-thinking]]) "
      "[--max-tokens N] "
      "[--temperature T] [--top-p P] [--top-k K] [--seed S] [--numerics official|fp32-reference] "
      "[--ignore-eos] "
      "[--tokenizer FILE] [--weights auto|map|copy] [--device cpu|cuda|cuda:N] [--threads N] "
      "[--numa off|distribute|isolate|numactl] "
      "[--speculative-tokens 0..4 [--draft-min-confidence P] [--speculative-token-map FILE]]";
  Args args;
  if (!args.Parse(argc, argv,
                  {"model", "prompt-ids", "prompt", "max-tokens", "temperature", "top-p", "top-k",
                   "seed", "numerics", "threads", "tokenizer", "weights", "device",
                   "speculative-tokens", "draft-min-confidence", "speculative-token-map", "numa"},
                  {"ignore-eos", "chat", "no-thinking"}) ||
      !args.Has("model") || (args.Has("prompt-ids") == args.Has("prompt")))
    return Usage(usage, args.error().empty() ? "give exactly one of --prompt-ids and --prompt"
                                             : args.error());
  long long max_tokens = 32, top_k = 0, seed = 0, threads = 0, speculative_tokens = 0;
  double temperature = 0.0, top_p = 1.0;
  double draft_min_confidence = runtime::EngineOptions{}.draft_min_confidence;
  if (!args.GetDouble("draft-min-confidence", &draft_min_confidence))
    return Usage(usage, args.error());
  if (!(draft_min_confidence >= 0 && draft_min_confidence <= 1))
    return Usage(usage, "--draft-min-confidence must be in [0, 1]");
  if (!args.GetInt("max-tokens", &max_tokens) || !args.GetInt("top-k", &top_k) ||
      !args.GetInt("speculative-tokens", &speculative_tokens) || !args.GetInt("seed", &seed) ||
      !args.GetInt("threads", &threads) || !args.GetDouble("temperature", &temperature) ||
      !args.GetDouble("top-p", &top_p))
    return Usage(usage, args.error());
  if (max_tokens < 0 || temperature < 0 || top_p <= 0 || top_p > 1 || top_k < 0)
    return Usage(usage, "invalid sampling parameters");
  if (threads < 0) return Usage(usage, "--threads must be >= 0");
  if (speculative_tokens < 0 || speculative_tokens > runtime::kMaxSpeculativeTokens)
    return Usage(usage, "--speculative-tokens must be in [0, 4]");
  if (args.Has("speculative-token-map") && speculative_tokens == 0)
    return Usage(usage, "--speculative-token-map needs --speculative-tokens");
  auto numerics = ParseNumerics(args.GetOr("numerics", "official"));
  if (!numerics.ok()) return Fail(numerics.status());
  const std::optional<int> device = ParseDevice(args.GetOr("device", "cpu"));
  if (!device) return Usage(usage, "--device must be cpu, cuda or cuda:N");
  const std::optional<CpuPlacement> placement =
      CpuPlacementOrPrint(args, *device, static_cast<int>(threads), "generate");
  if (!placement) return 2;
  const std::string model_dir = *args.Get("model");

  // Text prompts: the model directory's tokenizer; --chat renders a one-turn conversation with
  // the DeepSeek V4 template and parses the output into reasoning and answer.
  std::optional<text::Tokenizer> tokenizer;
  std::optional<text::OutputParser> parser;
  std::vector<int32_t> ids;
  if (auto prompt = args.Get("prompt")) {
    auto tok = text::Tokenizer::FromFile(FindTokenizer(model_dir, args.GetOr("tokenizer", "")));
    if (!tok.ok()) return Fail(tok.status());
    tokenizer.emplace(std::move(tok).value());
    if (args.Has("chat")) {
      text::ChatRequest req;
      req.thinking = !args.Has("no-thinking");
      text::ChatMessage user;
      user.role = text::Role::kUser;
      user.content = *prompt;
      req.messages.push_back(user);
      auto rendered = text::RenderPromptSegments(req);
      if (!rendered.ok()) return Fail(rendered.status());
      auto encoded = text::EncodePrompt(*tokenizer, rendered->segments);
      if (!encoded.ok()) return Fail(encoded.status());
      ids = std::move(encoded).value();
      text::OutputParserOptions po;
      po.thinking = req.thinking ? text::ThinkingStage::kReasoningStart : text::ThinkingStage::kOff;
      parser.emplace(po);
    } else {
      auto encoded = tokenizer->Encode(*prompt, /*allow_special=*/true);
      if (!encoded.ok()) return Fail(encoded.status());
      ids = std::move(encoded).value();
    }
  } else if (!ParseIdList(*args.Get("prompt-ids"), &ids)) {
    return Usage(usage, "--prompt-ids must be a list of ids");
  }
  if (ids.empty()) return Usage(usage, "the prompt is empty");

  const auto residency = WeightResidencyFlag(args);
  if (!residency) return Usage(usage, kWeightResidencyFlagError);
  auto weights = LoadWeightsOrPrint(model_dir, *residency, "generate", 0, placement->weights);
  if (weights == nullptr) return 1;
  auto runner = MakeRunner(*device, *weights, *numerics, *placement);
  if (!runner.ok()) return Fail(runner.status());
  std::unique_ptr<backend::RunnerState> state;  // made when the runner is stepped here
  // One sequence stepped through the runner: the last position's logits into `out`.
  backend::cpu::ForwardOutput out;
  auto forward = [&](std::span<const int32_t> tokens) {
    out.logits.clear();
    backend::RunnerChunk chunk{state.get(), tokens, {}, &out};
    return (*runner)->ForwardBatch(std::span<backend::RunnerChunk>(&chunk, 1));
  };
  runtime::SamplingParams sp{
      temperature, top_p, static_cast<int>(top_k), 0.0, static_cast<uint64_t>(seed), true};
  const int eos = weights->config().eos_token_id;

  std::optional<text::StreamingDetokenizer> detok;
  if (tokenizer) detok.emplace(*tokenizer);
  std::string reasoning, answer;
  auto emit = [&](int32_t tok, bool first) {
    if (!detok) {
      std::printf("%s%d", first ? "" : ",", tok);
    } else if (!parser) {
      std::fputs(detok->Next(tok).c_str(), stdout);
    } else {
      for (const auto& ev : parser->Feed(detok->Next(tok))) {
        if (ev.kind == text::ParserEvent::Kind::kReasoning) reasoning += ev.text;
        if (ev.kind == text::ParserEvent::Kind::kContent) answer += ev.text;
      }
    }
    std::fflush(stdout);
  };

  auto t0 = std::chrono::steady_clock::now();
  auto t1 = t0;
  std::vector<int32_t> generated;
  bool hit_eos = false;
  std::string speculation;  // the acceptance line, with --speculative-tokens
  if (speculative_tokens > 0 && max_tokens > 0) {
    // Speculative decoding runs in the engine (drafts, verification, rollback): one request.
    runtime::EngineOptions eo;
    eo.numerics = *numerics;
    eo.enable_prefix_cache = false;
    eo.speculative_tokens = static_cast<int>(speculative_tokens);
    eo.draft_min_confidence = draft_min_confidence;
    if (auto map = args.Get("speculative-token-map")) {
      auto vocabulary = model::ReadDraftVocabulary(*map, weights->config().vocab_size);
      if (!vocabulary.ok()) return Fail(vocabulary.status());
      eo.draft_vocabulary = std::move(vocabulary).value();
    }
    auto engine = runtime::Engine::Create(*weights, eo, std::move(runner).value());
    if (!engine.ok()) return Fail(engine.status());
    runtime::RequestParams rp;
    rp.prompt = ids;
    rp.max_tokens = static_cast<int>(max_tokens);
    rp.sampling = sp;
    rp.ignore_eos = args.Has("ignore-eos");
    auto stream = (*engine)->Submit(std::move(rp));
    if (!stream.ok()) return Fail(stream.status());
    while (auto ev = (*stream)->Next(std::chrono::hours(24))) {
      for (int32_t tok : ev->tokens) {
        if (generated.empty()) t1 = std::chrono::steady_clock::now();
        emit(tok, generated.empty());
        generated.push_back(tok);
      }
      if (!ev->finished) continue;
      if (ev->finish_reason == runtime::FinishReason::kError) return Fail(ev->error);
      hit_eos = ev->finish_reason == runtime::FinishReason::kStop;
      break;
    }
    const runtime::SpecDecodeStats spec = (*engine)->Stats().spec_decode;
    char line[160];
    std::snprintf(
        line, sizeof line,
        "speculative decoding: %lld of %lld draft tokens accepted, %.3f tokens per step\n",
        static_cast<long long>(spec.num_accepted_tokens),
        static_cast<long long>(spec.num_draft_tokens),
        spec.num_drafts > 0 ? 1.0 + static_cast<double>(spec.num_accepted_tokens) /
                                        static_cast<double>(spec.num_drafts)
                            : 1.0);
    speculation = line;
  } else {
    auto made = (*runner)->NewState();
    if (!made.ok()) return Fail(made.status());
    state = std::move(made).value();
    Status st = forward(ids);
    if (!st.ok()) return Fail(st);
    t1 = std::chrono::steady_clock::now();
  }
  for (long long i = 0; speculation.empty() && i < max_tokens; ++i) {
    int32_t tok = runtime::Sample(out.logits, sp, static_cast<uint64_t>(i));
    generated.push_back(tok);
    if (tok == eos && !args.Has("ignore-eos")) {
      hit_eos = true;
      if (!detok) emit(tok, i == 0);
      break;
    }
    emit(tok, i == 0);
    if (i + 1 == max_tokens) break;
    const int32_t one[1] = {tok};
    const Status st = forward(one);
    if (!st.ok()) return Fail(st);
  }
  auto t2 = std::chrono::steady_clock::now();
  if (detok) {
    std::string rest = detok->Flush();
    if (parser) {
      for (const auto& ev : parser->Feed(rest)) {
        if (ev.kind == text::ParserEvent::Kind::kReasoning) reasoning += ev.text;
        if (ev.kind == text::ParserEvent::Kind::kContent) answer += ev.text;
      }
      for (const auto& ev :
           parser->Finish(hit_eos ? text::BackendFinish::kStop : text::BackendFinish::kLength)) {
        if (ev.kind == text::ParserEvent::Kind::kReasoning) reasoning += ev.text;
        if (ev.kind == text::ParserEvent::Kind::kContent) answer += ev.text;
      }
      std::printf("[reasoning]\n%s\n[answer]\n%s\n[finish: %s]", reasoning.c_str(), answer.c_str(),
                  text::FinishReasonName(parser->result().finish_reason));
    } else {
      std::fputs(rest.c_str(), stdout);
    }
  }
  std::printf("\n");
  double decode_s = Seconds(t1, t2);
  std::fprintf(
      stderr,
      "prefill %zu tokens in %.3f s (%.1f tok/s); decode %zu tokens in %.3f s (%.1f tok/s)\n",
      ids.size(), Seconds(t0, t1), ids.size() / std::max(1e-9, Seconds(t0, t1)), generated.size(),
      decode_s, generated.size() > 1 ? (generated.size() - 1) / std::max(1e-9, decode_s) : 0.0);
  std::fputs(speculation.c_str(), stderr);
  return 0;
}

}  // namespace dsinfer::cli
