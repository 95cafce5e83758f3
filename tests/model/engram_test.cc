// V4.1 Engram hashing (model/engram.h) and token map (text/engram_token_map.h) against the
// third-party constants of spec §14.5 and the oracle's fixtures (tests/fixtures/v41/engram:
// the token map of the V4.1 tokenizer, 10,000 hashed id sequences with dead positions).
#include "model/engram.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "io/safetensors.h"
#include "model/config.h"
#include "text/engram_token_map.h"
#include "text/tokenizer.h"

namespace dsinfer::model {
namespace {

std::string Fixture(const std::string& rel) { return std::string(DSINFER_SOURCE_DIR) + "/" + rel; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename T>
std::vector<T> Tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo* info = f.Find(name);
  EXPECT_NE(info, nullptr) << name;
  if (info == nullptr) return {};
  auto ref = f.Ref(*info);
  std::vector<T> out(ref.bytes.size() / sizeof(T));
  std::memcpy(out.data(), ref.bytes.data(), out.size() * sizeof(T));
  return out;
}

// The released V4.1-Flash Engram geometry (spec §14.1).
EngramConfig RealEngram() {
  EngramConfig e;
  e.layer_ids = {1, 14};
  e.num_embeddings = {384006168, 384016682};
  e.max_ngram_size = 4, e.vocab_size = 16000000, e.n_heads = 8, e.head_dim = 256, e.pad_id = 2;
  e.compressed_vocab_size = 99092;
  return e;
}

TEST(Engram, PrimesAndMultipliersAreTheThirdPartyValues) {
  const EngramConfig e = RealEngram();
  const auto primes = EngramPrimes(e);
  ASSERT_EQ(primes.size(), 2u);
  ASSERT_EQ(primes[0].size(), 24u);
  EXPECT_EQ(primes[0][0], 16000057);
  EXPECT_EQ(primes[0][1], 16000079);
  EXPECT_EQ(primes[0][2], 16000081);
  EXPECT_EQ(primes[1][21], 16000877);
  EXPECT_EQ(primes[1][22], 16000879);
  EXPECT_EQ(primes[1][23], 16000889);
  EXPECT_EQ(EngramTableRows(e), (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(EngramMultipliers(1, 99092, 4),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(EngramMultipliers(14, 99092, 4),
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  // A wrong table size is refused at load, naming the config key.
  EngramConfig bad = e;
  bad.num_embeddings[1] += 1;
  auto h = EngramHasher::Create(bad);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("engram_num_embeddings[1]"), std::string::npos);
}

TEST(Engram, HashesEqualTheOracleOnTenThousandSequences) {
  auto f = io::SafetensorsFile::Open(Fixture("tests/fixtures/v41/engram/hashes.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto tm = io::SafetensorsFile::Open(Fixture("tests/fixtures/v41/engram/token_map.safetensors"));
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  const auto token_map = Tensor<int32_t>(**tm, "token_map");
  const auto ids = Tensor<int32_t>(**f, "ids");           // [N, 6] token ids
  const auto dead = Tensor<uint8_t>(**f, "dead");         // [N, 6]
  const auto last = Tensor<int32_t>(**f, "last_ids");     // [N, 2, 24]
  const auto digest = Tensor<int64_t>(**f, "digest");     // [N]
  const auto primes = Tensor<int64_t>(**f, "primes");     // [2, 24]
  const auto offsets = Tensor<int64_t>(**f, "offsets");   // [2, 24]
  const auto mult = Tensor<int64_t>(**f, "multipliers");  // [2, 4]
  const size_t N = digest.size(), L = 6;
  ASSERT_EQ(N, 10000u);
  auto hasher = EngramHasher::Create(RealEngram());
  ASSERT_TRUE(hasher.ok()) << hasher.status().ToString();
  for (int j = 0; j < 2; ++j) {
    for (int r = 0; r < 24; ++r) {
      EXPECT_EQ(hasher->primes(j)[r], primes[j * 24 + r]);
      EXPECT_EQ(hasher->offsets(j)[r], offsets[j * 24 + r]);
    }
    for (int n = 0; n < 4; ++n) EXPECT_EQ(hasher->multipliers(j)[n], mult[j * 4 + n]);
  }
  const int32_t pad_class = token_map[2];
  int mismatches = 0, with_dead = 0;
  for (size_t q = 0; q < N; ++q) {
    std::vector<int32_t> classes(L);
    bool any_dead = false;
    for (size_t p = 0; p < L; ++p) {
      classes[p] = dead[q * L + p] ? kDeadClass : token_map[ids[q * L + p]];
      any_dead = any_dead || dead[q * L + p];
    }
    with_dead += any_dead;
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t row[24];
    for (size_t p = 0; p < L; ++p) {
      int64_t tok[4];
      NgramClasses(classes, static_cast<int64_t>(p), 4, pad_class, tok);
      for (int j = 0; j < 2; ++j) {
        hasher->RowIds(j, tok, row);
        for (int r = 0; r < 24; ++r) {
          for (int b = 0; b < 8; ++b)
            h = (h ^ ((static_cast<uint64_t>(row[r]) >> (8 * b)) & 0xff)) * 0x100000001b3ull;
          if (p == L - 1 && row[r] != last[(q * 2 + j) * 24 + r]) ++mismatches;
        }
      }
    }
    if (static_cast<int64_t>(h) != digest[q]) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(with_dead, 500);  // the fixture exercises blocking past dead positions
}

TEST(Engram, TokenMapOfTheV41TokenizerEqualsTheOracles) {
  auto json = text::ApplyAddedTokenOverlay(
      ReadAll(Fixture("tests/fixtures/tokenizer/deepseek-v4/tokenizer.json")),
      ReadAll(Fixture("tests/fixtures/v41/tokenizer_overlay.json")));
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  auto tok = text::Tokenizer::FromJson(*json);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->TokenId("<｜System｜>"), 128799);
  EXPECT_EQ(tok->TokenId("<｜▁pad▁｜>"), 2);
  auto map = text::BuildEngramTokenMap(*tok);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(map->classes, 99092);
  auto tm = io::SafetensorsFile::Open(Fixture("tests/fixtures/v41/engram/token_map.safetensors"));
  ASSERT_TRUE(tm.ok());
  const auto want = Tensor<int32_t>(**tm, "token_map");
  ASSERT_EQ(map->class_of.size(), want.size());
  int mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (map->class_of[i] != want[i] && mismatches++ < 10)
      ADD_FAILURE() << "id " << i << " (" << *tok->TokenString(static_cast<int32_t>(i))
                    << "): class " << map->class_of[i] << ", oracle " << want[i];
  EXPECT_EQ(mismatches, 0);
}

TEST(Engram, NormalizationSteps) {
  auto n = [](const char* s) { return text::EngramNormalize(s).value(); };
  EXPECT_EQ(n(" The"), "the");
  EXPECT_EQ(n("Élan"), "elan");        // NFD + marks stripped
  EXPECT_EQ(n("ﬁ"), "fi");             // NFKC
  EXPECT_EQ(n("\n\n"), " ");           // a lone space survives the strip
  EXPECT_EQ(n("a \t\r\nb"), "a b");    // whitespace runs collapse
  EXPECT_EQ(n("\xE3\x80\x80x"), "x");  // U+3000 -> " " by NFKC, then stripped
  EXPECT_EQ(n("ΣΑΣ"), "σασ");          // per-character lowercase: no final sigma
  EXPECT_FALSE(text::EngramNormalize("\xff").ok());
}

}  // namespace
}  // namespace dsinfer::model
