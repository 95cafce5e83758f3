// V4.1 dSpark goldens: the CPU engine's draft head against the independent PyTorch oracle
// reference/v41 (make_dspark_goldens.py; tests/fixtures/v41/dspark/<preset>/manifest.json says
// how each was made) on the checkpoints `dsinfer create-demo-model --preset P --seed 1` writes:
// the target-layer means (main_hidden), the projected rows the stage rings take (main_x), and at
// every draft point the collapsed streams, the logits with the Markov bias, the confidence and
// the greedy draft chain. The oracle's continuation is teacher-forced, and each row's Markov
// bias uses the oracle's previous draft id, so every row is compared on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
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
using dsinfer::testing::CompareLogits;
using dsinfer::testing::ReadGoldenTensor;

// The worst of one quantity over the compared rows.
struct Worst {
  double value = 0;
  std::string where;
  void Take(double v, const std::string& at) {
    if (v > value) value = v, where = at;
  }
};

// Biased logits of one row against the golden's: the full row (tiny presets), or the golden's
// top-16 log-probabilities (demo-v4.1: the row minus its log-sum-exp at the golden's ids).
double RowError(const float* got, int64_t V, const io::SafetensorsFile& g, const std::string& nm,
                int64_t row) {
  auto full = ReadGoldenTensor<float>(g, nm + ".draft_logits");
  if (!full.empty()) return CompareLogits(got, full.data() + row * V, V).nmse;
  auto top_ids = ReadGoldenTensor<int32_t>(g, nm + ".draft_top_ids");
  auto top = ReadGoldenTensor<float>(g, nm + ".draft_top_logits");
  auto lse = ReadGoldenTensor<float>(g, nm + ".draft_logsumexp");
  const int64_t K = static_cast<int64_t>(top_ids.size()) / static_cast<int64_t>(lse.size());
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(got[v]));
  for (int64_t v = 0; v < V; ++v) sum += std::exp(got[v] - mx);
  const double got_lse = mx + std::log(sum);
  double worst = 0;
  for (int64_t k = 0; k < K; ++k) {
    const int32_t id = top_ids[row * K + k];
    const double want = static_cast<double>(top[row * K + k]) - lse[row];
    worst = std::max(worst, std::fabs((got[id] - got_lse) - want));
  }
  return worst;
}

class GoldenDspark : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenDspark, TheDraftHeadMatchesTheOracle) {
  const std::string preset = GetParam();
  const std::string dir = dsinfer::testing::FixtureDir("v41/dspark/" + preset);
  ASSERT_TRUE(fs::exists(dir + "/manifest.json")) << "missing dSpark goldens for " << preset;
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  const auto& weights = dsinfer::testing::PresetWeights(preset, 1);
  int n_hashed = 0;
  for (const auto& [file, hash] : manifest["checkpoint"]["sha256"].items()) {
    if (file.rfind("model", 0) != 0) continue;
    EXPECT_EQ(dsinfer::testing::FileSha256(weights.checkpoint().dir() + "/" + file),
              hash.get<std::string>())
        << file << ": create-demo-model output changed; regenerate the dSpark goldens";
    ++n_hashed;
  }
  EXPECT_GE(n_hashed, 2);
  auto golden = io::SafetensorsFile::Open(dir + "/dspark.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const io::SafetensorsFile& g = **golden;
  const model::ModelConfig& c = weights.config();
  const int64_t V = c.vocab_size, D = c.hidden;
  const auto tokens = ReadGoldenTensor<int32_t>(g, "tokens");
  const int64_t L = ReadGoldenTensor<int32_t>(g, "prompt_len").at(0);
  const int B = ReadGoldenTensor<int32_t>(g, "block_size").at(0);
  ASSERT_EQ(B, c.dspark.block_size);
  const int64_t S = static_cast<int64_t>(tokens.size()) - L - 1;
  ASSERT_GT(S, 0);
  ThreadPool pool(2);
  for (const bool official : {false, true}) {
    const std::string nm = official ? "official" : "fp32";
    auto made = CpuModel::Create(
        weights, official ? Numerics::Official() : Numerics::Fp32Reference(), pool);
    ASSERT_TRUE(made.ok());
    CpuModel& m = **made;
    const int64_t K = m.HiddenWidth();
    const auto main_hidden = ReadGoldenTensor<float>(g, nm + ".main_hidden");
    const auto main_x = ReadGoldenTensor<float>(g, nm + ".main_x");
    const auto draft_x = ReadGoldenTensor<float>(g, nm + ".draft_x");
    const auto draft_ids = ReadGoldenTensor<int32_t>(g, nm + ".draft_ids");
    const auto confidence = ReadGoldenTensor<float>(g, nm + ".confidence");
    const auto unstable = ReadGoldenTensor<int32_t>(g, nm + ".unstable");
    ASSERT_EQ(main_hidden.size(), static_cast<size_t>((L + S) * K));
    ASSERT_EQ(main_x.size(), static_cast<size_t>((L + S) * D));
    ASSERT_EQ(draft_ids.size(), static_cast<size_t>(S * B));
    Worst hidden_err, x_err, draft_err, logit_err, conf_err;
    int rows = 0, rows_within = 0, ids_compared = 0, ids_equal = 0;
    auto st = m.NewSequence();
    // Feeds positions [at, at + n): the backbone (its captures checked against the oracle's),
    // then the stage rings with the ORACLE's main_hidden rows, so that the draft head is compared
    // on the same inputs even where the official numerics' backbone has flipped a rounding
    // discontinuity (an FP8 code, a routing near-tie) that the oracle did not, or the reverse:
    // on these random tiny models such a flip moves everything after it (golden_v41_test).
    int positions = 0, positions_within = 0;
    const auto feed = [&](int64_t at, int64_t n) {
      ForwardOutput out;
      ASSERT_TRUE(m.Forward(*st, std::span(tokens).subspan(at, n),
                            {.want_hidden = true, .want_logits = false}, &out)
                      .ok());
      for (int64_t p = 0; p < n; ++p) {
        const double e = CompareLogits(out.hidden.data() + p * K,
                                       main_hidden.data() + (at + p) * K, K).nmse;
        hidden_err.Take(e, "position " + std::to_string(at + p));
        ++positions;
        positions_within += e <= tolerance::kV41GoldenStableNmse;
      }
      SequenceState* states[] = {st.get()};
      const std::span<const float> hidden[] = {
          std::span<const float>(main_hidden).subspan(at * K, n * K)};
      std::vector<float> mx;
      ASSERT_TRUE(m.DsparkSeedBatch(states, hidden, &mx).ok());
      for (int64_t p = 0; p < n; ++p)
        x_err.Take(CompareLogits(mx.data() + p * D, main_x.data() + (at + p) * D, D).nmse,
                   "position " + std::to_string(at + p));
    };
    feed(0, L);
    for (int64_t j = 0; j < S; ++j) {
      const int64_t n = L + j;
      std::vector<float> logits, x;
      SequenceState* states[] = {st.get()};
      const int32_t pending[] = {tokens[n]};
      std::vector<float>* lo[] = {&logits};
      std::vector<float>* xo[] = {&x};
      ASSERT_TRUE(m.DsparkDraftBatch(states, pending, lo, xo).ok());
      std::vector<int32_t> prev = {tokens[n]};  // the oracle's chain: row i's previous token
      for (int i = 1; i < B; ++i) prev.push_back(draft_ids[j * B + i - 1]);
      std::vector<float> bias, conf;
      ASSERT_TRUE(m.DsparkMarkov(prev, x, &bias, &conf).ok());
      const int stable_rows = unstable.empty() ? B : unstable[j];
      for (int i = 0; i < B; ++i) {
        const std::string at = "draft " + std::to_string(j) + " row " + std::to_string(i);
        std::vector<float> row(logits.begin() + i * V, logits.begin() + (i + 1) * V);
        for (int64_t v = 0; v < V; ++v) row[v] += bias[i * V + v];
        draft_err.Take(CompareLogits(x.data() + i * D, draft_x.data() + (j * B + i) * D, D).nmse,
                       at);
        const double e = RowError(row.data(), V, g, nm, j * B + i);
        logit_err.Take(e, at);
        conf_err.Take(std::fabs(conf[i] - confidence[j * B + i]), at);
        ++rows;
        rows_within += e <= (V > 4096 ? tolerance::kDsparkTopLogprobAbs
                                      : tolerance::kV41GoldenStableNmse);
        if (i < stable_rows) {
          ++ids_compared;
          ids_equal += runtime::ArgMax(row) == draft_ids[j * B + i];
        }
      }
      feed(n, 1);
    }
    std::printf(
        "[%s %s] main_hidden worst NMSE %.3g (%s), %d/%d positions within budget; main_x %.3g; "
        "draft rows: x worst NMSE %.3g "
        "(%s), biased logits worst %.3g (%s), %d/%d rows within budget; confidence worst |d| "
        "%.3g; greedy drafts %d/%d equal on the oracle's stable rows\n",
        preset.c_str(), nm.c_str(), hidden_err.value, hidden_err.where.c_str(), positions_within,
        positions, x_err.value,
        draft_err.value, draft_err.where.c_str(), logit_err.value, logit_err.where.c_str(),
        rows_within, rows, conf_err.value, ids_equal, ids_compared);
    // main_x from the oracle's main_hidden: one FP8 linear and a norm, no discontinuity reached.
    EXPECT_LE(x_err.value, tolerance::kV41GoldenStableNmse) << x_err.where;
    if (!official) {
      // Both sides are fp32 computations of the same formulas: as the backbone's goldens.
      EXPECT_LE(hidden_err.value, tolerance::kV41GoldenStableNmse) << hidden_err.where;
      EXPECT_LE(draft_err.value, tolerance::kV41GoldenStableNmse) << draft_err.where;
      EXPECT_EQ(rows_within, rows) << "worst " << logit_err.value << " at " << logit_err.where;
      EXPECT_LE(conf_err.value, tolerance::kDsparkConfidenceAbs);
      EXPECT_EQ(ids_equal, ids_compared);
    } else {
      // FP8 codes and bf16 roundings flip on summation order (as the backbone's official
      // goldens): most rows within the budget, the greedy draft equal wherever the oracle's
      // own fp64 run agrees with it. The backbone's captures are reported only: on these random
      // models the official backbone diverges from the oracle's at its first rounding flip
      // (golden_v41_test holds it to its own budgets).
      EXPECT_GE(static_cast<double>(rows_within) / rows, tolerance::kDsparkOfficialRowShare);
      if (V <= 4096) {
        EXPECT_GT(ids_compared, rows / 2);
      }
      if (ids_compared > 0) {
        EXPECT_GE(static_cast<double>(ids_equal) / ids_compared,
                  tolerance::kDsparkOfficialDraftAgreement);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GoldenDspark,
                         ::testing::Values("tiny-v41-a", "tiny-v41-b", "demo-v4.1"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (ch == '-' || ch == '.') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace dsinfer::backend::cpu
