// peft_adapter.h: reading a PEFT LoRA adapter folder (adapter_config.json +
// adapter_model.safetensors) into a module tree.
//
// Keys: "base_model.model." + the module path + ".lora_A.weight" / ".lora_B.weight" (PEFT's names
// without the adapter name); lora_A [r, in], lora_B [out, r]; any float dtype (converted to the
// tree's f32). scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
// Phi-3 (checkpoint/fused_projections.h): an adapter on the fused qkv_proj / gate_up_proj loads into
// the tree's parts: of the tree's rank, every part takes lora_A and its rows of lora_B (PEFT's shared
// A); of rank n*r with a block-diagonal lora_B (qshard's export), part i takes its own rank-r block.
// rank_pattern / alpha_pattern are read for those two names only (what qshard's Phi-3 export
// writes, and a PEFT user's per-module rank there); each module's scaling must equal the adapter's
// (lora_alpha / r), since qshard applies one scaling to every projection.
// Errors: InputError naming the folder, file and key (missing files, a config that is not LoRA,
// a tensor the tree has no slot for, a shape that does not match, a targeted module without
// adapter weights, a fused adapter that does not split exactly).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "checkpoint/fused_projections.h"
#include "checkpoint/module_tree.h"

namespace qshard {

struct PeftLoraConfig {
  int64_t r = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;  // short names: q_proj, ..., down_proj (Phi-3: qkv_proj, gate_up_proj)
  // rank_pattern / alpha_pattern, keyed by "qkv_proj" or "gate_up_proj" only (PEFT matches such a
  // key against every module path ending in ".<key>"); empty when the file has none.
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  // The rank and alpha PEFT uses for modules named `short_name` ("qkv_proj", "o_proj", ...).
  int64_t rank_of(const std::string& short_name) const;
  double alpha_of(const std::string& short_name) const;
  // PEFT's scaling of such a module: alpha / rank, or alpha / sqrt(rank) with use_rslora.
  double scaling_of(const std::string& short_name) const;
};

// The largest LoRA rank and |lora_alpha| qshard takes (an adapter's config, a job's lora.r / alpha):
// far beyond any real adapter; past them shapes overflow or the scaling makes every value Inf.
inline constexpr int64_t kMaxLoraRank = int64_t{1} << 16;
inline constexpr double kMaxLoraAlpha = 1e6;
PeftLoraConfig read_peft_config(const std::string& dir);
// Copies every adapter tensor into the tree's lora_A / lora_B slots (which must exist); `fused`: the
// model's fused projections (fused_projections(config); empty for Llama-layout families).
void load_peft_adapter(Module& root, const std::string& dir, const std::vector<FusedProjection>& fused = {});

}  // namespace qshard
