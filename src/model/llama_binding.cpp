#include "model/llama_binding.h"

#include <algorithm>

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
const Tensor& bound_tensor(const Module::Slot& s, const std::string& owner, const char* suffix, Device device) {
  if (!s.tensor.defined())
    throw Error("parameter '" + owner + suffix + "' is not available (its FSDP unit is not gathered)");
  if (s.tensor.device() != device)
    throw Error("parameter '" + owner + suffix + "' is on the " + (s.tensor.device() == Device::kCpu ? "CPU" : "GPU") +
                ", the model computes on the other device");
  return s.tensor;
}

struct ProjSlots {
  std::string fqn;  // "model.layers.0.self_attn.q_proj", for error messages at bind
  Module::Slot* weight = nullptr;
  Module::Slot* bias = nullptr;
  Module::Slot* lora_A = nullptr;
  Module::Slot* lora_B = nullptr;
  int64_t in = 0, out = 0, r = 0;
};

struct LayerSlots {
  std::array<ProjSlots, 7> proj;
  Module::Slot* input_norm = nullptr;
  Module::Slot* post_norm = nullptr;
  std::string prefix;  // "model.layers.0."
};

}  // namespace

struct LlamaTreeSlots::Slots {
  std::vector<LayerSlots> layers;
  Module::Slot* embed = nullptr;
  Module::Slot* norm = nullptr;
  Module::Slot* head = nullptr;
  LlamaBufferDims measured;
};

LlamaTreeSlots::LlamaTreeSlots(const LlamaConfig& c, Module& root, const DeviceContext& ctx, bool fold_lora)
    : config_(c), slots_(std::make_unique<Slots>()) {
  const int64_t L = c.num_hidden_layers, C = c.hidden_size, V = c.vocab_size;
  const DType act_t = ctx.activation_dtype();
  LlamaBufferDims& d = slots_->measured;
  // A workspace operand: a dequantized 4-bit weight, or a dense weight the GEMM does not take as it is.
  auto in_workspace = [&](const Module::Slot& w) {
    return w.kind == Module::SlotKind::kParams4bit || !ops::gemm_supports(ctx, act_t, w.tensor.dtype());
  };
  for (int64_t l = 0; l < L; ++l) {
    LayerSlots ls;
    ls.prefix = "model.layers." + std::to_string(l) + ".";
    int64_t layer_dequant = 0, layer_lora = 0;
    for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
      ProjSlots& ps = ls.proj[i];
      ps.fqn = ls.prefix + kLlamaProjections[i];
      Module* lin = root.find_module(ps.fqn);
      ps.weight = require_slot(lin, ps.fqn, "weight");
      const Shape shape = llama_projection_shape(c, kLlamaProjections[i]);
      check_shape(ps.fqn + ".weight", slot_shape(*ps.weight), shape);
      ps.out = shape[0];
      ps.in = shape[1];
      if (Module::Slot* b = lin->slot("bias")) {
        check_shape(ps.fqn + ".bias", b->tensor.shape(), {ps.out});
        ps.bias = b;
      }
      Module* la = lin->child("lora_A");
      Module* lb = lin->child("lora_B");
      if (la || lb) {
        ps.lora_A = require_slot(la, ps.fqn + ".lora_A", "weight");
        ps.lora_B = require_slot(lb, ps.fqn + ".lora_B", "weight");
        if (ps.lora_A->tensor.dtype() != DType::kF32 || ps.lora_B->tensor.dtype() != DType::kF32)
          throw InputError("LoRA weights of '" + ps.fqn + "' must be F32");
        ps.r = ps.lora_A->tensor.ndim() == 2 ? ps.lora_A->tensor.dim(0) : 0;
        check_shape(ps.fqn + ".lora_A.weight", ps.lora_A->tensor.shape(), {ps.r, ps.in});
        check_shape(ps.fqn + ".lora_B.weight", ps.lora_B->tensor.shape(), {ps.out, ps.r});
      }
      d.max_in = std::max(d.max_in, ps.in);
      d.max_out = std::max(d.max_out, ps.out);
      d.max_r = std::max(d.max_r, ps.r);
      layer_lora += ps.r * (ps.in + ps.out);
      if (in_workspace(*ps.weight)) layer_dequant += ps.in * ps.out;
    }
    d.lora_elems = std::max(d.lora_elems, layer_lora);
    d.dequant_elems = std::max(d.dequant_elems, layer_dequant);
    // The fold's extra columns: per group the sum of its ranks (when every projection has LoRA).
    for (size_t g = 0; g < kFoldGroups.size(); ++g) {
      int64_t R = 0;
      bool all = true;
      for (int idx : kFoldGroups[g]) {
        if (idx < 0) continue;
        all = all && ls.proj[static_cast<size_t>(idx)].r > 0;
        R += ls.proj[static_cast<size_t>(idx)].r;
      }
      if (!all || !fold_lora) continue;
      d.fold_r[g] = std::max(d.fold_r[g], R);
      int64_t extra = 0;  // the widened weights: R more columns per output row, and the whole
                          // weight when it was not already counted as a workspace operand
      for (int idx : kFoldGroups[g]) {
        if (idx < 0) continue;
        const ProjSlots& ps = ls.proj[static_cast<size_t>(idx)];
        extra += ps.out * R + (in_workspace(*ps.weight) ? 0 : ps.out * ps.in);
      }
      d.fold_extra[g] = std::max(d.fold_extra[g], extra);
    }
    ls.input_norm = require_slot(root.find_module(ls.prefix + "input_layernorm"), ls.prefix + "input_layernorm", "weight");
    ls.post_norm = require_slot(root.find_module(ls.prefix + "post_attention_layernorm"),
                                ls.prefix + "post_attention_layernorm", "weight");
    check_shape(ls.prefix + "input_layernorm.weight", ls.input_norm->tensor.shape(), {C});
    check_shape(ls.prefix + "post_attention_layernorm.weight", ls.post_norm->tensor.shape(), {C});
    slots_->layers.push_back(std::move(ls));
  }
  Slots& s = *slots_;
  s.embed = require_slot(root.find_module("model.embed_tokens"), "model.embed_tokens", "weight");
  check_shape("model.embed_tokens.weight", s.embed->tensor.shape(), {V, C});
  s.norm = require_slot(root.find_module("model.norm"), "model.norm", "weight");
  check_shape("model.norm.weight", s.norm->tensor.shape(), {C});
  Module* head = root.child("lm_head");
  s.head = (c.tie_word_embeddings || !head || !head->slot("weight")) ? s.embed : head->slot("weight");
  check_shape("lm_head.weight", s.head->tensor.shape(), {V, C});
  d.convert_head = !ops::gemm_supports(ctx, act_t, s.head->tensor.dtype());
}

LlamaTreeSlots::~LlamaTreeSlots() = default;

void LlamaTreeSlots::measure(LlamaBufferDims& d) const {
  const LlamaBufferDims& m = slots_->measured;
  d.max_in = m.max_in, d.max_out = m.max_out, d.max_r = m.max_r;
  d.dequant_elems = m.dequant_elems;
  d.lora_elems = m.lora_elems;
  d.fold_r = m.fold_r;
  d.fold_extra = m.fold_extra;
  d.convert_head = m.convert_head;
}

void LlamaTreeSlots::bind_root(RootBinding& r, const BindScratch& scratch, DeviceContext& ctx) const {
  const Device dev = ctx.compute_device();
  const Slots& s = *slots_;
  const Tensor& e = bound_tensor(*s.embed, "model.embed_tokens", ".weight", dev);
  r.embed = e.raw();
  r.embed_dtype = e.dtype();
  const Tensor& n = bound_tensor(*s.norm, "model.norm", ".weight", dev);
  float* norm = scratch.norms + 2 * config_.hidden_size;
  ops::to_f32(norm, n.raw(), n.dtype(), config_.hidden_size, ctx);
  r.norm = norm;
  const Tensor& h = bound_tensor(*s.head, "lm_head", ".weight", dev);
  r.head = h.raw();
  r.head_dtype = h.dtype();
}

void LlamaTreeSlots::bind_layer(int64_t layer, const LayerLora& lora, const BindScratch& scratch, LayerBinding& b,
                                DeviceContext& ctx) const {
  QS_CHECK(layer >= 0 && layer < config_.num_hidden_layers, "layer index out of range");
  const Device dev = ctx.compute_device();
  const LayerSlots& ls = slots_->layers[static_cast<size_t>(layer)];
  const int64_t C = config_.hidden_size;
  b.layer = layer;
  const DType act_t = ctx.activation_dtype();
  const size_t esz = dtype_size(act_t);
  int64_t bias_off = 0, lora_off = 0;
  for (size_t i = 0; i < ls.proj.size(); ++i) {
    const ProjSlots& ps = ls.proj[i];
    ProjectionBinding& pb = b.proj[i];
    pb = ProjectionBinding{};
    pb.in = ps.in;
    pb.out = ps.out;
    if (ps.weight->kind == Module::SlotKind::kParams4bit) {
      const Params4bit& p4 = *ps.weight->params4bit;
      if (!p4.data.defined())
        throw Error("parameter '" + ps.fqn + ".weight' is not available (its FSDP unit is not gathered)");
      if (p4.data.device() != dev) throw Error("parameter '" + ps.fqn + ".weight' is on the wrong device");
      pb.quantized = true;
      pb.q = dequant_args(p4);
      pb.weight_dtype = p4.quant_state.dtype;
    } else {
      const Tensor& w = bound_tensor(*ps.weight, ps.fqn, ".weight", dev);
      pb.dense = w.raw();
      pb.weight_dtype = w.dtype();
    }
    if (ps.bias) {
      const Tensor& bt = bound_tensor(*ps.bias, ps.fqn, ".bias", dev);
      float* dst = scratch.biases + bias_off;
      QS_CHECK(ps.out <= scratch.bias_stride, "bias larger than its buffer");
      ops::to_f32(dst, bt.raw(), bt.dtype(), ps.out, ctx);
      pb.bias = dst;
    }
    bias_off += scratch.bias_stride;
    if (ps.r > 0) {
      pb.r = ps.r;
      const Tensor& ta = bound_tensor(*ps.lora_A, ps.fqn, ".lora_A.weight", dev);
      const Tensor& tb = bound_tensor(*ps.lora_B, ps.fqn, ".lora_B.weight", dev);
      if (lora.A[i] && lora.B[i]) {  // compute copies in the activation dtype
        pb.lora_A = lora.A[i];
        pb.lora_B = lora.B[i];
      } else if (act_t == DType::kF32) {
        pb.lora_A = ta.raw();
        pb.lora_B = tb.raw();
      } else {
        const int64_t na = ps.r * ps.in, nb = ps.out * ps.r;
        void* ca = static_cast<uint8_t*>(scratch.lora_cvt) + lora_off * static_cast<int64_t>(esz);
        void* cb = static_cast<uint8_t*>(scratch.lora_cvt) + (lora_off + na) * static_cast<int64_t>(esz);
        ops::convert(ca, act_t, ta.raw(), DType::kF32, na, ctx);
        ops::convert(cb, act_t, tb.raw(), DType::kF32, nb, ctx);
        lora_off += na + nb;
        pb.lora_A = ca;
        pb.lora_B = cb;
      }
      pb.scaling = lora_scaling(scratch.lora_alpha, ps.r, scratch.use_rslora);
      pb.grad_A = lora.grad_A[i];
      pb.grad_B = lora.grad_B[i];
    }
  }
  const Tensor& n1 = bound_tensor(*ls.input_norm, ls.prefix, "input_layernorm.weight", dev);
  const Tensor& n2 = bound_tensor(*ls.post_norm, ls.prefix, "post_attention_layernorm.weight", dev);
  ops::to_f32(scratch.norms, n1.raw(), n1.dtype(), C, ctx);
  ops::to_f32(scratch.norms + C, n2.raw(), n2.dtype(), C, ctx);
  b.input_norm = scratch.norms;
  b.post_norm = scratch.norms + C;
}

}  // namespace qshard
