#include "checkpoint/module_tree.h"

#include "runtime/sync_counters.h"

#include <functional>
#include <map>
#include <set>

namespace qshard {

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::kModule: return "Module";
    case NodeKind::kParameter: return "Parameter";
    case NodeKind::kBuffer: return "Buffer";
    case NodeKind::kParams4bit: return "Params4bit";
    case NodeKind::kQuantState: return "QuantState";
    case NodeKind::kNestedQuantState: return "QuantState (nested, state2)";
    case NodeKind::kTensor: return "Tensor";
    case NodeKind::kScalar: return "scalar";
  }
  return "?";
}

// ---- Module -------------------------------------------------------------------------------

void Module::check_free(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error("module " + type_name_ + ": invalid attribute name '" + name + "'");
  if (index_.count(name)) throw Error("module " + type_name_ + ": attribute '" + name + "' registered twice");
}

Module& Module::add_child(const std::string& name, const std::string& type_name) {
  check_free(name);
  index_.emplace(name, std::make_pair(true, children_.size()));
  children_.emplace_back(name, std::make_unique<Module>(type_name));
  return *children_.back().second;
}

void Module::add_parameter(const std::string& name, Tensor t, bool trainable) {
  check_free(name);
  index_.emplace(name, std::make_pair(false, slots_.size()));
  slots_.push_back({name, SlotKind::kParameter, std::move(t), nullptr, trainable});
}

void Module::add_buffer(const std::string& name, Tensor t) {
  check_free(name);
  index_.emplace(name, std::make_pair(false, slots_.size()));
  slots_.push_back({name, SlotKind::kBuffer, std::move(t), nullptr, false});
}

void Module::add_params4bit(const std::string& name, std::shared_ptr<Params4bit> p) {
  check_free(name);
  QS_CHECK(p != nullptr, "null Params4bit");
  index_.emplace(name, std::make_pair(false, slots_.size()));
  slots_.push_back({name, SlotKind::kParams4bit, Tensor(), std::move(p), false});
}

Module* Module::child(std::string_view name) {
  count_name_lookup();
  const auto it = index_.find(name);
  return it != index_.end() && it->second.first ? children_[it->second.second].second.get() : nullptr;
}
const Module* Module::child(std::string_view name) const { return const_cast<Module*>(this)->child(name); }

Module::Slot* Module::slot(std::string_view name) {
  count_name_lookup();
  const auto it = index_.find(name);
  return it != index_.end() && !it->second.first ? &slots_[it->second.second] : nullptr;
}
const Module::Slot* Module::slot(std::string_view name) const { return const_cast<Module*>(this)->slot(name); }

Module* Module::find_module(std::string_view path) {
  Module* m = this;
  while (!path.empty() && m) {
    const size_t dot = path.find('.');
    m = m->child(path.substr(0, dot));
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  }
  return m;
}

// ---- resolution ---------------------------------------------------------------------------

namespace {

Tensor scalar_f32(float v) { return Tensor::from_f32({}, DType::kF32, std::vector<float>{v}); }

std::string tensor_desc(const Tensor& t) {
  return std::string(dtype_safetensors_name(t.dtype())) + " " + shape_str(t.shape());
}

// A node during the walk.
struct Cursor {
  NodeKind kind = NodeKind::kModule;
  const Module* module = nullptr;
  const Params4bit* p4 = nullptr;
  Tensor tensor;
  std::string scalar;
  std::string owner;  // module type of the slot's owner
};

[[noreturn]] void fail(std::string_view fqn, std::string_view walked, const Cursor& c, std::string_view name,
                       const std::string& why) {
  std::string where = walked.empty() ? "the root" : "'" + std::string(walked) + "'";
  std::string kind = node_kind_name(c.kind);
  if (c.kind == NodeKind::kModule && c.module) kind += " " + c.module->type_name();
  throw ResolveError("cannot resolve '" + std::string(fqn) + "': the walk stopped at " + where + " (a " + kind +
                     "), which " + why + " '" + std::string(name) + "'");
}

// QuantState (or nested state) attributes.
bool quant_state_attr(const Params4bit& p, bool nested, std::string_view name, Cursor& out) {
  const QuantState& st = p.quant_state;
  auto tensor = [&](const Tensor& t) {
    out.kind = NodeKind::kTensor;
    out.tensor = t;
    return true;
  };
  auto scalar = [&](std::string v) {
    out.kind = NodeKind::kScalar;
    out.scalar = std::move(v);
    return true;
  };
  if (nested) {
    const NestedQuantState& n = *st.state2;
    if (name == "absmax") return tensor(n.absmax);
    if (name == "code") return tensor(n.code);
    if (name == "blocksize") return scalar(std::to_string(n.blocksize));
    if (name == "dtype") return scalar(dtype_torch_name(n.dtype));
    return false;
  }
  if (name == "absmax") return tensor(st.absmax);
  if (name == "code" || name == "quant_map") return tensor(st.code);
  if (name == "blocksize") return scalar(std::to_string(st.blocksize));
  if (name == "quant_type") return scalar(quant_type_name(st.quant_type));
  if (name == "dtype") return scalar(dtype_torch_name(st.dtype));
  if (name == "shape") return scalar(shape_str(st.shape));
  if (name == std::string("bitsandbytes__") + quant_type_name(st.quant_type)) return tensor(packed_quant_state_tensor(st));
  if (st.state2) {
    if (name == "nested_absmax") return tensor(st.state2->absmax);
    if (name == "nested_quant_map") return tensor(st.state2->code);
    if (name == "offset") return tensor(scalar_f32(st.state2->offset));
    if (name == "state2") {
      out.kind = NodeKind::kNestedQuantState;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string Resolved::describe() const {
  switch (kind) {
    case NodeKind::kModule: return "Module " + (module ? module->type_name() : std::string());
    case NodeKind::kParameter:
    case NodeKind::kBuffer:
      return std::string(node_kind_name(kind)) + " " + tensor_desc(tensor) + (module ? " of " + module->type_name() : "");
    case NodeKind::kParams4bit:
      return "Params4bit " + std::string(quant_type_name(params4bit->quant_state.quant_type)) + " " +
             shape_str(params4bit->quant_state.shape) + (module ? " of " + module->type_name() : "");
    case NodeKind::kTensor:
    case NodeKind::kScalar: {
      std::string d = kind == NodeKind::kTensor ? "QuantState tensor " + tensor_desc(tensor) : "QuantState value " + scalar;
      if (params4bit)
        d += " of Params4bit " + std::string(quant_type_name(params4bit->quant_state.quant_type)) + " " +
             shape_str(params4bit->quant_state.shape);
      return d;
    }
    default: return node_kind_name(kind);
  }
}

Resolved resolve(const Module& root, std::string_view fqn) {
  Cursor c;
  c.module = &root;
  if (fqn.empty()) throw ResolveError("cannot resolve an empty key");
  size_t pos = 0;  // start of the current name in fqn
  while (pos <= fqn.size()) {
    const size_t dot = fqn.find('.', pos);
    const std::string_view name = fqn.substr(pos, dot == std::string_view::npos ? std::string_view::npos : dot - pos);
    const std::string_view walked = pos == 0 ? std::string_view() : fqn.substr(0, pos - 1);
    if (name.empty()) fail(fqn, walked, c, name, "cannot have an empty attribute name, before");
    Cursor next;
    next.module = c.module;
    next.p4 = c.p4;
    switch (c.kind) {
      case NodeKind::kModule: {
        if (const Module* m = c.module->child(name)) {
          next.kind = NodeKind::kModule;
          next.module = m;
        } else if (const Module::Slot* s = c.module->slot(name)) {
          if (s->kind == Module::SlotKind::kParams4bit) {
            next.kind = NodeKind::kParams4bit;
            next.p4 = s->params4bit.get();
          } else {
            next.kind = s->kind == Module::SlotKind::kParameter ? NodeKind::kParameter : NodeKind::kBuffer;
            next.tensor = s->tensor;
          }
        } else {
          fail(fqn, walked, c, name, "has no child, parameter or buffer named");
        }
        break;
      }
      case NodeKind::kParams4bit: {
        const Params4bit& p = *c.p4;
        if (name == "data") {
          next.kind = NodeKind::kTensor;
          next.tensor = p.data;
        } else if (name == "quant_state") {
          next.kind = NodeKind::kQuantState;
        } else if (name == "blocksize") {
          next.kind = NodeKind::kScalar;
          next.scalar = std::to_string(p.quant_state.blocksize);
        } else if (name == "quant_type") {
          next.kind = NodeKind::kScalar;
          next.scalar = quant_type_name(p.quant_state.quant_type);
        } else if (name == "quant_storage") {
          next.kind = NodeKind::kScalar;
          next.scalar = dtype_torch_name(p.data.dtype());
        } else if (!quant_state_attr(p, false, name, next)) {  // forwarded to the QuantState
          fail(fqn, walked, c, name, "(nor its QuantState) has no attribute");
        }
        break;
      }
      case NodeKind::kQuantState:
        if (!quant_state_attr(*c.p4, false, name, next)) fail(fqn, walked, c, name, "has no attribute");
        break;
      case NodeKind::kNestedQuantState:
        if (!quant_state_attr(*c.p4, true, name, next)) fail(fqn, walked, c, name, "has no attribute");
        break;
      default:
        fail(fqn, walked, c, name, "has no attributes; cannot look up");
    }
    c = std::move(next);
    if (dot == std::string_view::npos) break;
    pos = dot + 1;
  }
  Resolved r;
  r.kind = c.kind;
  r.fqn = std::string(fqn);
  r.tensor = c.kind == NodeKind::kParams4bit ? c.p4->data : c.tensor;
  r.scalar = c.scalar;
  r.module = c.module;
  r.params4bit = c.p4;
  return r;
}

std::optional<Resolved> try_resolve(const Module& root, std::string_view fqn) {
  try {
    return resolve(root, fqn);
  } catch (const ResolveError&) {
    return std::nullopt;
  }
}

// ---- state dicts --------------------------------------------------------------------------

std::pair<int64_t, int64_t> shard_range(int64_t numel, int rank, int world_size) {
  QS_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "bad rank/world_size");
  const int64_t k = (numel + world_size - 1) / world_size;
  const int64_t begin = std::min(numel, rank * k);
  return {begin, std::min(numel, begin + k) - begin};
}

namespace {

void emit(NamedTensors& out, const std::string& key, const Tensor& t, const StateDictOptions& o) {
  Tensor v = t;
  if (!o.full) {
    auto [begin, count] = shard_range(t.numel(), o.rank, o.world_size);
    v = t.reshape({t.numel()}).flat_slice(begin, count);
  }
  if (o.cpu_offload) v = v.to(Device::kCpu);
  out.emplace_back(key, v);
}

void collect(const Module& m, const std::string& prefix, const StateDictOptions& o, NamedTensors& out) {
  for (const auto& s : m.slots()) {
    if (s.kind == Module::SlotKind::kBuffer) continue;
    if (o.trainable_only && !s.trainable) continue;
    emit(out, prefix + s.name, s.kind == Module::SlotKind::kParams4bit ? s.params4bit->data : s.tensor, o);
  }
  if (!o.trainable_only) {
    for (const auto& s : m.slots())
      if (s.kind == Module::SlotKind::kBuffer) emit(out, prefix + s.name, s.tensor, o);
    for (const auto& s : m.slots()) {
      if (s.kind != Module::SlotKind::kParams4bit) continue;
      for (auto& [k, t] : params4bit_state_dict(*s.params4bit, prefix + s.name))
        if (k != prefix + s.name) emit(out, k, t, o);
    }
  }
  for (const auto& [name, child] : m.children()) collect(*child, prefix + name + ".", o, out);
}

}  // namespace

NamedTensors state_dict(const Module& root, const StateDictOptions& o) {
  NamedTensors out;
  collect(root, "", o, out);
  return out;
}

std::string LoadReport::str() const {
  std::string s;
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    s += std::string(s.empty() ? "" : "; ") + what + " (" + std::to_string(v.size()) + "): ";
    for (size_t i = 0; i < v.size() && i < 20; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 20) s += ", ...";
  };
  list("missing keys", missing);
  list("unexpected keys", unexpected);
  list("mismatched keys", mismatched);
  return s;
}

LoadReport load_state_dict(Module& root, const NamedTensors& dict, bool strict, const std::string& source) {
  std::map<std::string, const Tensor*> by_key;
  for (const auto& [k, t] : dict) by_key[k] = &t;
  const TensorLookup lookup = [&by_key](const std::string& k) -> std::optional<Tensor> {
    auto it = by_key.find(k);
    if (it == by_key.end()) return std::nullopt;
    return *it->second;
  };
  LoadReport rep;
  std::set<std::string> consumed;
  struct Pending {
    Module::Slot* slot;
    std::string key;
    std::optional<Params4bit> p4;
  };
  std::vector<Pending> todo;
  // Walk the tree's expected keys: slots of every module.
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& prefix) {
    for (auto& s : const_cast<std::vector<Module::Slot>&>(m.slots())) {
      const std::string key = prefix + s.name;
      if (s.kind == Module::SlotKind::kParams4bit) {
        if (!by_key.count(key)) {
          rep.missing.push_back(key);
          continue;
        }
        try {
          Params4bit p = params4bit_from_state_dict(key, lookup, source);
          if (p.quant_state.shape != s.params4bit->quant_state.shape)
            rep.mismatched.push_back(key + ": expected 4-bit " + shape_str(s.params4bit->quant_state.shape) + ", got " +
                                     shape_str(p.quant_state.shape));
          else
            todo.push_back({&s, key, std::move(p)});
          for (auto& [k, t] : params4bit_state_dict(p, key)) consumed.insert(k);
        } catch (const InputError& e) {
          rep.mismatched.push_back(key + ": " + e.what());
          consumed.insert(key);
        }
        continue;
      }
      auto it = by_key.find(key);
      if (it == by_key.end()) {
        rep.missing.push_back(key);
        continue;
      }
      consumed.insert(key);
      const Tensor& t = *it->second;
      if (t.dtype() != s.tensor.dtype() || t.shape() != s.tensor.shape()) {
        rep.mismatched.push_back(key + ": expected " + tensor_desc(s.tensor) + ", got " + tensor_desc(t));
        continue;
      }
      todo.push_back({&s, key, std::nullopt});
    }
    for (auto& [name, child] : m.children()) walk(*child, prefix + name + ".");
  };
  walk(root, "");
  for (const auto& [k, t] : dict)
    if (!consumed.count(k)) rep.unexpected.push_back(k);
  if (strict && !rep.ok()) throw InputError(source + ": state dict does not match the model: " + rep.str());
  for (auto& p : todo) {
    if (p.p4) {
      *p.slot->params4bit = std::move(*p.p4);
    } else {
      p.slot->tensor.copy_from(*by_key[p.key]);
    }
  }
  return rep;
}

bool is_valid_fqn(std::string_view fqn) {
  if (fqn.empty() || fqn.front() == '.' || fqn.back() == '.') return false;
  return fqn.find("..") == std::string_view::npos;
}

std::unique_ptr<Module> tree_from_keys(const std::vector<std::string>& keys, const TensorLookup& lookup,
                                       const std::string& source) {
  auto root = std::make_unique<Module>("root");
  std::set<std::string> four_bit;
  const std::set<std::string> all(keys.begin(), keys.end());
  for (const auto& k : keys) {
    if (!is_valid_fqn(k)) continue;
    for (const char* suffix : {".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"}) {
      const std::string s(suffix);
      if (k.size() > s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0) four_bit.insert(k.substr(0, k.size() - s.size()));
    }
    // A weight with bitsandbytes' statistics beside it is 4-bit even when its quant state is
    // missing: params4bit_from_state_dict then names that key (not "a tensor and a module path").
    const std::string qm = ".quant_map";
    if (k.size() > qm.size() && k.compare(k.size() - qm.size(), qm.size(), qm) == 0) {
      const std::string w = k.substr(0, k.size() - qm.size());
      if (all.count(w) && all.count(w + ".absmax")) four_bit.insert(w);
    }
  }
  auto module_for = [&](const std::string& path) -> Module& {
    Module* m = root.get();
    size_t start = 0;
    while (start < path.size()) {
      const size_t dot = path.find('.', start);
      const std::string name = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      Module* c = m->child(name);
      if (!c) {
        if (m->slot(name)) throw InputError(source + ": key path '" + path + "' runs through tensor '" + name + "'");
        c = &m->add_child(name, "Module");
      }
      m = c;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return *m;
  };
  std::set<std::string> consumed;
  for (const auto& w : four_bit) {
    Params4bit p = params4bit_from_state_dict(w, lookup, source);
    for (auto& [k, t] : params4bit_state_dict(p, w)) consumed.insert(k);
    const size_t dot = w.rfind('.');
    Module& m = dot == std::string::npos ? *root : module_for(w.substr(0, dot));
    m.add_params4bit(dot == std::string::npos ? w : w.substr(dot + 1), std::make_shared<Params4bit>(std::move(p)));
  }
  for (const auto& k : keys) {
    if (consumed.count(k) || !is_valid_fqn(k)) continue;  // odd keys: reported by the caller
    const size_t dot = k.rfind('.');
    Module& m = dot == std::string::npos ? *root : module_for(k.substr(0, dot));
    const std::string name = dot == std::string::npos ? k : k.substr(dot + 1);
    if (m.child(name) || m.slot(name)) throw InputError(source + ": key '" + k + "' is both a tensor and a module path");
    auto t = lookup(k);
    QS_CHECK(t.has_value(), "lookup failed for a listed key");
    m.add_parameter(name, *t);
  }
  return root;
}

}  // namespace qshard
