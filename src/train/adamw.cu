// adamw.cu: the CUDA version of adamw_step (see adamw.h for the formula and its order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "train/adamw.h"

namespace qshard {
namespace {

struct AdamWScalars {
  float decay, one_minus_b1, b2, one_minus_b2, neg_step_size, bc2_sqrt, eps, scale;
  bool scaled;
};

// One thread per element, grid-stride loop. Same float operations, same order as the CPU
// reference; the build compiles with -fmad=false, so nothing is fused.
__global__ void adamw_step_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = s.scaled ? g[i] * s.scale : g[i];
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
                      void* stream) {
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
                                                                                                      n, s);
  QS_CUDA_CHECK_LAUNCH();
}

}  // namespace qshard
