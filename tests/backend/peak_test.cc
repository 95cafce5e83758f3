// The compute roof: the fastest multiply-add unit the CPU has, measured on every thread at once.
#include "backend/cpu/peak.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace dsinfer::backend::cpu {
namespace {

TEST(ComputePeak, MeasuresTheFastestUnitOnEveryThread) {
  const PeakUnit units[] = {PeakUnit::kAmxBf16, PeakUnit::kAvx512Bf16, PeakUnit::kAvx512Fma,
                            PeakUnit::kAvx2Fma, PeakUnit::kPortableFma};
  ASSERT_TRUE(PeakUnitAvailable(PeakUnit::kPortableFma)) << "the portable loop runs everywhere";
  const PeakUnit* first = nullptr;
  for (const PeakUnit& u : units)
    if (first == nullptr && PeakUnitAvailable(u)) first = &u;
  // The pool's rate against one thread's rate of the same unit, each the best of five short
  // runs taken alternately, so that other tests and builds sharing the machine under ctest -j
  // slow both alike and an interrupted run does not stand for either.
  ThreadPool pool(2);
  ThreadPool one_thread(1);
  ComputePeak peak, one;
  for (int run = 0; run < 5; ++run) {
    const ComputePeak p = MeasureComputePeak(pool, 0.05);
    const ComputePeak o = MeasureComputePeak(one_thread, 0.05);
    EXPECT_EQ(p.unit, *first) << PeakUnitName(p.unit);
    EXPECT_EQ(o.unit, p.unit);
    peak.unit = p.unit;
    peak.gmacs = std::max(peak.gmacs, p.gmacs);
    one.gmacs = std::max(one.gmacs, o.gmacs);
  }
  ASSERT_GT(one.gmacs, 0.0);
  // Two threads reach at least half of one thread's rate (they may share a core on some
  // machines; a pool that left its threads idle or divided by the wrong count would not).
  EXPECT_GT(peak.gmacs, 0.5 * one.gmacs) << "one thread " << one.gmacs << ", pool " << peak.gmacs;
  auto best_one_core = [](PeakUnit u) {
    double best = 0;
    for (int run = 0; run < 5; ++run) best = std::max(best, OneCorePeakGmacs(u, 200000));
    return best;
  };
  for (const PeakUnit& u : units) {
    if (!PeakUnitAvailable(u)) {
      EXPECT_EQ(OneCorePeakGmacs(u, 1000), 0.0) << PeakUnitName(u);
    }
  }
  // The order is fastest first: on x86-64 the intrinsic units beat the portable loop.
  if (peak.unit != PeakUnit::kPortableFma) {
    EXPECT_GE(best_one_core(peak.unit), best_one_core(PeakUnit::kPortableFma) * 0.9);
  }
}

}  // namespace
}  // namespace dsinfer::backend::cpu
