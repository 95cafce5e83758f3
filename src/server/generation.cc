#include "server/generation.h"

#include <algorithm>
#include <utility>

namespace dsinfer::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kIdleInterval = std::chrono::seconds(10);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Start of the longest suffix of `s` that is a proper prefix of `stop` (s.size() if none).
size_t PartialStopStart(std::string_view s, std::string_view stop) {
  size_t max_len = std::min(s.size(), stop.size() - 1);
  for (size_t len = max_len; len > 0; --len)
    if (s.substr(s.size() - len) == stop.substr(0, len)) return s.size() - len;
  return s.size();
}

text::OutputParserOptions ParserOptions(const GenerationSpec& spec) {
  text::OutputParserOptions o;
  o.thinking = spec.thinking ? text::ThinkingStage::kReasoningStart : text::ThinkingStage::kOff;
  o.parse_tool_calls = spec.parse_tools;
  o.starts_in_tool_calls = spec.forced_tool_call;
  o.parse_json_output = spec.json_output;
  o.stop_sequences = spec.stop;
  // Nothing the model writes is dropped: unparsable tool-call or JSON-mode text is content.
  o.recover_unparsed = true;
  return o;
}

}  // namespace

struct Generation::SampleState {
  SampleState(const text::Tokenizer& tokenizer, const GenerationSpec& spec)
      : detokenizer(tokenizer), parser(ParserOptions(spec)), in_reasoning(spec.thinking) {}
  text::StreamingDetokenizer detokenizer;
  text::OutputParser parser;
  std::string stop_hold;       // answer text that may be the start of a stop sequence
  std::string reasoning_hold;  // reasoning held back for one delta (stream_reasoning false)
  bool in_reasoning;
  std::vector<runtime::TokenLogprob> unsent_logprobs;  // waiting for the next delta
};

Result<std::unique_ptr<Generation>> Generation::Start(EnginePort& engine,
                                                      const text::Tokenizer& tokenizer,
                                                      ServerMetrics& metrics, GenerationSpec spec) {
  spec.stop.erase(std::remove(spec.stop.begin(), spec.stop.end(), std::string()), spec.stop.end());
  for (const auto& [id, bias] : spec.params.logit_bias)
    if (id < 0 || id >= tokenizer.vocab_size())
      return InvalidArgument("logit_bias: token id " + std::to_string(id) +
                             " is outside the vocabulary (" +
                             std::to_string(tokenizer.vocab_size()) + " tokens)");
  DSINFER_ASSIGN_OR_RETURN(auto stream, engine.Submit(spec.params));
  return std::unique_ptr<Generation>(
      new Generation(tokenizer, metrics, std::move(spec), std::move(stream)));
}

Generation::Generation(const text::Tokenizer& tokenizer, ServerMetrics& metrics,
                       GenerationSpec spec, std::shared_ptr<runtime::RequestStream> stream)
    : tokenizer_(tokenizer), metrics_(metrics), spec_(std::move(spec)), stream_(std::move(stream)) {
  int n = std::max(1, spec_.params.n);
  samples_.resize(n);
  for (int i = 0; i < n; ++i) states_.push_back(std::make_unique<SampleState>(tokenizer_, spec_));
}

Generation::~Generation() {
  if (!finished_) stream_->Cancel();
}

bool Generation::Deliver(int index, std::vector<OutputDelta>& deltas,
                         GenerationObserver& observer) {
  SampleState& state = *states_[index];
  SampleOutput& sample = samples_[index];
  // Raw completions have no parser; their stop sequences are matched here (the parser does it
  // for chat output, in answer text only).
  if (spec_.raw_text && !spec_.stop.empty()) {
    for (size_t i = 0; i < deltas.size(); ++i) {
      if (deltas[i].kind != OutputDelta::Kind::kContent) continue;
      std::string text = state.stop_hold + deltas[i].text;
      state.stop_hold.clear();
      size_t best = std::string::npos;
      std::string matched;
      for (const auto& stop : spec_.stop) {
        size_t at = text.find(stop);
        if (at < best) best = at, matched = stop;
      }
      if (best != std::string::npos) {
        deltas[i].text = text.substr(0, best + (spec_.include_stop_in_output ? matched.size() : 0));
        deltas.resize(i + 1);
        sample.stopped_by_sequence = true;
        sample.stop_sequence = matched;
        break;
      }
      size_t keep = text.size();
      if (!sample.done)
        for (const auto& stop : spec_.stop) keep = std::min(keep, PartialStopStart(text, stop));
      deltas[i].text = text.substr(0, keep);
      state.stop_hold = text.substr(keep);
    }
  }
  bool ok = true;
  auto emit = [&](const OutputDelta& delta) {
    if (delta.text.empty() && delta.kind != OutputDelta::Kind::kToolCallStart) return;
    // The logprobs of every token consumed so far ride on the first delta that follows them.
    if (ok) ok = observer.OnDelta(index, delta, state.unsent_logprobs);
    state.unsent_logprobs.clear();
  };
  // Reasoning as the request asked for it: its own kind or content, streamed or held whole.
  auto emit_reasoning = [&](std::string text) {
    if (!spec_.include_reasoning) return;  // its tokens' logprobs ride on the next delta
    OutputDelta d;
    d.kind = spec_.separate_reasoning ? OutputDelta::Kind::kReasoning : OutputDelta::Kind::kContent;
    d.text = std::move(text);
    emit(d);
  };
  auto end_reasoning = [&] {
    if (!state.reasoning_hold.empty()) emit_reasoning(std::exchange(state.reasoning_hold, {}));
  };
  for (const auto& delta : deltas) {
    if (delta.kind == OutputDelta::Kind::kReasoning) {
      if (spec_.stream_reasoning) {
        emit_reasoning(delta.text);
      } else {
        state.reasoning_hold += delta.text;
      }
      continue;
    }
    if (state.in_reasoning) {
      state.in_reasoning = false;
      end_reasoning();
      // Unseparated, the text is what the model wrote: the parser consumed the </think>.
      if (!spec_.separate_reasoning) emit(OutputDelta{OutputDelta::Kind::kContent, -1, "</think>"});
    }
    if (delta.kind == OutputDelta::Kind::kToolCallStart) ++sample.tool_calls;
    emit(delta);
  }
  if (sample.done) end_reasoning();  // cut while reasoning (length, stop, cancel)
  return ok;
}

bool Generation::Consume(const runtime::StreamEvent& event, GenerationObserver& observer) {
  if (event.index < 0 || event.index >= static_cast<int>(samples_.size())) return true;
  SampleState& state = *states_[event.index];
  SampleOutput& sample = samples_[event.index];
  if (event.exported_state != nullptr) exported_state_ = event.exported_state;
  if (!event.export_status.ok()) export_status_ = event.export_status;
  if (!event.prompt_logprobs.empty() && !prompt_logprobs_seen_) {
    prompt_logprobs_seen_ = true;
    if (!observer.OnPromptLogprobs(event.prompt_logprobs)) return false;
  }
  if (sample.done) return true;  // stopped by a stop sequence; later tokens are discarded
  const auto now = Clock::now();
  if (!event.tokens.empty()) {
    if (!first_token_seen_) {
      first_token_seen_ = true;
      metrics_.ObserveTimeToFirstToken(Seconds(now - spec_.arrival));
      if (event.scheduled_at.time_since_epoch().count() != 0 &&
          event.queued_at.time_since_epoch().count() != 0)
        metrics_.ObserveQueueTime(Seconds(event.scheduled_at - event.queued_at));
    } else {
      metrics_.ObserveInterTokenLatency(Seconds(now - last_token_time_));
    }
    last_token_time_ = now;
  }
  std::string text;
  const auto eos = tokenizer_.eos_id();
  for (int32_t token : event.tokens) {
    ++sample.completion_tokens;
    if (state.in_reasoning) ++sample.reasoning_tokens;
    if (eos && token == *eos) continue;  // the end-of-message marker is not output text
    if (spec_.skip_special_tokens && tokenizer_.IsSpecial(token)) continue;
    text += state.detokenizer.Next(token);
  }
  state.unsent_logprobs.insert(state.unsent_logprobs.end(), event.logprobs.begin(),
                               event.logprobs.end());
  std::vector<OutputDelta> deltas;
  auto convert = [&](std::vector<text::ParserEvent> events) {
    for (auto& e : events) {
      OutputDelta d;
      d.tool_index = e.tool_index;
      d.text = std::move(e.text);
      switch (e.kind) {
        case text::ParserEvent::Kind::kReasoning:
          d.kind = OutputDelta::Kind::kReasoning;
          break;
        case text::ParserEvent::Kind::kContent:
          d.kind = OutputDelta::Kind::kContent;
          break;
        case text::ParserEvent::Kind::kToolCallBegin:
          d.kind = OutputDelta::Kind::kToolCallStart;
          break;
        case text::ParserEvent::Kind::kToolCallArguments:
          d.kind = OutputDelta::Kind::kToolCallArguments;
          break;
        case text::ParserEvent::Kind::kStopSequence:
          sample.stopped_by_sequence = true;
          sample.stop_sequence = d.text;
          if (!spec_.include_stop_in_output) continue;
          d.kind = OutputDelta::Kind::kContent;
          break;
      }
      deltas.push_back(std::move(d));
    }
  };
  auto push = [&](const std::string& piece) {
    if (!spec_.raw_text) return convert(state.parser.Feed(piece));
    if (piece.empty()) return;
    OutputDelta d;
    d.text = piece;
    deltas.push_back(std::move(d));
  };
  push(text);
  if (event.finished) {
    push(state.detokenizer.Flush());
    if (!spec_.raw_text)
      convert(state.parser.Finish(event.finish_reason == runtime::FinishReason::kLength
                                      ? text::BackendFinish::kLength
                                      : text::BackendFinish::kStop));
    sample.engine_finish = event.finish_reason;
    sample.done = true;
    if (event.finish_reason == runtime::FinishReason::kError) error_ = event.error;
    // Release answer text held back for a stop sequence that never completed.
    if (!state.stop_hold.empty()) {
      OutputDelta rest;
      rest.kind = OutputDelta::Kind::kContent;
      deltas.push_back(rest);
    }
  }
  bool ok = Deliver(event.index, deltas, observer);
  if (sample.stopped_by_sequence) sample.done = true;
  if (sample.done) {
    if (ok) ok = observer.OnSampleDone(event.index, state.unsent_logprobs);
    state.unsent_logprobs.clear();
  }
  return ok;
}

GenerationEnd Generation::Run(GenerationObserver& observer, ResponseSink* sink) {
  GenerationEnd end = GenerationEnd::kFinished;
  auto last_activity = Clock::now();
  auto cancel_seen_at = Clock::time_point{};
  while (!finished_) {
    auto event = stream_->Next(kPollInterval);
    if (!event) {
      if (sink && sink->ClientGone()) {
        end = GenerationEnd::kClientGone;
        break;
      }
      if (stream_->cancelled()) {
        // Cancelled elsewhere (cancel endpoint): the engine confirms at its next step.
        if (cancel_seen_at == Clock::time_point{}) cancel_seen_at = Clock::now();
        if (Clock::now() - cancel_seen_at > std::chrono::seconds(5)) {
          end = GenerationEnd::kCancelled;
          break;
        }
      }
      if (Clock::now() - last_activity > kIdleInterval) {
        last_activity = Clock::now();
        if (!observer.OnIdle()) {
          end = GenerationEnd::kClientGone;
          break;
        }
      }
      continue;
    }
    last_activity = Clock::now();
    usage_ = event->usage;
    if (!Consume(*event, observer) || (sink && sink->ClientGone())) {
      end = GenerationEnd::kClientGone;
      break;
    }
    bool all_done =
        std::all_of(samples_.begin(), samples_.end(), [](const SampleOutput& s) { return s.done; });
    if (all_done) {
      bool engine_finished = std::all_of(
          samples_.begin(), samples_.end(),
          [](const SampleOutput& s) { return s.engine_finish != runtime::FinishReason::kNone; });
      if (!engine_finished) stream_->Cancel();  // stop sequences ended every sample early
      finished_ = true;
    }
  }
  if (end == GenerationEnd::kFinished) {
    for (const auto& s : samples_) {
      if (s.engine_finish == runtime::FinishReason::kError) end = GenerationEnd::kError;
      if (s.engine_finish == runtime::FinishReason::kCancelled && end == GenerationEnd::kFinished)
        end = GenerationEnd::kCancelled;
    }
  }
  if (end == GenerationEnd::kClientGone || end == GenerationEnd::kCancelled) stream_->Cancel();
  finished_ = true;
  if (sink) sink->NoteTokens(usage_.prompt_tokens, usage_.completion_tokens);
  RecordOutcome(end);
  return end;
}

void Generation::RecordOutcome(GenerationEnd end) {
  metrics_.ObserveEndToEnd(Seconds(Clock::now() - spec_.arrival));
  metrics_.ObserveRequestTokens(usage_.prompt_tokens, usage_.completion_tokens);
  switch (end) {
    case GenerationEnd::kClientGone:
      metrics_.CountAborted("client_disconnect");
      metrics_.CountFinished("abort");
      return;
    case GenerationEnd::kCancelled:
      metrics_.CountAborted(stream_->cancelled() ? "cancel_endpoint" : "shutdown");
      metrics_.CountFinished("abort");
      return;
    case GenerationEnd::kError:
      metrics_.CountFinished("error");
      return;
    case GenerationEnd::kFinished:
      break;
  }
  for (const auto& s : samples_)
    metrics_.CountFinished(
        s.engine_finish == runtime::FinishReason::kLength && !s.stopped_by_sequence ? "length"
                                                                                    : "stop");
}

}  // namespace dsinfer::server
