// CUDA version of accumulate.h (one float add per element, as the CPU reference).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#include "runtime/accumulate.h"

namespace qshard {
namespace {
__global__ void accumulate_f32_kernel(float* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __fadd_rn(out[i], in[i]);
}
__global__ void convert_f32_bf16_kernel(__nv_bfloat16* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void convert_f32_f16_kernel(__half* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(in[i]);
}
}  // namespace

void cuda::convert_f32(void* out, DType out_dtype, const float* in, int64_t n, void* stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
  auto st = static_cast<cudaStream_t>(stream);
  if (out_dtype == DType::kBF16)
    convert_f32_bf16_kernel<<<blocks, 256, 0, st>>>(static_cast<__nv_bfloat16*>(out), in, n);
  else if (out_dtype == DType::kF16)
    convert_f32_f16_kernel<<<blocks, 256, 0, st>>>(static_cast<__half*>(out), in, n);
  else
    throw Error(std::string("convert_f32: output dtype ") + dtype_torch_name(out_dtype) + " is not bf16 or f16");
  QS_CUDA_CHECK_LAUNCH();
}

void cuda::accumulate_f32(float* out, const float* in, int64_t n, void* stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
  accumulate_f32_kernel<<<static_cast<int>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(out, in, n);
  QS_CUDA_CHECK_LAUNCH();
}

}  // namespace qshard
