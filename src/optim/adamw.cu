// adamw.cu: the CUDA version of adamw_step (see adamw.h for the formula and its order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "optim/adamw.h"

namespace qshard {
namespace {

struct AdamWScalars {
  float decay, one_minus_b1, b2, one_minus_b2, neg_step_size, bc2_sqrt, eps, scale;
  bool scaled;
};

// One thread per element, grid-stride loop. Same float operations, same order as the CPU
// reference; the build compiles with -fmad=false, so nothing is fused.
__global__ void adamw_step_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWScalars s,
                                  const float* scale_ptr) {
  const float scale = scale_ptr ? *scale_ptr : s.scale;
  const bool scaled = scale_ptr ? scale != 1.0f : s.scaled;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = scaled ? g[i] * scale : g[i];
    float pi = p[i] * s.decay;
    const float mi = m[i] + s.one_minus_b1 * (gi - m[i]);
    const float vi = v[i] * s.b2 + s.one_minus_b2 * gi * gi;
    const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    pi = pi + (s.neg_step_size * mi) / denom;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void cuda::adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, int64_t step,
                      void* stream, const float* grad_scale_ptr) {
  QS_CHECK(n >= 0 && step >= 1, "cuda::adamw_step: n >= 0 and step >= 1");
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(step));
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  s.one_minus_b1 = static_cast<float>(1.0 - a.beta1);
  s.b2 = static_cast<float>(a.beta2);
  s.one_minus_b2 = static_cast<float>(1.0 - a.beta2);
  s.neg_step_size = static_cast<float>(-(a.lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(a.eps);
  s.scale = static_cast<float>(a.grad_scale);
  s.scaled = a.grad_scale != 1.0;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
  adamw_step_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, g, m, v,
                                                                                                      n, s,
                                                                                                      grad_scale_ptr);
  QS_CUDA_CHECK_LAUNCH();
}

namespace {

constexpr int kSumThreads = 256;

// Fixed tree over the block (blockDim.x == kSumThreads): the same order every run.
__device__ double block_sum_fixed(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

__global__ void sum_squares_partial_kernel(double* partials, const float* x, int64_t n) {
  __shared__ double shared[kSumThreads];
  double s = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kSumThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kSumThreads) {
    const double xi = static_cast<double>(x[i]);
    s += xi * xi;
  }
  const double total = block_sum_fixed(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_partials_kernel(double* acc, const double* partials, int count, bool accumulate) {
  __shared__ double shared[kSumThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += kSumThreads) s += partials[i];
  const double total = block_sum_fixed(s, shared);
  if (threadIdx.x == 0) acc[0] = (accumulate ? acc[0] : 0.0) + total;
}

__global__ void clip_kernel(const double* sum_sq, double max_norm, double* norm, float* scale) {
  const double nrm = sqrt(sum_sq[0]);
  norm[0] = nrm;
  double c = 1.0;  // clip_coefficient (adamw_cpu.cpp)
  if (max_norm > 0.0 && isfinite(nrm)) {
    c = max_norm / (nrm + 1e-6);
    if (c > 1.0) c = 1.0;
  }
  scale[0] = static_cast<float>(c);
}

}  // namespace

void cuda::add_sum_squares(double* acc, double* partials, const float* x, int64_t n, bool accumulate, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (n > 0) {
    sum_squares_partial_kernel<<<kSumSquaresBlocks, kSumThreads, 0, st>>>(partials, x, n);
    QS_CUDA_CHECK_LAUNCH();
  }
  sum_partials_kernel<<<1, kSumThreads, 0, st>>>(acc, partials, n > 0 ? kSumSquaresBlocks : 0, accumulate);
  QS_CUDA_CHECK_LAUNCH();
}

void cuda::clip_from_sum_squares(const double* sum_sq, double max_norm, double* norm, float* scale, void* stream) {
  clip_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(sum_sq, max_norm, norm, scale);
  QS_CUDA_CHECK_LAUNCH();
}

}  // namespace qshard
