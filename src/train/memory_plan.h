// memory_plan.h: the training step's GPU memory plan (the memory.* keys of a job).
//
// What: given a GPU memory budget (memory.gpu_budget_gb, bytes = GB x 1e9), weighs the plans
// open to the job and keeps the one a cost model says is fastest among those within the budget:
//   - the micro-batch, when batch.micro_batch_size is 0 (auto): any divisor of the rank's share of
//     the global batch, gradient accumulation making up the rest (the GPU; the CPU takes 1);
//   - whether the frozen base's shards live on the GPU or in pinned host memory (offload.params;
//     a config that asks for it keeps it, memory.base: gpu keeps them on the GPU); whether the
//     LoRA optimizer state goes to the host too (offload.optimizer: AdamW on the host), only when
//     no plan fits with it on the GPU;
//   - whether the embedding table (frozen, untied) stays on the GPU or in pinned host memory, read
//     in place by the lookup (memory.embedding; auto: the plan weighs both: the host saves V x C
//     bytes of the GPU, 1.05 GB at 8B, for a read of the step's rows over PCIe);
//   - whether the layer inputs (activation checkpoints) go to pinned host memory, three (or more,
//     where the host holds fewer) on the GPU
//     (memory.host_checkpoints; auto: both weighed with a budget);
//   - whether the MLP runs in chunks of rows (long sequences: memory.mlp_chunk_tokens, auto past
//     kAutoChunkAbove tokens per micro-batch, in chunks of kAutoChunkRows);
//   - how many decoder layers keep their activations from the forward instead of recomputing them
//     in the backward (LlamaModelOptions::keep_layers; the last layers first, beside a host tier the
//     last of those it leaves): as many as the budget
//     holds after the base, the LoRA state and the step's buffers. Kept layers are the speed lever:
//     each saves its layer's recompute (about a third of its forward and backward work);
//   - how many of the other layers keep theirs in pinned host memory (the host tier,
//     LlamaModelOptions::host_keep_layers: two kept sets' worth of device staging, one set of host
//     memory each, copied out in the forward and back before the backward at the measured
//     host-to-device rate). The cost model counts the copies that the compute cannot hide; the
//     host memory is memory.host_budget_gb, or half of what the host can still take. Chosen only
//     with the base on the GPU (an offloaded base's copies and the tier's stalled each other);
//   - whether each tier's kept sets hold the MLP's gate / up (memory.kept_mlp; auto: whole, lean,
//     or whole on the device beside a lean host tier, each with its own host-kept count);
//   - once every layer is kept, how many of the kept sets are full (memory.full_kept_layers; auto:
//     as many as the memory left holds): they keep h1, h2 and m too, whose recompute (two RMSNorms,
//     the fold's skinny GEMMs and a SwiGLU: memory-bound) is about 2% of a step with every layer kept;
//   - then, once every kept set is full too, how many layers keep their base dequantized on the GPU
//     from their first use on (memory.dequantized_layers; auto: as many as the memory left holds, the
//     GPU only): each saves its two dequants a micro-batch (about 1.3% of a step at 8B, every layer),
//     for about its bf16 weights' bytes.
// The cost model (GPU): a micro-batch of N tokens takes N a (1 - s k) + N0 a seconds, a = useful
// FLOPs per token / (0.54 x the measured GEMM rate), N0 = 350 tokens of per-micro-batch fixed work
// (dequantizing the base, the head, the LoRA's small GEMMs, launches), s = 0.29 the recompute's share,
// k the kept fraction of the layers (device- or host-kept; a full set's share f more: N a (1 - s k -
// f k_full)); an offloaded base adds, per layer, the part
// of its host-to-device copy (at the measured bandwidth) longer than that layer's forward (and its
// backward); a host optimizer adds 32 bytes a LoRA parameter at 10 GB/s. Constants from the H200 runs
// of docs/PERFORMANCE.md (session 11), N0 and s refitted to session 31's 27 plans tried on an H100
// (memory_plan.cpp): the plan's choice the fastest measured at 10.08 and 12.48 GB, within 1% at 16.1
// and 21.47 GB. The base is offloaded when that is faster within the budget (room for kept
// layers), not only when it must be.
// Two stages: plan_memory() before the model is built (estimates: offload and chunking), then
// plan_kept_layers() once it is, with the device memory actually in use (CUDA; the estimate on the
// CPU) in place of the estimate of the base, the LoRA state and the runtime's own memory.
// Every plan of one micro-batch size gives the same arithmetic as full recompute (tested bitwise on
// the CPU); another micro-batch sums the same gradients in another order (gradient accumulation).
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "model/llama_buffers.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "train/train_config.h"

namespace qshard {

inline constexpr int64_t kAutoChunkAbove = 16384;  // tokens per micro-batch
inline constexpr int64_t kAutoChunkRows = 8192;

// The rates the cost model reads (measured at start on the GPU; 0: the H200's, as measured in
// docs/PERFORMANCE.md: these).
inline constexpr double kPlanDefaultGemmFlops = 790e12;
inline constexpr double kPlanDefaultH2dBytesPerSecond = 55e9;
struct PlanRates {
  double gemm_flops = 0;            // bf16 GEMM FLOP/s (flops.h measure_gemm_flops)
  double h2d_bytes_per_second = 0;  // pinned host to device (flops.h measure_h2d_bandwidth)
  double host_available_bytes = 0;  // host memory the process can still take (machine.h); 0: unknown
};

struct MemoryPlan {
  double budget = 0;             // bytes; 0: no budget (keep_layers as configured, else 0)
  int64_t micro_batch = 1;       // sequences per forward/backward (batch.micro_batch_size, or the plan's
                                 // choice when that is 0)
  bool offload_params = false;
  bool offload_optimizer = false;
  int64_t mlp_chunk_rows = 0;    // 0: the whole micro-batch at once
  int64_t keep_layers = 0;
  int64_t host_keep_layers = 0;  // of the layers keep_layers leaves, those kept in pinned host memory
  int64_t host_staging = 2;      // their device staging sets at most (memory.host_staging_sets)
  bool kept_mlp = true;          // device-kept layers hold gate / up (LlamaModelOptions::kept_mlp)
  bool host_kept_mlp = true;     // host-kept layers do (LlamaModelOptions::host_kept_mlp)
  int64_t full_kept = 0;         // of the device-kept layers but the last, those whose sets are full
                                 // (h1, h2 and m kept too: LlamaModelOptions::full_kept_sets)
  int64_t dequantized = 0;       // layers whose base stays dequantized (LlamaModelOptions::dequantized_layers)
  bool host_checkpoints = false; // the layer inputs in pinned host memory (memory.host_checkpoints;
                                 // step_buffers count it)
  int64_t checkpoint_slots = 3;  // with host_checkpoints: the layer inputs' device slots (three, or more
                                 // where the host memory given to them holds fewer than L - 2)
  int64_t checkpoint_every = 1;  // 2: every second layer input kept (memory.checkpoint_every)
  bool embedding_on_host = false; // the embedding table in pinned host memory (memory.embedding)
  int64_t layers = 0;            // L, for the description
  bool cuda = false;             // the plan is for GPU memory (else the CPU backend's host memory)
  // Estimates, bytes on the GPU:
  double resident = 0;  // base shards (unless offloaded), gathered units, LoRA and optimizer state, runtime,
                        // libraries
  double library = 0;   // of which the libraries' workspaces at this micro-batch (cuDNN's grows with it)
  bool measured = false;  // resident is the device memory in use after the build, not an estimate
  double step = 0;      // LlamaModel's activation buffers and workspace at keep_layers 0 (step_buffers' total)
  BufferPlan step_buffers;  // those buffers, entry by entry (model/llama_buffers.h; ledger() prints them)
  double per_kept = 0;       // each device-kept layer but the last
  double per_host_kept = 0;  // each host-kept layer's set: its staging sets on the GPU (at most two),
                             // its host sets in pinned host memory (per_kept unless host_kept_mlp differs)
  double per_full = 0;       // a full kept set's bytes beyond a whole one (0: no full sets at this shape)
  double per_dequantized = 0;  // one dequantized layer's slot (llama_dequantized_layer_bytes)
  double dequantized_ws = 0;   // the workspace's weights, which every layer dequantized leaves out
  // The cost model (GPU plans): the estimated seconds of one optimizer step, how many plans were
  // weighed, and the fastest other one that fits.
  double est_step_s = 0;
  int candidates = 1;
  std::string runner_up;
  double runner_up_s = 0;
  int64_t staging_sets() const { return std::min<int64_t>(host_keep_layers, host_staging); }
  double staging_bytes() const { return per_host_kept * static_cast<double>(staging_sets()); }
  double kept_bytes() const {
    return per_kept * static_cast<double>(keep_layers > 1 ? keep_layers - 1 : 0) +
           per_full * static_cast<double>(full_kept) + staging_bytes();
  }
  double host_bytes() const {
    return per_host_kept * static_cast<double>(std::max<int64_t>(host_keep_layers - staging_sets(), 0));
  }
  double dequantized_bytes() const {
    return per_dequantized * static_cast<double>(dequantized) - (dequantized > 0 && dequantized >= layers ? dequantized_ws : 0.0);
  }
  double total() const { return resident + step + kept_bytes() + dequantized_bytes(); }
  // Within the budget on the GPU (none: always): the base, the step's buffers and the staging sets
  // (the device-kept layers fill what is left).
  bool fits() const { return budget <= 0 || resident + step + staging_bytes() <= budget; }
  std::string describe() const;
  // One line of the choices: "micro-batch 8, base offloaded, 3 kept, 28 host-kept without gate / up, ...".
  std::string brief() const;
  // The config overrides (key=value, as --set takes them) that make plan_memory choose this plan's
  // shape at its budget: the micro-batch, where the base, the optimizer, the embedding and the
  // layer inputs live, every second checkpoint, each tier's gate / up and the host-kept layers. The
  // device-kept layers stay the plan's (stage 2 fills the budget with the memory measured after the
  // build).
  std::vector<std::string> pins() const;
};

// LoRA parameters of rank `r` on `targets` (module names, e.g. "q_proj") over every layer:
// r x (in + out) per projection.
double lora_param_count(const LlamaConfig& model, int64_t r, const std::vector<std::string>& targets);

// Stage 1: the micro-batch, offload and chunking from the config and estimates. `world`: ranks
// sharing the base. Throws InputError when memory.keep_layers > 0 asks for kept layers with a
// chunked MLP.
MemoryPlan plan_memory(const TrainConfig& config, const LlamaConfig& model, Backend backend, DType activation_dtype,
                       int world, const PlanRates& rates = {});
// Every plan stage 1 weighs (its kept layers: what the estimated budget holds), in the order
// plan_memory prefers on a tie.
std::vector<MemoryPlan> plan_candidates(const TrainConfig& config, const LlamaConfig& model, Backend backend,
                                        DType activation_dtype, int world, const PlanRates& rates = {});
// Within its budget and fastest by the estimate, the earliest on a tie (plan_memory's choice among
// plan_candidates' plans); null when none fits.
const MemoryPlan* fastest_fitting(const std::vector<MemoryPlan>& plans);
// The cost model's step time for `plan` (after stage 2 changed its kept layers).
double plan_step_estimate(const MemoryPlan& plan, const TrainConfig& config, const LlamaConfig& model, int world,
                          const PlanRates& rates = {});
// Stage 2: the kept layers. in_use_bytes > 0: the device memory in use now (the built model);
// optimizer_bytes: state still to be allocated (AdamW moments on the GPU). The host-kept layers of
// stage 1 keep their staging sets' room and give way to device-kept ones (at most the layers left).
void plan_kept_layers(MemoryPlan& plan, const TrainConfig& config, double in_use_bytes, double optimizer_bytes);

}  // namespace qshard
