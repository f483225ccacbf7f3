// random_4bit.h: the direct draw of a quantized normal tensor, block by block.
#include "quant/random_4bit.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <vector>

#include "runtime/error.h"
#include "runtime/parallel.h"

namespace qshard {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64's finalizer (as random_normal's counter-based path).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- the encoder's intervals ----------------------------------------------------------------

// Floats in value order as integers (-0 and +0 both 0), and back.
int32_t float_order(float f) {
  const int32_t i = std::bit_cast<int32_t>(f);
  return i >= 0 ? i : -(i & 0x7fffffff);
}
float order_float(int32_t o) { return o >= 0 ? std::bit_cast<float>(o) : -std::bit_cast<float>(-o); }

CodeIntervals read_intervals(QuantType t) {
  // What quantize_4bit applies to a scaled value.
  auto code_of = [t](float v) { return encode_4bit(t, flush_subnormal(v)); };
  CodeIntervals c{};
  int found = 0;
  c.code[0] = code_of(-1.0f);
  // A grid over [-1, 1] finer than the narrowest interval (FP4's (0, 0.0026]); every change of
  // code between two grid points is one boundary, found exactly by bisection over the floats.
  constexpr int kGrid = 1 << 14;
  float prev = -1.0f;
  for (int i = 1; i <= kGrid; ++i) {
    const float v = -1.0f + 2.0f * static_cast<float>(i) / kGrid;
    if (code_of(v) == code_of(prev)) {
      prev = v;
      continue;
    }
    int32_t lo = float_order(prev), hi = float_order(v);  // code_of(lo) = the left code, code_of(hi) not
    const uint8_t left = code_of(prev);
    while (hi - lo > 1) {
      const int32_t mid = lo + (hi - lo) / 2;
      (code_of(order_float(mid)) == left ? lo : hi) = mid;
    }
    QS_CHECK(found < 15, "code_intervals: more than 15 boundaries");
    c.bound[found] = order_float(lo);  // the largest float of the left interval: v > bound -> next code
    c.code[++found] = code_of(order_float(hi));
    prev = v;
  }
  QS_CHECK(found == 15, "code_intervals: expected 15 decision boundaries");
  return c;
}

// ---- the standard normal's CDF at the boundaries, and its inverse ----------------------------

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); }

// Phi(s b_k) for the 15 boundaries b_k of one quant type, and Q(s) = 1 - Phi(s), as functions of
// s = absmax / std: tabulated at steps of h = 1/64 on [0, 9] with cubic Hermite interpolation (the
// derivatives b_k phi(s b_k) known exactly), so a block's 16 values share one position in the table.
// Error <= h^4 / 384 * max|d^4/ds^4 Phi(s b)| < 1e-10 (|b| <= 1), below the 2^-32 the thresholds
// are kept to. Past s = 9 (a max of > 9 std: never, for blocks of <= 4096 values from 53-bit
// uniforms) the values are computed directly.
class BoundaryCdf {
 public:
  explicit BoundaryCdf(const CodeIntervals& iv) {
    for (int k = 0; k < 15; ++k) b_[k] = iv.bound[k];
    b_[15] = -1.0;  // Phi(-s) = Q(s)
    for (int r = 0; r <= kRows; ++r) {
      const double s = static_cast<double>(r) / kPerUnit;
      for (int k = 0; k < 16; ++k) {
        v_[r][k] = normal_cdf(s * b_[k]);
        d_[r][k] = b_[k] * normal_pdf(s * b_[k]) / kPerUnit;  // per table step
      }
    }
  }
  // out[k] = Phi(s b_k) for k < 15 (out[15] = Q(s)). REQUIRES s >= 0.
  void at(double s, double out[16]) const {
    const double x = s * kPerUnit;
    if (!(x < kRows)) {
      for (int k = 0; k < 16; ++k) out[k] = normal_cdf(s * b_[k]);
      return;
    }
    const int r = static_cast<int>(x);
    const double t = x - r, u = 1.0 - t;
    const double h00 = (1.0 + 2.0 * t) * u * u, h10 = t * u * u, h01 = t * t * (3.0 - 2.0 * t), h11 = -t * t * u;
    for (int k = 0; k < 16; ++k) out[k] = h00 * v_[r][k] + h10 * d_[r][k] + h01 * v_[r + 1][k] + h11 * d_[r + 1][k];
  }
  // Q(s) alone. REQUIRES s >= 0.
  double q(double s) const {
    const double x = s * kPerUnit;
    if (!(x < kRows)) return normal_cdf(-s);
    const int r = static_cast<int>(x);
    const double t = x - r, u = 1.0 - t;
    return (1.0 + 2.0 * t) * u * u * v_[r][15] + t * u * u * d_[r][15] + t * t * (3.0 - 2.0 * t) * v_[r + 1][15] -
           t * t * u * d_[r + 1][15];
  }

 private:
  static constexpr int kPerUnit = 64, kRows = 9 * kPerUnit;
  double b_[16];
  double v_[kRows + 1][16], d_[kRows + 1][16];
};

const BoundaryCdf& boundary_cdf(QuantType t) {
  static const BoundaryCdf nf4(code_intervals(QuantType::kNf4)), fp4(code_intervals(QuantType::kFp4));
  return t == QuantType::kNf4 ? nf4 : fp4;
}

// Phi^-1(p), 0 < p < 1: Acklam's rational approximation (relative error < 1.15e-9).
double normal_quantile(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01, -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  auto tail = [&](double r) {  // r = sqrt(-2 log(min(p, 1 - p)))
    return (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) /
           ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1.0);
  };
  if (p < kLow) return tail(std::sqrt(-2.0 * std::log(p)));
  if (p > 1.0 - kLow) return -tail(std::sqrt(-2.0 * std::log1p(-p)));
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
}

// ---- one block ------------------------------------------------------------------------------

struct Draw {
  const BoundaryCdf* cdf;
  const CodeIntervals* iv;
  double std;
  DType dtype;
  QuantType type;
  int64_t n, blocksize;
  uint64_t key;
  uint8_t pad;
};

// The float absmax a tensor of `dtype` has when its largest |value| is m (rounded as it is stored).
float stored_absmax(double m, DType dtype) {
  const float f = static_cast<float>(m);
  if (dtype == DType::kBF16) return bf16_to_f32(f32_to_bf16(f));
  if (dtype == DType::kF16) return f16_to_f32(f32_to_f16(f));
  return f;
}

// #{k : u > t[k]} for t[0..15] sorted with t[15] = UINT32_MAX (so at most 15).
[[gnu::always_inline]] inline uint32_t interval_of(const uint32_t* t, uint32_t u) {
  uint32_t j = u > t[7] ? 8 : 0;
  j += u > t[j + 3] ? 4 : 0;
  j += u > t[j + 1] ? 2 : 0;
  j += u > t[j] ? 1 : 0;
  return j;
}

void draw_block(const Draw& d, int64_t b, uint8_t* packed, float* absmax) {
  const int64_t begin = b * d.blocksize, len = std::min(d.n - begin, d.blocksize);
  const uint64_t ctr = static_cast<uint64_t>(b) * static_cast<uint64_t>(d.blocksize / 2 + 2);
  auto word = [&](uint64_t c) { return mix64(d.key + (ctr + c) * kGolden); };
  // The block's max |x| / std: q = 1 - U^(1/len) = P(|x| > m) for the max, so m = Phi^-1(1 - q/2).
  const double u = (static_cast<double>(word(0) >> 11) + 0.5) * 0x1p-53;
  const double q = -std::expm1(std::log(u) / static_cast<double>(len));
  const double m = -normal_quantile(0.5 * q);
  const float a = stored_absmax(d.std * m, d.dtype);
  absmax[b] = a;
  // Cumulative interval probabilities of N(0, 1) truncated to [-m, m] at the boundaries a b_k / std:
  // P(x <= a b_k | |x| <= m) = (Phi(a b_k / std) - Q(m)) / (1 - 2 Q(m)).
  double cdf[16];
  d.cdf->at(static_cast<double>(a) / d.std, cdf);
  const double below = d.cdf->q(m), inv_mass = 1.0 / (1.0 - 2.0 * below);
  uint32_t t[16];
  for (int k = 0; k < 15; ++k) {
    const double p = (cdf[k] - below) * inv_mass;
    t[k] = p <= 0.0 ? 0u : p >= 1.0 ? UINT32_MAX : static_cast<uint32_t>(p * 0x1p32);
  }
  t[15] = UINT32_MAX;
  for (int k = 1; k < 15; ++k) t[k] = std::max(t[k], t[k - 1]);  // sorted despite rounding
  const uint8_t* code = d.iv->code;
  uint8_t* out = packed + begin / 2;  // begin is even: blocksizes are even
  const int64_t pairs = len / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const uint64_t w = word(2 + static_cast<uint64_t>(j));
    out[j] = static_cast<uint8_t>((code[interval_of(t, static_cast<uint32_t>(w >> 32))] << 4) |
                                  code[interval_of(t, static_cast<uint32_t>(w))]);
  }
  if (len & 1) {  // an odd count: the last value in the high nibble, the padding code in the low one
    const uint32_t last = static_cast<uint32_t>(word(2 + static_cast<uint64_t>(pairs)) >> 32);
    out[pairs] = static_cast<uint8_t>((code[interval_of(t, last)] << 4) | d.pad);
  }
  // The max element: uniform position, uniform sign, the code quantize_4bit gives +-a.
  const uint64_t w1 = word(1);
  const int64_t pos = static_cast<int64_t>(((w1 >> 32) * static_cast<uint64_t>(len)) >> 32);
  const float v = (w1 & 1) ? -a : a;
  const uint8_t c = encode_4bit(d.type, flush_subnormal(flush_subnormal(v) * (1.0f / a)));
  uint8_t& byte = out[pos / 2];
  byte = (pos & 1) ? static_cast<uint8_t>((byte & 0xf0) | c) : static_cast<uint8_t>((byte & 0x0f) | (c << 4));
}

}  // namespace

const CodeIntervals& code_intervals(QuantType t) {
  static const CodeIntervals nf4 = read_intervals(QuantType::kNf4), fp4 = read_intervals(QuantType::kFp4);
  return t == QuantType::kNf4 ? nf4 : fp4;
}

Params4bit random_4bit(const Shape& shape, DType dtype, const QuantizeOptions& o, double std, uint64_t key,
                       int threads) {
  validate_blocksize(o.blocksize);
  if (!dtype_is_float(dtype))
    throw InputError(std::string("random_4bit: dtype ") + dtype_torch_name(dtype) + " is not float32, bfloat16 or float16");
  const int64_t n = shape_numel(shape);
  if (n <= 0) throw InputError("random_4bit: shape " + shape_str(shape) + " has no elements");
  if (!(std >= 1e-6 && std <= 1e3)) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", std);
    throw InputError(std::string("random_4bit: std ") + text + ": expected a standard deviation in [1e-6, 1e3]");
  }
  Draw d{};
  d.cdf = &boundary_cdf(o.quant_type);
  d.iv = &code_intervals(o.quant_type);
  d.std = std;
  d.dtype = dtype;
  d.type = o.quant_type;
  d.n = n;
  d.blocksize = o.blocksize;
  d.key = mix64(key ^ 0x5eed4b17c0de5eedull);  // its own stream: not random_normal's words for the same key
  d.pad = zero_code(o.quant_type);
  const int64_t nb = (n + o.blocksize - 1) / o.blocksize;
  Tensor packed = Tensor::empty({(n + 1) / 2, 1}, DType::kU8);
  Tensor absmax = Tensor::empty({nb}, DType::kF32);
  uint8_t* pk = packed.data<uint8_t>();
  float* am = absmax.data<float>();
  const int64_t per_chunk = std::max<int64_t>(1, (int64_t{1} << 20) / o.blocksize);
  const int64_t chunks = (nb + per_chunk - 1) / per_chunk;
  parallel_for(static_cast<size_t>(chunks), threads, [&](size_t c) {
    const int64_t first = static_cast<int64_t>(c) * per_chunk, last = std::min(nb, first + per_chunk);
    for (int64_t b = first; b < last; ++b) draw_block(d, b, pk, am);
  });
  return params4bit_from_blocks(std::move(packed), std::move(absmax), shape, dtype, o);
}

}  // namespace qshard
