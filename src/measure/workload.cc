#include "measure/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dsinfer::measure {
namespace {

using Json = nlohmann::json;

// splitmix64's finalizer. Hashing the (seed, level, index) triple gives every request its own
// generator state; a linear seed such as seed * K + index would repeat prompts across levels.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t RequestSeed(uint64_t seed, int level, int index) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(level)) ^ static_cast<uint64_t>(index));
}

bool ParseNumber(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return *end == '\0' && std::isfinite(*out);
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

}  // namespace

Result<LengthSpec> ParseLengthSpec(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("length '" + text + "': " + why +
                           " (expected N, uniform:LO:HI or normal:MEAN:STD)");
  };
  const std::vector<std::string> parts = Split(text, ':');
  LengthSpec spec;
  spec.text = text;
  if (parts.size() == 1) {
    if (!ParseNumber(parts[0], &spec.a) || spec.a < 1 || spec.a != std::floor(spec.a))
      return bad("N must be an integer >= 1");
    return spec;
  }
  if (parts.size() != 3) return bad("wrong number of fields");
  if (!ParseNumber(parts[1], &spec.a) || !ParseNumber(parts[2], &spec.b))
    return bad("not a number");
  if (parts[0] == "uniform") {
    spec.kind = LengthSpec::Kind::kUniform;
    if (spec.a < 1 || spec.a != std::floor(spec.a) || spec.b != std::floor(spec.b))
      return bad("LO and HI must be integers >= 1");
    if (spec.a > spec.b) return bad("LO > HI");
  } else if (parts[0] == "normal") {
    spec.kind = LengthSpec::Kind::kNormal;
    if (spec.a < 1) return bad("MEAN must be >= 1");
    if (spec.b < 0) return bad("STD must be >= 0");
  } else {
    return bad("unknown distribution '" + parts[0] + "'");
  }
  // Keep samples inside int with room for a request's other tokens.
  if (spec.a > 1e8 || spec.b > 1e8) return bad("too large");
  return spec;
}

int SampleLength(const LengthSpec& spec, std::mt19937_64& rng) {
  double v = spec.a;
  switch (spec.kind) {
    case LengthSpec::Kind::kFixed:
      break;
    case LengthSpec::Kind::kUniform:
      v = static_cast<double>(std::uniform_int_distribution<int64_t>(
          static_cast<int64_t>(spec.a), static_cast<int64_t>(spec.b))(rng));
      break;
    case LengthSpec::Kind::kNormal:
      v = std::round(std::normal_distribution<double>(spec.a, spec.b)(rng));
      break;
  }
  return static_cast<int>(std::clamp(v, 1.0, 1e9));
}

Result<std::vector<PromptEntry>> ParsePromptsJsonl(const std::string& text,
                                                   const std::string& source) {
  std::vector<PromptEntry> entries;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    auto bad = [&](const std::string& why) {
      return InvalidArgument(source + " line " + std::to_string(line_no) + ": " + why);
    };
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return bad("not valid JSON");
    if (!j.is_object()) return bad("expected a JSON object");
    PromptEntry e;
    const bool has_prompt = j.contains("prompt"), has_messages = j.contains("messages");
    if (has_prompt == has_messages) return bad("needs exactly one of \"prompt\" or \"messages\"");
    if (has_prompt) {
      const Json& p = j["prompt"];
      const bool ids =
          p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const Json& t) {
            return t.is_number_integer() && t.get<int64_t>() >= 0;
          });
      if (!(p.is_string() && !p.get<std::string>().empty()) && !ids)
        return bad("\"prompt\" must be a non-empty string or array of token ids");
      e.prompt_json = p.dump();
    } else {
      const Json& m = j["messages"];
      if (!m.is_array() || m.empty()) return bad("\"messages\" must be a non-empty array");
      for (const Json& msg : m)
        if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
          return bad("each message must be an object with a string \"role\"");
      e.chat = true;
      e.messages_json = m.dump();
    }
    if (j.contains("max_tokens")) {
      const Json& mt = j["max_tokens"];
      if (!mt.is_number_integer() || mt.get<int64_t>() < 1 || mt.get<int64_t>() > (1 << 30))
        return bad("\"max_tokens\" must be an integer >= 1");
      e.max_tokens = mt.get<int>();
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return InvalidArgument(source + ": no prompts");
  return entries;
}

Status CheckExtraBody(const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("not a JSON object");
  return Status::Ok();
}

RequestPlan PlanRequest(const WorkloadConfig& cfg, int level, int index, int num_prompts) {
  std::mt19937_64 rng(RequestSeed(cfg.seed, level, index));
  RequestPlan plan;
  Json body = {{"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true},
               {"temperature", cfg.temperature}};
  if (cfg.temperature > 0) body["seed"] = RequestSeed(cfg.seed, level, index) & 0x7fffffff;
  if (!cfg.model.empty()) body["model"] = cfg.model;
  int max_tokens = SampleLength(cfg.output_len, rng);
  if (!cfg.prompts.empty()) {
    // File order from a seeded starting line; level L continues at L * num_prompts, so levels
    // take different lines while the file has enough of them.
    const uint64_t n = cfg.prompts.size();
    const uint64_t pos =
        (Mix(cfg.seed) % n + static_cast<uint64_t>(level) * static_cast<uint64_t>(num_prompts) +
         static_cast<uint64_t>(index)) %
        n;
    const PromptEntry& e = cfg.prompts[pos];
    plan.chat = e.chat;
    if (e.chat) {
      body["messages"] = Json::parse(e.messages_json);
    } else {
      body["prompt"] = Json::parse(e.prompt_json);
    }
    if (e.max_tokens > 0) max_tokens = e.max_tokens;
  } else {
    plan.chat = cfg.chat;
    const int input_len = SampleLength(cfg.input_len, rng);
    if (cfg.chat) {
      static constexpr const char* kWords[] = {"river", "stone", "light", "paper",
                                               "cloud", "metal", "green", "quiet",
                                               "north", "table", "seven", "bread"};
      std::string text;
      for (int i = 0; i < input_len; ++i) {
        if (i) text += ' ';
        text += kWords[rng() % std::size(kWords)];
      }
      body["messages"] = Json::array({{{"role", "user"}, {"content", text}}});
    } else {
      std::uniform_int_distribution<int> id(10, std::max(11, cfg.vocab_hint - 1));
      Json ids = Json::array();
      for (int i = 0; i < input_len; ++i) ids.push_back(id(rng));
      body["prompt"] = ids;
    }
  }
  body["max_tokens"] = max_tokens;
  if (!cfg.extra_body_json.empty()) {
    // CheckExtraBody made sure it is an object.
    const Json extra = Json::parse(cfg.extra_body_json, nullptr, /*allow_exceptions=*/false);
    if (extra.is_object())
      for (const auto& [key, value] : extra.items()) body[key] = value;
  }
  plan.body = body.dump();
  return plan;
}

}  // namespace dsinfer::measure
