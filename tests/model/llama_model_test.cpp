// LlamaModel: a decoder layer's backward (with activation recompute and LoRA dropout) and the
// whole training step against finite differences; hook order; and parity with transformers +
// PEFT (tests/data/model, scripts/golden/make_model_golden.py) for logits, loss and every LoRA gradient,
// on a 4-bit NF4 model (GQA 4/2, untied) and an f32 model (GQA 4/1, tied embeddings, llama3 RoPE).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fstream>

#include "checkpoint/llama_tree.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "model/llama_model.h"
#include "model_test_util.h"
#include "common/test_util.h"

namespace qshard {
namespace {

using test::check_grad;
using test::dot;
using test::random_vec;

const std::string kData = QSHARD_TEST_DATA_DIR;

// ---- a small random model ---------------------------------------------------------------------

LlamaConfig small_config() {
  LlamaConfig c;
  c.vocab_size = 19;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 16;
  return c;
}

// f32 tree with LoRA (r=2 on every projection by default), filled with random values (norm
// weights near 1).
std::unique_ptr<Module> random_tree(const LlamaConfig& c, uint32_t seed, const LoraSpec& lora = LoraSpec{2}) {
  LlamaTreeOptions o;
  o.dtype = DType::kF32;
  o.lora = lora;
  auto tree = build_llama_tree(c, o);
  for (auto& [name, t] : state_dict(*tree)) {
    const bool norm = name.find("norm") != std::string::npos;
    const std::vector<float> v = random_vec(t.numel(), seed++, norm ? 0.1f : 0.3f);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = v[i] + (norm ? 1.0f : 0.0f);
  }
  return tree;
}

// A tree of 4-bit NF4 projections (random floats quantized) with f32 LoRA `lora` and random f32
// norms (near 1) and embeddings.
std::unique_ptr<Module> random_4bit_tree(const LlamaConfig& c, uint32_t seed, const LoraSpec& lora) {
  LlamaTreeOptions o;
  o.dtype = DType::kF32;
  o.quant = QuantizeOptions{};
  o.lora = lora;
  auto tree = build_llama_tree(c, o);
  for (auto& [name, t] : state_dict(*tree)) {  // random floats (norms near 1); the 4-bit projections below
    if (t.dtype() != DType::kF32) continue;
    const bool norm = name.find("norm") != std::string::npos;
    const std::vector<float> v = random_vec(t.numel(), seed++, norm ? 0.1f : 0.3f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v[i] + (norm ? 1.0f : 0.0f);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                          "mlp.up_proj", "mlp.down_proj"}) {
      const std::string w = "model.layers." + std::to_string(l) + "." + p + ".weight";
      Params4bit& p4 = const_cast<Params4bit&>(*resolve(*tree, w).params4bit);
      const Shape shape = p4.quant_state.shape;
      p4 = quantize_4bit(Tensor::from_f32(shape, DType::kF32, random_vec(shape_numel(shape), seed++, 0.3f)));
    }
  return tree;
}

float* param(Module& tree, const std::string& fqn) { return resolve(tree, fqn).tensor.data<float>(); }

// Gradient buffers keyed by fqn, created on first lookup: the tree's weights with LoRA gradient
// buffers added (`skip` gets none), as a trainer's owner of the weights hands them.
struct GradStore : LlamaWeights {
  explicit GradStore(Module& t) : tree(t) {}
  Module& tree;
  std::map<std::string, std::vector<float>> grads;
  LlamaWeights* inner = nullptr;
  std::string skip;
  LayerWeights current;
  float* lookup(const std::string& fqn) {
    auto it = grads.find(fqn);
    if (it == grads.end()) it = grads.emplace(fqn, std::vector<float>(resolve(tree, fqn).tensor.numel(), 0.0f)).first;
    return it->second.data();
  }
  const LayerWeights& layer(int64_t l) override {
    current = inner->layer(l);
    for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
      if (current.proj[i].r == 0) continue;  // no adapter on this projection
      const std::string p = "model.layers." + std::to_string(l) + "." + kLlamaProjections[i];
      current.proj[i].grad_A = p + ".lora_A.weight" != skip ? lookup(p + ".lora_A.weight") : nullptr;
      current.proj[i].grad_B = p + ".lora_B.weight" != skip ? lookup(p + ".lora_B.weight") : nullptr;
    }
    return current;
  }
  const RootWeights& root() override { return inner->root(); }
  // The model reads its tree's weights through this store from now on.
  void attach(LlamaModel& model, const std::string& skip_fqn = "") {
    inner = &model.tree_weights();
    skip = skip_fqn;
    model.set_weights(this);
  }
};

// The CPU context of the model tests.
DeviceContext& ctx() {
  static DeviceContext c(Backend::kCpu, -1);
  return c;
}

// Mean cross entropy of logits [N,V] (the loss a training step reports).
double ce_loss(std::vector<float> logits, const std::vector<int64_t>& targets, int64_t N, int64_t V, double normalizer) {
  double sum = 0;
  cpu::cross_entropy_fwd_bwd(logits.data(), &sum, targets.data(), N, V, 0.0f, ctx());
  return sum / normalizer;
}

const char* kProjections[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                              "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// An optimizer's update between steps: every LoRA A and B of the tree moves by
// scale * ((i + layer) % 5) - shift, element i.
void move_lora(Module& tree, const LlamaConfig& c, float scale, float shift) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const char* p : kProjections)
      for (const char* ab : {".lora_A.weight", ".lora_B.weight"}) {
        Tensor t = resolve(tree, "model.layers." + std::to_string(l) + "." + p + ab).tensor;
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] += scale * static_cast<float>((i + l) % 5) - shift;
      }
}

// Every LoRA gradient of `got` within rel * max(1, max|want|) of `want`'s (28: two layers, seven
// projections, A and B), none of `want`'s all zero.
void expect_grads_close(const std::map<std::string, std::vector<float>>& got,
                        const std::map<std::string, std::vector<float>>& want, float rel, const std::string& what) {
  ASSERT_EQ(got.size(), 28u) << what;
  for (const auto& [name, g] : want) {
    const std::vector<float>& f = got.at(name);
    ASSERT_EQ(f.size(), g.size()) << name << " " << what;
    float gmax = 0;
    for (float v : g) gmax = std::max(gmax, std::fabs(v));
    EXPECT_GT(gmax, 0.0f) << name << " " << what;
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(f[i], g[i], rel * std::max(1.0f, gmax)) << name << "[" << i << "] " << what;
  }
}

// Same tolerance and reason as llama_layers_test.cpp (fp32 forward, central differences), but a
// smaller step: a whole layer / network has larger third derivatives, and with step 1e-2 the
// truncation error of central differences reached ~2% of the gradient (measured: the error fell
// by ~10x for each ~3x smaller step, i.e. O(eps^2), down to the fp32 rounding floor of ~2e-4 at
// 1e-3). At 3e-3 both terms are ~1e-4 .. 5e-4, inside 2e-3 * max(1, max|grad|).
constexpr float kEps = 3e-3f;
constexpr double kTol = 2e-3;

// One decoder layer's backward (recompute included) against central differences of its forward:
// dx and all 14 LoRA gradients, for B x T = 2 x 4 inputs drawn from `seed`.
void check_layer_backward(const LlamaModelOptions& opt, int64_t layer, uint32_t tree_seed, uint32_t seed,
                          const std::function<void(LlamaModel&)>& setup = {},
                          const LlamaConfig& c = small_config(),
                          const std::function<void(LlamaModel&)>& after = {}) {
  auto tree = random_tree(c, tree_seed);
  LlamaModel model(c, *tree, ctx(), opt);
  if (setup) setup(model);
  const int64_t B = 2, T = 4, NC = B * T * c.hidden_size;
  model.bind_layer(layer);
  std::vector<float> x = random_vec(NC, seed);
  const std::vector<float> wout = random_vec(NC, seed + 1);
  std::vector<float> y(NC);
  auto f = [&] {
    model.layer_forward(x.data(), y.data(), B, T);
    return dot(wout, y.data(), y.size());
  };
  GradStore gs(*tree);
  std::vector<float> dx(NC, 123.0f);  // overwritten, whatever it held
  gs.attach(model);
  model.bind_layer(layer);
  model.layer_backward(x.data(), wout.data(), dx.data(), B, T);
  EXPECT_EQ(gs.grads.size(), 14u);
  check_grad("layer dx", x.data(), x.size(), dx, f, kEps, kTol);
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  for (const char* p : kProjections)
    for (const char* ab : {"lora_A", "lora_B"}) {
      const std::string fqn = prefix + p + "." + ab + ".weight";
      check_grad(fqn, param(*tree, fqn), gs.grads[fqn].size(), gs.grads[fqn], f, kEps, kTol);
    }
  if (after) after(model);
}

LlamaModelOptions layer_test_options() {
  LlamaModelOptions opt;
  opt.lora_alpha = 4.0;
  opt.max_batch = 2;
  opt.max_seq = 4;
  return opt;
}

// The other families' layers (model/llama_model.h, docs/ARCHITECTURE.md "Model families"):
// Qwen2's q/k/v biases (no o_proj bias), Qwen3's q/k norms with biases on all four attention
// projections, Mistral's sliding window of 2 over T = 4 (it masks): the same checks, so the
// backward through q_norm / k_norm and the banded attention is the forward's derivative. Gemma:
// the 1 + weight norms, the post-attention and post-MLP norms, GeGLU, the query_pre_attn_scalar
// scale, the tested layer (1) sliding; Gemma 2 with soft-capped scores, Gemma 3 with q/k norms and
// the sliding layers' own RoPE.
LlamaConfig family_config(ModelFamily f) {
  LlamaConfig c = small_config();
  c.family = f;
  if (f == ModelFamily::kQwen2) c.attention_bias = true;
  if (f == ModelFamily::kQwen3) c.attention_bias = c.o_proj_bias = c.qk_norm = true;
  if (f == ModelFamily::kMistral) c.sliding_window = 2;
  if (f == ModelFamily::kGemma2 || f == ModelFamily::kGemma3) {
    c.gemma_norms = c.gelu_tanh = true;
    c.embed_scale = 4.0;
    c.query_pre_attn_scalar = 6.0;
    c.sliding_window = 2;
    c.sliding_layers = {false, true};
    if (f == ModelFamily::kGemma2) {
      c.attn_logit_softcapping = 0.5;
      c.final_logit_softcapping = 1.5;
    } else {
      c.qk_norm = true;
      c.rope_local_theta = 10.0;
      c.rope_scaling = RopeScaling{};
      c.rope_scaling.rope_type = "linear";
      c.rope_scaling.factor = 2.0;
    }
  }
  return c;
}

TEST(LlamaModel, FamilyDecoderLayerBackward) {
  for (ModelFamily f : {ModelFamily::kQwen2, ModelFamily::kQwen3, ModelFamily::kMistral, ModelFamily::kGemma2,
                        ModelFamily::kGemma3})
    for (bool fold : {true, false}) {
      SCOPED_TRACE(std::string(model_family_name(f)) + (fold ? " folded" : " unfolded"));
      LlamaModelOptions opt = layer_test_options();
      opt.fold_lora = fold;
      check_layer_backward(opt, 1, 21, 70, {}, family_config(f));
    }
}

TEST(LlamaModel, DecoderLayerBackwardWithRecomputeAndDropout) {
  LlamaModelOptions opt = layer_test_options();
  opt.lora_dropout = 0.1f;  // the mask must be identical in the backward's recompute
  opt.dropout_seed = 77;
  check_layer_backward(opt, 1, 1, 50, [](LlamaModel& m) { m.set_dropout_context(3, 8); });
}

// The training step passes one buffer as dout and dx (the residual gradient updated in place):
// the same bits, dx and LoRA gradients, as separate buffers.
TEST(LlamaModel, DecoderLayerBackwardInPlace) {
  const LlamaConfig c = small_config();
  auto tree = random_tree(c, 5);
  LlamaModel model(c, *tree, ctx(), layer_test_options());
  const int64_t B = 2, T = 4, NC = B * T * c.hidden_size;
  const std::vector<float> x = random_vec(NC, 90);
  const std::vector<float> dout = random_vec(NC, 91);
  GradStore apart_grads(*tree);
  apart_grads.attach(model);
  model.bind_layer(1);
  std::vector<float> dx(NC, 7.0f);
  model.layer_backward(x.data(), dout.data(), dx.data(), B, T);
  GradStore inplace_grads(*tree);
  inplace_grads.attach(model);
  model.bind_layer(1);
  std::vector<float> g = dout;
  model.layer_backward(x.data(), g.data(), g.data(), B, T);
  EXPECT_EQ(0, std::memcmp(dx.data(), g.data(), dx.size() * sizeof(float)));
  ASSERT_EQ(apart_grads.grads.size(), inplace_grads.grads.size());
  for (const auto& [fqn, v] : apart_grads.grads) {
    ASSERT_EQ(v.size(), inplace_grads.grads[fqn].size()) << fqn;
    EXPECT_EQ(0, std::memcmp(v.data(), inplace_grads.grads[fqn].data(), v.size() * sizeof(float))) << fqn;
  }
}

// The LoRA fold (q|k|v and gate|up: X A^T as extra K-columns of the base GEMMs, s B beside the
// weight; dropout off): the same checks on the folded path.
TEST(LlamaModel, FoldedDecoderLayerBackward) {
  const LlamaModelOptions opt = layer_test_options();
  ASSERT_TRUE(opt.fold_lora);
  check_layer_backward(opt, 0, 11, 60);
}

// q|k|v's backward fused (options.fuse_qkv_backward) against finite differences.
TEST(LlamaModel, FusedQkvDecoderLayerBackward) {
  LlamaModelOptions opt = layer_test_options();
  opt.fuse_qkv_backward = true;
  bool fused = false;
  check_layer_backward(opt, 0, 11, 60, {}, small_config(), [&](LlamaModel& m) { fused = m.qkv_backward_fused(); });
  EXPECT_TRUE(fused);
}

// The fold changes only the order of f32 sums: a training step, its logits and its LoRA
// gradients with fold_lora on equal those of the separate LoRA GEMMs within f32 rounding.
TEST(LlamaModel, FoldedStepEqualsSeparateLoraGemms) {
  const LlamaConfig c = small_config();
  const int64_t B = 2, T = 5;
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 5 + 2) % c.vocab_size, targets[i] = (i * 7 + 1) % c.vocab_size;
  double loss[2];
  std::vector<float> logits[2];
  std::map<std::string, std::vector<float>> grads[2];
  for (int k = 0; k < 2; ++k) {
    auto tree = random_tree(c, 21);
    LlamaModelOptions opt;
    opt.lora_alpha = 4.0;
    opt.max_batch = B;
    opt.max_seq = T;
    opt.fold_lora = k == 0;
    LlamaModel model(c, *tree, ctx(), opt);
    GradStore gs(*tree);
    gs.attach(model);
    model.forward_backward(ids, targets, B, T, 10.0);
    loss[k] = model.take_loss_sum();
    logits[k] = model.forward_logits(ids, B, T);
    grads[k] = gs.grads;
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-5 * std::fabs(loss[1]));
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_NEAR(logits[0][i], logits[1][i], 2e-5f) << i;
  expect_grads_close(grads[0], grads[1], 1e-5f, "folded");
}

// q|k|v's backward fused (options.fuse_qkv_backward: dq|dk|dv side by side, one input-gradient GEMM
// and one s dt GEMM over the stacked folded weights) changes only the order of f32 sums: the same
// step's loss and LoRA gradients as a GEMM per projection within f32 rounding, on 4-bit and dense
// bases, over three optimizer-moved steps, also with packed data. Where it cannot run (LoRA dropout
// turns the fold off, q/k norms) the projections run their own GEMMs, bit for bit the unfused step's.
TEST(LlamaModel, FusedQkvBackwardEqualsSeparateGemms) {
  const int64_t B = 2, T = 5;
  struct Run {
    std::vector<double> losses;
    std::map<std::string, std::vector<float>> grads;
    bool fused = false;
  };
  auto run = [&](const LlamaConfig& c, bool quantized, bool fuse, float dropout, bool packed) {
    auto tree = quantized ? random_4bit_tree(c, 23, LoraSpec{2}) : random_tree(c, 23);
    LlamaModelOptions opt;
    opt.lora_alpha = 4.0;
    opt.max_batch = B;
    opt.max_seq = T;
    opt.lora_dropout = dropout;
    opt.dropout_seed = 3;
    opt.fuse_qkv_backward = fuse;
    opt.packed_positions = packed;
    LlamaModel model(c, *tree, ctx(), opt);
    GradStore gs(*tree);
    gs.attach(model);
    Run r;
    for (int step = 0; step < 3; ++step) {
      std::vector<int64_t> ids(B * T), targets(B * T), pos(B * T);
      for (int64_t i = 0; i < B * T; ++i) {
        ids[i] = (i * 5 + 2 + step) % c.vocab_size, targets[i] = (i * 7 + 1 + 2 * step) % c.vocab_size;
        pos[i] = (i % T) < 3 ? i % T : i % T - 3;  // two pieces a sequence: 3 tokens, then 2
      }
      model.set_dropout_context(static_cast<uint64_t>(step), 0);
      model.forward_backward(ids, targets, B, T, 10.0, packed ? std::span<const int64_t>(pos) : std::span<const int64_t>());
      r.losses.push_back(model.take_loss_sum());
      r.fused = model.qkv_backward_fused();
      move_lora(*tree, c, 0.04f, 0.08f);
    }
    r.grads = gs.grads;
    return r;
  };
  auto close = [](const Run& a, const Run& b, const std::string& what) {
    ASSERT_EQ(a.losses.size(), b.losses.size());
    for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::fabs(b.losses[i])) << what;
    expect_grads_close(a.grads, b.grads, 2e-5f, what);
  };
  auto same = [](const Run& a, const Run& b, const std::string& what) {
    EXPECT_EQ(a.losses, b.losses) << what;
    for (const auto& [name, g] : b.grads)
      EXPECT_EQ(0, std::memcmp(a.grads.at(name).data(), g.data(), g.size() * sizeof(float))) << name << " " << what;
  };
  const LlamaConfig c = small_config();
  for (const bool quantized : {true, false}) {
    const std::string what = quantized ? "4-bit" : "f32";
    const Run fused = run(c, quantized, true, 0.0f, false), separate = run(c, quantized, false, 0.0f, false);
    EXPECT_TRUE(fused.fused) << what;
    EXPECT_FALSE(separate.fused) << what;
    close(fused, separate, what);
    // not bit for bit: the fused GEMM sums q's, k's and v's products in one loop
    bool differs = false;
    for (const auto& [name, g] : separate.grads)
      differs = differs || std::memcmp(fused.grads.at(name).data(), g.data(), g.size() * sizeof(float)) != 0;
    EXPECT_TRUE(differs) << what;
  }
  const Run p_on = run(c, true, true, 0.0f, true), p_off = run(c, true, false, 0.0f, true);
  EXPECT_TRUE(p_on.fused);
  close(p_on, p_off, "packed");
  // where it does not run: LoRA dropout (no fold in training), q/k norms
  const Run d_on = run(c, true, true, 0.25f, false), d_off = run(c, true, false, 0.25f, false);
  EXPECT_FALSE(d_on.fused);
  same(d_on, d_off, "dropout");
  LlamaConfig qk = c;
  qk.qk_norm = true;
  const Run q_on = run(qk, false, true, 0.0f, false), q_off = run(qk, false, false, 0.0f, false);
  EXPECT_FALSE(q_on.fused);
  same(q_on, q_off, "q/k norms");
}

// A LoRA rank far above every width of the model (8192 > hidden 16, intermediate 24, vocab 19) on
// one 4-bit projection: its GEMMs' rows are as long as the rank, which the workspace did not count
// (lora.r 65536 on q_proj overflowed it while the dequantized weights were held: an internal
// error). Folded and separate, the step runs and agrees.
TEST(LlamaModel, LoraRankAboveEveryWidthFitsTheWorkspace) {
  const LlamaConfig c = small_config();
  const int64_t B = 1, T = 4;
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 3 + 1) % c.vocab_size, targets[i] = (i * 5 + 4) % c.vocab_size;
  double loss[2];
  for (int k = 0; k < 2; ++k) {
    auto tree = random_4bit_tree(c, 41, LoraSpec{8192, {"q_proj"}});
    LlamaModelOptions opt;
    opt.lora_alpha = 4.0;
    opt.max_batch = B;
    opt.max_seq = T;
    opt.fold_lora = k == 0;
    LlamaModel model(c, *tree, ctx(), opt);
    GradStore gs(*tree);
    gs.attach(model);
    ASSERT_NO_THROW(model.forward_backward(ids, targets, B, T, 10.0)) << (k == 0 ? "folded" : "separate");
    loss[k] = model.take_loss_sum();
    EXPECT_TRUE(std::isfinite(loss[k]));
    EXPECT_EQ(gs.grads.size(), 4u);  // q_proj's A and B in both layers
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-5 * std::fabs(loss[1]));
}

// The memory plans of the training step: kept layers (internals from the forward, no recompute)
// give the same loss and LoRA gradients as full recompute, bit for bit (same arithmetic), over two
// micro-batches, with the LoRA fold and with LoRA dropout; the MLP in chunks of rows (a chunk
// boundary inside a sequence) gives them within f32 rounding (the weight gradients sum over rows
// in another order), dropout masks included (keyed per global row).
struct StepResult {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};
StepResult run_plan(const LlamaConfig& c, int64_t keep, int64_t chunk, float dropout, int64_t host = 0,
                    std::vector<int64_t>* host_layers = nullptr, bool host_checkpoints = false,
                    int64_t checkpoint_slots = kCheckpointSlots, int64_t checkpoint_every = 1,
                    bool kept_mlp = true, std::optional<bool> host_kept_mlp = std::nullopt, int64_t full = 0,
                    int64_t staging = 2, std::vector<int64_t>* kept_layers = nullptr) {
  const int64_t B = 2, T = 5;
  auto tree = random_tree(c, 33);
  LlamaModelOptions opt;
  opt.lora_alpha = 4.0;
  opt.max_batch = B;
  opt.max_seq = T;
  opt.lora_dropout = dropout;
  opt.dropout_seed = 9;
  opt.keep_layers = keep;
  opt.mlp_chunk_rows = chunk;
  opt.host_keep_layers = host;
  opt.host_checkpoints = host_checkpoints;
  opt.checkpoint_slots = checkpoint_slots;
  opt.checkpoint_every = checkpoint_every;
  opt.kept_mlp = kept_mlp;
  opt.host_kept_mlp = host_kept_mlp.value_or(kept_mlp);
  opt.full_kept_sets = full;
  opt.host_staging_sets = staging;
  LlamaModel model(c, *tree, ctx(), opt);
  if (host_layers) *host_layers = model.host_kept_layers();
  if (kept_layers) *kept_layers = model.device_kept_layers();
  GradStore gs(*tree);
  gs.attach(model);
  StepResult r;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<int64_t> ids(B * T), targets(B * T);
    for (int64_t i = 0; i < B * T; ++i)
      ids[i] = (i * 5 + 2 + micro) % c.vocab_size, targets[i] = (i * 7 + 1 + 3 * micro) % c.vocab_size;
    model.set_dropout_context(4, micro * B);
    model.forward_backward(ids, targets, B, T, 20.0);
    r.loss += model.take_loss_sum();
  }
  r.grads = gs.grads;
  return r;
}

// got's loss and every LoRA gradient bit for bit ref's.
void expect_same_step(const StepResult& got, const StepResult& ref, const std::string& what) {
  EXPECT_EQ(got.loss, ref.loss) << what;
  for (const auto& [name, g] : ref.grads) {
    const std::vector<float>& h = got.grads.at(name);
    ASSERT_EQ(h.size(), g.size());
    EXPECT_EQ(0, std::memcmp(h.data(), g.data(), g.size() * sizeof(float))) << name << " " << what;
  }
}

TEST(LlamaModel, MemoryPlansGiveTheSameStep) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 4;
  for (const float dropout : {0.0f, 0.25f}) {
    const StepResult ref = run_plan(c, 0, 0, dropout);
    ASSERT_EQ(ref.grads.size(), 56u);
    for (const int64_t keep : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{9}}) {
      expect_same_step(run_plan(c, keep, 0, dropout), ref,
                       "keep " + std::to_string(keep) + " dropout " + std::to_string(dropout));
    }
    for (const int64_t chunk : {int64_t{3}, int64_t{7}}) {
      const StepResult got = run_plan(c, 0, chunk, dropout);
      EXPECT_NEAR(got.loss, ref.loss, 1e-6 * std::fabs(ref.loss)) << "chunk " << chunk;
      for (const auto& [name, g] : ref.grads) {
        const std::vector<float>& h = got.grads.at(name);
        float gmax = 0;
        for (float v : g) gmax = std::max(gmax, std::fabs(v));
        EXPECT_GT(gmax, 0.0f) << name;
        for (size_t i = 0; i < g.size(); ++i)
          EXPECT_NEAR(h[i], g[i], 2e-5f * std::max(1.0f, gmax)) << name << "[" << i << "] chunk " << chunk;
      }
    }
  }
}

// Kept layers without the MLP's gate / up (options.kept_mlp false): their backward recomputes the
// two GEMMs from h2 with the forward's kernels, so device-kept and host-kept layers give full
// recompute's loss and LoRA gradients bit for bit (with LoRA dropout too: the same masks); a kept
// set is smaller by exactly gate's and up's buffers; a kept set whose gate / up were not
// recomputed (the working set's of another layer) would change the gradients.
TEST(LlamaModel, KeptLayersWithoutGateUpGiveTheSameStep) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 6;
  for (const float dropout : {0.0f, 0.25f}) {
    const StepResult ref = run_plan(c, 0, 0, dropout);
    struct Case {
      int64_t keep, host;
    };
    for (const Case& k : {Case{2, 0}, Case{4, 0}, Case{9, 0}, Case{3, 2}, Case{0, 5}}) {
      const StepResult got = run_plan(c, k.keep, 0, dropout, k.host, nullptr, false, kCheckpointSlots, 1, false);
      expect_same_step(got, ref,
                       "keep " + std::to_string(k.keep) + " host " + std::to_string(k.host) + " dropout " +
                           std::to_string(dropout));
    }
  }
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 5;
  const double full = llama_kept_layer_bytes(c, opt, Backend::kCpu, DType::kF32, 4);
  opt.kept_mlp = false;
  const double lean = llama_kept_layer_bytes(c, opt, Backend::kCpu, DType::kF32, 4);
  const double gate_up = 2.0 * 10 * static_cast<double>(c.intermediate_size) * 4;  // two [N, I] f32 buffers
  EXPECT_NEAR(full - lean, gate_up, 2 * 256.0) << "full " << full << " lean " << lean;  // buffer alignment
  EXPECT_LT(lean, full);
}

// Each tier its own shape (options.kept_mlp for the device-kept sets, host_kept_mlp for the host
// tier's staging and host sets): whole device sets beside lean host sets, and the other way round,
// give full recompute's bits, over one staging set and two (host sets stored), with dropout; the
// kept storage holds the kept sets at their size, then the staging sets at theirs (a staging set
// taken at the device sets' offset or size would copy the wrong bytes: other gradients), and the
// pinned host sets are the host tier's size.
TEST(LlamaModel, KeptMlpPerTierGivesTheSameStep) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 8;
  for (const float dropout : {0.0f, 0.25f}) {
    const StepResult ref = run_plan(c, 0, 0, dropout);
    struct Case {
      int64_t keep, host;
    };
    for (const Case& k : {Case{3, 1}, Case{3, 2}, Case{3, 4}, Case{2, 6}, Case{0, 5}})
      for (const bool device_whole : {true, false}) {
        std::vector<int64_t> layers;
        const StepResult got =
            run_plan(c, k.keep, 0, dropout, k.host, &layers, false, kCheckpointSlots, 1, device_whole, !device_whole);
        const std::string what = "keep " + std::to_string(k.keep) + " host " + std::to_string(k.host) +
                                 " device sets whole " + std::to_string(device_whole) + " dropout " +
                                 std::to_string(dropout);
        EXPECT_EQ(static_cast<int64_t>(layers.size()), std::min<int64_t>(k.host, 7 - std::max<int64_t>(k.keep - 1, 0)))
            << what;
        expect_same_step(got, ref, what);
      }
  }
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  opt.keep_layers = 3;
  opt.host_keep_layers = 4;
  opt.host_kept_mlp = false;
  const LlamaBufferDims d = llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4);
  const int64_t whole = llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16);
  const int64_t lean = llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16, true);
  EXPECT_NEAR(static_cast<double>(whole - lean), 2.0 * 32 * static_cast<double>(c.intermediate_size) * 2, 2 * 256.0);
  const BufferPlan p = llama_buffer_plan(d, Backend::kCuda, DType::kBF16);
  EXPECT_EQ(p.total(BufferLife::kKept), 2 * whole + 2 * lean);
  EXPECT_EQ(p.total(BufferLife::kHost), 2 * lean);
  EXPECT_EQ(llama_kept_layer_bytes(c, opt, Backend::kCuda, DType::kBF16, 4), static_cast<double>(whole));
  EXPECT_EQ(llama_kept_layer_bytes(c, opt, Backend::kCuda, DType::kBF16, 4, true), static_cast<double>(lean));
}

// Full kept sets (options.full_kept_sets): the first kept sets also hold h1, h2 (with the fold's
// x A^T columns) and m, so their backward reruns nothing; every kept layer, some of them, beside
// the host tier (the staging sets after the full and the plain kept sets), with dropout, give full
// recompute's loss and LoRA gradients bit for bit (a backward reading a full set the forward did not
// write, or the working set's h1 / m of another layer, would not). A full set is a whole one plus
// exactly h1's, h2's and m's buffers; lean sets (kept_mlp false) and more than the kept sets clamp.
TEST(LlamaModel, FullKeptSetsGiveTheSameStep) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 6;
  for (const float dropout : {0.0f, 0.25f}) {
    const StepResult ref = run_plan(c, 0, 0, dropout);
    struct Case {
      int64_t keep, host, full;
      bool whole;
    };
    for (const Case& k : {Case{6, 0, 5, true}, Case{6, 0, 2, true}, Case{4, 0, 9, true}, Case{3, 2, 1, true},
                          Case{4, 0, 3, false}}) {
      const StepResult got =
          run_plan(c, k.keep, 0, dropout, k.host, nullptr, false, kCheckpointSlots, 1, k.whole, std::nullopt, k.full);
      expect_same_step(got, ref,
                       "keep " + std::to_string(k.keep) + " host " + std::to_string(k.host) + " full " +
                           std::to_string(k.full) + " whole " + std::to_string(k.whole) + " dropout " +
                           std::to_string(dropout));
    }
  }
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  opt.keep_layers = 5;
  opt.host_keep_layers = 1;
  opt.full_kept_sets = 3;
  const int64_t r = 4, N = 32, C = c.hidden_size, I = c.intermediate_size;
  LlamaBufferDims d = llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, r);
  ASSERT_EQ(d.kept_sets, 4);
  EXPECT_EQ(d.full_sets, 3);
  const int64_t whole = llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16);
  const int64_t full = llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16, false, true);
  const double extra = static_cast<double>(N * (C + 3 * r) + N * (C + 2 * r) + N * I) * 2;  // h1, h2, m in bf16
  EXPECT_NEAR(static_cast<double>(full - whole), extra, 3 * 256.0);
  EXPECT_EQ(llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16, true, true), whole) << "staging sets are never full";
  EXPECT_EQ(llama_kept_sets_bytes(d, Backend::kCuda, DType::kBF16), 3 * full + whole);
  const BufferPlan p = llama_buffer_plan(d, Backend::kCuda, DType::kBF16);
  EXPECT_EQ(p.total(BufferLife::kKept), 3 * full + whole + whole);  // + one staging set
  bool m2 = false, m3 = false;
  for (const BufferEntry& e : p.entries()) {
    m2 = m2 || e.name == "kept[2].m";
    m3 = m3 || e.name == "kept[3].m";
  }
  EXPECT_TRUE(m2);
  EXPECT_FALSE(m3);
  EXPECT_EQ(llama_kept_layer_bytes(c, opt, Backend::kCuda, DType::kBF16, r, false, true), static_cast<double>(full));
  opt.kept_mlp = false;
  EXPECT_EQ(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, r).full_sets, 0);
  opt.kept_mlp = true;
  opt.mlp_chunk_rows = 8;
  EXPECT_EQ(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, r).full_sets, 0);
}

// Dequantized layers (options.dequantized_layers): the first layers keep their projections
// dequantized (4-bit) or widened / copied (the fold's [W | s B], the row-folded [W; A]) in a slot of
// their own from their first use on, and a later bind packs only the LoRA's columns and rows again.
// Over training steps whose LoRA weights change between them (an optimizer's update), an eval pass
// between them (with LoRA dropout the fold is off in training and on in eval: the slot's layout
// changes both ways) and kept layers, one slot and every layer's give the losses and LoRA gradients
// of no slots bit for bit, on a 4-bit base and on a dense one (a slot whose LoRA columns were not
// packed again would keep the first step's B and A: other numbers from the second step on). The
// slots are one kWeights entry; with every layer in one the workspace holds no weights.
TEST(LlamaModel, DequantizedLayersGiveTheSameSteps) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 3;
  const int64_t B = 2, T = 5;
  auto make_tree = [&](bool quantized) {
    return quantized ? random_4bit_tree(c, 71, LoraSpec{2}) : random_tree(c, 71);
  };
  struct Run {
    std::vector<double> losses;
    std::map<std::string, std::vector<float>> grads;
    int64_t weights_bytes = 0, workspace_bytes = 0;
  };
  auto run = [&](bool quantized, float dropout, int64_t keep, int64_t dequantized) {
    auto tree = make_tree(quantized);
    LlamaModelOptions opt;
    opt.lora_alpha = 4.0;
    opt.max_batch = B;
    opt.max_seq = T;
    opt.lora_dropout = dropout;
    opt.dropout_seed = 5;
    opt.keep_layers = keep;
    opt.dequantized_layers = dequantized;
    LlamaModel model(c, *tree, ctx(), opt);
    GradStore gs(*tree);
    gs.attach(model);
    Run r;
    r.weights_bytes = model.buffer_plan().total(BufferLife::kWeights);
    r.workspace_bytes = model.buffer_plan().total(BufferLife::kWorkspace);
    for (int step = 0; step < 3; ++step) {
      std::vector<int64_t> ids(B * T), targets(B * T);
      for (int64_t i = 0; i < B * T; ++i)
        ids[i] = (i * 5 + 2 + step) % c.vocab_size, targets[i] = (i * 7 + 1 + 3 * step) % c.vocab_size;
      model.set_dropout_context(static_cast<uint64_t>(step), 0);
      model.forward_backward(ids, targets, B, T, 20.0);
      r.losses.push_back(model.take_loss_sum());
      model.set_training(false);
      model.forward_loss(ids, targets, B, T);
      r.losses.push_back(model.take_loss_sum());
      model.set_training(true);
      move_lora(*tree, c, 0.05f, 0.1f);  // an optimizer's update: every LoRA A and B moves
    }
    r.grads = gs.grads;
    return r;
  };
  for (const bool quantized : {true, false})
    for (const float dropout : {0.0f, 0.25f})
      for (const int64_t keep : {int64_t{0}, int64_t{3}}) {
        const Run ref = run(quantized, dropout, keep, 0);
        EXPECT_EQ(ref.weights_bytes, 0);
        for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{7}}) {
          const std::string what = fmt::format("4-bit {} dropout {} keep {} dequantized {}", quantized, dropout, keep, n);
          const Run got = run(quantized, dropout, keep, n);
          EXPECT_EQ(got.losses, ref.losses) << what;
          ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
          for (const auto& [name, g] : ref.grads)
            EXPECT_EQ(0, std::memcmp(got.grads.at(name).data(), g.data(), g.size() * sizeof(float))) << name << " " << what;
          EXPECT_GT(got.weights_bytes, 0) << what;
          if (n >= 3) EXPECT_LT(got.workspace_bytes, ref.workspace_bytes) << what;
          else EXPECT_EQ(got.workspace_bytes, ref.workspace_bytes) << what;
        }
      }
  // The slots: the config's estimate (every projection 4-bit, LoRA on all seven, folded) has one
  // layer's dequantized weights, the fold's widened columns and the row-folded A rows in each.
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  opt.dequantized_layers = 2;
  const int64_t r = 4, C = c.hidden_size, I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const LlamaBufferDims d = llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, r);
  const int64_t weights = (q + 2 * kv) * (C + 3 * r) + (q + r) * C + 2 * I * (C + 2 * r) + (I + r) * C;
  const int64_t slot = llama_dequantized_layer_bytes(d, DType::kBF16);
  EXPECT_GE(slot, weights * 2);
  EXPECT_LE(slot, weights * 2 + 8 * kBufferAlign);
  EXPECT_EQ(llama_buffer_plan(d, Backend::kCuda, DType::kBF16).total(BufferLife::kWeights), 2 * slot);
  opt.dequantized_layers = 99;
  EXPECT_EQ(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, r).dequantized_layers, 3);
}

// More staging sets for the host tier (options.host_staging_sets): one, three and five rings of
// slots over six and three host-kept layers (the last that many stay on the device), beside kept
// layers, full sets and lean host sets, with dropout, give full recompute's bits (a value read from
// a slot the ring had given another layer, or a copy back into the wrong slot, would not); the
// device holds that many staging sets, the host the rest of the host-kept layers.
TEST(LlamaModel, HostStagingSetsGiveTheSameStep) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 8;
  for (const float dropout : {0.0f, 0.25f}) {
    const StepResult ref = run_plan(c, 0, 0, dropout);
    struct Case {
      int64_t keep, host, staging, full;
      bool host_whole;
    };
    for (const Case& k : {Case{0, 6, 1, 0, true}, Case{0, 6, 3, 0, true}, Case{2, 5, 3, 1, false},
                          Case{3, 3, 5, 0, true}, Case{0, 7, 4, 0, false}}) {
      std::vector<int64_t> layers;
      const StepResult got = run_plan(c, k.keep, 0, dropout, k.host, &layers, false, kCheckpointSlots, 1, true,
                                      k.host_whole, k.full, k.staging);
      const std::string what = "keep " + std::to_string(k.keep) + " host " + std::to_string(k.host) + " staging " +
                               std::to_string(k.staging) + " dropout " + std::to_string(dropout);
      EXPECT_EQ(static_cast<int64_t>(layers.size()), k.host) << what;
      expect_same_step(got, ref, what);
    }
  }
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  opt.keep_layers = 2;
  opt.host_keep_layers = 6;
  opt.host_staging_sets = 3;
  const LlamaBufferDims d = llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4);
  EXPECT_EQ(d.staging_sets, 3);
  const int64_t set = llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16, true);
  const BufferPlan p = llama_buffer_plan(d, Backend::kCuda, DType::kBF16);
  EXPECT_EQ(p.total(BufferLife::kKept), llama_kept_sets_bytes(d, Backend::kCuda, DType::kBF16) + 3 * set);
  EXPECT_EQ(p.total(BufferLife::kHost), 3 * set);
  opt.host_staging_sets = 9;
  EXPECT_EQ(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4).staging_sets, 6);
  opt.host_staging_sets = 0;
  EXPECT_EQ(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4).staging_sets, 1);
}

// The host tier (options.host_keep_layers, host_checkpoints): layers whose internals go to (pinned)
// host memory in the forward and come back through one or two staging sets before their backward,
// and the checkpoints x_l through three slots, give full recompute's loss and LoRA gradients bit
// for bit, beside device-kept layers and alone, with one
// staging set and two (host sets stored and kept in their staging set), over two micro-batches,
// with and without dropout. The host-kept layers are spread over all the layers but the last, the
// last of them at the layer before it; the device-kept ones are the last of the others; more than
// the layers left are clamped. A staging set mixed up between two
// layers (a wrong slot, a copy out of order) changes the gradients.
TEST(LlamaModel, HostKeptLayersGiveTheSameStep) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 8;
  for (const float dropout : {0.0f, 0.25f}) {
    const StepResult ref = run_plan(c, 0, 0, dropout);
    struct Case {
      int64_t keep, host;
      std::vector<int64_t> layers, kept;
    };
    for (const Case& k : {Case{0, 0, {}, {}}, Case{0, 1, {6}, {}}, Case{0, 2, {2, 6}, {}}, Case{0, 3, {1, 3, 6}, {}},
                          Case{0, 7, {0, 1, 2, 3, 4, 5, 6}, {}}, Case{3, 2, {2, 6}, {4, 5}},
                          Case{3, 5, {0, 1, 3, 4, 6}, {2, 5}}, Case{3, 9, {0, 1, 3, 4, 6}, {2, 5}},
                          Case{8, 4, {}, {0, 1, 2, 3, 4, 5, 6}}})
    for (const bool ckpt : {false, true}) {  // the checkpoints x_l in host memory too
      std::vector<int64_t> layers, kept;
      const StepResult got = run_plan(c, k.keep, 0, dropout, k.host, &layers, ckpt, kCheckpointSlots, 1, true,
                                      std::nullopt, 0, 2, &kept);
      const std::string what = "keep " + std::to_string(k.keep) + " host " + std::to_string(k.host) + " dropout " +
                               std::to_string(dropout) + " host checkpoints " + std::to_string(ckpt);
      EXPECT_EQ(layers, k.layers) << what;
      EXPECT_EQ(kept, k.kept) << what;
      expect_same_step(got, ref, what);
    }
  }
  // The plan: two staging sets after the kept sets, one host set per host-kept layer but the last
  // two (they stay in their staging sets), in pinned host memory (not counted as GPU memory).
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  opt.keep_layers = 3;
  opt.host_keep_layers = 4;
  const LlamaBufferDims d = llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4);
  EXPECT_EQ(d.kept_sets, 2);
  EXPECT_EQ(d.host_sets, 4);
  EXPECT_EQ(d.staging_sets, 2);
  const BufferPlan p = llama_buffer_plan(d, Backend::kCuda, DType::kBF16);
  const int64_t set = llama_kept_set_bytes(d, Backend::kCuda, DType::kBF16);
  EXPECT_EQ(p.total(BufferLife::kKept), 4 * set);
  EXPECT_EQ(p.total(BufferLife::kHost), 2 * set);
  EXPECT_EQ(p.total(), p.total(BufferLife::kRun) + p.total(BufferLife::kKept) + p.total(BufferLife::kWorkspace) +
                           p.total(BufferLife::kLibrary));
  EXPECT_NE(p.ledger().find("pinned host (kept layers)"), std::string::npos) << p.ledger();
  opt.host_checkpoints = true;  // x_0..x_8: three device slots, six in pinned memory
  const LlamaBufferDims dc = llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4);
  const BufferPlan pc = llama_buffer_plan(dc, Backend::kCuda, DType::kBF16);
  const int64_t x = 2 * 16 * c.hidden_size * 2;
  EXPECT_EQ(pc.total(BufferLife::kHost), 2 * set + 6 * x);
  EXPECT_EQ(pc.total(BufferLife::kRun) + 6 * x, p.total(BufferLife::kRun));
  opt.checkpoint_slots = 5;  // two more on the device, two fewer in pinned memory
  const BufferPlan p5 = llama_buffer_plan(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4),
                                          Backend::kCuda, DType::kBF16);
  EXPECT_EQ(p5.total(BufferLife::kHost), 2 * set + 4 * x);
  EXPECT_EQ(p5.total(BufferLife::kRun), pc.total(BufferLife::kRun) + 2 * x);
  opt.mlp_chunk_rows = 8;  // chunked MLP: no kept layers of either kind (the checkpoints may go)
  opt.keep_layers = 0;
  EXPECT_EQ(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4).host_sets, 0);
  EXPECT_TRUE(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4).host_checkpoints);
}

// The MLP's gradients take no buffers: dg / du go over gate / up, dm over m (llama_buffer_plan);
// with LoRA dropout on, dm has its own (down_proj's masked input is recomputed after its base
// GEMM wrote dm). The steps are the same bits either way (PlansGiveTheSameStep and the others).
TEST(LlamaModel, MlpGradientsGoOverTheForwardsBuffers) {
  const LlamaConfig c = small_config();
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  for (const int64_t chunk : {int64_t{0}, int64_t{8}}) {
    opt.mlp_chunk_rows = chunk;
    opt.lora_dropout = 0.0f;
    const BufferPlan p = llama_buffer_plan(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4),
                                           Backend::kCuda, DType::kBF16);
    opt.lora_dropout = 0.1f;
    const BufferPlan pd = llama_buffer_plan(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4),
                                            Backend::kCuda, DType::kBF16);
    const int64_t nm = chunk > 0 ? chunk : 2 * 16;
    const int64_t one = (nm * c.intermediate_size * 2 + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
    EXPECT_EQ(pd.total(BufferLife::kRun) - p.total(BufferLife::kRun), one) << pd.ledger(100);
    for (const char* name : {" dm ", " dg ", " du "})
      EXPECT_EQ(p.ledger(100).find(name), std::string::npos) << name << " in " << p.ledger(100);
    EXPECT_NE(pd.ledger(100).find(" dm "), std::string::npos) << pd.ledger(100);
  }
}

// Every second layer input kept (LlamaModelOptions::checkpoint_every 2): the odd layers' inputs
// rerun from the one before in the backward. Bitwise full recompute's step: odd and even layer
// counts, with LoRA dropout (the rerun draws the same masks), the MLP in chunks, the inputs in
// device buffers or through the ring (two slots and the scratch; the ring holding all).
TEST(LlamaModel, EverySecondCheckpointGivesTheSameStep) {
  for (const int64_t L : {4, 5}) {
    LlamaConfig c = small_config();
    c.num_hidden_layers = L;
    for (const float dropout : {0.0f, 0.25f})
      for (const int64_t chunk : {0, 3}) {
        const StepResult ref = run_plan(c, 0, chunk, dropout);
        for (const bool host : {false, true})
          for (const int64_t slots : {3, 9}) {
            if (!host && slots != 3) continue;
            SCOPED_TRACE(fmt::format("L {} dropout {} chunk {} host {} slots {}", L, dropout, chunk, host, slots));
            const StepResult got = run_plan(c, 0, chunk, dropout, 0, nullptr, host, slots, 2);
            EXPECT_EQ(got.loss, ref.loss);
            ASSERT_EQ(got.grads.size(), ref.grads.size());
            for (const auto& [name, g] : ref.grads)
              EXPECT_EQ(0, std::memcmp(got.grads.at(name).data(), g.data(), g.size() * sizeof(float))) << name;
          }
      }
  }
  LlamaConfig c = small_config();
  EXPECT_THROW(run_plan(c, 2, 0, 0.0f, 0, nullptr, false, 3, 2), Error);  // kept layers: refused
  EXPECT_EQ(llama_checkpoint_count(32, 2), 18);
  EXPECT_EQ(llama_checkpoint_index(30, 32, 2), 15);
  EXPECT_EQ(llama_checkpoint_index(29, 32, 2), -1);
  EXPECT_EQ(llama_checkpoint_index(31, 32, 2), 16);
  EXPECT_EQ(llama_checkpoint_index(32, 32, 2), 17);
  EXPECT_EQ(llama_checkpoint_count(5, 2), 4);  // x_0, x_2, x_4, x_5
  EXPECT_EQ(llama_checkpoint_index(3, 5, 2), -1);
  EXPECT_EQ(llama_checkpoint_index(4, 5, 2), 2);
}

// The checkpoints in host memory with the MLP in row chunks (long sequences): full recompute's
// loss, and LoRA gradients within the chunked run's rounding (the same chunks: bit for bit).
TEST(LlamaModel, HostCheckpointsWithMlpChunks) {
  LlamaConfig c = small_config();
  c.num_hidden_layers = 5;
  const StepResult ref = run_plan(c, 0, 3, 0.0f);
  // three device slots (x_0..x_2 to the host), four (x_0, x_1), five (x_0 alone): the same bits
  for (const int64_t slots : {3, 4, 5}) {
    SCOPED_TRACE("checkpoint slots " + std::to_string(slots));
    const StepResult got = run_plan(c, 0, 3, 0.0f, 0, nullptr, true, slots);
    EXPECT_EQ(got.loss, ref.loss);
    for (const auto& [name, g] : ref.grads)
      EXPECT_EQ(0, std::memcmp(got.grads.at(name).data(), g.data(), g.size() * sizeof(float))) << name;
  }
}

// Packed data (options.packed_positions): a sequence holding several pieces, positions restarting
// at each, gives the loss and LoRA gradients of running every piece as a sequence of its own
// (RoPE by the position in the piece, attention within it), for the Llama, Qwen3 and Mistral
// (window 3, shorter than a piece) layers; the padding after the last piece changes nothing. The
// same rows without their positions attend across the pieces and give another loss.
TEST(LlamaModel, PackedPositionsGiveEveryPieceItsOwnSequence) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kQwen3, ModelFamily::kMistral}) {
    SCOPED_TRACE(model_family_name(f));
    LlamaConfig c = f == ModelFamily::kLlama ? small_config() : family_config(f);
    if (f == ModelFamily::kMistral) c.sliding_window = 3;
    const int64_t B = 2, T = 8;
    const std::vector<std::vector<int>> pieces = {{3, 5}, {4, 2}};  // row 1: 2 positions of padding
    std::vector<int64_t> ids(B * T), targets(B * T, kIgnoreIndex), positions(B * T);
    for (int64_t r = 0; r < B; ++r) {
      int64_t j = 0;
      for (int len : pieces[static_cast<size_t>(r)])
        for (int t = 0; t < len; ++t, ++j) {
          ids[r * T + j] = (r * 11 + j * 5 + 2) % c.vocab_size;
          targets[r * T + j] = (r * 7 + j * 3 + 1) % c.vocab_size;
          positions[r * T + j] = t;
        }
      for (int t = 0; j < T; ++j, ++t) ids[r * T + j] = 1, positions[r * T + j] = t;
    }
    const double normalizer = 13.0;
    LlamaModelOptions opt;
    opt.lora_alpha = 4.0;
    opt.max_batch = B;
    opt.max_seq = T;
    opt.packed_positions = true;
    auto run = [&](bool packed) {
      auto tree = random_tree(c, 41);
      LlamaModel model(c, *tree, ctx(), opt);
      GradStore gs(*tree);
      gs.attach(model);
      StepResult r;
      if (packed) {
        model.forward_backward(ids, targets, B, T, normalizer, positions);
        r.loss = model.take_loss_sum();
      } else {  // each piece alone
        for (int64_t row = 0; row < B; ++row) {
          int64_t j = 0;
          for (int len : pieces[static_cast<size_t>(row)]) {
            const auto at = [&](const std::vector<int64_t>& v) {
              return std::vector<int64_t>(v.begin() + row * T + j, v.begin() + row * T + j + len);
            };
            model.forward_backward(at(ids), at(targets), 1, len, normalizer);
            r.loss += model.take_loss_sum();
            j += len;
          }
        }
      }
      r.grads = gs.grads;
      return r;
    };
    const StepResult got = run(true), ref = run(false);
    EXPECT_NEAR(got.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
    ASSERT_EQ(got.grads.size(), ref.grads.size());
    for (const auto& [name, g] : ref.grads) {
      const std::vector<float>& h = got.grads.at(name);
      float gmax = 0;
      for (float v : g) gmax = std::max(gmax, std::fabs(v));
      EXPECT_GT(gmax, 0.0f) << name;
      for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(h[i], g[i], 2e-5f * std::max(1.0f, gmax)) << name << "[" << i << "]";
    }
    auto tree = random_tree(c, 41);
    LlamaModel model(c, *tree, ctx(), opt);
    model.forward_loss(ids, targets, B, T);  // no positions: the pieces attend across
    EXPECT_GT(std::fabs(model.take_loss_sum() - ref.loss), 1e-3 * std::fabs(ref.loss));
    model.forward_loss(ids, targets, B, T, positions);
    EXPECT_NEAR(model.take_loss_sum(), ref.loss, 1e-5 * std::fabs(ref.loss));
  }
}

// Qwen3's q/k-norm inputs and rstd in kept sets, Mistral's window under every plan: kept layers
// (with and without gate / up, on the device and in host memory) give the recompute's bits, MLP
// chunks the same step within f32 rounding.
TEST(LlamaModel, FamilyMemoryPlansGiveTheSameStep) {
  for (ModelFamily f : {ModelFamily::kQwen3, ModelFamily::kMistral, ModelFamily::kGemma2, ModelFamily::kGemma3}) {
    SCOPED_TRACE(model_family_name(f));
    LlamaConfig c = family_config(f);
    c.num_hidden_layers = 3;
    if (!c.sliding_layers.empty()) c.sliding_layers = {true, false, true};
    const StepResult ref = run_plan(c, 0, 0, 0.0f);
    struct Case {
      int64_t keep, host;
      bool kept_mlp;
    };
    for (const Case& k : {Case{2, 0, true}, Case{3, 0, true}, Case{2, 0, false}, Case{3, 0, false}, Case{0, 2, false},
                          Case{2, 1, false}}) {
      const StepResult got =
          run_plan(c, k.keep, 0, 0.0f, k.host, nullptr, false, kCheckpointSlots, 1, k.kept_mlp);
      const std::string what =
          "keep " + std::to_string(k.keep) + " host " + std::to_string(k.host) + " kept_mlp " + std::to_string(k.kept_mlp);
      EXPECT_EQ(got.loss, ref.loss) << what;
      for (const auto& [name, g] : ref.grads)
        EXPECT_EQ(0, std::memcmp(got.grads.at(name).data(), g.data(), g.size() * sizeof(float))) << name << " " << what;
    }
    const StepResult chunked = run_plan(c, 0, 3, 0.0f);
    EXPECT_NEAR(chunked.loss, ref.loss, 1e-6 * std::fabs(ref.loss));
  }
}

// cuDNN's fused attention takes head_dim % 8 == 0 only: on CUDA any other head_dim is refused by
// name (the source and the value) before anything loads; the CPU backend takes it.
TEST(LlamaModel, GpuAttentionRefusesAHeadDimNotAMultipleOf8) {
  LlamaConfig c;
  c.head_dim = 14;
  try {
    check_attention_shape(c, Backend::kCuda, "models/odd/config.json");
    ADD_FAILURE() << "head_dim 14 accepted on CUDA";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("models/odd/config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("head_dim 14"), std::string::npos) << m;
    EXPECT_NE(m.find("device cpu"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_attention_shape(c, Backend::kCpu, "models/odd/config.json"));
  c.head_dim = 16;
  EXPECT_NO_THROW(check_attention_shape(c, Backend::kCuda, "models/odd/config.json"));
  c.attn_logit_softcapping = 50.0;  // Gemma 2's soft-capped scores: the eager attention on CUDA
  EXPECT_NO_THROW(check_attention_shape(c, Backend::kCuda, "gemma2/config.json"));
  EXPECT_NO_THROW(check_attention_shape(c, Backend::kCpu, "gemma2/config.json"));
}

TEST(LlamaModel, KeptLayersNeedTheWholeMlp) {
  const LlamaConfig c = small_config();
  auto tree = random_tree(c, 3);
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 5;
  opt.keep_layers = 2;
  opt.mlp_chunk_rows = 4;
  EXPECT_THROW(LlamaModel(c, *tree, ctx(), opt), Error);
  opt.mlp_chunk_rows = 10;  // >= the rows of a micro-batch: whole
  EXPECT_NO_THROW(LlamaModel(c, *tree, ctx(), opt));
}

// One memory model: the plan the planner makes from the config (llama_buffer_dims: 4-bit base,
// LoRA of rank r on all seven projections) is the plan the model makes from its tree, entry for
// entry, and the model allocates exactly its totals (activations, kept sets, workspace); with
// LoRA on some projections only, the config's plan still bounds the allocation.
TEST(LlamaModel, BufferPlanIsWhatTheModelAllocates) {
  for (const auto& [keep, chunk] : {std::pair<int64_t, int64_t>{0, 0}, {3, 0}, {0, 7}, {1, 0}})
    for (const bool fold : {true, false})
      for (const int64_t T : {int64_t{5}, int64_t{64}})
        for (const float dropout : {0.0f, 0.1f}) {
          const LlamaConfig c = small_config();
          LlamaTreeOptions to;
          to.dtype = DType::kF32;
          to.quant = QuantizeOptions{};
          to.lora.r = 2;
          auto tree = build_llama_tree(c, to);
          LlamaModelOptions opt;
          opt.max_batch = 3;
          opt.max_seq = T;
          opt.fold_lora = fold;
          opt.keep_layers = keep;
          opt.mlp_chunk_rows = chunk;
          opt.lora_dropout = dropout;
          const std::string what = "fold " + std::to_string(fold) + " T " + std::to_string(T) + " keep " +
                                   std::to_string(keep) + " chunk " + std::to_string(chunk) + " dropout " +
                                   std::to_string(dropout);
          const BufferPlan want = llama_buffer_plan(
              llama_buffer_dims(c, opt, Backend::kCpu, DType::kF32, DType::kF32, 2), Backend::kCpu, DType::kF32);
          DeviceContext cpu(Backend::kCpu, -1);
          LlamaModel model(c, *tree, cpu, opt);
          const BufferPlan& got = model.buffer_plan();
          ASSERT_EQ(want.entries().size(), got.entries().size()) << what;
          for (size_t i = 0; i < want.entries().size(); ++i) {
            EXPECT_EQ(want.entries()[i].name, got.entries()[i].name) << what;
            EXPECT_EQ(want.entries()[i].bytes, got.entries()[i].bytes) << what << " " << got.entries()[i].name;
            EXPECT_EQ(want.entries()[i].life, got.entries()[i].life) << what;
          }
          const LlamaStepBytes alloc = model.allocated_bytes();
          EXPECT_EQ(alloc.activations, static_cast<double>(got.total(BufferLife::kRun) + got.total(BufferLife::kKept)))
              << what;
          EXPECT_EQ(alloc.workspace, static_cast<double>(got.total(BufferLife::kWorkspace) + Workspace::kAlign)) << what;
          const LlamaStepBytes planned = llama_step_bytes(c, opt, Backend::kCpu, DType::kF32, DType::kF32, 2);
          EXPECT_EQ(planned.activations, alloc.activations) << what;
          EXPECT_EQ(planned.workspace + Workspace::kAlign, alloc.workspace) << what;
        }
  // LoRA on the attention projections only: the estimate (LoRA on all seven) bounds the allocation.
  const LlamaConfig c = small_config();
  LlamaTreeOptions to;
  to.dtype = DType::kF32;
  to.quant = QuantizeOptions{};
  to.lora.r = 2;
  to.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  auto tree = build_llama_tree(c, to);
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  DeviceContext cpu(Backend::kCpu, -1);
  LlamaModel model(c, *tree, cpu, opt);
  const LlamaStepBytes planned = llama_step_bytes(c, opt, Backend::kCpu, DType::kF32, DType::kF32, 2);
  EXPECT_GE(planned.activations, model.allocated_bytes().activations);
  EXPECT_GE(planned.workspace + Workspace::kAlign, model.allocated_bytes().workspace);
  EXPECT_GT(planned.activations, model.allocated_bytes().activations);  // the fold of gate|up is planned, not built
}

// The ledger names every lifetime's total and its largest buffers.
TEST(LlamaModel, BufferLedgerNamesTheLargestBuffers) {
  const LlamaConfig c = small_config();
  LlamaModelOptions opt;
  opt.max_batch = 2;
  opt.max_seq = 16;
  opt.keep_layers = 3;
  const BufferPlan p =
      llama_buffer_plan(llama_buffer_dims(c, opt, Backend::kCuda, DType::kBF16, DType::kBF16, 4), Backend::kCuda,
                        DType::kBF16);
  const std::string l = p.ledger();
  EXPECT_NE(l.find("activations"), std::string::npos) << l;
  EXPECT_NE(l.find("kept layers"), std::string::npos) << l;
  EXPECT_NE(l.find("workspace"), std::string::npos) << l;
  EXPECT_NE(l.find("attention workspace (cuDNN)"), std::string::npos) << l;
  EXPECT_NE(l.find("xs (layer inputs)"), std::string::npos) << l;
  EXPECT_EQ(p.total(), p.total(BufferLife::kRun) + p.total(BufferLife::kKept) + p.total(BufferLife::kWorkspace) +
                           p.total(BufferLife::kLibrary));
}

// The LM head and loss in row chunks (3 rows, so a chunk boundary falls inside each sequence):
// the same loss, logits and LoRA gradients as one chunk, bit for bit (row-independent math).
TEST(LlamaModel, HeadChunksGiveTheSameStep) {
  const LlamaConfig c = small_config();
  const int64_t B = 2, T = 5;
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 3 + 1) % c.vocab_size, targets[i] = (i * 11 + 2) % c.vocab_size;
  targets[7] = kIgnoreIndex;
  double loss[2];
  std::vector<float> logits[2];
  std::map<std::string, std::vector<float>> grads[2];
  for (int k = 0; k < 2; ++k) {
    auto tree = random_tree(c, 7);
    LlamaModelOptions opt;
    opt.max_batch = B;
    opt.max_seq = T;
    if (k == 1) opt.head_chunk_bytes = 3 * 4 * c.vocab_size;
    LlamaModel model(c, *tree, ctx(), opt);
    EXPECT_EQ(model.head_chunk_rows(), k == 1 ? 3 : B * T);
    GradStore gs(*tree);
    gs.attach(model);
    model.forward_backward(ids, targets, B, T, 9.0);
    loss[k] = model.take_loss_sum();
    logits[k] = model.forward_logits(ids, B, T);
    grads[k] = gs.grads;
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(LlamaModel, TrainingStepBackwardHooksAndAccumulation) {
  const LlamaConfig c = small_config();
  auto tree = random_tree(c, 100);
  LlamaModelOptions opt;
  opt.lora_dropout = 0.2f;
  opt.lora_alpha = 4.0;
  opt.max_batch = 2;
  opt.max_seq = 5;
  LlamaModel model(c, *tree, ctx(), opt);
  const int64_t B = 2, T = 5;
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (i * 7 + 3) % c.vocab_size, targets[i] = (i * 5 + 1) % c.vocab_size;
  targets[2] = kIgnoreIndex;
  const double normalizer = 12.0;

  std::vector<std::string> calls;
  const char* pass_name[2] = {"f", "b"};
  model.before_root = [&](Pass p) { calls.push_back(std::string("root+") + pass_name[int(p)]); };
  model.after_root = [&](Pass p) { calls.push_back(std::string("root-") + pass_name[int(p)]); };
  model.before_layer = [&](int64_t l, Pass p) { calls.push_back("L" + std::to_string(l) + "+" + pass_name[int(p)]); };
  model.after_layer = [&](int64_t l, Pass p) { calls.push_back("L" + std::to_string(l) + "-" + pass_name[int(p)]); };

  GradStore gs(*tree);
  gs.attach(model);
  model.forward_backward(ids, targets, B, T, normalizer);
  const double loss = model.take_loss_sum() / normalizer;
  const std::vector<std::string> want = {"root+f", "root-f", "L0+f", "L0-f", "L1+f", "L1-f",
                                         "root+b", "root-b", "L1+b", "L1-b", "L0+b", "L0-b"};
  EXPECT_EQ(calls, want);
  EXPECT_EQ(gs.grads.size(), 28u);

  // The loss equals cross entropy of forward_logits()'s logits (same dropout masks in both).
  const std::vector<float> logits = model.forward_logits(ids, B, T);
  EXPECT_DOUBLE_EQ(loss, ce_loss(logits, targets, B * T, c.vocab_size, normalizer));
  // Eval's loss routine gives the same sum without the logits.
  model.forward_loss(ids, targets, B, T);
  EXPECT_DOUBLE_EQ(model.take_loss_sum() / normalizer, loss);

  // Finite differences of the whole step on two LoRA tensors (layer 0 gets its gradient through
  // layer 1, the final norm, the LM head and the loss).
  auto f = [&] {
    return ce_loss(model.forward_logits(ids, B, T), targets, B * T, c.vocab_size, normalizer);
  };
  for (const std::string fqn : {"model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.0.mlp.up_proj.lora_B.weight"})
    check_grad(fqn, param(*tree, fqn), gs.grads[fqn].size(), gs.grads[fqn], f, kEps, kTol);

  // Gradients accumulate: a second identical step doubles them; nullptr skips a tensor.
  const std::string skip = "model.layers.1.mlp.down_proj.lora_B.weight";
  std::map<std::string, std::vector<float>> first = gs.grads;
  gs.attach(model, skip);
  model.forward_backward(ids, targets, B, T, normalizer);
  for (auto& [k, g] : gs.grads)
    for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], (k == skip ? 1.0f : 2.0f) * first[k][i]) << k;
}

TEST(LlamaModel, LayerPiecesComposeToForward) {
  const LlamaConfig c = small_config();
  auto tree = random_tree(c, 200);
  LlamaModelOptions opt;
  opt.max_seq = 6;
  LlamaModel model(c, *tree, ctx(), opt);
  const int64_t B = 1, T = 6, NC = B * T * c.hidden_size;
  const std::vector<int64_t> ids = {1, 5, 2, 18, 0, 7};
  std::vector<float> x(NC), y(NC), logits(B * T * c.vocab_size);
  model.bind_root();
  model.embed(ids, x.data(), B, T);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    model.bind_layer(l);
    model.layer_forward(x.data(), y.data(), B, T);
    std::swap(x, y);
  }
  model.bind_root();
  model.head_forward(x.data(), logits.data(), B, T);
  EXPECT_EQ(logits, model.forward_logits(ids, B, T));
}

// ---- parity with transformers + PEFT ----------------------------------------------------------

struct Loaded {
  LlamaConfig config;
  std::unique_ptr<Module> tree;
  LlamaModelOptions options;
};

// A model folder (plain or bitsandbytes 4-bit) plus a PEFT adapter folder, loaded into one tree.
Loaded load_with_adapter(const std::string& model_dir, const std::string& adapter_dir) {
  Loaded out;
  out.config = LlamaConfig::load(model_dir);
  std::ifstream cfg_file(adapter_dir + "/adapter_config.json");
  const nlohmann::json acfg = nlohmann::json::parse(cfg_file);
  out.options.lora_alpha = acfg.at("lora_alpha").get<double>();
  out.options.use_rslora = acfg.value("use_rslora", false);
  out.options.lora_dropout = acfg.value("lora_dropout", 0.0f);
  const SafetensorsFolder folder = SafetensorsFolder::open(model_dir);
  LlamaTreeOptions o;
  o.dtype = *folder.find("model.embed_tokens.weight")->dtype;
  if (out.config.quantized) {
    const auto& q = out.config.raw["quantization_config"];
    QuantizeOptions qo;
    qo.quant_type = parse_quant_type(q.value("bnb_4bit_quant_type", std::string("nf4")));
    qo.compress_statistics = q.value("bnb_4bit_use_double_quant", false);
    o.quant = qo;
  }
  o.lora.r = acfg.at("r").get<int64_t>();
  out.tree = build_llama_tree(out.config, o);
  NamedTensors dict;
  for (const auto& name : folder.names()) dict.emplace_back(name, folder.get(name));
  const LoadReport rep = load_state_dict(*out.tree, dict, /*strict=*/false, model_dir);
  EXPECT_TRUE(rep.unexpected.empty() && rep.mismatched.empty()) << rep.str();
  for (const auto& m : rep.missing) EXPECT_NE(m.find(".lora_"), std::string::npos) << m;
  const SafetensorsFolder adapter = SafetensorsFolder::open_file(adapter_dir + "/adapter_model.safetensors");
  const std::string prefix = "base_model.model.";
  size_t n = 0;
  for (const auto& name : adapter.names()) {
    EXPECT_EQ(name.rfind(prefix, 0), 0u) << name;
    resolve(*out.tree, name.substr(prefix.size())).tensor.copy_from(adapter.get(name));
    ++n;
  }
  EXPECT_EQ(n, rep.missing.size()) << "the adapter fills exactly the LoRA slots";
  return out;
}

std::vector<int64_t> i64(const Tensor& t) {
  const int64_t* p = t.data<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

// Tolerances (fp32 both sides; only the summation order differs: torch's blocked/vectorised
// GEMM and reductions vs our sequential loops). The golden script measured the fp32 noise of
// this computation itself as f32 vs f64 differences: logits ~2e-7 (nf4) / 1.5e-6 (llama3)
// absolute, LoRA gradients ~1.5e-6 relative to each tensor's max. We allow ~10-50x that:
//   logits: |ours - hf| <= 2e-5 absolute (logits are O(1));
//   loss:   |ours - hf| <= 1e-5 absolute;
//   grads:  max |ours - hf| <= 5e-5 * max |hf| per tensor.
// The nf4 case is transformers + bitsandbytes 0.50.2 + PEFT itself (make_model_golden.py): its
// forward multiplies with the unrounded float32 dequantized weights, its backward's input gradient
// with them rounded to the quant state's bf16. Either rule swapped moves the golden by far more than
// these tolerances (the script prints it: forward rounded 2.1e-3 of max|logit| and 6.4e-3 of the
// LoRA gradients; backward unrounded 2.5e-3 of the gradients, logits unchanged), so each can fail.
constexpr double kLogitTol = 2e-5, kLossTol = 1e-5, kGradRelTol = 5e-5;

void golden_case(const std::string& name, const std::string& model_dir, bool expect_4bit, bool expect_tied) {
  Loaded m = load_with_adapter(model_dir, kData + "/model/" + name + "_adapter");
  const Module::Slot* q = m.tree->find_module("model.layers.0.self_attn.q_proj")->slot("weight");
  EXPECT_EQ(q->kind == Module::SlotKind::kParams4bit, expect_4bit);
  EXPECT_EQ(m.tree->child("lm_head")->slot("weight") == nullptr, expect_tied);
  EXPECT_LT(m.config.num_key_value_heads, m.config.num_attention_heads);
  const SafetensorsFolder g = SafetensorsFolder::open_file(kData + "/model/" + name + ".golden.safetensors");
  const Tensor ids_t = g.get("input_ids");
  const int64_t B = ids_t.dim(0), T = ids_t.dim(1), V = m.config.vocab_size;
  const std::vector<int64_t> ids = i64(ids_t), labels = i64(g.get("labels")), targets = i64(g.get("targets"));
  EXPECT_EQ(shift_labels(labels.data(), B, T), targets);
  const double normalizer = static_cast<double>(g.get("normalizer").data<int64_t>()[0]);

  m.options.max_batch = B;
  m.options.max_seq = T;
  LlamaModel model(m.config, *m.tree, ctx(), m.options);
  const std::vector<float> logits = model.forward_logits(ids, B, T);
  const std::vector<float> want_logits = g.get("logits").to_f32_vector();
  ASSERT_EQ(logits.size(), static_cast<size_t>(B * T * V));
  double worst = 0;
  for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(double(logits[i]) - want_logits[i]));
  std::printf("  %s logits[0..2]: %.7f %.7f %.7f  hf %.7f %.7f %.7f; max |diff| %.3e (tol %.0e)\n", name.c_str(),
              logits[0], logits[1], logits[2], want_logits[0], want_logits[1], want_logits[2], worst, kLogitTol);
  EXPECT_LE(worst, kLogitTol);

  GradStore gs(*m.tree);
  gs.attach(model);
  model.forward_backward(ids, targets, B, T, normalizer);
  const double loss = model.take_loss_sum() / normalizer;
  const float want_loss = g.get("loss").to_f32_vector()[0];
  std::printf("  %s loss %.7f hf %.7f (normalizer %.0f)\n", name.c_str(), loss, want_loss, normalizer);
  EXPECT_NEAR(loss, want_loss, kLossTol);

  size_t checked = 0;
  double worst_rel = 0;
  for (const auto& key : g.names()) {
    if (key.rfind("grad.", 0) != 0) continue;
    const std::string fqn = key.substr(std::string("grad.base_model.model.").size());
    ASSERT_TRUE(gs.grads.count(fqn)) << "no gradient for " << fqn;
    const std::vector<float> want = g.get(key).to_f32_vector();
    const std::vector<float>& got = gs.grads[fqn];
    ASSERT_EQ(got.size(), want.size()) << fqn;
    double gmax = 0, err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      gmax = std::max(gmax, std::fabs(double(want[i])));
      err = std::max(err, std::fabs(double(got[i]) - want[i]));
    }
    EXPECT_GT(gmax, 0.0) << fqn << ": the golden gradient should be non-zero";
    EXPECT_LE(err, kGradRelTol * gmax) << fqn << ": max |diff| " << err << ", max |hf| " << gmax;
    worst_rel = std::max(worst_rel, err / gmax);
    ++checked;
  }
  std::printf("  %s: %zu LoRA gradients, worst max|diff|/max|hf| %.3e (tol %.0e)\n", name.c_str(), checked, worst_rel,
              kGradRelTol);
  EXPECT_EQ(checked, static_cast<size_t>(2 * 7 * m.config.num_hidden_layers));
  EXPECT_EQ(gs.grads.size(), checked);
}

TEST(LlamaModelGolden, Nf4ModelMatchesTransformersAndPeft) {
  golden_case("nf4", kData + "/hf/tiny_llama_bnb4_nf4_dq", /*expect_4bit=*/true, /*expect_tied=*/false);
}

TEST(LlamaModelGolden, TiedLlama3GqaModelMatchesTransformersAndPeft) {
  golden_case("llama3", kData + "/model/tiny_llama3_tied", /*expect_4bit=*/false, /*expect_tied=*/true);
}

// Gemma 2 and Gemma 3 (scripts/golden/make_gemma_golden.py: every Gemma feature changes their
// logits; Gemma 2 with binding soft-caps, tied; Gemma 3 with q/k norms, two RoPEs, untied).
TEST(LlamaModelGolden, Gemma2MatchesTransformersAndPeft) {
  golden_case("gemma2", kData + "/family/gemma2", /*expect_4bit=*/false, /*expect_tied=*/true);
}

TEST(LlamaModelGolden, Gemma3MatchesTransformersAndPeft) {
  golden_case("gemma3", kData + "/family/gemma3", /*expect_4bit=*/false, /*expect_tied=*/false);
}

}  // namespace
}  // namespace qshard
