#include "core/system_memory.h"

#include <gtest/gtest.h>

namespace dsinfer {
namespace {

TEST(SystemMemory, ParsesMemAvailableAndRejectsMalformedText) {
  EXPECT_EQ(ParseMemAvailable("MemTotal:       24000000 kB\nMemFree:  100 kB\n"
                              "MemAvailable:   22000000 kB\nBuffers: 5 kB\n"),
            int64_t{22000000} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 0 kB\n"), 0);
  EXPECT_FALSE(ParseMemAvailable("MemTotal: 5 kB\n").has_value());
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: lots\n").has_value());
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: 12 MB\n").has_value());
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: -3 kB\n").has_value());
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: 99999999999999999999 kB\n").has_value());
  EXPECT_FALSE(ParseMemAvailable("XMemAvailable: 12 kB\n").has_value());  // not at a line start
  EXPECT_FALSE(ParseMemAvailable("MemAvailable:").has_value());
  EXPECT_FALSE(ParseMemAvailable("").has_value());
}

TEST(SystemMemory, ThisMachineReportsPlausibleFigures) {
  const auto total = TotalMemoryBytes();
  const auto available = AvailableMemoryBytes();
  ASSERT_TRUE(total.has_value());
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*total, int64_t{64} << 20);
  EXPECT_GT(*available, 0);
  EXPECT_LE(*available, *total);
}

}  // namespace
}  // namespace dsinfer
