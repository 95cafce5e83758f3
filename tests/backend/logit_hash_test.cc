// Numerics pinned bit for bit: FNV-1a hashes of the CPU forward's logits (and MTP logits) for
// the golden prompts of tiny-a/b/c and fixed prompts on the demo and bench presets, in both
// numerics modes, against tests/fixtures/logit_hashes.json. Restructuring the forward (one layer
// program for every backend, paged sequence state) must not change a single bit; a change that
// is meant to alter numerics regenerates the table (DSINFER_WRITE_LOGIT_HASHES=1) and says why.
//
// Which CPU kernels run the official numerics' matmuls depends on the machine (AMX tiles,
// AVX-512 BF16 dot products, or the FP32 kernels; each family reproducible bit for bit, the
// families not with each other), so the table is keyed by backend::cpu::MachineMatMulKernel().
// ctest runs this suite twice: as discovered (this machine's kernels; skipped where the table
// has no entry for them) and as `logit_hashes_fp32` with the fast kernels switched off, whose
// entries every x86-64 machine must reproduce.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "../golden_fixtures.h"
#include "backend/cpu/cpu_model.h"
#include "backend/cpu/linear.h"
#include "io/safetensors.h"
#include "model/demo_model.h"
#include "runtime/sampler.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

namespace fs = std::filesystem;

std::string TablePath() {
  const char* env = std::getenv("DSINFER_SOURCE_DIR");
  const std::string root = env != nullptr && *env != '\0' ? env : DSINFER_SOURCE_DIR;
  return root + "/tests/fixtures/logit_hashes.json";
}

struct Hasher {
  uint64_t h = 0xcbf29ce484222325ull;
  void Add(const std::vector<float>& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
  std::string Hex() const {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

std::vector<int32_t> SeededIds(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(2, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

// The golden prompts of a tiny preset (their p<k>.ids tensors).
std::vector<std::vector<int32_t>> GoldenPrompts(const std::string& preset) {
  std::vector<std::vector<int32_t>> prompts;
  auto golden = io::SafetensorsFile::Open(dsinfer::testing::GoldenFixtureDir(preset) +
                                          "/golden.safetensors");
  if (!golden.ok()) return prompts;
  for (int k = 0;; ++k) {
    auto ids = dsinfer::testing::ReadGoldenTensor<int32_t>(**golden,
                                                           "p" + std::to_string(k) + ".ids");
    if (ids.empty()) break;
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

// The numbers a case pins: every position's logits of a one-shot prefill and the MTP block's
// logits over its hidden states (tiny presets); or a chunked prefill's last logits followed by
// greedy decode steps (demo, bench: vocabulary-sized rows for every position would be hundreds
// of MB).
std::string HashOneShot(CpuModel& m, const std::vector<int32_t>& ids, bool mtp) {
  Hasher h;
  auto state = m.NewSequence();
  ForwardOutput out;
  Status st = m.Forward(*state, ids, {.all_logits = true, .want_hidden = mtp}, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  h.Add(out.logits);
  if (mtp && ids.size() > 1) {
    const int64_t HD = int64_t{m.config().hc_mult} * m.config().hidden;
    std::vector<int32_t> next(ids.begin() + 1, ids.end());
    std::vector<float> mtp_logits;
    auto mtp_state = m.NewSequence();
    st = m.ForwardMtp(*mtp_state, std::span<const float>(out.hidden.data(), next.size() * HD),
                      next, &mtp_logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    h.Add(mtp_logits);
  }
  return h.Hex();
}

std::string HashPrefillDecode(CpuModel& m, const std::vector<int32_t>& ids, int chunk,
                              int decode_steps) {
  Hasher h;
  auto state = m.NewSequence();
  ForwardOutput out;
  for (size_t i = 0; i < ids.size(); i += chunk) {
    const size_t n = std::min<size_t>(chunk, ids.size() - i);
    Status st = m.Forward(*state, std::span<const int32_t>(ids.data() + i, n), {}, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    h.Add(out.logits);
  }
  for (int s = 0; s < decode_steps; ++s) {
    const int32_t tok[1] = {runtime::ArgMax(out.logits)};
    Status st = m.Forward(*state, tok, {}, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    h.Add(out.logits);
  }
  return h.Hex();
}

// name -> hash for every case of a preset in both numerics modes.
std::map<std::string, std::string> HashPreset(const std::string& preset,
                                              const model::ModelWeights& weights) {
  std::map<std::string, std::string> got;
  ThreadPool pool(2);
  for (bool official : {true, false}) {
    const Numerics nm = official ? Numerics::Official() : Numerics::Fp32Reference();
    auto m = CpuModel::Create(weights, nm, pool);
    EXPECT_TRUE(m.ok());
    if (!m.ok()) return got;
    const std::string prefix = preset + "/" + nm.Name() + "/";
    const int vocab = weights.config().vocab_size;
    if (preset == "demo") {
      // 300 tokens: ratio-128 rows, and the indexer selecting (75 visible rows > top-64).
      got[prefix + "short"] = HashOneShot(**m, SeededIds(37, vocab, 51), false);
      got[prefix + "prefill300+decode8"] = HashPrefillDecode(**m, SeededIds(300, vocab, 52), 128, 8);
    } else if (preset == "bench") {
      got[prefix + "prefill600+decode4"] = HashPrefillDecode(**m, SeededIds(600, vocab, 61), 512, 4);
    } else {
      const auto prompts = GoldenPrompts(preset);
      EXPECT_GE(prompts.size(), 8u) << preset << ": golden prompts missing";
      for (size_t k = 0; k < prompts.size(); ++k)
        got[prefix + "p" + std::to_string(k)] =
            HashOneShot(**m, prompts[k], weights.config().n_mtp_layers > 0);
    }
  }
  return got;
}

// Compares (or, with DSINFER_WRITE_LOGIT_HASHES=1, records) this machine's kernel family's
// hashes for one preset.
void CheckPreset(const std::string& preset, const model::ModelWeights& weights) {
  const std::string kernel = MachineMatMulKernel();
  nlohmann::json table = nlohmann::json::object();
  if (fs::exists(TablePath())) table = nlohmann::json::parse(std::ifstream(TablePath()));
  const auto got = HashPreset(preset, weights);
  const char* write = std::getenv("DSINFER_WRITE_LOGIT_HASHES");
  if (write != nullptr && std::string(write) == "1") {
    for (const auto& [name, hash] : got) table[kernel][name] = hash;
    std::ofstream(TablePath()) << table.dump(2) << "\n";
    std::printf("recorded %zu hashes for kernel %s\n", got.size(), kernel.c_str());
    return;
  }
  if (!table.contains(kernel))
    GTEST_SKIP() << "no recorded logit hashes for this machine's kernels (" << kernel
                 << "); the logit_hashes_fp32 test checks the FP32 kernels' hashes here";
  int same = 0;
  for (const auto& [name, hash] : got) {
    ASSERT_TRUE(table[kernel].contains(name)) << kernel << " " << name << " not recorded";
    const bool equal = hash == table[kernel][name].get<std::string>();
    EXPECT_TRUE(equal) << kernel << " " << name << ": the logits changed";
    same += equal;
  }
  std::printf("[%s, kernels %s] %d of %zu logit hashes identical\n", preset.c_str(),
              kernel.c_str(), same, got.size());
}

class LogitHashes : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitHashes, UnchangedBitForBit) {
  const std::string preset = GetParam();
  CheckPreset(preset, dsinfer::testing::PresetWeights(preset, 1));
}

INSTANTIATE_TEST_SUITE_P(Presets, LogitHashes,
                         ::testing::Values("tiny-a", "tiny-b", "tiny-c", "demo"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The bench preset has real V4-Flash layer sizes (12 GB of weights, ~2 min to write): it runs
// where DSINFER_BENCH_MODEL names a checkpoint written by `dsinfer create-demo-model DIR --preset
// bench --seed 1` (the `logit_hashes_bench` ctest writes one into the build tree first).
TEST(LogitHashesBench, UnchangedBitForBit) {
  const char* dir = std::getenv("DSINFER_BENCH_MODEL");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "DSINFER_BENCH_MODEL is not set";
  auto weights = model::ModelWeights::Load(dir);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  CheckPreset("bench", **weights);
}

}  // namespace
}  // namespace dsinfer::backend::cpu
