// The engine (continuous batching, prefix cache, preemption, n > 1 forks) on the GPU runner
// (backend/cuda/cuda_runner.h), with the same invariances the CPU engine suite asserts
// (tests/runtime/engine_test.cc), plus the GPU's greedy tokens against the CPU engine's. Skips
// without a GPU. The GPU's kernels are deterministic (no atomics, fixed split-K order), so a
// step's result depends only on its batch composition: a prefix hit restores an exact copy and
// replays the cold run's chunks, so its logprobs are bit-identical; a different batch changes
// fp32 summation orders, so tokens are compared there (fp32-reference numerics, no rounding
// steps to amplify the difference).
#include <gtest/gtest.h>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_runner.h"
#include "device_test_util.h"
#include "runtime/engine.h"

namespace dsinfer::backend::cuda {
namespace {

using runtime::Engine;
using runtime::EngineOptions;
using runtime::FinishReason;
using runtime::RequestParams;
using runtime::RequestStream;

using dsinfer::testing::Collect;
using dsinfer::testing::Greedy;
using dsinfer::testing::Ids;
using dsinfer::testing::Outcome;

// An engine on GPU 0 (nullptr and the reason when there is none).
std::unique_ptr<Engine> GpuEngine(EngineOptions o, std::string* why) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  o.numerics = Numerics::Fp32Reference();
  auto runner = MakeCudaRunner(0, w, o.numerics);
  if (!runner.ok()) {
    *why = runner.status().message();
    return nullptr;
  }
  auto e = Engine::Create(w, o, std::move(runner).value());
  if (!e.ok()) {
    *why = e.status().ToString();
    return nullptr;
  }
  return std::move(e).value();
}

#define GPU_ENGINE_OR_SKIP(engine, options)                                  \
  std::string why_##engine;                                                  \
  std::unique_ptr<Engine> engine = GpuEngine(options, &why_##engine);        \
  if (!engine) GTEST_SKIP() << "no CUDA device or engine: " << why_##engine; \
  EXPECT_NE(engine->device().find("cuda:0"), std::string::npos)

// DeepSeek-V4.1 is refused with a clear error before any device is opened (it runs on the CPU
// backend only), on machines with a GPU and without one; V4 checkpoints are accepted.
TEST(CudaEngine, V41CheckpointsAreRefusedBeforeTheDeviceOpens) {
  const auto& v41 = dsinfer::testing::PresetWeights("tiny-v41-a");
  const Status refused = CudaModel::Supports(v41.config());
  EXPECT_EQ(refused.code(), StatusCode::kUnimplemented);
  EXPECT_NE(refused.message().find("DeepSeek-V4.1"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("--device cpu"), std::string::npos) << refused.message();
  auto runner = MakeCudaRunner(0, v41, Numerics::Official());
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), StatusCode::kUnimplemented) << runner.status().ToString();
  EXPECT_TRUE(CudaModel::Supports(dsinfer::testing::PresetWeights("tiny-a").config()).ok());
}

TEST(CudaEngine, GreedyMatchesTheCpuEngineAloneInABatchAndAfterAPrefixHit) {
  const RequestParams target = Greedy(Ids(300, 1), 16);
  // The CPU engine's tokens: the reference across devices.
  Outcome cpu;
  {
    EngineOptions o{.n_threads = 2, .kv_cache_bytes = int64_t{256} << 20};
    o.numerics = Numerics::Fp32Reference();
    auto e = Engine::Create(dsinfer::testing::PresetWeights("tiny-a"), o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    cpu = Collect(**(*e)->Submit(target))[0];
  }
  GPU_ENGINE_OR_SKIP(engine, (EngineOptions{.kv_cache_bytes = int64_t{512} << 20}));
  Outcome first = Collect(**engine->Submit(target))[0];
  ASSERT_EQ(first.tokens.size(), 16u);
  EXPECT_EQ(first.tokens, cpu.tokens);
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0);
  // The same prompt again: restored from the cache, then the cold run's chunks replayed.
  Outcome second = Collect(**engine->Submit(target))[0];
  EXPECT_GE(second.usage.cached_prompt_tokens, static_cast<int64_t>(0.9 * target.prompt.size()));
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.logprobs, first.logprobs);  // bit-identical logits
  // In a batch of 8 with mixed prompt lengths (no cache: every prompt runs cold).
  GPU_ENGINE_OR_SKIP(batch_engine, (EngineOptions{.enable_prefix_cache = false}));
  std::vector<std::shared_ptr<RequestStream>> streams;
  const int lens[] = {5, 300, 1, 64, 129, 17, 250};
  for (int i = 0; i < 7; ++i)
    streams.push_back(*batch_engine->Submit(Greedy(Ids(lens[i], 100 + i), 10 + i)));
  auto mine = batch_engine->Submit(target);
  ASSERT_TRUE(mine.ok());
  Outcome batched = Collect(**mine)[0];
  for (auto& s : streams) EXPECT_EQ(Collect(*s)[0].reason, FinishReason::kLength);
  EXPECT_EQ(batched.tokens, first.tokens);
}

TEST(CudaEngine, PreemptionForksAndAdmissionUnderTheDeviceBudget) {
  // A GPU state is mostly its fixed window region, so growth has to come from long outputs:
  // four requests of 10 + 600 tokens under a budget of 3.5 states of 10 tokens. Three are
  // admitted, the fourth waits; their compressed rows grow ~1.5x, which forces preemption.
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  auto probe = MakeCudaRunner(0, w, Numerics::Fp32Reference());
  if (!probe.ok()) GTEST_SKIP() << "no CUDA device: " << probe.status().message();
  const int64_t start = (*probe)->StateBytesAt(10);
  ASSERT_GT((*probe)->StateBytesAt(610), start + start / 3);
  probe->reset();
  EngineOptions tight{.kv_cache_bytes = start * 3 + start / 2, .enable_prefix_cache = false};
  GPU_ENGINE_OR_SKIP(engine, tight);
  const RequestParams target = Greedy(Ids(10, 1), 600);
  std::vector<std::shared_ptr<RequestStream>> others;
  for (int i = 0; i < 3; ++i) others.push_back(*engine->Submit(Greedy(Ids(10, 200 + i), 600)));
  auto mine = engine->Submit(target);
  ASSERT_TRUE(mine.ok());
  Outcome preempted = Collect(**mine)[0];
  for (auto& s : others) EXPECT_EQ(Collect(*s)[0].reason, FinishReason::kLength);
  EXPECT_GT(engine->Stats().preemptions_total, 0);
  // A request that can never fit is refused up front.
  auto impossible = engine->Submit(Greedy(Ids(50, 3), 20000));
  ASSERT_FALSE(impossible.ok());
  EXPECT_EQ(impossible.status().code(), StatusCode::kResourceExhausted);
  // Alone on a roomy engine: the same tokens.
  GPU_ENGINE_OR_SKIP(roomy, (EngineOptions{.enable_prefix_cache = false}));
  Outcome alone = Collect(**roomy->Submit(target))[0];
  ASSERT_EQ(alone.tokens.size(), 600u);
  EXPECT_EQ(preempted.tokens, alone.tokens);
  // n = 3 greedy samples share the prompt (device copies of its state): identical outputs.
  RequestParams three = Greedy(Ids(40, 5), 20);
  three.n = 3;
  std::vector<Outcome> forks = Collect(**roomy->Submit(three), 3);
  Outcome single = Collect(**roomy->Submit(Greedy(Ids(40, 5), 20)))[0];
  for (const Outcome& o : forks) EXPECT_EQ(o.tokens, single.tokens);
}

}  // namespace
}  // namespace dsinfer::backend::cuda
