#include "model/offload_ring.h"

#include <string>

#include "runtime/error.h"

namespace qshard {

OffloadRing::OffloadRing(int count, int slots, int64_t bytes, uint8_t* device, Device device_kind, Stream& offload)
    : count_(count), slots_(slots), bytes_(bytes), device_(device), device_kind_(device_kind), offload_(offload) {
  QS_CHECK(count >= 1 && slots >= 1 && bytes > 0 && device != nullptr, "OffloadRing: bad sizes");
  if (stored() > 0) host_ = static_cast<uint8_t*>(pinned_.allocate(static_cast<size_t>(host_bytes())));
  for (int s = 0; s < slots_; ++s) {
    written_.emplace_back();
    stored_.emplace_back();
    released_.emplace_back();
    loaded_.emplace_back();
  }
  holds_.assign(static_cast<size_t>(slots_), -1);
  storing_.assign(static_cast<size_t>(slots_), 0);
  loading_.assign(static_cast<size_t>(slots_), 0);
}

OffloadRing::~OffloadRing() {
  offload_.synchronize();
  if (host_) pinned_.release(host_);
}

void OffloadRing::before_write(int i, const Stream& compute) {
  const size_t s = static_cast<size_t>(i % slots_);
  QS_CHECK(!loading_[s], "offload ring: a slot is being loaded at a forward");
  if (storing_[s]) {
    compute.wait(stored_[s]);
    storing_[s] = 0;
  }
}

void OffloadRing::after_write(int i, const Stream& compute) {
  const size_t s = static_cast<size_t>(i % slots_);
  holds_[s] = i;
  if (i >= stored()) return;  // one of the last `slots`: it stays for its backward
  compute.record(written_[s]);
  offload_.wait(written_[s]);
  copy_bytes_async(host(i), Device::kCpu, slot_ptr(i), device_kind_, static_cast<size_t>(bytes_), offload_.handle());
  offload_.record(stored_[s]);
  storing_[s] = 1;
}

void OffloadRing::before_read(int i, const Stream& compute) {
  const size_t s = static_cast<size_t>(i % slots_);
  QS_CHECK(holds_[s] == i, "offload ring: value " + std::to_string(i) + " is not in its slot (it holds " +
                               std::to_string(holds_[s]) + ")");
  if (loading_[s]) {
    compute.wait(loaded_[s]);
    loading_[s] = 0;
  }
}

void OffloadRing::after_read(int i, const Stream& compute) {
  const size_t s = static_cast<size_t>(i % slots_);
  holds_[s] = -1;
  const int next = i - slots_;
  if (next < 0) return;
  compute.record(released_[s]);
  offload_.wait(released_[s]);
  copy_bytes_async(slot_ptr(next), device_kind_, host(next), Device::kCpu, static_cast<size_t>(bytes_),
                   offload_.handle());
  offload_.record(loaded_[s]);
  loading_[s] = 1;
  holds_[s] = next;
}

}  // namespace qshard
