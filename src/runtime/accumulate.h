// accumulate.h: out[i] += in[i] over fp32 shards (gradient accumulation across micro-batches), and
// the f32 -> bf16/f16 conversion of gathered LoRA weights into their compute copies.
//
// Shapes: out, in [n] f32, same device. CPU: a plain loop (the reference). CUDA: a grid-stride
// kernel on `stream` (cudaStream_t as void*). Tolerance CPU vs CUDA: none (one float add each).
// Twins (runtime/dispatch.h): cpu:: in accumulate_cpu.cpp, cuda:: in accumulate.cu (CUDA builds
// only); the Tensor forms are the one dispatch (accumulate_dispatch.cpp), by the tensors' device.
#pragma once

#include "runtime/tensor.h"

namespace qshard {

// Twins (same name and parameters, trailing stream; the CPU ignores it).
namespace cpu {
void accumulate_f32(float* out, const float* in, int64_t n, void* stream = nullptr);
}  // namespace cpu
namespace cuda {
void accumulate_f32(float* out, const float* in, int64_t n, void* stream);
}  // namespace cuda
// The dispatch: the twin of the tensors' device (one device for both).
void accumulate_f32(Tensor& out, const Tensor& in, void* stream);

// out[i] = dtype(in[i]) (round to nearest even): the compute copy of f32 master weights in bf16 or
// f16 (the sharded manager's post-gather transform). Tolerance CPU vs CUDA: none (one rounding).
namespace cpu {
void convert_f32(void* out, DType out_dtype, const float* in, int64_t n, void* stream = nullptr);
}  // namespace cpu
namespace cuda {
void convert_f32(void* out, DType out_dtype, const float* in, int64_t n, void* stream);
}  // namespace cuda
void convert_f32(Tensor& out, const Tensor& in, void* stream);

}  // namespace qshard
