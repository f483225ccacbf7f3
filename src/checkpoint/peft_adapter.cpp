#include "checkpoint/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "runtime/input_file.h"

namespace qshard {
namespace fs = std::filesystem;

PeftLoraConfig read_peft_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  check_input_folder(dir, "adapter folder");
  if (!fs::exists(path)) throw InputError("adapter folder " + dir + " has no adapter_config.json");
  const nlohmann::json j = parse_json_input(read_input_file(path, "adapter config"), path);
  if (!j.is_object()) throw InputError(path + ": must be a JSON object");
  const std::string peft_type = json_string(j, "peft_type", path, "");
  if (peft_type != "LORA")
    throw InputError(path + ": key \"peft_type\" is " + (peft_type.empty() ? std::string("missing") : "\"" + peft_type + "\"") +
                     ", expected \"LORA\"");
  PeftLoraConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() <= 0 || j["r"].get<int64_t>() > kMaxLoraRank)
    throw InputError(path + ": key \"r\" must be an integer in [1, " + std::to_string(kMaxLoraRank) + "], got " +
                     (j.contains("r") ? j["r"].dump() : std::string("none")));
  c.r = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number() || !(std::fabs(j["lora_alpha"].get<double>()) <= kMaxLoraAlpha))
    throw InputError(path + ": key \"lora_alpha\" must be a number of magnitude at most " +
                     std::to_string(static_cast<int64_t>(kMaxLoraAlpha)) + ", got " +
                     (j.contains("lora_alpha") ? j["lora_alpha"].dump() : std::string("none")));
  c.lora_alpha = j["lora_alpha"].get<double>();
  c.lora_dropout = json_number(j, "lora_dropout", path, 0.0);
  c.use_rslora = json_bool(j, "use_rslora", path, false);
  if (!j.contains("target_modules"))  // (operator[] of a const json on a missing key is undefined)
    throw InputError(path + ": key \"target_modules\" is missing: expected a list of module names");
  const auto& t = j["target_modules"];
  // PEFT matches a string against every module's full name as a regular expression ("all-linear":
  // every linear layer); read as one module name it named none, and the weights were refused as
  // belonging to no slot.
  if (t.is_string())
    throw InputError(path + ": key \"target_modules\" is the string " + t.dump() +
                     " (PEFT's regular-expression or all-linear form); qshard reads a list of module names, e.g. "
                     "[\"q_proj\", \"v_proj\"]");
  if (t.is_array())
    for (const auto& s : t) {
      if (!s.is_string()) throw InputError(path + ": key \"target_modules\" holds " + s.dump() + ", not a module name");
      c.target_modules.push_back(s.get<std::string>());
    }
  else throw InputError(path + ": key \"target_modules\" must be a list of module names");
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
