// POST /v1/completions (OpenAI's legacy text completions: the prompt as given, no chat template,
// no output parsing). Stream shape: serving-protocols.md §3.2.
#include <optional>

#include "server/openai_result.h"
#include "server/structured_output.h"

namespace dsinfer::server {

// The /v1/completions prompt: a string, token ids, or a one-element array of either.
Result<std::vector<int32_t>> CompletionPrompt(const Service::Core& core, const Json& body,
                                              std::string* text, bool* bos_inserted) {
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
    *bos_inserted = bos && (ids.empty() || ids[0] != *bos);
    if (*bos_inserted) ids.insert(ids.begin(), *bos);
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

namespace {

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

// What the completions result echoes of the prompt.
struct Echo {
  std::string text;           // the prompt as the client wrote it (or decoded from its ids)
  std::vector<int32_t> ids;   // the prompt as the engine saw it
  bool bos_inserted = false;  // ids[0] is a BOS the server added: it has no text in `text`
};

// The completions result builder: per choice, the text (the echoed prompt first) and the legacy
// logprobs as they arrive; streaming, each delta is also one chunk. With echo and logprobs the
// echoed prompt waits for the prompt's logprobs, which come with the engine's first event.
class CompletionResult final : public OpenAIResult {
 public:
  struct Options {
    int logprobs = -1;  // legacy logprobs (top alternatives) of the output and an echoed prompt
    std::optional<Echo> echo;
    int prompt_logprobs = -1;  // vLLM's prompt_logprobs field (top alternatives)
    bool hide_output = false;  // max_tokens 0: the prompt is scored, nothing is generated
  };
  CompletionResult(Service::Core& core, ResponseSink& sink, std::string id, StreamOptions stream,
                   int n, Options options)
      : OpenAIResult(core, sink, std::move(id), "text_completion", "text_completion", stream),
        choices_(static_cast<size_t>(n)),
        options_(std::move(options)) {
    for (auto& c : choices_) c.logprobs = CompletionLogprobs(*core_.tokenizer, {}, 0);
  }

  bool Begin() {
    if (streaming() && !BeginStream()) return false;
    return WaitsForPromptLogprobs() || FlushEcho();
  }

  bool OnPromptLogprobs(std::span<const runtime::TokenLogprob> lps) override {
    prompt_lps_.assign(lps.begin(), lps.end());
    return FlushEcho();
  }

  bool OnDelta(int index, const OutputDelta& d,
               std::span<const runtime::TokenLogprob> lps) override {
    if (!FlushEcho()) return false;
    if (options_.hide_output) return true;
    Choice& c = choices_[index];
    Json lp = Logprobs(c, lps);
    c.text += d.text;
    return WriteChunk(Json::array({Chunk(index, d.text, lp, nullptr)}));
  }

  bool OnSampleDone(int index, std::span<const runtime::TokenLogprob> lps) override {
    if (!FlushEcho()) return false;
    Choice& c = choices_[index];
    c.finish_reason = OpenAIFinishReason(generation_->samples()[index]);
    Json lp = options_.hide_output ? Json(nullptr) : Logprobs(c, lps);
    return WriteChunk(Json::array({Chunk(index, "", lp, c.finish_reason)}));
  }

 private:
  struct Choice {
    std::string text;
    Json logprobs;  // legacy format, every token so far
    std::string finish_reason;
  };

  bool WaitsForPromptLogprobs() const {
    return (options_.prompt_logprobs >= 0 || (options_.echo && options_.logprobs >= 0)) &&
           prompt_lps_.empty() && !echoed_;
  }

  Json Chunk(int index, const std::string& text, Json logprobs, Json finish) const {
    Json choice = {{"index", index},
                   {"text", text},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", std::move(finish)}};
    if (options_.prompt_logprobs >= 0 && !echoed_)
      choice["prompt_logprobs"] =
          VllmPromptLogprobs(*core_.tokenizer, prompt_lps_, options_.prompt_logprobs);
    return choice;
  }

  // Every choice's first piece: the echoed prompt with its logprobs (null for the first token,
  // whose offset is 0), and vLLM's prompt_logprobs. Once; later calls do nothing.
  bool FlushEcho() {
    if (echoed_) return true;
    Json chunks = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      Json lp = nullptr;
      std::string text;
      if (options_.echo) {
        text = options_.echo->text;
        if (options_.logprobs >= 0) lp = EchoLogprobs();
        if (lp.is_object()) AppendLogprobs(c.logprobs, lp);
        c.text += text;
      }
      if (options_.echo || options_.prompt_logprobs >= 0)
        chunks.push_back(Chunk(static_cast<int>(i), text, lp, nullptr));
    }
    const bool ok = chunks.empty() || WriteChunk(chunks);
    echoed_ = true;
    return ok;
  }

  // The legacy logprobs of the echoed prompt's tokens.
  Json EchoLogprobs() const {
    const Echo& e = *options_.echo;
    const text::Tokenizer& tok = *core_.tokenizer;
    Json out = CompletionLogprobs(tok, {}, 0);
    size_t offset = 0;
    for (size_t i = 0; i < e.ids.size(); ++i) {
      const std::string t = TokenText(tok, e.ids[i]);
      out["tokens"].push_back(t);
      out["text_offset"].push_back(offset);
      if (!(i == 0 && e.bos_inserted)) offset += t.size();
      const runtime::TokenLogprob* lp =
          i > 0 && i - 1 < prompt_lps_.size() ? &prompt_lps_[i - 1] : nullptr;
      out["token_logprobs"].push_back(lp ? Json(lp->logprob) : Json(nullptr));
      Json top = nullptr;
      if (lp) {
        top = Json::object();
        for (size_t k = 0; k < lp->top.size() && k < static_cast<size_t>(options_.logprobs); ++k)
          top[TokenText(tok, lp->top[k].first)] = lp->top[k].second;
      }
      out["top_logprobs"].push_back(top);
    }
    return out;
  }

  // Records the logprobs of a chunk's tokens (their text starts where the choice's text ends);
  // returns the chunk's "logprobs" value.
  Json Logprobs(Choice& c, std::span<const runtime::TokenLogprob> lps) const {
    if (options_.logprobs < 0) return nullptr;
    Json part = CompletionLogprobs(*core_.tokenizer, lps, c.text.size());
    AppendLogprobs(c.logprobs, part);
    return part;
  }

  Json FinalChoices() const override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      Json choice = {{"index", i},
                     {"text", c.text},
                     {"logprobs", options_.logprobs >= 0 ? c.logprobs : Json(nullptr)},
                     {"finish_reason", c.finish_reason}};
      if (options_.prompt_logprobs >= 0)
        choice["prompt_logprobs"] =
            VllmPromptLogprobs(*core_.tokenizer, prompt_lps_, options_.prompt_logprobs);
      choices.push_back(std::move(choice));
    }
    return choices;
  }

  runtime::Usage ReportedUsage() const override {
    runtime::Usage u = generation_->usage();
    if (options_.hide_output) u.completion_tokens = 0;
    return u;
  }

  std::vector<Choice> choices_;
  const Options options_;
  std::vector<runtime::TokenLogprob> prompt_lps_;
  bool echoed_ = false;
};

}  // namespace

void HandleCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  GenerationSpec spec;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body) return;
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
  auto prompt_logprobs = OptInt(*body, "prompt_logprobs");
  if (!prompt_logprobs.ok()) return SendError(sink, FromStatus(prompt_logprobs.status()), flavor);
  if (*prompt_logprobs && (**prompt_logprobs < 0 || **prompt_logprobs > 20))
    return SendError(sink, BadRequest("prompt_logprobs: must be in [0, 20]", "prompt_logprobs"),
                     flavor);
  auto max_tokens = OptInt(*body, "max_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  // max_tokens 0 scores the prompt only (lm-eval's loglikelihood): it needs echo, and the one
  // token the engine must generate is not returned.
  const bool hide_output = max_tokens->has_value() && **max_tokens == 0;
  if (hide_output && !echo->value_or(false))
    return SendError(sink, BadRequest("max_tokens: 0 is only allowed with echo", "max_tokens"),
                     flavor);
  auto stops = StopSequences(*body, "stop");
  if (!stops.ok()) return SendError(sink, BadRequest(stops.status().message(), "stop"), flavor);
  Status sampling = ParseGenerationFields(*body, &spec);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);
  std::string prompt_text;
  bool bos_inserted = false;
  auto ids = CompletionPrompt(core, *body, &prompt_text, &bos_inserted);
  if (!ids.ok()) return SendError(sink, BadRequest(ids.status().message(), "prompt"), flavor);
  if (core.model.max_model_len > 0 && static_cast<int64_t>(ids->size()) >= core.model.max_model_len)
    return SendError(sink,
                     FromStatus(OutOfRange("the prompt has " + std::to_string(ids->size()) +
                                           " tokens; the maximum context length is " +
                                           std::to_string(core.model.max_model_len))),
                     flavor);
  auto resolved_max = core.ResolveMaxTokens(
      hide_output ? std::optional<int64_t>(1)
                  : (max_tokens->has_value() ? *max_tokens : std::optional<int64_t>(16)),
      ids->size(), /*default_tokens=*/16);
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);

  Status structured = AttachStructuredOutput(core, *body, /*thinking=*/false, &spec);
  if (!structured.ok()) return SendError(sink, FromStatus(structured), flavor);

  const std::string id = NewId("cmpl-");
  CompletionResult::Options options;
  options.logprobs = logprobs->has_value() ? static_cast<int>(**logprobs) : -1;
  options.prompt_logprobs = prompt_logprobs->has_value() ? static_cast<int>(**prompt_logprobs) : -1;
  options.hide_output = hide_output;
  if (echo->value_or(false)) options.echo = Echo{prompt_text, *ids, bos_inserted};
  // The prompt's logprobs: for an echo with logprobs, and for vLLM's prompt_logprobs.
  int prompt_k = -1;
  if (options.echo) prompt_k = options.logprobs;
  prompt_k = std::max(prompt_k, options.prompt_logprobs);
  spec.params.prompt_logprobs = prompt_k;
  spec.params.prompt = std::move(*ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.n = static_cast<int>(n->value_or(1));
  spec.params.top_logprobs = logprobs->has_value() ? static_cast<int>(**logprobs) : -1;
  spec.params.request_id = id;
  spec.raw_text = true;
  spec.stop = std::move(*stops);
  auto kv_transfer = PrepareKvTransfer(core, *body, stream_options->stream, &spec.params, sink);
  if (!kv_transfer) return;
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  CompletionResult result(core, sink, id, *stream_options,
                          static_cast<int>((*generation)->samples().size()), std::move(options));
  result.set_generation(generation->get());
  if (!result.Begin()) return;
  const GenerationEnd end = (*generation)->Run(result, &sink);
  if (!AddKvTransferParams(core, *kv_transfer, **generation, end, result, sink)) return;
  result.Finish(end);
}

}  // namespace dsinfer::server
