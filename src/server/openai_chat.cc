// POST /v1/chat/completions (OpenAI wire format, DeepSeek extras: reasoning_content,
// prompt_cache_hit_tokens / prompt_cache_miss_tokens, finish_reason "aborted"). Stream shape:
// serving-protocols.md §2.5 "Chat Completions stream" and §3.2.
#include "server/openai_result.h"
#include "server/structured_output.h"
#include "text/chat_json.h"

namespace dsinfer::server {
namespace {

Json ChatLogprobEntries(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps) {
  Json content = Json::array();
  for (const auto& lp : lps) {
    Json top = Json::array();
    for (const auto& [id, value] : lp.top)
      top.push_back(
          {{"token", TokenText(tok, id)}, {"logprob", value}, {"bytes", TokenBytes(tok, id)}});
    content.push_back({{"token", TokenText(tok, lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", TokenBytes(tok, lp.token)},
                       {"top_logprobs", top}});
  }
  return content;
}

std::string ToolCallId(const std::string& response_id, int index) {
  return "call_" + response_id + "_" + std::to_string(index);
}

// The chat result builder: per choice, the message (reasoning, content, tool calls) and the
// logprobs as they arrive; streaming, each delta is also one chunk.
class ChatResult final : public OpenAIResult {
 public:
  ChatResult(Service::Core& core, ResponseSink& sink, std::string id, StreamOptions options, int n,
             bool thinking, bool logprobs, int prompt_logprobs)
      : OpenAIResult(core, sink, std::move(id), "chat.completion", "chat.completion.chunk",
                     options),
        choices_(static_cast<size_t>(n)),
        thinking_(thinking),
        logprobs_(logprobs),
        prompt_logprobs_(prompt_logprobs) {}

  // Streaming: the head and the chunk that gives every choice its role.
  bool Begin() {
    if (!streaming()) return true;
    if (!BeginStream()) return false;
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Json delta =
          thinking_ ? Json{{"role", "assistant"}, {"content", nullptr}, {"reasoning_content", ""}}
                    : Json{{"role", "assistant"}, {"content", ""}};
      choices.push_back(ChunkChoice(static_cast<int>(i), delta, nullptr, nullptr));
    }
    return WriteChunk(choices);
  }

  bool OnDelta(int index, const OutputDelta& d,
               std::span<const runtime::TokenLogprob> lps) override {
    Choice& c = choices_[index];
    Json delta;
    switch (d.kind) {
      case OutputDelta::Kind::kReasoning:
        c.reasoning += d.text;
        delta = {{"content", nullptr}, {"reasoning_content", d.text}};
        break;
      case OutputDelta::Kind::kContent:
        c.content += d.text;
        delta = thinking_ ? Json{{"content", d.text}, {"reasoning_content", nullptr}}
                          : Json{{"content", d.text}};
        break;
      case OutputDelta::Kind::kToolCallStart:
        c.tool_calls.push_back({{"id", ToolCallId(id_, d.tool_index)},
                                {"type", "function"},
                                {"function", {{"name", d.text}, {"arguments", ""}}}});
        delta = {
            {"tool_calls", Json::array({{{"index", d.tool_index},
                                         {"id", ToolCallId(id_, d.tool_index)},
                                         {"type", "function"},
                                         {"function", {{"name", d.text}, {"arguments", ""}}}}})}};
        break;
      case OutputDelta::Kind::kToolCallArguments: {
        if (d.tool_index < 0 || d.tool_index >= static_cast<int>(c.tool_calls.size())) return true;
        Json& args = c.tool_calls[d.tool_index]["function"]["arguments"];
        args = args.get<std::string>() + d.text;
        delta = {{"tool_calls",
                  Json::array({{{"index", d.tool_index}, {"function", {{"arguments", d.text}}}}})}};
        break;
      }
    }
    return WriteChunk(Json::array({ChunkChoice(index, delta, Logprobs(c, lps), nullptr)}));
  }

  // vLLM's prompt_logprobs: a top-level field; streamed, one chunk without choices.
  bool OnPromptLogprobs(std::span<const runtime::TokenLogprob> lps) override {
    if (prompt_logprobs_ < 0) return true;
    prompt_lps_.assign(lps.begin(), lps.end());
    return WriteChunk(Json::array(),
                      Json{{"prompt_logprobs",
                            VllmPromptLogprobs(*core_.tokenizer, prompt_lps_, prompt_logprobs_)}});
  }

  bool OnSampleDone(int index, std::span<const runtime::TokenLogprob> lps) override {
    Choice& c = choices_[index];
    c.finish_reason = OpenAIFinishReason(generation_->samples()[index]);
    return WriteChunk(Json::array(
        {ChunkChoice(index, Json{{"content", ""}}, Logprobs(c, lps), c.finish_reason)}));
  }

 private:
  struct Choice {
    std::string reasoning;
    std::string content;
    Json tool_calls = Json::array();
    Json logprobs = Json::array();  // the entries of every generated token, in order
    std::string finish_reason;
  };

  static Json ChunkChoice(int index, Json delta, Json logprobs, Json finish) {
    return Json{{"index", index},
                {"delta", std::move(delta)},
                {"logprobs", std::move(logprobs)},
                {"finish_reason", std::move(finish)}};
  }

  // Records the logprobs of a chunk's tokens; returns the chunk's "logprobs" value.
  Json Logprobs(Choice& c, std::span<const runtime::TokenLogprob> lps) const {
    if (!logprobs_) return nullptr;
    Json entries = ChatLogprobEntries(*core_.tokenizer, lps);
    for (const auto& e : entries) c.logprobs.push_back(e);
    return Json{{"content", std::move(entries)}};
  }

  Json FinalChoices() const override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      Json message = {{"role", "assistant"},
                      {"content", c.content.empty() && !c.tool_calls.empty() ? Json(nullptr)
                                                                             : Json(c.content)}};
      if (thinking_) message["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) message["tool_calls"] = c.tool_calls;
      choices.push_back({{"index", i},
                         {"message", message},
                         {"logprobs", logprobs_ ? Json{{"content", c.logprobs}} : Json(nullptr)},
                         {"finish_reason", c.finish_reason}});
    }
    return choices;
  }

  void AddFields(Json& response) const override {
    if (prompt_logprobs_ >= 0)
      response["prompt_logprobs"] =
          VllmPromptLogprobs(*core_.tokenizer, prompt_lps_, prompt_logprobs_);
  }

  int64_t ReasoningTokens() const override {
    int64_t n = 0;
    for (const auto& s : generation_->samples()) n += s.reasoning_tokens;
    return n;
  }

  std::vector<Choice> choices_;
  const bool thinking_;
  const bool logprobs_;
  const int prompt_logprobs_;  // vLLM's prompt_logprobs: top alternatives; -1: not asked for
  std::vector<runtime::TokenLogprob> prompt_lps_;
};

}  // namespace

void HandleChatCompletions(Service::Core& core, const HttpRequest& request, ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  GenerationSpec spec;
  auto body = BodyForServedModel(core, request, sink, flavor);
  if (!body) return;
  auto stream_options = ParseStreamOptions(*body);
  if (!stream_options.ok()) return SendError(sink, FromStatus(stream_options.status()), flavor);
  auto n = OptInt(*body, "n");
  if (!n.ok()) return SendError(sink, FromStatus(n.status()), flavor);
  if (n->value_or(1) < 1 || n->value_or(1) > 16)
    return SendError(sink, BadRequest("n: must be in [1, 16]", "n"), flavor);
  auto logprobs = OptBool(*body, "logprobs");
  auto top_logprobs = OptInt(*body, "top_logprobs");
  if (!logprobs.ok()) return SendError(sink, FromStatus(logprobs.status()), flavor);
  if (!top_logprobs.ok()) return SendError(sink, FromStatus(top_logprobs.status()), flavor);
  if (*top_logprobs && (**top_logprobs < 0 || **top_logprobs > 20))
    return SendError(sink, BadRequest("top_logprobs: must be in [0, 20]", "top_logprobs"), flavor);
  if (*top_logprobs && !logprobs->value_or(false))
    return SendError(sink, BadRequest("top_logprobs: requires logprobs to be true", "top_logprobs"),
                     flavor);
  auto prompt_logprobs = OptInt(*body, "prompt_logprobs");
  if (!prompt_logprobs.ok()) return SendError(sink, FromStatus(prompt_logprobs.status()), flavor);
  if (*prompt_logprobs && (**prompt_logprobs < 0 || **prompt_logprobs > 20))
    return SendError(sink, BadRequest("prompt_logprobs: must be in [0, 20]", "prompt_logprobs"),
                     flavor);
  auto max_tokens = OptInt(*body, "max_completion_tokens");
  if (max_tokens.ok() && !*max_tokens) max_tokens = OptInt(*body, "max_tokens");
  if (!max_tokens.ok()) return SendError(sink, FromStatus(max_tokens.status()), flavor);
  auto stops = StopSequences(*body, "stop");
  if (!stops.ok()) return SendError(sink, BadRequest(stops.status().message(), "stop"), flavor);
  Status sampling = ParseGenerationFields(*body, &spec);
  if (!sampling.ok()) return SendError(sink, FromStatus(sampling), flavor);

  auto chat =
      text::ChatRequestFromJsonValue(*body, core.model.version, core.options.default_thinking);
  if (!chat.ok()) return SendError(sink, FromStatus(chat.status()), flavor);
  auto encoded = core.EncodeChat(*chat);
  if (!encoded.ok()) return SendError(sink, FromStatus(encoded.status()), flavor);
  auto resolved_max =
      core.ResolveMaxTokens(*max_tokens, encoded->ids.size(), core.DefaultMaxTokens(*encoded));
  if (!resolved_max.ok()) return SendError(sink, FromStatus(resolved_max.status()), flavor);

  auto parallel_calls = OptBool(*body, "parallel_tool_calls");
  if (!parallel_calls.ok()) return SendError(sink, FromStatus(parallel_calls.status()), flavor);
  auto tool_grammar = ToolCallGrammarSpec(
      *chat, encoded->forced_tool_call ? ToolCallForcing::kPromptOpened : ToolCallForcing::kNone,
      parallel_calls->value_or(true));
  if (!tool_grammar.ok()) return SendError(sink, FromStatus(tool_grammar.status()), flavor);
  Status structured = AttachStructuredOutput(core, *body, encoded->thinking, &spec,
                                             std::move(*tool_grammar));
  if (!structured.ok()) return SendError(sink, FromStatus(structured), flavor);

  const std::string id = NewId("chatcmpl-");
  spec.params.prompt = std::move(encoded->ids);
  spec.params.max_tokens = *resolved_max;
  spec.params.n = static_cast<int>(n->value_or(1));
  spec.params.top_logprobs =
      logprobs->value_or(false) ? static_cast<int>(top_logprobs->value_or(0)) : -1;
  spec.params.request_id = id;
  const int spec_prompt_logprobs =
      prompt_logprobs->has_value() ? static_cast<int>(**prompt_logprobs) : -1;
  spec.params.prompt_logprobs = spec_prompt_logprobs;
  spec.thinking = encoded->thinking;
  spec.parse_tools = encoded->has_tools;
  spec.forced_tool_call = encoded->forced_tool_call;
  spec.json_output = encoded->json_output;
  spec.stop = std::move(*stops);
  auto kv_transfer = PrepareKvTransfer(core, *body, stream_options->stream, &spec.params, sink);
  if (!kv_transfer) return;
  auto generation =
      Generation::Start(*core.engine.load(), *core.tokenizer, core.metrics, std::move(spec));
  if (!generation.ok()) return SendError(sink, FromStatus(generation.status()), flavor);
  ChatResult result(core, sink, id, *stream_options,
                    static_cast<int>((*generation)->samples().size()), encoded->thinking,
                    logprobs->value_or(false), prompt_logprobs->has_value());
  result.set_generation(generation->get());
  if (!result.Begin()) return;
  const GenerationEnd end = (*generation)->Run(result, &sink);
  if (!AddKvTransferParams(core, *kv_transfer, **generation, end, result, sink)) return;
  result.Finish(end);
}

}  // namespace dsinfer::server
