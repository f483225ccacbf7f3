#include "checkpoint/llama_tree.h"

#include <algorithm>

namespace qshard {

std::unique_ptr<Module> build_llama_tree(const LlamaConfig& c, const LlamaTreeOptions& o) {
  auto dtype = [&o](const std::string& fqn) {
    const auto it = o.float_dtypes.find(fqn);
    return it == o.float_dtypes.end() ? o.dtype : it->second;
  };
  auto root = std::make_unique<Module>("LlamaForCausalLM");
  Module& model = root->add_child("model", "LlamaModel");
  model.add_child("embed_tokens", "Embedding")
      .add_parameter("weight", Tensor::zeros({c.vocab_size, c.hidden_size}, dtype("model.embed_tokens.weight")));
  Module& layers = model.add_child("layers", "ModuleList");
  std::string layer_prefix;  // "model.layers.<l>."
  auto projection = [&](Module& parent, const std::string& full_name, const std::string& short_name) {
    const Shape shape = llama_projection_shape(c, full_name);
    const std::string fqn = layer_prefix + full_name;
    Module& lin = parent.add_child(short_name, o.quant ? "Linear4bit" : "Linear");
    if (o.quant) lin.add_params4bit("weight", std::make_shared<Params4bit>(
                                           empty_params4bit(shape, dtype(fqn + ".weight"), *o.quant, o.shapes_only_4bit)));
    else lin.add_parameter("weight", Tensor::zeros(shape, dtype(fqn + ".weight")));
    if (llama_projection_has_bias(c, full_name)) lin.add_parameter("bias", Tensor::zeros({shape[0]}, dtype(fqn + ".bias")));
    if (o.lora.r > 0 && std::find(o.lora.targets.begin(), o.lora.targets.end(), short_name) != o.lora.targets.end()) {
      lin.add_child("lora_A", "Linear").add_parameter("weight", Tensor::zeros({o.lora.r, shape[1]}, DType::kF32), true);
      lin.add_child("lora_B", "Linear").add_parameter("weight", Tensor::zeros({shape[0], o.lora.r}, DType::kF32), true);
    }
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layer_prefix = "model.layers." + std::to_string(l) + ".";
    Module& layer = layers.add_child(std::to_string(l), "LlamaDecoderLayer");
    Module& attn = layer.add_child("self_attn", "LlamaAttention");
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) projection(attn, std::string("self_attn.") + p, p);
    if (c.qk_norm)  // Qwen3: an RMSNorm over head_dim on each head of q and k
      for (const char* norm : {"q_norm", "k_norm"})
        attn.add_child(norm, "LlamaRMSNorm")
            .add_parameter("weight", Tensor::zeros({c.head_dim}, dtype(layer_prefix + "self_attn." + norm + ".weight")));
    Module& mlp = layer.add_child("mlp", "LlamaMLP");
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) projection(mlp, std::string("mlp.") + p, p);
    for (const std::string& norm : layer_norm_names(c))  // Gemma: four
      layer.add_child(norm, "LlamaRMSNorm")
          .add_parameter("weight", Tensor::zeros({c.hidden_size}, dtype(layer_prefix + norm + ".weight")));
  }
  model.add_child("norm", "LlamaRMSNorm").add_parameter("weight", Tensor::zeros({c.hidden_size}, dtype("model.norm.weight")));
  Module& head = root->add_child("lm_head", "Linear");
  if (!c.tie_word_embeddings)
    head.add_parameter("weight", Tensor::zeros({c.vocab_size, c.hidden_size}, dtype("lm_head.weight")));
  return root;
}

}  // namespace qshard
