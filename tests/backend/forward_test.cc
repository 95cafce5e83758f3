// Invariants of the CPU forward pass: chunked prefill and token-by-token decode equal a
// one-shot prefill exactly (same per-row arithmetic), sequence state resets cleanly, MTP runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "backend/cpu/cpu_model.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

std::vector<int32_t> RandomIds(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(2, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = dist(rng);
  return ids;
}

std::vector<float> RunChunks(CpuModel& m, const std::vector<int32_t>& ids,
                             const std::vector<int>& chunks) {
  auto state = m.NewSequence();
  std::vector<float> all;
  size_t i = 0, c = 0;
  while (i < ids.size()) {
    size_t n = std::min<size_t>(chunks[std::min(c, chunks.size() - 1)], ids.size() - i);
    ForwardOutput out;
    Status st =
        m.Forward(*state, std::span<const int32_t>(ids.data() + i, n), {.all_logits = true}, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    i += n, ++c;
  }
  return all;
}

struct Case {
  std::string preset;
  bool official;
};

class ForwardInvariance : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardInvariance, ChunkedPrefillAndDecodeEqualOneShot) {
  const auto& w = dsinfer::testing::PresetWeights(GetParam().preset);
  ThreadPool pool(2);
  auto m = CpuModel::Create(
      w, GetParam().official ? Numerics::Official() : Numerics::Fp32Reference(), pool);
  ASSERT_TRUE(m.ok());
  // Long enough for ratio-128 rows and for the indexer to select (visible rows > index_topk).
  auto ids = RandomIds(300, w.config().vocab_size, 7);
  auto one_shot = RunChunks(**m, ids, {300});
  for (float v : one_shot) ASSERT_TRUE(std::isfinite(v));
  auto chunked = RunChunks(**m, ids, {1, 7, 64, 3, 100, 128});
  auto decode = RunChunks(**m, ids, {130, 1});
  ASSERT_EQ(one_shot.size(), chunked.size());
  ASSERT_EQ(one_shot.size(), decode.size());
  for (size_t i = 0; i < one_shot.size(); ++i) {
    ASSERT_EQ(one_shot[i], chunked[i]) << "element " << i;
    ASSERT_EQ(one_shot[i], decode[i]) << "element " << i;
  }
}

TEST_P(ForwardInvariance, ResetGivesAFreshSequence) {
  const auto& w = dsinfer::testing::PresetWeights(GetParam().preset);
  ThreadPool pool(2);
  auto m = CpuModel::Create(
      w, GetParam().official ? Numerics::Official() : Numerics::Fp32Reference(), pool);
  ASSERT_TRUE(m.ok());
  auto a = RandomIds(133, w.config().vocab_size, 1), b = RandomIds(9, w.config().vocab_size, 2);
  auto state = (*m)->NewSequence();
  ForwardOutput out_a, out_b, fresh;
  ASSERT_TRUE((*m)->Forward(*state, a, {}, &out_a).ok());
  (*m)->Reset(*state);
  ASSERT_TRUE((*m)->Forward(*state, b, {}, &out_b).ok());
  auto clean = (*m)->NewSequence();
  ASSERT_TRUE((*m)->Forward(*clean, b, {}, &fresh).ok());
  EXPECT_EQ(out_b.logits, fresh.logits);
}

INSTANTIATE_TEST_SUITE_P(Presets, ForwardInvariance,
                         ::testing::Values(Case{"tiny-a", true}, Case{"tiny-a", false},
                                           Case{"tiny-b", true}, Case{"tiny-c", false},
                                           Case{"tiny-v41-a", true}, Case{"tiny-v41-a", false},
                                           Case{"tiny-v41-b", true}, Case{"tiny-v41-c", false}),
                         [](const auto& param_info) {
                           std::string n = param_info.param.preset +
                                           (param_info.param.official ? "_official" : "_fp32");
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, BatchedStepEqualsSequencesAlone) {
  const auto& w = dsinfer::testing::PresetWeights(GetParam());
  ThreadPool pool(2);
  auto m = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(m.ok());
  const int vocab = w.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts = {RandomIds(150, vocab, 11), RandomIds(1, vocab, 12),
                                               RandomIds(37, vocab, 13)};
  // Alone: prefill then 3 decode steps each.
  std::vector<std::vector<float>> alone(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto st = (*m)->NewSequence();
    ForwardOutput out;
    ASSERT_TRUE((*m)->Forward(*st, prompts[i], {.all_logits = true}, &out).ok());
    alone[i] = out.logits;
    for (int k = 0; k < 3; ++k) {
      int32_t tok[1] = {static_cast<int32_t>(5 + k + i)};
      ASSERT_TRUE((*m)->Forward(*st, tok, {}, &out).ok());
      alone[i].insert(alone[i].end(), out.logits.begin(), out.logits.end());
    }
  }
  // Batched: all prefills in one step, then decode steps of all three together.
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<ForwardOutput> outs(prompts.size());
  std::vector<SequenceChunk> chunks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    states.push_back((*m)->NewSequence());
    chunks.push_back({states[i].get(), prompts[i], {.all_logits = true}, &outs[i]});
  }
  ASSERT_TRUE((*m)->ForwardBatch(chunks).ok());
  std::vector<std::vector<float>> batched(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) batched[i] = outs[i].logits;
  std::vector<int32_t> toks(prompts.size());
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      toks[i] = static_cast<int32_t>(5 + k + i);
      chunks[i] = {states[i].get(), std::span<const int32_t>(&toks[i], 1), {}, &outs[i]};
    }
    ASSERT_TRUE((*m)->ForwardBatch(chunks).ok());
    for (size_t i = 0; i < prompts.size(); ++i)
      batched[i].insert(batched[i].end(), outs[i].logits.begin(), outs[i].logits.end());
  }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(alone[i], batched[i]) << "sequence " << i;
}

INSTANTIATE_TEST_SUITE_P(Presets, BatchInvariance, ::testing::Values("tiny-a", "tiny-v41-a"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The official numerics (bf16 activations, FP8 activations/KV, FP4 indexer) must stay within the
// error those formats explain relative to the fp32 reference, and must differ at all (the
// quantization is really applied). Position 0 has no attention history, so only smooth errors
// act there: e4m3 has 3 mantissa bits (relative RMS ~2^-4/sqrt(3) ~ 3.6% per quantized input,
// NMSE ~1e-3 per FP8 linear, ~5 in series) -> budget 2e-2 (measured 6.8e-3, docs/NUMERICS.md).
// Later positions add discrete flips (indexer top-k under FP4 keys, MoE top-k) that random
// weights amplify: measured 0.099 over 300 positions, budget 0.3.
TEST(Forward, OfficialNumericsStayCloseToFp32Reference) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(2);
  auto official = CpuModel::Create(w, Numerics::Official(), pool);
  auto fp32 = CpuModel::Create(w, Numerics::Fp32Reference(), pool);
  ASSERT_TRUE(official.ok() && fp32.ok());
  auto ids = RandomIds(300, w.config().vocab_size, 21);
  auto a = RunChunks(**official, ids, {300});
  auto b = RunChunks(**fp32, ids, {300});
  double num = 0, den = 0;
  int argmax_agree = 0;
  const int64_t V = w.config().vocab_size;
  for (size_t t = 0; t < ids.size(); ++t) {
    int64_t ia = 0, ib = 0;
    for (int64_t v = 0; v < V; ++v) {
      double d = a[t * V + v] - b[t * V + v];
      num += d * d, den += static_cast<double>(b[t * V + v]) * b[t * V + v];
      if (a[t * V + v] > a[t * V + ia]) ia = v;
      if (b[t * V + v] > b[t * V + ib]) ib = v;
    }
    argmax_agree += ia == ib;
  }
  double nmse = num / den;
  double num0 = 0, den0 = 0;
  for (int64_t v = 0; v < V; ++v) {
    double d = a[v] - b[v];
    num0 += d * d, den0 += static_cast<double>(b[v]) * b[v];
  }
  std::printf(
      "official vs fp32-reference on tiny-a: position 0 NMSE %.3g; 300 positions NMSE %.3g, top-1 "
      "agreement %d/300\n",
      num0 / den0, nmse, argmax_agree);
  EXPECT_LT(num0 / den0, 2e-2);
  EXPECT_GT(num0 / den0, 1e-7);
  EXPECT_LT(nmse, 0.3);
}

TEST(Forward, RejectsOutOfVocabularyTokens) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(2);
  auto m = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(m.ok());
  auto state = (*m)->NewSequence();
  ForwardOutput out;
  std::vector<int32_t> bad = {1, w.config().vocab_size};
  EXPECT_FALSE((*m)->Forward(*state, bad, {}, &out).ok());
  std::vector<int32_t> negative = {-1};
  EXPECT_FALSE((*m)->Forward(*state, negative, {}, &out).ok());
  EXPECT_EQ(state->n_tokens(), 0);  // nothing was consumed
}

// The step's multiply-add count (the compute roof of `dsinfer bench model`), built here from the
// config's shapes rather than the weight list: every projection of every layer kind (window,
// CSA with its indexer, HCA), top-k routed experts per token, the shared expert, the head for
// the rows asked for, and scores and values over each query's visible rows (window, then the
// indexer's top-k or all compressed rows; the indexer scores every visible row once over top-k).
int64_t ExpectedMacs(const model::ModelConfig& c, int64_t start, int64_t n, int64_t head_rows) {
  const int64_t D = c.hidden, H = c.n_heads, hd = c.head_dim;
  const int64_t ih = c.index_n_heads, ihd = c.index_head_dim;
  int64_t macs = head_rows * c.vocab_size * D;
  for (int li = 0; li < c.n_layers; ++li) {
    const int ratio = c.CompressRatio(li);
    int64_t per_token = c.q_lora_rank * D + H * hd * c.q_lora_rank + hd * D  // wq_a, wq_b, wkv
                        + c.o_groups * int64_t{c.o_lora_rank} * (H / c.o_groups * hd)  // wo_a
                        + D * c.o_groups * int64_t{c.o_lora_rank};                     // wo_b
    if (ratio > 0) per_token += 2 * (ratio == 4 ? 2 : 1) * hd * D;  // compressor wkv, wgate
    if (ratio == 4)  // indexer wq_b, weights_proj, its compressor
      per_token += ih * ihd * c.q_lora_rank + ih * D + 2 * (2 * ihd) * D;
    per_token += c.n_routed_experts * D  // router gate
                 + (c.n_experts_per_tok + c.n_shared_experts) * 3 * c.moe_inter * D;
    macs += n * per_token;
    for (int64_t pos = start; pos < start + n; ++pos) {
      int64_t visible = std::min<int64_t>(pos + 1, c.window);
      if (ratio == 4) {
        const int64_t n_vis = (pos + 1) / 4;
        visible += std::min<int64_t>(n_vis, c.index_topk);
        if (n_vis > c.index_topk) macs += n_vis * ih * ihd;
      } else if (ratio > 0) {
        visible += (pos + 1) / ratio;
      }
      macs += visible * H * hd * 2;
    }
  }
  return macs;
}

TEST(Forward, StepStatsCountEveryMultiplyAdd) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  const auto& c = w.config();
  ThreadPool pool(2);
  auto m = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(m.ok());
  // 140 tokens: past the indexer's top-k (8 of 35+ rows) and the first HCA row (128).
  auto ids = RandomIds(140, c.vocab_size, 5);
  auto state = (*m)->NewSequence();
  ForwardOutput out;
  ASSERT_TRUE((*m)->Forward(*state, ids, {}, &out).ok());
  EXPECT_EQ((*m)->last_step_stats().macs, ExpectedMacs(c, 0, 140, 1));
  ASSERT_TRUE((*m)->Forward(*state, std::span(ids).subspan(0, 3), {.all_logits = true}, &out).ok());
  EXPECT_EQ((*m)->last_step_stats().macs, ExpectedMacs(c, 140, 3, 3));
}

TEST(Forward, MtpChunkingIsExactAndLogitsAreFinite) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(2);
  auto m = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(m.ok());
  auto ids = RandomIds(40, w.config().vocab_size, 3);
  auto state = (*m)->NewSequence();
  ForwardOutput out;
  ASSERT_TRUE((*m)->Forward(*state, ids, {.all_logits = true, .want_hidden = true}, &out).ok());
  const int64_t HD = int64_t{w.config().hc_mult} * w.config().hidden;
  std::vector<int32_t> next(ids.begin() + 1, ids.end());
  std::span<const float> hidden(out.hidden.data(), (ids.size() - 1) * HD);
  std::vector<float> one_shot, part1, part2;
  auto s1 = (*m)->NewSequence();
  ASSERT_TRUE((*m)->ForwardMtp(*s1, hidden, next, &one_shot).ok());
  auto s2 = (*m)->NewSequence();
  ASSERT_TRUE(
      (*m)->ForwardMtp(*s2, hidden.subspan(0, 20 * HD), std::span(next).subspan(0, 20), &part1)
          .ok());
  ASSERT_TRUE(
      (*m)->ForwardMtp(*s2, hidden.subspan(20 * HD), std::span(next).subspan(20), &part2).ok());
  part1.insert(part1.end(), part2.begin(), part2.end());
  EXPECT_EQ(one_shot, part1);
  for (float v : one_shot) ASSERT_TRUE(std::isfinite(v));
}

// bench model --profile runs the program through ProfiledOps: the same bits come out, every op
// kind the step runs is counted, and the times add up to no more than the step's wall time.
TEST(Forward, ProfiledStepsComputeTheSameBitsAndCountEveryOp) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(2);
  auto plain = CpuModel::Create(w, Numerics::Official(), pool);
  auto profiled = CpuModel::Create(w, Numerics::Official(), pool);
  ASSERT_TRUE(plain.ok() && profiled.ok());
  OpProfile profile;
  (*profiled)->set_op_profile(&profile);
  // 140 tokens reach the indexer's top-k and the first HCA row, so every attention kind runs.
  auto ids = RandomIds(140, w.config().vocab_size, 11);
  auto run = [&](CpuModel& m) {
    std::vector<float> logits = RunChunks(m, ids, {100, 40});
    auto state = m.NewSequence();
    ForwardOutput out;
    EXPECT_TRUE(m.Forward(*state, ids, {.want_hidden = true}, &out).ok());
    std::vector<int32_t> next(ids.begin() + 1, ids.end());
    std::vector<float> mtp;
    auto mtp_state = m.NewSequence();
    const int64_t HD = int64_t{w.config().hc_mult} * w.config().hidden;
    EXPECT_TRUE(m.ForwardMtp(*mtp_state, std::span<const float>(out.hidden).first(139 * HD),
                             next, &mtp)
                    .ok());
    logits.insert(logits.end(), mtp.begin(), mtp.end());
    return logits;
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> got = run(**profiled);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got, run(**plain));

  std::map<std::string, int64_t> calls;
  for (const auto& e : profile.Sorted()) calls[e.op] = e.calls;
  const int layers = w.config().n_layers;
  // Three steps of the backbone (two chunks and the one-shot run), one MTP call.
  EXPECT_EQ(calls["begin_step"], 4);
  EXPECT_EQ(calls["moe experts (routed + shared)"], 3 * layers + 1);
  EXPECT_EQ(calls["linear head"], 3 + 1);
  EXPECT_EQ(calls["linear mtp.e_proj"], 1);
  EXPECT_GT(calls["sparse_attention window+selected"], 0);
  EXPECT_GT(calls["sparse_attention window+all compressed"], 0);
  EXPECT_GT(calls["indexer_select"], 0);
  EXPECT_GT(calls["compressor_pool kv"], 0);
  EXPECT_GT(profile.TotalSeconds(), 0.0);
  EXPECT_LE(profile.TotalSeconds(), wall);
  // Sorted most expensive first; the table names every op and ends with the total.
  const auto sorted = profile.Sorted();
  for (size_t i = 1; i < sorted.size(); ++i) EXPECT_GE(sorted[i - 1].seconds, sorted[i].seconds);
  const std::string table = profile.Table(4);
  for (const auto& e : sorted) EXPECT_NE(table.find("| " + e.op + " |"), std::string::npos);
  EXPECT_NE(table.find("| all ops |"), std::string::npos);
  profile.Clear();
  EXPECT_TRUE(profile.Sorted().empty());
}

}  // namespace
}  // namespace dsinfer::backend::cpu
