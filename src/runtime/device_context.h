// device_context.h: where a job computes: the backend, the device, the compute stream, the
// workspace arena and the library handles. Built once from `device: auto|cpu|cuda`; nothing else
// decides the device.
//
// What:
//   Backend        kCpu (the reference: plain loops, f32 activations) or kCuda (kernels, bf16
//                  activations).
//   DeviceContext  backend, CUDA device id (-1 on the CPU), compute_device() for tensors, the
//                  activation dtype (f32 on the CPU, bf16 on CUDA), the compute stream (every op
//                  runs on it; the sharded manager owns only its h2d / gather / reduce streams),
//                  a Workspace arena, and slots for the GEMM (cuBLASLt) and attention (cuDNN)
//                  handles, which the CUDA ops create at start-up and the context destroys last.
//   Workspace      one allocation cut by a bump pointer: take() hands out 256-byte aligned
//                  pieces, reset() gives them all back. Scratch of the ops comes from here (the
//                  caller's arena): it is reset per layer and per step, so a step allocates
//                  nothing. It never grows by itself: reserve() outside a step (sizing), take()
//                  past the capacity throws naming the request and the capacity.
//   memory_in_use  the device memory in use, for measurement (nullopt on the CPU backend), so
//                  that callers measure without asking which backend they run on.
//   StepScope      RAII over a training step: reads sync_alloc_counts() at the start and, at
//                  end(), reports the host synchronizations and device allocations the step made
//                  (both must be 0 on CUDA: runtime/sync_counters.h), and the lookups by name
//                  (0 on every backend).
// Device choice (make_device_context): kAuto takes CUDA when this is a CUDA build and the World
// gave the rank a GPU, else the CPU; kCuda without a GPU is an InputError naming the setting.
// Ownership: the context owns its stream, workspace and handles. One per process (per rank).
// Streams: the Workspace's memory is reused in stream order: a reset() while kernels that read
// earlier pieces are still queued is safe only because every user of the workspace runs on the
// compute stream.
// Thread safety: none; one thread drives a context.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/dtype.h"
#include "runtime/stream.h"
#include "runtime/sync_counters.h"
#include "runtime/tensor.h"

namespace qshard {

enum class Backend : uint8_t { kCpu, kCuda };
const char* backend_name(Backend b);

// The `device:` setting of a job.
enum class DeviceChoice : uint8_t { kAuto, kCpu, kCuda };
const char* device_choice_name(DeviceChoice c);
// "auto" | "cpu" | "cuda" (case-sensitive); nullopt otherwise.
std::optional<DeviceChoice> parse_device_choice(const std::string& s);
// True when this build has the CUDA backend (compiled with nvcc), whether or not a GPU is visible.
bool cuda_backend_built();

class Workspace {
 public:
  static constexpr size_t kAlign = 256;
  explicit Workspace(Device device) : device_(device) {}
  // Makes the capacity at least `bytes` (one new allocation; the old pieces are invalid).
  // REQUIRES: outside a step, nothing taken (used() == 0).
  // Reserves kAlign bytes more than asked, so that `bytes` fit after aligning the base.
  void reserve(size_t bytes);
  // A piece of `bytes` bytes (kAlign aligned). Throws Error when the capacity would be passed.
  void* take(size_t bytes, const char* what = "scratch");
  template <class T>
  T* take(int64_t n, const char* what = "scratch") {
    return static_cast<T*>(take(static_cast<size_t>(n) * sizeof(T), what));
  }
  void reset() { used_ = 0; }
  // Gives back the pieces taken after used() was `mark` (an op's own scratch, LIFO).
  void rewind(size_t mark) { used_ = std::min(used_, mark); }
  size_t used() const { return used_; }
  size_t capacity() const { return buffer_.defined() ? buffer_.nbytes() : 0; }
  size_t high_water() const { return high_water_; }
  Device device() const { return device_; }

 private:
  Device device_;
  Tensor buffer_;
  size_t used_ = 0, high_water_ = 0;
};

class DeviceContext {
 public:
  // REQUIRES for kCuda: a CUDA build and `device_id` the current device.
  DeviceContext(Backend backend, int device_id);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Backend backend() const { return backend_; }
  bool is_cuda() const { return backend_ == Backend::kCuda; }
  int device_id() const { return device_id_; }
  Device compute_device() const { return backend_ == Backend::kCuda ? Device::kCuda : Device::kCpu; }
  DType activation_dtype() const { return backend_ == Backend::kCuda ? DType::kBF16 : DType::kF32; }
  Stream& compute() { return compute_; }
  void* stream() const { return compute_.handle(); }
  Workspace& workspace() { return workspace_; }
  // "cpu" or "cuda:0".
  std::string describe() const;
  // Device memory in use now (cudaMemGetInfo: total - free, the whole device, every process on
  // it; 0 when the query fails); nullopt on the CPU backend, which has no device memory (the
  // host's is peak_rss_bytes(), runtime/machine.h). A host call, no stream order: between steps.
  std::optional<int64_t> memory_in_use() const;

  // Library handle slots (nullptr until the backend's ops create them); the deleter runs in the
  // destructor, before the stream goes.
  void* gemm_handle() const { return gemm_handle_; }
  void* attention_handle() const { return attention_handle_; }
  void set_gemm_handle(void* h, std::function<void(void*)> deleter);
  void set_attention_handle(void* h, std::function<void(void*)> deleter);

  // Counts what happened between construction and end() (see the file comment).
  class StepScope {
   public:
    StepScope() : start_(sync_alloc_counts()) {}
    SyncAllocCounts end() const {
      const SyncAllocCounts now = sync_alloc_counts();
      return {now.host_syncs - start_.host_syncs, now.device_allocs - start_.device_allocs,
              now.name_lookups - start_.name_lookups};
    }

   private:
    SyncAllocCounts start_;
  };

 private:
  Backend backend_;
  int device_id_;
  Stream compute_;
  Workspace workspace_;
  void* gemm_handle_ = nullptr;
  void* attention_handle_ = nullptr;
  std::function<void(void*)> gemm_deleter_, attention_deleter_;
};

// The context for `choice`, given the GPU World picked for this rank (-1: none). `setting`
// names the source for errors ("configs/x.yaml: device"). Throws InputError for kCuda without a GPU.
std::unique_ptr<DeviceContext> make_device_context(DeviceChoice choice, int world_device, const std::string& setting);

}  // namespace qshard
