// GpuMonitor on a real card (label `cuda`; skips without a GPU): NVML answers through the driver's
// library, and a busy card's samples have a clock within its top clock and a power draw.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/gpu_monitor.h"
#include "runtime/tensor.h"

namespace qshard {
namespace {

TEST(GpuMonitorGpu, SamplesTheCardWhileItCopies) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  GpuMonitor m(20);
  ASSERT_TRUE(m.usable()) << "NVML (libnvidia-ml.so.1) did not open this GPU";
  // Keep the card busy (device-to-device copies of 512 MiB) so that its samples are not idle ones.
  Tensor a = Tensor::zeros({int64_t{256} << 20}, DType::kBF16, Device::kCuda);
  Tensor b = Tensor::zeros({int64_t{256} << 20}, DType::kBF16, Device::kCuda);
  m.start();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
  while (std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 20; ++i) copy_bytes(b.raw(), Device::kCuda, a.raw(), Device::kCuda, a.nbytes());
  const GpuClockSummary c = m.stop();
  ASSERT_TRUE(c.available()) << "no busy sample in 600 ms";
  EXPECT_GT(c.sm_mhz_median, 100.0);
  if (c.sm_mhz_max > 0) EXPECT_LE(c.sm_mhz_p90, c.sm_mhz_max);
  EXPECT_GT(c.power_w_median, 0.0);
  if (c.power_limit_w > 0) EXPECT_LE(c.power_w_median, c.power_limit_w * 1.2);
  std::printf("GpuMonitor: %s\n", c.describe().c_str());
}

}  // namespace
}  // namespace qshard
