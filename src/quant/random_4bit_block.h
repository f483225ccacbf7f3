// random_4bit_block.h: one block of random_4bit's draw (quant/random_4bit.h), written once for the
// host (random_4bit.cpp) and the GPU (random_4bit.cu), and the twins that draw runs of blocks.
//
// Why one source: the GPU draw must give the CPU draw's bytes. Both compile these functions, and
// they are built only from operations that round identically on both: +, -, *, / and sqrt on
// double and float (IEEE round-to-nearest on x86-64 SSE2 and on CUDA, whose double and float
// division and square root are correctly rounded unless -use_fast_math), floor, integer ops,
// double -> float and float -> bf16 / f16 rounding (to nearest even on both), and double ->
// uint32 truncation. No contraction of a*b+c into an FMA: CMakeLists.txt compiles C++ with
// -ffp-contract=off and CUDA with -fmad=false. The library functions whose last bit differs
// between glibc and CUDA (log, expm1, erfc, exp) are either replaced by own series below (log,
// expm1) or used only to build the Phi table on the host, which the GPU receives as data.
//
// Per block b of L values (L = blocksize, the last block shorter), from the 64-bit words
// word(b, c) = splitmix64(key + (b * (blocksize / 2 + 2) + c) * golden):
//   u = ((word(b, 0) >> 11) + 0.5) 2^-53, at most 1 - 2^-53 (the rounding of the top value to 1.0
//   is pulled back: log(1) = 0 would make the absmax 0 / 0)
//   q = -expm1(log(u) / L), m = -Phi^-1(q / 2) (Acklam), absmax A = std m rounded to the dtype
//   thresholds t_k = floor(2^32 (Phi(A b_k / std) - Q(m)) / (1 - 2 Q(m))), clamped to [0, 2^32-1]
//   and made non-decreasing; t_15 = 2^32 - 1
//   the max element: position ((word(b, 1) >> 32) L) >> 32, negative when word(b, 1) is odd, its
//   code encode_4bit(+-A * (1 / A)) as quantize_4bit computes it
//   byte j (elements 2j high nibble, 2j + 1 low) from word(b, 2 + j): each half's code is that of
//   interval #{k : half > t_k}; the max element's nibble replaced by its code; the missing low
//   nibble of an odd block the padding code.
// Phi(s b_k) and Q(s) = 1 - Phi(s): a table over s in [0, 10] at steps of 1/64 (values and
// derivatives per step), cubic Hermite interpolation. Past s = 10 the table's last row is used:
// unreachable, since u <= 1 - 2^-53 gives q >= ~2^-54 / L, so m <= Phi^-1(1 - 2^-67) < 9.4 for
// L <= 4096, and the rounded A / std exceeds m by at most 2^-8 relative.
// Layout of `table`: [641 rows][16][2] doubles: row r, boundary k (k = 15: b = -1, so Q(s)),
// {Phi(r/64 b_k), b_k phi(r/64 b_k) / 64}.
//
// Twins (runtime/dispatch.h): random_4bit_blocks draws blocks [first_block, first_block + count)
// into packed (byte 0 = the first block's first byte) and absmax (absmax[0] = the first block's);
// cpu:: on the caller's thread (host pointers, args.table the host table), cuda:: on `stream`
// (device pointers; args.table the host table: the launcher uploads it). Both return when the
// blocks are written (cuda:: waits for `stream`; random_4bit_to_host's GPU path pipelines its
// chunks with its own launches instead). REQUIRES for cuda:: packed 4-byte aligned.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>

#include "quant/codebook.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace qshard {

inline constexpr int kPhiPerUnit = 64, kPhiRows = 10 * kPhiPerUnit;  // table steps per unit of s, last row
inline constexpr int64_t kPhiTableDoubles = (kPhiRows + 1) * 16 * 2;

// Everything one draw needs, by value into the kernel.
struct Random4bitArgs {
  const double* table = nullptr;  // the Phi table above (host or device memory, see the twins)
  double std = 0;
  int64_t n = 0, blocksize = 64;
  uint64_t key = 0;     // already mixed (random_4bit.cpp)
  uint64_t codes = 0;   // interval k's code in bits 4k..4k+3 (CodeIntervals::code)
  uint8_t pad = 0;      // zero_code(type)
  QuantType type = QuantType::kNf4;
  DType dtype = DType::kF32;
};

// The arguments of random_4bit(shape, dtype, {type, blocksize}, std, key) (random_4bit.h), with the
// host's Phi table for `type`; throws random_4bit.h's InputErrors. Defined in random_4bit.cpp.
Random4bitArgs random_4bit_args(const Shape& shape, DType dtype, QuantType type, int64_t blocksize, double std,
                                uint64_t key);

// One block's draw: its absmax and what codes its elements.
struct Random4bitBlock {
  uint32_t t[16];  // cumulative thresholds, t[15] = UINT32_MAX
  int64_t len;     // values in the block
  int64_t pos;     // the max element
  float absmax;
  uint8_t max_code;
};

namespace r4 {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

QS_HOST_DEVICE inline uint64_t f64_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
#endif
}
QS_HOST_DEVICE inline double bits_f64(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, 8);
  return x;
#endif
}
QS_HOST_DEVICE inline uint32_t f32_bits_hd(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return f32_bits(x);
#endif
}
QS_HOST_DEVICE inline float bits_f32_hd(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return bits_f32(u);
#endif
}

// splitmix64's finalizer (as random_normal's counter-based path).
QS_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ln 2 split so that e * kLn2Hi is exact for |e| < 2^20 (fdlibm's split).
constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;

// Natural log of a finite x > 0: x = 2^e m, m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s) with
// s = (m - 1) / (m + 1), |s| <= 0.1716, as 2 s (1 + z/3 + ... + z^10/21), z = s^2: truncation
// < 1e-18 relative. Within a few ulp of the true log.
QS_HOST_DEVICE inline double log_positive(double x) {
  int e = 0;
  if (x < 0x1p-1022) {  // subnormal: scale into the normal range first
    x *= 0x1p54;
    e = -54;
  }
  const uint64_t bits = f64_bits(x);
  e += static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  double m = bits_f64((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  if (m > 1.4142135623730951) {
    m *= 0.5;  // exact
    ++e;
  }
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f), z = s * s;
  double p = 0.047619047619047616;  // 1/21
  p = p * z + 0.05263157894736842;  // 1/19
  p = p * z + 0.058823529411764705;  // 1/17
  p = p * z + 0.06666666666666667;   // 1/15
  p = p * z + 0.07692307692307693;   // 1/13
  p = p * z + 0.09090909090909091;   // 1/11
  p = p * z + 0.1111111111111111;    // 1/9
  p = p * z + 0.14285714285714285;   // 1/7
  p = p * z + 0.2;                   // 1/5
  p = p * z + 0.3333333333333333;    // 1/3
  const double log_m = 2.0 * s + 2.0 * s * (z * p);
  const double de = static_cast<double>(e);
  return de * kLn2Hi + (de * kLn2Lo + log_m);
}

// e^y - 1 for finite y <= 1 (the draw's y = log(u) / L is in [-37.5, 0)): |y| <= ln2 / 2 by its
// Taylor series to y^14 / 14! (truncation < 1e-19 relative); otherwise y = k ln2 + r, |r| <= ln2/2,
// and e^y - 1 = 2^k expm1(r) + (2^k - 1). Below y = -45, -1 (e^-45 < 2^-64).
QS_HOST_DEVICE inline double expm1_small(double r) {
  double p = 1.1470745597729725e-11;  // 1/14!
  p = p * r + 1.6059043836821613e-10;  // 1/13!
  p = p * r + 2.08767569878681e-09;    // 1/12!
  p = p * r + 2.505210838544172e-08;   // 1/11!
  p = p * r + 2.755731922398589e-07;   // 1/10!
  p = p * r + 2.755731922398589e-06;   // 1/9!
  p = p * r + 2.48015873015873e-05;    // 1/8!
  p = p * r + 0.0001984126984126984;   // 1/7!
  p = p * r + 0.001388888888888889;    // 1/6!
  p = p * r + 0.008333333333333333;    // 1/5!
  p = p * r + 0.041666666666666664;    // 1/4!
  p = p * r + 0.16666666666666666;     // 1/3!
  p = p * r + 0.5;                     // 1/2!
  return r + r * (r * p);
}
QS_HOST_DEVICE inline double expm1_bounded(double y) {
  constexpr double kHalfLn2 = 0.34657359027997264;
  if (y > -kHalfLn2 && y < kHalfLn2) return expm1_small(y);
  if (y < -45.0) return -1.0;
  const double k = floor(y * 1.4426950408889634 + 0.5);  // y / ln2, to nearest
  const double r = (y - k * kLn2Hi) - k * kLn2Lo;
  const double scale = bits_f64(static_cast<uint64_t>(1023 + static_cast<int>(k)) << 52);  // 2^k, exact
  return scale * expm1_small(r) + (scale - 1.0);
}

// Phi^-1(p) for 0 < p <= 0.5: Acklam's rational approximation (relative error < 1.15e-9), with
// log_positive for the tail's log.
QS_HOST_DEVICE inline double lower_normal_quantile(double p) {
  constexpr double kLow = 0.02425;
  if (p < kLow) {
    const double r = sqrt(-2.0 * log_positive(p));
    return (((((-7.784894002430293e-03 * r + -3.223964580411365e-01) * r + -2.400758277161838e+00) * r +
              -2.549732539343734e+00) * r + 4.374664141464968e+00) * r + 2.938163982698783e+00) /
           ((((7.784695709041462e-03 * r + 3.224671290700398e-01) * r + 2.445134137142996e+00) * r +
             3.754408661907416e+00) * r + 1.0);
  }
  const double q = p - 0.5, r = q * q;
  return (((((-3.969683028665376e+01 * r + 2.209460984245205e+02) * r + -2.759285104469687e+02) * r +
            1.383577518672690e+02) * r + -3.066479806614716e+01) * r + 2.506628277459239e+00) * q /
         (((((-5.447609879822406e+01 * r + 1.615858368580409e+02) * r + -1.556989798598866e+02) * r +
            6.680131188771972e+01) * r + -1.328068155288572e+01) * r + 1.0);
}

// f rounded to `dtype` (as a tensor of that dtype stores it), back in float32.
QS_HOST_DEVICE inline float round_to_dtype(float f, DType dtype) {
  if (dtype == DType::kBF16) {  // dtype.h's f32_to_bf16 (NaN never reaches here), then exact widening
    uint32_t u = f32_bits_hd(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return bits_f32_hd(u & 0xffff0000u);
  }
  if (dtype == DType::kF16) {
#if defined(__CUDA_ARCH__)
    return __half2float(__float2half_rn(f));  // IEEE round to nearest even, subnormals exact
#else
    return f16_to_f32(f32_to_f16(f));  // the same rounding (dtype.h)
#endif
  }
  return f;
}

// Hermite interpolation in the table at s >= 0: out[k] = Phi(s b_k), k in [first, last).
QS_HOST_DEVICE inline void phi_at(const double* table, double s, int first, int last, double* out) {
  const double x = s * kPhiPerUnit;
  int r = kPhiRows - 1;
  double t = 1.0;
  if (x < kPhiRows) {  // else the last row (unreachable, see above)
    r = static_cast<int>(x);
    t = x - r;
  }
  const double u = 1.0 - t;
  const double h00 = (1.0 + 2.0 * t) * u * u, h10 = t * u * u, h01 = t * t * (3.0 - 2.0 * t), h11 = -t * t * u;
  const double* a = table + r * 32;
  const double* b = a + 32;
  for (int k = first; k < last; ++k)
    out[k - first] = h00 * a[2 * k] + h10 * a[2 * k + 1] + h01 * b[2 * k] + h11 * b[2 * k + 1];
}

// #{k : u > t[k]} for t[0..15] sorted with t[15] = UINT32_MAX (so at most 15): 4 steps.
QS_HOST_DEVICE inline uint32_t interval_of(const uint32_t* t, uint32_t u) {
  uint32_t j = u > t[7] ? 8 : 0;
  j += u > t[j + 3] ? 4 : 0;
  j += u > t[j + 1] ? 2 : 0;
  j += u > t[j] ? 1 : 0;
  return j;
}

QS_HOST_DEVICE inline uint64_t block_counter(const Random4bitArgs& a, int64_t b) {
  return static_cast<uint64_t>(b) * static_cast<uint64_t>(a.blocksize / 2 + 2);
}
QS_HOST_DEVICE inline uint64_t word(const Random4bitArgs& a, uint64_t counter) {
  return mix64(a.key + counter * kGolden);
}

// Block b's absmax, thresholds and max element.
QS_HOST_DEVICE inline void draw_block(const Random4bitArgs& a, int64_t b, Random4bitBlock& d) {
  const int64_t begin = b * a.blocksize;
  d.len = a.n - begin < a.blocksize ? a.n - begin : a.blocksize;
  const uint64_t ctr = block_counter(a, b);
  // The block's max |x| / std: q = 1 - U^(1/len) = P(|x| > m) for the max, so m = Phi^-1(1 - q/2).
  constexpr double kMaxU = 0x1.fffffffffffffp-1;  // 1 - 2^-53
  double u = (static_cast<double>(word(a, ctr) >> 11) + 0.5) * 0x1p-53;
  u = u < kMaxU ? u : kMaxU;
  const double q = -expm1_bounded(log_positive(u) / static_cast<double>(d.len));
  const double m = -lower_normal_quantile(0.5 * q);
  const float am = round_to_dtype(static_cast<float>(a.std * m), a.dtype);
  d.absmax = am;
  // Cumulative interval probabilities of N(0, 1) truncated to [-m, m] at the boundaries A b_k / std:
  // P(x <= A b_k | |x| <= m) = (Phi(A b_k / std) - Q(m)) / (1 - 2 Q(m)).
  double cdf[15], below;
  phi_at(a.table, static_cast<double>(am) / a.std, 0, 15, cdf);
  phi_at(a.table, m, 15, 16, &below);
  const double inv_mass = 1.0 / (1.0 - 2.0 * below);
  uint32_t prev = 0;
  for (int k = 0; k < 15; ++k) {
    const double p = (cdf[k] - below) * inv_mass;
    uint32_t t = p <= 0.0 ? 0u : p >= 1.0 ? 0xffffffffu : static_cast<uint32_t>(p * 0x1p32);
    t = t > prev ? t : prev;  // sorted despite rounding
    d.t[k] = prev = t;
  }
  d.t[15] = 0xffffffffu;
  // The max element: uniform position, uniform sign, the code quantize_4bit gives +-A.
  const uint64_t w1 = word(a, ctr + 1);
  d.pos = static_cast<int64_t>(((w1 >> 32) * static_cast<uint64_t>(d.len)) >> 32);
  const float v = (w1 & 1) ? -am : am;
  d.max_code = encode_4bit(a.type, flush_subnormal(flush_subnormal(v) * (1.0f / am)));
}

// Byte j of block b (whose draw is d): elements 2j (high nibble) and 2j + 1 (low).
QS_HOST_DEVICE inline uint8_t block_byte(const Random4bitArgs& a, const Random4bitBlock& d, uint64_t ctr, int64_t j) {
  const uint64_t w = word(a, ctr + 2 + static_cast<uint64_t>(j));
  const int64_t e = 2 * j;
  const uint32_t hi = e == d.pos ? d.max_code
                                 : static_cast<uint32_t>(a.codes >> (4 * interval_of(d.t, static_cast<uint32_t>(w >> 32)))) & 0xf;
  const uint32_t lo = e + 1 >= d.len  ? a.pad
                      : e + 1 == d.pos ? d.max_code
                                       : static_cast<uint32_t>(a.codes >> (4 * interval_of(d.t, static_cast<uint32_t>(w)))) & 0xf;
  return static_cast<uint8_t>((hi << 4) | lo);
}

}  // namespace r4

// random_4bit_to_host's twins (random_4bit.h; the public function is the dispatch).
struct Random4bitJob;

namespace cpu {
void random_4bit_blocks(const Random4bitArgs& args, int64_t first_block, int64_t count, uint8_t* packed,
                        float* absmax, void* stream = nullptr);
void random_4bit_to_host(std::span<const Random4bitJob> jobs, int threads);
}  // namespace cpu
namespace cuda {
void random_4bit_blocks(const Random4bitArgs& args, int64_t first_block, int64_t count, uint8_t* packed,
                        float* absmax, void* stream);
void random_4bit_to_host(std::span<const Random4bitJob> jobs, int threads);
}  // namespace cuda
namespace quant {
// The twin of `on` (random_4bit_dispatch.cpp).
void random_4bit_blocks(Device on, const Random4bitArgs& args, int64_t first_block, int64_t count, uint8_t* packed,
                        float* absmax, void* stream);
}  // namespace quant

}  // namespace qshard
