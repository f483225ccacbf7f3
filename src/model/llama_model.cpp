#include "model/llama_model.h"

#include <algorithm>

#include "quant/params4bit.h"

namespace qshard {

namespace {

// Projection index = dropout module id offset within a layer (module id = layer * 7 + index).
constexpr std::array<const char*, 7> kProjections = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                     "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                     "mlp.down_proj"};
enum { kQ, kK, kV, kO, kGate, kUp, kDown };

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

const Module::Slot& require_slot(const Module* m, const std::string& fqn_module, const char* name) {
  if (!m) throw InputError("model tree has no module '" + fqn_module + "'");
  const Module::Slot* s = m->slot(name);
  if (!s) throw InputError("model tree has no parameter '" + fqn_module + "." + name + "'");
  return *s;
}

void check_shape(const std::string& fqn, const Shape& got, const Shape& want) {
  if (got != want)
    throw InputError("parameter '" + fqn + "' has shape " + shape_str(got) + ", expected " + shape_str(want));
}

void check_cpu(const std::string& fqn, const Tensor& t) {
  if (t.device() != Device::kCpu) throw Error("parameter '" + fqn + "' is not on the CPU (the CPU model needs host tensors)");
}

}  // namespace

struct LlamaModel::Projection {
  LoraLinearParams p;
  std::vector<float> bias;  // f32 copy of the bias, if any
  std::string fqn;          // "model.layers.0.self_attn.q_proj"
};

struct LlamaModel::LayerWeights {
  std::array<Projection, 7> proj;
  std::vector<float> input_norm, post_norm;  // [C] each
};

// One layer's forward internals (recomputed in the backward). Shapes with N = B*T.
struct LlamaModel::LayerActivations {
  std::vector<float> h1;    // [N,C]  input_layernorm(x)
  std::vector<float> q;     // [N,H*D] after RoPE
  std::vector<float> k, v;  // [N,Hkv*D] (k after RoPE)
  std::vector<float> att;   // [B,H,T,T] attention probabilities
  std::vector<float> a;     // [N,H*D] attention output (o_proj input)
  std::vector<float> x2;    // [N,C]  x + o_proj(a)
  std::vector<float> h2;    // [N,C]  post_attention_layernorm(x2)
  std::vector<float> g, u;  // [N,I]  gate_proj(h2), up_proj(h2)
  std::vector<float> m;     // [N,I]  silu(g) * u (down_proj input)
  std::vector<float> out;   // [N,C]  x2 + down_proj(m)
};

LlamaModel::LlamaModel(const LlamaConfig& config, Module& root, const LlamaModelOptions& options)
    : config_(config), root_(root), options_(options), inv_freq_(rope_inv_freq(config)) {
  QS_CHECK(config_.head_dim % 2 == 0, "head_dim must be even for RoPE");
}

std::vector<float> LlamaModel::float_param(const std::string& fqn, int64_t numel) const {
  const Resolved r = resolve(root_, fqn);
  if (r.kind != NodeKind::kParameter && r.kind != NodeKind::kBuffer)
    throw InputError("'" + fqn + "' is " + r.describe() + ", expected a float parameter");
  check_cpu(fqn, r.tensor);
  if (r.tensor.numel() != numel)
    throw InputError("parameter '" + fqn + "' has shape " + shape_str(r.tensor.shape()) + ", expected " +
                     std::to_string(numel) + " elements");
  return r.tensor.to_f32_vector();
}

LlamaModel::LayerWeights LlamaModel::load_layer(int64_t layer) {
  QS_CHECK(layer >= 0 && layer < config_.num_hidden_layers, "layer index out of range");
  const std::string prefix = layer_prefix(layer);
  LayerWeights w;
  for (size_t i = 0; i < kProjections.size(); ++i) {
    Projection& pr = w.proj[i];
    pr.fqn = prefix + kProjections[i];
    Module* lin = root_.find_module(pr.fqn);
    const Module::Slot& ws = require_slot(lin, pr.fqn, "weight");
    const Shape shape = llama_projection_shape(config_, kProjections[i]);
    pr.p.out = shape[0];
    pr.p.in = shape[1];
    std::vector<float>& scratch = weight_scratch_[i];
    scratch.resize(shape_numel(shape));
    if (ws.kind == Module::SlotKind::kParams4bit) {
      const Params4bit& p4 = *ws.params4bit;
      check_cpu(pr.fqn + ".weight", p4.data);
      check_shape(pr.fqn + ".weight", p4.quant_state.shape, shape);
      dequantize_4bit_args_cpu(dequant_args(p4), scratch.data());
    } else {
      check_cpu(pr.fqn + ".weight", ws.tensor);
      check_shape(pr.fqn + ".weight", ws.tensor.shape(), shape);
      if (ws.tensor.dtype() == DType::kF32) std::copy_n(ws.tensor.data<float>(), scratch.size(), scratch.data());
      else scratch = ws.tensor.to_f32_vector();
    }
    pr.p.weight = scratch.data();
    if (const Module::Slot* b = lin->slot("bias")) {
      check_shape(pr.fqn + ".bias", b->tensor.shape(), {pr.p.out});
      pr.bias = b->tensor.to_f32_vector();
      pr.p.bias = pr.bias.data();
    }
    const Module* la = lin->child("lora_A");
    const Module* lb = lin->child("lora_B");
    if (la || lb) {
      const Module::Slot& sa = require_slot(la, pr.fqn + ".lora_A", "weight");
      const Module::Slot& sb = require_slot(lb, pr.fqn + ".lora_B", "weight");
      const std::string fa = pr.fqn + ".lora_A.weight", fb = pr.fqn + ".lora_B.weight";
      if (sa.tensor.dtype() != DType::kF32 || sb.tensor.dtype() != DType::kF32)
        throw InputError("LoRA weights of '" + pr.fqn + "' must be F32");
      check_cpu(fa, sa.tensor);
      check_cpu(fb, sb.tensor);
      const int64_t r = sa.tensor.ndim() == 2 ? sa.tensor.dim(0) : 0;
      check_shape(fa, sa.tensor.shape(), {r, pr.p.in});
      check_shape(fb, sb.tensor.shape(), {pr.p.out, r});
      pr.p.r = r;
      pr.p.lora_A = sa.tensor.data<float>();
      pr.p.lora_B = sb.tensor.data<float>();
      pr.p.scaling = lora_scaling(options_.lora_alpha, r, options_.use_rslora);
      pr.p.dropout = DropoutKey{training_ ? options_.lora_dropout : 0.0f, options_.dropout_seed, step_,
                                static_cast<uint64_t>(layer) * kProjections.size() + i, row_offset_};
    }
  }
  const int64_t C = config_.hidden_size;
  w.input_norm = float_param(prefix + "input_layernorm.weight", C);
  w.post_norm = float_param(prefix + "post_attention_layernorm.weight", C);
  return w;
}

void LlamaModel::run_layer(const LayerWeights& w, const float* x, LayerActivations& a, int64_t B, int64_t T) {
  const int64_t N = B * T, C = config_.hidden_size, I = config_.intermediate_size;
  const int64_t H = config_.num_attention_heads, Hkv = config_.num_key_value_heads, D = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const RopeTables rope = rope_tables(inv_freq_, T);
  a.h1.resize(N * C);
  rmsnorm_fwd(a.h1.data(), nullptr, x, w.input_norm.data(), N, C, eps);
  a.q.resize(N * H * D);
  a.k.resize(N * Hkv * D);
  a.v.resize(N * Hkv * D);
  lora_linear_fwd(a.q.data(), a.h1.data(), w.proj[kQ].p, N);
  lora_linear_fwd(a.k.data(), a.h1.data(), w.proj[kK].p, N);
  lora_linear_fwd(a.v.data(), a.h1.data(), w.proj[kV].p, N);
  rope_fwd(a.q.data(), rope, B, T, H, D);
  rope_fwd(a.k.data(), rope, B, T, Hkv, D);
  a.att.resize(B * H * T * T);
  a.a.resize(N * H * D);
  attention_fwd(a.a.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T, H, Hkv, D);
  a.x2.resize(N * C);
  lora_linear_fwd(a.x2.data(), a.a.data(), w.proj[kO].p, N);
  for (int64_t i = 0; i < N * C; ++i) a.x2[i] = x[i] + a.x2[i];  // residual + attn (HF order)
  a.h2.resize(N * C);
  rmsnorm_fwd(a.h2.data(), nullptr, a.x2.data(), w.post_norm.data(), N, C, eps);
  a.g.resize(N * I);
  a.u.resize(N * I);
  a.m.resize(N * I);
  lora_linear_fwd(a.g.data(), a.h2.data(), w.proj[kGate].p, N);
  lora_linear_fwd(a.u.data(), a.h2.data(), w.proj[kUp].p, N);
  swiglu_fwd(a.m.data(), a.g.data(), a.u.data(), N * I);
  a.out.resize(N * C);
  lora_linear_fwd(a.out.data(), a.m.data(), w.proj[kDown].p, N);
  for (int64_t i = 0; i < N * C; ++i) a.out[i] = a.x2[i] + a.out[i];
}

void LlamaModel::embed(std::span<const int64_t> ids, std::span<float> x, int64_t B, int64_t T) {
  const int64_t N = B * T, C = config_.hidden_size, V = config_.vocab_size;
  QS_CHECK(static_cast<int64_t>(ids.size()) == N && static_cast<int64_t>(x.size()) == N * C, "embed: bad sizes");
  const std::vector<float> table = float_param("model.embed_tokens.weight", V * C);
  embedding_fwd(x.data(), ids.data(), table.data(), N, C, V);
}

void LlamaModel::layer_forward(int64_t layer, std::span<const float> x_in, std::span<float> x_out, int64_t B,
                               int64_t T) {
  const int64_t NC = B * T * config_.hidden_size;
  QS_CHECK(static_cast<int64_t>(x_in.size()) == NC && static_cast<int64_t>(x_out.size()) == NC,
           "layer_forward: bad sizes");
  const LayerWeights w = load_layer(layer);
  LayerActivations a;
  run_layer(w, x_in.data(), a, B, T);
  std::copy(a.out.begin(), a.out.end(), x_out.begin());
}

void LlamaModel::layer_backward(int64_t layer, std::span<const float> x_in, std::span<const float> dout,
                                std::span<float> dx, int64_t B, int64_t T, const GradLookup& grad_lookup) {
  const int64_t N = B * T, C = config_.hidden_size, I = config_.intermediate_size;
  const int64_t H = config_.num_attention_heads, Hkv = config_.num_key_value_heads, D = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  QS_CHECK(static_cast<int64_t>(x_in.size()) == N * C && static_cast<int64_t>(dout.size()) == N * C &&
               static_cast<int64_t>(dx.size()) == N * C,
           "layer_backward: bad sizes");
  const LayerWeights w = load_layer(layer);
  LayerActivations a;
  run_layer(w, x_in.data(), a, B, T);  // activation checkpointing: recompute the internals

  auto grads = [&](int idx, float*& dA, float*& dB) {
    const Projection& pr = w.proj[idx];
    dA = dB = nullptr;
    if (pr.p.r == 0 || !grad_lookup) return;
    dA = grad_lookup(pr.fqn + ".lora_A.weight");
    dB = grad_lookup(pr.fqn + ".lora_B.weight");
  };
  auto lin_bwd = [&](int idx, float* dxin, const float* dy, const float* xin) {
    float *dA, *dB;
    grads(idx, dA, dB);
    lora_linear_bwd(dxin, dA, dB, dy, xin, w.proj[idx].p, N);
  };

  // MLP: out = x2 + down(silu(gate(h2)) * up(h2)); dout flows to x2 unchanged (residual).
  std::vector<float> dx2(dout.begin(), dout.end());  // [N,C]
  std::vector<float> dm(N * I, 0.0f), dg(N * I, 0.0f), du(N * I, 0.0f), dh2(N * C, 0.0f);
  lin_bwd(kDown, dm.data(), dout.data(), a.m.data());
  swiglu_bwd(dg.data(), du.data(), dm.data(), a.g.data(), a.u.data(), N * I);
  lin_bwd(kGate, dh2.data(), dg.data(), a.h2.data());
  lin_bwd(kUp, dh2.data(), du.data(), a.h2.data());
  rmsnorm_bwd(dx2.data(), dh2.data(), a.x2.data(), w.post_norm.data(), N, C, eps);

  // Attention: x2 = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))), h1 = norm(x).
  std::copy(dx2.begin(), dx2.end(), dx.begin());  // residual
  std::vector<float> da(N * H * D, 0.0f), dq(N * H * D, 0.0f), dk(N * Hkv * D, 0.0f), dv(N * Hkv * D, 0.0f);
  lin_bwd(kO, da.data(), dx2.data(), a.a.data());
  attention_bwd(dq.data(), dk.data(), dv.data(), da.data(), a.q.data(), a.k.data(), a.v.data(), a.att.data(), B, T,
                H, Hkv, D);
  const RopeTables rope = rope_tables(inv_freq_, T);
  rope_bwd(dq.data(), rope, B, T, H, D);
  rope_bwd(dk.data(), rope, B, T, Hkv, D);
  std::vector<float> dh1(N * C, 0.0f);
  lin_bwd(kQ, dh1.data(), dq.data(), a.h1.data());
  lin_bwd(kK, dh1.data(), dk.data(), a.h1.data());
  lin_bwd(kV, dh1.data(), dv.data(), a.h1.data());
  rmsnorm_bwd(dx.data(), dh1.data(), x_in.data(), w.input_norm.data(), N, C, eps);
}

namespace {
const char* head_weight_name(const Module& root, const LlamaConfig& c) {
  const Module* head = root.child("lm_head");
  if (c.tie_word_embeddings || !head || !head->slot("weight")) return "model.embed_tokens.weight";
  return "lm_head.weight";
}
}  // namespace

void LlamaModel::head_forward(std::span<const float> x, std::span<float> logits, int64_t B, int64_t T) {
  const int64_t N = B * T, C = config_.hidden_size, V = config_.vocab_size;
  QS_CHECK(static_cast<int64_t>(x.size()) == N * C && static_cast<int64_t>(logits.size()) == N * V,
           "head_forward: bad sizes");
  const std::vector<float> norm = float_param("model.norm.weight", C);
  const std::vector<float> head = float_param(head_weight_name(root_, config_), V * C);
  std::vector<float> xf(N * C);  // [N,C] final norm
  rmsnorm_fwd(xf.data(), nullptr, x.data(), norm.data(), N, C, static_cast<float>(config_.rms_norm_eps));
  LoraLinearParams p;
  p.in = C;
  p.out = V;
  p.weight = head.data();
  lora_linear_fwd(logits.data(), xf.data(), p, N);
}

float LlamaModel::head_forward_backward(std::span<const float> x, std::span<const int64_t> targets,
                                        std::span<float> dx, int64_t B, int64_t T, double normalizer) {
  const int64_t N = B * T, C = config_.hidden_size, V = config_.vocab_size;
  QS_CHECK(static_cast<int64_t>(targets.size()) == N && static_cast<int64_t>(dx.size()) == N * C,
           "head_forward_backward: bad sizes");
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const std::vector<float> norm = float_param("model.norm.weight", C);
  const std::vector<float> head = float_param(head_weight_name(root_, config_), V * C);
  std::vector<float> xf(N * C), logits(N * V), dlogits(N * V), dxf(N * C, 0.0f);
  rmsnorm_fwd(xf.data(), nullptr, x.data(), norm.data(), N, C, eps);
  LoraLinearParams p;
  p.in = C;
  p.out = V;
  p.weight = head.data();
  lora_linear_fwd(logits.data(), xf.data(), p, N);
  const float loss = cross_entropy_fwd_bwd(dlogits.data(), logits.data(), targets.data(), N, V, normalizer);
  lora_linear_bwd(dxf.data(), nullptr, nullptr, dlogits.data(), xf.data(), p, N);
  std::fill(dx.begin(), dx.end(), 0.0f);
  rmsnorm_bwd(dx.data(), dxf.data(), x.data(), norm.data(), N, C, eps);
  return loss;
}

std::vector<float> LlamaModel::forward(std::span<const int64_t> ids, int64_t B, int64_t T) {
  const int64_t NC = B * T * config_.hidden_size;
  std::vector<float> x(NC), y(NC), logits(B * T * config_.vocab_size);
  if (before_root) before_root(Pass::kForward);
  embed(ids, x, B, T);
  if (after_root) after_root(Pass::kForward);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (before_layer) before_layer(l, Pass::kForward);
    layer_forward(l, x, y, B, T);
    if (after_layer) after_layer(l, Pass::kForward);
    std::swap(x, y);
  }
  if (before_root) before_root(Pass::kForward);
  head_forward(x, logits, B, T);
  if (after_root) after_root(Pass::kForward);
  return logits;
}

float LlamaModel::forward_backward(std::span<const int64_t> ids, std::span<const int64_t> targets, int64_t B,
                                   int64_t T, double normalizer, const GradLookup& grad_lookup) {
  const int64_t L = config_.num_hidden_layers, NC = B * T * config_.hidden_size;
  std::vector<std::vector<float>> xs(L + 1, std::vector<float>(NC));  // checkpoints: each layer's input
  if (before_root) before_root(Pass::kForward);
  embed(ids, xs[0], B, T);
  if (after_root) after_root(Pass::kForward);
  for (int64_t l = 0; l < L; ++l) {
    if (before_layer) before_layer(l, Pass::kForward);
    layer_forward(l, xs[l], xs[l + 1], B, T);
    if (after_layer) after_layer(l, Pass::kForward);
  }
  std::vector<float> dx(NC), dprev(NC);
  if (before_root) before_root(Pass::kBackward);
  const float loss = head_forward_backward(xs[L], targets, dx, B, T, normalizer);
  if (after_root) after_root(Pass::kBackward);
  for (int64_t l = L - 1; l >= 0; --l) {
    if (before_layer) before_layer(l, Pass::kBackward);
    layer_backward(l, xs[l], dx, dprev, B, T, grad_lookup);
    if (after_layer) after_layer(l, Pass::kBackward);
    std::swap(dx, dprev);
  }
  return loss;
}

}  // namespace qshard
