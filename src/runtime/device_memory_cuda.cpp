// CUDA implementations of the device-memory primitives declared in tensor.h.
#include <cstring>

#include "runtime/cuda_check.h"
#include "runtime/sync_counters.h"
#include "runtime/tensor.h"

namespace qshard {

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

void* device_malloc(size_t nbytes) {
  void* p = nullptr;
  count_device_alloc();
  QS_CUDA_CHECK(cudaMalloc(&p, nbytes));
  return p;
}

void device_free(void* p) { cudaFree(p); }

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (dst_device == Device::kCpu && src_device == Device::kCpu) {
    std::memmove(dst, src, nbytes);
    return;
  }
  count_host_sync();
  QS_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
  // cudaMemcpy from pageable host memory may return before the DMA into device memory lands; it
  // is ordered only on the legacy default stream, which our non-blocking streams do not follow.
  // Waiting for that stream makes the copy complete, as tensor.h promises.
  QS_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return prop.name;
}

int64_t device_memory_in_use() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(total_b - free_b);
}

int64_t device_memory_free() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(free_b);
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                      void* stream) {
  if (nbytes == 0) return;
  if (dst_device == Device::kCpu && src_device == Device::kCpu) {
    std::memmove(dst, src, nbytes);
    return;
  }
  QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

void copy_bytes_anywhere_async(void* dst, const void* src, size_t nbytes, void* stream) {
  if (nbytes == 0) return;
  if (stream != nullptr || cuda_available()) {
    QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
    return;
  }
  std::memmove(dst, src, nbytes);
}

void zero_bytes_async(void* p, Device device, size_t nbytes, void* stream) {
  if (nbytes == 0) return;
  if (device == Device::kCuda) {
    QS_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, static_cast<cudaStream_t>(stream)));
    return;
  }
  std::memset(p, 0, nbytes);
}

void zero_bytes(void* p, Device device, size_t nbytes) {
  zero_bytes_async(p, device, nbytes, nullptr);  // the legacy default stream
  if (nbytes != 0 && device == Device::kCuda) QS_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace qshard
