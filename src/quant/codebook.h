// codebook.h: the 4-bit code tables (NF4, FP4), the 8-bit signed dynamic map used by double
// quantization, and the scalar encoders that bitsandbytes' CUDA kernels use.
//
// What: pure functions and constant tables, host and device (the CUDA kernels include this
// header and use the same thresholds, so CPU and GPU encode identically).
// Encoding rules (see shared/FORMATS.md, "NF4 and FP4 code tables"):
//  - NF4: code = number of thresholds t with x > t (strict), thresholds are the float literals of
//    bitsandbytes' decision tree (midpoints of neighbouring table values); NaN gives code 0.
//  - FP4: sign bit 3 set when x < 0, magnitude bits from a decision tree on |x| with the literal
//    thresholds of bitsandbytes' kernel (not all exact midpoints).
//  - 8-bit dynamic: bitsandbytes' 7-step binary search over the sorted 256-entry map followed by
//    a comparison with the float midpoint of the bracketing pair.
// Thread safety: everything is constant or pure.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define QS_HOST_DEVICE __host__ __device__
#else
#define QS_HOST_DEVICE
#endif

namespace qshard {

enum class QuantType : uint8_t { kNf4, kFp4 };

// "nf4" | "fp4" -> QuantType; anything else throws InputError naming the value.
QuantType parse_quant_type(std::string_view s);
const char* quant_type_name(QuantType t);  // "nf4" | "fp4"

// Valid 4-bit blocksizes: powers of two in [32, 4096]. Throws InputError naming the value.
void validate_blocksize(int64_t blocksize);

// The 16-entry code table (bitsandbytes' quant_map), float32.
const std::array<float, 16>& code_table(QuantType t);
// The 256-entry signed dynamic map of bitsandbytes' create_dynamic_map(signed=True), sorted.
const std::array<float, 256>& dynamic_map_signed();

// The NF4 table as bitsandbytes stores it (index -> value).
inline constexpr float kNf4Table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// The FP4 table (bitsandbytes' quant_map for fp4): [0, 0.0625, 8, 12, 4, 6, 2, 3, -0, ...] / 12
// with entry 8 stored as +0.0.
inline constexpr float kFp4Table[16] = {
    0.0f, 0.0625f / 12.0f, 8.0f / 12.0f, 12.0f / 12.0f, 4.0f / 12.0f, 6.0f / 12.0f, 2.0f / 12.0f, 3.0f / 12.0f,
    0.0f, -0.0625f / 12.0f, -8.0f / 12.0f, -12.0f / 12.0f, -4.0f / 12.0f, -6.0f / 12.0f, -2.0f / 12.0f, -3.0f / 12.0f};

QS_HOST_DEVICE inline uint8_t nf4_encode(float x) {
  // bitsandbytes' decision-tree thresholds (float literals), ascending: code = #{t : x > t}.
  // A counting loop gives the same code as the tree; NaN compares false everywhere -> 0.
  constexpr float kThresholds[15] = {
      -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
      -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
      0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
      0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f};
  uint8_t c = 0;
  for (int i = 0; i < 15; ++i) c += (x > kThresholds[i]) ? 1 : 0;
  return c;
}

QS_HOST_DEVICE inline uint8_t fp4_encode(float x) {
  const uint8_t sign = x < 0.0f ? 0x8 : 0x0;
  const float a = x < 0.0f ? -x : x;  // fabsf without <cmath> on the device
  uint8_t m;
  if (a > 0.29166667f) {
    if (a > 0.583333f) m = a > 0.8333333f ? 0x3 : 0x2;
    else m = a > 0.4166667f ? 0x5 : 0x4;
  } else {
    if (a > 0.0859375f) m = a > 0.20833333f ? 0x7 : 0x6;
    else m = a > 0.00260417f ? 0x1 : 0x0;
  }
  return static_cast<uint8_t>(m | sign);
}

// bitsandbytes' CUDA kernels run with flush-to-zero: a subnormal input or result reads as a zero
// of the same sign (seen on real CUDA output: subnormal inputs give absmax 0). Both our paths
// apply it explicitly at the same points, so they agree with each other and with bitsandbytes'
// CUDA bytes. NaN passes through.
QS_HOST_DEVICE inline float flush_subnormal(float v) {
  constexpr float kMinNormal = 1.17549435082228750797e-38f;  // FLT_MIN
  return (v > -kMinNormal && v < kMinNormal) ? v * 0.0f : v;
}

// Decode table used by dequantization: bitsandbytes' CUDA kernel computes FP4 as
// sign * magnitude, so code 8 decodes to -0.0 (the stored quant_map has +0.0 there).
inline constexpr float kFp4DecodeTable[16] = {
    0.0f, 0.0625f / 12.0f, 8.0f / 12.0f, 12.0f / 12.0f, 4.0f / 12.0f, 6.0f / 12.0f, 2.0f / 12.0f, 3.0f / 12.0f,
    -0.0f, -0.0625f / 12.0f, -8.0f / 12.0f, -12.0f / 12.0f, -4.0f / 12.0f, -6.0f / 12.0f, -2.0f / 12.0f, -3.0f / 12.0f};
inline const float* decode_table(QuantType t) { return t == QuantType::kNf4 ? kNf4Table : kFp4DecodeTable; }

QS_HOST_DEVICE inline uint8_t encode_4bit(QuantType t, float x) {
  return t == QuantType::kNf4 ? nf4_encode(x) : fp4_encode(x);
}

// Nibble that encodes the padding element of an odd count (a zero): NF4 0x7, FP4 0x0.
QS_HOST_DEVICE inline uint8_t zero_code(QuantType t) { return t == QuantType::kNf4 ? 0x7 : 0x0; }

// bitsandbytes' 8-bit encoder (dQuantize, non-stochastic) over a sorted 256-entry map.
QS_HOST_DEVICE inline uint8_t encode_8bit(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int step = 64; step > 0; step >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += step;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= step;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

}  // namespace qshard
