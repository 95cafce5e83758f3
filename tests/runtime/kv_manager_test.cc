// runtime::KvManager: reference-counted pages under the budget, recycled through the free list,
// and the pages of sequences that share a prefix held once (with the CPU runner's states).
#include "runtime/kv_manager.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/model_runner.h"
#include "../backend/test_models.h"

namespace dsinfer::runtime {
namespace {

TEST(KvManager, PagesAreCountedOnceRecycledAndRefusedPastTheBudget) {
  auto kv = KvManager::Create(/*budget_bytes=*/4 * 1000, /*free_list_bytes=*/1000);
  auto a = kv->Allocate(1000);
  ASSERT_TRUE(a.ok());
  std::memset((*a)->data, 7, 1000);  // the memory is really there
  backend::PageRef shared = *a;      // a second holder: still one page
  EXPECT_EQ(kv->bytes_in_use(), 1000);
  EXPECT_EQ(kv->stats().pages_in_use, 1);
  std::vector<backend::PageRef> more;
  for (int i = 0; i < 3; ++i) more.push_back(*kv->Allocate(1000));
  EXPECT_EQ(kv->bytes_in_use(), 4000);
  auto over = kv->Allocate(1000);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->stats().refused, 1);
  // Released pages: one kept for reuse (the free list holds 1000 bytes), the rest freed.
  more.clear();
  EXPECT_EQ(kv->bytes_in_use(), 1000);
  EXPECT_EQ(kv->stats().free_bytes, 1000);
  a = Status(StatusCode::kCancelled, "dropped");
  EXPECT_EQ(kv->bytes_in_use(), 1000) << "the second holder keeps the page";
  shared.reset();
  EXPECT_EQ(kv->bytes_in_use(), 0);
  auto again = kv->Allocate(1000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(kv->stats().reused, 1);
  EXPECT_EQ(kv->stats().peak_bytes, 4000);
}

TEST(KvManager, OutlivesItsHolders) {
  backend::PageRef page;
  {
    auto kv = KvManager::Create(1 << 20);
    page = *kv->Allocate(4096);
  }
  std::memset(page->data, 1, 4096);  // the manager is kept alive by its page (ASan checks)
  page.reset();
}

// Sixteen sequences that continue one prefix hold its pages once: copies share them and each
// copies only the page it writes into.
TEST(KvManager, SequencesSharingAPrefixHoldItsPagesOnce) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  auto runner = backend::MakeCpuRunner(w, backend::Numerics::Official(), {.n_threads = 2});
  ASSERT_TRUE(runner.ok());
  auto kv = KvManager::Create(int64_t{1} << 30);
  ASSERT_TRUE((*runner)->UsePageAllocator(kv).ok());
  const int64_t page = (*runner)->layout()->page_bytes;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> tok(2, w.config().vocab_size - 1);
  std::vector<int32_t> prefix(1000);
  for (auto& t : prefix) t = tok(rng);
  auto root = (*runner)->NewState();
  ASSERT_TRUE(root.ok());
  backend::ForwardOutput out;
  backend::RunnerChunk chunk{root->get(), prefix, {}, &out};
  ASSERT_TRUE((*runner)->ForwardBatch(std::span(&chunk, 1)).ok());
  const int64_t prefix_pages = (*runner)->layout()->PagesFor(1000);
  EXPECT_EQ(kv->bytes_in_use(), prefix_pages * page);
  std::vector<std::unique_ptr<backend::RunnerState>> forks;
  for (int i = 0; i < 16; ++i) forks.push_back(std::move((*runner)->Copy(**root)).value());
  EXPECT_EQ(kv->bytes_in_use(), prefix_pages * page);
  // Each continues with tokens of its own (past a page boundary: 1000 -> 1100).
  std::vector<std::vector<int32_t>> tails(16, std::vector<int32_t>(100));
  std::vector<backend::ForwardOutput> outs(16);
  std::vector<backend::RunnerChunk> chunks;
  for (int i = 0; i < 16; ++i) {
    for (auto& t : tails[i]) t = tok(rng);
    chunks.push_back({forks[i].get(), tails[i], {}, &outs[i]});
  }
  ASSERT_TRUE((*runner)->ForwardBatch(chunks).ok());
  // The shared full pages once; per sequence its copy of the prefix's last (partial) page and
  // the page past the boundary.
  EXPECT_EQ(kv->bytes_in_use(), (prefix_pages + 16 * 2) * page);
  std::printf("16 sequences over a 1000-token prefix: %lld page bytes (unshared: %lld)\n",
              static_cast<long long>(kv->bytes_in_use()),
              static_cast<long long>(17 * (*runner)->layout()->PagesFor(1100) * page));
}

}  // namespace
}  // namespace dsinfer::runtime
