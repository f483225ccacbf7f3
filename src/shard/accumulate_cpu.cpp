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

}  // namespace qshard
