// The one dispatch of accumulate.h: the twin of the tensors' device (runtime/dispatch.h: a CPU
// build has no CUDA twins).
#include "runtime/dispatch.h"
#include "runtime/accumulate.h"

namespace qshard {

void accumulate_f32(Tensor& out, const Tensor& in, void* stream) {
  QS_CHECK(out.dtype() == DType::kF32 && in.dtype() == DType::kF32 && out.numel() == in.numel(),
           "accumulate_f32: f32 tensors of equal size");
  QS_CHECK(out.device() == in.device(), "accumulate_f32: tensors on one device");
  QS_DISPATCH_TWIN(out.device() == Device::kCpu, "accumulate_f32",
                   cpu::accumulate_f32(out.data<float>(), in.data<float>(), out.numel(), stream),
                   cuda::accumulate_f32(out.data<float>(), in.data<float>(), out.numel(), stream));
}

void convert_f32(Tensor& out, const Tensor& in, void* stream) {
  QS_CHECK(in.dtype() == DType::kF32 && out.numel() == in.numel(), "convert_f32: f32 input of the output's size");
  QS_CHECK(out.device() == in.device(), "convert_f32: tensors on one device");
  QS_DISPATCH_TWIN(out.device() == Device::kCpu, "convert_f32",
                   cpu::convert_f32(out.raw(), out.dtype(), in.data<float>(), out.numel(), stream),
                   cuda::convert_f32(out.raw(), out.dtype(), in.data<float>(), out.numel(), stream));
}

}  // namespace qshard
