#include "runtime/dtype.h"

#include <algorithm>
#include <cctype>

namespace qshard {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kF64: return 8;
  }
  return 0;
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF64: return "F64";
  }
  return "?";
}

const char* dtype_torch_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kF64: return "float64";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s.substr(0, 6) == "torch.") s.remove_prefix(6);
  std::string l(s);
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "f32" || l == "float32" || l == "fp32" || l == "float") return DType::kF32;
  if (l == "bf16" || l == "bfloat16") return DType::kBF16;
  if (l == "f16" || l == "float16" || l == "fp16" || l == "half") return DType::kF16;
  if (l == "u8" || l == "uint8") return DType::kU8;
  if (l == "i32" || l == "int32") return DType::kI32;
  if (l == "i64" || l == "int64") return DType::kI64;
  if (l == "f64" || l == "float64" || l == "double") return DType::kF64;
  return std::nullopt;
}

bool dtype_is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // Subnormal: normalise.
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_f32(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
  return bits_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 0x38800000u) {
    // Result is subnormal or zero in f16: value = m * 2^-24 with m rounded to nearest even.
    if (a < 0x33000000u) return sign;  // below half of the smallest subnormal -> 0
    const uint32_t e = a >> 23;                     // biased f32 exponent
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand
    const uint32_t shift = 126 - e;                  // 14 + (113 - e)
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent, round 13 dropped bits to nearest even.
  uint32_t r = a - (112u << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

}  // namespace qshard
