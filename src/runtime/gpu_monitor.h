// gpu_monitor.h: the GPU's SM clock, power draw and clock-event reasons, sampled through NVML on a
// host thread while a benchmark's timed steps run, so that a tokens/s or MFU figure says at what
// clock it was made. A card at its power limit lowers its clock under sustained load (an H200 at
// 700 W ran qshard's 8B steps at a median 1,485 of its 1,980 MHz, docs/PERFORMANCE.md session 28),
// which a GEMM rate measured in a ~14 ms burst at start does not see.
//
// NVML is opened at run time (dlopen of libnvidia-ml.so.1, the driver's): a build machine without
// a driver links and runs, and a monitor without NVML or a GPU reports no samples. Only the
// sampling thread calls NVML; the training step is not touched (no CUDA call, no sync).
//
// summarize_gpu_samples: median / p10 / p90 of the SM clock, median power, the share of samples
// with the software power cap (NVML's clock-event reason 0x4) and with any thermal slowdown (0x20
// software, 0x40 hardware); samples taken while the card was idle (reason 0x1) are left out.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace qshard {

struct GpuSample {
  double sm_mhz = 0;
  double power_w = 0;
  uint64_t reasons = 0;  // NVML clock-event reasons (bit mask)
};

// NVML's clock-event reason bits that the summary reads.
inline constexpr uint64_t kGpuReasonIdle = 0x1, kGpuReasonSwPowerCap = 0x4, kGpuReasonSwThermal = 0x20,
                          kGpuReasonHwThermal = 0x40;

struct GpuClockSummary {
  int samples = 0;          // busy samples summarized
  double sm_mhz_median = 0, sm_mhz_p10 = 0, sm_mhz_p90 = 0;
  double sm_mhz_max = 0;    // the card's top SM clock (0: unknown)
  double power_w_median = 0;
  double power_limit_w = 0;  // the enforced limit (0: unknown)
  double power_capped_share = 0, thermal_share = 0;  // of the busy samples, 0..1
  bool available() const { return samples > 0; }
  // "SM 1,485 MHz median (p10 1,425, p90 1,530; top 1,980), power 693 W of 700 W, power-capped in
  // 100% of 120 samples" (thermal slowdown named when seen); "" when unavailable.
  std::string describe() const;
};

GpuClockSummary summarize_gpu_samples(std::vector<GpuSample> samples, double sm_mhz_max, double power_limit_w);

class GpuMonitor {
 public:
  // Samples the current CUDA device every period_ms between start() and stop().
  explicit GpuMonitor(int period_ms = 100);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;
  // False where NVML or a GPU is missing (then start/stop do nothing and stop's summary is empty).
  bool usable() const { return device_ != nullptr; }
  void start();
  GpuClockSummary stop();

 private:
  void run();
  int period_ms_;
  void* device_ = nullptr;  // nvmlDevice_t
  double sm_mhz_max_ = 0, power_limit_w_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<GpuSample> samples_;
  std::thread thread_;
};

}  // namespace qshard
