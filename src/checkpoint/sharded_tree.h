// sharded_tree.h: binds a module tree to the sharded-parameter manager.
//
// shard_module_tree() registers one FSDP unit per child of `layers_path` (a decoder layer each)
// and a root unit for every other slot, with each slot's tensors in the buffer of its kind:
// Params4bit data and statistics -> kFrozen4bit (the packed JSON's scalars stay with the tree),
// trainable parameters -> kTrainable (f32), other parameters and buffers -> kFrozenFloat.
// Every slot's entries in its unit's layouts are found once, at registration (ShardedTree::slots),
// so an owner of typed views (train/sharded_llama_weights.h: what the model computes with) binds
// them at each gather without a name lookup.
// The tree itself is re-pointed only inside a TreeViews scope (export, inspect, checkpoint code
// that reads the tree by FQN): while one is open, a gathered unit's slots are views into the
// gathered buffers (a Params4bit whose data, absmax, quant_map and nested tensors are views), so
// FQN resolution and state_dict() work on a gathered unit exactly as on an unsharded tree; a
// released unit's slots are meta tensors (shape and dtype, no data): never a view into a slot that
// the next unit reuses. Outside a scope (the training step) gathers leave the tree alone: its
// slots stay meta tensors. REQUIRES for opening a scope: no unit is gathered. The root unit has a
// gathered slot of its own (ShardedParameterManager own_slot).
// After the manager is finalized, mgr.release_all_views() drops the full tensors the tree was
// built with (the caller does it once the tree's values are no longer needed).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/module_tree.h"
#include "shard/sharded_parameter_manager.h"

namespace qshard {

// One slot's entries, as indices into layout(unit, kind).entries().
struct ShardedSlot {
  int unit = -1;
  BufferKind kind = BufferKind::kFrozenFloat;  // a Params4bit's are kFrozen4bit
  size_t data = 0;                             // the tensor, or the Params4bit's packed data
  size_t absmax = 0, quant_map = 0, nested_absmax = 0, nested_quant_map = 0;  // Params4bit only
};

struct ShardedTree {
  std::vector<std::string> unit_paths;  // module path of each unit ("" for the root unit)
  std::unordered_map<const Module::Slot*, ShardedSlot> slots;  // every slot of the tree
  std::shared_ptr<int> tree_views = std::make_shared<int>(0);  // open TreeViews scopes
  const ShardedSlot& slot(const Module::Slot* s) const;  // REQUIRES: s is a slot of the tree
};

// While alive, gathers re-point the tree's slots at the gathered views (see above).
class TreeViews {
 public:
  // REQUIRES: no unit of `tree`'s manager is gathered.
  explicit TreeViews(const ShardedTree& tree) : count_(tree.tree_views) { ++*count_; }
  ~TreeViews() { --*count_; }
  TreeViews(const TreeViews&) = delete;
  TreeViews& operator=(const TreeViews&) = delete;

 private:
  std::shared_ptr<int> count_;
};

// REQUIRES: the manager is not finalized; the caller finalizes after this returns. The tree's
// current tensors are the full values every rank passes in.
// host_fqns: frozen float tensors (by FQN) registered as kFrozenHost: kept whole in pinned host
// memory on every rank, read in place (the embedding table, memory.embedding: host).
ShardedTree shard_module_tree(Module& root, ShardedParameterManager& manager, const std::string& layers_path,
                              const std::set<std::string>& host_fqns = {});

}  // namespace qshard
