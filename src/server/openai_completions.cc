// POST /v1/completions (OpenAI's legacy text completions: the prompt as given, no chat template,
// no output parsing). Stream shape: serving-protocols.md §3.2.
#include "server/openai_result.h"

namespace dsinfer::server {
namespace {

// The /v1/completions prompt: a string, token ids, or a one-element array of either.
Result<std::vector<int32_t>> CompletionPrompt(const Service::Core& core, const Json& body,
                                              std::string* text) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return InvalidArgument("prompt: required");
  Json prompt = *it;
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = prompt[0];
  std::vector<int32_t> ids;
  if (prompt.is_string()) {
    *text = prompt.get<std::string>();
    // No chat template here: the caller writes the whole prompt, special tokens included.
    DSINFER_ASSIGN_OR_RETURN(ids, core.tokenizer->Encode(*text, /*allow_special=*/true));
    auto bos = core.tokenizer->bos_id();
    if (bos && (ids.empty() || ids[0] != *bos)) ids.insert(ids.begin(), *bos);
    return ids;
  }
  if (prompt.is_array()) {
    for (const auto& t : prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= core.tokenizer->vocab_size())
        return InvalidArgument("prompt: token ids must be integers in the vocabulary");
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    if (ids.empty()) return InvalidArgument("prompt: must not be empty");
    DSINFER_ASSIGN_OR_RETURN(*text, core.tokenizer->Decode(ids));
    return ids;
  }
  return InvalidArgument(
      "prompt: must be a string, an array of token ids, or a one-element array of either");
}

// The legacy logprobs object of a run of tokens whose text starts at byte `offset` of the
// choice's text.
Json CompletionLogprobs(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps,
                        size_t offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  for (const auto& lp : lps) {
    std::string t = TokenText(tok, lp.token);
    tokens.push_back(t);
    token_logprobs.push_back(lp.logprob);
    Json alternatives = Json::object();
    for (const auto& [id, value] : lp.top) alternatives[TokenText(tok, id)] = value;
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += t.size();
  }
  return Json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top},
              {"text_offset", offsets}};
}

// Appends the entries of `part` to the legacy logprobs object `all`.
void AppendLogprobs(Json& all, const Json& part) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const auto& v : part[key]) all[key].push_back(v);
}

// The completions result builder: per choice, the text (the echoed prompt first) and the legacy
// logprobs as they arrive; streaming, each delta is also one chunk.
class CompletionResult final : public OpenAIResult {
 public:
  CompletionResult(Service::Core& core, ResponseSink& sink, std::string id, StreamOptions options,
                   int n, bool logprobs)
      : OpenAIResult(core, sink, std::move(id), "text_completion", "text_completion", options),
        choices_(static_cast<size_t>(n)),
        logprobs_(logprobs) {
    for (auto& c : choices_) c.logprobs = CompletionLogprobs(*core_.tokenizer, {}, 0);
  }

  // Streaming: the head; with echo, the prompt text as every choice's first piece.
  bool Begin(const std::string* echo) {
    if (streaming() && !BeginStream()) return false;
    if (!echo) return true;
    OutputDelta d;
    d.text = *echo;
    for (size_t i = 0; i < choices_.size(); ++i)
      if (!OnDelta(static_cast<int>(i), d, {})) return false;
    return true;
  }

  bool OnDelta(int index, const OutputDelta& d,
               std::span<const runtime::TokenLogprob> lps) override {
    Choice& c = choices_[index];
    Json lp = Logprobs(c, lps);
    c.text += d.text;
    return WriteChunk(Json::array(
        {{{"index", index}, {"text", d.text}, {"logprobs", lp}, {"finish_reason", nullptr}}}));
  }

  bool OnSampleDone(int index, std::span<const runtime::TokenLogprob> lps) override {
    Choice& c = choices_[index];
    c.finish_reason = OpenAIFinishReason(generation_->samples()[index]);
    Json lp = Logprobs(c, lps);
    return WriteChunk(Json::array(
        {{{"index", index}, {"text", ""}, {"logprobs", lp}, {"finish_reason", c.finish_reason}}}));
  }

 private:
  struct Choice {
    std::string text;
    Json logprobs;  // legacy format, every token so far
    std::string finish_reason;
  };

  // Records the logprobs of a chunk's tokens (their text starts where the choice's text ends);
  // returns the chunk's "logprobs" value.
  Json Logprobs(Choice& c, std::span<const runtime::TokenLogprob> lps) const {
    if (!logprobs_) return nullptr;
    Json part = CompletionLogprobs(*core_.tokenizer, lps, c.text.size());
    AppendLogprobs(c.logprobs, part);
    return part;
  }

  Json FinalChoices() const override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      choices.push_back({{"index", i},
                         {"text", c.text},
                         {"logprobs", logprobs_ ? c.logprobs : Json(nullptr)},
                         {"finish_reason", c.finish_reason}});
    }
    return choices;
  }

  std::vector<Choice> choices_;
  const bool logprobs_;
};

}  // namespace

void HandleCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  GenerationSpec spec;
  auto body = ParseBody(request.body);
  if (!body.ok()) return SendError(sink, FromStatus(body.status()), flavor);
  auto model = OptString(*body, "model");
  if (!model.ok()) return SendError(sink, FromStatus(model.status()), flavor);
  if (!core.KnownModel(*model, flavor)) return SendError(sink, core.UnknownModel(**model), flavor);
  if (body->contains("suffix") && !(*body)["suffix"].is_null())
    return SendError(
        sink, Unsupported("suffix (fill-in-the-middle) is not supported by this model", "suffix"),
        flavor);
  auto stream_options = ParseStreamOptions(*body);
  if (!stream_options.ok()) return SendError(sink, FromStatus(stream_options.status()), flavor);
  auto n = OptInt(*body, "n");
  if (!n.ok()) return SendError(sink, FromStatus(n.status()), flavor);
  if (n->value_or(1) < 1 || n->value_or(1) > 16)
    return SendError(sink, BadRequest("n: must be in [1, 16]", "n"), flavor);
  auto logprobs = OptInt(*body, "logprobs");
  if (!logprobs.ok()) return SendError(sink, FromStatus(logprobs.status()), flavor);
  if (*logprobs && (**logprobs < 0 || **logprobs > 20))
    return SendError(sink, BadRequest("logprobs: must be in [0, 20]", "logprobs"), flavor);
  auto echo = OptBool(*body, "echo");
  if (!echo.ok()) return SendError(sink, FromStatus(echo.status()), flavor);
  auto max_tokens = OptInt(*body, "max_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  auto stops = StopSequences(*body, "stop");
  if (!stops.ok()) return SendError(sink, BadRequest(stops.status().message(), "stop"), flavor);
  Status sampling = ParseSampling(*body, &spec.params);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);
  std::string prompt_text;
  auto ids = CompletionPrompt(core, *body, &prompt_text);
  if (!ids.ok()) return SendError(sink, BadRequest(ids.status().message(), "prompt"), flavor);
  if (core.model.max_model_len > 0 && static_cast<int64_t>(ids->size()) >= core.model.max_model_len)
    return SendError(sink,
                     FromStatus(OutOfRange("the prompt has " + std::to_string(ids->size()) +
                                           " tokens; the maximum context length is " +
                                           std::to_string(core.model.max_model_len))),
                     flavor);
  auto resolved_max = core.ResolveMaxTokens(
      max_tokens->has_value() ? *max_tokens : std::optional<int64_t>(16), ids->size());
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);

  const std::string id = NewId("cmpl-");
  spec.params.prompt = std::move(*ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.n = static_cast<int>(n->value_or(1));
  spec.params.top_logprobs = logprobs->has_value() ? static_cast<int>(**logprobs) : -1;
  spec.params.request_id = id;
  spec.raw_text = true;
  spec.stop = std::move(*stops);
  auto skip_special = OptBool(*body, "skip_special_tokens");
  if (!skip_special.ok()) return SendError(sink, FromStatus(skip_special.status()), flavor);
  spec.skip_special_tokens = skip_special->value_or(true);
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  CompletionResult result(core, sink, id, *stream_options,
                          static_cast<int>((*generation)->samples().size()), logprobs->has_value());
  result.set_generation(generation->get());
  if (!result.Begin(echo->value_or(false) ? &prompt_text : nullptr)) return;
  result.Finish((*generation)->Run(result, &sink));
}

}  // namespace dsinfer::server
