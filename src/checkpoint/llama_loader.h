// llama_loader.h: the one loader of a Hugging Face Llama folder (config.json + safetensors, one
// file or an index of shards; f32/bf16/f16 weights, or bitsandbytes 4-bit as transformers saves
// it) into the module tree of llama_tree.h. `qshard inspect` (strict, as stored), training's
// model.path (as stored, quantized on load, LoRA slots) and `qshard eval` / `generate` (f32, a
// PEFT adapter, a host memory check) all load through it.
//
// Steps: config.json (LlamaConfig::load) -> the adapter's adapter_config.json, when given ->
// the host check, when asked -> the folder's headers -> build_llama_tree -> every frozen slot
// filled from the folder -> the adapter's weights, when given. Nothing is allocated before the
// host check. The fill matches every slot first (headers only, except that a stored 4-bit weight
// is read and checked there), then copies, converts and quantizes once every slot has a source.
// Per slot (FQN = the state-dict key, as in the folder):
//   float tensor (embeddings, norms, lm_head, biases; projections when nothing is 4-bit): the
//     stored tensor, bytes as stored when the dtypes agree (kAsStored), else converted through f32.
//   Params4bit projection (the folder is bitsandbytes 4-bit, or `quantize` is set): a weight
//     stored in 4-bit loads as stored (data and statistics byte for byte, its quant type, block
//     size and nesting); a float weight is quantized with `quantize` (or the folder's
//     quantization_config when unset). strict refuses a float weight in a 4-bit folder.
//   LoRA A/B (trainable, f32): zeros for the caller to init, or the adapter's weights.
// strict: the folder holds exactly the tensors its config.json implies (a 4-bit folder: each
// projection with its statistics); lenient: tensors the tree has no slot for are ignored. Either
// way a tensor the tree needs and the folder lacks, a wrong shape or a non-float tensor in a float
// slot is an InputError "<dir>: state dict does not match the model: missing keys (n): ...;
// unexpected keys (strict only) ...; mismatched keys ..." listing all of them (LoadReport::str).
// Values: every float tensor a slot takes is scanned for NaN / Inf once, as it is copied (one
// pass over its bits, host threads for large tensors: checkpoint/nonfinite.h), and every stored
// 4-bit weight's statistics as dequantization decodes them, and an adapter's LoRA weights once
// loaded; refused unless allow_nonfinite.
// Errors: InputError naming the folder, file and key (config.json, adapter_config.json and the
// safetensors readers name theirs); a host too small names the bytes (require_host_memory).
// Ownership: the result owns the tree (host tensors; the caller moves them to a device).
// Thread safety: none needed; the loader touches only what it creates.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "checkpoint/hf_config.h"
#include "checkpoint/llama_tree.h"
#include "checkpoint/module_tree.h"
#include "checkpoint/peft_adapter.h"

namespace qshard {

struct LlamaLoadOptions {
  // kAsStored: each float tensor in the dtype the folder stores it in (bf16 stays bf16, so an
  // export writes it back as it came in); kF32: every float tensor f32 (inference).
  enum class Floats { kAsStored, kF32 };
  Floats floats = Floats::kAsStored;
  // Set: the projections become Params4bit and a float folder's projections are quantized on
  // load with these. A 4-bit folder's projections load as stored either way.
  std::optional<QuantizeOptions> quantize;
  // LoRA A/B slots to add (zero-filled; the caller inits them, checkpoint/model_init.h).
  LoraSpec lora;
  // A PEFT adapter folder: its adapter_config.json gives the LoRA rank and targets, its weights
  // fill the slots. REQUIRES: not together with lora.r > 0 (Error otherwise).
  std::string adapter_dir;
  // true: reject tensors config.json does not imply; false: ignore them.
  bool strict = true;
  // true: before anything is allocated, require_host_memory(llama_tree_bytes(...),
  // "loading <dir>", llama_size_keys(config)); false: the caller checks (or nothing does).
  bool check_host_memory = false;
  // false: a float tensor holding NaN / Inf, or 4-bit statistics that dequantize to NaN / Inf or
  // past the dtype's range, is an InputError naming the file, tensor (or field), the first bad
  // index and the count (checkpoint/nonfinite.h, QuantState::check_values); true: loaded as is
  // (`--allow-nonfinite`).
  bool allow_nonfinite = false;
};

struct LoadedLlama {
  LlamaConfig config;
  std::unique_ptr<Module> tree;
  std::optional<PeftLoraConfig> adapter;  // adapter_dir's config (r, lora_alpha, use_rslora, targets)
  double tree_bytes = 0;                  // llama_tree_bytes(config, options)
};

// Defaults (strict, as stored, no LoRA, no check): the folder as it is, what `qshard inspect` checks.
LoadedLlama load_llama_folder(const std::string& dir, const LlamaLoadOptions& options = {});

// The bytes of the frozen tree load_llama_folder builds (the host check's figure): projections in
// 4-bit when the folder is bitsandbytes 4-bit (the default block size of 64, its double quant) or
// `quantize` is set (llama_4bit_bytes), at the float size otherwise; the float tensors at 4 bytes
// (kF32) or at config.json's dtype (kAsStored; 2 when it names none). LoRA slots are not counted.
double llama_tree_bytes(const LlamaConfig& config, const LlamaLoadOptions& options);

}  // namespace qshard
