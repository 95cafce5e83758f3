// Token-for-token parity with HF tokenizers 0.23.3 on the committed corpus
// (tests/fixtures/tokenizer/encode_corpus.jsonl, made by reference/tokenizer/make_fixtures.py),
// for the DeepSeek V4 and V3 tokenizers in both modes, plus decode and streaming parity.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "text/utf8.h"
#include "tokenizer_test_util.h"

namespace dsinfer::text {
namespace {

using testing::FixturePath;
using testing::V3;
using testing::V4;

struct Case {
  std::string text;
  std::vector<int32_t> plain, v4, v3;
};

const std::vector<Case>& Corpus() {
  static const std::vector<Case>* corpus = [] {
    auto* cases = new std::vector<Case>();
    std::ifstream in(FixturePath("encode_corpus.jsonl"), std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      const auto rec = nlohmann::json::parse(line);
      Case c;
      c.text = rec["text"].get<std::string>();
      c.plain = rec["plain"].get<std::vector<int32_t>>();
      c.v4 = rec.contains("v4") ? rec["v4"].get<std::vector<int32_t>>() : c.plain;
      c.v3 = rec.contains("v3") ? rec["v3"].get<std::vector<int32_t>>() : c.v4;
      cases->push_back(std::move(c));
    }
    return cases;
  }();
  return *corpus;
}

std::string Describe(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s += std::to_string(ids[i]) + " ";
  return s + (ids.size() > 40 ? "..." : "");
}

// Counts mismatches (reporting the first few) so one regression doesn't print 8000 failures.
void ExpectParity(const Tokenizer& tok, bool allow_special, std::vector<int32_t> Case::*field,
                  const char* label) {
  size_t mismatches = 0;
  for (const Case& c : Corpus()) {
    auto ids = tok.Encode(c.text, allow_special);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    if (*ids != c.*field) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << label << " mismatch on " << nlohmann::json(c.text.substr(0, 200)).dump()
                      << "\n  expected: " << Describe(c.*field)
                      << "\n  actual:   " << Describe(*ids);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << label;
}

TEST(TokenizerParity, CorpusIsLargeAndCoversLargeInputs) {
  ASSERT_GE(Corpus().size(), 5000u);
  size_t large = 0, with_specials = 0;
  for (const Case& c : Corpus()) {
    large += c.text.size() >= 100000;
    with_specials += c.v4 != c.plain;
  }
  EXPECT_GE(large, 3u);
  EXPECT_GE(with_specials, 500u);
}

TEST(TokenizerParity, V4RecognisesAddedTokens) { ExpectParity(V4(), true, &Case::v4, "v4"); }
TEST(TokenizerParity, V3RecognisesAddedTokens) { ExpectParity(V3(), true, &Case::v3, "v3"); }
TEST(TokenizerParity, V4PlainMode) { ExpectParity(V4(), false, &Case::plain, "v4 plain"); }
TEST(TokenizerParity, V3PlainMode) { ExpectParity(V3(), false, &Case::plain, "v3 plain"); }

TEST(TokenizerParity, DecodeRoundTripsAndStreamingMatches) {
  const Tokenizer& tok = V4();
  size_t failures = 0;
  for (const Case& c : Corpus()) {
    for (const auto* ids : {&c.v4, &c.plain}) {
      auto text = tok.Decode(*ids);
      ASSERT_TRUE(text.ok()) << text.status().ToString();
      StreamingDetokenizer stream(tok);
      std::string streamed;
      bool pieces_valid = true;
      for (int32_t id : *ids) {
        const std::string piece = stream.Next(id);
        pieces_valid &= IsValidUtf8(piece);
        streamed += piece;
      }
      streamed += stream.Flush();
      if (*text != c.text || streamed != c.text || !pieces_valid) {
        if (++failures <= 5)
          ADD_FAILURE() << "decode/stream mismatch on "
                        << nlohmann::json(c.text.substr(0, 200)).dump();
      }
    }
  }
  EXPECT_EQ(failures, 0u);
}

// Random id sequences (many cutting UTF-8 characters) decoded by HF, with and without
// skip_special_tokens; and the streaming property on the same sequences.
TEST(TokenizerParity, DecodeCasesMatchHf) {
  std::ifstream in(FixturePath("decode_cases.jsonl"), std::ios::binary);
  std::string line;
  size_t count = 0, with_replacement = 0, skipped_differs = 0;
  while (std::getline(in, line)) {
    const auto rec = nlohmann::json::parse(line);
    const Tokenizer& tok = rec["tok"] == "v4" ? V4() : V3();
    const auto ids = rec["ids"].get<std::vector<int32_t>>();
    const std::string expected = rec["text"].get<std::string>();
    const std::string expected_skip =
        rec.contains("text_skip") ? rec["text_skip"].get<std::string>() : expected;
    auto text = tok.Decode(ids);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, expected) << line;
    auto skipped = tok.Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok());
    EXPECT_EQ(*skipped, expected_skip) << line;

    StreamingDetokenizer stream(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.Next(id);
      EXPECT_TRUE(IsValidUtf8(piece));
      streamed += piece;
    }
    streamed += stream.Flush();
    EXPECT_EQ(streamed, expected) << line;
    ++count;
    with_replacement += expected.find("\xEF\xBF\xBD") != std::string::npos;
    skipped_differs += rec.contains("text_skip");
  }
  EXPECT_GE(count, 1000u);
  EXPECT_GE(with_replacement, 100u);  // the cases do exercise the lossy path
  EXPECT_GE(skipped_differs, 100u);
}

}  // namespace
}  // namespace dsinfer::text
