// llama_buffers.h: the one memory model of LlamaModel: every buffer of the step as a plan.
//
// What: llama_buffer_plan() lists every buffer a LlamaModel allocates for its step, each entry a
// name, a size in bytes and a lifetime:
//   kRun        the activation storage: one device allocation at construction, lives with the model
//               (checkpoints x_l, one layer's internals and gradients, head, RoPE tables, ids,
//               the loss accumulator, per-bind conversions, generation's KV cache);
//   kKept       the internals of each kept layer but the last (LlamaModelOptions::keep_layers),
//               one more allocation, "kept[i].<name>" (all but the two RMSNorm outputs h1 / h2
//               and SwiGLU's m, which the backward recomputes into the working set's; the first
//               full_sets sets, LlamaModelOptions::full_kept_sets, hold those too);
//   kWorkspace  the scratch the model reserves in the context's Workspace (dequantized
//               projections, the fold's widened weights, LoRA and dropout temporaries, one chunk of
//               LM-head logits): reset and reused per layer;
//   kLibrary    memory a library takes on the model's behalf (cuDNN's attention workspace): an
//               estimate, not allocated by the model;
//   kWeights    the dequantized base layers (LlamaModelOptions::dequantized_layers): one slot a
//               layer of llama_dequantized_layer_bytes, one allocation, filled at the layer's first
//               use and read from then on (the frozen base's values do not change);
//   kHost       pinned host memory: one kept set's bytes per host-kept layer but the last two
//               (LlamaModelOptions::host_keep_layers), "host kept[i]"; their device staging sets are
//               kKept entries "host-kept staging[i].<name>"; the checkpoints x_0..x_L-3
//               (host_checkpoints; their device slots, three or more, are the xs entry). Not GPU memory:
//               total() leaves it out.
// The same function serves both sides, so they cannot drift apart:
//   - LlamaModel's constructor measures its tree (LlamaBufferDims from the slots it found), asks
//     for the plan with `bind` set, allocates kRun and kKept storage from it (each entry 256-byte
//     aligned: its `bytes` are already rounded) and reserves total(kWorkspace);
//   - the memory planner (train/memory_plan.h), the start-up refusals and `qshard eval/generate`
//     ask for it from the config alone (llama_buffer_dims: every projection 4-bit, LoRA of one rank
//     on all seven) before any tree exists.
// For a 4-bit tree with LoRA of rank r on all seven projections the two plans are equal entry for
// entry (tested); other trees (dense weights, partial LoRA) allocate no more than the estimate.
// Dimension legend: B batch, T sequence (max_seq), N = B*T rows, NM MLP rows per chunk, C hidden,
// H heads, Hkv kv heads, D head dim, I intermediate, V vocab, L layers, r LoRA rank.
// Thread safety: pure functions and plain structs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "runtime/device_context.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace qshard {

struct LlamaModelOptions;

enum class BufferLife { kRun, kKept, kWorkspace, kLibrary, kHost, kWeights };
const char* buffer_life_name(BufferLife life);

struct BufferEntry {
  std::string name;
  int64_t bytes = 0;        // rounded up to kBufferAlign for kRun / kKept entries
  BufferLife life = BufferLife::kRun;
  void** target = nullptr;  // where the allocation's address goes (a plan made with `bind`)
};

inline constexpr int64_t kBufferAlign = 256;
// bytes rounded up to a whole number of kBufferAlign
inline constexpr int64_t buffer_aligned(int64_t bytes) { return (bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }

class BufferPlan {
 public:
  void add(std::string name, int64_t bytes, BufferLife life, void** target = nullptr);
  const std::vector<BufferEntry>& entries() const { return entries_; }
  int64_t total(BufferLife life) const;
  int64_t total() const;  // the device lifetimes (every one but kHost)
  // The ledger on one line: per lifetime its total and its largest entries (top `top`), "; " apart.
  std::string ledger(int top = 4) const;
  // Allocates one tensor of u8 on `device` holding every entry of `life` and writes each entry's
  // address into its target. zero: zero-filled. Returns an undefined tensor when there are none.
  Tensor allocate(BufferLife life, Device device, bool zero) const;

 private:
  std::vector<BufferEntry> entries_;
};

// The facts of a model that size its buffers: from the tree (the constructor) or estimated from
// the config (llama_buffer_dims).
struct LlamaBufferDims {
  int64_t L = 0, C = 0, I = 0, V = 0, H = 0, Hkv = 0, D = 0;
  int64_t B = 1, T = 0, N = 0;       // max_batch, max_seq, max rows
  int64_t NM = 0;                    // MLP rows per chunk (N: whole)
  int64_t max_in = 0, max_out = 0, max_r = 0;
  int64_t dequant_elems = 0;         // per layer: projections dequantized / converted into the workspace
  int64_t round_elems = 0;           // the largest 4-bit projection the backward dequantizes again,
                                     // rounded to its QuantState's dtype (ops::dequant_rules_differ)
  int64_t lora_elems = 0;            // per layer: sum of r * (in + out) (the bf16 conversions of LoRA)
  std::array<int64_t, 2> fold_r{};   // per fold group (q|k|v, gate|up): its ranks' sum (0: not folded)
  std::array<int64_t, 2> fold_extra{};  // per fold group: the widened weights' elements beyond dequant_elems
  bool convert_lora = false;         // LoRA A/B converted from f32 to the activation dtype at bind
  bool convert_head = false;         // the LM head converted into a buffer of the model's
  int64_t kept_sets = 0;             // kept layers but the last
  bool kept_mlp = true;              // device kept sets hold gate / up (false: the backward recomputes them)
  bool host_kept_mlp = true;         // the host tier's sets (staging and host) hold gate / up
  int64_t full_sets = 0;             // of the kept sets, the first full_sets also hold h1, h2 and m
                                     // (LlamaModelOptions::full_kept_sets; whole sets, whole MLP only)
  int64_t dequantized_layers = 0;    // layers whose projections stay dequantized in a slot of their own
                                     // (LlamaModelOptions::dequantized_layers; at most L)
  int64_t host_sets = 0;             // host-kept layers (pinned host sets)
  int64_t staging_sets = 0;          // their device staging sets (min(host_sets, options.host_staging_sets))
  bool host_checkpoints = false;     // x_l through checkpoint_slots device slots, the rest in pinned memory
  int64_t checkpoint_slots = 0;      // with host_checkpoints: the device slots (the ring's, + the scratch)
  int64_t checkpoint_every = 1;      // options.checkpoint_every (1 or 2)
  int64_t checkpoints = 0;           // the layer inputs kept (llama_checkpoint_count)
  int64_t kv_cache_tokens = 0;
  bool dropout = false;              // LoRA dropout's masked inputs in the workspace
  int64_t head_rows = 0;             // LM-head logits rows per chunk
  bool qk_norm = false;              // Qwen3's q / k norms: their inputs and rstd kept per layer
  bool gemma_norms = false;          // Gemma's post-attention / post-MLP norms: their inputs and gradients
  bool eager_attention = false;      // CUDA, soft-capped scores (Gemma 2): the eager attention's workspace
  bool local_rope = false;           // Gemma 3: the sliding layers' own RoPE tables
  bool positions = false;            // packed data's positions [N] int64 (options.packed_positions)
  int64_t ragged_ints = 0;           // CUDA, packed: ragged_layout's int32 arrays (llama_ops.h)
};

// Rows of LM-head logits per chunk for a vocabulary of V and N rows (options.head_chunk_bytes).
int64_t llama_head_rows(int64_t head_chunk_bytes, int64_t V, int64_t N);

// The dims of a model built from `config` with `options`: every projection 4-bit with LoRA of
// rank `lora_r` (0: none) on all seven, folded per options.fold_lora; `head_dtype` the LM head's.
LlamaBufferDims llama_buffer_dims(const LlamaConfig& config, const LlamaModelOptions& options, Backend backend,
                                  DType activation_dtype, DType head_dtype, int64_t lora_r);

// The activation pointers a plan made with `bind` fills (LlamaModel's; in the activation dtype
// unless noted; [rows, cols]).
struct LlamaInternals {  // one layer's forward results that its backward reads
  void* h1 = nullptr;         // [N, C + R_qkv] input_layernorm(x) (and, folded, x A_qkv^T)
  float* rstd1 = nullptr;     // [N] f32
  void* q = nullptr;          // [N, H*D] after RoPE
  void* k = nullptr;          // [N, Hkv*D] after RoPE
  void* q_raw = nullptr;      // [N, H*D] q_proj's output before q_norm (qk_norm only)
  void* k_raw = nullptr;      // [N, Hkv*D] k_proj's output before k_norm (qk_norm only)
  float* rstd_q = nullptr;    // [N*H] f32 (qk_norm only)
  float* rstd_k = nullptr;    // [N*Hkv] f32 (qk_norm only)
  void* v = nullptr;          // [N, Hkv*D]
  void* att_saved = nullptr;  // attention_saved_bytes(...)
  void* a = nullptr;          // [N, H*D] attention output (o_proj input)
  void* x2 = nullptr;         // [N, C] x + o_proj(a)
  void* h2 = nullptr;         // [N, C + R_gu] post_attention_layernorm(x2)
  float* rstd2 = nullptr;     // [N] f32
  void* g = nullptr;          // [NM, I] gate_proj(h2)
  void* u = nullptr;          // [NM, I] up_proj(h2)
  void* m = nullptr;          // [NM, I] silu(g) * u (down_proj input; a kept set: full sets only)
  // o_proj's and down_proj's LoRA x A^T from the forward ([N, r] / [NM, r]; with LoRA only): their
  // row-folded backward reads it in place of the same GEMM again (LlamaModel::linear_bwd)
  void* t_o = nullptr;
  void* t_dn = nullptr;
};
struct LlamaActivations : LlamaInternals {
  Tensor storage, kept_storage;
  std::vector<LlamaInternals> kept;  // kept_sets sets: layers L-keep .. L-2 (the last: the working set),
                                     // then staging_sets staging sets of the host-kept layers
  LlamaInternals work;               // the working set's pointers (saved while a kept set is in use)
  // Points the internals at set `s`; a kept set but a full one has no h1 / h2 / m (recomputed in
  // the backward): the working set's serve.
  void use(const LlamaInternals& s) {
    static_cast<LlamaInternals&>(*this) = s;
    if (!s.h1) h1 = work.h1;
    if (!s.h2) h2 = work.h2;
    if (!s.m) m = work.m;
    if (!s.g) g = work.g;  // a kept set without the MLP's gate / up (options.kept_mlp / host_kept_mlp false)
    if (!s.u) u = work.u;
  }
  void* xs = nullptr;        // [L+1, N, C] layer inputs (checkpoints); xs[L] the final hidden state
  // gradients
  // Gemma's output norms (gemma_norms; the working set only: a kept layer's backward recomputes them)
  void* ao = nullptr;        // [N, C] o_proj's output (post_attention_layernorm's input)
  float* rstd_ao = nullptr;  // [N] f32
  void* dao = nullptr;       // [N, C] its gradient
  void* dn = nullptr;        // [NM, C] down_proj's output (post_feedforward_layernorm's input)
  float* rstd_dn = nullptr;  // [NM] f32
  void* ddn = nullptr;       // [NM, C] its gradient
  void* dx = nullptr;        // [N, C] the residual stream's gradient (updated in place by each layer)
  void* dm = nullptr;        // [NM, I] (m's buffer without LoRA dropout: llama_buffer_aliases); the
                             // gate / up gradients go over g / u (model/llama_model.cpp)
  void* dh2 = nullptr;       // [N, C + R_gu] (dh1's buffer: llama_buffer_aliases)
  void* da = nullptr;        // [N, H*D] (dh1's buffer without q/k norms)
  void* dq = nullptr;        // [N, H*D], or [N, H*D + 2 Hkv*D] rows: dq|dk|dv side by side (qkv_fused_ld)
  void* dk = nullptr;        // [N, Hkv*D] packed, in dq's buffer after N H*D elements
  void* dk_raw = nullptr;    // [N, Hkv*D] the gradient before k_norm (qk_norm; q's goes through da)
  void* dv = nullptr;        // [N, Hkv*D] packed, in dq's buffer after dk
  void* dh1 = nullptr;       // [N, C + R_qkv]
  // head
  void* xf = nullptr;        // [N, C] final norm (dh1's buffer)
  float* rstdf = nullptr;    // [N] f32
  void* dxf = nullptr;       // [N, C] (dq's buffer where H*D >= C)
  float* rope_cos = nullptr; // [T, D/2] f32
  float* rope_sin = nullptr; // [T, D/2] f32
  float* rope_cos_local = nullptr;  // [T, D/2] f32 (local_rope: Gemma 3's sliding layers)
  float* rope_sin_local = nullptr;
  int64_t* ids = nullptr;    // [N]
  int64_t* targets = nullptr;// [N]
  int64_t* positions = nullptr;  // [N] packed data's positions (LlamaBufferDims::positions)
  int32_t* ragged = nullptr;     // [ragged_ints] the pieces in cuDNN's ragged layout (CUDA, packed)
  double* loss_sum = nullptr;// [1] f64 accumulator
  float* norms = nullptr;    // [3C (+ 2D) (+ 2C)] f32: the bound layer's two norms, the root's final
                             // norm (the bound layer's q / k norms; its output norms: BindScratch)
  float* biases = nullptr;   // [7, max_out] f32: the bound layer's biases
  void* lora_cat = nullptr;  // the fold: the bound layer's A matrices stacked per group [R_qkv + R_gu, C]
  void* dequantized = nullptr;  // [dequantized_layers] slots of llama_dequantized_layer_bytes (kWeights)
  Tensor dequantized_storage;
  void* lora_cvt = nullptr;  // the bound layer's LoRA A/B in the activation dtype (convert_lora)
  void* head_cvt = nullptr;  // [V, C] the LM head in the activation dtype (convert_head)
  bool head_converted = false;  // head_cvt holds the bound root's head
  void* k_cache = nullptr;   // [L, kv_cache_tokens, Hkv*D] generation's keys (after RoPE)
  void* v_cache = nullptr;   // [L, kv_cache_tokens, Hkv*D] and values
};

// The layer inputs a training step keeps as checkpoints (LlamaModelOptions::checkpoint_every): every
// `every`-th of x_0..x_L, and x_L-1 and x_L (the last layer's backward and the head read them
// straight after the forward). llama_checkpoint_index: l's place among them, or -1.
int64_t llama_checkpoint_count(int64_t L, int64_t every);
int64_t llama_checkpoint_index(int64_t l, int64_t L, int64_t every);
// The buffers the checkpoints need at most: one each, and (every 2) the scratch an odd layer's
// input is recomputed into.
int64_t llama_checkpoint_buffers(int64_t L, int64_t every);
// The device slots of the checkpoint ring (host_checkpoints): the dims' slots less the scratch.
int64_t llama_checkpoint_ring_slots(const LlamaBufferDims& dims);

// One kept set's bytes: a device kept set's (full: one of the first dims.full_sets, which hold h1,
// h2 and m too), or (host_tier) a staging set's and a host set's. The kept storage holds the full
// sets, the other kept sets, then the staging sets, each contiguous at its own size.
int64_t llama_kept_set_bytes(const LlamaBufferDims& dims, Backend backend, DType activation_dtype,
                             bool host_tier = false, bool full = false);
// The device kept sets' bytes together (full ones and the others): where the staging sets begin.
int64_t llama_kept_sets_bytes(const LlamaBufferDims& dims, Backend backend, DType activation_dtype);

// One dequantized layer's slot (LlamaModelOptions::dequantized_layers): what a layer's
// projections take in the workspace when dequantized (the fold's widened weights, the row-folded
// ones' A rows), each piece kBufferAlign-aligned.
int64_t llama_dequantized_layer_bytes(const LlamaBufferDims& dims, DType activation_dtype);

// After the plan's allocation: the buffers that share another's memory (dh2, da, xf, dxf; dk and dv
// packed in dq's buffer).
void llama_buffer_aliases(const LlamaBufferDims& dims, DType act_t, LlamaActivations& a);

// Every buffer of a model with `dims`. bind: the activations whose pointers the entries target
// (its `kept` is resized to dims.kept_sets); null: an estimate.
BufferPlan llama_buffer_plan(const LlamaBufferDims& dims, Backend backend, DType activation_dtype,
                             LlamaActivations* bind = nullptr);

}  // namespace qshard
