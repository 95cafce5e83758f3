// Tier-3 goldens: the CPU engine in fp32-reference numerics against Hugging Face transformers'
// DeepseekV4ForCausalLM (fixtures from reference/make_goldens.py; see their manifest.json).
// The checkpoint is regenerated here with the same generator and seed, and its bytes are
// checked against the hashes in the manifest, so a generator change cannot pass silently.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../golden_fixtures.h"
#include "../tolerance.h"
#include "backend/cpu/cpu_model.h"
#include "io/safetensors.h"
#include "runtime/sampler.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

namespace fs = std::filesystem;

std::string FixtureDir(const std::string& preset) {
  return dsinfer::testing::GoldenFixtureDir(preset);
}

uint64_t Fnv1a(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t h = 0xcbf29ce484222325ull;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof(buf));
    for (std::streamsize i = 0; i < in.gcount(); ++i)
      h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ull;
  }
  return h;
}

template <typename T>
std::vector<T> Read(const io::SafetensorsFile& f, const std::string& name) {
  return dsinfer::testing::ReadGoldenTensor<T>(f, name);
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LogitsAndGreedyMatchTransformers) {
  const std::string preset = GetParam();
  const std::string dir = FixtureDir(preset);
  if (!fs::exists(dir + "/manifest.json")) GTEST_SKIP() << "no golden fixtures for " << preset;
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  uint64_t seed = manifest.value("seed", 1);
  const auto& weights = dsinfer::testing::PresetWeights(preset, seed);
  // Same generator, same bytes.
  if (manifest.contains("checkpoint_fnv1a64")) {
    for (auto& [file, hash] : manifest["checkpoint_fnv1a64"].items()) {
      uint64_t got = Fnv1a(weights.checkpoint().dir() + "/" + file);
      char hex[32];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(got));
      EXPECT_EQ(std::string(hex), hash.get<std::string>())
          << file << ": create-demo-model output changed";
    }
  }
  auto golden = io::SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  ThreadPool pool(2);
  auto m = CpuModel::Create(weights, Numerics::Fp32Reference(), pool);
  ASSERT_TRUE(m.ok());
  const int64_t V = weights.config().vocab_size;
  int n_prompts = 0, n_greedy_exact = 0, n_ties = 0;
  for (int k = 0;; ++k) {
    std::string p = "p" + std::to_string(k) + ".";
    auto ids = Read<int32_t>(**golden, p + "ids");
    if (ids.empty()) break;
    ++n_prompts;
    auto positions = Read<int32_t>(**golden, p + "positions");
    auto want = Read<float>(**golden, p + "logits");
    ASSERT_EQ(want.size(), positions.size() * V);
    auto state = (*m)->NewSequence();
    ForwardOutput out;
    ASSERT_TRUE((*m)->Forward(*state, ids, {.all_logits = true, .want_hidden = true}, &out).ok());
    // MTP: the block runs over the main model's final streams H[0..L-2] with tokens ids[1..L-1].
    auto mtp_positions = Read<int32_t>(**golden, p + "mtp_positions");
    if (!mtp_positions.empty()) {
      auto mtp_want = Read<float>(**golden, p + "mtp_logits");
      ASSERT_EQ(mtp_want.size(), mtp_positions.size() * V);
      const int64_t HD = int64_t{weights.config().hc_mult} * weights.config().hidden;
      std::vector<int32_t> next(ids.begin() + 1, ids.end());
      std::vector<float> mtp;
      auto mtp_state = (*m)->NewSequence();
      ASSERT_TRUE((*m)->ForwardMtp(*mtp_state,
                                   std::span<const float>(out.hidden.data(), next.size() * HD),
                                   next, &mtp)
                      .ok());
      double worst = 0;
      for (size_t i = 0; i < mtp_positions.size(); ++i) {
        const float* a = mtp.data() + static_cast<int64_t>(mtp_positions[i]) * V;
        const float* b = mtp_want.data() + i * V;
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; ++v) {
          double d = static_cast<double>(a[v]) - b[v];
          num += d * d, den += static_cast<double>(b[v]) * b[v];
        }
        worst = std::max(worst, num / std::max(den, 1e-30));
      }
      std::printf("[%s prompt %d] MTP logits NMSE %.3g (%.2f%% of budget)\n", preset.c_str(), k,
                  worst, 100 * worst / tolerance::kMtpLogitsNmse);
      EXPECT_LE(worst, tolerance::kMtpLogitsNmse) << preset << " prompt " << k << " MTP";
    }
    double worst_nmse = 0, worst_rel = 0, worst_abs = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
      const float* a = out.logits.data() + static_cast<int64_t>(positions[i]) * V;
      const float* b = want.data() + i * V;
      double num = 0, den = 0, maxabs_b = 0, maxdiff = 0;
      for (int64_t v = 0; v < V; ++v) {
        double d = static_cast<double>(a[v]) - b[v];
        num += d * d, den += static_cast<double>(b[v]) * b[v];
        maxabs_b = std::max(maxabs_b, std::fabs(static_cast<double>(b[v])));
        maxdiff = std::max(maxdiff, std::fabs(d));
      }
      worst_nmse = std::max(worst_nmse, num / std::max(den, 1e-30));
      worst_rel = std::max(worst_rel, maxdiff / std::max(maxabs_b, 1e-30));
      worst_abs = std::max(worst_abs, maxdiff);
    }
    std::printf(
        "[%s prompt %d, %zu tokens] logits NMSE %.3g (%.2f%% of budget), max abs err %.3g, max rel "
        "err %.3g (%.2f%% of budget)\n",
        preset.c_str(), k, ids.size(), worst_nmse, 100 * worst_nmse / tolerance::kGoldenLogitsNmse,
        worst_abs, worst_rel, 100 * worst_rel / tolerance::kGoldenLogitsMaxRel);
    EXPECT_LE(worst_nmse, tolerance::kGoldenLogitsNmse) << preset << " prompt " << k;
    EXPECT_LE(worst_rel, tolerance::kGoldenLogitsMaxRel) << preset << " prompt " << k;

    // Greedy continuation, decoded token by token from the prefilled state.
    auto greedy = Read<int32_t>(**golden, p + "greedy");
    auto margin = Read<float>(**golden, p + "greedy_margin");
    std::vector<float> logits(out.logits.end() - V, out.logits.end());
    bool exact = true;
    for (size_t s = 0; s < greedy.size(); ++s) {
      int32_t tok = runtime::ArgMax(logits);
      if (tok != greedy[s]) {
        bool tie = s < margin.size() && margin[s] < tolerance::kGreedyTieMargin;
        EXPECT_TRUE(tie) << preset << " prompt " << k << ": greedy diverged at step " << s
                         << " (got " << tok << ", want " << greedy[s] << ", reference margin "
                         << (s < margin.size() ? margin[s] : -1) << ")";
        n_ties += tie;
        exact = false;
        break;
      }
      int32_t one[1] = {tok};
      ASSERT_TRUE((*m)->Forward(*state, one, {}, &out).ok());
      logits = out.logits;
    }
    n_greedy_exact += exact;
  }
  EXPECT_GE(n_prompts, 8);
  std::printf("[%s] %d/%d greedy continuations identical, %d stopped at a reference near-tie\n",
              preset.c_str(), n_greedy_exact, n_prompts, n_ties);
}

// The official quantization steps (act_quant before FP8/FP4 linears, FP8 KV round trip, indexer
// Hadamard + FP4), without bf16 rounding, against the oracle with the same steps added by hooks
// (reference/quant_sim.py). Quantization is discontinuous: one flipped code propagates to later
// positions, and the oracle itself (fp64 vs fp32) diverges from `first_unstable_position` on.
// Before it the engine must match at the fp32 floor; a missing or misplaced step would show at
// every position, position 0 included.
TEST_P(Golden, QuantizationStepsMatchHookedTransformers) {
  const std::string preset = GetParam();
  const std::string path = FixtureDir(preset) + "/golden_quant.safetensors";
  if (!fs::exists(path)) GTEST_SKIP() << "no quantization goldens for " << preset;
  auto golden = io::SafetensorsFile::Open(path);
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const auto& weights = dsinfer::testing::PresetWeights(preset, 1);
  ThreadPool pool(2);
  auto m = CpuModel::Create(weights, Numerics{false, true, true, true}, pool);
  ASSERT_TRUE(m.ok());
  const int64_t V = weights.config().vocab_size;
  int n_stable = 0, n_after = 0, n_after_close = 0;
  for (int k = 0; k < 16; ++k) {
    std::string p = "p" + std::to_string(k) + ".";
    auto ids = Read<int32_t>(**golden, p + "ids");
    if (ids.empty()) continue;
    auto positions = Read<int32_t>(**golden, p + "positions");
    auto want = Read<float>(**golden, p + "logits");
    auto unstable = Read<int32_t>(**golden, p + "first_unstable_position");
    int32_t first_unstable = unstable.empty() ? static_cast<int32_t>(ids.size()) : unstable[0];
    if (first_unstable < 0) first_unstable = static_cast<int32_t>(ids.size());
    auto state = (*m)->NewSequence();
    ForwardOutput out;
    ASSERT_TRUE((*m)->Forward(*state, ids, {.all_logits = true}, &out).ok());
    for (size_t i = 0; i < positions.size(); ++i) {
      const float* a = out.logits.data() + static_cast<int64_t>(positions[i]) * V;
      const float* b = want.data() + i * V;
      double num = 0, den = 0;
      for (int64_t v = 0; v < V; ++v) {
        double d = static_cast<double>(a[v]) - b[v];
        num += d * d, den += static_cast<double>(b[v]) * b[v];
      }
      double nmse = num / std::max(den, 1e-30);
      if (positions[i] < first_unstable) {
        ++n_stable;
        EXPECT_LE(nmse, tolerance::kGoldenLogitsNmse)
            << preset << " prompt " << k << " position " << positions[i];
      } else {
        ++n_after;
        n_after_close += nmse <= tolerance::kGoldenLogitsNmse;
      }
    }
  }
  std::printf(
      "[%s quant] %d stable positions all within budget; %d/%d positions past the oracle's own "
      "instability point also match\n",
      preset.c_str(), n_stable, n_after_close, n_after);
  EXPECT_GT(n_stable, 0);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, Golden, ::testing::Values("tiny-a", "tiny-b", "tiny-c"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace dsinfer::backend::cpu
