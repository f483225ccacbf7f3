// peft_adapter.h: reading a PEFT LoRA adapter folder (adapter_config.json +
// adapter_model.safetensors) into a module tree.
//
// Keys: "base_model.model." + the module path + ".lora_A.weight" / ".lora_B.weight" (PEFT's names
// without the adapter name); lora_A [r, in], lora_B [out, r]; any float dtype (converted to the
// tree's f32). scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
// Errors: InputError naming the folder, file and key (missing files, a config that is not LoRA,
// a tensor the tree has no slot for, a shape that does not match, a targeted module without
// adapter weights).
#pragma once

#include <string>
#include <vector>

#include "checkpoint/module_tree.h"

namespace qshard {

struct PeftLoraConfig {
  int64_t r = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;  // short names: q_proj, ..., down_proj
};

// The largest LoRA rank and |lora_alpha| qshard takes (an adapter's config, a job's lora.r / alpha):
// far beyond any real adapter; past them shapes overflow or the scaling makes every value Inf.
inline constexpr int64_t kMaxLoraRank = int64_t{1} << 16;
inline constexpr double kMaxLoraAlpha = 1e6;
PeftLoraConfig read_peft_config(const std::string& dir);
// Copies every adapter tensor into the tree's lora_A / lora_B slots (which must exist).
void load_peft_adapter(Module& root, const std::string& dir);

}  // namespace qshard
