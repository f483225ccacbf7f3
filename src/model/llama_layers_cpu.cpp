// CPU reference of llama_layers.h: plain loops, f32 accumulation.
#include "model/llama_layers.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "runtime/error.h"

namespace qshard {

namespace {

// y[n, o] = sum_i x[n, i] * w[o, i]   (x [N,K], w [M,K], y [N,M], overwritten)
void matmul_nt(float* y, const float* x, const float* w, int64_t N, int64_t K, int64_t M) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * K;
    for (int64_t o = 0; o < M; ++o) {
      const float* wr = w + o * K;
      float acc = 0.0f;
      for (int64_t i = 0; i < K; ++i) acc += xr[i] * wr[i];
      y[n * M + o] = acc;
    }
  }
}

// dx[n, i] += sum_o dy[n, o] * w[o, i] * alpha   (dy [N,M], w [M,K], dx [N,K])
void matmul_nn_acc(float* dx, const float* dy, const float* w, int64_t N, int64_t M, int64_t K, float alpha) {
  std::vector<float> row(K);
  for (int64_t n = 0; n < N; ++n) {
    std::fill(row.begin(), row.end(), 0.0f);
    for (int64_t o = 0; o < M; ++o) {
      const float g = dy[n * M + o];
      const float* wr = w + o * K;
      for (int64_t i = 0; i < K; ++i) row[i] += g * wr[i];
    }
    for (int64_t i = 0; i < K; ++i) dx[n * K + i] += alpha * row[i];
  }
}

// dw[o, i] += alpha * sum_n dy[n, o] * x[n, i]   (dy [N,M], x [N,K], dw [M,K])
void matmul_tn_acc(float* dw, const float* dy, const float* x, int64_t N, int64_t M, int64_t K, float alpha) {
  for (int64_t o = 0; o < M; ++o) {
    for (int64_t i = 0; i < K; ++i) {
      float acc = 0.0f;
      for (int64_t n = 0; n < N; ++n) acc += dy[n * M + o] * x[n * K + i];
      dw[o * K + i] += alpha * acc;
    }
  }
}

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

// ---- embedding --------------------------------------------------------------------------------
void embedding_fwd(float* out, const int64_t* ids, const float* weight, int64_t N, int64_t C, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = ids[n];
    if (id < 0 || id >= V)
      throw InputError("token id " + std::to_string(id) + " at position " + std::to_string(n) +
                       " is outside the vocabulary [0, " + std::to_string(V) + ")");
    std::copy(weight + id * C, weight + (id + 1) * C, out + n * C);
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------
void rmsnorm_fwd(float* out, float* rstd, const float* x, const float* weight, int64_t N, int64_t C, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0.0f;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    if (rstd) rstd[n] = r;
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = weight[c] * (xr[c] * r);
  }
}

void rmsnorm_bwd(float* dx, const float* dout, const float* x, const float* weight, int64_t N, int64_t C, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    const float* gr = dout + n * C;
    float ss = 0.0f;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    float dot = 0.0f;  // sum_c g * xhat
    for (int64_t c = 0; c < C; ++c) dot += gr[c] * weight[c] * (xr[c] * r);
    const float mean_dot = dot / static_cast<float>(C);
    for (int64_t c = 0; c < C; ++c) dx[n * C + c] += r * (gr[c] * weight[c] - (xr[c] * r) * mean_dot);
  }
}

// ---- RoPE -------------------------------------------------------------------------------------
std::vector<float> rope_inv_freq(const LlamaConfig& c) {
  const int64_t D = c.head_dim;
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> inv(D / 2);
  for (int64_t i = 0; i < D / 2; ++i)
    inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(D));
  if (c.rope_scaling.rope_type == "llama3") {
    // transformers' _compute_llama3_parameters, each op in f32 as torch does on a f32 tensor.
    const RopeScaling& s = c.rope_scaling;
    const float factor = static_cast<float>(s.factor);
    const float low = static_cast<float>(s.low_freq_factor), high = static_cast<float>(s.high_freq_factor);
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const float low_freq_wavelen = static_cast<float>(old_len / s.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(old_len / s.high_freq_factor);
    for (float& f : inv) {
      const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (static_cast<float>(old_len) / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  return inv;
}

RopeTables rope_tables(const std::vector<float>& inv_freq, int64_t T) {
  RopeTables r;
  r.T = T;
  r.half = static_cast<int64_t>(inv_freq.size());
  r.cos.resize(T * r.half);
  r.sin.resize(T * r.half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < r.half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[i];  // f32 product, as HF
      r.cos[t * r.half + i] = std::cos(angle);
      r.sin[t * r.half + i] = std::sin(angle);
    }
  return r;
}

namespace {
// Rotates every head vector of x by +angle (sign = 1) or -angle (sign = -1).
void rope_rotate(float* x, const RopeTables& rope, int64_t B, int64_t T, int64_t nh, int64_t D, float sign) {
  const int64_t half = D / 2;
  QS_CHECK(half == rope.half && T <= rope.T, "RoPE tables do not match the head dim / sequence length");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        float* v = x + ((b * T + t) * nh + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float c = rope.cos[t * half + i], s = sign * rope.sin[t * half + i];
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c - x2 * s;
          v[i + half] = x2 * c + x1 * s;
        }
      }
}
}  // namespace

void rope_fwd(float* x, const RopeTables& rope, int64_t B, int64_t T, int64_t nh, int64_t D) {
  rope_rotate(x, rope, B, T, nh, D, 1.0f);
}
void rope_bwd(float* dx, const RopeTables& rope, int64_t B, int64_t T, int64_t nh, int64_t D) {
  rope_rotate(dx, rope, B, T, nh, D, -1.0f);
}

// ---- attention --------------------------------------------------------------------------------
void attention_fwd(float* out, float* att, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D) {
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  const int64_t group = H / Hkv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));  // HF: head_dim ** -0.5
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + ((b * T + t) * H + h) * D;
        float* a = att + ((b * H + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          const float* ku = k + ((b * T + u) * Hkv + hk) * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qt[d] * ku[d];
          a[u] = dot * scale;
          maxv = std::max(maxv, a[u]);
        }
        float sum = 0.0f;
        for (int64_t u = 0; u <= t; ++u) {
          a[u] = std::exp(a[u] - maxv);
          sum += a[u];
        }
        for (int64_t u = 0; u <= t; ++u) a[u] /= sum;
        for (int64_t u = t + 1; u < T; ++u) a[u] = 0.0f;
        float* ot = out + ((b * T + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0.0f;
          for (int64_t u = 0; u <= t; ++u) acc += a[u] * v[((b * T + u) * Hkv + hk) * D + d];
          ot[d] = acc;
        }
      }
    }
}

void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                   const float* v, const float* att, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t group = H / Hkv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<float> dp(T), ds(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const float* a = att + ((b * H + h) * T + t) * T;
        const float* go = dout + ((b * T + t) * H + h) * D;
        // dp[u] = dout_t . v_u ; dv_u += a[u] * dout_t
        float sum_adp = 0.0f;
        for (int64_t u = 0; u <= t; ++u) {
          const float* vu = v + ((b * T + u) * Hkv + hk) * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += go[d] * vu[d];
          dp[u] = dot;
          sum_adp += a[u] * dot;
          if (dv) {
            float* dvu = dv + ((b * T + u) * Hkv + hk) * D;
            for (int64_t d = 0; d < D; ++d) dvu[d] += a[u] * go[d];
          }
        }
        // softmax backward: ds[u] = a[u] * (dp[u] - sum_w a[w] dp[w]), then through the scale
        for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (dp[u] - sum_adp) * scale;
        const float* qt = q + ((b * T + t) * H + h) * D;
        for (int64_t u = 0; u <= t; ++u) {
          const float* ku = k + ((b * T + u) * Hkv + hk) * D;
          if (dq) {
            float* dqt = dq + ((b * T + t) * H + h) * D;
            for (int64_t d = 0; d < D; ++d) dqt[d] += ds[u] * ku[d];
          }
          if (dk) {
            float* dku = dk + ((b * T + u) * Hkv + hk) * D;
            for (int64_t d = 0; d < D; ++d) dku[d] += ds[u] * qt[d];
          }
        }
      }
    }
}

// ---- SwiGLU -----------------------------------------------------------------------------------
void swiglu_fwd(float* h, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    h[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void swiglu_bwd(float* dgate, float* dup, const float* dh, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sig;
    if (dup) dup[i] += dh[i] * silu;
    // d silu / dg = sig * (1 + g * (1 - sig))
    if (dgate) dgate[i] += dh[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

// ---- dropout ----------------------------------------------------------------------------------
bool dropout_keep(const DropoutKey& key, int64_t global_index) {
  if (key.p <= 0.0f) return true;
  uint64_t z = splitmix64(key.seed);
  z = splitmix64(z ^ key.step);
  z = splitmix64(z ^ key.module_id);
  z = splitmix64(z ^ static_cast<uint64_t>(global_index));
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // top 24 bits -> [0, 1)
  return u >= key.p;
}

void dropout_fwd(float* out, const float* x, const DropoutKey& key, int64_t N, int64_t W) {
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

// ---- LoRA Linear ------------------------------------------------------------------------------
float lora_scaling(double alpha, int64_t r, bool use_rslora) {
  if (r <= 0) return 0.0f;
  return static_cast<float>(use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r));
}

void lora_linear_fwd(float* y, const float* x, const LoraLinearParams& p, int64_t N) {
  matmul_nt(y, x, p.weight, N, p.in, p.out);
  if (p.bias)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < p.out; ++o) y[n * p.out + o] += p.bias[o];
  if (p.r == 0) return;
  std::vector<float> xd(N * p.in), xa(N * p.r), lora(N * p.out);
  dropout_fwd(xd.data(), x, p.dropout, N, p.in);
  matmul_nt(xa.data(), xd.data(), p.lora_A, N, p.in, p.r);     // [N,r]
  matmul_nt(lora.data(), xa.data(), p.lora_B, N, p.r, p.out);  // [N,out]
  for (int64_t i = 0; i < N * p.out; ++i) y[i] += lora[i] * p.scaling;
}

void lora_linear_bwd(float* dx, float* dA, float* dB, const float* dy, const float* x, const LoraLinearParams& p,
                     int64_t N) {
  if (dx) matmul_nn_acc(dx, dy, p.weight, N, p.out, p.in, 1.0f);
  if (p.r == 0) return;
  std::vector<float> xd(N * p.in), xa(N * p.r), dxa(N * p.r, 0.0f);
  dropout_fwd(xd.data(), x, p.dropout, N, p.in);                   // recomputed: same mask
  matmul_nt(xa.data(), xd.data(), p.lora_A, N, p.in, p.r);         // [N,r]
  if (dB) matmul_tn_acc(dB, dy, xa.data(), N, p.out, p.r, p.scaling);  // [out,r]
  matmul_nn_acc(dxa.data(), dy, p.lora_B, N, p.out, p.r, 1.0f);    // dy B: [N,r]
  if (dA) matmul_tn_acc(dA, dxa.data(), xd.data(), N, p.r, p.in, p.scaling);  // [r,in]
  if (dx) {
    std::vector<float> dxd(N * p.in, 0.0f);
    matmul_nn_acc(dxd.data(), dxa.data(), p.lora_A, N, p.r, p.in, p.scaling);  // [N,in]
    dropout_fwd(dxd.data(), dxd.data(), p.dropout, N, p.in);  // the mask's transpose is itself
    for (int64_t i = 0; i < N * p.in; ++i) dx[i] += dxd[i];
  }
}

// ---- cross entropy ----------------------------------------------------------------------------
float cross_entropy_fwd_bwd(float* dlogits, const float* logits, const int64_t* targets, int64_t N, int64_t V,
                            double normalizer) {
  QS_CHECK(normalizer > 0, "cross entropy normalizer must be positive");
  const float inv_norm = static_cast<float>(1.0 / normalizer);
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    const int64_t y = targets[n];
    if (y == kIgnoreIndex) {
      if (dlogits) std::fill(dlogits + n * V, dlogits + (n + 1) * V, 0.0f);
      continue;
    }
    if (y < 0 || y >= V)
      throw InputError("target " + std::to_string(y) + " at row " + std::to_string(n) +
                       " is outside the vocabulary [0, " + std::to_string(V) + ") and not -100");
    float maxv = -INFINITY;
    for (int64_t v = 0; v < V; ++v) maxv = std::max(maxv, l[v]);
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(l[v] - maxv);
    const float lse = maxv + std::log(sum);
    total += static_cast<double>(lse - l[y]);
    if (dlogits)
      for (int64_t v = 0; v < V; ++v) {
        const float prob = std::exp(l[v] - lse);
        dlogits[n * V + v] = (prob - (v == y ? 1.0f : 0.0f)) * inv_norm;
      }
  }
  return static_cast<float>(total / normalizer);
}

std::vector<int64_t> shift_labels(const int64_t* labels, int64_t B, int64_t T) {
  std::vector<int64_t> t(B * T, kIgnoreIndex);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s + 1 < T; ++s) t[b * T + s] = labels[b * T + s + 1];
  return t;
}

}  // namespace qshard
