#include "train/host_adamw.h"

#include <chrono>

#include "runtime/allocator.h"
#include "runtime/error.h"

namespace qshard {
namespace {

Tensor pinned_f32(int64_t n) {
  static PinnedHostAllocator pinned;
  const int64_t count = std::max<int64_t>(n, 1);
  void* p = pinned.allocate(static_cast<size_t>(count) * sizeof(float));
  return Tensor::adopt(p, {count}, DType::kF32, Device::kCpu, [](void* q) { pinned.release(q); });
}

}  // namespace

HostAdamW::HostAdamW(ShardedParameterManager& mgr, std::vector<int> order) : mgr_(mgr), order_(std::move(order)) {
  const int units = mgr.num_units();
  QS_CHECK(static_cast<int>(order_.size()) == units, "HostAdamW: the order must name every unit once");
  std::vector<bool> seen(static_cast<size_t>(units), false);
  int64_t total = 0;
  for (int u : order_) {
    QS_CHECK(u >= 0 && u < units && !seen[static_cast<size_t>(u)], "HostAdamW: the order must name every unit once");
    seen[static_cast<size_t>(u)] = true;
  }
  for (int u = 0; u < units; ++u) {
    QS_CHECK(mgr.master_shard(u).device() == Device::kCpu, "HostAdamW: master shards must be in host memory");
    offset_.push_back(total);
    total += mgr.grad_shard(u).numel();
  }
  staging_ = pinned_f32(total);
  scale_ = pinned_f32(1);
  copied_.resize(static_cast<size_t>(units));
  jobs_.resize(static_cast<size_t>(units));
  done_.assign(static_cast<size_t>(units), 0);
  // The worker queries this thread's events: on this thread's device (a new thread starts on
  // device 0, where a query would open a context on GPU 0 for every rank).
  worker_ = std::thread([this, device = current_device()] {
    try {
      use_device_on_this_thread(device);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    run();
  });
  mgr_.set_master_fence([this](int u) { wait_unit(u); });
}

HostAdamW::~HostAdamW() {
  mgr_.set_master_fence(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void HostAdamW::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);  // sticky: the units after the failed one never finish
}

void HostAdamW::submit(std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const float* scale,
                       const AdamWParams& params, int64_t step, Stream& stream) {
  finish();  // the previous step's (done long ago: the forward since then waited for every unit)
  const int units = mgr_.num_units();
  QS_CHECK(static_cast<int>(exp_avg.size()) == units && static_cast<int>(exp_avg_sq.size()) == units,
           "HostAdamW: one moment tensor per unit");
  copy_bytes_anywhere_async(scale_.raw(), scale, sizeof(float), stream.handle());
  stream.record(scale_copied_);
  float* staged = staging_.data<float>();
  for (int u = 0; u < units; ++u) {
    const Tensor g = mgr_.grad_shard(u);
    Job& j = jobs_[static_cast<size_t>(u)];
    j.n = g.numel();
    j.g = staged + offset_[static_cast<size_t>(u)];
    j.p = mgr_.master_shard(u).data<float>();
    j.m = exp_avg[static_cast<size_t>(u)].data<float>();
    j.v = exp_avg_sq[static_cast<size_t>(u)].data<float>();
    QS_CHECK(exp_avg[static_cast<size_t>(u)].numel() == j.n && exp_avg_sq[static_cast<size_t>(u)].numel() == j.n,
             "HostAdamW: moments of the master shard's size");
    if (j.n > 0) copy_bytes_anywhere_async(const_cast<float*>(j.g), g.raw(), static_cast<size_t>(j.n) * sizeof(float),
                                           stream.handle());
    stream.record(copied_[static_cast<size_t>(u)]);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    params_ = params;
    step_ = step;
    ++generation_;
  }
  cv_.notify_all();
}

void HostAdamW::wait_unit(int unit) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_[static_cast<size_t>(unit)] == generation_ || error_; });
  rethrow_locked();
}

void HostAdamW::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (error_) return true;
    for (uint64_t d : done_)
      if (d != generation_) return false;
    return true;
  });
  rethrow_locked();
}

void HostAdamW::run() {
  uint64_t seen = 0;
  for (;;) {
    AdamWParams params;
    int64_t step = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      params = params_;
      step = step_;
    }
    try {
      // Poll, not synchronize: this thread waits for the copies without blocking the GPU's driver
      // thread or counting as a host synchronization of its step.
      auto wait_for = [](const Event& e) {
        while (!e.query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
      };
      wait_for(scale_copied_);
      const float* scale = scale_.data<float>();
      for (int u : order_) {
        const Job& j = jobs_[static_cast<size_t>(u)];
        wait_for(copied_[static_cast<size_t>(u)]);
        cpu::adamw_step(j.p, j.g, j.m, j.v, j.n, params, step, nullptr, scale);
        {
          std::lock_guard<std::mutex> lock(mu_);
          done_[static_cast<size_t>(u)] = seen;
        }
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }
}

}  // namespace qshard
