#include "quant/codebook.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "quant/quant_state.h"
#include "runtime/error.h"

namespace qshard {
namespace {

TEST(Codebook, Nf4TableMatchesFormats) {
  const auto& t = code_table(QuantType::kNf4);
  EXPECT_EQ(t[0], -1.0f);
  EXPECT_EQ(t[7], 0.0f);
  EXPECT_EQ(t[13], 0.5626170039176941f);
  EXPECT_EQ(t[15], 1.0f);
  for (int i = 0; i < 15; ++i) EXPECT_LT(t[i], t[i + 1]);
}

TEST(Codebook, Nf4EncodesNearestWithStrictThresholds) {
  const auto& t = code_table(QuantType::kNf4);
  // Table values encode to themselves.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(nf4_encode(t[i]), i) << i;
  // Values between neighbours go to the nearer one; the threshold itself goes to the lower code.
  EXPECT_EQ(nf4_encode(0.03979014977812767f), 7);
  EXPECT_EQ(nf4_encode(std::nextafter(0.03979014977812767f, 1.0f)), 8);
  EXPECT_EQ(nf4_encode(2.0f), 15);
  EXPECT_EQ(nf4_encode(-2.0f), 0);
  EXPECT_EQ(nf4_encode(std::numeric_limits<float>::quiet_NaN()), 0);
  // bitsandbytes' CUDA thresholds are float literals (decimal repr of the double midpoints),
  // parsed straight to float32 by the compiler. Where the double midpoint is a float32 rounding
  // tie, the literal lands one ulp away from the float32 midpoint that torch computes
  // ((a + b) / 2 in float32, ties to even): the codes on such a midpoint follow the literal here,
  // as on bitsandbytes' CUDA kernel. Each literal is within one ulp of the float32 midpoint.
  constexpr float kLiterals[15] = {
      -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
      -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
      0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
      0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f};
  int off_by_one_ulp = 0;
  for (int i = 0; i < 15; ++i) {
    const float lit = kLiterals[i];
    EXPECT_EQ(nf4_encode(lit), i) << i;  // strict compare: the threshold itself -> lower code
    EXPECT_EQ(nf4_encode(std::nextafter(lit, 2.0f)), i + 1) << i;
    const float mid = static_cast<float>((static_cast<double>(t[i]) + t[i + 1]) / 2);
    const int64_t ulps = static_cast<int64_t>(f32_bits(std::fabs(lit))) - static_cast<int64_t>(f32_bits(std::fabs(mid)));
    EXPECT_LE(std::llabs(ulps), 1) << i;
    if (ulps != 0) ++off_by_one_ulp;
  }
  std::printf("NF4 thresholds one ulp from the float32 midpoint: %d of 15\n", off_by_one_ulp);
}

TEST(Codebook, Fp4SignAndTree) {
  EXPECT_EQ(fp4_encode(0.0f), 0x0);
  EXPECT_EQ(fp4_encode(-0.0f), 0x0);  // -0.0 is not < 0
  EXPECT_EQ(fp4_encode(1.0f), 0x3);
  EXPECT_EQ(fp4_encode(-1.0f), 0xb);
  EXPECT_EQ(fp4_encode(0.5f), 0x5);
  EXPECT_EQ(fp4_encode(-0.25f), 0xf);
  EXPECT_EQ(fp4_encode(0.29166667f), 0x7);  // strict threshold
  EXPECT_EQ(fp4_encode(std::numeric_limits<float>::quiet_NaN()), 0x0);
  const auto& t = code_table(QuantType::kFp4);
  for (int i = 0; i < 16; ++i) {
    if (i == 0 || i == 8) continue;  // +-0 both encode to 0
    EXPECT_EQ(fp4_encode(t[i]), i) << i;
  }
}

TEST(Codebook, DynamicMapMatchesBitsandbytesCheckValues) {
  const auto& m = dynamic_map_signed();
  EXPECT_EQ(m[0], -0.992968738079071f);
  EXPECT_EQ(m[126], -5.500000384017767e-07f);
  EXPECT_EQ(m[127], 0.0f);
  EXPECT_EQ(m[128], 5.500000384017767e-07f);
  EXPECT_EQ(m[254], 0.992968738079071f);
  EXPECT_EQ(m[255], 1.0f);
  for (int i = 0; i < 255; ++i) EXPECT_LT(m[i], m[i + 1]);
}

TEST(Codebook, Encode8bitIsNearest) {
  const auto& m = dynamic_map_signed();
  for (int i = 0; i < 256; ++i) EXPECT_EQ(encode_8bit(m.data(), m[i]), i) << i;
  // Away from midpoints the result is the nearest entry.
  for (int i = 0; i + 1 < 256; ++i) {
    const float lo = m[i], hi = m[i + 1];
    const float near_lo = lo + (hi - lo) * 0.25f, near_hi = lo + (hi - lo) * 0.75f;
    EXPECT_EQ(encode_8bit(m.data(), near_lo), i) << i;
    EXPECT_EQ(encode_8bit(m.data(), near_hi), i + 1) << i;
  }
}

TEST(Codebook, BadQuantTypeAndBlocksize) {
  EXPECT_EQ(parse_quant_type("nf4"), QuantType::kNf4);
  try {
    parse_quant_type("int4");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'int4'"), std::string::npos) << e.what();
  }
  for (int64_t bs : {32, 64, 128, 256, 512, 1024, 2048, 4096}) EXPECT_NO_THROW(validate_blocksize(bs));
  for (int64_t bs : {0, -64, 16, 48, 100, 8192}) {
    try {
      validate_blocksize(bs);
      FAIL() << bs;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bs)), std::string::npos) << e.what();
    }
  }
}

TEST(PythonRepr, MatchesPythonFloatRepr) {
  EXPECT_EQ(python_float_repr(0.5), "0.5");
  EXPECT_EQ(python_float_repr(2.0), "2.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(static_cast<double>(1.5e-05f)), "1.4999999621068127e-05");
  EXPECT_EQ(python_float_repr(static_cast<double>(0.0234567f)), "0.023456700146198273");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(123.25), "123.25");
  EXPECT_EQ(python_float_repr(-3.5e-7), "-3.5e-07");
  EXPECT_EQ(python_float_repr(1.5e300), "1.5e+300");
}

}  // namespace
}  // namespace qshard
