// What the OpenAI chat and completions result builders share: the response envelope, stream
// options, usage, finish reasons, and the end of a stream or the final object. Each builder is
// the generation's observer on both paths: streaming, it writes a chunk per delta; otherwise it
// only accumulates; either way the final object comes from the same accumulated state, so a
// stream and a non-streamed reply of the same generation carry the same output.
#pragma once

#include <string>

#include "server/service_core.h"

namespace dsinfer::server {

struct StreamOptions {
  bool stream = false;
  bool include_usage = false;
  // vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far.
  bool continuous_usage = false;
};

Result<StreamOptions> ParseStreamOptions(const Json& body);

// "stop", "length", "tool_calls", "aborted" (DeepSeek's spelling of a cancelled request), "error".
std::string OpenAIFinishReason(const SampleOutput& s);
Json OpenAIUsage(const runtime::Usage& u, int64_t reasoning_tokens);
// vLLM's prompt_logprobs: null for the first prompt token, then per token a map from token id to
// {logprob, rank (1-based among the first `top_k` the top alternatives; null when the token is not
// among them), decoded_token}.
Json VllmPromptLogprobs(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps,
                        int top_k);

class OpenAIResult : public GenerationObserver {
 public:
  // Streaming: sends the response head; false when the client is gone.
  bool BeginStream();
  bool OnIdle() override;
  // Streaming: the usage chunk (if asked for) and [DONE], or the error event; otherwise the
  // whole response object, or the error reply.
  void Finish(GenerationEnd end);
  // The non-streamed response object (valid once the generation has ended).
  Json Response() const;
  void set_generation(const Generation* g) { generation_ = g; }
  // A top-level field of the final object besides the builder's own (kv_transfer_params).
  void set_extra_field(const std::string& key, Json value) { extra_[key] = std::move(value); }

 protected:
  OpenAIResult(Service::Core& core, ResponseSink& sink, std::string id, std::string object,
               std::string chunk_object, StreamOptions options);
  bool streaming() const { return options_.stream; }
  // A stream chunk with these choices (and, with continuous usage, the usage so far).
  bool WriteChunk(Json choices, const Json& extra = nullptr);
  // The final choices, from the accumulated state.
  virtual Json FinalChoices() const = 0;
  virtual int64_t ReasoningTokens() const { return 0; }
  // The usage reported (completions with max_tokens 0 generate a token nobody sees).
  virtual runtime::Usage ReportedUsage() const { return generation_->usage(); }
  // Fields of the final object besides the envelope, choices and usage.
  virtual void AddFields(Json& /*response*/) const {}

  Service::Core& core_;
  const Generation* generation_ = nullptr;
  const std::string id_;

 private:
  Json Envelope(const std::string& object, Json choices) const;

  ResponseSink& sink_;
  const std::string object_;
  const std::string chunk_object_;
  const StreamOptions options_;
  const int64_t created_;
  Json extra_ = Json::object();
};

// Prefill/decode disaggregation in the OpenAI handlers (disaggregation.cc). Before the
// generation: the request's kv_transfer_params (a prefill request must not stream), the state
// pulled for a decode worker; nullopt when the error was sent. After it: a prefill worker's
// answer gets its kv_transfer_params; false when the error was sent instead.
std::optional<KvTransferRequest> PrepareKvTransfer(Service::Core& core, const Json& body,
                                                   bool stream, runtime::RequestParams* params,
                                                   ResponseSink& sink);
bool AddKvTransferParams(Service::Core& core, const KvTransferRequest& kv,
                         const Generation& generation, GenerationEnd end, OpenAIResult& result,
                         ResponseSink& sink);

}  // namespace dsinfer::server
