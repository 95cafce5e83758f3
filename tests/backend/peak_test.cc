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
  ThreadPool pool(2);
  const ComputePeak peak = MeasureComputePeak(pool, 0.05);
  EXPECT_EQ(peak.unit, *first) << PeakUnitName(peak.unit);
  // One core's rate of a unit: the best of a few short runs, so that a run the scheduler
  // interrupted (other tests share the machine under ctest -j) does not stand for it.
  auto best_one_core = [](PeakUnit u) {
    double best = 0;
    for (int run = 0; run < 5; ++run) best = std::max(best, OneCorePeakGmacs(u, 200000));
    return best;
  };
  // One core's rate of the same unit: the two-thread figure is at least most of it (the pool's
  // threads may share a core on some machines, never less than one core's worth).
  const double one = best_one_core(peak.unit);
  ASSERT_GT(one, 0.0);
  EXPECT_GT(peak.gmacs, 0.5 * one) << "one core " << one << ", pool " << peak.gmacs;
  for (const PeakUnit& u : units) {
    if (!PeakUnitAvailable(u)) {
      EXPECT_EQ(OneCorePeakGmacs(u, 1000), 0.0) << PeakUnitName(u);
    }
  }
  // The order is fastest first: on x86-64 the intrinsic units beat the portable loop.
  if (peak.unit != PeakUnit::kPortableFma) {
    EXPECT_GE(one, best_one_core(PeakUnit::kPortableFma) * 0.9);
  }
}

}  // namespace
}  // namespace dsinfer::backend::cpu
