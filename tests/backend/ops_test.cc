#include "backend/cpu/ops.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace dsinfer::backend::cpu {
namespace {

// The experts take silu of a bf16-rounded gate from SiluOfBf16's table instead of computing
// x / (1 + e^-x): every one of the 65536 bf16 values gives the formula's bits (NaNs: a NaN).
TEST(Ops, SiluTableGivesTheFormulaForEveryBf16Value) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float x = Bf16ToF32(static_cast<uint16_t>(bits));
    const float want = x / (1.0f + std::exp(-x));
    const float got = SiluOfBf16(static_cast<uint16_t>(bits));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "bits " << bits;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
        << "bits " << bits << " x " << x;
  }
}

}  // namespace
}  // namespace dsinfer::backend::cpu
