#include "runtime/kv_manager.h"

#include <algorithm>
#include <new>
#include <string>

namespace dsinfer::runtime {

std::shared_ptr<KvManager> KvManager::Create(int64_t budget_bytes, int64_t free_list_bytes) {
  return std::shared_ptr<KvManager>(new KvManager(budget_bytes, free_list_bytes));
}

KvManager::KvManager(int64_t budget_bytes, int64_t free_list_bytes)
    : budget_(budget_bytes), free_list_limit_(free_list_bytes) {}

KvManager::~KvManager() {
  for (backend::Page& p : free_) delete[] p.data;
}

Result<backend::PageRef> KvManager::Allocate(int64_t bytes) {
  if (bytes <= 0) return InvalidArgument("KV page of " + std::to_string(bytes) + " bytes");
  backend::Page page;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.bytes_in_use + bytes > budget_) {
      ++stats_.refused;
      return ResourceExhausted("KV budget of " + std::to_string(budget_) +
                               " bytes is full (" + std::to_string(stats_.pages_in_use) +
                               " pages in use): no page for this step");
    }
    auto it = std::find_if(free_.begin(), free_.end(),
                           [&](const backend::Page& p) { return p.bytes == bytes; });
    if (it != free_.end()) {
      page = *it;
      free_.erase(it);
      stats_.free_bytes -= bytes;
      ++stats_.reused;
    }
    stats_.bytes_in_use += bytes;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes_in_use);
    ++stats_.pages_in_use;
    ++stats_.allocations;
  }
  if (page.data == nullptr) {
    page.data = new (std::nothrow) uint8_t[static_cast<size_t>(bytes)];
    page.bytes = bytes;
    if (page.data == nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_in_use -= bytes;
      --stats_.pages_in_use;
      return ResourceExhausted("out of memory for a " + std::to_string(bytes) + "-byte KV page");
    }
  }
  // The deleter returns the page here; it keeps the manager alive until its last page is gone.
  auto self = shared_from_this();
  return backend::PageRef(new backend::Page(page), [self](backend::Page* p) {
    self->Release(p);
    delete p;
  });
}

void KvManager::Release(backend::Page* page) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in_use -= page->bytes;
  --stats_.pages_in_use;
  if (stats_.free_bytes + page->bytes <= free_list_limit_) {
    free_.push_back(*page);
    stats_.free_bytes += page->bytes;
  } else {
    delete[] page->data;
  }
}

int64_t KvManager::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.bytes_in_use;
}

KvManager::Stats KvManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dsinfer::runtime
