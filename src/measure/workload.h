// What `bench serve` sends: length distributions (`N` | `uniform:LO:HI` | `normal:MEAN:STD`), a
// prompts file (JSONL, one {"prompt": ...} or {"messages": [...]} per line), and the request body
// of each (level, request index). Every body is a pure function of (seed, level, index), and the
// synthetic prompts of different levels and requests are different token sequences, so a
// server's prefix cache cannot turn a later level into a cache-hit benchmark.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsinfer::measure {

// A token-count distribution, sampled per request with the request's own seeded generator.
struct LengthSpec {
  enum class Kind { kFixed, kUniform, kNormal };
  Kind kind = Kind::kFixed;
  double a = 1;      // fixed: N; uniform: LO; normal: MEAN
  double b = 0;      // uniform: HI; normal: STD
  std::string text;  // as given, for the report
};
// "32", "uniform:16:64" (inclusive integers), "normal:32:8" (rounded). All values >= 1 except
// STD >= 0; LO <= HI.
Result<LengthSpec> ParseLengthSpec(const std::string& text);
// A sample, clipped to >= 1 (a normal's tail below 1 becomes 1).
int SampleLength(const LengthSpec& spec, std::mt19937_64& rng);

// One line of a prompts file. Exactly one of prompt/messages_json is set.
struct PromptEntry {
  bool chat = false;          // {"messages": [...]} -> /v1/chat/completions
  std::string prompt_json;    // completions: the "prompt" value (a string or an id array), JSON
  std::string messages_json;  // chat: the "messages" array, JSON
  int max_tokens = 0;         // 0: use --output-len
};
// The file's text -> entries. Blank lines are skipped; a bad line is an InvalidArgument naming
// `source` and the 1-based line number. An empty file is an error.
Result<std::vector<PromptEntry>> ParsePromptsJsonl(const std::string& text,
                                                   const std::string& source);

struct WorkloadConfig {
  std::string model;  // "" -> omitted from the request
  bool chat = false;  // synthetic prompts: /v1/chat/completions instead of /v1/completions
  LengthSpec input_len{LengthSpec::Kind::kFixed, 32, 0, "32"};   // completions: ids; chat: words
  LengthSpec output_len{LengthSpec::Kind::kFixed, 16, 0, "16"};  // max_tokens, with ignore_eos
  int vocab_hint = 1000;  // synthetic token ids are drawn from [10, vocab_hint)
  uint64_t seed = 0;
  // 0: greedy. Above 0 each request also carries a seed of its own (from seed, level and
  // index), so a sampled run repeats; sampling has a cost of its own on the engine thread.
  double temperature = 0.0;
  std::vector<PromptEntry> prompts;  // non-empty: requests take these instead of synthetic ones
  std::string prompts_source;        // the prompts file's path, for the report
  // A JSON object whose fields every request also carries (e.g. a structured-output constraint:
  // {"response_format": {...}}), set over the generated ones; "" for none. CheckExtraBody checks
  // it.
  std::string extra_body_json;
};

// --extra-body: InvalidArgument unless `text` is a JSON object.
Status CheckExtraBody(const std::string& text);

struct RequestPlan {
  bool chat = false;
  std::string body;  // the JSON request body, streaming with usage
};
// Request `index` of level `level` (0-based position in the --concurrency list). With a prompts
// file, requests take the lines in file order from a seeded start, level L from L * num_prompts
// on (wrapping), so levels use different lines while the file has enough of them.
RequestPlan PlanRequest(const WorkloadConfig& cfg, int level, int index, int num_prompts);

}  // namespace dsinfer::measure
