// One generation request as the protocol handlers see it: submit to the engine, then turn the
// token stream into parsed deltas (reasoning / content / tool calls, via text::OutputParser) per
// sample, applying stop sequences to answer text, watching the client socket so a disconnect
// cancels the request within one engine step, and recording latency metrics.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "server/engine_port.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "text/chat_parser.h"
#include "text/tokenizer.h"

namespace dsinfer::server {

// A parsed piece of one sample's output, as the protocol handlers format it.
struct OutputDelta {
  enum class Kind { kReasoning, kContent, kToolCallStart, kToolCallArguments };
  Kind kind = Kind::kContent;
  int tool_index = -1;  // tool calls: 0-based index within the sample
  std::string text;     // reasoning/content/argument text; the function name for kToolCallStart
};

struct GenerationSpec {
  runtime::RequestParams params;
  bool thinking = false;          // the prompt ended with <think>: output starts as reasoning
  bool parse_tools = false;       // DSML blocks become tool calls
  bool raw_text = false;          // /v1/completions: text passes through verbatim (no parsing)
  bool forced_tool_call = false;  // the prompt opened the DSML block (tool_choice required)
  bool json_output = false;       // response_format json_object
  // vLLM's skip_special_tokens: tokens the tokenizer flags "special" (placeholders, BOS, ...) are
  // left out of the text. The chat markup (<think>, ｜DSML｜, ...) is not flagged special, and the
  // end-of-message token is never text.
  bool skip_special_tokens = true;
  std::vector<std::string> stop;  // stop sequences, matched in answer text only
  // vLLM's include_stop_str_in_output / SGLang's no_stop_trim: the matched stop sequence ends the
  // text instead of being cut.
  bool include_stop_in_output = false;
  // SGLang's separate_reasoning (false: the reasoning and its closing </think> are content, as
  // the model wrote them) and stream_reasoning (false: the reasoning arrives as one delta when
  // it ends, not token by token).
  bool separate_reasoning = true;
  bool stream_reasoning = true;
  bool include_reasoning = true;  // vLLM's include_reasoning: false leaves the reasoning out
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

// How one sample ended. Its text, tool calls and logprobs reach the protocol handlers only as
// deltas (GenerationObserver): each API's result builder assembles both its stream and its
// final object from them, so the two cannot disagree.
struct SampleOutput {
  int tool_calls = 0;  // tool calls the parser announced
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;  // tokens generated while the parser was in reasoning
  runtime::FinishReason engine_finish = runtime::FinishReason::kNone;
  bool stopped_by_sequence = false;
  std::string stop_sequence;
  bool done = false;
};

// Receives a generation's output as it is parsed. Every generated token's logprob is handed over
// exactly once, in order: with the next delta of its sample (whatever its kind), or with
// OnSampleDone for tokens no delta followed (the end-of-message token, held-back text).
// Returning false means the client is gone (a write failed).
class GenerationObserver {
 public:
  virtual ~GenerationObserver() = default;
  virtual bool OnDelta(int index, const OutputDelta& delta,
                       std::span<const runtime::TokenLogprob> logprobs) = 0;
  // No event for a while (queued or in a long prefill): a chance to send an SSE keep-alive.
  virtual bool OnIdle() { return true; }
  // The prompt's logprobs (RequestParams::prompt_logprobs), once, before any delta: one entry per
  // prompt token after the first.
  virtual bool OnPromptLogprobs(std::span<const runtime::TokenLogprob> /*logprobs*/) {
    return true;
  }
  // A sample finished (its SampleOutput is final).
  virtual bool OnSampleDone(int /*index*/, std::span<const runtime::TokenLogprob> /*logprobs*/) {
    return true;
  }
};

enum class GenerationEnd { kFinished, kClientGone, kCancelled, kError };

class Generation {
 public:
  // Submits to the engine; engine errors (queue full, bad parameters) come back here, before any
  // response byte is written, so handlers can answer with the right status code.
  static Result<std::unique_ptr<Generation>> Start(EnginePort& engine,
                                                   const text::Tokenizer& tokenizer,
                                                   ServerMetrics& metrics, GenerationSpec spec);
  ~Generation();  // cancels the engine request if still running

  // Runs until every sample finished, the client left, or the request was cancelled. The
  // observer (a result builder) sees every delta, streamed or not.
  GenerationEnd Run(GenerationObserver& observer, ResponseSink* sink);

  const std::vector<SampleOutput>& samples() const { return samples_; }
  const runtime::Usage& usage() const { return usage_; }
  const Status& error() const { return error_; }
  const std::shared_ptr<runtime::RequestStream>& stream() const { return stream_; }
  const std::string& request_id() const { return stream_->id(); }
  const runtime::RequestParams& params() const { return spec_.params; }
  // RequestParams::export_prompt_state: the blob (or why there is none), from the first event.
  const std::shared_ptr<const std::vector<uint8_t>>& exported_state() const {
    return exported_state_;
  }
  const Status& export_status() const { return export_status_; }

 private:
  Generation(const text::Tokenizer& tokenizer, ServerMetrics& metrics, GenerationSpec spec,
             std::shared_ptr<runtime::RequestStream> stream);
  struct SampleState;
  // Feeds one engine event; false if the observer reported the client gone.
  bool Consume(const runtime::StreamEvent& event, GenerationObserver& observer);
  bool Deliver(int index, std::vector<OutputDelta>& deltas, GenerationObserver& observer);
  void RecordOutcome(GenerationEnd end);

  const text::Tokenizer& tokenizer_;
  ServerMetrics& metrics_;
  GenerationSpec spec_;
  std::shared_ptr<runtime::RequestStream> stream_;
  std::vector<std::unique_ptr<SampleState>> states_;  // [n]
  std::vector<SampleOutput> samples_;                 // [n]
  runtime::Usage usage_;
  Status error_;
  bool finished_ = false;
  bool first_token_seen_ = false;
  bool prompt_logprobs_seen_ = false;
  std::shared_ptr<const std::vector<uint8_t>> exported_state_;
  Status export_status_;
  std::chrono::steady_clock::time_point last_token_time_;
};

}  // namespace dsinfer::server
