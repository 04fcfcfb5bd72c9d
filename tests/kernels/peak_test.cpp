#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/peak.hpp>
#include <meshtensor/kernels/simd.hpp>

namespace meshtensor::kernels {
namespace {

constexpr double kGHz = 1e9;

std::vector<SimdLevel> levels_this_cpu_runs() {
  std::vector<SimdLevel> levels;
  for (const SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512})
    if (static_cast<int>(level) <= static_cast<int>(best_simd_level())) levels.push_back(level);
  return levels;
}

#if defined(__x86_64__)
// A core clock no x86-64 core has been sold with lies outside this range: a chain the core
// shortcuts (Intel folds immediate additions at renaming) reads several times too fast.
TEST(MeasuredClock, IsACoreClock) {
  const double clock = measured_clock_hz(0.02);
  EXPECT_GT(clock, 0.3 * kGHz);
  EXPECT_LT(clock, 7.0 * kGHz);
}

// Wide FMAs beside the chain may lower the clock (Intel's AVX-512 licence), never raise it (by
// more than the turbo clock's moves between two measurements while other tests run).
TEST(MeasuredClock, UnderFmaLoadIsNoFasterThanAlone) {
  // The fastest of a few: one measurement can fall in a moment another test slows the core.
  double alone = 0;
  for (int i = 0; i < 3; ++i)
    alone = std::max(alone, measured_clock_hz(0.02));
  for (const SimdLevel level : levels_this_cpu_runs()) {
    const double loaded = measured_clock_hz(0.02, level);
    EXPECT_GT(loaded, 0.3 * kGHz) << simd_level_name(level);
    EXPECT_LT(loaded, 1.3 * alone) << simd_level_name(level);
  }
}

// The FMA kernel cannot beat the theoretical peak at its own clock: where it seems to, the unit
// table or the clock is wrong (by a factor: the bound leaves room for the turbo clock's moves
// between the two measurements while other tests run; a clock measured while the thread was
// preempted reads low, so the fastest of three counts).
TEST(FmaPeak, StaysWithinTheTheoreticalPeakAtTheLevelsClock) {
  for (const SimdLevel level : levels_this_cpu_runs()) {
    double clock = 0;
    for (int i = 0; i < 3; ++i)
      clock = std::max(clock, measured_clock_hz(0.02, level));
    const double theoretical = clock * fma_units(level).flops_per_cycle();
    const double measured = fma_flops_per_second(level, 0.02);
    EXPECT_LT(measured, 1.5 * theoretical) << simd_level_name(level);
  }
}
#endif

TEST(FmaPeak, RejectsALevelTheCpuCannotRun) {
  if (best_simd_level() == SimdLevel::avx512) GTEST_SKIP() << "this CPU runs every level";
  EXPECT_THROW(measured_clock_hz(0.01, SimdLevel::avx512), InvalidArgument);
  EXPECT_THROW(fma_flops_per_second(SimdLevel::avx512, 0.01), InvalidArgument);
}

}  // namespace
}  // namespace meshtensor::kernels
