// train_job.h: one training job (`qshard train`) as named phases; train() (train/trainer.h) calls
// them in order, and trainer.h states what the job does as a whole.
//
// Phases, every rank alike (each is collective unless it says rank 0):
//   open()        the start: config validated and its input files checked (TrainConfig::
//                 check_inputs); rank 0 takes checkpoint.dir's lock (train/run_lock.h: a folder
//                 another job uses is refused on every rank) and says where the run folder is, or
//                 that nothing is saved; the resume decision (train/run_protocol.h: rank 0 picks,
//                 every rank reads the checkpoint's metadata); rank 0 writes the resolved config to
//                 checkpoint.dir/config.resolved.yaml (when there is a dir); build_model(): the memory
//                 plan, the sharded QLoRA model, its optimizer state, the kept layers, the
//                 LlamaModel and its FSDP driver; the data (token files, eval split, loader, LR
//                 schedule); the resumed state (sharded tensors resharded to this world size, the
//                 data position, the history); rank 0's metrics logger; the GEMM rate for MFU
//                 (logging.gemm_tflops).
//   run_step(s)   optimizer step s (0-based): micro-batches from the loader, train_step(), the
//                 step's time and tokens, device memory, the after_step callback. Returns the
//                 step's record, which eval and logging complete.
//   evaluate(d)   mean loss over the eval split after d steps (every rank runs the same number of
//                 forwards), recorded in the summary. REQUIRES: eval data (eval_due(d)).
//   log(r)        rank 0: the progress line and the JSONL line when the step is a logging step
//                 (every logging.every_steps, the first, the last, an evaluated one); elsewhere nothing.
//   save(d)       a sharded checkpoint CKPT/step-d with the trainer's state (train_checkpoint.h).
//   finish()      rank 0 prints the compute stream's split (logging.profile, on CUDA, without
//                 callbacks); a run stopped by checkpoint.stop_after_steps ends there; a complete
//                 run exports CKPT/final (or final-step-N, run_protocol.h). Returns the summary.
// The lock is released when the job is destroyed (also when an error unwinds it).
// Steps run from start_step() (the resumed step, else 0) to stop_step() (max steps, or
// checkpoint.stop_after_steps).
// Ownership: the job borrows `config`, `rt` and `callbacks` (all outlive it) and owns the model,
// the optimizer state, the data and the logger; the model is torn down in the reverse order of
// its building. Not copyable or movable (the model's hooks point into it).
// Thread safety: one thread per rank drives a job.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "model/llama_model.h"
#include "runtime/runtime.h"
#include "text/data_loader.h"
#include "text/token_file.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/qlora_model.h"
#include "train/run_lock.h"
#include "train/train_config.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace qshard {

// One optimizer step as run_step() saw it; evaluate() and log() complete it.
struct StepRecord {
  int64_t step = 0;  // steps done (1-based)
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;     // non-ignored targets over all ranks
  int64_t input_tokens = 0;  // every token processed (padding excluded) over all ranks
  double step_s = 0;      // the optimizer step's wall time
  std::chrono::steady_clock::time_point start;  // the step's start (throughput counts eval too)
  std::optional<double> eval_loss;
};

class TrainJob {
 public:
  TrainJob(const TrainConfig& config, Runtime& rt, const TrainCallbacks* callbacks);
  ~TrainJob();
  TrainJob(const TrainJob&) = delete;
  TrainJob& operator=(const TrainJob&) = delete;

  void open();
  int64_t start_step() const { return start_step_; }
  int64_t stop_step() const { return stop_step_; }

  StepRecord run_step(int64_t step);
  bool eval_due(int64_t done) const;
  double evaluate(int64_t done);
  void log(const StepRecord& r);
  bool save_due(int64_t done) const;
  void save(int64_t done);
  TrainSummary finish();

 private:
  // The memory plan and the model as built (the memory model is reworked in it); the data, then
  // the step's model (its packed-data attention sized by the data's pieces), on the built base.
  void build_model();
  void write_resolved_config();
  void open_data();
  void build_step_model(std::optional<int64_t> runtime_bytes);
  void restore_resumed();
  void account_memory(std::optional<int64_t> runtime_bytes);
  void open_logger();
  void print_profile() const;
  void export_final();

  TrainConfig config_;  // a copy: the memory plan fills batch.micro_batch_size when it is 0 (auto)
  Runtime& rt_;
  Communicator& comm_;  // rt_.host
  const TrainCallbacks* callbacks_;
  const int rank_, world_;

  std::unique_ptr<RunLock> lock_;  // rank 0, with checkpoint.dir; declared first: released last
  std::optional<CheckpointInfo> resume_;
  // build_model()
  MemoryPlan plan_;
  std::unique_ptr<QloraModel> qm_;
  LlamaModelOptions mo_;
  OptimizerState opt_;
  std::vector<UnitStateShard> state_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<FsdpDriver> fsdp_;
  int T_ = 0;  // data.max_seq_len
  // open_data()
  std::optional<TokenFile> train_file_, eval_file_;
  std::optional<PackedDataset> train_data_, eval_data_;
  Packing packing_ = Packing::kWrapped;  // data.packing resolved (auto: by the files)
  std::optional<DataLoader> loader_;
  int64_t max_steps_ = 0, micro_steps_ = 0;
  LrSchedule sched_;
  // restore_resumed(), open_logger()
  int64_t start_step_ = 0, stop_step_ = 0;
  std::unique_ptr<MetricsLogger> logger_;
  double gemm_flops_ = 0, flops_per_token_ = 0;
  PlanRates rates_;  // measured before the plan when it has a choice (GPU)

  TrainSummary summary_;
  // A job that ends before it saved anything (a refusal after the start, a diverged first step)
  // takes back what it made in checkpoint.dir: the resolved config and the metrics log it created.
  bool saved_ = false;
  std::string fresh_resolved_, fresh_metrics_;
};

}  // namespace qshard
