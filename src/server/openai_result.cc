#include "server/openai_result.h"

namespace dsinfer::server {

Result<StreamOptions> ParseStreamOptions(const Json& body) {
  StreamOptions out;
  DSINFER_ASSIGN_OR_RETURN(auto stream, OptBool(body, "stream"));
  out.stream = stream.value_or(false);
  auto it = body.find("stream_options");
  if (it != body.end() && !it->is_null()) {
    if (!out.stream) return InvalidArgument("stream_options: only allowed when stream is true");
    if (!it->is_object()) return InvalidArgument("stream_options: must be an object");
    DSINFER_ASSIGN_OR_RETURN(auto usage, OptBool(*it, "include_usage"));
    DSINFER_ASSIGN_OR_RETURN(auto continuous, OptBool(*it, "continuous_usage_stats"));
    out.include_usage = usage.value_or(false);
    out.continuous_usage = continuous.value_or(false);
    if (out.continuous_usage && !out.include_usage)
      return InvalidArgument(
          "stream_options.continuous_usage_stats: requires stream_options.include_usage");
  }
  return out;
}

std::string OpenAIFinishReason(const SampleOutput& s) {
  if (s.stopped_by_sequence) return "stop";
  switch (s.engine_finish) {
    case runtime::FinishReason::kLength:
      return "length";
    case runtime::FinishReason::kCancelled:
      return "aborted";
    case runtime::FinishReason::kError:
      return "error";
    default:
      return s.tool_calls == 0 ? "stop" : "tool_calls";
  }
}

Json OpenAIUsage(const runtime::Usage& u, int64_t reasoning_tokens) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
              {"prompt_cache_hit_tokens", u.cached_prompt_tokens},
              {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_prompt_tokens}};
}

Json VllmPromptLogprobs(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps,
                        int top_k) {
  Json out = Json::array({nullptr});  // the first prompt token has nothing before it
  for (const auto& lp : lps) {
    Json entry = Json::object();
    auto add = [&](int32_t id, float logprob, std::optional<int> rank) {
      const std::string key = std::to_string(id);
      if (entry.contains(key)) return;
      entry[key] = {{"logprob", logprob},
                    {"rank", rank ? Json(*rank) : Json(nullptr)},
                    {"decoded_token", TokenText(tok, id)}};
    };
    const size_t n = std::min(lp.top.size(), static_cast<size_t>(std::max(0, top_k)));
    std::optional<int> rank;
    for (size_t k = 0; k < n; ++k)
      if (lp.top[k].first == lp.token) rank = static_cast<int>(k) + 1;
    add(lp.token, lp.logprob, rank);
    for (size_t k = 0; k < n; ++k) add(lp.top[k].first, lp.top[k].second, static_cast<int>(k) + 1);
    out.push_back(std::move(entry));
  }
  return out;
}

OpenAIResult::OpenAIResult(Service::Core& core, ResponseSink& sink, std::string id,
                           std::string object, std::string chunk_object, StreamOptions options)
    : core_(core),
      id_(std::move(id)),
      sink_(sink),
      object_(std::move(object)),
      chunk_object_(std::move(chunk_object)),
      options_(options),
      created_(UnixNow()) {}

Json OpenAIResult::Envelope(const std::string& object, Json choices) const {
  return Json{{"id", id_},
              {"object", object},
              {"created", created_},
              {"model", core_.options.served_model_name},
              {"system_fingerprint", "fp_dsinfer"},
              {"choices", std::move(choices)}};
}

bool OpenAIResult::BeginStream() {
  return sink_.BeginStream(200, "text/event-stream", SseHeaders(id_));
}

bool OpenAIResult::OnIdle() { return !streaming() || sink_.WriteChunk(": keep-alive\n\n"); }

bool OpenAIResult::WriteChunk(Json choices, const Json& extra) {
  if (!streaming()) return true;
  Json chunk = Envelope(chunk_object_, std::move(choices));
  if (extra.is_object())
    for (const auto& [key, value] : extra.items()) chunk[key] = value;
  if (options_.include_usage) {
    // OpenAI's stream carries "usage": null until the last chunk; vLLM's continuous usage
    // reports the running counts in every chunk instead.
    chunk["usage"] = nullptr;
    if (options_.continuous_usage && generation_) {
      const runtime::Usage u = ReportedUsage();
      chunk["usage"] = {{"prompt_tokens", u.prompt_tokens},
                        {"completion_tokens", u.completion_tokens},
                        {"total_tokens", u.prompt_tokens + u.completion_tokens}};
    }
  }
  return sink_.WriteChunk(SseData(chunk));
}

Json OpenAIResult::Response() const {
  Json response = Envelope(object_, FinalChoices());
  AddFields(response);
  for (const auto& [key, value] : extra_.items()) response[key] = value;
  response["usage"] = OpenAIUsage(ReportedUsage(), ReasoningTokens());
  return response;
}

void OpenAIResult::Finish(GenerationEnd end) {
  if (end == GenerationEnd::kClientGone) return;
  if (!streaming()) {
    if (end == GenerationEnd::kError)
      return SendError(sink_, GenerationFailed(generation_->error()), ApiFlavor::kOpenAI);
    return SendJson(sink_, 200, Response(), {{"x-request-id", id_}});
  }
  if (end == GenerationEnd::kError) {
    sink_.WriteChunk(
        SseData(ErrorBody(GenerationFailed(generation_->error()), ApiFlavor::kOpenAI)));
  } else if (options_.include_usage) {
    Json chunk = Envelope(chunk_object_, Json::array());
    chunk["usage"] = OpenAIUsage(ReportedUsage(), ReasoningTokens());
    sink_.WriteChunk(SseData(chunk));
  }
  sink_.WriteChunk("data: [DONE]\n\n");
  sink_.EndStream();
}

}  // namespace dsinfer::server
