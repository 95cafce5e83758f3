// Structured outputs in the engine (tiny checkpoint, synthetic vocabulary of byte strings): the
// grammar's mask decides every drawn token, greedy and sampled, n > 1, batched; a completed
// output ends with the stop token and finish reason stop; max_tokens cuts with length; with
// grammar_after_token the output is free until that token and constrained after it.
#include <gtest/gtest.h>

#include <regex>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "grammar/grammar.h"
#include "runtime/engine.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::Collect;
using dsinfer::testing::Ids;
using dsinfer::testing::Outcome;

constexpr char kAlphabet[] = "abcxyz0123456789-";
constexpr const char* kRegex = "[a-c]{2,5}-[0-9]{1,3}";

const model::ModelWeights& Weights() { return dsinfer::testing::PresetWeights("tiny-a"); }

// Token t stands for 1-3 characters of kAlphabet (t's digits in base 17); the EOS and one
// "added" token (kMarker) are no text.
int32_t Marker() { return Weights().config().eos_token_id == 3 ? 4 : 3; }

grammar::Vocabulary TestVocabulary() {
  const auto& c = Weights().config();
  grammar::Vocabulary v;
  v.vocab_size = static_cast<int32_t>(c.vocab_size);
  v.token_bytes.resize(c.vocab_size);
  const int base = sizeof(kAlphabet) - 1;
  for (int32_t t = 0; t < v.vocab_size; ++t) {
    if (t == c.eos_token_id || t == Marker()) continue;
    std::string s;
    for (int x = t; s.size() < 3; x /= base) {
      s += kAlphabet[x % base];
      if (x < base) break;
    }
    v.token_bytes[t] = s;
  }
  v.stop_token_ids = {static_cast<int32_t>(c.eos_token_id)};
  return v;
}

std::shared_ptr<const grammar::CompiledGrammar> RegexGrammar() {
  auto compiler = grammar::Compiler::Create(TestVocabulary());
  DSINFER_CHECK_MSG(compiler.ok(), compiler.status().ToString());
  auto g = (*compiler)->Compile({.kind = grammar::GrammarKind::kRegex, .text = kRegex});
  DSINFER_CHECK_MSG(g.ok(), g.status().ToString());
  return *g;
}

std::unique_ptr<Engine> MakeEngine() {
  auto e = Engine::Create(Weights(), {.n_threads = 2, .kv_cache_bytes = int64_t{256} << 20});
  DSINFER_CHECK_MSG(e.ok(), e.status().ToString());
  return std::move(e).value();
}

std::string Text(const std::vector<int32_t>& tokens) {
  const grammar::Vocabulary v = TestVocabulary();
  std::string s;
  for (int32_t t : tokens) s += v.token_bytes.at(t);
  return s;
}

RequestParams Constrained(uint32_t seed, double temperature, int n = 1, int max_tokens = 40) {
  RequestParams p;
  p.prompt = Ids(12, seed);
  p.max_tokens = max_tokens;
  p.n = n;
  p.sampling.temperature = temperature;
  p.sampling.seed = seed;
  p.sampling.has_seed = true;
  p.top_logprobs = 1;
  p.grammar = RegexGrammar();
  return p;
}

TEST(GrammarEngine, GreedySampledAndNSamplesFollowTheGrammarAndStop) {
  auto engine = MakeEngine();
  std::vector<std::pair<RequestParams, std::shared_ptr<RequestStream>>> runs;
  for (uint32_t seed = 0; seed < 6; ++seed) {
    RequestParams p = Constrained(seed, seed % 2 ? 1.0 : 0.0, seed == 5 ? 3 : 1);
    auto s = engine->Submit(p);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    runs.emplace_back(std::move(p), std::move(*s));
  }
  for (auto& [p, stream] : runs) {
    int64_t drawn = 0, counted = 0;
    for (const Outcome& o : Collect(*stream, p.n)) {
      EXPECT_EQ(o.reason, FinishReason::kStop) << Text(o.tokens);
      EXPECT_TRUE(std::regex_match(Text(o.tokens), std::regex(kRegex))) << Text(o.tokens);
      EXPECT_EQ(o.logprobs.size(), o.tokens.size());
      drawn += static_cast<int64_t>(o.tokens.size()) + 1;
      counted = std::max(counted, o.usage.completion_tokens);
    }
    // Each sample's stop token was drawn (counted) but is not output.
    EXPECT_EQ(counted, drawn);
  }
  // Without the grammar the same greedy request writes something else: the mask decided.
  RequestParams free = Constrained(0, 0.0);
  free.grammar = nullptr;
  auto s = engine->Submit(free);
  ASSERT_TRUE(s.ok());
  Outcome o = Collect(**s)[0];
  EXPECT_FALSE(std::regex_match(Text(o.tokens), std::regex(kRegex))) << Text(o.tokens);
}

TEST(GrammarEngine, MaxTokensCutsWithLength) {
  auto engine = MakeEngine();
  auto s = engine->Submit(Constrained(3, 1.0, 1, /*max_tokens=*/1));
  ASSERT_TRUE(s.ok());
  Outcome o = Collect(**s)[0];
  EXPECT_EQ(o.reason, FinishReason::kLength);
  ASSERT_EQ(o.tokens.size(), 1u);
  EXPECT_TRUE(std::regex_match(Text(o.tokens), std::regex("[a-c]{1,3}"))) << Text(o.tokens);
}

TEST(GrammarEngine, TheGrammarAppliesAfterItsStartToken) {
  auto engine = MakeEngine();
  RequestParams p = Constrained(4, 1.0);
  p.grammar_after_token = Marker();
  // The marker first (a bias the grammar would override, were it already in force) ...
  p.logit_bias = {{Marker(), 100.0f}};
  auto s = engine->Submit(p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Outcome o = Collect(**s)[0];
  ASSERT_FALSE(o.tokens.empty());
  EXPECT_EQ(o.tokens[0], Marker());
  // ... then the grammar, which never allows the marker despite its bias.
  std::vector<int32_t> rest(o.tokens.begin() + 1, o.tokens.end());
  EXPECT_EQ(o.reason, FinishReason::kStop);
  EXPECT_TRUE(std::regex_match(Text(rest), std::regex(kRegex))) << Text(rest);
}

TEST(GrammarEngine, AGrammarNoOutputSatisfiesIsRefusedAtSubmit) {
  auto compiler = grammar::Compiler::Create(TestVocabulary());
  ASSERT_TRUE(compiler.ok());
  auto g =
      (*compiler)->Compile({.kind = grammar::GrammarKind::kJsonSchema,
                            .text = R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}})"});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto engine = MakeEngine();
  RequestParams p = Constrained(1, 0.0);
  p.grammar = *g;
  auto s = engine->Submit(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("matches no output"), std::string::npos);
}

TEST(GrammarEngine, AGrammarOfAnotherVocabularyIsRefused) {
  grammar::Vocabulary v = TestVocabulary();
  v.vocab_size += 32;
  auto compiler = grammar::Compiler::Create(v);
  ASSERT_TRUE(compiler.ok());
  auto g = (*compiler)->Compile({.kind = grammar::GrammarKind::kRegex, .text = "a"});
  ASSERT_TRUE(g.ok());
  auto engine = MakeEngine();
  RequestParams p = Constrained(1, 0.0);
  p.grammar = *g;
  auto s = engine->Submit(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsinfer::runtime
