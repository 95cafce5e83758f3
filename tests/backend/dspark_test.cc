// V4.1's dSpark stages on the CPU (spec §14.6; V4Forward::DsparkSeed / DsparkDraft /
// DsparkMarkov): feeding the stage rings in any chunking gives the same drafts; a draft block
// changes no state and gives each sequence in a batch what it gets alone; exported states carry
// the rings; bad calls are refused before anything changes; and the rollback stress: verify
// steps with random accept lengths at every offset mod 128 and mod the compression ratios leave
// the state of plain decoding, bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "backend/cpu/cpu_model.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

struct Draft {
  std::vector<float> logits, x;  // [block, vocab], [block, hidden]
};

Draft DraftOf(CpuModel& m, SequenceState& st, int32_t token) {
  Draft d;
  SequenceState* states[] = {&st};
  const int32_t tokens[] = {token};
  std::vector<float>* logits[] = {&d.logits};
  std::vector<float>* x[] = {&d.x};
  const Status s = m.DsparkDraftBatch(states, tokens, logits, x);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return d;
}

// Forward `tokens` and feed the stage rings with their hidden rows.
void Advance(CpuModel& m, SequenceState& st, std::span<const int32_t> tokens) {
  ForwardOutput out;
  ASSERT_TRUE(m.Forward(st, tokens, {.want_hidden = true, .want_logits = false}, &out).ok());
  SequenceState* states[] = {&st};
  const std::span<const float> hidden[] = {out.hidden};
  const Status s = m.DsparkSeedBatch(states, hidden);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

class Dspark : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto& w = dsinfer::testing::PresetWeights(GetParam());
    auto made = CpuModel::Create(w, Numerics::Official(), pool_);
    ASSERT_TRUE(made.ok());
    m_ = std::move(made).value();
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> any(2, m_->config().vocab_size - 1);
    tokens_.resize(400);
    for (auto& t : tokens_) t = any(rng);
  }
  ThreadPool pool_{2};
  std::unique_ptr<CpuModel> m_;
  std::vector<int32_t> tokens_;
};

TEST_P(Dspark, AnyChunkingOfTheRingFeedGivesTheSameDraft) {
  CpuModel& m = *m_;
  ASSERT_TRUE(m.CheckDspark().ok());
  const int64_t n = 3 * m.config().window + 5;  // the rings wrap
  auto whole = m.NewSequence();
  Advance(m, *whole, std::span(tokens_).first(n));
  auto pieces = m.NewSequence();
  for (int64_t at = 0, step = 1; at < n; at += step, step = step * 2 + 1)
    Advance(m, *pieces, std::span(tokens_).subspan(at, std::min(step, n - at)));
  ASSERT_EQ(whole->mtp_n_tokens(), n);
  ASSERT_EQ(pieces->mtp_n_tokens(), n);
  const Draft a = DraftOf(m, *whole, tokens_[n]), b = DraftOf(m, *pieces, tokens_[n]);
  ASSERT_EQ(a.logits.size(), static_cast<size_t>(m.config().dspark.block_size) *
                                 static_cast<size_t>(m.config().vocab_size));
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.x, b.x);
}

TEST_P(Dspark, ADraftChangesNoStateAndIsTheSameAloneAndBatched) {
  CpuModel& m = *m_;
  const std::vector<int64_t> lengths = {1, 17, 130, 257};
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<Draft> alone;
  for (int64_t len : lengths) {
    seqs.push_back(m.NewSequence());
    Advance(m, *seqs.back(), std::span(tokens_).subspan(3, len));
    alone.push_back(DraftOf(m, *seqs.back(), tokens_[3 + len]));
  }
  // Again, alone: the same (nothing was stored), and the state is unchanged.
  const std::span<const int32_t> consumed = std::span(tokens_).subspan(3, lengths[2]);
  auto before = m.Export(*seqs[2], consumed);
  ASSERT_TRUE(before.ok());
  const Draft again = DraftOf(m, *seqs[2], tokens_[3 + lengths[2]]);
  EXPECT_EQ(again.logits, alone[2].logits);
  auto after = m.Export(*seqs[2], consumed);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*before == *after);
  EXPECT_EQ(seqs[2]->mtp_n_tokens(), lengths[2]);
  // Batched.
  std::vector<Draft> batched(seqs.size());
  std::vector<SequenceState*> states;
  std::vector<int32_t> ids;
  std::vector<std::vector<float>*> logits, x;
  for (size_t i = 0; i < seqs.size(); ++i) {
    states.push_back(seqs[i].get());
    ids.push_back(tokens_[3 + lengths[i]]);
    logits.push_back(&batched[i].logits);
    x.push_back(&batched[i].x);
  }
  ASSERT_TRUE(m.DsparkDraftBatch(states, ids, logits, x).ok());
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(batched[i].logits, alone[i].logits) << "length " << lengths[i];
    EXPECT_EQ(batched[i].x, alone[i].x) << "length " << lengths[i];
  }
  // Logits of the first rows only (the drafts wanted): the same rows, bit for bit.
  for (int n : {0, 1, m.config().dspark.block_size - 1}) {
    Draft part;
    SequenceState* one[] = {seqs[2].get()};
    const int32_t tok[] = {tokens_[3 + lengths[2]]};
    std::vector<float>* lo[] = {&part.logits};
    std::vector<float>* xo[] = {&part.x};
    const int wanted[] = {n};
    ASSERT_TRUE(m.DsparkDraftBatch(one, tok, lo, xo, wanted).ok());
    ASSERT_EQ(part.logits.size(), static_cast<size_t>(n) * m.config().vocab_size);
    EXPECT_TRUE(std::equal(part.logits.begin(), part.logits.end(), alone[2].logits.begin()));
    EXPECT_EQ(part.x, alone[2].x);
  }
  // The rings travel in exported states: an imported copy drafts the same.
  auto copy = m.Import(*before, consumed);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ(DraftOf(m, **copy, tokens_[3 + lengths[2]]).logits, alone[2].logits);
}

TEST_P(Dspark, TheMarkovBiasAndConfidenceAreBatchInvariant) {
  CpuModel& m = *m_;
  const int64_t D = m.config().hidden, V = m.config().vocab_size;
  auto st = m.NewSequence();
  Advance(m, *st, std::span(tokens_).first(40));
  const Draft d = DraftOf(m, *st, tokens_[40]);
  const int B = m.config().dspark.block_size;
  std::vector<int32_t> prev(tokens_.begin() + 40, tokens_.begin() + 40 + B);
  std::vector<float> bias, conf;
  ASSERT_TRUE(m.DsparkMarkov(prev, d.x, &bias, &conf).ok());
  ASSERT_EQ(bias.size(), static_cast<size_t>(B * V));
  ASSERT_EQ(conf.size(), static_cast<size_t>(B));
  for (int j = 0; j < B; ++j) {
    std::vector<float> b1, c1;
    ASSERT_TRUE(m.DsparkMarkov(std::span(prev).subspan(j, 1),
                               std::span(d.x).subspan(j * D, D), &b1, &c1)
                    .ok());
    EXPECT_TRUE(std::equal(b1.begin(), b1.end(), bias.begin() + j * V)) << "row " << j;
    EXPECT_EQ(c1[0], conf[j]) << "row " << j;
  }
  // The bias depends on the previous token only.
  std::vector<float> b2, c2;
  const int32_t other = prev[0] == 5 ? 6 : 5;
  ASSERT_TRUE(m.DsparkMarkov(std::span(&other, 1), std::span(d.x).first(D), &b2, &c2).ok());
  EXPECT_FALSE(std::equal(b2.begin(), b2.end(), bias.begin()));
}

TEST_P(Dspark, BadCallsAreRefusedBeforeAnythingChanges) {
  CpuModel& m = *m_;
  auto st = m.NewSequence();
  ForwardOutput out;
  ASSERT_TRUE(m.Forward(*st, std::span(tokens_).first(10), {.want_hidden = true}, &out).ok());
  ASSERT_EQ(out.hidden.size(), static_cast<size_t>(10 * m.HiddenWidth()));
  // A draft before the rings hold every position.
  Draft d;
  SequenceState* states[] = {st.get()};
  const int32_t tok[] = {tokens_[10]};
  std::vector<float>* lo[] = {&d.logits};
  std::vector<float>* xo[] = {&d.x};
  EXPECT_FALSE(m.DsparkDraftBatch(states, tok, lo, xo).ok());
  // Rows past the backbone, and rows of the wrong width.
  std::vector<float> too_many(out.hidden);
  too_many.insert(too_many.end(), out.hidden.begin(), out.hidden.begin() + m.HiddenWidth());
  const std::span<const float> h1[] = {too_many};
  EXPECT_FALSE(m.DsparkSeedBatch(states, h1).ok());
  const std::span<const float> h2[] = {
      std::span<const float>(out.hidden).first(out.hidden.size() - 1)};
  EXPECT_FALSE(m.DsparkSeedBatch(states, h2).ok());
  EXPECT_EQ(st->mtp_n_tokens(), 0);
  // A token outside the vocabulary.
  const std::span<const float> h3[] = {out.hidden};
  ASSERT_TRUE(m.DsparkSeedBatch(states, h3).ok());
  const int32_t bad[] = {static_cast<int32_t>(m.config().vocab_size)};
  EXPECT_FALSE(m.DsparkDraftBatch(states, bad, lo, xo).ok());
  std::vector<float> bias, conf;
  EXPECT_FALSE(m.DsparkMarkov(bad, std::vector<float>(m.config().hidden), &bias, &conf).ok());
}

// Verify steps of 1 + k rows with random accept lengths, the rejected positions rolled back and
// only the accepted ones fed to the rings, at offsets covering every residue mod 128 and mod 2
// (the compression ratios of these presets): the state is that of plain decoding, bit for bit.
TEST_P(Dspark, RandomAcceptLengthsLeaveTheStateOfPlainDecoding) {
  CpuModel& m = *m_;
  const model::ModelConfig& c = m.config();
  const int64_t K = m.HiddenWidth();
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> any_token(2, c.vocab_size - 1);
  std::vector<int32_t> tokens(1600);
  for (auto& t : tokens) t = any_token(rng);
  auto spec = m.NewSequence();
  const int64_t prompt = 37;
  Advance(m, *spec, std::span(tokens).first(prompt));
  std::set<int64_t> offsets128, offsets2;
  int64_t n = prompt;
  ForwardOutput out;
  while ((offsets128.size() < 128 || offsets2.size() < 2) && n + 6 < 1500) {
    offsets128.insert(n % 128);
    offsets2.insert(n % 2);
    const int k = std::uniform_int_distribution<int>(1, c.dspark.block_size)(rng);
    const int accept = rng() % 2 == 0 ? 0 : std::uniform_int_distribution<int>(1, k)(rng);
    // A draft block from the current state (read only), then the verify step.
    (void)DraftOf(m, *spec, tokens[n]);
    std::vector<int32_t> chunk(tokens.begin() + n, tokens.begin() + n + 1 + accept);
    while (static_cast<int>(chunk.size()) < k + 1) chunk.push_back(any_token(rng));
    ASSERT_TRUE(m.Forward(*spec, chunk, {.all_logits = true, .want_hidden = true}, &out).ok());
    ASSERT_TRUE(m.Truncate(*spec, n + 1 + accept).ok());
    // The rings take the accepted positions (Truncate may have taken back the last one).
    const int64_t done = spec->mtp_n_tokens(), now = spec->n_tokens();
    SequenceState* states[] = {spec.get()};
    const std::span<const float> rows[] = {
        std::span<const float>(out.hidden).subspan((done - n) * K, (now - done) * K)};
    ASSERT_TRUE(m.DsparkSeedBatch(states, rows).ok());
    n = now;
  }
  ASSERT_EQ(offsets128.size(), 128u) << "the walk ended before covering every offset";
  auto plain = m.NewSequence();
  for (int64_t p = 0; p < n; ++p) Advance(m, *plain, std::span(tokens).subspan(p, 1));
  const std::span<const int32_t> consumed(tokens.data(), n);
  auto spec_blob = m.Export(*spec, consumed), plain_blob = m.Export(*plain, consumed);
  ASSERT_TRUE(spec_blob.ok() && plain_blob.ok());
  EXPECT_TRUE(*spec_blob == *plain_blob) << "exported states differ after " << n << " tokens";
  const Draft a = DraftOf(m, *spec, tokens[n]), b = DraftOf(m, *plain, tokens[n]);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.x, b.x);
}

INSTANTIATE_TEST_SUITE_P(Presets, Dspark,
                         ::testing::Values("tiny-v41-a", "tiny-v41-b", "tiny-v41-c"));

TEST(DsparkV4, AV4CheckpointHasNoDsparkStages) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(1);
  auto m = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE((*m)->CheckDspark().ok());
  EXPECT_EQ((*m)->HiddenWidth(), int64_t{w.config().hc_mult} * w.config().hidden);
}

}  // namespace
}  // namespace dsinfer::backend::cpu
