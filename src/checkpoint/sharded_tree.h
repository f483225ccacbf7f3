// sharded_tree.h: binds a module tree to the sharded-parameter manager.
//
// shard_module_tree() registers one FSDP unit per child of `layers_path` (a decoder layer each)
// and a root unit for every other slot, with each slot's tensors in the buffer of its kind:
// Params4bit data and statistics -> kFrozen4bit (the packed JSON's scalars stay with the tree),
// trainable parameters -> kTrainable (f32), other parameters and buffers -> kFrozenFloat.
// When a unit is gathered, its hook points the tree's slots at views into the gathered buffers:
// a Params4bit whose data, absmax, quant_map and nested tensors are views, so FQN resolution and
// state_dict() work on a gathered unit exactly as on an unsharded tree. When a unit is released
// its slots become meta tensors (shape and dtype, no data): never a view into a slot that the next
// unit reuses. The root unit has a gathered slot of its own (ShardedParameterManager own_slot).
// After the manager is finalized, mgr.release_all_views() drops the full tensors the tree was
// built with (the caller does it once the tree's values are no longer needed).
#pragma once

#include <string>
#include <vector>

#include "checkpoint/module_tree.h"
#include "shard/sharded_parameter_manager.h"

namespace qshard {

struct ShardedTree {
  std::vector<std::string> unit_paths;  // module path of each unit ("" for the root unit)
};

// REQUIRES: the manager is not finalized; the caller finalizes after this returns. The tree's
// current tensors are the full values every rank passes in.
ShardedTree shard_module_tree(Module& root, ShardedParameterManager& manager, const std::string& layers_path);

}  // namespace qshard
