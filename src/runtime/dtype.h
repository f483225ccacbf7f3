// dtype.h: element types of qshard tensors and exact float conversions.
//
// What: the element types the runtime stores (f32, bf16, f16, u8, i32, i64, f64), their sizes,
// their names in safetensors ("F32", "BF16", ...) and in PyTorch/bitsandbytes JSON ("float32",
// "bfloat16", ...), and scalar conversions between f32 and the two 16-bit float formats.
// Rounding: f32 -> bf16 and f32 -> f16 round to nearest, ties to even (what PyTorch's .to() does);
// NaN stays NaN (quiet), overflow in f16 gives +-inf, f16 subnormals are produced exactly.
// bf16/f16 -> f32 are exact. Thread safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace qshard {

// kF64 is for exact sums (loss, squared norms) only: no safetensors weight is read as F64.
enum class DType : uint8_t { kF32, kBF16, kF16, kU8, kI32, kI64, kF64 };

// Bytes per element.
size_t dtype_size(DType t);
// Safetensors dtype string: "F32", "BF16", "F16", "U8", "I32", "I64".
const char* dtype_safetensors_name(DType t);
// PyTorch dtype name without the "torch." prefix: "float32", "bfloat16", "float16", "uint8", ...
const char* dtype_torch_name(DType t);
// Parses either naming ("F32"/"float32"/"torch.float32", also "fp32", "bf16", "fp16", "half").
// Returns nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view s);
// True for f32, bf16, f16.
bool dtype_is_float(DType t);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace qshard
