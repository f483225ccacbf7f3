// llama_binding.h: the weights of a LlamaModel: the tree's slots found once, and binding.
//
// What: LlamaTreeSlots finds every slot a LlamaModel reads in a module tree built by
// build_llama_tree (checkpoint/llama_tree.h; from a folder by checkpoint/llama_loader.h) ONCE, at construction: names and
// shapes checked, errors name the fqn. Projections are Linear {weight} (f32/bf16/f16) or
// Linear4bit {weight: Params4bit}, optionally with lora_A {weight [r,in] f32} and lora_B
// {weight [out,r] f32}. It also measures what the model's buffers need from the tree (the widest
// projection, the LoRA ranks, the workspace operands, the fold's extra columns: the tree's part of
// LlamaBufferDims, model/llama_buffers.h). As a LlamaWeights (model/layer_weights.h) it hands the
// tree's current tensors (a model over a whole tree: eval, generate, tests); a sharded owner finds
// its own views of the same parameters through layer_slots() / root_slots().
// Binding: bind_layer / bind_root turn a LayerWeights / RootWeights into the LayerBinding /
// RootBinding the passes read: norm weights and biases converted to f32 into the model's scratch,
// f32 LoRA operands converted to the activation dtype there (operands already in it are used as
// they are). No lookup by name and no string is built, except on an error path.
// Dimension legend: C hidden, V vocab, r LoRA rank; in/out a projection's input/output width.
// Ownership: borrows the tree (it outlives the slots). Thread safety: none. Stream: the bind's
// conversions run on ctx.compute().
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/module_tree.h"
#include "model/layer_weights.h"
#include "model/llama_buffers.h"
#include "quant/blockwise.h"
#include "runtime/device_context.h"

namespace qshard {

// The projections of a decoder layer in dropout-module order (module id = layer * 7 + index).
inline constexpr std::array<const char*, 7> kLlamaProjections = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// One projection, bound: the frozen base weight (4-bit kernel arguments, or a dense tensor in its
// own dtype), bias, LoRA weights and gradients.
struct ProjectionBinding {
  int64_t in = 0, out = 0;
  bool quantized = false;
  Dequant4bitArgs q;                   // when quantized
  DType weight_dtype = DType::kF32;    // QuantState dtype (quantized) or the dense tensor's dtype
  const void* dense = nullptr;         // when not quantized: [out,in] in weight_dtype
  const float* bias = nullptr;         // [out] f32 (converted at bind) or null
  int64_t r = 0;
  const void* lora_A = nullptr;        // [r,in] in the activation dtype
  const void* lora_B = nullptr;        // [out,r] in the activation dtype
  float* grad_A = nullptr;             // backward only
  float* grad_B = nullptr;
  float scaling = 0.0f;
};

struct LayerBinding {
  int64_t layer = -1;
  std::array<ProjectionBinding, 7> proj;
  const float* input_norm = nullptr;  // [C] f32
  const float* post_norm = nullptr;   // [C] f32
  const float* q_norm = nullptr;      // [D] f32 (qk_norm), else null
  const float* k_norm = nullptr;      // [D] f32
  const float* attn_out_norm = nullptr;  // [C] f32 (gemma_norms), else null
  const float* mlp_out_norm = nullptr;   // [C] f32 (gemma_norms), else null
};

struct RootBinding {
  const void* embed = nullptr;  // [V,C]
  DType embed_dtype = DType::kF32;
  const float* norm = nullptr;  // [C] f32
  const void* head = nullptr;   // [V,C] (the embedding when tied), a dtype the GEMM takes with
  DType head_dtype = DType::kF32;  // activations (converted into the model's buffer otherwise)
};

// Projection indices in kLlamaProjections order, and the LoRA fold's groups: projections sharing
// one input (q|k|v read h1, gate|up read h2).
enum LlamaProjection : int { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr std::array<std::array<int, 3>, 2> kFoldGroups = {{{kQ, kK, kV}, {kGate, kUp, -1}}};
inline int fold_group(int idx) {
  if (idx == kQ || idx == kK || idx == kV) return 0;
  if (idx == kGate || idx == kUp) return 1;
  return -1;
}

// Where a bind writes what it converts (the model's buffers, model/llama_buffers.h).
struct BindScratch {
  float* biases = nullptr;    // [7, bias_stride] f32
  int64_t bias_stride = 0;
  int64_t head_dim = 0;       // D (the q / k norms' width)
  float* norms = nullptr;     // [3C + 2D (+ 2C)] f32: the layer's two norms, the root's final norm,
                              // the layer's q / k norms (qk_norm), its post-attention and post-MLP
                              // norms (gemma_norms)
  float norm_offset = 0.0f;   // added to every norm weight (Gemma: 1 + weight)
  void* lora_cvt = nullptr;   // LoRA A/B in the activation dtype (when not f32 and no compute copies)
  double lora_alpha = 16.0;   // LoRA scaling = alpha / r (alpha / sqrt(r) with use_rslora)
  bool use_rslora = false;
};

// The tree's slots of the parameters a LlamaModel reads, found once (null: absent).
struct ProjectionSlots {
  Module::Slot* weight = nullptr;  // Linear weight, or Params4bit
  Module::Slot* bias = nullptr;
  Module::Slot* lora_A = nullptr;
  Module::Slot* lora_B = nullptr;
};
struct LayerSlots {
  std::array<ProjectionSlots, 7> proj;
  Module::Slot* input_norm = nullptr;
  Module::Slot* post_norm = nullptr;
  Module::Slot* q_norm = nullptr;  // qk_norm (Qwen3), else null
  Module::Slot* k_norm = nullptr;
  Module::Slot* attn_out_norm = nullptr;  // gemma_norms, else null
  Module::Slot* mlp_out_norm = nullptr;
};
struct RootSlots {
  Module::Slot* embed = nullptr;
  Module::Slot* norm = nullptr;
  Module::Slot* head = nullptr;  // the embedding's slot when tied
};

class LlamaTreeSlots final : public LlamaWeights {
 public:
  // REQUIRES: `root` follows config (checked; errors name the fqn). fold_lora: the fold's extra
  // columns are measured (LlamaModelOptions::fold_lora). The tree's tensors may be meta tensors
  // (shapes only: a sharded tree); layer() / root() then find no data and say so.
  LlamaTreeSlots(const LlamaConfig& config, Module& root, const DeviceContext& ctx, bool fold_lora);
  ~LlamaTreeSlots() override;
  // The tree's part of the buffer dims: max_in, max_out, max_r, dequant_elems, lora_elems, fold_r,
  // fold_extra, convert_head (the other fields are left as they are).
  void measure(LlamaBufferDims& dims) const;
  const LayerSlots& layer_slots(int64_t layer) const;
  const RootSlots& root_slots() const;
  // Layer `layer`'s weights with the shapes and scalars resolved at construction and nothing
  // bound (pointers null): what an owner of other views fills in.
  const LayerWeights& layer_shapes(int64_t layer) const;
  // "model.layers.<l>.<projection>" (for error messages).
  const std::string& projection_fqn(int64_t layer, int idx) const;
  // LlamaWeights: the tree's current tensors (no gradient buffers). The tensors must be on the
  // context's compute device.
  const LayerWeights& layer(int64_t layer) override;
  const RootWeights& root() override;

 private:
  struct Slots;
  const LlamaConfig& config_;
  Device device_;
  std::unique_ptr<Slots> slots_;
};

// A bind: `w` (layer `layer`'s weights) into `b`, converting into `scratch` what the passes do not
// read as it is. REQUIRES: w's shapes are the config's (LlamaTreeSlots::layer_shapes).
void bind_layer(const LayerWeights& w, int64_t layer, const BindScratch& scratch, LayerBinding& b, DeviceContext& ctx);
// The root's: the final norm into scratch.norms + 2C.
void bind_root(const RootWeights& w, int64_t hidden, const BindScratch& scratch, RootBinding& r, DeviceContext& ctx);

}  // namespace qshard
