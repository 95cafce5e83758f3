// Ad-hoc engine check used while making the goldens (not built: copy into tests/backend/ to run).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_model.h"
#include "io/safetensors.h"
#include "runtime/sampler.h"
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
double Nmse(const float* a, const float* b, int64_t V) {
  double num = 0, den = 0;
  for (int64_t v = 0; v < V; ++v) {
    double d = double(a[v]) - b[v];
    num += d * d, den += double(b[v]) * b[v];
  }
  return num / den;
}
TEST(QuantOracleCheck, All) {
  const char* dir = std::getenv("QDIR");
  ASSERT_NE(dir, nullptr);
  for (std::string preset : {"tiny-a", "tiny-b", "tiny-c"}) {
    auto g =
        io::SafetensorsFile::Open(std::string(dir) + "/" + preset + "/golden_quant.safetensors");
    if (!g.ok()) continue;
    const auto& w = dsinfer::testing::PresetWeights(preset, 1);
    ThreadPool pool(1);
    Numerics nm{false, true, true, true};
    if (const char* q = std::getenv("QNUM"))
      nm = Numerics{q[0] == '1', q[1] == '1', q[2] == '1', q[3] == '1'};
    auto m = CpuModel::Create(w, nm, pool);
    ASSERT_TRUE(m.ok());
    const int64_t V = w.config().vocab_size;
    for (int k = 0; k < 8; ++k) {
      std::string p = "p" + std::to_string(k) + ".";
      auto ids = Rd<int32_t>(**g, p + "ids");
      if (ids.empty()) continue;
      auto pos = Rd<int32_t>(**g, p + "positions");
      auto want = Rd<float>(**g, p + "logits");
      auto st = (*m)->NewSequence();
      ForwardOutput out;
      ASSERT_TRUE((*m)->Forward(*st, ids, {.all_logits = true, .want_hidden = true}, &out).ok());
      double worst = 0;
      for (size_t i = 0; i < pos.size(); ++i) {
        double e = Nmse(&out.logits[pos[i] * V], &want[i * V], V);
        worst = std::max(worst, e);
        if (std::getenv("QVERBOSE")) std::printf("   pos %d nmse %.3g\n", pos[i], e);
        if (std::getenv("QBAD") && e > 1e-10) std::printf(" %d(%.1g)", pos[i], e);
      }
      const int64_t L = ids.size();
      double mworst = -1;
      auto mpos = Rd<int32_t>(**g, p + "mtp_positions");
      if (!mpos.empty()) {
        auto mwant = Rd<float>(**g, p + "mtp_logits");
        const int64_t HD = out.hidden.size() / L;
        std::vector<float> hid(out.hidden.begin(), out.hidden.begin() + (L - 1) * HD);
        std::vector<int32_t> nxt(ids.begin() + 1, ids.end());
        std::vector<float> ml;
        auto st2 = (*m)->NewSequence();
        ASSERT_TRUE((*m)->ForwardMtp(*st2, hid, nxt, &ml).ok());
        mworst = 0;
        for (size_t i = 0; i < mpos.size(); ++i)
          mworst = std::max(mworst, Nmse(&ml[mpos[i] * V], &mwant[i * V], V));
      }
      auto greedy = Rd<int32_t>(**g, p + "greedy");
      auto margin = Rd<float>(**g, p + "greedy_margin");
      std::vector<float> logits(out.logits.end() - V, out.logits.end());
      size_t s = 0;
      for (; s < greedy.size(); ++s) {
        int32_t tok = runtime::ArgMax(logits);
        if (tok != greedy[s]) break;
        int32_t one[1] = {tok};
        ASSERT_TRUE((*m)->Forward(*st, one, {}, &out).ok());
        logits = out.logits;
      }
      std::printf(
          "[%s quant p%d L=%lld] logits NMSE %.3g, mtp NMSE %.3g, greedy %zu/48 (margin at stop "
          "%g)\n",
          preset.c_str(), k, (long long)L, worst, mworst, s, s < margin.size() ? margin[s] : -1.0f);
    }
  }
}
}  // namespace
}  // namespace dsinfer::backend::cpu
