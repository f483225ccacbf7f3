// llama_layers.h: the ops of a Llama decoder, forward and backward, CPU reference.
//
// What: embedding, RMSNorm, RoPE, causal grouped-query attention, SwiGLU, Linear with a frozen
// weight plus LoRA (with deterministic dropout), and cross entropy, each as plain loops over
// row-major f32 arrays with fp32 accumulation, written to be read. Every formula follows
// transformers' LlamaForCausalLM (5.x) and PEFT's LoRA Linear in float32; the comments give the
// operation order where it matters for the last bits.
// Dimension legend: B batch, T sequence, N = B*T rows, C hidden, H heads, Hkv kv heads,
// D head dim, I intermediate, V vocab, r LoRA rank, in/out a Linear's sizes.
// Conventions:
//   - forward functions overwrite their outputs;
//   - backward functions ACCUMULATE (+=) into every gradient they are given (dx, dA, dB, ...),
//     so gradients of shared inputs (the residual stream, gradient accumulation) just add up;
//     a null gradient pointer means "not needed" and is skipped;
//   - frozen parameters (embedding, norm weights, base Linear weights) get no gradient.
// Outputs must not alias inputs unless a function says so. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/hf_config.h"
#include "runtime/error.h"

namespace qshard {

// ---- embedding --------------------------------------------------------------------------------
// out[n, :] = weight[ids[n], :]. ids: [N] in [0, V) (checked, throws InputError naming the id).
void embedding_fwd(float* out /*[N,C]*/, const int64_t* ids /*[N]*/, const float* weight /*[V,C]*/,
                   int64_t N, int64_t C, int64_t V);

// ---- RMSNorm (transformers' LlamaRMSNorm) -----------------------------------------------------
// rstd[n] = 1 / sqrt(mean_c(x^2) + eps) (mean accumulated in f32 as HF does for f32 inputs);
// out = weight * (x * rstd). rstd may be null (not saved).
void rmsnorm_fwd(float* out /*[N,C]*/, float* rstd /*[N] or null*/, const float* x /*[N,C]*/,
                 const float* weight /*[C]*/, int64_t N, int64_t C, float eps);
// dx += rstd * (g - xhat * mean_c(g * xhat)), g = dout * weight, xhat = x * rstd.
void rmsnorm_bwd(float* dx /*[N,C]*/, const float* dout /*[N,C]*/, const float* x /*[N,C]*/,
                 const float* weight /*[C]*/, int64_t N, int64_t C, float eps);

// ---- RoPE (HF rotate_half: dims [0, D/2) pair with [D/2, D)) ----------------------------------
// inv_freq[i] = 1 / theta^(2i / D) in f32 (HF's default), then llama3 scaling when
// config.rope_scaling.rope_type == "llama3" (transformers' _compute_llama3_parameters, in f32).
std::vector<float> rope_inv_freq(const LlamaConfig& config);  // [D/2]
// cos[t, i] = cos(t * inv_freq[i]), sin likewise, for positions t = 0..T-1.
struct RopeTables {
  int64_t T = 0, half = 0;  // half = D/2
  std::vector<float> cos, sin;  // [T, D/2] each
};
RopeTables rope_tables(const std::vector<float>& inv_freq, int64_t T);
// x: [B,T,nh,D] (nh = H for q, Hkv for k), rotated in place, position = t:
//   y[i]     = x[i] * cos - x[i+D/2] * sin
//   y[i+D/2] = x[i+D/2] * cos + x[i] * sin        (i < D/2)
void rope_fwd(float* x /*[B,T,nh,D]*/, const RopeTables& rope, int64_t B, int64_t T, int64_t nh, int64_t D);
// The transpose of the rotation (rotation by -angle), applied in place to a gradient:
// dx = R^T dy. (Not accumulating: it is a linear map of the gradient onto itself.)
void rope_bwd(float* dx /*[B,T,nh,D]*/, const RopeTables& rope, int64_t B, int64_t T, int64_t nh, int64_t D);

// ---- causal grouped-query attention -----------------------------------------------------------
// Query head h reads kv head h / (H / Hkv) (HF repeat_kv). s[t, u] = (q_t . k_u) * (1/sqrt(D)) for
// u <= t; att = softmax_u(s) (f32, max subtracted); out_t = sum_u att[t, u] v_u.
// att (saved for the backward): [B,H,T,T], entries above the diagonal are 0.
// REQUIRES: H % Hkv == 0.
void attention_fwd(float* out /*[B,T,H,D]*/, float* att /*[B,H,T,T]*/, const float* q /*[B,T,H,D]*/,
                   const float* k /*[B,T,Hkv,D]*/, const float* v /*[B,T,Hkv,D]*/, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D);
// Accumulates dq, dk, dv from dout, given the forward's inputs and att.
void attention_bwd(float* dq /*[B,T,H,D]*/, float* dk /*[B,T,Hkv,D]*/, float* dv /*[B,T,Hkv,D]*/,
                   const float* dout /*[B,T,H,D]*/, const float* q, const float* k, const float* v,
                   const float* att /*[B,H,T,T]*/, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);

// ---- SwiGLU gate ------------------------------------------------------------------------------
// h = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_fwd(float* h /*[N,I]*/, const float* gate /*[N,I]*/, const float* up /*[N,I]*/, int64_t n /*N*I*/);
void swiglu_bwd(float* dgate /*[N,I]*/, float* dup /*[N,I]*/, const float* dh /*[N,I]*/, const float* gate,
                const float* up, int64_t n /*N*I*/);

// ---- deterministic dropout --------------------------------------------------------------------
// The keep decision of one element is a pure function of (seed, step, module_id, index), where
// index is the element's position in the GLOBAL batch (row_offset + local row) * width + column,
// so a sample's mask does not depend on how the batch is split over ranks. Counter-based: a
// splitmix64 hash chain, top 24 bits -> u in [0, 1); kept when u >= p. Kept elements are scaled
// by 1 / (1 - p) (PyTorch's inverted dropout). REQUIRES: 0 <= p < 1.
struct DropoutKey {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t module_id = 0;
  int64_t row_offset = 0;  // global row index of local row 0 (global sample index * T)
};
bool dropout_keep(const DropoutKey& key, int64_t global_index);
// out = x * mask / (1 - p); with p == 0 an exact copy. out may alias x.
void dropout_fwd(float* out /*[N,W]*/, const float* x /*[N,W]*/, const DropoutKey& key, int64_t N, int64_t W);

// ---- Linear with a frozen weight plus LoRA (PEFT's lora.Linear) -------------------------------
// y = x W^T (+ bias) + scaling * ((dropout(x) A^T) B^T)    [PEFT: base(x) + lora_B(lora_A(drop(x))) * scaling]
// scaling = alpha / r, or alpha / sqrt(r) with rsLoRA (lora_scaling()). No LoRA when r == 0.
struct LoraLinearParams {
  int64_t in = 0, out = 0;
  const float* weight = nullptr;  // [out, in], frozen (f32; a 4-bit weight dequantized by the caller)
  const float* bias = nullptr;    // [out] or null, frozen
  int64_t r = 0;                  // 0: plain Linear
  const float* lora_A = nullptr;  // [r, in]
  const float* lora_B = nullptr;  // [out, r]
  float scaling = 0.0f;
  DropoutKey dropout;             // dropout of the LoRA input only
};
float lora_scaling(double alpha, int64_t r, bool use_rslora);
void lora_linear_fwd(float* y /*[N,out]*/, const float* x /*[N,in]*/, const LoraLinearParams& p, int64_t N);
// dx += dy W + scaling * dropout_bwd((dy B) A); dA += scaling * (dy B)^T dropout(x);
// dB += scaling * dy^T (dropout(x) A^T). Any of dx, dA, dB may be null.
void lora_linear_bwd(float* dx /*[N,in]*/, float* dA /*[r,in]*/, float* dB /*[out,r]*/, const float* dy /*[N,out]*/,
                     const float* x /*[N,in]*/, const LoraLinearParams& p, int64_t N);

// ---- cross entropy ----------------------------------------------------------------------------
constexpr int64_t kIgnoreIndex = -100;
// targets: [N], already aligned with the logits' rows (row n predicts targets[n]; HF's causal
// shift is the caller's job), kIgnoreIndex rows contribute nothing. normalizer: the number of
// non-ignored targets over ALL ranks and micro-batches (so summed per-rank losses give the mean).
// Returns sum_n -log softmax(logits[n])[targets[n]] / normalizer (log-sum-exp in f32, the sum in
// double). dlogits (nullable) is OVERWRITTEN: (softmax - onehot) / normalizer, 0 on ignored rows.
// Throws InputError for a target outside [0, V) that is not kIgnoreIndex.
float cross_entropy_fwd_bwd(float* dlogits /*[N,V]*/, const float* logits /*[N,V]*/, const int64_t* targets /*[N]*/,
                            int64_t N, int64_t V, double normalizer);

// HF causal-LM target alignment: targets[b, t] = labels[b, t + 1], targets[b, T-1] = kIgnoreIndex.
std::vector<int64_t> shift_labels(const int64_t* labels /*[B,T]*/, int64_t B, int64_t T);

}  // namespace qshard
