// stream.h: named CUDA streams and events, with the same calls on the CPU backend.
//
// What: `Stream` owns a cudaStream_t created with cudaStreamNonBlocking (it never synchronises
// with the legacy default stream) on the device current at construction, and carries a name for
// logs and profiles. `Event` owns a cudaEvent_t (cudaEventDisableTiming unless timing is asked
// for). Cross-stream order is `producer.record(ev); consumer.wait(ev);` - never a device-wide
// sync inside a step.
// CPU: in a CPU build, or a CUDA build without a visible GPU, both are no-ops: handle() is
// nullptr, record/wait do nothing, synchronize returns at once, query() is true. CPU code runs
// the same calls; its work is synchronous anyway.
// Ownership: move-only; the destructor destroys the handle (a stream is synchronised first so
// work enqueued on it is not abandoned).
// Thread safety: a Stream or Event may be used from several threads as CUDA allows (handles are
// thread safe); construction and destruction from one thread.
// REQUIRES: the device that was current at construction still exists when the object is used.
#pragma once

#include <string>

namespace qshard {

// The streams of the sharded-parameter manager (src/shard), each with the overlap it buys.
namespace stream_names {
// Forward/backward kernels: dequant, GEMMs, LoRA, optimizer. Everything else overlaps with it.
inline constexpr const char* kCompute = "compute";
// Host-to-device copies of offloaded shards (pinned memory), overlapping the previous unit's
// compute and the current unit's gather.
inline constexpr const char* kH2D = "h2d";
// All-gather of the next unit's shards while the current unit computes (prefetch).
inline constexpr const char* kGather = "gather";
// Reduce-scatter of a unit's gradients while the backward pass moves on to the previous unit.
inline constexpr const char* kReduce = "reduce";
// The model's host tier (LlamaModelOptions::host_keep_layers): host-kept layers' internals to
// pinned host memory in the forward and back ahead of their backward, behind other layers' compute.
inline constexpr const char* kActivationOffload = "activation offload";
}  // namespace stream_names

class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // cudaEvent_t, or nullptr on the CPU.
  void* handle() const { return event_; }
  // Blocks the host until the recorded work is done.
  void synchronize() const;
  // True when the recorded work is done (or never recorded).
  bool query() const;
  // Milliseconds between `start` and this event (both recorded, made with timing = true);
  // 0 on the CPU.
  float elapsed_ms_since(const Event& start) const;

 private:
  void destroy() noexcept;
  void* event_ = nullptr;
};

// The CUDA device current on this thread (-1 without a GPU), and making `device` current on a
// thread the caller started (a new thread starts on device 0: a CUDA call there would open a
// context on GPU 0 for every rank). No-ops without a GPU.
int current_device();
void use_device_on_this_thread(int device);

class Stream {
 public:
  explicit Stream(std::string name);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const std::string& name() const { return name_; }
  // cudaStream_t, or nullptr on the CPU (which CUDA also reads as the default stream).
  void* handle() const { return stream_; }
  // Records `event` after the work enqueued so far on this stream.
  void record(Event& event) const;
  // Later work on this stream waits for `event` (does not block the host).
  void wait(const Event& event) const;
  // Blocks the host until all work on this stream is done.
  void synchronize() const;

 private:
  void destroy() noexcept;
  std::string name_;
  void* stream_ = nullptr;
};

}  // namespace qshard
