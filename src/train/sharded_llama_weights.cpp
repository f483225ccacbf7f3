#include "train/sharded_llama_weights.h"

#include <array>
#include <string>

#include "runtime/error.h"

namespace qshard {
namespace {

// A parameter's entries, or none (`present` false: an absent bias or adapter).
struct Param {
  bool present = false;
  ShardedSlot at;
};

Param param_of(const ShardedTree& units, const Module::Slot* s, int unit, const std::string& fqn) {
  if (!s) return {};
  const ShardedSlot& at = units.slot(s);
  if (at.unit != unit)
    throw Error("sharded weights: parameter '" + fqn + "' is in FSDP unit " + std::to_string(at.unit) +
                ", expected unit " + std::to_string(unit));
  return {true, at};
}

}  // namespace

struct ShardedLlamaWeights::Entries {
  struct Proj {
    Param weight, bias, lora_A, lora_B;
    bool nested = false;  // a 4-bit weight with double-quantized statistics
  };
  struct Layer {
    std::array<Proj, 7> proj;
    Param input_norm, post_norm, q_norm, k_norm, attn_out_norm, mlp_out_norm;
  };
  std::vector<Layer> layers;
  Param embed, norm, head;
  int root_unit = -1;
  DType compute_dtype = DType::kF32;  // of the manager's LoRA compute copies (f32: none)
};

ShardedLlamaWeights::ShardedLlamaWeights(const LlamaConfig& c, const LlamaTreeSlots& slots,
                                         ShardedParameterManager& mgr, const ShardedTree& units)
    : mgr_(mgr), entries_(std::make_unique<Entries>()) {
  const int64_t L = c.num_hidden_layers;
  QS_CHECK(mgr.num_units() == L + 1, "sharded weights: one unit per decoder layer and a root unit");
  Entries& E = *entries_;
  E.root_unit = static_cast<int>(L);
  E.compute_dtype = mgr.options().trainable_compute_dtype;
  for (int64_t l = 0; l < L; ++l) {
    const int u = static_cast<int>(l);
    const LayerSlots& ls = slots.layer_slots(l);
    Entries::Layer el;
    for (size_t i = 0; i < ls.proj.size(); ++i) {
      const std::string& fqn = slots.projection_fqn(l, static_cast<int>(i));
      el.proj[i].weight = param_of(units, ls.proj[i].weight, u, fqn + ".weight");
      el.proj[i].nested = ls.proj[i].weight->kind == Module::SlotKind::kParams4bit &&
                          ls.proj[i].weight->params4bit->quant_state.state2.has_value();
      el.proj[i].bias = param_of(units, ls.proj[i].bias, u, fqn + ".bias");
      el.proj[i].lora_A = param_of(units, ls.proj[i].lora_A, u, fqn + ".lora_A.weight");
      el.proj[i].lora_B = param_of(units, ls.proj[i].lora_B, u, fqn + ".lora_B.weight");
    }
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    el.input_norm = param_of(units, ls.input_norm, u, prefix + "input_layernorm.weight");
    el.post_norm = param_of(units, ls.post_norm, u, prefix + mlp_norm_name(c) + ".weight");
    el.q_norm = param_of(units, ls.q_norm, u, prefix + "self_attn.q_norm.weight");
    el.k_norm = param_of(units, ls.k_norm, u, prefix + "self_attn.k_norm.weight");
    el.attn_out_norm = param_of(units, ls.attn_out_norm, u, prefix + "post_attention_layernorm.weight");
    el.mlp_out_norm = param_of(units, ls.mlp_out_norm, u, prefix + "post_feedforward_layernorm.weight");
    E.layers.push_back(el);
    layers_.push_back(slots.layer_shapes(l));  // shapes and 4-bit scalars; pointers at each gather
  }
  const RootSlots& rs = slots.root_slots();
  E.embed = param_of(units, rs.embed, E.root_unit, "model.embed_tokens.weight");
  E.norm = param_of(units, rs.norm, E.root_unit, "model.norm.weight");
  E.head = param_of(units, rs.head, E.root_unit, "lm_head.weight");
  root_.embed.dtype = rs.embed->tensor.dtype();
  root_.norm.dtype = rs.norm->tensor.dtype();
  root_.head.dtype = rs.head->tensor.dtype();
  gathered_.assign(static_cast<size_t>(L + 1), 0);
  for (int64_t l = 0; l < L; ++l) {
    mgr.on_gathered(static_cast<int>(l), [this](int u) { fill_layer(u); });
    mgr.on_released(static_cast<int>(l), [this](int u) { gathered_[static_cast<size_t>(u)] = 0; });
  }
  mgr.on_gathered(E.root_unit, [this](int) { fill_root(); });
  mgr.on_released(E.root_unit, [this](int u) { gathered_[static_cast<size_t>(u)] = 0; });
}

ShardedLlamaWeights::~ShardedLlamaWeights() = default;

void ShardedLlamaWeights::fill_layer(int64_t layer) {
  const int u = static_cast<int>(layer);
  const Entries::Layer& el = entries_->layers[static_cast<size_t>(layer)];
  LayerWeights& w = layers_[static_cast<size_t>(layer)];
  auto entry = [&](const ShardedSlot& at, size_t index) -> const FlatEntry& {
    return mgr_.layout(u, at.kind).entries()[index];
  };
  auto data = [&](const ShardedSlot& at, size_t index) { return mgr_.data(u, at.kind, entry(at, index)); };
  for (size_t i = 0; i < el.proj.size(); ++i) {
    const Entries::Proj& e = el.proj[i];
    ProjectionWeights& pw = w.proj[i];
    if (pw.quantized) {
      const ShardedSlot& at = e.weight.at;
      pw.q.packed = static_cast<const uint8_t*>(data(at, at.data));
      if (e.nested) {
        pw.q.absmax_q8 = static_cast<const uint8_t*>(data(at, at.absmax));
        pw.q.nested_absmax = static_cast<const float*>(data(at, at.nested_absmax));
        pw.q.nested_code = static_cast<const float*>(data(at, at.nested_quant_map));
      } else {
        pw.q.absmax = static_cast<const float*>(data(at, at.absmax));
      }
    } else {
      pw.dense = data(e.weight.at, e.weight.at.data);
    }
    if (e.bias.present) pw.bias.data = data(e.bias.at, e.bias.at.data);
    if (e.lora_A.present) {
      const FlatEntry& a = entry(e.lora_A.at, e.lora_A.at.data);
      const FlatEntry& b = entry(e.lora_B.at, e.lora_B.at.data);
      const void* ca = mgr_.compute_data(u, a);  // null when the manager keeps no compute copies
      const void* cb = mgr_.compute_data(u, b);
      pw.lora_A = ca ? WeightRef{ca, entries_->compute_dtype} : WeightRef{mgr_.data(u, BufferKind::kTrainable, a), DType::kF32};
      pw.lora_B = cb ? WeightRef{cb, entries_->compute_dtype} : WeightRef{mgr_.data(u, BufferKind::kTrainable, b), DType::kF32};
      pw.grad_A = mgr_.grad_data(u, a);
      pw.grad_B = mgr_.grad_data(u, b);
    }
  }
  w.input_norm.data = data(el.input_norm.at, el.input_norm.at.data);
  w.post_norm.data = data(el.post_norm.at, el.post_norm.at.data);
  if (el.q_norm.present) {
    w.q_norm.data = data(el.q_norm.at, el.q_norm.at.data);
    w.k_norm.data = data(el.k_norm.at, el.k_norm.at.data);
  }
  if (el.attn_out_norm.present) {
    w.attn_out_norm.data = data(el.attn_out_norm.at, el.attn_out_norm.at.data);
    w.mlp_out_norm.data = data(el.mlp_out_norm.at, el.mlp_out_norm.at.data);
  }
  gathered_[static_cast<size_t>(layer)] = 1;
}

void ShardedLlamaWeights::fill_root() {
  const Entries& E = *entries_;
  const int u = E.root_unit;
  auto data = [&](const Param& p) { return mgr_.data(u, p.at.kind, mgr_.layout(u, p.at.kind).entries()[p.at.data]); };
  root_.embed.data = data(E.embed);
  root_.norm.data = data(E.norm);
  root_.head.data = data(E.head);
  gathered_[static_cast<size_t>(u)] = 1;
}

const LayerWeights& ShardedLlamaWeights::layer(int64_t layer) {
  QS_CHECK(layer >= 0 && layer < static_cast<int64_t>(layers_.size()), "layer index out of range");
  if (!gathered_[static_cast<size_t>(layer)])
    throw Error("the weights of decoder layer " + std::to_string(layer) + " are not available (FSDP unit '" +
                mgr_.unit_name(static_cast<int>(layer)) + "' is not gathered)");
  return layers_[static_cast<size_t>(layer)];
}

const RootWeights& ShardedLlamaWeights::root() {
  if (!gathered_[static_cast<size_t>(entries_->root_unit)])
    throw Error("the embedding, final norm and LM head are not available (FSDP unit '" +
                mgr_.unit_name(entries_->root_unit) + "' is not gathered)");
  return root_;
}

}  // namespace qshard
