// bnb_folder.h: conversion between a Hugging Face Llama folder (f32/bf16/f16 safetensors) and
// the bitsandbytes 4-bit folder transformers writes (`qshard quantize` / `qshard dequantize`).
//
// quantize_model_folder(IN, OUT): the q/k/v/o and gate/up/down projection weights become 4-bit
// (weight + absmax + quant_map [+ nested_absmax + nested_quant_map] + packed quant state, in
// bitsandbytes' state-dict order); every other tensor is copied unchanged; config.json gains
// transformers' quantization_config (compute dtype: options.compute_dtype, float32 by default as
// in BitsAndBytesConfig), every other field as read; other files (tokenizer, generation config)
// are copied.
// dequantize_model_folder(IN, OUT): the reverse: each 4-bit weight in `out_dtype`, or when none is
// given in the dtype it was quantized from (its quant state's "dtype"); config.json without
// quantization_config, its torch_dtype / dtype set to that dtype (when the 4-bit weights disagree
// and no out_dtype is given, the dtype field stays as read); other tensors and files copied.
// Streaming: one tensor at a time is converted; the output is written with the streaming
// safetensors writer (split into shards with an index past max_shard_bytes).
// Atomicity: everything is written into "OUT.partial-<pid>" and renamed to OUT at the end; OUT
// must not exist or be an empty directory, so nothing already there is ever overwritten.
// Errors: InputError naming the folder, file, tensor or key (no config.json, a tensor missing
// for the config, a wrong shape or dtype, an already quantized input, a non-empty OUT).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cmath>
#include <nlohmann/json.hpp>

#include "quant/params4bit.h"

namespace qshard {

struct QuantizeFolderOptions {
  QuantizeOptions quant;
  DType compute_dtype = DType::kF32;  // quantization_config.bnb_4bit_compute_dtype (transformers' default)
  uint64_t max_shard_bytes = 5'000'000'000ULL;  // transformers' default max_shard_size "5GB"
  bool use_cuda = true;  // quantize on the GPU when one is present (bitwise identical results)
  // A weight holding NaN or Inf is refused (its block's absmax would be NaN/Inf and every value of
  // the block lost) unless this is set; then the count is reported.
  bool allow_nonfinite = false;
  // Host threads quantizing tensors at once on the CPU path (0: the host's threads, at most 16,
  // no more than half the available host memory holds). The output is the same for any count.
  int threads = 0;
};

struct FolderReport {
  int64_t converted_tensors = 0;  // quantized (or dequantized) weights
  int64_t copied_tensors = 0;
  int64_t converted_elements = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  // Quantization error over all converted weights, measured against the input values:
  double max_abs_err = 0, sum_sq_err = 0, sum_sq_ref = 0;
  double rel_rms_err() const { return sum_sq_ref > 0 ? std::sqrt(sum_sq_err / sum_sq_ref) : 0.0; }
  int64_t nonfinite_values = 0;  // NaN/Inf inputs quantized (allow_nonfinite); not in the error figures
  int files_written = 0;
};

FolderReport quantize_model_folder(const std::string& in_dir, const std::string& out_dir,
                                   const QuantizeFolderOptions& options = {});
// allow_nonfinite false: a 4-bit weight whose statistics dequantize to NaN / Inf (or past its
// dtype's range) is refused before anything is written (QuantState::check_values).
FolderReport dequantize_model_folder(const std::string& in_dir, const std::string& out_dir,
                                     std::optional<DType> out_dtype = std::nullopt,
                                     uint64_t max_shard_bytes = 5'000'000'000ULL, bool allow_nonfinite = false);

// transformers' quantization_config for these options (keys sorted, as in FORMATS.md), as
// BitsAndBytesConfig(load_in_4bit=True, ...).to_dict() writes it (transformers 5.24): the compute
// dtype defaults to float32, BitsAndBytesConfig's default; quant storage uint8.
nlohmann::json bnb_quantization_config(const QuantizeOptions& o, DType compute_dtype = DType::kF32);

// The files of a model folder that are neither weights nor config.json (generation_config.json,
// tokenizer files, ...): every regular file except config.json, *.safetensors and
// model.safetensors.index.json, sorted by name. Quantize, dequantize and the bnb4 / merged exports
// copy them unchanged (InputError naming the file when a copy fails).
std::vector<std::string> model_side_files(const std::string& dir);
void copy_model_side_files(const std::string& in_dir, const std::string& out_dir);

}  // namespace qshard
