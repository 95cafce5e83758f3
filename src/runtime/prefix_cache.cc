#include "runtime/prefix_cache.h"

#include <algorithm>

namespace dsinfer::runtime {

uint64_t PrefixCache::Extend(uint64_t h, int32_t token) {
  uint64_t x = h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ull +
                    (h << 6) + (h >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const PrefixCache::Entry* PrefixCache::Lookup(std::span<const int32_t> ids, int64_t max_tokens) {
  uint64_t h = 0x243f6a8885a308d3ull;
  Lru::iterator best = lru_.end();
  int64_t n = std::min<int64_t>(max_tokens, static_cast<int64_t>(ids.size()));
  for (int64_t i = 0; i < n; ++i) {
    h = Extend(h, ids[i]);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) continue;
    const Entry& e = *it->second;
    if (static_cast<int64_t>(e.tokens.size()) == i + 1 &&
        std::equal(e.tokens.begin(), e.tokens.end(), ids.begin()))
      best = it->second;
  }
  if (best == lru_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, best);
  return &*best;
}

bool PrefixCache::Contains(std::span<const int32_t> prefix) const {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (int32_t t : prefix) h = Extend(h, t);
  auto it = by_hash_.find(h);
  return it != by_hash_.end() && std::equal(prefix.begin(), prefix.end(),
                                            it->second->tokens.begin(), it->second->tokens.end());
}

void PrefixCache::Insert(std::span<const int32_t> prefix,
                         std::shared_ptr<const backend::RunnerState> state, int64_t bytes) {
  if (prefix.empty() || Contains(prefix)) return;
  uint64_t h = 0x243f6a8885a308d3ull;
  for (int32_t t : prefix) h = Extend(h, t);
  auto old = by_hash_.find(h);
  if (old != by_hash_.end()) {  // a colliding different prefix: replace it
    bytes_ -= old->second->bytes;
    if (observer_ != nullptr) observer_->OnRemoved(old->second->tokens);
    lru_.erase(old->second);
    by_hash_.erase(old);
  }
  lru_.push_front({std::vector<int32_t>(prefix.begin(), prefix.end()), std::move(state), bytes});
  by_hash_[h] = lru_.begin();
  bytes_ += bytes;
  if (observer_ != nullptr) observer_->OnStored(prefix);
}

void PrefixCache::EvictTo(int64_t target_bytes) {
  while (bytes_ > target_bytes && !lru_.empty()) {
    Entry& e = lru_.back();
    uint64_t h = 0x243f6a8885a308d3ull;
    for (int32_t t : e.tokens) h = Extend(h, t);
    by_hash_.erase(h);
    bytes_ -= e.bytes;
    if (observer_ != nullptr) observer_->OnRemoved(e.tokens);
    lru_.pop_back();
  }
}

void PrefixCache::Clear() {
  lru_.clear();
  by_hash_.clear();
  bytes_ = 0;
  if (observer_ != nullptr) observer_->OnCleared();
}

}  // namespace dsinfer::runtime
