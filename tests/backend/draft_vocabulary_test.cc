// Drafting over a draft vocabulary (model/draft_vocabulary.h; V4Forward::VocabularyProjection):
// the MTP block's and the dSpark block's logits and the Markov bias are the whole vocabulary's at
// the subset's ids, bit for bit, and -inf (the bias 0) everywhere else; what else a draft returns
// (the MTP streams, the dSpark x and confidence) and the backbone's logits do not change; the
// profiled ops pass the vocabulary through; bad vocabularies are refused and change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_model.h"
#include "backend/op_profile.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

// Every third id, and the first and last (the gather's edges).
std::vector<int32_t> EveryThirdId(int64_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab; ++i)
    if (i % 3 == 1 || i == 0 || i == vocab - 1) ids.push_back(i);
  return ids;
}

std::vector<int32_t> RandomIds(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> any(2, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = any(rng);
  return ids;
}

// sub [rows, V] is full [rows, V] at `ids` and `fill` elsewhere, exactly.
void ExpectRestricted(const std::vector<float>& full, const std::vector<float>& sub,
                      std::span<const int32_t> ids, int64_t V, float fill, const char* what) {
  ASSERT_EQ(full.size(), sub.size()) << what;
  ASSERT_EQ(full.size() % static_cast<size_t>(V), 0u) << what;
  std::vector<char> in(static_cast<size_t>(V), 0);
  for (int32_t id : ids) in[id] = 1;
  int64_t mismatches = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    const bool kept = in[i % static_cast<size_t>(V)] != 0;
    const float want = kept ? full[i] : fill;
    if (!(sub[i] == want)) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0) << what << ": entries differing from the restriction of the full ones";
}

class DraftVocabularyV4 : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = CpuModel::Create(w_, Numerics::Official(), pool_);
    auto b = CpuModel::Create(w_, Numerics::Official(), pool_);
    ASSERT_TRUE(a.ok() && b.ok());
    full_ = std::move(a).value();
    sub_ = std::move(b).value();
    ids_ = EveryThirdId(w_.config().vocab_size);
    ASSERT_TRUE(sub_->UseDraftVocabulary(ids_).ok());
  }
  const model::ModelWeights& w_ = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool_{2};
  std::unique_ptr<CpuModel> full_, sub_;
  std::vector<int32_t> ids_;
};

TEST_F(DraftVocabularyV4, MtpLogitsAreTheFullOnesAtTheSubsetAndTheBackboneIsUntouched) {
  const int64_t V = w_.config().vocab_size, HD = int64_t{w_.config().hc_mult} * w_.config().hidden;
  const std::vector<int32_t> ids = RandomIds(40, V, 3);
  ForwardOutput a, b;
  auto sa = full_->NewSequence(), sb = sub_->NewSequence();
  ASSERT_TRUE(full_->Forward(*sa, ids, {.all_logits = true, .want_hidden = true}, &a).ok());
  ASSERT_TRUE(sub_->Forward(*sb, ids, {.all_logits = true, .want_hidden = true}, &b).ok());
  EXPECT_EQ(a.logits, b.logits);  // the target's logits: the whole vocabulary's
  EXPECT_EQ(a.hidden, b.hidden);
  const std::vector<int32_t> next(ids.begin() + 1, ids.end());
  const std::span<const float> hidden(a.hidden.data(), next.size() * HD);
  std::vector<float> la, lb;
  auto ma = full_->NewSequence(), mb = sub_->NewSequence();
  ASSERT_TRUE(full_->ForwardMtp(*ma, hidden.first(30 * HD), std::span(next).first(30), &la).ok());
  ASSERT_TRUE(sub_->ForwardMtp(*mb, hidden.first(30 * HD), std::span(next).first(30), &lb).ok());
  ExpectRestricted(la, lb, ids_, V, -INFINITY, "MTP logits, 30 rows");
  // The drafting call: the last row's logits and streams.
  std::vector<float> last_a, last_b, streams_a, streams_b;
  ASSERT_TRUE(full_->ForwardMtpLast(*ma, hidden.subspan(30 * HD), std::span(next).subspan(30),
                                    &last_a, &streams_a)
                  .ok());
  ASSERT_TRUE(sub_->ForwardMtpLast(*mb, hidden.subspan(30 * HD), std::span(next).subspan(30),
                                   &last_b, &streams_b)
                  .ok());
  ExpectRestricted(last_a, last_b, ids_, V, -INFINITY, "MTP drafting logits");
  EXPECT_EQ(streams_a, streams_b);
}

TEST_F(DraftVocabularyV4, ProfiledOpsPassTheVocabularyThrough) {
  const int64_t V = w_.config().vocab_size, HD = int64_t{w_.config().hc_mult} * w_.config().hidden;
  const std::vector<int32_t> ids = RandomIds(12, V, 5);
  ForwardOutput out;
  auto s = full_->NewSequence();
  ASSERT_TRUE(full_->Forward(*s, ids, {.all_logits = true, .want_hidden = true}, &out).ok());
  const std::vector<int32_t> next(ids.begin() + 1, ids.end());
  const std::span<const float> hidden(out.hidden.data(), next.size() * HD);
  std::vector<float> plain, profiled;
  auto m1 = sub_->NewSequence();
  ASSERT_TRUE(sub_->ForwardMtp(*m1, hidden, next, &plain).ok());
  OpProfile profile;
  sub_->set_op_profile(&profile);
  auto m2 = sub_->NewSequence();
  ASSERT_TRUE(sub_->ForwardMtp(*m2, hidden, next, &profiled).ok());
  sub_->set_op_profile(nullptr);
  EXPECT_EQ(plain, profiled);
  bool counted = false;
  for (const auto& e : profile.Sorted()) counted |= e.op == "linear head (draft vocabulary)";
  EXPECT_TRUE(counted) << profile.Table(1);
}

TEST_F(DraftVocabularyV4, BadVocabulariesAreRefusedAndChangeNothing) {
  const int64_t V = w_.config().vocab_size;
  const std::vector<std::vector<int32_t>> bad = {
      {}, {5, 3}, {3, 3}, {-1, 4}, {0, static_cast<int32_t>(V)}};
  for (const auto& ids : bad) EXPECT_FALSE(full_->UseDraftVocabulary(ids).ok());
  // full_ still drafts over the whole vocabulary: no -inf anywhere.
  const int64_t HD = int64_t{w_.config().hc_mult} * w_.config().hidden;
  const std::vector<int32_t> ids = RandomIds(6, V, 9);
  ForwardOutput out;
  auto s = full_->NewSequence();
  ASSERT_TRUE(full_->Forward(*s, ids, {.want_hidden = true}, &out).ok());
  std::vector<float> logits;
  auto m = full_->NewSequence();
  const std::vector<int32_t> next(ids.begin() + 1, ids.end());
  ASSERT_TRUE(full_->ForwardMtp(*m, std::span(out.hidden).first(next.size() * HD), next, &logits)
                  .ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// V4.1's dSpark: the block's logits and the Markov bias over the subset; x and the confidence
// unchanged.
TEST(DraftVocabularyV41, DsparkLogitsAndMarkovBiasAreTheFullOnesAtTheSubset) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-v41-a");
  ThreadPool pool(2);
  auto a = CpuModel::Create(w, Numerics::Official(), pool);
  auto b = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t V = w.config().vocab_size, D = w.config().hidden;
  const std::vector<int32_t> vocabulary = EveryThirdId(V);
  ASSERT_TRUE((*b)->UseDraftVocabulary(vocabulary).ok());
  const std::vector<int32_t> ids = RandomIds(150, V, 7);
  struct Drafted {
    std::vector<float> logits, x, bias, confidence;
  };
  auto draft = [&](CpuModel& m) {
    auto st = m.NewSequence();
    ForwardOutput out;
    EXPECT_TRUE(m.Forward(*st, ids, {.want_hidden = true, .want_logits = false}, &out).ok());
    SequenceState* states[] = {st.get()};
    const std::span<const float> hidden[] = {out.hidden};
    EXPECT_TRUE(m.DsparkSeedBatch(states, hidden).ok());
    Drafted d;
    const int32_t pending[] = {ids.back()};
    std::vector<float>* logits[] = {&d.logits};
    std::vector<float>* x[] = {&d.x};
    const Status s = m.DsparkDraftBatch(states, pending, logits, x);
    EXPECT_TRUE(s.ok()) << s.ToString();
    const int block = m.config().dspark.block_size;
    std::vector<int32_t> prev(static_cast<size_t>(block), ids.back());
    for (int j = 1; j < block; ++j) prev[j] = ids[static_cast<size_t>(j) * 11];
    EXPECT_TRUE(m.DsparkMarkov(prev, std::span<const float>(d.x).first(block * D), &d.bias,
                               &d.confidence)
                    .ok());
    return d;
  };
  const Drafted full = draft(**a), sub = draft(**b);
  ExpectRestricted(full.logits, sub.logits, vocabulary, V, -INFINITY, "dSpark block logits");
  ExpectRestricted(full.bias, sub.bias, vocabulary, V, 0.0f, "Markov bias");
  EXPECT_EQ(full.x, sub.x);
  EXPECT_EQ(full.confidence, sub.confidence);
}

}  // namespace
}  // namespace dsinfer::backend::cpu
