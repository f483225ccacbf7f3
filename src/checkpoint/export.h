// export.h: full-state-dict export of a sharded model (issue 6): the bitsandbytes 4-bit HF folder,
// the PEFT LoRA adapter, or merged bf16 HF weights, streamed one FSDP unit at a time.
//
// What: export_model() is collective (every rank of the manager's communicator calls it with the
// same arguments); `host` (the MPI control communicator over the same ranks) carries the status
// agreement and the strings, the manager's data communicator the gathers. The output layout (names, dtypes, shapes, files) is computed first from the
// tree's slots and QuantStates, without gathering, identically on every rank. Then the units are
// gathered one at a time, in the order the file needs them: the root unit for
// model.embed_tokens, the decoder layers 0..L-1, the root unit again for model.norm and lm_head
// (HF order). On rank 0 the gathered tensors a unit contributes are copied to host memory
// (cpu_offload semantics) and streamed into the safetensors writer; the unit is released before
// the next one is gathered. The other ranks only take part in the gathers.
// Memory (rank 0): host copies of at most one unit's output tensors at a time
// (ExportReport::peak_unit_bytes, measured), plus for kMerged one projection's f32 work buffers.
//
// Formats (shared/FORMATS.md):
//   kBnb4    config.json and model.safetensors, or
//            model-0000i-of-0000n.safetensors + model.safetensors.index.json past max_shard_bytes
//            (a 4-bit weight stays in the file of its statistics): every non-LoRA key of the tree's
//            state dict in its dtype and bytes, bitsandbytes' key order (packed + absmax + quant_map
//            [+ nested_absmax + nested_quant_map] + quant_state.bitsandbytes__nf4|fp4); frozen float
//            tensors exactly as the tree holds them. config.json: for a config read from a 4-bit
//            folder, that config.json as read (quantization_config with its compute dtype and quant
//            storage, dtype, every field), after checking the weights' quant type and double quant
//            against it; otherwise the config as read + bnb_quantization_config (transformers'
//            defaults: compute dtype float32), dtype as read (the embedding's when absent).
//   kPeft    adapter_model.safetensors (base_model.model.<path>.lora_A.weight [r, in] f32,
//            .lora_B.weight [out, r] f32) + adapter_config.json with the fields PEFT writes.
//   kBnb4 and kMerged also copy the other files of config.source_dir (the folder the config was
//            loaded from, if any: generation_config.json, tokenizer; bnb_folder.h model_side_files).
//   kMerged  config.json (no quantization_config, torch_dtype bfloat16) + bf16 weights: each
//            projection W' = bf16(f32(dequantize(W)) + float(scaling) * (B @ A)), where dequantize
//            gives W's original dtype (as bitsandbytes' forward and PEFT's merge see it) and
//            (B @ A)[o, i] is summed in f32 over k = 0..r-1; other tensors cast to bf16.
//            scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
// Atomicity: rank 0 writes into "<out_dir>.partial-<pid>"; after every rank has finished its gathers
// (a broadcast of rank 0's status acts as the barrier) rank 0 self-checks the folder and renames it
// to out_dir (then fsyncs out_dir's parent). The rename is the completion marker: out_dir exists
// only once the export is complete and checked (export_complete). A process killed before it
// leaves "<out_dir>.partial-<pid>", which the next export to out_dir removes (partial_dir_for).
// A failure on rank 0 (I/O, self-check) is broadcast with its kind, so every rank throws the same
// kind (InputError for bad input and failing I/O - a full disk -, Error otherwise: one exit code,
// whichever rank ends the job first) and none hangs; the partial folder is removed.
// Test hook: with QSHARD_TEST_KILL_DURING_EXPORT=<bnb4|peft|merged> rank 0 SIGKILLs itself halfway
// through writing the tensors of an export of that format (tests/apps/export_resume_check.sh). out_dir must not exist or be an empty directory (checked
// on rank 0 and broadcast before any gather: InputError on every rank).
// Self-check (rank 0, on the partial folder, streaming, bounded memory): config.json parses and
// implies exactly the stored weight names and shapes; every stored key resolves through the
// exporting tree to the same dtype and shape (kBnb4, kPeft); 4-bit weights rebuild from their
// statistics; kPeft: the config's r / alpha / targets match, every lora_B is non-zero (an all-zero
// lora_B means an untrained or lost adapter: InputError naming the key, unless allow_zero_lora_b);
// kMerged: bf16 and finite.
// REQUIRES: `units` came from shard_module_tree(tree, mgr, ...) and mgr is finalized; no unit is
// gathered. Thread safety: one thread per rank, like the manager.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/sharded_tree.h"

namespace qshard {

enum class ExportFormat { kBnb4, kPeft, kMerged };
const char* export_format_name(ExportFormat f);

struct ExportOptions {
  std::string out_dir;
  ExportFormat format = ExportFormat::kBnb4;
  uint64_t max_shard_bytes = 5'000'000'000ULL;  // kBnb4 / kMerged (transformers' "5GB")
  std::string base_model_name_or_path;          // kPeft; empty writes null
  double lora_alpha = 16;
  bool use_rslora = false;
  double lora_dropout = 0;
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  int64_t r = 0;                                // must equal the tree's LoRA rank (kPeft, kMerged)
  bool allow_zero_lora_b = false;               // kPeft self-check: accept an untrained adapter
};

struct ExportReport {
  std::vector<std::string> files;  // file names written in out_dir (all ranks)
  int64_t tensors = 0;             // tensors written (all ranks)
  uint64_t bytes = 0;              // tensor bytes written (all ranks)
  uint64_t peak_unit_bytes = 0;    // rank 0: most bytes of host tensor copies alive at once
};

// Whether out_dir holds a complete export: a non-empty directory (export_model's rename is the
// marker). Never throws.
bool export_complete(const std::string& out_dir);

ExportReport export_model(Communicator& host, Module& tree, const LlamaConfig& config, ShardedParameterManager& mgr,
                          const ShardedTree& units, const ExportOptions& options);

}  // namespace qshard
