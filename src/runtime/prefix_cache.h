// Exact prefix cache over token ids. Entries are snapshots of a sequence's complete decode state
// at restorable boundaries (every `block` tokens of a prompt and one token before its end), so a
// hit restores exactly the state a cold prefill would reach: logits are bit-identical.
// Keys are hashes of the whole prefix (chained over the ids); the ids are kept and compared, so a
// hash collision can never return a wrong state. LRU eviction under a byte budget owned by the
// engine. Engine-thread only.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/model_runner.h"

namespace dsinfer::runtime {

// Told, on the engine thread, what the cache holds: a prefix stored, a prefix dropped (evicted
// or replaced), everything dropped. This is what a KV-event publisher for KV-aware routers
// needs (server/kv_events.h). Calls must be cheap and must not block: they run inside a step.
class PrefixCacheObserver {
 public:
  virtual ~PrefixCacheObserver() = default;
  virtual void OnStored(std::span<const int32_t> prefix) = 0;
  virtual void OnRemoved(std::span<const int32_t> prefix) = 0;
  virtual void OnCleared() = 0;
};

class PrefixCache {
 public:
  struct Entry {
    std::vector<int32_t> tokens;  // the prefix this state has consumed
    std::shared_ptr<const backend::RunnerState> state;
    int64_t bytes = 0;
  };

  // Longest cached prefix of ids with length <= max_tokens, or nullptr. Marks it recently used.
  const Entry* Lookup(std::span<const int32_t> ids, int64_t max_tokens);
  bool Contains(std::span<const int32_t> prefix) const;
  void Insert(std::span<const int32_t> prefix, std::shared_ptr<const backend::RunnerState> state,
              int64_t bytes);
  // Evicts least recently used entries until bytes() <= target_bytes.
  void EvictTo(int64_t target_bytes);
  // Drops every entry (the observer hears OnCleared, not one OnRemoved per entry).
  void Clear();
  // Not owned; null: nobody is told.
  void set_observer(PrefixCacheObserver* observer) { observer_ = observer; }
  int64_t bytes() const { return bytes_; }
  size_t size() const { return lru_.size(); }

 private:
  static uint64_t Extend(uint64_t h, int32_t token);
  using Lru = std::list<Entry>;
  Lru lru_;  // front = most recent
  std::unordered_map<uint64_t, Lru::iterator> by_hash_;
  int64_t bytes_ = 0;
  PrefixCacheObserver* observer_ = nullptr;
};

}  // namespace dsinfer::runtime
