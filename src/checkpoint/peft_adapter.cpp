#include "checkpoint/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  for (const char* key : {"alpha_pattern", "rank_pattern"})
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_object() && j[key].empty()))
      refuse(key, "sets per-module values");
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

void load_peft_adapter(Module& root, const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_model.safetensors").string();
  check_input_folder(dir, "adapter folder");
  if (!fs::exists(path)) throw InputError("adapter folder " + dir + " has no adapter_model.safetensors");
  const SafetensorsFile f = SafetensorsFile::open(path);
  static const std::string kPrefix = "base_model.model.";
  size_t loaded = 0;
  for (const auto& e : f.entries()) {
    if (e.name.rfind(kPrefix, 0) != 0) throw InputError(path + ": key '" + e.name + "' does not start with '" + kPrefix + "'");
    const std::string fqn = e.name.substr(kPrefix.size());
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
