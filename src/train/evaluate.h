// evaluate.h: `qshard eval`: loss and perplexity of a model folder (f32/bf16/f16, or bitsandbytes
// 4-bit) with an optional PEFT adapter, on a token file or a JSON list of token-id lists.
//
// Token file: packed into sequences of seq_len + 1 tokens (train/data_loader.h), every target
// counted. JSON: each list is one sequence; target t is token t + 1 (the last has none).
// dump_logits: writes float32 logits [B, T, V] as safetensors under the key "logits" (JSON input
// whose lists all have the same length). Runs in one process on the CPU reference backend.
// Errors: InputError naming the folder, file or value.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/device_context.h"

namespace qshard {

struct EvalOptions {
  std::string model_dir;
  std::string adapter_dir;   // optional PEFT adapter
  std::string data;          // token file, or .json list of token-id lists
  std::string dump_logits;   // optional output .safetensors
  int64_t seq_len = 0;       // token files: 0 = min(512, max_position_embeddings)
  DeviceChoice device = DeviceChoice::kAuto;  // auto: the GPU when this build and machine have one
};

struct EvalResult {
  double loss = 0;        // mean cross entropy over counted targets
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;
  int64_t sequences = 0;
};

EvalResult evaluate_model(const EvalOptions& options);

}  // namespace qshard
