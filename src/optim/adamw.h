// adamw.h: the AdamW update over flat fp32 arrays, and global gradient-norm clipping helpers.
//
// What: one optimizer step of torch.optim.AdamW (decoupled weight decay, bias correction,
// amsgrad=False, maximize=False), element by element, in fp32, in the order of torch's
// single-tensor implementation (torch/optim/adamw.py + adam.py, `_single_tensor_adam`):
//   g      = g * grad_scale                      (grad_scale: the clip coefficient, 1 = none)
//   p      = p * (1 - lr * weight_decay)
//   m      = m + (1 - beta1) * (g - m)           (torch: exp_avg.lerp_(g, 1 - beta1))
//   v      = v * beta2 + (1 - beta2) * g * g
//   bc1    = 1 - beta1^step,  bc2 = 1 - beta2^step          (in double, like Python floats)
//   p      = p + (-(lr / bc1) * m) / (sqrt(v) / sqrt(bc2) + eps)   (torch: addcdiv_)
// Scalars are computed in double and rounded to float once, as torch passes Python floats to
// fp32 kernels. Shapes: p, g, m, v are [n] (a rank's flat shard of LoRA A/B and its moments).
// `step` is the 1-based count of steps taken including this one (torch's state["step"]).
// In place: p, m and v are updated; g is read only. m and v start as zeros.
// The CPU and CUDA versions run the same float operations in the same order; the build turns
// off FMA contraction (-ffp-contract=off, nvcc -fmad=false), and CUDA's sqrtf and division are
// IEEE round-to-nearest (no fast math), so both give the same bits (seen on an H200, nvcc 13.0:
// 0 of 100,003 elements differ after 4 steps); the CUDA test still allows 1e-6 relative error in
// case a toolchain rounds one operation differently. Against torch's CPU kernels (vectorised, may
// fuse multiply-adds) the difference is a few ulps: that test's tolerance is 1e-6 relative.
// CUDA: enqueued on `stream` (a cudaStream_t; nullptr = the legacy default stream); no sync.
// REQUIRES: n >= 0, step >= 1; for CUDA, all four pointers are device memory.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace qshard {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // torch.optim.AdamW's default
  double grad_scale = 1.0;     // multiplies g first (global-norm clipping)
};

// Twins (runtime/dispatch.h): same name and parameters, trailing stream (the CPU ignores it);
// cpu:: in adamw_cpu.cpp, cuda:: in adamw.cu (CUDA builds only). grad_scale_ptr: when not null,
// *grad_scale_ptr (f32, where the kernel runs: device memory on CUDA) replaces params.grad_scale,
// so a clip coefficient computed on the device needs no host round trip.
namespace cpu {
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& params, int64_t step,
                void* stream = nullptr, const float* grad_scale_ptr = nullptr);
}  // namespace cpu
namespace cuda {
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& params, int64_t step,
                void* stream, const float* grad_scale_ptr = nullptr);
}  // namespace cuda

// The global gradient norm and its clip coefficient where the gradients live (twins; CUDA: device
// pointers, enqueued on `stream`, no host wait).
// add_sum_squares: acc[0] = (accumulate ? acc[0] : 0) + sum of x[i]^2, in f64 (n may be 0). CPU:
// the sequential sum (sum_squares), then one add. CUDA: deterministic (a fixed grid of kSumSquaresBlocks blocks, each summing its grid-stride
// elements and reducing in a fixed tree into partials[block]; then one block adds the partials in
// order into acc[0]), so a resumed run repeats the straight run's bits. `partials`: f64
// [kSumSquaresBlocks] scratch (unused on the CPU).
// clip_from_sum_squares: from the sum of squares over every rank (all-reduced by the caller),
// norm[0] = sqrt(sum) and scale[0] = float(clip_coefficient(norm, max_norm)).
// Tolerance CPU vs CUDA: the sums differ in summation order only (f64: ~1e-15 relative).
inline constexpr int kSumSquaresBlocks = 256;
namespace cpu {
void add_sum_squares(double* acc, double* partials, const float* x, int64_t n, bool accumulate,
                     void* stream = nullptr);
void clip_from_sum_squares(const double* sum_sq, double max_norm, double* norm, float* scale, void* stream = nullptr);
}  // namespace cpu
namespace cuda {
void add_sum_squares(double* acc, double* partials, const float* x, int64_t n, bool accumulate, void* stream);
void clip_from_sum_squares(const double* sum_sq, double max_norm, double* norm, float* scale, void* stream);
}  // namespace cuda

// ---- the dispatch (optim_dispatch.cpp): the twin of where the data lives (runtime/dispatch.h) ----
namespace optim {
// The gradient norm's twins on `on`, the Device of the gradients (acc, partials, x, norm, scale
// all there).
void add_sum_squares(Device on, double* acc, double* partials, const float* x, int64_t n, bool accumulate,
                     void* stream);
void clip_from_sum_squares(Device on, const double* sum_sq, double max_norm, double* norm, float* scale,
                           void* stream);
// AdamW on one unit's master shard where it lives: p, m, v [n] f32 on one device. A master on the
// host (the CPU backend, or offload.optimizer) takes the CPU twin, the gradient shard g coming to
// it (copied to the host first when on the device: a synchronous copy); a master on the device
// takes the CUDA twin on `stream` (g there too). grad_scale_ptr: the clip coefficient in the
// master's memory (device memory for a device master, host memory for a host one), or null for
// params.grad_scale. A no-op when p is empty.
void adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWParams& params, int64_t step,
                void* stream, const float* grad_scale_ptr);
}  // namespace optim

// Sum of squares of x[0..n) accumulated in double (a rank's part of the squared global norm; the
// trainer all-reduces it over ranks and takes the square root).
double sum_squares(const float* x, int64_t n);

// torch.nn.utils.clip_grad_norm_'s coefficient: min(1, max_norm / (total_norm + 1e-6)).
// max_norm <= 0 means no clipping (1). A non-finite total_norm gives 1 and is the caller's to
// report (a NaN/Inf gradient).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace qshard
