// CPU reference for blockwise.h: plain loops, float32 arithmetic as bitsandbytes' kernels do it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/blockwise.h"
#include "runtime/error.h"

namespace qshard {
namespace {
// max |x| over [begin, end), subnormals read as zero (bitsandbytes' flush-to-zero).
float block_absmax(const float* x, int64_t begin, int64_t end) {
  float m = 0.0f;
  for (int64_t i = begin; i < end; ++i) m = std::fmax(m, std::fabs(flush_subnormal(x[i])));
  return m;
}
}  // namespace

void quantize_4bit_cpu(const float* x, int64_t n, int64_t blocksize, QuantType type, uint8_t* packed,
                       float* absmax) {
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  const uint8_t pad = zero_code(type);
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * blocksize;
    const int64_t end = std::min(n, begin + blocksize);
    const float m = block_absmax(x, begin, end);
    absmax[b] = m;
    const float scale = 1.0f / m;  // inf for an all-zero block: 0 * inf = NaN -> code 0 (as CUDA)
    auto scaled = [&](int64_t i) { return flush_subnormal(flush_subnormal(x[i]) * scale); };
    for (int64_t i = begin; i < end; i += 2) {
      const uint8_t hi = encode_4bit(type, scaled(i));
      const uint8_t lo = i + 1 < end ? encode_4bit(type, scaled(i + 1)) : pad;
      packed[i / 2] = static_cast<uint8_t>((hi << 4) | lo);
    }
  }
}

void dequantize_4bit_cpu(const uint8_t* packed, const float* absmax, const float* code, int64_t n,
                         int64_t blocksize, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t nib = (i % 2 == 0) ? (byte >> 4) : (byte & 0x0f);
    out[i] = flush_subnormal(code[nib] * absmax[i / blocksize]);
  }
}

void quantize_8bit_cpu(const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q,
                       float* absmax) {
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

void decode_nested_absmax_cpu(const uint8_t* q, const float* nested_absmax, const float* code256,
                              int64_t nblocks, int64_t nested_blocksize, float offset, float* absmax) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float v = flush_subnormal(code256[q[b]] * nested_absmax[b / nested_blocksize]);
    absmax[b] = v + offset;  // bitsandbytes adds the offset in torch (no flush-to-zero)
  }
}

float absmax_mean_cpu(const float* absmax, int64_t nblocks) {
  double s = 0.0;
  for (int64_t b = 0; b < nblocks; ++b) s += absmax[b];
  return static_cast<float>(s / static_cast<double>(nblocks));
}

void dequantize_4bit_args_cpu(const Dequant4bitArgs& a, float* out) {
  const int64_t nblocks = (a.n + a.blocksize - 1) / a.blocksize;
  if (a.absmax_q8) {
    std::vector<float> absmax(static_cast<size_t>(nblocks));
    decode_nested_absmax_cpu(a.absmax_q8, a.nested_absmax, a.nested_code, nblocks, a.nested_blocksize,
                             a.offset, absmax.data());
    dequantize_4bit_cpu(a.packed, absmax.data(), a.code, a.n, a.blocksize, out);
  } else {
    dequantize_4bit_cpu(a.packed, a.absmax, a.code, a.n, a.blocksize, out);
  }
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
    dequantize_4bit_args_cpu(a, static_cast<float*>(out));
    return;
  }
  if (out_dtype != DType::kBF16 && out_dtype != DType::kF16)
    throw Error(std::string("cpu::dequantize_4bit: unsupported output dtype ") + dtype_torch_name(out_dtype));
  std::vector<float> f(static_cast<size_t>(a.n));
  dequantize_4bit_args_cpu(a, f.data());
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < a.n; ++i) o[i] = out_dtype == DType::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
}

}  // namespace qshard
