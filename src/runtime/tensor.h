// tensor.h: owning buffers on the CPU or a CUDA device, and tensor views over them.
//
// What: `Storage` owns one allocation (host memory, 64-byte aligned, or device memory from
// cudaMalloc). `Tensor` is a view: a shared reference to a Storage, a byte offset, a dtype and a
// shape (row-major, contiguous). Copying a Tensor copies the view, not the bytes; clone() copies
// the bytes. Views keep their storage alive.
// Shapes: any rank, including 0-d (numel 1); dims are int64 >= 0.
// Device: Device::kCuda works only in a CUDA build with a GPU present; otherwise allocating
// or copying to it throws qshard::Error naming the reason.
// Thread safety: distinct tensors may be used from different threads; a Tensor shared between
// threads must not be written concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace qshard {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

// Product of dims (1 for a 0-d shape). Throws Error on a negative dim or int64 overflow.
int64_t shape_numel(const Shape& shape);
// "[4096, 4096]"
std::string shape_str(const Shape& shape);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Adopts memory allocated elsewhere (a pool, pinned memory); `deleter` returns it.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_ = Device::kCpu;
  std::function<void(void*)> deleter_;  // set for adopted memory
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised contents.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::kCpu);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::kCpu);
  // A tensor over adopted memory (see Storage); `deleter` runs when the last view goes.
  static Tensor adopt(void* data, const Shape& shape, DType dtype, Device device, std::function<void(void*)> deleter);
  // CPU tensor holding a copy of `bytes` (bytes.size() must equal numel * dtype size).
  static Tensor from_bytes(const Shape& shape, DType dtype, std::span<const uint8_t> bytes);
  template <class T>
  static Tensor from_vector(const Shape& shape, DType dtype, const std::vector<T>& v) {
    return from_bytes(shape, dtype,
                      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)));
  }

  // Shape and dtype without storage (defined() false, raw() null): what the module tree keeps of
  // a sharded unit's tensor while the unit is not gathered.
  static Tensor meta(const Shape& shape, DType dtype);
  Tensor as_meta() const { return meta(shape_, dtype_); }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::kCpu; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  void* raw() { return storage_ ? static_cast<uint8_t*>(storage_->data()) + offset_ : nullptr; }
  const void* raw() const {
    return storage_ ? static_cast<const uint8_t*>(storage_->data()) + offset_ : nullptr;
  }
  // Typed pointer; checks that sizeof(T) matches the dtype size.
  template <class T>
  T* data() {
    QS_CHECK(sizeof(T) == dtype_size(dtype_), "data<T>() element size does not match dtype");
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    QS_CHECK(sizeof(T) == dtype_size(dtype_), "data<T>() element size does not match dtype");
    return static_cast<const T*>(raw());
  }
  // Bytes of a CPU tensor.
  std::span<const uint8_t> bytes() const;

  // A view with another shape of the same numel (shares storage).
  Tensor reshape(const Shape& shape) const;
  // A view of the same bytes as another dtype; the last dim (or numel for 1-d) rescales.
  // Used for bitsandbytes' quant_storage reinterpretation.
  Tensor view_as(DType dtype, const Shape& shape) const;
  // A view of elements [begin, begin + count) of the flattened tensor, as a 1-d tensor.
  Tensor flat_slice(int64_t begin, int64_t count) const;
  // Deep copy to `device` (the same device gives an independent copy).
  Tensor to(Device device) const;
  Tensor clone() const { return to(device()); }
  // Copies all bytes from `src` (same nbytes; any devices).
  void copy_from(const Tensor& src);

  // Float tensors (f32/bf16/f16) on the CPU, widened to f32. Throws for other dtypes.
  std::vector<float> to_f32_vector() const;
  // f32 values converted (RNE) into a new CPU tensor of `dtype` (f32, bf16 or f16).
  static Tensor from_f32(const Shape& shape, DType dtype, std::span<const float> values);

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

// True when both tensors have the same dtype, shape and bytes (CPU tensors).
bool bitwise_equal(const Tensor& a, const Tensor& b);

// Device memory primitives (CUDA builds); in a CPU build they throw Error.
bool cuda_available();
void* device_malloc(size_t nbytes);
void device_free(void* p);
// Synchronous copy between any two locations.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
// Bytes of the current GPU's memory in use (cudaMemGetInfo: total - free, every process on the
// device); 0 in a build without CUDA or without a GPU.
int64_t device_memory_in_use();
// Free bytes of the current GPU's memory (cudaMemGetInfo); -1 in a build without CUDA or without a GPU.
int64_t device_memory_free();
// The current GPU's name as CUDA reports it ("NVIDIA H100 80GB HBM3"); "" in a build without CUDA
// or without a GPU.
std::string device_name();
// Asynchronous copy enqueued on `stream` (a cudaStream_t): the host does not wait, and must keep
// `src` unchanged (and pinned, for a true DMA) until the stream passes the copy. Host to host
// is a plain memmove.
void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, void* stream);
// The same where the caller does not say where the pointers live: in a CUDA build with a stream
// given or a GPU visible, cudaMemcpyAsync(cudaMemcpyDefault) on `stream` (the driver finds where
// each pointer lives); otherwise (a CPU build, or no stream and no GPU) a plain memmove.
void copy_bytes_anywhere_async(void* dst, const void* src, size_t nbytes, void* stream);
// Zeroes `nbytes` at `p` on `device`: cudaMemsetAsync on `stream` for device memory (the host does
// not wait), a memset on the CPU.
void zero_bytes_async(void* p, Device device, size_t nbytes, void* stream);
// The same, done when it returns (device memory: on the legacy default stream, then waited for).
void zero_bytes(void* p, Device device, size_t nbytes);

}  // namespace qshard
