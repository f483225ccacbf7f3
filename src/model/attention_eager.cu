// CUDA attention with its scores in memory (the "eager" attention of transformers), for the
// scores cuDNN's fused kernels do not take: Gemma 2's soft-capped scores (attn_logit_softcapping).
// Same contract as attention_fwd / attention_bwd (llama_ops.h): q [B,T,H,D], k / v [B,T,Hkv,D]
// bf16 rows, query head h reads kv head h / (H / Hkv), causal, the sliding window and packed
// pieces as first_key(); the saved state is the rows' log-sum-exp, f32 [B,H,T].
//
// Per sequence b, per chunk of `rows` query positions [t0, t1) (eager_attention_layout), per query
// head g of each kv group, the keys [k0, t1) the chunk can see (k0: the chunk's first key):
//   forward   S = Q K^T (f32, batched over the kv heads: head kvh*G + g reads kv head kvh)
//             P = softmax(cap(S * scale)) over the row's keys (a kernel; lse kept), bf16
//             O = P V
//   backward  S again, P from the kept lse; dV += P^T dO and dK += dS^T Q in f32 buffers of the
//             sequence; dP = dO V^T; dS = P (dP - rowsum(dO . O)) (1 - tanh^2) scale (a kernel),
//             bf16; dQ = dS K straight into dq (each row and head written once); then dK, dV
//             rounded to bf16.
// Every product is a cuBLASLt GEMM (ops::gemm, strided batches), every sum in a fixed order:
// the gradients are bitwise repeatable. The workspace (eager_attention_workspace_bytes) is the
// caller's, allocated before the step.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "model/llama_ops.h"
#include "runtime/cuda_check.h"

namespace qshard::cuda {
namespace {

constexpr int kThreads = 256;

cudaStream_t stream_of(DeviceContext& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The f32 sum of v over the block (every thread gets it); `red` holds kThreads / 32 floats.
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < kThreads / 32 ? red[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

__device__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < kThreads / 32 ? red[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

// The score as the CPU twin computes it from the dot product: * scale, then cap * tanh(s / cap).
__device__ __forceinline__ float capped(float dot, float scale, float cap) {
  const float s = dot * scale;
  return cap > 0.0f ? tanhf(s / cap) * cap : s;
}

// One chunk of query rows [t0, t0 + rows) and the keys [k0, k0 + keys) it sees, in S's rows of ld
// floats.
struct ChunkRows {
  int64_t T, H, G, t0, rows, k0, keys, ld;
  int64_t window;
  const int64_t* pos;  // this sequence's packed positions [T], or null
  float scale, cap;
};

// The chunk from query row t0 of a sequence (pos: its packed positions, or null).
ChunkRows chunk_at(const EagerAttentionLayout& l, int64_t H, int64_t t0, int64_t window, const int64_t* pos,
                   AttentionScores scores) {
  const int64_t rows = std::min(l.rows, l.T - t0);
  const int64_t k0 = window > 0 ? std::max<int64_t>(0, t0 - window + 1) : 0, keys = t0 + rows - k0;
  return ChunkRows{l.T,  H,      H / l.Hkv, t0,  rows, k0, keys, round_up(keys, 8), window, pos, scores.scale_for(l.D),
                   scores.softcap > 0.0f ? scores.softcap : 0.0f};
}

// The first key query position t sees (llama_ops_cpu.cpp's first_key).
__device__ __forceinline__ int64_t first_key(const ChunkRows& c, int64_t t) {
  int64_t f = c.window > 0 ? max(int64_t{0}, t - c.window + 1) : 0;
  if (c.pos) f = max(f, t - c.pos[t]);
  return f;
}

// One block per row r = kvh * rows + i of S [Hkv, rows, ld]: P = softmax over the row's keys
// (0 elsewhere), bf16, into p; with `lse` null the forward writes the row's log-sum-exp to
// stats[(head) * T + t] (this sequence's [H, T]); else P = exp(score - lse) with the kept one.
__global__ void eager_softmax_kernel(__nv_bfloat16* p, float* stats, const float* S, ChunkRows c, bool from_stats) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x, kvh = r / c.rows, i = r % c.rows, t = c.t0 + i;
  const int64_t head = kvh * c.G;  // + g: the caller's offset of stats
  const float* s = S + r * c.ld;
  __nv_bfloat16* pr = p + r * c.ld;
  const int64_t lo = first_key(c, t) - c.k0, hi = t - c.k0;  // the row's keys, inclusive, in S's columns
  float* lse_at = stats + head * c.T + t;
  float lse;
  if (from_stats) {
    lse = *lse_at;
  } else {
    float m = -INFINITY;
    for (int64_t j = lo + threadIdx.x; j <= hi; j += kThreads) m = fmaxf(m, capped(s[j], c.scale, c.cap));
    m = block_max(m, red);
    float sum = 0.0f;
    for (int64_t j = lo + threadIdx.x; j <= hi; j += kThreads) sum += __expf(capped(s[j], c.scale, c.cap) - m);
    sum = block_sum(sum, red);
    lse = m + __logf(sum);
    if (threadIdx.x == 0) *lse_at = lse;
  }
  for (int64_t j = threadIdx.x; j < c.keys; j += kThreads) {
    const float v = (j >= lo && j <= hi) ? __expf(capped(s[j], c.scale, c.cap) - lse) : 0.0f;
    pr[j] = __float2bfloat16_rn(v);
  }
}

// One block per row: dS = P (dP - sum_d dO . O) (1 - tanh^2) scale, bf16 into ds (P from the kept
// lse and the scores S; 0 outside the row's keys). dout / out: this sequence's [T, H, D] rows.
__global__ void eager_softmax_bwd_kernel(__nv_bfloat16* ds, const float* S, const float* dP, const float* stats,
                                         const __nv_bfloat16* dout, const __nv_bfloat16* out, int64_t D, int64_t g,
                                         ChunkRows c) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x, kvh = r / c.rows, i = r % c.rows, t = c.t0 + i;
  const int64_t head = kvh * c.G + g;
  const __nv_bfloat16* go = dout + (t * c.H + head) * D;
  const __nv_bfloat16* o = out + (t * c.H + head) * D;
  float dot = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) dot += __bfloat162float(go[d]) * __bfloat162float(o[d]);
  dot = block_sum(dot, red);
  const float lse = stats[head * c.T + t];
  const float* s = S + r * c.ld;
  const float* dp = dP + r * c.ld;
  __nv_bfloat16* out_ds = ds + r * c.ld;
  const int64_t lo = first_key(c, t) - c.k0, hi = t - c.k0;
  for (int64_t j = threadIdx.x; j < c.keys; j += kThreads) {
    float v = 0.0f;
    if (j >= lo && j <= hi) {
      const float x = s[j] * c.scale;
      float y = x, dcap = 1.0f;
      if (c.cap > 0.0f) {
        const float th = tanhf(x / c.cap);
        y = th * c.cap;
        dcap = 1.0f - th * th;
      }
      const float pj = __expf(y - lse);
      v = pj * (dp[j] - dot) * dcap * c.scale;
    }
    out_ds[j] = __float2bfloat16_rn(v);
  }
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

// The chunk's three kinds of batched GEMM (bf16 operands; batch: the kv heads, query head
// kvh * G + g reading kv head kvh), with `rows` query rows, `keys` keys and S-like buffers of row
// stride ld:
// [rows, keys] f32 = a query-like operand ([T, H, D] rows) times a key-like one^T ([T, Hkv, D]):
// S = Q K^T, dP = dO V^T.
GemmShape rows_by_keys(int64_t rows, int64_t keys, int64_t ld, int64_t H, int64_t Hkv, int64_t D) {
  GemmShape s{rows, keys, D, false, true};
  s.a_type = s.b_type = DType::kBF16;
  s.c_type = DType::kF32;
  s.batch = Hkv;
  s.lda = H * D, s.stride_a = (H / Hkv) * D;
  s.ldb = Hkv * D, s.stride_b = D;
  s.ldc = ld, s.stride_c = rows * ld;
  return s;
}
// [rows, D] bf16 into query-like rows = an S-like buffer times a key-like operand: O = P V, dQ = dS K.
GemmShape rows_by_dim(int64_t rows, int64_t keys, int64_t ld, int64_t H, int64_t Hkv, int64_t D) {
  GemmShape s{rows, D, keys, false, false};
  s.a_type = s.b_type = s.c_type = DType::kBF16;
  s.batch = Hkv;
  s.lda = ld, s.stride_a = rows * ld;
  s.ldb = Hkv * D, s.stride_b = D;
  s.ldc = H * D, s.stride_c = (H / Hkv) * D;
  return s;
}
// [keys, D] f32 += an S-like buffer^T times a query-like operand: dV += P^T dO, dK += dS^T Q.
GemmShape keys_by_dim(int64_t rows, int64_t keys, int64_t ld, int64_t H, int64_t Hkv, int64_t D) {
  GemmShape s{keys, D, rows, true, false, 1.0f, 1.0f};
  s.a_type = s.b_type = DType::kBF16;
  s.c_type = DType::kF32;
  s.batch = Hkv;
  s.lda = ld, s.stride_a = rows * ld;
  s.ldb = H * D, s.stride_b = (H / Hkv) * D;
  s.ldc = Hkv * D, s.stride_c = D;
  return s;
}

}  // namespace

void eager_attention_fwd(uint16_t* out_, void* saved, const uint16_t* q_, const uint16_t* k_, const uint16_t* v_,
                         int64_t B, int64_t H, DeviceContext& ctx, int64_t window, const int64_t* pos,
                         AttentionScores scores, const EagerAttentionLayout& l, void* workspace) {
  const int64_t T = l.T, Hkv = l.Hkv, D = l.D;
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "eager attention: H must be a multiple of Hkv");
  auto* out = reinterpret_cast<__nv_bfloat16*>(out_);
  const auto* q = reinterpret_cast<const __nv_bfloat16*>(q_);
  const auto* k = reinterpret_cast<const __nv_bfloat16*>(k_);
  const auto* v = reinterpret_cast<const __nv_bfloat16*>(v_);
  const int64_t G = H / Hkv;
  char* ws = static_cast<char*>(workspace);
  auto* S = reinterpret_cast<float*>(ws);
  auto* P = reinterpret_cast<__nv_bfloat16*>(ws + 2 * l.scores_bytes);
  const cudaStream_t st = stream_of(ctx);
  for (int64_t b = 0; b < B; ++b) {
    const __nv_bfloat16* qb = q + b * T * H * D;
    const __nv_bfloat16* kb = k + b * T * Hkv * D;
    const __nv_bfloat16* vb = v + b * T * Hkv * D;
    float* stats = static_cast<float*>(saved) + b * H * T;
    for (int64_t t0 = 0; t0 < T; t0 += l.rows) {
      const ChunkRows c = chunk_at(l, H, t0, window, pos ? pos + b * T : nullptr, scores);
      const int64_t rows = c.rows, k0 = c.k0, keys = c.keys, ld = c.ld;
      for (int64_t g = 0; g < G; ++g) {
        // S[kvh] = Q_(kvh G + g) K_kvh^T over the chunk's rows and keys; P; O_(kvh G + g) = P[kvh] V_kvh
        gemm(S, qb + (t0 * H + g) * D, kb + k0 * Hkv * D, rows_by_keys(rows, keys, ld, H, Hkv, D), ctx);
        eager_softmax_kernel<<<static_cast<unsigned>(Hkv * rows), kThreads, 0, st>>>(P, stats + g * T, S, c, false);
        QS_CUDA_CHECK(cudaGetLastError());
        gemm(out + (b * T * H + t0 * H + g) * D, P, vb + k0 * Hkv * D, rows_by_dim(rows, keys, ld, H, Hkv, D), ctx);
      }
    }
  }
}

void eager_attention_bwd(uint16_t* dq_, uint16_t* dk_, uint16_t* dv_, const uint16_t* dout_, const uint16_t* q_,
                         const uint16_t* k_, const uint16_t* v_, const uint16_t* out_, const void* saved, int64_t B,
                         int64_t H, DeviceContext& ctx, int64_t window, const int64_t* pos, AttentionScores scores,
                         const EagerAttentionLayout& l, void* workspace) {
  const int64_t T = l.T, Hkv = l.Hkv, D = l.D;
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "eager attention: H must be a multiple of Hkv");
  auto* dq = reinterpret_cast<__nv_bfloat16*>(dq_);
  auto* dk = reinterpret_cast<__nv_bfloat16*>(dk_);
  auto* dv = reinterpret_cast<__nv_bfloat16*>(dv_);
  const auto* dout = reinterpret_cast<const __nv_bfloat16*>(dout_);
  const auto* q = reinterpret_cast<const __nv_bfloat16*>(q_);
  const auto* k = reinterpret_cast<const __nv_bfloat16*>(k_);
  const auto* v = reinterpret_cast<const __nv_bfloat16*>(v_);
  const auto* out = reinterpret_cast<const __nv_bfloat16*>(out_);
  const int64_t G = H / Hkv;
  char* ws = static_cast<char*>(workspace);
  auto* S = reinterpret_cast<float*>(ws);
  auto* dP = reinterpret_cast<float*>(ws + l.scores_bytes);
  auto* P = reinterpret_cast<__nv_bfloat16*>(ws + 2 * l.scores_bytes);
  auto* dKf = reinterpret_cast<float*>(ws + 2 * l.scores_bytes + l.probs_bytes);
  auto* dVf = reinterpret_cast<float*>(ws + 2 * l.scores_bytes + l.probs_bytes + l.dkv_bytes);
  const cudaStream_t st = stream_of(ctx);
  const int64_t kv_elems = T * Hkv * D;
  for (int64_t b = 0; b < B; ++b) {
    const __nv_bfloat16* qb = q + b * T * H * D;
    const __nv_bfloat16* kb = k + b * T * Hkv * D;
    const __nv_bfloat16* vb = v + b * T * Hkv * D;
    const __nv_bfloat16* dob = dout + b * T * H * D;
    const __nv_bfloat16* ob = out + b * T * H * D;
    const float* stats = static_cast<const float*>(saved) + b * H * T;
    QS_CUDA_CHECK(cudaMemsetAsync(dKf, 0, static_cast<size_t>(kv_elems) * 4, st));
    QS_CUDA_CHECK(cudaMemsetAsync(dVf, 0, static_cast<size_t>(kv_elems) * 4, st));
    for (int64_t t0 = 0; t0 < T; t0 += l.rows) {
      const ChunkRows c = chunk_at(l, H, t0, window, pos ? pos + b * T : nullptr, scores);
      const int64_t rows = c.rows, k0 = c.k0, keys = c.keys, ld = c.ld;
      for (int64_t g = 0; g < G; ++g) {
        const __nv_bfloat16* qg = qb + (t0 * H + g) * D;
        const __nv_bfloat16* dog = dob + (t0 * H + g) * D;
        const __nv_bfloat16* kk = kb + k0 * Hkv * D;
        const __nv_bfloat16* vk = vb + k0 * Hkv * D;
        // S = Q K^T, then P from the kept lse
        gemm(S, qg, kk, rows_by_keys(rows, keys, ld, H, Hkv, D), ctx);
        eager_softmax_kernel<<<static_cast<unsigned>(Hkv * rows), kThreads, 0, st>>>(
            P, const_cast<float*>(stats) + g * T, S, c, true);
        QS_CUDA_CHECK(cudaGetLastError());
        gemm(dVf + k0 * Hkv * D, P, dog, keys_by_dim(rows, keys, ld, H, Hkv, D), ctx);  // dV_kvh += P^T dO (f32)
        gemm(dP, dog, vk, rows_by_keys(rows, keys, ld, H, Hkv, D), ctx);               // dP = dO V^T
        eager_softmax_bwd_kernel<<<static_cast<unsigned>(Hkv * rows), kThreads, 0, st>>>(P, S, dP, stats, dob, ob, D, g,
                                                                                        c);  // dS over P
        QS_CUDA_CHECK(cudaGetLastError());
        // dQ = dS K (bf16, each row and head once); dK_kvh += dS^T Q (f32)
        gemm(dq + (b * T * H + t0 * H + g) * D, P, kk, rows_by_dim(rows, keys, ld, H, Hkv, D), ctx);
        gemm(dKf + k0 * Hkv * D, P, qg, keys_by_dim(rows, keys, ld, H, Hkv, D), ctx);
      }
    }
    f32_to_bf16_kernel<<<blocks_for(kv_elems), kThreads, 0, st>>>(dk + b * kv_elems, dKf, kv_elems);
    f32_to_bf16_kernel<<<blocks_for(kv_elems), kThreads, 0, st>>>(dv + b * kv_elems, dVf, kv_elems);
    QS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace qshard::cuda
