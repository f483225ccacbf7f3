// hf_config.h: a Hugging Face config.json of a Llama-family model, parsed and validated into LlamaConfig.
//
// Families (config.json's model_type; docs/ARCHITECTURE.md, "Model families"): "llama",
// "qwen2" (Qwen2 / Qwen2.5: q/k/v projections with a bias, o_proj without; use_sliding_window
// must be false), "qwen3" (an RMSNorm over head_dim on each head of q and k before RoPE:
// self_attn.q_norm / k_norm; attention_bias on all four attention projections; use_sliding_window
// must be false) and "mistral" (Llama's math, no biases, sliding_window: each token attends to the
// last sliding_window positions, itself included) and "phi3" (Phi3ForCausalLM: Llama's math with q|k|v
// fused in self_attn.qkv_proj and gate|up in mlp.gate_up_proj in the files, split into qshard's
// separate projections on load and fused again on export: checkpoint/fused_projections.h; plain
// RoPE only (rope_scaling null; longrope / su refused by key and value), partial_rotary_factor 1,
// sliding_window as Mistral's, resid_pdrop / embd_pdrop / attention_dropout 0), "gemma2" and
// "gemma3_text" (Gemma 2 / Gemma 3's text model, Gemma2ForCausalLM / Gemma3ForCausalLM: every RMSNorm
// multiplies by 1 + weight; post_attention_layernorm normalizes the attention's output before the
// residual add, pre_feedforward_layernorm is the MLP's input norm and post_feedforward_layernorm
// normalizes its output; GeGLU (gelu_pytorch_tanh); the embeddings times sqrt(hidden_size);
// attention scaled by query_pre_attn_scalar^-0.5; layer_types' "sliding_attention" layers with
// sliding_window, the others full; Gemma 2: tanh soft-capping of the attention scores
// (attn_logit_softcapping) and of the logits (final_logit_softcapping); Gemma 3: q_norm / k_norm as
// Qwen3's, the sliding layers' own RoPE (rope_local_base_freq, or rope_parameters'
// "sliding_attention"), linear RoPE scaling on the full layers; transformers ignores a Gemma 3
// attn_logit_softcapping, and so does qshard). Any other model_type is refused by name ("gemma3",
// the multimodal model, pointing at gemma3_text).
// What: the fields of transformers' LlamaConfig (and the families' configs) that qshard uses (shared/FORMATS.md, "HF Llama
// folder"): sizes, heads (GQA), RoPE (rope_theta and rope_scaling of type "llama3", or the newer
// single rope_parameters field), norms, tied embeddings, biases, token ids, dtype. The parsed
// JSON is kept as well (raw, as read: quantization_config and dtype included), so a folder
// rewritten by qshard keeps every field it does not know, and load() remembers the folder, so an
// export can carry its other files (generation_config.json, tokenizer) along.
// Errors: InputError naming the file, the key and what was expected (missing file, bad JSON, a
// missing or mistyped field, a non-positive size, heads that do not divide, unsupported act).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace qshard {

struct RopeScaling {
  std::string rope_type = "default";  // "default" | "llama3" | "linear"
  double factor = 1.0;                 // llama3's and linear's (inv_freq / factor)
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

// The decoder families qshard runs (one skeleton: transformers' Llama layer plus the options below).
enum class ModelFamily { kLlama, kQwen2, kQwen3, kMistral, kPhi3, kGemma2, kGemma3 };
// "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text" (config.json's model_type).
const char* model_family_name(ModelFamily family);

struct LlamaConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q_proj, k_proj, v_proj have a bias (Qwen2: always)
  bool o_proj_bias = false;     // o_proj has a bias (Llama, Qwen3: attention_bias; Qwen2: never)
  bool mlp_bias = false;
  bool qk_norm = false;         // Qwen3: self_attn.q_norm / k_norm ([head_dim] RMSNorm per head, before RoPE)
  // Mistral, Phi-3: a key at position j is seen from position i when i - sliding_window < j <= i
  // (transformers' sliding-window causal mask); 0: none (plain causal attention).
  int64_t sliding_window = 0;
  // Gemma: per layer whether sliding_window applies (config.json's layer_types, or the family's
  // default pattern); empty: every layer (Mistral, Phi-3). layer_window() reads it.
  std::vector<bool> sliding_layers;
  // Gemma (gemma2, gemma3_text): the norms, the activation, the scales and the caps of the family
  // comment above; zero / false for the other families.
  bool gemma_norms = false;            // 1 + weight, and the post-attention / pre- and post-MLP norms
  bool gelu_tanh = false;              // GeGLU: gelu_pytorch_tanh(gate) * up
  double embed_scale = 0;              // the embeddings times this, rounded to their dtype; 0: none
  double query_pre_attn_scalar = 0;    // attention scale = this^-0.5; 0: head_dim's
  double attn_logit_softcapping = 0;   // 0: none
  double final_logit_softcapping = 0;  // 0: none
  // Gemma 3: the sliding layers' RoPE base (default type, no scaling); 0: every layer's is rope_theta.
  double rope_local_theta = 0;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::optional<DType> dtype;  // "torch_dtype" or "dtype"
  bool quantized = false;      // has a bitsandbytes quantization_config
  std::string bnb_quant_type = "nf4";  // its bnb_4bit_quant_type ("nf4" or "fp4"), when quantized
  bool bnb_double_quant = false;       // its bnb_4bit_use_double_quant, when quantized
  nlohmann::json raw;          // the whole config.json as read
  std::string source_dir;      // the folder load() read it from; empty for from_json()

  // Reads and validates DIR/config.json. When DIR holds .safetensors files, the model config.json
  // describes must fit in them (llama_min_weight_bytes <= their total size): a config that does
  // not belong to its weights (num_hidden_layers: 1e9, say) is an InputError naming the sizes
  // before anything is built from it.
  static LlamaConfig load(const std::string& dir);
  // Validates an already parsed object; `label` names the file in errors.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& label);
};

// Layer l's sliding window: sliding_window where it applies to l, 0 (full causal attention) elsewhere.
int64_t layer_window(const LlamaConfig& c, int64_t layer);
// True when layer l rotates with rope_local_theta (Gemma 3's sliding layers).
bool layer_local_rope(const LlamaConfig& c, int64_t layer);
// The decoder layer's RMSNorms (their module names in the checkpoints): input_layernorm and the
// MLP's input norm (post_attention_layernorm; Gemma: pre_feedforward_layernorm), and Gemma's
// post-attention and post-MLP norms (post_attention_layernorm, post_feedforward_layernorm; empty
// for the other families).
const char* mlp_norm_name(const LlamaConfig& c);
std::vector<std::string> layer_norm_names(const LlamaConfig& c);

// Parameter counts of the model a config describes (doubles: a hostile config overflows int64).
struct LlamaSize {
  double projection_params = 0;  // the Linear weights of the decoder layers (what 4-bit quantizes)
  double other_params = 0;       // embeddings, LM head (untied), norms, biases
  double total() const { return projection_params + other_params; }
};
LlamaSize llama_size(const LlamaConfig& c);
// The one size of a 4-bit base: every projection in bitsandbytes 4-bit (half a byte per weight,
// the absmax per block of `blocksize`: one byte with double quantization plus the nested f32
// absmax per 256 blocks, else f32), every other weight at `other_bytes` per parameter. Used by
// the memory plan, the start-up refusals and `qshard eval/generate`.
struct Llama4bitBytes {
  double projections = 0;  // all decoder layers' projections (one layer: projections / L)
  double other = 0;        // embeddings, LM head, norms, biases
  double total() const { return projections + other; }
};
Llama4bitBytes llama_4bit_bytes(const LlamaConfig& c, int64_t blocksize, bool double_quant, double other_bytes);
// The fewest bytes its weights can take in a folder qshard reads: projections in 4-bit (half a
// byte each), everything else in a 2-byte float.
double llama_min_weight_bytes(const LlamaConfig& c);
// "num_hidden_layers = 32, hidden_size = 4096, intermediate_size = 14336, vocab_size = 128256"
std::string llama_size_keys(const LlamaConfig& c);

// True when `projection` ("self_attn.q_proj", ...) has a bias in this config's family.
bool llama_projection_has_bias(const LlamaConfig& c, const std::string& projection);

// The Linear projections of a decoder layer in qshard's model (the module tree, the model's
// binding), as named in HF Llama checkpoints.
const std::vector<std::string>& llama_projection_names();  // "self_attn.q_proj", ... "mlp.down_proj"
// The projections of a decoder layer as the family's checkpoints store them: llama_projection_names(),
// except Phi-3's "self_attn.qkv_proj" (for q, k, v) and "mlp.gate_up_proj" (for gate, up).
std::vector<std::string> stored_projection_names(const LlamaConfig& c);
// Shape [out, in] of a projection ("self_attn.q_proj", ..., or Phi-3's fused "self_attn.qkv_proj"
// [(H + 2 KV) D, C] and "mlp.gate_up_proj" [2 I, C]) for this config.
std::vector<int64_t> llama_projection_shape(const LlamaConfig& c, const std::string& projection);
// True for "model.layers.<N>.<projection>.weight" (the weights that qshard quantizes), the stored
// projections of every family (q/k/v/o, gate/up/down, Phi-3's qkv_proj and gate_up_proj).
bool is_llama_projection_weight(const std::string& name);
// Every weight name the config implies with its shape, as the family's checkpoints store them
// (stored_projection_names), in HF order (embed, layers, norm, lm_head).
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_expected_weights(const LlamaConfig& c);
// A folder whose tensors (`names`) hold a decoder layer "model.layers.<N>." with N >= the config's
// num_hidden_layers is an InputError naming `dir`, the layer and num_hidden_layers: config.json does
// not describe these weights, and a loader that ignores tensors it has no slot for (eval, generate,
// train) would drop those layers in silence.
void check_stored_layers(const LlamaConfig& c, const std::vector<std::string>& names, const std::string& dir);

}  // namespace qshard
