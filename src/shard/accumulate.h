// accumulate.h: out[i] += in[i] over fp32 shards (gradient accumulation across micro-batches).
//
// Shapes: out, in [n] f32, same device. CPU: a plain loop (the reference). CUDA: a grid-stride
// kernel on `stream` (cudaStream_t as void*). Tolerance CPU vs CUDA: none (one float add each).
#pragma once

#include "runtime/tensor.h"

namespace qshard {

// Twins (same name and parameters, trailing stream; the CPU ignores it).
namespace cpu {
void accumulate_f32(float* out, const float* in, int64_t n, void* stream = nullptr);
}  // namespace cpu
namespace cuda {
void accumulate_f32(float* out, const float* in, int64_t n, void* stream);  // CUDA builds only
}  // namespace cuda
// Dispatches on the tensors' device.
void accumulate_f32(Tensor& out, const Tensor& in, void* stream);

}  // namespace qshard
