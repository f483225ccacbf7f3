// offload_ring.h: values of the training step that wait in pinned host memory between the forward
// and the backward, through a few device slots (the host tier of LlamaModel: host-kept layers'
// internals, and the layer inputs x_l with options.host_checkpoints).
//
// What: `count` values 0..count-1 of `bytes` each. Value i lives in device slot i % slots (the
// slots: `slots` consecutive blocks of `bytes` at `device`). The forward writes them in increasing
// i, the backward reads them in decreasing i:
//   before_write(i)  the compute stream waits until the copy out of i's slot (value i - slots) is
//                    done (no wait when none is in flight);
//   after_write(i)   value i goes out to pinned host memory on the offload stream once the compute
//                    stream's event says it is written; the last `slots` values stay in their
//                    slots (their backward comes first) and are never copied;
//   before_read(i)   the compute stream waits for value i's copy back, if one was made;
//   after_read(i)    the slot is free: value i - slots comes back into it on the offload stream
//                    once the compute stream's event says the reads are done.
// Every cross-stream order is an event; the host never waits. One value's copy has the compute of
// the values between to hide behind. A value out of order (read when its slot holds another) is a
// qshard::Error. On the CPU backend the streams are no-ops and the copies plain memmoves.
// Memory: host_bytes() of pinned host memory (count - slots values), allocated at construction.
// Ownership: borrows the slots and the offload stream (both outlive the ring); owns its pinned
// memory and events. The destructor waits for the offload stream.
// Thread safety: none (the model's thread).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace qshard {

class OffloadRing {
 public:
  OffloadRing(int count, int slots, int64_t bytes, uint8_t* device, Device device_kind, Stream& offload);
  ~OffloadRing();
  OffloadRing(const OffloadRing&) = delete;
  OffloadRing& operator=(const OffloadRing&) = delete;

  int count() const { return count_; }
  int slots() const { return slots_; }
  void* slot_ptr(int i) const { return device_ + static_cast<int64_t>(i % slots_) * bytes_; }
  int64_t host_bytes() const { return static_cast<int64_t>(stored()) * bytes_; }

  void before_write(int i, const Stream& compute);
  void after_write(int i, const Stream& compute);
  void before_read(int i, const Stream& compute);
  void after_read(int i, const Stream& compute);

 private:
  int stored() const { return count_ > slots_ ? count_ - slots_ : 0; }
  uint8_t* host(int i) const { return host_ + static_cast<int64_t>(i) * bytes_; }

  int count_, slots_;
  int64_t bytes_;
  uint8_t* device_;
  Device device_kind_;
  Stream& offload_;
  PinnedHostAllocator pinned_;
  uint8_t* host_ = nullptr;
  std::vector<Event> written_, stored_, released_, loaded_;  // per slot
  std::vector<int> holds_;                                   // per slot: the value it holds, or -1
  std::vector<char> storing_, loading_;                      // per slot: a copy out of / into it in flight
};

}  // namespace qshard
