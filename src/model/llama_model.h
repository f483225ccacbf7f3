// llama_model.h: a LlamaForCausalLM with LoRA adapters: one skeleton for every backend.
//
// What: LlamaModel runs the forward and the training step (forward + backward) of a Llama with
// LoRA on the ops of llama_ops.h, through their dispatch: the DeviceContext picks the backend
// (CPU reference or CUDA), the activation dtype and the stream. Nothing here branches on the
// backend.
//
// Weights: the model reads them through a LlamaWeights (model/layer_weights.h): typed per layer
// (4-bit arguments, norms, LoRA operands and their gradients), resolved once by their owner.
// By default the owner is the module tree itself (LlamaTreeSlots, model/llama_binding.h: every
// slot found ONCE, at construction, from a tree built by build_llama_tree or checkpoint/llama_loader.h);
// a sharded trainer sets its manager's views instead (set_weights; the post-gather step of
// train/sharded_llama_weights.h), and the tree then only gives the shapes. bind_layer(l) /
// bind_root() read the owner's current weights into a LayerBinding. The step does no lookups by
// name and builds no strings (runtime/sync_counters.h counts lookups). 4-bit
// weights are dequantized just in time into the workspace by bitsandbytes 0.50.2's rules
// (ops::dequantize_4bit): the forward multiplies with table value * absmax cast straight to the
// activation dtype (f32 on the CPU: unrounded), the backward's input gradient with the values
// rounded to the QuantState's dtype first (a bf16 model's weights: bf16 values, dequantized again
// per projection into the workspace where the two differ).
//
// Memory: every buffer comes from one plan (model/llama_buffers.h), made from the tree at
// construction, the same function the memory planner calls from the config: the activation
// buffers sized once for (max_batch, max_seq) (the checkpoints x_l [L+1, N, C], one layer's
// internals and gradients, the RoPE tables, kept layers' sets), and the context's Workspace
// reserved for the scratch (dequantized projections, LoRA temporaries, one chunk of LM-head
// logits), reset per layer. The LM head and the loss run in chunks of rows (no [N, V] logits
// buffer in training or eval). The step's time split: model/step_profiler.h.
//
// Training step (forward_backward), activation checkpointing: the forward keeps each decoder
// layer's input x_l; the backward recomputes a layer's internals from x_l (not its down_proj,
// whose output the backward does not read), except for kept layers (options.keep_layers: their
// internals stay in buffers of their own) and the last layer (its internals are still in the
// working set). Long sequences run the MLP in chunks of rows (options.mlp_chunk_rows). Hook order:
//   before_root(kForward)  embed                                  after_root(kForward)
//   before_layer(l, kForward)  layer l                            after_layer(l, kForward)   l = 0..L-1
//   before_root(kBackward) final norm, LM head, loss, their backward   after_root(kBackward)
//   before_layer(l, kBackward) recompute + backward of layer l    after_layer(l, kBackward)  l = L-1..0
// The model binds a unit right after its before_* hook (where a sharded trainer gathers it).
// Gradients: only LoRA A/B, ADDED into the gradient buffers of the layer's LayerWeights (f32, the
// parameter's shape; null skips: the tree's own weights have none); nothing is zeroed.
// Operand dtypes: every GEMM reads activations in the activation dtype; an operand of another
// dtype that the backend's GEMM does not take with it (ops::gemm_supports: on CUDA a dense f32
// weight, an f32 LM head, f32 LoRA weights, the f32 logit gradient) is converted first: a dense
// weight into the workspace per bind, the head into a model-owned buffer at bind_root, f32 LoRA
// weights into a model-owned buffer (an owner with compute copies in the activation dtype hands
// those).
// Host data: ids and targets go up through a ring of pinned staging slots on the compute stream
// (no host wait unless the ring laps a copy that is still queued). Loss: the sum over non-ignored targets of -log p is
// added to a device-side double accumulator (take_loss_sum() reads and clears it); gradients are
// those of sum / normalizer (normalizer: non-ignored targets over all ranks and micro-batches).
// Targets are aligned with the logits (row t predicts targets[t]; shift_labels() for HF labels).
// Tied embeddings: with no lm_head.weight in the tree (or tie_word_embeddings) the LM head is
// model.embed_tokens.weight.
// Dimension legend: B batch, T sequence, N = B*T, C hidden, H heads, Hkv kv heads, D head dim,
// I intermediate, V vocab, L layers, r LoRA rank.
// Ownership: borrows the tree and the context (both outlive the model); owns its activations.
// Thread safety: none. Stream: everything runs on ctx.compute().
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/module_tree.h"
#include "model/llama_binding.h"
#include "model/llama_buffers.h"
#include "model/llama_ops.h"
#include "model/step_profiler.h"
#include "quant/blockwise.h"

namespace qshard {

class OffloadRing;
inline constexpr int64_t kCheckpointSlots = 3;  // options.host_checkpoints: x_l's device slots (at least)

struct LlamaModelOptions {
  double lora_alpha = 16.0;   // scaling = alpha / r (alpha / sqrt(r) with use_rslora)
  bool use_rslora = false;
  float lora_dropout = 0.0f;  // on the LoRA input of every adapted projection
  uint64_t dropout_seed = 0;
  int64_t max_batch = 1;      // activation buffers: B <= max_batch,
  int64_t max_seq = 0;        //   T <= max_seq (0: max_position_embeddings)
  int64_t head_chunk_bytes = int64_t{256} << 20;  // f32 LM-head logits per chunk (rows = this / (4 V))
  bool profile = false;       // time the step's parts with CUDA events (StepProfile; none on the CPU)
  // LoRA folded into the base GEMMs of q|k|v and gate|up (see "LoRA fold" in llama_model.cpp);
  // false: separate LoRA GEMMs per projection (the reference the fold is tested against).
  bool fold_lora = true;
  // With q|k|v folded (and no q/k norms or soft-cap): attention's backward writes
  // dq|dk|dv side by side, one row [N, H*D + 2 Hkv*D] per token, and q|k|v's input gradient is ONE
  // GEMM over it (K = H*D + 2 Hkv*D) against the stacked folded weights, as is the fold's s dt;
  // false: a GEMM per projection, k's and v's adding into q's (the reference it is tested against).
  // Off by default until its GPU tests (OpHarness.Attention's and .Rope's side-by-side cases,
  // ctest -L cuda) have run and it is measured against the unfused step on a GPU.
  bool fuse_qkv_backward = false;
  // Activation memory plan of the training step (forward_backward; train/memory_plan.h chooses):
  // keep_layers: keep_layers decoder layers keep their internals from the forward in buffers of
  // their own (no recompute in the backward): the last layer (it never recomputes: its internals are
  // still in the working set when its backward starts, so 0 and 1 cost the same) and the last
  // keep_layers - 1 of those the host tier leaves (all the last ones without it).
  // The others are recomputed from their checkpoint x_l (activation checkpointing), without
  // down_proj (its output is not needed by the backward). Same arithmetic either way: the same bits.
  int64_t keep_layers = 0;
  // host_keep_layers: as many more of the layers keep_layers leaves to recompute keep their
  // internals in pinned host memory instead (the host tier). The forward writes such a layer's
  // internals into one of two device staging sets and copies them out on the model's offload
  // stream; the backward copies them back into a staging set ahead of the layer (the next one's
  // while this one computes). Events order each copy against the compute stream both ways; the
  // host never waits. The host-kept layers are spread evenly over all the layers but the last (the
  // last of them at the layer before it), so that a copy has the compute of the layers between them,
  // kept or recomputed, to hide behind. Same arithmetic: the same bits.
  // REQUIRES the whole MLP (mlp_chunk_rows 0); more than the recomputed layers are clamped.
  int64_t host_keep_layers = 0;
  // host_staging_sets: the host tier's device staging sets (at least 1; at most host_keep_layers).
  // More let the copies run further behind the compute (the forward's copies out and the backward's
  // copies back, each ring value in slot i % sets), and the last that many host-kept layers never
  // leave the device; each is one more set of the host tier's size on the device.
  int64_t host_staging_sets = 2;
  // kept_mlp false: the device-kept layers' sets hold no gate / up; a kept layer's backward
  // recomputes those two GEMMs (and SwiGLU) from h2, as it recomputes h1 and h2. About a third of a
  // kept layer's bytes at the 8B shape for half of its forward's FLOPs: at a tight budget three such
  // layers for one whole. host_kept_mlp: the same for the host tier's sets (staging and host), on
  // its own: device sets whole beside lean host sets spend the device's room on whole layers while
  // the host tier's copies (bound by PCIe) carry a third of the bytes each. Same kernels on the
  // same inputs: the same bits.
  bool kept_mlp = true;
  bool host_kept_mlp = true;
  // full_kept_sets: this many of the device-kept layers (the earliest of them) also keep their two
  // RMSNorm outputs h1 / h2 (with the fold's x A^T columns) and SwiGLU's m, which a kept layer's
  // backward otherwise reruns (two RMSNorms, the fold's two skinny GEMMs and one SwiGLU: memory-bound
  // kernels, about 2.4% of a step with every layer kept at 8B, session 32) into the working set. About half a
  // whole kept set's bytes again at the 8B shape: worth it only once every layer is kept
  // (train/memory_plan.h). Whole sets (kept_mlp) of a whole MLP only; clamped to the kept sets.
  // Same kernels on the same inputs: the same bits.
  int64_t full_kept_sets = 0;
  // dequantized_layers: the first this many layers keep their projections dequantized (4-bit ones
  // in the activation dtype, laid out as the GEMMs read them: the fold's widened weights, the
  // row-folded backward's [W; A]) in a slot of their own (BufferLife::kWeights) from their first
  // use on: the frozen base's values never change, so each later bind of the layer (the forward and
  // the backward of every micro-batch) packs only the LoRA's columns / rows (which do change) and
  // dequantizes nothing. A layer's slot is remade when its layout changes (the fold is off while
  // training with LoRA dropout and on in evaluation). About a layer's bf16 weights each (439 MB at
  // 8B, r 16); every layer: the workspace holds none. Same values in the same GEMMs: the same bits.
  int64_t dequantized_layers = 0;
  // host_checkpoints: the layer inputs x_0..x_L (activation checkpointing's checkpoints) go
  // through checkpoint_slots device slots (at least kCheckpointSlots) instead of one buffer each:
  // x_0..x_L-slots are copied to pinned host memory as the forward writes them and back ahead of
  // their backward, on the same offload stream and with the same events as the host-kept layers;
  // the last `slots` stay on the device. Long sequences: at 8B the checkpoints are 264 KB a token;
  // more slots where the host holds fewer. Same arithmetic: the same bits.
  bool host_checkpoints = false;
  int64_t checkpoint_slots = kCheckpointSlots;
  // checkpoint_every: 2 keeps only every second layer input (x_0, x_2, .. and x_L-1, x_L; half the
  // checkpoints' memory, device or host); the backward of an odd layer l first reruns layer l-1's
  // forward from x_l-1 into one scratch buffer (an extra forward of about half the layers). The
  // same kernels on the same inputs: the same bits. With host_checkpoints the scratch is one of
  // the checkpoint_slots (>= 2). REQUIRES every layer recomputed (keep_layers <= 1, no host-kept
  // layers). 1: every layer input.
  int64_t checkpoint_every = 1;
  // mlp_chunk_rows: > 0 and below max_batch * max_seq: the MLP runs over rows in chunks of this
  // many (its [rows, I] buffers and gradients chunk-sized: long sequences); the backward
  // recomputes a chunk's gate/up just before its gradients. REQUIRES keep_layers == 0 then.
  int64_t mlp_chunk_rows = 0;
  // Generation (forward_cached): a KV cache of this many positions per layer, [L, tokens, Hkv*D]
  // for keys and for values in the activation dtype. REQUIRES: <= max_seq (the RoPE tables).
  int64_t kv_cache_tokens = 0;
  // Packed data (text/data_loader.h, data.packing packed): forward_backward / forward_loss take
  // each token's position in its piece (a buffer of max_batch * max_seq int64); RoPE rotates by
  // it and attention keeps to the piece (on CUDA, cuDNN's ragged layout of the pieces).
  bool packed_positions = false;
  // Packed data: the most pieces one pass holds (max_batch sequences; the padded tail of a
  // sequence counts as a piece): CUDA's attention graphs are built for it, and a pass with more is
  // refused. 0: max_batch * max_seq (every token its own piece; large graphs: pass the data's).
  int64_t packed_max_pieces = 0;
  // CUDA: bound cuDNN's deterministic attention backward, where its workspace is past 2 GiB, by the
  // non-deterministic one's (more calls of fewer sequences: ops::set_attention_lean_workspace) rather
  // than by 2 GiB. A job with a memory budget sets it.
  bool attention_lean_workspace = false;
};

// What a LlamaModel allocates for `options` (its activation buffers, the workspace it reserves,
// the attention library's estimated workspace): the totals of its buffer plan
// (model/llama_buffers.h), made from the config before any tree exists: every projection 4-bit
// with LoRA of rank `lora_r` (0: none) on all seven, folded per options.fold_lora; `head_dtype`
// the embedding / LM head's dtype. Equal to what the constructor allocates for such a model, and
// never below it for another tree (tested).
struct LlamaStepBytes {
  double activations = 0;          // kRun + kKept
  double workspace = 0;            // kWorkspace
  double workspace_attention = 0;  // kLibrary: the fused attention's own workspace (cuDNN; estimate)
  double total() const { return activations + workspace + workspace_attention; }
};
LlamaStepBytes llama_step_bytes(const BufferPlan& plan);
LlamaStepBytes llama_step_bytes(const LlamaConfig& config, const LlamaModelOptions& options, Backend backend,
                                DType activation_dtype, DType head_dtype, int64_t lora_r);

// One kept layer's internals (LlamaModelOptions::keep_layers: each kept layer but the last costs this,
// with options.kept_mlp's gate / up or not). host_tier: a host-kept layer's instead (options.host_kept_mlp):
// this many bytes of pinned host memory each, and two staging sets this much each on the device.
// full: a full kept set's (options.full_kept_sets: h1, h2 and m too; a whole set's otherwise).
double llama_kept_layer_bytes(const LlamaConfig& config, const LlamaModelOptions& options, Backend backend,
                              DType activation_dtype, int64_t lora_r, bool host_tier = false, bool full = false);

// The GPU's fused attention (cuDNN) takes only a head_dim that is a multiple of 8, and no soft-capped
// scores (Gemma 2's attn_logit_softcapping): on Backend::kCuda either is an InputError naming
// `source` (the model's config) and the value, raised before anything loads; the CPU backend takes
// any even head_dim and soft-caps.
void check_attention_shape(const LlamaConfig& config, Backend backend, const std::string& source);

// Which half of the step a hook is called for.
enum class Pass { kForward, kBackward };

class LlamaModel {
 public:
  // REQUIRES: `root` follows config (checked here; errors name the fqn).
  LlamaModel(const LlamaConfig& config, Module& root, DeviceContext& ctx, const LlamaModelOptions& options = {});
  ~LlamaModel();

  // FSDP hooks (default: empty), in the order of the header comment.
  std::function<void(int64_t layer, Pass pass)> before_layer;
  std::function<void(int64_t layer, Pass pass)> after_layer;
  std::function<void(Pass pass)> before_root;
  std::function<void(Pass pass)> after_root;
  // Where the weights come from: `weights` (borrowed; it outlives the model or is reset first),
  // null: the tree's own (tree_weights()). Its shapes must be the tree's.
  // The dequantized layers' slots (options.dequantized_layers) are remade at each one's next use.
  void set_weights(LlamaWeights* weights) {
    source_ = weights ? weights : tree_.get();
    forget_dequantized();
  }
  // Empties the dequantized layers' slots (options.dequantized_layers): each is dequantized again
  // at its next use. For a caller that changed the frozen base's values under the model.
  void forget_dequantized() { std::fill(dequant_layout_.begin(), dequant_layout_.end(), 0u); }
  LlamaTreeSlots& tree_weights() { return *tree_; }

  // Dropout keys of the next calls: the optimizer step, and the global row index of local row 0.
  void set_dropout_context(uint64_t step, int64_t row_offset) { step_ = step; row_offset_ = row_offset; }
  // Training mode (default) applies LoRA dropout; eval mode does not (like model.eval()).
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  // ---- whole passes (hooks called) ----
  // One training micro-step on ids/targets [B*T] (host): loss sum into the accumulator, LoRA
  // gradients of (sum / normalizer) added into the LayerWeights' gradient buffers.
  // positions [B*T] (packed data; REQUIRES options.packed_positions): each token's position in
  // its piece; empty: position t of a row is t.
  void forward_backward(std::span<const int64_t> ids, std::span<const int64_t> targets, int64_t B, int64_t T,
                        double normalizer, std::span<const int64_t> positions = {});
  // Eval: adds the loss sum of ids/targets to the accumulator; no gradients, no dropout state
  // changes. The same routine serves the trainer's eval and `qshard eval`.
  void forward_loss(std::span<const int64_t> ids, std::span<const int64_t> targets, int64_t B, int64_t T,
                    std::span<const int64_t> positions = {});
  // Reads the loss accumulator and clears it (waits for the compute stream: the one host wait of
  // a step). With options.profile, also adds the timed intervals so far into profile().
  double take_loss_sum();
  // The time split accumulated since the last reset (options.profile on CUDA).
  const StepProfile& profile() const { return profiler_.profile(); }
  void reset_profile() { profiler_.reset(); }
  // Pauses (false) or resumes the profiler's marks (options.profile; between steps): StepProfiler::set_active.
  void set_profiling(bool on) { profiler_.set_active(on); }
  // logits [B,T,V] f32 on the host (for --dump-logits and tests; written chunk by chunk).
  std::vector<float> forward_logits(std::span<const int64_t> ids, int64_t B, int64_t T);
  // Generation (options.kv_cache_tokens > 0; hooks called): ids (one sequence, T new tokens) at
  // positions [pos, pos + T) through every layer, their keys and values appended to the cache
  // (positions past pos + T are dropped: pos rewinds). pos == 0 (the prompt) runs attention_fwd,
  // so its logits are forward_logits' bits; later calls read the cache (attention_cached_fwd).
  // Returns the logits of the last position [V] f32 on the host (waits for the compute stream).
  // REQUIRES: 0 <= pos, T >= 1, pos + T <= kv_cache_tokens.
  std::vector<float> forward_cached(std::span<const int64_t> ids, int64_t pos);

  // ---- the pieces, for tests and trainers that drive the loop (hooks NOT called) ----
  void bind_root();
  void bind_layer(int64_t layer);
  const LayerBinding& layer_binding() const { return layer_; }
  // Activation pointers below are in ctx.activation_dtype(), on ctx's device.
  // x [B,T,C] = embed_tokens.weight[ids]. REQUIRES bind_root().
  void embed(std::span<const int64_t> ids, void* x, int64_t B, int64_t T);
  // x_out = decoder layer (bound) applied to x_in. REQUIRES x_out != x_in.
  void layer_forward(const void* x_in, void* x_out, int64_t B, int64_t T);
  // Recomputes the bound layer from x_in, then dx (OVERWRITTEN) = d loss / d x_in given dout;
  // LoRA gradients ADDED into the bound gradient pointers. dx may be dout (updated in place: the
  // training step's residual gradient); REQUIRES dx does not alias x_in.
  void layer_backward(const void* x_in, const void* dout, void* dx, int64_t B, int64_t T);
  // logits [B,T,V] f32 on the host = lm_head(norm(x)). REQUIRES bind_root().
  void head_forward(const void* x, float* logits, int64_t B, int64_t T);
  // Loss of the head on x: sum into the accumulator; dx (OVERWRITTEN) = d (sum/normalizer) / dx.
  void head_forward_backward(const void* x, std::span<const int64_t> targets, void* dx, int64_t B, int64_t T,
                             double normalizer);

  const LlamaConfig& config() const { return config_; }
  DeviceContext& context() { return ctx_; }
  int64_t max_rows() const { return max_rows_; }
  // Rows of LM-head logits per chunk.
  int64_t head_chunk_rows() const { return head_rows_; }
  // Bytes this model allocated: its activation buffers and the context workspace it reserved.
  LlamaStepBytes allocated_bytes() const;
  // The device memory the libraries took when the model prepared them (cuBLAS / cuDNN handles,
  // kernels, the attention workspace): measured, nullopt on the CPU or when they were ready before.
  std::optional<int64_t> library_bytes() const { return library_bytes_; }
  // Whether the attention backward is bitwise repeatable at the model's shapes (false where cuDNN's
  // non-deterministic backward runs: ops::prepare_attention).
  bool attention_deterministic() const { return attention_deterministic_; }
  // Whether the last layer backward ran q|k|v's backward fused (options.fuse_qkv_backward, qkv_fused_ld).
  bool qkv_backward_fused() const { return qkv_fused_; }
  // Every buffer this model allocated (its tree's plan; the entries' targets are its own).
  const BufferPlan& buffer_plan() const { return plan_; }
  // The layers whose internals go to pinned host memory in forward_backward (ascending).
  std::vector<int64_t> host_kept_layers() const;
  // The layers whose internals stay in device kept sets of their own (ascending; the last layer's
  // working set not among them).
  std::vector<int64_t> device_kept_layers() const;

 private:

  void check_sizes(int64_t B, int64_t T) const;
  BindScratch bind_scratch() const;
  AttentionScores attention_scores() const;  // the config's scale and soft-cap (Gemma)
  GatedAct gated_act() const;                // the MLP's activation
  const float* rope_table(bool sin) const;   // the bound layer's RoPE cos / sin (Gemma 3's sliding layers: their own)
  // cache_pos >= 0: generation (forward_cached): B == 1, positions cache_pos.., the KV cache.
  const void* forward_layers(std::span<const int64_t> ids, int64_t B, int64_t T, bool keep_checkpoints,
                             int64_t cache_pos = -1, std::span<const int64_t> positions = {});
  // ids or targets -> a device buffer, through the next pinned staging slot (asynchronous).
  void upload(int64_t* device_dst, std::span<const int64_t> values);
  void upload_bytes(void* device_dst, const void* values, size_t bytes);
  // The bound layer's forward into the working set (or kept set) of internals; with x_out null the
  // MLP (only its output depends on it) is left to the backward: the recompute.
  // cache_pos >= 0: generation (B == 1): RoPE at positions cache_pos.., K/V appended to the bound
  // layer's cache, attention over it.
  void run_layer(const void* x, void* x_out, int64_t B, int64_t T, int64_t cache_pos = -1);
  void mlp_rows_fwd(int64_t r0, int64_t rows, bool norm);  // gate/up/SwiGLU of rows [r0, r0+rows) into g, u, m
  // forward_backward's layers: kept (-1: recompute) index of layer l's own internals set; the
  // working set holds the last layer's from its forward to its backward (unless chunked).
  int kept_set(int64_t layer) const;
  bool chunked(int64_t N) const;
  void layer_forward_kept(const void* x_in, void* x_out, int64_t B, int64_t T, int set, int64_t cache_pos = -1);
  void layer_backward_impl(const void* x_in, const void* dout, void* dx, int64_t B, int64_t T, int set);
  // The host tier (options.host_keep_layers): layer l's host set index (-1: not host-kept) and the
  // staging set it goes through; a ring's wait, timed as a wait.
  int checkpoint_index(int64_t l) const;  // x_l's place among the checkpoints, or -1 (llama_buffers.h)
  void* checkpoint_at(int64_t l, int64_t NC) const;
  int host_set(int64_t layer) const { return host_index_.empty() ? -1 : host_index_[static_cast<size_t>(layer)]; }
  int staging_set(int h) const;
  void ring_before(OffloadRing& ring, int i, bool write);
  void dequantize_layer();
  // x (and dx) rows ldx apart (0 = the projection's input width); a folded projection reads its
  // group's LoRA columns from the same rows. residual: y = x W^T (+ LoRA) + residual ([N, out],
  // may be y), added in the GEMMs' epilogues (no separate pass over y).
  // t_out: where an unfolded projection's x A^T goes ([N, r]) for its backward to read (keeps_t),
  // else the workspace.
  void linear_fwd(int idx, void* y, const void* x, int64_t N, int64_t ldx = 0, const void* residual = nullptr,
                  void* t_out = nullptr);
  // dy_ext: room for [N, out + r] in the activation dtype where the projection's backward may run
  // row-folded (o_proj, down_proj: row_fold_), else null. t_in: x A^T as this layer's forward left
  // it (linear_fwd's t_out), else null: recomputed.
  void linear_bwd(int idx, void* dx, bool accumulate_dx, const void* dy, const void* x, int64_t N, int64_t ldx = 0,
                  void* dy_ext = nullptr, const void* t_in = nullptr);
  // Whether projection idx's forward x A^T is worth keeping in `buf` for its row-folded backward
  // (LoRA without dropout, a row-folded backward, a set with room for it).
  bool keeps_t(int idx, const void* buf) const;
  // linear_bwd's B: the backward's rounding rule; row_fold: [W; A] (A's r rows below W)
  const void* backward_weight(int idx, GemmShape& s, bool row_fold = false);
  // The LoRA fold of group g (0: q|k|v on h1, 1: gate|up on h2): X A^T into x's extra columns
  // (forward); after the group's input-gradient GEMMs, the A gradients and dx += (s dt) A.
  void fold_fwd(int g, void* x, int64_t N);
  void fold_bwd(int g, void* dx, const void* x, int64_t N);
  int64_t fold_ld(int g) const;  // row stride of the group's input / input-gradient buffers
  // options.fuse_qkv_backward for this layer's backward: the row stride of dq|dk|dv side by side
  // (H*D + 2 Hkv*D), or 0 where the projections run their own GEMMs (q|k|v not folded, q/k norms,
  // a soft-cap, a backward weight other than the forward's, packed data whose offsets of rows that
  // wide pass int32 on CUDA).
  int64_t qkv_fused_ld() const;
  // q|k|v's backward over their gradients side by side (dqkv [N, ld]): dx = dqkv W_qkv (the
  // stacked folded weights' first C columns) and s dt = dqkv W_qkv's LoRA columns, one GEMM each,
  // then each projection's dB; fold_bwd(0) follows.
  void qkv_bwd_fused(void* dx, const void* dqkv, int64_t ld, const void* x, int64_t N);
  void* lora_cat(int g) const;    // the group's stacked A matrices [R_g, C] in the model's buffer
  DropoutKey dropout_key(int idx) const;
  // The head over rows [0, N) of x: logits chunk by chunk; with grad_scale != 0 also dx;
  // with logits_out (host) the logits are copied out instead of the loss being taken.
  void head_chunks(const void* x, const int64_t* targets, void* dx, int64_t N, float grad_scale, float* logits_out);
  void* act(void* base, int64_t elems) const;  // base + elems activation-dtype elements
  const void* act(const void* base, int64_t elems) const;

  LlamaConfig config_;
  DeviceContext& ctx_;
  const int64_t* pos_ = nullptr;  // this pass's packed positions (act_->positions) or null
  AttentionPieces pieces_;        // this pass's pieces (packed data; pos_ non-null)
  int64_t max_pieces_ = 0;        // options.packed_max_pieces resolved
  std::vector<int32_t> ragged_host_;  // ragged_layout's arrays made on the host (CUDA, packed)
  LlamaModelOptions options_;
  int64_t max_rows_ = 0, max_seq_ = 0, head_rows_ = 0, mlp_rows_ = 0;
  std::unique_ptr<LlamaTreeSlots> tree_;  // the tree's slots, found once (model/llama_binding.h)
  LlamaWeights* source_ = nullptr;        // what bind reads: tree_ or set_weights'
  BufferPlan plan_;
  std::unique_ptr<LlamaActivations> act_;
  LayerBinding layer_;
  RootBinding root_binding_;
  // The bound layer's projections as GEMM operands [out,in] in the activation dtype (dequantized
  // into the workspace, or a dense weight of that dtype); null: a dense weight in its own dtype.
  std::array<const void*, 7> weights_{};
  // The bound layer's fold (set by dequantize_layer): per group whether it is folded and its
  // total rank R; per projection its column offset in the group's R LoRA columns.
  std::array<bool, 2> fold_{};
  std::array<int64_t, 2> fold_r_{};
  std::array<int64_t, 7> fold_off_{};
  // Per projection whether its backward is row-folded (set by dequantize_layer; o_proj and
  // down_proj): its dequantized weight has A's r rows below W ([W; A], [out + r, in]), and
  // dx = [dy | s dt] [W; A] is one GEMM (linear_bwd).
  std::array<bool, 7> row_fold_{};
  // options.dequantized_layers: per slot the layout its weights were made for (dequant_layout()),
  // 0 while empty; each slot dequant_slot_bytes_ bytes at act_->dequantized.
  std::vector<uint32_t> dequant_layout_;
  int64_t dequant_slot_bytes_ = 0;
  uint32_t dequant_layout() const;  // the bound layer's: its fold and row folds (never 0)
  StepProfiler profiler_;
  void mark(StepPart part, uint32_t line = std::source_location::current().line()) { profiler_.mark(part, line); }
  struct Staging;  // pinned host slots for ids/targets uploads
  std::unique_ptr<Staging> staging_;
  // The host tier (model/offload_ring.h): one offload stream; the host-kept layers' sets and the
  // checkpoints x_0..x_L (options.host_checkpoints), each through its ring of device slots.
  std::unique_ptr<Stream> offload_;
  std::unique_ptr<OffloadRing> kept_ring_, ckpt_ring_;
  std::vector<int> host_index_;  // per layer: its host set, or -1
  std::vector<int> kept_index_;  // per layer: its device kept set, or -1
  int64_t device_kept_sets_ = 0;  // act_->kept's first entries (the staging sets follow)
  uint64_t step_ = 0;
  int64_t row_offset_ = 0;
  int64_t chunk_row_offset_ = 0;  // the MLP chunk's first row (dropout keys are per global row)
  bool training_ = true;
  std::optional<int64_t> library_bytes_;
  bool attention_deterministic_ = true;
  bool qkv_fused_ = false;
  int64_t qkv_ld_ = 0;     // dq|dk|dv's row where the config lets q|k|v's backward fuse, else 0
  int64_t ragged_ld_ = 0;  // the ld_dqkv this pass's ragged layout was made with (CUDA, packed data)
};

}  // namespace qshard
