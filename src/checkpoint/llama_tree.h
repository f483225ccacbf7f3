// llama_tree.h: the module tree of a Hugging Face LlamaForCausalLM (a folder loads into it
// through checkpoint/llama_loader.h).
//
// Tree (module types as in transformers, so FQNs equal HF state-dict keys):
//   LlamaForCausalLM
//     model: LlamaModel
//       embed_tokens: Embedding {weight [V, C]}
//       layers: ModuleList {"0".."L-1": LlamaDecoderLayer
//         self_attn: LlamaAttention {q_proj, k_proj, v_proj, o_proj,
//                                    q_norm, k_norm: LlamaRMSNorm {weight [D]} (qk_norm: Qwen3)}
//         mlp: LlamaMLP {gate_proj, up_proj, down_proj}
//         input_layernorm, post_attention_layernorm: LlamaRMSNorm {weight [C]}}
//       norm: LlamaRMSNorm {weight [C]}
//     lm_head: Linear {weight [V, C]}       (no weight slot when embeddings are tied)
//   Projections are Linear {weight} or, quantized, Linear4bit {weight: Params4bit}; with LoRA each
//   targeted projection also has children lora_A: Linear {weight [r, in] f32, trainable} and
//   lora_B: Linear {weight [out, r] f32, trainable} (PEFT's names without the adapter name).
//   Biases per llama_projection_has_bias (the family's rule). The type names are Llama's for every
//   family (the FQNs, not the types, are what checkpoints hold).
// Legend: V vocab, C hidden, D head dim, L layers, r LoRA rank.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/module_tree.h"

namespace qshard {

struct LoraSpec {
  int64_t r = 0;  // 0: no adapters
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
};

struct LlamaTreeOptions {
  DType dtype = DType::kBF16;               // float weights and the 4-bit weights' original dtype
  std::map<std::string, DType> float_dtypes;  // FQN -> dtype for these weights instead of `dtype`
  std::optional<QuantizeOptions> quant;     // projections in 4-bit when set
  bool shapes_only_4bit = false;            // 4-bit placeholders without bytes (meta tensors): the
                                            // caller replaces every Params4bit (init_random_base)
  LoraSpec lora;
};

// A tree with zero-filled placeholder tensors of the right shapes and dtypes.
std::unique_ptr<Module> build_llama_tree(const LlamaConfig& config, const LlamaTreeOptions& options);

}  // namespace qshard
