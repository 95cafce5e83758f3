// The grammar layer on a synthetic vocabulary: the mask it applies, the walks it allows (every
// walk through the masks ends in an output the grammar describes), and the 400-class errors of
// specs that are invalid or over the limits.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

namespace dsinfer::grammar {
namespace {

// Ids 0..255: the single bytes; 256: EOS; 257: an added token ("<think>"), never text; then a
// few multi-byte tokens; the model's row is wider than the tokenizer's (padding ids 270..299).
constexpr int32_t kEos = 256;
constexpr int32_t kAdded = 257;
constexpr int32_t kVocab = 300;

Vocabulary TestVocabulary() {
  Vocabulary v;
  for (int b = 0; b < 256; ++b) v.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  v.token_bytes.push_back("");  // EOS
  v.token_bytes.push_back("");  // an added token
  for (const char* t : {"true", "false", "{\"", "\":", "\",\"", "ab", "null", "12"})
    v.token_bytes.push_back(t);
  v.vocab_size = kVocab;
  v.stop_token_ids = {kEos};
  return v;
}

// A compiler of its own per use (the vocabulary is small: creating one is cheap).
Result<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec) {
  auto compiler = Compiler::Create(TestVocabulary());
  EXPECT_TRUE(compiler.ok()) << compiler.status().ToString();
  return (*compiler)->Compile(spec);
}

std::vector<int32_t> Allowed(Matcher& m) {
  std::vector<uint32_t> mask(BitmaskWords(kVocab));
  EXPECT_TRUE(m.FillNextTokenBitmask(mask).ok());
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < kVocab; ++t)
    if ((mask[t / 32] >> (t % 32)) & 1u) allowed.push_back(t);
  return allowed;
}

std::string TokenText(int32_t t) {
  const Vocabulary v = TestVocabulary();
  return t < static_cast<int32_t>(v.token_bytes.size()) ? v.token_bytes[t] : std::string();
}

// Draws uniformly among the allowed tokens until the matcher terminates (or max_steps); returns
// the text (without the stop token) and whether it terminated.
std::pair<std::string, bool> RandomWalk(const GrammarSpec& spec, uint32_t seed,
                                        int max_steps = 400) {
  auto compiled = Compile(spec);
  EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto matcher = Matcher::Create(*compiled);
  EXPECT_TRUE(matcher.ok());
  std::mt19937 rng(seed);
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    std::vector<int32_t> allowed = Allowed(**matcher);
    EXPECT_FALSE(allowed.empty());
    if (allowed.empty()) break;
    for (int32_t t : allowed) {
      EXPECT_NE(t, kAdded) << "an added token is never text";
      EXPECT_LT(t, 256 + 2 + 8) << "padding ids are never allowed";
    }
    // Prefer ending once possible, half of the time, so walks finish.
    int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (std::find(allowed.begin(), allowed.end(), kEos) != allowed.end() && rng() % 2) pick = kEos;
    EXPECT_TRUE((*matcher)->AcceptToken(pick));
    if (pick == kEos) {
      EXPECT_TRUE((*matcher)->IsTerminated());
      return {text, true};
    }
    text += TokenText(pick);
  }
  return {text, false};
}

TEST(ApplyBitmask, MasksExactlyTheClearBitsAndEverythingPastTheMask) {
  std::vector<float> logits(70, 1.5f);
  std::vector<uint32_t> mask = {0x80000001u};  // tokens 0 and 31 only; 32.. past the mask
  ApplyBitmask(logits, mask);
  for (int t = 0; t < 70; ++t) {
    if (t == 0 || t == 31)
      EXPECT_EQ(logits[t], 1.5f) << t;
    else
      EXPECT_TRUE(std::isinf(logits[t]) && logits[t] < 0) << t;
  }
  EXPECT_EQ(BitmaskWords(64), 2);
  EXPECT_EQ(BitmaskWords(65), 3);
}

TEST(Matcher, RegexAllowsOnlyItsPathsThenOnlyTheStopToken) {
  auto compiled = Compile({.kind = GrammarKind::kRegex, .text = "ab|cd"});
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto m = Matcher::Create(*compiled);
  ASSERT_TRUE(m.ok());
  const int32_t ab = 256 + 2 + 5;  // the "ab" token
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{'a', 'c', ab}));
  EXPECT_FALSE((*m)->AcceptToken('b'));  // rejected, and nothing changed
  ASSERT_TRUE((*m)->AcceptToken('c'));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{'d'}));
  ASSERT_TRUE((*m)->AcceptToken('d'));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{kEos}));
  EXPECT_FALSE((*m)->IsTerminated());
  ASSERT_TRUE((*m)->AcceptToken(kEos));
  EXPECT_TRUE((*m)->IsTerminated());
  EXPECT_TRUE(Allowed(**m).empty());
  EXPECT_FALSE((*m)->AcceptToken('a'));
}

TEST(Matcher, RandomWalksOfARegexMatchIt) {
  const std::string re = "[a-c]{2,4}-(x|yz)[0-9]?";
  for (uint32_t seed = 0; seed < 30; ++seed) {
    auto [text, done] = RandomWalk({.kind = GrammarKind::kRegex, .text = re}, seed);
    ASSERT_TRUE(done);
    EXPECT_TRUE(std::regex_match(text, std::regex(re))) << text;
  }
}

TEST(Matcher, ChoicesAreEscapedAndMatchedExactly) {
  const std::vector<std::string> choices = {"x\"y", "a\\b\n1",
                                            "\x01"
                                            "f",
                                            "plain"};
  std::set<std::string> seen;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    auto [text, done] = RandomWalk({.kind = GrammarKind::kChoice, .choices = choices}, seed);
    ASSERT_TRUE(done);
    EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 3u);
}

TEST(Matcher, RandomWalksOfAJsonSchemaSatisfyIt) {
  const std::string schema = R"({"type":"object","properties":{
      "n":{"type":"integer","minimum":3,"maximum":5},
      "s":{"type":"string","enum":["red","green"]},
      "b":{"type":"boolean"}},"required":["n","s"],"additionalProperties":false})";
  int completed = 0;
  for (uint32_t seed = 0; seed < 30; ++seed) {
    auto [text, done] = RandomWalk({.kind = GrammarKind::kJsonSchema, .text = schema}, seed);
    if (!done) continue;
    ++completed;
    auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("n") && j["n"].is_number_integer()) << text;
    EXPECT_GE(j["n"].get<int>(), 3);
    EXPECT_LE(j["n"].get<int>(), 5);
    ASSERT_TRUE(j.contains("s")) << text;
    EXPECT_TRUE(j["s"] == "red" || j["s"] == "green") << text;
    for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "n" || k == "s" || k == "b") << text;
  }
  EXPECT_GE(completed, 20);
}

// xgrammar 0.2.8 lets a length-bounded string (minLength / maxLength) take any byte but '"', '\\',
// '\r' and '\n' unescaped; raw control bytes are invalid JSON (the V4.1 demo once produced "\x0f"
// there). JSON grammars therefore never allow a token holding a byte below 0x20 (compact JSON has
// none anywhere), and every completed walk parses.
TEST(Matcher, JsonStringsNeverTakeARawControlByte) {
  const std::string schema = R"({"type":"object","properties":{
      "w":{"type":"string","minLength":2,"maxLength":3}},"required":["w"],
      "additionalProperties":false})";
  int completed = 0;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    auto [text, done] = RandomWalk({.kind = GrammarKind::kJsonSchema, .text = schema}, seed);
    for (char b : text) EXPECT_GE(static_cast<unsigned char>(b), 0x20) << "seed " << seed;
    if (!done) continue;
    ++completed;
    auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.contains("w") && j["w"].is_string()) << text;
  }
  EXPECT_GE(completed, 20);
}

TEST(Matcher, JsonObjectModeGivesAnObject) {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    auto [text, done] = RandomWalk({.kind = GrammarKind::kJsonObject}, seed, 2000);
    if (!done) continue;
    ASSERT_TRUE(!text.empty() && text.front() == '{' && text.back() == '}') << text;
    // A uniform walk writes numbers like 5E8922 (valid JSON that nlohmann cannot hold: 406) and,
    // byte by byte, encodings of surrogate code points inside strings that xgrammar's UTF-8
    // decoder accepts and strict UTF-8 does not (the server's detokenizer makes them U+FFFD).
    try {
      EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
    } catch (const nlohmann::json::out_of_range& e) {
      EXPECT_EQ(e.id, 406) << e.what() << "\n" << text;
    } catch (const nlohmann::json::parse_error& e) {
      EXPECT_NE(std::string(e.what()).find("ill-formed UTF-8"), std::string::npos) << e.what();
    }
  }
}

TEST(Matcher, EbnfGrammar) {
  const std::string ebnf = R"g(root ::= "(" item ("," item)* ")"
item ::= [0-9]+ | "ab")g";
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto [text, done] = RandomWalk({.kind = GrammarKind::kEbnf, .text = ebnf}, seed);
    ASSERT_TRUE(done);
    EXPECT_TRUE(std::regex_match(text, std::regex(R"(\((\d+|ab)(,(\d+|ab))*\))"))) << text;
  }
}

void ExpectRejected(const GrammarSpec& spec, const std::string& needle) {
  auto compiled = Compile(spec);
  ASSERT_FALSE(compiled.ok()) << needle;
  EXPECT_EQ(compiled.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(compiled.status().message().find(needle), std::string::npos)
      << compiled.status().message();
}

TEST(Compiler, InvalidSpecsAreInvalidArgumentNamingTheProblem) {
  ExpectRejected({.kind = GrammarKind::kJsonSchema, .text = "{not json"}, "not valid JSON");
  ExpectRejected({.kind = GrammarKind::kJsonSchema, .text = "[1]"}, "must be a JSON object");
  ExpectRejected({.kind = GrammarKind::kJsonSchema, .text = R"({"$ref":"#/$defs/missing"})"},
                 "does not compile");
  ExpectRejected({.kind = GrammarKind::kRegex, .text = "(ab"}, "regex does not compile");
  ExpectRejected({.kind = GrammarKind::kRegex, .text = ""}, "regex is empty");
  ExpectRejected({.kind = GrammarKind::kEbnf, .text = "root ::= undefined_rule"},
                 "grammar does not compile");
  ExpectRejected({.kind = GrammarKind::kChoice}, "at least one");
  ExpectRejected({.kind = GrammarKind::kChoice, .choices = {"a", ""}}, "must not be empty");
}

TEST(Compiler, PathologicalSpecsAreBoundedByTheLimits) {
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 40; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  ExpectRejected({.kind = GrammarKind::kJsonSchema, .text = deep}, "nests deeper than");
  nlohmann::json many_enums = {{"type", "string"}, {"enum", nlohmann::json::array()}};
  for (int i = 0; i < 2000; ++i) many_enums["enum"].push_back("v" + std::to_string(i));
  ExpectRejected({.kind = GrammarKind::kJsonSchema, .text = many_enums.dump()}, "enum/const");
  ExpectRejected({.kind = GrammarKind::kJsonSchema,
                  .text = R"({"type":"array","items":{"type":"integer"},"maxItems":100000})"},
                 "maxItems is over");
  ExpectRejected(
      {.kind = GrammarKind::kJsonSchema, .text = R"({"type":"string","pattern":"a{5000}"})"},
      "pattern repeats");
  ExpectRejected({.kind = GrammarKind::kRegex, .text = "x{1,99999}"}, "repeats more than");
  ExpectRejected({.kind = GrammarKind::kRegex, .text = std::string(70000, 'a')}, "longer than");
  // A structural tag may carry a tool list's schemas: 1 MiB, not 64 KiB.
  const std::string padded_tag = R"j({"type":"structural_tag","format":{"type":"const_string",)j"
                                 R"j("value":")j" +
                                 std::string(70000, 'a') + "\"}}";
  EXPECT_TRUE(CheckLimits({.kind = GrammarKind::kStructuralTag, .text = padded_tag}, {}).ok());
  ExpectRejected({.kind = GrammarKind::kStructuralTag, .text = std::string(1100000, ' ')},
                 "longer than");
  GrammarSpec choices{.kind = GrammarKind::kChoice};
  for (int i = 0; i < 300; ++i) choices.choices.push_back("c" + std::to_string(i));
  ExpectRejected(choices, "more than 256 entries");
}

TEST(Compiler, CreateChecksTheVocabulary) {
  Vocabulary v = TestVocabulary();
  v.vocab_size = 10;  // fewer than the token strings
  EXPECT_FALSE(Compiler::Create(v).ok());
  v = TestVocabulary();
  v.stop_token_ids = {kVocab};
  EXPECT_FALSE(Compiler::Create(v).ok());
}

TEST(Matcher, WrongBitmaskSizeIsAnError) {
  auto compiled = Compile({.kind = GrammarKind::kRegex, .text = "a"});
  ASSERT_TRUE(compiled.ok());
  auto m = Matcher::Create(*compiled);
  ASSERT_TRUE(m.ok());
  std::vector<uint32_t> small(2);
  EXPECT_FALSE((*m)->FillNextTokenBitmask(small).ok());
}

}  // namespace
}  // namespace dsinfer::grammar
