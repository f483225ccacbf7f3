// CPU reference for blockwise.h: plain loops, float32 arithmetic as bitsandbytes' kernels do it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/blockwise.h"
#include "runtime/error.h"

namespace qshard {
namespace {
// max |x| over [begin, end), subnormals read as zero (bitsandbytes' flush-to-zero). A NaN never
// wins (as with fmax); written as a compare so that it inlines (std::fmax is a libm call).
float block_absmax(const float* x, int64_t begin, int64_t end) {
  float m = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float a = std::fabs(flush_subnormal(x[i]));
    m = a > m ? a : m;
  }
  return m;
}

// The 4-bit encoder for one quant type, chosen once per call rather than per element.
template <QuantType kType>
[[gnu::always_inline]] inline uint8_t encode_scaled(float x, float scale) {
  const float v = flush_subnormal(flush_subnormal(x) * scale);
  return kType == QuantType::kNf4 ? nf4_encode(v) : fp4_encode(v);
}

template <QuantType kType>
void quantize_4bit_blocks(const float* x, int64_t n, int64_t blocksize, uint8_t* packed, float* absmax) {
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  const uint8_t pad = zero_code(kType);
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * blocksize;  // even: blocksizes are powers of two >= 32
    const int64_t end = std::min(n, begin + blocksize);
    const float m = block_absmax(x, begin, end);
    absmax[b] = m;
    const float scale = 1.0f / m;  // inf for an all-zero block: 0 * inf = NaN -> code 0 (as CUDA)
    const int64_t pairs_end = begin + ((end - begin) & ~int64_t{1});
    for (int64_t i = begin; i < pairs_end; i += 2)
      packed[i / 2] = static_cast<uint8_t>((encode_scaled<kType>(x[i], scale) << 4) | encode_scaled<kType>(x[i + 1], scale));
    if (pairs_end < end) packed[pairs_end / 2] = static_cast<uint8_t>((encode_scaled<kType>(x[pairs_end], scale) << 4) | pad);
  }
}

// The f32 output of a (packed-layout) dequantization.
void dequantize_4bit_f32(const Dequant4bitArgs& a, float* out) {
  const int64_t nblocks = (a.n + a.blocksize - 1) / a.blocksize;
  if (a.absmax_q8) {
    std::vector<float> absmax(static_cast<size_t>(nblocks));
    cpu::decode_nested_absmax(a.absmax_q8, a.nested_absmax, a.nested_code, nblocks, a.nested_blocksize, a.offset,
                              absmax.data());
    cpu::dequantize_4bit_blocks(a.packed, absmax.data(), a.code, a.n, a.blocksize, out);
  } else {
    cpu::dequantize_4bit_blocks(a.packed, a.absmax, a.code, a.n, a.blocksize, out);
  }
}
}  // namespace

void cpu::quantize_4bit(const void* x, DType dtype, int64_t n, int64_t blocksize, QuantType type, uint8_t* packed,
                        float* absmax, void* stream) {
  (void)stream;
  const float* xf = static_cast<const float*>(x);
  std::vector<float> widened;  // bf16 / f16 input: widened to f32 first (exact)
  if (dtype != DType::kF32) {
    if (dtype != DType::kBF16 && dtype != DType::kF16)
      throw Error(std::string("cpu::quantize_4bit: unsupported input dtype ") + dtype_torch_name(dtype));
    const uint16_t* h = static_cast<const uint16_t*>(x);
    widened.resize(static_cast<size_t>(n));
    if (dtype == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) widened[i] = bf16_to_f32(h[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) widened[i] = f16_to_f32(h[i]);
    }
    xf = widened.data();
  }
  if (type == QuantType::kNf4) quantize_4bit_blocks<QuantType::kNf4>(xf, n, blocksize, packed, absmax);
  else quantize_4bit_blocks<QuantType::kFp4>(xf, n, blocksize, packed, absmax);
}

void cpu::dequantize_4bit_blocks(const uint8_t* packed, const float* absmax, const float* code, int64_t n,
                                 int64_t blocksize, float* out) {
  // Block by block, a byte (two values) at a time: no division per element. Blocks start at even
  // indices (blocksizes are even), so a byte never straddles two blocks.
  for (int64_t b = 0, begin = 0; begin < n; ++b, begin += blocksize) {
    const int64_t end = std::min(n, begin + blocksize);
    const float a = absmax[b];
    int64_t i = begin;
    for (; i + 1 < end; i += 2) {
      const uint8_t byte = packed[i / 2];
      out[i] = flush_subnormal(code[byte >> 4] * a);
      out[i + 1] = flush_subnormal(code[byte & 0x0f] * a);
    }
    if (i < end) out[i] = flush_subnormal(code[packed[i / 2] >> 4] * a);
  }
}

void cpu::quantize_8bit(const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q, float* absmax,
                        void* stream) {
  (void)stream;
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * blocksize;
    const int64_t end = std::min(n, begin + blocksize);
    const float m = block_absmax(x, begin, end);
    absmax[b] = m;
    const float scale = 1.0f / m;
    for (int64_t i = begin; i < end; ++i) q[i] = encode_8bit(code256, flush_subnormal(flush_subnormal(x[i]) * scale));
  }
}

void cpu::subtract_offset(float* x, int64_t n, float offset, void* stream) {
  (void)stream;
  for (int64_t i = 0; i < n; ++i) x[i] = flush_subnormal(x[i] - offset);
}

void cpu::decode_nested_absmax(const uint8_t* q, const float* nested_absmax, const float* code256, int64_t nblocks,
                               int64_t nested_blocksize, float offset, float* absmax) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float v = flush_subnormal(code256[q[b]] * nested_absmax[b / nested_blocksize]);
    absmax[b] = v + offset;  // bitsandbytes adds the offset in torch (no flush-to-zero)
  }
}

float cpu::absmax_mean(const float* absmax, int64_t nblocks) {
  double s = 0.0;
  for (int64_t b = 0; b < nblocks; ++b) s += absmax[b];
  return static_cast<float>(s / static_cast<double>(nblocks));
}

void cpu::dequantize_4bit(const Dequant4bitArgs& a, void* out, DType out_dtype, void* stream) {
  (void)stream;
  if (a.out_ld != 0 && a.out_ld != a.row_len) {  // rows into a wider buffer: packed, then placed
    QS_CHECK(a.row_len > 0 && a.n % a.row_len == 0 && a.out_ld >= a.row_len, "dequantize_4bit: bad row layout");
    Dequant4bitArgs packed = a;
    packed.row_len = packed.out_ld = 0;
    const size_t esz = dtype_size(out_dtype);
    std::vector<uint8_t> tmp(static_cast<size_t>(a.n) * esz);
    cpu::dequantize_4bit(packed, tmp.data(), out_dtype, stream);
    for (int64_t r = 0; r < a.n / a.row_len; ++r)
      std::memcpy(static_cast<uint8_t*>(out) + static_cast<size_t>(r * a.out_ld) * esz,
                  tmp.data() + static_cast<size_t>(r * a.row_len) * esz, static_cast<size_t>(a.row_len) * esz);
    return;
  }
  if (out_dtype == DType::kF32) {
    dequantize_4bit_f32(a, static_cast<float*>(out));
    return;
  }
  if (out_dtype != DType::kBF16 && out_dtype != DType::kF16)
    throw Error(std::string("cpu::dequantize_4bit: unsupported output dtype ") + dtype_torch_name(out_dtype));
  std::vector<float> f(static_cast<size_t>(a.n));
  dequantize_4bit_f32(a, f.data());
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < a.n; ++i) o[i] = out_dtype == DType::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
}

void cpu::dequantize_4bit_batch(const Dequant4bitArgs* args, void* const* outs, int count, DType out_dtype,
                                void* stream) {
  for (int i = 0; i < count; ++i) cpu::dequantize_4bit(args[i], outs[i], out_dtype, stream);
}

}  // namespace qshard
