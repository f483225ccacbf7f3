// GpuMonitor's summary (CPU) and, with the `cuda` label, its sampling of a real card.
#include "runtime/gpu_monitor.h"

#include <gtest/gtest.h>


#include "runtime/tensor.h"

namespace qshard {
namespace {

TEST(GpuClockSummary, MedianPercentilesAndShares) {
  std::vector<GpuSample> s;
  // 10 busy samples 1,400..1,850 MHz (the first four power-capped, one thermal), and two idle ones
  // at the top clock, which the summary leaves out.
  for (int i = 0; i < 10; ++i)
    s.push_back({1400.0 + 50.0 * i, 600.0 + 10.0 * i,
                 (i < 4 ? kGpuReasonSwPowerCap : 0) | (i == 9 ? kGpuReasonHwThermal : 0)});
  s.push_back({1980, 90, kGpuReasonIdle});
  s.push_back({1980, 90, kGpuReasonIdle});
  const GpuClockSummary c = summarize_gpu_samples(s, 1980, 700);
  ASSERT_TRUE(c.available());
  EXPECT_EQ(c.samples, 10);
  EXPECT_EQ(c.sm_mhz_p10, 1450.0);     // index round(0.1 * 9) = 1
  EXPECT_EQ(c.sm_mhz_median, 1650.0);  // index round(4.5) = 5
  EXPECT_EQ(c.sm_mhz_p90, 1800.0);     // index round(8.1) = 8
  EXPECT_EQ(c.power_w_median, 650.0);
  EXPECT_DOUBLE_EQ(c.power_capped_share, 0.4);
  EXPECT_DOUBLE_EQ(c.thermal_share, 0.1);
  EXPECT_EQ(c.describe(),
            "SM 1,650 MHz median (p10 1,450, p90 1,800; top 1,980), power 650 W of 700 W, power-capped in 40% of "
            "10 samples, thermal slowdown in 10%");
}

TEST(GpuClockSummary, NothingBusyIsUnavailable) {
  EXPECT_FALSE(summarize_gpu_samples({}, 0, 0).available());
  EXPECT_FALSE(summarize_gpu_samples({{1980, 80, kGpuReasonIdle}, {0, 0, 0}}, 1980, 700).available());
  EXPECT_EQ(summarize_gpu_samples({}, 1980, 700).describe(), "");
  // Unknown top clock and limit are left out of the line.
  EXPECT_EQ(summarize_gpu_samples({{1500, 400, 0}}, 0, 0).describe(),
            "SM 1,500 MHz median (p10 1,500, p90 1,500), power 400 W, power-capped in 0% of 1 samples");
}

TEST(GpuMonitor, WithoutAGpuItSamplesNothing) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is here (GpuMonitorGpu covers it)";
  GpuMonitor m(5);
  EXPECT_FALSE(m.usable());
  m.start();
  EXPECT_FALSE(m.stop().available());
}

}  // namespace
}  // namespace qshard
