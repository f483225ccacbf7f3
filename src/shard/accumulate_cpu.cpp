#include "shard/accumulate.h"

namespace qshard {

void cpu::accumulate_f32(float* out, const float* in, int64_t n, void* stream) {
  (void)stream;
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

void accumulate_f32(Tensor& out, const Tensor& in, void* stream) {
  QS_CHECK(out.dtype() == DType::kF32 && in.dtype() == DType::kF32 && out.numel() == in.numel(),
           "accumulate_f32: f32 tensors of equal size");
  QS_CHECK(out.device() == in.device(), "accumulate_f32: tensors on one device");
  if (out.device() == Device::kCpu) {
    cpu::accumulate_f32(out.data<float>(), in.data<float>(), out.numel());
    return;
  }
#ifdef QSHARD_WITH_CUDA
  cuda::accumulate_f32(out.data<float>(), in.data<float>(), out.numel(), stream);
#else
  (void)stream;
  throw Error("accumulate_f32: device tensors in a CPU-only build");
#endif
}

void cpu::convert_f32(void* out, DType out_dtype, const float* in, int64_t n, void* stream) {
  (void)stream;
  uint16_t* o = static_cast<uint16_t*>(out);
  if (out_dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(in[i]);
  } else if (out_dtype == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_f16(in[i]);
  } else {
    throw Error(std::string("convert_f32: output dtype ") + dtype_torch_name(out_dtype) + " is not bf16 or f16");
  }
}

void convert_f32(Tensor& out, const Tensor& in, void* stream) {
  QS_CHECK(in.dtype() == DType::kF32 && out.numel() == in.numel(), "convert_f32: f32 input of the output's size");
  QS_CHECK(out.device() == in.device(), "convert_f32: tensors on one device");
  if (out.device() == Device::kCpu) {
    cpu::convert_f32(out.raw(), out.dtype(), in.data<float>(), out.numel());
    return;
  }
#if QSHARD_WITH_CUDA
  cuda::convert_f32(out.raw(), out.dtype(), in.data<float>(), out.numel(), stream);
#else
  (void)stream;
  throw Error("convert_f32: device tensors in a CPU-only build");
#endif
}

}  // namespace qshard
