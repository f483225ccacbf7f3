// sharded_llama_weights.h: the weights a LlamaModel computes with, as the sharded manager holds them.
//
// What: ShardedLlamaWeights is a LlamaWeights (model/layer_weights.h) whose LayerWeights are
// filled by the manager's post-gather step: at registration it takes, for every parameter the
// model reads (LlamaTreeSlots' slots of the tree that shard_module_tree registered), the entries
// of that parameter in its unit's layouts (ShardedTree::slots), and the shapes and 4-bit scalars
// from the tree; a gather of a unit (on_gathered hook) then writes the addresses of the gathered
// bytes into that unit's LayerWeights / RootWeights: 4-bit data and statistics, norms and
// biases, the LoRA operands (the manager's compute copies in the activation dtype when it keeps
// them, else the f32 gathered masters) and the LoRA gradients (the slot's gradient buffer, which
// a backward gather zeroes). A release marks the unit unavailable. No name is looked up and no
// string is built in the step, except on the error path (reading a unit that is not gathered).
// The module tree is not touched (it is re-pointed only inside a TreeViews scope, for export).
// Layer l is unit l, the root unit is the last (shard_module_tree's order; checked).
// Ownership: borrows the manager (it outlives this object; the hooks point here, so this object
// lives as long as the manager: QloraModel owns both). Thread safety: the manager's (one thread).
#pragma once

#include <memory>
#include <vector>

#include "checkpoint/sharded_tree.h"
#include "model/llama_binding.h"
#include "shard/sharded_parameter_manager.h"

namespace qshard {

class ShardedLlamaWeights final : public LlamaWeights {
 public:
  // REQUIRES: `units` = shard_module_tree(tree of `slots`, mgr, "model.layers"), before the
  // manager's first gather. `slots` is read here only (it need not outlive this object).
  ShardedLlamaWeights(const LlamaConfig& config, const LlamaTreeSlots& slots, ShardedParameterManager& mgr,
                      const ShardedTree& units);
  ~ShardedLlamaWeights() override;
  ShardedLlamaWeights(const ShardedLlamaWeights&) = delete;
  ShardedLlamaWeights& operator=(const ShardedLlamaWeights&) = delete;

  // REQUIRES: the layer's / root's unit is gathered (else Error naming the unit).
  const LayerWeights& layer(int64_t layer) override;
  const RootWeights& root() override;

 private:
  struct Entries;
  void fill_layer(int64_t layer);
  void fill_root();
  ShardedParameterManager& mgr_;
  std::unique_ptr<Entries> entries_;
  std::vector<LayerWeights> layers_;
  std::vector<char> gathered_;  // per layer unit, then the root unit
  RootWeights root_;
};

}  // namespace qshard
