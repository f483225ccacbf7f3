// A Llama tree (4-bit projections, LoRA) sharded across ranks: inside a TreeViews scope, while a
// unit is gathered, every key of its state dict resolves through the tree, to the bytes of the
// unsharded original; offload on and off, and the embedding kept whole in host memory
// (kFrozenHost), give identical bytes. Every slot's entries are recorded with its unit. Runs under
// mpirun -np 1..4.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "common/test_stream.h"
#include "checkpoint/llama_tree.h"
#include "checkpoint/sharded_tree.h"
#include "common/random_tree.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"

namespace qshard {
namespace {

using testing_util::randn;
using testing_util::randomize;

std::unique_ptr<Module> make_tree() {
  nlohmann::json j = {{"vocab_size", 77},       {"hidden_size", 64}, {"intermediate_size", 96},
                      {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
  LlamaTreeOptions o;
  o.quant = QuantizeOptions{QuantType::kNf4, 64, true};
  o.lora.r = 4;
  auto tree = build_llama_tree(LlamaConfig::from_json(j, "tiny"), o);
  uint32_t seed = 5;
  randomize(*tree, seed);
  return tree;
}

TEST(ShardedTree, GatheredUnitsResolveToTheOriginalBytes) {
  MpiCommunicator comm(World::get().comm());
  const auto original = make_tree();
  const NamedTensors expect = state_dict(*original);
  std::vector<std::vector<uint8_t>> first_run;
  for (int mode : {0, 1, 2}) {
    const bool offload = mode == 1, embed_host = mode == 2;
    auto tree = make_tree();  // same seed: same values as `original`
    ShardOptions so;
    so.offload_params = so.offload_optimizer = offload;
    ShardedParameterManager mgr(comm, qshard_test_compute_stream(), so);
    std::set<std::string> host_fqns;
    if (embed_host) host_fqns.insert("model.embed_tokens.weight");
    const ShardedTree st = shard_module_tree(*tree, mgr, "model.layers", host_fqns);
    mgr.finalize();
    mgr.release_all_views();  // the tree keeps shapes only: the bytes below come from the views
    ASSERT_EQ(mgr.num_units(), 4);
    const TreeViews views(st);  // gathers re-point the tree
    size_t checked = 0, k = 0;
    for (int u = 0; u < mgr.num_units(); ++u) {
      mgr.gather(u);
      mgr.compute_stream().synchronize();  // the host reads the views below
      Module* sub = tree->find_module(st.unit_paths[u]);
      ASSERT_NE(sub, nullptr);
      if (st.unit_paths[u].empty()) {
        // Root unit: its own slots (embeddings, norm, head) resolve from the root.
        for (const char* key : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}) {
          const Resolved r = resolve(*tree, key);
          const Resolved o = resolve(*original, key);
          EXPECT_EQ(r.tensor.nbytes(), o.tensor.nbytes());
          EXPECT_EQ(std::memcmp(r.tensor.raw(), o.tensor.raw(), o.tensor.nbytes()), 0) << key;
          ++checked;
        }
      } else {
        for (const auto& [key, t] : state_dict(*sub)) {
          const std::string fqn = st.unit_paths[u] + "." + key;
          const Resolved r = resolve(*tree, fqn);
          const Resolved o = resolve(*original, fqn);
          Tensor host = r.tensor.to(Device::kCpu);
          EXPECT_EQ(host.nbytes(), o.tensor.nbytes()) << fqn;
          if (host.nbytes() == o.tensor.nbytes()) {
            EXPECT_EQ(std::memcmp(host.raw(), o.tensor.raw(), o.tensor.nbytes()), 0) << fqn;
          }
          std::vector<uint8_t> bytes(host.bytes().begin(), host.bytes().end());
          if (mode == 0) {
            first_run.push_back(bytes);
          } else if (k < first_run.size()) {
            EXPECT_EQ(bytes, first_run[k]) << "offload differs: " << fqn;
          }
          ++k;
          ++checked;
        }
      }
      mgr.release(u);
    }
    EXPECT_GT(checked, 100u);
    // Every slot of the tree has its entries, in the unit that holds it.
    EXPECT_EQ(st.slot(tree->find_module("model.layers.2.mlp.up_proj")->slot("weight")).unit, 2);
    EXPECT_EQ(st.slot(tree->find_module("model.norm")->slot("weight")).unit, 3);
    EXPECT_EQ(st.slot(tree->find_module("model.layers.0.self_attn.q_proj.lora_B")->slot("weight")).kind,
              BufferKind::kTrainable);
    EXPECT_EQ(st.slots.size(), 3u * (7 * 3 + 2) + 3) << "per layer 7 projections with lora_A and lora_B, 2 norms; embed, norm, lm_head";
    // kFrozenHost: the embedding whole on every rank (no shard of it), read in place at one address.
    const ShardedSlot& embed = st.slot(tree->find_module("model.embed_tokens")->slot("weight"));
    EXPECT_EQ(embed.kind, embed_host ? BufferKind::kFrozenHost : BufferKind::kFrozenFloat);
    if (embed_host) {
      const FlatLayout& l = mgr.layout(3, BufferKind::kFrozenHost);
      EXPECT_EQ(l.shard_bytes(), l.padded_bytes());
      EXPECT_EQ(l.total_bytes(), static_cast<int64_t>(resolve(*original, "model.embed_tokens.weight").tensor.nbytes()));
      mgr.gather(3);
      const void* first = mgr.data(3, BufferKind::kFrozenHost, l.entries()[embed.data]);
      mgr.release(3);
      mgr.gather(3);
      EXPECT_EQ(mgr.data(3, BufferKind::kFrozenHost, l.entries()[embed.data]), first);
      mgr.release(3);
    }
  }
  // Only frozen float tensors stay in host memory.
  for (const char* bad : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.lora_A.weight",
                          "model.nope.weight"}) {
    auto tree = make_tree();
    ShardedParameterManager mgr(comm, qshard_test_compute_stream(), ShardOptions{});
    EXPECT_THROW(shard_module_tree(*tree, mgr, "model.layers", {bad}), Error) << bad;
  }
  (void)expect;
}

}  // namespace
}  // namespace qshard
