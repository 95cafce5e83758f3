// Ad-hoc engine check used while making the goldens (not built: copy into tests/backend/ to run).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_model.h"
#include "io/safetensors.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {
template <typename T>
std::vector<T> Rd(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo* info = f.Find(name);
  if (info == nullptr) return {};
  auto ref = f.Ref(*info);
  std::vector<T> out(ref.bytes.size() / sizeof(T));
  std::memcpy(out.data(), ref.bytes.data(), out.size() * sizeof(T));
  return out;
}
TEST(MtpOracleCheck, All) {
  for (std::string preset : {"tiny-a", "tiny-b", "tiny-c"}) {
    auto g = io::SafetensorsFile::Open(std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/golden/" +
                                       preset + "/golden.safetensors");
    ASSERT_TRUE(g.ok());
    const auto& w = dsinfer::testing::PresetWeights(preset, 1);
    ThreadPool pool(1);
    auto m = CpuModel::Create(w, Numerics::Fp32Reference(), pool);
    ASSERT_TRUE(m.ok());
    const int64_t V = w.config().vocab_size;
    int n = 0;
    for (int k = 0; k < 8; ++k) {
      std::string p = "p" + std::to_string(k) + ".";
      auto pos = Rd<int32_t>(**g, p + "mtp_positions");
      if (pos.empty()) continue;
      ++n;
      auto ids = Rd<int32_t>(**g, p + "ids");
      auto want = Rd<float>(**g, p + "mtp_logits");
      auto st = (*m)->NewSequence();
      ForwardOutput out;
      ASSERT_TRUE((*m)->Forward(*st, ids, {.all_logits = false, .want_hidden = true}, &out).ok());
      const int64_t L = ids.size();
      const int64_t HD = out.hidden.size() / L;
      std::vector<float> hid(out.hidden.begin(), out.hidden.begin() + (L - 1) * HD);
      std::vector<int32_t> nxt(ids.begin() + 1, ids.end());
      std::vector<float> logits;
      ASSERT_TRUE((*m)->ForwardMtp(*st, hid, nxt, &logits).ok());
      double worst = 0;
      for (size_t i = 0; i < pos.size(); ++i) {
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; ++v) {
          double d = logits[pos[i] * V + v] - want[i * V + v];
          num += d * d, den += double(want[i * V + v]) * want[i * V + v];
        }
        worst = std::max(worst, num / den);
      }
      std::printf("[%s p%d L=%lld] mtp NMSE %.3g\n", preset.c_str(), k, (long long)L, worst);
      EXPECT_LE(worst, 1e-6);
    }
    EXPECT_EQ(n, 2);
  }
}
}  // namespace
}  // namespace dsinfer::backend::cpu
