// module_tree.h: the model as a tree of named nodes, state dicts over it, and fully qualified
// name (FQN) resolution the way PyTorch's state-dict code walks a module with getattr.
//
// What: a Module has ordered slots (parameters, 4-bit parameters, buffers) and ordered children.
// A state-dict key is a dotted path from the root; resolve(root, key) walks it one name at a time:
//   Module      -> child module, parameter, buffer or Params4bit slot of that name
//   Params4bit  -> its own attributes (data, quant_state, blocksize, quant_type, quant_storage);
//                  any other name is forwarded to its QuantState (bitsandbytes' __getattr__ fix)
//   QuantState  -> absmax, code, quant_map (alias of code), nested_absmax, nested_quant_map,
//                  offset, blocksize, quant_type, dtype, shape, state2, bitsandbytes__nf4|fp4
//                  (the packed JSON tensor, built on demand, only for its own quant type)
//   state2      -> absmax, code, blocksize, dtype (the nested QuantState)
// A failed walk throws ResolveError naming the full key, the node where it stopped and its kind.
// state_dict order follows PyTorch + bitsandbytes: per module its parameters (a Params4bit by its
// data), then buffers, then each Params4bit's statistics (Linear4bit._save_to_state_dict), then
// children depth-first. Invariant (tested): every key of every state dict resolves, to the bytes
// stored under it.
// Ownership: a Module owns its children; slots hold shared tensor views (state dicts alias them
// unless cpu_offload copies). Thread safety: none; build, then read.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/params4bit.h"

namespace qshard {

enum class NodeKind { kModule, kParameter, kBuffer, kParams4bit, kQuantState, kNestedQuantState, kTensor, kScalar };
const char* node_kind_name(NodeKind k);

class ResolveError : public InputError {
 public:
  explicit ResolveError(const std::string& what) : InputError(what) {}
};

class Module {
 public:
  enum class SlotKind { kParameter, kBuffer, kParams4bit };
  struct Slot {
    std::string name;
    SlotKind kind = SlotKind::kParameter;
    Tensor tensor;                         // parameter / buffer
    std::shared_ptr<Params4bit> params4bit;  // 4-bit parameter
    bool trainable = false;
  };

  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // Registration; a name already used by a slot or child throws Error.
  Module& add_child(const std::string& name, const std::string& type_name);
  void add_parameter(const std::string& name, Tensor t, bool trainable = false);
  void add_buffer(const std::string& name, Tensor t);
  void add_params4bit(const std::string& name, std::shared_ptr<Params4bit> p);

  Module* child(std::string_view name);
  const Module* child(std::string_view name) const;
  Slot* slot(std::string_view name);
  const Slot* slot(std::string_view name) const;
  const std::vector<Slot>& slots() const { return slots_; }
  const std::vector<std::pair<std::string, std::unique_ptr<Module>>>& children() const { return children_; }
  // The module at a dotted path ("" = this), or nullptr.
  Module* find_module(std::string_view path);

 private:
  void check_free(const std::string& name) const;
  std::string type_name_;
  std::vector<Slot> slots_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  // name -> (is a child, position in children_ / slots_): lookups in O(log n), so a module with a
  // million attributes (a flat safetensors file under inspect) builds in O(n log n).
  std::map<std::string, std::pair<bool, size_t>, std::less<>> index_;
};

struct Resolved {
  NodeKind kind = NodeKind::kModule;
  std::string fqn;
  Tensor tensor;       // tensor-valued nodes (parameter, buffer, Params4bit data, statistics)
  std::string scalar;  // scalar nodes, printed (blocksize "64", quant_type "nf4", shape "[4, 8]")
  const Module* module = nullptr;          // kModule, or the owner of a slot
  const Params4bit* params4bit = nullptr;  // kParams4bit and below
  // Human-readable node description: "Params4bit (Linear4bit.weight)", "Tensor F32 [16]", ...
  std::string describe() const;
};

// True when `fqn` is a dotted path of non-empty names ("a.b"): "", ".", "a.", ".a" and "a..b" are
// not (no module tree, PyTorch's or this one, can hold them; tree_from_keys leaves them out).
bool is_valid_fqn(std::string_view fqn);

Resolved resolve(const Module& root, std::string_view fqn);
std::optional<Resolved> try_resolve(const Module& root, std::string_view fqn);

struct StateDictOptions {
  bool full = true;           // false: sharded, each tensor's flat slice `rank` of `world_size`
  bool cpu_offload = false;   // copy every tensor to host memory (views alias otherwise)
  bool trainable_only = false;
  int rank = 0;
  int world_size = 1;
};

// Flat shard r of a tensor of n elements padded to a multiple of world: [r*k, min(n,(r+1)*k))
// with k = ceil(n / world); may be empty.
std::pair<int64_t, int64_t> shard_range(int64_t numel, int rank, int world_size);

NamedTensors state_dict(const Module& root, const StateDictOptions& options = {});

struct LoadReport {
  std::vector<std::string> missing;     // expected by the tree, absent from the dict
  std::vector<std::string> unexpected;  // in the dict, not in the tree
  std::vector<std::string> mismatched;  // "key: expected BF16 [4, 8], got F32 [4, 8]"
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string str() const;
};
// Copies the dict into the tree's tensors (shape and dtype must match; a 4-bit weight is rebuilt
// from its statistics keys and must keep its shape). strict: any problem throws InputError that
// lists all of them (missing, unexpected and mismatched together); nothing is loaded then.
// Non-strict: loads what matches and reports the rest. `source` names the input in messages.
LoadReport load_state_dict(Module& root, const NamedTensors& dict, bool strict, const std::string& source);

// A generic tree from state-dict keys alone (for `qshard inspect` of a bare file): modules along
// every dotted path, a Params4bit for each W with W.quant_state.bitsandbytes__*, parameters for
// the rest. `lookup` gives the tensors; `source` names the file in errors.
std::unique_ptr<Module> tree_from_keys(const std::vector<std::string>& keys, const TensorLookup& lookup,
                                       const std::string& source);

}  // namespace qshard
