// CPU twins of accumulate.h (the reference).
#include "runtime/accumulate.h"

namespace qshard {

void cpu::accumulate_f32(float* out, const float* in, int64_t n, void* stream) {
  (void)stream;
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

void cpu::convert_f32(void* out, DType out_dtype, const float* in, int64_t n, void* stream) {
  (void)stream;
  uint16_t* o = static_cast<uint16_t*>(out);
  if (out_dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(in[i]);
  } else if (out_dtype == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_f16(in[i]);
  } else {
    throw Error(std::string("convert_f32: output dtype ") + dtype_torch_name(out_dtype) + " is not bf16 or f16");
  }
}

}  // namespace qshard
