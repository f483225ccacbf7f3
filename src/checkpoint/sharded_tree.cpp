#include "checkpoint/sharded_tree.h"

#include <functional>
#include <set>

#include "runtime/error.h"

namespace qshard {
namespace {

struct SlotRef {
  Module::Slot* slot;
  std::string fqn;
};

// One slot's entries in its unit's layouts, found at registration: a gather binds its views
// without a name lookup.
struct SlotEntries : ShardedSlot {
  Module::Slot* slot = nullptr;
};

void collect_slots(Module& m, const std::string& prefix, std::vector<SlotRef>& out, const Module* skip) {
  if (&m == skip) return;
  for (auto& s : const_cast<std::vector<Module::Slot>&>(m.slots())) out.push_back({&s, prefix + s.name});
  for (auto& [name, child] : m.children()) collect_slots(*child, prefix + name + ".", out, skip);
}

void register_unit(ShardedParameterManager& mgr, int unit, const std::vector<SlotRef>& refs, ShardedTree& tree,
                   const std::set<std::string>& host_fqns) {
  std::vector<SlotEntries> slots;
  for (const SlotRef& r : refs) {
    Module::Slot& s = *r.slot;
    SlotEntries e;
    e.slot = &s;
    e.unit = unit;
    if (s.kind == Module::SlotKind::kParams4bit) {
      const Params4bit& p = *s.params4bit;
      e.kind = BufferKind::kFrozen4bit;
      e.data = mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn, p.data);
      e.absmax = mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".absmax", p.quant_state.absmax);
      e.quant_map = mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".quant_map", p.quant_state.code);
      if (p.quant_state.state2) {
        e.nested_absmax =
            mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".nested_absmax", p.quant_state.state2->absmax);
        e.nested_quant_map =
            mgr.add_tensor(unit, BufferKind::kFrozen4bit, r.fqn + ".nested_quant_map", p.quant_state.state2->code);
      }
    } else {
      e.kind = s.trainable ? BufferKind::kTrainable : BufferKind::kFrozenFloat;
      if (host_fqns.count(r.fqn)) {
        if (s.trainable) throw Error("shard_module_tree: '" + r.fqn + "' is trainable; only frozen tensors stay in host memory");
        e.kind = BufferKind::kFrozenHost;
      }
      e.data = mgr.add_tensor(unit, e.kind, r.fqn, s.tensor);
    }
    slots.push_back(e);
    tree.slots.emplace(&s, static_cast<const ShardedSlot&>(e));
  }
  const std::shared_ptr<int> views = tree.tree_views;
  // Whether the slots hold data now (the full tensors the tree was built with, or views).
  const auto pointed = std::make_shared<bool>(true);
  // Released: the slots keep shapes and dtypes only (meta tensors), never a view into a slot that
  // another unit reuses; reading a unit that is not gathered finds no data instead of stale bytes.
  mgr.on_released(unit, [slots, pointed](int) {
    if (!*pointed) return;  // already meta tensors: the gather did not re-point the tree
    *pointed = false;
    for (const SlotEntries& e : slots) {
      Module::Slot& s = *e.slot;
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
  // Gathered: views through the entries found above (pointer arithmetic, no name lookup).
  mgr.on_gathered(unit, [&mgr, slots, views, pointed](int u) {
    if (*views == 0) return;  // no TreeViews scope: the tree is left alone
    *pointed = true;
    for (const SlotEntries& e : slots) {
      Module::Slot& s = *e.slot;
      const std::vector<FlatEntry>& entries = mgr.layout(u, e.kind).entries();
      if (s.kind == Module::SlotKind::kParams4bit) {
        // The Params4bit's tensors become views; scalars (type, blocksize, dtype, shape, offset) unchanged.
        Params4bit& p = *s.params4bit;
        p.data = mgr.view(u, e.kind, entries[e.data]);
        p.quant_state.absmax = mgr.view(u, e.kind, entries[e.absmax]);
        p.quant_state.code = mgr.view(u, e.kind, entries[e.quant_map]);
        if (p.quant_state.state2) {
          p.quant_state.state2->absmax = mgr.view(u, e.kind, entries[e.nested_absmax]);
          p.quant_state.state2->code = mgr.view(u, e.kind, entries[e.nested_quant_map]);
        }
      } else {
        s.tensor = mgr.view(u, e.kind, entries[e.data]);
      }
    }
  });
}

}  // namespace

const ShardedSlot& ShardedTree::slot(const Module::Slot* s) const {
  auto it = slots.find(s);
  QS_CHECK(it != slots.end(), "slot is not part of the sharded tree");
  return it->second;
}

ShardedTree shard_module_tree(Module& root, ShardedParameterManager& mgr, const std::string& layers_path,
                              const std::set<std::string>& host_fqns) {
  ShardedTree out;
  for (const std::string& fqn : host_fqns) {
    const std::optional<Resolved> r = try_resolve(root, fqn);
    if (!r || (r->kind != NodeKind::kParameter && r->kind != NodeKind::kBuffer))
      throw Error("shard_module_tree: no frozen float tensor '" + fqn + "' to keep in host memory");
  }
  Module* layers = root.find_module(layers_path);
  if (!layers) throw Error("shard_module_tree: no module at '" + layers_path + "'");
  for (auto& [name, child] : layers->children()) {
    const std::string path = layers_path + "." + name;
    std::vector<SlotRef> slots;
    collect_slots(*child, path + ".", slots, nullptr);
    register_unit(mgr, mgr.add_unit(path), slots, out, host_fqns);
    out.unit_paths.push_back(path);
  }
  std::vector<SlotRef> rest;
  collect_slots(root, "", rest, layers);
  register_unit(mgr, mgr.add_unit("root", /*own_slot=*/true), rest, out, host_fqns);
  out.unit_paths.push_back("");
  return out;
}

}  // namespace qshard
