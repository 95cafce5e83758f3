// Storage on cache-line boundaries for buffers that SIMD kernels read and write in 64-byte
// vectors: from a 16-byte aligned std::vector every such access straddles two lines, which on
// the Sapphire Rapids VM of docs/PERF.md made the FP8 tile conversion ~25 % slower (stores into
// the A-tile ring and tile loads from it both split).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace dsinfer {

inline constexpr std::size_t kCacheLine = 64;

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  constexpr CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{kCacheLine});
  }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

// A std::vector whose data() is 64-byte aligned.
template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace dsinfer
