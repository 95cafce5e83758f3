#include "core/aligned.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace dsinfer {
namespace {

// The kernels' scratch buffers rely on it: a 64-byte vector access from data() never splits a
// cache line, whatever the element type, size or growth.
TEST(AlignedVector, DataStartsOnACacheLine) {
  for (std::size_t n : {1u, 3u, 17u, 1000u, 123457u}) {
    AlignedVector<uint16_t> a(n);
    AlignedVector<int8_t> b(n, 5);
    AlignedVector<float> c;
    c.resize(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % kCacheLine, 0u) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % kCacheLine, 0u) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c.data()) % kCacheLine, 0u) << n;
    EXPECT_EQ(b[n - 1], 5);
    c.resize(3 * n + 1);  // regrown storage is aligned too
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c.data()) % kCacheLine, 0u) << n;
  }
}

}  // namespace
}  // namespace dsinfer
