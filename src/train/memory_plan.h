// memory_plan.h: the training step's GPU memory plan (the memory.* keys of a job).
//
// What: given a GPU memory budget (memory.gpu_budget_gb, bytes = GB x 1e9), chooses
//   - whether the frozen base's shards live on the GPU or in pinned host memory (offload.params):
//     offloaded only when the resident base would not leave room for one step's buffers; then
//     whether the LoRA optimizer state goes to the host too (offload.optimizer: AdamW on the host),
//     only when the budget is still exceeded; a config that asks for offload keeps it;
//   - whether the MLP runs in chunks of rows (long sequences: memory.mlp_chunk_tokens, auto past
//     kAutoChunkAbove tokens per micro-batch, in chunks of kAutoChunkRows);
//   - how many decoder layers keep their activations from the forward instead of recomputing them
//     in the backward (LlamaModelOptions::keep_layers; the last layers first): as many as the budget
//     holds after the base, the LoRA state and the step's buffers. Kept layers are the speed lever:
//     each saves its layer's recompute (about a third of its forward and backward work).
// Two stages: plan_memory() before the model is built (estimates: offload and chunking), then
// plan_kept_layers() once it is, with the device memory actually in use (CUDA; the estimate on the
// CPU) in place of the estimate of the base, the LoRA state and the runtime's own memory.
// Every plan gives the same arithmetic as full recompute (tested bitwise on the CPU).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/hf_config.h"
#include "model/llama_buffers.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "train/train_config.h"

namespace qshard {

inline constexpr int64_t kAutoChunkAbove = 16384;  // tokens per micro-batch
inline constexpr int64_t kAutoChunkRows = 8192;

struct MemoryPlan {
  double budget = 0;             // bytes; 0: no budget (keep_layers as configured, else 0)
  bool offload_params = false;
  bool offload_optimizer = false;
  int64_t mlp_chunk_rows = 0;    // 0: the whole micro-batch at once
  int64_t keep_layers = 0;
  int64_t layers = 0;            // L, for the description
  bool cuda = false;             // the plan is for GPU memory (else the CPU backend's host memory)
  // Estimates, bytes on the GPU:
  double resident = 0;  // base shards (unless offloaded), gathered units, LoRA and optimizer state, runtime
  bool measured = false;  // resident is the device memory in use after the build, not an estimate
  double step = 0;      // LlamaModel's activation buffers and workspace at keep_layers 0 (step_buffers' total)
  BufferPlan step_buffers;  // those buffers, entry by entry (model/llama_buffers.h; ledger() prints them)
  double per_kept = 0;  // each kept layer but the last
  double total() const { return resident + step + per_kept * static_cast<double>(keep_layers > 1 ? keep_layers - 1 : 0); }
  std::string describe() const;
};

// Stage 1: offload and chunking from the config and estimates. `world`: ranks sharing the base.
// Throws InputError when memory.keep_layers > 0 asks for kept layers with a chunked MLP.
MemoryPlan plan_memory(const TrainConfig& config, const LlamaConfig& model, Backend backend, DType activation_dtype,
                       int world);
// Stage 2: the kept layers. in_use_bytes > 0: the device memory in use now (the built model);
// optimizer_bytes: state still to be allocated (AdamW moments on the GPU).
void plan_kept_layers(MemoryPlan& plan, const TrainConfig& config, double in_use_bytes, double optimizer_bytes);

}  // namespace qshard
