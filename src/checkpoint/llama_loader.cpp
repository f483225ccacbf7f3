#include "checkpoint/llama_loader.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/fused_projections.h"
#include "checkpoint/nonfinite.h"
#include "checkpoint/safetensors_index.h"
#include "runtime/error.h"
#include "runtime/machine.h"

namespace qshard {
namespace {

// The quantization a bitsandbytes folder's config.json names (bitsandbytes' block size of 64).
QuantizeOptions folder_quantize_options(const LlamaConfig& c) {
  QuantizeOptions q;
  q.quant_type = parse_quant_type(c.bnb_quant_type);
  q.compress_statistics = c.bnb_double_quant;
  return q;
}

// Each float tensor's dtype by its tree key: a fused Phi-3 weight's dtype under each of its parts.
std::map<std::string, DType> float_dtypes_of(const SafetensorsFolder& folder, const std::vector<FusedProjection>& fused) {
  std::map<std::string, DType> out;
  for (const std::string& name : folder.names())
    if (const SafetensorsEntry* e = folder.find(name); e->dtype && dtype_is_float(*e->dtype)) out.emplace(name, *e->dtype);
  static const std::string kLayers = "model.layers.";
  for (const auto& [name, dtype] : std::map<std::string, DType>(out)) {
    const size_t dot = name.find('.', kLayers.size());
    if (name.compare(0, kLayers.size(), kLayers) != 0 || dot == std::string::npos) continue;
    const std::string layer = name.substr(0, dot + 1);
    for (const FusedProjection& f : fused)
      if (name.compare(0, layer.size() + f.fused.size() + 1, layer + f.fused + ".") == 0)
        for (const std::string& part : f.parts) out[layer + part + name.substr(layer.size() + f.fused.size())] = dtype;
  }
  return out;
}

void visit_slots(Module& m, const std::string& prefix, const std::function<void(Module::Slot&, const std::string&)>& f) {
  for (const Module::Slot& s : m.slots()) f(*m.slot(s.name), prefix + s.name);
  for (const auto& [name, child] : m.children()) visit_slots(*child, prefix + name + ".", f);
}

std::string desc(const std::string& dtype_name, const Shape& shape) { return dtype_name + " " + shape_str(shape); }

// The file that holds `key`, for error messages (the folder when the key is not in one file).
std::string file_of(const SafetensorsFolder& folder, const std::string& key) {
  const SafetensorsFile* f = folder.file_of(key);
  return f ? f->path() : folder.dir();
}

// One frozen slot and where its value comes from, decided from the folder's headers (a 4-bit
// weight is read and checked here already, as its statistics decide whether it fits). A fused
// Phi-3 weight fills the slots of all its parts (`slots`, in row order, `rows` each): float rows
// are copied, a float weight quantized on load is quantized whole (as bitsandbytes quantizes the
// fused Linear) and then split, a stored 4-bit weight split (checkpoint/fused_projections.h).
struct SlotFill {
  enum class How { kTensor, kQuantize, kStored4bit };
  std::vector<Module::Slot*> slots;
  std::string key;
  How how = How::kTensor;
  std::optional<Params4bit> stored;  // kStored4bit
  std::vector<int64_t> rows;         // a fused weight: rows of each part; empty otherwise
};

// Matches every frozen slot of `tree` with the folder's tensors: the fills to run and the problems
// (missing, mismatched, and with `strict` the folder's tensors that no slot takes). The parts of a
// fused projection are matched with the fused tensor once, as one fill of all their slots.
LoadReport plan_fills(Module& tree, const SafetensorsFolder& folder, const LlamaConfig& config, bool strict,
                      std::vector<SlotFill>& fills) {
  const TensorLookup lookup = [&folder](const std::string& k) -> std::optional<Tensor> {
    if (!folder.contains(k)) return std::nullopt;
    return folder.get(k);
  };
  const std::vector<FusedProjection> fused = fused_projections(config);
  std::map<std::string, size_t> fused_fill;  // fused key -> its fill (or SIZE_MAX: already refused)
  LoadReport rep;
  std::set<std::string> consumed;
  visit_slots(tree, "", [&](Module::Slot& s, const std::string& tree_key) {
    if (s.trainable) return;  // LoRA: the caller's init or the adapter
    std::string key = tree_key;
    Shape want = s.kind == Module::SlotKind::kParams4bit ? s.params4bit->quant_state.shape : s.tensor.shape();
    const std::optional<FusedPartRef> part = fused_part_of(fused, tree_key);
    if (part) {
      key = part->fused_path + part->rest;
      if (const auto it = fused_fill.find(key); it != fused_fill.end()) {
        if (it->second != SIZE_MAX) fills[it->second].slots[part->index] = &s;
        return;
      }
      want = {part->proj->total_rows(), want[1]};
    }
    // Registers the fill (all parts of a fused weight join it).
    auto add_fill = [&](SlotFill f) {
      f.slots = {&s};
      if (part) {
        f.rows = part->proj->rows;
        f.slots.assign(f.rows.size(), nullptr);  // by part index, whatever order the tree is visited in
        f.slots[part->index] = &s;
        fused_fill[key] = fills.size();
      }
      fills.push_back(std::move(f));
    };
    auto refused = [&] {
      if (part) fused_fill[key] = SIZE_MAX;
    };
    const SafetensorsEntry* e = folder.find(key);
    if (!e) {
      rep.missing.push_back(key);
      refused();
      return;
    }
    if (s.kind == Module::SlotKind::kParams4bit) {
      // A 4-bit folder's projections must be stored in 4-bit under strict (what its config implies);
      // a packed (non-float) weight in a 4-bit folder, or beside 4-bit statistics, is a 4-bit
      // weight in any mode: one without its quant state is named as such, not as a float to quantize.
      const bool packed = !e->dtype || !dtype_is_float(*e->dtype);
      if (is_4bit_weight(key, lookup) || (config.quantized && (strict || packed)) ||
          (packed && folder.contains(key + ".absmax"))) {
        try {
          // Structure here (shapes, sizes, dtypes); the statistics' values are checked in run_fill.
          Params4bit p = params4bit_from_state_dict(key, lookup, file_of(folder, key), /*allow_nonfinite=*/true);
          for (const auto& [k, t] : params4bit_state_dict(p, key)) consumed.insert(k);
          if (p.quant_state.shape != want) {
            rep.mismatched.push_back(key + ": expected 4-bit " + shape_str(want) + ", got " + shape_str(p.quant_state.shape));
            refused();
          } else {
            add_fill({{}, key, SlotFill::How::kStored4bit, std::move(p), {}});
          }
        } catch (const InputError& err) {
          rep.mismatched.push_back(key + ": " + err.what());
          consumed.insert(key);  // and its statistics: the weight is the problem, not they
          for (const char* stat : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"}) consumed.insert(key + stat);
          refused();
        }
        return;
      }
      consumed.insert(key);
      if (!e->dtype || !dtype_is_float(*e->dtype) || e->shape != want) {
        rep.mismatched.push_back(key + ": expected F32, BF16 or F16 " + shape_str(want) + " to quantize, got " +
                                 desc(e->dtype_name, e->shape));
        refused();
      } else {
        add_fill({{}, key, SlotFill::How::kQuantize, std::nullopt, {}});
      }
      return;
    }
    consumed.insert(key);
    const DType dt = s.tensor.dtype();
    if (!e->dtype || !dtype_is_float(*e->dtype)) {
      rep.mismatched.push_back(key + ": expected F32, BF16 or F16 " + shape_str(want) + ", got " + desc(e->dtype_name, e->shape));
      refused();
    } else if (e->shape != want) {
      rep.mismatched.push_back(key + ": expected " + desc(dtype_safetensors_name(dt), want) + ", got " + desc(e->dtype_name, e->shape));
      refused();
    } else {
      add_fill({{}, key, SlotFill::How::kTensor, std::nullopt, {}});
    }
  });
  if (strict)
    for (const std::string& name : folder.names())
      if (!consumed.count(name)) rep.unexpected.push_back(name);
  return rep;
}

constexpr const char* kRefuse = "; refusing to load it (--allow-nonfinite to load anyway)";

// Fills one slot (or a fused weight's part slots); unless allow_nonfinite, first refuses a source
// holding NaN / Inf (a float tensor: count_nonfinite over its bits; a stored 4-bit weight:
// QuantState::check_values).
void run_fill(SlotFill& f, const SafetensorsFolder& folder, const QuantizeOptions& quantize, bool allow_nonfinite) {
  const std::string label = file_of(folder, f.key) + ": '" + f.key + "'";
  // A whole 4-bit weight into the slots: as it is, or split by rows (exact: no requantization).
  auto place_4bit = [&](Params4bit p) {
    if (f.rows.empty()) {
      *f.slots[0]->params4bit = std::move(p);
      return;
    }
    std::vector<Params4bit> parts = split_params4bit(p, f.rows, label);
    QS_CHECK(parts.size() == f.slots.size() && std::find(f.slots.begin(), f.slots.end(), nullptr) == f.slots.end(),
             "fused weight " + f.key + ": a slot for each part");
    for (size_t i = 0; i < parts.size(); ++i) *f.slots[i]->params4bit = std::move(parts[i]);
  };
  switch (f.how) {
    case SlotFill::How::kStored4bit:
      if (!allow_nonfinite) f.stored->quant_state.check_values(label);
      place_4bit(std::move(*f.stored));
      return;
    case SlotFill::How::kQuantize: {
      const Tensor t = folder.get(f.key);
      require_finite(t, file_of(folder, f.key), f.key, allow_nonfinite, kRefuse);
      place_4bit(quantize_4bit(t, quantize));
      return;
    }
    case SlotFill::How::kTensor: {
      const Tensor t = folder.get(f.key);
      require_finite(t, file_of(folder, f.key), f.key, allow_nonfinite, kRefuse);
      int64_t row0 = 0;
      for (size_t i = 0; i < f.slots.size(); ++i) {
        const Tensor src = f.rows.empty() ? t : take_rows(t, row0, f.rows[i]);
        if (!f.rows.empty()) row0 += f.rows[i];
        Tensor& dst = f.slots[i]->tensor;
        // The same dtype: the stored bytes; another float dtype: through f32 (exact for widening).
        if (src.dtype() == dst.dtype()) dst.copy_from(src);
        else dst.copy_from(Tensor::from_f32(src.shape(), dst.dtype(), src.to_f32_vector()));
      }
      return;
    }
  }
}

}  // namespace

double llama_tree_bytes(const LlamaConfig& c, const LlamaLoadOptions& o) {
  double other = 2.0;  // kAsStored, config.json naming no float dtype
  if (o.floats == LlamaLoadOptions::Floats::kF32) other = 4.0;
  else if (c.dtype && dtype_is_float(*c.dtype)) other = static_cast<double>(dtype_size(*c.dtype));
  if (c.quantized) return llama_4bit_bytes(c, QuantizeOptions{}.blocksize, c.bnb_double_quant, other).total();
  if (o.quantize) return llama_4bit_bytes(c, o.quantize->blocksize, o.quantize->compress_statistics, other).total();
  return llama_size(c).total() * other;
}

LoadedLlama load_llama_folder(const std::string& dir, const LlamaLoadOptions& o) {
  QS_CHECK(o.adapter_dir.empty() || o.lora.r == 0, "load_llama_folder: LoRA slots come from lora or adapter_dir, not both");
  LoadedLlama out;
  out.config = LlamaConfig::load(dir);
  const LlamaConfig& config = out.config;
  LlamaTreeOptions to;
  to.lora = o.lora;
  if (!o.adapter_dir.empty()) {
    out.adapter = read_peft_config(o.adapter_dir);
    to.lora.r = out.adapter->r;
    to.lora.targets = tree_lora_targets(config, out.adapter->target_modules, o.adapter_dir + "/adapter_config.json");
  }
  out.tree_bytes = llama_tree_bytes(config, o);
  if (o.check_host_memory) require_host_memory(out.tree_bytes, "loading " + dir, llama_size_keys(config));

  const SafetensorsFolder folder = SafetensorsFolder::open(dir);
  check_stored_layers(config, folder.names(), dir);
  // Float weights f32 unless stored otherwise and kept as stored; the 4-bit placeholders are
  // replaced by the stored or quantized weights.
  to.dtype = DType::kF32;
  if (o.floats == LlamaLoadOptions::Floats::kAsStored) to.float_dtypes = float_dtypes_of(folder, fused_projections(config));
  const QuantizeOptions quantize = o.quantize ? *o.quantize : folder_quantize_options(config);
  if (config.quantized || o.quantize) to.quant = quantize;
  out.tree = build_llama_tree(config, to);

  std::vector<SlotFill> fills;
  const LoadReport rep = plan_fills(*out.tree, folder, config, o.strict, fills);
  if (!rep.ok()) throw InputError(dir + ": state dict does not match the model: " + rep.str());
  for (SlotFill& f : fills) run_fill(f, folder, quantize, o.allow_nonfinite);
  if (!o.adapter_dir.empty()) {
    load_peft_adapter(*out.tree, o.adapter_dir, fused_projections(config));
    // The adapter's LoRA weights, as loaded into the trainable slots (named by their module path).
    visit_slots(*out.tree, "", [&](Module::Slot& s, const std::string& key) {
      if (s.trainable && s.tensor.defined())
        require_finite(s.tensor, o.adapter_dir + "/adapter_model.safetensors", key, o.allow_nonfinite, kRefuse);
    });
  }
  return out;
}

}  // namespace qshard
