// DeepSeek-V4.1 goldens: the CPU engine against the independent PyTorch oracle reference/v41
// (spec §14) on the checkpoints `dsinfer create-demo-model --preset tiny-v41-X --seed 1` writes
// (tests/fixtures/v41/golden_demo/, made by reference/v41/make_goldens.py --ckpt; see its
// manifest.json). The checkpoint is regenerated here and its bytes checked against the
// manifest's hashes, so a generator change cannot pass silently. Both numerics are compared:
// fp32-reference tightly before the oracle's own first unstable position, official tightly at
// the positions no discontinuity can have reached yet and loosely (top-1) after.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../golden_fixtures.h"
#include "../tolerance.h"
#include "backend/cpu/cpu_model.h"
#include "core/sha256.h"
#include "io/safetensors.h"
#include "runtime/sampler.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

namespace fs = std::filesystem;

// What one numerics' comparison over a preset's prompts found.
struct Tally {
  int stable = 0;         // stored positions before the oracle's first unstable one
  int stable_within = 0;  // of those, within the tight budget
  int early = 0;          // stored positions < kV41OfficialTightPositions (official only)
  int all = 0;            // every stored position
  int top1 = 0;           // of all, same argmax
  double worst_stable = 0;
  double worst_early = 0;
};

int32_t FirstUnstable(const io::SafetensorsFile& g, const std::string& name, size_t length) {
  auto v = dsinfer::testing::ReadGoldenTensor<int32_t>(g, name);
  return v.empty() || v[0] < 0 ? static_cast<int32_t>(length) : v[0];
}

class GoldenV41 : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenV41, LogitsAndGreedyMatchTheOracle) {
  const std::string preset = GetParam();
  const std::string dir = dsinfer::testing::FixtureDir("v41/golden_demo/" + preset);
  ASSERT_TRUE(fs::exists(dir + "/manifest.json")) << "missing V4.1 goldens for " << preset;
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  const auto& weights = dsinfer::testing::PresetWeights(preset, 1);
  // Same generator, same bytes (the weights; the tokenizer only feeds Engram's token map).
  int n_hashed = 0;
  for (const auto& [file, hash] : manifest["checkpoint"]["dir_fingerprint_sha256"].items()) {
    if (file.rfind("model", 0) != 0) continue;
    EXPECT_EQ(dsinfer::testing::FileSha256(weights.checkpoint().dir() + "/" + file),
              hash.get<std::string>())
        << file << ": create-demo-model output changed; regenerate the goldens";
    ++n_hashed;
  }
  EXPECT_GE(n_hashed, 2);
  auto golden = io::SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const io::SafetensorsFile& g = **golden;
  const int64_t V = weights.config().vocab_size;
  ThreadPool pool(2);
  for (const bool official : {false, true}) {
    const std::string nm = official ? "official" : "fp32";
    auto m = CpuModel::Create(weights, official ? Numerics::Official() : Numerics::Fp32Reference(),
                              pool);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    Tally tally;
    int n_prompts = 0, n_greedy_exact = 0, n_greedy_ties = 0;
    for (int k = 0;; ++k) {
      const std::string p = "p" + std::to_string(k) + ".";
      auto ids = dsinfer::testing::ReadGoldenTensor<int32_t>(g, p + "ids");
      if (ids.empty()) break;
      ++n_prompts;
      auto positions = dsinfer::testing::ReadGoldenTensor<int32_t>(g, p + "positions");
      auto want = dsinfer::testing::ReadGoldenTensor<float>(g, p + "logits." + nm);
      ASSERT_EQ(want.size(), positions.size() * V);
      const int32_t unstable = FirstUnstable(g, p + "first_unstable." + nm, ids.size());
      auto state = (*m)->NewSequence();
      ForwardOutput out;
      ASSERT_TRUE((*m)->Forward(*state, ids, {.all_logits = true}, &out).ok());
      for (size_t i = 0; i < positions.size(); ++i) {
        const float* a = out.logits.data() + int64_t{positions[i]} * V;
        const float* b = want.data() + i * V;
        const double nmse = dsinfer::testing::CompareLogits(a, b, V).nmse;
        ++tally.all;
        tally.top1 += runtime::ArgMax(std::span<const float>(a, V)) ==
                      runtime::ArgMax(std::span<const float>(b, V));
        if (positions[i] < unstable) {
          ++tally.stable;
          tally.worst_stable = std::max(tally.worst_stable, nmse);
          tally.stable_within += nmse <= tolerance::kV41GoldenStableNmse;
          if (!official) {
            EXPECT_LE(nmse, tolerance::kV41GoldenStableNmse)
                << preset << " fp32 prompt " << k << " position " << positions[i];
          }
        }
        if (official && positions[i] < std::min(unstable, tolerance::kV41OfficialTightPositions)) {
          ++tally.early;
          tally.worst_early = std::max(tally.worst_early, nmse);
          EXPECT_LE(nmse, tolerance::kV41GoldenStableNmse)
              << preset << " official prompt " << k << " position " << positions[i];
        }
      }
      // Greedy continuation, one token per step from the prefilled state, while the oracle's
      // margins say the choice is not a near-tie (compared only while the prompt is stable).
      if (unstable < static_cast<int32_t>(ids.size())) continue;
      auto greedy = dsinfer::testing::ReadGoldenTensor<int32_t>(g, p + "greedy." + nm);
      auto margin = dsinfer::testing::ReadGoldenTensor<float>(g, p + "margin." + nm);
      std::vector<float> logits(out.logits.end() - V, out.logits.end());
      bool exact = true;
      for (size_t s = 0; s < greedy.size(); ++s) {
        const int32_t tok = runtime::ArgMax(logits);
        if (tok != greedy[s]) {
          const bool tie = s < margin.size() && margin[s] < tolerance::kGreedyTieMargin;
          if (!official) {
            EXPECT_TRUE(tie) << preset << " fp32 prompt " << k << ": greedy diverged at step " << s
                             << " (reference margin " << margin[s] << ")";
          }
          n_greedy_ties += tie;
          exact = false;
          break;
        }
        const int32_t one[1] = {tok};
        ASSERT_TRUE((*m)->Forward(*state, one, {}, &out).ok());
        logits = out.logits;
      }
      n_greedy_exact += exact;
    }
    EXPECT_EQ(n_prompts, 6) << preset;
    const double top1 = static_cast<double>(tally.top1) / std::max(tally.all, 1);
    const double stable_share =
        static_cast<double>(tally.stable_within) / std::max(tally.stable, 1);
    std::printf(
        "[%s %s] %d/%d stable positions within %.0e (worst %.3g), %d positions < %d worst %.3g, "
        "top-1 agreement %.3f over %d positions, %d greedy continuations exact (%d at a "
        "near-tie)\n",
        preset.c_str(), nm.c_str(), tally.stable_within, tally.stable,
        tolerance::kV41GoldenStableNmse, tally.worst_stable, tally.early,
        tolerance::kV41OfficialTightPositions, tally.worst_early, top1, tally.all, n_greedy_exact,
        n_greedy_ties);
    if (official) {
      EXPECT_GE(tally.early, 5) << preset;
      EXPECT_GE(stable_share, tolerance::kV41OfficialStableShare) << preset;
      EXPECT_GE(top1, tolerance::kV41OfficialTop1Agreement) << preset;
    } else {
      EXPECT_EQ(top1, 1.0) << preset;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GoldenV41,
                         ::testing::Values("tiny-v41-a", "tiny-v41-b", "tiny-v41-c"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace dsinfer::backend::cpu
