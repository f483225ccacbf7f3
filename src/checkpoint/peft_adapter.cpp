#include "checkpoint/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/safetensors.h"
#include "runtime/input_file.h"
#include "runtime/json_field.h"

namespace qshard {
namespace fs = std::filesystem;

PeftLoraConfig read_peft_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  check_input_folder(dir, "adapter folder");
  if (!fs::exists(path)) throw InputError("adapter folder " + dir + " has no adapter_config.json");
  const nlohmann::json j = parse_json_input(read_input_file(path, "adapter config"), path);
  // Every field through a JsonField: a missing one or one of the wrong type names the file and key.
  const JsonField f(j, path);
  const std::string peft_type = f.object().at("peft_type", "\"LORA\"").string();
  if (peft_type != "LORA") f.at("peft_type").expected("\"LORA\"");
  PeftLoraConfig c;
  c.r = f.at("r", "the LoRA rank").integer(1, kMaxLoraRank);
  // alpha scales every update (alpha / r): 0 silences the adapter, a negative one flips it; PEFT
  // writes a positive one.
  const std::string alpha_range = "a number in (0, " + std::to_string(static_cast<int64_t>(kMaxLoraAlpha)) + "]";
  const JsonField alpha = f.at("lora_alpha", alpha_range.c_str());
  c.lora_alpha = alpha.json().is_number() ? alpha.json().get<double>() : NAN;  // 1e999 parses as inf
  if (!(c.lora_alpha > 0 && c.lora_alpha <= kMaxLoraAlpha)) alpha.expected(alpha_range);
  if (const auto dropout = f.find("lora_dropout")) {
    c.lora_dropout = dropout->json().is_number() ? dropout->json().get<double>() : NAN;
    if (!(c.lora_dropout >= 0 && c.lora_dropout < 1)) dropout->expected("a number in [0, 1)");
  }
  c.use_rslora = f.bool_or("use_rslora", false);
  const JsonField t = f.at("target_modules", "a list of module names");
  // PEFT matches a string against every module's full name as a regular expression ("all-linear":
  // every linear layer); read as one module name it named none, and the weights were refused as
  // belonging to no slot.
  if (t.json().is_string())
    throw InputError(path + ": key \"target_modules\" is the string " + t.json().dump() +
                     " (PEFT's regular-expression or all-linear form); qshard reads a list of module names, e.g. "
                     "[\"q_proj\", \"v_proj\"]");
  if (!t.json().is_array()) t.expected("a list of module names");
  for (const JsonField& m : t.elements()) c.target_modules.push_back(m.string());
  // LoRA features qshard does not implement are refused, never ignored (an ignored alpha_pattern
  // would silently compute another model than PEFT does).
  auto refuse = [&](const char* key, const std::string& why) {
    throw InputError(path + ": key \"" + key + "\" " + why + "; qshard implements plain LoRA (and rsLoRA) only");
  };
  // Per-module values only for Phi-3's fused projections (what qshard's Phi-3 export writes: the
  // fused adapter's rank n*r and alpha; the loader checks they give every part the same scaling).
  for (const char* key : {"alpha_pattern", "rank_pattern"}) {
    const auto pat = f.find(key);
    if (!pat) continue;
    for (const auto& [name, v] : pat->object().members()) {
      if (name != "qkv_proj" && name != "gate_up_proj")
        refuse(key, "sets per-module values for '" + name +
                        "' (qshard reads them only for Phi-3's fused qkv_proj and gate_up_proj)");
      if (std::string(key) == "rank_pattern") c.rank_pattern[name] = v.integer(1, kMaxLoraRank);
      else {
        const double a = v.number();
        if (!(a > 0 && a <= kMaxLoraAlpha)) v.expected(alpha_range);
        c.alpha_pattern[name] = a;
      }
    }
  }
  if (json_bool(j, "use_dora", path, false)) refuse("use_dora", "is true (DoRA)");
  if (j.contains("bias") && !j["bias"].is_null() && j["bias"] != "none") refuse("bias", "trains biases");
  if (json_bool(j, "fan_in_fan_out", path, false)) refuse("fan_in_fan_out", "is true (Conv1D-style weights)");
  if (json_bool(j, "lora_bias", path, false)) refuse("lora_bias", "is true (a bias on lora_B)");
  for (const char* key : {"modules_to_save", "layers_to_transform", "layer_replication", "exclude_modules",
                          "target_parameters", "trainable_token_indices"})
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_array() && j[key].empty())) refuse(key, "is set");
  if (j.contains("use_qalora") && j["use_qalora"].is_boolean() && j["use_qalora"].get<bool>())
    refuse("use_qalora", "is true");
  return c;
}

int64_t PeftLoraConfig::rank_of(const std::string& short_name) const {
  const auto it = rank_pattern.find(short_name);
  return it == rank_pattern.end() ? r : it->second;
}

double PeftLoraConfig::alpha_of(const std::string& short_name) const {
  const auto it = alpha_pattern.find(short_name);
  return it == alpha_pattern.end() ? lora_alpha : it->second;
}

double PeftLoraConfig::scaling_of(const std::string& short_name) const {
  const double rank = static_cast<double>(rank_of(short_name));
  return alpha_of(short_name) / (use_rslora ? std::sqrt(rank) : rank);
}

namespace {

// The slot `fqn` of the tree, as a LoRA weight the adapter fills.
Tensor lora_slot(Module& root, const std::string& fqn, const std::string& path, const std::string& key) {
  const auto r = try_resolve(root, fqn);
  if (!r || r->kind != NodeKind::kParameter)
    throw InputError(path + ": tensor '" + key + "' has no LoRA slot '" + fqn + "' in the model (rank or targets differ?)");
  return r->tensor;
}

// A fused module's adapter (lora_A [R, C], lora_B [rows, R]) into its parts' slots; see the header.
size_t load_fused(Module& root, const SafetensorsFile& f, const std::string& path, const PeftLoraConfig& c,
                  const FusedProjection& proj, const std::string& fused_path, const std::string& layer) {
  const std::string key_a = "base_model.model." + fused_path + ".lora_A.weight";
  const std::string key_b = "base_model.model." + fused_path + ".lora_B.weight";
  for (const std::string& k : {key_a, key_b})
    if (!f.find(k)) throw InputError(path + ": tensor '" + k + "' is missing (the adapter has its other half)");
  const Tensor ta = f.get(key_a), tb = f.get(key_b);
  const std::vector<float> A = ta.to_f32_vector(), B = tb.to_f32_vector();
  const size_t n = proj.parts.size();
  const Tensor slot_a0 = lora_slot(root, layer + proj.parts[0] + ".lora_A.weight", path, key_a);
  const int64_t r = slot_a0.dim(0), C = slot_a0.dim(1), rows = proj.total_rows();
  if (ta.ndim() != 2 || tb.ndim() != 2 || ta.dim(1) != C || tb.dim(0) != rows || tb.dim(1) != ta.dim(0))
    throw InputError(path + ": '" + key_a + "' " + shape_str(ta.shape()) + " and '" + key_b + "' " + shape_str(tb.shape()) +
                     " are not a LoRA pair of [R, " + std::to_string(C) + "] and [" + std::to_string(rows) + ", R]");
  const int64_t R = ta.dim(0);
  // PEFT's scaling of the fused module must be the one qshard applies to each part.
  const std::string name = proj.short_name();
  const double s_fused = c.scaling_of(name), s_model = c.lora_alpha / (c.use_rslora ? std::sqrt(double(c.r)) : double(c.r));
  if (c.rank_of(name) != R)
    throw InputError(path + ": '" + key_a + "' has rank " + std::to_string(R) + " but adapter_config.json gives " + name +
                     " rank " + std::to_string(c.rank_of(name)));
  if (std::fabs(s_fused - s_model) > 1e-12 * s_model)
    throw InputError(path + ": " + name + "'s scaling (lora_alpha " + std::to_string(c.alpha_of(name)) + ", rank " +
                     std::to_string(R) + ") differs from the adapter's (lora_alpha " + std::to_string(c.lora_alpha) +
                     ", r " + std::to_string(c.r) + "); qshard applies one scaling to every projection");
  // Which rank-r columns each part takes: all of them (shared A, R == r), or its own block of a
  // block-diagonal B (R == n r), checked exactly.
  bool blocks = false;
  if (R == static_cast<int64_t>(n) * r && n > 1) {
    blocks = true;
    int64_t row0 = 0;
    for (size_t i = 0; i < n && blocks; row0 += proj.rows[i], ++i)
      for (int64_t o = row0; o < row0 + proj.rows[i] && blocks; ++o)
        for (int64_t k = 0; k < R; ++k)
          if (k / r != static_cast<int64_t>(i) && B[static_cast<size_t>(o * R + k)] != 0.0f) {
            blocks = false;
            break;
          }
  }
  if (R != r && !blocks)
    throw InputError(path + ": " + name + "'s adapter has rank " + std::to_string(R) + "; qshard splits it into its " +
                     std::to_string(n) + " parts exactly only at the adapter's rank r = " + std::to_string(r) +
                     " (PEFT's shared lora_A) or at rank " + std::to_string(n * r) +
                     " with a block-diagonal lora_B (qshard's export)");
  int64_t row0 = 0;
  for (size_t i = 0; i < n; row0 += proj.rows[i], ++i) {
    Tensor a = lora_slot(root, layer + proj.parts[i] + ".lora_A.weight", path, key_a);
    Tensor b = lora_slot(root, layer + proj.parts[i] + ".lora_B.weight", path, key_b);
    const int64_t k0 = blocks ? static_cast<int64_t>(i) * r : 0;
    std::vector<float> pa(static_cast<size_t>(r * C)), pb(static_cast<size_t>(proj.rows[i] * r));
    for (int64_t k = 0; k < r; ++k)
      for (int64_t x = 0; x < C; ++x) pa[static_cast<size_t>(k * C + x)] = A[static_cast<size_t>((k0 + k) * C + x)];
    for (int64_t o = 0; o < proj.rows[i]; ++o)
      for (int64_t k = 0; k < r; ++k) pb[static_cast<size_t>(o * r + k)] = B[static_cast<size_t>((row0 + o) * R + k0 + k)];
    a.copy_from(Tensor::from_f32(a.shape(), a.dtype(), pa));
    b.copy_from(Tensor::from_f32(b.shape(), b.dtype(), pb));
  }
  return 2 * n;  // the parts' slots filled
}

}  // namespace

void load_peft_adapter(Module& root, const std::string& dir, const std::vector<FusedProjection>& fused) {
  const std::string path = (fs::path(dir) / "adapter_model.safetensors").string();
  check_input_folder(dir, "adapter folder");
  if (!fs::exists(path)) throw InputError("adapter folder " + dir + " has no adapter_model.safetensors");
  const SafetensorsFile f = SafetensorsFile::open(path);
  static const std::string kPrefix = "base_model.model.";
  size_t loaded = 0;
  const PeftLoraConfig config = fused.empty() ? PeftLoraConfig{} : read_peft_config(dir);
  std::set<std::string> fused_done;
  for (const auto& e : f.entries()) {
    if (e.name.rfind(kPrefix, 0) != 0) throw InputError(path + ": key '" + e.name + "' does not start with '" + kPrefix + "'");
    const std::string fqn = e.name.substr(kPrefix.size());
    // A fused Phi-3 module ("model.layers.<l>.self_attn.qkv_proj.lora_A.weight"): both halves at once.
    const FusedProjection* proj = nullptr;
    std::string fused_path, layer;
    for (const FusedProjection& fp : fused) {
      for (const char* half : {".lora_A.weight", ".lora_B.weight"}) {
        const std::string tail = "." + fp.fused + half;
        if (fqn.size() > tail.size() && fqn.compare(fqn.size() - tail.size(), tail.size(), tail) == 0) {
          proj = &fp;
          fused_path = fqn.substr(0, fqn.size() - std::string(half).size());
          layer = fqn.substr(0, fqn.size() - tail.size() + 1);
        }
      }
    }
    if (proj) {
      if (fused_done.insert(fused_path).second) loaded += load_fused(root, f, path, config, *proj, fused_path, layer);
      continue;
    }
    const auto r = try_resolve(root, fqn);
    if (!r || r->kind != NodeKind::kParameter)
      throw InputError(path + ": tensor '" + e.name + "' has no LoRA slot '" + fqn + "' in the model (rank or targets differ?)");
    const Tensor t = f.get(e.name);
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16 && t.dtype() != DType::kF64)
      throw InputError(path + ": tensor '" + e.name + "' has dtype " + dtype_safetensors_name(t.dtype()) +
                       "; LoRA weights are floating point (F32, BF16, F16)");
    if (t.shape() != r->tensor.shape())
      throw InputError(path + ": tensor '" + e.name + "' has shape " + shape_str(t.shape()) + ", the model expects " +
                       shape_str(r->tensor.shape()));
    Tensor dst = r->tensor;
    dst.copy_from(Tensor::from_f32(t.shape(), dst.dtype(), t.to_f32_vector()));
    ++loaded;
  }
  // Every LoRA slot of the tree must have been filled.
  size_t slots = 0;
  for (const auto& [k, t] : state_dict(root, {true, false, true})) slots += k.find(".lora_") != std::string::npos;
  if (loaded != slots)
    throw InputError(path + ": " + std::to_string(loaded) + " adapter tensors for " + std::to_string(slots) +
                     " LoRA weights of the model");
}

}  // namespace qshard
