// trainer.h: the QLoRA training job (`qshard train`): orchestration around train_step().
//
// One call of train() runs a whole job on the ranks of `comm`:
//   model    an HF folder (float weights are quantized to 4-bit on load; a bitsandbytes folder
//            keeps its bytes) or a tiny random Llama from config.model.init; LoRA A/B added
//            (PEFT init, seeded by name, identical at every world size);
//   sharding one FSDP unit per decoder layer + a root unit (embeddings, final norm, LM head),
//            through ShardedParameterManager: gathered before use (next unit prefetched),
//            released after, LoRA gradients reduce-scattered (averaged) into f32 shards;
//   step     global_batch sequences per optimizer step, each rank micro-batches over its
//            contiguous slice of the global batch (DistributedSampler); the loss is the mean
//            over all non-ignored target tokens of all ranks; global gradient-norm clipping
//            across ranks; AdamW on this rank's f32 master shards; LR schedule;
//   eval     mean loss over the eval split (every logging.eval_every_steps and at the end);
//   metrics  rank 0: a progress line per logging step, JSONL (metrics.h) and, with
//            logging.tensorboard_dir, TensorBoard scalars (tensorboard_writer.h);
//   folder   checkpoint.dir, the run folder (`qshard train` makes it runs/<job> when the job file
//            leaves it unset; none: nothing saved), locked for the job's life (train/run_lock.h);
//   resume   with checkpoint.dir set: a sharded checkpoint CKPT/step-N every checkpoint.every_steps,
//            at checkpoint.stop_after_steps and at the end (checkpoint/sharded_checkpoint.h,
//            train/train_checkpoint.h), the newest checkpoint.keep_last kept; checkpoint.resume
//            ("auto" or a path) continues from one, at any world size (resharded): the loss
//            curve and the LoRA weights are those of an uninterrupted run (bitwise at the same
//            world size); TrainSummary then holds the whole run's history. A fresh start into a
//            checkpoint.dir that holds an earlier run's checkpoints or exports is refused, and so
//            is a resume under another LR schedule unless checkpoint.allow_schedule_change.
//   export   with checkpoint.dir set, at the end: CKPT/final/base_bnb4 (the bitsandbytes 4-bit
//            folder transformers loads) and CKPT/final/adapter (PEFT, its base_model_name_or_path
//            the absolute path of model.path, or of base_bnb4 for a model made from scratch),
//            streamed one unit at a time (checkpoint/export.h); CKPT/final-step-N when final/ holds the exports of an
//            earlier part of the run. A run killed during the export is finished by --resume auto,
//            which writes only the exports not complete (run_protocol.h). A run stopped by
//            stop_after_steps does not export.
//   knobs    logging.profile prints the compute stream's time split at the end (CUDA);
//            lora.fold false runs separate LoRA GEMMs per projection; logging.gemm_tflops sets
//            MFU's denominator (-1 measures it at start, 0 reports no MFU).
// The job's phases (open, run_step, evaluate, save, finish) are TrainJob's (train/train_job.h);
// the protocols of checkpoint.dir (resume, final export) are train/run_protocol.h's.
// Data-parallel equivalence: the per-rank normalizer is (global token count / world), so the
// averaged gradient equals the gradient of the global mean loss at any world size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/llama_model.h"
#include "runtime/communicator.h"
#include "runtime/runtime.h"
#include "runtime/memory_ledger.h"
#include "runtime/sync_counters.h"
#include "train/train_config.h"

namespace qshard {

// Speed and memory of a run (rank 0's view; `qshard bench` reports them).
struct TrainPerf {
  std::vector<double> step_seconds;   // wall time per optimizer step run here (host wait at its end included)
  std::vector<int64_t> step_tokens;   // non-ignored targets over all ranks, per step
  double gemm_flops = 0;              // the bf16 GEMM rate (logging.gemm_tflops: measured at start; 0 on the CPU)
  double flops_per_token = 0;         // useful work (train/flops.h)
  int64_t peak_gpu_bytes = 0;         // device memory in use (cudaMemGetInfo), the most seen after a step
  std::string plan;                   // the memory plan, described
  std::string plan_brief;             // its choices on one line (MemoryPlan::brief())
  bool attention_deterministic = true;  // the attention backward bitwise repeatable (LlamaModel's)
  int64_t keep_layers = 0, host_keep_layers = 0, mlp_chunk_rows = 0;
  bool kept_mlp = true;               // device-kept layers hold gate / up (memory.kept_mlp)
  bool host_kept_mlp = true;          // host-kept layers do
  int64_t full_kept = 0;              // device-kept layers whose sets are full (memory.full_kept_layers)
  int64_t dequantized_layers = 0;     // layers whose base stays dequantized (memory.dequantized_layers)
  bool qkv_backward_fused = false;    // the last step's q|k|v backward ran fused (lora.fuse_qkv_backward)
  int64_t micro_batch = 0;            // sequences per micro-batch (the plan's choice with batch.micro_batch_size 0)
  double est_step_s = 0;              // the memory plan's cost model (GPU)
  double first_step_done_s = 0;       // seconds from the launch to the end of the first step run here
  bool offload_params = false, offload_optimizer = false;
  bool embedding_on_host = false;     // the plan's memory.embedding
  bool host_checkpoints = false;      // the layer inputs in pinned host memory (memory.host_checkpoints)
  int64_t checkpoint_slots = 0;       // their device slots (with host_checkpoints)
  int64_t checkpoint_every = 1;       // 2: every second layer input kept (memory.checkpoint_every)
  // Summed over the steps run here: what each step did between its first gather and the optimizer
  // (train_step's StepStats::inside): host syncs and device allocations (0 on CUDA with NCCL) and
  // lookups by name (0 on every backend: the step binds through slots and entries found once).
  SyncAllocCounts inside;
  // Where the memory went at start-up (runtime/memory_ledger.h: the model's allocations line by
  // line, device and pinned host, and the device memory measured in use beside them).
  MemoryLedger ledger;
};

// Optional observers of a run (rank 0 and every other rank alike).
struct TrainCallbacks {
  // After every optimizer step (1-based `step`), before logging: e.g. reset the model's profile
  // after warm-up steps.
  std::function<void(int64_t step, LlamaModel& model)> after_step;
  bool profile = false;  // time the compute stream's parts (as logging.profile does), returned in
                         // TrainSummary::profile and not printed
  bool profile_paused = false;  // with profile: the model's profiler starts paused (after_step may
                                // resume it: LlamaModel::set_profiling)
};

struct TrainSummary {
  std::vector<double> losses;                              // per optimizer step, global mean
  std::vector<std::pair<int64_t, double>> eval_losses;     // (step, mean eval loss)
  int64_t steps = 0;
  int64_t max_steps = 0;        // the run's steps (steps, or epochs in steps); steps < max_steps: stopped early
  uint64_t trainable_parameters = 0;
  // Set when checkpoint.dir is and the run is complete (CKPT/final/...; also when an earlier
  // invocation wrote them all and there was nothing left to do).
  std::string exported_base, exported_adapter;
  std::string resumed_from;     // the checkpoint folder this run resumed from, if any
  std::string last_checkpoint;  // the newest checkpoint this run saved, if any
  TrainPerf perf;
  StepProfile profile;          // the compute stream's split (logging.profile or bench), since the last reset
};

// The job on `rt` (rt.ctx decides the backend; rt.host carries control, rt.data the parameters).
TrainSummary train(const TrainConfig& config, Runtime& rt, const TrainCallbacks* callbacks = nullptr);
// The CPU backend with `comm` as both communicators (tests and tools on the CPU).
TrainSummary train(const TrainConfig& config, Communicator& comm);

}  // namespace qshard
