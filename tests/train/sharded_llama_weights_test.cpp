// The typed layer views of a sharded Llama (train/sharded_llama_weights.h), under mpirun -np 1..3:
// after each gather, every operand of LayerWeights / RootWeights points at the bytes of the
// unsharded original (4-bit data and statistics, plain and double-quantized; biases; norms; LoRA
// A/B; embedding, final norm, LM head), at the very address the tree's view of the same unit
// has inside a TreeViews scope; the LoRA gradient pointers are the manager's gradient buffer. A
// step's gathers (no TreeViews scope) leave the tree alone: its slots stay meta tensors. A unit
// that is not gathered is an error naming it, never stale bytes.
#include <gtest/gtest.h>

#include <cstring>

#include "checkpoint/llama_tree.h"
#include "common/random_tree.h"
#include "common/test_stream.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"
#include "train/sharded_llama_weights.h"

namespace qshard {
namespace {

using testing_util::randomize;

LlamaConfig config() {
  nlohmann::json j = {{"vocab_size", 77},       {"hidden_size", 64},        {"intermediate_size", 96},
                      {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"attention_bias", true}};
  return LlamaConfig::from_json(j, "tiny");
}

// Layer 1's projections are double-quantized, the others not: both statistic layouts are bound.
std::unique_ptr<Module> make_tree(const LlamaConfig& c) {
  LlamaTreeOptions o;
  o.quant = QuantizeOptions{QuantType::kNf4, 64, false};
  o.lora.r = 4;
  o.lora.targets = {"q_proj", "v_proj", "down_proj"};
  auto tree = build_llama_tree(c, o);
  for (const char* p : {"self_attn.q_proj", "mlp.down_proj", "mlp.up_proj"}) {
    Params4bit& w = *tree->find_module(std::string("model.layers.1.") + p)->slot("weight")->params4bit;
    w = quantize_4bit(Tensor::zeros(w.quant_state.shape, DType::kBF16, Device::kCpu), {QuantType::kNf4, 64, true});
  }
  uint32_t seed = 11;
  randomize(*tree, seed);
  return tree;
}

const void* bytes_of(Module& tree, const std::string& fqn) { return resolve(tree, fqn).tensor.raw(); }

void expect_same(const void* got, Module& original, const std::string& fqn) {
  const Resolved o = resolve(original, fqn);
  ASSERT_NE(got, nullptr) << fqn;
  EXPECT_EQ(std::memcmp(got, o.tensor.raw(), o.tensor.nbytes()), 0) << fqn << ": bytes differ from the original";
}

TEST(ShardedLlamaWeights, GatheredOperandsAreTheOriginalBytesAndTheTreeIsLeftAlone) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  const LlamaConfig c = config();
  const auto original = make_tree(c);
  auto tree = make_tree(c);  // same seed: same values
  ShardedParameterManager mgr(comm, qshard_test_compute_stream(), ShardOptions{});
  const ShardedTree st = shard_module_tree(*tree, mgr, "model.layers");
  mgr.finalize();
  mgr.release_all_views();  // the tree keeps shapes only: every byte below comes from a gather
  const LlamaTreeSlots slots(c, *tree, ctx, false);
  ShardedLlamaWeights weights(c, slots, mgr, st);
  const int L = static_cast<int>(c.num_hidden_layers), root = L;

  EXPECT_THROW(weights.layer(0), Error);
  EXPECT_THROW(weights.root(), Error);

  // A step's gathers: the typed views are bound, the tree is not touched.
  for (int u = 0; u <= L; ++u) {
    mgr.gather(u, GatherFor::kBackward);
    mgr.compute_stream().synchronize();
    if (u < L) {
      const LayerWeights& w = weights.layer(u);
      const std::string p = "model.layers." + std::to_string(u) + ".";
      for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
        const std::string fqn = p + kLlamaProjections[i];
        const ProjectionWeights& pw = w.proj[i];
        ASSERT_TRUE(pw.quantized) << fqn;
        EXPECT_FALSE(resolve(*tree, fqn + ".weight").tensor.defined()) << fqn << ": the step re-pointed the tree";
        expect_same(pw.q.packed, *original, fqn + ".weight");
        const bool nested = u == 1 && (i == kQ || i == kDown || i == kUp);
        EXPECT_EQ(pw.q.absmax_q8 != nullptr, nested) << fqn;
        if (nested) {
          expect_same(pw.q.absmax_q8, *original, fqn + ".weight.absmax");
          expect_same(pw.q.nested_absmax, *original, fqn + ".weight.nested_absmax");
          expect_same(pw.q.nested_code, *original, fqn + ".weight.nested_quant_map");
        } else {
          expect_same(pw.q.absmax, *original, fqn + ".weight.absmax");
        }
        EXPECT_EQ(pw.bias.data != nullptr, i <= kO) << fqn << ": attention_bias gives q/k/v/o biases";
        if (pw.bias.data) expect_same(pw.bias.data, *original, fqn + ".bias");
        const bool lora = i == kQ || i == kV || i == kDown;
        ASSERT_EQ(pw.r, lora ? 4 : 0) << fqn;
        if (!lora) continue;
        EXPECT_EQ(pw.lora_A.dtype, DType::kF32);  // no compute copies on the CPU: the gathered masters
        expect_same(pw.lora_A.data, *original, fqn + ".lora_A.weight");
        expect_same(pw.lora_B.data, *original, fqn + ".lora_B.weight");
        EXPECT_EQ(pw.grad_A, mgr.grad(u, fqn + ".lora_A.weight").data<float>()) << fqn;
        EXPECT_EQ(pw.grad_B, mgr.grad(u, fqn + ".lora_B.weight").data<float>()) << fqn;
      }
      expect_same(w.input_norm.data, *original, p + "input_layernorm.weight");
      expect_same(w.post_norm.data, *original, p + "post_attention_layernorm.weight");
    } else {
      const RootWeights& r = weights.root();
      expect_same(r.embed.data, *original, "model.embed_tokens.weight");
      expect_same(r.norm.data, *original, "model.norm.weight");
      expect_same(r.head.data, *original, "lm_head.weight");
      EXPECT_FALSE(resolve(*tree, "model.norm.weight").tensor.defined());
    }
    mgr.release(u);
    if (u < L) EXPECT_THROW(weights.layer(u), Error) << "a released unit's weights must not be readable";
  }

  // Inside a TreeViews scope the tree's views are the same bytes, at the same addresses.
  {
    const TreeViews views(st);
    for (int u = 0; u < L; ++u) {
      mgr.gather(u);
      const LayerWeights& w = weights.layer(u);
      const std::string p = "model.layers." + std::to_string(u) + ".";
      for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
        const std::string fqn = p + kLlamaProjections[i];
        EXPECT_EQ(w.proj[i].q.packed, bytes_of(*tree, fqn + ".weight")) << fqn;
        if (w.proj[i].r > 0) EXPECT_EQ(w.proj[i].lora_B.data, bytes_of(*tree, fqn + ".lora_B.weight")) << fqn;
      }
      EXPECT_EQ(w.post_norm.data, bytes_of(*tree, p + "post_attention_layernorm.weight"));
      mgr.release(u);
      EXPECT_FALSE(resolve(*tree, p + "input_layernorm.weight").tensor.defined()) << "released: meta tensors";
    }
    mgr.gather(root);
    EXPECT_EQ(weights.root().embed.data, bytes_of(*tree, "model.embed_tokens.weight"));
    mgr.release(root);
  }
  // Scope closed: gathers leave the tree alone again.
  mgr.gather(0);
  EXPECT_FALSE(resolve(*tree, "model.layers.0.input_layernorm.weight").tensor.defined());
  mgr.release(0);
}

}  // namespace
}  // namespace qshard
