// bench.h: `qshard bench`: tokens/s, MFU, memory and the time split of QLoRA training steps on a
// Llama-shaped random NF4 model (no model folder: the projections drawn directly in 4-bit,
// model.init.draw_4bit; no data: random token ids).
//
// What: a preset (tiny, 1b = Llama-3.2-1B, 8b = Llama-3.1-8B, 70b = Llama-3.1-70B shapes; sizes
// can be overridden one by one) trained with LoRA of rank `rank` on all seven projections, AdamW,
// batch x seq tokens per rank per step, through the same trainer as `qshard train` (the memory
// plan, offload and sharding included). `warmup` steps first (plans, caches), then `steps` timed.
// Reports, rank 0:
//   tokens/s      all ranks' target tokens over the timed steps' wall time;
//   MFU           useful FLOPs (train/flops.h: forward + input-gradient backward, attention, no
//                 recompute) per second over the bf16 GEMM rate measured in the same run, per GPU;
//   memory        device memory in use (cudaMemGetInfo: everything, CUDA context included) at its
//                 most after a step; pinned host memory at its most; the host's peak RSS;
//   time split    the compute stream's parts per step (StepPart; "waiting" is exposed
//                 gather / host-to-device time), from `profile_steps` more steps run after the
//                 timed ones with the profiler on (the timed steps run without its events), with
//                 their own wall time beside the timed steps';
//   limits        measured now: bf16 GEMM TFLOP/s, device copy GB/s (read + write), pinned
//                 host-to-device GB/s: the ceilings the figures compare against.
// as a table on stdout and as JSON (--json FILE).
// Thread safety: one call per rank, every rank alike (collectives inside).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/device_context.h"
#include "runtime/world.h"
#include "train/train_config.h"

namespace qshard {

// BenchOptions' ranges (bench_config throws InputError naming the option outside them; the CLI
// checks the same while parsing): model sizes 0 (the preset's) or 1..kMaxBenchSize; counts
// (--batch, --seq, --rank, --steps) 1..kMaxBenchCount, --warmup and --profile-steps from 0, --micro-batch,
// --keep-layers and --mlp-chunk-tokens from -1; gpu_budget_gb in [0, kMaxBenchGb]. TrainConfig's
// validate then checks how they fit together.
inline constexpr int64_t kMaxBenchSize = int64_t{1} << 24;   // model.init.vocab_size's cap
inline constexpr int64_t kMaxBenchCount = int64_t{1} << 30;
inline constexpr double kMaxBenchGb = 1e6;

struct BenchOptions {
  std::string preset = "8b";  // tiny | 1b | 8b | 70b
  // Sizes overriding the preset's (0: the preset's).
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0;
  int64_t batch = 1;     // sequences per rank per step
  int64_t micro_batch = -1;  // sequences per micro-batch: -1 = batch (no accumulation); 0 = the plan's choice
  int64_t seq = 2048;
  int64_t rank = 16;     // LoRA rank
  int64_t steps = 6;     // timed (the profiler paused: its marks cost host and stream time)
  int64_t warmup = 2;
  int64_t profile_steps = 1;  // after the timed steps, profiled for the time split (0: no split)
  bool offload = false;            // offload.params: the base in pinned host memory
  bool offload_optimizer = false;  // offload.optimizer: LoRA masters and AdamW on the host
  double gpu_budget_gb = 0;
  int64_t keep_layers = -1;
  int64_t host_keep_layers = -1;
  int64_t mlp_chunk_tokens = -1;
  DeviceChoice device = DeviceChoice::kAuto;
  std::vector<std::string> set;  // further config overrides, key=value
  std::string json;              // write the result here (rank 0)
  int64_t list_plans = 0;        // > 0: list the memory plan's this many fastest plans and exit (list_memory_plans)
  int64_t try_plans = 0;         // > 0: run the memory plan's this many fastest plans one after another and
                                 // name the fastest as measured (try_memory_plans)
  std::string token_dir;         // where the random token file goes (default: the temp folder)
};

// The training job a bench runs (`data_train`: the token file). Throws InputError naming the option.
TrainConfig bench_config(const BenchOptions& options, const std::string& data_train, int world_size);

// Runs the bench on this rank; rank 0 prints the table and writes the JSON. Returns the JSON.
// With options.list_plans > 0 it runs nothing: list_memory_plans, printed and written by rank 0.
// With options.try_plans > 0: try_memory_plans.
nlohmann::json run_bench(const BenchOptions& options, World& world);

// The plans the memory plan weighs for this bench's job on a GPU (train/memory_plan.h: the cost
// model at its default rates, an H200's as measured in docs/PERFORMANCE.md; the host memory this
// machine has free), those within --gpu-budget-gb, fastest first, at most options.list_plans: each
// with its estimated step time and tokens/s, its estimated GPU memory and its choices (the first is
// the plan's). The kept layers are the estimate's: a run fills the budget with the memory it
// measures after the build. Nothing is built or allocated. JSON: {"plans": [...], "weighed",
// "fit", ...}; `text` the table. Throws the plan's InputError when no plan fits the budget.
nlohmann::json list_memory_plans(const BenchOptions& options, int world_size, std::string* text = nullptr);

// The plan measured, not estimated: options.try_plans of list_memory_plans' plans (the plan's own
// choice, then the fastest estimate of each shape not yet tried: micro-batch, the base's place,
// each tier's gate / up, a host tier or none; then the next fastest estimates), each
// pinned (MemoryPlan::pins()) and run as a bench of its own (options.warmup + options.steps steps,
// no profiled ones) one after another in this process; each with its estimate, its measured
// tokens/s, step time and peak device memory in use, and whether that peak kept to the budget. The
// fastest as measured among those that kept to it is named with the --set overrides that pin it
// (a job file's memory.* keys). A plan that fails to run (its build or step throws) is reported
// with its error and the rest still run. One rank (the listing reads this host's free memory).
// JSON: {"trials": [{"plan", "est_step_s", "tokens_per_s", "step_s", "peak_gpu_bytes",
// "within_budget", "pins", "ran_as", "losses", "attention_deterministic", "same_losses_as",
// "losses_match", "error"}...], "fastest": index or -1, "pins": [...], "losses_match",
// "losses_compared", "losses_unrepeatable"}: the trials of one micro-batch size give the same losses
// bit for bit (a plan changes no arithmetic), each compared with the first of its size; a trial whose
// attention backward is the non-deterministic one is left out (losses_unrepeatable counts them).
nlohmann::json try_memory_plans(const BenchOptions& options, World& world, std::string* text = nullptr);

}  // namespace qshard
