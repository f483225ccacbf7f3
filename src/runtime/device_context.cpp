#include "runtime/device_context.h"

#include <optional>

#include "runtime/error.h"
#if QSHARD_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace qshard {

const char* backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

const char* device_choice_name(DeviceChoice c) {
  switch (c) {
    case DeviceChoice::kAuto: return "auto";
    case DeviceChoice::kCpu: return "cpu";
    case DeviceChoice::kCuda: return "cuda";
  }
  return "?";
}

std::optional<DeviceChoice> parse_device_choice(const std::string& s) {
  if (s == "auto") return DeviceChoice::kAuto;
  if (s == "cpu") return DeviceChoice::kCpu;
  if (s == "cuda") return DeviceChoice::kCuda;
  return std::nullopt;
}

bool cuda_backend_built() {
#if QSHARD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void Workspace::reserve(size_t bytes) {
  QS_CHECK(used_ == 0, "Workspace::reserve while pieces are taken");
  if (bytes <= capacity()) return;
  buffer_ = Tensor();  // give the old block back first
  buffer_ = Tensor::empty({static_cast<int64_t>(bytes + kAlign)}, DType::kU8, device_);
}

void* Workspace::take(size_t bytes, const char* what) {
  // Aligned in the address space (host storage is only 64-byte aligned at its base).
  const uintptr_t base = reinterpret_cast<uintptr_t>(buffer_.raw());
  const size_t begin = static_cast<size_t>((base + used_ + kAlign - 1) / kAlign * kAlign - base);
  if (begin + bytes > capacity())
    throw Error(std::string("workspace: ") + what + " needs " + std::to_string(bytes) + " bytes at offset " +
                std::to_string(begin) + ", past the capacity of " + std::to_string(capacity()) +
                " bytes (reserve() sizes it before the step)");
  used_ = begin + bytes;
  high_water_ = std::max(high_water_, used_);
  return static_cast<uint8_t*>(buffer_.raw()) + begin;
}


DeviceContext::DeviceContext(Backend backend, int device_id)
    : backend_(backend),
      device_id_(backend == Backend::kCuda ? device_id : -1),
      compute_(stream_names::kCompute),
      workspace_(backend == Backend::kCuda ? Device::kCuda : Device::kCpu) {
#if QSHARD_WITH_CUDA
  if (backend == Backend::kCuda) {
    int current = -1;
    QS_CUDA_CHECK(cudaGetDevice(&current));
    QS_CHECK(current == device_id, "DeviceContext: device " + std::to_string(device_id) + " is not current");
  }
#else
  QS_CHECK(backend == Backend::kCpu, "DeviceContext: this build has no CUDA backend");
#endif
}

DeviceContext::~DeviceContext() {
  compute_.synchronize();
  if (attention_handle_ && attention_deleter_) attention_deleter_(attention_handle_);
  if (gemm_handle_ && gemm_deleter_) gemm_deleter_(gemm_handle_);
}

std::string DeviceContext::describe() const {
  return backend_ == Backend::kCuda ? "cuda:" + std::to_string(device_id_) : std::string("cpu");
}

std::optional<int64_t> DeviceContext::memory_in_use() const {
  if (backend_ != Backend::kCuda) return std::nullopt;
  return device_memory_in_use();
}

void DeviceContext::set_gemm_handle(void* h, std::function<void(void*)> deleter) {
  QS_CHECK(!gemm_handle_, "GEMM handle set twice");
  gemm_handle_ = h;
  gemm_deleter_ = std::move(deleter);
}

void DeviceContext::set_attention_handle(void* h, std::function<void(void*)> deleter) {
  QS_CHECK(!attention_handle_, "attention handle set twice");
  attention_handle_ = h;
  attention_deleter_ = std::move(deleter);
}

std::unique_ptr<DeviceContext> make_device_context(DeviceChoice choice, int world_device, const std::string& setting) {
  const bool have_gpu = world_device >= 0;
  switch (choice) {
    case DeviceChoice::kCpu: return std::make_unique<DeviceContext>(Backend::kCpu, -1);
    case DeviceChoice::kAuto:
      return have_gpu ? std::make_unique<DeviceContext>(Backend::kCuda, world_device)
                      : std::make_unique<DeviceContext>(Backend::kCpu, -1);
    case DeviceChoice::kCuda:
      if (!have_gpu)
        throw InputError(setting + ": 'cuda' asked for, but " +
#if QSHARD_WITH_CUDA
                         std::string("no CUDA GPU is visible to this rank") +
#else
                         std::string("this build has no CUDA backend (built without nvcc)") +
#endif
                         "; use device: cpu or auto");
      return std::make_unique<DeviceContext>(Backend::kCuda, world_device);
  }
  return nullptr;
}

}  // namespace qshard
