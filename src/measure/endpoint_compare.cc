#include "measure/endpoint_compare.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>

namespace dsinfer::measure {
namespace {

using Json = nlohmann::json;

// OpenAI reports logprobs it cannot represent as -9999; JSON has no -inf (nlohmann writes null).
constexpr double kLogprobFloor = -9999.0;

Result<double> LogprobValue(const Json& v, const std::string& where) {
  if (v.is_null()) return kLogprobFloor;
  if (!v.is_number()) return InvalidArgument(where + ": logprob must be a number");
  const double d = v.get<double>();
  if (std::isnan(d)) return InvalidArgument(where + ": logprob is NaN");
  return std::max(d, kLogprobFloor);
}

Result<std::vector<TokenStep>> ParseCompletionLogprobs(const Json& lp) {
  auto tokens = lp.find("tokens");
  auto values = lp.find("token_logprobs");
  if (tokens == lp.end() || values == lp.end() || !tokens->is_array() || !values->is_array() ||
      tokens->size() != values->size())
    return InvalidArgument("logprobs: tokens and token_logprobs must be arrays of the same length");
  auto top = lp.find("top_logprobs");
  const bool has_top = top != lp.end() && top->is_array();
  if (has_top && top->size() != tokens->size())
    return InvalidArgument("logprobs: top_logprobs must have one entry per token");
  std::vector<TokenStep> steps;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const std::string where = "logprobs position " + std::to_string(i);
    if (!(*tokens)[i].is_string()) return InvalidArgument(where + ": token must be a string");
    TokenStep s;
    s.token = (*tokens)[i].get<std::string>();
    DSINFER_ASSIGN_OR_RETURN(s.logprob, LogprobValue((*values)[i], where));
    if (has_top && !(*top)[i].is_null()) {
      if (!(*top)[i].is_object())
        return InvalidArgument(where + ": top_logprobs entry must be an object");
      for (const auto& [text, value] : (*top)[i].items()) {
        DSINFER_ASSIGN_OR_RETURN(double v, LogprobValue(value, where));
        s.top.emplace(text, v);
      }
    }
    steps.push_back(std::move(s));
  }
  return steps;
}

Result<std::vector<TokenStep>> ParseChatLogprobs(const Json& lp) {
  auto content = lp.find("content");
  if (content == lp.end() || !content->is_array())
    return InvalidArgument("logprobs.content must be an array");
  std::vector<TokenStep> steps;
  for (size_t i = 0; i < content->size(); ++i) {
    const Json& e = (*content)[i];
    const std::string where = "logprobs.content[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("token") || !e["token"].is_string() || !e.contains("logprob"))
      return InvalidArgument(where + ": needs token (string) and logprob");
    TokenStep s;
    s.token = e["token"].get<std::string>();
    DSINFER_ASSIGN_OR_RETURN(s.logprob, LogprobValue(e["logprob"], where));
    auto top = e.find("top_logprobs");
    if (top != e.end() && !top->is_null()) {
      if (!top->is_array()) return InvalidArgument(where + ": top_logprobs must be an array");
      for (const Json& alt : *top) {
        if (!alt.is_object() || !alt.contains("token") || !alt["token"].is_string() ||
            !alt.contains("logprob"))
          return InvalidArgument(where + ": top_logprobs entries need token and logprob");
        DSINFER_ASSIGN_OR_RETURN(double v, LogprobValue(alt["logprob"], where));
        // Best first on the wire: two ids with the same text keep the better logprob.
        s.top.emplace(alt["token"].get<std::string>(), v);
      }
    }
    steps.push_back(std::move(s));
  }
  return steps;
}

Json StepJson(const SequenceComparison& r) {
  return Json{{"compared_positions", r.compared},
              {"first_divergence", r.divergence},
              {"token_a", r.divergence >= 0 ? Json(r.token_a) : Json(nullptr)},
              {"token_b", r.divergence >= 0 ? Json(r.token_b) : Json(nullptr)},
              {"a_token_in_b_top", r.divergence >= 0 ? Json(r.a_in_b_top) : Json(nullptr)},
              {"b_token_in_a_top", r.divergence >= 0 ? Json(r.b_in_a_top) : Json(nullptr)},
              {"near_tie", r.near_tie},
              {"mean_abs_logprob_delta", r.mean_abs_delta},
              {"max_abs_logprob_delta", r.max_abs_delta},
              {"max_abs_logprob_delta_position", r.max_delta_position},
              {"mean_kl", r.mean_kl},
              {"max_kl", r.max_kl},
              {"max_kl_position", r.max_kl_position}};
}

std::string UrlText(const Url& u) {
  return "http://" + u.host + ":" + std::to_string(u.port) + u.path_prefix;
}

}  // namespace

Result<std::vector<ComparePrompt>> LoadPromptsJsonl(const std::string& path, EndpointKind kind) {
  std::ifstream in(path);
  if (!in) return IoError("cannot open prompts file " + path);
  std::vector<ComparePrompt> prompts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + ": not a JSON object");
    ComparePrompt p;
    if (auto m = j.find("messages"); m != j.end()) {
      if (kind != EndpointKind::kChat)
        return InvalidArgument(where + ": \"messages\" needs --endpoint chat");
      if (!m->is_array() || m->empty())
        return InvalidArgument(where + ": messages must be a non-empty array");
      p.messages_json = m->dump();
    } else if (auto t = j.find("prompt"); t != j.end() && t->is_string()) {
      p.text = t->get<std::string>();
    } else if (t != j.end() && t->is_array() && !t->empty()) {
      if (kind != EndpointKind::kCompletions)
        return InvalidArgument(where + ": token-id prompts need --endpoint completions");
      for (const Json& id : *t) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          return InvalidArgument(where + ": prompt ids must be non-negative integers");
        p.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else {
      return InvalidArgument(where +
                             ": needs \"prompt\" (string or id array) or \"messages\" (chat)");
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return InvalidArgument(path + ": no prompts");
  return prompts;
}

std::vector<ComparePrompt> SyntheticPrompts(int count, int input_len, uint64_t seed,
                                            EndpointKind kind, int vocab_hint) {
  static constexpr const char* kWords[] = {"river", "stone", "light", "paper", "cloud", "metal",
                                           "green", "quiet", "north", "table", "seven", "bread"};
  std::vector<ComparePrompt> prompts(static_cast<size_t>(std::max(count, 0)));
  for (int i = 0; i < count; ++i) {
    std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(i));
    ComparePrompt& p = prompts[static_cast<size_t>(i)];
    if (kind == EndpointKind::kChat) {
      for (int w = 0; w < input_len; ++w) {
        if (w) p.text += ' ';
        p.text += kWords[rng() % std::size(kWords)];
      }
    } else {
      std::uniform_int_distribution<int> id(10, std::max(11, vocab_hint - 1));
      for (int t = 0; t < input_len; ++t) p.ids.push_back(id(rng));
    }
  }
  return prompts;
}

std::string GreedyRequestBody(const ComparePrompt& prompt, const std::string& model,
                              const GreedyRequestOptions& options) {
  Json body = {{"max_tokens", options.max_tokens}, {"temperature", 0}, {"stream", false}};
  if (!model.empty()) body["model"] = model;
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (options.kind == EndpointKind::kChat) {
    body["logprobs"] = true;
    body["top_logprobs"] = options.top_logprobs;
    body["messages"] = prompt.messages_json.empty()
                           ? Json::array({{{"role", "user"}, {"content", prompt.text}}})
                           : Json::parse(prompt.messages_json);
  } else {
    body["logprobs"] = options.top_logprobs;
    if (prompt.ids.empty())
      body["prompt"] = prompt.text;
    else
      body["prompt"] = prompt.ids;
  }
  return body.dump();
}

Result<std::vector<TokenStep>> ParseGreedyResponse(std::string_view body, EndpointKind kind) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("response is not a JSON object");
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() || !(*choices)[0].is_object())
    return InvalidArgument("response has no choices[0]");
  const Json& choice = (*choices)[0];
  auto lp = choice.find("logprobs");
  if (lp == choice.end() || lp->is_null() || !lp->is_object())
    return InvalidArgument("choices[0].logprobs is missing (the endpoint ignored logprobs)");
  return kind == EndpointKind::kChat ? ParseChatLogprobs(*lp) : ParseCompletionLogprobs(*lp);
}

Result<std::vector<TokenStep>> FetchGreedy(const EndpointSide& side, const ComparePrompt& prompt,
                                           const GreedyRequestOptions& options) {
  HttpRequestSpec req;
  req.path = options.kind == EndpointKind::kChat ? "/v1/chat/completions" : "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  if (!side.api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + side.api_key);
  req.body = GreedyRequestBody(prompt, side.model, options);
  req.timeout_s = options.timeout_s;
  DSINFER_ASSIGN_OR_RETURN(HttpResult res, HttpCall(side.url, req));
  if (res.status < 200 || res.status >= 300)
    return IoError("HTTP " + std::to_string(res.status) + " from " + UrlText(side.url) + req.path +
                   ": " + res.body.substr(0, 300));
  auto steps = ParseGreedyResponse(res.body, options.kind);
  if (!steps.ok())
    return InvalidArgument(UrlText(side.url) + req.path + ": " + steps.status().message());
  return steps;
}

void AddPromptComparison(int index, std::vector<TokenStep> a, std::vector<TokenStep> b,
                         int top_logprobs, const CompareThresholds& thresholds,
                         EndpointComparison* out) {
  PromptComparison p;
  p.index = index;
  p.tokens_a = static_cast<int64_t>(a.size());
  p.tokens_b = static_cast<int64_t>(b.size());
  if (top_logprobs > 0) {
    for (const auto* side : {&a, &b}) {
      for (size_t i = 0; i < side->size() && p.error.empty(); ++i)
        if ((*side)[i].top.empty())
          p.error = std::string(side == &a ? "A" : "B") + " returned no top_logprobs at position " +
                    std::to_string(i) + " (asked for " + std::to_string(top_logprobs) + ")";
    }
  }
  if (!p.error.empty()) {
    p.result.pass = false;
    ++out->errors;
    if (out->reason.empty()) out->reason = "prompt " + std::to_string(index) + ": " + p.error;
    out->prompts.push_back(std::move(p));
    return;
  }
  p.result = CompareSequences(a, b, thresholds);
  if (p.result.divergence >= 0 && static_cast<size_t>(p.result.divergence) < a.size()) {
    const TokenStep& at = a[static_cast<size_t>(p.result.divergence)];
    if (auto it = at.top.find(p.result.token_b); it != at.top.end())
      p.divergence_margin_a = at.logprob - it->second;
  }
  if (!p.result.pass) {
    ++out->failed;
    if (out->reason.empty())
      out->reason = "prompt " + std::to_string(index) + ": " + p.result.reason;
  }
  out->prompts.push_back(std::move(p));
}

EndpointComparison CompareEndpoints(const EndpointSide& a, const EndpointSide& b,
                                    const std::vector<ComparePrompt>& prompts,
                                    const GreedyRequestOptions& options,
                                    const CompareThresholds& thresholds,
                                    const std::function<void(int, int)>& progress) {
  EndpointComparison out;
  const int total = static_cast<int>(prompts.size());
  for (int i = 0; i < total; ++i) {
    const ComparePrompt& prompt = prompts[static_cast<size_t>(i)];
    // The two sides are independent servers: ask both at once.
    auto from_b = std::async(std::launch::async, [&] { return FetchGreedy(b, prompt, options); });
    auto steps_a = FetchGreedy(a, prompt, options);
    auto steps_b = from_b.get();
    if (!steps_a.ok() || !steps_b.ok()) {
      PromptComparison p;
      p.index = i;
      p.error =
          !steps_a.ok() ? "A: " + steps_a.status().ToString() : "B: " + steps_b.status().ToString();
      p.result.pass = false;
      ++out.errors;
      if (out.reason.empty()) out.reason = "prompt " + std::to_string(i) + ": " + p.error;
      out.prompts.push_back(std::move(p));
    } else {
      AddPromptComparison(i, std::move(steps_a).value(), std::move(steps_b).value(),
                          options.top_logprobs, thresholds, &out);
    }
    if (progress) progress(i + 1, total);
  }
  return out;
}

std::string EndpointComparisonJson(const EndpointSide& a, const EndpointSide& b,
                                   const GreedyRequestOptions& options,
                                   const CompareThresholds& thresholds,
                                   const EndpointComparison& comparison) {
  Json prompts = Json::array();
  double worst_delta = 0, worst_kl = 0;
  Json worst_delta_at = nullptr, worst_kl_at = nullptr;
  int64_t compared = 0, diverged = 0;
  for (const auto& p : comparison.prompts) {
    Json item = {{"index", p.index}};
    if (!p.error.empty()) {
      item["verdict"] = "error";
      item["error"] = p.error;
      prompts.push_back(item);
      continue;
    }
    item["tokens_a"] = p.tokens_a;
    item["tokens_b"] = p.tokens_b;
    item.update(StepJson(p.result));
    item["divergence_margin_a"] =
        p.divergence_margin_a >= 0 ? Json(p.divergence_margin_a) : Json(nullptr);
    item["verdict"] = p.result.pass ? "pass" : "fail";
    item["reason"] = p.result.reason;
    prompts.push_back(item);
    compared += p.result.compared;
    diverged += p.result.divergence >= 0;
    if (p.result.max_abs_delta > worst_delta) {
      worst_delta = p.result.max_abs_delta;
      worst_delta_at = {{"prompt", p.index}, {"position", p.result.max_delta_position}};
    }
    if (p.result.max_kl > worst_kl) {
      worst_kl = p.result.max_kl;
      worst_kl_at = {{"prompt", p.index}, {"position", p.result.max_kl_position}};
    }
  }
  const char* verdict = comparison.errors > 0 ? "error" : comparison.pass() ? "pass" : "fail";
  Json report = {{"a", {{"url", UrlText(a.url)}, {"model", a.model}}},
                 {"b", {{"url", UrlText(b.url)}, {"model", b.model}}},
                 {"endpoint", options.kind == EndpointKind::kChat ? "chat" : "completions"},
                 {"max_tokens", options.max_tokens},
                 {"top_logprobs", options.top_logprobs},
                 {"ignore_eos", options.ignore_eos},
                 {"thresholds",
                  {{"max_abs_logprob_delta", thresholds.max_abs_logprob_delta},
                   {"max_kl", thresholds.max_kl},
                   {"tie_margin", thresholds.tie_margin}}},
                 {"prompts", prompts},
                 {"summary",
                  {{"prompts", comparison.prompts.size()},
                   {"failed", comparison.failed},
                   {"errors", comparison.errors},
                   {"diverged", diverged},
                   {"compared_positions", compared},
                   {"max_abs_logprob_delta", worst_delta},
                   {"max_abs_logprob_delta_at", worst_delta_at},
                   {"max_kl", worst_kl},
                   {"max_kl_at", worst_kl_at}}},
                 {"verdict", verdict},
                 {"reason", comparison.reason}};
  return report.dump(2) + "\n";
}

std::string EndpointComparisonText(const CompareThresholds& thresholds,
                                   const EndpointComparison& comparison) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%-6s %8s %10s %6s %6s %11s %11s %10s %10s  %s\n", "prompt",
                "compared", "divergence", "A@Btop", "B@Atop", "mean|dlp|", "max|dlp|", "mean KL",
                "max KL", "verdict");
  out += line;
  for (const auto& p : comparison.prompts) {
    if (!p.error.empty()) {
      out += std::to_string(p.index) + "      error: " + p.error + "\n";
      continue;
    }
    const auto& r = p.result;
    const bool div = r.divergence >= 0;
    std::snprintf(
        line, sizeof(line), "%-6d %8lld %10s %6s %6s %11.3g %11.3g %10.3g %10.3g  ", p.index,
        static_cast<long long>(r.compared), div ? std::to_string(r.divergence).c_str() : "-",
        div ? (r.a_in_b_top ? "yes" : "no") : "-", div ? (r.b_in_a_top ? "yes" : "no") : "-",
        r.mean_abs_delta, r.max_abs_delta, r.mean_kl, r.max_kl);
    out += line;
    out += r.pass ? "pass\n" : "FAIL: " + r.reason + "\n";
  }
  std::snprintf(line, sizeof(line),
                "thresholds: max |delta logprob| %.4g nats, max KL %.4g nats, tie margin %.4g "
                "nats\n",
                thresholds.max_abs_logprob_delta, thresholds.max_kl, thresholds.tie_margin);
  out += line;
  if (comparison.pass()) {
    std::snprintf(line, sizeof(line), "verdict: PASS (%zu prompts)\n", comparison.prompts.size());
    out += line;
  } else {
    std::snprintf(line, sizeof(line), "verdict: %s (%d failed, %d errors of %zu prompts): ",
                  comparison.errors ? "ERROR" : "FAIL", comparison.failed, comparison.errors,
                  comparison.prompts.size());
    out += line + comparison.reason + "\n";
  }
  return out;
}

}  // namespace dsinfer::measure
