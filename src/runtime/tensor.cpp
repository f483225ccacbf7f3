#include "runtime/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>

namespace qshard {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw Error("shape " + shape_str(shape) + " overflows int64");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device == Device::kCpu) {
    const size_t rounded = (nbytes + 63) / 64 * 64;
    data_ = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !data_) throw Error("host allocation of " + std::to_string(nbytes) + " bytes failed");
  } else {
    data_ = nbytes ? device_malloc(nbytes) : nullptr;
  }
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (!data_) return;
  if (deleter_) {
    deleter_(data_);
    return;
  }
  if (device_ == Device::kCpu) {
    std::free(data_);
  } else {
    device_free(data_);
  }
}

Tensor Tensor::meta(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  // On the device, zeroed there (not a host buffer of zeros copied over: the step's buffers are
  // tens of GB at long context, and that copy was the run's peak host memory).
  zero_bytes(t.raw(), device, t.nbytes());
  return t;
}

Tensor Tensor::adopt(void* data, const Shape& shape, DType dtype, Device device, std::function<void(void*)> deleter) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device, std::move(deleter));
  return t;
}

Tensor Tensor::from_bytes(const Shape& shape, DType dtype, std::span<const uint8_t> bytes) {
  Tensor t = empty(shape, dtype, Device::kCpu);
  if (bytes.size() != t.nbytes())
    throw Error("from_bytes: " + std::to_string(bytes.size()) + " bytes given for shape " + shape_str(shape) +
                " of " + dtype_torch_name(dtype) + " (" + std::to_string(t.nbytes()) + " expected)");
  if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());
  return t;
}

std::span<const uint8_t> Tensor::bytes() const {
  QS_CHECK(device() == Device::kCpu, "bytes() needs a CPU tensor");
  return {static_cast<const uint8_t*>(raw()), nbytes()};
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel_)
    throw Error("reshape " + shape_str(shape_) + " -> " + shape_str(shape) + ": element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::view_as(DType dtype, const Shape& shape) const {
  Tensor t = *this;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  if (t.nbytes() != nbytes())
    throw Error("view_as " + std::string(dtype_torch_name(dtype)) + shape_str(shape) + ": byte size " +
                std::to_string(t.nbytes()) + " differs from " + std::to_string(nbytes()));
  return t;
}

Tensor Tensor::flat_slice(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > numel_)
    throw Error("flat_slice [" + std::to_string(begin) + ", +" + std::to_string(count) + ") outside " +
                std::to_string(numel_) + " elements");
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(begin) * dtype_size(dtype_);
  t.shape_ = {count};
  t.numel_ = count;
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  if (nbytes()) copy_bytes(t.raw(), device, raw(), this->device(), nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.nbytes() != nbytes())
    throw Error("copy_from: " + std::to_string(src.nbytes()) + " bytes into " + std::to_string(nbytes()));
  if (nbytes()) copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
}

std::vector<float> Tensor::to_f32_vector() const {
  QS_CHECK(device() == Device::kCpu, "to_f32_vector needs a CPU tensor");
  std::vector<float> out(static_cast<size_t>(numel_));
  switch (dtype_) {
    case DType::kF32:
      if (numel_) std::memcpy(out.data(), raw(), nbytes());
      break;
    case DType::kBF16: {
      const uint16_t* p = data<uint16_t>();
      for (int64_t i = 0; i < numel_; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* p = data<uint16_t>();
      for (int64_t i = 0; i < numel_; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
    default:
      throw Error(std::string("to_f32_vector: dtype ") + dtype_torch_name(dtype_) + " is not a float type");
  }
  return out;
}

Tensor Tensor::from_f32(const Shape& shape, DType dtype, std::span<const float> values) {
  Tensor t = empty(shape, dtype, Device::kCpu);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw Error("from_f32: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  switch (dtype) {
    case DType::kF32:
      if (!values.empty()) std::memcpy(t.raw(), values.data(), t.nbytes());
      break;
    case DType::kBF16: {
      uint16_t* p = t.data<uint16_t>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = f32_to_bf16(values[i]);
      break;
    }
    case DType::kF16: {
      uint16_t* p = t.data<uint16_t>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = f32_to_f16(values[i]);
      break;
    }
    default:
      throw Error(std::string("from_f32: dtype ") + dtype_torch_name(dtype) + " is not a float type");
  }
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.nbytes() == 0) return true;
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

#ifndef QSHARD_WITH_CUDA
bool cuda_available() { return false; }
void* device_malloc(size_t) { throw Error("device memory requested, but qshard was built without CUDA"); }
void device_free(void*) {}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (dst_device != Device::kCpu || src_device != Device::kCpu)
    throw Error("device copy requested, but qshard was built without CUDA");
  std::memmove(dst, src, nbytes);
}
int64_t device_memory_in_use() { return 0; }
int64_t device_memory_free() { return -1; }
std::string device_name() { return {}; }
void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, void*) {
  copy_bytes(dst, dst_device, src, src_device, nbytes);
}
void copy_bytes_anywhere_async(void* dst, const void* src, size_t nbytes, void*) {
  if (nbytes) std::memmove(dst, src, nbytes);
}
void zero_bytes_async(void* p, Device device, size_t nbytes, void*) {
  if (device != Device::kCpu) throw Error("device memory zeroed, but qshard was built without CUDA");
  if (nbytes) std::memset(p, 0, nbytes);
}
void zero_bytes(void* p, Device device, size_t nbytes) { zero_bytes_async(p, device, nbytes, nullptr); }
#endif

}  // namespace qshard
