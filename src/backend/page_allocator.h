// Pages of sequence state (model/state_layout.h): fixed-size spans of host memory holding the
// compressed KV rows and indexer keys of page_tokens positions. A page is reference counted: the
// sequences and prefix-cache entries that share a prefix hold the same pages, and a writer copies
// a shared page before changing it (copy on write). Who hands pages out is a PageAllocator: the
// engine's KV manager (runtime/kv_manager.h), which accounts them against its budget, or the
// plain HeapPageAllocator for standalone use (tools, tests).
// Allocators are thread-compatible (the engine thread); a Page may be released on any thread
// that drops the last reference while no other thread uses the allocator.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"

namespace dsinfer::backend {

struct Page {
  uint8_t* data = nullptr;  // [bytes]
  int64_t bytes = 0;
};
using PageRef = std::shared_ptr<Page>;

class PageAllocator {
 public:
  virtual ~PageAllocator() = default;
  // A page of `bytes` (contents unspecified). ResourceExhausted when none can be had.
  virtual Result<PageRef> Allocate(int64_t bytes) = 0;
  // Bytes of the pages alive now, each counted once however many holders share it.
  virtual int64_t bytes_in_use() const = 0;
};

// new[] / delete[] with a byte count; never refuses (but for the system running out of memory).
std::shared_ptr<PageAllocator> MakeHeapPageAllocator();

}  // namespace dsinfer::backend
