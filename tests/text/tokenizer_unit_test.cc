// Behaviour of the tokenizer beyond corpus parity: spec token ids, plain-text mode, UTF-8 error
// handling, lossy decoding rules, streaming, unsupported configurations, and randomized inputs.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "text/tokenizer.h"
#include "text/tokenizer_bpe.h"
#include "text/utf8.h"
#include "tokenizer_test_util.h"

namespace dsinfer::text {
namespace {

using testing::V3;
using testing::V4;

TEST(Tokenizer, V4SpecialTokenIdsMatchSpec) {
  const Tokenizer& tok = V4();
  const std::pair<const char*, int32_t> expected[] = {
      {"<｜begin▁of▁sentence｜>", 0},
      {"<｜end▁of▁sentence｜>", 1},
      {"<｜▁pad▁｜>", 2},
      {"<｜User｜>", 128803},
      {"<｜Assistant｜>", 128804},
      {"<think>", 128821},
      {"</think>", 128822},
      {"｜DSML｜", 128825},
      {"<｜latest_reminder｜>", 128828},
      {"<｜action｜>", 128829},
      {"<｜image｜>", 129279},
  };
  for (const auto& [token, id] : expected) EXPECT_EQ(tok.TokenId(token), id) << token;
  EXPECT_EQ(tok.TokenId("Ġthe"), 270);  // a regular byte-level vocab entry
  EXPECT_FALSE(tok.TokenId("<｜no_such_token｜>").has_value());
  EXPECT_EQ(tok.vocab_size(), 129280);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_TRUE(tok.IsSpecial(0));
  EXPECT_FALSE(tok.IsSpecial(128803));  // <｜User｜> is an added but not "special" token
}

TEST(Tokenizer, V3LacksV4Tokens) {
  const Tokenizer& tok = V3();
  EXPECT_EQ(tok.vocab_size(), 128815);
  EXPECT_EQ(tok.TokenId("<｜User｜>"), 128803);
  EXPECT_FALSE(tok.TokenId("<think>").has_value());
  auto ids = tok.Encode("<think>", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_GT(ids->size(), 1u);
}

TEST(Tokenizer, PlainModeNeverEmitsAddedTokens) {
  const Tokenizer& tok = V4();
  const std::string text =
      "<｜begin▁of▁sentence｜>sys<｜User｜>hi<｜Assistant｜><think>x</think>｜DSML｜";
  auto special = tok.Encode(text, true);
  ASSERT_TRUE(special.ok());
  EXPECT_EQ((*special)[0], 0);
  EXPECT_EQ((*special)[2], 128803);
  auto plain = tok.Encode(text, false);
  ASSERT_TRUE(plain.ok());
  for (int32_t id : *plain) EXPECT_LT(id, 128000) << "plain mode produced an added token";
  for (int32_t id : *plain) EXPECT_GT(id, 2);  // nor BOS/EOS/pad, which live below 128000
  EXPECT_EQ(*tok.Decode(*plain), text);
}

TEST(Tokenizer, InvalidUtf8IsRejectedWithOffset) {
  const Tokenizer& tok = V4();
  const std::pair<std::string, size_t> bad[] = {
      {"\xff", 0},
      {"ab\x80", 2},
      {"\xc0\xaf", 0},
      {"x\xed\xa0\x80", 1},
      {"\xf4\x90\x80\x80", 0},
      {"\xe2\x82", 0},
      {"ok \xf0\x9f\x98", 3},
      {"\xf8\x88\x80\x80\x80", 0},
  };
  for (const auto& [text, offset] : bad) {
    for (bool allow_special : {true, false}) {
      auto ids = tok.Encode(text, allow_special);
      ASSERT_FALSE(ids.ok());
      EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(ids.status().message().find("byte " + std::to_string(offset)), std::string::npos)
          << ids.status().message();
    }
  }
  for (const char* good : {"\xf4\x8f\xbf\xbf", "\xef\xbf\xbf", "\xed\x9f\xbf", "\x7f"}) {
    EXPECT_TRUE(tok.Encode(good, true).ok()) << good;
  }
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  for (int32_t id : {-1, 129280, 1 << 30}) {
    auto text = V4().Decode(std::vector<int32_t>{19923, id});
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), StatusCode::kOutOfRange);
  }
  EXPECT_FALSE(V3().Decode(std::vector<int32_t>{128815}).ok());  // V4-only id
  EXPECT_TRUE(V3().Decode(std::vector<int32_t>{128814}).ok());
}

TEST(Utf8, LossyFollowsMaximalSubparts) {
  const std::pair<std::string, std::string> cases[] = {
      {"\xF0\x90\x80"
       "a",
       "\uFFFD"
       "a"},
      {"\xE0\x80\xAF", "\uFFFD\uFFFD\uFFFD"},  // E0 needs A0..BF next: three lone bytes
      {"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"},  // surrogate
      {"\xF4\x90", "\uFFFD\uFFFD"},
      {"a\xC3", "a\uFFFD"},
      {"\xE2\x82\xAC\xE2\x82", "€\uFFFD"},
      {"\xC3\xA9\x80", "é\uFFFD"},
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(Utf8Lossy(in), out);
}

TEST(Utf8, StreamSafePrefixHoldsOnlyPossibleCharacters) {
  EXPECT_EQ(StreamSafePrefixLength("a\xE2\x82"), 1u);
  EXPECT_EQ(StreamSafePrefixLength("a\xE2\x82\xAC"), 4u);
  EXPECT_EQ(StreamSafePrefixLength("a\xF0"), 1u);
  EXPECT_EQ(StreamSafePrefixLength("\x80"), 1u);      // stray continuation: nothing to wait for
  EXPECT_EQ(StreamSafePrefixLength("\xE2\x28"), 2u);  // already invalid
  EXPECT_EQ(StreamSafePrefixLength("\xE0\x80"), 2u);  // E0 80 can never complete
  EXPECT_EQ(StreamSafePrefixLength(""), 0u);
}

// Id of the single-byte token for `byte`.
int32_t ByteToken(const Tokenizer& tok, uint8_t byte) {
  std::string ch;
  AppendUtf8(ByteToByteLevelChar(byte), &ch);
  return *tok.TokenId(ch);
}

TEST(StreamingDetokenizer, HoldsSplitCharactersUntilComplete) {
  const Tokenizer& tok = V4();
  StreamingDetokenizer stream(tok);
  EXPECT_EQ(stream.Next(ByteToken(tok, 'a')), "a");
  EXPECT_EQ(stream.Next(ByteToken(tok, 0xE2)), "");
  EXPECT_EQ(stream.Next(ByteToken(tok, 0x82)), "");
  EXPECT_EQ(stream.Next(ByteToken(tok, 0xAC)), "€");
  EXPECT_EQ(stream.Next(ByteToken(tok, 0xF0)), "");
  EXPECT_EQ(stream.Next(128803), "\uFFFD<｜User｜>");  // broken character, then an added token
  EXPECT_EQ(stream.Next(ByteToken(tok, 0xC3)), "");
  EXPECT_EQ(stream.Flush(), "\uFFFD");
  EXPECT_EQ(stream.Flush(), "");
  EXPECT_EQ(stream.Next(-5), "");  // unknown ids are ignored
}

TEST(Tokenizer, LoadErrorsAreStatusesNotCrashes) {
  EXPECT_EQ(Tokenizer::FromJson("not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Tokenizer::FromJson("{}").ok());
  EXPECT_FALSE(Tokenizer::FromJson("[1,2]").ok());
  EXPECT_FALSE(Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": 3, "merges": []}})").ok());
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            StatusCode::kNotFound);
}

// A small byte-level BPE file: the 256 byte tokens, then "ab", "abab", "cd".
nlohmann::json TinyTokenizer(bool array_merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteToByteLevelChar(static_cast<uint8_t>(b)), &ch);
    vocab[ch] = b;
  }
  vocab["ab"] = 256;
  vocab["abab"] = 257;
  vocab["cd"] = 258;
  nlohmann::json merges = array_merges
                              ? nlohmann::json::parse(R"([["a","b"],["c","d"],["ab","ab"]])")
                              : nlohmann::json::parse(R"(["a b","c d","ab ab"])");
  return {
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"String", "|"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", 259}, {"content", "<x>"}, {"special", true}, {"normalized", false}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
}

TEST(Tokenizer, TinyBpeMergesInRankOrderInBothMergeForms) {
  for (bool array_merges : {false, true}) {
    auto tok = Tokenizer::FromJson(TinyTokenizer(array_merges).dump());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    // "ababa|cd": the literal "|" split isolates "|"; "abab"+"a", "|", "cd".
    auto ids = tok->Encode("ababa|cd<x>", true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, (std::vector<int32_t>{257, 'a', '|', 258, 259}));
    EXPECT_EQ(*tok->Decode(*ids), "ababa|cd<x>");
    EXPECT_EQ(*tok->Decode(*ids, /*skip_special_tokens=*/true), "ababa|cd");
    EXPECT_EQ(tok->vocab_size(), 260);
  }
}

TEST(Tokenizer, UnsupportedConfigurationsAreRejected) {
  auto with = [](const char* pointer, nlohmann::json value) {
    nlohmann::json j = TinyTokenizer(false);
    j[nlohmann::json::json_pointer(pointer)] = std::move(value);
    return Tokenizer::FromJson(j.dump()).status().code();
  };
  EXPECT_EQ(with("/normalizer", {{"type", "NFC"}}), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/pre_tokenizer/pretokenizers/0/behavior", "Removed"), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/pre_tokenizer/pretokenizers/0/invert", true), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/pre_tokenizer/pretokenizers/1/use_regex", true), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/added_tokens/0/lstrip", true), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/decoder", {{"type", "Metaspace"}}), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/model/type", "WordPiece"), StatusCode::kUnimplemented);
  EXPECT_EQ(with("/model/merges/0", "a b c"), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/model/merges/0", 7), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/model/merges", 7), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/model/vocab", 3), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/model/vocab/ab", "x"), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/model/vocab/ab", -4), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/model/merges/0", "a zz"), StatusCode::kInvalidArgument);
  EXPECT_EQ(with("/pre_tokenizer/pretokenizers/0/pattern", {{"Regex", "(unclosed"}}),
            StatusCode::kInvalidArgument);
}

// Ids index dense tables: one past kMaxTokenId (or INT32_MAX, whose size + 1 overflowed) is
// refused before anything is allocated, in the vocab and in added_tokens; kMaxTokenId itself
// loads. fuzz_tokenizer found a file whose id 133,333,333 asked for a 4 GiB table.
TEST(Tokenizer, TokenIdsPastTheLimitAreRefused) {
  auto with = [](const char* pointer, int64_t id) {
    nlohmann::json j = TinyTokenizer(false);
    j[nlohmann::json::json_pointer(pointer)] = id;
    return Tokenizer::FromJson(j.dump());
  };
  for (const char* pointer : {"/model/vocab/cd", "/added_tokens/0/id"}) {
    for (int64_t id : {kMaxTokenId + 1, int64_t{INT32_MAX}, int64_t{133333333}}) {
      auto tok = with(pointer, id);
      EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << pointer << " " << id;
      EXPECT_NE(tok.status().message().find(std::to_string(kMaxTokenId)), std::string::npos)
          << tok.status().message();
    }
    auto edge = with(pointer, kMaxTokenId);
    ASSERT_TRUE(edge.ok()) << pointer << ": " << edge.status().ToString();
    EXPECT_EQ(edge->vocab_size(), kMaxTokenId + 1);
  }
}

// Randomized inputs: arbitrary bytes must give a clean accept/reject decision matching UTF-8
// validity; accepted text must round-trip in both modes; random ids must decode and stream.
TEST(TokenizerFuzz, RandomBytesAndIds) {
  const Tokenizer& tok = V4();
  std::mt19937 rng(12345);
  const std::string alphabet[] = {
      "<",    "｜",   "User", "▁",    ">", " ", "\n", "think",           "/",
      "\xe2", "\x82", "\xac", "\xff", "1", "é", "中", "\xf0\x9f\x98\x80"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      if (rng() % 2) {
        text += alphabet[rng() % std::size(alphabet)];
      } else {
        text.push_back(static_cast<char>(rng() % 256));
      }
    }
    for (bool allow_special : {true, false}) {
      auto ids = tok.Encode(text, allow_special);
      ASSERT_EQ(ids.ok(), IsValidUtf8(text));
      if (ids.ok()) {
        EXPECT_EQ(*tok.Decode(*ids), text);
      }
    }
  }
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int32_t> ids(rng() % 30);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % tok.vocab_size());
    auto text = tok.Decode(ids);
    ASSERT_TRUE(text.ok());
    ASSERT_TRUE(IsValidUtf8(*text));
    StreamingDetokenizer stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Next(id);
    streamed += stream.Flush();
    EXPECT_EQ(streamed, *text);
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer& tok = V4();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "Hello 世界 " + std::to_string(i) + " <｜User｜> ";
  auto expected = tok.Encode(text, true);
  ASSERT_TRUE(expected.ok());
  std::vector<int32_t> results[2];
  std::thread a([&] { results[0] = *tok.Encode(text, true); });
  std::thread b([&] { results[1] = *tok.Encode(text, true); });
  a.join();
  b.join();
  EXPECT_EQ(results[0], *expected);
  EXPECT_EQ(results[1], *expected);
}

}  // namespace
}  // namespace dsinfer::text
