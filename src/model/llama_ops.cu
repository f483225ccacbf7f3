// CUDA twins of llama_ops.h (activations bf16). Each kernel follows its CPU reference's formula
// with f32 arithmetic and rounds its output to bf16 once; tolerances against the CPU are declared
// in tests/model/op_harness_test.cpp. Everything is enqueued on ctx.compute(); nothing allocates.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <cmath>
#include <map>
#include <mutex>
#include <type_traits>
#include <tuple>
#include <vector>
#include <utility>

#include "model/llama_ops.h"
#include "runtime/cuda_check.h"

namespace qshard::cuda {
namespace {

using bf16 = __nv_bfloat16;

cudaStream_t st(DeviceContext& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }
const bf16* B16(const uint16_t* p) { return reinterpret_cast<const bf16*>(p); }
bf16* B16(uint16_t* p) { return reinterpret_cast<bf16*>(p); }

int grid_for(int64_t n, int block = 256) { return static_cast<int>(std::min<int64_t>((n + block - 1) / block, 65535 * 4)); }

#define QS_GRID_STRIDE(i, n)                                                                  \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float t = lane < warps ? part[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

__device__ float load_any(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case 0: return static_cast<const float*>(p)[i];
    case 1: return __bfloat162float(static_cast<const bf16*>(p)[i]);
    default: return __half2float(static_cast<const __half*>(p)[i]);
  }
}
int dtype_code(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kBF16: return 1;
    case DType::kF16: return 2;
    default: throw Error(std::string("CUDA op: unsupported dtype ") + dtype_torch_name(t));
  }
}

// ---- kernels ------------------------------------------------------------------------------------

// Ids are validated on the host where the data is read (token files, eval input): an id outside
// [0, V) that got here anyway reads as a zero row instead of memory out of bounds.
__global__ void embedding_kernel(bf16* out, const int64_t* ids, const void* w, int dt, int64_t N, int64_t C,
                                 int64_t V) {
  QS_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, id = ids[n];
    if (id < 0 || id >= V) {
      out[i] = __float2bfloat16_rn(0.0f);
      continue;
    }
    out[i] = __float2bfloat16_rn(load_any(w, dt, id * C + c));
  }
}

// The scaled embedding (Gemma's sqrt(hidden)): weight * scale in f32, rounded to the weight's dtype
// (transformers multiplies in the embedding's dtype; an f32 table is not rounded), then to bf16.
__global__ void embedding_scaled_kernel(bf16* out, const int64_t* ids, const void* w, int dt, int64_t N, int64_t C,
                                        int64_t V, float scale) {
  QS_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, id = ids[n];
    if (id < 0 || id >= V) {
      out[i] = __float2bfloat16_rn(0.0f);
      continue;
    }
    float v = load_any(w, dt, id * C + c) * scale;
    if (dt == 1) v = __bfloat162float(__float2bfloat16_rn(v));
    else if (dt == 2) v = __half2float(__float2half_rn(v));
    out[i] = __float2bfloat16_rn(v);
  }
}

// One row per block. The output (forward) / the incoming gradient (backward) may have a row stride
// larger than C (ld_out / ld_dout: the LoRA fold's wider buffers). The 8-wide variants (every row
// start 16-byte aligned, C a multiple of 8) move 16 bytes per access; both compute each element
// with the same f32 expression, the row sums in the same per-thread-then-block order for one
// variant (the two variants may differ in the last bit of the sum order).
__global__ void rmsnorm_fwd_kernel(bf16* out, float* rstd, const bf16* x, const float* w, int64_t C, int64_t ld_out,
                                   float eps) {
  const int64_t n = blockIdx.x;
  const bf16* xr = x + n * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = __bfloat162float(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[n] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    out[n * ld_out + c] = __float2bfloat16_rn(w[c] * (__bfloat162float(xr[c]) * r));
}

__global__ void rmsnorm_bwd_kernel(bf16* dx, const bf16* dout, const bf16* x, const float* w, const float* rstd,
                                   int64_t C, int64_t ld_dout) {
  const int64_t n = blockIdx.x;
  const float r = rstd[n];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dot += __bfloat162float(dout[n * ld_dout + c]) * w[c] * (__bfloat162float(x[n * C + c]) * r);
  dot = block_sum(dot);
  const float mean_dot = dot / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xh = __bfloat162float(x[n * C + c]) * r;
    const float g = __bfloat162float(dout[n * ld_dout + c]) * w[c];
    dx[n * C + c] = __float2bfloat16_rn(__bfloat162float(dx[n * C + c]) + r * (g - xh * mean_dot));
  }
}

struct alignas(16) Bf16x8 {
  bf16 v[8];
};

__global__ void rmsnorm_fwd_kernel_v8(bf16* out, float* rstd, const bf16* x, const float* w, int64_t C,
                                      int64_t ld_out, float eps) {
  const int64_t n = blockIdx.x;
  const Bf16x8* xr = reinterpret_cast<const Bf16x8*>(x + n * C);
  const int64_t C8 = C / 8;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C8; c += blockDim.x) {
    const Bf16x8 v = xr[c];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = __bfloat162float(v.v[j]);
      ss += f * f;
    }
  }
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[n] = r;
  Bf16x8* o = reinterpret_cast<Bf16x8*>(out + n * ld_out);
  for (int64_t c = threadIdx.x; c < C8; c += blockDim.x) {
    const Bf16x8 v = xr[c];
    Bf16x8 y;
#pragma unroll
    for (int j = 0; j < 8; ++j) y.v[j] = __float2bfloat16_rn(w[8 * c + j] * (__bfloat162float(v.v[j]) * r));
    o[c] = y;
  }
}

__global__ void rmsnorm_bwd_kernel_v8(bf16* dx, const bf16* dout, const bf16* x, const float* w, const float* rstd,
                                      int64_t C, int64_t ld_dout) {
  const int64_t n = blockIdx.x;
  const float r = rstd[n];
  const int64_t C8 = C / 8;
  const Bf16x8* xr = reinterpret_cast<const Bf16x8*>(x + n * C);
  const Bf16x8* gr = reinterpret_cast<const Bf16x8*>(dout + n * ld_dout);
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C8; c += blockDim.x) {
    const Bf16x8 xv = xr[c], gv = gr[c];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      dot += __bfloat162float(gv.v[j]) * w[8 * c + j] * (__bfloat162float(xv.v[j]) * r);
  }
  dot = block_sum(dot);
  const float mean_dot = dot / static_cast<float>(C);
  Bf16x8* d = reinterpret_cast<Bf16x8*>(dx + n * C);
  for (int64_t c = threadIdx.x; c < C8; c += blockDim.x) {
    const Bf16x8 xv = xr[c], gv = gr[c];
    Bf16x8 dv = d[c];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float xh = __bfloat162float(xv.v[j]) * r;
      const float g = __bfloat162float(gv.v[j]) * w[8 * c + j];
      dv.v[j] = __float2bfloat16_rn(__bfloat162float(dv.v[j]) + r * (g - xh * mean_dot));
    }
    d[c] = dv;
  }
}

// Register-resident 8-wide RMSNorm (C / 8 <= kNormThreads * VPT): each thread loads its VPT 16-byte
// vectors of the row (and, backward, of the incoming gradient) once, keeps them in registers for
// the row sum and the output, and reads the f32 weight as two float4. The v8 kernels above read
// the row twice; these move each byte once (the row sum's order differs from theirs in the last
// bit, as theirs differs from the scalar kernels').
constexpr int kNormThreads = 128;
constexpr int kNormMaxVpt = 8;  // C <= 8 * 128 * 8 = 8192

__device__ inline void load_w8(float (&w)[8], const float* wp, int64_t c8) {
  const float4 a = reinterpret_cast<const float4*>(wp)[2 * c8], b = reinterpret_cast<const float4*>(wp)[2 * c8 + 1];
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

template <int VPT>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_fwd_kernel_reg(bf16* out, float* rstd, const bf16* x,
                                                                       const float* w, int64_t C, int64_t ld_out,
                                                                       float eps) {
  const int64_t n = blockIdx.x, C8 = C / 8;
  const Bf16x8* xr = reinterpret_cast<const Bf16x8*>(x + n * C);
  Bf16x8 v[VPT];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c < C8) {
      v[i] = xr[c];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = __bfloat162float(v[i].v[j]);
        ss += f * f;
      }
    }
  }
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[n] = r;
  Bf16x8* o = reinterpret_cast<Bf16x8*>(out + n * ld_out);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c < C8) {
      float wv[8];
      load_w8(wv, w, c);
      Bf16x8 y;
#pragma unroll
      for (int j = 0; j < 8; ++j) y.v[j] = __float2bfloat16_rn(wv[j] * (__bfloat162float(v[i].v[j]) * r));
      o[c] = y;
    }
  }
}

template <int VPT>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_bwd_kernel_reg(bf16* dx, const bf16* dout, const bf16* x,
                                                                       const float* w, const float* rstd, int64_t C,
                                                                       int64_t ld_dout) {
  const int64_t n = blockIdx.x, C8 = C / 8;
  const float r = rstd[n];
  const Bf16x8* xr = reinterpret_cast<const Bf16x8*>(x + n * C);
  const Bf16x8* gr = reinterpret_cast<const Bf16x8*>(dout + n * ld_dout);
  Bf16x8 xv[VPT], gv[VPT];
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c < C8) {
      xv[i] = xr[c];
      gv[i] = gr[c];
      float wv[8];
      load_w8(wv, w, c);
#pragma unroll
      for (int j = 0; j < 8; ++j) dot += __bfloat162float(gv[i].v[j]) * wv[j] * (__bfloat162float(xv[i].v[j]) * r);
    }
  }
  dot = block_sum(dot);
  const float mean_dot = dot / static_cast<float>(C);
  Bf16x8* d = reinterpret_cast<Bf16x8*>(dx + n * C);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c < C8) {
      float wv[8];
      load_w8(wv, w, c);
      Bf16x8 dv = d[c];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float xh = __bfloat162float(xv[i].v[j]) * r;
        const float g = __bfloat162float(gv[i].v[j]) * wv[j];
        dv.v[j] = __float2bfloat16_rn(__bfloat162float(dv.v[j]) + r * (g - xh * mean_dot));
      }
      d[c] = dv;
    }
  }
}

// Vectors per thread of the register-resident kernels for a row of C (0: C too wide for them).
int norm_vpt(int64_t C) {
  const int64_t vpt = (C / 8 + kNormThreads - 1) / kNormThreads;
  return vpt <= kNormMaxVpt ? static_cast<int>(vpt) : 0;
}

// Runs f(std::integral_constant<int, V>{}) for V = vpt in 1 .. kNormMaxVpt.
template <class F>
void with_vpt(int vpt, F&& f) {
  switch (vpt) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// ---- element-wise ops: one per-element function, run by a scalar kernel or, when every pointer is
// 16-byte aligned and n a multiple of 8, by a kernel moving 8 bf16 (16 bytes) per load/store. Both
// give the same bits (the same function per element); the wide one is the common case (buffers
// come 256-byte aligned, widths are multiples of 8).

bool vec8_ok(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % 8 != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// out[i] = op(a[i], b[i]): the scalar kernel and the 8-wide one, one launcher choosing between them.
template <class Op>
__global__ void map2_kernel(bf16* out, const bf16* a, const bf16* b, int64_t n, Op op) {
  QS_GRID_STRIDE(i, n) out[i] = op(a[i], b[i]);
}

template <class Op>
__global__ void map2_kernel_v8(bf16* out, const bf16* a, const bf16* b, int64_t n8, Op op) {
  QS_GRID_STRIDE(i, n8) {
    const Bf16x8 x = reinterpret_cast<const Bf16x8*>(a)[i], y = reinterpret_cast<const Bf16x8*>(b)[i];
    Bf16x8 r;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = op(x.v[k], y.v[k]);
    reinterpret_cast<Bf16x8*>(out)[i] = r;
  }
}

struct AddOp {
  __device__ bf16 operator()(bf16 a, bf16 b) const {
    return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
  }
};

__global__ void add_bias_kernel(bf16* y, const float* bias, int64_t N, int64_t W) {
  QS_GRID_STRIDE(i, N * W) y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + bias[i % W]);
}

// dst[r, c] = bf16(scale * src[r, c]) (zeros without src), rows ld_dst / ld_src apart.
__global__ void copy_2d_kernel(bf16* dst, int64_t ld_dst, const bf16* src, int64_t ld_src, int64_t rows, int64_t cols,
                               float scale) {
  QS_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * ld_dst + c] = src ? __float2bfloat16_rn(scale * __bfloat162float(src[r * ld_src + c])) : __float2bfloat16_rn(0.0f);
  }
}

// copy_2d of whole 16-byte words (scale 1, columns and both strides multiples of 8, both bases
// 16-byte aligned): the row fold's [dy | ..] copy (LlamaModel::linear_bwd) of N x C elements,
// which the element kernel's 64-bit division per element held well under the copy rate.
__global__ void copy_2d_words_kernel(uint4* dst, int64_t ld_dst, const uint4* src, int64_t ld_src, int64_t rows,
                                     int64_t cols) {
  QS_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * ld_dst + c] = src[r * ld_src + c];
  }
}

// copy_2d_batch: blockIdx.y picks the block; the same element rule as copy_2d_kernel.
struct Copy2dBatchArgs {
  Copy2dBlock blocks[kCopy2dBatchMax];
};
__global__ void copy_2d_batch_kernel(Copy2dBatchArgs args) {
  const Copy2dBlock& b = args.blocks[blockIdx.y];
  bf16* dst = static_cast<bf16*>(b.dst);
  const bf16* src = static_cast<const bf16*>(b.src);
  const int64_t n = b.rows * b.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / b.cols, c = i - r * b.cols;
    dst[r * b.ld_dst + c] =
        src ? __float2bfloat16_rn(b.scale * __bfloat162float(src[r * b.ld_src + c])) : __float2bfloat16_rn(0.0f);
  }
}

__global__ void to_f32_kernel(float* out, const void* x, int dt, int64_t n, float offset) {
  QS_GRID_STRIDE(i, n) out[i] = load_any(x, dt, i) + offset;
}

// pos (packed data; null: none): token r = b*T + t is rotated by position pos[r], not t.
__global__ void rope_kernel(bf16* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
                            float sign, const int64_t* pos, int64_t ld) {
  const int64_t half = D / 2;
  QS_GRID_STRIDE(i, B * T * nh * half) {
    const int64_t k = i % half, row = i / half;  // row = (b*T + t)*nh + h
    const int64_t t = pos ? pos[row / nh] : (row / nh) % T;
    bf16* v = x + (row / nh) * ld + (row % nh) * D;
    const float c = cos[t * half + k], s = sign * sin[t * half + k];
    const float x1 = __bfloat162float(v[k]), x2 = __bfloat162float(v[k + half]);
    v[k] = __float2bfloat16_rn(x1 * c - x2 * s);
    v[k + half] = __float2bfloat16_rn(x2 * c + x1 * s);
  }
}

// The same rotation 8 pairs per thread (half % 8 == 0, x, cos and sin 16-byte aligned): one 16-byte
// load of each half of the head and two float4 of each table; the same f32 expression per element.
__global__ void rope_kernel_v8(bf16* x, const float* cos, const float* sin, int64_t T, int64_t nh, int64_t half,
                               int64_t n8, float sign, const int64_t* pos, int64_t ld) {
  const int64_t g8 = half / 8;
  QS_GRID_STRIDE(i, n8) {
    const int64_t k = (i % g8) * 8, row = i / g8;  // row = (b*T + t)*nh + h
    const int64_t t = pos ? pos[row / nh] : (row / nh) % T;
    bf16* head = x + (row / nh) * ld + (row % nh) * 2 * half;
    Bf16x8* p1 = reinterpret_cast<Bf16x8*>(head + k);
    Bf16x8* p2 = reinterpret_cast<Bf16x8*>(head + half + k);
    float c[8], s[8];
    load_w8(c, cos + t * half, k / 8);
    load_w8(s, sin + t * half, k / 8);
    const Bf16x8 a = *p1, b = *p2;
    Bf16x8 ya, yb;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float x1 = __bfloat162float(a.v[j]), x2 = __bfloat162float(b.v[j]), sj = sign * s[j];
      ya.v[j] = __float2bfloat16_rn(x1 * c[j] - x2 * sj);
      yb.v[j] = __float2bfloat16_rn(x2 * c[j] + x1 * sj);
    }
    *p1 = ya;
    *p2 = yb;
  }
}

// Cached attention (generation): block (t, h) of 4 warps; warp w takes keys w, w + 4, ...; each
// lane holds D/32 of the query's and the accumulator's elements. Per key: the score by a warp
// sum (times scale, then soft-capped with softcap > 0), then the online-softmax update (running
// max m, sum l, acc rescaled by exp(m_old - m)). The warps' (m, l, acc) are merged through shared
// memory.
constexpr int kCachedAttnWarps = 4;
constexpr int kCachedAttnMaxPer = 8;  // D / 32 <= 8: D <= 256
__global__ void attention_cached_fwd_kernel(bf16* out, const bf16* q, const bf16* kc, const bf16* vc, int64_t T,
                                            int64_t P, int H, int Hkv, int D, float scale, float softcap,
                                            int64_t window) {
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hk = h / (H / Hkv), per = (D + 31) / 32;  // lane's elements: d = lane + 32 j < D
  const int64_t keys = P + t + 1;
  // A sliding window: keys P + t - window < u <= P + t.
  const int64_t first = window > 0 && keys > window ? keys - window : 0;
  float qv[kCachedAttnMaxPer], acc[kCachedAttnMaxPer];
  const bf16* qt = q + (static_cast<int64_t>(t) * H + h) * D;
  for (int j = 0; j < per; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < D ? __bfloat162float(qt[d]) : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t u = first + warp; u < keys; u += kCachedAttnWarps) {
    const bf16* ku = kc + (u * Hkv + hk) * D;
    float dot = 0.0f;
    for (int j = 0; j < per; ++j)
      if (lane + 32 * j < D) dot += qv[j] * __bfloat162float(ku[lane + 32 * j]);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    float s = dot * scale;
    if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;  // the cpu twin's order: / cap, tanh, * cap
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
    const bf16* vu = vc + (u * Hkv + hk) * D;
    for (int j = 0; j < per; ++j)
      if (lane + 32 * j < D) acc[j] = acc[j] * corr + p * __bfloat162float(vu[lane + 32 * j]);
    m = m_new;
  }
  __shared__ float sm[kCachedAttnWarps], sl[kCachedAttnWarps], sacc[kCachedAttnWarps][256];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int j = 0; j < per; ++j)
    if (lane + 32 * j < D) sacc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kCachedAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.0f, f[kCachedAttnWarps];
  for (int w = 0; w < kCachedAttnWarps; ++w) {
    f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);  // a warp with no keys adds nothing
    L += sl[w] * f[w];
  }
  bf16* ot = out + (static_cast<int64_t>(t) * H + h) * D;
  for (int j = 0; j < per && lane + 32 * j < D; ++j) {
    float o = 0.0f;
    for (int w = 0; w < kCachedAttnWarps; ++w) o += sacc[w][lane + 32 * j] * f[w];
    ot[lane + 32 * j] = __float2bfloat16_rn(o / L);
  }
}

// The gated MLP's activation of a gate value (GatedAct, the cpu twin's formulas in f32).
constexpr float kGeluTanhC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluTanhK = 0.044715f;

template <GatedAct A>
__device__ __forceinline__ float gated_act(float g) {
  if constexpr (A == GatedAct::kSilu) return g / (1.0f + expf(-g));
  else return 0.5f * g * (1.0f + tanhf(kGeluTanhC * (g + kGeluTanhK * g * g * g)));
}

template <GatedAct A>
struct GatedOp {  // act(gate) * up
  __device__ bf16 operator()(bf16 gate, bf16 up) const {
    return __float2bfloat16_rn(gated_act<A>(__bfloat162float(gate)) * __bfloat162float(up));
  }
};

template <GatedAct A>
__device__ __forceinline__ void swiglu_bwd_one(bf16& dgate, bf16& dup, bf16 dh, bf16 gate, bf16 up) {
  const float g = __bfloat162float(gate), d = __bfloat162float(dh);
  if constexpr (A == GatedAct::kSilu) {
    const float sig = 1.0f / (1.0f + expf(-g));
    dup = __float2bfloat16_rn(d * g * sig);
    dgate = __float2bfloat16_rn(d * __bfloat162float(up) * sig * (1.0f + g * (1.0f - sig)));
  } else {
    // d gelu / dg = 0.5 (1 + th) + 0.5 g (1 - th^2) sqrt(2/pi) (1 + 3 k g^2)
    const float th = tanhf(kGeluTanhC * (g + kGeluTanhK * g * g * g));
    dup = __float2bfloat16_rn(d * (0.5f * g * (1.0f + th)));
    const float dgelu = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * kGeluTanhC * (1.0f + 3.0f * kGeluTanhK * g * g);
    dgate = __float2bfloat16_rn(d * __bfloat162float(up) * dgelu);
  }
}

template <GatedAct A>
__global__ void swiglu_bwd_kernel(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* up, int64_t n) {
  QS_GRID_STRIDE(i, n) swiglu_bwd_one<A>(dgate[i], dup[i], dh[i], gate[i], up[i]);
}

template <GatedAct A>
__global__ void swiglu_bwd_kernel_v8(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* up,
                                     int64_t n8) {
  QS_GRID_STRIDE(i, n8) {
    const Bf16x8 d = reinterpret_cast<const Bf16x8*>(dh)[i], g = reinterpret_cast<const Bf16x8*>(gate)[i],
                 u = reinterpret_cast<const Bf16x8*>(up)[i];
    Bf16x8 rg, ru;
#pragma unroll
    for (int k = 0; k < 8; ++k) swiglu_bwd_one<A>(rg.v[k], ru.v[k], d.v[k], g.v[k], u.v[k]);
    reinterpret_cast<Bf16x8*>(dgate)[i] = rg;
    reinterpret_cast<Bf16x8*>(dup)[i] = ru;
  }
}

__global__ void dropout_kernel(bf16* out, const bf16* x, DropoutKey key, int64_t N, int64_t W) {
  const float keep_scale = 1.0f / (1.0f - key.p);
  QS_GRID_STRIDE(i, N * W) {
    const int64_t n = i / W, c = i % W;
    const bool keep = dropout_keep(key, (key.row_offset + n) * W + c);
    out[i] = keep ? __float2bfloat16_rn(__bfloat162float(x[i]) * keep_scale) : __float2bfloat16_rn(0.0f);
  }
}

// One block per row. Pass 1 reads the row once: each thread keeps a running (max, sum of exp)
// pair over its elements (the sum rescaled when the max grows), the pairs merged over the block;
// log-sum-exp from the merged pair. The loss into *loss_sum (f64 atomics). Pass 2 reads the row
// again and writes the gradient (softmax - onehot) * grad_scale: over the logits in place (Out =
// float, dl == logits), or rounded once into dl in the GEMM's dtype (bf16 / f16): the bits the
// f32 gradient converted afterwards would have, without that pass over [rows, V] f32.
// softcap > 0: the logits are soft-capped ones (logit_softcap) and the gradient is the raw
// logits', times 1 - (y / softcap)^2 (y the given logit).
// Targets are validated on the host like ids; one outside [0, V) that got here is skipped.
__device__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2, s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

__device__ void add_to_max_sum(float& m, float& s, float x) {
  if (x > m) {
    s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

template <typename Out>
__device__ Out from_f32(float v);
template <>
__device__ float from_f32<float>(float v) { return v; }
template <>
__device__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// The gradient of logit x (target or not): (softmax - onehot) * grad_scale, through the soft-cap
// with softcap > 0; one expression for every output type and both passes (__fmul_rn: no FMA
// contraction, so the f32 and the rounded outputs come from the same f32 value).
__device__ __forceinline__ float ce_grad(float x, float lse, bool target, float grad_scale, float softcap) {
  float g = (expf(x - lse) - (target ? 1.0f : 0.0f)) * grad_scale;
  if (softcap > 0.0f) {
    const float th = x / softcap;
    g = __fmul_rn(g, 1.0f - __fmul_rn(th, th));
  }
  return g;
}

template <typename Out>
__global__ void cross_entropy_kernel(const float* logits, Out* dlogits, double* loss_sum, const int64_t* targets,
                                     int64_t V, float grad_scale, float softcap) {
  __shared__ float part_m[32], part_s[32];
  const int64_t row = blockIdx.x;
  const float* l = logits + row * V;
  Out* dl = dlogits + row * V;
  const int64_t y = targets[row];
  if (y == kIgnoreIndex) {
    if (grad_scale != 0.0f)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) dl[v] = from_f32<Out>(0.0f);
    return;
  }
  if (y < 0 || y >= V) return;
  float m = -INFINITY, s = 0.0f;
  const bool vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(l) & 15) == 0;
  if (vec) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    for (int64_t i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 x = l4[i];
      add_to_max_sum(m, s, x.x);
      add_to_max_sum(m, s, x.y);
      add_to_max_sum(m, s, x.z);
      add_to_max_sum(m, s, x.w);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) add_to_max_sum(m, s, l[v]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) part_m[warp] = m, part_s[warp] = s;
  __syncthreads();
  m = lane < warps ? part_m[lane] : -INFINITY;
  s = lane < warps ? part_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, m2, s2);
  }
  const float lse = m + logf(s);
  const float ly = l[y];
  // In place (dl == l): every thread read l[y] before any overwrites it.
  if (static_cast<const void*>(dl) == static_cast<const void*>(l)) __syncthreads();
  if (threadIdx.x == 0) atomicAdd(loss_sum, static_cast<double>(lse - ly));
  if (grad_scale == 0.0f) return;
  if (vec) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    for (int64_t i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 x = l4[i];
      const int64_t v = 4 * i;
      dl[v] = from_f32<Out>(ce_grad(x.x, lse, v == y, grad_scale, softcap));
      dl[v + 1] = from_f32<Out>(ce_grad(x.y, lse, v + 1 == y, grad_scale, softcap));
      dl[v + 2] = from_f32<Out>(ce_grad(x.z, lse, v + 2 == y, grad_scale, softcap));
      dl[v + 3] = from_f32<Out>(ce_grad(x.w, lse, v + 3 == y, grad_scale, softcap));
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      dl[v] = from_f32<Out>(ce_grad(l[v], lse, v == y, grad_scale, softcap));
  }
}

__global__ void convert_kernel(void* out, int out_dt, const void* x, int dt, int64_t n) {
  QS_GRID_STRIDE(i, n) {
    const float v = load_any(x, dt, i);
    switch (out_dt) {
      case 0: static_cast<float*>(out)[i] = v; break;
      case 1: static_cast<bf16*>(out)[i] = __float2bfloat16_rn(v); break;
      default: static_cast<__half*>(out)[i] = __float2half_rn(v); break;
    }
  }
}

__global__ void logit_softcap_kernel(float* x, int64_t n, float cap) {
  QS_GRID_STRIDE(i, n) x[i] = tanhf(x[i] / cap) * cap;
}

__global__ void round_kernel(float* x, int64_t n, int dt) {
  QS_GRID_STRIDE(i, n) x[i] = dt == 1 ? __bfloat162float(__float2bfloat16_rn(x[i])) : __half2float(__float2half_rn(x[i]));
}

// ---- cuBLASLt -----------------------------------------------------------------------------------

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, bool, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, uint64_t>;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<Key, Plan> plans;
  ~LtState() {
    for (auto& [k, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

LtState& lt(DeviceContext& ctx) {
  if (!ctx.gemm_handle()) prepare(ctx);
  return *static_cast<LtState*>(ctx.gemm_handle());
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: throw Error(std::string("gemm: unsupported dtype ") + dtype_torch_name(t));
  }
}

// Host -> device in a kernel: 4-byte words, then the tail bytes (src pinned host memory, mapped
// by unified addressing: each load a PCIe read, no copy engine).
__global__ void upload_kernel(uint8_t* dst, const uint8_t* src, int64_t words, int64_t bytes) {
  QS_GRID_STRIDE(i, words) reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
  QS_GRID_STRIDE(j, bytes - words * 4) dst[words * 4 + j] = src[words * 4 + j];
}

}  // namespace

void prepare(DeviceContext& ctx) {
  if (ctx.gemm_handle()) return;
  auto* s = new LtState();
  try {
    QS_CUBLAS_CHECK(cublasLtCreate(&s->handle));
    QS_CUDA_CHECK(cudaMalloc(&s->workspace, kLtWorkspaceBytes));
  } catch (...) {
    delete s;
    throw;
  }
  ctx.set_gemm_handle(s, [](void* p) { delete static_cast<LtState*>(p); });
}

// Row-major C[M,N] = alpha op(A) op(B) + beta C is column-major C^T[N,M] = alpha op(B)^T op(A)^T
// + beta C^T: cuBLASLt's "A" is our B, its "B" our A, each described as the column-major matrix
// its row-major storage is.
void gemm(void* C, const void* A, const void* B, const GemmShape& s, DeviceContext& ctx) {
  gemm_into(C, A, B, C, s, ctx);
}

// The largest power of two, at most 256, that divides p's address. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), and
// may choose an algorithm that needs it; operands that start inside a row (the fold's LoRA columns
// beside an activation, at `in + offset` elements) can be less aligned.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// C and D share one layout (plan->c); cuBLASLt reads C in the epilogue only when beta != 0, so a
// separate C costs nothing beyond its read.
void gemm_into(void* D, const void* A, const void* B, const void* C, const GemmShape& s, DeviceContext& ctx) {
  QS_CHECK(s.a_type == s.b_type, "gemm: A and B must have one dtype on CUDA");
  QS_CHECK(C || s.beta == 0.0f, "gemm: beta != 0 without C");
  if (!C) C = D;
  LtState& L = lt(ctx);
  const int64_t lda = s.lda_or_packed(), ldb = s.ldb_or_packed(), ldc = s.ldc_or_packed();
  QS_CHECK(lda >= (s.trans_a ? s.M : s.K) && ldb >= (s.trans_b ? s.K : s.N) && ldc >= s.N,
           "gemm: a leading dimension below its row");
  QS_CHECK(s.batch >= 1, "gemm: batch below 1");
  // cuBLASLt's A is our B, its B our A; C and D as they are (the plan is per alignment too)
  const uint32_t align[4] = {pointer_alignment(B), pointer_alignment(A), pointer_alignment(C), pointer_alignment(D)};
  const uint64_t aligns = uint64_t{align[0]} | uint64_t{align[1]} << 9 | uint64_t{align[2]} << 18 |
                          uint64_t{align[3]} << 27;  // 9 bits each (at most 256)
  const LtState::Key key{s.M,   s.N,   s.K,  s.trans_a, s.trans_b, static_cast<int>(s.a_type), static_cast<int>(s.c_type),
                         s.beta != 0.0f, lda, ldb, ldc, s.batch, s.batch > 1 ? s.stride_a : 0,
                         s.batch > 1 ? s.stride_b : 0, s.batch > 1 ? s.stride_c : 0, aligns};
  LtState::Plan* plan;
  {
    std::lock_guard<std::mutex> lock(L.mu);
    auto it = L.plans.find(key);
    if (it == L.plans.end()) {
      LtState::Plan p;
      QS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
      const cublasOperation_t tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
      QS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      QS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      const cudaDataType_t ab = cuda_type(s.a_type), ct = cuda_type(s.c_type);
      // Our B: row-major [K,N] = column-major N x K (ld ldb); with trans_b row-major [N,K] = col-major K x N.
      if (s.trans_b) QS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, s.K, s.N, ldb));
      else QS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, s.N, s.K, ldb));
      // Our A: row-major [M,K] = col-major K x M (ld lda); with trans_a row-major [K,M] = col-major M x K.
      if (s.trans_a) QS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, s.M, s.K, lda));
      else QS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, s.K, s.M, lda));
      QS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, ct, s.N, s.M, ldc));
      if (s.batch > 1) {  // strided batches (cuBLASLt's A = our B, its B = our A)
        const int32_t count = static_cast<int32_t>(s.batch);
        QS_CHECK(count == s.batch, "gemm: batch past int32");
        const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {{p.a, s.stride_b}, {p.b, s.stride_a}, {p.c, s.stride_c}};
        for (const auto& [layout, stride] : layouts) {
          QS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
          QS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof(stride)));
        }
      }
      cublasLtMatmulPreference_t pref;
      QS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      QS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &kLtWorkspaceBytes, sizeof(kLtWorkspaceBytes)));
      const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
      for (int i = 0; i < 4; ++i)
        QS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i])));
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      const cublasStatus_t hs =
          cublasLtMatmulAlgoGetHeuristic(L.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &heur, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      QS_CUBLAS_CHECK(hs);
      if (found == 0)
        throw Error("gemm: cuBLASLt has no algorithm for M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                    " K=" + std::to_string(s.K));
      p.algo = heur.algo;
      it = L.plans.emplace(key, p).first;
    }
    plan = &it->second;
  }
  const float alpha = s.alpha, beta = s.beta;
  QS_CUBLAS_CHECK(cublasLtMatmul(L.handle, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C, plan->c, D, plan->c,
                                 &plan->algo, L.workspace, kLtWorkspaceBytes, st(ctx)));
}

// ---- elementwise --------------------------------------------------------------------------------


// A bf16 table: rows copied 8 values (16 bytes) per access, the same bits as the scalar kernel's
// widening and rounding. The table may be pinned host memory (memory.embedding: host): the wide
// accesses keep the PCIe reads at 512 bytes a warp.
__global__ void embedding_kernel_v8(Bf16x8* out, const int64_t* ids, const Bf16x8* w, int64_t N, int64_t C8,
                                    int64_t V) {
  QS_GRID_STRIDE(i, N * C8) {
    const int64_t n = i / C8, c = i % C8, id = ids[n];
    if (id < 0 || id >= V) {
      Bf16x8 z;
#pragma unroll
      for (int k = 0; k < 8; ++k) z.v[k] = __float2bfloat16_rn(0.0f);
      out[i] = z;
      continue;
    }
    out[i] = w[id * C8 + c];
  }
}

void embedding_fwd(uint16_t* out, const int64_t* ids, const void* weight, DType weight_type, int64_t N, int64_t C,
                   int64_t V, DeviceContext& ctx, float scale) {
  if (N * C == 0) return;
  if (scale != 1.0f) {  // Gemma's scaled embedding: a plain kernel (one gather a step)
    embedding_scaled_kernel<<<grid_for(N * C), 256, 0, st(ctx)>>>(B16(out), ids, weight, dtype_code(weight_type), N, C,
                                                                  V, scale);
  } else if (weight_type == DType::kBF16 && vec8_ok(C, {out, weight})) {
    embedding_kernel_v8<<<grid_for(N * C / 8), 256, 0, st(ctx)>>>(reinterpret_cast<Bf16x8*>(out), ids,
                                                                   static_cast<const Bf16x8*>(weight), N, C / 8, V);
  } else {
    embedding_kernel<<<grid_for(N * C), 256, 0, st(ctx)>>>(B16(out), ids, weight, dtype_code(weight_type), N, C, V);
  }
  QS_CUDA_CHECK_LAUNCH();
}

void rmsnorm_fwd(uint16_t* out, float* rstd, const uint16_t* x, const float* weight, int64_t N, int64_t C, float eps,
                 DeviceContext& ctx, int64_t ld_out) {
  if (N == 0) return;
  if (ld_out == 0) ld_out = C;
  const int vpt = norm_vpt(C);
  if (C % 8 == 0 && ld_out % 8 == 0 && vpt > 0 && vec8_ok(8, {out, x, weight}))
    with_vpt(vpt, [&](auto v) {
      rmsnorm_fwd_kernel_reg<decltype(v)::value>
          <<<static_cast<unsigned>(N), kNormThreads, 0, st(ctx)>>>(B16(out), rstd, B16(x), weight, C, ld_out, eps);
    });
  else if (C % 8 == 0 && ld_out % 8 == 0 && vec8_ok(8, {out, x}))
    rmsnorm_fwd_kernel_v8<<<static_cast<unsigned>(N), 256, 0, st(ctx)>>>(B16(out), rstd, B16(x), weight, C, ld_out, eps);
  else
    rmsnorm_fwd_kernel<<<static_cast<unsigned>(N), 256, 0, st(ctx)>>>(B16(out), rstd, B16(x), weight, C, ld_out, eps);
  QS_CUDA_CHECK_LAUNCH();
}

void rmsnorm_bwd(uint16_t* dx, const uint16_t* dout, const uint16_t* x, const float* weight, const float* rstd,
                 int64_t N, int64_t C, DeviceContext& ctx, int64_t ld_dout) {
  if (N == 0) return;
  if (ld_dout == 0) ld_dout = C;
  const int vpt = norm_vpt(C);
  if (C % 8 == 0 && ld_dout % 8 == 0 && vpt > 0 && vec8_ok(8, {dx, dout, x, weight}))
    with_vpt(vpt, [&](auto v) {
      rmsnorm_bwd_kernel_reg<decltype(v)::value><<<static_cast<unsigned>(N), kNormThreads, 0, st(ctx)>>>(
          B16(dx), B16(dout), B16(x), weight, rstd, C, ld_dout);
    });
  else if (C % 8 == 0 && ld_dout % 8 == 0 && vec8_ok(8, {dx, dout, x}))
    rmsnorm_bwd_kernel_v8<<<static_cast<unsigned>(N), 256, 0, st(ctx)>>>(B16(dx), B16(dout), B16(x), weight, rstd, C,
                                                                        ld_dout);
  else
    rmsnorm_bwd_kernel<<<static_cast<unsigned>(N), 256, 0, st(ctx)>>>(B16(dx), B16(dout), B16(x), weight, rstd, C,
                                                                     ld_dout);
  QS_CUDA_CHECK_LAUNCH();
}

template <class Op>
void map2(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n, Op op, DeviceContext& ctx) {
  if (n == 0) return;
  if (vec8_ok(n, {out, a, b}))
    map2_kernel_v8<<<grid_for(n / 8), 256, 0, st(ctx)>>>(B16(out), B16(a), B16(b), n / 8, op);
  else
    map2_kernel<<<grid_for(n), 256, 0, st(ctx)>>>(B16(out), B16(a), B16(b), n, op);
  QS_CUDA_CHECK_LAUNCH();
}

void add(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n, DeviceContext& ctx) {
  map2(out, a, b, n, AddOp{}, ctx);
}

void accumulate(uint16_t* out, const uint16_t* b, int64_t n, DeviceContext& ctx) { add(out, out, b, n, ctx); }

void copy(uint16_t* out, const uint16_t* x, int64_t n, DeviceContext& ctx) {
  if (n == 0 || out == x) return;
  QS_CUDA_CHECK(cudaMemcpyAsync(out, x, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToDevice, st(ctx)));
}

void upload(void* dst, const void* src, size_t bytes, DeviceContext& ctx) {
  if (bytes == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(dst) % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0;
  const int64_t n = static_cast<int64_t>(bytes), words = aligned ? n / 4 : 0;
  upload_kernel<<<grid_for(std::max(words, n - words * 4)), 256, 0, st(ctx)>>>(
      static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), words, n);
  QS_CUDA_CHECK_LAUNCH();
}

void zero(uint16_t* x, int64_t n, DeviceContext& ctx) {
  if (n == 0) return;
  QS_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * 2, st(ctx)));
}

void add_bias(uint16_t* y, const float* bias, int64_t N, int64_t W, DeviceContext& ctx) {
  if (N * W == 0) return;
  add_bias_kernel<<<grid_for(N * W), 256, 0, st(ctx)>>>(B16(y), bias, N, W);
  QS_CUDA_CHECK_LAUNCH();
}

void copy_2d(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, float scale,
             DeviceContext& ctx) {
  if (rows * cols == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (src && scale == 1.0f && cols % 8 == 0 && ld_dst % 8 == 0 && ld_src % 8 == 0 && aligned(dst) && aligned(src)) {
    const int64_t words = rows * (cols / 8);
    copy_2d_words_kernel<<<grid_for(words), 256, 0, st(ctx)>>>(reinterpret_cast<uint4*>(dst), ld_dst / 8,
                                                                reinterpret_cast<const uint4*>(src), ld_src / 8, rows,
                                                                cols / 8);
  } else {
    copy_2d_kernel<<<grid_for(rows * cols), 256, 0, st(ctx)>>>(B16(dst), ld_dst, B16(src), ld_src, rows, cols, scale);
  }
  QS_CUDA_CHECK_LAUNCH();
}

void copy_2d_batch(const Copy2dBlock* blocks, int count, DeviceContext& ctx) {
  QS_CHECK(count >= 0 && count <= kCopy2dBatchMax, "copy_2d_batch: count out of range");
  Copy2dBatchArgs args{};
  int64_t most = 0;
  for (int i = 0; i < count; ++i) {
    args.blocks[i] = blocks[i];
    most = std::max(most, blocks[i].rows * blocks[i].cols);
  }
  if (count == 0 || most == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((most + 255) / 256, 1024)), static_cast<unsigned>(count));
  copy_2d_batch_kernel<<<grid, 256, 0, st(ctx)>>>(args);
  QS_CUDA_CHECK_LAUNCH();
}

void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx, float offset) {
  if (n == 0) return;
  to_f32_kernel<<<grid_for(n), 256, 0, st(ctx)>>>(out, x, dtype_code(type), n, offset);
  QS_CUDA_CHECK_LAUNCH();
}

void rope_tables(float* cos, float* sin, const RopeParams& p, int64_t T, DeviceContext& ctx) {
  DeviceContext host(Backend::kCpu, -1);
  const int64_t half = p.head_dim / 2;
  std::vector<float> c(static_cast<size_t>(T * half)), s(c.size());
  qshard::cpu::rope_tables(c.data(), s.data(), p, T, host);
  QS_CUDA_CHECK(cudaMemcpyAsync(cos, c.data(), c.size() * 4, cudaMemcpyHostToDevice, st(ctx)));
  QS_CUDA_CHECK(cudaMemcpyAsync(sin, s.data(), s.size() * 4, cudaMemcpyHostToDevice, st(ctx)));
  ctx.compute().synchronize();  // the host vectors go out of scope (a start-up op, not in a step)
}

// The 8-wide kernel when the head's halves, the rows and the tables allow it, else the scalar one.
static void rope_launch(bf16* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
                        float sign, const int64_t* pos, int64_t ld, DeviceContext& ctx) {
  const int64_t half = D / 2, n = B * T * nh * half, row = ld > 0 ? ld : nh * D;
  QS_CHECK(row >= nh * D, "rope: rows of heads closer than their width");
  if (half % 8 == 0 && row % 8 == 0 && vec8_ok(8, {x, cos, sin}))
    rope_kernel_v8<<<grid_for(n / 8), 256, 0, st(ctx)>>>(x, cos, sin, T, nh, half, n / 8, sign, pos, row);
  else
    rope_kernel<<<grid_for(n), 256, 0, st(ctx)>>>(x, cos, sin, B, T, nh, D, sign, pos, row);
}

void rope_fwd(uint16_t* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos, int64_t ld) {
  const int64_t n = B * T * nh * (D / 2);
  if (n == 0) return;
  rope_launch(B16(x), cos, sin, B, T, nh, D, 1.0f, pos, ld, ctx);
  QS_CUDA_CHECK_LAUNCH();
}

void rope_bwd(uint16_t* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos, int64_t ld) {
  const int64_t n = B * T * nh * (D / 2);
  if (n == 0) return;
  rope_launch(B16(dx), cos, sin, B, T, nh, D, -1.0f, pos, ld, ctx);
  QS_CUDA_CHECK_LAUNCH();
}

void attention_cached_fwd(uint16_t* out, const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                          int64_t T, int64_t P, int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx,
                          int64_t window, AttentionScores scores) {
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  QS_CHECK(D >= 1 && D <= 32 * kCachedAttnMaxPer, "attention_cached_fwd: head_dim must be at most 256");
  QS_CHECK(T <= 65535 && H <= 65535, "attention_cached_fwd: too many queries or heads for one launch");
  if (T == 0) return;
  attention_cached_fwd_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(H)), 32 * kCachedAttnWarps, 0,
                                st(ctx)>>>(B16(out), B16(q), B16(k_cache), B16(v_cache), T, P, static_cast<int>(H),
                                           static_cast<int>(Hkv), static_cast<int>(D), scores.scale_for(D),
                                           scores.softcap, window);
  QS_CUDA_CHECK_LAUNCH();
}

void swiglu_fwd(uint16_t* h, const uint16_t* gate, const uint16_t* up, int64_t n, DeviceContext& ctx, GatedAct act) {
  if (act == GatedAct::kSilu) map2(h, gate, up, n, GatedOp<GatedAct::kSilu>{}, ctx);
  else map2(h, gate, up, n, GatedOp<GatedAct::kGeluTanh>{}, ctx);
}

template <GatedAct A>
static void swiglu_bwd_launch(uint16_t* dgate, uint16_t* dup, const uint16_t* dh, const uint16_t* gate,
                              const uint16_t* up, int64_t n, DeviceContext& ctx) {
  if (vec8_ok(n, {dgate, dup, dh, gate, up}))
    swiglu_bwd_kernel_v8<A><<<grid_for(n / 8), 256, 0, st(ctx)>>>(B16(dgate), B16(dup), B16(dh), B16(gate), B16(up),
                                                                  n / 8);
  else
    swiglu_bwd_kernel<A><<<grid_for(n), 256, 0, st(ctx)>>>(B16(dgate), B16(dup), B16(dh), B16(gate), B16(up), n);
}

void swiglu_bwd(uint16_t* dgate, uint16_t* dup, const uint16_t* dh, const uint16_t* gate, const uint16_t* up,
                int64_t n, DeviceContext& ctx, GatedAct act) {
  if (n == 0) return;
  if (act == GatedAct::kSilu) swiglu_bwd_launch<GatedAct::kSilu>(dgate, dup, dh, gate, up, n, ctx);
  else swiglu_bwd_launch<GatedAct::kGeluTanh>(dgate, dup, dh, gate, up, n, ctx);
  QS_CUDA_CHECK_LAUNCH();
}

void dropout_fwd(uint16_t* out, const uint16_t* x, const DropoutKey& key, int64_t N, int64_t W, DeviceContext& ctx) {
  QS_CHECK(key.p >= 0.0f && key.p < 1.0f, "dropout probability must be in [0, 1)");
  if (key.p == 0.0f) {
    copy(out, x, N * W, ctx);
    return;
  }
  if (N * W == 0) return;
  dropout_kernel<<<grid_for(N * W), 256, 0, st(ctx)>>>(B16(out), B16(x), key, N, W);
  QS_CUDA_CHECK_LAUNCH();
}

void cross_entropy_fwd_bwd(float* logits, double* loss_sum, const int64_t* targets, int64_t n, int64_t V,
                           float grad_scale, DeviceContext& ctx, void* dlogits, DType dlogits_type, float softcap) {
  if (n == 0) return;
  const unsigned rows = static_cast<unsigned>(n);
  if (!dlogits || dlogits_type == DType::kF32) {
    float* out = dlogits ? static_cast<float*>(dlogits) : logits;
    cross_entropy_kernel<float><<<rows, 512, 0, st(ctx)>>>(logits, out, loss_sum, targets, V, grad_scale, softcap);
  } else if (dlogits_type == DType::kBF16) {
    cross_entropy_kernel<bf16><<<rows, 512, 0, st(ctx)>>>(logits, static_cast<bf16*>(dlogits), loss_sum, targets, V,
                                                          grad_scale, softcap);
  } else {
    QS_CHECK(dlogits_type == DType::kF16, "cross_entropy_fwd_bwd: the gradient's dtype must be f32, bf16 or f16");
    cross_entropy_kernel<__half><<<rows, 512, 0, st(ctx)>>>(logits, static_cast<__half*>(dlogits), loss_sum, targets,
                                                            V, grad_scale, softcap);
  }
  QS_CUDA_CHECK_LAUNCH();
}

void logit_softcap(float* x, int64_t n, float cap, DeviceContext& ctx) {
  QS_CHECK(cap > 0.0f, "logit_softcap: the cap must be positive");
  if (n == 0) return;
  logit_softcap_kernel<<<grid_for(n), 256, 0, st(ctx)>>>(x, n, cap);
  QS_CUDA_CHECK_LAUNCH();
}

void round_to_dtype(float* x, int64_t n, DType dtype, DeviceContext& ctx) {
  if (dtype == DType::kF32 || n == 0) return;
  round_kernel<<<grid_for(n), 256, 0, st(ctx)>>>(x, n, dtype_code(dtype));
  QS_CUDA_CHECK_LAUNCH();
}

void convert(void* out, DType out_type, const void* x, DType x_type, int64_t n, DeviceContext& ctx) {
  if (n == 0) return;
  convert_kernel<<<grid_for(n), 256, 0, st(ctx)>>>(out, dtype_code(out_type), x, dtype_code(x_type), n);
  QS_CUDA_CHECK_LAUNCH();
}

}  // namespace qshard::cuda
