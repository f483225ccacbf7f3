// llama_tree.h: the module tree of a Hugging Face LlamaForCausalLM, and loading a model folder
// (f32/bf16/f16, or bitsandbytes 4-bit as transformers saves it) into it.
//
// Tree (module types as in transformers, so FQNs equal HF state-dict keys):
//   LlamaForCausalLM
//     model: LlamaModel
//       embed_tokens: Embedding {weight [V, C]}
//       layers: ModuleList {"0".."L-1": LlamaDecoderLayer
//         self_attn: LlamaAttention {q_proj, k_proj, v_proj, o_proj}
//         mlp: LlamaMLP {gate_proj, up_proj, down_proj}
//         input_layernorm, post_attention_layernorm: LlamaRMSNorm {weight [C]}}
//       norm: LlamaRMSNorm {weight [C]}
//     lm_head: Linear {weight [V, C]}       (no weight slot when embeddings are tied)
//   Projections are Linear {weight} or, quantized, Linear4bit {weight: Params4bit}; with LoRA each
//   targeted projection also has children lora_A: Linear {weight [r, in] f32, trainable} and
//   lora_B: Linear {weight [out, r] f32, trainable} (PEFT's names without the adapter name).
// Legend: V vocab, C hidden, L layers, r LoRA rank.
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
  LoraSpec lora;
};

// A tree with zero-filled placeholder tensors of the right shapes and dtypes.
std::unique_ptr<Module> build_llama_tree(const LlamaConfig& config, const LlamaTreeOptions& options);

// The dtype each float tensor of DIR's safetensors is stored in (headers only, no data read), for
// LlamaTreeOptions::float_dtypes: a tree built with it holds the folder's frozen tensors
// (embeddings, norms, lm_head) in their stored dtypes, so they are written back as they came in.
std::map<std::string, DType> folder_float_dtypes(const std::string& dir);

// Reads DIR/config.json and the folder's weights into a tree (strict: every tensor the config
// implies must be there with its shape, nothing else may be), each float tensor in its stored
// dtype. A bitsandbytes folder gives Params4bit projections with the statistics as stored.
struct LoadedLlama {
  LlamaConfig config;
  std::unique_ptr<Module> tree;
};
LoadedLlama load_llama_folder(const std::string& dir);

}  // namespace qshard
