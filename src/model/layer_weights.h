// layer_weights.h: the weights a LlamaModel computes with, typed, as their owner hands them over.
//
// What: LayerWeights is one decoder layer's operands in their stored form: per projection the
// frozen base (4-bit kernel arguments, or a dense [out,in] tensor), its bias, the LoRA operands
// A [r,in] / B [out,r] (in the activation dtype when the owner keeps compute copies, else f32) and
// the f32 gradient buffers of A and B (null: none); the layer's two RMSNorm weights (and Qwen3's
// per-head q / k norms). RootWeights is
// the embedding, the final norm and the LM head. Shapes, ranks and 4-bit scalars are fixed when
// the owner resolves its weights, ONCE (registration); only the pointers change afterwards (a
// sharded owner rewrites them at each gather, from entries it found at registration).
// LlamaWeights is the interface the model reads them through (model/llama_model.h): layer(l) after
// the model's before_layer hook (where a sharded trainer gathers layer l), root() after
// before_root. Implementations: the module tree's slots (LlamaTreeSlots, model/llama_binding.h:
// the tree's current tensors, for a model over a whole tree) and the sharded manager's post-gather
// step (ShardedLlamaWeights, train/sharded_llama_weights.h). A read builds no string and looks up
// no name; an error path (a weight not available) names the parameter.
// The model converts what the GEMMs do not take as they are (norms and biases to f32, f32 LoRA
// operands to the activation dtype) into its own buffers at bind (LayerBinding).
// Dimension legend: C hidden, V vocab, r LoRA rank; in/out a projection's input/output width.
// Ownership: pointers borrowed from the owner, valid until its unit is released (sharded) or the
// tree changes. Thread safety: none.
#pragma once

#include <array>
#include <cstdint>

#include "quant/blockwise.h"
#include "runtime/tensor.h"

namespace qshard {

// A tensor operand by pointer and dtype (its shape is known from the config).
struct WeightRef {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

struct ProjectionWeights {
  int64_t in = 0, out = 0;
  bool quantized = false;
  Dequant4bitArgs q;                 // when quantized: pointers + the QuantState's scalars
  DType weight_dtype = DType::kF32;  // QuantState dtype (quantized) or the dense tensor's dtype
  const void* dense = nullptr;       // when not quantized: [out,in] in weight_dtype
  WeightRef bias;                    // [out], null data: none
  int64_t r = 0;                     // LoRA rank (0: no adapter)
  WeightRef lora_A;                  // [r,in]
  WeightRef lora_B;                  // [out,r]
  float* grad_A = nullptr;           // [r,in] f32, gradients ADDED (backward); null: none
  float* grad_B = nullptr;           // [out,r] f32
};

struct LayerWeights {
  std::array<ProjectionWeights, 7> proj;  // kLlamaProjections order (model/llama_binding.h)
  WeightRef input_norm;                   // [C]
  WeightRef post_norm;                    // [C] the MLP's input norm (mlp_norm_name: Gemma's pre_feedforward_layernorm)
  WeightRef q_norm, k_norm;               // [D] (qk_norm: Qwen3, Gemma 3), null data: none
  WeightRef attn_out_norm, mlp_out_norm;  // [C] (gemma_norms: post_attention_ / post_feedforward_layernorm), null: none
};

struct RootWeights {
  WeightRef embed;  // [V,C]
  WeightRef norm;   // [C]
  WeightRef head;   // [V,C] (the embedding when tied)
};

class LlamaWeights {
 public:
  virtual ~LlamaWeights() = default;
  // The current weights of decoder layer `layer` / of the root. Errors (an unavailable weight, a
  // weight on the other device) name the parameter.
  virtual const LayerWeights& layer(int64_t layer) = 0;
  virtual const RootWeights& root() = 0;
};

}  // namespace qshard
