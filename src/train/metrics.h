// metrics.h: training metrics as JSONL and a human progress line (rank 0 only).
//
// JSONL: one JSON object per logged step, keys in this order:
//   {"step": 12, "loss": 3.1234, "eval_loss": 3.2 (only when evaluated at this step), "lr": 0.0003,
//    "grad_norm": 1.23, "tokens_per_s": 1234.5, "target_tokens_per_s": 1100.2, "step_time_s": 0.52,
//    "peak_mem_bytes": 12345678,
//    "peak_gpu_mem_bytes": 2123456789 (GPU runs), "mfu": 0.41 (GPU runs), "elapsed_s": 83.2}
// `step` counts completed optimizer steps (1-based); `loss` is the mean training loss of that step;
// `grad_norm` the global norm before clipping; `tokens_per_s` counts every token the step processed
// (all ranks, padding excluded: what other trainers report), `target_tokens_per_s` the loss targets
// among them (fewer with prompt masking, data.packing padded or at document ends), both over the
// logged step's wall time, its eval included; `peak_mem_bytes` the peak of the allocator that matters (device
// pool on GPU, host on CPU); `step_time_s` the wall time of the logged step (its optimizer step,
// without eval or checkpoint); `peak_gpu_mem_bytes` the GPU memory in use at the step's end
// (cudaMemGetInfo: the whole device, every process on it; the step allocates nothing, so this is
// its peak); `mfu` useful model FLOPs per second (train/flops.h) over the bf16 GEMM rate measured
// at start-up on this GPU; `elapsed_s` the wall time since the logger was made.
// Each line is flushed as it is written, so a killed run keeps every finished line; with
// append = true (resume) the file is opened for appending instead of being truncated.
// scripts/tools/plot_metrics.py plots loss, eval_loss and lr against step from this file.
// TensorBoard (open_tensorboard, logging.tensorboard_dir): each line's numbers, every key but
// "step" (tensorboard_scalars), go to an event file as scalars tagged with the JSON key, at the
// line's step, flushed with the line (train/tensorboard_writer.h); a null (NaN) value as NaN.
//
// Progress line (to `out`, stdout by default):
//   "step 12/200 | loss 3.1234 | lr 3.0e-04 | grad 1.23 | 1234 tok/s (1100 target) | 0.52 s/step | mem 12.3 MB |
//    eta 1m23s"
// with " | eval 3.2100" after the loss when eval_loss is present, and " | gpu 20.1 GB | mfu 41.0%"
// after mem on GPU runs; when `out` is a terminal
// (isatty) the line starts with a 20-cell bar "[#####...............] ".
// Thread safety: one thread (the trainer's rank 0).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/tf_event.h"

namespace qshard {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  std::optional<double> eval_loss;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;         // every token processed (padding excluded)
  double target_tokens_per_s = 0.0;  // the loss targets among them
  double step_time_s = 0.0;
  int64_t peak_mem_bytes = 0;
  std::optional<int64_t> peak_gpu_mem_bytes;
  std::optional<double> mfu;
  double elapsed_s = 0.0;
};

// The JSONL line (without the newline).
std::string metrics_json_line(const StepMetrics& m);
// The TensorBoard scalars of a JSONL line: each number (or null, as NaN) but "step", in line order,
// tagged with its key. REQUIRES: a line metrics_json_line wrote.
std::vector<TfScalar> tensorboard_scalars(const std::string& json_line);
// The progress line for `total_steps` (without bar or newline).
std::string progress_line(const StepMetrics& m, int64_t total_steps);
// "45s", "1m23s", "2h05m"; "?" for a negative or non-finite value.
std::string format_duration(double seconds);
// "512 B", "12.3 KB", "12.3 MB", "1.2 GB" (powers of 1024).
std::string format_bytes(int64_t bytes);
// "[#####...............] " for step/total, width cells.
std::string progress_bar(int64_t step, int64_t total, int width = 20);

class TensorBoardWriter;

class MetricsLogger {
 public:
  // jsonl_path empty: no file. Creates the parent directories of jsonl_path. Throws InputError
  // naming the path if it cannot be opened.
  MetricsLogger(const std::string& jsonl_path, int64_t total_steps, bool append = false, std::FILE* out = stdout);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // From now on every logged line's scalars also go to a new TensorBoard event file in `dir`;
  // `first_step` is the first step this job logs (train/tensorboard_writer.h). Returns its path.
  // Throws InputError naming the folder or file.
  std::string open_tensorboard(const std::string& dir, int64_t first_step);
  // Writes the JSONL line (and the TensorBoard event) and prints the progress line. elapsed_s is
  // filled in when 0.
  void log(StepMetrics m);
  // Seconds since construction.
  double elapsed_s() const;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::FILE* out_;
  bool tty_;
  int64_t total_steps_;
  double start_;
};

}  // namespace qshard
