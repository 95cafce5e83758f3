// server::Service in process, without sockets, for the fuzz target (tests/fuzz/service_fuzz.cc)
// and the tests that replay its corpus (service_corpus_test.cc): the real V4 tokenizer, and an
// engine that "generates" a given text for every choice, so the request parsers, the output
// parsers (reasoning, DSML tool calls, stop strings) and the stream writers all run.
// The engine can also be told to fail (EngineFailure). Every reply is checked as it is written:
// the status is one the API documents (a 500 means a request reached an unexpected error path,
// unless the engine was told to fail), every JSON body parses, every SSE `data:` line is JSON or
// [DONE], everything written is valid UTF-8, and a stream ends on a whole line.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine_port.h"
#include "server/service.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace dsinfer::server::testing {

// How the engine fails, if it does: it refuses the request (its queue is full), or every choice
// ends with an engine error after its first two tokens.
enum class EngineFailure { kNone, kRefuse, kMidStream };

// Pushes every event of every choice before Submit returns, so Service::Handle never waits.
class TextEngine final : public EnginePort {
 public:
  explicit TextEngine(const text::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string text;  // what every choice generates
  EngineFailure failure = EngineFailure::kNone;
  runtime::RequestParams last_params;  // of the latest request submitted (the rendered prompt)

  Result<std::shared_ptr<runtime::RequestStream>> Submit(runtime::RequestParams params) override {
    if (failure == EngineFailure::kRefuse) return ResourceExhausted("request queue is full");
    last_params = params;
    auto stream = std::make_shared<runtime::RequestStream>("harness");
    auto encoded = tokenizer_.Encode(text, /*allow_special=*/true);
    const std::vector<int32_t> tokens = encoded.ok() ? *encoded : std::vector<int32_t>{};
    runtime::Usage usage;
    usage.prompt_tokens = static_cast<int64_t>(params.prompt.size());
    // Prompt logprobs: made-up values, distinct per position, with the token itself on top.
    std::vector<runtime::TokenLogprob> prompt_logprobs;
    if (params.prompt_logprobs >= 0)
      for (size_t i = 1; i < params.prompt.size(); ++i) {
        runtime::TokenLogprob lp{params.prompt[i], -0.5f - 0.125f * static_cast<float>(i), {}};
        for (int k = 0; k < params.prompt_logprobs; ++k)
          lp.top.push_back({k == 0 ? params.prompt[i] : k, lp.logprob - static_cast<float>(k)});
        prompt_logprobs.push_back(std::move(lp));
      }
    for (int n = 0; n < params.n; ++n) {
      for (size_t i = 0;; ++i) {
        runtime::StreamEvent event;
        event.index = n;
        const bool at_limit = static_cast<int64_t>(i) >= params.max_tokens;
        if (failure == EngineFailure::kMidStream && i == std::min<size_t>(2, tokens.size())) {
          event.finished = true;
          event.finish_reason = runtime::FinishReason::kError;
          event.error = Internal("injected engine failure");
        } else if (i < tokens.size() && !at_limit) {
          event.tokens = {tokens[i]};
          if (params.top_logprobs >= 0) {
            runtime::TokenLogprob lp{tokens[i], -0.25f, {}};
            for (int k = 0; k < params.top_logprobs; ++k) lp.top.push_back({tokens[i], -0.25f});
            event.logprobs = {lp};
          }
          ++usage.completion_tokens;
        } else {
          event.finished = true;
          event.finish_reason =
              at_limit ? runtime::FinishReason::kLength : runtime::FinishReason::kStop;
        }
        event.usage = usage;
        if (n == 0 && i == 0) event.prompt_logprobs = prompt_logprobs;
        stream->Push(event);
        if (event.finished) break;
      }
    }
    return stream;
  }
  runtime::EngineStats Stats() const override { return {}; }
  bool ready() const override { return true; }
  void Shutdown(std::chrono::steady_clock::time_point) override {}
  Status FlushPrefixCache() override { return Status::Ok(); }

 private:
  const text::Tokenizer& tokenizer_;
};

struct Reply {
  int status = 0;
  std::string body;       // the JSON body, or the stream's text
  std::string violation;  // the first broken rule (see the file comment); empty when none
};

// Records a reply and checks it as it is written. `failure`: what the engine was told to do,
// which makes its error statuses expected (429 / 503 for a refusal, 500 for a failed generation).
class CheckingSink final : public ResponseSink {
 public:
  CheckingSink(Reply& reply, EngineFailure failure) : reply_(reply), failure_(failure) {}
  void Send(int status, std::string_view content_type, std::string_view body,
            const HeaderList&) override {
    RecordStatus(status);
    reply_.body = std::string(body);
    if (!text::IsValidUtf8(body)) Violate("a body is not UTF-8");
    if (content_type.rfind("application/json", 0) == 0 &&
        !nlohmann::json::accept(body.begin(), body.end()))
      Violate("a JSON body does not parse");
  }
  bool BeginStream(int status, std::string_view, const HeaderList&) override {
    RecordStatus(status);
    return true;
  }
  bool WriteChunk(std::string_view data) override {
    if (!text::IsValidUtf8(data)) Violate("a stream chunk is not UTF-8");
    reply_.body += data;
    pending_ += data;
    // Whole SSE lines only: a chunk may end mid-line.
    for (size_t eol; (eol = pending_.find('\n')) != std::string::npos;) {
      const std::string_view line(pending_.data(), eol);
      if (line.rfind("data: ", 0) == 0) {
        const std::string_view payload = line.substr(6);
        if (payload != "[DONE]" && !nlohmann::json::accept(payload.begin(), payload.end()))
          Violate("an SSE data line is not JSON");
      }
      pending_.erase(0, eol + 1);
    }
    return true;
  }
  void EndStream() override {
    if (!pending_.empty()) Violate("a stream ends mid-line");
  }
  bool ClientGone() override { return false; }

 private:
  void RecordStatus(int status) {
    reply_.status = status;
    switch (status) {
      case 200:
      case 400:
      case 404:
      case 405:
      case 413:
      case 422:
      case 429:
        return;
      case 503:
        if (failure_ == EngineFailure::kRefuse) return;
        break;
      case 500:
        if (failure_ == EngineFailure::kMidStream) return;
        break;
      default:
        break;
    }
    Violate("status " + std::to_string(status));
  }
  void Violate(std::string what) {
    if (reply_.violation.empty()) reply_.violation = std::move(what);
  }
  Reply& reply_;
  EngineFailure failure_;
  std::string pending_;
};

// The service with the V4 test tokenizer attached (4096-token context).
class InProcessService {
 public:
  static constexpr const char* kPaths[8] = {
      "/v1/chat/completions",      "/v1/completions", "/v1/responses", "/v1/messages",
      "/v1/messages/count_tokens", "/tokenize",       "/detokenize",   "/v1/chat/completions"};
  // The worker endpoints the routers call with a body (worker_endpoints.cc), picked instead of
  // kPaths when byte 0's bit 5 is set.
  static constexpr const char* kWorkerPaths[4] = {"/v1/chat/completions/render",
                                                  "/v1/completions/render", "/v1/responses/render",
                                                  "/flush_cache"};

  explicit InProcessService(text::Tokenizer tokenizer, ModelInfo info = DefaultInfo())
      : tokenizer_(std::move(tokenizer)), engine_(tokenizer_), service_(ServiceOptions{}) {
    service_.Attach(&engine_, &tokenizer_, info);
  }
  static ModelInfo DefaultInfo() {
    ModelInfo info;
    info.max_model_len = 4096;
    return info;
  }
  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  // What the engine was asked for by the latest request that reached it.
  const runtime::RequestParams& last_params() const { return engine_.last_params; }
  static std::string TokenizerPath() {
    return std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json";
  }

  Reply Post(const std::string& path, std::string body, std::string generated = {},
             EngineFailure failure = EngineFailure::kNone) {
    HttpRequest request;
    request.method = "POST";
    request.path = path;
    request.headers = {{"content-type", "application/json"}};
    request.body = std::move(body);
    engine_.text = std::move(generated);
    engine_.failure = failure;
    engine_.last_params = {};
    Reply reply;
    CheckingSink sink(reply, failure);
    service_.Handle(request, sink);
    if (reply.status == 0 && reply.violation.empty()) reply.violation = "no reply";
    return reply;
  }

  // A fuzz input: byte 0's low three bits pick the endpoint (kPaths; with bit 5 set, the low
  // two pick from kWorkerPaths) and bits 3-4 how the engine fails (1: refuses, 2: fails
  // mid-stream, 0 and 3: does not), then the body up to the first NUL byte (JSON has no raw
  // NUL), then the text the engine generates.
  Reply PostFuzzInput(std::string_view input) {
    if (input.empty()) return Reply{200, "", ""};
    const std::string_view rest = input.substr(1);
    const size_t nul = rest.find('\0');
    const auto mode = static_cast<uint8_t>(input[0]);
    const EngineFailure failure = ((mode >> 3) & 3) == 1   ? EngineFailure::kRefuse
                                  : ((mode >> 3) & 3) == 2 ? EngineFailure::kMidStream
                                                           : EngineFailure::kNone;
    const char* path = (mode & 0x20) != 0 ? kWorkerPaths[mode & 3] : kPaths[mode & 7];
    return Post(path, std::string(rest.substr(0, nul)),
                nul == std::string_view::npos ? "" : std::string(rest.substr(nul + 1)), failure);
  }

 private:
  text::Tokenizer tokenizer_;
  TextEngine engine_;
  Service service_;
};

// One service for a test binary (loading the tokenizer takes a while): the default options, the
// V4 test tokenizer, a 4096-token context.
inline InProcessService& Service() {
  static InProcessService* service = [] {
    auto tokenizer = text::Tokenizer::FromFile(InProcessService::TokenizerPath());
    if (!tokenizer.ok()) std::abort();  // the fixture is part of the repository
    return new InProcessService(std::move(tokenizer).value());
  }();
  return *service;
}

}  // namespace dsinfer::server::testing
