// llama_model.h: a LlamaForCausalLM with LoRA adapters run on a module tree, forward and a
// training step (forward + backward) on the CPU reference ops of llama_layers.h.
//
// What: LlamaModel reads its weights from a module tree built by build_llama_tree /
// load_llama_folder (checkpoint/llama_tree.h): projections are Linear {weight} (f32/bf16/f16) or
// Linear4bit {weight: Params4bit}, optionally with LoRA children lora_A {weight [r,in] f32} and
// lora_B {weight [out,r] f32}. The tree is looked up afresh at every layer call, so a sharded
// trainer may re-point slots in before_layer / before_root (gathered views) and release them in
// after_layer / after_root. 4-bit weights are dequantized to f32 per layer into scratch buffers
// owned by the model and reused for every layer (dequantize_4bit_args_cpu).
//
// Training step (forward_backward), activation checkpointing: the forward keeps only each decoder
// layer's input x_l [B,T,C] (L+1 buffers, the last one the final hidden state); the backward
// recomputes a layer's internals from x_l before going back through it. Hook order:
//   before_root(kForward)  embed                                  after_root(kForward)
//   before_layer(l, kForward)  layer_forward(l)                   after_layer(l, kForward)   l = 0..L-1
//   before_root(kBackward) final norm, lm_head, loss and their backward  after_root(kBackward)
//   before_layer(l, kBackward) layer_backward(l) (recompute + bwd) after_layer(l, kBackward) l = L-1..0
// (The embedding is frozen: nothing flows into it.) forward() runs the first two rows, then the
// head (norm + lm_head, no loss) between before_root(kForward) and after_root(kForward). Gradients: only LoRA A/B; after a layer's backward each LoRA gradient has
// been ADDED into the buffer grad_lookup(fqn) returns, fqn being the tree path of the parameter
// ("model.layers.0.self_attn.q_proj.lora_A.weight"), f32 of the parameter's shape; a null
// buffer skips that gradient. Nothing is zeroed: gradient accumulation is the caller's choice.
// Loss: targets are already aligned with the logits (row t predicts targets[t]; use
// shift_labels() for HF's causal labels); normalizer = number of non-ignored targets over all
// ranks and micro-batches; the returned loss is this call's sum / normalizer.
// Tied embeddings: with no lm_head.weight in the tree (or tie_word_embeddings), the LM head is
// model.embed_tokens.weight.
// Dimension legend: B batch, T sequence, N = B*T, C hidden, H heads, Hkv kv heads, D head dim,
// I intermediate, V vocab, L layers, r LoRA rank.
// Ownership: the model borrows the tree (it must outlive the model) and owns its scratch.
// Thread safety: none (scratch buffers are members). Device: CPU tensors only (checked).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/module_tree.h"
#include "model/llama_layers.h"

namespace qshard {

struct LlamaModelOptions {
  double lora_alpha = 16.0;   // scaling = alpha / r (alpha / sqrt(r) with use_rslora)
  bool use_rslora = false;
  float lora_dropout = 0.0f;  // on the LoRA input of every adapted projection
  uint64_t dropout_seed = 0;
};

// Which half of the step a hook is called for.
enum class Pass { kForward, kBackward };

// f32 buffer of the parameter's shape to add its gradient into, or nullptr to skip it.
using GradLookup = std::function<float*(const std::string& fqn)>;

class LlamaModel {
 public:
  // REQUIRES: `root` follows config (shapes are checked at each use, errors name the fqn).
  LlamaModel(const LlamaConfig& config, Module& root, const LlamaModelOptions& options = {});

  // FSDP hooks (default: empty). Called in the order given in the header comment.
  std::function<void(int64_t layer, Pass pass)> before_layer;
  std::function<void(int64_t layer, Pass pass)> after_layer;
  std::function<void(Pass pass)> before_root;
  std::function<void(Pass pass)> after_root;

  // Dropout keys of the next calls: the optimizer step, and the global row index of local row 0
  // (global index of this rank's first sample * T), so masks do not depend on the world size.
  void set_dropout_context(uint64_t step, int64_t row_offset) { step_ = step; row_offset_ = row_offset; }
  // Training mode (default) applies LoRA dropout; eval mode (false) does not, like PyTorch's
  // model.eval(), so eval losses do not depend on the step or on how sequences map to ranks.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  // ids: [B*T] -> logits [B,T,V].
  std::vector<float> forward(std::span<const int64_t> ids, int64_t B, int64_t T);
  // One training micro-step: returns sum of token losses / normalizer, adds LoRA gradients.
  float forward_backward(std::span<const int64_t> ids, std::span<const int64_t> targets, int64_t B, int64_t T,
                         double normalizer, const GradLookup& grad_lookup);

  // ---- the pieces, for a trainer that drives the loop itself (hooks are NOT called here) ----
  // x: [B,T,C] = embed_tokens.weight[ids].
  void embed(std::span<const int64_t> ids, std::span<float> x, int64_t B, int64_t T);
  // x_out [B,T,C] = decoder layer `layer` applied to x_in [B,T,C]. REQUIRES x_out != x_in.
  void layer_forward(int64_t layer, std::span<const float> x_in, std::span<float> x_out, int64_t B, int64_t T);
  // Recomputes the layer's forward from x_in, then dx [B,T,C] (OVERWRITTEN) = d loss / d x_in
  // given dout = d loss / d x_out; LoRA gradients are added through grad_lookup.
  // REQUIRES dx does not alias x_in or dout.
  void layer_backward(int64_t layer, std::span<const float> x_in, std::span<const float> dout,
                      std::span<float> dx, int64_t B, int64_t T, const GradLookup& grad_lookup);
  // logits [B,T,V] = lm_head(norm(x)).
  void head_forward(std::span<const float> x, std::span<float> logits, int64_t B, int64_t T);
  // Loss of the head on x [B,T,C]; dx [B,T,C] OVERWRITTEN with d loss / d x.
  float head_forward_backward(std::span<const float> x, std::span<const int64_t> targets, std::span<float> dx,
                              int64_t B, int64_t T, double normalizer);

  const LlamaConfig& config() const { return config_; }

 private:
  struct Projection;      // a projection's f32 weight view + LoRA pointers (llama_model.cpp)
  struct LayerWeights;    // one layer's projections and norms
  struct LayerActivations;
  LayerWeights load_layer(int64_t layer);
  void run_layer(const LayerWeights& w, const float* x, LayerActivations& a, int64_t B, int64_t T);
  std::vector<float> float_param(const std::string& fqn, int64_t numel) const;

  LlamaConfig config_;
  Module& root_;
  LlamaModelOptions options_;
  std::vector<float> inv_freq_;
  uint64_t step_ = 0;
  int64_t row_offset_ = 0;
  bool training_ = true;
  std::array<std::vector<float>, 7> weight_scratch_;  // dequantized projections of the current layer
};

}  // namespace qshard
