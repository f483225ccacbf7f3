#include "checkpoint/sharded_tree.h"

#include <functional>

namespace qshard {
namespace {

struct SlotRef {
  Module::Slot* slot;
  std::string fqn;
};

void collect_slots(Module& m, const std::string& prefix, std::vector<SlotRef>& out, const Module* skip) {
  if (&m == skip) return;
  for (auto& s : const_cast<std::vector<Module::Slot>&>(m.slots())) out.push_back({&s, prefix + s.name});
  for (auto& [name, child] : m.children()) collect_slots(*child, prefix + name + ".", out, skip);
}

void register_unit(ShardedParameterManager& mgr, int unit, std::vector<SlotRef> slots) {
  for (const SlotRef& r : slots) {
    Module::Slot& s = *r.slot;
    if (s.kind == Module::SlotKind::kParams4bit) {
      const Params4bit& p = *s.params4bit;
      mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn, p.data);
      mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".absmax", p.quant_state.absmax);
      mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".quant_map", p.quant_state.code);
      if (p.quant_state.state2) {
        mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".nested_absmax", p.quant_state.state2->absmax);
        mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".nested_quant_map", p.quant_state.state2->code);
      }
    } else {
      mgr.add_tensor(unit, s.trainable ? BufferKind::kTrainable : BufferKind::kFrozenFloat, r.fqn, s.tensor);
    }
  }
  // Released: the slots keep shapes and dtypes only (meta tensors), never a view into a slot that
  // another unit reuses; reading a unit that is not gathered finds no data instead of stale bytes.
  mgr.on_released(unit, [slots](int) {
    for (const SlotRef& r : slots) {
      Module::Slot& s = *r.slot;
      if (s.kind == Module::SlotKind::kParams4bit) {
        Params4bit& p = *s.params4bit;
        p.data = p.data.as_meta();
        p.quant_state.absmax = p.quant_state.absmax.as_meta();
        p.quant_state.code = p.quant_state.code.as_meta();
        if (p.quant_state.state2) {
          p.quant_state.state2->absmax = p.quant_state.state2->absmax.as_meta();
          p.quant_state.state2->code = p.quant_state.state2->code.as_meta();
        }
      } else {
        s.tensor = s.tensor.as_meta();
      }
    }
  });
  mgr.on_gathered(unit, [&mgr, slots](int u) {
    for (const SlotRef& r : slots) {
      Module::Slot& s = *r.slot;
      if (s.kind == Module::SlotKind::kParams4bit) {
        // A new Params4bit of views; scalars (type, blocksize, dtype, shape, offset) unchanged.
        Params4bit p = *s.params4bit;
        p.data = mgr.view(u, BufferKind::kFrozen4bit, r.fqn);
        p.quant_state.absmax = mgr.view(u, BufferKind::kFrozen4bit, r.fqn + ".absmax");
        p.quant_state.code = mgr.view(u, BufferKind::kFrozen4bit, r.fqn + ".quant_map");
        if (p.quant_state.state2) {
          p.quant_state.state2->absmax = mgr.view(u, BufferKind::kFrozen4bit, r.fqn + ".nested_absmax");
          p.quant_state.state2->code = mgr.view(u, BufferKind::kFrozen4bit, r.fqn + ".nested_quant_map");
        }
        *s.params4bit = std::move(p);
      } else {
        s.tensor = mgr.view(u, s.trainable ? BufferKind::kTrainable : BufferKind::kFrozenFloat, r.fqn);
      }
    }
  });
}

}  // namespace

ShardedTree shard_module_tree(Module& root, ShardedParameterManager& mgr, const std::string& layers_path) {
  ShardedTree out;
  Module* layers = root.find_module(layers_path);
  if (!layers) throw Error("shard_module_tree: no module at '" + layers_path + "'");
  for (auto& [name, child] : layers->children()) {
    const std::string path = layers_path + "." + name;
    std::vector<SlotRef> slots;
    collect_slots(*child, path + ".", slots, nullptr);
    register_unit(mgr, mgr.add_unit(path), std::move(slots));
    out.unit_paths.push_back(path);
  }
  std::vector<SlotRef> rest;
  collect_slots(root, "", rest, layers);
  register_unit(mgr, mgr.add_unit("root", /*own_slot=*/true), std::move(rest));
  out.unit_paths.push_back("");
  return out;
}

}  // namespace qshard
