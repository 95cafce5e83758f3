// The GPU forward (CudaModel) on the tiny presets:
//  - fp32-reference numerics against Hugging Face transformers' goldens, with the CPU golden
//    suite's fixtures and budgets (tests/backend/golden_test.cc), greedy continuations included;
//  - the official quantization steps (no bf16 rounding) against the hooked transformers goldens
//    before the oracle's own instability point, as the CPU suite does;
//  - the official numerics against the CPU backend's official numerics;
//  - chunking invariance (one call, the 256-token steps it is cut into, and one token at a time);
//  - bad input fails clearly without changing the sequence.
// Without a GPU every test skips with the reason.
#include "backend/cuda/cuda_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../backend/test_models.h"
#include "../golden_fixtures.h"
#include "../tolerance.h"
#include "backend/cpu/cpu_model.h"
#include "device_test_util.h"

namespace dsinfer::backend::cuda {
namespace {

namespace fs = std::filesystem;
using dsinfer::testing::CompareLogits;
using dsinfer::testing::GoldenFixtureDir;
using dsinfer::testing::ReadGoldenTensor;

// The greedy token: the first of the largest logits (runtime::ArgMax's rule; test_cuda does not
// link the runtime layer).
int32_t ArgMax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// The first position where running `ids` in 7-token steps differs from `whole` (the logits of
// one call, [ids.size(), V]) by more than the fp32 floor; ids.size() when none does.
int32_t FirstDivergence(CudaModel& m, std::span<const int32_t> ids, const std::vector<float>& whole,
                        int64_t V) {
  auto seq = m.NewSequence();
  if (!seq.ok()) return 0;
  for (size_t at = 0; at < ids.size(); at += 7) {
    ForwardOutput o;
    auto chunk = ids.subspan(at, std::min<size_t>(7, ids.size() - at));
    if (!m.Forward(**seq, chunk, {.all_logits = true}, &o).ok()) return 0;
    for (size_t i = 0; i < chunk.size(); ++i)
      if (CompareLogits(o.logits.data() + i * V, whole.data() + (at + i) * V, V).nmse >
          tolerance::kGoldenLogitsNmse)
        return static_cast<int32_t>(at + i);
  }
  return static_cast<int32_t>(ids.size());
}

class CudaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGolden, LogitsAndGreedyMatchTransformers) {
  DEVICE_OR_SKIP(dev);
  const std::string preset = GetParam();
  const std::string dir = GoldenFixtureDir(preset);
  ASSERT_TRUE(fs::exists(dir + "/manifest.json")) << "no golden fixtures for " << preset;
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  const auto& weights = dsinfer::testing::PresetWeights(preset, manifest.value("seed", 1));
  auto golden = io::SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  auto m = CudaModel::Create(*dev, weights, Numerics::Fp32Reference());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const int64_t V = weights.config().vocab_size;
  int n_prompts = 0, n_greedy_exact = 0, n_ties = 0;
  double worst_nmse_all = 0, worst_rel_all = 0;
  for (int k = 0;; ++k) {
    const std::string p = "p" + std::to_string(k) + ".";
    auto ids = ReadGoldenTensor<int32_t>(**golden, p + "ids");
    if (ids.empty()) break;
    ++n_prompts;
    auto positions = ReadGoldenTensor<int32_t>(**golden, p + "positions");
    auto want = ReadGoldenTensor<float>(**golden, p + "logits");
    ASSERT_EQ(want.size(), positions.size() * V);
    auto seq = (*m)->NewSequence();
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    ForwardOutput out;
    Status st = (*m)->Forward(**seq, ids, {.all_logits = true}, &out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(out.logits.size(), ids.size() * V);
    double worst_nmse = 0, worst_rel = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
      auto e = CompareLogits(out.logits.data() + int64_t{positions[i]} * V, want.data() + i * V, V);
      worst_nmse = std::max(worst_nmse, e.nmse);
      worst_rel = std::max(worst_rel, e.max_rel);
    }
    std::printf(
        "[gpu %s prompt %d, %zu tokens] logits NMSE %.3g (%.2f%% of budget), max rel err "
        "%.3g (%.2f%% of budget)\n",
        preset.c_str(), k, ids.size(), worst_nmse, 100 * worst_nmse / tolerance::kGoldenLogitsNmse,
        worst_rel, 100 * worst_rel / tolerance::kGoldenLogitsMaxRel);
    EXPECT_LE(worst_nmse, tolerance::kGoldenLogitsNmse) << preset << " prompt " << k;
    EXPECT_LE(worst_rel, tolerance::kGoldenLogitsMaxRel) << preset << " prompt " << k;
    worst_nmse_all = std::max(worst_nmse_all, worst_nmse);
    worst_rel_all = std::max(worst_rel_all, worst_rel);
    // Greedy continuation decoded one token per step from the prefilled device state.
    auto greedy = ReadGoldenTensor<int32_t>(**golden, p + "greedy");
    auto margin = ReadGoldenTensor<float>(**golden, p + "greedy_margin");
    std::vector<float> logits(out.logits.end() - V, out.logits.end());
    bool exact = true;
    for (size_t s = 0; s < greedy.size(); ++s) {
      const int32_t tok = ArgMax(logits.data(), V);
      if (tok != greedy[s]) {
        const bool tie = s < margin.size() && margin[s] < tolerance::kGreedyTieMargin;
        EXPECT_TRUE(tie) << preset << " prompt " << k << ": greedy diverged at step " << s
                         << " (got " << tok << ", want " << greedy[s] << ")";
        n_ties += tie;
        exact = false;
        break;
      }
      const int32_t one[1] = {tok};
      st = (*m)->Forward(**seq, one, {}, &out);
      ASSERT_TRUE(st.ok()) << st.ToString();
      logits = out.logits;
    }
    n_greedy_exact += exact;
  }
  EXPECT_GE(n_prompts, 8);
  std::printf(
      "[gpu %s] worst NMSE %.3g, worst max rel %.3g; %d/%d greedy continuations "
      "identical, %d stopped at a reference near-tie\n",
      preset.c_str(), worst_nmse_all, worst_rel_all, n_greedy_exact, n_prompts, n_ties);
}

// The official quantization steps without bf16 rounding, as the CPU suite's
// QuantizationStepsMatchHookedTransformers: positions before the oracle's own instability
// point must match at the fp32 floor.
TEST_P(CudaGolden, QuantizationStepsMatchHookedTransformers) {
  DEVICE_OR_SKIP(dev);
  const std::string preset = GetParam();
  const std::string path = GoldenFixtureDir(preset) + "/golden_quant.safetensors";
  ASSERT_TRUE(fs::exists(path)) << "no quantization goldens for " << preset;
  auto golden = io::SafetensorsFile::Open(path);
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const auto& weights = dsinfer::testing::PresetWeights(preset, 1);
  auto m = CudaModel::Create(*dev, weights, Numerics{false, true, true, true});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ThreadPool pool(2);
  auto cpu_model = cpu::CpuModel::Create(weights, Numerics{false, true, true, true}, pool);
  ASSERT_TRUE(cpu_model.ok());
  const int64_t V = weights.config().vocab_size;
  int n_stable = 0, n_after = 0, n_after_close = 0, n_cut = 0;
  for (int k = 0; k < 16; ++k) {
    const std::string p = "p" + std::to_string(k) + ".";
    auto ids = ReadGoldenTensor<int32_t>(**golden, p + "ids");
    if (ids.empty()) continue;
    auto positions = ReadGoldenTensor<int32_t>(**golden, p + "positions");
    auto want = ReadGoldenTensor<float>(**golden, p + "logits");
    auto unstable = ReadGoldenTensor<int32_t>(**golden, p + "first_unstable_position");
    int32_t first_unstable = unstable.empty() ? static_cast<int32_t>(ids.size()) : unstable[0];
    if (first_unstable < 0) first_unstable = static_cast<int32_t>(ids.size());
    auto seq = (*m)->NewSequence();
    ASSERT_TRUE(seq.ok());
    ForwardOutput out;
    Status st = (*m)->Forward(**seq, ids, {.all_logits = true}, &out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The oracle's instability point (its fp64 vs fp32 runs) covers neither the GPU's summation
    // order nor the CPU's. The stable range also ends where the GPU's own two orders (7-token
    // steps run the GEMV kernels, whole prompts the tiled GEMM) or the GPU and the CPU backend
    // (same quantization steps) first leave the fp32 floor: a code flipped there (measured on an
    // H200: one tiny-b position at NMSE 9e-4 inside the oracle's range). A missing or misplaced
    // step would differ from position 0 on and leave no stable position at all.
    ForwardOutput cpu_out;
    auto cpu_state = (*cpu_model)->NewSequence();
    ASSERT_TRUE((*cpu_model)->Forward(*cpu_state, ids, {.all_logits = true}, &cpu_out).ok());
    int32_t cpu_agrees_until = static_cast<int32_t>(ids.size());
    for (size_t t = 0; t < ids.size(); ++t)
      if (CompareLogits(out.logits.data() + t * V, cpu_out.logits.data() + t * V, V).nmse >
          tolerance::kGoldenLogitsNmse) {
        cpu_agrees_until = static_cast<int32_t>(t);
        break;
      }
    const int32_t oracle_unstable = first_unstable;
    first_unstable =
        std::min({first_unstable, FirstDivergence(**m, ids, out.logits, V), cpu_agrees_until});
    n_cut += static_cast<int>(std::count_if(positions.begin(), positions.end(), [&](int32_t q) {
      return q >= first_unstable && q < oracle_unstable;
    }));
    for (size_t i = 0; i < positions.size(); ++i) {
      auto e = CompareLogits(out.logits.data() + int64_t{positions[i]} * V, want.data() + i * V, V);
      if (positions[i] < first_unstable) {
        ++n_stable;
        EXPECT_LE(e.nmse, tolerance::kGoldenLogitsNmse)
            << preset << " prompt " << k << " position " << positions[i];
      } else {
        ++n_after;
        n_after_close += e.nmse <= tolerance::kGoldenLogitsNmse;
      }
    }
  }
  std::printf(
      "[gpu %s quant] %d stable positions checked (%d more cut by a GPU/CPU code flip); "
      "%d/%d past the stable range also match\n",
      preset.c_str(), n_stable, n_cut, n_after_close, n_after);
  EXPECT_GT(n_stable, 0);
  EXPECT_GE(n_stable, 2 * n_cut) << "most of the oracle's stable range must remain";
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, CudaGolden, ::testing::Values("tiny-a", "tiny-b", "tiny-c"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

std::vector<int32_t> PromptIds(int64_t n, int vocab, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint32_t x = seed;
  for (auto& id : ids) {
    x = x * 1664525u + 1013904223u;
    id = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
  }
  return ids;
}

// Official numerics (bf16 rounding points, FP8 activation / KV round trips, Hadamard + FP4
// indexer) on the GPU against the same on the CPU. The two differ by fp32 summation order, which
// sooner or later flips a bf16 rounding or an FP8 code (measured on an H200: at position 0 of a
// 7-token tiny-c prompt already), and the tiny random models amplify any flip as they amplify the
// quantization itself. So the bound is the quantization's own effect: the GPU must stay closer to
// the CPU's official result than that is to the fp32 forward. The exactness of each rounding
// step is checked op by op (CudaQuantOps, bit for bit against core/quant.h).
// Every FP8 GEMM path the device has is checked: the tensor-core GEMM (the default from 9
// tokens), the generic kernels and, on sm_89+, the FP8 MMA; and the routed experts on tensor
// cores (the tiny presets' w1 / w3, whose 128 / 256 columns fit its 128-column blocks).
TEST(CudaModel, OfficialNumericsTrackTheCpu) {
  DEVICE_OR_SKIP(dev);
  struct Path {
    const char* name;
    Fp8GemmPath fp8;
    ExpertGemmPath experts;
  };
  std::vector<Path> paths = {{"default", Fp8GemmPath::kAuto, ExpertGemmPath::kAuto},
                             {"generic", Fp8GemmPath::kGeneric, ExpertGemmPath::kCudaCores},
                             {"experts-tc", Fp8GemmPath::kAuto, ExpertGemmPath::kTensor}};
  if (dev->info().Sm() >= 89)
    paths.push_back({"fp8 mma", Fp8GemmPath::kTensorFp8, ExpertGemmPath::kTensor});
  for (auto [path_name, path, expert_path] : paths)
    for (const char* preset : {"tiny-a", "tiny-b", "tiny-c"}) {
      const auto& weights = dsinfer::testing::PresetWeights(preset, 1);
      const int64_t V = weights.config().vocab_size;
      ThreadPool pool(2);
      auto cpu_off = cpu::CpuModel::Create(weights, Numerics::Official(), pool);
      auto cpu_f32 = cpu::CpuModel::Create(weights, Numerics::Fp32Reference(), pool);
      auto gpu_off = CudaModel::Create(*dev, weights, Numerics::Official(), path, expert_path);
      ASSERT_TRUE(cpu_off.ok() && cpu_f32.ok());
      ASSERT_TRUE(gpu_off.ok()) << gpu_off.status().ToString();
      for (int64_t len : {1, 7, 37, 300}) {
        auto ids = PromptIds(len, static_cast<int>(V), 77u + static_cast<uint32_t>(len));
        ForwardOutput a, b, g;
        auto sa = (*cpu_off)->NewSequence();
        auto sb = (*cpu_f32)->NewSequence();
        auto sg = (*gpu_off)->NewSequence();
        ASSERT_TRUE(sg.ok());
        ASSERT_TRUE((*cpu_off)->Forward(*sa, ids, {.all_logits = true}, &a).ok());
        ASSERT_TRUE((*cpu_f32)->Forward(*sb, ids, {.all_logits = true}, &b).ok());
        Status st = (*gpu_off)->Forward(**sg, ids, {.all_logits = true}, &g);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(g.logits.size(), a.logits.size());
        double worst_gpu = 0, worst_quant = 0;
        int argmax_same = 0;
        for (int64_t t = 0; t < len; ++t) {
          const float* ga = g.logits.data() + t * V;
          const float* ca = a.logits.data() + t * V;
          worst_gpu = std::max(worst_gpu, CompareLogits(ga, ca, V).nmse);
          worst_quant = std::max(worst_quant, CompareLogits(ca, b.logits.data() + t * V, V).nmse);
          argmax_same += ArgMax(ga, V) == ArgMax(ca, V);
        }
        std::printf(
            "[gpu %s official, %s GEMM, %lld tokens] NMSE vs CPU official %.3g; CPU official vs "
            "fp32 %.3g; argmax agrees at %d/%lld positions\n",
            preset, path_name, static_cast<long long>(len), worst_gpu, worst_quant, argmax_same,
            static_cast<long long>(len));
        EXPECT_LE(worst_gpu, worst_quant) << preset << " " << path_name << " " << len << " tokens";
      }
    }
}

// One call (cut into 256-token steps inside), ragged chunks and one token at a time give the
// same logits at the fp32 floor (the kernels differ by token count: GEMV vs tiled GEMM).
// dsinfer doctor's whole-forward check (conformance.h CheckForward) on every tiny preset.
TEST(CudaModel, DoctorForwardCheckPasses) {
  DEVICE_OR_SKIP(dev);
  for (const char* preset : {"tiny-a", "tiny-b", "tiny-c"})
    ExpectPass(CheckForward(*dev, dsinfer::testing::PresetWeights(preset, 1), 64, 11));
}

TEST(CudaModel, ChunkingDoesNotChangeTheResult) {
  DEVICE_OR_SKIP(dev);
  const auto& weights = dsinfer::testing::PresetWeights("tiny-c", 1);
  const int64_t V = weights.config().vocab_size;
  auto m = CudaModel::Create(*dev, weights, Numerics::Fp32Reference());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto ids = PromptIds(300, static_cast<int>(V), 5);
  ForwardOutput whole;
  auto s1 = (*m)->NewSequence();
  ASSERT_TRUE((*m)->Forward(**s1, ids, {.all_logits = true}, &whole).ok());
  auto s2 = (*m)->NewSequence();
  std::vector<float> ragged;
  size_t at = 0;
  for (size_t len : {7u, 1u, 13u, 64u, 5u, 130u, 3u, 77u}) {
    ForwardOutput o;
    std::span<const int32_t> chunk(ids.data() + at, std::min(len, ids.size() - at));
    ASSERT_TRUE((*m)->Forward(**s2, chunk, {.all_logits = true}, &o).ok());
    ragged.insert(ragged.end(), o.logits.begin(), o.logits.end());
    at += chunk.size();
  }
  ASSERT_EQ(at, ids.size());
  auto s3 = (*m)->NewSequence();
  std::vector<float> single;
  for (int32_t id : ids) {
    ForwardOutput o;
    const int32_t one[1] = {id};
    ASSERT_TRUE((*m)->Forward(**s3, one, {}, &o).ok());
    single.insert(single.end(), o.logits.begin(), o.logits.end());
  }
  double worst_ragged = 0, worst_single = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    worst_ragged = std::max(
        worst_ragged, CompareLogits(ragged.data() + t * V, whole.logits.data() + t * V, V).nmse);
    worst_single = std::max(
        worst_single, CompareLogits(single.data() + t * V, whole.logits.data() + t * V, V).nmse);
  }
  std::printf("[gpu chunking] worst NMSE ragged %.3g, one token at a time %.3g\n", worst_ragged,
              worst_single);
  EXPECT_LE(worst_ragged, tolerance::kGoldenLogitsNmse);
  EXPECT_LE(worst_single, tolerance::kGoldenLogitsNmse);
  EXPECT_EQ((*s1)->n_tokens(), 300);
  EXPECT_EQ((*s3)->n_tokens(), 300);
}

// The MTP block runs on the GPU through the same layer program: its logits over the backbone's
// hidden streams (which the GPU returns too) match the CPU's in fp32-reference numerics at the
// golden budget, in one call and in ragged ones.
TEST(CudaModel, MtpMatchesTheCpuAndIsChunkInvariant) {
  DEVICE_OR_SKIP(dev);
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  const int64_t V = w.config().vocab_size;
  const int64_t HD = int64_t{w.config().hc_mult} * w.config().hidden;
  auto m = CudaModel::Create(*dev, w, Numerics::Fp32Reference());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ThreadPool pool(2);
  auto cpu_model = cpu::CpuModel::Create(w, Numerics::Fp32Reference(), pool);
  ASSERT_TRUE(cpu_model.ok());
  auto ids = PromptIds(150, static_cast<int>(V), 9);
  // The backbone's streams from each side, then MTP over positions 0..148 with tokens 1..149.
  ForwardOutput gpu_main, cpu_main;
  auto gs = (*m)->NewSequence();
  ASSERT_TRUE((*m)->Forward(**gs, ids, {.all_logits = true, .want_hidden = true}, &gpu_main).ok());
  auto cs = (*cpu_model)->NewSequence();
  ASSERT_TRUE(
      (*cpu_model)->Forward(*cs, ids, {.all_logits = true, .want_hidden = true}, &cpu_main).ok());
  ASSERT_EQ(gpu_main.hidden.size(), cpu_main.hidden.size());
  std::vector<int32_t> next(ids.begin() + 1, ids.end());
  std::span<const float> hidden(cpu_main.hidden.data(), next.size() * HD);
  std::vector<float> want, whole, part1, part2;
  ASSERT_TRUE((*cpu_model)->ForwardMtp(*cs, hidden, next, &want).ok());
  ASSERT_TRUE((*m)->ForwardMtp(**gs, hidden, next, &whole).ok());
  auto gs2 = (*m)->NewSequence();
  ASSERT_TRUE((*m)->ForwardMtp(**gs2, hidden.subspan(0, 60 * HD), std::span(next).first(60),
                               &part1).ok());
  ASSERT_TRUE((*m)->ForwardMtp(**gs2, hidden.subspan(60 * HD), std::span(next).subspan(60),
                               &part2).ok());
  part1.insert(part1.end(), part2.begin(), part2.end());
  ASSERT_EQ(whole.size(), want.size());
  ASSERT_EQ(part1.size(), want.size());
  double worst = 0, worst_hidden = 0;
  for (size_t t = 0; t < next.size(); ++t) {
    worst = std::max({worst, CompareLogits(whole.data() + t * V, want.data() + t * V, V).nmse,
                      CompareLogits(part1.data() + t * V, want.data() + t * V, V).nmse});
    worst_hidden = std::max(worst_hidden, CompareLogits(gpu_main.hidden.data() + t * HD,
                                                        cpu_main.hidden.data() + t * HD, HD)
                                              .nmse);
  }
  std::printf("[gpu mtp] worst logits NMSE %.3g, backbone streams %.3g\n", worst, worst_hidden);
  EXPECT_LE(worst, tolerance::kMtpLogitsNmse);
  EXPECT_LE(worst_hidden, tolerance::kGoldenLogitsNmse);
}

// Sequences of mixed lengths prefilled in one batched call (rounds of 256 tokens for the long
// one) and then decoded together give each sequence the logits it gets alone, at the fp32
// floor (the kernels differ by token count only).
TEST(CudaModel, BatchMatchesEachSequenceAlone) {
  DEVICE_OR_SKIP(dev);
  const auto& weights = dsinfer::testing::PresetWeights("tiny-c", 1);
  const int64_t V = weights.config().vocab_size;
  auto m = CudaModel::Create(*dev, weights, Numerics::Fp32Reference());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::vector<int64_t> lengths = {1, 7, 37, 300, 129};
  const int kDecode = 5;
  std::vector<std::vector<int32_t>> prompts, next;
  for (size_t i = 0; i < lengths.size(); ++i) {
    prompts.push_back(PromptIds(lengths[i], static_cast<int>(V), 900u + static_cast<uint32_t>(i)));
    next.push_back(PromptIds(kDecode, static_cast<int>(V), 950u + static_cast<uint32_t>(i)));
  }
  // Alone: prefill (all logits), then kDecode single tokens.
  std::vector<std::vector<float>> alone(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    auto seq = (*m)->NewSequence();
    ASSERT_TRUE(seq.ok());
    ForwardOutput o;
    ASSERT_TRUE((*m)->Forward(**seq, prompts[i], {.all_logits = true}, &o).ok());
    alone[i] = o.logits;
    for (int s = 0; s < kDecode; ++s) {
      const int32_t one[1] = {next[i][s]};
      ASSERT_TRUE((*m)->Forward(**seq, one, {}, &o).ok());
      alone[i].insert(alone[i].end(), o.logits.begin(), o.logits.end());
    }
  }
  // Together.
  std::vector<std::unique_ptr<CudaSequence>> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) {
    auto seq = (*m)->NewSequence();
    ASSERT_TRUE(seq.ok());
    seqs.push_back(std::move(seq).value());
  }
  std::vector<ForwardOutput> outs(lengths.size());
  std::vector<std::vector<float>> together(lengths.size());
  std::vector<CudaChunk> chunks;
  for (size_t i = 0; i < lengths.size(); ++i)
    chunks.push_back({seqs[i].get(), prompts[i], {.all_logits = true}, &outs[i]});
  Status st = (*m)->ForwardBatch(chunks);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t i = 0; i < lengths.size(); ++i) together[i] = outs[i].logits;
  for (int s = 0; s < kDecode; ++s) {
    chunks.clear();
    for (size_t i = 0; i < lengths.size(); ++i)
      chunks.push_back({seqs[i].get(), std::span<const int32_t>(&next[i][s], 1), {}, &outs[i]});
    st = (*m)->ForwardBatch(chunks);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < lengths.size(); ++i)
      together[i].insert(together[i].end(), outs[i].logits.begin(), outs[i].logits.end());
  }
  double worst = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_EQ(together[i].size(), alone[i].size()) << "sequence " << i;
    for (size_t r = 0; r * V < alone[i].size(); ++r)
      worst = std::max(worst,
                       CompareLogits(together[i].data() + r * V, alone[i].data() + r * V, V).nmse);
    EXPECT_EQ(seqs[i]->n_tokens(), lengths[i] + kDecode);
  }
  std::printf(
      "[gpu batch] 5 sequences of 1-300 tokens + 5 decode steps: worst NMSE vs alone %.3g\n",
      worst);
  EXPECT_LE(worst, tolerance::kGoldenLogitsNmse);
  // The same sequence twice in one step is refused before anything runs.
  ForwardOutput o1, o2;
  const int32_t tok[1] = {3};
  std::vector<CudaChunk> dup = {{seqs[0].get(), tok, {}, &o1}, {seqs[0].get(), tok, {}, &o2}};
  EXPECT_EQ((*m)->ForwardBatch(dup).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(seqs[0]->n_tokens(), lengths[0] + kDecode);
}

TEST(CudaModel, BadInputFailsClearlyAndChangesNothing) {
  DEVICE_OR_SKIP(dev);
  const auto& weights = dsinfer::testing::PresetWeights("tiny-a", 1);
  auto m = CudaModel::Create(*dev, weights, Numerics::Fp32Reference());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto other = CudaModel::Create(*dev, weights, Numerics::Fp32Reference());
  ASSERT_TRUE(other.ok());
  auto seq = (*m)->NewSequence();
  ASSERT_TRUE(seq.ok());
  ForwardOutput out;
  const int32_t good[2] = {3, 4};
  ASSERT_TRUE((*m)->Forward(**seq, good, {}, &out).ok());
  const int32_t bad[2] = {5, weights.config().vocab_size};
  Status st = (*m)->Forward(**seq, bad, {}, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  const int32_t negative[1] = {-1};
  EXPECT_EQ((*m)->Forward(**seq, negative, {}, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->Forward(**seq, std::span<const int32_t>(), {}, &out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*other)->Forward(**seq, good, {}, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->Forward(**seq, good, {.want_hidden = true}, &out).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ((*seq)->n_tokens(), 2);  // nothing above advanced the sequence
}

}  // namespace
}  // namespace dsinfer::backend::cuda
