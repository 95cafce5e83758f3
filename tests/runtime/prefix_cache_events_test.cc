// What the prefix cache tells its observer (the KV-event publisher's source) and the engine's
// prefix-cache flush (SGLang's /flush_cache): refused while requests run, complete when idle.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::Collect;
using dsinfer::testing::Greedy;
using dsinfer::testing::Ids;

// Records what it is told; the engine calls it from its own thread.
class RecordingObserver final : public PrefixCacheObserver {
 public:
  void OnStored(std::span<const int32_t> prefix) override {
    std::lock_guard lock(mu_);
    stored_.emplace_back(prefix.begin(), prefix.end());
  }
  void OnRemoved(std::span<const int32_t> prefix) override {
    std::lock_guard lock(mu_);
    removed_.emplace_back(prefix.begin(), prefix.end());
  }
  void OnCleared() override {
    std::lock_guard lock(mu_);
    ++cleared_;
  }
  std::vector<std::vector<int32_t>> stored() const {
    std::lock_guard lock(mu_);
    return stored_;
  }
  std::vector<std::vector<int32_t>> removed() const {
    std::lock_guard lock(mu_);
    return removed_;
  }
  int cleared() const {
    std::lock_guard lock(mu_);
    return cleared_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> stored_, removed_;
  int cleared_ = 0;
};

TEST(PrefixCacheObserver, HearsEveryInsertEvictionAndClear) {
  PrefixCache cache;
  RecordingObserver observer;
  cache.set_observer(&observer);
  const std::vector<int32_t> a = {1, 2, 3}, b = {1, 2, 3, 4, 5};
  cache.Insert(a, nullptr, 100);
  cache.Insert(b, nullptr, 200);
  cache.Insert(a, nullptr, 100);  // already cached: nothing new
  ASSERT_EQ(observer.stored(), (std::vector<std::vector<int32_t>>{a, b}));
  cache.EvictTo(200);  // the least recently used, a, goes
  EXPECT_EQ(observer.removed(), (std::vector<std::vector<int32_t>>{a}));
  cache.Clear();
  EXPECT_EQ(cache.bytes(), 0);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(observer.cleared(), 1);
  EXPECT_EQ(observer.removed().size(), 1u);  // a clear is one event, not one per entry
}

std::unique_ptr<Engine> MakeEngine(std::shared_ptr<PrefixCacheObserver> observer) {
  EngineOptions o;
  o.n_threads = 2;
  o.kv_cache_bytes = int64_t{256} << 20;
  o.prefix_cache_observer = std::move(observer);
  auto e = Engine::Create(dsinfer::testing::PresetWeights("tiny-a"), o);
  DSINFER_CHECK_MSG(e.ok(), e.status().ToString());
  return std::move(e).value();
}

TEST(EnginePrefixCache, ObserverSeesTheSnapshotsAPromptLeaves) {
  auto observer = std::make_shared<RecordingObserver>();
  auto engine = MakeEngine(observer);
  const std::vector<int32_t> prompt = Ids(300, 7);
  auto s = engine->Submit(Greedy(prompt, 2));
  ASSERT_TRUE(s.ok());
  Collect(**s);
  // Snapshots every 128 tokens and one token before the prompt's end, each a prefix of it.
  std::vector<size_t> lengths;
  for (const auto& p : observer->stored()) {
    lengths.push_back(p.size());
    EXPECT_TRUE(std::equal(p.begin(), p.end(), prompt.begin()));
  }
  EXPECT_EQ(lengths, (std::vector<size_t>{128, 256, 299}));
}

TEST(EnginePrefixCache, FlushWhenIdleDropsEverythingAndIsRefusedWhileARequestRuns) {
  auto observer = std::make_shared<RecordingObserver>();
  auto engine = MakeEngine(observer);
  const std::vector<int32_t> prompt = Ids(200, 11);
  Collect(**engine->Submit(Greedy(prompt, 2)));
  auto again = engine->Submit(Greedy(prompt, 2));
  ASSERT_TRUE(again.ok());
  EXPECT_GT(Collect(**again)[0].usage.cached_prompt_tokens, 0);

  // A request in flight: the flush is refused and the cache keeps serving.
  auto busy = engine->Submit(Greedy(Ids(50, 12), 1000));
  ASSERT_TRUE(busy.ok());
  Status refused = engine->FlushPrefixCache();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_EQ(observer->cleared(), 0);
  (*busy)->Cancel();
  Collect(**busy);

  Status flushed = engine->FlushPrefixCache();
  EXPECT_TRUE(flushed.ok()) << flushed.ToString();
  EXPECT_EQ(observer->cleared(), 1);
  auto cold = engine->Submit(Greedy(prompt, 2));
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(Collect(**cold)[0].usage.cached_prompt_tokens, 0);

  engine->Shutdown(std::chrono::steady_clock::now());
  EXPECT_EQ(engine->FlushPrefixCache().code(), StatusCode::kFailedPrecondition);
}

TEST(EnginePrefixCache, StatsCountTheRunningSequencesTokens) {
  auto engine = MakeEngine(nullptr);
  auto s = engine->Submit(Greedy(Ids(40, 3), 1000));
  ASSERT_TRUE(s.ok());
  // Wait until it runs, then its context (prompt + generated so far) is counted.
  int64_t seen = 0;
  for (int i = 0; i < 500 && seen == 0; ++i) {
    seen = engine->Stats().n_tokens_running;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_GE(seen, 40);
  (*s)->Cancel();
  Collect(**s);
}

}  // namespace
}  // namespace dsinfer::runtime
