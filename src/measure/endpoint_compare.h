// `dsinfer compare endpoints`: sends the same greedy (temperature 0) requests with top-k logprobs
// to two OpenAI-compatible endpoints that serve the same checkpoint, turns each response into a
// TokenStep sequence and compares them position by position (CompareSequences, compare.h).
//
// Both OpenAI response shapes are read:
//   /v1/completions       choices[0].logprobs.{tokens[], token_logprobs[], top_logprobs[{text:lp}]}
//   /v1/chat/completions  choices[0].logprobs.content[].{token, logprob, top_logprobs[{token,
//                         logprob}]}
// Requests are non-streaming and one at a time per side (A and B of a prompt run concurrently), so
// the comparison measures numerics, not scheduling. JSON stays inside this layer: the CLI gets
// serialized text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "measure/compare.h"
#include "measure/http_client.h"

namespace dsinfer::measure {

enum class EndpointKind { kCompletions, kChat };

struct EndpointSide {
  Url url;
  std::string api_key;  // "" -> no Authorization header
  std::string model;    // "" -> omitted from the request
};

// One prompt. Completions send `text` or `ids`; chat sends `messages_json` (a serialized messages
// array) or, when that is empty, `text` as one user message.
struct ComparePrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::string messages_json;
};

// JSON lines, one object per line (blank lines skipped): {"prompt": "text"} or {"prompt": [ids]}
// or {"messages": [...]} (chat only). Errors name the line.
Result<std::vector<ComparePrompt>> LoadPromptsJsonl(const std::string& path, EndpointKind kind);

// Deterministic synthetic prompts (seed, index): completions get `input_len` token ids drawn from
// [10, vocab_hint); chat gets `input_len` words.
std::vector<ComparePrompt> SyntheticPrompts(int count, int input_len, uint64_t seed,
                                            EndpointKind kind, int vocab_hint);

struct GreedyRequestOptions {
  EndpointKind kind = EndpointKind::kCompletions;
  int max_tokens = 16;
  int top_logprobs = 5;
  bool ignore_eos = false;  // vLLM/SGLang/dsinfer extension: both sides generate max_tokens
  double timeout_s = 600;
};

// The request body for one side (temperature 0, logprobs on, non-streaming).
std::string GreedyRequestBody(const ComparePrompt& prompt, const std::string& model,
                              const GreedyRequestOptions& options);

// A response body -> one TokenStep per generated token. A missing logprobs object is an error
// (the endpoint ignored the request's logprobs); a null logprob (what a JSON encoder writes for
// -inf) reads as -9999, OpenAI's own floor value.
Result<std::vector<TokenStep>> ParseGreedyResponse(std::string_view body, EndpointKind kind);

// Sends one request and parses the answer; a non-2xx status is an error carrying the body.
Result<std::vector<TokenStep>> FetchGreedy(const EndpointSide& side, const ComparePrompt& prompt,
                                           const GreedyRequestOptions& options);

struct PromptComparison {
  int index = 0;
  std::string error;  // a request/parse failure of either side; the comparison is then empty
  int64_t tokens_a = 0, tokens_b = 0;
  SequenceComparison result;
  // At a divergence where B's token is in A's top-k: A's logprob of its own token minus A's
  // logprob of B's token (the near-tie test's left side); -1 otherwise.
  double divergence_margin_a = -1;
};

struct EndpointComparison {
  std::vector<PromptComparison> prompts;
  int failed = 0, errors = 0;
  bool pass() const { return failed == 0 && errors == 0; }
  std::string reason;  // the first failing or erroring prompt, "prompt I: ..."; empty on pass
};

// Runs every prompt on both sides and compares. progress (optional) sees (done, total).
EndpointComparison CompareEndpoints(const EndpointSide& a, const EndpointSide& b,
                                    const std::vector<ComparePrompt>& prompts,
                                    const GreedyRequestOptions& options,
                                    const CompareThresholds& thresholds,
                                    const std::function<void(int, int)>& progress = nullptr);

// Adds the comparison of prompt `index` to `out` (counts and the overall reason included). Used by
// CompareEndpoints; public so the report logic can be tested without a server. A side with an
// empty top-k at some position while `top_logprobs` > 0 was asked for makes the prompt an error:
// its logprobs cannot be compared.
void AddPromptComparison(int index, std::vector<TokenStep> a, std::vector<TokenStep> b,
                         int top_logprobs, const CompareThresholds& thresholds,
                         EndpointComparison* out);

// The JSON report: thresholds, per-prompt results, overall verdict.
std::string EndpointComparisonJson(const EndpointSide& a, const EndpointSide& b,
                                   const GreedyRequestOptions& options,
                                   const CompareThresholds& thresholds,
                                   const EndpointComparison& comparison);
// A short human-readable table of the same.
std::string EndpointComparisonText(const CompareThresholds& thresholds,
                                   const EndpointComparison& comparison);

}  // namespace dsinfer::measure
