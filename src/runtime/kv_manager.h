// The engine's KV memory: the pages of sequence state (model/state_layout.h) handed to the
// runner as its backend::PageAllocator. A page is reference counted: every sequence and
// prefix-cache entry over the same prefix holds the same page, and the state that writes into a
// shared page copies it first (backend/cpu/sequence_state.cc), so a shared prefix occupies its
// pages once however many requests use it. Released pages go to a free list (bounded) and are
// handed out again, so steady serving does not churn the allocator.
//
// Budget: the engine decides admission, preemption and eviction from the bytes in use (the
// states' own bytes plus bytes_in_use() here) before each step; the manager refuses any page
// past the whole budget as a backstop, so a wrong estimate fails a step with a clear error
// instead of running the machine out of memory.
// Thread-safe (pages may be released from any thread that drops the last reference).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/page_allocator.h"

namespace dsinfer::runtime {

class KvManager final : public backend::PageAllocator,
                        public std::enable_shared_from_this<KvManager> {
 public:
  struct Stats {
    int64_t pages_in_use = 0;
    int64_t bytes_in_use = 0;
    int64_t peak_bytes = 0;
    int64_t allocations = 0;  // pages handed out
    int64_t reused = 0;       // of those, taken from the free list
    int64_t refused = 0;      // allocations refused at the budget
    int64_t free_bytes = 0;   // held on the free list
  };

  // budget_bytes: no more page bytes than this are ever in use. free_list_bytes: at most this
  // many released bytes are kept for reuse (the rest go back to the system).
  static std::shared_ptr<KvManager> Create(int64_t budget_bytes,
                                           int64_t free_list_bytes = int64_t{64} << 20);
  ~KvManager() override;

  Result<backend::PageRef> Allocate(int64_t bytes) override;
  int64_t bytes_in_use() const override;
  Stats stats() const;
  int64_t budget() const { return budget_; }

 private:
  KvManager(int64_t budget_bytes, int64_t free_list_bytes);
  void Release(backend::Page* page);

  const int64_t budget_;
  const int64_t free_list_limit_;
  mutable std::mutex mu_;
  Stats stats_;
  std::vector<backend::Page> free_;  // released pages, any size (the model's page size is one)
};

}  // namespace dsinfer::runtime
