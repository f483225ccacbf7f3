#include "runtime/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace qshard {
namespace {

// Reference: round-to-nearest-even through double arithmetic, independent of the bit tricks.
uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u = f32_bits(f);
  uint32_t lower = u & 0xffff0000u;
  uint32_t upper = lower + 0x10000u;
  double dl = bits_f32(lower), du = bits_f32(upper), x = f;
  if (std::isinf(bits_f32(upper)) && !std::isinf(f)) {
    // Distance to "infinity" is measured as to 2^128.
    du = std::ldexp(1.0, 128) * (f < 0 ? -1 : 1);
  }
  double el = std::fabs(x - dl), eu = std::fabs(du - x);
  if (el < eu) return static_cast<uint16_t>(lower >> 16);
  if (eu < el) return static_cast<uint16_t>(upper >> 16);
  return static_cast<uint16_t>(((lower >> 16) & 1) ? upper >> 16 : lower >> 16);
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kU8, DType::kI32, DType::kI64}) {
    EXPECT_EQ(parse_dtype(dtype_safetensors_name(t)), t);
    EXPECT_EQ(parse_dtype(dtype_torch_name(t)), t);
    EXPECT_EQ(parse_dtype(std::string("torch.") + dtype_torch_name(t)), t);
  }
  EXPECT_FALSE(parse_dtype("float8").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is half way between 1+2^-7 (odd) and 1+2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = bits_f32(bits(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), bf16_reference(f)) << "f=" << f;
  }
}

TEST(DType, F16ExactAndRounding) {
  // Every f16 bit pattern converts to f32 and back unchanged (NaNs stay NaN).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);   // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(3.0f, -25)), 0x8002);  // 1.5 ulp tie -> even (2)
  // Random floats: the result is the nearest f16 (checked against neighbours in double).
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) {
    float f = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 30) - 25);
    uint16_t h = f32_to_f16(f);
    double got = f16_to_f32(h);
    if (std::isinf(got)) continue;
    for (int d : {-1, 1}) {
      uint16_t nb = static_cast<uint16_t>(h + d);
      double other = f16_to_f32(nb);
      if (std::isnan(other) || std::isinf(other) || ((nb ^ h) & 0x8000)) continue;
      ASSERT_LE(std::fabs(got - f), std::fabs(other - f)) << f;
    }
  }
}

}  // namespace
}  // namespace qshard
