#include "runtime/gpu_monitor.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#if QSHARD_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace qshard {
namespace {

double at_fraction(const std::vector<double>& sorted, double f) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(f * static_cast<double>(sorted.size() - 1) + 0.5));
  return sorted[i];
}

std::string thousands(double v) {
  const auto n = static_cast<int64_t>(v + 0.5);
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// The NVML entry points used, resolved from the driver's library at run time (their C signatures:
// nvmlReturn_t is an int, 0 success; nvmlDevice_t an opaque pointer; clock type 1 = SM).
struct Nvml {
  using InitFn = int (*)();
  using HandleByBusFn = int (*)(const char*, void**);
  using ClockFn = int (*)(void*, int, unsigned*);
  using PowerFn = int (*)(void*, unsigned*);
  using ReasonsFn = int (*)(void*, unsigned long long*);
  void* lib = nullptr;
  InitFn init = nullptr;
  HandleByBusFn handle_by_bus = nullptr;
  ClockFn clock = nullptr, max_clock = nullptr;
  PowerFn power = nullptr, limit = nullptr;
  ReasonsFn reasons = nullptr;
  bool ok = false;
  Nvml() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    handle_by_bus = reinterpret_cast<HandleByBusFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock = reinterpret_cast<ClockFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    max_clock = reinterpret_cast<ClockFn>(dlsym(lib, "nvmlDeviceGetMaxClockInfo"));
    power = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    limit = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit"));
    reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons) reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    ok = init && handle_by_bus && clock && power && init() == 0;
  }
  // Kept open for the process (NVML's own state is process-wide; no shutdown racing a monitor).
  static Nvml& get() {
    static Nvml n;
    return n;
  }
};

constexpr int kSmClock = 1;

}  // namespace

GpuClockSummary summarize_gpu_samples(std::vector<GpuSample> samples, double sm_mhz_max, double power_limit_w) {
  GpuClockSummary s;
  s.sm_mhz_max = sm_mhz_max;
  s.power_limit_w = power_limit_w;
  std::erase_if(samples, [](const GpuSample& x) { return (x.reasons & kGpuReasonIdle) != 0 || x.sm_mhz <= 0; });
  if (samples.empty()) return s;
  std::vector<double> mhz, watts;
  int capped = 0, thermal = 0;
  for (const GpuSample& x : samples) {
    mhz.push_back(x.sm_mhz);
    watts.push_back(x.power_w);
    capped += (x.reasons & kGpuReasonSwPowerCap) != 0;
    thermal += (x.reasons & (kGpuReasonSwThermal | kGpuReasonHwThermal)) != 0;
  }
  std::sort(mhz.begin(), mhz.end());
  std::sort(watts.begin(), watts.end());
  s.samples = static_cast<int>(samples.size());
  s.sm_mhz_median = at_fraction(mhz, 0.5);
  s.sm_mhz_p10 = at_fraction(mhz, 0.1);
  s.sm_mhz_p90 = at_fraction(mhz, 0.9);
  s.power_w_median = at_fraction(watts, 0.5);
  s.power_capped_share = static_cast<double>(capped) / s.samples;
  s.thermal_share = static_cast<double>(thermal) / s.samples;
  return s;
}

std::string GpuClockSummary::describe() const {
  if (!available()) return "";
  std::string t = fmt::format("SM {} MHz median (p10 {}, p90 {}", thousands(sm_mhz_median), thousands(sm_mhz_p10),
                              thousands(sm_mhz_p90));
  if (sm_mhz_max > 0) t += fmt::format("; top {}", thousands(sm_mhz_max));
  t += fmt::format("), power {} W", thousands(power_w_median));
  if (power_limit_w > 0) t += fmt::format(" of {} W", thousands(power_limit_w));
  t += fmt::format(", power-capped in {:.0f}% of {} samples", 100.0 * power_capped_share, samples);
  if (thermal_share > 0) t += fmt::format(", thermal slowdown in {:.0f}%", 100.0 * thermal_share);
  return t;
}

GpuMonitor::GpuMonitor(int period_ms) : period_ms_(std::max(1, period_ms)) {
#if QSHARD_WITH_CUDA
  int dev = -1;
  char bus[32] = {};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess) {
    cudaGetLastError();  // no GPU: leave no sticky error behind
    return;
  }
  Nvml& n = Nvml::get();
  void* handle = nullptr;
  if (!n.ok || n.handle_by_bus(bus, &handle) != 0) return;
  device_ = handle;
  unsigned v = 0;
  if (n.max_clock && n.max_clock(device_, kSmClock, &v) == 0) sm_mhz_max_ = v;
  if (n.limit && n.limit(device_, &v) == 0) power_limit_w_ = v * 1e-3;
#endif
}

GpuMonitor::~GpuMonitor() {
  if (thread_.joinable()) stop();
}

void GpuMonitor::start() {
  if (!device_ || thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
    samples_.clear();
  }
  thread_ = std::thread([this] { run(); });
}

void GpuMonitor::run() {
  Nvml& n = Nvml::get();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    GpuSample x;
    unsigned v = 0;
    unsigned long long r = 0;
    if (n.clock(device_, kSmClock, &v) == 0) x.sm_mhz = v;
    if (n.power(device_, &v) == 0) x.power_w = v * 1e-3;
    if (n.reasons && n.reasons(device_, &r) == 0) x.reasons = r;
    samples_.push_back(x);
    cv_.wait_for(lock, std::chrono::milliseconds(period_ms_), [this] { return stopping_; });
  }
}

GpuClockSummary GpuMonitor::stop() {
  if (!thread_.joinable()) return summarize_gpu_samples({}, sm_mhz_max_, power_limit_w_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  return summarize_gpu_samples(std::move(samples_), sm_mhz_max_, power_limit_w_);
}

}  // namespace qshard
