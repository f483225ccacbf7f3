// The one dispatch of blockwise.h: the twin of the Device where the pointers live (the CPU's for
// host memory, CUDA's for device memory; runtime/dispatch.h: a CPU build has no CUDA twins).
#include "quant/blockwise.h"
#include "runtime/dispatch.h"

namespace qshard::quant {

void quantize_4bit(Device on, const void* x, DType dtype, int64_t n, int64_t blocksize, QuantType type,
                   uint8_t* packed, float* absmax, void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "quantize_4bit",
                   cpu::quantize_4bit(x, dtype, n, blocksize, type, packed, absmax, stream),
                   cuda::quantize_4bit(x, dtype, n, blocksize, type, packed, absmax, stream));
}

void quantize_8bit(Device on, const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q,
                   float* absmax, void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "quantize_8bit", cpu::quantize_8bit(x, n, blocksize, code256, q, absmax, stream),
                   cuda::quantize_8bit(x, n, blocksize, code256, q, absmax, stream));
}

void subtract_offset(Device on, float* x, int64_t n, float offset, void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "subtract_offset", cpu::subtract_offset(x, n, offset, stream),
                   cuda::subtract_offset(x, n, offset, stream));
}

void dequantize_4bit(Device on, const Dequant4bitArgs& args, void* out, DType out_dtype, void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "dequantize_4bit", cpu::dequantize_4bit(args, out, out_dtype, stream),
                   cuda::dequantize_4bit(args, out, out_dtype, stream));
}

void dequantize_4bit_batch(Device on, const Dequant4bitArgs* args, void* const* outs, int count, DType out_dtype,
                           void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "dequantize_4bit_batch",
                   cpu::dequantize_4bit_batch(args, outs, count, out_dtype, stream),
                   cuda::dequantize_4bit_batch(args, outs, count, out_dtype, stream));
}

}  // namespace qshard::quant
