#include "backend/page_allocator.h"

#include <atomic>
#include <new>

namespace dsinfer::backend {

namespace {

class HeapPageAllocator final : public PageAllocator,
                                public std::enable_shared_from_this<HeapPageAllocator> {
 public:
  Result<PageRef> Allocate(int64_t bytes) override {
    if (bytes <= 0) return InvalidArgument("page of " + std::to_string(bytes) + " bytes");
    auto* data = new (std::nothrow) uint8_t[static_cast<size_t>(bytes)];
    if (data == nullptr)
      return ResourceExhausted("out of memory for a " + std::to_string(bytes) + "-byte page");
    in_use_ += bytes;
    // The deleter keeps the allocator alive until its last page is gone.
    auto self = shared_from_this();
    return PageRef(new Page{data, bytes}, [self](Page* p) {
      self->in_use_ -= p->bytes;
      delete[] p->data;
      delete p;
    });
  }
  int64_t bytes_in_use() const override { return in_use_.load(); }

 private:
  std::atomic<int64_t> in_use_{0};
};

}  // namespace

std::shared_ptr<PageAllocator> MakeHeapPageAllocator() {
  return std::make_shared<HeapPageAllocator>();
}

}  // namespace dsinfer::backend
