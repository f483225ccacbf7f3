// evaluate.h: `qshard eval`: loss and perplexity of a model folder (f32/bf16/f16, or bitsandbytes
// 4-bit) with an optional PEFT adapter, on a token file or a JSON list of token-id lists.
//
// Token file: packed into sequences of seq_len + 1 tokens (text/data_loader.h), every target
// counted. JSON: each list is one sequence; target t is token t + 1 (the last has none).
// dump_logits: writes float32 logits [B, T, V] as safetensors under the key "logits" (JSON input
// whose lists all have the same length). Runs in one process on the CPU reference backend.
// Errors: InputError naming the folder, file or value.
#pragma once

#include <cstdint>
#include <string>

#include <memory>

#include "checkpoint/hf_config.h"
#include "checkpoint/module_tree.h"
#include "model/llama_model.h"
#include "runtime/device_context.h"

namespace qshard {

// A model folder (f32/bf16/f16, or bitsandbytes 4-bit) with an optional PEFT adapter, loaded as
// `qshard eval` and `qshard generate` run it: 4-bit projections as stored, every other weight f32,
// on the host (move_tree_to puts it on the GPU). options: LoRA alpha / rsLoRA from the adapter.
// Errors: InputError naming the folder, file or value; a host too small for the tree names its bytes.
struct InferenceModel {
  LlamaConfig config;
  std::unique_ptr<Module> tree;
  LlamaModelOptions options;
  int64_t lora_r = 0;       // the adapter's rank (0: none)
  double tree_bytes = 0;    // the tree's bytes (host, then device)
};
// allow_nonfinite: LlamaLoadOptions::allow_nonfinite (NaN / Inf weights refused when false).
InferenceModel load_inference_model(const std::string& model_dir, const std::string& adapter_dir,
                                    bool allow_nonfinite = false);
// Every tensor of the tree (parameters, buffers, 4-bit data and statistics) onto `device`.
void move_tree_to(Module& m, Device device);
// The context of a one-process inference command: the first GPU or the CPU as `choice` says
// (`setting` names the flag in errors); a CUDA build without fused attention refuses the GPU.
std::unique_ptr<DeviceContext> inference_context(DeviceChoice choice, const std::string& setting,
                                                 const std::string& model_dir);

struct EvalOptions {
  std::string model_dir;
  std::string adapter_dir;   // optional PEFT adapter
  std::string data;          // token file, or .json list of token-id lists
  std::string dump_logits;   // optional output .safetensors
  int64_t seq_len = 0;       // token files: 0 = min(512, max_position_embeddings)
  DeviceChoice device = DeviceChoice::kAuto;  // auto: the GPU when this build and machine have one
  bool allow_nonfinite = false;              // load weights holding NaN / Inf (--allow-nonfinite)
};

struct EvalResult {
  double loss = 0;        // mean cross entropy over counted targets
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;
  int64_t sequences = 0;
};

EvalResult evaluate_model(const EvalOptions& options);

}  // namespace qshard
