// The one dispatch of adamw.h: the twin of the Device where the data lives (runtime/dispatch.h: a
// CPU build has no CUDA twins). The trainer's step (train/train_step.cpp) calls these.
#include "optim/adamw.h"
#include "runtime/dispatch.h"

namespace qshard::optim {

void add_sum_squares(Device on, double* acc, double* partials, const float* x, int64_t n, bool accumulate,
                     void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "add_sum_squares", cpu::add_sum_squares(acc, partials, x, n, accumulate, stream),
                   cuda::add_sum_squares(acc, partials, x, n, accumulate, stream));
}

void clip_from_sum_squares(Device on, const double* sum_sq, double max_norm, double* norm, float* scale,
                           void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "clip_from_sum_squares",
                   cpu::clip_from_sum_squares(sum_sq, max_norm, norm, scale, stream),
                   cuda::clip_from_sum_squares(sum_sq, max_norm, norm, scale, stream));
}

void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWParams& params, int64_t step,
                void* stream, const float* grad_scale_ptr) {
  if (p.numel() == 0) return;
  QS_DISPATCH_TWIN(p.device() == Device::kCpu, "adamw_step",
                   {
                     // Master on the host (CPU backend, or offload.optimizer): the gradient shard
                     // comes to it.
                     const Tensor gh = g.device() == Device::kCpu ? g : g.to(Device::kCpu);
                     cpu::adamw_step(p.data<float>(), gh.data<float>(), m.data<float>(), v.data<float>(), p.numel(),
                                     params, step, stream, grad_scale_ptr);
                   },
                   cuda::adamw_step(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(),
                                    params, step, stream, grad_scale_ptr));
}

}  // namespace qshard::optim
