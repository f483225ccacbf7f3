// llama_ops.h: the ops of a Llama decoder, forward and backward, one set of names for every
// backend.
//
// The twin rule: each op has the same name and parameter order in `namespace cpu` (the
// reference: plain loops over row-major f32 arrays, fp32 accumulation, written to be read) and
// in `namespace cuda` (kernels, bf16 activations; the CUDA backend's issue adds them), plus a
// trailing DeviceContext& (stream, library handles, workspace). Ops never allocate: scratch comes
// from the caller (the context's Workspace). `namespace ops` is the one dispatch: it takes
// activation pointers as void* in ctx.activation_dtype() and calls the twin of ctx.backend().
// Every formula follows transformers' LlamaForCausalLM (5.x) and PEFT's LoRA Linear in float32.
//
// Dimension legend: B batch, T sequence, N = B*T rows, C hidden, H heads, Hkv kv heads, D head
// dim, I intermediate, V vocab, r LoRA rank, M/N/K a GEMM's sizes.
// Conventions: forward ops overwrite their outputs; backward ops overwrite the gradients they
// produce, except rmsnorm_bwd, which ADDS into dx (the residual stream's gradient arrives there
// first). Outputs must not alias inputs unless an op says so. Frozen parameters get no gradient.
// Tolerances of the CUDA twins against these references are declared in tests/model/op_harness.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/blockwise.h"
#include "runtime/device_context.h"
#include "runtime/dtype.h"
#include "runtime/ignore_index.h"

namespace qshard {

// C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C, row-major.
// op(A) = A stored [M,K], or with trans_a A stored [K,M]; op(B) = B stored [K,N], or with trans_b
// B stored [N,K] (a Linear weight [out,in]: y = x W^T is trans_b). b_type: B's dtype (f32, bf16 or
// f16: a frozen weight kept in its own dtype, widened per row on the CPU); A and C are f32 on the CPU. With beta == 0, C is
// not read. CPU order: one f32 accumulator per output, k ascending, then alpha*acc + beta*C.
// lda / ldb / ldc: the row strides (elements) of A, B and C as stored; 0 = packed (the stored row
// length). A stride larger than the row reads or writes a column block of a wider matrix (the
// LoRA fold: X and X A^T side by side in one [N, in + R] buffer).
// batch > 1: `batch` such products, the i-th reading A + i * stride_a, B + i * stride_b and
// writing C + i * stride_c (elements; the attention's heads as strided views of their rows).
// gemm_into: D = alpha op(A) op(B) + beta C with C read from its own buffer (ldc, the type and
// batch strides of D; C may be D): a residual added in the GEMM's epilogue (y = x W^T + x_in).
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  DType b_type = DType::kF32;
  DType a_type = DType::kF32, c_type = DType::kF32;  // the CPU twin: f32 only (CUDA: bf16 / f32)
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  int64_t lda_or_packed() const { return lda ? lda : (trans_a ? M : K); }
  int64_t ldb_or_packed() const { return ldb ? ldb : (trans_b ? K : N); }
  int64_t ldc_or_packed() const { return ldc ? ldc : N; }
};

// RoPE's parameters (HF rotate_half: dims [0, D/2) pair with [D/2, D)).
// inv_freq[i] = 1 / theta^(2i / D) in f32, then llama3 scaling when `llama3`
// (transformers' _compute_llama3_parameters, in f32).
// rope_type "linear" (Gemma 3's global layers): inv_freq / linear_factor, after the rest.
struct RopeParams {
  double theta = 10000.0;
  int64_t head_dim = 0;
  bool llama3 = false;
  double linear_factor = 1.0;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};
std::vector<float> rope_inv_freq(const RopeParams& p);  // [D/2]

// The attention scores beyond the causal mask (Gemma): s = (q . k) * scale, then with softcap > 0
// s = softcap * tanh(s / softcap) (transformers' attn_logit_softcapping, before the mask).
// scale 0: 1 / sqrt(D) (head_dim ** -0.5).
struct AttentionScores {
  float scale = 0.0f;
  float softcap = 0.0f;
  float scale_for(int64_t D) const;  // scale, or 1 / sqrt(D)
};

// The gated MLP's activation: h = act(gate) * up. kSilu: silu(g) = g / (1 + exp(-g)) (Llama's
// SwiGLU); kGeluTanh: gelu(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (Gemma's GeGLU,
// "gelu_pytorch_tanh").
enum class GatedAct { kSilu, kGeluTanh };

// Packed data's pieces (data.packing packed: several documents in one sequence) as attention takes
// them: each token's position in its piece (the cpu twins' rule, attention_fwd below) and, for the
// CUDA twin, the same pieces in cuDNN's ragged layout (ragged_layout, uploaded by the model).
struct AttentionPieces {
  const int64_t* pos = nullptr;     // [B*T] in ctx's memory
  const int32_t* ragged = nullptr;  // CUDA: ragged_layout_ints(max) int32 in device memory
  int64_t max = 0;                  // P: the pieces a pass may hold (the CUDA graphs' batch dimension)
};
// cuDNN's ragged layout of the pieces that pos [n] makes (a piece starts where pos is 0; pos[0] is
// 0) over attention rows [n, heads, D]: out[0, P) each piece's length (0 past the last piece), then
// four arrays of P + 1 offsets, in elements, of each piece's first row (row n past the last
// piece): of q and out (x H*D), of k and v (x Hkv*D), of the row statistics (x H), of the
// gradients dq, dk, dv side by side (x ld_dqkv; zeros when ld_dqkv is 0). Returns the number of
// pieces. Throws Error when they are more than P or an offset passes int32.
int64_t ragged_layout(int32_t* out, const int64_t* pos, int64_t n, int64_t P, int64_t H, int64_t Hkv, int64_t D,
                      int64_t ld_dqkv = 0);
inline int64_t ragged_layout_ints(int64_t P) { return 5 * P + 4; }

// Deterministic dropout: the keep decision of one element is a pure function of (seed, step,
// module_id, index), index = the element's position in the GLOBAL batch
// ((row_offset + local row) * width + column), so a sample's mask does not depend on how the batch
// is split over ranks. splitmix64 chain, top 24 bits -> u in [0, 1); kept when u >= p; kept
// elements scaled by 1 / (1 - p). REQUIRES: 0 <= p < 1.
struct DropoutKey {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t module_id = 0;
  int64_t row_offset = 0;
};
#if defined(__CUDACC__)
#define QS_OPS_HD __host__ __device__
#else
#define QS_OPS_HD
#endif
QS_OPS_HD inline uint64_t dropout_splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// The keep decision (host and device: the CPU and CUDA twins draw the same mask).
QS_OPS_HD inline bool dropout_keep(const DropoutKey& key, int64_t global_index) {
  if (key.p <= 0.0f) return true;
  uint64_t z = dropout_splitmix64(key.seed);
  z = dropout_splitmix64(z ^ key.step);
  z = dropout_splitmix64(z ^ key.module_id);
  z = dropout_splitmix64(z ^ static_cast<uint64_t>(global_index));
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // top 24 bits -> [0, 1)
  return u >= key.p;
}

// scaling = alpha / r, or alpha / sqrt(r) with rsLoRA; 0 when r == 0.
float lora_scaling(double alpha, int64_t r, bool use_rslora);

// HF causal-LM target alignment: targets[b, t] = labels[b, t + 1], targets[b, T-1] = kIgnoreIndex.
std::vector<int64_t> shift_labels(const int64_t* labels /*[B,T]*/, int64_t B, int64_t T);

// Bytes of attention's saved state for the backward on `backend`: the CPU keeps the
// probabilities [B,H,T,T] f32; a fused kernel keeps row statistics.
size_t attention_saved_bytes(Backend backend, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);

// The GPU's attention with its scores in memory (cuda::eager_attention_fwd / _bwd: Gemma 2's
// soft-capped scores, which cuDNN's fused kernels do not take): one sequence at a time, `rows`
// query positions a chunk. Its workspace: the chunk's f32 scores and their gradient, its bf16
// probabilities ([Hkv, rows, T rounded up to 8] each, chunk_bytes together at most unless a chunk
// of 64 rows needs more), and the sequence's f32 dK and dV accumulators ([T, Hkv, D] each).
struct EagerAttentionLayout {
  int64_t T = 0, Hkv = 0, D = 0;
  int64_t rows = 0, ld = 0;  // query positions a chunk; the scores' row stride (floats)
  size_t scores_bytes = 0, probs_bytes = 0, dkv_bytes = 0;
  size_t total() const { return 2 * scores_bytes + probs_bytes + 2 * dkv_bytes; }
  // The most total() any sequence length up to T takes (a shorter one may chunk more rows):
  // what prepare_attention allocates, so that no step allocates.
  size_t bound = 0;
};
constexpr int64_t kEagerAttentionChunkBytes = int64_t{256} << 20;
EagerAttentionLayout eager_attention_layout(int64_t T, int64_t Hkv, int64_t D,
                                            int64_t chunk_bytes = kEagerAttentionChunkBytes);

// One block of copy_2d_batch: dst[r, c] = scale * src[r, c] for r < rows, c < cols (rows ld_dst /
// ld_src apart), zeros when src is null; pointers in the twin's element type.
struct Copy2dBlock {
  void* dst = nullptr;
  int64_t ld_dst = 0;
  const void* src = nullptr;
  int64_t ld_src = 0;
  int64_t rows = 0, cols = 0;
  float scale = 1.0f;
};
constexpr int kCopy2dBatchMax = 32;  // blocks in one copy_2d_batch (the CUDA twin's one launch)

namespace cpu {

void gemm(float* C, const float* A, const void* B, const GemmShape& s, DeviceContext& ctx);
void gemm_into(float* D, const float* A, const void* B, const float* C, const GemmShape& s, DeviceContext& ctx);

// out[n, :] = weight[ids[n], :] (weight in `weight_type`, widened). Throws InputError for an id
// outside [0, V), naming it.
// scale != 1 (Gemma: sqrt(hidden) rounded to weight_type by the caller): out = the product
// weight * scale computed in f32 and rounded to weight_type (transformers multiplies in the
// embedding's dtype), then widened.
void embedding_fwd(float* out /*[N,C]*/, const int64_t* ids /*[N]*/, const void* weight /*[V,C]*/, DType weight_type,
                   int64_t N, int64_t C, int64_t V, DeviceContext& ctx, float scale = 1.0f);

// rstd[n] = 1 / sqrt(mean_c(x^2) + eps); out = weight * (x * rstd) (transformers' LlamaRMSNorm).
// out's rows are ld_out apart (0 = C): a column block of a wider buffer.
void rmsnorm_fwd(float* out /*[N,ld_out]*/, float* rstd /*[N]*/, const float* x /*[N,C]*/, const float* weight /*[C]*/,
                 int64_t N, int64_t C, float eps, DeviceContext& ctx, int64_t ld_out = 0);
// dx += rstd * (g - xhat * mean_c(g * xhat)), g = dout * weight, xhat = x * rstd (rstd saved).
// dout's rows are ld_dout apart (0 = C).
void rmsnorm_bwd(float* dx /*[N,C]*/, const float* dout /*[N,ld_dout]*/, const float* x /*[N,C]*/,
                 const float* weight /*[C]*/, const float* rstd /*[N]*/, int64_t N, int64_t C, DeviceContext& ctx,
                 int64_t ld_dout = 0);

// out = a + b (the residual add). out may alias a or b.
void add(float* out, const float* a, const float* b, int64_t n, DeviceContext& ctx);
// out += b (accumulating a gradient).
void accumulate(float* out, const float* b, int64_t n, DeviceContext& ctx);
// out = x; x = 0.
void copy(float* out, const float* x, int64_t n, DeviceContext& ctx);
void zero(float* x, int64_t n, DeviceContext& ctx);
// dst[r, c] = scale * src[r, c] for r < rows, c < cols, rows ld_dst / ld_src apart; zeros when src
// is null (packing the LoRA fold's operands: scaled B blocks beside a weight, A matrices stacked).
void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols, float scale,
             DeviceContext& ctx);
// copy_2d of each block, as one op (the CUDA twin: one launch for a layer's LoRA fold packing,
// which was 20 launches of copy_2d a bind). REQUIRES: count <= kCopy2dBatchMax; no block's
// destination overlaps another's or any source.
void copy_2d_batch(const Copy2dBlock* blocks, int count, DeviceContext& ctx);
// y[n, :] += bias (a Linear's bias, f32).
void add_bias(float* y /*[N,W]*/, const float* bias /*[W]*/, int64_t N, int64_t W, DeviceContext& ctx);
// out = f32(x) + offset for x in `type` (a frozen norm weight or bias bound in its own dtype;
// offset 1: Gemma's RMSNorm, which multiplies by 1 + weight in f32).
void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx, float offset = 0.0f);

// cos[t, i] = cos(t * inv_freq[i]), sin likewise, t = 0..T-1 (the angle a f32 product, as HF).
void rope_tables(float* cos /*[T,D/2]*/, float* sin /*[T,D/2]*/, const RopeParams& p, int64_t T, DeviceContext& ctx);
// x rotated in place by position t:  y[i] = x[i] cos - x[i+D/2] sin, y[i+D/2] = x[i+D/2] cos + x[i] sin.
// pos [B,T] (packed data; null: position t is t): row (b, t) is rotated by position pos[b*T + t].
void rope_fwd(float* x /*[B,T,nh,D]*/, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh,
              int64_t D, DeviceContext& ctx, const int64_t* pos = nullptr, int64_t ld = 0);
// The transpose (rotation by -angle), in place on a gradient.
// ld (both): elements from one token's row of heads to the next (0: nh * D, packed); a row's nh
// heads are contiguous (ld > nh * D: the heads of a wider row, as q|k|v's gradients side by side).
void rope_bwd(float* dx /*[B,T,nh,D]*/, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh,
              int64_t D, DeviceContext& ctx, const int64_t* pos = nullptr, int64_t ld = 0);

// Causal grouped-query attention: query head h reads kv head h / (H / Hkv) (HF repeat_kv);
// s[t, u] = (q_t . k_u) / sqrt(D) for u <= t (scores: another scale, a soft-cap); softmax over u
// (max subtracted); out_t = sum_u p v_u.
// window > 0: a sliding window (Mistral): query t reads keys t - window < u <= t only
// (transformers' sliding-window causal mask); 0: none.
// pos [B,T] (packed data, text/data_loader.h; null: none): query t reads keys u >= t - pos[t] only,
// its own piece's (documents packed into one sequence attend within themselves).
// saved: attention_saved_bytes(kCpu, ...) bytes, written by the forward, read by the backward.
// REQUIRES: H % Hkv == 0; with pos, 0 <= pos[t] <= t and pos restarting at 0 or rising by 1.
void attention_fwd(float* out /*[B,T,H,D]*/, void* saved, const float* q /*[B,T,H,D]*/,
                   const float* k /*[B,T,Hkv,D]*/, const float* v /*[B,T,Hkv,D]*/, int64_t B, int64_t T, int64_t H,
                   int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window = 0, const int64_t* pos = nullptr,
                   AttentionScores scores = {});
// dq, dk, dv OVERWRITTEN from dout, given the forward's inputs, output and saved state.
// ld_dqkv: elements from one token's row of dq (and of dk, of dv) to the next (0: packed, H * D and
// Hkv * D): q|k|v's gradients side by side in one [B*T, ld] buffer, dk and dv pointing into it.
void attention_bwd(float* dq, float* dk, float* dv, const float* dout /*[B,T,H,D]*/, const float* q, const float* k,
                   const float* v, const float* out, const void* saved, int64_t B, int64_t T, int64_t H,
                   int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window = 0, const int64_t* pos = nullptr,
                   AttentionScores scores = {}, int64_t ld_dqkv = 0);

// Generation's attention: T new queries of one sequence at positions [P, P + T) over a KV cache
// holding positions [0, P + T) (this call's keys and values already appended): query t reads
// keys u <= P + t (and u > P + t - window with a sliding window), with attention_fwd's arithmetic
// (scores in f32, max subtracted, the same order), so a cached step gives attention_fwd's bits
// for the same rows. Scratch: P + T floats of ctx's workspace. REQUIRES: H % Hkv == 0.
void attention_cached_fwd(float* out /*[T,H,D]*/, const float* q /*[T,H,D]*/, const float* k_cache /*[P+T,Hkv,D]*/,
                          const float* v_cache /*[P+T,Hkv,D]*/, int64_t T, int64_t P, int64_t H, int64_t Hkv,
                          int64_t D, DeviceContext& ctx, int64_t window = 0, AttentionScores scores = {});

// h = act(gate) * up (GatedAct: silu by default, Llama's SwiGLU).
void swiglu_fwd(float* h /*[n]*/, const float* gate, const float* up, int64_t n, DeviceContext& ctx,
                GatedAct act = GatedAct::kSilu);
// dgate, dup OVERWRITTEN (act(g) recomputed from the saved gate). In place allowed: dgate may be
// gate and dup up (each element's three inputs are read before its two outputs are written); the
// model's backward writes the gradients over the gate / up it no longer needs.
void swiglu_bwd(float* dgate, float* dup, const float* dh, const float* gate, const float* up, int64_t n,
                DeviceContext& ctx, GatedAct act = GatedAct::kSilu);

// out = x * mask / (1 - p); with p == 0 an exact copy. out may alias x.
void dropout_fwd(float* out /*[N,W]*/, const float* x /*[N,W]*/, const DropoutKey& key, int64_t N, int64_t W,
                 DeviceContext& ctx);

// Cross entropy over n rows of logits (one chunk of the LM head's rows): for each row whose
// target is not kIgnoreIndex, *loss_sum += lse(logits) - logits[target] (in double, on the
// device). With grad_scale != 0 the logits are OVERWRITTEN by their gradient
// (softmax - onehot) * grad_scale, 0 on ignored rows. Throws InputError for a target outside
// [0, V) that is not kIgnoreIndex. The caller chunks the rows so that no [N,V] buffer exists.
// softcap > 0: the logits given are soft-capped ones, y = softcap * tanh(l / softcap)
// (logit_softcap); the gradient is the raw logits' (times 1 - (y / softcap)^2).
void cross_entropy_fwd_bwd(float* logits /*[n,V]*/, double* loss_sum, const int64_t* targets /*[n]*/, int64_t n,
                           int64_t V, float grad_scale, DeviceContext& ctx, float softcap = 0.0f);
// x = cap * tanh(x / cap) in place (f32 logits; Gemma 2's final_logit_softcapping). REQUIRES cap > 0.
void logit_softcap(float* x, int64_t n, float cap, DeviceContext& ctx);

// x[i] = float(dtype(x[i])): rounds f32 values to what `dtype` holds (the backward's operand of a
// 4-bit weight, rounded to its QuantState's dtype as bitsandbytes' dequantize_4bit does, kept in f32
// for the CPU GEMM: ops::dequantize_4bit_rounded).
void round_to_dtype(float* x, int64_t n, DType dtype, DeviceContext& ctx);
// out[i] = x[i] converted (f32, bf16 or f16 each way; round to nearest even when narrowing).
void convert(void* out, DType out_type, const void* x, DType x_type, int64_t n, DeviceContext& ctx);

}  // namespace cpu

// ---- CUDA twins (CUDA builds): activations bf16 (uint16_t bits), device pointers, work on
// ctx.compute(); no allocation, no host synchronization. Ids and targets must be in range: they
// are validated on the host where the data is read (a kernel cannot throw; an out-of-range id
// reads a zero row, an out-of-range target is skipped). Reductions in f32 (RMSNorm, softmax,
// log-sum-exp), outputs rounded to bf16 once. prepare() creates the cuBLASLt handle and its
// workspace (called once, outside the step, by the model's constructor).
namespace cuda {
void prepare(DeviceContext& ctx);
// A, B, C of the types in `s` (bf16 or f32; A and B of one type), f32 accumulation (cuBLASLt,
// CUBLAS_COMPUTE_32F). The algorithm is chosen once per shape and cached, so a resumed run is
// bitwise the straight one on the same GPU.
void gemm(void* C, const void* A, const void* B, const GemmShape& s, DeviceContext& ctx);
void gemm_into(void* D, const void* A, const void* B, const void* C, const GemmShape& s, DeviceContext& ctx);
void embedding_fwd(uint16_t* out, const int64_t* ids, const void* weight, DType weight_type, int64_t N, int64_t C,
                   int64_t V, DeviceContext& ctx, float scale = 1.0f);
void rmsnorm_fwd(uint16_t* out, float* rstd, const uint16_t* x, const float* weight, int64_t N, int64_t C, float eps,
                 DeviceContext& ctx, int64_t ld_out = 0);
void rmsnorm_bwd(uint16_t* dx, const uint16_t* dout, const uint16_t* x, const float* weight, const float* rstd,
                 int64_t N, int64_t C, DeviceContext& ctx, int64_t ld_dout = 0);
void add(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n, DeviceContext& ctx);
void accumulate(uint16_t* out, const uint16_t* b, int64_t n, DeviceContext& ctx);
void copy(uint16_t* out, const uint16_t* x, int64_t n, DeviceContext& ctx);
void zero(uint16_t* x, int64_t n, DeviceContext& ctx);
void copy_2d(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, float scale,
             DeviceContext& ctx);
void copy_2d_batch(const Copy2dBlock* blocks, int count, DeviceContext& ctx);
// upload_async's twin: a kernel reads `src` (pinned host memory, mapped by unified addressing) in
// place; no copy engine.
void upload(void* dst, const void* src, size_t bytes, DeviceContext& ctx);
void add_bias(uint16_t* y, const float* bias, int64_t N, int64_t W, DeviceContext& ctx);
void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx, float offset = 0.0f);
// The tables are computed on the host (the CPU's cos/sin, bit for bit) and copied: a start-up op.
void rope_tables(float* cos, float* sin, const RopeParams& p, int64_t T, DeviceContext& ctx);
// pos: the cpu twins' rule (packed positions; null: none).
void rope_fwd(uint16_t* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos = nullptr, int64_t ld = 0);
void rope_bwd(uint16_t* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos = nullptr, int64_t ld = 0);
// One block per (query, head), one warp per stripe of keys with an online softmax, the warps'
// partial sums merged in shared memory (f32 throughout). REQUIRES: D <= 256.
void attention_cached_fwd(uint16_t* out, const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                          int64_t T, int64_t P, int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx,
                          int64_t window = 0, AttentionScores scores = {});
void swiglu_fwd(uint16_t* h, const uint16_t* gate, const uint16_t* up, int64_t n, DeviceContext& ctx,
                GatedAct act = GatedAct::kSilu);
void swiglu_bwd(uint16_t* dgate, uint16_t* dup, const uint16_t* dh, const uint16_t* gate, const uint16_t* up,
                int64_t n, DeviceContext& ctx, GatedAct act = GatedAct::kSilu);
void dropout_fwd(uint16_t* out, const uint16_t* x, const DropoutKey& key, int64_t N, int64_t W, DeviceContext& ctx);
void cross_entropy_fwd_bwd(float* logits, double* loss_sum, const int64_t* targets, int64_t n, int64_t V,
                           float grad_scale, DeviceContext& ctx, void* dlogits = nullptr,
                           DType dlogits_type = DType::kF32, float softcap = 0.0f);
void logit_softcap(float* x, int64_t n, float cap, DeviceContext& ctx);
void round_to_dtype(float* x, int64_t n, DType dtype, DeviceContext& ctx);
void convert(void* out, DType out_type, const void* x, DType x_type, int64_t n, DeviceContext& ctx);
// Fused attention (cuDNN SDPA, builds with QSHARD_WITH_CUDNN): saved = row statistics
// (attention_saved_bytes(kCuda, ...)); the backward OVERWRITES dq, dk, dv. prepare_attention builds
// and caches the graphs of one shape (start-up work: a build takes ~0.4 s and may allocate).
// window (0 < window < T): the sliding window as cuDNN's diagonal band (left bound = window: key u
// kept when u + window > t, with the causal right bound), a graph of its own.
// pieces (packed data): the B*T rows as up to pieces->max sequences of their own (cuDNN's ragged
// layout with a padding mask: pieces->ragged), graphs of their own (prepare_attention's max_pieces
// builds them); the row statistics then per row [B*T, H].
// scores: the scale is the graphs' attn_scale. A soft-cap (softcap > 0, Gemma 2) runs the eager
// attention below instead (cuDNN 9.19 refused its soft-capped backward graph: attention_cudnn.cpp);
// prepare_attention then allocates its workspace (eager_attention_layout).
// ld_dqkv > 0: also the backward's graphs that write dq, dk and dv rows ld_dqkv apart (and, with
// max_pieces, packed data's).
// Returns whether every backward prepared here (plain and packed) is deterministic.
bool prepare_attention(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       int64_t window = 0, int64_t max_pieces = 0, AttentionScores scores = {},
                       int64_t ld_dqkv = 0);
// The backward's algorithm for graphs built from now on: cuDNN's deterministic one (the default:
// bitwise repeatable gradients; past 2 GiB of workspace in chunks of whole sequences, and the other
// where one sequence is past it) or its non-deterministic one (dQ accumulated by atomics in f32).
void set_attention_deterministic(DeviceContext& ctx, bool deterministic);
// Graphs built from now on bound the deterministic backward's calls (past its 2 GiB limit) by the
// non-deterministic backward's workspace and dQ accumulator (lean: a job with a memory budget) or by
// the limit (the default; fewer calls, faster).
void set_attention_lean_workspace(DeviceContext& ctx, bool lean);
// Graphs built from now on run the deterministic backward in calls of n sequences where n divides
// the batch (unpacked data); 0 (the default): chunks only past the workspace limit. Tests force
// chunks at small shapes with it; each sequence's attention is its own, so the chunks' results are
// the whole batch's.
void set_attention_backward_sequences(DeviceContext& ctx, int64_t n);
// How the backward at this shape runs (building its graphs if they are not yet): sequences a call
// (B when not chunked; packed data is never chunked), whether deterministic, its workspace bytes.
struct AttentionBackwardPlan {
  int64_t sequences_per_call = 0;
  bool deterministic = true;
  int64_t workspace_bytes = 0;
};
AttentionBackwardPlan attention_backward_plan(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                              int64_t D, int64_t window = 0, int64_t max_pieces = 0,
                                              AttentionScores scores = {});
void attention_fwd(uint16_t* out, void* saved, const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t B,
                   int64_t T, int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window = 0,
                   const AttentionPieces* pieces = nullptr, AttentionScores scores = {});
// ld_dqkv > 0 (the cpu twin's rule): the fused kernels only (no soft-cap); with pieces, their ragged
// layout made with the same ld_dqkv.
void attention_bwd(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                   const uint16_t* k, const uint16_t* v, const uint16_t* out, const void* saved, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window = 0,
                   const AttentionPieces* pieces = nullptr, AttentionScores scores = {}, int64_t ld_dqkv = 0);
// The eager attention (attention_eager.cu): the contract of attention_fwd / attention_bwd (the
// saved row statistics [B,H,T] f32 also with packed positions `pos` [B*T], device memory, or
// null), cuBLASLt GEMMs and two kernels, bitwise repeatable; `layout`: eager_attention_layout of
// (T, Hkv, D), `workspace` its total() bytes of device memory.
void eager_attention_fwd(uint16_t* out, void* saved, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                         int64_t B, int64_t H, DeviceContext& ctx, int64_t window, const int64_t* pos,
                         AttentionScores scores, const EagerAttentionLayout& layout, void* workspace);
void eager_attention_bwd(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                         const uint16_t* k, const uint16_t* v, const uint16_t* out, const void* saved, int64_t B,
                         int64_t H, DeviceContext& ctx, int64_t window, const int64_t* pos, AttentionScores scores,
                         const EagerAttentionLayout& layout, void* workspace);
}  // namespace cuda

// ---- the dispatch: activations as void* in ctx.activation_dtype(); the twin of ctx.backend() ----
namespace ops {
// True when this build has the twin of `op` (e.g. "gemm") on `backend`, or with op null, the
// backend's twins at all (the op harness runs every backend and op there is).
bool has_backend(Backend backend, const char* op = nullptr);
// Start-up work of the backend (library handles, their workspaces); once per context.
void prepare(DeviceContext& ctx);
// Start-up work of attention for one shape (the fused kernels' graphs); a no-op on the CPU.
// max_pieces > 0: also packed data's graphs, for passes of up to that many pieces. scores: the
// layers' (a model whose layers differ prepares each kind). Returns whether the backward at this
// shape is bitwise repeatable (false where cuDNN's non-deterministic backward runs: one sequence's
// deterministic workspace past its limit, or packed data past it). ld_dqkv > 0: the backward's
// graphs for gradients rows that far apart too (attention_bwd's ld_dqkv).
bool prepare_attention(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       int64_t window = 0, int64_t max_pieces = 0, AttentionScores scores = {},
                       int64_t ld_dqkv = 0);
// cuda::set_attention_lean_workspace on the CUDA backend (before prepare_attention); a no-op on
// the CPU and in a build without cuDNN.
void set_attention_lean_workspace(DeviceContext& ctx, bool lean);
void gemm(void* C, const void* A, const void* B, const GemmShape& s, DeviceContext& ctx);
void gemm_into(void* D, const void* A, const void* B, const void* C, const GemmShape& s, DeviceContext& ctx);
void embedding_fwd(void* out, const int64_t* ids, const void* weight, DType weight_type, int64_t N, int64_t C,
                   int64_t V, DeviceContext& ctx, float scale = 1.0f);
void rmsnorm_fwd(void* out, float* rstd, const void* x, const float* weight, int64_t N, int64_t C, float eps,
                 DeviceContext& ctx, int64_t ld_out = 0);
void rmsnorm_bwd(void* dx, const void* dout, const void* x, const float* weight, const float* rstd, int64_t N,
                 int64_t C, DeviceContext& ctx, int64_t ld_dout = 0);
void add(void* out, const void* a, const void* b, int64_t n, DeviceContext& ctx);
void accumulate(void* out, const void* b, int64_t n, DeviceContext& ctx);
// out += b over f32 whatever the activation dtype (a LoRA gradient): runtime/accumulate.h's twins.
void accumulate_f32(float* out, const float* b, int64_t n, DeviceContext& ctx);
void copy(void* out, const void* x, int64_t n, DeviceContext& ctx);
void zero(void* x, int64_t n, DeviceContext& ctx);
void copy_2d(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows, int64_t cols, float scale,
             DeviceContext& ctx);
void copy_2d_batch(const Copy2dBlock* blocks, int count, DeviceContext& ctx);
void add_bias(void* y, const float* bias, int64_t N, int64_t W, DeviceContext& ctx);
void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx, float offset = 0.0f);
void rope_tables(float* cos, float* sin, const RopeParams& p, int64_t T, DeviceContext& ctx);
// pos (packed positions) and ld (rows of heads ld apart), the cpu twins' rules: every backend.
void rope_fwd(void* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos = nullptr, int64_t ld = 0);
void rope_bwd(void* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos = nullptr, int64_t ld = 0);
// window > 0: a sliding window (the cpu twins' rule), on every backend. pieces (packed data):
// attention within each piece, on every backend (the CPU reads pieces->pos, CUDA pieces->ragged).
void attention_fwd(void* out, void* saved, const void* q, const void* k, const void* v, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window = 0,
                   const AttentionPieces* pieces = nullptr, AttentionScores scores = {});
// ld_dqkv > 0 (the cpu twin's rule): on CUDA without a soft-cap, pieces->ragged made with it.
void attention_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                   const void* out, const void* saved, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                   DeviceContext& ctx, int64_t window = 0, const AttentionPieces* pieces = nullptr,
                   AttentionScores scores = {}, int64_t ld_dqkv = 0);
void attention_cached_fwd(void* out, const void* q, const void* k_cache, const void* v_cache, int64_t T, int64_t P,
                          int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window = 0,
                          AttentionScores scores = {});
void swiglu_fwd(void* h, const void* gate, const void* up, int64_t n, DeviceContext& ctx,
                GatedAct act = GatedAct::kSilu);
void swiglu_bwd(void* dgate, void* dup, const void* dh, const void* gate, const void* up, int64_t n,
                DeviceContext& ctx, GatedAct act = GatedAct::kSilu);
void dropout_fwd(void* out, const void* x, const DropoutKey& key, int64_t N, int64_t W, DeviceContext& ctx);
// dlogits (optional): the gradient written there in dlogits_type (f32, bf16, f16) instead of over
// the logits (whose contents are then unspecified): the bits convert() of the in-place f32
// gradient would give.
// softcap: the cpu twin's rule (logits already soft-capped by logit_softcap).
void cross_entropy_fwd_bwd(void* logits, double* loss_sum, const int64_t* targets, int64_t n, int64_t V,
                           float grad_scale, DeviceContext& ctx, void* dlogits = nullptr,
                           DType dlogits_type = DType::kF32, float softcap = 0.0f);
// f32 logits (every backend's memory), the cpu twin's rule.
void logit_softcap(float* x, int64_t n, float cap, DeviceContext& ctx);
void round_to_dtype(void* x, int64_t n, DType dtype, DeviceContext& ctx);
// out[i] = x[i] converted between f32, bf16 and f16 (device memory on CUDA).
void convert(void* out, DType out_type, const void* x, DType x_type, int64_t n, DeviceContext& ctx);
// True when gemm() on ctx's backend takes A of a_type with B of b_type (the CPU widens any float
// B per row; cuBLASLt here wants one type): the model converts an operand when it does not.
bool gemm_supports(const DeviceContext& ctx, DType a_type, DType b_type);
// Host -> device copy of `bytes` on the compute stream (`src` pinned host memory on CUDA, so the
// host does not wait; the caller keeps it unchanged until the copy is done). A memcpy on the CPU.
// On CUDA a kernel reads `src` in place (cuda::upload), not the copy engine: a cudaMemcpyAsync
// there queued behind the other streams' large host-to-device copies (the offloaded base's
// prefetch, 110 MB a layer at 8B) and held the compute stream about 2.7 ms each upload (the ids
// and the targets of every micro-batch).
void upload_async(void* dst, const void* src, size_t bytes, DeviceContext& ctx);
// A 4-bit weight as a GEMM's B operand, in the activation dtype, by bitsandbytes 0.50.2's two rules
// (table value * absmax in f32; a nested absmax is f32(f32(code * nested_absmax) + offset)):
//   forward  (gemm_4bit): that f32 product cast STRAIGHT to the activation dtype: on the CPU (f32)
//            not rounded at all; on CUDA rounded once to bf16.
//   backward (MatMul4Bit.backward: dequantize_4bit(B, state).to(grad.dtype)): rounded to the
//            QuantState's dtype `quant_dtype` first, then to the activation dtype.
// They differ where quant_dtype is neither f32 nor the activation dtype (dequant_rules_differ): a
// bf16- or f16-made weight on the CPU, an f16-made one on CUDA.
void dequantize_4bit(void* out, const Dequant4bitArgs& args, DeviceContext& ctx);
// The forward's rule for `count` weights at once (outs[i] receives args[i]): one launch on CUDA for
// up to eight (a decoder layer's projections), the same values as dequantize_4bit on each.
void dequantize_4bit_batch(void* const* outs, const Dequant4bitArgs* args, int count, DeviceContext& ctx);
void dequantize_4bit_rounded(void* out, const Dequant4bitArgs& args, DType quant_dtype, DeviceContext& ctx);
bool dequant_rules_differ(const DeviceContext& ctx, DType quant_dtype);
}  // namespace ops

}  // namespace qshard
