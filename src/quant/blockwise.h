// blockwise.h: blockwise 4-bit and 8-bit quantization kernels, CPU reference and CUDA.
//
// Layout (bitsandbytes, shared/FORMATS.md "Blockwise 4-bit quantization"):
//   x       [n]                 input, flattened row-major
//   packed  [(n+1)/2] uint8     element 2j in the HIGH nibble, 2j+1 in the LOW nibble; an odd
//                               count pads the last low nibble with the code of zero
//   absmax  [ceil(n/bs)] f32    max |x| over each block's valid elements
// Encoding: x * (1.0f / absmax[b]) through the scalar encoders of codebook.h, so an all-zero
// block encodes NaN -> code 0 exactly as bitsandbytes' CUDA kernel does.
// Double quantization stores absmax as uint8 codes of (absmax - offset) against the signed
// dynamic map in blocks of 256 with an fp32 nested absmax per block.
//
// Twins (runtime/dispatch.h): `cpu::name` is the reference (plain loops, float32 math, no FMA
// contraction), `cuda::name` the kernel launcher, with the same parameters and a trailing stream
// (a cudaStream_t as void*, so this header stays free of CUDA; the CPU ignores it). CUDA: all
// pointers are device pointers; work is enqueued on `stream`, nothing synchronises. `quant::name`
// (blockwise_dispatch.cpp) is the one dispatch: the twin of the Device where the pointers live.
// The cpu:: helpers without a twin (dequantize_4bit_blocks, decode_nested_absmax, absmax_mean) are
// host steps of quantize and export. REQUIRES: blocksize is a power of two in [32, 4096]
// (validate_blocksize).
#pragma once

#include <cstdint>

#include "quant/codebook.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace qshard {

// Tolerance note for CUDA vs CPU comparisons: none. Both paths perform the same float32
// operations in the same order (one reciprocal, one multiply, threshold compares; dequant is
// one multiply, the nested absmax one multiply then one add), so results are bitwise equal.

// Everything the 4-bit dequant kernel needs; absmax is either plain f32 or nested (q8 != null).
struct Dequant4bitArgs {
  const uint8_t* packed = nullptr;
  int64_t n = 0;
  int64_t blocksize = 64;
  float code[16] = {};             // 4-bit code table (values, by value into the kernel)
  const float* absmax = nullptr;   // plain absmax [nblocks] f32, or
  const uint8_t* absmax_q8 = nullptr;      // nested: uint8 codes [nblocks]
  const float* nested_absmax = nullptr;    // [ceil(nblocks / nested_blocksize)]
  const float* nested_code = nullptr;      // [256]
  int64_t nested_blocksize = 256;
  float offset = 0.0f;
  int units_per_thread = 0;  // CUDA tuning knob (1, 2, 4, 8, 16; 0 = automatic), for bench/dequant
  // The output as rows of row_len values out_ld apart (the weight [out, in] written into a wider
  // [out, in + R] buffer: the LoRA fold); 0 = one packed run of n values. REQUIRES n % row_len == 0.
  int64_t row_len = 0;
  int64_t out_ld = 0;
};

// ---- the twins (cpu:: defined in blockwise_cpu.cpp, cuda:: in blockwise.cu, CUDA builds only) ----
// quantize_4bit: x [n] of `dtype` (f32, bf16 or f16; the CPU widens to f32 first, exactly) into
//   packed [(n+1)/2] and absmax [ceil(n/blocksize)].
// quantize_8bit: 8-bit blockwise quantization of x [n] f32 against a sorted 256-entry map
//   (bitsandbytes' General8bit): q [n] codes, absmax [ceil(n/blocksize)].
// subtract_offset: x[i] = flush_subnormal(x[i] - offset) in place (x: [n] f32): the centring of
//   the absmax before its 8-bit quantization (double quant).
// dequantize_4bit: out [n] of out_dtype (f32, bf16, f16), converted with round-to-nearest-even:
//   the nested absmax decoded if present, then each value table[code] * absmax in f32, then the
//   rounding; rows of row_len values out_ld apart when args.out_ld is set.
// dequantize_4bit_batch: `count` tensors (outs[i] receives args[i]); CUDA with as few launches as
//   possible: one per 8 tensors, plus a small one for any tail or unaligned tensor (a decoder
//   layer's projections, dequantized together). The CPU dequantizes them one by one.
namespace cpu {
void quantize_4bit(const void* x, DType dtype, int64_t n, int64_t blocksize, QuantType type, uint8_t* packed,
                   float* absmax, void* stream = nullptr);
void quantize_8bit(const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q, float* absmax,
                   void* stream = nullptr);
void subtract_offset(float* x, int64_t n, float offset, void* stream = nullptr);
void dequantize_4bit(const Dequant4bitArgs& args, void* out, DType out_dtype, void* stream = nullptr);
void dequantize_4bit_batch(const Dequant4bitArgs* args, void* const* outs, int count, DType out_dtype,
                           void* stream = nullptr);

// Host helpers without a twin.
// out[i] = code[nibble(i)] * absmax[i / blocksize], float32 (a plain absmax).
void dequantize_4bit_blocks(const uint8_t* packed, const float* absmax, const float* code, int64_t n,
                            int64_t blocksize, float* out);
// absmax[b] = code256[q[b]] * nested_absmax[b / nested_blocksize] + offset (two roundings).
void decode_nested_absmax(const uint8_t* q, const float* nested_absmax, const float* code256, int64_t nblocks,
                          int64_t nested_blocksize, float offset, float* absmax);
// mean(absmax) as bitsandbytes' offset: summed in double, rounded once to float32.
float absmax_mean(const float* absmax, int64_t nblocks);
}  // namespace cpu

namespace cuda {
void quantize_4bit(const void* x, DType dtype, int64_t n, int64_t blocksize, QuantType type, uint8_t* packed,
                   float* absmax, void* stream);
void quantize_8bit(const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q, float* absmax,
                   void* stream);
void subtract_offset(float* x, int64_t n, float offset, void* stream);
void dequantize_4bit(const Dequant4bitArgs& args, void* out, DType out_dtype, void* stream);
void dequantize_4bit_batch(const Dequant4bitArgs* args, void* const* outs, int count, DType out_dtype, void* stream);
}  // namespace cuda

// ---- the dispatch (blockwise_dispatch.cpp): the twin of `on`, the Device where the pointers live;
// a CUDA Device in a build without CUDA is an Error naming the op.
namespace quant {
void quantize_4bit(Device on, const void* x, DType dtype, int64_t n, int64_t blocksize, QuantType type,
                   uint8_t* packed, float* absmax, void* stream);
void quantize_8bit(Device on, const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q,
                   float* absmax, void* stream);
void subtract_offset(Device on, float* x, int64_t n, float offset, void* stream);
void dequantize_4bit(Device on, const Dequant4bitArgs& args, void* out, DType out_dtype, void* stream);
void dequantize_4bit_batch(Device on, const Dequant4bitArgs* args, void* const* outs, int count, DType out_dtype,
                           void* stream);
}  // namespace quant

}  // namespace qshard
