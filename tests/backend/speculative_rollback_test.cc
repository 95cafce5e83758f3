// Rollback stress for speculative decoding: verify steps of 1 + k rows (k = 1..4) whose drafts
// are accepted up to a random length, the rest rolled back with Truncate, the MTP block catching
// up and chaining draft positions that TruncateMtp rolls back, at verify offsets covering every
// residue mod 128 (the HCA ratio and the page rows) and mod 4 (the CSA ratio), crossing windows,
// compressor groups and pages. The final state must be bit-identical to decoding the same
// tokens without speculation: the exported state blobs are equal and so are the next logits of
// the backbone and the MTP block.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "backend/cpu/cpu_model.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

class SpeculativeRollback : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeRollback, RandomAcceptLengthsLeaveTheStateOfPlainDecoding) {
  const auto& w = dsinfer::testing::PresetWeights(GetParam());
  const model::ModelConfig& c = w.config();
  ThreadPool pool(2);
  auto made = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(made.ok());
  CpuModel& m = **made;
  const int64_t HD = int64_t{c.hc_mult} * c.hidden;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> any_token(2, c.vocab_size - 1);
  std::vector<int32_t> tokens(1600);  // the sequence both paths end up consuming
  for (auto& t : tokens) t = any_token(rng);

  // Speculative path: a prompt, then verify steps until the offsets are covered.
  auto spec = m.NewSequence();
  const int64_t prompt = 37;
  ForwardOutput out;
  ASSERT_TRUE(
      m.Forward(*spec, std::span(tokens).subspan(0, prompt), {.want_hidden = true}, &out).ok());
  std::vector<float> mtp_logits, streams;
  ASSERT_TRUE(
      m.ForwardMtpLast(*spec, out.hidden, std::span(tokens).subspan(1, prompt), nullptr, nullptr)
          .ok());
  std::set<int64_t> offsets128, offsets4;
  int64_t n = prompt;
  while ((offsets128.size() < 128 || offsets4.size() < 4) && n + 6 < 1500) {
    offsets128.insert(n % 128);
    offsets4.insert(n % 4);
    const int k = std::uniform_int_distribution<int>(1, 4)(rng);
    // Accept nothing half of the time (so that every offset comes up), else 1..k.
    const int accept = rng() % 2 == 0 ? 0 : std::uniform_int_distribution<int>(1, k)(rng);
    std::vector<int32_t> chunk(tokens.begin() + n, tokens.begin() + n + 1 + accept);
    while (static_cast<int>(chunk.size()) < k + 1) {
      int32_t wrong = any_token(rng);
      if (static_cast<int64_t>(chunk.size()) == accept + 1 && wrong == tokens[n + 1 + accept])
        wrong = wrong == 2 ? 3 : 2;  // the first rejected draft differs from the real token
      chunk.push_back(wrong);
    }
    ASSERT_TRUE(m.Forward(*spec, chunk, {.all_logits = true, .want_hidden = true}, &out).ok());
    ASSERT_TRUE(m.Truncate(*spec, n + 1 + accept).ok());
    // MTP: the positions the backbone now holds, then chained drafts past them, rolled back.
    const int64_t done = spec->mtp_n_tokens(), now = spec->n_tokens();
    ASSERT_TRUE(m.ForwardMtpLast(
                     *spec,
                     std::span<const float>(out.hidden).subspan((done - n) * HD, (now - done) * HD),
                     std::span(tokens).subspan(done + 1, now - done), &mtp_logits, &streams)
                    .ok());
    for (int j = 1; j < k; ++j) {
      const std::vector<float> in = streams;
      const int32_t draft = any_token(rng);
      ASSERT_TRUE(m.ForwardMtpLast(*spec, in, std::span(&draft, 1), &mtp_logits, &streams).ok());
    }
    ASSERT_TRUE(m.TruncateMtp(*spec, now).ok());
    n = now;
  }
  ASSERT_EQ(offsets128.size(), 128u) << "the walk ended before covering every offset";
  ASSERT_EQ(offsets4.size(), 4u);

  // Plain decoding of the same tokens: one token at a time, MTP position by position.
  auto plain = m.NewSequence();
  for (int64_t p = 0; p < n; ++p) {
    ASSERT_TRUE(
        m.Forward(*plain, std::span(tokens).subspan(p, 1), {.want_hidden = true}, &out).ok());
    ASSERT_TRUE(
        m.ForwardMtpLast(*plain, out.hidden, std::span(tokens).subspan(p + 1, 1), nullptr, nullptr)
            .ok());
  }
  const std::span<const int32_t> consumed(tokens.data(), n);
  auto spec_blob = m.Export(*spec, consumed), plain_blob = m.Export(*plain, consumed);
  ASSERT_TRUE(spec_blob.ok() && plain_blob.ok());
  EXPECT_TRUE(*spec_blob == *plain_blob) << "exported states differ after " << n << " tokens";
  // The next step of both: backbone logits and streams, and the MTP block's next logits.
  ForwardOutput a, b;
  ASSERT_TRUE(m.Forward(*spec, std::span(tokens).subspan(n, 1), {.want_hidden = true}, &a).ok());
  ASSERT_TRUE(m.Forward(*plain, std::span(tokens).subspan(n, 1), {.want_hidden = true}, &b).ok());
  EXPECT_EQ(a.logits, b.logits);
  std::vector<float> la, lb;
  ASSERT_TRUE(
      m.ForwardMtpLast(*spec, a.hidden, std::span(tokens).subspan(n + 1, 1), &la, nullptr).ok());
  ASSERT_TRUE(
      m.ForwardMtpLast(*plain, b.hidden, std::span(tokens).subspan(n + 1, 1), &lb, nullptr).ok());
  EXPECT_EQ(la, lb);
}

INSTANTIATE_TEST_SUITE_P(Presets, SpeculativeRollback, ::testing::Values("tiny-a", "tiny-c"));

// Drafting across a batch: one ForwardMtpBatch over sequences of different lengths (catch-up
// rows of different counts, then chained one-token rows) gives every sequence the logits,
// streams and MTP state it gets alone, bit for bit.
TEST_P(SpeculativeRollback, BatchedDraftingGivesEachSequenceWhatItGetsAlone) {
  const auto& w = dsinfer::testing::PresetWeights(GetParam());
  const model::ModelConfig& c = w.config();
  ThreadPool pool(2);
  auto made = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(made.ok());
  CpuModel& m = **made;
  std::mt19937 rng(23);
  std::uniform_int_distribution<int32_t> any_token(2, c.vocab_size - 1);
  const std::vector<int64_t> lengths = {1, 9, 130, 257};  // window, group and page boundaries
  struct Seq {
    std::unique_ptr<SequenceState> batched, alone;
    std::vector<int32_t> tokens;
    ForwardOutput out;
  };
  std::vector<Seq> seqs(lengths.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& q = seqs[i];
    q.tokens.resize(static_cast<size_t>(lengths[i] + 1));
    for (auto& t : q.tokens) t = any_token(rng);
    q.batched = m.NewSequence();
    q.alone = m.NewSequence();
    const auto prompt = std::span<const int32_t>(q.tokens).first(static_cast<size_t>(lengths[i]));
    ASSERT_TRUE(m.Forward(*q.batched, prompt, {.want_hidden = true}, &q.out).ok());
    ForwardOutput again;
    ASSERT_TRUE(m.Forward(*q.alone, prompt, {.want_hidden = true}, &again).ok());
  }
  // Catch-up: every sequence's MTP stream over its whole prompt (the last row's next token is
  // the one after the prompt), with logits and streams of the last row.
  std::vector<std::vector<float>> logits_b(seqs.size()), streams_b(seqs.size());
  std::vector<MtpChunk> batch;
  for (size_t i = 0; i < seqs.size(); ++i)
    batch.push_back({seqs[i].batched.get(), seqs[i].out.hidden,
                     std::span<const int32_t>(seqs[i].tokens).subspan(1), &logits_b[i],
                     &streams_b[i]});
  ASSERT_TRUE(m.ForwardMtpBatch(batch).ok());
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<float> logits_a, streams_a;
    ASSERT_TRUE(m.ForwardMtpLast(*seqs[i].alone, seqs[i].out.hidden,
                                 std::span<const int32_t>(seqs[i].tokens).subspan(1), &logits_a,
                                 &streams_a)
                    .ok());
    EXPECT_EQ(logits_b[i], logits_a) << "sequence " << i;
    EXPECT_EQ(streams_b[i], streams_a) << "sequence " << i;
  }
  // Two chained draft positions; the second leaves out sequence 0 and asks sequence 1 for no
  // streams, as a batch whose sequences want different draft counts does.
  for (int j = 0; j < 2; ++j) {
    batch.clear();
    std::vector<std::vector<float>> in(seqs.size());
    std::vector<int32_t> drafts(seqs.size());
    for (size_t i = j == 0 ? 0 : 1; i < seqs.size(); ++i) {
      in[i] = streams_b[i];
      drafts[i] = any_token(rng);
      batch.push_back({seqs[i].batched.get(), in[i], std::span<const int32_t>(&drafts[i], 1),
                       &logits_b[i], j == 1 && i == 1 ? nullptr : &streams_b[i]});
    }
    ASSERT_TRUE(m.ForwardMtpBatch(batch).ok());
    for (size_t i = j == 0 ? 0 : 1; i < seqs.size(); ++i) {
      std::vector<float> logits_a, streams_a;
      ASSERT_TRUE(m.ForwardMtpLast(*seqs[i].alone, in[i], std::span<const int32_t>(&drafts[i], 1),
                                   &logits_a, &streams_a)
                      .ok());
      EXPECT_EQ(logits_b[i], logits_a) << "sequence " << i << " draft " << j + 1;
      if (!(j == 1 && i == 1)) {
        EXPECT_EQ(streams_b[i], streams_a) << "sequence " << i;
      }
      EXPECT_EQ(seqs[i].batched->mtp_n_tokens(), seqs[i].alone->mtp_n_tokens());
    }
  }
  // A bad chunk fails the call before any state changes.
  std::vector<int32_t> bad = {c.vocab_size};
  std::vector<float> h(static_cast<size_t>(int64_t{c.hc_mult} * c.hidden), 0.0f);
  const int64_t before = seqs[2].batched->mtp_n_tokens();
  batch = {{seqs[2].batched.get(), h, std::span<const int32_t>(&seqs[2].tokens[0], 1), nullptr,
            nullptr},
           {seqs[3].batched.get(), h, bad, nullptr, nullptr}};
  EXPECT_FALSE(m.ForwardMtpBatch(batch).ok());
  EXPECT_EQ(seqs[2].batched->mtp_n_tokens(), before);
}

TEST(SpeculativeRollback, TruncateMtpRefusesToGoPastItsRing) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(1);
  auto m = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(m.ok());
  auto s = (*m)->NewSequence();
  const int64_t HD = int64_t{w.config().hc_mult} * w.config().hidden;
  std::vector<int32_t> ids(40, 5);
  std::vector<float> hidden(40 * HD, 0.5f);
  ASSERT_TRUE((*m)->ForwardMtpLast(*s, hidden, ids, nullptr, nullptr).ok());
  EXPECT_FALSE((*m)->TruncateMtp(*s, 41).ok());
  EXPECT_FALSE((*m)->TruncateMtp(*s, 40 - (*m)->layout().rollback_tokens - 1).ok());
  EXPECT_TRUE((*m)->TruncateMtp(*s, 38).ok());
  EXPECT_EQ(s->mtp_n_tokens(), 38);
}

}  // namespace
}  // namespace dsinfer::backend::cpu
