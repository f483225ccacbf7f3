// CUDA version of accumulate.h (one float add per element, as the CPU reference).
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#include "shard/accumulate.h"

namespace qshard {
namespace {
__global__ void accumulate_f32_kernel(float* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __fadd_rn(out[i], in[i]);
}
}  // namespace

void cuda::accumulate_f32(float* out, const float* in, int64_t n, void* stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
  accumulate_f32_kernel<<<static_cast<int>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(out, in, n);
  QS_CUDA_CHECK_LAUNCH();
}

}  // namespace qshard
