// random_4bit (quant/random_4bit.h): the direct 4-bit draw has the statistics quantize_4bit gives a
// N(0, std) tensor, quantize_4bit's layout, and the same bytes at any thread count.
//
// Statistical tolerance: every figure is compared as a mean over blocks (the code frequencies, the
// dequantized mean and mean square per block, the absmax itself). Blocks are independent in both
// samples, values inside a block are not (they share the absmax), so each figure's standard error
// is measured from its own sample's block-to-block spread: se = sd(per-block value) / sqrt(blocks).
// The two figures must agree within 5 standard errors of their difference, sqrt(se_a^2 + se_b^2):
// a true-equal pair fails with probability 6e-7 (normal approximation, ~10^5 blocks per sample),
// while the mistakes this guards against move the figures by far more: a block without its
// absmax element shifts the +-1 codes by 1/64 = 0.016 (~20 se), a normal not truncated at the
// absmax puts ~0.008 of the mass on the +-1 codes, an absmax from the wrong order statistic moves
// its mean by > 3%.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>

#include "quant/params4bit.h"
#include "quant/random_4bit.h"
#include "quant/random_4bit_block.h"
#include "runtime/error.h"

namespace qshard {
namespace {

constexpr double kStd = 0.02;

// Mean of per-block values and its standard error.
struct Figure {
  double mean = 0, se = 0;
};
Figure figure(const std::vector<double>& per_block) {
  const double nb = static_cast<double>(per_block.size());
  double s = 0, ss = 0;
  for (double v : per_block) s += v;
  const double m = s / nb;
  for (double v : per_block) ss += (v - m) * (v - m);
  return {m, std::sqrt(ss / (nb - 1) / nb)};
}

// Prints the pair and checks |a - b| <= 5 sqrt(se_a^2 + se_b^2).
void expect_same(const std::string& what, const Figure& quantized, const Figure& drawn) {
  const double tol = 5.0 * std::hypot(quantized.se, drawn.se);
  std::printf("  %-28s quantize_4bit %.6g  random_4bit %.6g  |diff| %.3g  tol %.3g\n", what.c_str(), quantized.mean,
              drawn.mean, std::fabs(quantized.mean - drawn.mean), tol);
  EXPECT_LE(std::fabs(quantized.mean - drawn.mean), tol) << what;
}

// The nibble of element i.
uint8_t code_at(const Params4bit& p, int64_t i) {
  const uint8_t b = p.data.data<uint8_t>()[i / 2];
  return (i & 1) ? (b & 0x0f) : (b >> 4);
}

struct Case {
  QuantType type;
  int64_t blocksize;
  DType dtype;
  const char* name;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Random4bitStats : public testing::TestWithParam<Case> {};

TEST_P(Random4bitStats, MatchQuantizeOfANormalTensor) {
  const Case c = GetParam();
  const int64_t n = int64_t{1} << 23, nb = n / c.blocksize;
  const QuantizeOptions plain{c.type, c.blocksize, false};
  // The reference: quantize_4bit of N(0, std) values stored in the dtype.
  std::mt19937_64 g(11);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(kStd));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(g);
  const Params4bit ref = quantize_4bit(Tensor::from_f32({n / 1024, 1024}, c.dtype, v), plain);
  const Params4bit drawn = random_4bit({n / 1024, 1024}, c.dtype, plain, kStd, 0x1234);
  std::printf("%s, %lld values, %lld blocks:\n", c.name, static_cast<long long>(n), static_cast<long long>(nb));

  // Per block: each code's frequency, the dequantized mean and mean square, the absmax.
  auto per_block = [&](const Params4bit& p) {
    std::vector<std::vector<double>> freq(16, std::vector<double>(static_cast<size_t>(nb)));
    std::vector<double> mean(static_cast<size_t>(nb)), msq(static_cast<size_t>(nb)), absmax(static_cast<size_t>(nb));
    const std::vector<float> y = dequantize_4bit(p, DType::kF32).to_f32_vector();
    const float* am = p.quant_state.absmax.data<float>();
    for (int64_t b = 0; b < nb; ++b) {
      double s = 0, ss = 0;
      for (int64_t i = b * c.blocksize; i < (b + 1) * c.blocksize; ++i) {
        freq[code_at(p, i)][static_cast<size_t>(b)] += 1.0 / static_cast<double>(c.blocksize);
        s += y[static_cast<size_t>(i)];
        ss += double(y[static_cast<size_t>(i)]) * y[static_cast<size_t>(i)];
      }
      mean[static_cast<size_t>(b)] = s / static_cast<double>(c.blocksize);
      msq[static_cast<size_t>(b)] = ss / static_cast<double>(c.blocksize);
      absmax[static_cast<size_t>(b)] = am[b];
    }
    return std::tuple{freq, mean, msq, absmax};
  };
  const auto [rf, rm, rs, ra] = per_block(ref);
  const auto [df, dm, ds, da] = per_block(drawn);
  for (int k = 0; k < 16; ++k) expect_same("code " + std::to_string(k) + " frequency", figure(rf[k]), figure(df[k]));
  expect_same("dequantized mean", figure(rm), figure(dm));
  expect_same("dequantized mean square", figure(rs), figure(ds));
  const Figure ref_sq = figure(rs), drawn_sq = figure(ds);
  std::printf("  dequantized std: quantize_4bit %.6f  random_4bit %.6f\n", std::sqrt(ref_sq.mean),
              std::sqrt(drawn_sq.mean));
  expect_same("absmax mean", figure(ra), figure(da));
  // Quantiles: the share of drawn absmax at or below the reference's p-quantile is p, within 5
  // standard errors of a two-sample proportion, 5 sqrt(2 p (1 - p) / blocks).
  std::vector<double> sorted = ra;
  std::sort(sorted.begin(), sorted.end());
  for (double p : {0.01, 0.1, 0.5, 0.9, 0.99}) {
    const double q = sorted[static_cast<size_t>(p * static_cast<double>(nb))];
    const double share = static_cast<double>(std::count_if(da.begin(), da.end(), [q](double a) { return a <= q; })) /
                         static_cast<double>(nb);
    const double ref_share = static_cast<double>(std::upper_bound(sorted.begin(), sorted.end(), q) - sorted.begin()) /
                             static_cast<double>(nb);
    const double tol = 5.0 * std::sqrt(2.0 * p * (1 - p) / static_cast<double>(nb));
    std::printf("  absmax %.2f-quantile %.6g: share at or below it: quantize_4bit %.5f  random_4bit %.5f  tol %.4f\n",
                p, q, ref_share, share, tol);
    EXPECT_NEAR(share, ref_share, tol) << "absmax quantile " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Random4bitStats,
                         testing::Values(Case{QuantType::kNf4, 64, DType::kBF16, "nf4_64_bf16"},
                                         Case{QuantType::kFp4, 64, DType::kF32, "fp4_64_f32"},
                                         Case{QuantType::kNf4, 256, DType::kF16, "nf4_256_f16"}),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// quantize_4bit's layout: sizes, a +-1 code in every block at its absmax, the padding nibble of an
// odd count, dequantize_4bit's output; with double quant the nested statistics of the same draw's
// plain absmax, made by quantize_4bit's own path.
TEST(Random4bit, LayoutIsQuantize4bits) {
  for (QuantType t : {QuantType::kNf4, QuantType::kFp4}) {
    const Shape shape{37, 129};  // 4773 values: odd, the last block short (4773 = 74 x 64 + 37)
    const int64_t n = 37 * 129, nb = (n + 63) / 64;
    const Params4bit plain = random_4bit(shape, DType::kBF16, {t, 64, false}, kStd, 5);
    const Params4bit dq = random_4bit(shape, DType::kBF16, {t, 64, true}, kStd, 5);
    const Params4bit want_layout = quantize_4bit(Tensor::zeros(shape, DType::kBF16), {t, 64, true});
    ASSERT_EQ(dq.data.shape(), want_layout.data.shape());
    ASSERT_EQ(dq.data.dtype(), DType::kU8);
    const QuantState& st = dq.quant_state;
    EXPECT_EQ(st.shape, shape);
    EXPECT_EQ(st.dtype, DType::kBF16);
    EXPECT_EQ(st.quant_type, t);
    EXPECT_EQ(st.blocksize, 64);
    ASSERT_TRUE(st.nested());
    EXPECT_EQ(st.absmax.shape(), Shape({nb}));
    EXPECT_EQ(st.absmax.dtype(), DType::kU8);
    EXPECT_EQ(st.state2->absmax.shape(), want_layout.quant_state.state2->absmax.shape());
    EXPECT_TRUE(bitwise_equal(st.code, want_layout.quant_state.code));
    EXPECT_TRUE(bitwise_equal(st.state2->code, want_layout.quant_state.state2->code));
    EXPECT_NO_THROW(st.validate("random_4bit"));
    const QuantState js = QuantState::from_packed_json(st.packed_json(), "random_4bit");  // the state dict's JSON
    EXPECT_EQ(js.shape, shape);
    EXPECT_EQ(js.blocksize, 64);
    ASSERT_TRUE(js.nested());
    EXPECT_EQ(js.state2->offset, st.state2->offset);
    // The same draw: codes equal with and without double quant; the nested statistics are those
    // params4bit_from_blocks (quantize_4bit's tail) makes of the plain absmax.
    EXPECT_TRUE(bitwise_equal(plain.data, dq.data));
    const Params4bit nested = params4bit_from_blocks(plain.data.clone(), plain.quant_state.absmax.clone(), shape,
                                                     DType::kBF16, {t, 64, true});
    EXPECT_TRUE(bitwise_equal(nested.quant_state.absmax, st.absmax));
    EXPECT_TRUE(bitwise_equal(nested.quant_state.state2->absmax, st.state2->absmax));
    EXPECT_EQ(nested.quant_state.state2->offset, st.state2->offset);
    EXPECT_GT(st.state2->offset, 0.0f);
    // Every block holds its absmax: a +-1 code, dequantized to exactly +-absmax; nothing larger.
    const std::vector<float> y = dequantize_4bit(plain, DType::kF32).to_f32_vector();
    const float* am = plain.quant_state.absmax.data<float>();
    const uint8_t plus = encode_4bit(t, 1.0f), minus = encode_4bit(t, -1.0f);
    for (int64_t b = 0; b < nb; ++b) {
      EXPECT_GT(am[b], 0.0f);
      EXPECT_EQ(am[b], bf16_to_f32(f32_to_bf16(am[b]))) << "absmax of a bf16 tensor is a bf16 value";
      float top = 0;
      int ones = 0;
      for (int64_t i = b * 64; i < std::min(n, (b + 1) * 64); ++i) {
        top = std::max(top, std::fabs(y[static_cast<size_t>(i)]));
        ones += code_at(plain, i) == plus || code_at(plain, i) == minus;
      }
      EXPECT_EQ(top, am[b]) << "block " << b;
      EXPECT_GE(ones, 1) << "block " << b;
    }
    EXPECT_EQ(plain.data.data<uint8_t>()[n / 2] & 0x0f, zero_code(t));  // the padding nibble
    // Double-quantized absmax decodes close to the plain one (8-bit codes: within 1% here).
    const std::vector<float> decoded = st.absmax_f32();
    for (int64_t b = 0; b < nb; ++b) EXPECT_NEAR(decoded[b], am[b], 0.01 * am[b] + 1e-4) << b;
    const Tensor dq_out = dequantize_4bit(dq);
    EXPECT_EQ(dq_out.shape(), shape);
    EXPECT_EQ(dq_out.dtype(), DType::kBF16);
  }
}

// The bytes are a function of (key, block): any thread count, the same bytes; another key, others.
TEST(Random4bit, SameBytesAtAnyThreadCount) {
  const Shape shape{3 * 1024 + 1, 1025};  // ~3.1 M values: 4 chunks of 2^20, odd count
  const QuantizeOptions q{QuantType::kNf4, 64, true};
  const Params4bit one = random_4bit(shape, DType::kBF16, q, kStd, 42, 1);
  for (int threads : {2, 3, 8}) {
    const Params4bit many = random_4bit(shape, DType::kBF16, q, kStd, 42, threads);
    EXPECT_TRUE(bitwise_equal(one.data, many.data)) << threads;
    EXPECT_TRUE(bitwise_equal(one.quant_state.absmax, many.quant_state.absmax)) << threads;
    EXPECT_TRUE(bitwise_equal(one.quant_state.state2->absmax, many.quant_state.state2->absmax)) << threads;
    EXPECT_EQ(one.quant_state.state2->offset, many.quant_state.state2->offset) << threads;
  }
  const Params4bit other = random_4bit(shape, DType::kBF16, q, kStd, 43, 2);
  EXPECT_FALSE(bitwise_equal(one.data, other.data));
}

// The shared per-block math (random_4bit_block.h) against libm and dtype.h: its own log and expm1
// are within 4 ulp of glibc's (they only need to be accurate; host and GPU run the same code), and
// its dtype rounding is dtype.h's bit for bit.
TEST(Random4bitBlock, OwnLogAndExpm1AreAccurate) {
  auto ulps = [](double a, double b) {
    if (a == b) return 0.0;
    return std::fabs(a - b) / std::fabs(std::nextafter(b, 2 * b + 1) - b);
  };
  std::mt19937_64 g(5);
  double worst_log = 0, worst_expm1 = 0;
  for (int i = 0; i < 200000; ++i) {
    // u as the draw makes it, and p = q/2 down to ~1e-21, and a spread of exponents.
    const double u = (static_cast<double>(g() >> 11) + 0.5) * 0x1p-53;
    const double x = std::ldexp(0.5 + 0.5 * u, static_cast<int>(g() % 200) - 100);
    for (double v : {u, x, 1.0 - u * 1e-3, 1.0 + u * 1e-3}) {
      const double w = ulps(r4::log_positive(v), std::log(v));
      worst_log = std::max(worst_log, w);
      ASSERT_LE(w, 4.0) << "log(" << v << ")";
    }
    for (double y : {-45.0 * u, -0.7 * u, -1e-10 * u, 0.3 * u}) {
      const double w = ulps(r4::expm1_bounded(y), std::expm1(y));
      worst_expm1 = std::max(worst_expm1, w);
      ASSERT_LE(w, 4.0) << "expm1(" << y << ")";
    }
  }
  std::printf("  log_positive(0.75) %.17g  std::log %.17g; worst %.1f ulp\n", r4::log_positive(0.75), std::log(0.75),
              worst_log);
  std::printf("  expm1_bounded(-0.01) %.17g  std::expm1 %.17g; worst %.1f ulp (tolerance 4)\n",
              r4::expm1_bounded(-0.01), std::expm1(-0.01), worst_expm1);
  EXPECT_EQ(r4::log_positive(1.0), 0.0);
  EXPECT_EQ(r4::expm1_bounded(-50.0), -1.0);
  EXPECT_NEAR(r4::lower_normal_quantile(0.025), -1.959963984540054, 3e-9);
  EXPECT_NEAR(r4::lower_normal_quantile(1e-10), -6.361340902404056, 1e-8);
}

TEST(Random4bitBlock, DtypeRoundingIsDtypeHs) {
  std::mt19937 g(9);
  for (int i = 0; i < 1000000; ++i) {
    const float f = bits_f32(g() & 0x7f7fffffu);  // finite, positive
    ASSERT_EQ(f32_bits(r4::round_to_dtype(f, DType::kBF16)), f32_bits(bf16_to_f32(f32_to_bf16(f)))) << f;
    ASSERT_EQ(f32_bits(r4::round_to_dtype(f, DType::kF16)), f32_bits(f16_to_f32(f32_to_f16(f)))) << f;
    ASSERT_EQ(f32_bits(r4::round_to_dtype(f, DType::kF32)), f32_bits(f));
  }
}

// The bytes are pinned: a random base must not change under a refactor (a run's loss curve is
// compared across versions). The hashes were recorded when the per-block math moved into
// random_4bit_block.h, and equal the draw of the code before it (compared then on 2.3e8 values:
// NF4 and FP4, blocksizes 64 / 256 / 4096, bf16 / f32 / f16, odd counts).
TEST(Random4bit, BytesArePinned) {
  auto fnv = [](const Tensor& t, uint64_t h) {
    for (uint8_t c : t.bytes()) h = (h ^ c) * 1099511628211ull;
    return h;
  };
  uint64_t h = 1469598103934665603ull;
  for (QuantType t : {QuantType::kNf4, QuantType::kFp4})
    for (int64_t bs : {64, 4096})
      for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
        const Params4bit p = random_4bit({129, 1031}, dt, {t, bs, false}, kStd, 77, 2);
        h = fnv(p.quant_state.absmax, fnv(p.data, h));
      }
  std::printf("  hash of 12 draws' codes and absmax: 0x%016llx\n", static_cast<unsigned long long>(h));
  EXPECT_EQ(h, 0xdd527e8125291de0ull);  // also what the pre-shared-header code gives
}

// The intervals read off the encoder reproduce it: for any float v (but NaN),
// encode_4bit(flush_subnormal(v)) = code[#{k : v > bound[k]}], at the boundaries and in between.
TEST(Random4bit, CodeIntervalsReproduceTheEncoder) {
  for (QuantType t : {QuantType::kNf4, QuantType::kFp4}) {
    const CodeIntervals& iv = code_intervals(t);
    auto via_intervals = [&](float v) {
      int k = 0;
      while (k < 15 && v > iv.bound[k]) ++k;
      return iv.code[k];
    };
    std::vector<float> probe = {-2.0f, -1.0f, -0.0f, 0.0f, 1e-39f, -1e-39f, 1.0f, 2.0f};
    for (float b : iv.bound)
      for (float v : {b, std::nextafter(b, 2.0f), std::nextafter(b, -2.0f)}) probe.push_back(v);
    std::mt19937 g(3);
    std::uniform_real_distribution<float> u(-1.5f, 1.5f);
    for (int i = 0; i < 100000; ++i) probe.push_back(u(g));
    for (float v : probe) ASSERT_EQ(via_intervals(v), encode_4bit(t, flush_subnormal(v))) << quant_type_name(t) << " " << v;
    for (int k = 1; k < 15; ++k) EXPECT_LT(iv.bound[k - 1], iv.bound[k]);
  }
  // NF4's boundaries are its encoder's thresholds (the midpoints of neighbouring table values).
  EXPECT_FLOAT_EQ(code_intervals(QuantType::kNf4).bound[7], 0.03979014977812767f);
}

TEST(Random4bit, RejectsBadArguments) {
  const QuantizeOptions q;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { random_4bit({8, 8}, DType::kF32, q, 0.0, 1); }),
            "random_4bit: std 0: expected a standard deviation in [1e-6, 1e3]");
  EXPECT_NE(message([&] { random_4bit({8, 8}, DType::kF32, q, NAN, 1); }).find("expected a standard deviation"),
            std::string::npos);
  EXPECT_NE(message([&] { random_4bit({8, 8}, DType::kU8, q, 0.02, 1); }).find("dtype uint8 is not float32"),
            std::string::npos);
  EXPECT_NE(message([&] { random_4bit({0, 8}, DType::kF32, q, 0.02, 1); }).find("has no elements"), std::string::npos);
  EXPECT_NE(message([&] { random_4bit({8, 8}, DType::kF32, {QuantType::kNf4, 48, true}, 0.02, 1); })
                .find("invalid blocksize 48"),
            std::string::npos);
}

}  // namespace
}  // namespace qshard
