// random_4bit.h: the direct draw of a quantized normal tensor, block by block (the per-block
// arithmetic in random_4bit_block.h, shared with random_4bit.cu), and the batch draw on the CPU.
#include "quant/random_4bit.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <vector>

#include "quant/random_4bit_block.h"
#include "runtime/error.h"
#include "runtime/parallel.h"

namespace qshard {
namespace {

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

// ---- the Phi table (random_4bit_block.h) -------------------------------------------------------

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); }

// Phi(s b_k) for the 15 boundaries b_k of one quant type, and Q(s) = Phi(-s), with their
// derivatives per table step, at s = r / 64 for r in [0, 640]. The interpolation error is
// <= h^4 / 384 * max|d^4/ds^4 Phi(s b)| < 1e-10 (h = 1/64, |b| <= 1), below the 2^-32 the
// thresholds are kept to. Built with libm on the host; the GPU receives these doubles.
std::vector<double> phi_table(const CodeIntervals& iv) {
  double b[16];
  for (int k = 0; k < 15; ++k) b[k] = iv.bound[k];
  b[15] = -1.0;  // Phi(-s) = Q(s)
  std::vector<double> t(static_cast<size_t>(kPhiTableDoubles));
  for (int r = 0; r <= kPhiRows; ++r) {
    const double s = static_cast<double>(r) / kPhiPerUnit;
    for (int k = 0; k < 16; ++k) {
      t[static_cast<size_t>((r * 16 + k) * 2)] = normal_cdf(s * b[k]);
      t[static_cast<size_t>((r * 16 + k) * 2 + 1)] = b[k] * normal_pdf(s * b[k]) / kPhiPerUnit;  // per table step
    }
  }
  return t;
}

const double* phi_table(QuantType t) {
  static const std::vector<double> nf4 = phi_table(code_intervals(QuantType::kNf4)),
                                   fp4 = phi_table(code_intervals(QuantType::kFp4));
  return (t == QuantType::kNf4 ? nf4 : fp4).data();
}

}  // namespace

const CodeIntervals& code_intervals(QuantType t) {
  static const CodeIntervals nf4 = read_intervals(QuantType::kNf4), fp4 = read_intervals(QuantType::kFp4);
  return t == QuantType::kNf4 ? nf4 : fp4;
}

Random4bitArgs random_4bit_args(const Shape& shape, DType dtype, QuantType type, int64_t blocksize, double std,
                                uint64_t key) {
  validate_blocksize(blocksize);
  if (!dtype_is_float(dtype))
    throw InputError(std::string("random_4bit: dtype ") + dtype_torch_name(dtype) + " is not float32, bfloat16 or float16");
  const int64_t n = shape_numel(shape);
  if (n <= 0) throw InputError("random_4bit: shape " + shape_str(shape) + " has no elements");
  if (!(std >= 1e-6 && std <= 1e3)) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", std);
    throw InputError(std::string("random_4bit: std ") + text + ": expected a standard deviation in [1e-6, 1e3]");
  }
  Random4bitArgs a;
  a.table = phi_table(type);
  a.std = std;
  a.n = n;
  a.blocksize = blocksize;
  a.key = r4::mix64(key ^ 0x5eed4b17c0de5eedull);  // its own stream: not random_normal's words for the same key
  const CodeIntervals& iv = code_intervals(type);
  for (int k = 0; k < 16; ++k) a.codes |= static_cast<uint64_t>(iv.code[k]) << (4 * k);
  a.pad = zero_code(type);
  a.type = type;
  a.dtype = dtype;
  return a;
}

namespace cpu {
void random_4bit_blocks(const Random4bitArgs& a, int64_t first_block, int64_t count, uint8_t* packed, float* absmax,
                        void* /*stream*/) {
  const int64_t half = a.blocksize / 2;  // bytes per full block (blocksizes are even)
  for (int64_t i = 0; i < count; ++i) {
    const int64_t b = first_block + i;
    Random4bitBlock d;
    r4::draw_block(a, b, d);
    absmax[i] = d.absmax;
    const uint64_t ctr = r4::block_counter(a, b);
    uint8_t* out = packed + i * half;
    const int64_t bytes = (d.len + 1) / 2;
    for (int64_t j = 0; j < bytes; ++j) out[j] = r4::block_byte(a, d, ctr, j);
  }
}

void random_4bit_to_host(std::span<const Random4bitJob> jobs, int threads) {
  parallel_for(jobs.size(), threads, [&](size_t i) {
    const Random4bitJob& j = jobs[i];
    *j.out = random_4bit(j.shape, j.dtype, j.options, j.std, j.key, 1);
  });
}
}  // namespace cpu

Params4bit random_4bit(const Shape& shape, DType dtype, const QuantizeOptions& o, double std, uint64_t key,
                       int threads) {
  const Random4bitArgs a = random_4bit_args(shape, dtype, o.quant_type, o.blocksize, std, key);
  const int64_t n = a.n, nb = (n + o.blocksize - 1) / o.blocksize;
  Tensor packed = Tensor::empty({(n + 1) / 2, 1}, DType::kU8);
  Tensor absmax = Tensor::empty({nb}, DType::kF32);
  uint8_t* pk = packed.data<uint8_t>();
  float* am = absmax.data<float>();
  const int64_t per_chunk = std::max<int64_t>(1, (int64_t{1} << 20) / o.blocksize);
  const int64_t chunks = (nb + per_chunk - 1) / per_chunk;
  parallel_for(static_cast<size_t>(chunks), threads, [&](size_t c) {
    const int64_t first = static_cast<int64_t>(c) * per_chunk, count = std::min(nb, first + per_chunk) - first;
    cpu::random_4bit_blocks(a, first, count, pk + first * (o.blocksize / 2), am + first);
  });
  return params4bit_from_blocks(std::move(packed), std::move(absmax), shape, dtype, o);
}

Params4bit random_4bit(const Shape& shape, DType dtype, const QuantizeOptions& o, double std, uint64_t key,
                       Device draw_on, void* stream) {
  if (draw_on == Device::kCpu) return random_4bit(shape, dtype, o, std, key, 1);
  const Random4bitArgs a = random_4bit_args(shape, dtype, o.quant_type, o.blocksize, std, key);
  const int64_t n = a.n, nb = (n + o.blocksize - 1) / o.blocksize;
  Tensor packed = Tensor::empty({(n + 1) / 2, 1}, DType::kU8, draw_on);
  Tensor absmax = Tensor::empty({nb}, DType::kF32, draw_on);
  // Returns when written (the twin waits for `stream`), so params4bit_from_blocks's kernels, on the
  // default stream, see the absmax.
  quant::random_4bit_blocks(draw_on, a, 0, nb, packed.data<uint8_t>(), absmax.data<float>(), stream);
  return params4bit_from_blocks(std::move(packed), std::move(absmax), shape, dtype, o);
}

}  // namespace qshard
