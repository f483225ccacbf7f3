#include "model/llama_binding.h"

#include <algorithm>
#include <string_view>
#include <tuple>

#include "model/llama_ops.h"
#include "quant/params4bit.h"
#include "runtime/error.h"

namespace qshard {
namespace {

Module::Slot* require_slot(Module* m, const std::string& fqn_module, const char* name) {
  if (!m) throw InputError("model tree has no module '" + fqn_module + "'");
  Module::Slot* s = m->slot(name);
  if (!s) throw InputError("model tree has no parameter '" + fqn_module + "." + name + "'");
  return s;
}

void check_shape(const std::string& fqn, const Shape& got, const Shape& want) {
  if (got != want)
    throw InputError("parameter '" + fqn + "' has shape " + shape_str(got) + ", expected " + shape_str(want));
}

const Shape& slot_shape(const Module::Slot& s) {
  return s.kind == Module::SlotKind::kParams4bit ? s.params4bit->quant_state.shape : s.tensor.shape();
}

// The slot's tensor, on `device` and gathered; the name (owner + suffix) is built only for the error.
const Tensor& bound_tensor(const Module::Slot& s, std::string_view owner, const char* suffix, Device device) {
  if (!s.tensor.defined())
    throw Error("parameter '" + std::string(owner) + suffix + "' is not available (its FSDP unit is not gathered)");
  if (s.tensor.device() != device)
    throw Error("parameter '" + std::string(owner) + suffix + "' is on the " + (s.tensor.device() == Device::kCpu ? "CPU" : "GPU") +
                ", the model computes on the other device");
  return s.tensor;
}

}  // namespace

struct LlamaTreeSlots::Slots {
  std::vector<LayerSlots> layers;
  std::vector<LayerWeights> shapes;           // per layer: shapes and 4-bit scalars, no pointers
  std::vector<std::array<std::string, 7>> fqn;  // per layer and projection, for error messages
  std::vector<std::string> prefix;              // per layer: "model.layers.<l>.", likewise
  RootSlots root;
  LayerWeights current;  // what layer() returned last
  RootWeights current_root;
  LlamaBufferDims measured;
};

LlamaTreeSlots::LlamaTreeSlots(const LlamaConfig& c, Module& root, const DeviceContext& ctx, bool fold_lora)
    : config_(c), device_(ctx.compute_device()), slots_(std::make_unique<Slots>()) {
  const int64_t L = c.num_hidden_layers, C = c.hidden_size, V = c.vocab_size;
  const DType act_t = ctx.activation_dtype();
  LlamaBufferDims& d = slots_->measured;
  // A workspace operand: a dequantized 4-bit weight, or a dense weight the GEMM does not take as it is.
  auto in_workspace = [&](const Module::Slot& w) {
    return w.kind == Module::SlotKind::kParams4bit || !ops::gemm_supports(ctx, act_t, w.tensor.dtype());
  };
  for (int64_t l = 0; l < L; ++l) {
    LayerSlots ls;
    LayerWeights lw;  // shapes and scalars
    std::array<std::string, 7> fqns;
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    int64_t layer_dequant = 0, layer_lora = 0;
    for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
      ProjectionSlots& ps = ls.proj[i];
      ProjectionWeights& pw = lw.proj[i];
      const std::string& fqn = fqns[i] = prefix + kLlamaProjections[i];
      Module* lin = root.find_module(fqn);
      ps.weight = require_slot(lin, fqn, "weight");
      const Shape shape = llama_projection_shape(c, kLlamaProjections[i]);
      check_shape(fqn + ".weight", slot_shape(*ps.weight), shape);
      pw.out = shape[0];
      pw.in = shape[1];
      if (ps.weight->kind == Module::SlotKind::kParams4bit) {
        pw.quantized = true;
        pw.q = dequant_args(*ps.weight->params4bit);  // the scalars; pointers are set per read
        pw.weight_dtype = ps.weight->params4bit->quant_state.dtype;
      } else {
        pw.weight_dtype = ps.weight->tensor.dtype();
      }
      if (Module::Slot* b = lin->slot("bias")) {
        check_shape(fqn + ".bias", b->tensor.shape(), {pw.out});
        ps.bias = b;
        pw.bias.dtype = b->tensor.dtype();
      }
      Module* la = lin->child("lora_A");
      Module* lb = lin->child("lora_B");
      if (la || lb) {
        ps.lora_A = require_slot(la, fqn + ".lora_A", "weight");
        ps.lora_B = require_slot(lb, fqn + ".lora_B", "weight");
        if (ps.lora_A->tensor.dtype() != DType::kF32 || ps.lora_B->tensor.dtype() != DType::kF32)
          throw InputError("LoRA weights of '" + fqn + "' must be F32");
        pw.r = ps.lora_A->tensor.ndim() == 2 ? ps.lora_A->tensor.dim(0) : 0;
        check_shape(fqn + ".lora_A.weight", ps.lora_A->tensor.shape(), {pw.r, pw.in});
        check_shape(fqn + ".lora_B.weight", ps.lora_B->tensor.shape(), {pw.out, pw.r});
      }
      d.max_in = std::max(d.max_in, pw.in);
      d.max_out = std::max(d.max_out, pw.out);
      d.max_r = std::max(d.max_r, pw.r);
      layer_lora += pw.r * (pw.in + pw.out);
      if (in_workspace(*ps.weight)) layer_dequant += pw.in * pw.out;
      // The backward's rounded copy (LlamaModel::backward_weight): on the CPU reserved for every 4-bit
      // projection, as the config's estimate does (llama_buffer_dims); on CUDA for an f16-made one.
      // (with A's r rows below W where the backward is row-folded: LlamaModel::linear_bwd)
      if (pw.quantized && (ctx.backend() == Backend::kCpu || ops::dequant_rules_differ(ctx, pw.weight_dtype)))
        d.round_elems = std::max(d.round_elems, pw.in * (pw.out + pw.r));
    }
    d.lora_elems = std::max(d.lora_elems, layer_lora);
    d.dequant_elems = std::max(d.dequant_elems, layer_dequant);
    // The fold's extra columns: per group the sum of its ranks (when every projection has LoRA).
    for (size_t g = 0; g < kFoldGroups.size(); ++g) {
      int64_t R = 0;
      bool all = true;
      for (int idx : kFoldGroups[g]) {
        if (idx < 0) continue;
        all = all && lw.proj[static_cast<size_t>(idx)].r > 0;
        R += lw.proj[static_cast<size_t>(idx)].r;
      }
      if (!all || !fold_lora) continue;
      d.fold_r[g] = std::max(d.fold_r[g], R);
      int64_t extra = 0;  // the widened weights: R more columns per output row, and the whole
                          // weight when it was not already counted as a workspace operand
      for (int idx : kFoldGroups[g]) {
        if (idx < 0) continue;
        const ProjectionWeights& pw = lw.proj[static_cast<size_t>(idx)];
        extra += pw.out * R + (in_workspace(*ls.proj[static_cast<size_t>(idx)].weight) ? 0 : pw.out * pw.in);
      }
      // q|k|v folded: o_proj's backward row-folded; gate|up folded: down_proj's; each one's
      // dequantized weight with A's r rows below it (LlamaModel::dequantize_layer)
      const ProjectionWeights& o = lw.proj[kO];
      const ProjectionWeights& down = lw.proj[kDown];
      // (a dense weight in the activation dtype is copied there whole)
      const auto rows = [&](const ProjectionWeights& pw, int idx) {
        return pw.r * pw.in + (in_workspace(*ls.proj[static_cast<size_t>(idx)].weight) ? 0 : pw.out * pw.in);
      };
      if (g == 0 && o.r > 0) extra += rows(o, kO);
      if (g == 1 && down.r > 0 && down.r <= R) extra += rows(down, kDown);
      d.fold_extra[g] = std::max(d.fold_extra[g], extra);
    }
    ls.input_norm = require_slot(root.find_module(prefix + "input_layernorm"), prefix + "input_layernorm", "weight");
    const std::string mlp_norm = mlp_norm_name(c);
    ls.post_norm = require_slot(root.find_module(prefix + mlp_norm), prefix + mlp_norm, "weight");
    check_shape(prefix + "input_layernorm.weight", ls.input_norm->tensor.shape(), {C});
    check_shape(prefix + mlp_norm + ".weight", ls.post_norm->tensor.shape(), {C});
    lw.input_norm.dtype = ls.input_norm->tensor.dtype();
    lw.post_norm.dtype = ls.post_norm->tensor.dtype();
    if (c.gemma_norms) {  // the attention's and the MLP's output norms
      for (auto [slot, ref, name] : {std::tuple{&ls.attn_out_norm, &lw.attn_out_norm, "post_attention_layernorm"},
                                     {&ls.mlp_out_norm, &lw.mlp_out_norm, "post_feedforward_layernorm"}}) {
        *slot = require_slot(root.find_module(prefix + name), prefix + name, "weight");
        check_shape(prefix + name + ".weight", (*slot)->tensor.shape(), {C});
        ref->dtype = (*slot)->tensor.dtype();
      }
    }
    if (c.qk_norm) {
      ls.q_norm = require_slot(root.find_module(prefix + "self_attn.q_norm"), prefix + "self_attn.q_norm", "weight");
      ls.k_norm = require_slot(root.find_module(prefix + "self_attn.k_norm"), prefix + "self_attn.k_norm", "weight");
      check_shape(prefix + "self_attn.q_norm.weight", ls.q_norm->tensor.shape(), {c.head_dim});
      check_shape(prefix + "self_attn.k_norm.weight", ls.k_norm->tensor.shape(), {c.head_dim});
      lw.q_norm.dtype = ls.q_norm->tensor.dtype();
      lw.k_norm.dtype = ls.k_norm->tensor.dtype();
    }
    slots_->layers.push_back(ls);
    slots_->shapes.push_back(lw);
    slots_->fqn.push_back(std::move(fqns));
    slots_->prefix.push_back(prefix);
  }
  RootSlots& r = slots_->root;
  r.embed = require_slot(root.find_module("model.embed_tokens"), "model.embed_tokens", "weight");
  check_shape("model.embed_tokens.weight", r.embed->tensor.shape(), {V, C});
  r.norm = require_slot(root.find_module("model.norm"), "model.norm", "weight");
  check_shape("model.norm.weight", r.norm->tensor.shape(), {C});
  Module* head = root.child("lm_head");
  r.head = (c.tie_word_embeddings || !head || !head->slot("weight")) ? r.embed : head->slot("weight");
  check_shape("lm_head.weight", r.head->tensor.shape(), {V, C});
  d.convert_head = !ops::gemm_supports(ctx, act_t, r.head->tensor.dtype());
}

LlamaTreeSlots::~LlamaTreeSlots() = default;

void LlamaTreeSlots::measure(LlamaBufferDims& d) const {
  const LlamaBufferDims& m = slots_->measured;
  d.max_in = m.max_in, d.max_out = m.max_out, d.max_r = m.max_r;
  d.dequant_elems = m.dequant_elems;
  d.round_elems = m.round_elems;
  d.lora_elems = m.lora_elems;
  d.fold_r = m.fold_r;
  d.fold_extra = m.fold_extra;
  d.convert_head = m.convert_head;
}

const LayerSlots& LlamaTreeSlots::layer_slots(int64_t layer) const {
  QS_CHECK(layer >= 0 && layer < config_.num_hidden_layers, "layer index out of range");
  return slots_->layers[static_cast<size_t>(layer)];
}
const RootSlots& LlamaTreeSlots::root_slots() const { return slots_->root; }
const LayerWeights& LlamaTreeSlots::layer_shapes(int64_t layer) const {
  QS_CHECK(layer >= 0 && layer < config_.num_hidden_layers, "layer index out of range");
  return slots_->shapes[static_cast<size_t>(layer)];
}
const std::string& LlamaTreeSlots::projection_fqn(int64_t layer, int idx) const {
  return slots_->fqn[static_cast<size_t>(layer)][static_cast<size_t>(idx)];
}

const RootWeights& LlamaTreeSlots::root() {
  const RootSlots& s = slots_->root;
  RootWeights& r = slots_->current_root;
  auto read = [&](const Module::Slot& slot, const char* fqn) {
    const Tensor& t = bound_tensor(slot, fqn, "", device_);
    return WeightRef{t.raw(), t.dtype()};
  };
  r.embed = read(*s.embed, "model.embed_tokens.weight");
  r.norm = read(*s.norm, "model.norm.weight");
  r.head = read(*s.head, "lm_head.weight");
  return r;
}

const LayerWeights& LlamaTreeSlots::layer(int64_t layer) {
  const LayerSlots& ls = layer_slots(layer);
  LayerWeights& w = slots_->current;
  w = slots_->shapes[static_cast<size_t>(layer)];
  const std::array<std::string, 7>& fqn = slots_->fqn[static_cast<size_t>(layer)];
  for (size_t i = 0; i < ls.proj.size(); ++i) {
    const ProjectionSlots& ps = ls.proj[i];
    ProjectionWeights& pw = w.proj[i];
    if (pw.quantized) {
      const Params4bit& p4 = *ps.weight->params4bit;
      if (!p4.data.defined())
        throw Error("parameter '" + fqn[i] + ".weight' is not available (its FSDP unit is not gathered)");
      if (p4.data.device() != device_) throw Error("parameter '" + fqn[i] + ".weight' is on the wrong device");
      pw.q = dequant_args(p4);
    } else {
      pw.dense = bound_tensor(*ps.weight, fqn[i], ".weight", device_).raw();
    }
    if (ps.bias) pw.bias.data = bound_tensor(*ps.bias, fqn[i], ".bias", device_).raw();
    if (pw.r > 0) {
      pw.lora_A = {bound_tensor(*ps.lora_A, fqn[i], ".lora_A.weight", device_).raw(), DType::kF32};
      pw.lora_B = {bound_tensor(*ps.lora_B, fqn[i], ".lora_B.weight", device_).raw(), DType::kF32};
    }
  }
  const std::string& prefix = slots_->prefix[static_cast<size_t>(layer)];
  w.input_norm.data = bound_tensor(*ls.input_norm, prefix, "input_layernorm.weight", device_).raw();
  const std::string post_norm = std::string(mlp_norm_name(config_)) + ".weight";
  w.post_norm.data = bound_tensor(*ls.post_norm, prefix, post_norm.c_str(), device_).raw();
  if (ls.attn_out_norm) {
    w.attn_out_norm.data = bound_tensor(*ls.attn_out_norm, prefix, "post_attention_layernorm.weight", device_).raw();
    w.mlp_out_norm.data = bound_tensor(*ls.mlp_out_norm, prefix, "post_feedforward_layernorm.weight", device_).raw();
  }
  if (ls.q_norm) {
    w.q_norm.data = bound_tensor(*ls.q_norm, prefix, "self_attn.q_norm.weight", device_).raw();
    w.k_norm.data = bound_tensor(*ls.k_norm, prefix, "self_attn.k_norm.weight", device_).raw();
  }
  return w;
}

void bind_root(const RootWeights& w, int64_t C, const BindScratch& scratch, RootBinding& r, DeviceContext& ctx) {
  r.embed = w.embed.data;
  r.embed_dtype = w.embed.dtype;
  float* norm = scratch.norms + 2 * C;
  ops::to_f32(norm, w.norm.data, w.norm.dtype, C, ctx, scratch.norm_offset);
  r.norm = norm;
  r.head = w.head.data;
  r.head_dtype = w.head.dtype;
}

void bind_layer(const LayerWeights& w, int64_t layer, const BindScratch& scratch, LayerBinding& b, DeviceContext& ctx) {
  const DType act_t = ctx.activation_dtype();
  const size_t esz = dtype_size(act_t);
  int64_t bias_off = 0, lora_off = 0, C = 0;
  b.layer = layer;
  for (size_t i = 0; i < w.proj.size(); ++i) {
    const ProjectionWeights& pw = w.proj[i];
    ProjectionBinding& pb = b.proj[i];
    pb = ProjectionBinding{};
    pb.in = pw.in;
    pb.out = pw.out;
    pb.quantized = pw.quantized;
    pb.weight_dtype = pw.weight_dtype;
    if (pw.quantized) pb.q = pw.q;
    else pb.dense = pw.dense;
    if (pw.bias.data) {
      float* dst = scratch.biases + bias_off;
      QS_CHECK(pw.out <= scratch.bias_stride, "bias larger than its buffer");
      ops::to_f32(dst, pw.bias.data, pw.bias.dtype, pw.out, ctx);
      pb.bias = dst;
    }
    bias_off += scratch.bias_stride;
    if (pw.r > 0) {
      pb.r = pw.r;
      // One path for every owner: operands in the activation dtype are read as they are (compute
      // copies, or f32 on an f32 backend); f32 operands are converted into the model's buffer.
      auto operand = [&](const WeightRef& ref, int64_t n) -> const void* {
        if (ref.dtype == act_t) return ref.data;
        QS_CHECK(ref.dtype == DType::kF32, "LoRA operands are f32 or in the activation dtype");
        void* dst = static_cast<uint8_t*>(scratch.lora_cvt) + lora_off * static_cast<int64_t>(esz);
        ops::convert(dst, act_t, ref.data, DType::kF32, n, ctx);
        lora_off += n;
        return dst;
      };
      pb.lora_A = operand(pw.lora_A, pw.r * pw.in);
      pb.lora_B = operand(pw.lora_B, pw.out * pw.r);
      pb.scaling = lora_scaling(scratch.lora_alpha, pw.r, scratch.use_rslora);
      pb.grad_A = pw.grad_A;
      pb.grad_B = pw.grad_B;
    }
    if (i == kO) C = pw.out;  // o_proj's output: the hidden size
  }
  const float off = scratch.norm_offset;
  ops::to_f32(scratch.norms, w.input_norm.data, w.input_norm.dtype, C, ctx, off);
  ops::to_f32(scratch.norms + C, w.post_norm.data, w.post_norm.dtype, C, ctx, off);
  b.input_norm = scratch.norms;
  b.post_norm = scratch.norms + C;
  b.q_norm = b.k_norm = b.attn_out_norm = b.mlp_out_norm = nullptr;
  const int64_t D = scratch.head_dim;
  if (w.q_norm.data) {  // after the root's final norm at 2C
    ops::to_f32(scratch.norms + 3 * C, w.q_norm.data, w.q_norm.dtype, D, ctx, off);
    ops::to_f32(scratch.norms + 3 * C + D, w.k_norm.data, w.k_norm.dtype, D, ctx, off);
    b.q_norm = scratch.norms + 3 * C;
    b.k_norm = scratch.norms + 3 * C + D;
  }
  if (w.attn_out_norm.data) {  // after the q / k norms' place
    QS_CHECK(w.mlp_out_norm.data, "a layer with a post-attention norm and no post-MLP norm");
    ops::to_f32(scratch.norms + 3 * C + 2 * D, w.attn_out_norm.data, w.attn_out_norm.dtype, C, ctx, off);
    ops::to_f32(scratch.norms + 4 * C + 2 * D, w.mlp_out_norm.data, w.mlp_out_norm.dtype, C, ctx, off);
    b.attn_out_norm = scratch.norms + 3 * C + 2 * D;
    b.mlp_out_norm = scratch.norms + 4 * C + 2 * D;
  }
}

}  // namespace qshard
