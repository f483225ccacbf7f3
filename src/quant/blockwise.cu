// CUDA kernels for blockwise.h. Each mirrors its cpu:: twin operation for operation
// (same float32 multiplies and adds, no FMA contraction: this file is compiled with
// -fmad=false and uses __fmul_rn / __fadd_rn where the order matters).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "quant/blockwise.h"
#include "runtime/cuda_check.h"

namespace qshard {
namespace {

constexpr int kQuantThreads = 128;

template <class T>
__device__ __forceinline__ float load_f32(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load_f32<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load_f32<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
template <>
__device__ __forceinline__ float load_f32<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }

// Block-wide max of non-negative floats (NaN-ignoring, like fmaxf). blockDim.x == kQuantThreads.
__device__ float block_max(float v) {
  __shared__ float warp_max[kQuantThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = warp_max[0];
  for (int w = 1; w < kQuantThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  __syncthreads();
  return m;
}

// One CUDA block per quantization block. Thread t encodes pairs t, t + 128, ...
template <class T>
__global__ void quantize_4bit_kernel(const T* __restrict__ x, int64_t n, int64_t blocksize, QuantType type,
                                     uint8_t* __restrict__ packed, float* __restrict__ absmax) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * blocksize;
  const int64_t end = min(n, begin + blocksize);
  float m = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    m = fmaxf(m, fabsf(flush_subnormal(load_f32(x, i))));
  m = block_max(m);
  if (threadIdx.x == 0) absmax[blockIdx.x] = m;
  const float scale = __frcp_rn(m);  // 1.0f / m, correctly rounded (inf for m == 0)
  const uint8_t pad = zero_code(type);
  auto scaled = [&](int64_t i) { return flush_subnormal(__fmul_rn(flush_subnormal(load_f32(x, i)), scale)); };
  for (int64_t i = begin + 2 * threadIdx.x; i < end; i += 2 * blockDim.x) {
    const uint8_t hi = encode_4bit(type, scaled(i));
    const uint8_t lo = i + 1 < end ? encode_4bit(type, scaled(i + 1)) : pad;
    packed[i / 2] = static_cast<uint8_t>((hi << 4) | lo);
  }
}

__global__ void quantize_8bit_kernel(const float* __restrict__ x, int64_t n, int64_t blocksize,
                                     const float* __restrict__ code256, uint8_t* __restrict__ q,
                                     float* __restrict__ absmax) {
  __shared__ float code[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) code[i] = code256[i];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * blocksize;
  const int64_t end = min(n, begin + blocksize);
  float m = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) m = fmaxf(m, fabsf(flush_subnormal(x[i])));
  m = block_max(m);  // its __syncthreads also publishes `code`
  if (threadIdx.x == 0) absmax[blockIdx.x] = m;
  const float scale = __frcp_rn(m);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    q[i] = encode_8bit(code, flush_subnormal(__fmul_rn(flush_subnormal(x[i]), scale)));
}

__global__ void subtract_offset_kernel(float* x, int64_t n, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = flush_subnormal(__fsub_rn(x[i], offset));
}

// ---- dequantization -----------------------------------------------------------------------

struct DequantParams {
  const uint8_t* packed;
  int64_t n;
  int64_t blocksize;
  float code[16];
  const float* absmax;
  const uint8_t* absmax_q8;
  const float* nested_absmax;
  const float* nested_code;
  int64_t nested_blocksize;
  float offset;
  int blocksize_log2;         // blocksize is a power of two (validated)
  int nested_blocksize_log2;  // -1 when the nested blocksize is not a power of two
  int64_t row_len;            // output rows of row_len values out_ld apart; 0 = packed
  int64_t out_ld;
};

// Where element i of the packed tensor goes in the output.
__device__ __forceinline__ int64_t out_index(const DequantParams& p, int64_t i) {
  if (p.out_ld == 0) return i;
  const int64_t row = i / p.row_len;
  return row * p.out_ld + (i - row * p.row_len);
}

__device__ __forceinline__ float nested_absmax_value(const DequantParams& p, int64_t b, int64_t nested_block) {
  const float c = __ldg(p.nested_code + __ldg(p.absmax_q8 + b));
  const float v = flush_subnormal(__fmul_rn(c, __ldg(p.nested_absmax + nested_block)));
  return __fadd_rn(v, p.offset);  // bitsandbytes adds the offset in torch (no flush-to-zero)
}

__device__ __forceinline__ float block_absmax(const DequantParams& p, int64_t b) {
  if (p.absmax_q8 == nullptr) return __ldg(p.absmax + b);
  return nested_absmax_value(p, b, b / p.nested_blocksize);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Eight outputs of type T, stored with 16-byte vector stores.
template <class T>
struct alignas(16) Out8 {
  T v[8];
};

constexpr int kDequantThreads = 256;

// Several tensors dequantized by one launch (a decoder layer's projections, say): each tensor's
// vector part is cut into tiles, tile_begin[i] is the first global tile of tensor i.
constexpr int kMaxBatch = 8;
template <class T>
struct DequantBatch {
  DequantParams t[kMaxBatch];
  T* out[kMaxBatch];
  int64_t units[kMaxBatch];          // vector units (8 elements) of tensor i
  int64_t tile_begin[kMaxBatch + 1];
  int count;
};

// Vector path. A unit is 4 packed bytes = elements [8u, 8u + 8), all inside one quantization
// block (blocksize >= 32 is a multiple of 8). Each CTA works on tiles of kDequantThreads * UNITS
// consecutive units; thread t takes units t, t + 256, ... of the tile, so a warp's 4-byte loads
// and 16/32-byte stores are fully coalesced. Per tile:
//   1. every thread issues its UNITS packed loads, and the threads decode the tile's block
//      absmax values (nested: one uint8 code, one table lookup, one nested absmax each) into
//      shared memory, so the dependent statistics loads happen once per block, not per unit;
//   2. after one barrier, each thread expands its words through the 16-entry table and stores.
// A tile spans at most kTile / 4 blocks because blocksize >= 32.
template <class T, int UNITS>
__global__ void __launch_bounds__(kDequantThreads)
    dequantize_4bit_vec_kernel(const __grid_constant__ DequantBatch<T> batch) {
  constexpr int kTile = kDequantThreads * UNITS;
  __shared__ float code[16];
  __shared__ float scale_smem[kTile / 4];
  const int64_t total_tiles = batch.tile_begin[batch.count];
  for (int64_t g = blockIdx.x; g < total_tiles; g += gridDim.x) {
    int ti = 0;
    while (g >= batch.tile_begin[ti + 1]) ++ti;
    const DequantParams& p = batch.t[ti];
    const int64_t units = batch.units[ti];
    T* __restrict__ out = batch.out[ti];
    const uint32_t* packed4 = reinterpret_cast<const uint32_t*>(p.packed);
    const int unit_shift = p.blocksize_log2 - 3;  // unit index -> quantization block
    const int64_t first_unit = (g - batch.tile_begin[ti]) * kTile;
    const int64_t first_block = first_unit >> unit_shift;
    if (threadIdx.x < 16) code[threadIdx.x] = p.code[threadIdx.x];
    uint32_t word[UNITS];
#pragma unroll
    for (int k = 0; k < UNITS; ++k) {
      const int64_t u = first_unit + k * kDequantThreads + threadIdx.x;
      word[k] = u < units ? __ldg(packed4 + u) : 0u;
    }
    const int64_t last_unit = min(units, first_unit + kTile) - 1;
    const int tile_blocks = static_cast<int>((last_unit >> unit_shift) - first_block + 1);
    const bool nested = p.absmax_q8 != nullptr;
    for (int i = threadIdx.x; i < tile_blocks; i += kDequantThreads) {
      const int64_t b = first_block + i;
      scale_smem[i] = nested ? nested_absmax_value(p, b, b >> p.nested_blocksize_log2) : __ldg(p.absmax + b);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < UNITS; ++k) {
      const int64_t u = first_unit + k * kDequantThreads + threadIdx.x;
      if (u >= units) break;
      const float scale = scale_smem[(u >> unit_shift) - first_block];
      Out8<T> o;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (word[k] >> (8 * j)) & 0xffu;  // little-endian: byte j of the unit
        o.v[2 * j] = from_f32<T>(flush_subnormal(__fmul_rn(code[byte >> 4], scale)));
        o.v[2 * j + 1] = from_f32<T>(flush_subnormal(__fmul_rn(code[byte & 0x0f], scale)));
      }
      *reinterpret_cast<Out8<T>*>(out + out_index(p, 8 * u)) = o;
    }
    __syncthreads();  // code and scale_smem are rewritten by the next tile
  }
}

// Scalar path: elements [first, n), one per thread (tails and unaligned buffers).
template <class T>
__global__ void dequantize_4bit_scalar_kernel(DequantParams p, int64_t first, T* __restrict__ out) {
  for (int64_t i = first + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t byte = p.packed[i / 2];
    const uint8_t nib = (i & 1) ? (byte & 0x0f) : (byte >> 4);
    out[out_index(p, i)] = from_f32<T>(flush_subnormal(__fmul_rn(p.code[nib], block_absmax(p, i / p.blocksize))));
  }
}

int grid_for(int64_t work, int threads) {
  int64_t blocks = (work + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > (1LL << 30) ? (1LL << 30) : blocks));
}

int log2_exact(int64_t v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// Units per thread, measured in bench/dequant on an H200 (Llama-8B shapes, bf16 output): more
// units per thread keep more loads in flight per CTA; 8 was best or within 2% of best everywhere.
constexpr int kAutoUnitsPerThread = 8;

template <class T, int UNITS>
void launch_vec(DequantBatch<T>& b, cudaStream_t s) {
  constexpr int64_t kTile = kDequantThreads * UNITS;
  b.tile_begin[0] = 0;
  for (int i = 0; i < b.count; ++i) b.tile_begin[i + 1] = b.tile_begin[i] + (b.units[i] + kTile - 1) / kTile;
  const int64_t tiles = b.tile_begin[b.count];
  if (tiles == 0) return;
  const int grid = static_cast<int>(std::min<int64_t>(tiles, 1 << 30));
  dequantize_4bit_vec_kernel<T, UNITS><<<grid, kDequantThreads, 0, s>>>(b);
  QS_CUDA_CHECK_LAUNCH();
}

DequantParams to_params(const Dequant4bitArgs& a) {
  DequantParams p{};
  p.packed = a.packed;
  p.n = a.n;
  p.blocksize = a.blocksize;
  for (int i = 0; i < 16; ++i) p.code[i] = a.code[i];
  p.absmax = a.absmax;
  p.absmax_q8 = a.absmax_q8;
  p.nested_absmax = a.nested_absmax;
  p.nested_code = a.nested_code;
  p.nested_blocksize = a.nested_blocksize;
  p.offset = a.offset;
  p.blocksize_log2 = log2_exact(a.blocksize);
  p.nested_blocksize_log2 = log2_exact(a.nested_blocksize);
  const bool rows = a.out_ld != 0 && a.out_ld != a.row_len;
  if (rows && (a.row_len <= 0 || a.n % a.row_len != 0 || a.out_ld < a.row_len))
    throw Error("dequantize_4bit: bad row layout (n " + std::to_string(a.n) + ", row_len " + std::to_string(a.row_len) +
                ", out_ld " + std::to_string(a.out_ld) + ")");
  p.row_len = rows ? a.row_len : 0;
  p.out_ld = rows ? a.out_ld : 0;
  return p;
}

// Vector part of every tensor in launches of up to kMaxBatch tensors; tails (n % 8) and tensors
// the vector path cannot take (unaligned pointers) go through the scalar kernel.
template <class T>
void launch_dequant(const Dequant4bitArgs* args, void* const* outs, int count, cudaStream_t s) {
  DequantBatch<T> b{};
  int upt = kAutoUnitsPerThread;
  auto flush = [&] {
    if (b.count == 0) return;
    switch (upt) {
      case 1: launch_vec<T, 1>(b, s); break;
      case 2: launch_vec<T, 2>(b, s); break;
      case 4: launch_vec<T, 4>(b, s); break;
      case 8: launch_vec<T, 8>(b, s); break;
      default: launch_vec<T, 16>(b, s); break;
    }
    b.count = 0;
  };
  for (int i = 0; i < count; ++i) {
    const Dequant4bitArgs& a = args[i];
    if (a.n == 0) continue;
    if (a.units_per_thread > 0) upt = a.units_per_thread;
    T* out = static_cast<T*>(outs[i]);
    const DequantParams p = to_params(a);
    const bool aligned = (reinterpret_cast<uintptr_t>(p.packed) % 4 == 0) && (reinterpret_cast<uintptr_t>(out) % 16 == 0) &&
                         (p.out_ld == 0 || (p.row_len % 8 == 0 && p.out_ld % 8 == 0));  // 8-element units stay in a row
    const bool shifts = p.blocksize_log2 >= 5 && (p.absmax_q8 == nullptr || p.nested_blocksize_log2 >= 0);
    int64_t first = 0;
    if (aligned && shifts && p.n >= 8) {
      if (b.count == kMaxBatch) flush();
      b.t[b.count] = p;
      b.out[b.count] = out;
      b.units[b.count] = p.n / 8;
      ++b.count;
      first = (p.n / 8) * 8;
    }
    if (first < p.n) {
      dequantize_4bit_scalar_kernel<T><<<grid_for(p.n - first, 256), 256, 0, s>>>(p, first, out);
      QS_CUDA_CHECK_LAUNCH();
    }
  }
  flush();
}

}  // namespace

void cuda::quantize_4bit(const void* x, DType dtype, int64_t n, int64_t blocksize, QuantType type, uint8_t* packed,
                         float* absmax, void* stream) {
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  if (nblocks == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kF32:
      quantize_4bit_kernel<<<nblocks, kQuantThreads, 0, s>>>(static_cast<const float*>(x), n, blocksize, type, packed, absmax);
      break;
    case DType::kBF16:
      quantize_4bit_kernel<<<nblocks, kQuantThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), n, blocksize, type,
                                                             packed, absmax);
      break;
    case DType::kF16:
      quantize_4bit_kernel<<<nblocks, kQuantThreads, 0, s>>>(static_cast<const __half*>(x), n, blocksize, type, packed,
                                                             absmax);
      break;
    default:
      throw Error(std::string("cuda::quantize_4bit: unsupported input dtype ") + dtype_torch_name(dtype));
  }
  QS_CUDA_CHECK_LAUNCH();
}

void cuda::quantize_8bit(const float* x, int64_t n, int64_t blocksize, const float* code256, uint8_t* q, float* absmax,
                         void* stream) {
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  if (nblocks == 0) return;
  quantize_8bit_kernel<<<nblocks, kQuantThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, blocksize, code256, q,
                                                                                          absmax);
  QS_CUDA_CHECK_LAUNCH();
}

void cuda::subtract_offset(float* x, int64_t n, float offset, void* stream) {
  if (n == 0) return;
  subtract_offset_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, n, offset);
  QS_CUDA_CHECK_LAUNCH();
}

void cuda::dequantize_4bit_batch(const Dequant4bitArgs* args, void* const* outs, int count, DType out_dtype,
                                 void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (out_dtype) {
    case DType::kF32: launch_dequant<float>(args, outs, count, s); break;
    case DType::kBF16: launch_dequant<__nv_bfloat16>(args, outs, count, s); break;
    case DType::kF16: launch_dequant<__half>(args, outs, count, s); break;
    default: throw Error(std::string("cuda::dequantize_4bit: unsupported output dtype ") + dtype_torch_name(out_dtype));
  }
}

void cuda::dequantize_4bit(const Dequant4bitArgs& a, void* out, DType out_dtype, void* stream) {
  cuda::dequantize_4bit_batch(&a, &out, 1, out_dtype, stream);
}

}  // namespace qshard
