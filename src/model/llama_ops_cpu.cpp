// CPU reference of llama_ops.h: plain loops, f32 accumulation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "model/llama_ops.h"
#include "runtime/error.h"

namespace qshard {

namespace {

float widen(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: throw Error(std::string("CPU op: unsupported operand dtype ") + dtype_torch_name(t));
  }
}

// Row `row` (n values, rows ld apart) of a matrix of dtype t as f32: a pointer into it (f32) or
// into `buf` (widened).
const float* row_f32(const void* m, DType t, int64_t row, int64_t n, int64_t ld, float* buf) {
  if (t == DType::kF32) return static_cast<const float*>(m) + row * ld;
  for (int64_t i = 0; i < n; ++i) buf[i] = widen(m, t, row * ld + i);
  return buf;
}

// Rotates every head vector of x by +angle (sign = 1) or -angle (sign = -1).
void rope_rotate(float* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
                 float sign, const int64_t* pos, int64_t ld) {
  const int64_t half = D / 2, row = ld > 0 ? ld : nh * D;
  QS_CHECK(row >= nh * D, "rope: rows of heads closer than their width");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        float* v = x + (b * T + t) * row + h * D;
        const int64_t at = (pos ? pos[b * T + t] : t) * half;
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos[at + i], s = sign * sin[at + i];
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c - x2 * s;
          v[i + half] = x2 * c + x1 * s;
        }
      }
}

}  // namespace

// ---- backend-independent helpers --------------------------------------------------------------

std::vector<float> rope_inv_freq(const RopeParams& p) {
  const int64_t D = p.head_dim;
  QS_CHECK(D > 0 && D % 2 == 0, "RoPE head_dim must be positive and even");
  const float base = static_cast<float>(p.theta);
  std::vector<float> inv(D / 2);
  for (int64_t i = 0; i < D / 2; ++i)
    inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(D));
  if (p.llama3) {
    // transformers' _compute_llama3_parameters, each op in f32 as torch does on a f32 tensor.
    const float factor = static_cast<float>(p.factor);
    const float low = static_cast<float>(p.low_freq_factor), high = static_cast<float>(p.high_freq_factor);
    const double old_len = static_cast<double>(p.original_max_position_embeddings);
    const float low_freq_wavelen = static_cast<float>(old_len / p.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(old_len / p.high_freq_factor);
    for (float& f : inv) {
      const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (static_cast<float>(old_len) / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  if (p.linear_factor != 1.0) {  // transformers' _compute_linear_scaling_rope_parameters: inv_freq / factor (f32)
    const float factor = static_cast<float>(p.linear_factor);
    for (float& f : inv) f /= factor;
  }
  return inv;
}

float AttentionScores::scale_for(int64_t D) const {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));  // head_dim ** -0.5
}

float lora_scaling(double alpha, int64_t r, bool use_rslora) {
  if (r <= 0) return 0.0f;
  return static_cast<float>(use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r));
}

std::vector<int64_t> shift_labels(const int64_t* labels, int64_t B, int64_t T) {
  std::vector<int64_t> t(B * T, kIgnoreIndex);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s + 1 < T; ++s) t[b * T + s] = labels[b * T + s + 1];
  return t;
}

size_t attention_saved_bytes(Backend backend, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  (void)Hkv;
  (void)D;
  if (backend == Backend::kCpu) return static_cast<size_t>(B * H * T * T) * sizeof(float);  // probabilities
  return static_cast<size_t>(B * H * T) * sizeof(float);  // a fused kernel's row statistics (log-sum-exp)
}

EagerAttentionLayout eager_attention_layout(int64_t T, int64_t Hkv, int64_t D, int64_t chunk_bytes) {
  QS_CHECK(T > 0 && Hkv > 0 && D > 0, "eager_attention_layout: bad sizes");
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  EagerAttentionLayout l;
  l.T = T, l.Hkv = Hkv, l.D = D;
  l.ld = up(T, 8);
  const int64_t per_row = Hkv * l.ld * (4 + 4 + 2);  // a row's scores, their gradient, probabilities
  const int64_t fit = chunk_bytes / per_row;
  l.rows = fit >= T ? T : std::min(T, std::max<int64_t>(64, fit / 64 * 64));
  const int64_t cells = Hkv * l.rows * l.ld;
  l.scores_bytes = static_cast<size_t>(up(cells * 4, 256));
  l.probs_bytes = static_cast<size_t>(up(cells * 2, 256));
  l.dkv_bytes = static_cast<size_t>(up(T * Hkv * D * 4, 256));
  // Rows of a shorter sequence: whole when they fit chunk_bytes, else a multiple of 64 within it
  // (or 64 rows): their three arrays stay within max(chunk_bytes, 64 rows of T), and within all T
  // rows of T, plus rounding.
  const int64_t arrays = std::min(std::max(chunk_bytes, 64 * per_row), T * per_row) + 3 * 256;
  l.bound = std::max(l.total(), static_cast<size_t>(arrays) + 2 * l.dkv_bytes);
  return l;
}

int64_t ragged_layout(int32_t* out, const int64_t* pos, int64_t n, int64_t P, int64_t H, int64_t Hkv, int64_t D,
                      int64_t ld_dqkv) {
  QS_CHECK(n >= 1 && P >= 1 && pos[0] == 0, "ragged_layout: no rows, no pieces, or a first row that starts none");
  const int64_t widest = std::max({H * D, Hkv * D, ld_dqkv});
  QS_CHECK(n * widest <= std::numeric_limits<int32_t>::max(),
           "ragged_layout: " + std::to_string(n) + " rows of " + std::to_string(widest) +
               " elements pass cuDNN's int32 offsets");
  int32_t* len = out;
  int32_t* off_q = out + P;
  int32_t* off_kv = off_q + P + 1;
  int32_t* off_stats = off_kv + P + 1;
  int32_t* off_grad = off_stats + P + 1;
  int64_t pieces = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (pos[r] != 0) continue;
    QS_CHECK(pieces < P, "ragged_layout: a pass holds more than the " + std::to_string(P) +
                             " pieces the attention graphs were built for");
    off_q[pieces++] = static_cast<int32_t>(r);  // the piece's first row, scaled below
  }
  for (int64_t j = 0; j <= P; ++j) {
    const int64_t first = j < pieces ? off_q[j] : n;
    if (j < P) len[j] = static_cast<int32_t>(j < pieces ? (j + 1 < pieces ? off_q[j + 1] : n) - first : 0);
    off_q[j] = static_cast<int32_t>(first * H * D);
    off_kv[j] = static_cast<int32_t>(first * Hkv * D);
    off_stats[j] = static_cast<int32_t>(first * H);
    off_grad[j] = static_cast<int32_t>(first * ld_dqkv);
  }
  return pieces;
}

namespace cpu {

// ---- GEMM -------------------------------------------------------------------------------------
void gemm(float* C, const float* A, const void* B, const GemmShape& s, DeviceContext& ctx) {
  gemm_into(C, A, B, C, s, ctx);
}

void gemm_into(float* D, const float* A, const void* B, const float* C, const GemmShape& s, DeviceContext& ctx) {
  QS_CHECK(s.a_type == DType::kF32 && s.c_type == DType::kF32, "CPU gemm: A and C must be f32");
  QS_CHECK(C || s.beta == 0.0f, "CPU gemm: beta != 0 without C");
  if (s.batch > 1) {  // one product after another
    GemmShape one = s;
    one.batch = 1;
    const size_t bsz = dtype_size(s.b_type);
    for (int64_t i = 0; i < s.batch; ++i)
      gemm_into(D + i * s.stride_c, A + i * s.stride_a, static_cast<const char*>(B) + i * s.stride_b * bsz,
                C ? C + i * s.stride_c : nullptr, one, ctx);
    return;
  }
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t lda = s.lda_or_packed(), ldb = s.ldb_or_packed(), ldc = s.ldc_or_packed();
  QS_CHECK(lda >= (s.trans_a ? M : K) && ldb >= (s.trans_b ? K : N) && ldc >= N, "CPU gemm: a leading dimension below its row");
  Workspace& ws = ctx.workspace();
  const size_t mark = ws.used();
  float* acc = ws.take<float>(N, "gemm row");
  float* brow = s.b_type == DType::kF32 ? nullptr : ws.take<float>(std::max(N, K), "gemm B row");
  auto store = [&](int64_t m) {
    float* d = D + m * ldc;
    if (s.beta == 0.0f) {
      for (int64_t n = 0; n < N; ++n) d[n] = s.alpha * acc[n];
      return;
    }
    const float* c = C + m * ldc;
    for (int64_t n = 0; n < N; ++n) d[n] = s.alpha * acc[n] + s.beta * c[n];
  };
  if (!s.trans_a && s.trans_b) {  // C = A B^T: dot products of rows (B stored [N,K])
    for (int64_t m = 0; m < M; ++m) {
      const float* a = A + m * lda;
      for (int64_t n = 0; n < N; ++n) {
        const float* b = row_f32(B, s.b_type, n, K, ldb, brow);
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += a[k] * b[k];
        acc[n] = sum;
      }
      store(m);
    }
  } else if (!s.trans_b) {  // B stored [K,N]: accumulate rows of B, k ascending per output
    for (int64_t m = 0; m < M; ++m) {
      std::fill(acc, acc + N, 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const float a = s.trans_a ? A[k * lda + m] : A[m * lda + k];
        const float* b = row_f32(B, s.b_type, k, N, ldb, brow);
        for (int64_t n = 0; n < N; ++n) acc[n] += a * b[n];
      }
      store(m);
    }
  } else {  // A^T B^T (not used by the model; kept for completeness of the op)
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += A[k * lda + m] * widen(B, s.b_type, n * ldb + k);
        acc[n] = sum;
      }
      store(m);
    }
  }
  ws.rewind(mark);
}

// ---- embedding --------------------------------------------------------------------------------
void embedding_fwd(float* out, const int64_t* ids, const void* weight, DType weight_type, int64_t N, int64_t C,
                   int64_t V, DeviceContext& ctx, float scale) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = ids[n];
    if (id < 0 || id >= V)
      throw InputError("token id " + std::to_string(id) + " at position " + std::to_string(n) +
                       " is outside the vocabulary [0, " + std::to_string(V) + ")");
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = widen(weight, weight_type, id * C + c);
  }
  if (scale != 1.0f) {  // Gemma: the product in the embedding's dtype
    for (int64_t i = 0; i < N * C; ++i) out[i] *= scale;
    if (weight_type != DType::kF32) round_to_dtype(out, N * C, weight_type, ctx);
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------
void rmsnorm_fwd(float* out, float* rstd, const float* x, const float* weight, int64_t N, int64_t C, float eps,
                 DeviceContext& ctx, int64_t ld_out) {
  (void)ctx;
  if (ld_out == 0) ld_out = C;
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0.0f;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    rstd[n] = r;
    for (int64_t c = 0; c < C; ++c) out[n * ld_out + c] = weight[c] * (xr[c] * r);
  }
}

void rmsnorm_bwd(float* dx, const float* dout, const float* x, const float* weight, const float* rstd, int64_t N,
                 int64_t C, DeviceContext& ctx, int64_t ld_dout) {
  (void)ctx;
  if (ld_dout == 0) ld_dout = C;
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    const float* gr = dout + n * ld_dout;
    const float r = rstd[n];
    float dot = 0.0f;  // sum_c g * xhat
    for (int64_t c = 0; c < C; ++c) dot += gr[c] * weight[c] * (xr[c] * r);
    const float mean_dot = dot / static_cast<float>(C);
    for (int64_t c = 0; c < C; ++c) dx[n * C + c] += r * (gr[c] * weight[c] - (xr[c] * r) * mean_dot);
  }
}

void add(float* out, const float* a, const float* b, int64_t n, DeviceContext& ctx) {
  (void)ctx;
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate(float* out, const float* b, int64_t n, DeviceContext& ctx) {
  (void)ctx;
  for (int64_t i = 0; i < n; ++i) out[i] += b[i];
}

void copy(float* out, const float* x, int64_t n, DeviceContext& ctx) {
  (void)ctx;
  std::copy(x, x + n, out);
}

void zero(float* x, int64_t n, DeviceContext& ctx) {
  (void)ctx;
  std::fill(x, x + n, 0.0f);
}

void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols, float scale,
             DeviceContext& ctx) {
  (void)ctx;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ld_dst + c] = src ? scale * src[r * ld_src + c] : 0.0f;
}

void copy_2d_batch(const Copy2dBlock* blocks, int count, DeviceContext& ctx) {
  QS_CHECK(count >= 0 && count <= kCopy2dBatchMax, "copy_2d_batch: count out of range");
  for (int i = 0; i < count; ++i) {
    const Copy2dBlock& b = blocks[i];
    copy_2d(static_cast<float*>(b.dst), b.ld_dst, static_cast<const float*>(b.src), b.ld_src, b.rows, b.cols, b.scale,
            ctx);
  }
}

void add_bias(float* y, const float* bias, int64_t N, int64_t W, DeviceContext& ctx) {
  (void)ctx;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < W; ++o) y[n * W + o] += bias[o];
}

void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx, float offset) {
  (void)ctx;
  for (int64_t i = 0; i < n; ++i) out[i] = widen(x, type, i) + offset;
}

// ---- RoPE -------------------------------------------------------------------------------------
void rope_tables(float* cos, float* sin, const RopeParams& p, int64_t T, DeviceContext& ctx) {
  (void)ctx;
  const std::vector<float> inv = rope_inv_freq(p);
  const int64_t half = static_cast<int64_t>(inv.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv[i];  // f32 product, as HF
      cos[t * half + i] = std::cos(angle);
      sin[t * half + i] = std::sin(angle);
    }
}

void rope_fwd(float* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos, int64_t ld) {
  (void)ctx;
  rope_rotate(x, cos, sin, B, T, nh, D, 1.0f, pos, ld);
}

void rope_bwd(float* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos, int64_t ld) {
  (void)ctx;
  rope_rotate(dx, cos, sin, B, T, nh, D, -1.0f, pos, ld);
}

// ---- attention --------------------------------------------------------------------------------
namespace {
// One query row of causal attention over keys first..last (key u at k0 + u * stride, value u at
// v0 + u * stride): a[u] = its probabilities (scores in f32, max subtracted, divided by the sum),
// ot = sum_u a[u] v_u. The one arithmetic of attention_fwd and attention_cached_fwd, so a cached
// step gives the full forward's bits.
// The score of query qt and key ku: (qt . ku) * scale, soft-capped with softcap > 0.
float score(const float* qt, const float* ku, int64_t D, float scale, float softcap) {
  float dot = 0.0f;
  for (int64_t d = 0; d < D; ++d) dot += qt[d] * ku[d];
  const float s = dot * scale;
  return softcap > 0.0f ? std::tanh(s / softcap) * softcap : s;  // transformers' order: / cap, tanh, * cap
}
void attend_row(float* ot, float* a, const float* qt, const float* k0, const float* v0, int64_t stride, int64_t first,
                int64_t last, int64_t D, float scale, float softcap) {
  float maxv = -INFINITY;
  for (int64_t u = first; u <= last; ++u) {
    a[u] = score(qt, k0 + u * stride, D, scale, softcap);
    maxv = std::max(maxv, a[u]);
  }
  float sum = 0.0f;
  for (int64_t u = first; u <= last; ++u) {
    a[u] = std::exp(a[u] - maxv);
    sum += a[u];
  }
  for (int64_t u = first; u <= last; ++u) a[u] /= sum;
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int64_t u = first; u <= last; ++u) acc += a[u] * v0[u * stride + d];
    ot[d] = acc;
  }
}
// The first key query position t sees: t - window + 1 with a sliding window, else 0.
int64_t first_key(int64_t t, int64_t window) { return window > 0 ? std::max<int64_t>(0, t - window + 1) : 0; }
// ... and with packed positions (`pos` of the sequence's row 0; null: none): not before the start
// of t's piece, t - pos[t].
int64_t first_key(int64_t t, int64_t window, const int64_t* pos) {
  return pos ? std::max(first_key(t, window), t - pos[t]) : first_key(t, window);
}
}  // namespace

void attention_fwd(float* out, void* saved, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window, const int64_t* pos,
                   AttentionScores scores) {
  (void)ctx;
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  float* att = static_cast<float*>(saved);  // [B,H,T,T] probabilities, 0 outside the (banded) causal mask
  const int64_t group = H / Hkv;
  const float scale = scores.scale_for(D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      const int64_t kv0 = (b * T * Hkv + hk) * D;  // key / value 0 of this sequence and kv head
      for (int64_t t = 0; t < T; ++t) {
        float* a = att + ((b * H + h) * T + t) * T;
        const int64_t first = first_key(t, window, pos ? pos + b * T : nullptr);
        attend_row(out + ((b * T + t) * H + h) * D, a, q + ((b * T + t) * H + h) * D, k + kv0, v + kv0, Hkv * D, first,
                   t, D, scale, scores.softcap);
        for (int64_t u = 0; u < first; ++u) a[u] = 0.0f;
        for (int64_t u = t + 1; u < T; ++u) a[u] = 0.0f;
      }
    }
}

void attention_cached_fwd(float* out, const float* q, const float* k_cache, const float* v_cache, int64_t T, int64_t P,
                          int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window,
                          AttentionScores scores) {
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  Workspace& ws = ctx.workspace();
  const size_t mark = ws.used();
  float* a = ws.take<float>(static_cast<size_t>(P + T), "cached attention scores");
  const int64_t group = H / Hkv;
  const float scale = scores.scale_for(D);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t hk = h / group;
    for (int64_t t = 0; t < T; ++t)  // the query at position P + t reads keys 0..P+t (its window's)
      attend_row(out + (t * H + h) * D, a, q + (t * H + h) * D, k_cache + hk * D, v_cache + hk * D, Hkv * D,
                 first_key(P + t, window), P + t, D, scale, scores.softcap);
  }
  ws.rewind(mark);
}

void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                   const float* v, const float* out, const void* saved, int64_t B, int64_t T, int64_t H,
                   int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window, const int64_t* pos,
                   AttentionScores scores, int64_t ld_dqkv) {
  (void)out;  // the CPU keeps the probabilities; a fused kernel needs out for its row sums
  const float* att = static_cast<const float*>(saved);
  const int64_t group = H / Hkv;
  const float scale = scores.scale_for(D), cap = scores.softcap;
  // token row n's gradients: dq at n ldq, dk / dv at n ldkv (ld_dqkv: one stride, side by side)
  const int64_t ldq = ld_dqkv > 0 ? ld_dqkv : H * D, ldkv = ld_dqkv > 0 ? ld_dqkv : Hkv * D;
  QS_CHECK(ldq >= H * D && ldkv >= Hkv * D, "attention_bwd: gradient rows closer than their width");
  for (int64_t n = 0; n < B * T; ++n) {
    std::fill(dq + n * ldq, dq + n * ldq + H * D, 0.0f);
    std::fill(dk + n * ldkv, dk + n * ldkv + Hkv * D, 0.0f);
    std::fill(dv + n * ldkv, dv + n * ldkv + Hkv * D, 0.0f);
  }
  Workspace& ws = ctx.workspace();
  const size_t mark = ws.used();
  float* dp = ws.take<float>(T, "attention dp");
  float* ds = ws.take<float>(T, "attention ds");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const float* a = att + ((b * H + h) * T + t) * T;
        const float* go = dout + ((b * T + t) * H + h) * D;
        const int64_t first = first_key(t, window, pos ? pos + b * T : nullptr);
        // dp[u] = dout_t . v_u ; dv_u += a[u] * dout_t
        float sum_adp = 0.0f;
        for (int64_t u = first; u <= t; ++u) {
          const float* vu = v + ((b * T + u) * Hkv + hk) * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += go[d] * vu[d];
          dp[u] = dot;
          sum_adp += a[u] * dot;
          float* dvu = dv + (b * T + u) * ldkv + hk * D;
          for (int64_t d = 0; d < D; ++d) dvu[d] += a[u] * go[d];
        }
        // softmax backward: ds[u] = a[u] * (dp[u] - sum_w a[w] dp[w]), then through the soft-cap
        // (d/ds cap tanh(s / cap) = 1 - tanh^2, the score recomputed) and the scale
        const float* qt = q + ((b * T + t) * H + h) * D;
        for (int64_t u = first; u <= t; ++u) {
          float g = a[u] * (dp[u] - sum_adp);
          if (cap > 0.0f) {
            const float th = score(qt, k + ((b * T + u) * Hkv + hk) * D, D, scale, cap) / cap;
            g *= 1.0f - th * th;
          }
          ds[u] = g * scale;
        }
        float* dqt = dq + (b * T + t) * ldq + h * D;
        for (int64_t u = first; u <= t; ++u) {
          const float* ku = k + ((b * T + u) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) dqt[d] += ds[u] * ku[d];
          float* dku = dk + (b * T + u) * ldkv + hk * D;
          for (int64_t d = 0; d < D; ++d) dku[d] += ds[u] * qt[d];
        }
      }
    }
  ws.rewind(mark);
}

// ---- SwiGLU -----------------------------------------------------------------------------------
namespace {
constexpr float kGeluTanhC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluTanhK = 0.044715f;
}  // namespace

void swiglu_fwd(float* h, const float* gate, const float* up, int64_t n, DeviceContext& ctx, GatedAct act) {
  (void)ctx;
  if (act == GatedAct::kGeluTanh) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      h[i] = 0.5f * g * (1.0f + std::tanh(kGeluTanhC * (g + kGeluTanhK * g * g * g))) * up[i];
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    h[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void swiglu_bwd(float* dgate, float* dup, const float* dh, const float* gate, const float* up, int64_t n,
                DeviceContext& ctx, GatedAct act) {
  (void)ctx;
  if (act == GatedAct::kGeluTanh) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i], u = up[i], d = dh[i];  // read before either write: in place allowed
      const float th = std::tanh(kGeluTanhC * (g + kGeluTanhK * g * g * g));
      dup[i] = d * (0.5f * g * (1.0f + th));
      // d gelu / dg = 0.5 (1 + th) + 0.5 g (1 - th^2) sqrt(2/pi) (1 + 3 k g^2)
      const float dgelu = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * kGeluTanhC * (1.0f + 3.0f * kGeluTanhK * g * g);
      dgate[i] = d * u * dgelu;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], d = dh[i];  // read before either write: in place allowed
    const float sig = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sig;
    dup[i] = d * silu;
    // d silu / dg = sig * (1 + g * (1 - sig))
    dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
  }
}

// ---- dropout ----------------------------------------------------------------------------------
void dropout_fwd(float* out, const float* x, const DropoutKey& key, int64_t N, int64_t W, DeviceContext& ctx) {
  (void)ctx;
  QS_CHECK(key.p >= 0.0f && key.p < 1.0f, "dropout probability must be in [0, 1)");
  if (key.p == 0.0f) {
    if (out != x) std::copy(x, x + N * W, out);
    return;
  }
  const float keep_scale = 1.0f / (1.0f - key.p);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < W; ++i) {
      const int64_t global = (key.row_offset + n) * W + i;
      out[n * W + i] = dropout_keep(key, global) ? x[n * W + i] * keep_scale : 0.0f;
    }
}

// ---- cross entropy ----------------------------------------------------------------------------
void logit_softcap(float* x, int64_t n, float cap, DeviceContext& ctx) {
  (void)ctx;
  QS_CHECK(cap > 0.0f, "logit_softcap: the cap must be positive");
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / cap) * cap;
}

void cross_entropy_fwd_bwd(float* logits, double* loss_sum, const int64_t* targets, int64_t n, int64_t V,
                           float grad_scale, DeviceContext& ctx, float softcap) {
  (void)ctx;
  for (int64_t row = 0; row < n; ++row) {
    float* l = logits + row * V;
    const int64_t y = targets[row];
    if (y == kIgnoreIndex) {
      if (grad_scale != 0.0f) std::fill(l, l + V, 0.0f);
      continue;
    }
    if (y < 0 || y >= V)
      throw InputError("target " + std::to_string(y) + " at row " + std::to_string(row) +
                       " is outside the vocabulary [0, " + std::to_string(V) + ") and not -100");
    float maxv = -INFINITY;
    for (int64_t v = 0; v < V; ++v) maxv = std::max(maxv, l[v]);
    // The sum in double: in float, once it nears 1 the terms below ~6e-8 are lost one by one and
    // the log-sum-exp comes out low (at 49k-152k vocabularies the loss by 1e-4 to 5e-4 relative,
    // against transformers' f32 log_softmax: scripts/interop/check_real_checkpoints.py).
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += static_cast<double>(std::exp(l[v] - maxv));
    const double lse_d = static_cast<double>(maxv) + std::log(sum);
    const float lse = static_cast<float>(lse_d);
    *loss_sum += lse_d - static_cast<double>(l[y]);
    if (grad_scale != 0.0f)
      for (int64_t v = 0; v < V; ++v) {
        const float prob = std::exp(l[v] - lse);
        float g = (prob - (v == y ? 1.0f : 0.0f)) * grad_scale;
        if (softcap > 0.0f) {  // through y = cap tanh(l / cap): d y / d l = 1 - (y / cap)^2
          const float th = l[v] / softcap;
          g *= 1.0f - th * th;
        }
        l[v] = g;
      }
  }
}

void round_to_dtype(float* x, int64_t n, DType dtype, DeviceContext& ctx) {
  (void)ctx;
  switch (dtype) {
    case DType::kF32: return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
      return;
    default: throw Error(std::string("round_to_dtype: not a float dtype: ") + dtype_torch_name(dtype));
  }
}

void convert(void* out, DType out_type, const void* x, DType x_type, int64_t n, DeviceContext& ctx) {
  (void)ctx;
  switch (out_type) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(out)[i] = widen(x, x_type, i);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(out)[i] = f32_to_bf16(widen(x, x_type, i));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(out)[i] = f32_to_f16(widen(x, x_type, i));
      return;
    default: throw Error(std::string("convert: not a float dtype: ") + dtype_torch_name(out_type));
  }
}

}  // namespace cpu
}  // namespace qshard
